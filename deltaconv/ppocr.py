"""PP-OCRv4's text detector (a DBNet on a PP-LCNetV3 backbone) with its real weights, from ONNX.

RapidOCR ships PaddleOCR's ``ch_PP-OCRv4_det_infer.onnx`` (exported by paddle2onnx; 4.7 MB, 62
convolutions, hardswish written out as ``x * clip(x + 3, 0, 6) / 6``, squeeze-excite blocks, an FPN
of nearest resizes and a concatenation, two transposed convolutions). :func:`ppocr_v4_det` loads it
through onnx2torch (:func:`deltaconv.load_onnx`) and puts RapidOCR's input convention in front:

Input: ``[N, 3, H, W]`` RGB in [0, 1] normalised with the ImageNet mean and std (what
:func:`deltaconv.video.to_tensor` gives; ``H`` and ``W`` multiples of 32). The network itself takes
BGR scaled to [-1, 1] (RapidOCR's ``DetPreProcess``: ``(x / 255 - 0.5) / 0.5``).
Output: ``[N, 1, H, W]``, each pixel's probability of being text; RapidOCR thresholds it at 0.3
(``thresh``) before it looks for boxes.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .video import imagenet_to_unit

#: the probability RapidOCR's post-processing thresholds the map at (its ``thresh``)
TEXT_THRESHOLD = 0.3


class PaddleInput(nn.Module):
    """ImageNet-normalised RGB -> BGR in [-1, 1]: ``flip(x) * scale + shift`` per channel."""

    def __init__(self) -> None:
        super().__init__()
        std, mean = (t.flip(1) for t in imagenet_to_unit())  # BGR order
        self.register_buffer("scale", 2 * std)
        self.register_buffer("shift", 2 * mean - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(1) * self.scale + self.shift


class PPOCRv4Det(nn.Module):
    """``detector(PaddleInput(x))``: the onnx2torch GraphModule with RapidOCR's input convention."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.input = PaddleInput()
        self.detector = detector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.detector(self.input(x))


def ppocr_v4_det() -> PPOCRv4Det:
    """PP-OCRv4's text detector with its real weights (RapidOCR's ONNX file, see
    :func:`deltaconv.weights.ppocr_det_onnx`), in eval mode on the CPU."""
    from .onnx_models import load_onnx
    from .weights import ppocr_det_onnx

    return PPOCRv4Det(load_onnx(ppocr_det_onnx())).eval()
