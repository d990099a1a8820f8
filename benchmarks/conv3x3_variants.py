"""A/B of the 3x3 tensor-core conv's variants in one process: the weight layout and the per-tile split.

    PYTHONPATH=. python benchmarks/conv3x3_variants.py [VARIANT ...]

Per shape (C in = C out, resolution, dilation) and changed fraction (24-pixel blobs, as
``kernel_sweep.py``), the median of 100 CUDA-graph replays of ``torch.ops.deltaconv.conv2d`` (fp16)
for each variant; the variables are read when each graph is captured, so all variants run in one
process on the same inputs:

* ``old``: dense (contiguous) weight, relaid out by the op on every call; no split;
* ``cl``: channels_last weight (what ``DCConv2d`` keeps), no relayout; no split;
* ``s16``: ``cl`` with ``DELTACONV_TC_SPLIT=16`` (tiles with at most 16 active pixels are sparse;
  their pixel rows run on the gathered-taps GEMM when there are enough, see ``conv::TileSplit``);
* ``s16m0``: the split always runs (``DELTACONV_TC_SPLIT_MIN=0``);
* ``s16inf``: the split never runs (the sparse tiles are listed apart, the 3x3 kernel takes them).

Each row gives the fraction of active 8x8 output tiles and their fill (active pixels / pixels of
the active tiles), the variants' times in us, and the best variant's and ``old``'s speedup against
cuDNN with a channels_last weight ("cuDNN(cl)"; the header line of each shape gives cuDNN with both
weight layouts). Results: ``benchmarks/results/tile_split_ab.txt``.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import capture_graph, clustered_mask, time_cuda, tile_stats  # noqa: E402

#: (channels, (H, W), dilation): kernel_sweep's 3x3 shapes and dilated ones
SHAPES = [(64, (1080, 1920), 1), (128, (540, 960), 1), (256, (270, 480), 1), (256, (135, 240), 2),
          (512, (135, 240), 4), (64, (540, 960), 2)]
FRACS = [0.0, 0.01, 0.05, 0.1, 0.25, 1.0]
#: name: (DELTACONV_TC_SPLIT, DELTACONV_TC_SPLIT_MIN or None for the default, channels_last weight)
ALL = {"old": ("0", None, False), "cl": ("0", None, True), "s16": ("16", None, True), "s16m0": ("16", "0", True),
       "s16inf": ("16", "1000000000", True)}


def main(names) -> None:
    from deltaconv.backends import cuda as dc
    if not dc.is_available():
        raise SystemExit(f"conv3x3_variants: the CUDA backend is unavailable: {dc.unavailable_reason()}")
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise SystemExit(f"conv3x3_variants: unknown variants {unknown}; choose from {list(ALL)}")
    variants = {k: ALL[k] for k in names} if names else ALL
    torch.backends.cudnn.benchmark = True
    print("variants:", variants, flush=True)
    for c, (h, w), d in SHAPES:
        x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
        wt = (torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5)
        wcl = wt.contiguous(memory_format=torch.channels_last)
        cud = time_cuda(capture_graph(lambda: F.conv2d(x, wt, None, 1, d, d))[0], iters=100)
        cudcl = time_cuda(capture_graph(lambda: F.conv2d(x, wcl, None, 1, d, d))[0], iters=100)
        print(f"== C={c} {h}x{w} d={d}: cuDNN graph {cud*1e3:.1f} us (weight contiguous) {cudcl*1e3:.1f} us "
              "(channels_last)", flush=True)
        for frac in FRACS:
            mask = clustered_mask(1, h, w, frac)
            out_mask = F.max_pool2d(F.pad(mask.float(), (d, d, d, d)), 3, 1, 0, d) > 0
            _, tiles, fill = tile_stats(out_mask)
            delta = (x * mask).contiguous(memory_format=torch.channels_last)
            res = {}
            for name, (split, least, channels_last) in variants.items():
                os.environ["DELTACONV_TC_SPLIT"] = split
                os.environ.pop("DELTACONV_TC_SPLIT_MIN", None)
                if least is not None:
                    os.environ["DELTACONV_TC_SPLIT_MIN"] = least
                weight = wcl if channels_last else wt
                args = (delta, mask, weight, None, [1, 1], [d, d], [d, d], 1, None)
                res[name] = time_cuda(capture_graph(lambda: torch.ops.deltaconv.conv2d(*args))[0], iters=100)
            best = min(res, key=res.get)
            line = (f"  f={frac:<5} tiles {tiles:.3f} fill {fill:.2f} | "
                    + " ".join(f"{k} {v*1e3:6.1f}" for k, v in res.items())
                    + f" | best {best}: {cudcl/res[best]:.2f}x cuDNN(cl)")
            if "old" in res:
                line += f", old {cudcl/res['old']:.2f}x"
            print(line, flush=True)
    for k in ("DELTACONV_TC_SPLIT", "DELTACONV_TC_SPLIT_MIN"):
        os.environ.pop(k, None)


if __name__ == "__main__":
    main(sys.argv[1:])
