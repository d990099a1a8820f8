"""Kernels that are not deltaconv's in a converted model's delta frame: per model, the kernels per
frame, how many of them (and how much GPU time) come from PyTorch ops between the delta kernels
(casts, arithmetic, copies), and the largest such families. A layer that derives something from its
parameters on every frame, or a data-movement rule that copies, shows up here (DenseNet's unfolded
BatchNorms did: ``benchmarks/results/densenet_ab.txt``).

For every torchvision classification and segmentation model (or the names given): random weights
(``zoo.load``), ``--dtype`` (float16), CUDA backend, threshold 0.02, ``--frames`` frames of ``vtest.avi`` at
``--size``; the key frame and one warm-up frame run unprofiled, the rest under ``torch.profiler``
(eagerly: each kernel is an event). Models that do not convert or run at that size are listed with
the error. Run on a CUDA machine from the repository root::

    PYTHONPATH=. python benchmarks/experiments/glue_kernels.py [--size 288x512] [NAME ...]
"""
from __future__ import annotations

import argparse
import collections
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import kernel_family  # noqa: E402


def glue(name: str, frames: list, top: int, dtype: torch.dtype = torch.float16) -> str:
    import deltaconv
    from deltaconv import zoo
    from torch.profiler import ProfilerActivity, profile

    model = zoo.load(name).model.cuda().to(dtype).to(memory_format=torch.channels_last)
    xs = [f.cuda().to(dtype) for f in frames]
    dm = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=xs[0], check_finite=False)
    fallbacks = len(dm.report.fallbacks)
    with torch.no_grad():
        for x in xs[:2]:
            dm(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for x in xs[2:]:
                dm(x)
            torch.cuda.synchronize()
    n = len(xs) - 2
    ours, other = collections.Counter(), collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if "deltaconv" in ev.name:
            ours[kernel_family(ev.name)] += 1
        else:
            rec = other[kernel_family(ev.name)]
            rec[0] += 1
            rec[1] += ev.device_time
    total = sum(ours.values()) + sum(c for c, _ in other.values())
    glue_calls = sum(c for c, _ in other.values())
    glue_us = sum(t for _, t in other.values())
    families = sorted(other.items(), key=lambda kv: -kv[1][1])[:top]
    listed = ", ".join(f"{k} {c / n:.0f} x {t / max(c, 1):.1f} us" for k, (c, t) in families)
    return (f"{name:34s} kernels/frame {total / n:6.0f}  other {glue_calls / n:5.0f} ({glue_us / n:7.1f} us)  "
            f"fallbacks {fallbacks:2d}  {listed}")


def main(argv=None) -> None:
    from deltaconv import zoo
    from deltaconv.video import read_frames

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*")
    p.add_argument("--size", default="288x512", help="HxW (default 288x512)")
    p.add_argument("--frames", type=int, default=5)
    p.add_argument("--top", type=int, default=3, help="families of other kernels listed per model")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = p.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    names = args.names or sorted(n for n, task in zoo.torchvision_names().items()
                                 if task in ("classification", "segmentation"))
    frames = list(read_frames(max_frames=args.frames, size=size, start=200))
    dtype = getattr(torch, args.dtype)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size}, {args.dtype}, t=0.02, "
          f"vtest.avi frames 200-{200 + args.frames - 1}, {args.frames - 2} profiled", flush=True)
    warnings.filterwarnings("ignore")
    for name in names:
        try:
            print(glue(name, frames, args.top, dtype), flush=True)
        except Exception as error:  # noqa: BLE001 - a survey: report and go on
            print(f"{name:34s} not run: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
