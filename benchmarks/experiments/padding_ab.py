"""A/B of the padding delta rule (``DCPad2d``; a convolution of ``padding_mode="reflect"`` padding its
input, ``DCConv2d.input_pad``) against what ran before it, in one process, with the dense model replayed
as a CUDA graph as the baseline.

    PYTHONPATH=. python benchmarks/experiments/padding_ab.py [--size 576 768] [--videos vtest.avi] \\
        [--thresholds 0.02] [--frames 24] [--start 200]

The model: Monodepth2's depth network (Godard et al., 2019; its layout, random weights): a torchvision
resnet18 encoder and a decoder of ``ReflectionPad2d(1)`` + 3x3 convolution + ELU blocks, nearest
upsampling, skip concatenations and a sigmoid disparity per scale, the BatchNorm statistics re-estimated
on the first frames. ``--conv-mode``: the decoder's convolutions pad themselves
(``nn.Conv2d(padding=1, padding_mode="reflect")``) instead of a ``ReflectionPad2d`` before each.
Variants (float16, CUDA-graph replay, the same frames in turn):
"pads": the default conversion;
"before": as before the rule: every padding module a dense fallback per frame, and a convolution of
``padding_mode="reflect"`` on the reference op (a dense convolution of the padded delta per frame).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (add_video_ab_arguments, compare_variants_on_videos, converted_under,  # noqa: E402
                    reestimate_batchnorm)


class ConvBlock(nn.Module):
    """Monodepth2's Conv3x3 + ELU: a reflection pad and an unpadded 3x3 convolution (or the convolution
    padding itself, ``conv_mode``)."""

    def __init__(self, cin: int, cout: int, conv_mode: bool, act: bool = True):
        super().__init__()
        if conv_mode:
            self.pad, self.conv = nn.Identity(), nn.Conv2d(cin, cout, 3, padding=1, padding_mode="reflect")
        else:
            self.pad, self.conv = nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3)
        self.act = nn.ELU(inplace=True) if act else nn.Identity()

    def forward(self, x):
        return self.act(self.conv(self.pad(x)))


class DepthNet(nn.Module):
    """resnet18 encoder, Monodepth2 decoder (channels 16-256), disparities at scales 0-3 (sigmoid)."""

    def __init__(self, conv_mode: bool = False):
        super().__init__()
        import torchvision
        torch.manual_seed(0)
        self.encoder = torchvision.models.resnet18(weights=None)
        enc, dec = [64, 64, 128, 256, 512], [16, 32, 64, 128, 256]
        self.up0 = nn.ModuleList(ConvBlock(enc[-1] if i == 4 else dec[i + 1], dec[i], conv_mode) for i in range(5))
        self.up1 = nn.ModuleList(ConvBlock(dec[i] + (enc[i - 1] if i > 0 else 0), dec[i], conv_mode)
                                 for i in range(5))
        self.disp = nn.ModuleList(ConvBlock(dec[s], 1, conv_mode, act=False) for s in range(4))

    def forward(self, x):
        e = self.encoder
        f0 = e.relu(e.bn1(e.conv1(x)))
        f1 = e.layer1(e.maxpool(f0))
        f2 = e.layer2(f1)
        f3 = e.layer3(f2)
        feats = [f0, f1, f2, f3, e.layer4(f3)]
        y, outs = feats[-1], []
        for i in range(4, -1, -1):
            y = F.interpolate(self.up0[i](y), scale_factor=2.0, mode="nearest")
            if i > 0:
                y = torch.cat([y, feats[i - 1]], 1)
            y = self.up1[i](y)
            if i < 4:
                outs.append(torch.sigmoid(self.disp[i](y)))
        return outs[-1]  # the full-resolution disparity (scale 0)


def build(frames: list, conv_mode: bool) -> nn.Module:
    return reestimate_batchnorm(DepthNet(conv_mode).cuda(), torch.cat(frames[:4]).cuda().float())


def before_the_rule(model: nn.Module, **kw):
    """The conversion as it was before the padding rule: padding modules fall back, convolutions of a
    padding mode other than zeros keep it (the CUDA backend then runs them on the reference op)."""
    import deltaconv
    from deltaconv import rules
    from deltaconv.modules import DCConv2d
    saved = dict(rules.MODULE_RULES)
    for t in (nn.ReflectionPad2d, nn.ReplicationPad2d, nn.CircularPad2d):
        rules.MODULE_RULES.pop(t, None)
    try:
        dm = deltaconv.convert(model, **kw)
    finally:
        rules.MODULE_RULES.clear()
        rules.MODULE_RULES.update(saved)
    for layer in dm.modules():
        if isinstance(layer, DCConv2d) and layer.input_pad is not None:
            left, right, top, bottom = layer.input_pad
            assert left == right and top == bottom
            layer.padding, layer.padding_mode = (top, left), layer.input_pad_mode
            layer.input_pad, layer.input_pad_mode = None, "zeros"
    return dm


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_video_ab_arguments(p, (576, 768))
    p.add_argument("--conv-mode", action="store_true")
    p.add_argument("--order", nargs="+", default=["pads", "before"], choices=["pads", "before"])
    a = p.parse_args(argv)
    variants = {"pads": converted_under(), "before": converted_under(convert=before_the_rule)}
    label = f"depthnet{' conv-mode' if a.conv_mode else ''} {a.size[0]}x{a.size[1]}"
    compare_variants_on_videos(a, {label: lambda cpu: build(cpu, a.conv_mode)}, variants)

if __name__ == "__main__":
    main()
