"""Grouped 3x3 convolutions (RegNet, ResNeXt): deltaconv's grouped kernel (CUDA cores) against the
same convolution as one group with a block-diagonal weight (zeros outside the groups; the
tensor-core kernels, ``groups`` times the multiply-adds) and against cuDNN's grouped convolution.

For each (channels, groups, resolution) of the 1080x1920 models' 3x3 grouped convolutions and each
changed fraction (clustered blobs, ``common.clustered_mask``) it times, with CUDA events after
warm-up, the median of the CUDA backend's ``conv2d`` on a delta frame both ways, eager, and cuDNN
dense (``F.conv2d``, channels_last, ``cudnn.benchmark`` on). Both deltaconv outputs are compared
(they must agree to float16 rounding). Run on a CUDA machine::

    PYTHONPATH=. python benchmarks/experiments/grouped_conv_ab.py [--dtype float16]

float32 runs the block-diagonal weight in TF32 (``torch.backends.cudnn.allow_tf32``, PyTorch's
default, which cuDNN's float32 convolution then uses too).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import clustered_mask, run_info, time_cuda  # noqa: E402

from deltaconv.backends import cuda as cuda_ops  # noqa: E402
from deltaconv.modules.folding import block_diagonal  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402

#: (model, channels, groups, (H, W) at a 1080x1920 input): each stage's 3x3 grouped conv (stride 1)
SHAPES = [("regnet_y_400mf", 48, 6, (270, 480)), ("regnet_y_400mf", 104, 13, (135, 240)),
          ("regnet_y_400mf", 208, 26, (68, 120)), ("regnet_y_400mf", 440, 55, (34, 60)),
          ("regnet_x_400mf", 32, 2, (270, 480)), ("regnet_x_400mf", 64, 4, (135, 240)),
          ("regnet_x_400mf", 160, 10, (68, 120)), ("regnet_x_400mf", 400, 25, (34, 60)),
          ("regnet_y_1_6gf", 48, 2, (270, 480)), ("regnet_y_1_6gf", 120, 5, (135, 240)),
          ("regnet_y_1_6gf", 336, 14, (68, 120)), ("regnet_y_1_6gf", 888, 37, (34, 60)),
          ("resnext50_32x4d", 128, 32, (270, 480)), ("resnext50_32x4d", 256, 32, (135, 240)),
          ("resnext50_32x4d", 512, 32, (68, 120)), ("resnext50_32x4d", 1024, 32, (34, 60))]
FRACTIONS = [0.01, 0.05, 0.3, 0.6, 1.0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--models", nargs="*", default=None, help="only these models' shapes")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"# grouped 3x3 conv, {args.dtype}: {run_info()}")
    print("model            C    g  HxW       changed  cudnn_ms  grouped_ms  blockdiag_ms  blockdiag/grouped  "
          "best_vs_cudnn")
    for model, c, groups, (h, w) in SHAPES:
        if args.models and model not in args.models:
            continue
        torch.manual_seed(0)
        x = torch.randn(1, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        weight = torch.randn(c, c // groups, 3, 3, device="cuda", dtype=dtype) * (3.0 / (c // groups * 9)) ** 0.5
        grouped_w = weight.contiguous(memory_format=kernel_weight_layout(weight, groups))
        dense_w = block_diagonal(weight, groups)
        dense_w = dense_w.contiguous(memory_format=kernel_weight_layout(dense_w, 1))
        cudnn_w = weight.contiguous(memory_format=torch.channels_last)
        cudnn_ms = time_cuda(lambda: F.conv2d(x, cudnn_w, None, 1, 1, 1, groups))
        for frac in FRACTIONS:
            mask = clustered_mask(1, h, w, frac)
            delta = torch.where(mask, x, 0)

            def run(wt, g):
                return cuda_ops.conv2d(delta, mask, wt, None, (1, 1), (1, 1), (1, 1), g, None)
            a, b = run(grouped_w, groups), run(dense_w, 1)
            torch.testing.assert_close(torch.where(a[1], b[0], 0), torch.where(a[1], a[0], 0), rtol=2e-2, atol=2e-2)
            assert torch.equal(a[1], b[1])
            grouped_ms = time_cuda(lambda: run(grouped_w, groups))
            dense_ms = time_cuda(lambda: run(dense_w, 1))
            print(f"{model:16s} {c:4d} {groups:3d}  {h}x{w:<5d} {frac:6.2f}  {cudnn_ms:8.4f}  {grouped_ms:10.4f}  "
                  f"{dense_ms:12.4f}  {dense_ms / grouped_ms:17.2f}  {cudnn_ms / min(grouped_ms, dense_ms):13.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
