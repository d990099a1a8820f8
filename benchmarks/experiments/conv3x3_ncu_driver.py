"""Driver for Nsight Compute: six calls of the fp16 3x3 sparse conv (C -> C, stride 1, padding 1)
at a clustered changed fraction (kernel_sweep.py's mask), on the built extension.

    ncu --clock-control none -k regex:conv3x3_tc_kernel --launch-skip 8 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \\
        python benchmarks/experiments/conv3x3_ncu_driver.py C H W FRACTION

(run from the repository root; benchmarks/results/ncu_conv3x3_fine.txt).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import clustered_mask  # noqa: E402

C, H, W, frac = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.ops.load_library("deltaconv/_C.abi3.so")
g = torch.Generator().manual_seed(0)
mask = clustered_mask(1, H, W, frac)
x = torch.randn(1, C, H, W, generator=g).half().cuda().contiguous(memory_format=torch.channels_last)
w = (torch.randn(C, C, 3, 3, generator=g) / (3 * C ** 0.5)).half().cuda().contiguous(memory_format=torch.channels_last)
for _ in range(6):
    out, mo = torch.ops.deltaconv.conv2d(x, mask, w, None, [1, 1], [1, 1], [1, 1], 1, None)
torch.cuda.synchronize()
print("active output fraction", float(mo.float().mean()))
