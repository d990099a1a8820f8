"""The 3x3 tensor-core conv's fine and coarse launches at n listed tiles, with the same launches
(benchmarks/results/block_spread_ab.txt section 2): fine = DELTACONV_TC_FINE_MAX=n (a fine grid of n
x channel blocks), coarse = n - 1 (the coarse launch runs, the fine grid of n - 1 exits), default =
the op as shipped. CUDA-graph replay, us (min of 2 medians of 60). Kept as it ran (2026-11-22).
Usage: PYTHONPATH=. python benchmarks/experiments/fine_coarse_tiles.py"""
import os, sys
sys.path.insert(0, "benchmarks")
import torch
from common import capture_graph, spread_tiles_mask, time_cuda
from deltaconv.modules.linear import kernel_weight_layout
import deltaconv.backends.cuda  # noqa: F401
COUNTS = [8, 16, 33, 50, 66, 80, 100, 120, 132, 150, 175, 200, 232, 264, 300, 350]
CONFIGS = [(64, (1080, 1920), 1), (128, (540, 960), 1), (256, (270, 480), 1),
           (64, (270, 480), 1), (128, (135, 240), 1), (256, (68, 120), 1), (512, (34, 60), 1), (256, (135, 240), 2)]
for c, (h, w), dil in CONFIGS:
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
    wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
    out = []
    for n in COUNTS:
        mask = spread_tiles_mask(h, w, n, dil)  # halo inside the tile
        if mask is None:
            break
        delta = (x * mask).contiguous(memory_format=torch.channels_last)
        f = lambda: torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [dil, dil], [dil, dil], 1, None)  # noqa: E731
        mo = torch.nn.functional.max_pool2d(mask.float(), 3, 1, dil, dil) > 0
        nt = int((torch.nn.functional.max_pool2d(mo.float(), 8, 8, ceil_mode=True) > 0).sum())
        res = {}
        for name, v in (("fine", str(nt)), ("coarse", str(nt - 1)), ("default", None)):
            os.environ.pop("DELTACONV_TC_FINE_MAX", None)
            if v is not None:
                os.environ["DELTACONV_TC_FINE_MAX"] = v
            gr = capture_graph(f)[0]
            res[name] = min(time_cuda(gr, iters=60) for _ in range(2)) * 1000
        os.environ.pop("DELTACONV_TC_FINE_MAX", None)
        print(f"C={c} {h}x{w} d{dil} tiles={nt}: fine {res['fine']:.1f} coarse {res['coarse']:.1f} default {res['default']:.1f}"
              f"  {'FINE' if res['fine'] < res['coarse'] else 'coarse'} {'*' if res['default'] > 1.05 * min(res['fine'], res['coarse']) else ''}", flush=True)
