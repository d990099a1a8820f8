"""Pointwise non-linearities as data: a kind name plus parameters, callable on tensors.

The CUDA backend dispatches on ``kind``; the reference backend just calls the object. ``kind ==
"generic"`` wraps any other pointwise callable (it then runs through PyTorch on every backend).
``kind == "prelu"`` is ``nn.PReLU`` with one slope per channel (dim 1), held in ``weight`` (``None``: the
slopes arrive per call, as ``F.prelu(x, weight)``'s, and are bound before the function runs).
``kind == "softmax"`` / ``"log_softmax"`` (:data:`CHANNEL_KINDS`) are not pointwise but functions of each
pixel's channel vector (dim 1), as a segmentation head's or a detector's class probabilities: a pixel's output
depends on that pixel alone, so an activation's delta rule (recompute the active pixels, truncate) holds for
them too; they run through PyTorch on every backend.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

#: kinds the CUDA kernels implement natively, with the meaning of ``param``
NATIVE_KINDS = {
    "identity": "unused",
    "relu": "unused",
    "relu6": "unused",
    "leaky_relu": "negative slope",
    "hardswish": "unused",
    "hardsigmoid": "unused",
    "silu": "unused",
    "sigmoid": "unused",
    "gelu": "0: exact (erf), 1: tanh approximation",
    "tanh": "unused",
    "elu": "alpha",
    "prelu": "unused: the negative slopes, one per channel (dim 1) or one for all, in Activation.weight",
}

#: kinds that map each pixel's channel vector (dim 1) as a whole, not each element: PyTorch runs them on every
#: backend; the converter builds them from a softmax over dim 1 only (:func:`channel_softmax`)
CHANNEL_KINDS = {"softmax": "torch.softmax(x, 1)", "log_softmax": "torch.log_softmax(x, 1)"}


@dataclass(frozen=True)
class Activation:
    """A pointwise function ``y = f(x)``: ``kind`` names it, ``param`` is its one parameter; ``weight``
    (``[C]`` or one value) the slopes of kind ``"prelu"`` (``F.prelu(x, weight)``, channels in dim 1), ``None``
    where they arrive per call (``F.prelu`` of a model's parameter: ``dataclasses.replace`` binds them)."""

    kind: str
    param: float = 0.0
    generic: Optional[Callable[[torch.Tensor], torch.Tensor]] = field(default=None, compare=False)
    weight: Optional[torch.Tensor] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.weight is not None and self.kind != "prelu":
            raise ValueError(f"Activation: only kind 'prelu' takes slopes in `weight`, got kind {self.kind!r} with "
                             "weight=a tensor")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kind
        if k == "identity":
            return x
        if k == "relu":
            return F.relu(x)
        if k == "relu6":
            return F.relu6(x)
        if k == "leaky_relu":
            return F.leaky_relu(x, self.param)
        if k == "hardswish":
            return F.hardswish(x)
        if k == "hardsigmoid":
            return F.hardsigmoid(x)
        if k == "silu":
            return F.silu(x)
        if k == "sigmoid":
            return torch.sigmoid(x)
        if k == "gelu":
            return F.gelu(x, approximate="tanh" if self.param else "none")
        if k == "tanh":
            return torch.tanh(x)
        if k == "elu":
            return F.elu(x, self.param)
        if k == "prelu":  # torch's formula: x > 0 ? x : weight * x, in x's dtype
            if self.weight is None:
                raise ValueError("Activation('prelu') has no slopes: they arrive per call; bind them first "
                                 "(dataclasses.replace(fn, weight=...))")
            return F.prelu(x, self.weight.detach().reshape(-1).to(device=x.device, dtype=x.dtype))
        if k == "softmax":
            return torch.softmax(x, 1)
        if k == "log_softmax":
            return torch.log_softmax(x, 1)
        if k == "generic":
            return self.generic(x)
        raise ValueError(f"Activation: unknown kind {k!r}; expected one of {sorted(NATIVE_KINDS)}, "
                         f"{sorted(CHANNEL_KINDS)} or 'generic'")

    def __repr__(self) -> str:
        if self.kind == "generic":
            return f"Activation(generic {getattr(self.generic, '__name__', self.generic)!r})"
        if self.kind == "prelu":
            return f"Activation(prelu, {'slopes per call' if self.weight is None else f'{self.weight.numel()} slopes'})"
        return f"Activation({self.kind}{'' if not self.param else f', {self.param:g}'})"


def from_module(module: nn.Module) -> Optional[Activation]:
    """The :class:`Activation` equal to a dense activation module, or ``None`` if it is not one.

    ``nn.PReLU`` with one slope (``num_parameters=1``, its default) becomes a leaky ReLU whose negative
    slope is the slope's value at this call (later changes of the PReLU's weight are not seen, as a
    BatchNorm folded into a convolution); with one slope per channel it is kind ``"prelu"`` holding the
    module's weight itself (:class:`~deltaconv.modules.nonlinear.DCActivation` shares it as its parameter)."""
    t = type(module)
    simple = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid",
              nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}
    if t in simple:
        return Activation(simple[t])
    if t is nn.LeakyReLU:
        return Activation("leaky_relu", float(module.negative_slope))
    if t is nn.PReLU and module.weight.numel() == 1:  # one learnt slope: a leaky ReLU with it, taken now
        return Activation("leaky_relu", float(module.weight.detach().reshape(())))
    if t is nn.PReLU:  # one slope per channel
        return Activation("prelu", weight=module.weight)
    if t is nn.GELU:
        return Activation("gelu", 1.0 if module.approximate == "tanh" else 0.0)
    if t is nn.ELU:
        return Activation("elu", float(module.alpha))
    if t is nn.Hardtanh and module.min_val == 0.0 and module.max_val == 6.0:
        return Activation("relu6")
    if t in (nn.Hardtanh, nn.Mish, nn.Softplus, nn.SELU, nn.CELU, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid):
        return Activation("generic", generic=module)
    return None


# functional forms: function or method name -> (kind, name of the parameter argument, its position
# after the input, its default)
_FUNCTIONAL = {
    "relu": ("relu", None), "relu_": ("relu", None), "relu6": ("relu6", None),
    "hardswish": ("hardswish", None), "hardsigmoid": ("hardsigmoid", None), "silu": ("silu", None),
    "sigmoid": ("sigmoid", None), "tanh": ("tanh", None),
    "leaky_relu": ("leaky_relu", ("negative_slope", 0, 0.01)), "elu": ("elu", ("alpha", 0, 1.0)),
    "gelu": ("gelu", ("approximate", 0, "none")),
}
_GENERIC_FUNCTIONAL = {"hardtanh", "mish", "softplus", "selu", "celu", "softsign", "exp", "log", "sqrt",
                       "rsqrt", "abs", "clamp", "clamp_min", "clamp_max", "clip", "pow", "square",
                       "reciprocal", "erf", "sin", "cos", "log_sigmoid", "logsigmoid"}


def from_call(name: str, fn: Callable, args: tuple, kwargs: dict) -> Optional[Activation]:
    """The :class:`Activation` for a call ``fn(x, *args, **kwargs)`` of a function or method named
    ``name`` whose extra arguments are all static values, or ``None``."""
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
    if name in _FUNCTIONAL:
        kind, p = _FUNCTIONAL[name]
        if p is None:
            return Activation(kind) if not args and not kwargs else None
        pname, pos, default = p
        value = kwargs.pop(pname, args[pos] if len(args) > pos else default)
        if len(args) > pos + 1 or kwargs:
            return None
        if kind == "gelu":
            return Activation("gelu", 1.0 if value == "tanh" else 0.0)
        return Activation(kind, float(value))
    if name in _GENERIC_FUNCTIONAL:
        def bound(x, _fn=fn, _a=args, _k=kwargs):
            return _fn(x, *_a, **_k)
        bound.__name__ = name
        return Activation("generic", generic=bound)
    return None


def softmax_dim(dim: Optional[int], rank: Optional[int]) -> Optional[int]:
    """The dim a softmax over ``dim`` of an input of ``rank`` dims normalises: a negative ``dim`` counted from the
    end, ``None`` torch's implicit choice (``torch.nn.functional._get_softmax_dim``: 0 for ranks 0, 1 and 3, else
    1). ``None`` where it is not known: ``rank`` unknown (``None``) and ``dim`` negative or implicit, or ``dim``
    neither an int nor ``None``."""
    if type(dim) is not int and dim is not None:
        return None
    if rank is None:
        return dim if dim is not None and dim >= 0 else None
    if dim is None:
        return 0 if rank in (0, 1, 3) else 1
    return dim + rank if dim < 0 else dim


def channel_softmax(name: str, args: tuple, kwargs: dict, rank: Optional[int] = None) -> Optional[Activation]:
    """The :class:`Activation` of kind ``"softmax"`` or ``"log_softmax"`` for a call ``name(x, *args, **kwargs)``
    (``F.softmax``, ``torch.softmax``, ``Tensor.softmax`` and the ``log_softmax`` ones) over dim 1 of ``x``, whose
    ``rank`` (number of dims, ``None`` if unknown) resolves a negative or implicit ``dim`` (:func:`softmax_dim`),
    or ``None``: another dim, an output ``dtype``, or other arguments."""
    kwargs = {k: v for k, v in kwargs.items() if k != "_stacklevel"}
    if name not in CHANNEL_KINDS or len(args) > 1 or kwargs.pop("dtype", None) is not None:
        return None
    dim = kwargs.pop("dim", args[0] if args else None)
    return Activation(name) if not kwargs and softmax_dim(dim, rank) == 1 else None


#: the softmax modules and their kinds; nn.Softmax2d is a softmax over dim -3 (its input has 3 or 4 dims)
SOFTMAX_MODULES = {nn.Softmax: "softmax", nn.LogSoftmax: "log_softmax", nn.Softmax2d: "softmax"}


def from_softmax_module(module: nn.Module, rank: Optional[int] = None) -> Optional[Activation]:
    """The :class:`Activation` of ``nn.Softmax``, ``nn.LogSoftmax`` or ``nn.Softmax2d`` over dim 1 of an input of
    ``rank`` dims (``None`` if unknown: then only ``dim=1`` is known to be dim 1; :func:`softmax_dim`), or ``None``
    (another dim). Kept apart from :func:`from_module`: a softmax is not pointwise, so it does not join the
    channels-last blocks that ``deltaconv.layout`` runs channels-first."""
    kind = SOFTMAX_MODULES.get(type(module))
    dim = -3 if type(module) is nn.Softmax2d else getattr(module, "dim", None)
    return Activation(kind) if kind is not None and softmax_dim(dim, rank) == 1 else None
