"""A BatchNorm folded into the convolution before it, and the rounding of the folded weights.

In float16 and bfloat16 the folded weights ``weight * scale`` must be rounded, and how matters.
Where a convolution's input has a large mean (a ReLU6 output, say), the error of each filter's
rounded taps adds up to an offset per output channel that the BatchNorm's shift was meant to
cancel. Rounding every tap to its nearest value leaves that sum error to chance: in MobileNetV2
(ImageNet weights) the first depthwise convolution alone moves the logits by 0.3 % to 1.8 %
depending on which way its 288 weights happen to round, and its folded weights rounded to nearest
give 0.82 %, about three times what rounding all of the unfolded model's weights costs (0.29 %).
:func:`round_keeping_sums` instead picks, for each tap, one of its two neighbours in the
low-precision type so that the sum of each filter's taps stays close to the exact sum (that layer:
0.13 %); every weight is still within one unit in the last place
(``benchmarks/experiments/fold_rounding.py``, ``fp16_floor.py``; results in
``benchmarks/results/fp16_floor.txt``).
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.nn as nn

from ..backends.reference import round_to_tf32


def bn_scale_shift(bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """BatchNorm in eval as ``y = scale * x + shift`` (float32, or float64 for a float64 BN)."""
    dtype = torch.promote_types(bn.running_var.dtype, torch.float32)
    scale = torch.rsqrt(bn.running_var.to(dtype) + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.to(dtype)
    shift = -bn.running_mean.to(dtype) * scale
    if bn.bias is not None:
        shift = shift + bn.bias.to(dtype)
    return scale, shift


def _coarser(dtype: torch.dtype, than: torch.dtype) -> bool:
    """Whether floating-point ``dtype`` has fewer mantissa bits than ``than``."""
    return torch.finfo(dtype).eps > torch.finfo(than).eps


def round_keeping_sums(weight: torch.Tensor, dtype: torch.dtype, max_flips: Optional[int] = None) -> torch.Tensor:
    """``weight`` ``[C_out, C_in / groups, KH, KW]`` rounded to the coarser ``dtype``, keeping each
    filter's sum over its taps (``weight[o, c].sum()``, the response to a constant input) close.

    Every value becomes one of its two neighbours in ``dtype``: the nearest, except where taking the
    other one brings its filter's sum closer to the exact sum; the taps to flip are chosen greedily,
    one per filter and step, up to ``max_flips`` steps (default: the taps per filter). 1x1 kernels,
    whose filters have one tap, round to nearest. Returns a ``dtype`` tensor on ``weight``'s device.
    """
    nearest = weight.to(dtype)
    taps = weight.shape[2] * weight.shape[3] if weight.dim() == 4 else 1
    if taps == 1 or weight.numel() == 0:
        return nearest
    exact = weight.reshape(weight.shape[0], weight.shape[1], taps).to(torch.float64)
    lo = nearest.reshape(exact.shape)
    # the other neighbour: one step from the nearest value towards (and past) the exact one
    toward = torch.where(exact > lo.to(torch.float64), float("inf"), float("-inf")).to(dtype)
    other = torch.where(exact == lo.to(torch.float64), lo, torch.nextafter(lo, toward)).to(torch.float64)
    lo = lo.to(torch.float64)
    flip = other - lo  # what taking the other neighbour adds to the filter's sum
    flipped = torch.zeros_like(exact, dtype=torch.bool)
    error = lo.sum(-1) - exact.sum(-1)  # [C_out, C_in / groups]
    # no early exit while a CUDA graph records (reading ``any()`` would synchronise)
    may_stop = not (weight.is_cuda and torch.cuda.is_current_stream_capturing())
    for _ in range(taps if max_flips is None else max_flips):
        change = torch.where(flipped, -flip, flip)
        best, tap = (error.unsqueeze(-1) + change).abs().min(-1)
        better = best < error.abs()
        if may_stop and not bool(better.any()):
            break
        chosen = torch.zeros_like(flipped).scatter_(-1, tap.unsqueeze(-1), better.unsqueeze(-1))
        flipped ^= chosen
        error = error + (change * chosen).sum(-1)
    return torch.where(flipped, other, lo).reshape(weight.shape).to(dtype)


def fold_sources(weight, bias, bn) -> tuple:
    """The tensors a fold reads: the weight, the bias and the BatchNorm's parameters and statistics."""
    return (weight, bias) + ((bn.weight, bn.bias, bn.running_mean, bn.running_var) if bn is not None else ())


def tensor_versions(*tensors) -> tuple:
    """What identifies each tensor's values: identity, in-place version, device and dtype."""
    return tuple((id(t), t._version, t.device, t.dtype) if t is not None else None for t in tensors)


def block_diagonal(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """A grouped conv weight ``[C_out, C_in / groups, KH, KW]`` as the one-group weight
    ``[C_out, C_in, KH, KW]`` of the same convolution: each group's filters in its own block of
    input channels, zeros elsewhere."""
    if groups == 1:
        return weight
    c_out, cin_g = weight.shape[:2]
    out = weight.new_zeros((c_out, cin_g * groups) + tuple(weight.shape[2:]))
    per_group = c_out // groups
    for g in range(groups):
        out[g * per_group:(g + 1) * per_group, g * cin_g:(g + 1) * cin_g] = weight[g * per_group:(g + 1) * per_group]
    return out


class FoldedWeights:
    """A convolution's weight and bias with an optional BatchNorm folded in, recomputed when any
    source changes (in-place updates such as ``load_state_dict`` bump the tensors' versions); with a
    ``layout``, the weight in that memory format (one copy if needed, kept until a source changes).

    The fold is computed in float32 (float64 for float64 sources) and rounded once to the weight's
    dtype, by :func:`round_keeping_sums` where that is coarser. A fold made before a cast to a
    coarser dtype can stand for the cast sources (:meth:`seed`): a float32 model converted and then
    cast to float16 rounds the exact fold, not a fold of weights that were rounded already.
    """

    def __init__(self) -> None:
        self._key = None
        self._value = None
        self._seed = None  # (sources, their versions, folded weight, folded bias)

    @staticmethod
    def exact(weight, bias, bn, out_dim: int):
        """``(weight * scale, bias * scale + shift)`` in float32 (or float64), not rounded; the
        sources as they are without a BatchNorm."""
        if bn is None:
            return weight, bias
        with torch.no_grad():
            scale, shift = bn_scale_shift(bn)
            shape = [1] * weight.dim()
            shape[out_dim] = -1
            w = weight.to(scale.dtype) * scale.view(shape)
            b = shift if bias is None else bias.to(scale.dtype) * scale + shift
            return w, b

    @staticmethod
    def rounded(weight: torch.Tensor, bias: Optional[torch.Tensor], dtype: torch.dtype, device=None):
        """An exact fold on ``device`` in ``dtype``: the weight by :func:`round_keeping_sums` where
        ``dtype`` is coarser, the bias to nearest."""
        with torch.no_grad():
            weight = weight.to(device) if device is not None else weight
            w = round_keeping_sums(weight, dtype) if _coarser(dtype, weight.dtype) else weight.to(dtype)
            return w, None if bias is None else bias.to(w.device, dtype)

    def seed(self, sources: tuple, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        """Use ``(weight, bias)`` as the fold of ``sources`` (see :func:`fold_sources`) while none of
        them changes."""
        self._seed = (sources, tensor_versions(*sources), weight, bias)

    def before_cast(self, weight, bias, bn, out_dim: int) -> tuple:
        """What :meth:`after_cast` needs: the sources as they are now (detached: a cast replaces
        their data) and their fold, not rounded (or the seed while it stands for them)."""
        sources = tuple(None if t is None else t.detach() for t in fold_sources(weight, bias, bn))
        return sources, self.folded(weight, bias, bn, out_dim, exact=True)

    def after_cast(self, before: tuple, weight, bias, bn) -> None:
        """Seed with the fold of :meth:`before_cast` rounded to the new weight's dtype on its device,
        if every source is now the old one cast (not so after ``to_empty``, for instance; meta
        tensors are never compared) and that fold is not coarser than the new weight (a cast up
        folds the new sources instead)."""
        old, (w, b) = before
        new = fold_sources(weight, bias, bn)
        if _coarser(w.dtype, weight.dtype):
            return
        for o, n in zip(old, new):
            if (o is None) != (n is None):
                return
            if o is not None and (o.is_meta or n.is_meta or not torch.equal(o.to(n.device, n.dtype), n)):
                return
        self.seed(new, *self.rounded(w, b, weight.dtype, weight.device))

    def folded(self, weight, bias, bn, out_dim: int, exact: bool = False):
        """The seed if it is still the fold of these sources, else their fold rounded to the weight's
        dtype (``exact``: not rounded)."""
        if self._seed is not None and self._seed[1] == tensor_versions(*fold_sources(weight, bias, bn)):
            return self._seed[2:]
        if bn is None:
            return weight, bias
        w, b = self.exact(weight, bias, bn, out_dim)
        return (w, b) if exact else self.rounded(w, b, weight.dtype)

    def get(self, weight, bias, bn, out_dim: int, layout: Optional[torch.memory_format] = None,
            expand_groups: int = 1, out_channels: Optional[int] = None, tf32: bool = False):
        """The folded ``(weight, bias)``, cached; the weight made block-diagonal over
        ``expand_groups`` groups (:func:`block_diagonal`) when > 1, both padded with zero filters to
        ``out_channels`` (dim 0) when that is more, the weight in ``layout`` if given and, with
        ``tf32`` (a float32 weight that the tensor cores read in TF32), rounded by
        :func:`round_to_tf32`."""
        versions = tensor_versions(*fold_sources(weight, bias, bn))
        key = versions + (layout, expand_groups, out_channels, tf32)
        if key != self._key:
            if self._seed is not None and self._seed[1] != versions:
                self._seed = None  # a source changed: the seed is no longer their fold
            w, b = self.folded(weight, bias, bn, out_dim)
            w = block_diagonal(w, expand_groups)
            extra = 0 if out_channels is None else out_channels - w.shape[0]
            if extra > 0:
                w = torch.cat([w, w.new_zeros((extra,) + tuple(w.shape[1:]))])
                b = None if b is None else torch.cat([b, b.new_zeros(extra)])
            if layout is not None:
                w = w.contiguous(memory_format=layout)
            if tf32:
                w = round_to_tf32(w)
            self._key, self._value = key, (w, b)
        return self._value

    def __deepcopy__(self, memo) -> "FoldedWeights":
        """A copy for the copied sources: a seed still valid carries over (the copy's tensors have
        new identities), the cached value is recomputed."""
        new = FoldedWeights()
        if self._seed is not None and tensor_versions(*self._seed[0]) == self._seed[1]:
            srcs, _, w, b = copy.deepcopy(self._seed, memo)
            new.seed(srcs, w, b)
        return new
