"""Detectors and pose models: convert the backbone, keep the heads dense.

torch.fx cannot trace the whole forward of torchvision's detection models (Faster / Mask /
Keypoint R-CNN, RetinaNet, FCOS, SSD, SSDlite): their proposals, ROI pooling and non-maximum
suppression depend on the values. Their backbone (the feature extractor with its feature pyramid)
traces, sees each frame once and does most of the convolution work, so :func:`convert_backbone`
converts it and leaves the rest of the model as it is::

    det = torchvision.models.detection.keypointrcnn_resnet50_fpn(weights=...).eval()
    det = deltaconv.convert_backbone(det, first_frame, threshold=0.02)
    for frame in frames:                  # [3, H, W] images of one static camera
        people = det([frame])[0]          # boxes, scores, keypoints as the dense model gives them
    det.backbone.stats()                  # the converted part: a DeltaModel

Heads that run convolutions on the feature maps once per frame (RetinaNet's, FCOS's and SSD's
``head``, the R-CNNs' ``rpn.head``) can be converted with the backbone, ``heads=("head",)``: the
backbone and those heads then form one converted model (:class:`FrameParts`), and each head is
replaced by a stand-in (:class:`HeadOutput`) that returns what it computed.
"""
from __future__ import annotations

import copy
from typing import Sequence, Union

import torch
import torch.nn as nn

from .convert import convert

__all__ = ["convert_backbone", "backbone_input", "FrameParts", "HeadOutput"]


def backbone_input(model: nn.Module, frames: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
    """The batch ``[N, 3, H', W']`` that ``model``'s backbone receives for ``frames``.

    ``frames``: what the model takes, a batch ``[N, 3, H, W]`` or a list of ``[3, H, W]`` images.
    A model with a torchvision ``transform`` (``GeneralizedRCNNTransform``: resize, normalise, pad to
    a multiple of 32) gives that transform's batched tensor; any other model the frames themselves.
    """
    if torch.is_tensor(frames):
        if frames.dim() != 4:
            raise ValueError(f"backbone_input: frames must be [N, 3, H, W] or a list of [3, H, W], got shape "
                             f"{tuple(frames.shape)}")
        images = list(frames)
    elif isinstance(frames, (list, tuple)) and frames and all(torch.is_tensor(f) and f.dim() == 3 for f in frames):
        images = list(frames)
    else:
        raise TypeError("backbone_input: frames must be a tensor [N, 3, H, W] or a non-empty list of [3, H, W] "
                        f"tensors, got {type(frames).__name__}")
    transform = getattr(model, "transform", None)
    if not isinstance(transform, nn.Module):
        return torch.stack(images)
    with torch.no_grad():
        out = transform(images)
    batch = out[0] if isinstance(out, tuple) else out
    return batch.tensors if hasattr(batch, "tensors") else batch


class _BackboneWithHeads(nn.Module):
    """The backbone and heads of a detector as one model to trace: the frames in, the backbone's
    feature maps and each head's output (on the maps as a list, in the backbone's order) out. The
    heads sit at their paths in the detector, so the layers keep the detector's names."""

    def __init__(self, backbone: nn.Module, heads: dict) -> None:
        super().__init__()
        self.backbone = backbone
        self.head_paths = tuple(heads)
        for path, head in heads.items():
            parent = self
            *containers, leaf = path.split(".")
            for name in containers:
                if name not in parent._modules:
                    parent.add_module(name, nn.Module())
                parent = parent._modules[name]
            parent.add_module(leaf, head)

    def forward(self, x):
        features = self.backbone(x)
        maps = list(features.values()) if isinstance(features, dict) else [features]
        return (features, *(self.get_submodule(path)(maps) for path in self.head_paths))


class FrameParts(nn.Module):
    """A detector's backbone and heads converted as one :class:`~deltaconv.DeltaModel` (``delta``).

    Called in the backbone's place, it runs the converted model on the transformed batch, returns
    the feature maps (what the backbone returns) and keeps each head's output for that head's
    :class:`HeadOutput`, which the detector calls next in the same frame.
    """

    def __init__(self, delta: nn.Module, heads: Sequence[str]) -> None:
        super().__init__()
        self.delta = delta
        self.heads = tuple(heads)
        self._outputs: dict = {}

    def forward(self, x):
        out = self.delta(x)
        self._outputs = dict(zip(self.heads, out[1:]))
        return out[0]

    def take(self, head: str):
        """The output of ``head`` computed by this frame's call (once: the detector calls each head once)."""
        if head not in self._outputs:
            raise RuntimeError(f"the head {head!r} was converted with the backbone and runs with it: call the "
                               "detector, which calls the backbone first, once per frame")
        return self._outputs.pop(head)


class HeadOutput(nn.Module):
    """Stands in for a head converted with the backbone: returns its output of this frame, computed
    by :class:`FrameParts` (whose ``delta`` holds the head's parameters)."""

    def __init__(self, parts: FrameParts, head: str) -> None:
        super().__init__()
        self.__dict__["parts"] = parts  # not a child: the parameters live in parts.delta
        self.head = head

    def forward(self, *args, **kwargs):
        return self.parts.take(self.head)


def _submodule(model: nn.Module, path, what: str) -> nn.Module:
    if not isinstance(path, str) or not path:
        raise ValueError(f"convert_backbone: {what} must be a module path like 'backbone', got {path!r}")
    try:
        return model.get_submodule(path)
    except AttributeError:
        children = ", ".join(name for name, _ in model.named_children()) or "none"
        raise ValueError(f"convert_backbone: {type(model).__name__} has no sub-module {path!r} "
                         f"(its children: {children}); name the one to convert with {what}=") from None


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_name, _, child_name = path.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child_name, module)


def convert_backbone(model: nn.Module, example_input: Union[torch.Tensor, Sequence[torch.Tensor]], *,
                     attribute: str = "backbone", heads: Union[str, Sequence[str]] = (),
                     **convert_kwargs) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose sub-module ``attribute`` is converted by :func:`convert`.

    Args:
        model: a detector or pose model that calls its backbone once per frame batch, e.g. any of
            torchvision's detection models, whose ``backbone`` takes the transformed batch and
            returns a dict of feature maps. ``model`` itself is left untouched.
        example_input: frames as ``model`` takes them (``[N, 3, H, W]`` or a list of ``[3, H, W]``);
            the backbone is traced on :func:`backbone_input` of them.
        attribute: dotted path of the sub-module to convert (default ``"backbone"``).
        heads: paths of heads to convert with it (``"head"`` for RetinaNet, FCOS and SSD,
            ``"rpn.head"`` for the R-CNNs): sub-modules the model calls once per frame on the
            backbone's feature maps as a list (in the backbone's order). Default: none.
        **convert_kwargs: passed on to :func:`convert` (``threshold``, ``thresholds``, ``backend``,
            ``cuda_graph``, ...); their ``example_input`` is :func:`backbone_input` of ``example_input``.

    Returns:
        The copy. Without ``heads`` its ``getattr(copy, attribute)`` is the
        :class:`~deltaconv.DeltaModel`: its ``stats()``, ``reset()`` and thresholds are those of the
        converted part, and the dense model's ``state_dict`` loads into the copy. With ``heads`` it
        is a :class:`FrameParts` whose ``delta`` is the DeltaModel (layer names ``backbone.*``,
        ``head.*``, ...), each head a :class:`HeadOutput`, and the parameters' names in the copy gain
        the prefix ``<attribute>.delta.``: load weights into ``model`` before converting it. The
        rest of the model runs dense on the converted outputs, which match the dense ones (exactly at
        threshold 0). The converted part is stateful: each call of the model is the next frame of
        its streams (one per image of the batch), and the images must come from the same cameras
        in order.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_backbone: model must be a torch.nn.Module, got {type(model).__name__}")
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    part = _submodule(model, attribute, "attribute")
    for head in heads:
        _submodule(model, head, "heads")
        if head == attribute or head.startswith(attribute + ".") or attribute.startswith(head + "."):
            raise ValueError(f"convert_backbone: heads must lie outside the backbone {attribute!r}, got {head!r}")
    result = copy.deepcopy(model).eval()
    example = backbone_input(result, example_input)
    if not heads:
        _replace(result, attribute, convert(part, example_input=example, **convert_kwargs))
        return result
    combined = _BackboneWithHeads(result.get_submodule(attribute), {h: result.get_submodule(h) for h in heads})
    parts = FrameParts(convert(combined, example_input=example, **convert_kwargs), heads)
    _replace(result, attribute, parts)
    for head in heads:
        _replace(result, head, HeadOutput(parts, head))
    return result
