"""Depthwise op time per DELTACONV_DW_PPT setting for other geometries (stride 2, 5x5, dilation 2),
fp16, graph replay of one call against cuDNN. Kept as it ran (benchmarks/results/dwconv_ab.txt
section 6):

    DELTACONV_DW_PPT=2 PYTHONPATH=. python benchmarks/experiments/dwconv_ppt_geometries.py
"""
import sys, os, torch
sys.path.insert(0, "benchmarks")
from common import clustered_mask, time_cuda, capture_graph
import deltaconv.backends.cuda  # noqa
from deltaconv.modules.linear import kernel_weight_layout
torch.manual_seed(0)
# (C, H, W, stride, kernel, dilation): mobilenet_v2 / mobilenet_v3_large-like depthwise layers at 1080p input
cases = [(96, 540, 960, 2, 3, 1), (144, 540, 960, 2, 3, 1), (192, 270, 480, 2, 3, 1), (72, 540, 960, 2, 5, 1),
         (120, 270, 480, 1, 5, 1), (240, 135, 240, 2, 5, 1), (480, 68, 120, 1, 3, 1), (960, 68, 120, 1, 5, 2), (64, 540, 960, 1, 3, 2)]
ppt = os.environ.get("DELTACONV_DW_PPT", "def")
for c, h, w, s, k, d in cases:
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, 1, k, k, device="cuda", dtype=torch.half) / k
    lay = kernel_weight_layout(wt, c)
    wdc = wt if lay is None else wt.contiguous(memory_format=lay)
    pad = k // 2 * d
    res = []
    for frac in (0.1, 0.5, 1.0):
        mask = clustered_mask(1, h, w, frac)
        dl = (x * mask).contiguous(memory_format=torch.channels_last)
        f = lambda: torch.ops.deltaconv.conv2d(dl, mask, wdc, None, [s, s], [pad, pad], [d, d], c, None)
        res.append(time_cuda(capture_graph(f)[0], iters=200))
    cud = time_cuda(capture_graph(lambda: torch.nn.functional.conv2d(x, wt, None, s, pad, d, c))[0], iters=200)
    print(f"PPT={ppt} C={c} {h}x{w} s{s} k{k} d{d}: graph ms at 0.1/0.5/1.0: " + " ".join(f"{r:.4f}" for r in res) + f"  cudnn {cud:.4f}", flush=True)
