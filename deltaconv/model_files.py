"""Model files as zoo models: an ``.onnx`` file (:func:`deltaconv.load_onnx`) or a ``.tflite`` file
(:func:`deltaconv.load_tflite`), named by its path wherever the CLI and the demo take a model name.

The demo and the CLI feed ImageNet-normalised RGB frames (:func:`deltaconv.video.to_tensor`). A file's network
takes its own input scaling, which it does not record, so :class:`FileModel` puts the affine from ImageNet
normalisation to that scaling in front (``input_range``, one of :data:`INPUT_RANGES`; the converter turns it into
a scale and an add before the first convolution). The default is ``"unit"`` ([0, 1] RGB, the usual float TFLite
convention, MediaPipe's) for ``.tflite`` and ``"imagenet"`` (the frames as they are, torchvision's exports) for
``.onnx``. The input size is the file's when its input has a fixed height and width (``deltaconv_input_size``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn as nn

#: input scalings a model file may take, with the affine ``(a, b)`` of [0, 1] RGB ``u``: the file's input is
#: ``a * u + b`` (``"imagenet"``: ImageNet's mean and std, the frames as the demo makes them)
INPUT_RANGES = ("imagenet", "unit", "signed", "byte")
#: the suffixes of the model files and their default input range
FILE_DEFAULT_RANGE = {".tflite": "unit", ".onnx": "imagenet"}


def is_model_file(name: str) -> bool:
    """Whether a model name is a path of a model file (by its suffix, :data:`FILE_DEFAULT_RANGE`)."""
    return Path(str(name)).suffix.lower() in FILE_DEFAULT_RANGE


def input_affine(input_range: str) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(scale, shift)`` ``[1, 3, 1, 1]``: an ImageNet-normalised frame ``x`` is ``x * scale + shift`` in
    ``input_range`` (``None`` for ``"imagenet"``: no affine)."""
    from .video import imagenet_to_unit

    if input_range not in INPUT_RANGES:
        raise ValueError(f"input_range: must be one of {', '.join(INPUT_RANGES)}, got {input_range!r}")
    if input_range == "imagenet":
        return None
    scale, shift = imagenet_to_unit()
    a, b = {"unit": (1.0, 0.0), "signed": (2.0, -1.0), "byte": (255.0, 0.0)}[input_range]
    return scale * a, shift * a + b


class FileModel(nn.Module):
    """A model file's network behind the affine that makes its input scaling from ImageNet-normalised frames.
    ``deltaconv_input_size``: the file's fixed input ``(H, W)``, or ``None``."""

    def __init__(self, network: nn.Module, input_range: str, input_size: Optional[tuple[int, int]] = None) -> None:
        super().__init__()
        self.network, self.input_range, self.deltaconv_input_size = network, input_range, input_size
        affine = input_affine(input_range)
        if affine is not None:
            self.register_buffer("scale", affine[0])
            self.register_buffer("shift", affine[1])

    def forward(self, x: torch.Tensor):
        """``x``: ``[N, 3, H, W]`` ImageNet-normalised RGB; returns what the file's network returns."""
        if self.input_range != "imagenet":
            x = x * self.scale + self.shift
        return self.network(x)


def _onnx_input_size(path: Path) -> Optional[tuple[int, int]]:
    """``(H, W)`` of an ONNX file's first graph input when both are fixed ``[N, C, H, W]`` dims, else ``None``."""
    import onnx

    graph = onnx.load(os.fspath(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in inputs[0].type.tensor_type.shape.dim] if inputs \
        else []
    return (int(dims[2]), int(dims[3])) if len(dims) == 4 and min(dims[2:]) > 0 else None


def load_model_file(path: Union[str, os.PathLike], input_range: Optional[str] = None) -> FileModel:
    """The ``.onnx`` or ``.tflite`` file at ``path`` as a :class:`FileModel` (eval mode, CPU, float32);
    ``input_range`` defaults to the suffix's (:data:`FILE_DEFAULT_RANGE`)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FILE_DEFAULT_RANGE:
        raise ValueError(f"model: a model file must end in {' or '.join(FILE_DEFAULT_RANGE)}, got {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"model: no model file at {str(path)!r}")
    input_range = FILE_DEFAULT_RANGE[suffix] if input_range is None else input_range
    input_affine(input_range)  # checks it before the file is read
    if suffix == ".tflite":
        from .tflite_models import load_tflite

        network = load_tflite(path)
        size = network.input_hw
    else:
        from .onnx_models import load_onnx

        network, size = load_onnx(path), _onnx_input_size(path)
    return FileModel(network, input_range, size).eval()
