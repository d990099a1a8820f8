"""Measured speed for the fidelity trade-off curves: fills the ``ms_per_frame``,
``dense_ms_per_frame`` and ``speed_frames`` columns of ``benchmarks/results/fidelity.csv`` and
redraws its plot (a second row of panels: measured speedup against the error).

Every row of the CSV is converted again, this time for speed: a uniform threshold with the row's
change detector and truncation measure, or the calibrated thresholds file that
``fidelity_sweep.py`` saved for the row's video, tolerance and truncation
(``fidelity_thresholds_<video>_<tolerance>[_rms].json`` beside the CSV). The model is MobileNetV2
with its ImageNet weights in float16, channels_last, on the CUDA backend replayed as one CUDA graph
per frame (``cuda_graph=True``), at the row's size, on ``--frames`` frames of the held-out part of
the row's video from ``--start`` (default 200, the first held-out frame). The baseline is the dense
float16 model replayed as a CUDA graph on the same frames. Both are medians of the per-frame times
(CUDA events) after ``--warmup`` frames. The CSV's densities and errors stay those of its float32
reference-backend run; only the time columns are written. Run on a CUDA machine with the
sample videos reachable::

    PYTHONPATH=. python benchmarks/fidelity_speed.py [--csv benchmarks/results/fidelity.csv]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import graphed_model, time_frames  # noqa: E402
from fidelity_sweep import CALIBRATED, RESULTS, plot, read_csv, thresholds_path, write_csv  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.fidelity import video_frames  # noqa: E402
from deltaconv.sparsify import from_spec  # noqa: E402


def folds_bn(row: dict) -> bool:
    """Whether the row's conversion folded BatchNorm into the convs (rows before the column: yes)."""
    return str(row.get("fold_bn") or "True") != "False"


def thresholds_file(row: dict, folder: Path) -> Path:
    """The calibrated thresholds file of a ``calibrated`` or ``refined`` row (as fidelity_sweep.py saved it)."""
    return thresholds_path(folder, row["video"], float(row["param"]), row.get("truncation", "max"),
                           row.get("cost") or "flops", row.get("dtype") or "float32", folds_bn(row),
                           refined=row.get("method") == "refined")


def convert_row(row: dict, model: torch.nn.Module, example: torch.Tensor, folder: Path):
    """The row's configuration as a CUDA-graph-replayed converted model."""
    common = dict(backend="cuda", example_input=example, cuda_graph=True, check_finite=False, fold_bn=folds_bn(row))
    if row["method"] in CALIBRATED:
        path = thresholds_file(row, folder)
        if not path.is_file():
            raise SystemExit(f"fidelity_speed: the thresholds file of row {row['video']} calibrated "
                             f"{row['param']} is missing: {path}")
        return deltaconv.convert(model, thresholds=str(path), **common)  # the file's detector and truncation
    det = None if row["detector"] in ("", "none", "null") else from_spec(json.loads(row["detector"]))
    return deltaconv.convert(model, threshold=float(row["param"]), change_detector=det,
                             truncation=row.get("truncation") or "max", **common)


def measure(rows: list[dict], folder: Path, start: int, n_frames: int, warmup: int) -> None:
    """Fill ``ms_per_frame`` / ``dense_ms_per_frame`` of ``rows`` in place."""
    from deltaconv.weights import mobilenet_v2_imagenet

    torch.backends.cudnn.benchmark = True
    model = mobilenet_v2_imagenet().cuda().half().to(memory_format=torch.channels_last)
    for key in dict.fromkeys((r["video"], r["size"]) for r in rows):
        video, size = key
        h, w = (int(v) for v in size.split("x"))
        frames = [f.cuda().half() for f in video_frames(video, (h, w), max_frames=n_frames, start=start)]
        with torch.no_grad():
            dense_ms, _ = time_frames(graphed_model(model, frames[0]), frames, warmup)
        span = f"{start}..{start + len(frames) - 1}"
        print(f"{video} {size}: dense CUDA graph {dense_ms:.3f} ms per frame, frames {span}", flush=True)
        for row in (r for r in rows if (r["video"], r["size"]) == key):
            dm = convert_row(row, model, frames[0], folder)
            ms, _ = time_frames(dm, frames, warmup)
            row["ms_per_frame"], row["dense_ms_per_frame"] = round(ms, 4), round(dense_ms, 4)
            row["speed_frames"] = span
            print(f"   {row['method']:<10} {row['detector'][:30]:<30} {row.get('truncation', ''):<4} "
                  f"{row['param']:<6} {ms:.3f} ms ({dense_ms / ms:.2f}x)  error {float(row['rel_err_mean']):.4f}",
                  flush=True)
            del dm
            torch.cuda.empty_cache()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=RESULTS / "fidelity.csv")
    p.add_argument("--start", type=int, default=200, help="first frame (default 200, the first held-out one)")
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    args = p.parse_args(argv)
    if not args.csv.is_file():
        p.error(f"--csv: no such file: {args.csv}")
    if args.frames <= args.warmup:
        p.error(f"--frames ({args.frames}) must exceed --warmup ({args.warmup})")
    if not torch.cuda.is_available():
        raise SystemExit("fidelity_speed: needs a CUDA GPU")
    rows = read_csv(args.csv)
    measure(rows, args.csv.parent, args.start, args.frames, args.warmup)
    write_csv(rows, args.csv)
    print(f"wrote {args.csv}")
    try:
        plot(rows, args.csv.with_suffix(".png"))
    except ImportError:
        print("matplotlib is not installed here: redraw the plot with fidelity_sweep.py --plot-only")


if __name__ == "__main__":
    main()
