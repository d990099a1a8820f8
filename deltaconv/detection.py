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

Thresholds for a backbone come from :func:`deltaconv.calibrate` on the dense backbone, its input
frames (:func:`backbone_input`) and :func:`feature_maps` as the output, so that every pyramid level
counts; ``convert_backbone(det, frames, thresholds=calibration)`` uses them.
"""
from __future__ import annotations

import copy
from typing import Sequence, Union

import torch
import torch.nn as nn

from .convert import convert

__all__ = ["convert_backbone", "backbone_input", "feature_maps"]


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


def feature_maps(out) -> torch.Tensor:
    """A backbone's output (a dict of feature maps ``[N, C, h, w]``, a list or a tensor) as one
    ``[N, M]`` tensor of every map flattened, in order: the ``output_fn`` of
    :func:`deltaconv.calibrate` for a backbone, whose relative error then weighs each pyramid level
    by its size (the default output function reads the first map only)."""
    maps = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (list, tuple)) else [out]
    if not maps or not all(torch.is_tensor(m) for m in maps):
        raise TypeError(f"feature_maps: expected a tensor, or a dict or list of tensors, got {type(out).__name__}")
    return torch.cat([m.flatten(1) for m in maps], dim=1)


def convert_backbone(model: nn.Module, example_input: Union[torch.Tensor, Sequence[torch.Tensor]], *,
                     attribute: str = "backbone", **convert_kwargs) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose sub-module ``attribute`` is converted by :func:`convert`.

    Args:
        model: a detector or pose model that calls its backbone once per frame batch, e.g. any of
            torchvision's detection models, whose ``backbone`` takes the transformed batch and
            returns a dict of feature maps. ``model`` itself is left untouched.
        example_input: frames as ``model`` takes them (``[N, 3, H, W]`` or a list of ``[3, H, W]``);
            the backbone is traced on :func:`backbone_input` of them.
        attribute: dotted path of the sub-module to convert (default ``"backbone"``).
        **convert_kwargs: passed on to :func:`convert` (``threshold``, ``thresholds``, ``backend``,
            ``cuda_graph``, ...); their ``example_input`` is :func:`backbone_input` of ``example_input``.

    Returns:
        The copy. Its ``getattr(copy, attribute)`` is the :class:`~deltaconv.DeltaModel`: its
        ``stats()``, ``reset()`` and thresholds are those of the converted part. The heads run dense
        on the backbone's outputs, which match the dense backbone's (exactly at threshold 0). The
        converted backbone is stateful: each call of the model is the next frame of its streams
        (one per image of the batch), and the images must come from the same cameras in order.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_backbone: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(attribute, str) or not attribute:
        raise ValueError(f"convert_backbone: attribute must be a module path like 'backbone', got {attribute!r}")
    try:
        part = model.get_submodule(attribute)
    except AttributeError:
        children = ", ".join(name for name, _ in model.named_children()) or "none"
        raise ValueError(f"convert_backbone: {type(model).__name__} has no sub-module {attribute!r} "
                         f"(its children: {children}); name the one to convert with attribute=") from None
    result = copy.deepcopy(model).eval()
    example = backbone_input(result, example_input)
    converted = convert(part, example_input=example, **convert_kwargs)
    parent_name, _, child_name = attribute.rpartition(".")
    parent = result.get_submodule(parent_name) if parent_name else result
    setattr(parent, child_name, converted)
    return result
