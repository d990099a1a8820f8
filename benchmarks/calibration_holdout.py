"""Do thresholds calibrated on a video's first frames hold on the whole rest of it?

The fidelity issue asks that thresholds calibrated on the first frames keep the error within 1.5x of
the tolerance on the rest of the video. ``fidelity_sweep.py`` calibrates on two clips from frames
0-199 and measures frames 200-499; this script runs its saved thresholds (the JSON files beside
``fidelity.csv``) from ``--start`` to the end of each video, one key frame first, and reports the
logit relative error (mean, p95, max) and the FLOPs density over the whole stretch and per window of
``--window`` frames, so a drift or a hard passage shows. MobileNetV2 with its ImageNet weights, the
backend of ``--backend`` (``auto``: the CUDA kernels on a GPU) in ``--dtype`` (float32 by default;
the dense model in the same dtype is the reference), eager or, with ``--cuda-graph``, replayed as a
CUDA graph (the deployment setting)::

    PYTHONPATH=. python benchmarks/calibration_holdout.py --device cuda \\
        [--files fidelity_thresholds_vtest_0.02_rms.json ...] [--size 1080 1920] [--start 200] \\
        [--dtype float16 --cuda-graph] [--no-fold-bn]

Frames are streamed (a 1080p video does not fit in memory as tensors). Writes
``calibration_holdout.csv`` (float32, eager; ``calibration_holdout_<dtype>[_graph].csv`` otherwise;
one row per file and window, the whole stretch as window ``all``) to ``--out`` and prints the same.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_csv  # noqa: E402
from fidelity_sweep import VIDEOS as SWEEP_VIDEOS, _short, thresholds_path  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.fidelity import compare, video_frames  # noqa: E402

#: the short names fidelity_sweep.py gives each video in its thresholds files
VIDEOS = {_short(video): video for video in SWEEP_VIDEOS}
#: the calibrated thresholds of fidelity.csv (tolerance 0.02, max and rms), and the video each was calibrated on
FILES = {thresholds_path(RESULTS, video, 0.02, truncation).name: video
         for video in SWEEP_VIDEOS for truncation in ("max", "rms")}

def video_of(name: str) -> str:
    """The video a thresholds file of fidelity_sweep.py was calibrated on, from its name
    (``fidelity_thresholds_<video>_<tolerance>...json``)."""
    parts = Path(name).name.split("_")
    if len(parts) < 4 or parts[:2] != ["fidelity", "thresholds"] or parts[2] not in VIDEOS:
        raise ValueError(f"--files: {name!r} is not a thresholds file of fidelity_sweep.py "
                         f"(fidelity_thresholds_<{'|'.join(VIDEOS)}>_<tolerance>...json)")
    return VIDEOS[parts[2]]


def window_rows(errors: list[float], densities: list[float], window: int) -> list[dict]:
    """Summaries of consecutive windows of ``window`` frames, then of all frames (window ``all``)."""
    spans = [(str(i // window), i, min(i + window, len(errors))) for i in range(0, len(errors), window)]
    rows = []
    for name, a, b in spans + [("all", 0, len(errors))]:
        e, d = errors[a:b], densities[a:b]
        rows.append({"window": name, "first": a, "frames": b - a, "rel_err_mean": statistics.fmean(e),
                     "rel_err_p95": sorted(e)[min(len(e) - 1, int(0.95 * len(e)))], "rel_err_max": max(e),
                     "density": statistics.fmean(d)})
    return rows


def run_file(name: str, video: str, args, model: torch.nn.Module) -> list[dict]:
    path = Path(args.thresholds_dir) / name
    spec = json.loads(path.read_text())
    dtype = getattr(torch, args.dtype)
    frames = (f.to(dtype) for f in video_frames(video, tuple(args.size), args.frames, start=args.start))
    first = next(frames)
    # the file's thresholds, change detector and truncation measure
    dm = deltaconv.convert(model, thresholds=str(path), backend=args.backend, example_input=first.to(args.device),
                           cuda_graph=args.cuda_graph, check_finite=not args.cuda_graph,
                           fold_bn=not args.no_fold_bn)
    densities: list[float] = []

    class _Densities:  # records each delta frame's FLOPs density as compare() runs
        def __init__(self, dm):
            self.dm = dm

        def __call__(self, x):
            self.dm.reset_stats()
            y = self.dm(x)
            densities.append(deltaconv.fidelity.flops_density(self.dm.stats()))
            return y

        def reset(self):
            self.dm.reset()

        def reset_stats(self):
            self.dm.reset_stats()

        def stats(self):
            return self.dm.stats()

    t0 = time.perf_counter()
    rep = compare(model, _Densities(dm), itertools.chain([first], frames), device=args.device, progress=True)
    errors = rep.per_frame["rel_err"]
    rows = window_rows(errors, densities[1:], args.window)  # densities[0]: the key frame
    for r in rows:
        r.update({"file": name, "video": video, "start": args.start + 1 + r.pop("first"),
                  "truncation": spec.get("truncation", "max"), "tolerance": spec.get("tolerance", 0.02),
                  "dtype": args.dtype,
                  "cuda_graph": args.cuda_graph, "fold_bn": not args.no_fold_bn})
    print(f"== {name} on {video}, frames {args.start + 1}-{args.start + len(errors)} after a key frame at "
          f"{args.start}, {args.dtype}{', CUDA graph' if args.cuda_graph else ''} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    for r in rows:
        print(f"   window {r['window']:>4} from {r['start']:5d}, {r['frames']:4d} frames: logit rel. error mean "
              f"{r['rel_err_mean']:.4f} p95 {r['rel_err_p95']:.4f} max {r['rel_err_max']:.4f}, FLOPs density "
              f"{r['density']:.3f}", flush=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", nargs="+", default=list(FILES),
                   help="thresholds files of fidelity_sweep.py in --thresholds-dir (default: the four of fidelity.csv)")
    p.add_argument("--thresholds-dir", default=str(RESULTS))
    p.add_argument("--size", type=int, nargs=2, default=[1080, 1920], metavar=("H", "W"))
    p.add_argument("--start", type=int, default=200, help="the key frame; measured from the next one")
    p.add_argument("--frames", type=int, default=None, help="at most this many frames (default: to the end)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--backend", default="auto", choices=["auto", "reference", "cuda"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--cuda-graph", action="store_true", help="replay the converted model as a CUDA graph")
    p.add_argument("--no-fold-bn", action="store_true", help="keep each BatchNorm a layer (convert(fold_bn=False))")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    if a.window < 1:
        p.error(f"--window must be >= 1, got {a.window}")
    if a.cuda_graph and not str(a.device).startswith("cuda"):
        p.error(f"--cuda-graph needs --device cuda, got {a.device!r}")
    try:
        videos = [video_of(name) for name in a.files]
    except ValueError as e:
        p.error(str(e))
    from deltaconv.weights import mobilenet_v2_imagenet
    model = mobilenet_v2_imagenet().to(a.device, getattr(torch, a.dtype))
    rows = []
    for name, video in zip(a.files, videos):
        rows += run_file(name, video, a, model)
    out = a.out / ("calibration_holdout.csv" if a.dtype == "float32" and not a.cuda_graph and not a.no_fold_bn
                   else f"calibration_holdout_{a.dtype}{'_graph' if a.cuda_graph else ''}"
                        f"{'_nofold' if a.no_fold_bn else ''}.csv")
    write_csv(out, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
