"""Codec key frames and the density they cost (benchmarks/results/density_experiments.txt section 3).

``changes``: for every frame of the sample videos, the fraction of pixels whose largest channel
change since the previous frame exceeds 2 grey levels (cv2, full resolution); prints its median and
the frames above 30 %.

``frames VIDEO THRESHOLDS H W START N``: per frame, MobileNetV2 (ImageNet weights) converted with
the calibrated thresholds JSON on the reference backend (CPU, float32): FLOPs density of that frame
(stats reset before it), the input sparsifier's density, the logit relative error against the dense
model, and how far the dense logits moved from the previous frame. The first frame is the key frame.

    PYTHONPATH=. python benchmarks/experiments/key_frame_density.py changes
    PYTHONPATH=. python benchmarks/experiments/key_frame_density.py frames one-by-one-person-detection.mp4 \\
        benchmarks/results/fidelity_thresholds_one_0.02_rms.json 540 960 200 101

Kept as it ran (2026-11-22; the two parts were run as separate scratch scripts, joined here)."""
import sys

import numpy as np
import torch

import deltaconv
from deltaconv.fidelity import flops_density, relative_error, video_frames
from deltaconv.video import find_sample_video
from deltaconv.weights import mobilenet_v2_imagenet


def changes() -> None:
    import cv2
    for name in ("vtest.avi", "one-by-one-person-detection.mp4"):
        cap = cv2.VideoCapture(str(find_sample_video(name)))
        prev, frac, n = None, [], 0
        while True:
            ok, f = cap.read()
            if not ok:
                break
            f = f.astype(np.int16)
            if prev is not None:
                frac.append(float((np.abs(f - prev).max(-1) > 2).mean()))
            prev, n = f, n + 1
        frac = np.array(frac)
        big = np.where(frac > 0.3)[0] + 1
        print(f"{name}: {n} frames, median changed by > 2 levels {np.median(frac):.3f}, "
              f"{len(big)} frames above 30 %: {big[:40].tolist()}")


def frames(video: str, thresholds: str, h: int, w: int, start: int, n: int) -> None:
    torch.set_num_threads(1)
    model = mobilenet_v2_imagenet()
    clip = list(video_frames(video, (h, w), n, start))
    dm = deltaconv.convert(model, thresholds=thresholds, backend="reference", example_input=clip[0])
    prev = None
    with torch.no_grad():
        for i, x in enumerate(clip):
            ref = model(x)
            dm.reset_stats()
            y = dm(x)
            st = dm.stats()
            moved = float(relative_error(ref, prev)) if prev is not None else 0.0
            print(f"{start + i:4d} dens {flops_density(st):.3f} in {st[0]['mean_density']:.3f} "
                  f"err {float(relative_error(y, ref)):.4f} dense_change {moved:.4f}", flush=True)
            prev = ref


if __name__ == "__main__":
    if sys.argv[1:2] == ["changes"]:
        changes()
    elif sys.argv[1:2] == ["frames"] and len(sys.argv) == 8:
        frames(sys.argv[2], sys.argv[3], *(int(v) for v in sys.argv[4:8]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} changes | frames VIDEO THRESHOLDS H W START N (got {sys.argv[1:]})")
