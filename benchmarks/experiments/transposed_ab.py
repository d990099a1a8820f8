"""A/B of the transposed convolutions' phase decomposition (``conv_transpose2d`` as one stride-1
convolution of all the phases of the stride on the tensor cores, a 2x2 window of taps widened to 3x3:
"phases") against the same with the 2x2 window kept ("phases2x2": ``DELTACONV_TC_TRANSPOSED_3X3=0``, the
gathered-taps kernel) and the CUDA-core transposed kernel ("direct": ``DELTACONV_TC_TRANSPOSED=0``), each
set while the variant's graph is captured, in one process, with the dense model replayed as a CUDA graph
as the baseline.

    PYTHONPATH=. python benchmarks/experiments/transposed_ab.py [--size 1080 1920] [--models pose unet] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--thresholds 0.02] [--frames 24] [--start 200]

The models (random weights, the BatchNorm statistics re-estimated on the first frames):
"pose": SimpleBaseline's keypoint network (Xiao et al., 2018): a torchvision resnet50 without its head,
three 4x4 transposed convolutions of stride 2 and 256 channels (each with BatchNorm and ReLU), and a 1x1
convolution to 17 heatmaps at a quarter of the frame's resolution;
"unet": a U-Net of four levels (32-256 channels): 3x3 blocks, max pooling down, 2x2 transposed
convolutions of stride 2 up, skip concatenations, a 1x1 head of 2 classes.
Float16, CUDA-graph replay, the variants frame by frame in turn on the same frames.
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (add_video_ab_arguments, compare_variants_on_videos, converted_under,  # noqa: E402
                    environment, reestimate_batchnorm)


class PoseNet(nn.Module):
    """SimpleBaseline: resnet50 features, 3 x (ConvTranspose2d 4x4 stride 2, BN, ReLU), 1x1 to 17."""

    def __init__(self, joints: int = 17):
        super().__init__()
        import torchvision
        torch.manual_seed(0)
        r = torchvision.models.resnet50(weights=None)
        self.backbone = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1, r.layer2, r.layer3, r.layer4)
        layers, cin = [], 2048
        for _ in range(3):
            layers += [nn.ConvTranspose2d(cin, 256, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(256),
                       nn.ReLU(inplace=True)]
            cin = 256
        self.deconv = nn.Sequential(*layers)
        self.head = nn.Conv2d(256, joints, 1)

    def forward(self, x):
        return self.head(self.deconv(self.backbone(x)))


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Four levels of 32-256 channels, 2x2 transposed convolutions of stride 2 up."""

    def __init__(self, widths=(32, 64, 128, 256), classes: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.down = nn.ModuleList(_block(3 if i == 0 else widths[i - 1], w) for i, w in enumerate(widths))
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                for i in range(len(widths) - 1))
        self.dec = nn.ModuleList(_block(2 * widths[i], widths[i]) for i in range(len(widths) - 1))
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        for i in range(len(self.up) - 1, -1, -1):
            x = self.dec[i](torch.cat([self.up[i](x), skips[i]], 1))
        return self.head(x)


MODELS = {"pose": PoseNet, "unet": UNet}
# the environment each variant is captured under
VARIANTS = {"phases": {}, "phases2x2": {"DELTACONV_TC_TRANSPOSED_3X3": "0"}, "direct": {"DELTACONV_TC_TRANSPOSED": "0"}}


def build(name: str, frames: list) -> nn.Module:
    return reestimate_batchnorm(MODELS[name]().cuda(), torch.cat(frames[:4]).cuda().float())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    add_video_ab_arguments(p, (1088, 1920))
    p.add_argument("--order", nargs="+", default=["phases", "phases2x2", "direct"], choices=list(VARIANTS))
    a = p.parse_args(argv)
    variants = {v: converted_under(functools.partial(environment, VARIANTS[v])) for v in VARIANTS}
    models = {f"{name} {a.size[0]}x{a.size[1]}": functools.partial(build, name) for name in a.models}
    compare_variants_on_videos(a, models, variants)

if __name__ == "__main__":
    main()
