"""Views rewritten before conversion: two graph passes of :func:`deltaconv.convert`.

Channels-last blocks kept channels-first (:func:`keep_channels_first`)
----------------------------------------------------------------------

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

Channel shuffles as one call (:func:`fold_channel_shuffles`)
------------------------------------------------------------
ShuffleNet (and models written like it) shuffles channels through a 5-D view::

    x.view(N, g, C // g, H, W) -> transpose(1, 2) -> .contiguous() -> .view(N, C, H, W)

On the 5-D view a delta's mask would be one flag per ``(group, channel)`` row, so each of the four
ops ran the general data-movement rule (the op on the values and on the masks expanded to the
values' shape). The chain is ``torch.channel_shuffle(x, g)``, which moves channels within each
pixel only: the pass puts that call in its place (and drops the ``x.size()`` arithmetic that only
fed the views; the report's entry for the call names the nodes it replaced), and the converter
keeps the mask as it is.

Concatenation, shuffle and split as one call (:func:`fold_shuffled_concatenations`)
-------------------------------------------------------------------------------------
A ShuffleNet V2 block ends in ``torch.cat((x1, branch(x2)), 1) -> channel_shuffle(., 2)`` and the
next block starts with ``.chunk(2, dim=1)``. Run as written, a delta frame copies four times per
block: the concatenation, the shuffle, and each half of the chunk (a strided view) for the
convolution and the next concatenation that read it contiguous. The pass puts one
``shuffled_concatenate(tensors, groups[, chunks])`` call in place of the chain, which
:class:`~deltaconv.modules.DCShuffledConcatenate` runs as one pass that writes each chunk
contiguous (the report's entry names the nodes it replaced).
"""
from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from . import activations
from .modules.linear import shuffled_concatenate
from .rules import FUNCTION_RULES, PASSTHROUGH_MODULES, _activation

#: node.meta key: the node computes on a channels-last view but runs channels-first (dim 1 = channels)
CHANNELS_FIRST = "dc_channels_first"
#: node.meta key: a permute into or out of such a view, removed by the converter
LAYOUT_PERMUTE = "dc_layout_permute"
#: node.meta key: on a ``torch.channel_shuffle`` node, the names of the view chain it replaced
FOLDED_SHUFFLE = "dc_folded_shuffle"

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


#: row-major reshapes (the shape checks of ``_shuffle_chain`` say which dims they split or join)
_SPLIT_VIEWS = (torch.reshape, torch.unflatten, "view", "reshape", "unflatten")
_JOIN_VIEWS = (torch.reshape, torch.flatten, "view", "reshape", "flatten")
#: pure calls that compute shapes from ``x.size()`` (erased with the views they fed)
_SHAPE_ARITHMETIC = (operator.getitem, operator.floordiv, operator.mul, operator.add, operator.sub, getattr)


def _is_call(node: fx.Node, *targets) -> bool:
    return (node.op == "call_function" and node.target in targets) or (
        node.op == "call_method" and node.target in targets)


def _only_user(node: fx.Node) -> Optional[fx.Node]:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _swaps_dims_1_2(node: fx.Node, src: fx.Node) -> bool:
    """``src.transpose(1, 2)`` (or ``torch.transpose``, ``swapaxes``, dims either way round) of a 5-D tensor."""
    if not _is_call(node, torch.transpose, torch.swapaxes, "transpose", "swapaxes") or node.kwargs:
        return False
    return tuple(node.args[:1]) == (src,) and len(node.args) == 3 and {node.args[1], node.args[2]} in (
        {1, 2}, {1, -3}, {-4, 2}, {-4, -3})


def _shuffle_chain(view: fx.Node) -> Optional[tuple[list, int]]:
    """The nodes of a channel shuffle chain starting at ``view`` (see the module docstring) and its
    groups, else ``None``."""
    src = view.args[0] if view.args else None
    shape, shape5 = _shape(src), _shape(view)
    if not _is_call(view, *_SPLIT_VIEWS) or shape is None or len(shape) != 4 or shape5 is None or len(shape5) != 5:
        return None
    n, c, h, w = shape
    groups = shape5[1]
    if shape5 != (n, groups, c // groups, h, w) or groups * (c // groups) != c:
        return None
    chain, cur = [view], _only_user(view)
    if cur is None or not _swaps_dims_1_2(cur, view):
        return None
    chain.append(cur)
    nxt = _only_user(cur)
    if nxt is not None and _is_call(nxt, "contiguous") and len(nxt.args) == 1 and not nxt.kwargs:
        chain.append(nxt)
        nxt = _only_user(nxt)
    if nxt is None or not _is_call(nxt, *_JOIN_VIEWS) or nxt.args[0] is not chain[-1] or _shape(nxt) != shape:
        return None
    return chain + [nxt], groups


def _erase_dead_shape_arithmetic(graph: fx.Graph, nodes) -> set:
    """Erase each of ``nodes`` (and what only it read, recursively) that nothing reads and that
    only computes shapes (``x.size()``, its items, integer arithmetic); returns the erased nodes."""
    def pure(n: fx.Node) -> bool:
        return _is_call(n, "size", *_SHAPE_ARITHMETIC)

    todo, erased = list(dict.fromkeys(nodes)), set()
    while todo:
        node = todo.pop()
        if node in erased or not pure(node):
            continue
        for user in [u for u in node.users if pure(u) and not u.users]:  # dead items of x.shape unpacked
            graph.erase_node(user)
            erased.add(user)
        if node.users:
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        erased.add(node)
        todo.extend(inputs)
    return erased


def fold_channel_shuffles(graph: fx.Graph) -> int:
    """Replace every ``view(N, g, C // g, H, W) -> transpose(1, 2) [-> contiguous()] -> view(N, C, H, W)``
    chain of ``graph`` (each op the only reader of the one before; see the module docstring) by
    ``torch.channel_shuffle(x, g)``. The views may be any row-major reshape whose shapes say so
    (``view``, ``reshape``, ``unflatten(1, (g, C // g))`` in, ``flatten(1, 2)`` out). Returns the
    number of chains."""
    folded, erased = 0, set()
    for view in list(graph.nodes):
        found = None if view in erased else _shuffle_chain(view)
        if found is None:
            continue
        chain, groups = found
        last = chain[-1]
        with graph.inserting_after(last):
            shuffle = graph.call_function(torch.channel_shuffle, (view.args[0], groups))
        shuffle.meta = dict(view.meta)
        shuffle.meta["tensor_meta"] = last.meta["tensor_meta"]
        shuffle.meta[FOLDED_SHUFFLE] = [node.name for node in chain]
        last.replace_all_uses_with(shuffle)
        shape_inputs = [n for node in chain for n in node.all_input_nodes if n not in chain]
        for node in reversed(chain):
            graph.erase_node(node)
        erased |= set(chain) | _erase_dead_shape_arithmetic(graph, shape_inputs)
        folded += 1
    return folded


def _literal_arg(node: fx.Node, position: int, name: str, default=None):
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _along_channels(dim, shape: Optional[tuple]) -> bool:
    return isinstance(dim, int) and shape is not None and len(shape) == 4 and dim % 4 == 1


def _shuffle_of(node: fx.Node, root: Optional[nn.Module]) -> Optional[tuple]:
    """``(input, groups)`` of a channel shuffle node (``torch.channel_shuffle``,
    ``F.channel_shuffle``, or an ``nn.ChannelShuffle`` of ``root``), else ``None``."""
    if _is_call(node, torch.channel_shuffle, F.channel_shuffle) and not node.kwargs and len(node.args) == 2:
        return node.args[0], node.args[1]
    if node.op == "call_module" and root is not None and len(node.args) == 1 and not node.kwargs:
        module = root.get_submodule(node.target)
        if type(module) is nn.ChannelShuffle:
            return node.args[0], module.groups
    return None


def _shuffled_concatenation(shuffle: fx.Node, root: Optional[nn.Module]) -> Optional[tuple]:
    """``(cat, tensors, groups, chunk, chunks)`` where ``shuffle`` is a channel shuffle whose input
    is a concatenation along the channels that nothing else reads (``chunk`` the chunk along the
    channels that alone reads the shuffle, else ``None``), else ``None``."""
    found = _shuffle_of(shuffle, root)
    if found is None:
        return None
    cat, groups = found
    if not isinstance(cat, fx.Node) or not _is_call(cat, torch.cat, torch.concat, torch.concatenate):
        return None
    tensors = _literal_arg(cat, 0, "tensors")
    if (not isinstance(groups, int) or _only_user(cat) is not shuffle or set(cat.kwargs) - {"dim"}
            or not isinstance(tensors, (list, tuple)) or not all(isinstance(t, fx.Node) for t in tensors)
            or not _along_channels(_literal_arg(cat, 1, "dim", 0), _shape(cat))):
        return None
    chunk = _only_user(shuffle)
    if chunk is None or not _is_call(chunk, torch.chunk, "chunk") or chunk.args[:1] != (shuffle,):
        return cat, tensors, groups, None, None
    chunks = _literal_arg(chunk, 1, "chunks")
    if not isinstance(chunks, int) or not _along_channels(_literal_arg(chunk, 2, "dim", 0), _shape(shuffle)):
        return cat, tensors, groups, None, None
    return cat, tensors, groups, chunk, chunks


def fold_shuffled_concatenations(graph: fx.Graph, root: Optional[nn.Module] = None) -> int:
    """Replace every ``torch.cat(tensors, 1) -> torch.channel_shuffle(., g) [-> .chunk(k, 1)]``
    chain of ``graph`` (each op the only reader of the one before; run after
    :func:`fold_channel_shuffles`) by one ``shuffled_concatenate(tensors, g[, k])`` call (see the
    module docstring). The shuffle may also be an ``nn.ChannelShuffle`` of ``root`` (the module the
    graph was traced from). Returns the number of chains."""
    folded = 0
    for shuffle in list(graph.nodes):
        found = _shuffled_concatenation(shuffle, root)
        if found is None:
            continue
        cat, tensors, groups, chunk, chunks = found
        last = chunk if chunk is not None else shuffle
        args = (list(tensors), groups) + (() if chunk is None else (chunks,))
        with graph.inserting_after(last):
            joined = graph.call_function(shuffled_concatenate, args)
        joined.meta = dict(cat.meta)
        for key in ("tensor_meta", "type"):  # what the call returns (named in the concatenation's scope)
            if key in last.meta:
                joined.meta[key] = last.meta[key]
        joined.meta[FOLDED_SHUFFLE] = ([cat.name] + shuffle.meta.get(FOLDED_SHUFFLE, [shuffle.name])
                                       + ([] if chunk is None else [chunk.name]))
        last.replace_all_uses_with(joined)
        for node in (chunk, shuffle, cat):
            if node is not None:
                graph.erase_node(node)
        folded += 1
    return folded


def folded_note(node: fx.Node) -> str:
    """The report's note on a call that a pass of this module put in place of a chain (names the
    nodes it replaced), else ``""``."""
    names = node.meta.get(FOLDED_SHUFFLE)
    if not names:
        return ""
    if node.target is shuffled_concatenate:
        what = "concatenation, channel shuffle and chunk" if len(node.args) > 2 else "concatenation and channel shuffle"
    else:
        what = "channel shuffle"
    return f"{what} of {', '.join(names)} (deltaconv.layout)"


__all__ = ["CHANNELS_FIRST", "FOLDED_SHUFFLE", "LAYOUT_PERMUTE", "fold_channel_shuffles",
           "fold_shuffled_concatenations", "folded_note", "keep_channels_first"]
