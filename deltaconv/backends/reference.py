"""Reference backend: the delta rule of every layer, in plain PyTorch.

This is the one place where the delta semantics are written down; the CUDA backend implements
the same functions and is tested against these. Every function is exact, runs on any device and
any float dtype, and ignores (never reads) values at inactive pixels.

Conventions for every function here
-----------------------------------
* ``delta``: ``[N, C, H, W]`` change since the previous frame (any memory format); ``mask``:
  ``[N, 1, H, W]`` bool, ``True`` where the pixel carries a change.
* State tensors have the shape of the value they track and are updated in place: accumulators
  (``acc``) are float32 (float64 for float64 models); ``sent`` has the dtype of the values sent
  (float16 for a float16 model). Changes against ``sent`` are computed in float32 (float64).
* ``key``: ``None``, or a ``[N]`` bool tensor marking the streams whose state was just reset:
  for those the layer sends every pixel (key frames are exact and dense) and affine layers add
  their constant term (bias, BN shift) once.
* ``threshold``: a pixel is sent when its change measure exceeds ``threshold``; what is not sent
  stays in the state and goes out once the accumulated change crosses the threshold. The measure
  (``measure`` of the non-linear layers, :data:`MEASURES`) is ``"max"``, ``max_c |change|``,
  ``"rms"``, ``sqrt(mean_c change^2)``, or ``"pooled"``, the rms of the change averaged over a 3x3
  window (:func:`exceeds`); the input sparsifier always uses ``"max"`` (or a change detector's
  measure).
* Returns ``(delta_out, mask_out)`` with ``delta_out`` zero at inactive pixels, in the input's
  dtype.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from ..delta import RowList, reduce_mask

Tensor = torch.Tensor


def _key_view(key: Optional[Tensor], ndim: int) -> Optional[Tensor]:
    """``key`` [N] reshaped to broadcast against an ``ndim``-D tensor."""
    if key is None:
        return None
    return key.view([-1] + [1] * (ndim - 1))


def _zero_inactive(delta: Tensor, mask: Tensor) -> Tensor:
    # where() rather than a product so that garbage (even NaN) at inactive pixels never leaks
    return torch.where(mask, delta, torch.zeros((), dtype=delta.dtype, device=delta.device))


def _footprint(mask: Tensor, pool: Callable[[Tensor], Tensor]) -> Tensor:
    """Mask of output pixels whose receptive field holds an active input pixel.

    ``pool`` is the layer's own spatial op applied to a float mask with non-negative weights
    (a ones kernel for convolutions), so the footprint respects kernel, stride, dilation,
    padding and ceil_mode exactly as the layer does.
    """
    return pool(mask.to(torch.float32)) > 0


# ----------------------------------------------------------------------------- truncation
def round_to_tf32(t: Tensor) -> Tensor:
    """Float32 ``t`` rounded to the nearest TF32 value (10 mantissa bits, ties away from zero, as
    ``cvt.rna.tf32.f32``), still float32 and in ``t``'s memory format; infinities and NaNs as they are.

    The CUDA backend's tensor-core convolutions read float32 operands in TF32 by dropping their low 13
    mantissa bits (the tensor cores' own conversion, toward zero), so the convolutions round their
    weights to nearest with their fold, once (:meth:`~deltaconv.modules.folding.FoldedWeights.get`
    with ``tf32``), and every layer with a ``sent`` state rounds the changes it sends (:func:`truncate`,
    :func:`sparsify` and the non-linear ops with ``tf32``)."""
    bits = t.view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(t), rounded, t)


def _work_dtype(sent: Tensor) -> torch.dtype:
    """The dtype in which changes against ``sent`` are computed: float32 (float64 for float64)."""
    return torch.promote_types(sent.dtype, torch.float32)


def _send(target: Tensor, sent: Tensor, change: Tensor, mask: Tensor, out_dtype: torch.dtype,
          tf32: bool = False) -> Tensor:
    """Send ``change = target - sent`` on ``mask``: returns the output delta (``out_dtype``, zero
    elsewhere) and updates ``sent`` in place to ``target`` less what the cast of the delta to
    ``out_dtype`` lost (that stays pending). ``sent + out`` instead would leave a float rounding
    residual that threshold 0 re-sends on every later frame although nothing changed. ``target``
    and ``change`` are in the work dtype, ``target`` already rounded to ``sent``'s dtype. ``tf32``
    (float32 only): the delta rounded to TF32 (:func:`round_to_tf32`) instead, what that lost
    pending in the same way."""
    zero = torch.zeros((), dtype=change.dtype, device=change.device)
    out = torch.where(mask, change, zero)
    out = round_to_tf32(out) if tf32 else out.to(out_dtype)
    sent.copy_(torch.where(mask, target - (change - out.to(change.dtype)), sent.to(change.dtype)))
    return out


def _check_tf32(tf32: bool, dtype: torch.dtype) -> bool:
    """``tf32``, checked: TF32 sends need float32 deltas (``ValueError`` naming the dtype)."""
    if tf32 and dtype != torch.float32:
        raise ValueError(f"tf32 needs float32 deltas, got {dtype}")
    return bool(tf32)


def _target(y: Optional[Tensor], sent: Tensor) -> Optional[Tensor]:
    """``y`` rounded to ``sent``'s dtype (what downstream can hold; for a weight or bias, what the model holds), in
    the work dtype; ``None`` stays ``None``."""
    return None if y is None else y.to(sent.dtype).to(_work_dtype(sent))


#: measures of a change that non-linear layers compare with their threshold (see :func:`exceeds`)
MEASURES = ("max", "rms", "pooled")
#: the ``"pooled"`` measure's window (``POOL_SIZE x POOL_SIZE``, centred, stride 1) and peak guard: a
#: pixel whose own rms exceeds ``POOL_PEAK`` times the threshold is sent whatever its neighbours do
POOL_SIZE = 3
POOL_PEAK = 4.0
#: truncations that choose a measure per layer by the layer's place in the model
#: (``DeltaModel.truncation``): ``"hybrid"`` is ``"pooled"`` where the layer's output is at a stride
#: of :data:`HYBRID_MIN_STRIDE` or more against the frame, ``"rms"`` nearer the input (pooling the
#: stride-2 layers costs the most error: README, Fidelity and calibration)
PRESETS = ("hybrid",)
HYBRID_MIN_STRIDE = 4


def check_measure(measure: str, what: str = "measure") -> str:
    """``measure`` if it is one of :data:`MEASURES`, else ``ValueError`` naming ``what`` and the value."""
    if measure not in MEASURES:
        raise ValueError(f"{what} must be one of {MEASURES}, got {measure!r}")
    return measure


def check_truncation(truncation, what: str = "truncation"):
    """``truncation`` if it is a measure of :data:`MEASURES`, a preset of :data:`PRESETS` or a dict
    of layer-name patterns (``fnmatch``) to measures, else ``TypeError`` / ``ValueError`` naming
    ``what`` and the value."""
    if isinstance(truncation, str):
        if truncation not in MEASURES + PRESETS:
            raise ValueError(f"{what} must be one of {MEASURES + PRESETS} or a dict of layer-name patterns to "
                             f"measures, got {truncation!r}")
        return truncation
    if not isinstance(truncation, dict) or not all(isinstance(k, str) for k in truncation):
        raise TypeError(f"{what} must be one of {MEASURES + PRESETS} or a dict of layer-name patterns to "
                        f"measures, got {truncation!r}")
    for pattern, measure in truncation.items():
        check_measure(measure, f"{what}[{pattern!r}]")
    return truncation


def exceeds(change: Tensor, threshold: float, measure: str = "max") -> Tensor:
    """Per-pixel mask (``[N, 1, ...]``) of where the measure of ``change`` ``[N, C, ...]`` exceeds
    ``threshold``:

    * ``"max"``: ``max_c |change| > threshold``;
    * ``"rms"``: ``sqrt(mean_c change^2) > threshold`` (the L2 size of the change, which is what
      reaches the output through linear layers; many channels each changing a little count as much
      as one changing a lot);
    * ``"pooled"`` (4-D maps; on other shapes ``"rms"``): each channel's *signed* change averaged
      over the ``POOL_SIZE x POOL_SIZE`` window around the pixel (``avg_pool2d``, stride 1, padding
      not counted), then ``sqrt(mean_c box_c^2) > threshold``; or the pixel's own rms exceeds
      ``POOL_PEAK * threshold``. Pending changes of random sign (codec noise spread through the
      network) partly cancel in what reaches a global output, a coherent change does not; the
      window measures that, and the peak guard still sends a large change of a lone pixel. Only the
      choice of pixels changes: what is sent is the pixel's exact change, the rest stays pending.
    """
    measure = check_measure(measure)
    if measure == "max":
        return reduce_mask(change.abs() > threshold)
    sq = change.square()
    mean_sq = sq.mean(dim=1, keepdim=True) if sq.dim() >= 2 else sq.mean().reshape([1] * sq.dim())
    pixel_rms = mean_sq.sqrt()
    if measure == "rms" or change.dim() != 4:
        return pixel_rms > threshold
    box = F.avg_pool2d(change, POOL_SIZE, 1, POOL_SIZE // 2, count_include_pad=False)
    pooled = box.square().mean(dim=1, keepdim=True).sqrt()
    return (pooled > threshold) | (pixel_rms > POOL_PEAK * threshold)


def truncate(y: Tensor, region: Tensor, sent: Tensor, threshold: float, key: Optional[Tensor],
             out_dtype: torch.dtype, measure: str = "max", tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Send ``y - sent`` on pixels of ``region`` whose change exceeds ``threshold`` (by ``measure``).

    The common tail of every non-linear layer: ``y`` is the layer's new output computed from its
    accumulated inputs, ``sent`` what downstream has received so far (updated in place). ``y`` is
    first rounded to ``sent``'s dtype (a float16 model's layers output float16, as the dense
    model's do); the change is computed in float32. ``tf32`` (float32 only): the changes are sent
    rounded to TF32, the rest kept pending (see :func:`_send`).
    """
    target = _target(y, sent)
    change = torch.where(region, target - sent.to(target.dtype), torch.zeros((), dtype=target.dtype, device=y.device))
    out_mask = region & exceeds(change, threshold, measure)
    k = _key_view(key, out_mask.dim())
    if k is not None:
        out_mask = out_mask | (k & region)
    return _send(target, sent, change, out_mask, out_dtype, _check_tf32(tf32, out_dtype)), out_mask


# ----------------------------------------------------------------------------- boundaries
def sparsify(x: Tensor, sent: Tensor, threshold: float, key: Optional[Tensor],
             change_measure: Optional[Tensor] = None, tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Input sparsifier: send pixels of frame ``x`` that moved more than ``threshold`` from ``sent``.

    ``change_measure`` ([N,1,H,W] float, optional) replaces the per-pixel ``max_c |x - sent|`` as
    the quantity compared with the threshold (the noise-robust measures of ``deltaconv.sparsify``
    compute it); the values sent are always the exact ``x - sent`` (``tf32``, float32 only: rounded
    to TF32, what that lost pending, as in :func:`truncate`).
    """
    target = _target(x, sent)
    change = target - sent.to(target.dtype)
    measure = change.abs().amax(dim=1, keepdim=True) if change_measure is None else change_measure
    mask = measure > threshold
    k = _key_view(key, mask.dim())
    if k is not None:
        mask = mask | k
    return _send(target, sent, change, mask, x.dtype, _check_tf32(tf32, x.dtype)), mask


def densify(delta: Tensor, mask: Tensor, acc: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Output densifier: accumulate ``delta`` into ``acc`` and return a dense copy."""
    acc += _zero_inactive(delta, mask).to(acc.dtype)
    return acc.to(out_dtype, copy=True)


# ----------------------------------------------------------------------------- pointwise
def activation(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, fn: Callable[[Tensor], Tensor],
               threshold: float, key: Optional[Tensor], measure: str = "max",
               rows: Optional[RowList] = None, tf32: bool = False, write_out: bool = True) -> tuple[Tensor, Tensor]:
    """Pointwise non-linearity ``fn``: ``fn(acc + d) - sent`` on active pixels, then truncation.
    ``rows``: ignored (the CUDA backend lists the sent pixels there; here ``rows.filled`` stays false).
    ``tf32`` (float32 only): the changes sent rounded to TF32 (see :func:`truncate`). ``write_out``:
    ignored (the CUDA kernel may leave the changes unwritten; here they are always returned)."""
    acc += _zero_inactive(delta, mask).to(acc.dtype)
    return truncate(fn(acc), mask, sent, threshold, key, delta.dtype, measure, tf32)


def activation_values(x: Tensor, mask: Tensor, sent: Tensor, fn: Callable[[Tensor], Tensor], threshold: float,
                      key: Optional[Tensor], measure: str = "max", rows: Optional[RowList] = None,
                      tf32: bool = False, write_out: bool = True) -> tuple[Tensor, Tensor]:
    """Pointwise non-linearity ``fn`` of a recomputed input: ``x`` holds the layer's whole new input
    on the active pixels (a convolution in value mode recomputed it from its input's whole values, see
    :func:`conv2d`'s ``load_mask``), so there is no accumulator: ``fn(x) - sent`` on active pixels,
    then truncation. ``rows``, ``tf32`` and ``write_out``: as in :func:`activation`."""
    y = fn(x.to(torch.promote_types(x.dtype, torch.float32)))
    return truncate(y, mask, sent, threshold, key, x.dtype, measure, tf32)


def layer_norm(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, weight: Optional[Tensor],
               bias: Optional[Tensor], eps: float, threshold: float, key: Optional[Tensor], measure: str = "max",
               rows: Optional[RowList] = None, tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Layer norm of each pixel over its channels (dim 1; ConvNeXt's LayerNorm, ``F.layer_norm`` over
    the last dim of the channels-last view): ``layer_norm(acc + d) - sent`` on active pixels, then
    truncation. Computed in the accumulator's dtype with ``weight`` and ``bias`` (``[C]`` or
    ``None``) in it. ``rows``: ignored, as in :func:`activation`; ``tf32``: as there."""
    acc += _zero_inactive(delta, mask).to(acc.dtype)
    x = acc.movedim(1, -1)
    w = None if weight is None else weight.to(acc.dtype)
    b = None if bias is None else bias.to(acc.dtype)
    y = F.layer_norm(x, (x.shape[-1],), w, b, eps).movedim(-1, 1)
    return truncate(y, mask, sent, threshold, key, delta.dtype, measure, tf32)


def affine_channel(delta: Tensor, mask: Tensor, scale: Optional[Tensor], shift: Optional[Tensor],
                   key: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Per-channel ``y = scale * x + shift`` (BatchNorm in eval): scale the delta; add ``shift``
    once, on key frames. Computed in float32 (float64 for float64) with the scale and shift as
    given, rounded to the delta's dtype once, as a dense float16 BatchNorm rounds only its output."""
    shape = [1, -1] + [1] * (delta.dim() - 2)
    work = torch.promote_types(delta.dtype, torch.float32)
    out = _zero_inactive(delta, mask).to(work)
    if scale is not None:
        out = out * scale.view(shape).to(work)
    k = _key_view(key, delta.dim())
    if k is not None:
        mask = mask | k
        if shift is not None:
            out = out + shift.view(shape).to(work) * k.to(work)
    return out.to(delta.dtype), mask


def add(delta_a: Tensor, mask_a: Tensor, delta_b: Tensor, mask_b: Tensor,
        alpha: float = 1.0, rows: Optional[RowList] = None) -> tuple[Tensor, Tensor]:
    """``a + alpha * b`` of two changing tensors (broadcasting): linear, the union of masks.
    ``rows``: ignored, as in :func:`activation`."""
    out = _zero_inactive(delta_a, mask_a) + alpha * _zero_inactive(delta_b, mask_b)
    return out, mask_a | mask_b


def add_activation(delta_a: Tensor, mask_a: Tensor, delta_b: Tensor, mask_b: Tensor, alpha: float, acc: Tensor,
                   sent: Tensor, fn: Callable[[Tensor], Tensor], threshold: float, key: Optional[Tensor],
                   measure: str = "max", rows: Optional[RowList] = None, tf32: bool = False,
                   write_out: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """A residual add and the activation after it (``activation(add(a, b, alpha))``), the add's mask
    returned too: ``(out, out_mask, mask_a | mask_b)``. The CUDA backend runs it in one kernel.
    ``tf32`` and ``write_out``: as in :func:`activation`."""
    d, union = add(delta_a, mask_a, delta_b, mask_b, alpha)
    out, out_mask = activation(d, union, acc, sent, fn, threshold, key, measure, tf32=tf32)
    return out, out_mask, union


def add_activation_values(a: Tensor, mask_a: Tensor, b: Tensor, mask_b: Tensor, alpha: float, sent: Tensor,
                          fn: Callable[[Tensor], Tensor], threshold: float, key: Optional[Tensor], measure: str = "max",
                          rows: Optional[RowList] = None, tf32: bool = False,
                          write_out: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """A residual add and the activation after it in value mode: ``a`` and ``b`` hold the add's
    operands *whole* at every pixel (a convolution's kept output, ``DCConv2d.keeps_output``; a layer's
    sent values, ``Delta.whole``), so the add's new output on the active pixels ``mask_a | mask_b``
    is ``a + alpha * b`` as the dense add computes it, and :func:`activation_values` of it needs no
    accumulator. Returns ``(out, out_mask, mask_a | mask_b)`` as :func:`add_activation`. ``rows``,
    ``tf32`` and ``write_out``: as in :func:`activation`."""
    union = mask_a | mask_b
    out, out_mask = activation_values(a + alpha * b, union, sent, fn, threshold, key, measure, tf32=tf32)
    return out, out_mask, union


def add_values(a: Tensor, mask_a: Tensor, b: Tensor, mask_b: Tensor, alpha: float, out: Tensor,
               rows: Optional[RowList] = None) -> Tensor:
    """An add of two operands *whole* at every pixel (value mode, ``DCAdd.keeps_sum``): ``out``, the
    add's kept whole sum, takes ``a + alpha * b`` as the dense add computes it on the union of the
    masks and keeps its other pixels, in place. Returns the union, the add's output mask. ``rows``:
    ignored, as in :func:`activation`."""
    union = mask_a | mask_b
    out.copy_(torch.where(union, a + alpha * b, out))
    return union


def mul(delta_a: Tensor, mask_a: Tensor, acc_a: Tensor, delta_b: Tensor, mask_b: Tensor, acc_b: Tensor,
        sent: Tensor, threshold: float, key: Optional[Tensor], measure: str = "max",
        rows: Optional[RowList] = None, tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Product of two changing tensors (broadcasting, e.g. squeeze-excite): non-linear.
    ``rows``: ignored, as in :func:`activation`; ``tf32``: as there."""
    acc_a += _zero_inactive(delta_a, mask_a).to(acc_a.dtype)
    acc_b += _zero_inactive(delta_b, mask_b).to(acc_b.dtype)
    return _send_product(acc_a * acc_b, mask_a, mask_b, sent, threshold, key, delta_a.dtype, measure, tf32)


def mul_values(a: Tensor, mask_a: Tensor, b: Tensor, mask_b: Tensor, sent: Tensor, threshold: float,
               key: Optional[Tensor], measure: str = "max", rows: Optional[RowList] = None,
               tf32: bool = False) -> tuple[Tensor, Tensor]:
    """A product in value mode (``DCMul.takes_whole``): ``a`` and ``b`` hold the operands *whole* at
    every pixel (layers' sent values, ``Delta.whole``; one may be ``[N, C, 1, 1]``, squeeze-excite), so
    the new product on the region ``mask_a | mask_b`` is ``a * b`` as the dense product computes it, no
    accumulator; then truncation against ``sent`` as in :func:`mul`. ``rows``: ignored, as in
    :func:`activation`; ``tf32``: as there."""
    work = _work_dtype(sent)
    return _send_product(a.to(work) * b.to(work), mask_a, mask_b, sent, threshold, key, a.dtype, measure, tf32)


def _send_product(y: Tensor, mask_a: Tensor, mask_b: Tensor, sent: Tensor, threshold: float, key: Optional[Tensor],
                  dtype: torch.dtype, measure: str, tf32: bool) -> tuple[Tensor, Tensor]:
    """:func:`truncate` of a product's new value ``y`` on the region ``mask_a | mask_b`` (of :func:`mul`
    and :func:`mul_values`; a broadcast operand's ``[N, 1, 1, 1]`` mask covers its stream's every pixel)."""
    region = (mask_a | mask_b).expand(list(y.shape[:1]) + [1] + list(y.shape[2:]))
    return truncate(y, region, sent, threshold, key, dtype, measure, tf32)


def concatenate(deltas: Sequence[Tensor], masks: Sequence[Tensor], dim: int) -> tuple[Tensor, Tensor]:
    """``torch.cat`` along ``dim``: along channels the masks are OR-ed, along other dims joined."""
    values = [_zero_inactive(d, m) for d, m in zip(deltas, masks)]
    out = torch.cat(values, dim=dim)
    ndim = out.dim()
    if dim % ndim == 1:
        mask = masks[0]
        for m in masks[1:]:
            mask = mask | m
    else:
        mask = torch.cat(list(masks), dim=dim)
    return out, mask


def interleave_channels(delta_a: Tensor, mask_a: Tensor, delta_b: Tensor, mask_b: Tensor,
                        parts: int) -> tuple[list[Tensor], Tensor]:
    """The channels of two 4-D deltas of one shape interleaved (``a0, b0, a1, b1, ...``: the channel
    shuffle in two groups of their concatenation, ShuffleNet V2's block tail), cut into ``parts``
    chunks along the channels as ``.chunk`` cuts (the next block's split); the masks OR-ed."""
    out, mask = concatenate([delta_a, delta_b], [mask_a, mask_b], 1)
    shuffled = torch.channel_shuffle(out, 2)
    return list(shuffled.chunk(parts, 1)), mask


# ----------------------------------------------------------------------------- convolution
def conv2d(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], stride, padding, dilation,
           groups: int, key: Optional[Tensor], padding_mode: str = "zeros",
           counters: Optional[Tensor] = None, input_tf32: bool = False, load_mask: Optional[Tensor] = None,
           bias_key: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Convolution (any kernel, stride, padding, dilation, groups): ``W * d``; the mask is dilated by
    the receptive field; the bias is added once, on key frames. ``counters`` (the CUDA kernels' work
    list counters) and ``input_tf32`` (the CUDA kernels then skip rounding the deltas to TF32) are
    not used here: PyTorch's convolution reads its input as cuDNN does.

    Value mode (a *recomputing* convolution, :class:`~deltaconv.modules.DCConv2d` ``recomputes``):
    ``delta`` holds the input's whole values and ``load_mask`` (``[N, 1, H, W]`` bool, all set)
    says which input pixels are read (default ``mask``); ``bias_key`` (``[N]`` bool, all set) says
    which streams' outputs get the bias (default ``key``). The output pixels still follow ``mask``
    and ``key``: the output then holds the layer's whole new values on them.

    The products are summed and the bias added in float32 (float64 for float64), then rounded to the
    input's dtype once, as a dense convolution with its bias (and the CUDA kernels' epilogues) round."""
    x = _zero_inactive(delta, mask if load_mask is None else load_mask)
    m = mask.to(torch.float32)
    if padding_mode != "zeros":
        pad = _reversed_padding(padding, weight.shape[-2:], dilation)
        x = F.pad(x, pad, mode=padding_mode)
        m = F.pad(m, pad, mode=padding_mode)
        padding = 0
    out = F.conv2d(x.to(_work_dtype(delta)), _target(weight, delta), None, stride, padding, dilation, groups)
    ones = torch.ones((1, 1) + tuple(weight.shape[-2:]), device=delta.device)
    out_mask = F.conv2d(m, ones, None, stride, padding, dilation) > 0
    out, out_mask = _add_bias_on_key(out, out_mask, _target(bias, delta), key, bias_key)
    return out.to(delta.dtype), out_mask


def keep_output(out: Tensor, delta: Tensor, mask: Tensor) -> Tensor:
    """A convolution's kept whole output (``DCConv2d.keeps_output``): ``out`` ``[N, C, H, W]`` takes the
    values of ``delta`` (the convolution's whole new output, valid on ``mask``) on the pixels of
    ``mask`` and keeps its own elsewhere, in place; returns ``out``."""
    return out.copy_(torch.where(mask, delta, out))


def conv1x1_into(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], stride, padding,
                 key: Optional[Tensor], out: Tensor, counters: Optional[Tensor] = None, input_tf32: bool = False,
                 load_mask: Optional[Tensor] = None, bias_key: Optional[Tensor] = None) -> Tensor:
    """:func:`conv2d` of a 1x1 kernel (``weight`` ``[Cout, Cin, 1, 1]``, one group, zero padding, any
    stride) whose output goes into ``out`` (``[N, Cout, Ho, Wo]``) on the output mask, every other
    pixel of ``out`` kept (:func:`keep_output`): a convolution keeping its whole output that runs on
    no row list (``DCConv2d.keeps_output``; a ResNet block's downsampling identity, on key frames any
    of them). ``counters`` and ``input_tf32`` as in :func:`conv2d`. Returns the output mask
    ``[N, 1, Ho, Wo]``."""
    v, m = conv2d(delta, mask, weight, bias, stride, padding, 1, 1, key, load_mask=load_mask, bias_key=bias_key)
    keep_output(out, v, m)
    return m


def _reversed_padding(padding, kernel_size, dilation) -> list[int]:
    """F.pad amounts (left, right, top, bottom) for a conv's ``padding`` (int, tuple or 'same')."""
    if isinstance(padding, str):
        if padding == "valid":
            return [0, 0, 0, 0]
        dil = (dilation, dilation) if isinstance(dilation, int) else dilation
        total = [d * (k - 1) for d, k in zip(dil, kernel_size)]
        return [total[1] // 2, total[1] - total[1] // 2, total[0] // 2, total[0] - total[0] // 2]
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    return [pw, pw, ph, ph]


def _add_bias_on_key(out: Tensor, out_mask: Tensor, bias: Optional[Tensor], key: Optional[Tensor],
                     bias_key: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Key streams' outputs all active; the bias added to the streams of ``bias_key`` (default ``key``)."""
    k = _key_view(key, out.dim())
    if k is not None:
        out_mask = out_mask | k
    kb = k if bias_key is None else _key_view(bias_key, out.dim())
    if kb is not None and bias is not None:
        shape = [1, -1] + [1] * (out.dim() - 2)
        out = out + bias.view(shape).to(out.dtype) * kb.to(out.dtype)
    return out, out_mask


def conv_transpose2d(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], stride, padding,
                     output_padding, groups: int, dilation, key: Optional[Tensor],
                     counters: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Transposed convolution: linear; the mask is scattered through the same footprint. ``counters``
    is not used here (see :func:`conv2d`)."""
    x = _zero_inactive(delta, mask)
    out = F.conv_transpose2d(x.to(_work_dtype(delta)), _target(weight, delta), None, stride, padding, output_padding,
                             groups, dilation)
    ones = torch.ones((1, 1) + tuple(weight.shape[-2:]), device=delta.device)
    out_mask = F.conv_transpose2d(mask.to(torch.float32), ones, None, stride, padding, output_padding, 1,
                                  dilation) > 0
    out, out_mask = _add_bias_on_key(out, out_mask, _target(bias, delta), key)
    return out.to(delta.dtype), out_mask


def linear(delta: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor],
           key: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``F.linear`` over the last dim. For rank > 2 the last dim is a pixel dim, so every output
    along it is active when any input along it is. Summed and biased in float32 (float64), rounded
    once, as :func:`conv2d`."""
    out = F.linear(_zero_inactive(delta, mask).to(_work_dtype(delta)), _target(weight, delta))
    if delta.dim() > 2:
        mask = mask.any(dim=-1, keepdim=True).expand(list(mask.shape[:-1]) + [out.shape[-1]])
    k = _key_view(key, out.dim())
    if k is not None:
        mask = mask | k
        if bias is not None:
            out = out + _target(bias, delta) * k.to(out.dtype)
    return out.to(delta.dtype), mask


# ----------------------------------------------------------------------------- pooling, resizing
def linear_spatial(delta: Tensor, mask: Tensor, op: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    """A linear, bias-free spatial op with non-negative weights (average pooling, adaptive average
    pooling, nearest/bilinear interpolation): apply ``op`` to the delta and to the mask."""
    return op(_zero_inactive(delta, mask)), _footprint(mask, op)


def pool_nonlinear(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, op: Callable[[Tensor], Tensor],
                   threshold: float, key: Optional[Tensor], measure: str = "max",
                   tf32: bool = False) -> tuple[Tensor, Tensor]:
    """A non-linear spatial op (max pooling): ``op`` on the accumulated input over the footprint of
    the active pixels, then truncation (``tf32``: as in :func:`truncate`)."""
    acc += _zero_inactive(delta, mask).to(acc.dtype)
    region = _footprint(mask, op)
    return truncate(op(acc), region, sent, threshold, key, delta.dtype, measure, tf32)


def avg_pool2d(delta: Tensor, mask: Tensor, kernel_size, stride, padding, ceil_mode: bool,
               count_include_pad: bool, divisor_override: Optional[int]) -> tuple[Tensor, Tensor]:
    """Average pooling (``F.avg_pool2d`` arguments): linear."""
    def op(t):
        return F.avg_pool2d(t, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return linear_spatial(delta, mask, op)


def adaptive_avg_pool2d(delta: Tensor, mask: Tensor, output_size) -> tuple[Tensor, Tensor]:
    """Adaptive average pooling (global pooling included): linear."""
    return linear_spatial(delta, mask, lambda t: F.adaptive_avg_pool2d(t, output_size))


def interpolate(delta: Tensor, mask: Tensor, size, scale_factor, mode: str,
                align_corners: Optional[bool]) -> tuple[Tensor, Tensor]:
    """``F.interpolate``: linear. In a mode with non-negative weights (nearest, nearest-exact,
    bilinear, area) the mask follows the same resampling. Bicubic weights can be negative (the mask's
    own resampling could cancel), so its footprint is the mask dilated by one pixel and resampled
    bilinearly: an output's 4x4 taps are the 2x2 bilinear ones around its source point and their
    neighbours (clamped at the borders alike). That is exact where the source point falls between
    input pixels (any scale 2 without ``align_corners``) and a superset where it falls on one (the
    bicubic weights of the neighbours are then 0)."""
    def op(t: Tensor) -> Tensor:
        return _interpolate(t, size, scale_factor, mode, align_corners)
    if mode != "bicubic":
        return linear_spatial(delta, mask, op)
    dilated = F.max_pool2d(mask.to(torch.float32), 3, 1, 1)
    return op(_zero_inactive(delta, mask)), _interpolate(dilated, size, scale_factor, "bilinear", align_corners) > 0


def _interpolate(t: Tensor, size, scale_factor, mode: str, align_corners: Optional[bool]) -> Tensor:
    """``F.interpolate`` with ``align_corners`` passed only to the modes that take it."""
    ac = align_corners if mode in ("linear", "bilinear", "bicubic", "trilinear") else None
    return F.interpolate(t, size=size, scale_factor=scale_factor, mode=mode, align_corners=ac)


def resample(x: Tensor, size, scale_factor, mode: str, align_corners: Optional[bool]) -> Tensor:
    """``F.interpolate`` of a dense map (the output densifier's, where a model ends in an
    upsampling), into a contiguous (NCHW) tensor: PyTorch resamples NCHW several times faster than
    channels_last."""
    return _interpolate(x.contiguous(), size, scale_factor, mode, align_corners)


def _max_pool(kernel_size, stride, padding, dilation, ceil_mode: bool) -> Callable[[Tensor], Tensor]:
    """``F.max_pool2d`` with these arguments, as a function of the map alone (the op of both max poolings)."""
    def op(t: Tensor) -> Tensor:
        return F.max_pool2d(t, kernel_size, stride, padding, dilation, ceil_mode)
    return op


def max_pool2d(delta: Tensor, mask: Tensor, acc: Tensor, sent: Tensor, kernel_size, stride, padding, dilation,
               ceil_mode: bool, threshold: float, key: Optional[Tensor],
               measure: str = "max", tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Max pooling (``F.max_pool2d`` arguments): non-linear, over the footprint of active pixels.
    ``tf32``: as in :func:`activation`."""
    op = _max_pool(kernel_size, stride, padding, dilation, ceil_mode)
    return pool_nonlinear(delta, mask, acc, sent, op, threshold, key, measure, tf32)


def max_pool2d_values(x: Tensor, mask: Tensor, sent: Tensor, kernel_size, stride, padding, dilation,
                      ceil_mode: bool, threshold: float, key: Optional[Tensor],
                      measure: str = "max", tf32: bool = False) -> tuple[Tensor, Tensor]:
    """Max pooling in value mode: ``x`` holds the input's whole values at every pixel (the activation
    before it keeps them, ``Delta.whole``), so there is no accumulator: the maximum of ``x`` over the
    footprint of the active pixels ``mask``, then truncation. ``tf32``: as in :func:`activation`."""
    op = _max_pool(kernel_size, stride, padding, dilation, ceil_mode)
    y = op(x.to(torch.promote_types(x.dtype, torch.float32)))
    return truncate(y, _footprint(mask, op), sent, threshold, key, x.dtype, measure, tf32)


# ----------------------------------------------------------------------------- statistics
def count_active(masks: Sequence[Tensor], stats: Sequence[Tensor]) -> None:
    """Per-layer statistics: for each mask, its ``stats`` (float64 ``[4]``) gets ``[0] = active
    pixels``, ``[1] += [0]``; ``[2:]`` is the CUDA kernel's scratch and stays zero."""
    if len(masks) != len(stats):
        raise ValueError(f"count_active: masks and stats must have the same length, got {len(masks)} and "
                         f"{len(stats)}")
    for mask, st in zip(masks, stats):
        st[0] = mask.sum(dtype=torch.float64)
        st[1] += st[0]
