"""A/B of programmatic dependent launch (``DELTACONV_PDL``) in one process: kernels and whole models.

    PYTHONPATH=. python benchmarks/launch_ab.py [--models mobilenet_v2 resnet50] [--frames 24]

With ``DELTACONV_PDL=1`` (opt-in) every deltaconv kernel is launched as the blocks of the kernel before
it in the stream exit, and waits there for its results (programmatic dependent launch,
``csrc/kernels/grid_dependency.cuh``); with ``DELTACONV_PDL=0`` (the default) kernels launch plainly.
The variable is read when a graph is captured, so both variants are captured in one
process and replayed in alternating rounds on the same inputs:

* kernels: ``torch.ops.deltaconv.conv2d`` (fp16) as in ``kernel_sweep.py`` (3x3, 1x1 and depthwise
  3x3 at C=64 1080x1920, 128 at 540x960, 256 at 270x480; 24-pixel blobs), the median of
  ``--rounds`` alternating rounds of 40 CUDA-graph replays per variant, and cuDNN's graph for scale
  (channels_last weight, as deltaconv's);
* models: the converted model (``cuda_graph=True``, threshold ``--threshold``) on the first
  ``--frames`` frames of vtest.avi upscaled to 1080x1920, both variants frame by frame, the median
  ms per frame after 4 frames, and the largest output difference between the two (0 unless a
  kernel's result depends on launch order).

Results: ``benchmarks/results/launch_ab.txt``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate_frames, capture_graph, clustered_mask, run_info, time_cuda  # noqa: E402
from kernel_sweep import SHAPES  # noqa: E402  (channels, (H, W)): the kernel sweep's shapes

OPS = {"conv3x3": (3, False), "conv1x1": (1, False), "dwconv3x3": (3, True)}
VARIANTS = {"pdl": "1", "plain": "0"}


def with_variant(name: str, fn):
    """``fn()`` with DELTACONV_PDL set for variant ``name`` (restored afterwards)."""
    old = os.environ.get("DELTACONV_PDL")
    os.environ["DELTACONV_PDL"] = VARIANTS[name]
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop("DELTACONV_PDL", None)
        else:
            os.environ["DELTACONV_PDL"] = old


def alternate(replays: dict, rounds: int = 5, iters: int = 40) -> dict:
    """Median over ``rounds`` alternating rounds of each replay's median ms."""
    times = {k: [] for k in replays}
    for _ in range(rounds):
        for k, fn in replays.items():
            times[k].append(time_cuda(fn, warmup=3, iters=iters))
    return {k: statistics.median(v) for k, v in times.items()}


def kernels(ops, fractions, rounds: int) -> None:
    for op in ops:
        k, depthwise = OPS[op]
        for c, (h, w) in SHAPES:
            x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16)
            x = x.contiguous(memory_format=torch.channels_last)
            groups = c if depthwise else 1
            fan_in = c // groups * k * k
            wt = torch.randn(c, c // groups, k, k, device="cuda", dtype=torch.float16) * (1.0 / fan_in) ** 0.5
            if not depthwise:
                wt = wt.contiguous(memory_format=torch.channels_last)  # what DCConv2d keeps for these convs
            cudnn = time_cuda(capture_graph(lambda: F.conv2d(x, wt, None, 1, k // 2, 1, groups))[0], iters=100)
            print(f"== {op} C={c} {h}x{w}: cuDNN graph {cudnn * 1e3:.1f} us", flush=True)
            for frac in fractions:
                mask = clustered_mask(1, h, w, frac)
                delta = (x * mask).contiguous(memory_format=torch.channels_last)
                args = (delta, mask, wt, None, [1, 1], [k // 2, k // 2], [1, 1], groups, None)
                replays = {v: with_variant(v, lambda: capture_graph(lambda: torch.ops.deltaconv.conv2d(*args))[0])
                           for v in VARIANTS}
                t = alternate(replays, rounds=rounds)
                print(f"  f={frac:<5} pdl {t['pdl'] * 1e3:7.1f} us  plain {t['plain'] * 1e3:7.1f} us  "
                      f"saved {(t['plain'] - t['pdl']) * 1e3:5.1f} us ({t['plain'] / t['pdl']:.3f}x)  "
                      f"vs cuDNN: {cudnn / t['pdl']:.2f}x / {cudnn / t['plain']:.2f}x", flush=True)
            del x, wt
            torch.cuda.empty_cache()


def models(names, n_frames: int, threshold: float, warmup: int = 4) -> None:
    import deltaconv
    from deltaconv.video import find_sample_video, read_frames
    from video_sweep import build

    frames_cpu = list(read_frames(find_sample_video("vtest.avi"), max_frames=n_frames, size=(1080, 1920)))
    for name in names:
        model = build(name, frames_cpu[:4]).cuda().half().to(memory_format=torch.channels_last)
        frames = [f.cuda().half() for f in frames_cpu]
        dms = {}
        for v in VARIANTS:
            dm = deltaconv.convert(model, threshold=threshold, backend="cuda", example_input=frames[0],
                                   cuda_graph=True, check_finite=False)
            with_variant(v, lambda: (dm(frames[0]), dm(frames[1])))  # key frame, then the captured frame
            dms[v] = dm
        t, diff = alternate_frames(dms, frames[2:], warmup)
        print(f"== {name} 1080x1920 fp16 t={threshold}, vtest frames 2-{n_frames - 1} (timed from {2 + warmup}): "
              f"pdl {t['pdl']:.3f} ms  plain {t['plain']:.3f} ms  ({t['plain'] / t['pdl']:.3f}x)  "
              f"max |pdl - plain| {diff:.3g}", flush=True)
        del dms, model, frames
        torch.cuda.empty_cache()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["mobilenet_v2", "resnet50"])
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--fractions", type=float, nargs="*", default=[0.0, 0.01, 0.05, 1.0])
    p.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per kernel cell (default 5)")
    a = p.parse_args(argv)
    from deltaconv.backends import cuda as dc
    if not dc.is_available():
        raise SystemExit(f"launch_ab: the CUDA backend is unavailable: {dc.unavailable_reason()}")
    torch.backends.cudnn.benchmark = True
    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}", flush=True)
    with torch.no_grad():
        if a.fractions:
            kernels(a.ops, a.fractions, a.rounds)
        if a.models:
            models(a.models, a.frames, a.threshold)


if __name__ == "__main__":
    main()
