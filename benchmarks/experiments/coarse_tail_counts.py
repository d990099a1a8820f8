"""The 3x3 tensor-core conv just past whole rounds of its coarse launch, with the tail on the fine
launch (default) and off (DELTACONV_TC_TAIL=0), at n listed tiles spread over the map: one round and
tails of 1 to tail_max tiles, and one tile more than tail_max (benchmarks/results/coarse_tail_ab.txt
section 6). CUDA-graph replay, us (min of 2 medians of 60, the two settings alternated twice).
Usage: PYTHONPATH=. python benchmarks/experiments/coarse_tail_counts.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import capture_graph, spread_tiles_mask, time_cuda  # noqa: E402

import deltaconv.backends.cuda  # noqa: E402,F401  (loads the extension)
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402

SMS = torch.cuda.get_device_properties(0).multi_processor_count
# (channels, map, dilation, tiles of one coarse round: blocks per multiprocessor x 2 tiles per
# channel block of 128 (2 blocks; 1 for the dilated halo), tail_max = SMS / channel blocks)
CONFIGS = [(256, (270, 480), 1, 2 * SMS, SMS // 2), (128, (540, 960), 1, 4 * SMS, SMS),
           (256, (135, 240), 2, SMS, SMS // 2)]
for c, (h, w), dil, rnd, tail_max in CONFIGS:
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
    wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
    for n in (rnd, rnd + 1, rnd + 8, rnd + tail_max // 2, rnd + tail_max, rnd + tail_max + 1):
        mask = spread_tiles_mask(h, w, n, dil)
        if mask is None:
            break
        delta = (x * mask).contiguous(memory_format=torch.channels_last)
        f = lambda: torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [dil, dil], [dil, dil], 1, None)  # noqa: E731
        os.environ["DELTACONV_TC_TAIL"] = "1"
        counters = torch.zeros(16, dtype=torch.int32, device="cuda")
        torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [dil, dil], [dil, dil], 1, None, counters)
        listed, split = counters.tolist()[0], counters.tolist()[3]  # split != 0: the fine launch ran (the tail)
        times = {"on": [], "off": []}
        for _ in range(2):
            for name in ("on", "off"):
                os.environ["DELTACONV_TC_TAIL"] = "1" if name == "on" else "0"
                gr = capture_graph(f)[0]
                times[name].append(min(time_cuda(gr, iters=60) for _ in range(2)) * 1000)
        os.environ.pop("DELTACONV_TC_TAIL", None)
        print(f"C={c} {h}x{w} d{dil} tiles={n} (listed {listed}, round {rnd} + {n - rnd}, fine split {split}): tail on "
              f"{' '.join(f'{t:.1f}' for t in times['on'])} off {' '.join(f'{t:.1f}' for t in times['off'])}", flush=True)
