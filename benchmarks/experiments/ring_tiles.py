"""The 3x3 conv's fine launch and its two coarse launches at n listed tiles (as fine_coarse_tiles.py):
fine = DELTACONV_TC_FINE_MAX=n, ring / tc = the warp-specialised coarse kernel (conv3x3_ring.cuh) /
conv3x3_tc_kernel's coarse launch (DELTACONV_TC_RING=0) with DELTACONV_TC_FINE_MAX=n-1, and the op as
shipped with each (default_ring, default_tc). CUDA-graph replay, us (min of 2 medians of 60), fp16.
Usage: PYTHONPATH=. python benchmarks/experiments/ring_tiles.py [--configs 0 1]"""
import argparse
import os
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402

from common import capture_graph, run_info, spread_tiles_mask, time_cuda  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402
import deltaconv.backends.cuda  # noqa: E402,F401

COUNTS = [33, 50, 66, 80, 100, 132, 150, 200, 264, 300, 400, 528]
# (C, (H, W), dilation); spread_tiles_mask has no masks for dilation 4
CONFIGS = [(256, (270, 480), 1), (256, (68, 120), 1), (512, (34, 60), 1), (256, (135, 240), 2)]
# name: (DELTACONV_TC_RING, DELTACONV_TC_FINE_MAX as n + this, None: unset)
VARIANTS = {"fine": ("1", 0), "ring": ("1", -1), "tc": ("0", -1), "default_ring": ("1", None),
            "default_tc": ("0", None)}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--configs", type=int, nargs="+", default=list(range(len(CONFIGS))))
args = ap.parse_args()
info = run_info()
print(f"# {info['device']}, {info['date']}, torch {torch.__version__}")
for i in args.configs:
    c, (h, w), dil = CONFIGS[i]
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
    wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
    for n in COUNTS:
        mask = spread_tiles_mask(h, w, n, dil)  # n output tiles, each block's halo inside its tile
        if mask is None:
            break
        delta = (x * mask).contiguous(memory_format=torch.channels_last)

        def f():
            return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [dil, dil], [dil, dil], 1, None)

        res = {}
        for name, (ring, fm) in VARIANTS.items():
            os.environ["DELTACONV_TC_RING"] = ring
            os.environ.pop("DELTACONV_TC_FINE_MAX", None)
            if fm is not None:
                os.environ["DELTACONV_TC_FINE_MAX"] = str(n + fm)
            gr = capture_graph(f)[0]
            res[name] = min(time_cuda(gr, iters=60) for _ in range(2)) * 1000
        os.environ.pop("DELTACONV_TC_FINE_MAX", None)
        os.environ.pop("DELTACONV_TC_RING", None)
        print(f"C={c} {h}x{w} d{dil} tiles={n}: " + " ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)
    del x, wt, wdc
    torch.cuda.empty_cache()
