"""Graph passes for what exported models spell out op by op (ONNX through onnx2torch, and the like).

Exporters such as paddle2onnx write a BatchNorm after a convolution as a multiplication and an
addition by constants, and hardswish as ``x * clip(x + 3, 0, 6) / 6``. Converted op by op, that is
two passes over memory after every convolution and four layers (one a product of two deltas, with
its states) per hardswish. :func:`fold_constant_affines` turns such a multiply-add after a
convolution into an ``nn.BatchNorm2d`` of the same constants (which the converter then folds into
the convolution) and :func:`fold_hardswish` turns the written-out hardswish into ``F.hardswish``.
Both run in :func:`deltaconv.convert` on the traced graph (with its shape metadata), before the
conversion; the dense model's outputs do not change (the multiply-add to rounding).
"""
from __future__ import annotations

import copy
import operator
from typing import Optional

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from .layout import _only_user
from .onnx_models import onnx_div

#: binary calls by function or tensor-method name (``c * x`` with ``c`` a buffer traces as ``c.mul(x)``)
_ADDS = (operator.add, torch.add, "add")
_MULS = (operator.mul, torch.mul, "mul")
_DIVS = (operator.truediv, torch.div, onnx_div, "div", "truediv")


def _call(node, targets) -> bool:
    return node.op in ("call_function", "call_method") and node.target in targets and not node.kwargs \
        and len(node.args) == 2


def _constant(node, root: nn.Module) -> Optional[torch.Tensor]:
    """The value of a literal number or of a ``get_attr`` tensor of ``root``, else ``None``."""
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return torch.tensor(float(node))
    if isinstance(node, fx.Node) and node.op == "get_attr":
        value = root
        for part in node.target.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.detach()
    return None


def _operands(node: fx.Node, root: nn.Module) -> Optional[tuple[fx.Node, torch.Tensor]]:
    """``(x, c)`` of a binary call with one graph operand ``x`` and one constant ``c``, else ``None``."""
    a, b = node.args
    for x, c in ((a, b), (b, a)):
        value = _constant(c, root)
        if value is not None and isinstance(x, fx.Node) and _constant(x, root) is None:
            return x, value
    return None


def _per_channel(value: torch.Tensor, channels: int) -> Optional[torch.Tensor]:
    """``value`` as ``[channels]`` if it broadcasts over ``[N, channels, H, W]`` along channels only."""
    if value.numel() == 1:
        return value.reshape(1).expand(channels).clone()
    shape = tuple(value.shape)
    if value.numel() == channels and shape in ((channels, 1, 1), (1, channels, 1, 1)):
        return value.reshape(channels).clone()
    return None


def _channels(node: fx.Node) -> Optional[int]:
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 4 else None


def fold_constant_affines(graph: fx.Graph, root: nn.Module) -> int:
    """Replace every ``conv(x) * c [+ b]`` and ``conv(x) + b`` of ``graph`` (``c``, ``b`` constants, a
    scalar or one per output channel; each op the only reader of the one before, the convolution a
    ``nn.Conv2d`` or ``nn.ConvTranspose2d`` of ``root``) by an ``nn.BatchNorm2d`` of those constants
    (mean 0, variance ``1 - eps``: ``y = c * x + b`` to rounding), registered in ``root``, which
    :func:`deltaconv.convert` folds into the convolution. Returns the number replaced."""
    folded = 0
    for conv in list(graph.nodes):
        if conv.op != "call_module" or type(root.get_submodule(conv.target)) not in (nn.Conv2d, nn.ConvTranspose2d):
            continue
        channels = _channels(conv)
        first = _only_user(conv)
        if channels is None or first is None:
            continue
        found = _scale_shift(first, root, channels, conv)
        if found is None:
            continue
        scale, shift, last = found
        weight = root.get_submodule(conv.target).weight
        bn = _constant_batch_norm(scale if scale is not None else torch.ones(channels),
                                  shift if shift is not None else torch.zeros(channels)).to(weight)
        name = _unique_name(root, f"affine_{conv.target}")
        root.add_module(name, bn)
        _substitute(graph, last, "call_module", name, (conv,))
        _erase_chain(graph, first, last)
        folded += 1
    return folded


def _not_persistent(module: nn.Module) -> nn.Module:
    """``module`` with its parameters and buffers as non-persistent buffers: what a pass adds stays out of
    the converted model's ``state_dict`` (which the dense model's still loads into)."""
    for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
        delattr(module, name)
        module.register_buffer(name, None if tensor is None else tensor.detach().clone(), persistent=False)
    return module


def _constant_batch_norm(scale: torch.Tensor, shift: torch.Tensor) -> nn.BatchNorm2d:
    """An eval ``nn.BatchNorm2d`` computing ``scale * x + shift`` per channel (mean 0, variance
    ``1 - eps``), its tensors kept out of ``state_dict``."""
    bn = nn.BatchNorm2d(scale.numel())
    with torch.no_grad():
        bn.running_var.fill_(1.0 - bn.eps)  # sqrt(var + eps) = 1
        bn.weight.copy_(scale)
        bn.bias.copy_(shift)
    # eval with its running statistics either way; no num_batches_tracked for load_state_dict to expect
    bn.track_running_stats = False
    del bn.num_batches_tracked
    return _not_persistent(bn.eval())


def _scale_shift(first: fx.Node, root: nn.Module, channels: int, follows: fx.Node):
    """``(scale, shift, last)`` of ``follows * c [+ b]`` / ``follows + b`` starting at ``first`` (``c``,
    ``b`` per channel of ``channels``; ``None`` where absent), ``last`` its final node; ``None`` if it
    is not one."""
    scale, shift, last = None, None, None
    if _call(first, _MULS) and (found := _operands(first, root)) is not None and found[0] is follows:
        scale, last = _per_channel(found[1], channels), first
        if scale is None:
            return None
    add = first if last is None else _only_user(first)
    if add is not None and _call(add, _ADDS) and (found := _operands(add, root)) is not None \
            and found[0] is (follows if last is None else last):
        shift = _per_channel(found[1], channels)
        if shift is not None:
            last = add
    return None if last is None else (scale, shift, last)


def _substitute(graph: fx.Graph, old: fx.Node, op: str, target, args: tuple) -> fx.Node:
    """A new ``op`` node calling ``target(*args)`` after ``old``, with its metadata, read where ``old`` was."""
    with graph.inserting_after(old):
        node = graph.create_node(op, target, args)
    node.meta = dict(old.meta)
    old.replace_all_uses_with(node)
    return node


def _erase_chain(graph: fx.Graph, first: fx.Node, last: fx.Node) -> None:
    """Erase ``first`` .. ``last`` (one or two nodes, unread now) and the constants only they read."""
    operands = list(first.args) + (list(last.args) if last is not first else [])
    for n in ([last, first] if last is not first else [last]):
        graph.erase_node(n)
    _erase_unused_constants(graph, operands)


def _unique_name(root: nn.Module, name: str) -> str:
    name = name.replace(".", "_")
    while hasattr(root, name):
        name += "_"
    return name


def fold_input_affines(graph: fx.Graph, root: nn.Module) -> int:
    """Fold every ``y * c [+ b]`` whose only reader is a convolution (``nn.Conv2d`` of ``root`` called at
    that one site; ``c``, ``b`` constants, a scalar or one per input channel) into a copy of that
    convolution: its weights times ``c`` per input channel, and ``b`` through the weights into its bias.
    The shift folds only where the convolution pads nothing (a padded border would see ``b`` where
    the dense model pads zeros); before a padded one ``y * c + b`` becomes ``y + b / c`` and the scale
    still folds (zero padding scales to zero). The affine layer PP-LCNetV3 puts after
    every activation (``LearnableAffineBlock``) before its 1x1 convolutions. Returns the number folded."""
    sites: dict = {}
    for n in graph.nodes:
        if n.op == "call_module":
            sites[n.target] = sites.get(n.target, 0) + 1
    folded, erased = 0, set()
    for first in list(graph.nodes):
        if first in erased or not (_call(first, _MULS) or _call(first, _ADDS)):
            continue
        y = first.args[0] if isinstance(first.args[0], fx.Node) and _constant(first.args[0], root) is None \
            else first.args[1]
        channels = _channels(first) if isinstance(y, fx.Node) else None
        found = None if channels is None else _scale_shift(first, root, channels, y)
        if found is None:
            continue
        scale, shift, last = found
        conv_node = _only_user(last)
        if conv_node is None or conv_node.op != "call_module" or conv_node.args != (last,) or conv_node.kwargs \
                or sites.get(conv_node.target) != 1:
            continue
        conv = root.get_submodule(conv_node.target)
        pads = conv.padding if isinstance(conv.padding, tuple) else (conv.padding,)
        if type(conv) is not nn.Conv2d or conv.in_channels != channels or conv.padding_mode != "zeros":
            continue
        source = y
        if shift is not None and (isinstance(conv.padding, str) or any(pads)):
            # a padded conv: c * y + b = c * (y + b / c); the scale folds, the shift stays (before it)
            if scale is None or not bool((scale != 0).all()):
                continue
            buffer = _unique_name(root, f"{conv_node.target}_shift_in")
            root.register_buffer(buffer, (shift / scale).view(1, channels, 1, 1).to(conv.weight), persistent=False)
            with graph.inserting_before(first):
                const = graph.get_attr(buffer)
                source = graph.call_function(torch.add, (y, const))
            source.meta = dict(last.meta)
            shift = None
        new = _not_persistent(copy.deepcopy(conv))
        g, w = conv.groups, conv.weight.detach()
        per_group = w.view(g, conv.out_channels // g, channels // g, *w.shape[2:])
        with torch.no_grad():
            if shift is not None:
                b = shift.to(w.dtype).view(g, 1, channels // g, 1, 1)
                extra = (per_group * b).sum(dim=(2, 3, 4)).reshape(conv.out_channels)
                new.bias = extra if new.bias is None else new.bias + extra
            if scale is not None:
                c = scale.to(w.dtype).view(g, 1, channels // g, 1, 1)
                new.weight.copy_((per_group * c).reshape(w.shape))
        name = _unique_name(root, f"{conv_node.target}_affine_in")
        root.add_module(name, new)
        _substitute(graph, conv_node, "call_module", name, (source,))
        graph.erase_node(conv_node)
        erased |= {first, last}
        _erase_chain(graph, first, last)
        folded += 1
    return folded


def _erase_unused_constants(graph: fx.Graph, nodes) -> None:
    """Erase the ``get_attr`` nodes among ``nodes``' arguments that nothing reads any more."""
    for n in nodes:
        if isinstance(n, fx.Node) and n.op == "get_attr" and not n.users:
            graph.erase_node(n)


def _is_value(value: Optional[torch.Tensor], number: float) -> bool:
    return value is not None and value.numel() == 1 and abs(float(value.reshape(())) - number) < 1e-6 * number


def _relu6_of(node: fx.Node, root: nn.Module) -> Optional[fx.Node]:
    """The input of ``relu6(y)`` / ``clamp(y, 0, 6)`` / ``nn.ReLU6`` / ``nn.Hardtanh(0, 6)``, else ``None``."""
    if node.op == "call_module" and len(node.args) == 1 and not node.kwargs:
        m = root.get_submodule(node.target)
        if type(m) is nn.ReLU6 or (type(m) is nn.Hardtanh and m.min_val == 0.0 and m.max_val == 6.0):
            return node.args[0]
    if node.op == "call_function" and node.target is F.relu6 and len(node.args) == 1:
        return node.args[0]
    if node.op == "call_function" and node.target in (torch.clamp, torch.clip) and not node.kwargs \
            and len(node.args) == 3 and node.args[1] == 0 and node.args[2] == 6:
        return node.args[0]
    return None


def fold_hardswish(graph: fx.Graph, root: nn.Module) -> int:
    """Replace every ``x * relu6(x + 3) / 6`` of ``graph`` (the product either way round, the division
    or a product by 1/6, relu6 as ``F.relu6``, ``clamp(., 0, 6)`` or an ``nn.ReLU6`` / ``nn.Hardtanh(0,
    6)`` of ``root``; each intermediate read only by the next) by ``F.hardswish(x)``. Returns the
    number replaced."""
    folded = 0
    for add in list(graph.nodes):
        if add.op == "output" or not _call(add, _ADDS):
            continue
        found = _operands(add, root)
        relu = _only_user(add)
        if found is None or not _is_value(found[1], 3.0) or relu is None or _relu6_of(relu, root) is not add:
            continue
        x = found[0]
        mul = _only_user(relu)
        if mul is None or not _call(mul, _MULS) or set(mul.args) != {x, relu}:
            continue
        last = _only_user(mul)
        divides = _call(last, _DIVS) and last.args[0] is mul and _is_value(_constant(last.args[1], root), 6.0) \
            if last is not None else False
        sixth = _operands(last, root) if last is not None and _call(last, _MULS) else None
        if not divides and not (sixth is not None and sixth[0] is mul and _is_value(sixth[1], 1 / 6)):
            continue
        _substitute(graph, last, "call_function", F.hardswish, (x,))
        operands = list(add.args) + list(last.args)
        for n in (last, mul, relu, add):
            graph.erase_node(n)
        _erase_unused_constants(graph, operands)
        folded += 1
    return folded
