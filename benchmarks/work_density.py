"""Work density of a converted MobileNetV2 on video: FLOPs density next to the work its kernels do.

The FLOPs-weighted density (``deltaconv.fidelity.flops_density``) weights each layer by its dense
multiply-adds, so the deep 1x1 convolutions dominate it. On the GPU most of a frame goes to
memory-bound kernels (activations, depthwise convolutions, mask passes), whose time follows the
elements they touch. This tool reports, over video frames and for each thresholds setting:

- ``flops_density``: the FLOPs-weighted density;
- ``element_density``: active output pixels weighted by each layer's output elements (C x H x W);
- ``work_density``: the same weights, counting what each kernel touches: tiled convolutions (any
  kernel larger than 1x1: the 3x3 and depthwise kernels work on whole 8x8 output tiles) their
  active tiles, non-linear pointwise layers (activations) their active *input* pixels (each one is
  accumulated and tested), every other layer its active output pixels;
- the same per layer kind (``1x1 conv``, ``depthwise``, ``conv``, ``activation``, ...).

Reference backend (masks do not depend on the backend), so it runs on the CPU::

    PYTHONPATH=. python benchmarks/work_density.py --size 1080 1920 --start 200 --frames 48 \\
        --thresholds benchmarks/results/fidelity_thresholds_vtest_0.02.json \\
        benchmarks/results/fidelity_thresholds_vtest_0.02_rms.json

``--thresholds`` takes numbers (one threshold for every layer) or thresholds JSON files (what
``deltaconv calibrate`` writes, with its truncation measure). Writes ``--out`` (CSV, one row per
setting and kind plus an ``all`` row) and prints the table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, tile_stats, write_csv  # noqa: E402
from video_sweep import _threshold_arg  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.delta import Delta  # noqa: E402
from deltaconv.fidelity import compare, video_frames  # noqa: E402
from deltaconv.modules.linear import DCConv2d  # noqa: E402


def layer_kind(layer: torch.nn.Module) -> str:
    """``1x1 conv``, ``depthwise``, ``conv`` (any other convolution), else the layer's ``kind``."""
    if isinstance(layer, DCConv2d):
        if tuple(layer.kernel_size) == (1, 1):
            return "1x1 conv"
        return "depthwise" if layer.groups > 1 and layer.groups == layer.in_channels else "conv"
    return layer.kind


def is_tiled(kind: str) -> bool:
    """Whether the CUDA kernels of this kind work on whole 8x8 output tiles."""
    return kind in ("depthwise", "conv")


def _hook(seen: dict):
    """A forward hook recording, per frame, a layer's output elements, active output pixel
    fraction, active fraction of the pixels its kernel touches and active 8x8 output tile fraction."""
    def hook(module, inputs, out):
        if not (isinstance(out, Delta) and out.mask.dim() == 4):
            return  # the classifier head: no spatial mask
        out_pixels, out_tiles, _ = tile_stats(out.mask)
        touched = out_pixels
        if module.kind == "activation" and inputs and isinstance(inputs[0], Delta):
            touched = tile_stats(inputs[0].mask)[0]
        seen.setdefault(module, []).append((out.value.numel(), out_pixels, touched, out_tiles))
    return hook


def measure(model: torch.nn.Module, frames: list, thresholds, progress: bool = False) -> tuple[dict, list[dict]]:
    """Run ``model`` converted with ``thresholds`` (a number or a JSON path) over ``frames`` (the
    first is the key frame, left out). Returns the summary (logit error, densities) and one row per
    layer kind: ``elements`` (share of output elements), ``pixel_density``, ``work_density``.
    ``progress``: a progress bar over the frames."""
    setting = {"thresholds": str(thresholds)} if isinstance(thresholds, Path) else {"threshold": thresholds}
    dm = deltaconv.convert(model, backend="reference", example_input=frames[0], **setting)
    seen: dict = {}
    hooks = [layer.register_forward_hook(_hook(seen)) for layer in dm.delta_layers()]
    try:
        rep = compare(model, dm, frames, progress=progress)
    finally:
        for h in hooks:
            h.remove()
    kinds: dict[str, list[float]] = {}
    for layer, obs in seen.items():
        obs = obs[1:]  # the key frame is dense
        if not obs:
            continue
        kind = layer_kind(layer)
        elements = obs[0][0]
        pixels = sum(o[1] for o in obs) / len(obs)
        work = sum((o[3] if is_tiled(kind) else o[2]) for o in obs) / len(obs)
        k = kinds.setdefault(kind, [0, 0.0, 0.0, 0])
        k[0] += elements
        k[1] += elements * pixels
        k[2] += elements * work
        k[3] += 1
    total = sum(k[0] for k in kinds.values()) or 1
    rows = [{"kind": kind, "layers": k[3], "elements": round(k[0] / total, 4), "pixel_density": round(k[1] / k[0], 4),
             "work_density": round(k[2] / k[0], 4)} for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1][0])]
    summary = {"frames": rep.frames, "rel_err": round(rep.mean("rel_err"), 5), "flops_density": round(rep.density, 4),
               "element_density": round(sum(k[1] for k in kinds.values()) / total, 4),
               "work_density": round(sum(k[2] for k in kinds.values()) / total, 4)}
    return summary, rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--video", default="vtest.avi", help="sample video name or path (default vtest.avi)")
    p.add_argument("--size", type=int, nargs=2, default=(540, 960), metavar=("H", "W"))
    p.add_argument("--start", type=int, default=200, help="first frame (the key frame; default 200)")
    p.add_argument("--frames", type=int, default=16, help="frames, the key frame included (default 16)")
    p.add_argument("--thresholds", nargs="+", type=_threshold_arg, default=[0.02],
                   help="numbers and / or thresholds JSON files (default 0.02)")
    p.add_argument("--out", type=Path, default=RESULTS / "work_density.csv")
    args = p.parse_args(argv)
    if args.frames < 2:
        p.error(f"--frames must be at least 2 (a key frame and a delta frame), got {args.frames}")
    torch.set_num_threads(min(torch.get_num_threads(), 8))
    from deltaconv.weights import mobilenet_v2_imagenet
    model = mobilenet_v2_imagenet().eval()
    frames = list(video_frames(args.video, tuple(args.size), args.frames, args.start))
    where = {"video": Path(args.video).name, "resolution": f"{args.size[0]}x{args.size[1]}",
             "frames": f"{args.start}-{args.start + len(frames) - 1}"}
    out = []
    for t in args.thresholds:
        t0 = time.time()
        summary, rows = measure(model, frames, t, progress=True)
        setting = t.name if isinstance(t, Path) else f"{t:g}"
        print(f"{setting}: logit rel. error {summary['rel_err']:.4f}, FLOPs density {summary['flops_density']:.3f}, "
              f"element-weighted {summary['element_density']:.3f}, work {summary['work_density']:.3f} "
              f"({time.time() - t0:.0f} s)", flush=True)
        for r in rows:
            print(f"   {r['kind']:20s} {r['layers']:3d} layers {r['elements']:6.1%} of elements: "
                  f"pixels {r['pixel_density']:.3f}, work {r['work_density']:.3f}")
        out.append({**where, "thresholds": setting, "kind": "all", "layers": sum(r["layers"] for r in rows),
                    "elements": 1.0, "pixel_density": summary["element_density"],
                    "work_density": summary["work_density"], "flops_density": summary["flops_density"],
                    "rel_err": summary["rel_err"]})
        out += [{**where, "thresholds": setting, **r, "flops_density": "", "rel_err": ""} for r in rows]
    write_csv(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
