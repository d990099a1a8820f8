"""Where a 3x3 delta conv call's time goes: the CUDA kernels of `torch.ops.deltaconv.conv2d` at the
kernel sweep's clustered-blob fractions, their mean durations over `--calls` eager calls
(torch.profiler, CUDA activity), with the call's listed tile count (counters[0]) and, beside them,
the CUDA-graph replay time of the whole call (CUDA events, median of 60). fp16, batch 1,
channels_last.

Usage: PYTHONPATH=. python benchmarks/experiments/conv3x3_kernel_times.py [--configs 256x270x480 ...]
       [--fractions 0.01 0.05] [--calls 20]
"""
import argparse
import collections
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from common import capture_graph, clustered_mask, run_info, time_cuda  # noqa: E402
from deltaconv.modules import WorkCounters  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402
import deltaconv.backends.cuda  # noqa: E402,F401


def short(name: str) -> str:
    """A kernel's name without its namespaces and arguments."""
    base = name.split("(")[0]
    return base.replace("void ", "").replace("deltaconv::", "").replace("conv::", "").replace("tc::", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["64x1080x1920", "128x540x960", "256x270x480"],
                    help="CxHxW (C_in = C_out = C)")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.01, 0.05])
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}, float16", flush=True)
    for cfg in args.configs:
        c, h, w = (int(v) for v in cfg.split("x"))
        x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
        wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
        for frac in args.fractions:
            mask = clustered_mask(1, h, w, frac)
            delta = (x * mask).contiguous(memory_format=torch.channels_last)
            counters = torch.zeros(WorkCounters.PER_CALL, dtype=torch.int32, device="cuda")

            def conv(cnt=None):
                return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [1, 1], [1, 1], 1, None, cnt)

            conv(counters)
            tiles = int(counters[0])
            graph_us = time_cuda(capture_graph(conv)[0], iters=60) * 1000
            for _ in range(3):
                conv()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    conv()
                torch.cuda.synchronize()
            total = collections.defaultdict(float)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    total[short(e.name)] += e.device_time_total / args.calls
            parts = "; ".join(f"{k} {v:.1f}" for k, v in sorted(total.items(), key=lambda kv: -kv[1]))
            print(f"C={c} {h}x{w} changed={frac} tiles={tiles} graph_us={graph_us:.1f} | kernel us per call: {parts}",
                  flush=True)
        del x, wt, wdc
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
