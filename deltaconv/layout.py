"""Channels-last blocks kept channels-first: a graph pass of :func:`deltaconv.convert`.

ConvNeXt (and models written like it) runs each block's pointwise part on a channels-last *view*::

    x.permute(0, 2, 3, 1) -> LayerNorm(C) -> Linear -> GELU -> Linear -> .permute(0, 3, 1, 2)

and its ``LayerNorm2d`` is ``permute -> F.layer_norm -> permute``. A :class:`~deltaconv.delta.Delta`
keeps one update flag per pixel in dim 1's place, so on the view ``[N, H, W, C]`` its mask would be
one flag per ``(w, c)`` column (any change in the column), and such a LayerNorm had no delta rule at
all (a dense fallback). Every op between the two permutes works on each pixel's channel vector
alone, so the block is the same computation channels-first: :func:`keep_channels_first` finds such
chains, marks the two permutes for removal and the ops between them with :data:`CHANNELS_FIRST`
(their shapes made ``[N, C, H, W]``); the converter then builds a per-pixel layer norm
(:class:`~deltaconv.modules.DCLayerNorm`) and 1x1 convolutions
(:class:`~deltaconv.modules.DCPixelLinear`) for them. A LayerNorm over the last dim of a 2-D
``[N, C]`` tensor is marked too (its channels are dim 1 already).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from . import activations
from .rules import FUNCTION_RULES, PASSTHROUGH_MODULES, _activation

#: node.meta key: the node computes on a channels-last view but runs channels-first (dim 1 = channels)
CHANNELS_FIRST = "dc_channels_first"
#: node.meta key: a permute into or out of such a view, removed by the converter
LAYOUT_PERMUTE = "dc_layout_permute"

_TO_CHANNELS_LAST = (0, 2, 3, 1)
_TO_CHANNELS_FIRST = (0, 3, 1, 2)


def _shape(node) -> Optional[tuple]:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _permute_dims(node: fx.Node) -> Optional[tuple]:
    """The dims of a 4-D ``permute`` node (``torch.permute(x, dims)``, ``x.permute(*dims)``), else ``None``."""
    if node.op == "call_function" and node.target is torch.permute:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dims")
    elif node.op == "call_method" and node.target == "permute":
        dims = node.args[1] if len(node.args) == 2 else node.args[1:]
        dims = node.kwargs.get("dims", dims)
    else:
        return None
    if not isinstance(dims, (list, tuple)) or len(dims) != 4 or not all(isinstance(d, int) for d in dims):
        return None
    return tuple(d % 4 for d in dims)


def _layer_norm_channels(node: fx.Node, root: nn.Module) -> Optional[int]:
    """The size of the one dim a LayerNorm node (module or ``F.layer_norm``) normalises, else ``None``."""
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        if type(module) is not nn.LayerNorm or len(module.normalized_shape) != 1:
            return None
        return module.normalized_shape[0]
    if node.op == "call_function" and node.target is F.layer_norm:
        shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
        if isinstance(shape, int):
            return shape
        if isinstance(shape, (list, tuple)) and len(shape) == 1 and isinstance(shape[0], int):
            return shape[0]
    return None


def _per_pixel(node: fx.Node, src: fx.Node, root: nn.Module) -> bool:
    """Whether ``node`` maps each pixel's channel vector of ``src`` (its only tensor input that
    changes) to that pixel's output channels, and has a channels-first delta rule."""
    shape = _shape(src)
    if shape is None or not node.args or node.args[0] is not src:
        return False
    others = [n for n in node.all_input_nodes if n is not src]
    if any(n.op != "get_attr" for n in others):
        return False
    channels = _layer_norm_channels(node, root)
    if channels is not None:
        return channels == shape[-1]
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        if type(module) is nn.Linear:
            return module.in_features == shape[-1] and not node.kwargs and len(node.args) == 1
        if isinstance(module, PASSTHROUGH_MODULES):
            return False  # removed by the converter anyway; keep the pass simple
        return activations.from_module(module) is not None and len(node.args) == 1 and not node.kwargs
    key = node.target if node.op == "call_function" else f"method:{node.target}"
    return FUNCTION_RULES.get(key) is _activation and not others


def _channels_first_meta(node: fx.Node) -> None:
    """``[N, H, W, C]`` shape metadata of ``node`` made ``[N, C, H, W]``."""
    meta = node.meta["tensor_meta"]
    n, h, w, c = meta.shape
    shape = torch.Size((n, c, h, w))
    node.meta["tensor_meta"] = meta._replace(shape=shape, stride=(c * h * w, h * w, w, 1))
    node.meta[CHANNELS_FIRST] = True


def keep_channels_first(graph: fx.Graph, root: nn.Module) -> int:
    """Mark every ``permute(0, 2, 3, 1) -> per-pixel ops -> permute(0, 3, 1, 2)`` chain of ``graph``
    (each op the only reader of the one before; see the module docstring) to run channels-first,
    and every LayerNorm over the last dim of a 2-D tensor. Returns the number of chains."""
    chains = 0
    for start in list(graph.nodes):
        if _permute_dims(start) != _TO_CHANNELS_LAST or len(_shape(start.args[0]) or ()) != 4:
            continue
        chain, cur = [], start
        while len(cur.users) == 1:
            user = next(iter(cur.users))
            if _permute_dims(user) == _TO_CHANNELS_FIRST and user.args[0] is cur:
                for node in chain:
                    _channels_first_meta(node)
                start.meta[LAYOUT_PERMUTE] = user.meta[LAYOUT_PERMUTE] = True
                start.meta["tensor_meta"] = start.args[0].meta["tensor_meta"]
                chains += 1
                break
            if not _per_pixel(user, cur, root) or len(_shape(user) or ()) != 4:
                break
            chain.append(user)
            cur = user
    for node in graph.nodes:
        shape = _shape(node.args[0]) if node.args else None
        if shape is not None and len(shape) == 2 and _layer_norm_channels(node, root) == shape[1]:
            node.meta[CHANNELS_FIRST] = True
    return chains


__all__ = ["CHANNELS_FIRST", "LAYOUT_PERMUTE", "keep_channels_first"]
