"""The block ranks of the 3x3 fine launch (block_work, csrc/conv/conv_common.cuh) against
block-index order: DELTACONV_SPREAD=1 / 0 alternated in one process, 3x3 and 1x1 convs at n listed
tiles spread over the map (benchmarks/results/block_spread_ab.txt section 3). CUDA-graph replay, us
(min of 2 medians of 60). Kept as it ran for the committed version (2026-11-22, 01:24 UTC).
Usage: PYTHONPATH=. python benchmarks/experiments/block_ranks_ab.py"""
import os, sys
sys.path.insert(0, "benchmarks")
import torch
from common import capture_graph, time_cuda
from deltaconv.modules.linear import kernel_weight_layout
import deltaconv.backends.cuda  # noqa: F401
COUNTS = [8, 16, 50, 100, 175, 300]
CONFIGS = [(64, (1080, 1920), 3), (128, (540, 960), 3), (256, (270, 480), 3),
           (128, (135, 240), 3), (256, (68, 120), 3), (512, (34, 60), 3),
           (64, (540, 960), 1), (256, (135, 240), 1), (1024, (68, 120), 1)]
for c, (h, w), k in CONFIGS:
    cout = c if k == 3 else c // 4 if c >= 1024 else c
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(cout, c, k, k, device="cuda", dtype=torch.float16) * (1.0 / (c * k * k)) ** 0.5
    wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
    th, tw = (h + 7) // 8, (w + 7) // 8
    g = torch.Generator().manual_seed(0)
    cand = torch.tensor([(i, j) for i in range(0, th) for j in range(0, tw)])
    perm = torch.randperm(len(cand), generator=g)
    for n in COUNTS:
        if n > len(cand) * 0.8:
            break
        mask = torch.zeros(1, 1, h, w, dtype=torch.bool)
        for i, j in cand[perm[:n]].tolist():
            mask[0, 0, i * 8 + 1:i * 8 + 7, j * 8 + 1:j * 8 + 7] = True
        mask = mask.cuda()
        delta = (x * mask).contiguous(memory_format=torch.channels_last)
        pad = k // 2
        f = lambda: torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [pad, pad], [1, 1], 1, None)  # noqa: E731
        res = {}
        for name, v in (("spread", "1"), ("index", "0"), ("spread2", "1"), ("index2", "0")):
            os.environ["DELTACONV_SPREAD"] = v
            gr = capture_graph(f)[0]
            res[name] = time_cuda(gr, iters=60) * 1000
        os.environ.pop("DELTACONV_SPREAD", None)
        sp, ix = min(res["spread"], res["spread2"]), min(res["index"], res["index2"])
        print(f"{k}x{k} C={c}->{cout} {h}x{w} tiles={n}: spread {sp:.1f} index {ix:.1f} us  ({sp - ix:+.1f})", flush=True)
