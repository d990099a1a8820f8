"""Where a 3x3 conv call's time goes at few changed pixels (benchmarks/results/block_spread_ab.txt
section 4): CUDA-graph replay of graphs of 1-8 tiny kernels (the timing method's floor), and of the
op at 0-10 % changed with the default launches, the coarse or the fine one forced and with
DELTACONV_PDL=1, with torch.profiler's time of each kernel. Kept as it ran (2026-11-22).
Usage: PYTHONPATH=. python benchmarks/experiments/conv3x3_call_floor.py"""
import os, sys, statistics
sys.path.insert(0, "benchmarks")
import torch
from common import capture_graph, clustered_mask, time_cuda
from deltaconv.modules.linear import kernel_weight_layout
import deltaconv.backends.cuda as dc
assert dc.is_available(), dc.unavailable_reason()
from torch.profiler import profile, ProfilerActivity

def tiny_graph(n):
    t = torch.zeros(1, device="cuda")
    def f():
        for _ in range(n):
            t.add_(1)
    return capture_graph(f)[0]

for n in (1, 2, 4, 8):
    print(f"tiny graph {n} kernels: {time_cuda(tiny_graph(n), iters=200)*1000:.2f} us", flush=True)

def op_for(c, h, w, frac, counters=False):
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
    mask = clustered_mask(1, h, w, frac)
    delta = (x * mask).contiguous(memory_format=torch.channels_last)
    wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
    cnt = torch.zeros(4, device="cuda", dtype=torch.int32)
    def f():
        return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [1, 1], [1, 1], 1, None)
    return f

def prof(g, n=30):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            g()
        torch.cuda.synchronize()
    d = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            d.setdefault(e.name[:60], []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
    return {k: (len(v) / n, statistics.median(v)) for k, v in d.items()}

SETTINGS = {"default": {}, "coarse_only": {"DELTACONV_TC_FINE_MAX": "-1"}, "fine_only": {"DELTACONV_TC_FINE_MAX": "1000000000"},
            "pdl": {"DELTACONV_PDL": "1"}}
for c, (h, w) in [(64, (1080, 1920)), (128, (540, 960)), (256, (270, 480))]:
    for frac in (0.0, 0.01, 0.05, 0.1):
        f = op_for(c, h, w, frac)
        res = {}
        for name, env in SETTINGS.items():
            for k in ("DELTACONV_TC_FINE_MAX", "DELTACONV_PDL"):
                os.environ.pop(k, None)
            os.environ.update(env)
            g = capture_graph(f)[0]
            res[name] = [time_cuda(g, iters=100) * 1000 for _ in range(3)]
            if name == "default":
                kp = prof(g)
        for k in ("DELTACONV_TC_FINE_MAX", "DELTACONV_PDL"):
            os.environ.pop(k, None)
        print(f"C={c} {h}x{w} frac={frac}: " + "  ".join(f"{k} {min(v):.1f}" for k, v in res.items()) + " us", flush=True)
        for k, (calls, us) in sorted(kp.items(), key=lambda kv: -kv[1][1]):
            print(f"    {k:60s} {calls:.0f}x {us:.2f} us")
