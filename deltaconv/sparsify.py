"""Noise-robust input sparsifiers: change detectors that tell sensor and codec noise from change.

The input sparsifier (:class:`~deltaconv.DCSparsify`) sends a pixel when a *change measure* of
the pending change ``x - sent`` exceeds its threshold. By default the measure is the per-pixel
``max_c |x - sent|``, which on noisy video sends about half of the pixels every frame. A change
detector replaces that measure; the values sent stay the exact ``x - sent`` and what is not sent
stays pending in ``sent`` (no drift), whatever the detector (``reference.sparsify`` guarantees it).

Every detector here is a parameter-free ``nn.Module`` (picklable, deep-copyable) mapping the
pending change ``[N, C, H, W]`` (float32) to a measure ``[N, 1, H, W]`` in the units of the
threshold (normalised input units: 0.0174 is one grey level with ImageNet normalisation).
Use it with ``deltaconv.convert(model, threshold=t, change_detector=BoxBlur(5))``.

Detectors
---------
* :class:`PixelMax` - ``max_c |d|``, the baseline (same as no detector).
* :class:`BoxBlur` - ``max_c |d|`` averaged over a ``k x k`` window: isolated noisy pixels are
  diluted by ``k^2``, coherent changes (objects) keep their value.
* :class:`GaussianBlur` - the same with a Gaussian window of standard deviation ``sigma``.
* :class:`SignedBlur` - ``max_c |box_k(d_c)|``: the *signed* change averaged over the window, so
  zero-mean noise cancels while a coherent change does not.
* :class:`CoherentChange` - the signed mean over ``k x k`` times ``gain = k``: a matched filter
  that keeps independent noise at its per-pixel scale and amplifies change shared by the window
  ``k`` times, so small coherent changes (a region brightening by one grey level) go out.
* :class:`TileEnergy` - mean ``max_c |d|`` per ``tile x tile`` block, broadcast back: the decision
  is per tile, the granularity of tiled GPU kernels.
* :class:`NoiseFloor` - wraps any of the above and scales its measure down by a noise floor
  estimated per stream from the frame's own statistics (a quantile of the measure over all
  pixels, most of which are static, tracked with a moving average over frames): the effective
  threshold becomes ``threshold * max(1, noise / ref)``.

The pooled detectors take ``max(pooled, pixel / peak)``: a pixel whose own change exceeds
``peak * threshold`` is always sent, so a small object or a sharp edge is never held back by the
averaging, the pending error of every pixel stays below ``peak * threshold``, and threshold 0 is
exact (every changed pixel has a positive measure). A sliding window (box, Gaussian, signed,
coherent) also marks pixels that have (almost) nothing pending when their neighbours lift the
window's measure; such pixels are sent with a near-zero change, frame after frame (no error, but
wasted work). ``gate=g`` limits a window to the pixels whose own change is at least ``g`` times
the measure (``min(pooled, pixel / g)``); tiles send all their pixels at once and need no gate.
Measured on CPU (MobileNetV2, 288x512, frames 200-211, input sparsifier only): ``gate=0.25`` sends
13 % (BoxBlur(5), t=0.02) and 16 % (CoherentChange(5), t=0.05) fewer input pixels of vtest at the
same logit error; the model's FLOPs density moves by 0.001 only (the first convolution's
footprint covers the difference), so the 1080p tables below were measured without it.

Detectors are described by a JSON-able spec (:meth:`ChangeDetector.spec`) and rebuilt by
:func:`from_spec`, so a calibration result can be saved with its detector.

Measured choice of the default
------------------------------
MobileNetV2 (torchvision ImageNet weights), 1080x1920, reference backend on an H200 (float32,
TF32 off); FLOPs-weighted density (``deltaconv.fidelity.flops_density``) and mean logit relative
error against the dense model, key frame excluded.

1. Input sparsifier alone (every other layer exact), frames 0-23 (``t`` in normalised units;
   one grey level is 0.0174). Density / error at comparable error:

   ========================  =================  =================
   detector, t               vtest.avi          one-by-one
   ========================  =================  =================
   per-pixel, 0.02           0.875 / 0.139      0.357 / 0.053
   BoxBlur(5), 0.02          0.865 / 0.086      0.348 / 0.030
   GaussianBlur(1.5), 0.02   0.864 / 0.083      0.348 / 0.029
   SignedBlur(5), 0.02       0.843 / 0.162      0.346 / 0.046
   CoherentChange(5), 0.05   0.874 / 0.096      0.375 / 0.014
   TileEnergy(8), 0.035      0.788 / 0.073      0.281 / 0.057
   TileEnergy(16), 0.035     0.751 / 0.053      0.228 / 0.043
   NoiseFloor(Box5), 0.035   0.463 / 0.195      0.302 / 0.098
   ========================  =================  =================

2. All layers at one threshold ``t``, 300 held-out frames (200-499), ``benchmarks/results/
   fidelity.csv``: per-pixel / TileEnergy(16)

   ======  ==============================  ==============================
   t       vtest.avi                       one-by-one
   ======  ==============================  ==============================
   0.005   0.834 / 0.0030   0.837 / 0.0077   0.441 / 0.016   0.433 / 0.016
   0.01    0.809 / 0.016    0.801 / 0.029    0.377 / 0.033   0.356 / 0.038
   0.02    0.681 / 0.174    0.593 / 0.097    0.290 / 0.133   0.263 / 0.094
   0.05    0.259 / 0.241    0.179 / 0.170    0.157 / 0.304   0.143 / 0.286
   ======  ==============================  ==============================

Findings. Once the input threshold exceeds one grey level, :class:`TileEnergy` with 16x16 tiles
gives the lowest density at a given error on both videos, hence :data:`DEFAULT`. But sub-grey-level
*coherent* change matters: holding back every one-level change (per-pixel, t >= 0.0175) costs 5-14 %
logit error at 1080p, far more than the dense model's own frame-to-frame jitter (3.9 % on vtest), and
no detector reaches the 2 % level with the input threshold above one grey level. At a 2 % tolerance
the calibration (:mod:`deltaconv.calibrate`) therefore keeps the per-pixel measure with the input
threshold below one grey level (everything that changed is sent) and finds its savings in the
non-linear layers' thresholds; detectors pay off at looser tolerances (5 % and above). The
noise-floor wrapper over-suppresses on vtest (whose noise is mostly one-level flicker).
``convert``'s default stays the per-pixel measure. Reproduce with
``PYTHONPATH=. python benchmarks/fidelity_sweep.py --size 1080 1920 --device cuda`` (table 2) and
``--detectors none '{"type": "tile", "tile": 8}' ...`` for other detectors.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

Tensor = torch.Tensor

__all__ = ["ChangeDetector", "PixelMax", "BoxBlur", "GaussianBlur", "SignedBlur", "CoherentChange", "TileEnergy",
           "NoiseFloor",
           "from_spec", "default_detector", "DETECTORS"]


def _pixel(change: Tensor) -> Tensor:
    """``max_c |change|`` as ``[N, 1, H, W]`` float32."""
    return change.to(torch.float32).abs().amax(dim=1, keepdim=True)


def _box(m: Tensor, k: int) -> Tensor:
    """Mean over a ``k x k`` window centred on each pixel (windows clipped at the borders)."""
    if k <= 1:
        return m
    return F.avg_pool2d(m, k, stride=1, padding=k // 2, count_include_pad=False)[..., :m.shape[-2], :m.shape[-1]]


def _check_odd(name: str, k) -> int:
    if not isinstance(k, int) or k < 1 or k % 2 == 0:
        raise ValueError(f"{name}: k must be an odd int >= 1, got {k!r}")
    return k


def _check_peak(name: str, peak) -> float:
    if not isinstance(peak, (int, float)) or not (0 < peak < math.inf):
        raise ValueError(f"{name}: peak must be a finite number > 0, got {peak!r}")
    return float(peak)


def _check_gate(name: str, gate) -> Optional[float]:
    if gate is None:
        return None
    if not isinstance(gate, (int, float)) or not (0 < gate <= 1):
        raise ValueError(f"{name}: gate must be None or a number in (0, 1], got {gate!r}")
    return float(gate)


def _with_gate(spec: dict, gate: Optional[float]) -> dict:
    return spec if gate is None else {**spec, "gate": gate}


def _combine(pooled: Tensor, m: Tensor, peak: float, gate: Optional[float]) -> Tensor:
    """``max(pooled, m / peak)``; with a ``gate``, a window sends only the pixels whose own change
    is at least ``gate`` times its measure (``min(pooled, m / gate)``)."""
    if gate is not None:
        pooled = torch.minimum(pooled, m / gate)
    return torch.maximum(pooled, m / peak)


class ChangeDetector(nn.Module):
    """Base class: ``forward(change [N,C,H,W]) -> measure [N,1,H,W]`` (float32, >= 0)."""

    def spec(self) -> dict:
        """A JSON-able description; :func:`from_spec` rebuilds the detector from it."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget any tracked state (stateless detectors: nothing to do)."""

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.spec().items() if k != "type")


class PixelMax(ChangeDetector):
    """``max_c |d|`` per pixel: the sparsifier's own measure (baseline)."""

    def forward(self, change: Tensor) -> Tensor:
        return _pixel(change)

    def spec(self) -> dict:
        return {"type": "pixel"}


class BoxBlur(ChangeDetector):
    """``max(box_k(max_c |d|), max_c |d| / peak)``: per-pixel change averaged over ``k x k``."""

    def __init__(self, k: int = 5, peak: float = 4.0,
                 gate: Optional[float] = None) -> None:
        super().__init__()
        self.k, self.peak = _check_odd("BoxBlur", k), _check_peak("BoxBlur", peak)
        self.gate = _check_gate("BoxBlur", gate)

    def forward(self, change: Tensor) -> Tensor:
        m = _pixel(change)
        return _combine(_box(m, self.k), m, self.peak, self.gate)

    def spec(self) -> dict:
        return _with_gate({"type": "box", "k": self.k, "peak": self.peak}, self.gate)


class GaussianBlur(ChangeDetector):
    """``max(gauss_sigma(max_c |d|), max_c |d| / peak)``, window ``2 * ceil(2 sigma) + 1``."""

    def __init__(self, sigma: float = 1.5, peak: float = 4.0,
                 gate: Optional[float] = None) -> None:
        super().__init__()
        if not isinstance(sigma, (int, float)) or sigma <= 0:
            raise ValueError(f"GaussianBlur: sigma must be a number > 0, got {sigma!r}")
        self.sigma, self.peak = float(sigma), _check_peak("GaussianBlur", peak)
        self.gate = _check_gate("GaussianBlur", gate)
        self._kernel: Optional[Tensor] = None

    def _taps(self, device) -> Tensor:
        if self._kernel is None or self._kernel.device != device:
            r = math.ceil(2 * self.sigma)
            x = torch.arange(-r, r + 1, dtype=torch.float32)
            g = torch.exp(-0.5 * (x / self.sigma) ** 2)
            self._kernel = (g / g.sum()).to(device)
        return self._kernel

    def forward(self, change: Tensor) -> Tensor:
        m = _pixel(change)
        g = self._taps(m.device)
        r = (g.numel() - 1) // 2
        b = F.pad(m.contiguous(), (r, r, r, r), mode="replicate")
        b = F.conv2d(b, g.view(1, 1, 1, -1))
        b = F.conv2d(b, g.view(1, 1, -1, 1))
        return _combine(b, m, self.peak, self.gate)

    def spec(self) -> dict:
        return _with_gate({"type": "gauss", "sigma": self.sigma, "peak": self.peak}, self.gate)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_kernel"] = None
        return state


class SignedBlur(ChangeDetector):
    """``max(max_c |box_k(d_c)|, max_c |d| / peak)``: zero-mean noise cancels in the signed mean."""

    def __init__(self, k: int = 5, peak: float = 4.0,
                 gate: Optional[float] = None) -> None:
        super().__init__()
        self.k, self.peak = _check_odd("SignedBlur", k), _check_peak("SignedBlur", peak)
        self.gate = _check_gate("SignedBlur", gate)

    def forward(self, change: Tensor) -> Tensor:
        d = change.to(torch.float32)
        m = d.abs().amax(dim=1, keepdim=True)
        b = _box(d, self.k).abs().amax(dim=1, keepdim=True)
        return _combine(b, m, self.peak, self.gate)

    def spec(self) -> dict:
        return _with_gate({"type": "signed", "k": self.k, "peak": self.peak}, self.gate)


class CoherentChange(ChangeDetector):
    """``max(gain * max_c |box_k(d_c)|, max_c |d| / peak)``: a matched filter for coherent change.

    The signed change averaged over ``k x k`` pixels, times ``gain`` (default ``k``, i.e.
    ``sqrt(k^2)``): independent zero-mean noise of per-pixel scale ``sigma`` gives a measure of
    scale ``sigma`` (as the per-pixel measure does), while a change shared by the window (an
    object, an edge, a brightness shift of a region) is amplified ``gain`` times. Small coherent
    changes that a per-pixel threshold would hold back forever (a one-grey-level shift of a
    whole region) are sent; noise is not.
    """

    def __init__(self, k: int = 5, gain: Optional[float] = None, peak: float = 4.0,
                 gate: Optional[float] = None) -> None:
        super().__init__()
        self.k, self.peak = _check_odd("CoherentChange", k), _check_peak("CoherentChange", peak)
        self.gate = _check_gate("CoherentChange", gate)
        gain = float(self.k) if gain is None else gain
        if not isinstance(gain, (int, float)) or not (0 < gain < math.inf):
            raise ValueError(f"CoherentChange: gain must be a finite number > 0, got {gain!r}")
        self.gain = float(gain)

    def forward(self, change: Tensor) -> Tensor:
        d = change.to(torch.float32)
        m = d.abs().amax(dim=1, keepdim=True)
        b = _box(d, self.k).abs().amax(dim=1, keepdim=True) * self.gain
        return _combine(b, m, self.peak, self.gate)

    def spec(self) -> dict:
        return _with_gate({"type": "coherent", "k": self.k, "gain": self.gain, "peak": self.peak}, self.gate)


class TileEnergy(ChangeDetector):
    """``max(mean_tile(max_c |d|), max_c |d| / peak)``: one decision per ``tile x tile`` block
    (partial tiles at the border average what they hold)."""

    def __init__(self, tile: int = 8, peak: float = 4.0) -> None:
        super().__init__()
        if not isinstance(tile, int) or tile < 1:
            raise ValueError(f"TileEnergy: tile must be an int >= 1, got {tile!r}")
        self.tile, self.peak = tile, _check_peak("TileEnergy", peak)

    def forward(self, change: Tensor) -> Tensor:
        m = _pixel(change)
        h, w = m.shape[-2:]
        t = self.tile
        e = F.avg_pool2d(m, t, stride=t, ceil_mode=True, count_include_pad=False)
        e = e.repeat_interleave(t, dim=-2).repeat_interleave(t, dim=-1)[..., :h, :w]
        return torch.maximum(e, m / self.peak)

    def spec(self) -> dict:
        return {"type": "tile", "tile": self.tile, "peak": self.peak}


class NoiseFloor(ChangeDetector):
    """Scales an inner detector's measure by ``ref / max(noise, ref)``, ``noise`` tracked per stream.

    ``noise`` is the ``quantile`` of the inner measure over the pixels of the frame (static pixels
    are the majority, so it reflects noise, not motion), smoothed over frames with ``momentum``.
    The effective threshold is ``threshold * max(1, noise / ref)``: unchanged on clean video,
    raised in proportion to the noise on noisy video. Threshold 0 stays exact.

    State: one value per stream, reset when the batch size changes or by :meth:`reset`; a
    detector instance should serve one converted model.
    """

    def __init__(self, inner: Optional[ChangeDetector] = None, quantile: float = 0.9, ref: float = 0.02,
                 momentum: float = 0.9, sample_stride: int = 4) -> None:
        super().__init__()
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"NoiseFloor: quantile must be in (0, 1), got {quantile!r}")
        if not ref > 0:
            raise ValueError(f"NoiseFloor: ref must be > 0, got {ref!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"NoiseFloor: momentum must be in [0, 1), got {momentum!r}")
        self.inner = PixelMax() if inner is None else inner
        self.quantile, self.ref, self.momentum = float(quantile), float(ref), float(momentum)
        self.sample_stride = max(int(sample_stride), 1)
        self.noise: Optional[Tensor] = None  # [N] per-stream estimate (not a buffer: not in state_dict)

    def reset(self) -> None:
        self.noise = None
        self.inner.reset()

    def forward(self, change: Tensor) -> Tensor:
        m = self.inner(change)
        s = self.sample_stride
        flat = m[..., ::s, ::s].reshape(m.shape[0], -1)
        k = max(1, min(flat.shape[1], int(round(self.quantile * flat.shape[1]))))
        q = flat.kthvalue(k, dim=1).values
        if self.noise is None or self.noise.shape != q.shape or self.noise.device != q.device:
            self.noise = q
        else:
            self.noise = self.momentum * self.noise + (1.0 - self.momentum) * q
        scale = self.ref / torch.clamp(self.noise, min=self.ref)
        return m * scale.view(-1, 1, 1, 1)

    def spec(self) -> dict:
        return {"type": "noise_floor", "inner": self.inner.spec(), "quantile": self.quantile, "ref": self.ref,
                "momentum": self.momentum, "sample_stride": self.sample_stride}

    def extra_repr(self) -> str:
        return f"quantile={self.quantile}, ref={self.ref}, momentum={self.momentum}"


#: spec ``type`` -> class
DETECTORS = {"pixel": PixelMax, "box": BoxBlur, "gauss": GaussianBlur, "signed": SignedBlur,
             "coherent": CoherentChange, "tile": TileEnergy, "noise_floor": NoiseFloor}


def from_spec(spec: Union[None, str, dict, ChangeDetector]) -> Optional[ChangeDetector]:
    """A detector from its spec (``{"type": "box", "k": 5, ...}``), a type name with default
    arguments (``"box"``), an existing detector (returned as is) or ``None`` (no detector)."""
    if spec is None or isinstance(spec, ChangeDetector):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or spec.get("type") not in DETECTORS:
        raise ValueError(f"from_spec: expected a dict with 'type' in {sorted(DETECTORS)}, got {spec!r}")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    if spec["type"] == "noise_floor" and "inner" in kwargs:
        kwargs["inner"] = from_spec(kwargs["inner"])
    return DETECTORS[spec["type"]](**kwargs)


#: the detector chosen by measurement (see the module docstring); ``default_detector()`` builds one
DEFAULT = {"type": "tile", "tile": 16, "peak": 4.0}


def default_detector() -> ChangeDetector:
    """A fresh instance of the measured default detector (:data:`DEFAULT`)."""
    return from_spec(DEFAULT)
