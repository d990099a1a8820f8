"""Which multiprocessor each block of a grid runs on (benchmarks/results/block_spread_ab.txt
section 1): block_placement_probe.cu records %smid per block for grids shaped like the 3x3 conv's
launches (threads, dynamic shared memory). Build the probe with the CUDA toolkit, then run it on the
GPU machine (torch loads the CUDA runtime first). Kept as it ran (2026-11-22):
    nvcc -O2 -arch=sm_90a -shared -Xcompiler -fPIC -cudart shared \\
        benchmarks/experiments/block_placement_probe.cu -o /tmp/probe.so
    python benchmarks/experiments/block_placement_probe.py /tmp/probe.so"""
import collections
import ctypes
import sys

import torch
torch.zeros(1, device="cuda")
lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "probe.so")
for gx, gy, threads, smem in [(264, 1, 128, 110 * 1024), (132, 2, 128, 110 * 1024), (264, 1, 256, 103 * 1024), (66, 4, 128, 110 * 1024), (132, 1, 128, 110 * 1024), (396, 1, 128, 70 * 1024)]:
    n = gx * gy
    buf = (ctypes.c_int * n)()
    occ = lib.probe(gx, gy, threads, smem, 200000, buf)
    sm = list(buf)
    cnt = collections.Counter(sm)
    print(f"grid {gx}x{gy} threads {threads} smem {smem // 1024}K occ {occ}: SMs used {len(cnt)}, max per SM {max(cnt.values())}")
    print("  first 40 blocks' SM:", sm[:40])
    if gy > 1:
        print("  blocks (x, 1) first 20:", sm[gx:gx + 20])
    for k in (50, 66, 100, 132):
        if k <= n:
            c = collections.Counter(sm[:k])
            print(f"  first {k} blocks: {len(c)} SMs, max {max(c.values())} per SM")
