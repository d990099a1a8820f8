# An experiment, run from the repository root on a CUDA machine:
#   PYTHONPATH=. python benchmarks/experiments/pooled_speed.py --help
"""Experiment: speed, density and error of the pooled truncation measure on the CUDA backend.

MobileNetV2 (ImageNet weights), channels_last, in ``--dtype`` (default float16) on the CUDA backend
replayed as one CUDA graph per frame, on ``--frames`` frames of a sample video from ``--start``,
against the dense model of the same dtype replayed as a CUDA graph, in one run. Each config is

* ``rms:T``       every non-linear layer per pixel (``truncation="rms"``) at threshold T;
* ``pooled:T``    every non-linear layer pooled (``truncation="pooled"``) at T;
* ``hybrid:T:T2`` pooled at T in the layers at stride 4 and coarser, per pixel (rms) at T2 in the
  stride-2 layers (the split ``pooled_truncation.py`` found on vtest, density_experiments.txt 4).

The input sparsifier's threshold is ``--t-in`` in every config. Printed per config: median ms per
frame (CUDA events, after ``--warmup`` frames) and the speedup over the dense graph, the
FLOPs-weighted density (mean over the frames after the key frame), and the output's relative error
against the dense model of the same dtype and against the float32 dense model (mean and max over
the frames after the key frame). The key frame (the first) is run first, outside the timing.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import graphed_model, kernel_family, time_frames  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.fidelity import flops_density, video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402


def layer_strides(dm, frame: torch.Tensor) -> dict[str, int]:
    """``{layer name: stride}`` of the non-linear layers: their output's stride against the frame,
    from the pixels each counted on one frame (the model is reset afterwards)."""
    with torch.no_grad():
        dm(frame)
    frame_pixels = frame.shape[0] * frame.shape[-2] * frame.shape[-1]
    strides = {s["name"]: round(math.sqrt(frame_pixels / s["pixels"]))
               for s in dm.stats() if "measure" in s and s["kind"] != "sparsify"}
    dm.reset()
    dm.reset_stats()
    return strides


def configure(dm, spec: str, t_in: float, strides: dict[str, int]) -> str:
    """Set ``dm``'s measures and thresholds from ``spec`` (see the module doc); returns a label."""
    kind, *ts = spec.split(":")
    t = float(ts[0])
    dm.set_threshold_all(t)
    if kind in ("rms", "pooled"):
        dm.truncation = kind
    elif kind == "hybrid":
        fine = [name for name, s in strides.items() if s <= 2]
        dm.truncation = {**{name: "rms" for name in fine}, "*": "pooled"}
        dm.load_thresholds({name: float(ts[1]) for name in fine})
    else:
        raise SystemExit(f"pooled_speed: config must be rms:T, pooled:T or hybrid:T:T2, got {spec!r}")
    dm.load_thresholds({dm.delta_layers()[0].layer_name: t_in})
    return spec


def profile_kernels(label: str, spec: str, model, frames: list, a) -> None:
    """Device time per frame by kernel family of the config run eagerly (torch.profiler) on the last
    ``a.profile`` frames, after the frames before them."""
    from torch.profiler import ProfilerActivity, profile

    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0], check_finite=False)
    configure(dm, spec, a.t_in, layer_strides(dm, frames[0]))
    with torch.no_grad():
        for f in frames[:-a.profile]:
            dm(f)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for f in frames[-a.profile:]:
                dm(f)
            torch.cuda.synchronize()
    per: dict[str, list] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            entry = per.setdefault(kernel_family(ev.name), [0, 0.0])
            entry[0] += 1
            entry[1] += ev.device_time
    busy = sum(t for _, t in per.values()) / a.profile
    print(f"      profile of {label} (eager, {a.profile} frames): busy {busy / 1000:.3f} ms per frame", flush=True)
    for name, (calls, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:10]:
        print(f"         {name:<48} {calls / a.profile:6.1f} calls {t / a.profile:8.1f} us", flush=True)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--video", default="vtest.avi")
    p.add_argument("--size", type=int, nargs=2, default=(1080, 1920))
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--t-in", type=float, default=0.01, help="input sparsifier threshold")
    p.add_argument("--configs", nargs="+", default=["rms:0.004", "pooled:0.004", "hybrid:0.004:0.001"])
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print each config's device time by kernel over its last N frames, run eagerly")
    a = p.parse_args(argv)
    if a.frames <= a.warmup:
        p.error(f"--frames ({a.frames}) must exceed --warmup ({a.warmup})")
    if not torch.cuda.is_available():
        raise SystemExit("pooled_speed: needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    dtype = getattr(torch, a.dtype)
    ref32 = mobilenet_v2_imagenet().cuda().eval().to(memory_format=torch.channels_last)
    model = mobilenet_v2_imagenet().cuda().eval().to(dtype).to(memory_format=torch.channels_last)
    frames = [f.cuda().to(dtype).contiguous(memory_format=torch.channels_last)
              for f in video_frames(a.video, tuple(a.size), max_frames=a.frames, start=a.start)]
    with torch.no_grad():
        dense32 = [ref32(f.float()) for f in frames[1:]]
        dense_ms, dense = time_frames(graphed_model(model, frames[0]), frames[1:], a.warmup)
    span = f"{a.start}..{a.start + len(frames) - 1}"
    print(f"{a.video} {a.size[0]}x{a.size[1]} {a.dtype} frames {span}: dense CUDA graph {dense_ms:.3f} ms per frame",
          flush=True)
    for spec in a.configs:
        dm = deltaconv.convert(model, backend="cuda", example_input=frames[0], cuda_graph=True, check_finite=False)
        label = configure(dm, spec, a.t_in, layer_strides(dm, frames[0]))
        with torch.no_grad():
            dm(frames[0])  # the key frame, outside the timing and the statistics
            dm.reset_stats()
            ms, outs = time_frames(dm, frames[1:], a.warmup)
        density = flops_density(dm.stats())
        err = [rel(o, d) for o, d in zip(outs, dense)]
        err32 = [rel(o, d) for o, d in zip(outs, dense32)]
        print(f"   {label:<22} {ms:.3f} ms ({dense_ms / ms:.2f}x)  FLOPs density {density:.3f}  "
              f"err vs dense {a.dtype} mean {statistics.mean(err):.4f} max {max(err):.4f}  "
              f"vs float32 mean {statistics.mean(err32):.4f}", flush=True)
        if a.profile:
            profile_kernels(label, spec, model, frames, a)
        del dm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
