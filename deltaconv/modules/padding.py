"""Spatial padding of a delta, in every mode of ``F.pad``: the delta rule of padding layers
(``nn.ReflectionPad2d``, ``nn.ReplicationPad2d``, ``nn.CircularPad2d``, ``nn.ZeroPad2d``,
``nn.ConstantPad2d`` of 0, ``F.pad`` of a 4-D map's last two dims) and of a convolution whose
``padding_mode`` is not ``"zeros"`` (:class:`~deltaconv.modules.DCConv2d` pads its input so, then
convolves without padding, as ``nn.Conv2d`` itself does).

The rule: each output pixel of a reflect, replicate or circular pad is a copy of one input pixel
(all its channels), so its change and its mask flag are that pixel's; a constant pad of 0 adds
pixels that never change (mask off). Padding is linear, so the whole values (``Delta.whole``) pad the
same way. Values at inactive pixels stay as undefined as they were (copies of inactive pixels).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..delta import Delta
from .base import DCModule

__all__ = ["DCPad2d", "pad_delta", "pad_map", "PAD_MODES", "conv_input_padding"]

#: the modes of ``F.pad`` a delta pads in (``"constant"`` with the value 0 only)
PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad_map(t: torch.Tensor, pad: tuple, mode: str) -> torch.Tensor:
    """``F.pad(t, pad, mode)`` of a 4-D map (0 for ``"constant"``; a bool mask too), in ``t``'s memory
    format: the interior copied once into the output, then the borders filled from it (width first, then
    height over the padded width), so a channels-last map costs one pass; on the GPU ``F.pad``'s reflect
    and replicate kernels copy a channels-last map to channels-first and back (three passes). Negative
    (cropping) constant pads go to ``F.pad``."""
    left, right = pad[0], pad[1]
    top, bottom = (pad[2], pad[3]) if len(pad) == 4 else (0, 0)
    if min(left, right, top, bottom) < 0:
        return F.pad(t, pad)
    n, c, h, w = t.shape
    fmt = torch.channels_last if t.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    out = torch.empty((n, c, h + top + bottom, w + left + right), dtype=t.dtype, device=t.device, memory_format=fmt)
    out[:, :, top:top + h, left:left + w].copy_(t)
    _fill_borders(out.narrow(2, top, h), 3, left, right, w, mode)
    _fill_borders(out, 2, top, bottom, h, mode)
    return out


def _fill_borders(out: torch.Tensor, dim: int, before: int, after: int, size: int, mode: str) -> None:
    """Fill the ``before`` and ``after`` border slices of ``out`` along ``dim`` around its interior of
    ``size`` (from index ``before``) as ``F.pad``'s ``mode`` does, in place."""
    end = before + size
    # per side: where it starts, its width, and where its source starts when reflected (read backwards),
    # replicated (one edge slice) or wrapped (circular)
    for start, count, reflected, edge, wrapped in ((0, before, before + 1, before, size),
                                                   (end, after, end - 1 - after, end - 1, before)):
        if not count:
            continue
        border = out.narrow(dim, start, count)
        if mode == "constant":
            border.zero_()
        elif mode == "reflect":
            border.copy_(out.narrow(dim, reflected, count).flip(dim))
        elif mode == "replicate":
            border.copy_(out.narrow(dim, edge, 1).expand_as(border))
        else:
            border.copy_(out.narrow(dim, wrapped, count))


def pad_delta(d: Delta, pad: Sequence[int], mode: str = "constant", *, values: bool = True,
              whole: bool = True) -> Delta:
    """``d`` (a 4-D delta ``[N, C, H, W]``) padded by ``pad`` (``F.pad``'s ``(left, right[, top, bottom])``,
    in pixels; 4 of them in the modes other than constant) in ``mode`` (:data:`PAD_MODES`; ``"constant"``
    pads zeros and may crop with negative pads). ``values`` false: the output's changes are left undefined
    (of the padded shape); ``whole`` false: it has no whole values. Both where the reader does not take
    them: a convolution in value mode reads the whole values only, one in delta mode the changes only.
    Row lists do not carry over (the pixels move); the TF32, recomputed and unwritten flags do."""
    pad = tuple(int(p) for p in pad)
    if mode not in PAD_MODES:
        raise ValueError(f"pad_delta: mode must be one of {PAD_MODES}, got {mode!r}")
    if d.value.dim() != 4 or len(pad) not in (2, 4):
        raise ValueError(f"pad_delta: pads the last two dims of a 4-D delta; got a {d.value.dim()}-D delta "
                         f"and pad {pad!r}")
    mask = pad_map(d.mask, pad, mode)  # a constant pad adds inactive pixels, the other modes copy flags
    if values and not d.unwritten:
        value = pad_map(d.value, pad, mode)
    else:
        v = d.value
        value = torch.empty(tuple(v.shape[:2]) + tuple(mask.shape[2:]), dtype=v.dtype, device=v.device,
                            memory_format=torch.channels_last)
    kept = pad_map(d.whole, pad, mode) if whole and d.whole is not None else None
    return Delta(value, mask, None, tf32=d.tf32, whole=kept, recomputed=d.recomputed, unwritten=d.unwritten)


def conv_input_padding(padding, padding_mode: str, kernel_size: tuple, dilation: tuple) -> Optional[tuple]:
    """The ``F.pad`` tuple ``(left, right, top, bottom)`` a convolution of ``padding`` (pixels per side, or
    ``"same"`` / ``"valid"``) pads its input by in ``padding_mode`` (``nn.Conv2d``'s
    ``_reversed_padding_repeated_twice``: ``"same"`` puts the odd pixel on the right and the bottom);
    ``None`` for ``"zeros"`` (the convolution pads itself)."""
    if padding_mode == "zeros":
        return None
    if padding_mode not in ("reflect", "replicate", "circular"):
        raise ValueError(f"DCConv2d: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', "
                         f"got {padding_mode!r}")
    if padding == "valid":
        return (0, 0, 0, 0)
    pads = []
    for i in (1, 0):  # width first, as F.pad takes it
        if padding == "same":
            total = dilation[i] * (kernel_size[i] - 1)
            pads += [total // 2, total - total // 2]
        else:
            pads += [padding[i], padding[i]]
    return tuple(pads)


class DCPad2d(DCModule):
    """Spatial padding of a 4-D map (``pad``: ``F.pad``'s ``(left, right[, top, bottom])``, all four in the
    modes other than constant) in ``mode``
    (:data:`PAD_MODES`, constant 0): data movement, stateless (:func:`pad_delta`)."""

    kind = "pad"

    def __init__(self, pad: Sequence[int], mode: str = "constant") -> None:
        super().__init__()
        if mode not in PAD_MODES:
            raise ValueError(f"DCPad2d: mode must be one of {PAD_MODES}, got {mode!r}")
        pad = tuple(pad)
        if len(pad) not in (2, 4) or not all(isinstance(p, int) for p in pad):
            raise ValueError(f"DCPad2d: pad must be 2 or 4 ints (left, right[, top, bottom]), got {pad!r}")
        if mode != "constant" and min(pad) < 0:
            raise ValueError(f"DCPad2d: pad must be >= 0 in mode {mode!r}, got {pad!r}")
        if mode != "constant" and len(pad) != 4:  # as F.pad of a 4-D map
            raise ValueError(f"DCPad2d: pad must be 4 ints (left, right, top, bottom) in mode {mode!r}, got {pad!r}")
        self.pad, self.mode = pad, mode

    #: the padding modules and their mode (``nn.ConstantPad2d`` only with the value 0)
    MODULE_MODES = {nn.ReflectionPad2d: "reflect", nn.ReplicationPad2d: "replicate",
                    nn.CircularPad2d: "circular", nn.ZeroPad2d: "constant", nn.ConstantPad2d: "constant"}

    @classmethod
    def from_dense(cls, module: nn.Module) -> Optional["DCPad2d"]:
        """Build from a dense padding module (:attr:`MODULE_MODES`); ``None`` for a constant pad of a
        value other than 0 (its pixels would not be changes)."""
        if getattr(module, "value", 0) != 0:
            return None
        mode = next(m for t, m in cls.MODULE_MODES.items() if isinstance(module, t))
        return cls(tuple(module.padding), mode)

    def forward(self, x: Delta) -> Delta:
        return self.observe(pad_delta(x, self.pad, self.mode))

    def extra_repr(self) -> str:
        return f"{self.pad}, mode={self.mode!r}, " + super().extra_repr()
