"""The activation / add_activation op alone on one map (fp16, ReLU, threshold 0.02, changes in 8x8
blocks): us per call (10 calls per CUDA-event pair, median of 40 after 8 warm-up) and GB/s by the
byte model of 16 B per element when every pixel is sent (18 B with the residual operand), beside a
float32 copy of 256 MB for the bandwidth the GPU reaches. Kept as it ran for
benchmarks/results/activation_kernel_experiments.txt section 5 (NVIDIA H200, 2026-11-22), where the
builds under test read DELTACONV_ACT_PREFETCH or DELTACONV_ACT_WIDE (printed as the row's tag; the
submitted kernels read neither). Run on a CUDA machine from the repository root:
    PYTHONPATH=. python benchmarks/experiments/activation_bandwidth.py
"""
import os
import sys
from pathlib import Path

import torch

import deltaconv._extension as _e

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import time_cuda  # noqa: E402

assert _e.load()
torch.manual_seed(0)
ops = torch.ops.deltaconv


def timeit(fn):
    """us per call: 10 calls between two CUDA events, the median of 40 after 8 warm-up pairs."""
    return time_cuda(lambda: [fn() for _ in range(10)], warmup=8, iters=40) * 100


cl = torch.channels_last
tag = os.environ.get("DELTACONV_ACT_WIDE", "-")
x = torch.empty(64 << 20, device="cuda"); y = torch.empty_like(x)
t = timeit(lambda: y.copy_(x))
print(f"pf={tag} copy fp32 256MB: {t:.1f} us {2 * x.numel() * 4 / t / 1e3:.0f} GB/s")
for C, H, W in [(256, 270, 480), (512, 135, 240), (1024, 135, 240), (2048, 135, 240)]:
    for res in (False, True):
        if res and C < 256: continue
        for dens in (1.0, 0.3):
            d = (torch.randn(1, C, H, W, device="cuda") * 0.1).half().to(memory_format=cl)
            b = (torch.randn(1, C, H, W, device="cuda") * 0.1).half().to(memory_format=cl)
            tiles = torch.rand(1, 1, (H + 7) // 8, (W + 7) // 8, device="cuda") < dens
            m = tiles.repeat_interleave(8, 2).repeat_interleave(8, 3)[:, :, :H, :W].contiguous()
            acc = torch.zeros(1, C, H, W, device="cuda").to(memory_format=cl)
            sent = torch.zeros(1, C, H, W, device="cuda").half().to(memory_format=cl)
            if res:
                fn = lambda: ops.add_activation(d, m, b, m, 1.0, acc, sent, "relu", 0.0, 0.02, None, False)
            else:
                fn = lambda: ops.activation(d, m, acc, sent, "relu", 0.0, 0.02, None, False)
            t = timeit(fn)
            act = m.float().mean().item()
            gbs = C * H * W * act * (18 if res else 16) / t / 1e3
            print(f"pf={tag} C={C} {H}x{W} res={int(res)} dens={act:.2f}: {t:.1f} us {gbs:.0f} GB/s")
