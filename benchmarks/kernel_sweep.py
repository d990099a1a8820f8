"""Kernel sweep: deltaconv's sparse convolution against cuDNN at the same dtype.

For each op (``conv3x3``, ``conv1x1``, ``dwconv3x3``), dtype, channel count (at a resolution fitting
it) and changed fraction (clustered blobs, as in real video) it times, with CUDA events after
warm-up, the median of many runs of

* cuDNN: ``F.conv2d`` on a channels_last input (``cudnn.benchmark`` on), eager and CUDA-graph replay;
* deltaconv: ``torch.ops.deltaconv.conv2d`` on the delta and mask (mask dilation included), eager
  and CUDA-graph replay.

CUDA-graph replay is timed two ways: ``*_graph_ms`` is one replay of a graph of one call (events
around it, so the host's graph launch is inside: ``common.time_in_graph``); ``*_in_graph_ms`` is the time per
call in a graph of ``--in-graph-calls`` calls in a row (default 20), as a layer runs inside a
converted model's graph.

Weight layouts: cuDNN is timed with the dense (contiguous) weight and with a channels_last one, and
the faster of the two counts (on an H200, 2026-11-21, the dense one was up to 13 % faster for the
3x3 convs, the channels_last one for the dilated ones); deltaconv gets the layout that
``DCConv2d`` keeps (``kernel_weight_layout``: channels_last, i.e. ``[C_out][KH][KW][C_in]``, for
tensor-core convs, read without a relayout copy per call).

``--ops`` also takes the transposed convolutions of stride 2 of decoders, ``deconv4x4`` (padding 1)
and ``deconv2x2`` (``torch.ops.deltaconv.conv_transpose2d`` against ``F.conv_transpose2d``; the
resolution is the input's, the changed fraction that of the input's pixels), and the stems of the
sample models (3 input channels, stride 2, at 1080x1920; ``channels`` is then the output channel
count): ``stem3x3`` (MobileNetV2, 32 channels) and ``stem7x7`` (ResNet, 64 channels); and the
dilated 3x3 convs of the segmentation backbones at
their 1080p sizes: ``conv3x3d2`` (C=256 at 135x240, C=64 at 540x960) and ``conv3x3d4`` (C=512 at
135x240). ``DELTACONV_TC=0`` in the environment times the CUDA-core kernels instead of the
tensor-core ones; ``--library PATH`` times another build of the extension (an A/B of two builds);
``--input-tf32`` gives float32 convs deltas rounded to TF32 with the op's ``input_tf32``, as the
activations send them, so the kernels skip their rounding pass.

Writes ``benchmarks/results/kernels.csv`` (``--name`` changes the file name) and
``kernels_speedup.png``. Run on a CUDA machine::

    PYTHONPATH=. python benchmarks/kernel_sweep.py [--dtypes float16 float32] [--quick]
    PYTHONPATH=. python benchmarks/kernel_sweep.py --ops stem3x3 stem7x7 --name kernels_stem
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (RESULTS, capture_graph, clustered_mask, run_info, time_cuda, time_in_graph,  # noqa: E402
                    write_csv)

from deltaconv.backends.reference import round_to_tf32  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402

#: (channels, (H, W)) pairs: resolution chosen to fit the channel count
SHAPES = [(64, (1080, 1920)), (128, (540, 960)), (256, (270, 480))]
FRACTIONS = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0]
OPS = {"conv3x3": dict(k=3, groups=1), "conv1x1": dict(k=1, groups=1), "dwconv3x3": dict(k=3, groups=-1),
       # stems: 3 input channels, stride 2, their own (output channels, resolution)
       "stem3x3": dict(k=3, groups=1, cin=3, stride=2, shapes=[(32, (1080, 1920))]),
       "stem7x7": dict(k=7, groups=1, cin=3, stride=2, shapes=[(64, (1080, 1920))]),
       # dilated (padding = dilation): fcn_resnet50's layer3 / layer4 at 1080p input
       "conv3x3d2": dict(k=3, groups=1, dilation=2, shapes=[(256, (135, 240)), (64, (540, 960))]),
       "conv3x3d4": dict(k=3, groups=1, dilation=4, shapes=[(512, (135, 240))]),
       # transposed, stride 2 (resolution: the input's; the output is twice as large): the 4x4 upsampling
       # of pose and segmentation decoders (SimpleBaseline's 256 channels) and a U-Net's 2x2
       "deconv4x4": dict(k=4, groups=1, stride=2, transposed=True, shapes=[(64, (540, 960)), (256, (136, 240))]),
       "deconv2x2": dict(k=2, groups=1, stride=2, transposed=True, shapes=[(64, (540, 960)), (256, (136, 240))])}
DEFAULT_OPS = ["conv3x3", "conv1x1", "dwconv3x3"]


def sweep(dtypes, shapes, fractions, iters: int, ops=DEFAULT_OPS, library=None,
          in_graph_calls: int = 20, input_tf32: bool = False) -> list[dict]:
    if library is not None:  # another build of the extension: its ops only, not deltaconv's backend
        if not torch.cuda.is_available():
            raise SystemExit("kernel_sweep: --library needs a CUDA GPU")
        torch.ops.load_library(str(library))
    else:
        from deltaconv.backends import cuda as dc

        if not dc.is_available():
            raise SystemExit(f"kernel_sweep: the CUDA backend is unavailable: {dc.unavailable_reason()}")
    torch.backends.cudnn.benchmark = True
    info = run_info()
    rows = []
    for op in ops:
        spec = OPS[op]
        for dtype in dtypes:
            for c, (h, w) in spec.get("shapes", shapes):
                groups = c if spec["groups"] == -1 else 1
                k, cin, stride, dil = spec["k"], spec.get("cin", c), spec.get("stride", 1), spec.get("dilation", 1)
                transposed = spec.get("transposed", False)
                x = torch.randn(1, cin, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
                shape = (cin, c // groups) if transposed else (c, cin // groups)
                wt = torch.randn(*shape, k, k, device="cuda", dtype=dtype) * (1.0 / (cin // groups * k * k)) ** 0.5
                pad = (k - stride) // 2 if transposed else k // 2 * dil
                # cuDNN's faster weight layout of the two (see the module docstring)
                cudnn_ms = cudnn_graph_ms = cudnn_in_graph_ms = float("inf")
                for wc in (wt, wt.contiguous(memory_format=torch.channels_last)):
                    if transposed:
                        cudnn = lambda: F.conv_transpose2d(x, wc, None, stride, pad)  # noqa: E731
                    else:
                        cudnn = lambda: F.conv2d(x, wc, None, stride, pad, dil, groups)  # noqa: E731
                    cudnn_ms = min(cudnn_ms, time_cuda(cudnn, iters=iters))
                    cudnn_graph_ms = min(cudnn_graph_ms, time_cuda(capture_graph(cudnn)[0], iters=iters))
                    cudnn_in_graph_ms = min(cudnn_in_graph_ms, time_in_graph(cudnn, calls=in_graph_calls))
                for frac in fractions:
                    mask = clustered_mask(1, h, w, frac)
                    delta = (x * mask).contiguous(memory_format=torch.channels_last)
                    # float32 with --input-tf32: the delta as a layer sends it in TF32 (rounded),
                    # which the kernels then read without rounding it themselves
                    flag = {"input_tf32": True} if input_tf32 and dtype == torch.float32 else {}
                    if flag:
                        delta = round_to_tf32(delta)

                    layout = None if transposed else kernel_weight_layout(wt, groups)
                    wdc = wt if layout is None else wt.contiguous(memory_format=layout)

                    def delta_conv():
                        if transposed:  # the weight as DCConvTranspose2d keeps it: the dense one
                            return torch.ops.deltaconv.conv_transpose2d(delta, mask, wdc, None, [stride, stride],
                                                                        [pad, pad], [0, 0], groups, [1, 1], None)
                        return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [stride, stride], [pad, pad],
                                                          [dil, dil], groups, None, **flag)
                    dc_ms = time_cuda(delta_conv, iters=iters)
                    dc_graph_ms = time_cuda(capture_graph(delta_conv)[0], iters=iters)
                    dc_in_graph_ms = time_in_graph(delta_conv, calls=in_graph_calls)
                    rows.append({"op": op, "dtype": str(dtype).replace("torch.", ""), "channels": c,
                                 "resolution": f"{h}x{w}", "changed": frac, "cudnn_ms": round(cudnn_ms, 4),
                                 "deltaconv_ms": round(dc_ms, 4), "speedup": round(cudnn_ms / dc_ms, 3),
                                 "cudnn_graph_ms": round(cudnn_graph_ms, 4),
                                 "deltaconv_graph_ms": round(dc_graph_ms, 4),
                                 "speedup_graph": round(cudnn_graph_ms / dc_graph_ms, 3),
                                 "cudnn_in_graph_ms": round(cudnn_in_graph_ms, 4),
                                 "deltaconv_in_graph_ms": round(dc_in_graph_ms, 4),
                                 "speedup_in_graph": round(cudnn_in_graph_ms / dc_in_graph_ms, 3),
                                 "device": info["device"], "date": info["date"]})
                    print(" ".join(f"{k}={v}" for k, v in rows[-1].items() if k not in ("device", "date")),
                          flush=True)
                del x, wt
                torch.cuda.empty_cache()
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, op in zip(axes, ops):
        for key in sorted({(r["dtype"], r["channels"], r["resolution"]) for r in rows if r["op"] == op}):
            pts = [r for r in rows if r["op"] == op and (r["dtype"], r["channels"], r["resolution"]) == key
                   and r["changed"] > 0]
            ax.plot([r["changed"] for r in pts], [r["speedup"] for r in pts], marker="o",
                    label=f"{key[0]} C={key[1]} {key[2]}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{op}: cuDNN time / deltaconv time")
        ax.set_xlabel("changed fraction of pixels")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("speedup (eager, same dtype)")
    fig.suptitle(f"{rows[0]['device']}, {rows[0]['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["float16"], choices=["float16", "bfloat16", "float32"])
    p.add_argument("--quick", action="store_true", help="one shape, three fractions, few iterations")
    p.add_argument("--ops", nargs="+", default=DEFAULT_OPS, choices=list(OPS),
                   help=f"ops to time (default: {' '.join(DEFAULT_OPS)})")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="kernels", help="file name stem of the CSV and the plot (default kernels)")
    p.add_argument("--in-graph-calls", type=int, default=20, metavar="N",
                   help="calls per graph for the *_in_graph_ms columns (default 20)")
    p.add_argument("--library", type=Path, default=None, metavar="PATH",
                   help="time this build of the extension (a _C*.so) instead of deltaconv's")
    p.add_argument("--input-tf32", action="store_true",
                   help="float32: deltas rounded to TF32 and passed with input_tf32, as a layer sends them "
                        "(the kernels skip their rounding pass)")
    args = p.parse_args(argv)
    dtypes = [getattr(torch, d) for d in args.dtypes]
    shapes = SHAPES[:1] if args.quick else SHAPES
    fractions = [0.01, 0.05, 1.0] if args.quick else FRACTIONS
    if args.in_graph_calls < 1:
        p.error(f"--in-graph-calls must be >= 1, got {args.in_graph_calls}")
    if args.library is not None and not args.library.is_file():
        p.error(f"--library: no such file: {args.library}")
    rows = sweep(dtypes, shapes, fractions, iters=10 if args.quick else 50, ops=args.ops, library=args.library,
                 in_graph_calls=args.in_graph_calls, input_tf32=args.input_tf32)
    write_csv(args.out / f"{args.name}.csv", rows)
    plot(rows, args.out / f"{args.name}_speedup.png")
    print(f"wrote {args.out / (args.name + '.csv')} and {args.name}_speedup.png")


if __name__ == "__main__":
    main()
