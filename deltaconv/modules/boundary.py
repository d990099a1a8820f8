"""Where dense tensors enter and leave a converted model: the sparsifier, the densifier, and the
dense resampling after a densifier where a model ends in an upsampling."""
from __future__ import annotations

import torch

from ..delta import Delta
from .base import DCModule
from .linear import sends_tf32


class DCSparsify(DCModule):
    """Input sparsifier: turns a dense frame into a delta against what was sent before.

    A pixel is sent when its change exceeds ``threshold`` (by default ``max_c |x - sent|``; a
    ``change_detector`` from :mod:`deltaconv.sparsify` may replace that measure). Values sent are
    exact (float32 on a GPU with TF32 convolutions: rounded to TF32, :func:`sends_tf32`); what is not
    sent stays pending in ``sent`` and goes out once it crosses the threshold. State: ``sent`` (the
    frame's dtype and shape).
    """

    kind = "sparsify"
    truncates = True
    #: set by :func:`~deltaconv.convert` where a layer reads the frame's whole values (a stem that
    #: recomputes, through a model file's input affine too): those are then the frame's own values on
    #: the pixels sent (``sent`` elsewhere) instead of ``sent``, which can differ from them by the
    #: rounding of a change to the frame's dtype (``x - sent`` may need more bits than float16 holds;
    #: that residual stays pending for the layers reading changes). In float16 the residuals made the
    #: stem read values an ulp off the frame's at moving pixels, frame after frame
    #: (``benchmarks/results/stem_value_mode.txt``).
    whole_from_frame = False

    def __init__(self, threshold: float = 0.0, change_detector=None) -> None:
        super().__init__()
        self.threshold = float(threshold)
        self.change_detector = change_detector

    def forward(self, x: torch.Tensor) -> Delta:
        sent = self.state("sent", x.shape, x.device, x.dtype, sent=True)
        measure = None
        if self.change_detector is not None and self.key is None:
            measure = self.change_detector(x.float() - sent.float())
        tf32 = sends_tf32(x)
        value, mask = self.ops.sparsify(x, sent, self.threshold, self.key, measure, tf32=tf32)
        whole = torch.where(mask, x, sent) if self.whole_from_frame else sent
        return self.observe(Delta(value, mask, tf32=tf32, whole=whole))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return 0.0

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", change_detector={self.change_detector!r}" if self.change_detector else "")


class DCDensify(DCModule):
    """Output densifier: accumulates deltas and returns the dense output. State: ``acc``."""

    kind = "densify"
    #: set by :func:`~deltaconv.convert` at the end of a whole head (:attr:`DCAdaptiveAvgPool2d.takes_whole`):
    #: the output is the whole values the layer before gives (a copy), with no accumulator
    takes_whole = False

    def forward(self, delta: Delta) -> torch.Tensor:
        if self.takes_whole and delta.whole is not None:
            return delta.whole.clone()
        acc = self.state("acc", delta.shape, delta.device, delta.dtype)
        return self.ops.densify(delta.value, delta.mask, acc, delta.dtype)


class DCResample(DCModule):
    """A model's final upsampling (``F.interpolate``, ``nn.Upsample``) run on the dense output, after
    the densifier (``convert(fuse=True)``): it reads the smaller map and writes the output once, as
    the densifier would have; the output is contiguous (NCHW). Stateless; ``size`` may also arrive
    per call."""

    kind = "resample"

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None) -> None:
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    @classmethod
    def from_upsample(cls, up) -> "DCResample":
        """The dense counterpart of a :class:`~deltaconv.modules.DCUpsample`."""
        return cls(up.size, up.scale_factor, up.mode, up.align_corners)

    def forward(self, x: torch.Tensor, size=None, scale_factor=None) -> torch.Tensor:
        size = self.size if size is None else size
        scale = self.scale_factor if scale_factor is None else scale_factor
        return self.ops.resample(x, size, scale, self.mode, self.align_corners)
