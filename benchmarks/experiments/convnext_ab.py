"""ConvNeXt with its channels-last blocks kept channels-first (``deltaconv.layout``: per-pixel layer
norm and 1x1 convolutions) against the conversion before it (each LayerNorm a dense fallback, the
pointwise Linears on the channels-last view), and the dense model replayed as a CUDA graph, in one
process:

    PYTHONPATH=. python benchmarks/experiments/convnext_ab.py [--models convnext_tiny] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--starts 0 200] [--thresholds 0.02 1e6]

float16, 1080x1920, CUDA-graph replay; the three run frame by frame in turn on the same frames (the
first two are the key frame and the captured one), medians after ``--warmup`` frames (CUDA events).
Random weights (none ship offline), with every ``layer_scale`` set to 0.2-0.5 (torchvision
initialises it to 1e-6, which makes each block nearly the identity; trained ConvNeXts have far
larger ones) and LayerNorm affine terms away from 1 / 0. Relative error of the logits against the
dense float16 model, and the mean updated-pixel density over the layers. Results:
``benchmarks/results/convnext_ab.txt``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import alternate_frames, run_info  # noqa: E402


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.8 + 0.6)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
            scale = getattr(m, "layer_scale", None)
            if isinstance(scale, torch.nn.Parameter):
                scale.copy_(torch.rand(scale.shape, generator=g) * 0.3 + 0.2)
    return model


def describe(result) -> str:
    err, density, flops, fallbacks = result
    return f"rel err {err:.2e}, mean density {density:.3f}, FLOPs density {flops:.3f}, {fallbacks} fallbacks"


def profile(dm, frames) -> None:
    """GPU time per kernel family of ``dm`` (eager) over ``frames[2:]``, per frame (torch.profiler)."""
    from collections import defaultdict

    from common import kernel_family
    from torch.profiler import ProfilerActivity, profile as torch_profile
    per = defaultdict(lambda: [0, 0.0])
    with torch.no_grad():
        dm.reset()
        dm(frames[0]), dm(frames[1])
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for f in frames[2:]:
                dm(f)
            torch.cuda.synchronize()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            fam = per[kernel_family(ev.name)]
            fam[0] += 1
            fam[1] += ev.device_time
    n = len(frames) - 2
    total = sum(t for _, t in per.values()) / n
    print(f"   profile (eager, kernels only): {total / 1e3:.3f} ms per frame", flush=True)
    for name, (calls, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"   {name:58s} {calls / n:6.1f} calls {us / n:8.1f} us {us / n / total:6.1%}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["convnext_tiny"])
    p.add_argument("--videos", nargs="*", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    p.add_argument("--starts", type=int, nargs="*", default=[0, 200])
    p.add_argument("--thresholds", type=float, nargs="*", default=[0.02, 1e6])
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--size", type=int, nargs=2, default=[1080, 1920])
    p.add_argument("--profile", action="store_true", help="GPU time per kernel family of the channels-first "
                   "model at the first threshold (eager, torch.profiler)")
    a = p.parse_args(argv)
    import deltaconv
    conversion = sys.modules["deltaconv.convert"]  # the module (deltaconv.convert is the function)
    from deltaconv.cuda_graphs import graphed_model
    from deltaconv.video import find_sample_video, read_frames

    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}", flush=True)
    layout_pass = conversion.keep_channels_first
    for name in a.models:
        model = build(name).cuda().half().to(memory_format=torch.channels_last)
        for video in a.videos:
            for start in a.starts:
                frames = [f.cuda().half() for f in read_frames(find_sample_video(video), start=start,
                                                               max_frames=a.frames, size=tuple(a.size))]
                if len(frames) < a.frames:
                    continue
                for t in a.thresholds:
                    runs, dms = {}, {}
                    with torch.no_grad():
                        runs["dense"] = graphed_model(model, frames[0])
                        for variant in ("channels_first", "before"):
                            conversion.keep_channels_first = layout_pass if variant == "channels_first" else (
                                lambda graph, root: 0)
                            dm = deltaconv.convert(model, threshold=t, backend="cuda", example_input=frames[0],
                                                   cuda_graph=True, check_finite=False)
                            conversion.keep_channels_first = layout_pass
                            dm(frames[0]), dm(frames[1])  # key frame, then the captured frame
                            runs[variant] = dms[variant] = dm
                        ms, _ = alternate_frames(runs, frames[2:], a.warmup)
                        errs = {v: [] for v in dms}
                        for v in dms:  # errors and densities on the same frames again, eagerly
                            conversion.keep_channels_first = layout_pass if v == "channels_first" else (
                                lambda graph, root: 0)
                            dm = deltaconv.convert(model, threshold=t, backend="cuda", example_input=frames[0])
                            conversion.keep_channels_first = layout_pass
                            for f in frames:
                                y, r = dm(f).float(), model(f).float()
                                errs[v].append(((y - r).norm() / r.norm()).item())
                            layers = [s for s in dm.stats() if s["kind"] != "densify"]
                            dens = statistics.mean(s["mean_density"] for s in layers)
                            flops = sum(s["mean_flops_done"] for s in layers) / sum(s["flops_dense"] for s in layers)
                            errs[v] = (statistics.mean(errs[v][1:]), dens, flops, len(dm.report.fallbacks))
                            if a.profile and v == "channels_first" and t == a.thresholds[0]:
                                profile(dm, frames)
                    print(f"== {name} {a.size[0]}x{a.size[1]} fp16 {video} frames {start + 2}-{start + a.frames - 1} "
                          f"t={t:g}: dense graph {ms['dense']:.3f} ms | channels-first {ms['channels_first']:.3f} ms "
                          f"({ms['dense'] / ms['channels_first']:.2f}x; {describe(errs['channels_first'])}) | "
                          f"before {ms['before']:.3f} ms ({ms['dense'] / ms['before']:.2f}x; "
                          f"{describe(errs['before'])})", flush=True)
                    del runs, dms
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
