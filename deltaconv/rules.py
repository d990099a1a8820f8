"""Which DC layer each dense op becomes: type -> class mappings, one entry per op.

``MODULE_RULES`` maps a dense module type to a builder ``dense_module -> DCModule | None``
(``RANKED_MODULE_RULES``: ``(dense_module, rank) -> DCModule | None``, for the modules whose rule depends on
their input's number of dims);
``FUNCTION_RULES`` maps a function (or ``"method:<name>"`` for tensor methods) to a builder
``Site -> Built | None``. A builder returning ``None`` means "no delta rule for this use": the
converter then inserts a :class:`~deltaconv.modules.DCFallback`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from . import activations
from .modules import (DCActivation, DCAdaptiveAvgPool2d, DCAdd, DCAvgPool2d, DCBatchNorm2d, DCConcatenate,
                      DCConv2d, DCConvTranspose2d, DCFunctionalConv2d, DCFunctionalLinear, DCLinear,
                      DCLayerNorm, DCLinearFunction, DCMaxPool2d, DCModule, DCMul, DCPixelLinear, DCScale,
                      DCPad2d, DCShuffledConcatenate, DCSpatialMean, DCUpsample)
from .modules.linear import shuffled_concatenate
from .modules.padding import PAD_MODES
from .onnx_models import onnx_div, onnx_prelu


@dataclass
class Site:
    """A call in the traced graph: ``fn(*args, **kwargs)`` named ``name``; ``delta_nodes`` are the
    nodes that carry deltas."""

    node: fx.Node
    fn: Callable
    name: str
    delta_nodes: set

    @property
    def args(self) -> tuple:
        """Positional arguments of the call (graph nodes or literals)."""
        return self.node.args

    @property
    def kwargs(self) -> dict:
        """Keyword arguments of the call."""
        return dict(self.node.kwargs)

    def is_delta(self, a: Any) -> bool:
        """Whether argument ``a`` is a node that carries deltas."""
        return isinstance(a, fx.Node) and a in self.delta_nodes

    def is_delta_tensor(self, a: Any) -> bool:
        """Whether argument ``a`` carries a delta tensor (not a tuple or a shape)."""
        return self.is_delta(a) and _is_tensor_node(a)

    def literal(self, *values) -> bool:
        """True when none of ``values`` (nested) is a graph node."""
        found = []
        fx.node.map_arg(values, lambda n: found.append(n))
        return not found


def input_rank(a: Any) -> Optional[int]:
    """The number of dims of node ``a``'s tensor as traced (its ``tensor_meta``), ``None`` if not known."""
    meta = a.meta.get("tensor_meta") if isinstance(a, fx.Node) else None
    shape = getattr(meta, "shape", None)
    return None if shape is None else len(shape)


def _is_tensor_node(n: fx.Node) -> bool:
    t = n.meta.get("type")
    return t is not None and issubclass(t, torch.Tensor)


@dataclass
class Built:
    """A DC layer and the arguments its graph node is called with."""

    module: DCModule
    args: tuple
    kwargs: dict


# ----------------------------------------------------------------------------- modules
def _bn_rule(bn: nn.Module) -> Optional[DCModule]:
    if bn.running_mean is None or bn.running_var is None:
        return None
    return DCBatchNorm2d.from_dense(bn)


def _upsample_rule(up: nn.Upsample) -> Optional[DCModule]:
    return DCUpsample.from_dense(up) if up.mode in DCUpsample.MODES else None


def _linear_fn_rule(module: nn.Module) -> DCModule:
    return DCLinearFunction(module, type(module).__name__)


MODULE_RULES: dict[type, Callable[[nn.Module], Optional[DCModule]]] = {
    nn.Conv2d: DCConv2d.from_dense,
    nn.ConvTranspose2d: DCConvTranspose2d.from_dense,
    nn.Linear: DCLinear.from_dense,
    nn.BatchNorm2d: _bn_rule,
    nn.MaxPool2d: DCMaxPool2d.from_dense,
    nn.AvgPool2d: DCAvgPool2d.from_dense,
    nn.AdaptiveAvgPool2d: DCAdaptiveAvgPool2d.from_dense,
    nn.Upsample: _upsample_rule,
    nn.UpsamplingNearest2d: _upsample_rule,
    nn.UpsamplingBilinear2d: _upsample_rule,
    nn.Flatten: _linear_fn_rule,
    nn.Unflatten: _linear_fn_rule,
    nn.ChannelShuffle: _linear_fn_rule,
    nn.PixelShuffle: _linear_fn_rule,
    nn.PixelUnshuffle: _linear_fn_rule,
}
for _pad in DCPad2d.MODULE_MODES:  # reflect, replicate, circular, zero (constant of 0)
    MODULE_RULES[_pad] = DCPad2d.from_dense
for _act in (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.Hardswish, nn.Hardsigmoid, nn.SiLU, nn.Sigmoid, nn.GELU,
             nn.Tanh, nn.ELU, nn.Hardtanh, nn.Mish, nn.Softplus, nn.SELU, nn.CELU, nn.Softsign, nn.Tanhshrink,
             nn.LogSigmoid):
    MODULE_RULES[_act] = DCActivation.from_dense

#: the rules of modules on a channels-last view that run channels-first (``deltaconv.layout``: nodes
#: marked ``CHANNELS_FIRST``; the others there, activations, use MODULE_RULES)
CHANNELS_FIRST_RULES: dict[type, Callable[[nn.Module], Optional[DCModule]]] = {
    nn.LayerNorm: DCLayerNorm.from_dense,
    nn.Linear: DCPixelLinear.from_dense,
}

#: modules that are the identity in eval: their node is removed
PASSTHROUGH_MODULES = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                       nn.FeatureAlphaDropout)
#: methods and functions that are the identity on values in eval -> position of their ``training``
#: argument (``None``: always the identity)
PASSTHROUGH_CALLS: dict[Any, Optional[int]] = {
    "method:detach": None, "method:clone": None, F.dropout: 2, F.dropout2d: 2, F.dropout1d: 2,
    F.alpha_dropout: 2, F.feature_alpha_dropout: 2}
try:  # torchvision's stochastic depth is an fx leaf function: stochastic_depth(input, p, mode, training)
    from torchvision.ops import stochastic_depth as _stochastic_depth
    PASSTHROUGH_CALLS[_stochastic_depth] = 3
except ImportError:  # pragma: no cover - torchvision is optional
    pass


# ----------------------------------------------------------------------------- functions
FUNCTION_RULES: dict[Any, Callable[[Site], Optional[Built]]] = {}


def _rule(*targets):
    def register(builder):
        for t in targets:
            FUNCTION_RULES[t] = builder
        return builder
    return register


def _methods(*names: str) -> list[str]:
    return [f"method:{n}" for n in names]


_ACTIVATION_FUNCTIONS = [F.relu, torch.relu, F.relu_, torch.relu_, F.relu6, F.hardswish, F.hardsigmoid, F.silu,
                         torch.sigmoid, F.sigmoid, F.gelu, torch.tanh, F.tanh, F.leaky_relu, F.elu, F.hardtanh,
                         F.mish, F.softplus, F.selu, F.celu, F.softsign, F.logsigmoid, torch.exp, torch.log,
                         torch.sqrt, torch.rsqrt, torch.abs, torch.clamp, torch.clip, torch.clamp_min,
                         torch.clamp_max, torch.square, torch.reciprocal, torch.erf, torch.sin, torch.cos]


@_rule(*_ACTIVATION_FUNCTIONS, *_methods("relu", "relu_", "sigmoid", "sigmoid_", "tanh", "exp", "log", "sqrt",
                                         "rsqrt", "abs", "clamp", "clamp_", "clip", "clamp_min", "clamp_max",
                                         "square", "reciprocal", "erf", "sin", "cos", "hardswish"))
def _activation(site: Site) -> Optional[Built]:
    x, *rest = site.args
    if not site.is_delta_tensor(x) or not site.literal(rest, site.kwargs):
        return None
    name = site.name.rstrip("_")
    dense_fn = site.fn
    if name != site.name and site.node.op == "call_method":
        # x.clamp_(...) must not run in place on the layer's accumulated-input state
        dense_fn = getattr(torch.Tensor, name, site.fn)
    fn = activations.from_call(name, dense_fn, tuple(rest), site.kwargs)
    return None if fn is None else Built(DCActivation(fn), (x,), {})


@_rule(F.softmax, torch.softmax, F.log_softmax, torch.log_softmax, *_methods("softmax", "log_softmax"))
def _channel_softmax(site: Site) -> Optional[Built]:
    """A softmax (or log-softmax) over dim 1, each pixel's channels (``dim=-3`` or the implicit dim of a 4-D
    input too): an activation of kind ``"softmax"`` (``deltaconv.activations.CHANNEL_KINDS``). A rule apart from
    :func:`_activation`, so that ``deltaconv.layout`` does not take it for a pointwise op inside a channels-last
    view (where dim 1 is a spatial dim)."""
    x, *rest = site.args
    if not site.is_delta_tensor(x) or not site.literal(rest, site.kwargs):
        return None
    fn = activations.channel_softmax(site.name, tuple(rest), site.kwargs, rank=input_rank(x))
    return None if fn is None else Built(DCActivation(fn), (x,), {})


def _softmax_module_rule(module: nn.Module, rank: Optional[int]) -> Optional[DCModule]:
    """``nn.Softmax`` / ``nn.LogSoftmax`` / ``nn.Softmax2d`` over dim 1 of an input of ``rank`` dims: an
    activation of kind ``"softmax"`` / ``"log_softmax"``."""
    fn = activations.from_softmax_module(module, rank)
    return None if fn is None else DCActivation(fn)


#: the module rules that depend on the input's number of dims (``None`` if not traced): a softmax's dim
RANKED_MODULE_RULES: dict[type, Callable[[nn.Module, Optional[int]], Optional[DCModule]]] = {
    module_type: _softmax_module_rule for module_type in activations.SOFTMAX_MODULES}


# onnx_prelu: ONNX's PRelu (deltaconv.onnx_models), F.prelu of its slopes flattened
@_rule(F.prelu, torch.prelu, onnx_prelu)
def _prelu(site: Site) -> Optional[Built]:
    """``F.prelu(x, weight)`` with slopes that are not deltas (a model's parameter): a PReLU whose slopes
    arrive per call (one per channel, or one for all)."""
    if len(site.args) != 2 or site.kwargs:
        return None
    x, weight = site.args
    if not site.is_delta_tensor(x) or site.is_delta(weight) or not isinstance(weight, fx.Node):
        return None
    return Built(DCActivation(activations.Activation("prelu")), (x, weight), {})


_SUBTRACTIONS = {"sub", "isub", "sub_", "subtract"}


@_rule(operator.add, operator.iadd, torch.add, operator.sub, operator.isub, torch.sub, torch.subtract,
       *_methods("add", "add_", "sub", "sub_"))
def _add(site: Site) -> Optional[Built]:
    a, b = site.args[:2]
    kwargs = site.kwargs
    alpha = site.args[2] if len(site.args) > 2 else kwargs.pop("alpha", 1)
    if kwargs or not site.literal(alpha) or not (site.is_delta_tensor(a) or site.is_delta_tensor(b)):
        return None
    if (site.is_delta(a) and not site.is_delta_tensor(a)) or (site.is_delta(b) and not site.is_delta_tensor(b)):
        return None
    sign = -1.0 if site.name in _SUBTRACTIONS else 1.0
    return Built(DCAdd(sign * float(alpha)), (a, b), {})


@_rule(operator.mul, operator.imul, torch.mul, torch.multiply, *_methods("mul", "mul_", "multiply"))
def _mul(site: Site) -> Optional[Built]:
    a, b = site.args[:2]
    if site.kwargs or len(site.args) > 2:
        return None
    if site.is_delta_tensor(a) and site.is_delta_tensor(b):
        return Built(DCMul(), (a, b), {})
    if site.is_delta_tensor(a) or site.is_delta_tensor(b):
        return Built(DCScale(divide=False), (a, b), {})
    return None


# onnx_div: ONNX's Div (deltaconv.onnx_models), a true division of a delta (deltas are floating point)
@_rule(operator.truediv, operator.itruediv, torch.div, torch.true_divide, onnx_div,
       *_methods("div", "div_", "true_divide"))
def _div(site: Site) -> Optional[Built]:
    a, b = site.args[:2]
    if site.kwargs or len(site.args) > 2 or not site.is_delta_tensor(a) or site.is_delta(b):
        return None
    return Built(DCScale(divide=True), (a, b), {})


@_rule(torch.cat, torch.concat, torch.concatenate)
def _cat(site: Site) -> Optional[Built]:
    tensors = site.args[0]
    dim = site.args[1] if len(site.args) > 1 else site.kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or not site.literal(dim):
        return None
    if not all(site.is_delta_tensor(t) for t in tensors):
        return None
    return Built(DCConcatenate(dim), (list(tensors),), {})


@_rule(shuffled_concatenate)
def _shuffled_cat(site: Site) -> Optional[Built]:
    tensors, groups = site.args[:2]
    chunks = site.args[2] if len(site.args) > 2 else None
    if site.kwargs or not all(site.is_delta_tensor(t) for t in tensors):
        return None
    return Built(DCShuffledConcatenate(groups, chunks), (list(tensors),), {})


def _bind(signature: Callable, site: Site) -> Optional[dict]:
    """Bind the site's arguments to a Python signature; ``None`` unless all but the input are
    literals."""
    try:
        bound = signature(*site.args, **site.kwargs)
    except TypeError:
        return None
    x = bound.pop("input")
    if not site.is_delta_tensor(x) or not site.literal(bound):
        return None
    return bound


def _max_pool_sig(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return dict(locals())


def _avg_pool_sig(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                  divisor_override=None):
    return dict(locals())


def _adaptive_sig(input, output_size):
    return dict(locals())


@_rule(F.max_pool2d, getattr(F, "_max_pool2d", F.max_pool2d), torch.max_pool2d)
def _max_pool(site: Site) -> Optional[Built]:
    p = _bind(_max_pool_sig, site)
    if p is None or p.pop("return_indices"):
        return None
    return Built(DCMaxPool2d(**p), (site.args[0],), {})


@_rule(F.avg_pool2d)
def _avg_pool(site: Site) -> Optional[Built]:
    p = _bind(_avg_pool_sig, site)
    return None if p is None else Built(DCAvgPool2d(**p), (site.args[0],), {})


@_rule(F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d)
def _adaptive_avg_pool(site: Site) -> Optional[Built]:
    p = _bind(_adaptive_sig, site)
    return None if p is None else Built(DCAdaptiveAvgPool2d(p["output_size"]), (site.args[0],), {})


def _interpolate_sig(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                     recompute_scale_factor=None, antialias=False):
    return dict(locals())


@_rule(F.interpolate, F.upsample)
def _interpolate(site: Site) -> Optional[Built]:
    try:
        p = _interpolate_sig(*site.args, **site.kwargs)
    except TypeError:
        return None
    x = p["input"]
    static = (p["mode"], p["align_corners"], p["recompute_scale_factor"], p["antialias"])
    if not site.is_delta_tensor(x) or not site.literal(static) or p["mode"] not in DCUpsample.MODES:
        return None
    if p["recompute_scale_factor"] or p["antialias"] or x.meta.get("tensor_meta") is None:
        return None
    if len(x.meta["tensor_meta"].shape) != 4:
        return None
    module = DCUpsample(None, None, p["mode"], p["align_corners"])
    return Built(module, (x,), {"size": p["size"], "scale_factor": p["scale_factor"]})


_LINEAR_FUNCTIONS = [torch.flatten, torch.reshape, torch.permute, torch.transpose, torch.squeeze, torch.unsqueeze,
                     torch.split, torch.chunk, torch.narrow, torch.unbind, torch.flip, torch.roll, torch.stack,
                     F.pad, F.pixel_shuffle, F.pixel_unshuffle, torch.channel_shuffle, F.channel_shuffle,
                     torch.mean, torch.sum, operator.neg, torch.neg, operator.getitem, torch.movedim,
                     torch.swapaxes, torch.tensor_split]
_LINEAR_METHODS = _methods("view", "reshape", "permute", "transpose", "flatten", "unflatten", "squeeze",
                           "unsqueeze", "split", "chunk", "narrow", "unbind", "expand", "repeat", "flip", "roll",
                           "mean", "sum", "neg", "contiguous", "float", "half", "bfloat16", "to", "type", "view_as",
                           "reshape_as", "expand_as", "movedim", "swapaxes", "tensor_split", "__getitem__")


def _mean_sig(input, dim=None, keepdim=False, *, dtype=None):
    return dict(locals())


def _spatial_mean(site: Site) -> Optional[Built]:
    """``x.mean((2, 3))`` / ``torch.mean(x, [-2, -1], keepdim)`` of a 4-D delta as the global average
    pooling it is (:class:`~deltaconv.modules.DCSpatialMean`), else ``None``."""
    p = _bind(_mean_sig, site) if site.fn in (torch.mean, torch.Tensor.mean) else None
    if p is None or p["dtype"] is not None or not isinstance(p["dim"], (list, tuple)) or len(p["dim"]) != 2:
        return None
    x = site.args[0] if site.args else site.kwargs["input"]
    meta = x.meta.get("tensor_meta")
    if meta is None or len(meta.shape) != 4 or sorted(d % 4 for d in p["dim"]) != [2, 3]:
        return None
    return Built(DCSpatialMean(bool(p["keepdim"])), (x,), {})


@_rule(*_LINEAR_FUNCTIONS, *_LINEAR_METHODS)
def _linear_function(site: Site) -> Optional[Built]:
    mean = _spatial_mean(site)
    if mean is not None:
        return mean
    leaves = []
    fx.node.map_arg((site.args, site.node.kwargs), lambda n: leaves.append(n))
    deltas = [n for n in leaves if site.is_delta(n)]
    if not deltas or not all(site.is_delta_tensor(n) for n in deltas):
        return None
    if site.fn is F.pad:
        return _spatial_pad(site)
    return Built(DCLinearFunction(site.fn, site.name), site.args, site.kwargs)


def _pad_sig(input, pad, mode="constant", value=None):
    return dict(locals())


def _spatial_pad(site: Site) -> Optional[Built]:
    """``F.pad`` of a delta: a :class:`~deltaconv.modules.DCPad2d` for the last two dims of a 4-D map with
    a literal pad (any mode), the general data movement for other constant pads of 0, else ``None``."""
    p = _bind(_pad_sig, site)
    if p is None:  # a pad computed in the graph: only constant pads of 0 move as data
        mode = site.args[2] if len(site.args) > 2 else site.kwargs.get("mode", "constant")
        value = site.args[3] if len(site.args) > 3 else site.kwargs.get("value", None)
        if mode != "constant" or value not in (None, 0, 0.0):
            return None
        return Built(DCLinearFunction(site.fn, site.name), site.args, site.kwargs)
    if p["mode"] not in PAD_MODES or p["value"] not in (None, 0, 0.0):
        return None
    x = site.args[0] if site.args else site.kwargs["input"]
    meta = x.meta.get("tensor_meta")
    pad = tuple(p["pad"])
    if (meta is not None and len(meta.shape) == 4 and len(pad) in ((2, 4) if p["mode"] == "constant" else (4,))
            and all(isinstance(v, int) for v in pad)):
        return Built(DCPad2d(pad, p["mode"]), (x,), {})
    if p["mode"] != "constant":
        return None
    return Built(DCLinearFunction(site.fn, site.name), site.args, site.kwargs)


def _conv2d_sig(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return dict(locals())


def _linear_sig(input, weight, bias=None):
    return dict(locals())


def _static_weights(site: Site, p: dict) -> bool:
    """Weight and bias are not deltas (parameters, or computed from them)."""
    return site.is_delta_tensor(p["input"]) and not site.is_delta(p["weight"]) and not site.is_delta(p["bias"])


@_rule(F.conv2d, torch.conv2d)
def _functional_conv2d(site: Site) -> Optional[Built]:
    try:
        p = _conv2d_sig(*site.args, **site.kwargs)
    except TypeError:
        return None
    params = (p["stride"], p["padding"], p["dilation"], p["groups"])
    if not _static_weights(site, p) or not site.literal(params):
        return None
    return Built(DCFunctionalConv2d(*params), (p["input"], p["weight"], p["bias"]), {})


@_rule(F.linear, torch._C._nn.linear)
def _functional_linear(site: Site) -> Optional[Built]:
    try:
        p = _linear_sig(*site.args, **site.kwargs)
    except TypeError:
        return None
    if not _static_weights(site, p):
        return None
    return Built(DCFunctionalLinear(), (p["input"], p["weight"], p["bias"]), {})


def _layer_norm_sig(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return dict(locals())


@_rule(F.layer_norm)
def _layer_norm(site: Site) -> Optional[Built]:
    """``F.layer_norm`` over the channels: on a channels-last view kept channels-first (``LayerNorm2d``,
    marked by ``deltaconv.layout``) or over dim 1 of a 2-D tensor; else no rule."""
    try:
        p = _layer_norm_sig(*site.args, **site.kwargs)
    except TypeError:
        return None
    shape = p["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape) if isinstance(shape, (list, tuple)) else ()
    if not site.node.meta.get("dc_channels_first") or len(shape) != 1 or not site.literal(shape, p["eps"]):
        return None
    if not _static_weights(site, p):
        return None
    return Built(DCLayerNorm(shape[0], float(p["eps"])), (p["input"], p["weight"], p["bias"]), {})
