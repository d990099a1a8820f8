"""How full are the active 8x8 tiles of the 3x3 tensor-core convolutions on real video?

The 3x3 tensor-core conv computes whole 8x8 output tiles; the opt-in pixel-row path
(``DELTACONV_TC_SPLIT``, see README: per tile, or for every tile with ``DELTACONV_TC_SPLIT=64``)
computes only the active output pixels and paid off, for all tiles at once, when they filled less
than about 0.35-0.4 of the active tiles (``results/conv3x3_paths.txt``, ``mma.sync`` kernels). This
tool measures that fill per 3x3 convolution of a converted model over video frames, with the
reference backend (runs on CPU: masks do not depend on the backend), and writes
``results/tile_fill.csv``:

    PYTHONPATH=. python benchmarks/tile_fill.py --model resnet50 --size 576 768 --frames 8 \
        --videos vtest.avi one-by-one-person-detection.mp4

Columns: layer, stride, channels, threshold, density (active output pixels / output pixels),
tiles (active tiles / tiles), fill (active output pixels / (64 x active tiles), the pixels the 3x3
kernel computes: tiles that overhang the image count 64 pixels); means over the delta frames
(key frame excluded).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, tile_stats, write_csv  # noqa: E402
from video_sweep import build, main_out  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.modules.linear import DCConv2d  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402


def tensor_core_3x3(m: DCConv2d) -> bool:
    """Whether ``m`` takes the 3x3 tensor-core path for fp16 / bf16 activations."""
    return (m.kernel_size == (3, 3) and m.groups == 1 and m.dilation == (1, 1) and m.stride[0] == m.stride[1]
            and m.stride[0] in (1, 2) and m.in_channels % 8 == 0 and m.out_channels % 8 == 0)


def _mean(values) -> float:
    """Mean of the non-NaN values, rounded; NaN when there are none."""
    kept = [v for v in values if not math.isnan(v)]
    return round(statistics.mean(kept), 4) if kept else float("nan")


def measure(model_name: str, size: tuple[int, int], n_frames: int, thresholds: list[float], video: Path) -> list[dict]:
    frames = list(read_frames(video, max_frames=n_frames, size=size))
    model = build(model_name, frames[:4], device="cpu")
    rows = []
    for t in thresholds:
        dm = deltaconv.convert(model, threshold=t, backend="reference", example_input=frames[0])
        seen: dict[str, list] = {}
        hooks = []
        for name, mod in dm.named_modules():
            if isinstance(mod, DCConv2d) and tensor_core_3x3(mod):
                def hook(mod, inputs, out, name=name):
                    seen.setdefault(name, []).append((mod, tile_stats(out.mask)))
                hooks.append(mod.register_forward_hook(hook))
        with torch.no_grad():
            for f in tqdm(frames, desc=f"{video.name} t={t:g}", unit="frame", leave=False):
                main_out(dm(f))
        for h in hooks:
            h.remove()
        for name, obs in seen.items():
            mod = obs[0][0]
            per_frame = [o[1] for o in obs[1:]]  # key frame excluded
            rows.append({"model": model_name, "resolution": f"{size[0]}x{size[1]}", "layer": name,
                         "stride": mod.stride[0], "channels": f"{mod.in_channels}->{mod.out_channels}",
                         "threshold": t,
                         "density": _mean(p[0] for p in per_frame), "tiles": _mean(p[1] for p in per_frame),
                         "fill": _mean(p[2] for p in per_frame),
                         "frames": len(per_frame), "video": video.name})
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items() if k != "model"), flush=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--size", nargs=2, type=int, default=[576, 768], metavar=("H", "W"))
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--thresholds", nargs="+", type=float, default=[0.0, 0.02])
    p.add_argument("--videos", nargs="+", default=["vtest.avi"],
                   help="sample video names (found like the demos find them) or paths")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if not (getattr(torchvision.models, args.model, None) or getattr(torchvision.models.segmentation, args.model, None)):
        p.error(f"--model: no torchvision model named {args.model!r}")
    rows = []
    for v in args.videos:
        video = Path(v) if Path(v).exists() else find_sample_video(v)
        rows += measure(args.model, tuple(args.size), args.frames, args.thresholds, video)
    write_csv(args.out / "tile_fill.csv", rows)
    fills = [r["fill"] for r in rows if not math.isnan(r["fill"])]
    if fills:
        print(f"{len(rows)} layer rows; fill min {min(fills):.2f}, median {statistics.median(fills):.2f}, "
              f"max {max(fills):.2f}; rows below 0.35: {sum(f < 0.35 for f in fills)}")


if __name__ == "__main__":
    main()
