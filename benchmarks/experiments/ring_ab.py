"""The warp-specialised 3x3 kernel (csrc/conv/conv3x3_ring.cuh) against conv3x3_tc_kernel's coarse
launch (DELTACONV_TC_RING=0) in one process, alternated per cell, with cuDNN at the same dtype,
dilation and padding beside them, at the kernel sweep's clustered-blob fractions. CUDA-graph
replay of one call and per call in a graph of 20 (time_in_graph), microseconds, min of `--rounds`
medians, batch 1, channels_last. `--fine-max N ...` adds a column per bound (ring_fmN: the
warp-specialised kernel with DELTACONV_TC_FINE_MAX=N, one replay). `--op conv1x1`: the same for the
warp-specialised 1x1 GEMM (csrc/conv/conv1x1_ring.cuh) against conv_gather_tc_kernel
(DELTACONV_TC_RING1=0) on CONFIGS_1X1 (the ring / tc columns are those two kernels).

Usage: PYTHONPATH=. python benchmarks/experiments/ring_ab.py [--rounds 2] [--dtype float16]
       [--fractions 0.05 0.25 1.0] [--configs 0 1 2] [--fine-max -1 66] [--op conv3x3|conv1x1]
"""
import argparse
import os
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import capture_graph, clustered_mask, run_info, time_cuda, time_in_graph  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402
import deltaconv.backends.cuda  # noqa: E402,F401

# (C_in, C_out, (H, W) of the input, dilation, stride): the kernel sweep's C = 256 cell, resnet50's
# layer3 3x3 conv at 1080p input, fcn_resnet50's dilated layer3 / layer4 3x3 convs at 1080p input,
# and resnet50's stride-2 3x3 convs (layer2 / 3 / 4's first blocks) at 1080p input
CONFIGS = [(256, 256, (270, 480), 1, 1), (256, 256, (68, 120), 1, 1), (256, 256, (135, 240), 2, 1),
           (512, 512, (135, 240), 4, 1), (128, 128, (270, 480), 1, 2), (256, 256, (135, 240), 1, 2),
           (512, 512, (68, 120), 1, 2)]
# 1x1 convs (C_in, C_out, (H, W) of the input, 1, stride) of resnet50 and fcn_resnet50 at 1080p input:
# layer1's at 270x480, the kernel sweep's C = 256 cell, layer2's, resnet50's layer3 and layer4, fcn's
# dilated layer3 / layer4 at 135x240, and a stride-2 downsample
CONFIGS_1X1 = [(64, 256, (270, 480), 1, 1), (256, 64, (270, 480), 1, 1), (256, 256, (270, 480), 1, 1),
               (512, 128, (135, 240), 1, 1), (1024, 256, (68, 120), 1, 1), (2048, 512, (34, 60), 1, 1),
               (256, 1024, (135, 240), 1, 1), (2048, 512, (135, 240), 1, 1), (512, 2048, (135, 240), 1, 1),
               (256, 512, (270, 480), 1, 2)]
FRACTIONS = [0.05, 0.1, 0.25, 0.5, 1.0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--fractions", type=float, nargs="+", default=FRACTIONS)
    ap.add_argument("--op", default="conv3x3", choices=["conv3x3", "conv1x1"])
    ap.add_argument("--configs", type=int, nargs="+", default=None,
                    help="indices into CONFIGS (CONFIGS_1X1 with --op conv1x1); default: all")
    ap.add_argument("--fine-max", type=int, nargs="*", default=[],
                    help="more ring columns, DELTACONV_TC_FINE_MAX set to each value")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    k = 1 if args.op == "conv1x1" else 3
    configs = CONFIGS_1X1 if k == 1 else CONFIGS
    switch_var = "DELTACONV_TC_RING1" if k == 1 else "DELTACONV_TC_RING"
    torch.backends.cudnn.benchmark = True
    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}, {args.dtype}", flush=True)
    print("cin,cout,HxW,dilation,stride,changed,cudnn_graph_us,ring_graph_us,tc_graph_us,speedup_ring,speedup_tc,"
          "cudnn_in_graph_us,ring_in_graph_us,tc_in_graph_us" + "".join(f",ring_fm{v}_graph_us" for v in args.fine_max),
          flush=True)
    for i in args.configs if args.configs is not None else range(len(configs)):
        cin, cout, (h, w), d, st = configs[i]
        pad = d if k == 3 else 0
        x = torch.randn(1, cin, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(cout, cin, k, k, device="cuda", dtype=dtype) * (1.0 / (cin * k * k)) ** 0.5
        wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
        wcl = wt.contiguous(memory_format=torch.channels_last)
        cudnn = min(time_cuda(capture_graph(lambda: F.conv2d(x, wc, None, st, pad, d))[0], iters=60)
                    for wc in (wt, wcl)) * 1000
        cudnn_in = min(time_in_graph(lambda: F.conv2d(x, wc, None, st, pad, d)) for wc in (wt, wcl)) * 1000
        for frac in args.fractions:
            mask = clustered_mask(1, h, w, frac)
            delta = (x * mask).contiguous(memory_format=torch.channels_last)

            def conv():
                return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [st, st], [pad, pad], [d, d], 1, None)

            graph, in_graph = {"1": [], "0": []}, {"1": [], "0": []}
            fm = {v: [] for v in args.fine_max}
            for _ in range(args.rounds):
                for switch in ("1", "0"):
                    os.environ[switch_var] = switch
                    graph[switch].append(time_cuda(capture_graph(conv)[0], iters=60) * 1000)
                    in_graph[switch].append(time_in_graph(conv) * 1000)
                os.environ[switch_var] = "1"
                for v in args.fine_max:
                    os.environ["DELTACONV_TC_FINE_MAX"] = str(v)
                    fm[v].append(time_cuda(capture_graph(conv)[0], iters=60) * 1000)
                    os.environ.pop("DELTACONV_TC_FINE_MAX")
            os.environ.pop(switch_var)
            gr, gt = min(graph["1"]), min(graph["0"])
            print(f"{cin},{cout},{h}x{w},{d},{st},{frac},{cudnn:.1f},{gr:.1f},{gt:.1f},"
                  f"{cudnn / gr:.2f},{cudnn / gt:.2f},"
                  f"{cudnn_in:.1f},{min(in_graph['1']):.1f},{min(in_graph['0']):.1f}"
                  + "".join(f",{min(fm[v]):.1f}" for v in args.fine_max), flush=True)
        del x, wt, wdc, wcl
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
