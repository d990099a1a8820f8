"""The weight-stationary 3x3 kernel (C_in = 64, 128 or 256; csrc/conv/conv3x3_stationary.cuh)
against the coarse / fine launches of conv3x3_tc_kernel (DELTACONV_TC_STATIONARY=0), same process,
alternated per cell, with cuDNN at the same dtype beside them, at the kernel sweep's clustered-blob
fractions. For C_in = 256 the kernel takes the tiles of the fine launch (at most
DELTACONV_TC_FINE_MAX); `--fine-max N ...` adds a column per bound (stationary_fmN). CUDA-graph replay (and eager for the sweep's cell), microseconds, min of
`--rounds` medians of 60 replays, batch 1, channels_last.

Usage: PYTHONPATH=. python benchmarks/experiments/stationary_ab.py [--cin 64 128 256] [--fine-max 300]
       [--rounds 2] [--dtype float16]
"""
import argparse
import os
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import capture_graph, clustered_mask, run_info, time_cuda  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402
import deltaconv.backends.cuda  # noqa: E402,F401

# (C_in, C_out, (H, W)): the kernel sweep's cells, resnet50's layer1 / 2 / 3 3x3 convs at 1080p
# input, and C_out of two channel blocks
CONFIGS = [(64, 64, (1080, 1920)), (64, 64, (270, 480)), (64, 128, (540, 960)),
           (128, 128, (540, 960)), (128, 128, (135, 240)), (256, 256, (270, 480)), (256, 256, (68, 120))]
FRACTIONS = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--fractions", type=float, nargs="+", default=FRACTIONS)
    ap.add_argument("--cin", type=int, nargs="+", default=[64, 128, 256], help="the C_in of CONFIGS to run")
    ap.add_argument("--fine-max", type=int, nargs="*", default=[],
                    help="more stationary columns, DELTACONV_TC_FINE_MAX set to each value")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.backends.cudnn.benchmark = True
    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}, {args.dtype}", flush=True)
    print("cin,cout,HxW,changed,cudnn_graph_us,stationary_graph_us,tc_graph_us,speedup_stationary,speedup_tc,"
          "stationary_eager_us,tc_eager_us" + "".join(f",stationary_fm{v}_graph_us" for v in args.fine_max),
          flush=True)
    variants = {"1": {"DELTACONV_TC_STATIONARY": "1"}, "0": {"DELTACONV_TC_STATIONARY": "0"}}
    for v in args.fine_max:
        variants[f"fm{v}"] = {"DELTACONV_TC_STATIONARY": "1", "DELTACONV_TC_FINE_MAX": str(v)}
    for cin, cout, (h, w) in CONFIGS:
        if cin not in args.cin:
            continue
        x = torch.randn(1, cin, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(cout, cin, 3, 3, device="cuda", dtype=dtype) * (1.0 / (cin * 9)) ** 0.5
        wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
        cudnn_us = min(time_cuda(capture_graph(lambda: F.conv2d(x, wc, None, 1, 1))[0], iters=60)
                       for wc in (wt, wt.contiguous(memory_format=torch.channels_last))) * 1000
        for frac in args.fractions:
            mask = clustered_mask(1, h, w, frac)
            delta = (x * mask).contiguous(memory_format=torch.channels_last)

            def conv():
                return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [1, 1], [1, 1], 1, None)

            graph, eager = {k: [] for k in variants}, {k: [] for k in variants}
            for _ in range(args.rounds):
                for name, env in variants.items():
                    os.environ.update(env)
                    graph[name].append(time_cuda(capture_graph(conv)[0], iters=60) * 1000)
                    if name in ("1", "0"):
                        eager[name].append(time_cuda(conv, iters=60) * 1000)
                    for k in env:
                        os.environ.pop(k)
            gs, gt = min(graph["1"]), min(graph["0"])
            print(f"{cin},{cout},{h}x{w},{frac},{cudnn_us:.1f},{gs:.1f},{gt:.1f},{cudnn_us / gs:.2f},{cudnn_us / gt:.2f},"
                  f"{min(eager['1']):.1f},{min(eager['0']):.1f}"
                  + "".join(f",{min(graph[f'fm{v}']):.1f}" for v in args.fine_max), flush=True)
        del x, wt, wdc
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
