"""The delta rules of ``deltaconv.backends.reference``, function by function.

Masks are checked against receptive fields computed independently (index arithmetic in Python
loops), values against the dense op applied to accumulated inputs. Inputs carry NaN at inactive
pixels: the contract is that no function ever reads them.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from deltaconv.backends import reference as ref
from helpers import is_tf32

NAN = float("nan")


def _delta(shape, active_frac=0.3, seed=0, garbage=NAN):
    """A random delta with a random mask and ``garbage`` at inactive pixels."""
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    value = torch.randn(shape, generator=g)
    mask = torch.rand((n, 1, h, w), generator=g) < active_frac
    return torch.where(mask, value, torch.full((), garbage)), mask


def _clean(value, mask):
    return torch.where(mask, value, torch.zeros(()))


# ----------------------------------------------------------------------------- analytic footprints
def _window_footprint(in_hw, out_hw, pixel, k, s, p, d):
    """Output pixels of a sliding-window op (conv, pooling) whose window holds input ``pixel``:
    output o covers inputs o*s - p + j*d for j in [0, k)."""
    out = torch.zeros(out_hw, dtype=torch.bool)
    for axis_o in range(out_hw[0]):
        if not any(axis_o * s[0] - p[0] + j * d[0] == pixel[0] for j in range(k[0])):
            continue
        for axis_w in range(out_hw[1]):
            if any(axis_w * s[1] - p[1] + j * d[1] == pixel[1] for j in range(k[1])):
                out[axis_o, axis_w] = True
    return out


def _transpose_footprint(out_hw, pixel, k, s, p, d):
    """Output pixels of a transposed conv that input ``pixel`` writes: i*s - p + j*d."""
    out = torch.zeros(out_hw, dtype=torch.bool)
    for jy in range(k[0]):
        for jx in range(k[1]):
            oy, ox = pixel[0] * s[0] - p[0] + jy * d[0], pixel[1] * s[1] - p[1] + jx * d[1]
            if 0 <= oy < out_hw[0] and 0 <= ox < out_hw[1]:
                out[oy, ox] = True
    return out


def _one_pixel(shape, pixel, c=None):
    n, ch, h, w = shape
    mask = torch.zeros((n, 1, h, w), dtype=torch.bool)
    mask[0, 0, pixel[0], pixel[1]] = True
    value = torch.full(shape, NAN)
    value[0, :, pixel[0], pixel[1]] = torch.arange(1, ch + 1, dtype=torch.float32)
    return value, mask


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), s=st.integers(1, 3), d=st.integers(1, 2), p=st.integers(0, 3),
       h=st.integers(6, 11), w=st.integers(6, 11), data=st.data())
def test_conv2d_mask_is_the_receptive_field(k, s, d, p, h, w, data):
    if (h + 2 * p - d * (k - 1) - 1) < 0 or (w + 2 * p - d * (k - 1) - 1) < 0:
        return
    py = data.draw(st.integers(0, h - 1))
    px = data.draw(st.integers(0, w - 1))
    weight = torch.rand(3, 2, k, k) + 0.1
    value, mask = _one_pixel((1, 2, h, w), (py, px))
    out, out_mask = ref.conv2d(value, mask, weight, None, s, p, d, 1, None)
    truth = _window_footprint((h, w), out.shape[-2:], (py, px), (k, k), (s, s), (p, p), (d, d))
    assert torch.equal(out_mask[0, 0], truth)
    assert not torch.isnan(out).any()
    # positive weights: exactly the footprint carries a non-zero value
    assert torch.equal(out[0].abs().amax(0) > 0, truth)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("pixel", [(0, 0), (1, 1), (4, 6), (7, 9)])
def test_conv2d_padding_mode_mask_and_value(mode, pixel):
    """Non-zero padding modes copy border pixels into the padding: a border change reaches the
    outputs its copies touch. Compared with the dense conv of a one-pixel change."""
    conv = torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode, bias=False)
    value, mask = _one_pixel((1, 2, 8, 10), pixel)
    out, out_mask = ref.conv2d(value, mask, conv.weight.detach(), None, conv.stride, conv.padding,
                               conv.dilation, 1, None, mode)
    with torch.no_grad():
        dense = conv(_clean(value, mask))
    truth = dense.abs().amax(1, keepdim=True) > 0
    assert torch.equal(out_mask, truth)
    assert torch.allclose(out, dense, atol=1e-6)


@pytest.mark.parametrize("k,s,p,op,d", [(2, 2, 0, 0, 1), (3, 2, 1, 1, 1), (3, 1, 1, 0, 1), (4, 2, 1, 0, 1),
                                        (3, 2, 0, 0, 2), (3, 3, 2, 2, 1)])
@pytest.mark.parametrize("pixel", [(0, 0), (2, 3), (4, 5)])
def test_conv_transpose2d_mask_is_the_scatter_footprint(k, s, p, op, d, pixel):
    weight = torch.rand(2, 3, k, k) + 0.1
    value, mask = _one_pixel((1, 2, 5, 6), pixel)
    out, out_mask = ref.conv_transpose2d(value, mask, weight, None, s, p, op, 1, d, None)
    truth = _transpose_footprint(out.shape[-2:], pixel, (k, k), (s, s), (p, p), (d, d))
    assert torch.equal(out_mask[0, 0], truth)
    assert torch.equal(out[0].abs().amax(0) > 0, truth)
    dense = F.conv_transpose2d(_clean(value, mask), weight, None, s, p, op, 1, d)
    assert torch.allclose(out, dense, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conv_linear_and_transposed_conv_round_once_with_their_bias(dtype):
    """In float16 and bfloat16 a convolution, a transposed one and a linear layer sum their products and add
    their bias in float32 and round once, as the dense layer (and the CUDA epilogues) do, on a key frame and
    in value mode (``bias_key``): the result equals the float32 computation of the rounded operands rounded
    once, and is no further from float64 than the dense layer (adding the bias after a first rounding was
    about 25 % further on these operands)."""
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(2, 3, 33, 35, generator=g) * 2 - 1).to(dtype)
    w, b = (torch.randn(24, 3, 3, 3, generator=g) * 0.3).to(dtype), torch.randn(24, generator=g).to(dtype)
    mask, key = torch.ones(2, 1, 33, 35, dtype=torch.bool), torch.ones(2, dtype=torch.bool)
    exact = F.conv2d(x.double(), w.double(), b.double(), stride=2)

    def err(y):
        return float((y.double() - exact).norm() / exact.norm())

    once = F.conv2d(x.float(), w.float(), b.float(), stride=2).to(dtype)
    for kw in (dict(key=key), dict(key=None, bias_key=key, load_mask=mask)):
        out, m = ref.conv2d(x, mask, w, b, 2, 0, 1, 1, **kw)
        assert out.dtype == dtype and m.all() and torch.equal(out, once)
    assert err(once) <= err(F.conv2d(x, w, b, stride=2)) * 1.01
    assert err(F.conv2d(x, w, None, stride=2) + b.view(1, -1, 1, 1)) > 1.1 * err(once)  # two roundings
    wt = (torch.randn(3, 8, 3, 3, generator=g) * 0.3).to(dtype)
    out, _ = ref.conv_transpose2d(x, mask, wt, b[:8], 2, 1, 1, 1, 1, key)
    assert torch.equal(out, F.conv_transpose2d(x.float(), wt.float(), b[:8].float(), 2, 1, 1).to(dtype))
    v, wl = x[:, :, 0, :].transpose(1, 2).reshape(-1, 3), (torch.randn(5, 3, generator=g)).to(dtype)
    out, _ = ref.linear(v, torch.ones(v.shape[0], 1, dtype=torch.bool), wl, b[:5],
                        torch.ones(v.shape[0], dtype=torch.bool))
    assert torch.equal(out, F.linear(v.float(), wl.float(), b[:5].float()).to(dtype))


@pytest.mark.parametrize("k,s,p,d,ceil", [(2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True),
                                          (2, 2, 0, 1, True), (3, 1, 1, 1, False), (3, 2, 0, 2, True),
                                          (3, 3, 1, 1, True)])
def test_pool_masks_are_window_footprints(k, s, p, d, ceil):
    h, w = 9, 11
    for pixel in [(0, 0), (8, 10), (4, 5), (8, 0)]:
        value, mask = _one_pixel((1, 2, h, w), pixel)
        acc = torch.randn(1, 2, h, w)
        out_hw = F.max_pool2d(acc, k, s, p, d, ceil).shape[-2:]
        truth = _window_footprint((h, w), out_hw, pixel, (k, k), (s, s), (p, p), (d, d))
        sent = F.max_pool2d(acc, k, s, p, d, ceil).contiguous()
        _, mmask = ref.max_pool2d(value, mask, acc.clone(), sent.clone(), k, s, p, d, ceil, -1.0, None)
        # a negative threshold sends the whole footprint: the mask is exactly the region examined
        assert torch.equal(mmask[0, 0], truth), pixel
        if d == 1:
            _, amask = ref.avg_pool2d(value, mask, k, s, p, ceil, False, None)
            assert torch.equal(amask[0, 0], truth), pixel


def test_max_pool2d_of_whole_values_equals_the_accumulating_one():
    """max_pool2d_values (value mode: the input's whole values, no accumulator) sends what max_pool2d does
    from the accumulated changes, frame after frame, when the whole values are the accumulated ones
    (float64, where the changes are exact; in float16 they differ by the changes' rounding)."""
    g = torch.Generator().manual_seed(4)
    dtype = torch.float64
    acc = torch.zeros(2, 5, 9, 11, dtype=dtype)
    sent_a, sent_w = torch.zeros(2, 5, 5, 6, dtype=dtype), torch.zeros(2, 5, 5, 6, dtype=dtype)
    for t, frac in enumerate([1.0, 0.2, 0.0, 0.5]):
        mask = torch.rand(2, 1, 9, 11, generator=g) < frac
        delta = torch.where(mask, torch.randn(2, 5, 9, 11, generator=g, dtype=dtype) - acc, 0)
        whole = acc + delta  # what max_pool2d's accumulator holds after this frame, bit for bit
        key = torch.ones(2, dtype=torch.bool) if t == 0 else None
        out_a, m_a = ref.max_pool2d(delta, mask, acc, sent_a, 3, 2, 1, 1, True, 0.1, key, "rms")
        out_w, m_w = ref.max_pool2d_values(whole, mask, sent_w, 3, 2, 1, 1, True, 0.1, key, "rms")
        assert torch.equal(m_a, m_w) and torch.equal(sent_a, sent_w), t
        assert torch.equal(torch.where(m_w, out_w, 0), torch.where(m_a, out_a, 0)), t
        assert t < 2 or frac == 0.0 or m_w.any()


def test_max_pool2d_values_and_truncation():
    """max of the accumulated input over the footprint; changes that do not alter the max are
    not sent at threshold 0."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 3, 8, 8, generator=g)
    acc, sent = torch.zeros_like(x0), torch.zeros(2, 3, 4, 4)
    key = torch.ones(2, dtype=torch.bool)
    out, m = ref.max_pool2d(x0, torch.ones(2, 1, 8, 8, dtype=torch.bool), acc, sent, 2, 2, 0, 1, False, 0.0, key)
    assert m.all() and torch.allclose(out, F.max_pool2d(x0, 2))
    # lower a non-maximal element of window (0, 0) in stream 0: the output must not change
    win = x0[0, :, :2, :2].reshape(3, 4)
    i = int(win[0].argmin())
    delta = torch.full_like(x0, NAN)
    mask = torch.zeros(2, 1, 8, 8, dtype=torch.bool)
    mask[0, 0, i // 2, i % 2] = True
    delta[0, :, i // 2, i % 2] = 0.0
    delta[0, 0, i // 2, i % 2] = -1.0
    out, m = ref.max_pool2d(delta, mask, acc, sent, 2, 2, 0, 1, False, 0.0, None)
    assert not m.any() and not out.any()
    # raise it above the max: exactly output (0, 0) of stream 0 changes, by the right amount
    x1 = x0.clone()
    x1[0, 0, i // 2, i % 2] = win[0].max() + 2.0
    delta[0, 0, i // 2, i % 2] = x1[0, 0, i // 2, i % 2] - acc[0, 0, i // 2, i % 2]
    out, m = ref.max_pool2d(delta, mask, acc, sent, 2, 2, 0, 1, False, 0.0, None)
    assert m.sum() == 1 and m[0, 0, 0, 0]
    assert torch.allclose(sent, F.max_pool2d(x1, 2))


@pytest.mark.parametrize("size,scale,ac", [(None, 2.0, False), (None, 2.0, True), ((13, 17), None, False),
                                           ((13, 17), None, True), (None, 0.5, False), ((3, 4), None, False)])
def test_bicubic_mask_holds_every_output_with_weight_on_the_pixel(size, scale, ac):
    """Bicubic weights can be negative: the mask is the footprint of the 4x4 taps, every output pixel
    a one-hot input reaches with a nonzero weight (exactly those at scale 2 without align_corners, where
    no source point falls on an input pixel), and the values those of the dense op."""
    h, w = 8, 10
    for pixel in [(0, 0), (3, 4), (7, 9), (1, 8)]:
        value, mask = _one_pixel((1, 2, h, w), pixel)
        out, out_mask = ref.interpolate(value, mask, size, scale, "bicubic", ac)
        onehot = torch.zeros(1, 1, h, w, dtype=torch.float64)
        onehot[0, 0, pixel[0], pixel[1]] = 1.0
        truth = F.interpolate(onehot, size=size, scale_factor=scale, mode="bicubic", align_corners=ac) != 0
        assert truth.any() and not (truth & ~out_mask).any(), "an output with weight on the pixel is not in the mask"
        if size is None and scale == 2.0 and not ac:
            assert torch.equal(out_mask, truth)
        dense = F.interpolate(torch.where(mask, value, 0), size=size, scale_factor=scale, mode="bicubic",
                              align_corners=ac)
        torch.testing.assert_close(out, dense, rtol=0, atol=0)


@pytest.mark.parametrize("size,scale,mode,ac", [
    ((16, 20), None, "nearest", None), (None, 2.0, "nearest", None), ((13, 17), None, "nearest", None),
    (None, 2.0, "bilinear", False), (None, 2.0, "bilinear", True), ((13, 17), None, "bilinear", False),
    ((13, 17), None, "bilinear", True), (None, 0.5, "bilinear", False), ((4, 5), None, "nearest-exact", None)])
def test_interpolate_mask_is_the_set_of_outputs_with_weight_on_the_pixel(size, scale, mode, ac):
    h, w = 8, 10
    for pixel in [(0, 0), (3, 4), (7, 9)]:
        value, mask = _one_pixel((1, 2, h, w), pixel)
        out, out_mask = ref.interpolate(value, mask, size, scale, mode, ac)
        # truth: a float64 one-hot through the dense op (weights are non-negative: no cancellation)
        onehot = torch.zeros(1, 1, h, w, dtype=torch.float64)
        onehot[0, 0, pixel[0], pixel[1]] = 1.0
        truth = F.interpolate(onehot, size=size, scale_factor=scale, mode=mode, align_corners=ac) > 0
        if mode == "nearest" and size is None:  # independent index arithmetic: src = floor(dst / scale)
            idx = torch.zeros(out.shape[-2:], dtype=torch.bool)
            for oy in range(idx.shape[0]):
                for ox in range(idx.shape[1]):
                    idx[oy, ox] = (math.floor(oy / scale), math.floor(ox / scale)) == pixel
            assert torch.equal(idx, truth[0, 0])
        assert torch.equal(out_mask, truth)
        assert not torch.isnan(out).any()
        dense = F.interpolate(_clean(value, mask), size=size, scale_factor=scale, mode=mode, align_corners=ac)
        assert torch.allclose(out, dense, atol=1e-6)


@pytest.mark.parametrize("output_size", [1, 3, (2, 4), (5, 7)])
def test_adaptive_avg_pool_mask(output_size):
    h, w = 10, 14
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    for pixel in [(0, 0), (4, 7), (9, 13)]:
        value, mask = _one_pixel((1, 3, h, w), pixel)
        out, out_mask = ref.adaptive_avg_pool2d(value, mask, output_size)
        truth = torch.zeros(oh, ow, dtype=torch.bool)
        for i in range(oh):  # PyTorch's adaptive windows: [floor(i*h/oh), ceil((i+1)*h/oh))
            for j in range(ow):
                ys = range(math.floor(i * h / oh), math.ceil((i + 1) * h / oh))
                xs = range(math.floor(j * w / ow), math.ceil((j + 1) * w / ow))
                truth[i, j] = pixel[0] in ys and pixel[1] in xs
        assert torch.equal(out_mask[0, 0], truth)
        assert torch.allclose(out, F.adaptive_avg_pool2d(_clean(value, mask), output_size), atol=1e-6)


# ----------------------------------------------------------------------------- boundaries
def test_sparsify_threshold_keeps_pending_change_and_never_drifts():
    x = torch.zeros(1, 2, 3, 3)
    sent = torch.zeros_like(x)
    key = torch.ones(1, dtype=torch.bool)
    out, m = ref.sparsify(x, sent, 0.5, key)
    assert m.all()  # key frame: dense, even where nothing changed
    # +0.2 per frame on pixel (1, 1), channel 0: sent only on the third frame, with the full 0.6
    sent_frames = []
    for t in range(1, 6):
        x = x.clone()
        x[0, 0, 1, 1] += 0.2
        out, m = ref.sparsify(x, sent, 0.5, None)
        assert m.sum() <= 1
        if m.any():
            sent_frames.append(t)
            assert m[0, 0, 1, 1]
            # the whole accumulated change goes out at once, on every channel of the pixel
            assert torch.allclose(out[0, :, 1, 1], torch.tensor([0.6, 0.0]))
        else:
            assert not out.any()
        # the pending change (what downstream has not seen) never exceeds the threshold
        assert (x - sent).abs().max() <= 0.5 + 1e-6
    assert sent_frames == [3]
    assert torch.allclose(sent[0, 0, 1, 1], torch.tensor(0.6))


def test_sparsify_sends_exact_values_and_all_channels_of_a_pixel():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 3, 4, 5, generator=g)
    sent = torch.zeros_like(x0)
    ref.sparsify(x0, sent, 0.0, torch.ones(2, dtype=torch.bool))
    x1 = x0.clone()
    x1[1, 2, 3, 4] += 1.0  # one channel of one pixel of stream 1
    out, m = ref.sparsify(x1, sent, 0.0, None)
    assert m.sum() == 1 and m[1, 0, 3, 4]
    assert torch.equal(out[1, :, 3, 4], (x1 - x0)[1, :, 3, 4])
    assert torch.equal(sent, x1)
    assert not out[0].any()


def test_sparsify_key_for_one_stream_only():
    x = torch.randn(2, 3, 4, 4)
    sent = torch.zeros_like(x)
    ref.sparsify(x, sent, 0.0, torch.ones(2, dtype=torch.bool))
    sent[1] = 0  # stream 1 was reset
    out, m = ref.sparsify(x, sent, 10.0, torch.tensor([False, True]))
    assert m[1].all() and not m[0].any()
    assert torch.equal(out[1], x[1]) and torch.equal(sent, x)


def test_densify_accumulates_only_active_pixels():
    acc = torch.zeros(1, 2, 3, 3)
    v, m = _delta((1, 2, 3, 3), 0.5)
    out = ref.densify(v, m, acc, torch.float32)
    assert torch.equal(out, _clean(v, m))
    out2 = ref.densify(v, m, acc, torch.float32)
    assert torch.equal(out2, 2 * _clean(v, m))
    assert out2.data_ptr() != acc.data_ptr()  # a copy, not the state itself


# ----------------------------------------------------------------------------- pointwise
def test_truncate_threshold_region_and_key():
    y = torch.tensor([[[[0.1, 0.6, -0.7, 0.0]]]]).expand(1, 2, 1, 4).clone()
    sent = torch.zeros_like(y)
    region = torch.tensor([[[[True, True, False, True]]]])
    out, m = ref.truncate(y, region, sent, 0.5, None, torch.float32)
    assert m.tolist() == [[[[False, True, False, False]]]]
    assert torch.equal(sent[..., 1], y[..., 1]) and not sent[..., [0, 2, 3]].any()
    out, m = ref.truncate(y, region, sent, 0.5, torch.ones(1, dtype=torch.bool), torch.float32)
    assert m.tolist() == [[[[True, True, False, True]]]]  # key: the whole region, never outside it
    assert torch.allclose(sent[..., [0, 1, 3]], y[..., [0, 1, 3]]) and not sent[..., 2].any()


ACTS = [F.relu, F.relu6, lambda t: F.leaky_relu(t, 0.2), F.hardswish, F.hardsigmoid, F.silu, torch.sigmoid,
        F.gelu, lambda t: F.gelu(t, approximate="tanh"), torch.tanh]


@pytest.mark.parametrize("fn", ACTS)
def test_activation_over_frames_equals_dense_and_ignores_inactive_garbage(fn):
    g = torch.Generator().manual_seed(1)
    shape = (2, 3, 5, 6)
    x = torch.randn(shape, generator=g) * 4
    acc, sent = torch.zeros(shape), torch.zeros(shape)
    out_acc = torch.zeros(shape)
    key = torch.ones(2, dtype=torch.bool)
    prev = torch.zeros(shape)
    for t in range(5):
        if t:
            x = x.clone()
            change = torch.rand(2, 1, 5, 6, generator=g) < 0.3
            x = torch.where(change, torch.randn(shape, generator=g) * 4, x)
        mask = (x != prev).any(1, keepdim=True) | (key is not None)
        delta = torch.where(mask, x - prev, torch.full((), NAN))
        out, m = ref.activation(delta, mask, acc, sent, fn, 0.0, key)
        assert not torch.isnan(out).any()
        out_acc += torch.where(m, out, 0.0)
        assert torch.allclose(out_acc, fn(x), atol=1e-5)
        assert not (m & ~mask).any()  # output changes only where the input changed
        prev, key = x, None


def test_activation_threshold_pending_goes_out_later():
    acc, sent = torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1)
    one = torch.ones(1, 1, 1, 1, dtype=torch.bool)
    ref.activation(torch.zeros(1, 1, 1, 1), one, acc, sent, F.relu, 0.25, torch.ones(1, dtype=torch.bool))
    sends = []
    for _ in range(4):
        out, m = ref.activation(torch.full((1, 1, 1, 1), 0.1), one, acc, sent, F.relu, 0.25, None)
        sends.append(float(out) if m.any() else None)
    assert sends[:2] == [None, None] and sends[2] == pytest.approx(0.3) and sends[3] is None
    assert float(sent) == pytest.approx(0.3) and float(acc) == pytest.approx(0.4)


def test_activation_tf32_sends_keep_what_the_rounding_left_pending():
    """``tf32``: the changes go out rounded to TF32 (13 low mantissa bits zero), ``sent`` is the
    value less a residual below one TF32 step of the change, and at threshold 0 that residual goes
    out on the next frames (the pixel active, nothing else changing) until downstream holds the value
    exactly: no drift. Deltas other than float32 are refused, naming the dtype."""
    delta, mask = _delta((2, 8, 5, 6), 1.0, seed=7)
    acc, sent = torch.randn(2, 8, 5, 6, generator=torch.Generator().manual_seed(8)), torch.zeros(2, 8, 5, 6)
    received = torch.zeros_like(sent)
    outs = []
    for d in (delta * 0.37, torch.zeros_like(delta), torch.zeros_like(delta), torch.zeros_like(delta)):
        out, m = ref.activation(d, mask, acc, sent, F.relu, 0.0, None, tf32=True)
        assert is_tf32(out)
        received += out
        outs.append(out)
    first = outs[0]
    assert (first - F.relu(acc)).abs().max() > 0  # the first frame's changes really were rounded
    assert outs[1].abs().sum() > 0 and outs[3].abs().sum() == 0
    assert torch.equal(received, F.relu(acc)) and torch.equal(sent, F.relu(acc))
    # one frame: the residual kept in `sent` is below one TF32 step of what went out
    acc2, sent2 = torch.randn(1, 4, 3, 3), torch.zeros(1, 4, 3, 3)
    out, _ = ref.activation(torch.randn(1, 4, 3, 3), torch.ones(1, 1, 3, 3, dtype=torch.bool), acc2, sent2, F.relu,
                            0.0, None, tf32=True)
    assert ((F.relu(acc2) - sent2).abs() <= out.abs() * 2.0 ** -11).all()
    with pytest.raises(ValueError, match="tf32 needs float32 deltas, got torch.float16"):
        ref.activation(delta.half(), mask, acc, sent.half(), F.relu, 0.0, None, tf32=True)


def test_sparsify_tf32_sends_round_the_frame_and_keep_the_rest_pending():
    """The input sparsifier with ``tf32`` sends TF32 values; at threshold 0 the same frame again sends
    what the rounding left until ``sent`` is the frame; float16 frames are refused."""
    x = torch.randn(1, 3, 6, 7, generator=torch.Generator().manual_seed(3)) * 2
    sent = torch.zeros_like(x)
    out, mask = ref.sparsify(x, sent, 0.0, None, tf32=True)
    assert mask.all() and is_tf32(out) and not torch.equal(out, x)
    for _ in range(3):
        ref.sparsify(x, sent, 0.0, None, tf32=True)
    assert torch.equal(sent, x)
    assert not ref.sparsify(x, sent, 0.0, None, tf32=True)[1].any()
    with pytest.raises(ValueError, match="tf32 needs float32 deltas, got torch.float16"):
        ref.sparsify(x.half(), sent.half(), 0.0, None, tf32=True)


def _tf32_sender(op, dtype=torch.float32):
    """A truncating op besides the activation, on fixed states, for ``tf32`` sends: returns
    ``send(delta) -> out`` (threshold 0, every pixel active), ``value()`` (the exact new value
    downstream should end up holding) and the op's ``sent`` state."""
    g = torch.Generator().manual_seed(11)
    acc, mask = torch.randn(1, 8, 5, 6, generator=g), torch.ones(1, 1, 5, 6, dtype=torch.bool)
    if op == "mul":  # squeeze-excite: a [1, 8, 1, 1] scale that does not change
        scale, one = torch.randn(1, 8, 1, 1, generator=g), torch.ones(1, 1, 1, 1, dtype=torch.bool)
        sent = torch.zeros(1, 8, 5, 6, dtype=dtype)
        return (lambda d: ref.mul(d, mask, acc, torch.zeros(1, 8, 1, 1, dtype=dtype), one, scale, sent, 0.0, None,
                                  tf32=True)[0], lambda: acc * scale, sent)
    if op == "layer_norm":
        sent = torch.zeros(1, 8, 5, 6, dtype=dtype)
        return (lambda d: ref.layer_norm(d, mask, acc, sent, None, None, 1e-5, 0.0, None, tf32=True)[0],
                lambda: F.layer_norm(acc.movedim(1, -1), (8,), eps=1e-5).movedim(-1, 1), sent)
    sent = torch.zeros(1, 8, 3, 3, dtype=dtype)
    return (lambda d: ref.max_pool2d(d, mask, acc, sent, 3, 2, 1, 1, False, 0.0, None, tf32=True)[0],
            lambda: F.max_pool2d(acc, 3, 2, 1), sent)


@pytest.mark.parametrize("op", ["mul", "layer_norm", "max_pool2d"])
def test_truncating_ops_tf32_sends_converge_at_threshold_zero(op):
    """The product, the layer norm and max pooling with ``tf32`` send TF32 values; at threshold 0,
    with nothing else changing, what the rounding left goes out on the next frames until downstream
    holds the new value exactly (no drift); float16 deltas are refused, naming the dtype."""
    send, value, sent = _tf32_sender(op)
    first = send(torch.randn(1, 8, 5, 6, generator=torch.Generator().manual_seed(12)) * 0.37)
    assert is_tf32(first) and not torch.equal(first, value())  # the first changes really were rounded
    received = first.clone()
    for _ in range(3):
        out = send(torch.zeros(1, 8, 5, 6))
        assert is_tf32(out)
        received += out
    assert torch.equal(received, value()) and torch.equal(sent, value())
    assert send(torch.zeros(1, 8, 5, 6)).abs().sum() == 0
    with pytest.raises(ValueError, match="tf32 needs float32 deltas, got torch.float16"):
        _tf32_sender(op, torch.float16)[0](torch.zeros(1, 8, 5, 6, dtype=torch.float16))


def test_affine_channel_shift_only_on_key_streams():
    v, m = _delta((2, 3, 4, 4), 0.4)
    scale, shift = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([0.5, -0.5, 3.0])
    out, om = ref.affine_channel(v, m, scale, shift, None)
    assert torch.equal(om, m)
    assert torch.allclose(out, _clean(v, m) * scale.view(1, 3, 1, 1))
    key = torch.tensor([True, False])
    out, om = ref.affine_channel(v, m, scale, shift, key)
    assert om[0].all() and torch.equal(om[1], m[1])
    assert torch.allclose(out[0], _clean(v, m)[0] * scale.view(3, 1, 1) + shift.view(3, 1, 1))
    assert torch.allclose(out[1], _clean(v, m)[1] * scale.view(3, 1, 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_affine_channel_rounds_once_in_half_precision(dtype):
    """A float16 / bfloat16 delta is scaled and shifted in float32 with the float32 scale and shift,
    then rounded once (as a dense BatchNorm rounds only its output), not step by step."""
    g = torch.Generator().manual_seed(3)
    v = torch.randn(1, 8, 5, 5, generator=g).to(dtype)
    m = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    scale = 1 + torch.rand(8, generator=g) / 3  # values that float16 does not hold exactly
    shift = torch.randn(8, generator=g) / 7
    out, _ = ref.affine_channel(v, m, scale, shift, torch.tensor([True]))
    once = (v.float() * scale.view(1, 8, 1, 1) + shift.view(1, 8, 1, 1)).to(dtype)
    stepwise = (v * scale.to(dtype).view(1, 8, 1, 1) + shift.to(dtype).view(1, 8, 1, 1))
    assert out.dtype == dtype and torch.equal(out, once)
    assert not torch.equal(out, stepwise)  # the old rounding of scale, product and sum differs


def test_conv_bias_once_on_key_frames():
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    v, m = _delta((2, 3, 6, 6), 0.2)
    out, om = ref.conv2d(v, m, w, b, 1, 1, 1, 1, torch.tensor([False, True]))
    dense = F.conv2d(_clean(v, m), w, None, 1, 1)
    assert om[1].all()
    assert torch.allclose(out[1], dense[1] + b.view(4, 1, 1), atol=1e-5)
    assert torch.allclose(out[0], dense[0], atol=1e-5)
    out, _ = ref.conv2d(v, m, w, b, 1, 1, 1, 1, None)
    assert torch.allclose(out, dense, atol=1e-5)


def test_add_union_and_alpha():
    va, ma = _delta((1, 2, 4, 4), 0.3, seed=1)
    vb, mb = _delta((1, 2, 4, 4), 0.3, seed=2)
    out, m = ref.add(va, ma, vb, mb, -2.0)
    assert torch.equal(m, ma | mb)
    assert torch.allclose(out, _clean(va, ma) - 2 * _clean(vb, mb))


def test_mul_squeeze_excite_broadcast_region():
    g = torch.Generator().manual_seed(0)
    a0, b0 = torch.randn(2, 3, 4, 5, generator=g), torch.rand(2, 3, 1, 1, generator=g)
    acc_a, acc_b, sent = torch.zeros_like(a0), torch.zeros_like(b0), torch.zeros(2, 3, 4, 5)
    key = torch.ones(2, dtype=torch.bool)
    ones_a, ones_b = torch.ones(2, 1, 4, 5, dtype=torch.bool), torch.ones(2, 1, 1, 1, dtype=torch.bool)
    out, m = ref.mul(a0, ones_a, acc_a, b0, ones_b, acc_b, sent, 0.0, key)
    assert torch.allclose(out, a0 * b0)
    # one pixel of a changes (stream 0): exactly that output pixel
    da = torch.full_like(a0, NAN)
    ma = torch.zeros_like(ones_a)
    ma[0, 0, 2, 3] = True
    da[0, :, 2, 3] = 1.0
    db, mb = torch.full_like(b0, NAN), torch.zeros_like(ones_b)
    out, m = ref.mul(da, ma, acc_a, db, mb, acc_b, sent, 0.0, None)
    assert torch.equal(m, ma)
    assert torch.allclose(out[0, :, 2, 3], b0[0, :, 0, 0])
    # the gate of stream 1 changes: every pixel of stream 1, none of stream 0
    mb = torch.tensor([False, True]).view(2, 1, 1, 1)
    db = torch.where(mb, torch.full_like(b0, 0.5), torch.full((), NAN))
    out, m = ref.mul(torch.full_like(a0, NAN), torch.zeros_like(ones_a), acc_a, db, mb, acc_b, sent, 0.0, None)
    assert m[1].all() and not m[0].any()
    a1 = a0.clone()
    a1[0, :, 2, 3] += 1.0
    b1 = b0.clone()
    b1[1] += 0.5
    assert torch.allclose(sent, a1 * b1, atol=1e-6)


@pytest.mark.parametrize("dim", [1, -3, 2, 3, -1, 0])
def test_concatenate_masks(dim):
    va, ma = _delta((2, 2, 4, 4), 0.3, seed=1)
    vb, mb = _delta((2, 3, 4, 4), 0.3, seed=2) if dim % 4 == 1 else _delta((2, 2, 4, 4), 0.3, seed=2)
    out, m = ref.concatenate([va, vb], [ma, mb], dim)
    assert torch.equal(out, torch.cat([_clean(va, ma), _clean(vb, mb)], dim))
    if dim % 4 == 1:
        assert torch.equal(m, ma | mb)
    else:
        assert torch.equal(m, torch.cat([ma, mb], dim))


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_interleave_channels_is_the_shuffled_concatenation_cut_in_parts(parts):
    """Channel 2k of the interleaved channels is a's k-th, 2k + 1 b's k-th (zero where that input is
    inactive); the parts are the chunks of that; the mask is the union."""
    va, ma = _delta((2, 3, 4, 5), 0.3, seed=1)
    vb, mb = _delta((2, 3, 4, 5), 0.6, seed=2)
    parts_out, m = ref.interleave_channels(va, ma, vb, mb, parts)
    joined = torch.cat(parts_out, 1)
    assert len(parts_out) == parts and torch.equal(m, ma | mb)
    assert torch.equal(joined[:, 0::2], _clean(va, ma)) and torch.equal(joined[:, 1::2], _clean(vb, mb))
    assert [p.shape[1] for p in parts_out] == [t.shape[1] for t in joined.chunk(parts, 1)]


def test_linear_rank2_and_rank4():
    w, b = torch.randn(5, 6), torch.randn(5)
    v = torch.randn(3, 6)
    m = torch.tensor([[True], [False], [True]])
    v[1] = NAN
    out, om = ref.linear(v, m, w, b, torch.tensor([False, False, True]))
    assert torch.equal(om, torch.tensor([[True], [False], [True]]))
    assert torch.allclose(out[0], w @ v[0]) and torch.allclose(out[2], w @ v[2] + b)
    assert not out[1].any()
    # rank 4: the last dim is a pixel dim, so an active input pixel activates the whole row
    v4, m4 = _delta((1, 2, 3, 6), 0.3)
    out, om = ref.linear(v4, m4, w, None, None)
    assert om.shape == (1, 1, 3, 5)
    assert torch.equal(om[..., 0], m4.any(-1))
    assert torch.allclose(out, F.linear(_clean(v4, m4), w), atol=1e-6)


# ----------------------------------------------------------------------------- garbage is never read
@pytest.mark.parametrize("name", ["conv2d", "conv2d_reflect", "conv_transpose2d", "linear_spatial", "avg_pool2d",
                                  "adaptive_avg_pool2d", "interpolate", "max_pool2d", "affine_channel", "densify",
                                  "activation", "add", "mul", "concatenate", "interleave_channels"])
def test_no_function_reads_inactive_values(name):
    """Same call with NaN and with zeros at inactive pixels: identical, finite results."""
    results = []
    for garbage in (NAN, 0.0):
        v, m = _delta((2, 4, 6, 7), 0.3, garbage=garbage)
        v2, m2 = _delta((2, 4, 6, 7), 0.3, seed=5, garbage=garbage)
        st_ = torch.zeros(2, 4, 6, 7)
        if name == "conv2d":
            r = ref.conv2d(v, m, torch.randn(3, 4, 3, 3, generator=torch.Generator().manual_seed(0)), None, 2, 1, 1,
                           1, None)
        elif name == "conv2d_reflect":
            r = ref.conv2d(v, m, torch.ones(4, 1, 3, 3), None, 1, "same", 1, 4, None, "reflect")
        elif name == "conv_transpose2d":
            r = ref.conv_transpose2d(v, m, torch.ones(4, 2, 3, 3), None, 2, 1, 1, 1, 1, None)
        elif name == "linear_spatial":
            r = ref.linear_spatial(v, m, lambda t: F.avg_pool2d(t, 2))
        elif name == "avg_pool2d":
            r = ref.avg_pool2d(v, m, 3, 2, 1, True, False, None)
        elif name == "adaptive_avg_pool2d":
            r = ref.adaptive_avg_pool2d(v, m, 3)
        elif name == "interpolate":
            r = ref.interpolate(v, m, None, 2.0, "bilinear", False)
        elif name == "max_pool2d":
            r = ref.max_pool2d(v, m, torch.zeros(2, 4, 6, 7), torch.zeros(2, 4, 3, 4), 3, 2, 1, 1, False, 0.0, None)
        elif name == "affine_channel":
            r = ref.affine_channel(v, m, torch.linspace(0.5, 2.0, 4), torch.zeros(4), None)
        elif name == "densify":
            r = (ref.densify(v, m, st_, torch.float32),)
        elif name == "activation":
            r = ref.activation(v, m, st_, torch.zeros_like(st_), torch.sigmoid, 0.0, None)
        elif name == "add":
            r = ref.add(v, m, v2, m2, 1.0)
        elif name == "mul":
            r = ref.mul(v, m, torch.zeros_like(st_), v2, m2, torch.ones_like(st_), torch.zeros_like(st_), 0.0, None)
        elif name == "concatenate":
            r = ref.concatenate([v, v2], [m, m2], 1)
        else:
            parts, mask = ref.interleave_channels(v, m, v2, m2, 2)
            r = (*parts, mask)
        results.append(r)
    for a, b in zip(*results):
        assert torch.isfinite(a.float()).all(), name
        assert torch.equal(a, b), name


@pytest.mark.parametrize("padding,k,d", [("same", 3, 1), ("same", 4, 1), ("same", 3, 2), ("valid", 3, 1), (2, 5, 1),
                                         ((1, 2), 3, 1)])
def test_reflect_padding_amounts_match_pytorch(padding, k, d):
    conv = torch.nn.Conv2d(2, 2, k, padding=padding, dilation=d, padding_mode="reflect", bias=False)
    x = torch.randn(1, 2, 9, 11)
    out, m = ref.conv2d(x, torch.ones(1, 1, 9, 11, dtype=torch.bool), conv.weight.detach(), None, conv.stride,
                        conv.padding, conv.dilation, 1, None, "reflect")
    with torch.no_grad():
        assert torch.allclose(out, conv(x), atol=1e-5)
    assert m.all() and m.shape[-2:] == out.shape[-2:]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_truncate_half_sent_holds_rounded_values(dtype):
    """A ``sent`` of a half dtype holds the new value rounded to it (as the dense model's output
    is), so at threshold 0 an unchanged value is sent once and never again, and what was sent adds
    up to the rounded value."""
    torch.manual_seed(3)
    y = torch.randn(2, 5, 3, 4) * 3  # float32, mostly not representable in dtype
    region = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    sent = torch.zeros(2, 5, 3, 4, dtype=dtype)
    out, m = ref.truncate(y, region, sent, 0.0, None, dtype)
    assert out.dtype == dtype and bool(m.all())
    assert torch.equal(sent, y.to(dtype)) and torch.equal(out, y.to(dtype))
    out, m = ref.truncate(y, region, sent, 0.0, None, dtype)
    assert not m.any()
    # a change below the threshold stays pending; once over it, downstream gets exactly the rest
    y2 = y + 0.01
    _, m = ref.truncate(y2, region, sent, 0.5, None, dtype)
    assert not m.any() and torch.equal(sent, y.to(dtype))
    y3 = y + 1.0
    before = sent.clone()
    out, m = ref.truncate(y3, region, sent, 0.5, None, dtype)
    assert bool(m.all())
    # sent = what downstream now holds (before + out), rounded to dtype; where the cast of the
    # change to dtype lost something, that stays pending and threshold 0 sends it next
    assert torch.equal(sent, (before.float() + out.float()).to(dtype))
    assert ((y3.to(dtype).float() - sent.float()).abs() <= 1e-2 * y3.abs().clamp_min(1)).all()
    ref.truncate(y3, region, sent, 0.0, None, dtype)
    assert torch.equal(sent, y3.to(dtype))
    _, m = ref.truncate(y3, region, sent, 0.0, None, dtype)
    assert not m.any()


def test_exceeds_max_and_rms_measures():
    change = torch.tensor([[0.3, 0.0, 0.0, 0.0], [0.15, 0.15, 0.15, 0.15], [0.0, 0.0, 0.0, 0.0]]).view(3, 4, 1, 1)
    # max: 0.3, 0.15, 0; rms: 0.15, 0.15, 0
    assert ref.exceeds(change, 0.2, "max").flatten().tolist() == [True, False, False]
    assert ref.exceeds(change, 0.1, "rms").flatten().tolist() == [True, True, False]
    assert ref.exceeds(change, 0.16, "rms").flatten().tolist() == [False, False, False]
    assert ref.exceeds(change, 0.0, "rms").flatten().tolist() == [True, True, False]  # threshold 0: any change
    assert ref.exceeds(change.view(3, 4), 0.1, "rms").shape == (3, 1)  # [N, C] values (classifier heads)
    with pytest.raises(ValueError, match="measure must be one of \\('max', 'rms', 'pooled'\\), got 'l1'"):
        ref.exceeds(change, 0.1, "l1")


def test_exceeds_pooled_measure():
    """"pooled": the rms over channels of each channel's signed change averaged over the 3x3 window
    (padding not counted), or the pixel's own rms over 4x the threshold. Changes of alternating sign
    cancel in the window, a coherent patch of the same size does not, a lone large change passes
    the peak guard; on [N, C] values it is the rms measure."""
    t = 0.1
    change = torch.zeros(1, 2, 12, 12)
    sign = torch.tensor([[1.0, -1.0], [-1.0, 1.0]]).repeat(3, 3)
    change[:, :, 0:6, 0:6] = 0.2 * sign  # a checkerboard of +-0.2: rms 0.2 per pixel, cancels in the window
    change[:, :, 7:10, 7:10] = 0.2  # a coherent 3x3 patch
    change[:, :, 0, 11] = 0.45  # a lone large change in a corner (window of 4 pixels)
    m = ref.exceeds(change, t, "pooled")[0, 0]
    assert not m[1:5, 1:5].any()  # inside the checkerboard: |box| = 0.2 / 9 per channel
    # the patch's centre and edges (window means 0.2 and 0.13) go out, its corners (0.09) and the
    # pixels beside it (at most 0.07) wait
    cross = torch.tensor([[False, True, False], [True, True, True], [False, True, False]])
    assert torch.equal(m[7:10, 7:10], cross) and not m[6, 7:10].any() and not m[10, 7:10].any()
    assert m[0, 11] and ref.exceeds(change, t, "rms")[0, 0, 1:5, 1:5].all()
    assert not ref.exceeds(change * 0.5, t, "pooled")[0, 0, 0, 11]  # 0.225 < 4t: only its window's mean counts
    # against an independent loop over windows, on random changes
    g = torch.Generator().manual_seed(0)
    change = torch.randn(2, 5, 7, 9, generator=g) * 0.1
    expect = torch.zeros(2, 1, 7, 9, dtype=torch.bool)
    for i in range(7):
        for j in range(9):
            window = change[:, :, max(i - 1, 0):i + 2, max(j - 1, 0):j + 2]
            pooled = window.mean(dim=(2, 3)).square().mean(dim=1).sqrt()
            own = change[:, :, i, j].square().mean(dim=1).sqrt()
            expect[:, 0, i, j] = (pooled > 0.03) | (own > 4 * 0.03)
    got = ref.exceeds(change, 0.03, "pooled")
    assert torch.equal(got, expect) and 0 < int(got.sum()) < got.numel()
    assert torch.equal(ref.exceeds(change[:, :, 0, 0], 0.03, "pooled"), ref.exceeds(change[:, :, 0, 0], 0.03, "rms"))
