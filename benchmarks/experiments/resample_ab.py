"""The dense output resampling op alone (ops.resample: the densifier's map upsampled into NCHW, as
after fcn_resnet50's and deeplabv3_mobilenet_v3_large's heads at 1080x1920: 21 channels at 135x240,
bilinear, align_corners=False; and nearest for scale): us per call, each call replayed from a CUDA
graph of 10 calls (op_timing.per_call_us), median of 30 after warm-up. Run once per build in
alternating processes (the op's name is the same in both builds):
    cp a.so deltaconv/_C.abi3.so && PYTHONPATH=. python benchmarks/experiments/resample_ab.py a
Kept as it ran for benchmarks/results/fixed_cost.txt section 11 (then with CUDA events around 5
replays at a time; per_call_us now times each replay, common.time_in_graph). Re-run that way on
the same kernels (NVIDIA H200, 2026-11-23 03:44 UTC): fp16 bilinear 43.8, nearest 35.4, fp32
bilinear 76.5, nearest 98.1 us, against 44.3 / 35.4 / 77.0 / 98.3 us in section 11.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_timing import deltaconv_ops, per_call_us  # noqa: E402

ops = deltaconv_ops()
tag = sys.argv[1] if len(sys.argv) > 1 else "-"

torch.manual_seed(0)
for dtype in (torch.float16, torch.float32):
    x = torch.randn(1, 21, 135, 240, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    for mode in ("bilinear", "nearest"):
        t = per_call_us(lambda: ops.resample(x, [1080, 1920], None, None, mode, False))
        dense = per_call_us(lambda: torch.nn.functional.interpolate(
            x.contiguous(), size=(1080, 1920), mode=mode, **({"align_corners": False} if mode == "bilinear" else {})))
        print(f"{tag} {str(dtype).split('.')[-1]} {mode} 21x135x240 -> 1080x1920: {t:.2f} us per call "
              f"(F.interpolate NCHW {dense:.2f} us)", flush=True)
