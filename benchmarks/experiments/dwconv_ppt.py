"""Depthwise 3x3 op time (CUDA-graph replay of one call, median of 200 after 10 warm-up) per
DELTACONV_DW_PPT setting, fp16, against cuDNN at the same shape; the cases are mobilenet_v2-like
depthwise layers at 1080x1920 input. Kept as it ran (benchmarks/results/dwconv_ab.txt section 5):

    DELTACONV_DW_PPT=4 PYTHONPATH=. python benchmarks/experiments/dwconv_ppt.py
"""
import sys, os, torch
sys.path.insert(0, "benchmarks")
from common import clustered_mask, time_cuda, capture_graph
import deltaconv.backends.cuda  # noqa
from deltaconv.modules.linear import kernel_weight_layout
torch.manual_seed(0)
cases = [(64, 1080, 1920, 1), (96, 540, 960, 2), (144, 270, 480, 1), (144, 540, 960, 2), (576, 68, 120, 1), (32, 540, 960, 1)]
ppt = os.environ.get("DELTACONV_DW_PPT", "def")
for c, h, w, s in cases:
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, 1, 3, 3, device="cuda", dtype=torch.half) / 3
    lay = kernel_weight_layout(wt, c)
    wdc = wt if lay is None else wt.contiguous(memory_format=lay)
    res = []
    for frac in (0.0, 0.1, 0.5, 1.0):
        mask = clustered_mask(1, h, w, frac)
        d = (x * mask).contiguous(memory_format=torch.channels_last)
        f = lambda: torch.ops.deltaconv.conv2d(d, mask, wdc, None, [s, s], [1, 1], [1, 1], c, None)
        res.append(time_cuda(capture_graph(f)[0], iters=200))
    cud = time_cuda(capture_graph(lambda: torch.nn.functional.conv2d(x, wt, None, s, 1, 1, c))[0], iters=200)
    print(f"PPT={ppt} C={c} {h}x{w} s{s}: graph ms at 0/0.1/0.5/1.0: " + " ".join(f"{r:.4f}" for r in res) + f"  cudnn {cud:.4f}", flush=True)
