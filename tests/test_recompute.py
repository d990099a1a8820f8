"""Value mode (``convert(..., recompute=True)``, the default): a convolution that reads a layer keeping its whole
values and feeds only an activation recomputes its whole output on the active pixels, and that
activation keeps no accumulator. Same results as delta mode (the reference backend in float64 to
rounding; the CUDA kernels against the reference), less state, and the pairs in the report."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import deltaconv
from deltaconv.activations import from_module
from deltaconv.backends import reference as R
from deltaconv.delta import Delta
from deltaconv.modules import DCActivation, DCConv2d
from helpers import (cuda_backend_reason, cuda_kernel_names, main_output, torchvision_model as build, video_frames,
                     without_kept_outputs, writing_changes)


def rel(a, b) -> float:
    a, b = main_output(a).double(), main_output(b).double()
    return ((a - b).norm() / b.norm()).item()


def moving_frames(n: int, shape=(2, 3, 48, 64), dtype=torch.float64, seed=0) -> list[torch.Tensor]:
    """A still frame pair of streams with a patch that moves and grows (a few changed pixels per frame)."""
    g = torch.Generator().manual_seed(seed)
    frames = [torch.randn(shape, generator=g, dtype=dtype)]
    for i in range(n - 1):
        x = frames[-1].clone()
        x[:, :, 8:14 + 3 * i, 20 + 2 * i:30 + 2 * i] += 0.3 * torch.randn(shape[0], 3, 6 + 3 * i, 10, generator=g,
                                                                          dtype=dtype)
        frames.append(x)
    return frames


def pairs(dm) -> list[str]:
    return [n.layer for n in dm.report.nodes if n.note and "recomputes for" in n.note]


def assert_value_equals_delta(value, delta, model, frames, t: float) -> None:
    """``value`` (value mode) gives ``delta``'s (delta mode) outputs on ``frames`` to float64 rounding, and at
    threshold ``t`` 0 the dense ``model``'s."""
    with torch.no_grad():
        for f in frames:
            got = value(f)
            torch.testing.assert_close(got, delta(f), rtol=0, atol=1e-12)
            if t == 0:
                torch.testing.assert_close(got, model(f), rtol=0, atol=1e-12)


@pytest.mark.parametrize("truncation", ["max", "rms", "pooled"])
@pytest.mark.parametrize("name, expected", [("resnet18", 9), ("mobilenet_v2", 35)])
def test_recompute_equals_delta_mode_on_the_reference(name, expected, truncation):
    """float64, reference backend: value mode gives delta mode's outputs (to float64 rounding) at
    threshold 0 and above, and at threshold 0 the dense model's."""
    model = build(name).double()
    frames = moving_frames(5)
    for t in (0.0, 0.03):
        delta = deltaconv.convert(model, threshold=t, truncation=truncation, backend="reference",
                                  example_input=frames[0], recompute=False)
        value = deltaconv.convert(model, threshold=t, truncation=truncation, backend="reference",
                                  example_input=frames[0])
        assert len(pairs(value)) == expected and not pairs(delta)
        with torch.no_grad():
            for f in frames:
                a, b = value(f), delta(f)
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
                if t == 0:
                    torch.testing.assert_close(a, model(f), rtol=0, atol=1e-12)
        if t > 0:
            assert any(0 < s["mean_density"] < 1 for s in value.stats() if s["kind"] == "activation")
            assert [s["mean_density"] for s in value.stats()] == pytest.approx([s["mean_density"] for s in delta.stats()],
                                                                              nan_ok=True)


class _FunctionalPReLUBlock(torch.nn.Module):
    """``F.prelu`` of parameters after a convolution and after a residual add (as an ONNX import writes PReLU)."""

    def __init__(self):
        super().__init__()
        self.c0 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c1, self.c2, self.c3 = (torch.nn.Conv2d(16, 16, k, padding=k // 2) for k in (3, 1, 3))
        self.s0, self.s1 = (torch.nn.Parameter(torch.linspace(-0.5, 0.75, 16)) for _ in range(2))
        self.s2 = torch.nn.Parameter(torch.tensor([0.25]))

    def forward(self, x):
        y = F.prelu(self.c0(x), self.s0)
        z = F.prelu(self.c1(y), self.s1)
        return self.c3(F.prelu(self.c2(z) + z, self.s2))


def test_functional_prelu_takes_value_mode_and_the_fused_add():
    """A PReLU with its slopes per call (``F.prelu(x, weight)``) reads its input whole as the other activations
    do: the convolution before it recomputes, the residual add before the second one is fused with it and its
    1x1 convolution keeps its output; value mode equals delta mode (float64, reference backend) at threshold 0
    and above, and the dense model at 0."""
    torch.manual_seed(0)
    model = _FunctionalPReLUBlock().double().eval()
    frames = moving_frames(5)
    for t in (0.0, 0.03):
        delta = deltaconv.convert(model, threshold=t, backend="reference", example_input=frames[0], recompute=False)
        value = deltaconv.convert(model, threshold=t, backend="reference", example_input=frames[0])
        notes = {n.layer: n.note for n in value.report.nodes}
        assert "recomputes for prelu_1" in notes["c1"] and "fused with prelu_2" in notes["add"], notes
        assert "recomputes for prelu_2 (output kept, summed by add)" in notes["c2"], notes
        assert not delta.report.fallbacks and not value.report.fallbacks and not pairs(delta)
        assert_value_equals_delta(value, delta, model, frames, t)


def test_recomputed_activations_keep_no_accumulator():
    model = build("resnet18")
    frames = moving_frames(2, dtype=torch.float32)
    delta = deltaconv.convert(model, threshold=0.01, backend="reference", example_input=frames[0], recompute=False)
    value = deltaconv.convert(model, threshold=0.01, backend="reference", example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            delta(f), value(f)
    recomputed = {n.layer for n in value.report.nodes if n.note and "recomputed by" in n.note}
    assert len(recomputed) == 9 and len(value.report.recomputing) == 18 and not delta.report.recomputing
    for layer in value.delta_layers():
        if layer.layer_name in recomputed:
            assert "acc" not in layer._buffers and layer._buffers["sent"] is not None
    assert value.state_bytes() < delta.state_bytes()


def test_only_convolutions_between_a_whole_source_and_a_lone_activation_recompute(monkeypatch):
    """mobilenet_v2 (the default conversion): every depthwise conv (after the expansion's ReLU6) and
    every expansion (after a kept sum or a kept projection) recomputes, and so does the stem (3 input
    channels; since 2026-12-07, ``MIN_RECOMPUTE_CHANNELS``); the projections (read by an add or the next
    block: they keep their outputs) do not. Without whole sums the expansions do not either;
    ``MIN_RECOMPUTE_CHANNELS = 8``: not the stem; recompute=False: none."""
    example = torch.zeros(1, 3, 64, 64)
    dm = deltaconv.convert(build("mobilenet_v2"), backend="reference", example_input=example)
    marked = sorted(name for name, m in dm.named_modules() if isinstance(m, DCConv2d) and m.recomputes)
    assert {"features.1.conv.0.0", "features.2.conv.1.0", "features.2.conv.0.0", "features.18.0"} <= set(marked)
    assert "features.0.0" in marked and "features.2.conv.2" not in marked and len(marked) == 35
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "MIN_RECOMPUTE_CHANNELS", 8)
    stem_in_delta_mode = deltaconv.convert(build("mobilenet_v2"), backend="reference", example_input=example)
    assert sorted(name for name, m in stem_in_delta_mode.named_modules()
                  if isinstance(m, DCConv2d) and m.recomputes) == [n for n in marked if n != "features.0.0"]
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "WHOLE_SUMS", False)
    before = deltaconv.convert(build("mobilenet_v2"), backend="reference", example_input=example)
    marked = sorted(name for name, m in before.named_modules() if isinstance(m, DCConv2d) and m.recomputes)
    assert "features.1.conv.0.0" in marked and "features.2.conv.1.0" in marked
    assert "features.0.0" not in marked and "features.2.conv.0.0" not in marked and "features.2.conv.2" not in marked
    assert len(marked) == 17  # MIN_RECOMPUTE_CHANNELS still 8 here: the stem in delta mode
    off = deltaconv.convert(build("mobilenet_v2"), backend="reference", example_input=example, recompute=False)
    assert not any(isinstance(m, DCConv2d) and m.recomputes for m in off.modules()) and not pairs(off)


def test_recompute_argument_is_checked():
    with pytest.raises(TypeError, match="recompute must be a bool, got 'yes'"):
        deltaconv.convert(build("resnet18"), recompute="yes")


def test_a_recomputing_convolution_without_whole_values_runs_in_delta_mode():
    """An input that gives no whole values this frame (its producer in delta mode, as on TF32 sends):
    the convolution computes the change, as with recomputes off; an input of whole values only (a kept
    output) it cannot read in delta mode, and says so."""
    torch.manual_seed(0)
    conv = DCConv2d.from_dense(torch.nn.Conv2d(4, 8, 3, padding=1))
    conv.layer_name = "conv"
    d = torch.randn(1, 4, 5, 5)
    mask = torch.rand(1, 1, 5, 5) < 0.5
    want = conv(Delta(d, mask))
    conv.recomputes = True
    got = conv(Delta(d, mask))
    assert not got.recomputed and torch.equal(got.value, want.value) and torch.equal(got.mask, want.mask)
    conv.recomputes = False
    with pytest.raises(RuntimeError, match="conv: the input holds whole values .* only a convolution in value mode"):
        conv(Delta(d, mask, recomputed=True, whole=d))


@pytest.mark.parametrize("stride, groups", [(1, 1), (2, 1), (1, 4)])
def test_reference_conv2d_reads_the_load_mask_and_adds_the_bias_key(stride, groups):
    """conv2d's value mode: inputs read where load_mask is set (not only where mask is), the bias on
    the streams of bias_key, the output pixels from mask and key."""
    g = torch.Generator().manual_seed(3)
    whole = torch.randn(2, 4, 9, 11, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 1, 9, 11, dtype=torch.bool)
    mask[0, 0, 4, 5] = True
    w = torch.randn(8, 4 // groups, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(8, generator=g, dtype=torch.float64)
    ones, all_streams = torch.ones_like(mask), torch.ones(2, dtype=torch.bool)
    out, out_mask = R.conv2d(whole, mask, w, b, stride, 1, 1, groups, None, load_mask=ones, bias_key=all_streams)
    dense = F.conv2d(whole, w, b, stride, 1, 1, groups)
    expected_mask = F.conv2d(mask.double(), torch.ones(1, 1, 3, 3, dtype=torch.float64), None, stride, 1) > 0
    assert torch.equal(out_mask, expected_mask) and expected_mask.any()
    torch.testing.assert_close(out[expected_mask.expand_as(out)], dense[expected_mask.expand_as(dense)])
    delta_out, _ = R.conv2d(whole, mask, w, b, stride, 1, 1, groups, None)  # delta mode: only the masked input
    assert not torch.allclose(delta_out[expected_mask.expand_as(out)], dense[expected_mask.expand_as(dense)])


@pytest.mark.parametrize("measure", ["max", "rms"])
def test_reference_activation_values_equals_activation_from_an_empty_accumulator(measure):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 4, 6, generator=g)
    mask = torch.rand(2, 1, 4, 6, generator=g) > 0.4
    fn = from_module(torch.nn.ReLU6())
    sent_a, sent_b = torch.rand(2, 5, 4, 6, generator=g), None
    sent_b = sent_a.clone()
    va, ma = R.activation_values(x, mask, sent_a, fn, 0.3, None, measure)
    vb, mb = R.activation(x, mask, torch.zeros_like(x), sent_b, fn, 0.3, None, measure)
    assert torch.equal(ma, mb) and ma.any() and not ma.all()
    torch.testing.assert_close(va, vb, rtol=0, atol=0)
    torch.testing.assert_close(sent_a, sent_b, rtol=0, atol=0)


# ----------------------------------------------------------------------------- GPU
REASON = cuda_backend_reason()
requires_cuda = pytest.mark.skipif(bool(REASON), reason=REASON or "ok")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("truncation", ["max", "rms", "hybrid"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "resnet50"])
def test_cuda_recompute_equals_reference_recompute(name, truncation):
    """float32 (TF32 off), thresholds > 0: the CUDA kernels in value mode make the reference's
    decisions, and delta mode's (outputs far closer than the truncation error), with the value
    variant of the activation kernel."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(name).cuda()
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    t = 0.02 if truncation == "max" else 0.005
    kw = dict(threshold=t, truncation=truncation, example_input=frames[0])
    cuda = deltaconv.convert(model, backend="cuda", **kw)
    ref = deltaconv.convert(model, backend="reference", **kw)
    delta = deltaconv.convert(model, backend="cuda", recompute=False, **kw)
    with torch.no_grad():
        for f in frames:
            dense, a, b, c = model(f), cuda(f), ref(f), delta(f)
            assert rel(a, b) <= 0.1 * max(rel(b, dense), 1e-5)
            assert rel(a, c) <= 0.1 * max(rel(c, dense), 1e-5)
    assert pairs(cuda)
    assert any(0 < s["mean_density"] < 1 for s in cuda.stats() if s["kind"] == "activation")
    with torch.no_grad():
        names = cuda_kernel_names(lambda: cuda(frames[0]))
    if names:  # none recorded under compute-sanitizer
        assert any("activation_kernel" in k and "false, true>" in k for k in names), names  # VALUES


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_cuda_recompute_at_threshold_0_within_dense_rounding_and_replayed(name, dtype):
    """At threshold 0 value mode stays within the dense model's own rounding of its dtype (it
    recomputes what the dense model computes from the sent values), eager and replayed from a CUDA
    graph (bit-equal)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(name).cuda()
    low = build(name).cuda().to(dtype)
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    kw = dict(backend="cuda", example_input=frames[0].to(dtype))
    eager = deltaconv.convert(low, **kw)
    graph = deltaconv.convert(low, cuda_graph=True, check_finite=False, **kw)
    with torch.no_grad():
        for f in frames:
            x = f.to(dtype)
            y, z, want = eager(x), graph(x).clone(), model(f)
            torch.testing.assert_close(z, y, rtol=0, atol=0)
            bound = 1e-4 if dtype == torch.float32 else 3 * rel(low(x), want) + 1e-3
            assert rel(y, want) <= bound


def clustered_case(cin: int, cout: int, k: int, groups: int, dtype: torch.dtype, fraction: float, seed: int,
                   device: str = "cuda") -> tuple[torch.Tensor, ...]:
    """Values ``[2, cin, 37, 45]`` (channels_last), a mask of 8x8 blocks each set with probability
    ``fraction``, and a ``k``x``k`` convolution's weight (``groups`` groups, scaled by its fan-in) and
    bias, on ``device`` in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    n, h, w = 2, 37, 45
    values = torch.randn(n, cin, h, w, generator=g).to(device, dtype).contiguous(memory_format=torch.channels_last)
    blocks = torch.rand(n, 1, (h + 7) // 8, (w + 7) // 8, generator=g) < fraction
    mask = blocks.repeat_interleave(8, 2).repeat_interleave(8, 3)[:, :, :h, :w].to(device)
    weight = (torch.randn(cout, cin // groups, k, k, generator=g) / (k * (cin // groups)) ** 0.5).to(device, dtype)
    return values, mask, weight, torch.randn(cout, generator=g).to(device, dtype)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("fraction", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("cin, cout, k, stride, groups, dilation", [
    (64, 64, 3, 1, 1, 1), (32, 64, 3, 2, 1, 1), (48, 48, 3, 1, 48, 1), (96, 96, 3, 2, 96, 1), (64, 128, 1, 1, 1, 1),
    (64, 32, 1, 2, 1, 1), (3, 64, 7, 2, 1, 1), (17, 24, 3, 1, 1, 1), (64, 64, 3, 1, 1, 2), (40, 40, 5, 1, 40, 1)])
def test_cuda_conv2d_value_mode_equals_reference(cin, cout, k, stride, groups, dilation, dtype, fraction):
    """ops.conv2d with load_mask / bias_key (every kernel family: tensor-core 3x3 and 1x1, depthwise,
    the stem's few channels, the CUDA cores, gathered taps) against the reference, on the output
    pixels, for clustered changes; and the same output pixels as delta mode."""
    from deltaconv.backends import cuda as C
    torch.backends.cudnn.allow_tf32 = False
    whole, mask, weight, bias = clustered_case(cin, cout, k, groups, dtype, fraction, seed=5)
    n = whole.shape[0]
    ones, streams = torch.ones_like(mask), torch.ones(n, dtype=torch.bool, device="cuda")
    pad = dilation * (k // 2)
    args = (whole, mask, weight, bias, stride, pad, dilation, groups, None)
    out, out_mask = C.conv2d(*args, load_mask=ones, bias_key=streams)
    ref, ref_mask = R.conv2d(*args, load_mask=ones, bias_key=streams)
    assert torch.equal(out_mask, ref_mask)
    assert torch.equal(out_mask, C.conv2d(*args)[1])
    sel = out_mask.expand_as(out)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out[sel].float(), ref[sel].float(), rtol=tol, atol=tol)


@pytest.mark.gpu
@requires_cuda
def test_a_change_of_the_tf32_setting_is_a_key_frame():
    """float32 on the GPU: with TF32 convolutions the layers send TF32-rounded changes and the
    recomputing convolutions run in delta mode, without TF32 in value mode. A change of the setting
    between frames is a key frame, so no activation switches modes with a stale accumulator: at
    threshold 0 the outputs stay the dense model's across the switches."""
    model = build("resnet18").cuda()
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        for i, f in enumerate(frames):
            tf32 = i % 3 != 2  # on, on, off, on, on, off
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
            with torch.no_grad():
                y, want = dm(f), model(f)
            assert rel(y, want) <= (1e-2 if tf32 else 1e-4), i
            since = dm._frames_since_key  # 1 right after a key frame
            assert since == (1 if i in (0, 2, 3, 5) else 2), (i, since)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_a_convolution_of_the_input_recomputes_from_the_sparsifier():
    """A model whose input has 8 channels or more: its first convolution recomputes from the input
    sparsifier's sent frame (``Delta.whole``), max pooling's sent values feed the next, and value
    mode gives delta mode's outputs (float64, reference backend)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.ReLU()).double().eval()
    g = torch.Generator().manual_seed(1)
    frames = [torch.randn(2, 8, 20, 24, generator=g, dtype=torch.float64)]
    for _ in range(3):
        x = frames[-1].clone()
        x[:, :, 4:9, 6:12] += torch.randn(2, 8, 5, 6, generator=g, dtype=torch.float64)
        frames.append(x)
    value = deltaconv.convert(model, threshold=0.05, backend="reference", example_input=frames[0])
    delta = deltaconv.convert(model, threshold=0.05, backend="reference", example_input=frames[0], recompute=False)
    assert len(pairs(value)) == 2
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(value(f), delta(f), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- through residual adds
def blocks(dm) -> list[str]:
    """The bottleneck blocks of a converted torchvision ResNet (``layer1.0``, ...)."""
    return sorted(name[:-len(".conv3")] for name, m in dm.named_modules() if name.endswith(".conv3"))


def kept(dm) -> list[str]:
    """The convolutions that keep their whole output (value mode before a residual add)."""
    return sorted(name for name, m in dm.named_modules() if isinstance(m, DCConv2d) and m.keeps_output)


def summing(dm) -> list[str]:
    """The activations that sum a kept output and a whole identity (the report's notes)."""
    return sorted({n.layer for n in dm.report.nodes if " through " in n.note and "recomputed by " in n.note})


def test_bottleneck_adds_of_whole_operands_are_marked():
    """resnet50: every bottleneck keeps its conv3's whole output and sums it in the ReLU after the add
    with the whole identity: the block input (a ReLU's sent values; 12 of 16 blocks) or, in the first
    block of each stage, the downsampling 1x1 convolution of it, which keeps its whole output too (of
    stride 2, or after the max pooling: on no row list); resnet18's basic blocks not (their conv2 is a
    3x3). Off with recompute=False or fuse=False."""
    example = torch.zeros(1, 3, 64, 64)
    dm = deltaconv.convert(build("resnet50"), backend="reference", example_input=example)
    downsampling = [f"layer{i}.0.downsample.0" for i in range(1, 5)]
    assert kept(dm) == sorted([f"{b}.conv3" for b in blocks(dm)] + downsampling) and len(blocks(dm)) == 16
    assert summing(dm) == sorted(f"{b}.relu_2" for b in blocks(dm))
    notes = {}
    for n in dm.report.nodes:  # a layer's first entry (a folded BatchNorm's follows its convolution's)
        notes.setdefault(n.layer, n.note)
    assert "recomputes for layer1.1.relu_2 (output kept, summed by layer1.1.add)" in notes["layer1.1.conv3"]
    assert "recomputed by layer1.1.conv3 through layer1.1.add" in notes["layer1.1.relu_2"]
    assert "recomputes for layer2.0.relu_2 (output kept, summed by layer2.0.add)" in notes["layer2.0.downsample.0"]
    assert len(dm.report.recomputing) == 2 * 33 + 20 + 16  # the pairs (the stem too); a summing ReLU notes both
    off = deltaconv.convert(build("resnet50"), backend="reference", example_input=example, recompute=False)
    assert not kept(off) and not summing(off)
    unfused = deltaconv.convert(build("resnet50"), backend="reference", example_input=example, fuse=False)
    # unfused, the adds keep their whole sums for the ReLUs after them (whole sums), no ReLU sums
    assert kept(unfused) == kept(dm) and not summing(unfused)
    assert sum(getattr(m, "keeps_sum", False) for m in unfused.modules()) == 16
    basic = deltaconv.convert(build("resnet18"), backend="reference", example_input=example)
    assert not kept(basic) and not summing(basic)


@pytest.mark.parametrize("truncation", ["max", "pooled"])
def test_bottleneck_value_mode_equals_delta_mode_on_the_reference(truncation):
    """float64, reference backend, resnet50: value mode through the residual adds gives delta mode's
    outputs (to float64 rounding) at threshold 0 and above, and the same densities; at threshold 0
    the dense model's; the summing ReLUs keep no accumulator and the kept convolutions their output,
    of the same size in float64 (an accumulator is float32 or float64, a kept output has the values'
    dtype: half of it in float16, test_cuda_bottleneck_value_mode; a block with a downsampling identity
    keeps two such outputs)."""
    model = build("resnet50").double()
    frames = moving_frames(4, shape=(2, 3, 40, 48))
    for t in (0.0, 0.03):
        kw = dict(threshold=t, truncation=truncation, backend="reference", example_input=frames[0])
        value = deltaconv.convert(model, **kw)
        delta = deltaconv.convert(model, recompute=False, **kw)
        with torch.no_grad():
            for f in frames:
                a, b = value(f), delta(f)
                assert rel(a, b) <= 1e-12
                if t == 0:
                    assert rel(a, model(f)) <= 1e-12
        assert [s["mean_density"] for s in value.stats()] == pytest.approx([s["mean_density"] for s in delta.stats()],
                                                                          nan_ok=True)
        if t > 0:
            assert any(0 < s["mean_density"] < 1 for s in value.stats() if s["name"].endswith("relu_2"))
    layers = dict(value.named_modules())
    for block in blocks(value):
        relu = layers[f"{block}.relu_2"]
        assert "acc" not in relu._buffers and relu._buffers["sent"] is not None
        for conv in (f"{block}.conv3", f"{block}.downsample.0"):
            if conv in layers:
                assert layers[conv]._buffers["output"].shape == relu._buffers["sent"].shape
    only_first = without_kept_outputs(deltaconv.convert(model, threshold=0.03, backend="reference",
                                                        example_input=frames[0]))
    with torch.no_grad():
        for f in frames:
            only_first(f)
    # a block with a downsampling identity keeps two outputs instead of one accumulator
    downsampling = sum(layers[f"layer{i}.0.downsample.0"]._buffers["output"].nbytes for i in range(1, 5))
    assert value.state_bytes() == only_first.state_bytes() + downsampling


def test_bottleneck_value_mode_restarts_one_stream():
    """reset(streams=[1]) in the middle of a video: the kept outputs of that stream are recomputed on
    its key frame, and the other stream goes on; the outputs stay delta mode's (float64)."""
    model = build("resnet50").double()
    frames = moving_frames(5, shape=(2, 3, 40, 48), seed=2)
    kw = dict(threshold=0.02, backend="reference", example_input=frames[0])
    value, delta = deltaconv.convert(model, **kw), deltaconv.convert(model, recompute=False, **kw)
    with torch.no_grad():
        for i, f in enumerate(frames):
            if i == 3:
                value.reset(streams=[1])
                delta.reset(streams=[1])
            assert rel(value(f), delta(f)) <= 1e-12, i


def test_a_sum_of_whole_operands_is_taken_only_by_its_activation():
    """The add before a summing activation hands its operands on unsummed (a DeferredSum); an operand
    holding whole values cannot be summed as a delta, so any other reader gets an error that says so."""
    from deltaconv.modules import DCAdd
    from deltaconv.modules.linear import DeferredSum
    add = DCAdd()
    add.layer_name = "block.add"
    whole = torch.zeros(1, 8, 3, 3)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    deferred = DeferredSum(Delta(whole, mask, whole=whole, recomputed=True), Delta(whole, mask, whole=whole), add)
    with pytest.raises(RuntimeError, match="block.add: an operand holds whole values"):
        deferred.value
    relu = DCActivation(from_module(torch.nn.ReLU()))
    relu.layer_name = "block.relu"
    out = relu(deferred)  # the activation fused with the add sums them
    torch.testing.assert_close(out.whole, torch.zeros_like(whole))
    half_whole = DeferredSum(Delta(whole, mask, whole=whole, recomputed=True), Delta(whole, mask), add)
    with pytest.raises(RuntimeError, match="block.relu: a residual add of a convolution's kept whole output needs "
                                           "its other operand whole too"):
        relu(half_whole)


def test_reference_add_activation_values_equals_add_activation_from_the_old_sum():
    """The reference op on whole operands equals add_activation on their changes with the accumulator
    holding the old sum (float64: exact), the union mask included."""
    g = torch.Generator().manual_seed(7)
    shape = (2, 6, 5, 7)
    a0, b0 = torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)
    ma, mb = torch.rand(2, 1, 5, 7, generator=g) < 0.3, torch.rand(2, 1, 5, 7, generator=g) < 0.3
    a1 = torch.where(ma, a0 + torch.randn(shape, generator=g, dtype=torch.float64), a0)
    b1 = torch.where(mb, b0 + torch.randn(shape, generator=g, dtype=torch.float64), b0)
    fn = from_module(torch.nn.ReLU())
    sent_v = torch.relu(a0 - 0.5 * b0)
    sent_d, acc = sent_v.clone(), a0 - 0.5 * b0
    out_v, m_v, u_v = R.add_activation_values(a1, ma, b1, mb, -0.5, sent_v, fn, 0.2, None, "rms")
    out_d, m_d, u_d = R.add_activation(a1 - a0, ma, b1 - b0, mb, -0.5, acc, sent_d, fn, 0.2, None, "rms")
    assert torch.equal(u_v, ma | mb) and torch.equal(u_d, u_v) and torch.equal(m_v, m_d)
    assert m_v.any() and not torch.equal(m_v, u_v)
    torch.testing.assert_close(out_v, out_d, rtol=0, atol=1e-12)
    torch.testing.assert_close(sent_v, sent_d, rtol=0, atol=1e-12)


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 0), (2, 1), ((1, 2), (0, 1))])
def test_reference_conv1x1_into_writes_the_output_mask_and_keeps_the_rest(stride, padding):
    """conv1x1_into: conv2d's output on its output mask in ``out``, every other element as it was (a
    sentinel), and conv2d's mask returned; delta frames, key frames and value mode (load mask, bias key)."""
    g = torch.Generator().manual_seed(9)
    n, cin, cout, h, w = 2, 6, 5, 9, 11
    delta = torch.randn(n, cin, h, w, generator=g, dtype=torch.float64)
    mask = torch.rand(n, 1, h, w, generator=g) < 0.3
    weight = torch.randn(cout, cin, 1, 1, generator=g, dtype=torch.float64)
    bias = torch.randn(cout, generator=g, dtype=torch.float64)
    key = torch.tensor([True, False])
    for kw in (dict(key=None), dict(key=key), dict(key=None, load_mask=torch.ones_like(mask), bias_key=key | True)):
        key_arg = kw.pop("key")
        want, want_mask = R.conv2d(delta, mask, weight, bias, stride, padding, 1, 1, key_arg, **kw)
        out = torch.full_like(want, 7.0)
        got_mask = R.conv1x1_into(delta, mask, weight, bias, stride, padding, key_arg, out, **kw)
        assert torch.equal(got_mask, want_mask) and got_mask.any() and not got_mask.all()
        sel = want_mask.expand_as(want)
        assert torch.equal(out[sel], want[sel]) and bool((out[~sel] == 7.0).all())


def test_reference_keep_output_takes_the_masked_pixels():
    g = torch.Generator().manual_seed(8)
    out, v = torch.zeros(2, 3, 4, 5), torch.randn(2, 3, 4, 5, generator=g)
    mask = torch.rand(2, 1, 4, 5, generator=g) < 0.5
    assert R.keep_output(out, v, mask) is out
    assert torch.equal(out, torch.where(mask, v, 0.0))


def run_cuda_value_mode(name: str, dtype: torch.dtype):
    """torchvision's ``name`` converted for the CUDA kernels in ``dtype`` (TF32 off, rms, t=0.01) with
    the defaults, replayed as a CUDA graph and in delta mode, over 6 video frames at 96x128: replayed
    bit-equal to eager, and eager against delta mode within far less than the truncation error.
    Returns (the eager converted model, the dense model in ``dtype``, the convert arguments, the
    frames)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(name).cuda()
    low = build(name).cuda().to(dtype)
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    kw = dict(threshold=0.01, truncation="rms", example_input=frames[0].to(dtype))
    cuda = deltaconv.convert(low, backend="cuda", **kw)
    graph = deltaconv.convert(low, backend="cuda", cuda_graph=True, check_finite=False, **kw)
    delta = deltaconv.convert(low, backend="cuda", recompute=False, **kw)
    with torch.no_grad():
        for f in frames:
            x = f.to(dtype)
            dense, a, b, c = model(f), cuda(x), graph(x).clone(), delta(x)
            torch.testing.assert_close(b, a, rtol=0, atol=0)
            bound = 1e-4 if dtype == torch.float32 else 3 * rel(low(x), dense) + 1e-3
            assert rel(a, c) <= max(0.1 * rel(c, dense), bound)
    return cuda, low, kw, frames


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_cuda_bottleneck_value_mode(dtype):
    """resnet50 on the CUDA kernels: value mode through the residual adds (the summing kernel and the
    GEMMs writing into the kept outputs, on row lists and off them, run) against the reference's value
    mode and delta mode on the GPU, within far less than the truncation error; replayed from a CUDA
    graph bit-equal to eager."""
    cuda, low, kw, frames = run_cuda_value_mode("resnet50", dtype)
    assert len(kept(cuda)) == 20
    with torch.no_grad():
        names = cuda_kernel_names(lambda: cuda(frames[-1].to(dtype)))
    if names:  # none recorded under compute-sanitizer
        assert any("activation_kernel" in k and "true, true>" in k for k in names), names  # RESIDUAL, VALUES
    relu = cuda.get_submodule("layer1.1.relu_2")
    assert "acc" not in relu._buffers and 0 < relu.stats()["mean_density"] <= 1
    first = without_kept_outputs(deltaconv.convert(low, backend="cuda", **kw))  # the first two ReLUs per block
    with torch.no_grad():
        first(frames[0].to(dtype)), first(frames[1].to(dtype))
    outputs = sum(cuda.get_submodule(name)._buffers["output"].nbytes for name in kept(cuda))
    accumulators = sum(first.get_submodule(f"{b}.relu_2")._buffers["acc"].nbytes for b in blocks(cuda))
    assert cuda.state_bytes() == first.state_bytes() - accumulators + outputs
    assert (cuda.state_bytes() < first.state_bytes()) == (dtype != torch.float32)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("cin, cout, stride, padding", [(64, 256, 1, 0), (256, 512, 2, 0), (24, 40, 2, 1),
                                                        (20, 16, 1, 0), (64, 128, (2, 1), (0, 1))])
def test_cuda_conv1x1_into_equals_conv2d_and_keeps_the_rest(cin, cout, stride, padding, dtype, fraction):
    """The op behind a kept output off a row list: conv2d's output bit for bit on its output mask (the
    same kernels: tensor-core GEMM, the CUDA cores for 20 input channels or float32 without TF32), every
    other element of ``out`` as it was (a sentinel), conv2d's mask; for delta frames, a key frame and
    value mode (load mask, bias key), clustered changes; within rounding of the reference."""
    from deltaconv.backends import cuda as C
    torch.backends.cudnn.allow_tf32 = False
    delta, mask, weight, bias = clustered_case(cin, cout, 1, 1, dtype, fraction, seed=11)
    n = delta.shape[0]
    streams = torch.ones(n, dtype=torch.bool, device="cuda")
    for key, extra in ((None, {}), (torch.tensor([False, True], device="cuda"), {}),
                       (None, dict(load_mask=torch.ones_like(mask), bias_key=streams))):
        args = (delta, mask, weight, bias, stride, padding)
        want, want_mask = C.conv2d(*args, 1, 1, key, **extra)
        out = torch.full_like(want, 7.0).contiguous(memory_format=torch.channels_last)
        got_mask = C.conv1x1_into(*args, key, out, **extra)
        assert torch.equal(got_mask, want_mask)
        sel = want_mask.expand_as(want)
        assert torch.equal(out[sel], want[sel]) and bool((out[~sel] == 7.0).all())
        ref, ref_mask = R.conv2d(*args, 1, 1, key, **extra)
        assert torch.equal(ref_mask, want_mask)
        tol = 1e-5 if dtype == torch.float32 else 2e-2 if dtype == torch.bfloat16 else 2e-3
        torch.testing.assert_close(out[sel].float(), ref[sel].float(), rtol=tol, atol=tol)


@pytest.mark.gpu
@requires_cuda
def test_cuda_conv1x1_into_declines_to_the_reference_and_checks_its_arguments():
    """Output channels not a multiple of 8 or an ``out`` of another layout: the wrapper runs the
    reference on the device (the same result); the op names the argument and the value."""
    from deltaconv.backends import cuda as C
    g = torch.Generator().manual_seed(12)
    delta = torch.randn(1, 16, 9, 10, generator=g).to("cuda", torch.float16).contiguous(
        memory_format=torch.channels_last)
    mask = (torch.rand(1, 1, 9, 10, generator=g) < 0.5).cuda()
    w21 = torch.randn(21, 16, 1, 1, generator=g).to("cuda", torch.float16)
    for weight, layout in ((w21, torch.channels_last), (w21[:16].contiguous(), torch.contiguous_format)):
        out = torch.zeros(1, weight.shape[0], 5, 5, device="cuda", dtype=torch.float16).contiguous(memory_format=layout)
        want_out = out.clone()
        want_mask = R.conv1x1_into(delta, mask, weight, None, 2, 0, None, want_out)
        assert torch.equal(C.conv1x1_into(delta, mask, weight, None, 2, 0, None, out), want_mask)
        torch.testing.assert_close(out, want_out, rtol=2e-3, atol=2e-3)
    op = torch.ops.deltaconv.conv1x1_into
    w16 = w21[:16].contiguous()
    out = torch.zeros(1, 16, 5, 5, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError, match=r"conv1x1_into: argument 'out' must be a channels_last contiguous "
                                           r"\[N, Cout, Ho, Wo\] = \[1, 16, 5, 5\] tensor, got shape \[1, 16, 9, 10\]"):
        op(delta, mask, w16, None, [2, 2], [0, 0], None, None, torch.zeros_like(delta))
    with pytest.raises(RuntimeError, match=r"conv1x1_into: argument 'weight' must have shape \[Cout, 16, 1, 1\], "
                                           r"got \[16, 16, 3, 3\]"):
        op(delta, mask, torch.zeros(16, 16, 3, 3, device="cuda", dtype=torch.float16), None, [1, 1], [1, 1], None,
           None, out)
    with pytest.raises(RuntimeError, match=r"conv1x1_into: argument 'weight' must have a multiple of 8 output "
                                           r"channels on the tensor cores \(pad the filters once\), got 21"):
        op(delta, mask, w21, None, [2, 2], [0, 0], None, None, torch.zeros(1, 21, 5, 5, device="cuda",
           dtype=torch.float16).contiguous(memory_format=torch.channels_last))
    with pytest.raises(RuntimeError, match=r"conv1x1_into: argument 'stride' must be >= 1, got \[0, 2\]"):
        op(delta, mask, w16, None, [0, 2], [0, 0], None, None, out)
    with pytest.raises(RuntimeError, match=r"conv1x1_into: argument 'out' must have dtype Float"):
        op(delta.float(), mask, w16.float(), None, [2, 2], [0, 0], None, None, out)
    torch.library.opcheck(op.default, (delta, mask, w16, None, [2, 2], [0, 0], None, None, out.clone()))
    key = torch.ones(1, dtype=torch.bool, device="cuda")
    torch.library.opcheck(op.default, (delta, mask, w16, torch.ones(16, device="cuda", dtype=torch.float16), [1, 2],
                                       [1, 0], key, None, torch.zeros(1, 16, 11, 5, device="cuda",
                                       dtype=torch.float16).contiguous(memory_format=torch.channels_last)))


def test_an_add_of_two_kept_outputs():
    """Both operands convolutions that keep their outputs (fcn_resnet50's dilated blocks: the
    downsampling identity is a 1x1 of stride 1 on the block input's row list too): both kept, and value
    mode gives delta mode's outputs (float64, reference backend)."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.relu0 = torch.nn.ReLU()
            self.a = torch.nn.Conv2d(16, 24, 1)
            self.b = torch.nn.Conv2d(16, 24, 1)
            self.relu = torch.nn.ReLU()

        def forward(self, x):
            h = self.relu0(self.stem(x))
            return self.relu(self.a(h) + self.b(h))

    model = Block().double().eval()
    frames = moving_frames(4, shape=(2, 3, 40, 48), seed=3)
    kw = dict(threshold=0.05, backend="reference", example_input=frames[0])
    value, delta = deltaconv.convert(model, **kw), deltaconv.convert(model, recompute=False, **kw)
    assert kept(value) == ["a", "b"] and len(summing(value)) == 1
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(value(f), delta(f), rtol=0, atol=1e-12)
    assert "acc" not in value.get_submodule(summing(value)[0])._buffers


def test_accumulator_share_counts_the_layers_left_in_delta_mode():
    """benchmarks/experiments/accumulator_share.py (README, What remains): resnet50 keeps no accumulator
    (its stem recomputes since 2026-12-07, and the max pooling after the stem's ReLU takes its whole values,
    ``WHOLE_MAX_POOLING``); resnet18 in its 8 blocks' fused adds (no bottleneck)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "experiments" / "accumulator_share.py"
    spec = importlib.util.spec_from_file_location("accumulator_share", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    n_acc, n, share, kinds = module.accumulator_share("resnet50", (64, 64))
    assert (n_acc, n, share) == (0, 50, 0.0) and not kinds
    n_acc, n, _, _ = module.accumulator_share("resnet18", (64, 64))
    assert (n_acc, n) == (8, 18)


# ----------------------------------------------------------------------------- whole sums (WHOLE_SUMS)
def accumulators(dm) -> list[str]:
    """The truncating layers (not the input sparsifier) that keep a float32 accumulator."""
    return sorted(layer.layer_name for layer in dm.delta_layers() if layer.truncates and layer.kind != "sparsify"
                  and any(n.startswith("acc") and b is not None for n, b in layer._buffers.items()))


def test_whole_sums_mark_the_projections_adds_and_expansions(monkeypatch):
    """mobilenet_v2: the 17 projections keep their outputs, the 10 adds between blocks their sums, and
    every expansion after them recomputes (35 recomputing convolutions with the stem instead of 18):
    after a frame no activation keeps an accumulator (17 without WHOLE_SUMS). resnet50 is marked as
    without it. The report notes the pairs."""
    example = torch.zeros(1, 3, 64, 64)
    dm = deltaconv.convert(build("mobilenet_v2"), backend="reference", example_input=example)
    keeping = sorted(n for n, m in dm.named_modules() if getattr(m, "keeps_output", False))
    summing_adds = sorted(n for n, m in dm.named_modules() if getattr(m, "keeps_sum", False))
    assert keeping == sorted(["features.1.conv.1"] + [f"features.{i}.conv.2" for i in range(2, 18)])
    assert len(summing_adds) == 10 and sum(getattr(m, "recomputes", False) for m in dm.modules()) == 35
    with torch.no_grad():
        dm(example), dm(example + 0.1)
    assert accumulators(dm) == []
    notes = {}
    for n in dm.report.nodes:  # a layer's first entry (a folded BatchNorm's follows its convolution's)
        notes.setdefault(n.layer, n.note)
    assert "output kept for features.2.conv.0.0" in notes["features.1.conv.1"]
    assert any("sum kept for" in notes[a] for a in summing_adds)
    resnet = deltaconv.convert(build("resnet50"), backend="reference", example_input=example)
    assert len(kept(resnet)) == 20 and not any(getattr(m, "keeps_sum", False) for m in resnet.modules())
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "WHOLE_SUMS", False)
    off = deltaconv.convert(build("mobilenet_v2"), backend="reference", example_input=example)
    assert not any(getattr(m, "keeps_sum", False) or getattr(m, "keeps_output", False) for m in off.modules())
    with torch.no_grad():
        off(example), off(example + 0.1)
    assert len(accumulators(off)) == 17


def value_against_delta_mode(model, frames, t: float):
    """``model`` (float64) converted with the defaults and with ``recompute=False`` (reference backend,
    rms, threshold ``t``), run over ``frames`` with stream 1 restarted before the fourth: the outputs
    equal to float64 rounding, at threshold 0 the dense model's, the densities the same. Returns both."""
    kw = dict(threshold=t, truncation="rms", backend="reference", example_input=frames[0])
    value = deltaconv.convert(model, **kw)
    delta = deltaconv.convert(model, recompute=False, **kw)
    with torch.no_grad():
        for i, f in enumerate(frames):
            if i == 3:
                value.reset(streams=[1])
                delta.reset(streams=[1])
            a, b = value(f), delta(f)
            assert rel(a, b) <= 1e-12, (t, i)
            if t == 0:
                assert rel(a, model(f)) <= 1e-12
    densities = [s["mean_density"] for s in value.stats()]
    assert densities == pytest.approx([s["mean_density"] for s in delta.stats()], nan_ok=True)
    return value, delta


@pytest.mark.parametrize("name", ["mobilenet_v2", "mobilenet_v3_large"])
def test_whole_sums_equal_delta_mode_on_the_reference(name):
    """float64, reference backend: with whole sums the outputs are delta mode's (to float64 rounding)
    at threshold 0 and above, with the same densities, also after restarting one stream; at threshold 0
    the dense model's; the kept sums take the sums' values."""
    model = build(name).double()
    frames = moving_frames(5, shape=(2, 3, 48, 64), seed=4)
    for t in (0.0, 0.002):
        value, delta = value_against_delta_mode(model, frames, t)
        if t > 0:
            adds = [s["mean_density"] for s in value.stats() if getattr(value.get_submodule(s["name"]), "keeps_sum",
                                                                             False)]
            assert adds and any(0 < d < 1 for d in adds)
    assert len(accumulators(value)) < len(accumulators(delta)) // 2


# ----------------------------------------------------------------------------- whole products (WHOLE_PRODUCTS)
def test_whole_products_mark_the_squeeze_excite_scalings(monkeypatch):
    """By default (``WHOLE_PRODUCTS``) every squeeze-excite product (both operands activations' outputs)
    takes whole values and keeps no accumulators after a frame; the report notes it; with the flag off
    none does."""
    example = torch.zeros(1, 3, 64, 64)
    for name, products in (("mobilenet_v3_large", 8), ("efficientnet_b0", 16)):
        dm = deltaconv.convert(build(name), backend="reference", example_input=example)
        taking = [layer for layer in dm.delta_layers() if layer.kind == "mul"]
        assert len(taking) == products and all(layer.takes_whole for layer in taking)
        with torch.no_grad():
            dm(example), dm(example + 0.1)
        assert not any(layer.layer_name in accumulators(dm) for layer in taking)
        notes = {n.layer: n.note for n in dm.report.nodes}
        assert "takes its operands' whole values" in notes[taking[0].layer_name]
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "WHOLE_PRODUCTS", False)
    dm = deltaconv.convert(build("mobilenet_v3_large"), backend="reference", example_input=example)
    assert not any(m.takes_whole for m in dm.delta_layers() if m.kind == "mul")


@pytest.mark.parametrize("name", ["mobilenet_v3_large", "efficientnet_b0"])
def test_whole_products_equal_delta_mode_on_the_reference(name):
    """float64, reference backend: with whole products the outputs are delta mode's (to float64
    rounding) at threshold 0 and above, with the same densities, also after restarting one stream; at
    threshold 0 the dense model's."""
    model = build(name).double()
    frames = moving_frames(5, shape=(2, 3, 48, 64), seed=5)
    for t in (0.0, 0.002):
        value, _ = value_against_delta_mode(model, frames, t)
        assert any(getattr(m, "takes_whole", False) for m in value.modules())


def test_reference_mul_values_is_the_product_on_the_region():
    """mul_values: the product of whole operands (one ``[N, C, 1, 1]``) on the region of either mask (a
    changed scale sets its stream's every pixel), sent against ``sent`` as the dense product rounds it;
    a product in value mode refuses an operand without whole values, naming the layer."""
    from deltaconv.modules import DCMul
    g = torch.Generator().manual_seed(17)
    a, b = torch.randn(2, 3, 1, 1, generator=g).half(), torch.randn(2, 3, 4, 5, generator=g).half()
    ma = torch.tensor([True, False]).reshape(2, 1, 1, 1)
    mb = torch.rand(2, 1, 4, 5, generator=g) < 0.3
    sent = torch.zeros(2, 3, 4, 5, dtype=torch.float16)
    out, mask = R.mul_values(a, ma, b, mb, sent, -1.0, None)
    region = (ma | mb).expand(2, 1, 4, 5)
    assert torch.equal(mask, region) and bool(mask[0].all()) and not bool(mask[1].all())
    sel = region.expand(2, 3, 4, 5)
    assert torch.equal(sent[sel], (a * b)[sel]) and bool((sent[~sel] == 0).all()) and torch.equal(out[sel], sent[sel])
    mul = DCMul()
    mul.layer_name, mul.takes_whole = "se.mul", True
    with pytest.raises(RuntimeError, match="se.mul: an operand gives no whole values this frame"):
        mul(Delta(b, mb), Delta(b, mb, whole=b))


def test_reference_add_values_takes_the_union_and_keeps_the_rest():
    """add_values: the kept sum takes ``a + alpha * b`` on the union of the masks (each operand whole,
    read where only the other changed) and keeps its other pixels; returns the union."""
    g = torch.Generator().manual_seed(13)
    a, b = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 4, 5, generator=g)
    ma, mb = torch.rand(2, 1, 4, 5, generator=g) < 0.3, torch.rand(2, 1, 4, 5, generator=g) < 0.3
    out = torch.full_like(a, 7.0)
    union = R.add_values(a, ma, b, mb, -0.5, out)
    assert torch.equal(union, ma | mb) and union.any() and not union.all()
    sel = union.expand_as(a)
    assert torch.equal(out[sel], (a - 0.5 * b)[sel]) and bool((out[~sel] == 7.0).all())


def test_an_add_of_changes_refuses_whole_operands():
    from deltaconv.modules import DCAdd
    add = DCAdd()
    add.layer_name = "block.add"
    whole = torch.zeros(1, 8, 3, 3)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="block.add: an operand holds whole values .* an add of changes cannot"):
        add(Delta(whole, mask, recomputed=True, whole=whole), Delta(whole, mask))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.5, 1.0])
def test_cuda_add_values_equals_reference(dtype, fraction):
    """ops.add_values on the device (the add kernel over whole operands, into the kept sum) against the
    reference: the same union, the kept sum bit-equal on it (the dense add's rounding) and untouched
    elsewhere, with and without a row list."""
    from deltaconv.backends import cuda as C
    from deltaconv.delta import RowList
    a, ma, _, _ = clustered_case(40, 8, 1, 1, dtype, fraction, seed=14)
    b, mb, _, _ = clustered_case(40, 8, 1, 1, dtype, fraction, seed=15)
    want = torch.full_like(a, 7.0).contiguous(memory_format=torch.channels_last)
    want_union = R.add_values(a, ma, b, mb, -0.5, want)
    for listed in (False, True):
        pixels = a.shape[0] * a.shape[2] * a.shape[3]
        rows = RowList(torch.empty(1 + 2 * pixels, dtype=torch.int32, device="cuda"),
                       torch.zeros(16, dtype=torch.int32, device="cuda")) if listed else None
        out = torch.full_like(a, 7.0).contiguous(memory_format=torch.channels_last)
        union = C.add_values(a, ma, b, mb, -0.5, out, rows)
        assert torch.equal(union, want_union) and torch.equal(out, want)
        if listed:
            assert int(rows.counters[0]) == int(union.sum())


@pytest.mark.gpu
@requires_cuda
def test_cuda_add_values_errors_name_the_argument():
    op = torch.ops.deltaconv.add_values
    a, m, _, _ = clustered_case(16, 8, 1, 1, torch.float16, 0.5, seed=16)
    out = torch.zeros_like(a)
    with pytest.raises(RuntimeError, match=r"add_values: argument 'out' must have dtype Half, got Float"):
        op(a, m, a, m, 1.0, out.float())
    with pytest.raises(RuntimeError, match=r"add_values: argument 'b' must have shape \[2, 16, 37, 45\], "
                                           r"got \[2, 16, 37, 44\]"):
        op(a, m, a[..., :44].contiguous(memory_format=torch.channels_last), m, 1.0, out)
    with pytest.raises(RuntimeError, match=r"add_values: argument 'out' \(state, updated in place\) must be "
                                           r"channels_last contiguous"):
        op(a, m, a, m, 1.0, out.contiguous())
    with pytest.raises(RuntimeError, match=r"add_values: argument 'mask_b' must have dtype Bool"):
        op(a, m, a, m.half(), 1.0, out)


@pytest.mark.gpu
@requires_cuda
def test_cuda_whole_products_mobilenet_v3_large():
    """mobilenet_v3_large in float16 on the CUDA backend with whole products (``ops.mul_values``, the
    default): against delta mode within far less than the truncation error, the products without
    accumulators."""
    model = build("mobilenet_v3_large").cuda()
    low = build("mobilenet_v3_large").cuda().half()
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    kw = dict(threshold=0.01, truncation="rms", example_input=frames[0].half())
    value = deltaconv.convert(low, backend="cuda", **kw)
    delta = deltaconv.convert(low, backend="cuda", recompute=False, **kw)
    with torch.no_grad():
        for f in frames:
            x = f.half()
            dense, a, c = model(f), value(x), delta(x)
            assert rel(a, c) <= max(0.1 * rel(c, dense), 3 * rel(low(x), dense) + 1e-3)
    products = [layer for layer in value.delta_layers() if layer.kind == "mul"]
    assert products and all(p.takes_whole and p.layer_name not in accumulators(value) for p in products)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_cuda_whole_sums_mobilenet_v2(dtype):
    """mobilenet_v2 on the CUDA kernels with whole sums: against delta mode on the GPU within far less
    than the truncation error, replayed from a CUDA graph bit-equal to eager, with no accumulator (the stem
    recomputes too, ``MIN_RECOMPUTE_CHANNELS``)."""
    cuda, _, _, _ = run_cuda_value_mode("mobilenet_v2", dtype)
    assert accumulators(cuda) == []


# ----------------------------------------------------------------------------- unread changes (SKIP_UNREAD_CHANGES)
def test_unread_changes_mark_the_activations_read_only_whole(monkeypatch):
    """By default an activation whose readers all take whole values (convolutions in value mode, kept
    sums, whole products, adds fused with their activation that sum whole operands) is marked not to write
    its changes: all 35 of mobilenet_v2's and 49 of resnet50's, the last read by the classifier's pooling of
    whole values (``WHOLE_HEADS``; without it that one writes them), among them the blocks' third ReLUs, fused
    with the residual add and read by the next block's first convolution and add, and the stem's, read by the
    max pooling in value mode (``WHOLE_MAX_POOLING``); none in delta mode or with the flag off."""
    example = torch.zeros(1, 3, 64, 64)
    model = build("mobilenet_v2")
    dm = deltaconv.convert(model, backend="reference", example_input=example)
    acts = [m for m in dm.delta_layers() if isinstance(m, DCActivation)]
    unread = [m.layer_name for m in acts if m.changes_unread]
    assert len(acts) == 35 and len(unread) == 35
    resnet = deltaconv.convert(build("resnet50"), backend="reference", example_input=example)
    acts = [m for m in resnet.delta_layers() if isinstance(m, DCActivation)]
    written = [m.layer_name for m in acts if not m.changes_unread]
    assert len(acts) == 49 and written == []
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "WHOLE_HEADS", False)
    heads = deltaconv.convert(build("resnet50"), backend="reference", example_input=example)
    assert [m.layer_name for m in heads.delta_layers() if isinstance(m, DCActivation) and not m.changes_unread] \
        == ["layer4.2.relu_2"]
    monkeypatch.undo()
    assert resnet.get_submodule("layer1.0.relu_2").changes_unread  # fused with layer1.0's add
    assert resnet.get_submodule("maxpool").takes_whole
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "WHOLE_MAX_POOLING", False)
    pooling_changes = deltaconv.convert(build("resnet50"), backend="reference", example_input=example)
    assert not pooling_changes.get_submodule("maxpool").takes_whole
    assert not pooling_changes.get_submodule("relu").changes_unread
    monkeypatch.undo()
    delta = deltaconv.convert(model, backend="reference", example_input=example, recompute=False)
    assert not any(getattr(m, "changes_unread", False) for m in delta.modules())
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "SKIP_UNREAD_CHANGES", False)
    off = deltaconv.convert(model, backend="reference", example_input=example)
    assert not any(getattr(m, "changes_unread", False) for m in off.modules())


def test_reading_unwritten_changes_is_an_error():
    """A reader's value mode cleared after ``convert`` (here resnet50's first bottleneck's conv3 and
    downsampling convolution, no longer keeping their outputs) would read the changes that a marked
    activation left unwritten: the layer raises, naming itself; with the activations writing their changes
    again (``helpers.writing_changes``) the model runs and equals delta mode's (float64)."""
    model = build("resnet50").double()
    frames = [f.double() for f in video_frames(3, (64, 64))]
    kw = dict(threshold=0.03, backend="reference", example_input=frames[0])
    dm = deltaconv.convert(model, **kw)
    for name in ("layer1.0.conv3", "layer1.0.downsample.0"):
        dm.get_submodule(name).keeps_output = False
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"layer1\.0\.conv3: its input's changes were not "
                                                            r"written .* changes_unread"):
        dm(frames[0])
    dm = writing_changes(deltaconv.convert(model, **kw))
    for name in ("layer1.0.conv3", "layer1.0.downsample.0"):
        dm.get_submodule(name).keeps_output = False
    delta = deltaconv.convert(model, recompute=False, **kw)
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(dm(f), delta(f), rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["mobilenet_v2", "mobilenet_v3_large", "resnet50"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda_graph"])
def test_cuda_unread_changes_equal_written_ones(name, graph, monkeypatch):
    """On the CUDA kernels the activations marked ``changes_unread`` leave their changes unwritten: the
    outputs equal, bit for bit, those of the same model writing them, eager and replayed from CUDA graphs."""
    model = build(name).cuda().half()
    frames = [f.cuda().half() for f in video_frames(6, (96, 128))]
    kw = dict(threshold=0.01, backend="cuda", example_input=frames[0], cuda_graph=graph)
    skipping = deltaconv.convert(model, **kw)
    assert any(getattr(m, "changes_unread", False) for m in skipping.modules())
    monkeypatch.setattr(importlib.import_module("deltaconv.convert"), "SKIP_UNREAD_CHANGES", False)
    writing = deltaconv.convert(model, **kw)
    with torch.no_grad():
        for f in frames:
            a, b = main_output(skipping(f)), main_output(writing(f))
            assert torch.equal(a, b)


class _AffineStem(torch.nn.Module):
    """A model file's front: an input affine ``x * scale + shift`` (static per-channel tensors), an explicit
    SAME padding, a stride-2 stem of 3 input channels, ReLU6, then a pointwise layer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1))
        self.register_buffer("shift", torch.tensor([0.5, 0.4, 0.45]).view(1, 3, 1, 1))
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.head = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = torch.nn.functional.pad(x * self.scale + self.shift, (0, 1, 0, 1))
        return torch.relu(self.head(torch.nn.functional.relu6(self.stem(x))))


def test_an_input_affine_gives_whole_values_to_the_stem():
    """The static product and sum before a padding and a stem give their whole outputs (``gives_whole``, noted in
    the report), the stem recomputes from them; float64, reference backend: the dense model's output at threshold
    0, delta mode's at 0.03 (``recompute=False``: no whole values given)."""
    model = _AffineStem().double()
    frames = moving_frames(5)
    value = deltaconv.convert(model, backend="reference", example_input=frames[0])
    layers = dict(value.named_modules())
    assert layers["mul"].gives_whole and layers["add"].gives_whole and layers["stem"].recomputes
    notes = {n.layer: n.note for n in value.report.nodes}
    assert notes["mul"] == notes["add"] == "gives its whole output" and "recomputes for" in notes["stem"]
    delta = deltaconv.convert(model, recompute=False, backend="reference", example_input=frames[0])
    assert not any(getattr(m, "gives_whole", False) for m in delta.modules())
    for t in (0.0, 0.03):
        value, delta = (deltaconv.convert(model, threshold=t, backend="reference", example_input=frames[0], **kw)
                        for kw in ({}, {"recompute": False}))
        assert_value_equals_delta(value, delta, model, frames, t)


def test_the_stem_reads_the_frame_not_the_sparsifiers_rounded_sends():
    """float16, threshold 0: a pixel falling from 1 to 0.0123 changes by an amount float16 cannot hold, so the
    sparsifier sends it rounded and keeps the residual in ``sent`` (for layers reading changes). Read by a
    recomputing stem (``whole_from_frame``, noted in the report; not with ``recompute=False``), its whole values
    are the frame's own on the pixels sent, so the stem's activation equals the dense float16 model's (0 of 392
    values differ here; at most 1 % allowed for another summation order), where reading ``sent`` put 131 of them
    an ulp or more off."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU6(), torch.nn.Conv2d(8, 8, 1)).half()
    first = torch.ones(1, 3, 16, 16, dtype=torch.float16)
    second = (torch.rand(1, 3, 16, 16) * 0.02 + 0.005).half()  # every pixel falls to 0.005-0.025
    dm = deltaconv.convert(model, backend="reference", example_input=first)
    sparsifier = dm.delta_layers()[0]
    assert sparsifier.whole_from_frame
    assert {n.layer: n.note for n in dm.report.nodes}[sparsifier.layer_name] == "gives the frame's values whole"
    plain = deltaconv.convert(model, backend="reference", recompute=False, example_input=first)
    assert not plain.delta_layers()[0].whole_from_frame
    seen = []
    sparsifier.register_forward_hook(lambda mod, inp, out: seen.append(out.whole.clone()))
    stem_activation = [m for m in dm.delta_layers() if isinstance(m, DCActivation)][0]
    differing = []
    for from_frame in (True, False):
        dm.reset()
        sparsifier.whole_from_frame = from_frame
        with torch.no_grad():
            dm(first)
            dm(second)
            want = model[:2](second)
        differing.append(int((stem_activation.sent != want).sum()))
    assert not torch.equal(sparsifier.sent, second)  # the residuals this test is about
    assert torch.equal(seen[1], second) and torch.equal(seen[3], sparsifier.sent)
    assert differing[0] <= 0.01 * want.numel() and differing[1] > 0.1 * want.numel(), differing


def test_whole_heads_pool_whole_values_and_return_them():
    """``WHOLE_HEADS``: a classifier's global average pooling of an activation, read by reshapes, linear layers
    and activations only, pools the whole values and the output returns the head's whole values (noted);
    mobilenet_v3_large's head is one, its 8 squeeze-excite poolings (read by convolutions) are not. float16,
    threshold 0, 30 frames that change everywhere: the outputs match the dense float16 model's (2.5 % of the
    values differ here, allowed 5 %), where summing the head's rounded changes left half of them off (48 %)."""
    example = torch.zeros(1, 3, 64, 64)
    dm = deltaconv.convert(build("mobilenet_v3_large"), backend="reference", example_input=example)
    pools = [m for m in dm.delta_layers() if m.kind == "adaptive_avg_pool2d"]
    assert len(pools) == 9 and [m.layer_name for m in pools if m.takes_whole] == ["avgpool"]
    assert dm.get_submodule("output").takes_whole
    notes = {n.layer: n.note for n in dm.report.nodes}
    assert notes["avgpool"] == "pools its input's whole values (a whole head)"
    assert notes["output"] == "returns the whole head's values"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(64, 100)).eval().half()
    g = torch.Generator().manual_seed(1)
    frames = [torch.rand(1, 3, 16, 16, generator=g).half() for _ in range(30)]
    differing = []
    for heads in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(importlib.import_module("deltaconv.convert"), "WHOLE_HEADS", heads)
            dm = deltaconv.convert(model, backend="reference", example_input=frames[0])
        assert dm.get_submodule("2").takes_whole == heads
        with torch.no_grad():
            differing.append(sum(int((dm(f) != model(f)).sum()) for f in frames) / (30 * 100))
    assert differing[0] <= 0.05 and differing[1] >= 0.3, differing


def test_a_head_reshaped_to_more_than_a_row_per_sample_stays_in_delta_mode():
    """A head whose reshape gives each sample more than one row (``[N, 5, 2]``: not a per-sample reshape as
    traced) is not a whole head; it runs in delta mode and equals the dense model (float64, threshold 0)."""
    class SplitHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 10)

        def forward(self, x):
            y = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1)
            return self.fc(y).reshape(-1, 5, 2)

    model = SplitHead().double().eval()
    frames = moving_frames(4)
    dm = deltaconv.convert(model, backend="reference", example_input=frames[0])
    assert not any(getattr(m, "takes_whole", False) for m in dm.delta_layers())
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(dm(f), model(f), rtol=0, atol=1e-12)
