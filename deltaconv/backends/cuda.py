"""CUDA backend: the functions of :mod:`.reference`, same signatures and semantics, run by the
``torch.ops.deltaconv`` kernels of the compiled extension ``deltaconv._C``.

Each function calls its kernel for the cases the kernels cover (CUDA tensors, 4-D feature maps,
made channels_last-contiguous when they are not; the pointwise ops also take 2-D ``[N, C]``
values, viewed as ``[N, C, 1, 1]``) and delegates to the reference function, which runs on GPU
tensors too, for the genuinely generic cases: callables (``truncate``, ``linear_spatial``,
``pool_nonlinear``, ``Activation("generic")``), broadcasting other than squeeze-excite, padding
modes other than zeros, string padding, resampling modes other than nearest / nearest-exact /
bilinear, other ranks. An op whose kernel is not registered in the loaded extension also falls
back to the reference. Nothing here synchronises with the device, so a frame can be captured in a
CUDA graph; every op has a fake (meta) implementation, so ``torch.compile`` can trace it.

Values at inactive output pixels are unspecified (the kernels leave them unwritten), where the
reference writes zeros: compare outputs only where the output mask is set.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from .. import _extension
from ..activations import NATIVE_KINDS
from ..delta import RowList
from . import reference as _ref

Tensor = torch.Tensor

_LOADED = _extension.load()
_OPS = ("sparsify", "densify", "activation", "activation_values", "add_activation", "affine_channel", "add", "mul",
        "concatenate", "interleave_channels", "interpolate", "resample", "conv2d", "conv_transpose2d", "max_pool2d",
        "avg_pool2d", "adaptive_avg_pool2d", "linear", "count_active", "conv1x1_rows", "layer_norm",
        "add_activation_values", "conv1x1_rows_into", "conv1x1_into", "add_values", "mul_values",
        "max_pool2d_values")


def _registered_cuda_kernels() -> frozenset:
    if not _LOADED:
        return frozenset()

    def has(op: str) -> bool:
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(f"deltaconv::{op}", "CUDA")
        except RuntimeError:  # an extension built before the op existed: the op runs through the reference
            return False
    return frozenset(op for op in _OPS if has(op))


#: ops with a CUDA kernel in the loaded extension (the others run through the reference)
NATIVE_OPS = _registered_cuda_kernels()

#: whether a layer can list its sent pixels for the 1x1 convolutions after it (``rows`` of
#: :func:`activation`, :func:`add_activation`, :func:`add` and :func:`mul`, read by :func:`conv1x1_rows`);
#: the reference has no lists
ROW_LISTS = "conv1x1_rows" in NATIVE_OPS

_ACT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CL = torch.channels_last
_MAX_CONCAT = 32  # kMaxConcat in csrc/kernels/pointwise.cuh


def is_available() -> bool:
    """Whether the CUDA kernels can run here (extension loaded and a CUDA device visible)."""
    return _LOADED and torch.cuda.is_available()


def unavailable_reason() -> str:
    """Why :func:`is_available` is false, with how to fix it; ``""`` when it is true."""
    return _extension.unavailable_reason()


# ----------------------------------------------------------------------------- helpers
def _native(op: str, *tensors: Tensor) -> bool:
    return op in NATIVE_OPS and all(t.is_cuda for t in tensors)


def _value4(t: Tensor) -> Tensor:
    """A 2-D ``[N, C]`` or 4-D value as a 4-D channels_last-contiguous tensor."""
    if t.dim() == 2:
        t = t.reshape(t.shape[0], t.shape[1], 1, 1)
    return t if t.is_contiguous(memory_format=_CL) else t.contiguous(memory_format=_CL)


def _mask4(m: Tensor) -> Tensor:
    """A 2-D ``[N, 1]`` or 4-D ``[N, 1, H, W]`` per-pixel tensor as a contiguous 4-D one."""
    if m.dim() == 2:
        m = m.reshape(m.shape[0], m.shape[1], 1, 1)
    return m if m.is_contiguous() else m.contiguous()


def _state4(s: Tensor) -> tuple[Tensor, bool]:
    """A state tensor as 4-D channels_last-contiguous, sharing its storage when it can; the flag
    says that it is a copy, to be written back after the op (:func:`_states4`)."""
    if s.dim() == 2:
        if s.is_contiguous():
            return s.view(s.shape[0], s.shape[1], 1, 1), False
        return s.contiguous().view(s.shape[0], s.shape[1], 1, 1), True
    if s.is_contiguous(memory_format=_CL):
        return s, False
    return s.contiguous(memory_format=_CL), True


class _states4:
    """The in-place states of an op as 4-D channels_last-contiguous tensors (:func:`_state4`), for the
    op in the ``with`` block to update; those that had to be copied are copied back into ``states``
    after it (not when the op raises). A class, not a ``contextlib`` generator: it runs around every
    truncating op of every eager frame, and the generator cost 3.6 against 1.5 us of host time per
    call (this class; two states, the CI machine's CPU)."""

    __slots__ = ("states", "views")

    def __init__(self, *states: Tensor) -> None:
        self.states = states
        self.views = [_state4(s) for s in states]

    def __enter__(self) -> list[Tensor]:
        return [v for v, _ in self.views]

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            for s, (v, copied) in zip(self.states, self.views):
                if copied:
                    s.copy_(v.reshape(s.shape))
        return False


def _like(out: Tensor, mask: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """Outputs of a 4-D kernel back in the rank of ``value`` (2-D values come back 2-D)."""
    if value.dim() == 2:
        return out.reshape(out.shape[0], out.shape[1]), mask.reshape(mask.shape[0], 1)
    return out, mask


def _key(key: Optional[Tensor]) -> Optional[Tensor]:
    return key if key is None or key.is_contiguous() else key.contiguous()


def _pair(v) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = [int(x) for x in v]
    return v * 2 if len(v) == 1 else v


def _pointwise_ok(op: str, value: Tensor, *others: Tensor) -> bool:
    return _native(op, value, *others) and value.dim() in (2, 4) and value.dtype in _ACT_DTYPES


def _state_ok(state: Tensor, shape) -> bool:
    """An accumulator the kernels take: float32, of ``shape``."""
    return state.dtype == torch.float32 and state.shape == shape


def _sent_ok(sent: Tensor, value: Tensor, shape) -> bool:
    """A ``sent`` buffer the kernels take: the dtype of the values sent, of ``shape``."""
    return sent.dtype == value.dtype and sent.shape == shape


def _fake(op: str):
    """Register the decorated function as the fake (meta) kernel of ``deltaconv::op``."""
    def register(fn):
        if _LOADED:
            try:
                torch.library.register_fake(f"deltaconv::{op}")(fn)
            except RuntimeError:  # already registered (module re-imported)
                pass
        return fn
    return register


def _empty_value(like: Tensor, shape, dtype: Optional[torch.dtype] = None) -> Tensor:
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device, memory_format=_CL)


def _empty_mask(like: Tensor, n, h, w) -> Tensor:
    return torch.empty((n, 1, h, w), dtype=torch.bool, device=like.device)


def _empty_like_delta(delta: Tensor) -> tuple[Tensor, Tensor]:
    """Fake outputs of a pointwise op: a value shaped like ``delta`` and its per-pixel mask."""
    n, _, h, w = delta.shape
    return _empty_value(delta, delta.shape), _empty_mask(delta, n, h, w)


# ----------------------------------------------------------------------------- truncation
def _rms(measure: str) -> bool:
    """The kernels' ``rms`` flag for a truncation ``measure`` (see ``reference.MEASURES``; ``"pooled"``
    is rms-based: the ops that take it set ``pooled`` too, the others run it through the reference)."""
    return _ref.check_measure(measure) in ("rms", "pooled")


def _pooled(measure: str) -> bool:
    """Whether ``measure`` is ``"pooled"``, which only the activation kernels run natively."""
    return measure == "pooled"


def truncate(y: Tensor, region: Tensor, sent: Tensor, threshold: float, key: Optional[Tensor],
             out_dtype: torch.dtype, measure: str = "max", tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Send ``y - sent`` on pixels of ``region`` over ``threshold`` (reference; generic tail)."""
    return _ref.truncate(y, region, sent, threshold, key, out_dtype, measure, tf32)


# ----------------------------------------------------------------------------- boundaries
def sparsify(x: Tensor, sent: Tensor, threshold: float, key: Optional[Tensor],
             change_measure: Optional[Tensor] = None, tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Input sparsifier: send pixels of frame ``x`` that moved more than ``threshold`` from ``sent``.
    ``tf32``: as in :func:`activation`."""
    if not (_pointwise_ok("sparsify", x, sent) and _sent_ok(sent, x, x.shape)
            and (change_measure is None or change_measure.dtype == torch.float32)):
        return _ref.sparsify(x, sent, threshold, key, change_measure, tf32=tf32)
    measure = None if change_measure is None else _mask4(change_measure)
    with _states4(sent) as (s4,):
        out, mask = torch.ops.deltaconv.sparsify(_value4(x), s4, float(threshold), _key(key), measure,
                                                 tf32=bool(tf32))
    return _like(out, mask, x)


@_fake("sparsify")
def _sparsify_fake(x, sent, threshold, key, measure, tf32=False):
    n, _, h, w = x.shape
    return _empty_value(x, x.shape), _empty_mask(x, n, h, w)


def densify(delta: Tensor, mask: Tensor, acc: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Output densifier: accumulate ``delta`` into ``acc`` and return a dense copy."""
    if not (_pointwise_ok("densify", delta, mask, acc) and _state_ok(acc, delta.shape) and out_dtype in _ACT_DTYPES):
        return _ref.densify(delta, mask, acc, out_dtype)
    with _states4(acc) as (a4,):
        out = torch.ops.deltaconv.densify(_value4(delta), _mask4(mask), a4, out_dtype)
    return out.reshape(delta.shape) if delta.dim() == 2 else out


@_fake("densify")
def _densify_fake(delta, mask, acc, out_dtype):
    return _empty_value(delta, delta.shape, out_dtype)


# ----------------------------------------------------------------------------- pointwise
def _row_args(rows: Optional[RowList], delta: Tensor) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The ``rows`` / ``rows_count`` arguments of the activation kernels for ``rows`` (4-D deltas
    only: the list indexes the ``[N, H, W]`` map of a 1x1 convolution); marks it filled."""
    if rows is None or delta.dim() != 4:
        return None, None
    rows.filled = True
    return rows.rows, rows.counters


def _slopes(fn, like: Tensor) -> Optional[Tensor]:
    """The ``slopes`` argument of the activation ops: a PReLU's per-channel slopes (``fn.weight``) as a
    contiguous float32 ``[C]`` vector on ``like``'s device (already one when it comes from
    ``DCActivation``), else ``None``."""
    w = getattr(fn, "weight", None)
    if w is None:
        return None
    return w.detach().reshape(-1).to(device=like.device, dtype=torch.float32).contiguous()


def _pooled_and_write_out(measure: str, write_out: bool) -> dict:
    """The activation ops' ``pooled`` and ``write_out`` arguments: the pooled measure's first pass writes the
    pending changes into the output, so it always writes them."""
    pooled = _pooled(measure)
    return {"pooled": pooled, "write_out": bool(write_out) or pooled}


def activation(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, fn: Callable[[Tensor], Tensor],
               threshold: float, key: Optional[Tensor], measure: str = "max",
               rows: Optional[RowList] = None, tf32: bool = False, write_out: bool = True) -> tuple[Tensor, Tensor]:
    """Pointwise non-linearity ``fn``: ``fn(acc + d) - sent`` on active pixels, then truncation.
    ``rows``: a :class:`~deltaconv.delta.RowList` where the kernel also lists the sent pixels
    (``rows.filled`` tells whether it ran; the reference path leaves it untouched). ``tf32``
    (float32 only): the changes sent rounded to TF32, for convolutions that read them in TF32
    (:func:`conv2d` with ``input_tf32``); what the rounding left stays pending. ``write_out=False``:
    the kernel leaves the returned changes unwritten and stores only ``sent``, for a layer whose
    readers all take its whole values (``DCActivation.changes_unread``); the pooled measure and the
    reference path write them anyway."""
    kind = getattr(fn, "kind", None)
    rms = _rms(measure)
    if not (kind in NATIVE_KINDS and _pointwise_ok("activation", delta, mask, acc, sent)
            and _state_ok(acc, delta.shape) and _sent_ok(sent, delta, delta.shape)):
        return _ref.activation(delta, mask, acc, sent, fn, threshold, key, measure, tf32=tf32)
    with _states4(acc, sent) as (a4, s4):
        out, m = torch.ops.deltaconv.activation(_value4(delta), _mask4(mask), a4, s4, kind,
                                                float(getattr(fn, "param", 0.0)), float(threshold), _key(key), rms,
                                                *_row_args(rows, delta), tf32=bool(tf32),
                                                **_pooled_and_write_out(measure, write_out),
                                                slopes=_slopes(fn, delta))
    return _like(out, m, delta)


@_fake("activation")
def _activation_fake(delta, mask, acc, sent, kind, param, threshold, key, rms=False, rows=None, rows_count=None,
                     tf32=False, pooled=False, write_out=True, slopes=None):
    return _empty_like_delta(delta)


def activation_values(x: Tensor, mask: Tensor, sent: Tensor, fn: Callable[[Tensor], Tensor], threshold: float,
                      key: Optional[Tensor], measure: str = "max", rows: Optional[RowList] = None,
                      tf32: bool = False, write_out: bool = True) -> tuple[Tensor, Tensor]:
    """Pointwise non-linearity ``fn`` of a recomputed input (``x``: the whole new input on the active
    pixels, no accumulator): ``fn(x) - sent`` on active pixels, then truncation. ``rows``, ``tf32``
    and ``write_out``: as in :func:`activation`."""
    kind = getattr(fn, "kind", None)
    if not (kind in NATIVE_KINDS and _pointwise_ok("activation_values", x, mask, sent) and _sent_ok(sent, x, x.shape)):
        return _ref.activation_values(x, mask, sent, fn, threshold, key, measure, tf32=tf32)
    with _states4(sent) as (s4,):
        out, m = torch.ops.deltaconv.activation_values(_value4(x), _mask4(mask), s4, kind,
                                                       float(getattr(fn, "param", 0.0)), float(threshold),
                                                       _key(key), _rms(measure), *_row_args(rows, x), tf32=bool(tf32),
                                                       **_pooled_and_write_out(measure, write_out),
                                                       slopes=_slopes(fn, x))
    return _like(out, m, x)


@_fake("activation_values")
def _activation_values_fake(x, mask, sent, kind, param, threshold, key, rms=False, rows=None, rows_count=None,
                            tf32=False, pooled=False, write_out=True, slopes=None):
    return _empty_like_delta(x)


def layer_norm(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, weight: Optional[Tensor],
               bias: Optional[Tensor], eps: float, threshold: float, key: Optional[Tensor], measure: str = "max",
               rows: Optional[RowList] = None, tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Layer norm of each pixel over its channels: ``layer_norm(acc + d) - sent`` on active pixels,
    then truncation. ``rows`` and ``tf32``: as in :func:`activation`."""
    rms = _rms(measure)
    c = delta.shape[1] if delta.dim() >= 2 else -1
    if _pooled(measure) or not (_pointwise_ok("layer_norm", delta, mask, acc, sent) and _state_ok(acc, delta.shape)
            and _sent_ok(sent, delta, delta.shape) and c >= 1
            and all(v is None or v.numel() == c for v in (weight, bias))):
        return _ref.layer_norm(delta, mask, acc, sent, weight, bias, eps, threshold, key, measure, tf32=tf32)

    def vec(v: Optional[Tensor]) -> Optional[Tensor]:
        return None if v is None else v.reshape(-1).to(device=delta.device, dtype=torch.float32).contiguous()

    with _states4(acc, sent) as (a4, s4):
        out, m = torch.ops.deltaconv.layer_norm(_value4(delta), _mask4(mask), a4, s4, vec(weight), vec(bias),
                                                float(eps), float(threshold), _key(key), rms, *_row_args(rows, delta),
                                                tf32=bool(tf32))
    return _like(out, m, delta)


@_fake("layer_norm")
def _layer_norm_fake(delta, mask, acc, sent, weight, bias, eps, threshold, key, rms=False, rows=None,
                     rows_count=None, tf32=False):
    return _empty_like_delta(delta)


def affine_channel(delta: Tensor, mask: Tensor, scale: Optional[Tensor], shift: Optional[Tensor],
                   key: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Per-channel ``y = scale * x + shift`` (BatchNorm in eval): scale the delta; add ``shift``
    once, on key frames."""
    c = delta.shape[1] if delta.dim() >= 2 else -1
    if not (_pointwise_ok("affine_channel", delta, mask) and (scale is None or scale.numel() == c)
            and (shift is None or shift.numel() == c)):
        return _ref.affine_channel(delta, mask, scale, shift, key)

    def vec(v: Optional[Tensor]) -> Optional[Tensor]:
        return None if v is None else v.reshape(-1).to(device=delta.device, dtype=torch.float32).contiguous()

    out, m = torch.ops.deltaconv.affine_channel(_value4(delta), _mask4(mask), vec(scale), vec(shift), _key(key))
    return _like(out, m, delta)


@_fake("affine_channel")
def _affine_channel_fake(delta, mask, scale, shift, key):
    return _empty_like_delta(delta)


def add(delta_a: Tensor, mask_a: Tensor, delta_b: Tensor, mask_b: Tensor,
        alpha: float = 1.0, rows: Optional[RowList] = None) -> tuple[Tensor, Tensor]:
    """``a + alpha * b`` of two changing tensors (broadcasting): linear, the union of masks.
    ``rows``: as in :func:`activation`, listing the output's active pixels."""
    if not (_pointwise_ok("add", delta_a, mask_a, delta_b, mask_b) and delta_a.shape == delta_b.shape
            and delta_a.dtype == delta_b.dtype and mask_a.shape == mask_b.shape):
        return _ref.add(delta_a, mask_a, delta_b, mask_b, alpha)
    out, m = torch.ops.deltaconv.add(_value4(delta_a), _mask4(mask_a), _value4(delta_b), _mask4(mask_b), float(alpha),
                                     *_row_args(rows, delta_a))
    return _like(out, m, delta_a)


@_fake("add")
def _add_fake(delta_a, mask_a, delta_b, mask_b, alpha, rows=None, rows_count=None):
    return _empty_like_delta(delta_a)


def add_activation(delta_a: Tensor, mask_a: Tensor, delta_b: Tensor, mask_b: Tensor, alpha: float, acc: Tensor,
                   sent: Tensor, fn: Callable[[Tensor], Tensor], threshold: float, key: Optional[Tensor],
                   measure: str = "max", rows: Optional[RowList] = None, tf32: bool = False,
                   write_out: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """A residual add and the activation after it (``activation(add(a, b, alpha))``), the add's mask
    returned too: ``(out, out_mask, mask_a | mask_b)``. The CUDA backend runs it in one kernel.
    ``rows``, ``tf32`` and ``write_out``: as in :func:`activation`."""
    kind = getattr(fn, "kind", None)
    if not (kind in NATIVE_KINDS and _pointwise_ok("add_activation", delta_a, mask_a, delta_b, mask_b, acc, sent)
            and delta_a.shape == delta_b.shape and delta_a.dtype == delta_b.dtype and mask_a.shape == mask_b.shape
            and _state_ok(acc, delta_a.shape) and _sent_ok(sent, delta_a, delta_a.shape)):
        d, union = add(delta_a, mask_a, delta_b, mask_b, alpha)
        out, out_mask = activation(d, union, acc, sent, fn, threshold, key, measure, rows, tf32, write_out)
        return out, out_mask, union
    with _states4(acc, sent) as (a4, s4):
        out, m, union = torch.ops.deltaconv.add_activation(
            _value4(delta_a), _mask4(mask_a), _value4(delta_b), _mask4(mask_b), float(alpha), a4, s4, kind,
            float(getattr(fn, "param", 0.0)), float(threshold), _key(key), _rms(measure), *_row_args(rows, delta_a),
            tf32=bool(tf32), **_pooled_and_write_out(measure, write_out), slopes=_slopes(fn, delta_a))
    out, m = _like(out, m, delta_a)
    return out, m, union.view(m.shape)


@_fake("add_activation")
def _add_activation_fake(delta_a, mask_a, delta_b, mask_b, alpha, acc, sent, kind, param, threshold, key, rms=False,
                         rows=None, rows_count=None, tf32=False, pooled=False, write_out=True, slopes=None):
    out, mask = _empty_like_delta(delta_a)
    return out, mask, torch.empty_like(mask)


def add_activation_values(a: Tensor, mask_a: Tensor, b: Tensor, mask_b: Tensor, alpha: float, sent: Tensor,
                          fn: Callable[[Tensor], Tensor], threshold: float, key: Optional[Tensor], measure: str = "max",
                          rows: Optional[RowList] = None, tf32: bool = False,
                          write_out: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """A residual add and the activation after it in value mode (``a``, ``b``: the operands whole at
    every pixel): one kernel, as :func:`add_activation`, with no accumulator. The pooled measure runs
    through the reference (its send pass reads one source map). ``rows``, ``tf32`` and ``write_out``:
    as in :func:`activation`."""
    kind = getattr(fn, "kind", None)
    if not (kind in NATIVE_KINDS and not _pooled(measure)
            and _pointwise_ok("add_activation_values", a, mask_a, b, mask_b, sent)
            and a.shape == b.shape and a.dtype == b.dtype and mask_a.shape == mask_b.shape
            and _sent_ok(sent, a, a.shape)):
        return _ref.add_activation_values(a, mask_a, b, mask_b, alpha, sent, fn, threshold, key, measure, tf32=tf32)
    with _states4(sent) as (s4,):
        out, m, union = torch.ops.deltaconv.add_activation_values(
            _value4(a), _mask4(mask_a), _value4(b), _mask4(mask_b), float(alpha), s4, kind,
            float(getattr(fn, "param", 0.0)), float(threshold), _key(key), _rms(measure), *_row_args(rows, a),
            tf32=bool(tf32), write_out=bool(write_out), slopes=_slopes(fn, a))
    out, m = _like(out, m, a)
    return out, m, union.view(m.shape)


@_fake("add_activation_values")
def _add_activation_values_fake(a, mask_a, b, mask_b, alpha, sent, kind, param, threshold, key, rms=False, rows=None,
                                rows_count=None, tf32=False, write_out=True, slopes=None):
    out, mask = _empty_like_delta(a)
    return out, mask, torch.empty_like(mask)


def add_values(a: Tensor, mask_a: Tensor, b: Tensor, mask_b: Tensor, alpha: float, out: Tensor,
               rows: Optional[RowList] = None) -> Tensor:
    """An add of two whole operands into its kept sum ``out`` (value mode, the reference's
    :func:`~deltaconv.backends.reference.add_values`), on the device: the add kernel reading both
    operands at every pixel of the union and writing the dense add's value there into ``out``.
    ``rows``: as in :func:`activation`."""
    if not (_pointwise_ok("add_values", a, mask_a, b, mask_b, out) and a.shape == b.shape
            and a.dtype == b.dtype and mask_a.shape == mask_b.shape and _sent_ok(out, a, a.shape)):
        return _ref.add_values(a, mask_a, b, mask_b, alpha, out)
    with _states4(out) as (s4,):
        union = torch.ops.deltaconv.add_values(_value4(a), _mask4(mask_a), _value4(b), _mask4(mask_b), float(alpha),
                                               s4, *_row_args(rows, a))
    return union.view(mask_a.shape)


@_fake("add_values")
def _add_values_fake(a, mask_a, b, mask_b, alpha, out, rows=None, rows_count=None):
    n, _, h, w = a.shape
    return _empty_mask(a, n, h, w)


def _mul_shape(a: Tensor, b: Tensor) -> Optional[torch.Size]:
    """The output shape when the kernel covers ``a * b`` (equal shapes or squeeze-excite)."""
    if a.shape == b.shape:
        return a.shape
    if a.dim() != 4 or b.dim() != 4 or a.shape[:2] != b.shape[:2]:
        return None
    if a.shape[2:] == (1, 1):
        return b.shape
    if b.shape[2:] == (1, 1):
        return a.shape
    return None


def mul(delta_a: Tensor, mask_a: Tensor, acc_a: Tensor, delta_b: Tensor, mask_b: Tensor, acc_b: Tensor,
        sent: Tensor, threshold: float, key: Optional[Tensor], measure: str = "max",
        rows: Optional[RowList] = None, tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Product of two changing tensors (broadcasting, e.g. squeeze-excite): non-linear.
    ``rows`` and ``tf32``: as in :func:`activation`."""
    rms = _rms(measure)
    shape = _mul_shape(delta_a, delta_b) if delta_a.dim() == delta_b.dim() else None
    if _pooled(measure) or not (shape is not None
            and _pointwise_ok("mul", delta_a, mask_a, acc_a, delta_b, mask_b, acc_b, sent)
            and delta_a.dtype == delta_b.dtype and _state_ok(acc_a, delta_a.shape) and _state_ok(acc_b, delta_b.shape)
            and _sent_ok(sent, delta_a, shape)):
        return _ref.mul(delta_a, mask_a, acc_a, delta_b, mask_b, acc_b, sent, threshold, key, measure, tf32=tf32)
    with _states4(acc_a, acc_b, sent) as (a4, b4, s4):
        out, m = torch.ops.deltaconv.mul(_value4(delta_a), _mask4(mask_a), a4, _value4(delta_b), _mask4(mask_b), b4,
                                         s4, float(threshold), _key(key), rms, *_row_args(rows, sent),
                                         tf32=bool(tf32))
    return _like(out, m, delta_a)


@_fake("mul")
def _mul_fake(delta_a, mask_a, acc_a, delta_b, mask_b, acc_b, sent, threshold, key, rms=False, rows=None,
              rows_count=None, tf32=False):
    shape = delta_b.shape if delta_a.shape[2:] == (1, 1) and delta_a.shape != delta_b.shape else delta_a.shape
    n, _, h, w = shape
    return _empty_value(delta_a, shape), _empty_mask(delta_a, n, h, w)


def mul_values(a: Tensor, mask_a: Tensor, b: Tensor, mask_b: Tensor, sent: Tensor, threshold: float,
               key: Optional[Tensor], measure: str = "max", rows: Optional[RowList] = None,
               tf32: bool = False) -> tuple[Tensor, Tensor]:
    """A product of two whole operands (value mode, the reference's
    :func:`~deltaconv.backends.reference.mul_values`), on the device: the mul kernel reading both
    operands whole, no accumulators. ``rows`` and ``tf32``: as in :func:`activation`."""
    shape = _mul_shape(a, b) if a.dim() == b.dim() else None
    if _pooled(measure) or not (shape is not None and _pointwise_ok("mul_values", a, mask_a, b, mask_b, sent)
                                and a.dtype == b.dtype and _sent_ok(sent, a, shape)):
        return _ref.mul_values(a, mask_a, b, mask_b, sent, threshold, key, measure, tf32=tf32)
    with _states4(sent) as (s4,):
        out, m = torch.ops.deltaconv.mul_values(_value4(a), _mask4(mask_a), _value4(b), _mask4(mask_b), s4,
                                                float(threshold), _key(key), _rms(measure), *_row_args(rows, sent),
                                                tf32=bool(tf32))
    return _like(out, m, a)


@_fake("mul_values")
def _mul_values_fake(a, mask_a, b, mask_b, sent, threshold, key, rms=False, rows=None, rows_count=None, tf32=False):
    return _mul_fake(a, mask_a, None, b, mask_b, None, sent, threshold, key)


def concatenate(deltas: Sequence[Tensor], masks: Sequence[Tensor], dim: int) -> tuple[Tensor, Tensor]:
    """``torch.cat`` along ``dim``: along channels the masks are OR-ed, along other dims joined. More
    than ``_MAX_CONCAT`` deltas (DenseNet-169's and -201's later blocks) are joined in steps: the first
    ``_MAX_CONCAT`` into one, which then leads the rest."""
    deltas, masks = list(deltas), list(masks)
    ndim = deltas[0].dim() if deltas else 0
    if not (deltas and ndim in (2, 4) and dim % ndim == 1
            and all(_pointwise_ok("concatenate", d, m) and d.dim() == ndim and d.dtype == deltas[0].dtype
                    for d, m in zip(deltas, masks))):
        return _ref.concatenate(deltas, masks, dim)
    first = deltas[0]
    while len(deltas) > _MAX_CONCAT:
        head, head_mask = torch.ops.deltaconv.concatenate([_value4(d) for d in deltas[:_MAX_CONCAT]],
                                                          [_mask4(m) for m in masks[:_MAX_CONCAT]])
        deltas[:_MAX_CONCAT], masks[:_MAX_CONCAT] = [head], [head_mask]
    out, m = torch.ops.deltaconv.concatenate([_value4(d) for d in deltas], [_mask4(m) for m in masks])
    return _like(out, m, first)


@_fake("concatenate")
def _concatenate_fake(deltas, masks):
    n, _, h, w = deltas[0].shape
    c = sum(d.shape[1] for d in deltas)
    return _empty_value(deltas[0], (n, c, h, w)), _empty_mask(deltas[0], n, h, w)


def interleave_channels(delta_a: Tensor, mask_a: Tensor, delta_b: Tensor, mask_b: Tensor,
                        parts: int) -> tuple[list[Tensor], Tensor]:
    """The channels of two 4-D deltas of one shape interleaved (``a0, b0, a1, b1, ...``), cut into
    ``parts`` chunks along the channels as ``.chunk`` cuts; the masks OR-ed. One kernel writes each
    chunk channels_last contiguous (1 or 2 chunks, always equal; others run the reference's torch ops)."""
    if not (_pointwise_ok("interleave_channels", delta_a, mask_a, delta_b, mask_b) and delta_a.dim() == 4
            and delta_b.shape == delta_a.shape and delta_b.dtype == delta_a.dtype and parts in (1, 2)):
        return _ref.interleave_channels(delta_a, mask_a, delta_b, mask_b, parts)
    out, mask = torch.ops.deltaconv.interleave_channels(_value4(delta_a), _mask4(mask_a), _value4(delta_b),
                                                        _mask4(mask_b), int(parts))
    return list(out), mask


@_fake("interleave_channels")
def _interleave_channels_fake(delta_a, mask_a, delta_b, mask_b, parts):
    n, c, h, w = delta_a.shape
    return [_empty_value(delta_a, (n, 2 * c // parts, h, w)) for _ in range(parts)], _empty_mask(delta_a, n, h, w)


# ----------------------------------------------------------------------------- convolution
def conv2d(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], stride, padding, dilation,
           groups: int, key: Optional[Tensor], padding_mode: str = "zeros",
           counters: Optional[Tensor] = None, input_tf32: bool = False, load_mask: Optional[Tensor] = None,
           bias_key: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Convolution: ``W * d``; the mask is dilated by the receptive field; the bias is added once,
    on key frames. ``counters``: zeroed int32 ``[>= 14]`` on the device where the kernels count their
    work list, rank their blocks and record the K split of the 3x3 kernel's fine launch or the
    gathered-rows GEMM (``counters[3]``; a slice of :class:`~deltaconv.modules.WorkCounters`); ``None``: the op zeroes
    its own. ``input_tf32`` (float32 only): ``delta`` holds TF32 values already (a layer with a ``sent``
    state sent it with ``tf32``), so the tensor-core kernels skip rounding it; other values they would read
    truncated. Outputs are bit-identical from call to call, except where the 3x3 kernel hands a tail of
    tiles past one round of its coarse launch to its fine launch (or, for 256 input channels on
    Hopper, to the weight-stationary kernel in its place; not under
    ``torch.use_deterministic_algorithms(True)``). ``load_mask`` / ``bias_key``: value mode, as in
    the reference's :func:`~deltaconv.backends.reference.conv2d`."""
    if not (_native("conv2d", delta, mask, weight) and delta.dim() == 4 and delta.dtype in _ACT_DTYPES
            and padding_mode == "zeros" and not isinstance(padding, str)):
        return _ref.conv2d(delta, mask, weight, bias, stride, padding, dilation, groups, key, padding_mode,
                           load_mask=load_mask, bias_key=bias_key)
    return torch.ops.deltaconv.conv2d(_value4(delta), _mask4(mask), weight, bias, _pair(stride), _pair(padding),
                                      _pair(dilation), int(groups), _key(key), counters, bool(input_tf32),
                                      None if load_mask is None else _mask4(load_mask), _key(bias_key))


def conv1x1_rows(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], rows: RowList,
                 input_tf32: bool = False, bias_key: Optional[Tensor] = None) -> Tensor:
    """:func:`conv2d` of a 1x1 kernel, stride 1, no padding, groups 1, on a delta frame (no key),
    over the pixels the layer before it listed in ``rows`` (filled): the same output at those pixels,
    without the mask pass; the output mask is ``mask``. CUDA tensors, 4-D ``delta``. ``input_tf32``:
    as in :func:`conv2d`; ``bias_key``: the streams whose outputs get the bias (value mode; default none)."""
    return torch.ops.deltaconv.conv1x1_rows(_value4(delta), _mask4(mask), weight, bias, rows.rows, rows.counters,
                                            bool(input_tf32), _key(bias_key))


@_fake("conv1x1_rows")
def _conv1x1_rows_fake(delta, mask, weight, bias, rows, counters, input_tf32=False, bias_key=None):
    n, _, h, w = delta.shape
    return _empty_value(delta, (n, weight.shape[0], h, w))


def keep_output(out: Tensor, delta: Tensor, mask: Tensor) -> Tensor:
    """A convolution's kept whole output takes ``delta`` on ``mask`` (the reference's, on the device)."""
    return _ref.keep_output(out, delta, mask)


def conv1x1_rows_into(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], rows: RowList, out: Tensor,
                      input_tf32: bool = False, bias_key: Optional[Tensor] = None) -> bool:
    """:func:`conv1x1_rows` writing its output's listed pixels into ``out`` (``[N, Cout, H, W]``
    channels_last, the delta's dtype), which keeps its other pixels: a convolution keeping its whole
    output (``DCConv2d.keeps_output``), with no copy. Returns whether it ran: ``False`` (``out``
    untouched) where the kernel does not take it (an extension without the op, output channels not a
    multiple of 8, which the tensor cores would pad; ``out`` of another layout); the caller then runs
    :func:`conv1x1_rows` and :func:`keep_output`."""
    n, _, h, w = delta.shape
    if not (_native("conv1x1_rows_into", delta, mask, weight, out) and out.dtype == delta.dtype
            and tuple(out.shape) == (n, weight.shape[0], h, w) and out.is_contiguous(memory_format=_CL)
            and weight.shape[0] % 8 == 0):
        return False
    torch.ops.deltaconv.conv1x1_rows_into(_value4(delta), _mask4(mask), weight, bias, rows.rows, rows.counters, out,
                                          bool(input_tf32), _key(bias_key))
    return True


@_fake("conv1x1_rows_into")
def _conv1x1_rows_into_fake(delta, mask, weight, bias, rows, counters, out, input_tf32=False, bias_key=None):
    return None


def conv1x1_into(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], stride, padding,
                 key: Optional[Tensor], out: Tensor, counters: Optional[Tensor] = None, input_tf32: bool = False,
                 load_mask: Optional[Tensor] = None, bias_key: Optional[Tensor] = None) -> Tensor:
    """:func:`conv2d` of a 1x1 kernel (one group, any stride and padding) writing its output pixels into
    ``out`` (``[N, Cout, Ho, Wo]``), which keeps the others: a convolution keeping its whole output
    off a row list (``DCConv2d.keeps_output``), with no copy. Returns the output mask. Where the kernel
    does not take it (an extension without the op, output channels not a multiple of 8, which the
    tensor cores would pad, ``out`` of another layout or dtype) :func:`conv2d` runs and
    :func:`keep_output` copies its output pixels into ``out``, as the reference's
    :func:`~deltaconv.backends.reference.conv1x1_into` does."""
    if not (_native("conv1x1_into", delta, mask, weight, out) and delta.dim() == 4 and delta.dtype in _ACT_DTYPES
            and out.dtype == delta.dtype and out.is_contiguous(memory_format=_CL) and weight.shape[0] % 8 == 0):
        v, m = conv2d(delta, mask, weight, bias, stride, padding, 1, 1, key, counters=counters,
                      input_tf32=input_tf32, load_mask=load_mask, bias_key=bias_key)
        keep_output(out, v, m)
        return m
    return torch.ops.deltaconv.conv1x1_into(_value4(delta), _mask4(mask), weight, bias, _pair(stride), _pair(padding),
                                            _key(key), counters, out, bool(input_tf32),
                                            None if load_mask is None else _mask4(load_mask), _key(bias_key))


@_fake("conv1x1_into")
def _conv1x1_into_fake(delta, mask, weight, bias, stride, padding, key, counters, out, input_tf32=False,
                       load_mask=None, bias_key=None):
    return _empty_mask(delta, *out.shape[:1], *out.shape[2:])


def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@_fake("conv2d")
def _conv2d_fake(delta, mask, weight, bias, stride, padding, dilation, groups, key, counters=None, input_tf32=False,
                 load_mask=None, bias_key=None):
    n, _, h, w = delta.shape
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    ho = _conv_out(h, weight.shape[2], sh, ph, dh)
    wo = _conv_out(w, weight.shape[3], sw, pw, dw)
    return _empty_value(delta, (n, weight.shape[0], ho, wo)), _empty_mask(delta, n, ho, wo)


def conv_transpose2d(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], stride, padding,
                     output_padding, groups: int, dilation, key: Optional[Tensor],
                     counters: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Transposed convolution: linear; the mask is scattered through the same footprint. In float16 /
    bfloat16 with one group, dilation 1 and a kernel of whole strides (``KH % stride_h == KW % stride_w ==
    0``: 4x4 or 2x2 at stride 2) it runs as one stride-1 convolution of all the phases of the stride
    (``stride_h * stride_w * C_out`` output channels over each phase's ``KH / stride_h x KW / stride_w``
    taps, a 2x2 window widened to 3x3: the 3x3 tile kernel) on the tensor cores and a depth-to-space of
    its output (``csrc/conv/conv_transpose_phases.cuh``; ``DELTACONV_TC_TRANSPOSED=0``: the CUDA-core
    kernel; ``DELTACONV_TC_TRANSPOSED_3X3=0``: a 2x2 window kept 2x2), else on the CUDA cores.
    ``counters``: as in :func:`conv2d` (that convolution's)."""
    if not (_native("conv_transpose2d", delta, mask, weight) and delta.dim() == 4 and delta.dtype in _ACT_DTYPES
            and not isinstance(padding, str)):
        return _ref.conv_transpose2d(delta, mask, weight, bias, stride, padding, output_padding, groups, dilation,
                                     key)
    return torch.ops.deltaconv.conv_transpose2d(_value4(delta), _mask4(mask), weight, bias, _pair(stride),
                                                _pair(padding), _pair(output_padding), int(groups), _pair(dilation),
                                                _key(key), counters)


@_fake("conv_transpose2d")
def _conv_transpose2d_fake(delta, mask, weight, bias, stride, padding, output_padding, groups, dilation, key,
                           counters=None):
    n, _, h, w = delta.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = _pair(stride), _pair(padding), _pair(output_padding), _pair(dilation)
    ho = (h - 1) * sh - 2 * ph + dh * (weight.shape[2] - 1) + oph + 1
    wo = (w - 1) * sw - 2 * pw + dw * (weight.shape[3] - 1) + opw + 1
    return _empty_value(delta, (n, weight.shape[1] * groups, ho, wo)), _empty_mask(delta, n, ho, wo)


def linear(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor],
           key: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``F.linear`` over the last dim (the kernel covers 2-D ``[N, in]`` deltas)."""
    if not (_native("linear", delta, mask, weight) and delta.dim() == 2 and delta.dtype in _ACT_DTYPES
            and mask.dim() == 2):
        return _ref.linear(delta, mask, weight, bias, key)
    return torch.ops.deltaconv.linear(delta if delta.is_contiguous() else delta.contiguous(), _mask4(mask), weight,
                                      bias, _key(key))


@_fake("linear")
def _linear_fake(delta, mask, weight, bias, key):
    return delta.new_empty((delta.shape[0], weight.shape[0])), mask.new_empty((delta.shape[0], 1))


# ----------------------------------------------------------------------------- pooling, resizing
def linear_spatial(delta: Tensor, mask: Tensor, op: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    """A linear, bias-free spatial op with non-negative weights given as a callable (reference)."""
    return _ref.linear_spatial(delta, mask, op)


def pool_nonlinear(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, op: Callable[[Tensor], Tensor],
                   threshold: float, key: Optional[Tensor], measure: str = "max",
                   tf32: bool = False) -> tuple[Tensor, Tensor]:
    """A non-linear spatial op given as a callable (reference)."""
    return _ref.pool_nonlinear(delta, mask, acc, sent, op, threshold, key, measure, tf32)


def _pool_out(size, k, p, s, d, ceil_mode):
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_stride(stride, kernel_size) -> list[int]:
    return _pair(kernel_size) if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _pair(stride)


#: the smallest window (pixels) that :func:`avg_pool2d` hands to the adaptive pooling when it tiles the map:
#: ``avgpool_kernel`` sums a window in one thread per output element, which for the whole-map windows of
#: exported squeeze-excite blocks (``AvgPool2d(64)`` over a 64x64 map: TFLite files spell a global
#: pooling so) is a few dozen threads each reading thousands of pixels; the adaptive kernel splits windows
#: into chunks of 256 pixels over a block each. Measured on windows of 256 to 16,384 pixels (MediaPipe's selfie
#: segmentation 3.8x faster per frame, ``benchmarks/results/mediapipe_cuda.txt``); 64 is a bound below that, the
#: windows of 64-255 pixels not timed on both kernels
LARGE_POOL_WINDOW = 64


def _tiling_pool_output(size, kernel_size, stride, padding, ceil_mode, divisor_override) -> Optional[list[int]]:
    """The output size ``[Ho, Wo]`` of an average pooling that is the adaptive pooling to that size (windows
    that tile the ``size`` map exactly: stride the window, no padding, no divisor) with a window of at least
    :data:`LARGE_POOL_WINDOW` pixels; else None."""
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel_size), _pool_stride(stride, kernel_size), _pair(padding)
    if (kh, kw) != (sh, sw) or ph or pw or divisor_override is not None or kh * kw < LARGE_POOL_WINDOW:
        return None
    out = [_pool_out(n, k, 0, k, 1, ceil_mode) for n, k in zip(size, (kh, kw))]
    return out if all(o * k == n for o, k, n in zip(out, (kh, kw), size)) else None


def avg_pool2d(delta: Tensor, mask: Tensor, kernel_size, stride, padding, ceil_mode: bool,
               count_include_pad: bool, divisor_override: Optional[int]) -> tuple[Tensor, Tensor]:
    """Average pooling (``F.avg_pool2d`` arguments): linear. A large window that tiles the map (a global
    pooling spelled as a fixed window) runs as the adaptive pooling to the same output size."""
    if not (_native("avg_pool2d", delta, mask) and delta.dim() == 4 and delta.dtype in _ACT_DTYPES):
        return _ref.avg_pool2d(delta, mask, kernel_size, stride, padding, ceil_mode, count_include_pad,
                               divisor_override)
    tiles = _tiling_pool_output(delta.shape[2:], kernel_size, stride, padding, ceil_mode, divisor_override)
    if tiles is not None:  # a large window that tiles the map: the adaptive pooling's chunked kernel
        return adaptive_avg_pool2d(delta, mask, tiles)
    return torch.ops.deltaconv.avg_pool2d(_value4(delta), _mask4(mask), _pair(kernel_size),
                                          _pool_stride(stride, kernel_size), _pair(padding), bool(ceil_mode),
                                          bool(count_include_pad),
                                          None if divisor_override is None else int(divisor_override))


@_fake("avg_pool2d")
def _avg_pool2d_fake(delta, mask, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    n, c, h, w = delta.shape
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel_size), _pool_stride(stride, kernel_size), _pair(padding)
    ho, wo = _pool_out(h, kh, ph, sh, 1, ceil_mode), _pool_out(w, kw, pw, sw, 1, ceil_mode)
    return _empty_value(delta, (n, c, ho, wo)), _empty_mask(delta, n, ho, wo)


def adaptive_avg_pool2d(delta: Tensor, mask: Tensor, output_size) -> tuple[Tensor, Tensor]:
    """Adaptive average pooling (global pooling included): linear."""
    if not (_native("adaptive_avg_pool2d", delta, mask) and delta.dim() == 4 and delta.dtype in _ACT_DTYPES):
        return _ref.adaptive_avg_pool2d(delta, mask, output_size)
    size = [output_size, output_size] if isinstance(output_size, int) else list(output_size)
    size = [delta.shape[2 + i] if s is None else int(s) for i, s in enumerate(size)]
    return torch.ops.deltaconv.adaptive_avg_pool2d(_value4(delta), _mask4(mask), size)


@_fake("adaptive_avg_pool2d")
def _adaptive_avg_pool2d_fake(delta, mask, output_size):
    n, c = delta.shape[:2]
    ho, wo = _pair(output_size)
    return _empty_value(delta, (n, c, ho, wo)), _empty_mask(delta, n, ho, wo)


def _interpolate_args(shape, size, scale_factor):
    """``F.interpolate``'s output size and the scales its kernels receive (None: from the sizes)."""
    h, w = int(shape[-2]), int(shape[-1])
    if size is not None:
        oh, ow = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        return [oh, ow], None, None
    sf = scale_factor if isinstance(scale_factor, (list, tuple)) else (scale_factor, scale_factor)
    sh, sw = float(sf[0]), float(sf[1])
    return [math.floor(float(h) * sh), math.floor(float(w) * sw)], sh, sw


def _resampling_ok(size, scale_factor) -> bool:
    """Whether the kernels take these ``F.interpolate`` sizes: one of ``size`` / ``scale_factor``, for
    two spatial dims."""
    return (size is None) != (scale_factor is None) and (
        size is None or isinstance(size, int) or len(size) == 2) and (
        scale_factor is None or not isinstance(scale_factor, (list, tuple)) or len(scale_factor) == 2)


def interpolate(delta: Tensor, mask: Tensor, size, scale_factor, mode: str,
                align_corners: Optional[bool]) -> tuple[Tensor, Tensor]:
    """``F.interpolate`` in a mode with non-negative weights: linear; the mask follows the same
    resampling (kernels: nearest, nearest-exact, bilinear)."""
    if not (_resampling_ok(size, scale_factor) and _native("interpolate", delta, mask) and delta.dim() == 4
            and delta.dtype in _ACT_DTYPES and mode in ("nearest", "nearest-exact", "bilinear")):
        return _ref.interpolate(delta, mask, size, scale_factor, mode, align_corners)
    out_size, sh, sw = _interpolate_args(delta.shape, size, scale_factor)
    return torch.ops.deltaconv.interpolate(_value4(delta), _mask4(mask), out_size, sh, sw, mode,
                                           bool(align_corners) if mode == "bilinear" else False)


@_fake("interpolate")
def _interpolate_fake(delta, mask, out_size, scale_h, scale_w, mode, align_corners):
    n, c = delta.shape[:2]
    oh, ow = out_size
    return _empty_value(delta, (n, c, oh, ow)), _empty_mask(delta, n, oh, ow)


def resample(x: Tensor, size, scale_factor, mode: str, align_corners: Optional[bool]) -> Tensor:
    """``F.interpolate`` of a dense map (the output densifier's, where a model ends in an
    upsampling), into a contiguous (NCHW) tensor (kernel: nearest, nearest-exact, bilinear)."""
    if not (_resampling_ok(size, scale_factor) and _native("resample", x) and x.dim() == 4 and x.dtype in _ACT_DTYPES
            and mode in ("nearest", "nearest-exact", "bilinear")):
        return _ref.resample(x, size, scale_factor, mode, align_corners)
    out_size, sh, sw = _interpolate_args(x.shape, size, scale_factor)
    return torch.ops.deltaconv.resample(_value4(x), out_size, sh, sw, mode,
                                        bool(align_corners) if mode == "bilinear" else False)


@_fake("resample")
def _resample_fake(x, out_size, scale_h, scale_w, mode, align_corners):
    return x.new_empty((x.shape[0], x.shape[1], out_size[0], out_size[1]))


def max_pool2d(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, kernel_size, stride, padding, dilation,
               ceil_mode: bool, threshold: float, key: Optional[Tensor],
               measure: str = "max", tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Max pooling (``F.max_pool2d`` arguments): non-linear, over the footprint of active pixels.
    ``tf32``: as in :func:`activation`."""
    rms = _rms(measure)
    if _pooled(measure) or not (_native("max_pool2d", delta, mask, acc, sent) and delta.dim() == 4
            and delta.dtype in _ACT_DTYPES
            and acc.dtype == torch.float32 and sent.dtype == delta.dtype):
        return _ref.max_pool2d(delta, mask, acc, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold,
                               key, measure, tf32=tf32)
    return torch.ops.deltaconv.max_pool2d(_value4(delta), _mask4(mask), acc, sent, _pair(kernel_size),
                                          _pool_stride(stride, kernel_size), _pair(padding), _pair(dilation),
                                          bool(ceil_mode), float(threshold), _key(key), rms, tf32=bool(tf32))


@_fake("max_pool2d")
def _max_pool2d_fake(delta, mask, acc, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold, key,
                     rms=False, tf32=False):
    n, c, h, w = delta.shape
    (kh, kw), (sh, sw) = _pair(kernel_size), _pool_stride(stride, kernel_size)
    (ph, pw), (dh, dw) = _pair(padding), _pair(dilation)
    ho, wo = _pool_out(h, kh, ph, sh, dh, ceil_mode), _pool_out(w, kw, pw, sw, dw, ceil_mode)
    return _empty_value(delta, (n, c, ho, wo)), _empty_mask(delta, n, ho, wo)


def max_pool2d_values(x: Tensor, mask: Tensor, sent: Tensor, kernel_size, stride, padding, dilation,
                      ceil_mode: bool, threshold: float, key: Optional[Tensor],
                      measure: str = "max", tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Max pooling in value mode (``x``: the input's whole values at every pixel, no accumulator):
    :func:`max_pool2d` without its accumulator pass. ``tf32``: as in :func:`activation`."""
    if _pooled(measure) or not (_native("max_pool2d_values", x, mask, sent) and x.dim() == 4
                                and x.dtype in _ACT_DTYPES and sent.dtype == x.dtype):
        return _ref.max_pool2d_values(x, mask, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold,
                                      key, measure, tf32=tf32)
    return torch.ops.deltaconv.max_pool2d_values(_value4(x), _mask4(mask), sent, _pair(kernel_size),
                                                 _pool_stride(stride, kernel_size), _pair(padding), _pair(dilation),
                                                 bool(ceil_mode), float(threshold), _key(key), _rms(measure),
                                                 tf32=bool(tf32))


@_fake("max_pool2d_values")
def _max_pool2d_values_fake(x, mask, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold, key,
                            rms=False, tf32=False):
    return _max_pool2d_fake(x, mask, None, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold, key)


# ----------------------------------------------------------------------------- statistics
def count_active(masks: Sequence[Tensor], stats: Sequence[Tensor]) -> None:
    """Per-layer statistics, one kernel per 256 masks: ``stats[i][0]`` = active pixels of
    ``masks[i]``, ``stats[i][1] += stats[i][0]`` (each ``stats[i]`` at most once per call)."""
    if not (masks and all(_native("count_active", m, s) and m.dtype == torch.bool and s.dtype == torch.float64
                          and s.shape == (4,) and s.is_contiguous() for m, s in zip(masks, stats))
            and len(masks) == len(stats)):
        return _ref.count_active(masks, stats)
    torch.ops.deltaconv.count_active(list(masks), list(stats))


@_fake("count_active")
def _count_active_fake(masks, stats):
    return None
