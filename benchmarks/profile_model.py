"""Where the GPU time of a converted model goes: kernels per frame, GPU busy time per frame by
kernel family, and the CUDA-graph replay time per frame, for real video frames.

For each model (built as the video sweep builds it: :func:`load_model`) it converts (CUDA backend,
``--dtype``, ``--threshold``) and reads ``--frames`` frames: a key frame and ``--warmup`` frames run
unprofiled, the rest are profiled eagerly with ``torch.profiler``, summing the device time of every
kernel, grouped by kernel name. It also times the same frames replayed as one CUDA graph per frame
(CUDA events, median) and the dense model replayed as a CUDA graph. ``graph_ms - busy_ms`` is the
time the GPU spends between kernels (launch gaps, tails).

Writes ``<out>/profile_<model>_<H>x<W>.csv`` (kernel, calls_per_frame, us_per_frame, share) and
prints a summary. Run on a CUDA machine::

    PYTHONPATH=. python benchmarks/profile_model.py --models mobilenet_v2 resnet50 --size 1080x1920
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, graphed_model, kernel_family, run_info, time_frames, write_csv  # noqa: E402


def load_model(name: str, frames: list) -> torch.nn.Module:
    """The dense model as the video sweep builds it for torchvision classification and segmentation names
    (``video_sweep.build``: real weights where shipped, else random weights with BatchNorm statistics
    re-estimated on the first 4 ``frames``), so that the densities match the sweep's; any other zoo name
    (``deltaconv.zoo.load``) as the zoo gives it."""
    from deltaconv import zoo
    if zoo.torchvision_names().get(name) in ("classification", "segmentation"):
        from video_sweep import build
        return build(name, frames[:4])
    return zoo.load(name).model


def profile_model(name: str, size: tuple, dtype: torch.dtype, threshold: float, frames: list, warmup: int,
                  out: Path, templates: bool = False) -> dict:
    import deltaconv
    from torch.profiler import ProfilerActivity, profile

    model = load_model(name, frames).cuda().to(dtype).to(memory_format=torch.channels_last)
    xs = [f.cuda().to(dtype) for f in frames]
    dm = deltaconv.convert(model, threshold=threshold, backend="cuda", example_input=xs[0], check_finite=False)
    n_prof = len(xs) - 1 - warmup
    with torch.no_grad():
        for x in xs[:1 + warmup]:
            dm(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for x in xs[1 + warmup:]:
                dm(x)
            torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            fam = kernel_family(ev.name, templates)
            per[fam][0] += 1
            per[fam][1] += ev.device_time
    busy_us = sum(v[1] for v in per.values()) / n_prof
    kernels = sum(v[0] for v in per.values()) / n_prof
    rows = [{"kernel": k, "calls_per_frame": round(c / n_prof, 1), "us_per_frame": round(t / n_prof, 1),
             "share": round(t / n_prof / busy_us, 4)} for k, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1])]
    h, w = size
    write_csv(out / f"profile_{name}_{h}x{w}.csv", rows)

    with torch.no_grad():
        dense_graph, _ = time_frames(graphed_model(model, xs[0]), xs, warmup)
        gm = deltaconv.convert(model, threshold=threshold, backend="cuda", example_input=xs[0], check_finite=False,
                               cuda_graph=True)
        graph, _ = time_frames(gm, xs, warmup + 1)  # the first frame is a key frame (and the capture)
    summary = {"model": name, "resolution": f"{h}x{w}", "dtype": str(dtype).split(".")[-1], "threshold": threshold,
               "kernels_per_frame": round(kernels, 1), "busy_ms": round(busy_us / 1000, 3),
               "graph_ms": round(graph, 3), "dense_graph_ms": round(dense_graph, 3)}
    print(f"== {name} {h}x{w} {summary['dtype']} t={threshold}: {summary}")
    for r in rows[:25 if templates else 15]:
        print(f"   {r['kernel']:60s} {r['calls_per_frame']:7.1f} calls {r['us_per_frame']:9.1f} us {r['share']:6.1%}")
    return summary


def main(argv=None) -> None:
    from deltaconv.video import find_sample_video, read_frames

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet50"])
    p.add_argument("--size", default="1080x1920", help="HxW (default 1080x1920)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--threshold", type=float, default=0.02,
                   help="every layer's threshold (default 0.02); 1e6 sends nothing after the key frame, "
                        "which profiles the fixed cost of a frame")
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--video", type=Path, default=None)
    p.add_argument("--start", type=int, default=0, help="first frame of the video read (default 0)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--templates", action="store_true",
                   help="group kernels by their template arguments too (each specialisation a row)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_model: needs a CUDA GPU")
    size = tuple(int(v) for v in args.size.lower().split("x"))
    video = args.video or find_sample_video("vtest.avi")
    frames = list(read_frames(video, max_frames=args.frames, size=size, start=args.start))
    dtype = getattr(torch, args.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    summaries = [profile_model(m, size, dtype, args.threshold, frames, args.warmup, args.out, args.templates)
                 for m in args.models]
    info = run_info()
    write_csv(args.out / "profile_summary.csv", [{**s, **info} for s in summaries])


if __name__ == "__main__":
    main()
