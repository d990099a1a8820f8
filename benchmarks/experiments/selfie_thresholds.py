"""MediaPipe's selfie segmentation (the zoo's ``selfie_segmentation``, real weights) converted at a few uniform
thresholds on both sample videos: how far its person mask moves from the dense model's, and the FLOPs it saves.

For each video, frames ``--start`` .. ``--start + --frames - 1`` resized to the model's 256x256 (the first the key
frame), each threshold: the mean relative error of the probability map against the dense model's, the mean IoU of
the two masks thresholded at 0.5 (frames where both are empty count 1), the smallest IoU, and the FLOPs density
(``deltaconv.fidelity.flops_density``). CPU, reference backend, float32::

    DELTACONV_VIDEOS=../shared/videos PYTHONPATH=. python benchmarks/experiments/selfie_thresholds.py
"""
from __future__ import annotations

import argparse

import torch

import deltaconv
from deltaconv import zoo
from deltaconv.fidelity import flops_density, mask_iou, relative_error
from deltaconv.video import find_sample_video, read_frames


def measure(model, frames: list, threshold: float) -> dict:
    """The converted model's errors against ``model`` over ``frames`` after the key frame, and its FLOPs density."""
    dm = deltaconv.convert(model, threshold=threshold, example_input=frames[0])
    errors, ious, person = [], [], []
    with torch.no_grad():
        for i, x in enumerate(frames):
            y, ref = dm(x), model(x)
            if i == 0:
                dm.reset_stats()
                continue
            errors.append(float(relative_error(y, ref).mean()))
            ious.append(float(mask_iou(y, ref, 0.5).mean()))
            person.append(float((ref > 0.5).float().mean()))
    return {"threshold": threshold, "rel_err": sum(errors) / len(errors), "iou": sum(ious) / len(ious),
            "iou_min": min(ious), "person": sum(person) / len(person), "flops_density": flops_density(dm.stats())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", nargs="+", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 0.005, 0.01, 0.02, 0.05])
    a = p.parse_args(argv)
    entry = zoo.load("selfie_segmentation")
    print(f"{entry.name} ({entry.weights}), {entry.input_size[0]}x{entry.input_size[1]}, frames {a.start}-"
          f"{a.start + a.frames - 1} (the first the key frame), reference backend, float32")
    print(f"{'video':32s} {'threshold':>9s} {'rel_err':>8s} {'IoU@0.5':>8s} {'min IoU':>8s} {'person':>7s} "
          f"{'FLOPs density':>13s}")
    for video in a.videos:
        frames = list(read_frames(find_sample_video(video), max_frames=a.frames, size=entry.input_size,
                                  start=a.start))
        for t in a.thresholds:
            r = measure(entry.model, frames, t)
            print(f"{video:32s} {t:9g} {r['rel_err']:8.4f} {r['iou']:8.4f} {r['iou_min']:8.4f} {r['person']:7.3f} "
                  f"{r['flops_density']:13.3f}", flush=True)


if __name__ == "__main__":
    main()
