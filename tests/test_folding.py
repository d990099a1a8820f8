"""BatchNorm folding (deltaconv/modules/folding.py): the rounding that keeps each filter's sum, the
fold a cast rounds from the converted model's own precision, and what invalidates it."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import deltaconv
from deltaconv import DCConv2d
from deltaconv.modules import folding
from deltaconv.modules.folding import (FoldedWeights, block_diagonal, bn_scale_shift, round_keeping_sums,
                                      round_to_tf32)
from deltaconv.delta import Delta
from deltaconv.modules.linear import (BLOCK_DIAGONAL_MAX_CIN, BLOCK_DIAGONAL_MAX_GROUPS, BLOCK_DIAGONAL_MIN_PIXELS,
                                      padded_out_channels, runs_block_diagonal, runs_tensor_cores)
from helpers import is_tf32, video_frames


def neighbours(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The two values of ``dtype`` around each value of ``weight`` (float64)."""
    near = weight.to(dtype)
    toward = torch.where(weight.double() > near.double(), float("inf"), float("-inf")).to(dtype)
    return near.double(), torch.nextafter(near, toward).double()


def filter_sum_error(rounded: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``|sum of taps rounded - sum of taps exact|`` per filter ``[C_out, C_in / groups]``."""
    return (rounded.double().sum((2, 3)) - weight.double().sum((2, 3))).abs()


@settings(max_examples=30, deadline=None)
@given(out_ch=st.integers(1, 12), in_ch=st.integers(1, 6), k=st.sampled_from([(3, 3), (5, 5), (1, 3), (7, 7)]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), scale=st.sampled_from([1e-3, 1.0, 40.0]),
       seed=st.integers(0, 2**16))
def test_round_keeping_sums_picks_a_neighbour_and_keeps_filter_sums(out_ch, in_ch, k, dtype, scale, seed):
    """Every value becomes one of its two neighbours in the coarser dtype, and no filter's sum is
    further from the exact sum than with rounding to nearest (float32 and float64 inputs)."""
    g = torch.Generator().manual_seed(seed)
    for src in (torch.float32, torch.float64):
        w = (torch.randn(out_ch, in_ch, *k, generator=g, dtype=torch.float64) * scale).to(src)
        r = round_keeping_sums(w, dtype)
        assert r.dtype == dtype and r.shape == w.shape
        near, other = neighbours(w, dtype)
        assert bool(((r.double() == near) | (r.double() == other)).all())
        assert bool((filter_sum_error(r, w) <= filter_sum_error(w.to(dtype), w)).all())


def test_round_keeping_sums_brings_sums_closer_than_nearest():
    """Over many 3x3 filters the sums are far closer than rounding to nearest gives; 1x1 kernels and
    values exact in the dtype round as to nearest; an empty weight stays empty."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, 3, 3, generator=g)
    for dtype in (torch.float16, torch.bfloat16):
        kept, nearest = filter_sum_error(round_keeping_sums(w, dtype), w), filter_sum_error(w.to(dtype), w)
        assert kept.mean() < 0.2 * nearest.mean(), (dtype, kept.mean(), nearest.mean())
        one = torch.randn(16, 8, 1, 1, generator=g)
        assert torch.equal(round_keeping_sums(one, dtype), one.to(dtype))
        exact = w.to(dtype).float()
        assert torch.equal(round_keeping_sums(exact, dtype), exact.to(dtype))
        assert round_keeping_sums(torch.empty(0, 4, 3, 3), dtype).shape == (0, 4, 3, 3)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        for bn in (self.bn, self.bn2):
            bn.running_mean.uniform_(-2, 2)
            bn.running_var.uniform_(0.01, 4)
            bn.weight.data.uniform_(-3, 3)
            bn.bias.data.uniform_(-1, 1)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn(self.conv(x))))))


def folded_convs(dm) -> list[DCConv2d]:
    return [m for m in dm.modules() if isinstance(m, DCConv2d) and m.folded_bn is not None]


def exact_fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    scale, shift = bn_scale_shift(bn)
    w = conv.weight.detach().double() * scale.double().view(-1, 1, 1, 1)
    b = shift.double() if conv.bias is None else conv.bias.detach().double() * scale.double() + shift.double()
    return w, b


def test_fold_of_float16_weights_keeps_sums():
    """A float16 model's fold: its exact fold (float32) rounded by round_keeping_sums, the bias to
    nearest."""
    model = ConvBN().eval().half()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 8, 8).half())
    for conv, (dense_conv, bn) in zip(folded_convs(dm), [(model.conv, model.bn), (model.conv2, model.bn2)]):
        w, b = conv.folded_weight_bias()
        scale, shift = bn_scale_shift(bn)
        exact_w = dense_conv.weight.float() * scale.view(-1, 1, 1, 1)
        assert torch.equal(w, round_keeping_sums(exact_w, torch.float16))
        exact_b = shift if dense_conv.bias is None else dense_conv.bias.float() * scale + shift
        assert torch.equal(b, exact_b.half())


def test_cast_after_conversion_rounds_the_exact_fold():
    """convert(model).half(): each fold is the float32 model's exact fold rounded once (keeping
    sums), not a fold of the rounded float16 weights; it holds across a further cast to the same
    dtype and a deepcopy, and is dropped when a parameter changes (load_state_dict), when the cast
    gives the parameters other values (to_empty) or when the model is cast up again (the fold is then
    the new parameters')."""
    model = ConvBN().eval()
    exact = [exact_fold(model.conv, model.bn), exact_fold(model.conv2, model.bn2)]
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 8, 8))
    assert dm.half() is dm
    for conv, (w, b) in zip(folded_convs(dm), exact):
        assert conv.weight.dtype == torch.float16
        got_w, got_b = conv.folded_weight_bias()
        assert torch.equal(got_w, round_keeping_sums(w.float(), torch.float16))
        assert torch.equal(got_b, b.float().half())
        from_half = FoldedWeights().folded(conv.weight, conv.bias, conv.folded_bn, 0)[0]
        assert not torch.equal(got_w, from_half)  # the second rounding the cast avoids

    expected = [c.folded_weight_bias()[0].clone() for c in folded_convs(dm)]
    dm.to(torch.float16)  # a cast to the same dtype keeps the fold
    copied = copy.deepcopy(dm)
    for model_ in (dm, copied):
        for conv, w in zip(folded_convs(model_), expected):
            assert torch.equal(conv.folded_weight_bias()[0], w)

    copied.load_state_dict(copied.state_dict())  # in-place copies: the parameters "changed"
    for conv in folded_convs(copied):
        fresh = FoldedWeights().folded(conv.weight, conv.bias, conv.folded_bn, 0)[0]
        assert torch.equal(conv.folded_weight_bias()[0], fresh)

    emptied = copy.deepcopy(dm).to_empty(device="cpu")  # other values (whatever memory held): not kept
    for conv in folded_convs(emptied):
        fresh = FoldedWeights().folded(conv.weight, conv.bias, conv.folded_bn, 0)[0]
        torch.testing.assert_close(conv.folded_weight_bias()[0], fresh, rtol=0, atol=0, equal_nan=True)

    dm.float()  # cast up: folded from the (float16-valued) float32 parameters
    for conv in folded_convs(dm):
        assert conv.folded_weight_bias()[0].dtype == torch.float32
        fresh = FoldedWeights().folded(conv.weight, conv.bias, conv.folded_bn, 0)[0]
        assert torch.equal(conv.folded_weight_bias()[0], fresh)


def test_folded_float16_model_keeps_the_dense_models_error(monkeypatch):
    """MobileNetV2 with its ImageNet weights in float16, threshold 0, on video, against the float64
    model (reference backend on the CPU; benchmarks/experiments/fp16_floor.py measures the CUDA
    kernels). Folding BatchNorm with each weight rounded to nearest raised the error to about twice
    the dense float16 model's: the first depthwise convolution's rounding errors add up to offsets
    per channel. Rounding that keeps each filter's sum, unfolding, and converting in float32 before
    the cast each stay near the dense model's."""
    from deltaconv.weights import mobilenet_v2_imagenet
    exact, half = mobilenet_v2_imagenet().double(), mobilenet_v2_imagenet().half()
    frames = video_frames(6, (64, 96), "one-by-one-person-detection.mp4")

    def mean_error(run) -> float:
        errors = []
        with torch.no_grad():
            for i, f in enumerate(frames):
                y, ref = run(f.half()).double(), exact(f.double())
                if i:
                    errors.append(((y - ref).norm() / ref.norm()).item())
        return sum(errors) / len(errors)

    dense = mean_error(half)
    folded = mean_error(deltaconv.convert(half, example_input=frames[0].half()))
    unfolded = mean_error(deltaconv.convert(half, example_input=frames[0].half(), fold_bn=False))
    cast = mean_error(deltaconv.convert(mobilenet_v2_imagenet(), example_input=frames[0]).half())
    monkeypatch.setattr(folding, "round_keeping_sums", lambda weight, dtype, max_flips=None: weight.to(dtype))
    nearest = mean_error(deltaconv.convert(half, example_input=frames[0].half()))
    errors = dict(dense=dense, folded=folded, unfolded=unfolded, cast=cast, nearest=nearest)
    assert nearest > 1.6 * dense, errors
    assert folded < 0.75 * nearest and folded < 1.4 * dense, errors
    assert unfolded < 1.2 * dense and cast < 1.2 * dense, errors


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_converted_model_cast_equals_dense_at_threshold_zero_within_rounding(dtype):
    """A converted float32 model cast to a coarser dtype runs: outputs near the dense model cast the
    same way (reference backend)."""
    model = ConvBN().eval()
    x = torch.randn(2, 1, 3, 16, 16)
    dm = deltaconv.convert(model, example_input=x[0]).to(dtype)
    dense = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        for f in x:
            torch.testing.assert_close(dm(f.to(dtype)).float(), dense(f.to(dtype)).float(), rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_keeping_sums_on_cuda_equals_cpu_also_while_a_graph_records(dtype):
    """The same values on CUDA tensors as on the CPU, and inside CUDA-graph capture (no early exit,
    which would synchronise) the same again on replay."""
    w = torch.randn(48, 16, 3, 3, generator=torch.Generator().manual_seed(1))
    expected = round_keeping_sums(w, dtype)
    src = w.cuda()
    assert torch.equal(round_keeping_sums(src, dtype).cpu(), expected)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        round_keeping_sums(src, dtype)  # warm-up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = round_keeping_sums(src, dtype)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.cpu(), expected)


# ----------------------------------------------------------------------------- grouped convs as one group
@pytest.mark.parametrize("groups,cin_g,cout_g,k,stride", [(2, 4, 4, 3, 1), (3, 2, 5, 3, 2), (8, 4, 1, 1, 1),
                                                          (4, 3, 3, 5, 1), (1, 6, 6, 3, 1)])
def test_block_diagonal_weight_is_the_grouped_convolution(groups, cin_g, cout_g, k, stride):
    torch.manual_seed(groups)
    weight = torch.randn(groups * cout_g, cin_g, k, k, dtype=torch.float64)
    x = torch.randn(2, groups * cin_g, 11, 13, dtype=torch.float64)
    dense = block_diagonal(weight, groups)
    assert dense.shape == (groups * cout_g, groups * cin_g, k, k)
    assert (dense != 0).sum() == (weight != 0).sum()  # only zeros were added
    torch.testing.assert_close(F.conv2d(x, dense, None, stride, k // 2), F.conv2d(x, weight, None, stride, k // 2, 1, groups),
                               rtol=1e-12, atol=1e-12)


def test_folded_weights_expand_groups_after_the_fold():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(12, 12, 3, padding=1, groups=3), nn.BatchNorm2d(12)
    bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2), bn.weight.data.normal_()
    conv, bn = conv.double().eval(), bn.double().eval()
    folded = FoldedWeights()
    w3, b3 = folded.get(conv.weight, conv.bias, bn, out_dim=0)
    w1, b1 = folded.get(conv.weight, conv.bias, bn, out_dim=0, expand_groups=3)
    assert w1.shape == (12, 12, 3, 3) and torch.equal(w1, block_diagonal(w3, 3)) and torch.equal(b1, b3)
    x = torch.randn(1, 12, 9, 9, dtype=torch.float64)
    torch.testing.assert_close(F.conv2d(x, w1, b1, 1, 1), bn(conv(x)), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        conv.weight.mul_(2)  # a changed source is folded again
    assert not torch.equal(folded.get(conv.weight, conv.bias, bn, out_dim=0, expand_groups=3)[0], w1)


def test_which_grouped_convolutions_run_block_diagonal(monkeypatch):
    half, gpu = torch.float16, True
    assert runs_block_diagonal(6, 48, half, gpu) and runs_block_diagonal(32, 128, torch.bfloat16, gpu)
    assert runs_block_diagonal(BLOCK_DIAGONAL_MAX_GROUPS, BLOCK_DIAGONAL_MAX_CIN, half, gpu)
    assert not runs_block_diagonal(BLOCK_DIAGONAL_MAX_GROUPS + 1, 8 * (BLOCK_DIAGONAL_MAX_GROUPS + 1), half, gpu)
    assert not runs_block_diagonal(8, BLOCK_DIAGONAL_MAX_CIN + 8, half, gpu)  # too wide
    assert not runs_block_diagonal(48, 48, half, gpu)  # depthwise: its own kernel
    assert not runs_block_diagonal(6, 54, half, gpu)  # rows not a multiple of 8
    assert not runs_block_diagonal(1, 48, half, gpu)
    assert not runs_block_diagonal(6, 48, torch.float32, gpu) and not runs_block_diagonal(6, 48, half, False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # float32 in TF32 on the tensor cores
    assert runs_block_diagonal(6, 48, torch.float32, gpu) and not runs_block_diagonal(6, 48, torch.float64, gpu)
    assert not runs_block_diagonal(6, 48, torch.float32, False)
    assert runs_block_diagonal(6, 48, half, gpu, pixels=BLOCK_DIAGONAL_MIN_PIXELS)
    assert not runs_block_diagonal(6, 48, half, gpu, pixels=BLOCK_DIAGONAL_MIN_PIXELS - 1)  # a small map
    layer = DCConv2d.from_dense(nn.Conv2d(48, 48, 3, padding=1, groups=6).half())
    assert layer.kernel_groups() == 6  # on the CPU
    assert layer.folded_weight_bias()[0].shape == (48, 8, 3, 3)


@pytest.mark.parametrize("kw,size,pixels", [(dict(padding=1), (9, 13), 2 * 9 * 13),
                                            (dict(padding=1, stride=2), (9, 13), 2 * 5 * 7),
                                            (dict(padding=2, dilation=2, stride=(1, 3)), (9, 13), 2 * 9 * 5),
                                            (dict(padding="valid"), (9, 13), 2 * 7 * 11),
                                            (dict(padding="same"), (9, 13), 2 * 9 * 13)], ids=str)
def test_output_pixels_is_the_dense_convolutions(kw, size, pixels):
    conv = nn.Conv2d(8, 8, 3, groups=2, **kw)
    x = torch.randn(2, 8, *size)
    assert conv(x)[:, 0].numel() == pixels
    layer = DCConv2d.from_dense(conv)
    assert layer.output_pixels(Delta(x, torch.ones(2, 1, *size, dtype=torch.bool))) == pixels


# ----------------------------------------------------------------------------- output channels padded once
def test_folded_weights_pad_to_out_channels_with_zero_filters():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(16, 21, 3, padding=1).double().eval(), nn.BatchNorm2d(21).double().eval()
    bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2)
    folded = FoldedWeights()
    w, b = folded.get(conv.weight, conv.bias, bn, out_dim=0)
    wp, bp = folded.get(conv.weight, conv.bias, bn, out_dim=0, out_channels=24)
    assert wp.shape == (24, 16, 3, 3) and bp.shape == (24,)
    assert torch.equal(wp[:21], w) and torch.equal(bp[:21], b) and not wp[21:].any() and not bp[21:].any()
    x = torch.randn(1, 16, 7, 9, dtype=torch.float64)
    torch.testing.assert_close(F.conv2d(x, wp, bp, 1, 1)[:, :21], bn(conv(x)), rtol=1e-12, atol=1e-12)
    nobias = nn.Conv2d(16, 21, 1, bias=False).double()
    assert FoldedWeights().get(nobias.weight, None, None, out_dim=0, out_channels=24)[1] is None


def test_which_convolutions_pad_their_filters_once(monkeypatch):
    half = torch.float16
    assert padded_out_channels(21, 16, 1, 9, half, True) == 24
    assert padded_out_channels(52, 208, 1, 1, torch.bfloat16, True) == 56  # a squeeze-excite reduction
    assert padded_out_channels(24, 16, 1, 9, half, True) == 24  # a multiple of 8 already
    assert padded_out_channels(21, 12, 1, 9, half, True) == 21  # input channels not a multiple of 8
    assert padded_out_channels(21, 16, 3, 9, half, True) == 21  # grouped
    assert padded_out_channels(21, 16, 1, 49, half, True) == 21  # more taps than the tensor cores' paths
    assert padded_out_channels(21, 16, 1, 9, torch.float32, True) == 21  # TF32 off (the tests' default)
    assert padded_out_channels(21, 16, 1, 9, half, False) == 21
    # float32 on the tensor cores in TF32 where torch.backends.cudnn.allow_tf32 lets it, unless
    # DELTACONV_TC_TF32=0; float64 never
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert runs_tensor_cores(torch.float32) and padded_out_channels(21, 16, 1, 9, torch.float32, True) == 24
    assert not runs_tensor_cores(torch.float64) and padded_out_channels(21, 16, 1, 9, torch.float64, True) == 21
    monkeypatch.setenv("DELTACONV_TC_TF32", "0")
    assert not runs_tensor_cores(torch.float32) and padded_out_channels(21, 16, 1, 9, torch.float32, True) == 21
    assert runs_tensor_cores(half) and runs_tensor_cores(torch.bfloat16)
    monkeypatch.setenv("DELTACONV_TC_PAD", "0")
    assert padded_out_channels(21, 16, 1, 9, half, True) == 21


def test_round_to_tf32_rounds_to_nearest_with_ties_away_from_zero():
    """10 mantissa bits, to nearest, halfway cases away from zero (cvt.rna.tf32.f32); the result is
    float32 with its low 13 mantissa bits zero, within half a TF32 unit of the value, rounded again
    unchanged; infinities and NaNs stay; the memory format is kept."""
    ulp = 2.0 ** -10  # TF32's unit in the last place at 1
    x = torch.tensor([1.0, 1 + ulp / 2, 1 + ulp / 2 + 2 ** -20, 1 + ulp / 4, -(1 + ulp / 2), 1 + ulp * 3 / 4, 0.0,
                      float("inf"), float("-inf")])
    expected = torch.tensor([1.0, 1 + ulp, 1 + ulp, 1.0, -(1 + ulp), 1 + ulp, 0.0, float("inf"), float("-inf")])
    assert torch.equal(round_to_tf32(x), expected)
    assert torch.isnan(round_to_tf32(torch.tensor([float("nan")]))).all()
    w = torch.randn(32, 16, 3, 3, generator=torch.Generator().manual_seed(3)) * 10.0 ** torch.randint(
        -8, 8, (32, 1, 1, 1), generator=torch.Generator().manual_seed(4))
    w = w.contiguous(memory_format=torch.channels_last)
    r = round_to_tf32(w)
    assert r.dtype == torch.float32 and r.is_contiguous(memory_format=torch.channels_last)
    assert is_tf32(r)
    unit = torch.ldexp(torch.ones_like(w), torch.frexp(w)[1] - 11)  # TF32's unit at each value
    assert ((r.double() - w.double()).abs() <= unit.double() / 2).all()
    assert torch.equal(round_to_tf32(r), r)


def test_folded_weights_rounded_to_tf32_on_request():
    """``FoldedWeights.get(..., tf32=True)``: the fold in its layout, rounded to TF32; cached apart
    from the unrounded fold."""
    conv, bn = nn.Conv2d(16, 24, 3), nn.BatchNorm2d(24)
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 2.0)
        bn.running_mean.normal_()
    fw = FoldedWeights()
    exact, b = fw.get(conv.weight, conv.bias, bn, out_dim=0, layout=torch.channels_last)
    rounded, b2 = fw.get(conv.weight, conv.bias, bn, out_dim=0, layout=torch.channels_last, tf32=True)
    assert torch.equal(rounded, round_to_tf32(exact)) and not torch.equal(rounded, exact) and torch.equal(b2, b)
    assert rounded.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(fw.get(conv.weight, conv.bias, bn, out_dim=0, layout=torch.channels_last)[0], exact)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_float32_convolution_rounds_its_weights_to_tf32_where_the_tensor_cores_take_it(monkeypatch):
    """On the GPU with TF32 allowed a float32 convolution's folded weight is rounded to TF32 (the
    tensor cores would truncate it), a grouped one's block-diagonal weight too, channels_last as
    the kernels read it (in float16 as well); with TF32 off, or a depthwise conv (CUDA cores), it
    stays exact."""
    conv = DCConv2d.from_dense(nn.Conv2d(16, 32, 3, padding=1)).cuda()
    grouped = DCConv2d.from_dense(nn.Conv2d(16, 32, 3, padding=1, groups=4)).cuda()
    depthwise = DCConv2d.from_dense(nn.Conv2d(16, 16, 3, padding=1, groups=16)).cuda()
    exact = conv.weight.detach()
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert torch.equal(conv.folded_weight_bias()[0], round_to_tf32(exact))
    block = grouped.folded_weight_bias()[0]  # channels_last, as the tensor-core kernels read it (4 channels per group)
    assert torch.equal(block, round_to_tf32(block_diagonal(grouped.weight.detach(), 4)))
    assert block.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(depthwise.folded_weight_bias()[0], depthwise.weight.detach())
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert torch.equal(conv.folded_weight_bias()[0], exact)
    assert torch.equal(grouped.folded_weight_bias()[0], grouped.weight.detach())
    half = DCConv2d.from_dense(nn.Conv2d(16, 32, 3, padding=1, groups=4)).cuda().half()
    assert half.folded_weight_bias()[0].is_contiguous(memory_format=torch.channels_last)
