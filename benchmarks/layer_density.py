"""Where the FLOPs of a converted MobileNetV2 (real ImageNet weights) go on a sample video: its
FLOPs-weighted density and logit error for one input threshold and one threshold for every
non-linear layer, and the density of the layers that hold the most dense FLOPs.

The input sparsifier gets ``--input-threshold``; every other truncating layer gets
``--threshold`` with ``--truncation`` (``max`` or ``rms``). ``--threshold 0`` shows the floor that
the input alone sets: every pixel whose receptive field holds a changed input pixel is computed.
Reference backend (float32); runs on the CPU (minutes at 540x960 for 30 frames on 2 cores) or on a
GPU with ``--device cuda``::

    PYTHONPATH=. python benchmarks/layer_density.py --video vtest.avi --size 540 960 --start 200 \\
        --frames 30 --input-threshold 0.01 --threshold 0

Prints one summary line and a table of the ``--top`` layers by dense FLOPs (share of the dense
FLOPs, mean density over the delta frames, share of the FLOPs still done), then the same by the
layers' stride against the frame. ``--thresholds JSON`` takes every layer's threshold and measure
from a calibration file instead (``deltaconv calibrate``, ``fidelity_sweep.py``), e.g. where the
FLOPs of a calibrated operating point go on held-out frames::

    PYTHONPATH=. python benchmarks/layer_density.py --size 1080 1920 --start 200 --frames 24 \
        --thresholds benchmarks/results/fidelity_thresholds_vtest_0.02_hybrid_refined.json
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import deltaconv  # noqa: E402
from deltaconv.backends.reference import MEASURES  # noqa: E402
from deltaconv.fidelity import compare, video_frames  # noqa: E402


def load_model(device: str) -> torch.nn.Module:
    """torchvision MobileNetV2 with its ImageNet weights (see ``deltaconv.weights``)."""
    from deltaconv.weights import mobilenet_v2_imagenet
    return mobilenet_v2_imagenet().to(device)


def finite(v: float) -> float:
    """``v``, or 0 for NaN (the statistics of layers that never ran)."""
    return v if v == v else 0.0


def layer_table(layers: list[dict], top: int) -> list[dict]:
    """The ``top`` layers by dense FLOPs, with their share of the dense FLOPs and of those done."""
    total = sum(finite(s["flops_dense"]) for s in layers) or 1.0
    done = sum(finite(s["mean_flops_done"]) for s in layers) or 1.0
    rows = sorted(layers, key=lambda s: -s["flops_dense"])[:top]
    return [{"name": s["name"], "kind": s["kind"], "share_dense": s["flops_dense"] / total,
             "density": s["mean_density"], "share_done": finite(s["mean_flops_done"]) / done} for s in rows]


GLOBAL = 0  # the stride of a layer with one output position per frame (a classifier after global pooling)


def layer_stride(pixels: float, frame_pixels: int) -> int:
    """A layer's stride against the frame from its output pixels per frame (``dm.stats()``'s
    ``pixels``): ``sqrt(frame_pixels / pixels)`` to the nearest power of two (at least 1), or
    ``GLOBAL`` (0) for one output pixel of a larger frame, which has no spatial stride."""
    if pixels <= 1 < frame_pixels:
        return GLOBAL
    return 2 ** max(0, round(math.log2(math.sqrt(frame_pixels / pixels))))


def stride_label(stride: int) -> str:
    """``stride`` as the tables print it: the number, or ``global`` for ``GLOBAL``."""
    return "global" if stride == GLOBAL else str(stride)


def stride_table(layers: list[dict], frame_pixels: int) -> list[dict]:
    """The layers with FLOPs grouped by their stride against a frame of ``frame_pixels`` pixels, from
    the finest (``GLOBAL`` last): ``stride``, ``layers``, ``share_dense`` (of the dense FLOPs), ``density`` (the group's
    FLOPs done over its dense FLOPs) and ``share_done`` (of the FLOPs done)."""
    counted = [s for s in layers if s["flops_dense"] > 0 and s.get("pixels", 0) > 0]
    total = sum(s["flops_dense"] for s in counted) or 1.0
    done = sum(finite(s["mean_flops_done"]) for s in counted) or 1.0
    groups: dict[int, list[dict]] = {}
    for s in counted:
        groups.setdefault(layer_stride(s["pixels"], frame_pixels), []).append(s)
    rows = []
    for stride in sorted(groups, key=lambda k: (k == GLOBAL, k)):
        dense = sum(s["flops_dense"] for s in groups[stride])
        did = sum(finite(s["mean_flops_done"]) for s in groups[stride])
        rows.append({"stride": stride, "layers": len(groups[stride]), "share_dense": dense / total,
                     "density": did / dense, "share_done": did / done})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--video", default="vtest.avi", help="sample video name or path (default vtest.avi)")
    p.add_argument("--size", type=int, nargs=2, default=(540, 960), metavar=("H", "W"))
    p.add_argument("--start", type=int, default=200, help="first frame (the key frame; default 200)")
    p.add_argument("--frames", type=int, default=30, help="frames, the key frame included (default 30)")
    p.add_argument("--input-threshold", type=float, default=0.01)
    p.add_argument("--threshold", type=float, default=0.0, help="every non-linear layer (default 0)")
    p.add_argument("--truncation", default="max", choices=MEASURES)
    p.add_argument("--thresholds", type=Path, default=None, metavar="JSON",
                   help="every layer's threshold and measure from this calibration file (then --input-threshold, "
                        "--threshold and --truncation are not used)")
    p.add_argument("--top", type=int, default=10, help="layers to list (default 10)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.frames < 2:
        p.error(f"--frames must be at least 2 (a key frame and a delta frame), got {args.frames}")
    if args.thresholds is not None and not args.thresholds.is_file():
        p.error(f"--thresholds: no such file: {args.thresholds}")
    if args.device == "cpu":
        torch.set_num_threads(2)
    model = load_model(args.device)
    frames = [f.to(args.device) for f in video_frames(args.video, tuple(args.size), args.frames, args.start)]
    if args.thresholds is not None:
        dm = deltaconv.convert(model, thresholds=args.thresholds, backend="reference", example_input=frames[0])
        setting = f"thresholds {args.thresholds.name}"
    else:
        dm = deltaconv.convert(model, threshold=args.threshold, truncation=args.truncation, backend="reference",
                               example_input=frames[0])
        sparsifier = dm.delta_layers()[0].layer_name
        dm.load_thresholds({sparsifier: args.input_threshold})
        setting = f"input t={args.input_threshold:g} layers t={args.threshold:g} ({args.truncation})"
    t0 = time.time()
    rep = compare(model, dm, frames, progress=True)
    print(f"{Path(args.video).name} {args.size[0]}x{args.size[1]} frames {args.start}-{args.start + len(frames) - 1} "
          f"{setting}: "
          f"FLOPs density {rep.density:.3f}, logit rel. error mean {rep.mean('rel_err'):.4f} "
          f"p95 {rep.quantile('rel_err', 0.95):.4f} ({time.time() - t0:.0f} s)")
    print(f"{'layer':28s} {'kind':12s} {'dense FLOPs':>11s} {'density':>8s} {'FLOPs done':>10s}")
    for r in layer_table(rep.layers, args.top):
        print(f"{r['name'][:28]:28s} {r['kind'][:12]:12s} {r['share_dense']:11.1%} {r['density']:8.3f} "
              f"{r['share_done']:10.1%}")
    print(f"{'stride':>6s} {'layers':>6s} {'dense FLOPs':>11s} {'density':>8s} {'FLOPs done':>10s}")
    for r in stride_table(rep.layers, args.size[0] * args.size[1]):
        print(f"{stride_label(r['stride']):>6s} {r['layers']:6d} {r['share_dense']:11.1%} {r['density']:8.3f} "
              f"{r['share_done']:10.1%}")


if __name__ == "__main__":
    main()
