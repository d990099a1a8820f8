"""MTCNN's face-proposal network PNet (Zhang et al., 2016) as facenet-pytorch defines it, with its real weights.

PNet is the first, fully convolutional stage of the MTCNN face detector, run over a whole frame (at each
scale of an image pyramid): three unpadded 3x3 convolutions with a per-channel PReLU after each (a 2x2 max
pooling with ``ceil_mode`` after the first), then two 1x1 heads on the 32-channel map: a face probability (a
softmax over 2 channels, each pixel's) and a box regression (4 channels). One output pixel per 12x12 window
of the input, at stride 2. Module names are facenet-pytorch's (``models/mtcnn.py``, MIT), so its released
``pnet.pt`` loads with ``strict=True``; the package itself is not imported (:func:`deltaconv.weights.
mtcnn_pnet_state_dict` finds the file).

Input: ``[N, 3, H, W]`` RGB as MTCNN scales it, ``(pixel - 127.5) / 128`` with pixels in [0, 255]
(:func:`mtcnn_normalize` of :func:`deltaconv.video.to_tensor`'s unnormalised frames). Output, as facenet-pytorch:
``(boxes [N, 4, h, w], probabilities [N, 2, h, w])`` with ``h = ceil((H - 2) / 2) - 4`` (likewise ``w``) and
channel 1 of the probabilities the face's. :class:`PNetFaces` (:func:`mtcnn_pnet_faces`, the zoo's ``mtcnn_pnet``)
takes ImageNet-normalised frames instead and gives the face probability map first.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn as nn


class PNet(nn.Module):
    """MTCNN's PNet (facenet-pytorch's layers and names); random weights until a state dict is loaded
    (:func:`mtcnn_pnet`)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: ``[N, 3, H, W]`` (see the module docstring); returns ``(boxes [N, 4, h, w], probabilities
        [N, 2, h, w])``."""
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))


class PNetFaces(nn.Module):
    """PNet on ImageNet-normalised RGB (what :func:`deltaconv.video.read_frames` gives, the input of the zoo's models
    and of the demo): MTCNN's input scaling as a per-channel affine in front (``x * scale + shift``, which the
    converter folds into the first convolution), and the face probability map first in the output:
    ``(faces [N, 1, h, w], boxes [N, 4, h, w])``, ``faces`` channel 1 of PNet's softmax."""

    deltaconv_task = "faces"

    def __init__(self, pnet: PNet) -> None:
        super().__init__()
        from .video import imagenet_to_unit

        std, mean = imagenet_to_unit()  # mtcnn_normalize(x * std + mean), as one affine
        self.register_buffer("scale", std * (255.0 * 0.0078125))
        self.register_buffer("shift", mtcnn_normalize(mean))
        self.pnet = pnet

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: ``[N, 3, H, W]`` ImageNet-normalised RGB; returns ``(faces [N, 1, h, w], boxes [N, 4, h, w])``."""
        boxes, probabilities = self.pnet(x * self.scale + self.shift)
        return probabilities[:, 1:2], boxes


def mtcnn_normalize(frame: torch.Tensor) -> torch.Tensor:
    """MTCNN's input scaling of an RGB frame with values in [0, 1] (``to_tensor(..., normalize=False)``):
    ``(255 * frame - 127.5) / 128``, as facenet-pytorch's ``(image - 127.5) * 0.0078125``."""
    return (frame * 255.0 - 127.5) * 0.0078125


def mtcnn_pnet(path: Union[str, os.PathLike, None] = None, device: Optional[torch.device] = None) -> PNet:
    """PNet with facenet-pytorch's released weights (default: the ``pnet.pt`` shipped by the PyPI package
    ``facenet-pytorch``, see :func:`deltaconv.weights.mtcnn_pnet_state_dict`), loaded with ``strict=True``
    (``weights_only``); in eval mode."""
    from .weights import mtcnn_pnet_state_dict

    path = Path(mtcnn_pnet_state_dict() if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"mtcnn_pnet: path {str(path)!r} does not exist")
    model = PNet()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    model.eval()
    return model.to(device) if device is not None else model


def mtcnn_pnet_faces(path: Union[str, os.PathLike, None] = None) -> PNetFaces:
    """:class:`PNetFaces` of :func:`mtcnn_pnet` (the released weights, or the state dict at ``path``), in eval mode on
    the CPU."""
    return PNetFaces(mtcnn_pnet(path)).eval()
