"""The adaptive average pooling op alone at the squeeze-excite and ASPP-pooling shapes of
deeplabv3_mobilenet_v3_large at 1080x1920 input (global pooling, fp16, changes in 8x8 blocks):
us per call, each call replayed from a CUDA graph of 10 calls (op_timing.per_call_us), median
of 30 after warm-up. Run once per build in alternating processes (the op's name is the
same in both builds, so one process cannot load two):
    cp old.so deltaconv/_C.abi3.so && PYTHONPATH=. python benchmarks/experiments/adaptive_pool_ab.py old
    cp new.so deltaconv/_C.abi3.so && PYTHONPATH=. python benchmarks/experiments/adaptive_pool_ab.py new
Kept as it ran for benchmarks/results/fixed_cost.txt section 9 (then with CUDA events around 5
replays at a time; per_call_us now times each replay, common.time_in_graph). Re-run that way on
the same kernels (NVIDIA H200, 2026-11-23 03:44 UTC): 4.8-6.0 us with nothing active, 12.2-14.1 us
at 100 %, against 4.5-5.5 and 12.0-13.8 us in section 9.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_timing import deltaconv_ops, per_call_us  # noqa: E402

ops = deltaconv_ops()
tag = sys.argv[1] if len(sys.argv) > 1 else "-"
# (channels, H, W): the eight squeeze-excite pools and the ASPP pooling
SHAPES = [(72, 135, 240), (120, 135, 240), (480, 68, 120), (672, 68, 120), (960, 68, 120)]
if len(sys.argv) > 2 and sys.argv[2] == "efficientnet_b0":
    # `... adaptive_pool_ab.py TAG efficientnet_b0`: its squeeze-excite pools at 1080x1920 input (the
    # first over 2,025 chunks of 256 pixels)
    SHAPES = [(32, 540, 960), (96, 270, 480), (144, 270, 480), (144, 135, 240), (240, 135, 240),
              (240, 68, 120), (480, 68, 120), (672, 68, 120), (672, 34, 60), (1152, 34, 60)]


torch.manual_seed(0)
for C, H, W in SHAPES:
    for density in (0.0, 0.02, 0.3, 1.0):
        d = (torch.randn(1, C, H, W, device="cuda") * 0.1).half().contiguous(memory_format=torch.channels_last)
        tiles = torch.rand(1, 1, (H + 7) // 8, (W + 7) // 8, device="cuda") < density
        m = tiles.repeat_interleave(8, 2).repeat_interleave(8, 3)[:, :, :H, :W].contiguous()
        t = per_call_us(lambda: ops.adaptive_avg_pool2d(d, m, [1, 1]))
        print(f"{tag} C={C} {H}x{W} density={m.float().mean().item():.3f}: {t:.2f} us per call", flush=True)
