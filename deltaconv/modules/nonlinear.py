"""Non-linear layers: they keep the accumulated input and what they have sent.

Each computes its new output from the accumulated inputs on the pixels a change can reach, sends
``new - sent`` where it exceeds the layer's threshold, and keeps the rest pending (no drift).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair

from .. import activations
from ..delta import Delta, filled_rows, mask_shape, require_changes
from .base import DCModule
from .linear import DeferredSum, _map_deltas, _map_leaves, sends_tf32


class DCActivation(DCModule):
    """Pointwise non-linearity (ReLU, ReLU6, LeakyReLU, PReLU, Hardswish, Hardsigmoid, SiLU, Sigmoid, GELU,
    Tanh, ELU, or any pointwise callable). A PReLU with one slope per channel keeps its slopes as the parameter
    ``weight``, shared with the dense module (``from_dense``), so ``.to()`` / ``.half()`` apply to them and a
    later change of them is used from then on (pixels that do not change keep what they sent until the next
    key frame, ``reset()``); ``F.prelu(x, weight)`` of a model's parameter (``Activation("prelu")`` without
    slopes) gets them per call, one per channel or one for all. State: ``acc`` (input), ``sent`` (output); after a
    recomputing convolution (``DCConv2d.recomputes``: its input arrives whole), or fused with a residual
    add of a convolution's kept whole output (``DCConv2d.keeps_output``) and another whole operand,
    ``sent`` only.
    Float32 on a GPU with TF32 convolutions: sends its changes rounded to TF32 (:func:`sends_tf32`)."""

    kind = "activation"
    truncates = True
    #: every reader takes this layer's whole values (``Delta.whole``, its ``sent``): convolutions in value
    #: mode, adds keeping whole sums, products taking whole operands, adds fused with their activation that
    #: sum whole operands (set by ``convert`` under ``deltaconv.convert.SKIP_UNREAD_CHANGES``, also on an
    #: activation fused with an add). The CUDA kernel then does not write the changes (the delta's ``value``
    #: is left unwritten, ``Delta.unwritten``) on frames that do not send TF32 (whose readers read the changes).
    changes_unread = False

    def __init__(self, fn: activations.Activation, threshold: float = 0.0) -> None:
        super().__init__()
        self.fn = fn
        self.threshold = float(threshold)
        if fn.weight is not None:  # PReLU's slopes: a parameter of this layer (the dense module's, shared)
            w = fn.weight
            self.weight = w if isinstance(w, nn.Parameter) else nn.Parameter(w.detach(), requires_grad=False)

    def _prelu_function(self, weight: Optional[torch.Tensor], channels: int) -> activations.Activation:
        """A PReLU's ``fn`` as the ops take it: its slopes (the parameter ``weight``, or ``weight`` as given per
        call) as a contiguous ``[channels]`` vector of the compute dtype (:meth:`work_vector`; one slope repeated
        for every channel), made again only when the slopes change."""
        w = getattr(self, "weight", None) if weight is None else weight
        if w is None:
            raise TypeError(f"{self.layer_name or 'DCActivation'}: a PReLU without slopes of its own needs them per "
                            "call, as F.prelu(x, weight)")
        w = self.work_vector("weight", w)
        if w.numel() == 1 and channels != 1:
            w = self.derived("slopes", (w,), lambda: w.expand(channels).contiguous())
        return self.derived("fn", (w,), lambda: replace(self.fn, weight=w))

    @classmethod
    def from_dense(cls, module: nn.Module) -> Optional["DCActivation"]:
        """Build from a pointwise activation module, or ``None`` when ``module`` is not one deltaconv knows."""
        fn = activations.from_module(module)
        return None if fn is None else cls(fn)

    def forward(self, x: Delta, weight: Optional[torch.Tensor] = None) -> Delta:
        fused = isinstance(x, DeferredSum) and x.fusable  # a residual add fused into this pass
        like = x.a.value if fused else x.value  # (a DeferredSum's own value would compute the sum)
        fn = self.fn
        if fn.kind == "prelu":
            fn = self._prelu_function(weight, like.shape[1] if like.dim() > 1 else 1)
        sent = self.state("sent", x.shape, like.device, like.dtype, sent=True)
        rows = self.row_list(x.shape, like.device)
        tf32 = sends_tf32(like)
        write_out = tf32 or not self.changes_unread  # TF32 frames: the convolutions read the changes
        if x.recomputed:  # value mode: the convolution before it recomputed the whole input, no accumulator
            v, m = self.ops.activation_values(x.value, x.mask, sent, fn, self.threshold, self.key, self.measure,
                                              rows, tf32=tf32, write_out=write_out)
            return self.observe(self._output(v, m, rows, tf32, sent, write_out))
        if fused and (x.a.recomputed or x.b.recomputed):
            # value mode after a residual add: an operand is a convolution's kept whole output
            # (DCConv2d.keeps_output) and the other whole too, so their sum on the active pixels is the
            # add's whole new output, with no accumulator; delta mode on frames where the convolution
            # is not in value mode (TF32 sends), which changes only with a key frame
            a, b = x.a, x.b
            if a.whole is None or b.whole is None:
                raise RuntimeError(f"{self.layer_name}: a residual add of a convolution's kept whole output needs "
                                   "its other operand whole too (Delta.whole), which the layer before it did not "
                                   "give; convert with recompute=False")
            v, m, union = self.ops.add_activation_values(a.whole, a.mask, b.whole, b.mask, x.layer.alpha, sent,
                                                         fn, self.threshold, self.key, self.measure, rows,
                                                         tf32=tf32, write_out=write_out)
            x.layer.observe(Delta(a.whole, union))  # the add's statistics: its output mask
            return self.observe(self._output(v, m, rows, tf32, sent, write_out))
        acc = self.state("acc", x.shape, like.device, like.dtype)
        if fused:
            a, b = x.a, x.b
            require_changes(x.layer.layer_name, a, b)
            v, m, union = self.ops.add_activation(a.value, a.mask, b.value, b.mask, x.layer.alpha, acc, sent, fn,
                                                  self.threshold, self.key, self.measure, rows, tf32=tf32,
                                                  write_out=write_out)
            x.layer.observe(Delta(a.value, union))  # the add's statistics: its output mask (a's value: its shape)
        else:
            v, m = self.ops.activation(x.value, x.mask, acc, sent, fn, self.threshold, self.key, self.measure,
                                       rows, tf32=tf32, write_out=write_out)
        return self.observe(self._output(v, m, rows, tf32, sent, write_out))

    @staticmethod
    def _output(v, m, rows, tf32: bool, sent, write_out: bool) -> Delta:
        """The output delta: the changes ``v`` on ``m`` (``unwritten`` without ``write_out``), ``sent`` whole."""
        return Delta(v, m, filled_rows(rows), tf32=tf32, whole=sent, unwritten=not write_out)

    def flops_per_output_pixel(self, out: Delta) -> float:
        return float(out.value.shape[1]) if out.value.dim() > 1 else 1.0

    def extra_repr(self) -> str:
        return f"{self.fn!r}, " + super().extra_repr()


class DCLayerNorm(DCModule):
    """Layer norm of each pixel over its channels (dim 1): ConvNeXt's ``LayerNorm`` and
    ``LayerNorm2d``, which normalise the last dim of a channels-last view; the converter keeps such a
    block channels-first (``deltaconv.layout``), so here the channels are dim 1. A pixel's output
    depends on that pixel alone, so the delta rule is an activation's over the whole channel vector:
    ``layer_norm(acc) - sent`` on active pixels, then truncation. State: ``acc`` (input), ``sent``
    (output). Weight and bias are the dense module's (``from_dense``) or arrive per call
    (``F.layer_norm``). Sends TF32 as :class:`DCActivation` does."""

    kind = "layer_norm"
    truncates = True

    def __init__(self, channels: int, eps: float = 1e-5, threshold: float = 0.0) -> None:
        super().__init__()
        self.channels, self.eps = int(channels), float(eps)
        self.threshold = float(threshold)
        self.register_parameter("weight", None)
        self.register_parameter("bias", None)

    @classmethod
    def from_dense(cls, ln: nn.LayerNorm) -> Optional["DCLayerNorm"]:
        """Build from a dense ``nn.LayerNorm`` over one dim (sharing its parameters), or ``None``
        when it normalises over several dims."""
        if len(ln.normalized_shape) != 1:
            return None
        m = cls(ln.normalized_shape[0], ln.eps)
        for name in ("weight", "bias"):
            p = ln._parameters.get(name)
            if p is not None:
                m.register_parameter(name, p)
        return m

    def forward(self, x: Delta, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None) -> Delta:
        if x.value.dim() < 2 or x.shape[1] != self.channels:
            raise ValueError(f"{self.layer_name or 'DCLayerNorm'}: expected a delta with {self.channels} channels "
                             f"in dim 1, got shape {tuple(x.shape)}")
        weight = self.work_vector("weight", self.weight if weight is None else weight)
        bias = self.work_vector("bias", self.bias if bias is None else bias)
        acc = self.state("acc", x.shape, x.device, x.dtype)
        sent = self.state("sent", x.shape, x.device, x.dtype, sent=True)
        rows = self.row_list(x.shape, x.device)
        tf32 = sends_tf32(x.value)
        v, m = self.ops.layer_norm(x.value, x.mask, acc, sent, weight, bias, self.eps, self.threshold, self.key,
                                   self.measure, rows, tf32=tf32)
        return self.observe(Delta(v, m, filled_rows(rows), tf32=tf32))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return 5.0 * out.value.shape[1]

    def extra_repr(self) -> str:
        return f"{self.channels}, eps={self.eps:g}, " + super().extra_repr()


class DCMul(DCModule):
    """Product of two changing tensors (broadcasting; squeeze-excite): ``new = A_a * A_b`` over
    the union of the masks. State: ``acc_a``, ``acc_b``, ``sent``. Sends TF32 as
    :class:`DCActivation` does. Gives ``sent`` as its whole values (``Delta.whole``), which a
    projection after a squeeze-excite scaling recomputes from under ``deltaconv.convert.WHOLE_SUMS``."""

    kind = "mul"
    truncates = True
    #: value mode (set by ``convert`` under ``deltaconv.convert.WHOLE_PRODUCTS``, on by default): both
    #: operands give their whole values (``Delta.whole``: the squeeze-excite scale and the
    #: feature map, activations' sent values), so the new product on the union of the masks is their
    #: product, and the layer keeps no accumulators (``ops.mul_values``). An operand without whole
    #: values then is an error (the accumulators were never kept).
    takes_whole = False

    def forward(self, a: Delta, b: Delta) -> Delta:
        if self.takes_whole and (a.whole is None or b.whole is None):
            raise RuntimeError(f"{self.layer_name}: an operand gives no whole values this frame, which a product "
                               "in value mode needs (it keeps no accumulators); set "
                               "deltaconv.convert.WHOLE_PRODUCTS = False before convert")
        if not self.takes_whole:
            require_changes(self.layer_name, a, b)
            acc_a = self.state("acc_a", a.shape, a.device, a.dtype)
            acc_b = self.state("acc_b", b.shape, b.device, b.dtype)
        out_shape = torch.broadcast_shapes(a.shape, b.shape)
        sent = self.state("sent", out_shape, a.device, a.dtype, sent=True)
        rows = self.row_list(out_shape, a.device)
        tf32 = sends_tf32(a.value)
        if self.takes_whole:  # value mode: the product of the whole operands, no accumulators
            v, m = self.ops.mul_values(a.whole, a.mask, b.whole, b.mask, sent, self.threshold, self.key,
                                       self.measure, rows, tf32=tf32)
        else:
            v, m = self.ops.mul(a.value, a.mask, acc_a, b.value, b.mask, acc_b, sent, self.threshold, self.key,
                                self.measure, rows, tf32=tf32)
        return self.observe(Delta(v, m, filled_rows(rows), tf32=tf32, whole=sent))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return float(out.value.shape[1]) if out.value.dim() > 1 else 1.0


class DCMaxPool2d(DCModule):
    """Max pooling (any window, stride, padding, dilation, ceil_mode): the max of the accumulated
    input over the footprint of the active pixels. State: ``acc``, ``sent``. Sends TF32 as
    :class:`DCActivation` does."""

    kind = "max_pool2d"
    truncates = True
    #: value mode (set by ``convert`` under ``deltaconv.convert.WHOLE_MAX_POOLING``, on by default): the
    #: input gives its whole values (``Delta.whole``: an activation's sent values, ResNet's stem ReLU), so
    #: the layer pools them and keeps no accumulator (``ops.max_pool2d_values``); delta mode on frames
    #: where the input has none or sends TF32 (which change only with a key frame)
    takes_whole = False
    lazy_states = ("acc",)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride) if stride not in (None, [], ()) else self.kernel_size
        self.padding, self.dilation, self.ceil_mode = _pair(padding), _pair(dilation), bool(ceil_mode)

    @classmethod
    def from_dense(cls, pool: nn.MaxPool2d) -> Optional["DCMaxPool2d"]:
        """Build from a dense ``nn.MaxPool2d``, or ``None`` when it returns indices (not supported)."""
        if pool.return_indices:
            return None
        return cls(pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)

    def forward(self, x: Delta) -> Delta:
        n, c = x.shape[:2]
        out_hw = torch.nn.functional.max_pool2d(torch.empty((1, 1) + tuple(x.shape[2:]), device="meta"),
                                                self.kernel_size, self.stride, self.padding, self.dilation,
                                                self.ceil_mode).shape[2:]
        sent = self.state("sent", (n, c) + tuple(out_hw), x.device, x.dtype, sent=True)
        tf32 = sends_tf32(x.value)
        if self.takes_whole and x.whole is not None and not x.tf32:  # value mode: the pooled whole input
            v, m = self.ops.max_pool2d_values(x.whole, x.mask, sent, self.kernel_size, self.stride, self.padding,
                                              self.dilation, self.ceil_mode, self.threshold, self.key, self.measure,
                                              tf32=tf32)
            return self.observe(Delta(v, m, tf32=tf32, whole=sent))
        require_changes(self.layer_name, x)
        acc = self.state("acc", x.shape, x.device, x.dtype)
        v, m = self.ops.max_pool2d(x.value, x.mask, acc, sent, self.kernel_size, self.stride, self.padding,
                                   self.dilation, self.ceil_mode, self.threshold, self.key, self.measure, tf32=tf32)
        return self.observe(Delta(v, m, tf32=tf32, whole=sent))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return float(out.value.shape[1] * self.kernel_size[0] * self.kernel_size[1])


class DCFallback(DCModule):
    """Any op without a delta rule: runs the dense op on its accumulated inputs and re-sparsifies
    its output against what it sent before (correct for every op, costs a dense evaluation).

    State: ``acc<i>`` per delta input, ``sent<j>`` per tensor output. Also used for spatial
    non-linear ops whose footprint is unknown (adaptive max pooling, ...). Sends TF32 as
    :class:`DCActivation` does.
    """

    kind = "fallback"
    truncates = True

    def __init__(self, fn: Callable, label: str = "") -> None:
        super().__init__()
        object.__setattr__(self, "fn", fn)  # a dense module stays registered where it was
        self.label = label or getattr(fn, "__name__", type(fn).__name__)

    def forward(self, *args, **kwargs):
        counter = iter(range(1 << 30))

        def accumulate(d: Delta) -> torch.Tensor:
            acc = self.state(f"acc{next(counter)}", d.shape, d.device, d.dtype)
            acc += torch.where(d.mask, d.value, 0).to(acc.dtype)
            return acc.to(d.dtype, copy=True)

        dtypes = [d.dtype for d in _leaves(args, kwargs)]
        dense_args = _map_deltas(args, accumulate)
        dense_kwargs = _map_deltas(kwargs, accumulate)
        y = self.fn(*dense_args, **dense_kwargs)
        outputs = iter(range(1 << 30))
        out_dtype = dtypes[0] if dtypes else None

        def resparsify(t: torch.Tensor) -> Delta:
            sent = self.state(f"sent{next(outputs)}", t.shape, t.device, t.dtype,
                              sent=t.is_floating_point())
            region = torch.ones(mask_shape(t.shape), dtype=torch.bool, device=t.device)
            key = self.key
            if key is not None and (t.dim() < 1 or t.shape[0] != key.shape[0]):
                key = torch.ones(t.shape[0] if t.dim() else 1, dtype=torch.bool, device=t.device)
            dtype = t.dtype if t.is_floating_point() else out_dtype
            tf32 = sends_tf32(t)
            v, m = self.ops.truncate(t, region, sent, self.threshold, key, dtype, self.measure, tf32)
            return Delta(v, m, tf32=tf32)

        out = _map_tensors(y, resparsify)
        return self.observe(out) if isinstance(out, Delta) else out

    def extra_repr(self) -> str:
        return f"{self.label}, " + super().extra_repr()


def _leaves(args, kwargs):
    out = []
    _map_deltas((args, kwargs), lambda d: out.append(d) or d)
    return out


def _map_tensors(obj, fn):
    """``obj`` with ``fn`` applied to every tensor in it (:func:`~deltaconv.modules.linear._map_leaves`)."""
    return _map_leaves(obj, fn, torch.is_tensor)
