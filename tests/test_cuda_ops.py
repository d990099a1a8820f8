"""The pointwise CUDA kernels (deltaconv.backends.cuda) against the reference backend.

Every test needs a CUDA GPU and the built extension (``python setup.py build_ext --inplace``) and
is skipped otherwise. Outputs are compared only at active output pixels (values elsewhere are
unspecified), masks exactly, and the float32 state tensors everywhere. Inactive input pixels hold
NaN, so a kernel that reads them fails the comparison.

``DELTACONV_TEST_QUICK=1`` shrinks the parameter matrix (for compute-sanitizer runs).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from deltaconv.activations import Activation
from deltaconv.backends import reference as ref
from helpers import is_tf32

try:
    from deltaconv.backends import cuda as dcc
    _READY = dcc.is_available()
    _REASON = dcc.unavailable_reason()
except Exception as exc:  # noqa: BLE001 - the module must import, but report rather than crash collection
    dcc = None
    _READY, _REASON = False, f"deltaconv.backends.cuda failed to import: {exc}"

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and _READY),
                                 reason=_REASON or "needs a CUDA GPU and the built extension")]

QUICK = bool(os.environ.get("DELTACONV_TEST_QUICK"))
DTYPES = [torch.float32, torch.float16] if QUICK else [torch.float32, torch.float16, torch.bfloat16]
CHANNELS = [3, 64] if QUICK else [1, 3, 17, 32, 64, 130]
FRACS = [0.3] if QUICK else [0.0, 0.01, 0.3, 1.0]
KEYS = ["partial"] if QUICK else ["none", "partial"]
# the second stream changes by a different fraction than the first (different masks per stream)
PARTNER = {0.0: 0.3, 0.01: 1.0, 0.3: 0.01, 1.0: 0.0}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
DEV = "cuda"
CL = torch.channels_last


# ----------------------------------------------------------------------------- helpers
def spatial(c: int) -> tuple[int, int]:
    """Odd spatial sizes, alternating with the channel count so that both are covered."""
    return (33, 65) if c in (3, 32, 64) else (7, 9)


def gen(seed: int) -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    return g


def make_mask(n: int, h: int, w: int, frac: float, g: torch.Generator) -> torch.Tensor:
    fracs = [frac, PARTNER.get(frac, frac)] + [frac] * max(0, n - 2)
    rows = [torch.rand((1, 1, h, w), generator=g, device=DEV) < f for f in fracs[:n]]
    return torch.cat(rows).contiguous()


def make_delta(shape, dtype, mask: torch.Tensor, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """A channels_last delta with NaN at inactive pixels (garbage that must never be read)."""
    d = torch.randn(shape, generator=g, device=DEV) * scale
    d = torch.where(mask, d, torch.full((), float("nan"), device=DEV))
    return d.to(dtype).contiguous(memory_format=CL)


def make_state(shape, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g, device=DEV) * scale).contiguous(memory_format=CL)


def make_key(kind: str, n: int):
    if kind == "none":
        return None
    return torch.tensor([True] + [False] * (n - 1), device=DEV)


def clones(*ts):
    return [t.clone() for t in ts]


def assert_masks(m_cuda: torch.Tensor, m_ref: torch.Tensor, ambiguous=None):
    assert m_cuda.dtype == torch.bool and m_cuda.shape == m_ref.shape, (m_cuda.shape, m_ref.shape)
    diff = m_cuda != m_ref
    if ambiguous is not None:
        diff = diff & ~ambiguous
    assert not diff.any(), f"{int(diff.sum())} mask mismatches of {diff.numel()}"


def assert_active(out_cuda, out_ref, mask, dtype):
    """Outputs equal at active output pixels (the reference is zero elsewhere)."""
    assert out_cuda.shape == out_ref.shape and out_cuda.dtype == out_ref.dtype
    sel = mask.expand_as(out_ref)
    torch.testing.assert_close(out_cuda[sel].float(), out_ref[sel].float(), **TOL[dtype])


def assert_state(s_cuda, s_ref, skip=None):
    """States match to the precision of their dtype (float32 accumulators, ``sent`` in the value
    dtype: one ulp of a transcendental function may round the other way)."""
    assert s_cuda.dtype == s_ref.dtype
    if skip is not None:
        keep = ~skip.expand_as(s_ref)
        s_cuda, s_ref = s_cuda[keep], s_ref[keep]
    torch.testing.assert_close(s_cuda, s_ref, **TOL[s_ref.dtype])


EPS = {torch.float32: 1e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def near_threshold(change: torch.Tensor, threshold: float, y: torch.Tensor, dtype) -> torch.Tensor:
    """Pixels where some channel's |change| is within rounding of the threshold: there one ulp of a
    transcendental function (the new value ``y``, rounded to ``dtype``) may legitimately flip the
    send decision."""
    tol = EPS[dtype] * (1.0 + threshold + y.abs())
    return ((change.abs() - threshold).abs() <= tol).any(dim=1, keepdim=True)


def near_rms_threshold(change: torch.Tensor, threshold: float, y: torch.Tensor, dtype) -> torch.Tensor:
    """Pixels whose RMS change is within rounding of the threshold (the kernels sum the squares in
    another order than the reference, and may round ``y`` one ulp the other way)."""
    tol = EPS[dtype] * (1.0 + threshold + y.abs().amax(dim=1, keepdim=True))
    rms = change.square().mean(dim=1, keepdim=True).sqrt()
    return (rms - threshold).abs() <= tol


def near_pooled_threshold(change: torch.Tensor, threshold: float, y: torch.Tensor, dtype) -> torch.Tensor:
    """Pixels whose pooled measure (``reference.exceeds``) is within rounding of the threshold, or
    whose own RMS change is within rounding of the peak guard (``POOL_PEAK`` times it): the window
    sums another order than ``avg_pool2d``, and a neighbour's ``y`` may round one ulp the other way."""
    y_max = F.max_pool2d(y.abs().amax(dim=1, keepdim=True), 3, 1, 1)
    tol = EPS[dtype] * (1.0 + threshold + y_max)
    box = F.avg_pool2d(change, ref.POOL_SIZE, 1, ref.POOL_SIZE // 2, count_include_pad=False)
    pooled = box.square().mean(dim=1, keepdim=True).sqrt()
    peak = near_rms_threshold(change, ref.POOL_PEAK * threshold, y, dtype)
    return ((pooled - threshold).abs() <= tol) | peak


def ambiguous(change, threshold, y, dtype, measure):
    near = {"max": near_threshold, "rms": near_rms_threshold, "pooled": near_pooled_threshold}[measure]
    return near(change, threshold, y, dtype)


# ----------------------------------------------------------------------------- sparsify
@pytest.mark.parametrize("measure", [False, True])
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sparsify(dtype, c, frac, key, measure):
    g = gen(1)
    n, (h, w) = 2, spatial(c)
    moved = make_mask(n, h, w, frac, g)
    sent = make_state((n, c, h, w), g)
    noise = torch.randn((n, c, h, w), generator=g, device=DEV) * 0.01  # below the threshold
    jump = torch.randn((n, c, h, w), generator=g, device=DEV)
    x = (sent + torch.where(moved, jump, noise)).to(dtype).contiguous(memory_format=CL)
    k = make_key(key, n)
    cm = None
    if measure:
        cm = torch.rand((n, 1, h, w), generator=g, device=DEV) * 0.1
    s_c, s_r = clones(sent.to(dtype), sent.to(dtype))  # sent holds values of the frame's dtype
    out_c, m_c = dcc.sparsify(x, s_c, 0.05, k, cm)
    out_r, m_r = ref.sparsify(x, s_r, 0.05, k, cm)
    assert out_c.dtype == dtype and out_c.is_contiguous(memory_format=CL)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)
    assert s_c.dtype == dtype and torch.equal(s_c, s_r)  # same float32 arithmetic: bit-identical state


@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
def test_sparsify_tf32_sends(c, frac):
    """A float32 frame with ``tf32``: the kernel sends TF32 values, bit for bit the reference's, and
    keeps what the rounding left in ``sent``; at threshold 0 an unchanged frame then sends that
    residual until ``sent`` is the frame (within three calls); float16 frames are refused."""
    g = gen(19)
    n, (h, w) = 2, spatial(c)
    moved = make_mask(n, h, w, frac, g)
    sent = make_state((n, c, h, w), g)
    x = (sent + torch.where(moved, torch.randn((n, c, h, w), generator=g, device=DEV), sent * 0)).contiguous(
        memory_format=CL)
    s_c, s_r = clones(sent, sent)
    out_c, m_c = dcc.sparsify(x, s_c, 0.05, make_key("partial", n), None, tf32=True)
    out_r, m_r = ref.sparsify(x, s_r, 0.05, make_key("partial", n), None, tf32=True)
    assert_masks(m_c, m_r)
    sel = m_c.expand_as(out_c)
    assert torch.equal(out_c[sel], out_r[sel]) and torch.equal(s_c, s_r)
    assert is_tf32(out_c[sel])
    for _ in range(3):
        dcc.sparsify(x, s_c, 0.0, None, None, tf32=True)
    assert torch.equal(s_c, x)
    _, m = dcc.sparsify(x, s_c, 0.0, None, None, tf32=True)
    assert not bool(m.any())
    with pytest.raises(RuntimeError, match="argument 'tf32' needs a float32 frame"):
        torch.ops.deltaconv.sparsify(x.half(), s_c.half(), 0.0, None, None, tf32=True)


def test_sparsify_same_frame_again_sends_nothing():
    """After sending, ``sent`` equals the frame exactly (float32), so at threshold 0 an unchanged
    frame sends no pixel (no float rounding residual is re-sent)."""
    g = gen(18)
    x = (torch.randn((2, 3, 33, 65), generator=g, device=DEV) * 3).contiguous(memory_format=CL)
    sent = make_state(x.shape, g)
    _, m1 = dcc.sparsify(x, sent, 0.0, None)
    assert bool(m1.all())
    assert torch.equal(sent, x)
    _, m2 = dcc.sparsify(x, sent, 0.0, None)
    assert not bool(m2.any())


# ----------------------------------------------------------------------------- densify
@pytest.mark.parametrize("out_dtype", ["same", torch.float32])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_densify(dtype, c, frac, out_dtype):
    out_dtype = dtype if out_dtype == "same" else out_dtype
    g = gen(2)
    n, (h, w) = 2, spatial(c)
    mask = make_mask(n, h, w, frac, g)
    delta = make_delta((n, c, h, w), dtype, mask, g)
    acc = make_state((n, c, h, w), g)
    a_c, a_r = clones(acc, acc)
    out_c = dcc.densify(delta, mask, a_c, out_dtype)
    out_r = ref.densify(delta, mask, a_r, out_dtype)
    assert out_c.dtype == out_dtype
    assert torch.equal(out_c, out_r)
    assert torch.equal(a_c, a_r)


# ----------------------------------------------------------------------------- activation
def _run_activation(fn, dtype, c, frac, key, threshold, seed=3, n=2, measure="max", size=None, tf32=False):
    g = gen(seed)
    h, w = size or spatial(c)
    mask = make_mask(n, h, w, frac, g)
    delta = make_delta((n, c, h, w), dtype, mask, g, scale=0.2)
    acc = make_state((n, c, h, w), g, scale=2.0)
    sent = (fn(acc) + torch.randn(acc.shape, generator=g, device=DEV) * 0.02).to(dtype).contiguous(memory_format=CL)
    k = make_key(key, n)
    a_c, s_c, a_r, s_r = clones(acc, sent, acc, sent)
    out_c, m_c = dcc.activation(delta, mask, a_c, s_c, fn, threshold, k, measure, tf32=tf32)
    out_r, m_r = ref.activation(delta, mask, a_r, s_r, fn, threshold, k, measure, tf32=tf32)
    assert_activation_matches((out_c, m_c, a_c, s_c), (out_r, m_r, a_r, s_r), fn, sent, mask, dtype, threshold,
                              measure)
    if tf32:
        assert_tf32_sends(out_c, m_c, fn(a_c), s_c)
    return m_r


def assert_tf32_sends(out, mask, y, sent, atol=0.0):
    """Changes sent with ``tf32``: TF32 values (the 13 low mantissa bits zero) at the sent pixels,
    and what the rounding left pending: ``sent`` is the new value ``y`` less a residual below one
    TF32 step of the change, give or take the float32 rounding of ``sent`` itself (and ``atol``
    where the kernel computes ``y`` in another order than ``y`` here)."""
    sel = mask.expand_as(out)
    assert is_tf32(out[sel])
    residual = (y - sent)[sel]
    bound = out[sel].abs() * 2.0 ** -11 + y[sel].abs() * 2.0 ** -22 + atol + 1e-30
    assert (residual.abs() <= bound).all(), (residual.abs() - bound).max()


def assert_activation_matches(cuda, reference, fn, sent, region, dtype, threshold, measure):
    """An activation's CUDA results (out, mask, acc, sent) equal the reference's, except the send
    decision of pixels on the threshold (found from the reference's change before truncation)."""
    out_c, m_c, a_c, s_c = cuda
    out_r, m_r, a_r, s_r = reference
    y = fn(a_r)
    change = torch.where(region, y.to(dtype).float() - sent.float(), torch.zeros((), device=DEV))
    amb = ambiguous(change, threshold, y, dtype, measure) & region
    assert_masks(m_c, m_r, amb)
    assert_active(out_c, out_r, m_r & m_c, dtype)
    assert_state(a_c, a_r)
    assert_state(s_c, s_r, skip=amb)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation(dtype, c, frac, key):
    _run_activation(Activation("relu"), dtype, c, frac, key, 0.05)


KINDS = [Activation("identity"), Activation("relu"), Activation("relu6"), Activation("leaky_relu", 0.1),
         Activation("hardswish"), Activation("hardsigmoid"), Activation("silu"), Activation("sigmoid"),
         Activation("gelu", 0.0), Activation("gelu", 1.0), Activation("tanh"), Activation("elu", 1.0),
         Activation("elu", 0.5)]


@pytest.mark.parametrize("threshold", [0.0, 0.05])
@pytest.mark.parametrize("fn", KINDS[:4] if QUICK else KINDS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_kinds(dtype, fn, threshold):
    for c in (17, 64):
        _run_activation(fn, dtype, c, 0.3, "partial", threshold, seed=4)


@pytest.mark.parametrize("threshold", [0.0, 0.15])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_rms_measure(dtype, c, frac, threshold):
    """The rms measure (sqrt(mean_c change^2) > threshold) on the kernels equals the reference. At
    0.15 (changes of about that size) it sends a different set of pixels than max, so the kernels
    really apply it."""
    _run_activation(Activation("silu"), dtype, c, frac, "partial", threshold, seed=8, measure="rms")
    if threshold > 0 and frac >= 0.3 and c > 1:  # no key stream here: every pixel is decided by the measure
        m_rms = _run_activation(Activation("silu"), dtype, c, frac, "none", threshold, seed=8, measure="rms")
        m_max = _run_activation(Activation("silu"), dtype, c, frac, "none", threshold, seed=8)
        assert not torch.equal(m_rms, m_max)


@pytest.mark.parametrize("threshold", [0.0, 0.1])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_pooled_measure(dtype, c, frac, threshold):
    """The pooled measure (the rms of each channel's change averaged over the pixel's 3x3 window, or
    its own rms over 4x the threshold; two kernels, the second reading the window's pending changes)
    equals the reference on odd sizes (windows cut by the image's edges) and at every fraction. At
    0.1 it sends another set of pixels than rms, so the kernels really apply it."""
    _run_activation(Activation("relu6"), dtype, c, frac, "partial", threshold, seed=21, measure="pooled")
    if threshold > 0 and frac >= 0.3 and c > 1:
        m_pooled = _run_activation(Activation("relu6"), dtype, c, frac, "none", threshold, seed=21, measure="pooled")
        m_rms = _run_activation(Activation("relu6"), dtype, c, frac, "none", threshold, seed=21, measure="rms")
        assert not torch.equal(m_pooled, m_rms)


@pytest.mark.parametrize("size", [(1, 1), (1, 7), (5, 1), (2, 2), (40, 300)])
def test_activation_pooled_measure_small_and_wide_maps(size):
    """Maps a 3x3 window does not fit (one row, one column, 2x2) and one wider than a batch of the
    persistent grid's groups; a kind switched per element; float16 16-byte and scalar paths."""
    for c in (17, 64):
        _run_activation(Activation("hardswish"), torch.float16, c, 0.5, "partial", 0.08, seed=22, measure="pooled",
                        size=size)


@pytest.mark.parametrize("fn", [Activation("relu"), Activation("relu6"), Activation("hardswish")], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_fixed_kinds_rms_measure(dtype, fn):
    """The kinds whose kernel has the activation fixed at compile time (ReLU, ReLU6) and one that
    switches per element (hardswish), with the rms measure too, on both the 16-byte (64 channels)
    and the scalar (17) paths."""
    for c in (17, 64):
        _run_activation(fn, dtype, c, 0.3, "partial", 0.15, seed=9, measure="rms")


VALUE_KINDS = [Activation("relu"), Activation("relu6"), Activation("silu"), Activation("hardswish"),
               Activation("leaky_relu", 0.1), Activation("sigmoid"), Activation("gelu", 0.0)]


@pytest.mark.parametrize("measure", ["max", "rms"])
@pytest.mark.parametrize("fn", VALUE_KINDS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_values_kinds_fixed_and_switched(dtype, fn, measure, monkeypatch):
    """``activation_values`` (value mode: the whole new input, no accumulator) equals the reference for
    the kinds with a kernel of their own (ReLU, ReLU6, SiLU, hardswish, GELU, LeakyReLU) and those switched
    per element, on the 16-byte (64 channels) and scalar (17) paths; with ``DELTACONV_ACT_FIXED=0`` (SiLU,
    hardswish, GELU and LeakyReLU on the switching kernel) the results are the same bit for bit, in delta
    mode too."""
    threshold = 0.15 if measure == "rms" else 0.05
    for c in (17, 64):
        g = gen(41)
        n, (h, w) = 2, spatial(c)
        mask = make_mask(n, h, w, 0.3, g)
        x = (make_state((n, c, h, w), g, scale=2.0)).to(dtype)
        sent = (fn(x.float()) + torch.randn(x.shape, generator=g, device=DEV) * 0.05).to(dtype)
        sent = sent.contiguous(memory_format=CL)
        k = make_key("partial", n)
        s_r = sent.clone()
        out_r, m_r = ref.activation_values(x, mask, s_r, fn, threshold, k, measure)
        change = torch.where(mask, fn(x.float()).to(dtype).float() - sent.float(), torch.zeros((), device=DEV))
        amb = ambiguous(change, threshold, fn(x.float()), dtype, measure) & mask
        runs = []
        for fixed in ("1", "0"):
            monkeypatch.setenv("DELTACONV_ACT_FIXED", fixed)
            s_c, a_c, s_d = sent.clone(), torch.zeros(x.shape, device=DEV).contiguous(memory_format=CL), sent.clone()
            out_c, m_c = dcc.activation_values(x, mask, s_c, fn, threshold, k, measure)
            out_d, m_d = dcc.activation(x, mask, a_c, s_d, fn, threshold, k, measure)  # an empty accumulator
            assert_masks(m_c, m_r, amb)
            assert_active(out_c, out_r, m_r & m_c, dtype)
            assert_state(s_c, s_r, skip=amb)
            runs.append((out_c.masked_fill(~m_c, 0), m_c, s_c, out_d.masked_fill(~m_d, 0), m_d, s_d))
        for a, b in zip(*runs):
            assert torch.equal(a, b)


def test_activation_generic_falls_back():
    fn = Activation("generic", generic=F.softplus)
    _run_activation(fn, torch.float32, 17, 0.3, "partial", 0.05)


def prelu(c: int) -> Activation:
    """``nn.PReLU(c)``'s function: slopes of both signs (and near zero) across the channels, float32 on the GPU."""
    return Activation("prelu", weight=torch.linspace(-0.75, 1.25, c, device=DEV))


@pytest.mark.parametrize("measure,threshold", [("max", 0.0), ("max", 0.05), ("rms", 0.15), ("pooled", 0.1)])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_prelu_per_channel(dtype, c, frac, measure, threshold, monkeypatch):
    """A PReLU with one slope per channel (kind "prelu", each element's slope read by its channel) equals the
    reference in delta mode, fused with a residual add, in value mode and in value mode fused with an add, at
    every measure (pooled: its send kernel too; whole operands run it through the reference), on the 16-byte
    (64 channels) and scalar (odd counts) paths and at every changed fraction. PReLU runs only on kernels with
    the kind fixed at compile time (the switching kernel reads no slopes), in every mode and whatever
    ``DELTACONV_ACT_FIXED`` says: the results are the same bit for bit with the switch on and off."""
    fn = prelu(c)
    _run_activation(fn, dtype, c, frac, "partial", threshold, seed=51, measure=measure)
    _run_add_activation(fn, dtype, c, frac, "partial", threshold, alpha=-0.5, seed=52, measure=measure)
    _run_add_activation_values(fn, dtype, c, frac, "partial", threshold, seed=53, measure=measure)
    g = gen(54)
    n, (h, w) = 2, spatial(c)
    mask = make_mask(n, h, w, frac, g)
    x = make_state((n, c, h, w), g, scale=2.0).to(dtype)
    sent = (fn(x.float()) + torch.randn(x.shape, generator=g, device=DEV) * 0.05).to(dtype)
    sent = sent.contiguous(memory_format=CL)
    k = make_key("partial", n)
    s_c, s_r = clones(sent, sent)
    out_c, m_c = dcc.activation_values(x, mask, s_c, fn, threshold, k, measure)
    out_r, m_r = ref.activation_values(x, mask, s_r, fn, threshold, k, measure)
    assert_activation_matches((out_c, m_c, x.float(), s_c), (out_r, m_r, x.float(), s_r), fn, sent, mask, dtype,
                              threshold, measure)
    b = make_state((n, c, h, w), g, scale=2.0).to(dtype)
    runs = []
    for fixed in ("1", "0"):
        monkeypatch.setenv("DELTACONV_ACT_FIXED", fixed)
        s_v, s_a, s_d, s_s = clones(sent, sent, sent, sent)
        acc_d, acc_s = (torch.zeros(x.shape, device=DEV).contiguous(memory_format=CL) for _ in range(2))
        out_v, m_v = dcc.activation_values(x, mask, s_v, fn, threshold, k, measure)
        out_a, m_a, _ = dcc.add_activation_values(x, mask, b, ~mask, -0.5, s_a, fn, threshold, k, measure)
        out_d, m_d = dcc.activation(x, mask, acc_d, s_d, fn, threshold, k, measure)
        out_s, m_s, _ = dcc.add_activation(x, mask, b, ~mask, -0.5, acc_s, s_s, fn, threshold, k, measure)
        runs.append((out_v.masked_fill(~m_v, 0), m_v, s_v, out_a.masked_fill(~m_a, 0), m_a, s_a,
                     out_d.masked_fill(~m_d, 0), m_d, s_d, acc_d, out_s.masked_fill(~m_s, 0), m_s, s_s, acc_s))
    for fixed_result, switched_result in zip(*runs):
        assert torch.equal(fixed_result, switched_result)


def test_activation_prelu_errors_name_the_argument():
    """The slopes come with kind "prelu" and only with it, as float32 [C] on the delta's device."""
    d, m, s = _err_inputs()
    ops = torch.ops.deltaconv
    ones = torch.ones(d.shape[1], device=DEV)
    with pytest.raises(RuntimeError, match=r"activation: argument 'slopes' \(the per-channel negative slopes\) "
                                           r"must be given with kind 'prelu' and only with it, got kind 'prelu' and "
                                           r"slopes=None"):
        ops.activation(d, m, s.clone(), s.clone(), "prelu", 0.0, 0.0, None)
    with pytest.raises(RuntimeError, match=r"activation_values: .*got kind 'relu' and slopes"):
        ops.activation_values(d, m, s.clone(), "relu", 0.0, 0.0, None, slopes=ones)
    with pytest.raises(RuntimeError, match=r"add_activation: argument 'slopes' must have shape \[4\], got \[3\]"):
        ops.add_activation(d, m, d, m, 1.0, s.clone(), s.clone(), "prelu", 0.0, 0.0, None, slopes=ones[:3])
    with pytest.raises(RuntimeError, match=r"add_activation_values: argument 'slopes' must have dtype Float, got Half"):
        ops.add_activation_values(d, m, d, m, 1.0, s.clone(), "prelu", 0.0, 0.0, None, slopes=ones.half())
    with pytest.raises(RuntimeError, match=r"argument 'slopes' must be a CUDA tensor, got device cpu"):
        ops.activation(d, m, s.clone(), s.clone(), "prelu", 0.0, 0.0, None, slopes=ones.cpu())


def run_rank2(seed: int, c: int, run):
    """``run(ops, delta, mask, acc, sent)`` on [N, C] values (classifier heads), through the kernels
    viewed as [N, C, 1, 1] and through the reference: the same outputs, masks and states."""
    g = gen(seed)
    n = 3
    mask = torch.tensor([[True], [False], [True]], device=DEV)
    delta = torch.where(mask, torch.randn((n, c), generator=g, device=DEV), torch.tensor(float("nan"), device=DEV))
    acc, sent = torch.randn((n, c), generator=g, device=DEV), torch.randn((n, c), generator=g, device=DEV)
    a_c, s_c, a_r, s_r = clones(acc, sent, acc, sent)
    out_c, m_c = run(dcc, delta, mask, a_c, s_c)
    out_r, m_r = run(ref, delta, mask, a_r, s_r)
    assert out_c.shape == (n, c) and m_c.shape == (n, 1)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)
    assert_state(a_c, a_r)
    assert_state(s_c, s_r)


def test_activation_rank2():
    """[N, C] values (classifier heads) run through the kernels viewed as [N, C, 1, 1]."""
    run_rank2(5, 37, lambda ops, d, m, a, s: ops.activation(d, m, a, s, Activation("hardswish"), 0.0, None))


def test_state_not_channels_last_is_written_back():
    """State tensors in another layout are updated in place all the same."""
    g = gen(6)
    n, c, h, w = 2, 8, 5, 7
    mask = make_mask(n, h, w, 0.5, g)
    delta = make_delta((n, c, h, w), torch.float32, mask, g).contiguous()  # NCHW
    acc = torch.randn((n, c, h, w), generator=g, device=DEV)  # NCHW
    sent = torch.randn((n, c, h, w), generator=g, device=DEV)
    a_c, s_c, a_r, s_r = clones(acc, sent, acc, sent)
    out_c, m_c = dcc.activation(delta, mask, a_c, s_c, Activation("relu"), 0.0, None)
    out_r, m_r = ref.activation(delta, mask, a_r, s_r, Activation("relu"), 0.0, None)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)
    assert_state(a_c, a_r)
    assert_state(s_c, s_r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_falls_back_to_scalar_loads(dtype):
    """Channels_last tensors whose data is not 16-byte aligned use the scalar path."""
    g = gen(7)
    n, c, h, w = 2, 64, 5, 6
    mask = make_mask(n, h, w, 0.5, g)
    base = torch.randn(n * h * w * c + 1, generator=g, device=DEV).to(dtype)
    delta = base[1:].view(n, h, w, c).permute(0, 3, 1, 2)
    assert delta.is_contiguous(memory_format=CL) and delta.data_ptr() % 16 != 0
    out_c, m_c = dcc.affine_channel(delta, mask, None, None, None)
    out_r, m_r = ref.affine_channel(delta, mask, None, None, None)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)


# ----------------------------------------------------------------------------- affine_channel
@pytest.mark.parametrize("terms", ["scale+shift", "scale", "shift", "none"])
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_affine_channel(dtype, c, frac, key, terms):
    if QUICK and terms != "scale+shift":
        pytest.skip("quick mode")
    g = gen(8)
    n, (h, w) = 2, spatial(c)
    mask = make_mask(n, h, w, frac, g)
    delta = make_delta((n, c, h, w), dtype, mask, g)
    scale = torch.randn(c, generator=g, device=DEV) if "scale" in terms else None
    shift = torch.randn(c, generator=g, device=DEV) if "shift" in terms else None
    k = make_key(key, n)
    out_c, m_c = dcc.affine_channel(delta, mask, scale, shift, k)
    out_r, m_r = ref.affine_channel(delta, mask, scale, shift, k)
    assert_masks(m_c, m_r)
    sel = m_r.expand_as(out_r)
    assert torch.equal(out_c[sel], out_r[sel])  # float32 arithmetic rounded to the dtype once: exact


# ----------------------------------------------------------------------------- add
@pytest.mark.parametrize("alpha", [1.0, -0.5])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add(dtype, c, frac, alpha):
    g = gen(9)
    n, (h, w) = 2, spatial(c)
    ma, mb = make_mask(n, h, w, frac, g), make_mask(n, h, w, PARTNER[frac] if frac in PARTNER else frac, g)
    da, db = make_delta((n, c, h, w), dtype, ma, g), make_delta((n, c, h, w), dtype, mb, g)
    out_c, m_c = dcc.add(da, ma, db, mb, alpha)
    out_r, m_r = ref.add(da, ma, db, mb, alpha)
    assert_masks(m_c, m_r)
    sel = m_r.expand_as(out_r)
    assert torch.equal(out_c[sel], out_r[sel])


# ----------------------------------------------------------------------------- add_activation
def _run_add_activation(fn, dtype, c, frac, key, threshold, alpha=1.0, seed=12, n=2, measure="max", size=None,
                        tf32=False):
    """The fused op against the reference (within rounding, as the activation) and against the CUDA
    add and activation run one after the other (bit for bit: the same arithmetic in one pass)."""
    g = gen(seed)
    h, w = size or spatial(c)
    ma, mb = make_mask(n, h, w, frac, g), make_mask(n, h, w, PARTNER.get(frac, frac), g)
    da, db = make_delta((n, c, h, w), dtype, ma, g, scale=0.2), make_delta((n, c, h, w), dtype, mb, g, scale=0.2)
    acc = make_state((n, c, h, w), g, scale=2.0)
    sent = (fn(acc) + torch.randn(acc.shape, generator=g, device=DEV) * 0.02).to(dtype).contiguous(memory_format=CL)
    k = make_key(key, n)
    a_c, s_c, a_r, s_r, a_2, s_2 = clones(acc, sent, acc, sent, acc, sent)
    out_c, m_c, u_c = dcc.add_activation(da, ma, db, mb, alpha, a_c, s_c, fn, threshold, k, measure, tf32=tf32)
    out_r, m_r, u_r = ref.add_activation(da, ma, db, mb, alpha, a_r, s_r, fn, threshold, k, measure, tf32=tf32)
    d2, u2 = dcc.add(da, ma, db, mb, alpha)
    out_2, m_2 = dcc.activation(d2, u2, a_2, s_2, fn, threshold, k, measure, tf32=tf32)
    assert torch.equal(u_c, ma | mb) and torch.equal(u_r, ma | mb)
    assert torch.equal(m_c, m_2) and torch.equal(a_c, a_2) and torch.equal(s_c, s_2)
    sel = m_c.expand_as(out_c)
    assert torch.equal(out_c[sel], out_2[sel])
    assert_activation_matches((out_c, m_c, a_c, s_c), (out_r, m_r, a_r, s_r), fn, sent, u_r, dtype, threshold,
                              measure)
    if tf32:
        assert_tf32_sends(out_c, m_c, fn(a_c), s_c)


@pytest.mark.parametrize("fn,alpha", [(Activation("relu"), 1.0), (Activation("hardswish"), -0.5)], ids=repr)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_activation(dtype, c, frac, fn, alpha):
    """A residual add fused into the activation after it: ReLU (fixed at compile time) and hardswish
    (switched per element), the subtraction's alpha too; the union of the two masks is the add's."""
    _run_add_activation(fn, dtype, c, frac, "partial", 0.05, alpha)


@pytest.mark.parametrize("fn", [Activation("relu"), Activation("relu6")], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_activation_rms_and_no_key(dtype, fn):
    for c in (17, 64):
        _run_add_activation(fn, dtype, c, 0.3, "none", 0.15, seed=13, measure="rms")
        _run_add_activation(fn, dtype, c, 0.3, "none", 0.05, seed=14)


@pytest.mark.parametrize("fn", [Activation("relu"), Activation("relu6")], ids=repr)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_activation_pooled(dtype, frac, fn):
    """The pooled measure after a fused residual add: the window is that of the add's mask."""
    for c in (17, 64):
        _run_add_activation(fn, dtype, c, frac, "partial", 0.1, seed=23, measure="pooled")
        _run_add_activation(fn, dtype, c, frac, "none", 0.1, seed=24, measure="pooled")


def _run_add_activation_values(fn, dtype, c, frac, key, threshold, alpha=1.0, seed=31, n=2, measure="max",
                               tf32=False):
    """The residual add in value mode (both operands whole at every pixel: no NaN anywhere, no
    accumulator) against the reference, within rounding as the activation; the add's mask is the
    union."""
    g = gen(seed)
    h, w = spatial(c)
    ma, mb = make_mask(n, h, w, frac, g), make_mask(n, h, w, PARTNER.get(frac, frac), g)
    a = make_state((n, c, h, w), g, scale=2.0).to(dtype)
    b = make_state((n, c, h, w), g, scale=2.0).to(dtype)
    z = (a + alpha * b).float()  # the add's whole output, as the dense add rounds it
    sent = (fn(z) + torch.randn(z.shape, generator=g, device=DEV) * 0.02).to(dtype).contiguous(memory_format=CL)
    k = make_key(key, n)
    s_c, s_r = clones(sent, sent)
    out_c, m_c, u_c = dcc.add_activation_values(a, ma, b, mb, alpha, s_c, fn, threshold, k, measure, tf32=tf32)
    out_r, m_r, u_r = ref.add_activation_values(a, ma, b, mb, alpha, s_r, fn, threshold, k, measure, tf32=tf32)
    assert torch.equal(u_c, ma | mb) and torch.equal(u_r, ma | mb)
    assert_activation_matches((out_c, m_c, z, s_c), (out_r, m_r, z, s_r), fn, sent, u_r, dtype, threshold, measure)
    if tf32:
        assert_tf32_sends(out_c, m_c, fn(z), s_c)
    return m_r


@pytest.mark.parametrize("fn,alpha", [(Activation("relu"), 1.0), (Activation("hardswish"), -0.5)], ids=repr)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_activation_values(dtype, c, frac, fn, alpha):
    """A residual add of whole operands fused into the activation after it (value mode): ReLU (fixed
    at compile time) and hardswish (switched per element), the subtraction's alpha too."""
    sent = _run_add_activation_values(fn, dtype, c, frac, "partial", 0.05, alpha)
    if frac not in (0.0, 1.0):
        assert 0 < int(sent.sum()) < sent.numel()


@pytest.mark.parametrize("measure,threshold", [("max", 0.0), ("rms", 0.15)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_activation_values_rms_threshold_0_and_no_key(dtype, measure, threshold):
    for c in (17, 64):
        _run_add_activation_values(Activation("relu"), dtype, c, 0.3, "none", threshold, seed=32, measure=measure)


@pytest.mark.parametrize("fn", [Activation("relu"), Activation("gelu", 0.0)], ids=repr)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", [17, 64])
def test_add_activation_values_tf32_sends(c, frac, fn):
    _run_add_activation_values(fn, torch.float32, c, frac, "partial", 0.05, seed=33, tf32=True)


def test_add_activation_values_pooled_runs_the_reference():
    """The pooled measure's send pass reads one source map, so whole operands run it through the
    reference (the same results, on the GPU)."""
    fn = Activation("relu")
    g = gen(34)
    ma, mb = make_mask(2, 9, 11, 0.3, g), make_mask(2, 9, 11, 0.3, g)
    a, b = make_state((2, 16, 9, 11), g).half(), make_state((2, 16, 9, 11), g).half()
    s_c, s_r = clones(*[torch.zeros_like(a)] * 2)
    out_c, m_c, _ = dcc.add_activation_values(a, ma, b, mb, 1.0, s_c, fn, 0.05, None, "pooled")
    out_r, m_r, _ = ref.add_activation_values(a, ma, b, mb, 1.0, s_r, fn, 0.05, None, "pooled")
    assert torch.equal(m_c, m_r) and torch.equal(s_c, s_r) and torch.equal(out_c, out_r)


@pytest.mark.parametrize("measure,threshold", [("max", 0.0), ("max", 0.05), ("rms", 0.15), ("pooled", 0.1)])
@pytest.mark.parametrize("fn", [Activation("relu"), Activation("relu6"), Activation("gelu", 0.0),
                                Activation("hardswish")], ids=repr)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
def test_activation_and_add_activation_tf32_sends(c, frac, fn, measure, threshold):
    """float32 with ``tf32``: the kernels (the kinds fixed at compile time and one switched per
    element; 16-byte and scalar channels) send TF32 values, equal to the reference's, and keep the
    rounding's residual pending in ``sent``."""
    _run_activation(fn, torch.float32, c, frac, "partial", threshold, seed=15, measure=measure, tf32=True)
    _run_add_activation(fn, torch.float32, c, frac, "partial", threshold, alpha=1.0, seed=16, measure=measure,
                        tf32=True)


def test_activation_tf32_sends_converge_at_threshold_zero():
    """At threshold 0 the residual a TF32 send leaves goes out on the next frames (the pixel stays
    active, nothing else changes): within three frames ``sent`` is the value itself and the outputs
    are zero, so downstream has received it exactly; float16 deltas with ``tf32`` are refused."""
    g = gen(17)
    n, c, h, w = 1, 64, 24, 40
    mask = torch.ones((n, 1, h, w), dtype=torch.bool, device=DEV)
    delta = make_delta((n, c, h, w), torch.float32, mask, g, scale=0.3)
    acc = make_state((n, c, h, w), g, scale=2.0)
    sent = torch.zeros_like(acc)
    fn = Activation("relu")
    received = torch.zeros_like(acc)
    outs = []
    for d in (delta, torch.zeros_like(delta), torch.zeros_like(delta), torch.zeros_like(delta)):
        out, m = dcc.activation(d, mask, acc, sent, fn, 0.0, None, tf32=True)
        out = torch.where(m, out, torch.zeros((), device=DEV))  # (inactive pixels: unwritten)
        received += out
        outs.append(out)
    assert torch.equal(sent, fn(acc))
    assert torch.equal(received, fn(acc))
    assert outs[1].abs().sum() > 0  # the first frame's residual did go out later
    assert outs[3].abs().sum() == 0
    with pytest.raises(RuntimeError, match="argument 'tf32' needs float32 deltas"):
        torch.ops.deltaconv.activation(delta.half(), mask, acc, sent.half(), "relu", 0.0, 0.0, None, tf32=True)


@pytest.mark.parametrize("op", ["activation", "activation_values", "add_activation", "add_activation_values"])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_without_writing_changes(dtype, frac, op):
    """``write_out=False`` (a layer whose readers all take its whole values), alone or fused with a residual
    add: the same masks, states and row list as with the changes written; refused with the pooled measure."""
    from deltaconv.delta import RowList
    g = gen(31)
    n, c, (h, w) = 2, 64, spatial(64)
    mask, mask_b = make_mask(n, h, w, frac, g), make_mask(n, h, w, frac / 2, g)
    values = op.endswith("_values")
    operand = (lambda m: make_state((n, c, h, w), g).to(dtype)) if values else (
        lambda m: make_delta((n, c, h, w), dtype, m, g))
    x, b = operand(mask), operand(mask_b)
    acc, sent = make_state((n, c, h, w), g), make_state((n, c, h, w), g, 3.0).to(dtype)
    pixels = n * h * w
    ops = torch.ops.deltaconv
    results = []
    for write_out in (True, False):
        a, s = clones(acc, sent)
        rows = RowList(torch.empty(1 + 2 * pixels, dtype=torch.int32, device=DEV),
                       torch.zeros(16, dtype=torch.int32, device=DEV))
        tail = ("relu", 0.0, 0.05, None, False, rows.rows, rows.counters)
        union = None
        if op == "activation":
            out, m = ops.activation(x, mask, a, s, *tail, write_out=write_out)
        elif op == "activation_values":
            out, m = ops.activation_values(x, mask, s, *tail, write_out=write_out)
        elif op == "add_activation":
            out, m, union = ops.add_activation(x, mask, b, mask_b, -0.5, a, s, *tail, write_out=write_out)
        else:
            out, m, union = ops.add_activation_values(x, mask, b, mask_b, -0.5, s, *tail, write_out=write_out)
        count = int(rows.counters[0])
        results.append((m, union, a, s, count, torch.sort(rows.rows[1:1 + count]).values))
    (m1, u1, a1, s1, n1, r1), (m2, u2, a2, s2, n2, r2) = results
    assert torch.equal(m1, m2) and torch.equal(a1, a2) and torch.equal(s1, s2)
    assert u1 is None or torch.equal(u1, u2)
    assert n1 == n2 == int(m1.sum()) and torch.equal(r1, r2)
    if frac > 0:
        assert not torch.equal(s1, sent)  # something was sent
    with pytest.raises(RuntimeError, match="argument 'write_out' must be True with the pooled measure"):
        if op.startswith("add_activation"):
            ops.add_activation(x, mask, b, mask_b, 1.0, acc.clone(), sent.clone(), "relu", 0.0, 0.05, None, True,
                               pooled=True, write_out=False)
        else:
            ops.activation(x, mask, acc.clone(), sent.clone(), "relu", 0.0, 0.05, None, True, pooled=True,
                           write_out=False)


def test_add_activation_falls_back_where_the_kernel_does_not_apply():
    """Operands of different shapes (broadcasting) or an activation without a kernel: the CUDA add
    and activation (or the reference) one after the other, with the same results."""
    fn = Activation("generic", generic=F.softplus)
    _run_add_activation(fn, torch.float32, 17, 0.3, "partial", 0.05)
    g = gen(15)
    ma, mb = make_mask(2, 5, 6, 0.5, g), make_mask(2, 1, 1, 1.0, g)
    da, db = make_delta((2, 4, 5, 6), torch.float32, ma, g), make_delta((2, 4, 1, 1), torch.float32, mb, g)
    acc, sent = make_state((2, 4, 5, 6), g), make_state((2, 4, 5, 6), g)
    a_c, s_c, a_r, s_r = clones(acc, sent, acc, sent)
    out_c, m_c, u_c = dcc.add_activation(da, ma, db, mb, 1.0, a_c, s_c, Activation("relu"), 0.0, None)
    out_r, m_r, u_r = ref.add_activation(da, ma, db, mb, 1.0, a_r, s_r, Activation("relu"), 0.0, None)
    assert torch.equal(u_c, u_r)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)
    assert_state(a_c, a_r)


def test_pooled_measure_without_a_kernel_runs_the_reference():
    """Only the activations have the pooled measure in a kernel: the product, layer norm and max
    pooling run it through the reference (the same results, bit for bit); the raw op refuses
    ``pooled`` without ``rms``."""
    g = gen(26)
    n, c, h, w = 2, 16, 9, 11
    ma, mb = make_mask(n, h, w, 0.5, g), make_mask(n, h, w, 0.3, g)
    da, db = make_delta((n, c, h, w), torch.float16, ma, g), make_delta((n, c, h, w), torch.float16, mb, g)
    acc_a, acc_b, sent = make_state((n, c, h, w), g), make_state((n, c, h, w), g), make_state((n, c, h, w), g).half()
    runs = {
        "mul": lambda ops, a, b, s: ops.mul(da, ma, a, db, mb, b, s, 0.1, None, "pooled"),
        "layer_norm": lambda ops, a, b, s: ops.layer_norm(da, ma, a, s, None, None, 1e-6, 0.1, None, "pooled"),
        "max_pool2d": lambda ops, a, b, s: ops.max_pool2d(da, ma, a, s[:, :, :4, :5].contiguous(memory_format=CL),
                                                          2, 2, 0, 1, False, 0.1, None, "pooled"),
    }
    for name, run in runs.items():
        results = []
        for ops in (dcc, ref):
            a, b, s = clones(acc_a, acc_b, sent)
            out, m = run(ops, a, b, s)
            results.append((out, m, a))
        (out_c, m_c, a_c), (out_r, m_r, a_r) = results
        assert torch.equal(m_c, m_r), name
        assert torch.equal(out_c[m_c.expand_as(out_c)], out_r[m_r.expand_as(out_r)]), name
        assert torch.equal(a_c, a_r), name
    with pytest.raises(RuntimeError, match="argument 'pooled' .* needs rms=True, got rms=False"):
        torch.ops.deltaconv.activation(da, ma, acc_a, sent, "relu", 0.0, 0.1, None, False, pooled=True)


# More pixels than the resident threads of a persistent grid (pw::for_each_active_pixel): each group
# walks several batches of pixels. 2 x 600 x 640 pixels.
LARGE = (600, 640)


@pytest.mark.parametrize("frac", [0.01, 0.3])
@pytest.mark.parametrize("c", [3, 64, 130])
def test_persistent_kernels_on_large_frames(c, frac):
    """activation, add_activation, add, affine_channel and concatenate on a frame larger than their grid."""
    dtype = torch.float16
    _run_activation(Activation("relu6"), dtype, c, frac, "partial", 0.05, seed=21, size=LARGE)
    _run_add_activation(Activation("relu"), dtype, c, frac, "partial", 0.05, seed=23, size=LARGE)
    _run_activation(Activation("relu6"), dtype, c, frac, "partial", 0.05, seed=25, size=LARGE, measure="pooled")
    _run_add_activation(Activation("relu"), dtype, c, frac, "partial", 0.05, seed=26, size=LARGE, measure="pooled")
    g = gen(22)
    n, (h, w) = 2, LARGE
    ma, mb = make_mask(n, h, w, frac, g), make_mask(n, h, w, PARTNER[frac], g)
    da, db = make_delta((n, c, h, w), dtype, ma, g), make_delta((n, c, h, w), dtype, mb, g)
    out_c, m_c = dcc.add(da, ma, db, mb, 1.0)
    out_r, m_r = ref.add(da, ma, db, mb, 1.0)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)
    scale, shift = torch.randn(c, generator=g, device=DEV), torch.randn(c, generator=g, device=DEV)
    key = make_key("partial", n)
    out_c, m_c = dcc.affine_channel(da, ma, scale, shift, key)
    out_r, m_r = ref.affine_channel(da, ma, scale, shift, key)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)
    out_c, m_c = dcc.concatenate([da, db], [ma, mb], 1)
    out_r, m_r = ref.concatenate([da, db], [ma, mb], 1)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)


def test_add_broadcast_falls_back():
    g = gen(10)
    ma, mb = make_mask(2, 5, 6, 0.5, g), make_mask(2, 1, 1, 1.0, g)
    da, db = make_delta((2, 4, 5, 6), torch.float32, ma, g), make_delta((2, 4, 1, 1), torch.float32, mb, g)
    out_c, m_c = dcc.add(da, ma, db, mb)
    out_r, m_r = ref.add(da, ma, db, mb)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)


# ----------------------------------------------------------------------------- mul
def _mul_layout(c, frac, layout, g):
    """The operands' shapes of a product (``layout``: "same", or operand a or b [N, C, 1, 1]: "se_a",
    "se_b") and their masks (the second at the partner fraction when the shapes are equal)."""
    n, (h, w) = 2, spatial(c)
    big, small = (n, c, h, w), (n, c, 1, 1)
    shape_a = small if layout == "se_a" else big
    shape_b = small if layout == "se_b" else big
    ma = make_mask(n, shape_a[2], shape_a[3], frac, g)
    mb = make_mask(n, shape_b[2], shape_b[3], PARTNER[frac] if layout == "same" else frac, g)
    return shape_a, shape_b, ma, mb


def _run_mul(dtype, c, frac, key, layout, tf32=False):
    """One mul call on the kernel and on the reference from the same states (``layout``: equal
    shapes, or operand a or b [N, C, 1, 1]); returns the kernel's output, mask and states."""
    g = gen(11)
    shape_a, shape_b, ma, mb = _mul_layout(c, frac, layout, g)
    da, db = make_delta(shape_a, dtype, ma, g, 0.3), make_delta(shape_b, dtype, mb, g, 0.3)
    acc_a, acc_b = make_state(shape_a, g), make_state(shape_b, g)
    sent = (acc_a * acc_b).contiguous(memory_format=CL)
    sent = (sent + torch.randn(sent.shape, generator=g, device=DEV) * 0.02).to(dtype).contiguous(memory_format=CL)
    k = make_key(key, da.shape[0])
    st_c = clones(acc_a, acc_b, sent)
    st_r = clones(acc_a, acc_b, sent)
    out_c, m_c = dcc.mul(da, ma, st_c[0], db, mb, st_c[1], st_c[2], 0.05, k, tf32=tf32)
    out_r, m_r = ref.mul(da, ma, st_r[0], db, mb, st_r[1], st_r[2], 0.05, k, tf32=tf32)
    assert out_c.shape == out_r.shape == sent.shape
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)
    for a, b in zip(st_c, st_r):
        assert torch.equal(a, b)  # float32 product rounded like the reference: bit-identical
    assert st_c[2].dtype == dtype
    return out_c, m_c, st_c


@pytest.mark.parametrize("layout", ["same", "se_a", "se_b"])
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mul(dtype, c, frac, key, layout):
    _run_mul(dtype, c, frac, key, layout)


@pytest.mark.parametrize("layout", ["same", "se_a"])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mul_rms_measure(dtype, frac, layout):
    g = gen(13)
    n, c, (h, w) = 2, 64, spatial(64)
    big, small = (n, c, h, w), (n, c, 1, 1)
    shape_a = small if layout == "se_a" else big
    ma, mb = make_mask(n, shape_a[2], shape_a[3], frac, g), make_mask(n, h, w, PARTNER[frac], g)
    da, db = make_delta(shape_a, dtype, ma, g, 0.3), make_delta(big, dtype, mb, g, 0.3)
    acc_a, acc_b = make_state(shape_a, g), make_state(big, g)
    sent = (acc_a * acc_b + torch.randn(big, generator=g, device=DEV) * 0.05).to(dtype).contiguous(memory_format=CL)
    st_c, st_r = clones(acc_a, acc_b, sent), clones(acc_a, acc_b, sent)
    out_c, m_c = dcc.mul(da, ma, st_c[0], db, mb, st_c[1], st_c[2], 0.04, None, "rms")
    out_r, m_r = ref.mul(da, ma, st_r[0], db, mb, st_r[1], st_r[2], 0.04, None, "rms")
    y = st_r[0] * st_r[1]
    region = ma | mb  # [N, 1, 1, 1] broadcasts
    change = torch.where(region, y.to(dtype).float() - sent.float(), torch.zeros((), device=DEV))
    amb = near_rms_threshold(change, 0.04, y, dtype) & region
    assert_masks(m_c, m_r, amb)
    assert_active(out_c, out_r, m_r & m_c, dtype)
    assert_state(st_c[2], st_r[2], skip=amb)


@pytest.mark.parametrize("layout", ["same", "se_b"])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
def test_mul_tf32_sends(c, frac, layout):
    """float32 with ``tf32``: the product sends TF32 values, bit for bit the reference's, and keeps
    what the rounding left pending in ``sent``; float16 deltas with ``tf32`` are refused."""
    out, mask, (acc_a, acc_b, sent) = _run_mul(torch.float32, c, frac, "partial", layout, tf32=True)
    assert_tf32_sends(out, mask, acc_a * acc_b, sent)
    d, m = out.half(), torch.ones_like(mask)
    with pytest.raises(RuntimeError, match="argument 'tf32' needs float32 deltas"):
        torch.ops.deltaconv.mul(d, m, acc_a, d, m, acc_b, sent.half(), 0.0, None, tf32=True)


def test_mul_general_broadcast_falls_back():
    g = gen(12)
    ma, mb = make_mask(2, 5, 6, 0.5, g), make_mask(2, 5, 1, 0.5, g)
    da, db = make_delta((2, 3, 5, 6), torch.float32, ma, g), make_delta((2, 3, 5, 1), torch.float32, mb, g)
    aa, ab = make_state(da.shape, g), make_state(db.shape, g)
    sent = torch.zeros((2, 3, 5, 6), device=DEV)
    st_c, st_r = clones(aa, ab, sent), clones(aa, ab, sent)
    out_c, m_c = dcc.mul(da, ma, st_c[0], db, mb, st_c[1], st_c[2], 0.0, None)
    out_r, m_r = ref.mul(da, ma, st_r[0], db, mb, st_r[1], st_r[2], 0.0, None)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)


def _mul_values_case(dtype, c, frac, layout, seed):
    """Operands whole at every pixel (no NaN: the kernel reads both on the whole region) with masks of
    :func:`_mul_layout`, and a ``sent`` near their product."""
    g = gen(seed)
    shape_a, shape_b, ma, mb = _mul_layout(c, frac, layout, g)
    a, b = make_state(shape_a, g).to(dtype), make_state(shape_b, g).to(dtype)
    y = a.float() * b.float()
    sent = (y + torch.randn(y.shape, generator=g, device=DEV) * 0.05).to(dtype).contiguous(memory_format=CL)
    return a, ma, b, mb, sent, y


@pytest.mark.parametrize("layout", ["same", "se_a", "se_b"])
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mul_values(dtype, c, frac, key, layout):
    """A product of whole operands (value mode, no accumulators): the reference's mask, output and
    ``sent`` bit for bit (one float32 multiply, as the reference computes it)."""
    a, ma, b, mb, sent, _ = _mul_values_case(dtype, c, frac, layout, seed=27)
    k = make_key(key, a.shape[0])
    s_c, s_r = clones(sent, sent)
    out_c, m_c = dcc.mul_values(a, ma, b, mb, s_c, 0.05, k)
    out_r, m_r = ref.mul_values(a, ma, b, mb, s_r, 0.05, k)
    assert out_c.shape == out_r.shape == sent.shape
    assert torch.equal(m_c, m_r)
    sel = m_r.expand_as(out_r)
    assert torch.equal(out_c[sel], out_r[sel])
    assert torch.equal(s_c, s_r)


@pytest.mark.parametrize("layout", ["same", "se_b"])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mul_values_rms_measure_and_tf32(dtype, frac, layout):
    """The RMS measure (the kernel sums the squares in another order: pixels near the threshold may
    go either way) and, in float32, TF32 sends bit for bit the reference's."""
    a, ma, b, mb, sent, y = _mul_values_case(dtype, 64, frac, layout, seed=28)
    s_c, s_r = clones(sent, sent)
    out_c, m_c = dcc.mul_values(a, ma, b, mb, s_c, 0.04, None, "rms")
    out_r, m_r = ref.mul_values(a, ma, b, mb, s_r, 0.04, None, "rms")
    region = ma | mb
    change = torch.where(region, y.to(dtype).float() - sent.float(), torch.zeros((), device=DEV))
    amb = near_rms_threshold(change, 0.04, y, dtype) & region
    assert_masks(m_c, m_r, amb)
    assert_active(out_c, out_r, m_r & m_c, dtype)
    assert_state(s_c, s_r, skip=amb)
    if dtype == torch.float32:
        s_c, s_r = clones(sent, sent)
        out_c, m_c = dcc.mul_values(a, ma, b, mb, s_c, 0.05, None, tf32=True)
        out_r, m_r = ref.mul_values(a, ma, b, mb, s_r, 0.05, None, tf32=True)
        assert torch.equal(m_c, m_r) and torch.equal(s_c, s_r)
        assert torch.equal(out_c[m_r.expand_as(out_r)], out_r[m_r.expand_as(out_r)])
        assert_tf32_sends(out_c, m_c, y, s_c)


def test_mul_values_errors_name_the_argument():
    d, m, s = _err_inputs()
    op = torch.ops.deltaconv.mul_values
    with pytest.raises(RuntimeError, match=r"mul_values: arguments 'a' .* and 'b' .* must have equal shapes"):
        op(d, m, d[:, :, :2].contiguous(memory_format=CL), m[:, :, :2].contiguous(), s, 0.0, None)
    with pytest.raises(RuntimeError, match=r"mul_values: argument 'sent' must have dtype Half, got Float"):
        op(d.half(), m, d.half(), m, s, 0.0, None)
    with pytest.raises(RuntimeError, match=r"mul_values: argument 'b' must have dtype Float, got Half"):
        op(d, m, d.half(), m, s, 0.0, None)
    with pytest.raises(RuntimeError, match=r"mul_values: argument 'mask_b' must have shape \[2, 1, 1, 1\]"):
        op(d, m, d[:, :, :1, :1].contiguous(memory_format=CL), m, s, 0.0, None)
    with pytest.raises(RuntimeError, match="argument 'tf32' needs float32 deltas"):
        op(d.half(), m, d.half(), m, s.half(), 0.0, None, tf32=True)


def test_mul_values_general_broadcast_falls_back():
    """Operands broadcast other than squeeze-excite's ``[N, C, 1, 1]``: the reference, on the device."""
    g = gen(29)
    ma, mb = make_mask(2, 5, 6, 0.5, g), make_mask(2, 5, 1, 0.5, g)
    a, b = make_state((2, 3, 5, 6), g), make_state((2, 3, 5, 1), g)
    s_c, s_r = torch.zeros((2, 3, 5, 6), device=DEV), torch.zeros((2, 3, 5, 6), device=DEV)
    out_c, m_c = dcc.mul_values(a, ma, b, mb, s_c, 0.0, None)
    out_r, m_r = ref.mul_values(a, ma, b, mb, s_r, 0.0, None)
    assert torch.equal(m_c, m_r) and torch.equal(s_c, s_r)


# ----------------------------------------------------------------------------- layer_norm
def _layer_norm_y(acc, weight, bias, eps):
    """The reference's new value (before rounding) of a layer norm over dim 1, in float32."""
    x = acc.movedim(1, -1)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps).movedim(-1, 1)


def _run_layer_norm(dtype, c, frac, key, threshold, affine=True, measure="max", seed=13, n=2, size=None,
                    tf32=False):
    g = gen(seed)
    h, w = size or spatial(c)
    mask = make_mask(n, h, w, frac, g)
    delta = make_delta((n, c, h, w), dtype, mask, g, scale=0.3)
    acc = make_state((n, c, h, w), g, scale=2.0) + 0.5  # a mean off zero, as after a residual add
    weight = (1.0 + 0.3 * torch.randn(c, generator=g, device=DEV)) if affine else None
    bias = (0.2 * torch.randn(c, generator=g, device=DEV)) if affine else None
    eps = 1e-6
    y0 = _layer_norm_y(acc, weight, bias, eps)
    sent = (y0 + torch.randn(acc.shape, generator=g, device=DEV) * 0.02).to(dtype).contiguous(memory_format=CL)
    k = make_key(key, n)
    a_c, s_c, a_r, s_r = clones(acc, sent, acc, sent)
    w_, b_ = (None, None) if weight is None else (weight.to(dtype), bias.to(dtype))
    out_c, m_c = dcc.layer_norm(delta, mask, a_c, s_c, w_, b_, eps, threshold, k, measure, tf32=tf32)
    out_r, m_r = ref.layer_norm(delta, mask, a_r, s_r, w_, b_, eps, threshold, k, measure, tf32=tf32)
    # the kernel sums mean and variance in another order than PyTorch: decisions within rounding of
    # the threshold may differ
    y = _layer_norm_y(a_r, None if w_ is None else w_.float(), None if b_ is None else b_.float(), eps)
    change = torch.where(mask, y.to(dtype).float() - sent.float(), torch.zeros((), device=DEV))
    amb = ambiguous(change, threshold, y, dtype, measure) & mask
    assert_masks(m_c, m_r, amb)
    if tf32:  # a change computed in another order may round to the TF32 step beside the reference's
        sel = (m_r & m_c).expand_as(out_r)
        step = torch.where(sel, out_r.abs(), 0.0) * 2.0 ** -10 + 1e-5  # one TF32 step of the change
        assert ((out_c - out_r).abs()[sel] <= step[sel]).all()
        keep = ~amb.expand_as(s_r)
        assert ((s_c - s_r).abs()[keep] <= step[keep]).all()
        y_c = _layer_norm_y(a_c, None if w_ is None else w_.float(), None if b_ is None else b_.float(), eps)
        assert_tf32_sends(out_c, m_c, y_c, s_c, atol=1e-5)
    else:
        assert_active(out_c, out_r, m_r & m_c, dtype)
        assert_state(s_c, s_r, skip=amb)
    assert_state(a_c, a_r)
    return m_r


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(dtype, c, frac, key):
    _run_layer_norm(dtype, c, frac, key, 0.05)


@pytest.mark.parametrize("threshold", [0.0, 0.15])
@pytest.mark.parametrize("c", [17, 96] if QUICK else [3, 17, 96, 384, 768])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_widths_affine_and_rms(dtype, c, threshold):
    """ConvNeXt's widths (96-768 channels, several packs per lane), without weight and bias, and the
    rms measure, which sends a different set of pixels than max at 0.15 (so the kernel applies it)."""
    size = (9, 11)
    _run_layer_norm(dtype, c, 0.3, "partial", threshold, size=size)
    _run_layer_norm(dtype, c, 0.3, "partial", threshold, affine=False, size=size)
    m_rms = _run_layer_norm(dtype, c, 0.3, "none", threshold, measure="rms", size=size)
    if threshold > 0:
        m_max = _run_layer_norm(dtype, c, 0.3, "none", threshold, size=size)
        assert not torch.equal(m_rms, m_max)


@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("c", [3, 17, 96] if QUICK else [3, 17, 64, 96, 384, 768])
def test_layer_norm_tf32_sends(c, frac):
    """float32 with ``tf32``: the layer norm sends TF32 values, those of the reference up to the
    TF32 step its own order of summation may cross, and keeps what the rounding left pending in
    ``sent``; float16 deltas with ``tf32`` are refused."""
    _run_layer_norm(torch.float32, c, frac, "partial", 0.05, size=(9, 11), tf32=True)
    _run_layer_norm(torch.float32, c, frac, "none", 0.0, measure="rms", size=(9, 11), tf32=True)
    g = gen(16)
    mask = make_mask(1, 3, 4, 0.5, g)
    delta = make_delta((1, c, 3, 4), torch.float16, mask, g)
    acc, sent = make_state(delta.shape, g), make_state(delta.shape, g).half()
    with pytest.raises(RuntimeError, match="argument 'tf32' needs float32 deltas"):
        torch.ops.deltaconv.layer_norm(delta, mask, acc, sent, None, None, 1e-5, 0.0, None, tf32=True)


def test_layer_norm_rank2():
    """A layer norm over the features of [N, C] (a classifier head's) runs through the kernel."""
    g = gen(14)
    weight, bias = torch.rand(40, generator=g, device=DEV), torch.randn(40, generator=g, device=DEV)
    run_rank2(14, 40, lambda ops, d, m, a, s: ops.layer_norm(d, m, a, s, weight, bias, 1e-5, 0.0, None))


def test_layer_norm_checks_name_the_argument():
    g = gen(15)
    n, c, h, w = 1, 8, 3, 4
    mask = make_mask(n, h, w, 0.5, g)
    delta = make_delta((n, c, h, w), torch.float32, mask, g)
    acc, sent = make_state((n, c, h, w), g), make_state((n, c, h, w), g)
    with pytest.raises(RuntimeError, match="argument 'weight' must have shape"):
        torch.ops.deltaconv.layer_norm(delta, mask, acc, sent, torch.ones(c + 1, device=DEV), None, 1e-5, 0.0, None)
    with pytest.raises(RuntimeError, match="argument 'eps' must be >= 0"):
        torch.ops.deltaconv.layer_norm(delta, mask, acc, sent, None, None, -1.0, 0.0, None)


# ----------------------------------------------------------------------------- concatenate
CONCATS = [(1,), (3, 17), (32, 64, 130), (4, 8, 4), (1, 3, 17, 32)]


@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("chans", CONCATS[1:3] if QUICK else CONCATS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_concatenate(dtype, chans, frac):
    g = gen(13)
    n, (h, w) = 2, spatial(chans[0])
    fr = [frac, PARTNER[frac]]
    masks = [make_mask(n, h, w, fr[i % 2], g) for i in range(len(chans))]
    deltas = [make_delta((n, c, h, w), dtype, m, g) for c, m in zip(chans, masks)]
    out_c, m_c = dcc.concatenate(deltas, masks, 1)
    out_r, m_r = ref.concatenate(deltas, masks, 1)
    assert out_c.shape == out_r.shape
    assert_masks(m_c, m_r)
    sel = m_r.expand_as(out_r)
    assert torch.equal(out_c[sel], out_r[sel])


@pytest.mark.parametrize("count", [33, 70])
@pytest.mark.parametrize("dim", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_concatenate_more_deltas_than_one_launch_takes(dtype, dim, count, monkeypatch):
    """More than the kernel's 32 inputs (DenseNet-169 / 201) are joined in steps on the device, not by
    the reference's torch ops, with the reference's values and mask (2-D deltas come back 2-D)."""
    g = gen(15)
    n, h, w = (2, 1, 1) if dim == 2 else (2, 9, 11)
    masks = [make_mask(n, h, w, FRACS[i % len(FRACS)], g) for i in range(count)]
    deltas = [make_delta((n, 8 * (1 + i % 3), h, w), dtype, m, g) for i, m in enumerate(masks)]
    if dim == 2:
        deltas, masks = [d.reshape(n, -1) for d in deltas], [m.reshape(n, 1) for m in masks]
    out_r, m_r = ref.concatenate(deltas, masks, 1)
    monkeypatch.setattr(dcc._ref, "concatenate", lambda *a: pytest.fail("fell back to the reference"))
    out_c, m_c = dcc.concatenate(deltas, masks, 1)
    assert out_c.shape == out_r.shape and m_c.shape == m_r.shape
    assert torch.equal(m_c, m_r)
    sel = m_r.expand_as(out_r)
    assert torch.equal(out_c[sel], out_r[sel])


# ----------------------------------------------------------------------------- interleave_channels
@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("chans", [3, 64] if QUICK else CHANNELS + [116, 232])
@pytest.mark.parametrize("dtype", DTYPES)
def test_interleave_channels(dtype, chans, frac, parts):
    """ShuffleNet V2's concatenation, shuffle and split in one pass: the reference's values at every
    active pixel of each part (every part channels_last contiguous) and its mask."""
    g = gen(16)
    n, (h, w) = 2, spatial(chans)
    ma, mb = make_mask(n, h, w, frac, g), make_mask(n, h, w, PARTNER[frac], g)
    da, db = make_delta((n, chans, h, w), dtype, ma, g), make_delta((n, chans, h, w), dtype, mb, g)
    out_c, m_c = dcc.interleave_channels(da, ma, db, mb, parts)
    out_r, m_r = ref.interleave_channels(da, ma, db, mb, parts)
    assert_masks(m_c, m_r)
    assert len(out_c) == len(out_r) == parts
    for part_c, part_r in zip(out_c, out_r):
        assert part_c.shape == part_r.shape == (n, 2 * chans // parts, h, w) and part_c.dtype == dtype
        assert part_c.is_contiguous(memory_format=CL)
        sel = m_r.expand_as(part_r)
        assert torch.equal(part_c[sel], part_r[sel])


def test_interleave_channels_outside_the_kernel_falls_back():
    """More than two parts, or parts that do not divide the channels, run the reference's ops."""
    g = gen(17)
    ma, mb = make_mask(1, 5, 6, 0.3, g), make_mask(1, 5, 6, 0.3, g)
    da, db = make_delta((1, 6, 5, 6), torch.float16, ma, g), make_delta((1, 6, 5, 6), torch.float16, mb, g)
    for parts in (3, 4):
        out_c, m_c = dcc.interleave_channels(da, ma, db, mb, parts)
        out_r, m_r = ref.interleave_channels(da, ma, db, mb, parts)
        assert [p.shape for p in out_c] == [p.shape for p in out_r] and torch.equal(m_c, m_r)
        for part_c, part_r in zip(out_c, out_r):
            assert torch.equal(part_c[m_r.expand_as(part_r)], part_r[m_r.expand_as(part_r)])


def test_interleave_channels_errors_name_the_argument():
    g = gen(18)
    m = make_mask(1, 4, 5, 0.5, g)
    a = make_delta((1, 4, 4, 5), torch.float32, m, g)
    ops = torch.ops.deltaconv
    with pytest.raises(RuntimeError, match="argument 'parts' must be 1 or 2, got 3"):
        ops.interleave_channels(a, m, a, m, 3)
    with pytest.raises(RuntimeError, match=r"argument 'delta_b' must have shape \[1, 4, 4, 5\]"):
        ops.interleave_channels(a, m, make_delta((1, 6, 4, 5), torch.float32, m, g), m, 2)
    with pytest.raises(RuntimeError, match="argument 'delta_b' must have dtype Float"):
        ops.interleave_channels(a, m, a.half(), m, 2)


def test_concatenate_other_dim_falls_back():
    g = gen(14)
    masks = [make_mask(2, 4, 5, 0.5, g) for _ in range(2)]
    deltas = [make_delta((2, 3, 4, 5), torch.float32, m, g) for m in masks]
    out_c, m_c = dcc.concatenate(deltas, masks, 2)
    out_r, m_r = ref.concatenate(deltas, masks, 2)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)


# ----------------------------------------------------------------------------- interpolate
RESAMPLES = [  # (size, scale_factor)
    (None, 2.0), (None, 0.5), (None, (1.7, 2.3)), ((15, 20), None), ((4, 5), None), (1, None), (None, 3),
]
# (mode, align_corners) of interpolate and resample
RESAMPLE_MODES = [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bilinear", True)]


@pytest.mark.parametrize("resample", RESAMPLES[:3] if QUICK else RESAMPLES, ids=str)
@pytest.mark.parametrize("mode,align", RESAMPLE_MODES)
@pytest.mark.parametrize("c", [3, 64] if QUICK else [1, 3, 17, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_interpolate(dtype, c, mode, align, resample):
    size, scale = resample
    g = gen(15)
    n, (h, w) = 2, spatial(c)
    mask = make_mask(n, h, w, 0.05 if c in (3, 64) else 0.3, g)
    delta = make_delta((n, c, h, w), dtype, mask, g)
    out_c, m_c = dcc.interpolate(delta, mask, size, scale, mode, align)
    out_r, m_r = ref.interpolate(delta, mask, size, scale, mode, align)
    assert out_c.shape == out_r.shape and out_c.is_contiguous(memory_format=CL)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, dtype)


@pytest.mark.parametrize("frac", FRACS)
def test_interpolate_fracs(frac):
    g = gen(16)
    mask = make_mask(2, 7, 9, frac, g)
    delta = make_delta((2, 17, 7, 9), torch.float32, mask, g)
    for mode, align in (("nearest", None), ("bilinear", False)):
        out_c, m_c = dcc.interpolate(delta, mask, None, 2.0, mode, align)
        out_r, m_r = ref.interpolate(delta, mask, None, 2.0, mode, align)
        assert_masks(m_c, m_r)
        assert_active(out_c, out_r, m_r, torch.float32)


def test_interpolate_area_falls_back():
    g = gen(17)
    mask = make_mask(2, 8, 8, 0.3, g)
    delta = make_delta((2, 5, 8, 8), torch.float32, mask, g)
    out_c, m_c = dcc.interpolate(delta, mask, (4, 4), None, "area", None)
    out_r, m_r = ref.interpolate(delta, mask, (4, 4), None, "area", None)
    assert_masks(m_c, m_r)
    assert_active(out_c, out_r, m_r, torch.float32)


@pytest.mark.parametrize("resample", RESAMPLES[:3] if QUICK else RESAMPLES, ids=str)
@pytest.mark.parametrize("mode,align", RESAMPLE_MODES)
@pytest.mark.parametrize("c", [3, 21] if QUICK else [1, 3, 21, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_resample(dtype, c, mode, align, resample):
    """Dense resampling of a channels_last map (the output densifier's) into NCHW: F.interpolate's
    values (nearest: the same elements; bilinear: within rounding), odd output widths too (the
    runs of 8 columns that end inside a row)."""
    size, scale = resample
    g = gen(19)
    n, (h, w) = 2, spatial(c)
    x = torch.randn((n, c, h, w), generator=g, device=DEV).to(dtype).contiguous(memory_format=CL)
    out_c = dcc.resample(x, size, scale, mode, align)
    out_r = ref.resample(x, size, scale, mode, align)
    assert out_c.shape == out_r.shape and out_c.is_contiguous() and out_c.dtype == dtype
    if mode == "bilinear":
        torch.testing.assert_close(out_c, out_r, **TOL[dtype])
    else:
        assert torch.equal(out_c, out_r)


@pytest.mark.parametrize("mode,width", [("bilinear", 200), ("nearest", 400)])
def test_resample_rows_too_wide_for_shared_memory(mode, width):
    """Input rows (two for bilinear, one for nearest) larger than 48 KiB: the kernel that reads every
    neighbour from global memory instead of a row per block in shared memory, same results."""
    g = gen(24)
    x = torch.randn((2, 64, 5, width), generator=g, device=DEV).half().contiguous(memory_format=CL)
    for size, scale in (((9, 2 * width - 3), None), (None, 1.5)):
        out_c = dcc.resample(x, size, scale, mode, False)
        out_r = ref.resample(x, size, scale, mode, False)
        torch.testing.assert_close(out_c, out_r, **TOL[torch.float16])


def test_resample_falls_back_and_checks_arguments():
    x = torch.randn((1, 5, 8, 8), device=DEV).contiguous(memory_format=CL)
    torch.testing.assert_close(dcc.resample(x, (4, 4), None, "area", None), ref.resample(x, (4, 4), None, "area", None))
    with pytest.raises(RuntimeError, match=r"resample: argument 'mode' must be 'nearest', 'nearest-exact' or "
                                           r"'bilinear', got 'bicubic'"):
        torch.ops.deltaconv.resample(x, [4, 4], None, None, "bicubic", False)
    with pytest.raises(RuntimeError, match=r"resample: argument 'x' must be channels_last contiguous"):
        torch.ops.deltaconv.resample(x.contiguous(), [4, 4], None, None, "nearest", False)


# ----------------------------------------------------------------------------- count_active
SHAPES_COUNT = [(1, 1, 1, 1), (2, 1, 7, 9), (1, 1, 33, 65), (3, 1, 270, 481), (1, 1, 1080, 1920)]


@pytest.mark.parametrize("frac", [0.0, 0.01, 0.5, 1.0])
def test_count_active(frac):
    """One launch for many masks: stats[i][0] = active pixels of mask i, stats[i][1] accumulates,
    the scratch pair returns to zero; equal to the reference for masks of different sizes, 16-byte
    aligned and at odd byte offsets, and for more masks than one launch takes (256)."""
    g = gen(50)
    masks = []
    for shape in SHAPES_COUNT:
        flat = torch.rand(shape[0] * shape[2] * shape[3] + 3, generator=g, device=DEV) < frac
        masks += [flat[:-3].view(shape), flat[3:].view(shape)]  # aligned, then offset by 3 bytes
    masks = masks * 26  # 260 masks: two launches
    stats = [torch.zeros(4, dtype=torch.float64, device=DEV) for _ in masks]
    expect = [torch.zeros(4, dtype=torch.float64) for _ in masks]
    for _ in range(2):
        dcc.count_active(masks, stats)
        ref.count_active([m.cpu() for m in masks], expect)
        for i, (s_, e) in enumerate(zip(stats, expect)):
            assert torch.equal(s_.cpu(), e), (i, s_, e)
    assert all(s_[2:].abs().sum().item() == 0.0 for s_ in stats)


@pytest.mark.skipif(bool(os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")),
                    reason="graph capture needs PyTorch's caching allocator")
def test_count_active_in_cuda_graph():
    g = gen(51)
    m_s = [torch.zeros((2, 1, 45, 77), dtype=torch.bool, device=DEV), torch.zeros((1, 1, 9, 5), dtype=torch.bool,
                                                                                   device=DEV)]
    stats = [torch.zeros(4, dtype=torch.float64, device=DEV) for _ in m_s]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dcc.count_active(m_s, stats)
    for s_ in stats:
        s_.zero_()
    totals = [0, 0]
    for _ in range(5):
        for i, m in enumerate(m_s):
            new = torch.rand(m.shape, generator=g, device=DEV) < 0.3
            m.copy_(new)
            totals[i] += int(new.sum())
        graph.replay()
        for i, m in enumerate(m_s):
            assert stats[i][0].item() == int(m.sum()) and stats[i][1].item() == totals[i]


def test_count_active_errors_name_the_argument():
    m = torch.ones((1, 1, 4, 4), dtype=torch.bool, device=DEV)
    s64 = torch.zeros(4, dtype=torch.float64, device=DEV)
    with pytest.raises(RuntimeError, match=r"'stats\[1\]' must have dtype"):
        torch.ops.deltaconv.count_active([m, m], [s64, torch.zeros(4, device=DEV)])
    with pytest.raises(RuntimeError, match=r"'masks\[0\]' must have dtype"):
        torch.ops.deltaconv.count_active([m.float()], [s64])
    with pytest.raises(RuntimeError, match=r"'stats\[0\]' must have shape"):
        torch.ops.deltaconv.count_active([m], [torch.zeros(2, dtype=torch.float64, device=DEV)])
    with pytest.raises(RuntimeError, match="same length"):
        torch.ops.deltaconv.count_active([m, m], [s64])


# ----------------------------------------------------------------------------- opcheck
def _opcheck_cases():
    """(op name, args) with every output pixel written (all-active masks, threshold -1)."""
    g = gen(20)
    n, c, h, w = 2, 12, 5, 7
    cl = lambda t: t.contiguous(memory_format=CL)  # noqa: E731
    x = cl(torch.randn((n, c, h, w), generator=g, device=DEV))
    st = lambda shape=(n, c, h, w): cl(torch.randn(shape, generator=g, device=DEV))  # noqa: E731
    full = torch.ones((n, 1, h, w), dtype=torch.bool, device=DEV)
    key = torch.tensor([True, False], device=DEV)
    small, small_m = cl(torch.randn((n, c, 1, 1), generator=g, device=DEV)), torch.ones((n, 1, 1, 1), dtype=torch.bool,
                                                                                        device=DEV)
    slopes = torch.linspace(-0.5, 0.5, c, device=DEV)  # PReLU's per-channel slopes
    ops = torch.ops.deltaconv
    return [
        ("sparsify", ops.sparsify.default, (x, st(), -1.0, key, None)),
        ("sparsify_measure", ops.sparsify.default, (x, st(), 0.5, None, torch.ones((n, 1, h, w), device=DEV))),
        ("densify", ops.densify.default, (x, full, st(), torch.float16)),
        ("activation", ops.activation.default, (x, full, st(), st(), "silu", 0.0, -1.0, key)),
        ("activation_rms", ops.activation.default, (x, full, st(), st(), "silu", 0.0, -1.0, key, True)),
        ("activation_pooled", ops.activation.default,
         (x, full, st(), st(), "relu6", 0.0, -1.0, key, True, None, None, False, True)),
        ("activation_values", ops.activation_values.default, (x, full, st(), "relu6", 0.0, -1.0, key)),
        ("activation_values_rms", ops.activation_values.default, (x.half(), full, st().half(), "silu", 0.0, -1.0, None,
                                                                   True)),
        ("activation_values_pooled", ops.activation_values.default,
         (x, full, st(), "relu6", 0.0, -1.0, key, True, None, None, False, True)),
        ("affine_channel", ops.affine_channel.default,
         (x, full, torch.randn(c, device=DEV), torch.randn(c, device=DEV), key)),
        ("affine_channel_none", ops.affine_channel.default, (x.half(), full, None, None, None)),
        ("add", ops.add.default, (x, full, st(), full, 0.5)),
        ("add_values", ops.add_values.default, (x, full, st(), full, -0.5, st())),
        ("add_activation", ops.add_activation.default, (x, full, st(), full, -0.5, st(), st(), "relu", 0.0, -1.0, key)),
        ("add_activation_rms", ops.add_activation.default,
         (x, full, st(), full, 1.0, st(), st(), "hardswish", 0.0, -1.0, None, True)),
        ("add_activation_pooled", ops.add_activation.default,
         (x.half(), full, st().half(), full, 1.0, st(), st().half(), "relu", 0.0, -1.0, key, True, None, None, False,
          True)),
        ("add_activation_values", ops.add_activation_values.default,
         (x, full, st(), full, -0.5, st(), "relu", 0.0, -1.0, key)),
        ("add_activation_values_rms", ops.add_activation_values.default,
         (x.half(), full, st().half(), full, 1.0, st().half(), "hardswish", 0.0, -1.0, None, True)),
        ("mul", ops.mul.default, (x, full, st(), st(), full, st(), st(), -1.0, key)),
        ("mul_rms", ops.mul.default, (x, full, st(), st(), full, st(), st(), -1.0, key, True)),
        ("mul_se", ops.mul.default, (small, small_m, st((n, c, 1, 1)), x, full, st(), st(), -1.0, None)),
        ("mul_values", ops.mul_values.default, (x, full, st(), full, st(), -1.0, key)),
        ("mul_values_se", ops.mul_values.default, (x, full, small, small_m, st(), 0.1, None, True)),
        ("layer_norm", ops.layer_norm.default,
         (x, full, st(), st(), torch.randn(c, device=DEV), torch.randn(c, device=DEV), 1e-6, -1.0, key)),
        ("layer_norm_rms", ops.layer_norm.default, (x.half(), full, st(), st().half(), None, None, 1e-5, -1.0, None,
                                                    True)),
        ("concatenate", ops.concatenate.default, ([x, st((n, 3, h, w))], [full, full])),
        ("interleave_channels", ops.interleave_channels.default, (x, full, st(), full, 2)),
        ("interpolate_nearest", ops.interpolate.default, (x, full, [9, 15], 2.0, 2.0, "nearest", False)),
        ("interpolate_bilinear", ops.interpolate.default, (x, full, [11, 4], None, None, "bilinear", True)),
        ("resample", ops.resample.default, (x, [11, 19], None, None, "bilinear", False)),
        ("count_active", ops.count_active.default,
         ([full, full[:1]], [torch.zeros(4, dtype=torch.float64, device=DEV) for _ in range(2)])),
        ("activation_prelu", ops.activation.default,
         (x, full, st(), st(), "prelu", 0.0, -1.0, key, False, None, None, False, False, True, slopes)),
        ("activation_values_prelu_pooled", ops.activation_values.default,
         (x.half(), full, st().half(), "prelu", 0.0, -1.0, key, True, None, None, False, True, True, slopes)),
        ("add_activation_values_prelu", ops.add_activation_values.default,
         (x, full, st(), full, -0.5, st(), "prelu", 0.0, -1.0, None, True, None, None, False, True, slopes)),
    ]


@pytest.mark.parametrize("case", range(34))
def test_opcheck(case):
    name, op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)


# ----------------------------------------------------------------------------- errors
def _err_inputs():
    n, c, h, w = 2, 4, 3, 5
    d = torch.randn((n, c, h, w), device=DEV).contiguous(memory_format=CL)
    m = torch.ones((n, 1, h, w), dtype=torch.bool, device=DEV)
    s = torch.zeros((n, c, h, w), device=DEV).contiguous(memory_format=CL)
    return d, m, s


def test_error_wrong_mask_dtype_names_argument():
    d, m, _ = _err_inputs()
    with pytest.raises(RuntimeError, match=r"add: argument 'mask_b' must have dtype Bool, got Float"):
        torch.ops.deltaconv.add(d, m, d, m.float(), 1.0)


def test_error_add_activation_names_argument():
    d, m, s = _err_inputs()
    with pytest.raises(RuntimeError, match=r"add_activation: argument 'delta_b' must have shape \[2, 4, 3, 5\], got"):
        torch.ops.deltaconv.add_activation(d, m, d[:, :2].contiguous(memory_format=CL), m, 1.0, s, s.clone(), "relu",
                                           0.0, 0.0, None)
    with pytest.raises(RuntimeError, match=r"add_activation: argument 'kind' must be one of"):
        torch.ops.deltaconv.add_activation(d, m, d, m, 1.0, s, s.clone(), "softplus", 0.0, 0.0, None)


def test_error_add_activation_values_names_argument():
    d, m, s = _err_inputs()
    with pytest.raises(RuntimeError, match=r"add_activation_values: argument 'b' must have shape \[2, 4, 3, 5\], got"):
        torch.ops.deltaconv.add_activation_values(d, m, d[:, :2].contiguous(memory_format=CL), m, 1.0, s, "relu", 0.0,
                                                  0.0, None)
    with pytest.raises(RuntimeError, match=r"add_activation_values: argument 'sent' must have dtype Half, got Float"):
        torch.ops.deltaconv.add_activation_values(d.half(), m, d.half(), m, 1.0, s, "relu", 0.0, 0.0, None)


def test_error_wrong_device_names_argument():
    d, m, s = _err_inputs()
    with pytest.raises(RuntimeError, match=r"activation: argument 'sent' must be a CUDA tensor, got device cpu"):
        torch.ops.deltaconv.activation(d, m, s, s.cpu(), "relu", 0.0, 0.0, None)


def test_error_wrong_layout_names_argument():
    d, m, s = _err_inputs()
    with pytest.raises(RuntimeError, match=r"affine_channel: argument 'delta' must be channels_last contiguous"):
        torch.ops.deltaconv.affine_channel(d.contiguous(), m, None, None, None)
    with pytest.raises(RuntimeError, match=r"densify: argument 'acc' .* must be channels_last contiguous"):
        torch.ops.deltaconv.densify(d, m, s.contiguous(), torch.float32)


def test_error_wrong_value_dtype_names_argument():
    d, m, s = _err_inputs()
    with pytest.raises(RuntimeError, match=r"sparsify: argument 'x' must be float32, float16 or bfloat16, got Double"):
        torch.ops.deltaconv.sparsify(d.double(), s, 0.0, None, None)
    with pytest.raises(RuntimeError, match=r"sparsify: argument 'sent' must have dtype Float, got Half"):
        torch.ops.deltaconv.sparsify(d, s.half(), 0.0, None, None)


def test_error_shapes_key_kind_mode():
    d, m, s = _err_inputs()
    with pytest.raises(RuntimeError, match=r"argument 'mask' must have shape \[2, 1, 3, 5\], got \[2, 1, 3, 4\]"):
        torch.ops.deltaconv.interpolate(d, m[..., :4].contiguous(), [6, 10], None, None, "nearest", False)
    with pytest.raises(RuntimeError, match=r"argument 'key' must have dtype Bool, got Long"):
        torch.ops.deltaconv.affine_channel(d, m, None, None, torch.ones(2, dtype=torch.long, device=DEV))
    with pytest.raises(RuntimeError, match=r"argument 'kind' must be one of .* got 'mish'"):
        torch.ops.deltaconv.activation(d, m, s, s.clone(), "mish", 0.0, 0.0, None)
    with pytest.raises(RuntimeError, match=r"argument 'mode' must be .* got 'bicubic'"):
        torch.ops.deltaconv.interpolate(d, m, [6, 10], None, None, "bicubic", False)
    with pytest.raises(RuntimeError, match=r"mul: arguments 'delta_a' .* and 'delta_b'"):
        torch.ops.deltaconv.mul(d, m, s, d[:, :, :2].contiguous(memory_format=CL), m[:, :, :2].contiguous(),
                                s[:, :, :2].contiguous(memory_format=CL), s.clone(), 0.0, None)


# ----------------------------------------------------------------------------- CUDA graphs, torch.compile
def _pipeline(x, xg, st, key, scale, shift):
    """A frame through a chain of ops (SE gate, upsampling, concat); returns a dense output."""
    d, m = dcc.sparsify(x, st["s0"], 0.05, key)
    d, m = dcc.affine_channel(d, m, scale, shift, key)
    a, am = dcc.activation(d, m, st["a1"], st["s1"], Activation("relu6"), 0.02, key)
    r, rm = dcc.add(a, am, d, m, 1.0)
    gd, gm = dcc.sparsify(xg, st["sg"], 0.0, key)
    gd, gm = dcc.activation(gd, gm, st["ag"], st["sgo"], Activation("hardsigmoid"), 0.0, key)
    p, pm = dcc.mul(gd, gm, st["ma"], r, rm, st["mb"], st["ms"], 0.01, key)
    u, um = dcc.interpolate(p, pm, None, 2.0, "bilinear", False)
    v, vm = dcc.interpolate(r, rm, None, 2.0, "nearest", None)
    cat, cm = dcc.concatenate([u, v], [um, vm], 1)
    return dcc.densify(cat, cm, st["out"], torch.float32)


def _pipeline_state(n, c, h, w):
    cl = lambda shape: torch.zeros(shape, device=DEV).contiguous(memory_format=CL)  # noqa: E731
    big, small = (n, c, h, w), (n, c, 1, 1)
    return {"s0": cl(big), "a1": cl(big), "s1": cl(big), "sg": cl(small), "ag": cl(small), "sgo": cl(small),
            "ma": cl(small), "mb": cl(big), "ms": cl(big), "out": cl((n, 2 * c, 2 * h, 2 * w))}


@pytest.mark.skipif(bool(os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")),
                    reason="graph capture needs PyTorch's caching allocator")
def test_cuda_graph_capture_and_replay():
    g = gen(30)
    n, c, h, w = 2, 24, 9, 11
    frames = [(torch.randn((n, c, h, w), generator=g, device=DEV).contiguous(memory_format=CL),
               torch.randn((n, c, 1, 1), generator=g, device=DEV).contiguous(memory_format=CL)) for _ in range(4)]
    for i in range(1, 4):  # later frames change a little, in places
        moved = torch.rand((n, 1, h, w), generator=g, device=DEV) < 0.2
        frames[i] = (torch.where(moved, frames[i][0], frames[i - 1][0]).contiguous(memory_format=CL),
                     frames[i - 1][1] + 0.1 * frames[i][1])
    keys = [torch.ones(n, dtype=torch.bool, device=DEV)] + [torch.zeros(n, dtype=torch.bool, device=DEV)] * 3
    scale, shift = torch.rand(c, generator=g, device=DEV) + 0.5, torch.randn(c, generator=g, device=DEV)

    # eager reference run
    st_e = _pipeline_state(n, c, h, w)
    eager = [_pipeline(x, xg, st_e, k, scale, shift).clone() for (x, xg), k in zip(frames, keys)]

    # static buffers, warm-up on a side stream, capture, then replay frame by frame
    st_g = _pipeline_state(n, c, h, w)
    x_s, xg_s, k_s = frames[0][0].clone(), frames[0][1].clone(), keys[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm = {k: v.clone() for k, v in st_g.items()}
        _pipeline(x_s, xg_s, warm, k_s, scale, shift)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_s = _pipeline(x_s, xg_s, st_g, k_s, scale, shift)
    for v in st_g.values():  # capture does not run the kernels, but start clean regardless
        v.zero_()
    for i, ((x, xg), k) in enumerate(zip(frames, keys)):
        x_s.copy_(x)
        xg_s.copy_(xg)
        k_s.copy_(k)
        graph.replay()
        torch.testing.assert_close(out_s, eager[i], rtol=0, atol=0, msg=f"frame {i}")
    for name in st_e:
        assert torch.equal(st_e[name], st_g[name]), name


@pytest.mark.skipif(QUICK, reason="quick mode (compute-sanitizer): no compilation")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_interleave_channels(backend):
    """The op's list of parts traces through its fake kernel: compiled, the eager parts and mask."""
    torch._dynamo.reset()

    def tail(a, ma, b, mb):
        (first, second), m = dcc.interleave_channels(a, ma, b, mb, 2)
        return first * 2, second, m

    g = gen(41)
    ma, mb = make_mask(2, 6, 10, 0.3, g), make_mask(2, 6, 10, 0.3, g)
    a, b = make_delta((2, 16, 6, 10), torch.float16, ma, g), make_delta((2, 16, 6, 10), torch.float16, mb, g)
    compiled = torch.compile(tail, backend=backend, fullgraph=True)
    got, want = compiled(a, ma, b, mb), tail(a, ma, b, mb)
    assert torch.equal(got[2], want[2])
    for x, y in zip(got[:2], want[:2]):
        sel = want[2].expand_as(y)
        assert x.shape == y.shape == (2, 16, 6, 10) and torch.equal(x[sel], y[sel])


SILU = Activation("silu")  # built outside the compiled function


@pytest.mark.skipif(QUICK, reason="quick mode (compute-sanitizer): no compilation")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile(backend):
    torch._dynamo.reset()

    def frame(x, sent, acc, sent2, acc_out, key):
        d, m = dcc.sparsify(x, sent, 0.05, key)
        d, m = dcc.affine_channel(d, m, None, None, key)
        d, m = dcc.activation(d, m, acc, sent2, SILU, 0.01, key)
        u, um = dcc.interpolate(d, m, None, 2.0, "nearest", None)
        return dcc.densify(u, um, acc_out, torch.float32)

    g = gen(40)
    n, c, h, w = 2, 16, 6, 10
    cl = lambda t: t.contiguous(memory_format=CL)  # noqa: E731
    xs = [cl(torch.randn((n, c, h, w), generator=g, device=DEV)) for _ in range(3)]
    keys = [torch.ones(n, dtype=torch.bool, device=DEV), None, torch.tensor([False, True], device=DEV)]
    states = lambda: [cl(torch.zeros((n, c, h, w), device=DEV)) for _ in range(3)] + [  # noqa: E731
        cl(torch.zeros((n, c, 2 * h, 2 * w), device=DEV))]
    st_e, st_c = states(), states()
    compiled = torch.compile(frame, backend=backend, fullgraph=True)
    for x, k in zip(xs, keys):
        out_e = frame(x, *st_e, k)
        out_c = compiled(x, *st_c, k)
        torch.testing.assert_close(out_c, out_e, rtol=0, atol=0)
    for a, b in zip(st_c, st_e):
        assert torch.equal(a, b)
