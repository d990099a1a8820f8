"""The error and density of an input that carries the scene's motion and none of the codec's noise
(benchmarks/results/density_experiments.txt section 17).

An oracle change detector that sees the future: per frame k, the per-pixel temporal median of the native frames
k-2..k+2 (uint8; codec flicker on a still background does not survive it, a person walking does) is compared with the
key frame's median, and the pixels whose largest channel differs by more than ``--levels`` grey levels, dilated by
``--dilate`` native pixels, are "moving". The oracle frame k is the key frame's pixels (``START``, noise included)
with the moving pixels taken from frame k (their noise included): what a delta model's input would hold if its change
detector sent every real change and no noise. Then, MobileNetV2 (ImageNet weights, float32, on ``--device``):

  * ``moving``: the mean share of moving pixels per delta frame (native resolution);
  * ``dense on oracle``: the dense model's logits on the oracle frame against its logits on the real frame k, the
    error of a delta model with that ideal detector and every later layer exact: the floor that ignoring the noise
    sets;
  * then the converted model (reference backend) run on the oracle frames with every layer exact (threshold 0, its
    FLOPs density: what propagating the real motion alone costs) and with ``--thresholds`` (a calibration), each with
    its FLOPs density over the delta frames and its error against the dense logits on the real frames.

One oracle per value of ``--levels`` (none: only the runs on the real frames); each calibration runs with its
thresholds multiplied by each of ``--scales``, and with ``--real`` on the real frames as well (the library's own
input measure, for a comparison at equal error).

    DELTACONV_VIDEOS=../shared/videos PYTHONPATH=. .venv/bin/python benchmarks/experiments/oracle_change_error.py \\
        --size 1080 1920 --start 200 --frames 24 --videos vtest.avi \\
        --thresholds benchmarks/results/fidelity_thresholds_vtest_0.02_hybrid_refined.json
"""
import argparse
import json
import tempfile
import time

import numpy as np
import torch

import deltaconv
from deltaconv.fidelity import flops_density, primary_output, relative_error
from deltaconv.video import find_sample_video, to_tensor
from deltaconv.weights import mobilenet_v2_imagenet


def native_frames(video: str, start: int, count: int) -> np.ndarray:
    """Frames ``start .. start + count - 1`` of ``video`` as OpenCV decodes them: ``[count, H, W, 3]`` uint8 BGR."""
    import cv2
    cap = cv2.VideoCapture(str(find_sample_video(video)))
    try:
        out, index = [], 0
        while len(out) < count:
            ok, frame = cap.read()
            if not ok:
                raise SystemExit(f"oracle_change_error: {video} ends before frame {start + count - 1}")
            if index >= start:
                out.append(frame)
            index += 1
    finally:
        cap.release()
    return np.stack(out)


def oracle_frames(raw: np.ndarray, frames: int, levels: int, dilate: int) -> tuple[list, list]:
    """From ``raw`` (frames START-2 .. START+frames+1, uint8): the oracle frames START.. (the key frame with each
    frame's moving pixels) and each delta frame's share of moving pixels."""
    import cv2
    median = [np.median(raw[k - 2:k + 3], axis=0).astype(np.int16) for k in range(2, frames + 2)]
    kernel = np.ones((2 * dilate + 1, 2 * dilate + 1), np.uint8)
    key = raw[2]
    oracle, moving = [], []
    for i, k in enumerate(range(2, frames + 2)):
        changed = (np.abs(median[i] - median[0]).max(axis=2) > levels).astype(np.uint8)
        if dilate > 0:
            changed = cv2.dilate(changed, kernel)
        oracle.append(np.where(changed[:, :, None] > 0, raw[k], key))
        if i > 0:
            moving.append(float(changed.mean()))
    return oracle, moving


def delta_run(model, frames: list, reference: list, **convert_kwargs) -> tuple[np.ndarray, float]:
    """The converted model (reference backend) over ``frames`` from a key frame: its errors against ``reference``
    on the delta frames and its FLOPs density over them."""
    dm = deltaconv.convert(model, example_input=frames[0], backend="reference", **convert_kwargs)
    errors = []
    with torch.no_grad():
        for i, f in enumerate(frames):
            y = primary_output(dm(f))
            if i == 0:
                dm.reset_stats()
                continue
            errors.append(float(relative_error(y, reference[i])))
    return np.array(errors), flops_density(dm.stats())


def scaled_calibration(path: str, scale: float, folder: str) -> str:
    """A copy of the calibration file ``path`` with every threshold multiplied by ``scale``, in ``folder``."""
    data = json.loads(open(path).read())
    data["thresholds"] = {name: value * scale for name, value in data["thresholds"].items()}
    out = f"{folder}/scaled_{scale:g}.json"
    with open(out, "w") as f:
        json.dump(data, f)
    return out


def summary(e: np.ndarray) -> str:
    return f"mean {e.mean():.4f} median {np.median(e):.4f} p95 {np.quantile(e, 0.95):.4f} max {e.max():.4f}"


def run_video(args, model, video: str, folder: str) -> None:
    """The runs of ``args`` on one video: its reference logits, the real frames' calibrated runs (``--real``), and
    per level its oracle frames, their dense error and the converted model's runs (lines on stdout)."""
    size = tuple(args.size)
    t0 = time.time()
    raw = native_frames(video, args.start - 2, args.frames + 4)
    with torch.no_grad():
        reference = [primary_output(model(to_tensor(raw[k], size).to(args.device)))
                     for k in range(2, args.frames + 2)]
    clip = f"{video} {size[0]}x{size[1]} frames {args.start}-{args.start + args.frames - 1}"
    calibrations = [(f"{path} x{scale:g}", scaled_calibration(path, scale, folder))
                    for path in args.thresholds for scale in args.scales]
    if args.real:
        reals = [to_tensor(raw[k], size).to(args.device) for k in range(2, args.frames + 2)]
        for label, path in calibrations:
            errors, density = delta_run(model, reals, reference, thresholds=path)
            print(f"{clip} delta on the real frames, {label}: FLOPs density {density:.3f}, error {summary(errors)} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    for levels in args.levels:
        oracle, moving = oracle_frames(raw, args.frames, levels, args.dilate)
        oracle = [to_tensor(f, size).to(args.device) for f in oracle]
        with torch.no_grad():
            dense_oracle = np.array([float(relative_error(primary_output(model(f)), r))
                                     for f, r in zip(oracle[1:], reference[1:])])
        where = f"{clip} levels {levels}"
        print(f"{where} dilate {args.dilate}: moving pixels mean {np.mean(moving):.4f} max {np.max(moving):.4f}; "
              f"dense on oracle frames vs dense: {summary(dense_oracle)} ({time.time() - t0:.0f} s)", flush=True)
        print(f"{where} per frame: " + " ".join(f"{e:.4f}" for e in dense_oracle), flush=True)
        runs = ([] if args.no_exact else [("every layer exact", dict(threshold=0.0))]) + \
               [(label, dict(thresholds=path)) for label, path in calibrations]
        for label, kw in runs:
            errors, density = delta_run(model, oracle, reference, **kw)
            print(f"{where} delta on oracle frames, {label}: FLOPs density {density:.3f}, error vs dense on the "
                  f"real frames {summary(errors)} ({time.time() - t0:.0f} s)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, nargs=2, default=(1080, 1920), metavar=("H", "W"))
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--levels", type=int, nargs="*", default=[10],
                   help="grey levels a median must move to count as motion (one oracle per value)")
    p.add_argument("--dilate", type=int, default=2, help="native pixels the moving pixels are dilated by")
    p.add_argument("--videos", nargs="+", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    p.add_argument("--thresholds", nargs="*", default=[], help="calibrations (JSON) run on the oracle frames too")
    p.add_argument("--scales", type=float, nargs="+", default=[1.0],
                   help="each calibration runs with its thresholds multiplied by each of these")
    p.add_argument("--real", action="store_true", help="run the calibrations on the real frames too")
    p.add_argument("--no-exact", action="store_true", help="skip the run with every layer exact")
    p.add_argument("--device", default="cpu", help="where the models run (the reference backend, float32, on either)")
    args = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # float32 on a GPU too
    model = mobilenet_v2_imagenet().eval().to(args.device)
    with tempfile.TemporaryDirectory(prefix="oracle_change_error_") as folder:  # the scaled calibrations
        for video in args.videos:
            run_video(args, model, video, folder)


if __name__ == "__main__":
    main()
