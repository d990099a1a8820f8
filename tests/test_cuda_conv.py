"""GPU tests of the convolution / pooling / linear kernels (csrc/conv_ops.cu, csrc/conv/*.cuh).

Every op is called directly through ``torch.ops.deltaconv`` and compared with the oracle,
``deltaconv.backends.reference``: linear ops against a float64 CPU run of the reference on the
same (dtype-rounded) inputs, max pooling bit-exactly against a CPU run in the same dtypes (its
float32 state arithmetic is the same there). Masks are compared exactly, values on active output
pixels only (values at inactive pixels are unspecified), and inputs carry NaN at inactive pixels,
so a kernel that reads them as data fails.

All tests are marked ``gpu`` and skip without a CUDA GPU or the built extension. For development
builds, ``DELTACONV_TEST_LIBRARY=/path/to/lib.so`` loads that library instead of ``deltaconv._C``.
"""
from __future__ import annotations

import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from deltaconv.backends import reference as ref
from deltaconv.modules import WorkCounters
from helpers import cuda_kernel_names, is_tf32


def _load() -> str:
    """``""`` when the ops can run, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    lib = os.environ.get("DELTACONV_TEST_LIBRARY")
    if lib:
        torch.ops.load_library(lib)
        return ""
    from deltaconv import _extension
    if not _extension.load():
        return "the deltaconv CUDA extension is not built or failed to load"
    return ""


_WHY = _load()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_WHY), reason=_WHY or "ok")]

if not _WHY and not os.environ.get("DELTACONV_TEST_LIBRARY"):
    try:  # the CUDA backend registers the fake (meta) impls of the ops, when it exists
        import deltaconv.backends.cuda  # noqa: F401
    except Exception:  # noqa: BLE001 - the tests register their own fakes then
        pass

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rtol, atol relative to the largest expected magnitude) per dtype: fp32 accumulation error, or
# the rounding of the output to the dtype
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
# changed fractions per stream (batch 2, different masks per stream) and key patterns
FRACS = [(0.0, 0.01), (0.01, 0.3), (0.3, 1.0), (1.0, 0.0)]
KEYS = [None, (True, False), (False, True)]
COUNTERS = WorkCounters.PER_CALL  # the zeroed ints a converted model gives each convolution call


def ops():
    return torch.ops.deltaconv


# ----------------------------------------------------------------------------- inputs
def make_mask(fracs, H, W, gen) -> torch.Tensor:
    """[N,1,H,W] bool: per stream 0, 1, clustered blobs (f < 0.05, like motion in video) or
    scattered pixels."""
    masks = []
    for f in fracs:
        if f <= 0:
            m = torch.zeros(H, W, dtype=torch.bool)
        elif f >= 1:
            m = torch.ones(H, W, dtype=torch.bool)
        elif f < 0.05:
            m = torch.zeros(H, W, dtype=torch.bool)
            target = max(1, round(f * H * W))
            while int(m.sum()) < target:
                cy = int(torch.randint(H, (1,), generator=gen))
                cx = int(torch.randint(W, (1,), generator=gen))
                r = int(torch.randint(1, 4, (1,), generator=gen))
                m[max(0, cy - r):cy + r + 1, max(0, cx - r):cx + r + 1] = True
        else:
            m = torch.rand(H, W, generator=gen) < f
        masks.append(m)
    return torch.stack(masks)[:, None]


def make_delta(N, C, H, W, mask, dtype, gen, scale=1.0) -> torch.Tensor:
    """channels_last CUDA delta, NaN at inactive pixels (they must never be read)."""
    d = torch.randn(N, C, H, W, generator=gen) * scale
    d = torch.where(mask, d, torch.full((), float("nan")))
    return d.to(dtype).cuda().contiguous(memory_format=torch.channels_last)


def make_key(k, N):
    return None if k is None else torch.tensor(k[:N], dtype=torch.bool)


def cuda_or_none(t):
    return None if t is None else t.cuda()


def assert_active_close(out, ref_out, ref_mask, dtype, what):
    """``out`` (CUDA, dtype) equals ``ref_out`` (CPU float64) on active output pixels."""
    rtol, atol = TOL[dtype]
    active = ref_mask.expand_as(ref_out)
    got = out.detach().cpu().double()[active]
    exp = ref_out.double()[active]
    if exp.numel() == 0:
        return
    scale = max(float(exp.abs().max()), 1e-3)
    err = (got - exp).abs()
    bad = ~(err <= rtol * exp.abs() + atol * scale)  # also catches NaN
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())}/{exp.numel()} active values differ; "
                                 f"max err {float(err.max())}, scale {scale}")


def runs_wgmma_kernels() -> bool:
    """Whether this GPU runs the extension's sm_90a code (wgmma; the weight-stationary 3x3 kernel): an H100 / H200."""
    return torch.cuda.get_device_capability(0) == (9, 0)


def check_layout(out, mask_out, N, C, Ho, Wo, dtype):
    assert out.shape == (N, C, Ho, Wo) and out.dtype == dtype and out.is_cuda
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert mask_out.shape == (N, 1, Ho, Wo) and mask_out.dtype == torch.bool


# ----------------------------------------------------------------------------- conv2d
# (C_in, C_out, kernel (h, w), stride, padding, dilation, groups, (H, W)); comment = kernel path
CONV_CASES = [
    (17, 32, (1, 1), 1, 0, 1, 1, (13, 17)),      # 1x1 GEMM
    (64, 96, (1, 1), 2, 0, 1, 1, (31, 45)),      # 1x1 stride 2 (downsample), 2 chunks of C_in
    (32, 64, (1, 1), 1, 0, 1, 2, (13, 17)),      # grouped 1x1
    (3, 17, (1, 1), 1, 1, 1, 1, (13, 17)),       # 1x1 with padding: border outputs read padding
    (96, 3, (1, 1), 1, 0, 1, 1, (31, 45)),
    (3, 32, (3, 3), 1, 1, 1, 1, (31, 45)),       # 3x3 tile kernel (fp16 / bf16: small C_in)
    (17, 17, (3, 3), 2, 1, 1, 1, (13, 17)),      # 3x3 stride 2
    (32, 64, (3, 3), 1, 2, 2, 1, (31, 45)),      # 3x3 dilation 2
    (64, 64, (3, 3), 2, 1, 1, 2, (13, 17)),      # 3x3 groups 2
    (96, 96, (3, 3), 1, 1, 1, 1, (13, 17)),      # several C_in chunks
    (32, 17, (3, 3), 2, 0, 1, 1, (31, 45)),      # no padding
    (32, 32, (3, 3), 1, 1, 1, 32, (31, 45)),     # depthwise 3x3
    (96, 96, (3, 3), 2, 1, 1, 96, (31, 45)),     # depthwise 3x3 stride 2
    (17, 17, (3, 3), 1, 2, 2, 17, (13, 17)),     # depthwise 3x3 dilation 2
    (12, 12, (3, 3), 1, 1, 1, 12, (13, 17)),     # depthwise: fp32 vectorised, fp16/bf16 scalar (12 % 8)
    (40, 40, (5, 5), 1, 2, 1, 40, (21, 30)),     # depthwise 5x5 vectorised, partial channel block
    (8, 8, (3, 3), 2, 0, 1, 8, (14, 19)),        # depthwise 3x3 stride 2, no padding
    (32, 32, (3, 3), 1, 2, 2, 32, (31, 45)),     # depthwise 3x3 dilation 2: vectorised
    (16, 16, (5, 5), 1, 4, 2, 16, (21, 30)),     # depthwise 5x5 dilation 2: vectorised
    (17, 17, (5, 5), 1, 2, 1, 17, (13, 17)),     # depthwise 5x5
    (64, 64, (5, 5), 2, 2, 1, 64, (31, 45)),     # depthwise 5x5 stride 2 (> 48 KiB smem: opt-in)
    (32, 32, (7, 7), 1, 3, 1, 32, (31, 45)),     # depthwise 7x7 (ConvNeXt's): vectorised
    (17, 17, (7, 7), 1, 3, 1, 17, (13, 17)),     # depthwise 7x7, 17 channels: the scalar kernel (runtime size)
    (3, 64, (7, 7), 2, 3, 1, 1, (31, 45)),       # stem 7x7 stride 2 (fp16 / bf16: small C_in)
    (17, 32, (5, 5), 1, 2, 1, 1, (13, 17)),      # general 5x5
    (32, 32, (5, 5), 2, 4, 2, 1, (31, 45)),      # general 5x5 stride 2 dilation 2
    (64, 96, (3, 5), (1, 2), (1, 2), (2, 1), 2, (31, 45)),  # non-square kernel, per-axis args
    (16, 48, (3, 3), 1, 1, 1, 16, (13, 17)),     # groups == C_in with multiplier 3 (general)
    (8, 8, (2, 2), 2, 0, 1, 1, (13, 17)),        # even kernel
    (2, 4, (3, 3), 1, 55, 55, 1, (121, 125)),    # huge dilation: opt-in shared memory
    (4, 8, (3, 3), 1, 120, 120, 1, (251, 243)),  # footprint beyond shared memory: direct kernel
    # fp16 / bf16 gathered-taps tensor-core path (fp32: tile kernel)
    (16, 24, (5, 5), 1, 2, 1, 1, (21, 30)),      # 5x5
    (64, 32, (3, 3), 3, 1, 1, 1, (31, 45)),      # stride 3
    (24, 16, (3, 3), 1, 6, 6, 1, (31, 45)),      # dilation 6 (ASPP-like)
    (136, 72, (3, 3), (1, 2), 1, 1, 1, (19, 27)),  # unequal strides, 3 chunks of C_in, 2 Cout blocks
    # fp16 / bf16 output channels not a multiple of 8: the tensor-core paths on filters padded to 8
    (64, 21, (1, 1), 1, 0, 1, 1, (31, 45)),      # a 21-class segmentation classifier (padded to 24)
    (32, 12, (3, 3), 1, 1, 1, 1, (13, 17)),      # a region proposal head's box layer (12 -> 16)
    (16, 3, (1, 1), 2, 0, 1, 1, (21, 30)),       # 3 outputs, stride 2 (3 -> 8)
    # fp16 / bf16 small-C_in tensor-core path (C_in <= 8, dilation 1, stride 1 / 2, 2..64 taps;
    # fp32: tile kernel)
    (3, 32, (3, 3), 2, 1, 1, 1, (31, 45)),       # MobileNetV2 stem
    (3, 16, (3, 3), 2, 1, 1, 1, (21, 30)),       # MobileNetV3 stem
    (3, 64, (7, 7), 2, 3, 1, 1, (135, 240)),     # ResNet stem, many tiles
    (1, 8, (5, 5), 1, 2, 1, 1, (13, 17)),        # one input channel
    (8, 24, (3, 3), 1, 1, 1, 1, (31, 45)),       # 8 input channels: no padding copy
    (4, 16, (8, 8), 1, 3, 1, 1, (21, 30)),       # 64 taps (8 full stages), even kernel
    (3, 16, (3, 5), 2, (1, 2), 1, 1, (21, 30)),  # non-square kernel, unequal padding
    (5, 8, (3, 3), 2, 2, 2, 1, (21, 30)),        # dilated: not that path (tile kernel)
    (3, 16, (9, 9), 1, 4, 1, 1, (21, 30)),       # 81 taps: not that path (tile kernel)
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _case_id(c):
    cin, cout, k, s, p, d, g, (H, W) = c
    return f"{cin}-{cout}-k{k[0]}x{k[1]}-s{s}-p{p}-d{d}-g{g}-{H}x{W}".replace(" ", "")


def run_conv2d(case, dtype, fracs, key, seed=0, bias=True, delta_format=torch.channels_last):
    cin, cout, k, s, p, d, g, (H, W) = case
    s, p, d = _pair(s), _pair(p), _pair(d)
    gen = torch.Generator().manual_seed(seed)
    N = len(fracs)
    mask = make_mask(fracs, H, W, gen)
    delta = make_delta(N, cin, H, W, mask, dtype, gen).contiguous(memory_format=delta_format)
    fan_in = cin // g * k[0] * k[1]
    weight = torch.randn(cout, cin // g, *k, generator=gen) / math.sqrt(fan_in)
    b = torch.randn(cout, generator=gen) if bias else None
    kt = make_key(key, N)
    out, mo = ops().conv2d(delta, mask.cuda(), weight.cuda(), cuda_or_none(b), list(s), list(p), list(d), g,
                           cuda_or_none(kt))
    # the float64 reference on the GPU: with it on the CPU (two threads per test process) the
    # 256 -> 136 channel cases at 135x240 took 30-35 s each, on the GPU 12-15 s (H200, 2026-11-22)
    r_out, r_mask = ref.conv2d(delta.double(), mask.cuda(), weight.to(dtype).double().cuda(),
                               None if b is None else b.to(dtype).double().cuda(), s, p, d, g, cuda_or_none(kt))
    check_layout(out, mo, N, cout, r_out.shape[2], r_out.shape[3], dtype)
    assert torch.equal(mo, r_mask), f"conv2d mask differs (fracs {fracs}, key {key})"
    assert_active_close(out, r_out.cpu(), r_mask.cpu(), dtype, f"conv2d (fracs {fracs}, key {key})")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cin,cout,k", [(64, 21, 1), (256, 819, 3), (32, 3, 3)])
def test_conv2d_odd_output_channels_pad_for_the_tensor_cores(cin, cout, k, dtype, monkeypatch):
    """Output channels not a multiple of 8 run on the tensor cores with zero filters added
    (DELTACONV_TC_PAD, default on): the output has cout channels, channels-last, equal to the
    CUDA-core kernels' (DELTACONV_TC_PAD=0) within the dtype's rounding at the active pixels, and
    the same mask; in a CUDA graph too."""
    gen = torch.Generator().manual_seed(3)
    N, H, W = 2, 27, 41
    mask = make_mask((0.3, 1.0), H, W, gen)
    delta = make_delta(N, cin, H, W, mask, dtype, gen).contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(cout, cin, k, k, generator=gen) / math.sqrt(cin * k * k)).to(dtype).cuda()
    bias = torch.randn(cout, generator=gen).to(dtype).cuda()
    outs = {}
    for pad in ("1", "0"):
        monkeypatch.setenv("DELTACONV_TC_PAD", pad)
        outs[pad] = ops().conv2d(delta, mask.cuda(), weight, bias, [1, 1], [k // 2] * 2, [1, 1], 1, None)
    (y, m), (y0, m0) = outs["1"], outs["0"]
    check_layout(y, m, N, cout, H, W, dtype)
    assert torch.equal(m, m0)
    assert_active_close(y, y0.double().cpu(), m0.cpu(), dtype, f"padded {cin}->{cout} k{k}")
    monkeypatch.setenv("DELTACONV_TC_PAD", "1")
    static, static_mask = delta.clone(), mask.cuda()
    graph = torch.cuda.CUDAGraph()
    ops().conv2d(static, static_mask, weight, bias, [1, 1], [k // 2] * 2, [1, 1], 1, None)  # warm-up
    with torch.cuda.graph(graph):
        yg, _ = ops().conv2d(static, static_mask, weight, bias, [1, 1], [k // 2] * 2, [1, 1], 1, None)
    graph.replay()
    active = m.expand_as(y)  # inactive output pixels carry no values
    assert torch.equal(yg[active], y[active])


def run_conv2d_every_fraction_and_key(case, dtype, seed: int) -> None:
    """run_conv2d at every FRACS x KEYS pair (fraction i: seed + i; a bias on even fractions and with key streams)."""
    for i, fracs in enumerate(FRACS):
        for key in KEYS:
            run_conv2d(case, dtype, fracs, key, seed=seed + i, bias=(i % 2 == 0) or key is not None)


def repeatable_conv2d(case, dtype, fracs, seed: int):
    """The conv2d of a ``case`` (groups 1, no bias) on a delta with changed fractions ``fracs``,
    as a function of no arguments, after asserting that three calls give bit-identical outputs."""
    cin, cout, k, s, p, d, g, (H, W) = case
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(fracs, H, W, gen).cuda()
    delta = make_delta(len(fracs), cin, H, W, mask.cpu(), dtype, gen)
    weight = (torch.randn(cout, cin, *k, generator=gen) / math.sqrt(cin * 9)).cuda()

    def call():
        return ops().conv2d(delta, mask, weight, None, [s, s], [p, p], [d, d], 1, None)

    first, mo = call()
    active = mo.expand_as(first)
    for _ in range(2):
        out, mo2 = call()
        assert torch.equal(mo2, mo) and torch.equal(out[active], first[active]), "outputs differ between calls"
    return call


def kernel_names_or_skip(call) -> list[str]:
    """cuda_kernel_names(call); skips the test when the profiler records none."""
    names = cuda_kernel_names(call)
    if not names:
        pytest.skip("the CUDA profiler recorded no kernel (CUPTI unavailable, e.g. under compute-sanitizer)")
    return names


def set_tile_split(monkeypatch, split: str) -> None:
    """DELTACONV_TC_SPLIT and DELTACONV_TC_SPLIT_MIN from "bound/least" ("huge": never enough pixel rows)."""
    bound, _, least = split.partition("/")
    monkeypatch.setenv("DELTACONV_TC_SPLIT", bound)
    monkeypatch.setenv("DELTACONV_TC_SPLIT_MIN", str(1 << 30) if least == "huge" else least or "0")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CONV_CASES, ids=_case_id)
def test_conv2d(case, dtype):
    run_conv2d_every_fraction_and_key(case, dtype, seed=0)


# float32 convolutions on the tensor cores in TF32 (torch.backends.cudnn.allow_tf32): one group,
# channels multiples of 8 (or C_out padded to 8), at most 32 taps; K chunks of 32 channels. 3x3
# (stride 1 / 2, dilation 1 / 2 / 4): the halo kernel (wgmma on Hopper at stride 1, else mma.sync);
# others: gathered rows (wgmma on Hopper); at most 4 input channels: the small-C_in kernel.
TF32_CASES = [
    (64, 96, (1, 1), 1, 0, 1, 1, (31, 45)),      # 1x1: 2 chunks of C_in, 2 blocks of C_out
    (40, 32, (1, 1), 2, 0, 1, 1, (31, 45)),      # 1x1 stride 2, a last chunk of one k-step
    (16, 24, (1, 1), 1, 1, 1, 1, (13, 17)),      # 1x1 with padding: border outputs read padding
    (256, 64, (1, 1), 1, 0, 1, 1, (19, 27)),     # 8 chunks of C_in: the K split in clusters (Hopper)
    (32, 64, (3, 3), 1, 1, 1, 1, (31, 45)),      # 3x3 halo kernel
    (96, 136, (3, 3), 2, 1, 1, 1, (31, 45)),     # 3x3 stride 2, 3 chunks, 2 blocks of C_out
    (40, 64, (3, 3), 1, 2, 2, 1, (31, 45)),      # 3x3 dilation 2, a last chunk of one k-step
    (24, 16, (3, 3), 1, 4, 4, 1, (31, 45)),      # 3x3 dilation 4
    (256, 64, (3, 3), 1, 1, 1, 1, (19, 27)),     # 3x3, 8 chunks: the fine launch's K split (Hopper)
    (64, 32, (3, 3), 3, 1, 1, 1, (31, 45)),      # 3x3 stride 3: gathered taps
    (16, 24, (5, 5), 1, 2, 1, 1, (21, 30)),      # 5x5: gathered taps
    (64, 21, (1, 1), 1, 0, 1, 1, (31, 45)),      # C_out 21: filters padded to 24
    (32, 12, (3, 3), 1, 1, 1, 1, (13, 17)),      # C_out 12: padded to 16
    # few input channels: the small-C_in kernel, one 16-byte row of 4 channels per pixel
    (3, 32, (3, 3), 2, 1, 1, 1, (31, 45)),       # MobileNetV2 stem
    (3, 64, (7, 7), 2, 3, 1, 1, (31, 45)),       # ResNet stem
    (4, 16, (8, 8), 1, 3, 1, 1, (21, 30)),       # 4 channels (no padding copy), 64 taps
    (1, 8, (5, 5), 1, 2, 1, 1, (13, 17)),        # one input channel
]
TF32_KERNEL = re.compile(r"(conv_gather_tc_kernel|conv3x3_tc_kernel|conv_small_cin_tc_kernel|conv3x3_stationary_kernel"
                        r"|conv3x3_ring_kernel|conv1x1_ring_kernel)<float")


def tf32_truncate(t: torch.Tensor) -> torch.Tensor:
    """``t`` (float32) as the tensor cores read a float32 weight in TF32: its low 13 mantissa bits
    dropped (deltaconv's convolutions round their weights to nearest first, with their fold)."""
    return (t.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def run_tf32_conv2d(case, fracs, key, seed: int, bias: bool) -> None:
    """conv2d of a float32 ``case`` (groups 1) against a float64 conv of the TF32-rounded delta and
    the truncated weight (as the kernels read them): equal to float32 accumulation (exact float32
    products, or a weight rounded otherwise, would differ from it by the TF32 rounding); masks
    exactly."""
    cin, cout, k, s, p, d, _, (H, W) = case
    s, p, d = _pair(s), _pair(p), _pair(d)
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(fracs, H, W, gen)
    delta = make_delta(len(fracs), cin, H, W, mask, torch.float32, gen)
    weight = torch.randn(cout, cin, *k, generator=gen) / math.sqrt(cin * k[0] * k[1])
    b = torch.randn(cout, generator=gen) if bias else None
    kt = make_key(key, len(fracs))
    out, mo = ops().conv2d(delta, mask.cuda(), weight.cuda(), cuda_or_none(b), list(s), list(p), list(d), 1,
                           cuda_or_none(kt))
    r_out, r_mask = ref.conv2d(ref.round_to_tf32(delta).double(), mask.cuda(),
                               tf32_truncate(weight).double().cuda(),
                               None if b is None else b.double().cuda(), s, p, d, 1, cuda_or_none(kt))
    check_layout(out, mo, len(fracs), cout, r_out.shape[2], r_out.shape[3], torch.float32)
    assert torch.equal(mo, r_mask), f"conv2d mask differs (fracs {fracs}, key {key})"
    assert_active_close(out, r_out.cpu(), r_mask.cpu(), torch.float32, f"TF32 conv2d (fracs {fracs}, key {key})")
    # input_tf32: a delta that an activation sent rounded is read as it is (the same outputs), and an
    # unrounded one then truncated, as the tensor cores convert it: the kernel skipped its rounding
    for given, read in ((ref.round_to_tf32(delta), ref.round_to_tf32(delta)), (delta, tf32_truncate(delta))):
        out2, mo2 = ops().conv2d(given, mask.cuda(), weight.cuda(), cuda_or_none(b), list(s), list(p), list(d), 1,
                                 cuda_or_none(kt), input_tf32=True)
        r2, _ = ref.conv2d(read.double(), mask.cuda(), tf32_truncate(weight).double().cuda(),
                           None if b is None else b.double().cuda(), s, p, d, 1, cuda_or_none(kt))
        assert torch.equal(mo2, r_mask)
        assert_active_close(out2, r2.cpu(), r_mask.cpu(), torch.float32, f"TF32 conv2d, input_tf32 (fracs {fracs})")


@pytest.mark.gpu
@pytest.mark.parametrize("wgmma", ["1", "0"])
@pytest.mark.parametrize("case", TF32_CASES, ids=_case_id)
def test_conv2d_float32_runs_tf32_on_the_tensor_cores(case, wgmma, monkeypatch):
    """With ``torch.backends.cudnn.allow_tf32`` a float32 conv runs on the tensor cores in TF32
    (run_tf32_conv2d at every changed fraction and key pattern; Hopper's wgmma and, with
    DELTACONV_WGMMA=0, mma.sync) and the profiler sees a tensor-core kernel in float; with it off
    (the tests' default) the exact CUDA-core kernels run."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setenv("DELTACONV_WGMMA", wgmma)
    for i, fracs in enumerate(FRACS):
        for key in KEYS:
            run_tf32_conv2d(case, fracs, key, seed=i, bias=i % 2 == 0 or key is not None)
    call = repeatable_conv2d(case, torch.float32, (0.3, 1.0), seed=7)
    names = kernel_names_or_skip(call)
    assert any(TF32_KERNEL.search(n) for n in names), names
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert not any("tc_kernel" in n for n in kernel_names_or_skip(call)), "TF32 off: the CUDA-core kernels"


@pytest.mark.gpu
@pytest.mark.parametrize("wgmma", ["1", "0"])
@pytest.mark.parametrize("launch", ["coarse", "fine", "split"])
@pytest.mark.parametrize("case", [c for c in TF32_CASES if c[2] == (3, 3) and c[3] in (1, 2) and c[0] >= 8],
                         ids=_case_id)
def test_conv2d_float32_tf32_3x3_launches(case, launch, wgmma, monkeypatch):
    """The TF32 3x3 conv on each launch of the halo kernel (coarse, fine: forced through
    DELTACONV_TC_FINE_MAX) and with the sparse tiles on the gathered pixel rows (DELTACONV_TC_SPLIT),
    on wgmma and mma.sync (not on the kernels whose weights come by TMA: their own test)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setenv("DELTACONV_WGMMA", wgmma)
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")
    monkeypatch.setenv("DELTACONV_TC_RING", "0")
    if launch == "split":
        set_tile_split(monkeypatch, "40/0")
    else:
        monkeypatch.setenv("DELTACONV_TC_FINE_MAX", "-1" if launch == "coarse" else str(1 << 30))
    for i, fracs in enumerate(FRACS):
        run_tf32_conv2d(case, fracs, (True, False), seed=10 + i, bias=True)
        run_tf32_conv2d(case, fracs, None, seed=20 + i, bias=False)


# every TF32 path with C_in and C_out multiples of 8 (tails of a 32-channel K chunk too), for the
# rounding test below: (C_in, kernel, stride, dilation, size)
TF32_ROUNDING_CASES = [(c, k, s, d, hw) for c in (8, 16, 24, 40, 64, 96, 136) for k, s, d, hw in
                       ((1, 1, 1, (21, 30)), (1, 2, 1, (21, 30)), (3, 1, 1, (21, 30)), (3, 2, 1, (21, 30)),
                        (3, 1, 2, (21, 30)), (5, 1, 1, (13, 17)))]
TF32_ROUNDING_CASES += [(3, 3, 2, 1, (31, 45)), (3, 7, 2, 1, (31, 45))]  # the small-C_in kernel (stems)


@pytest.mark.gpu
@pytest.mark.parametrize("case", TF32_ROUNDING_CASES, ids=lambda c: f"{c[0]}-k{c[1]}-s{c[2]}-d{c[3]}")
def test_conv2d_float32_rounds_every_delta_to_nearest_tf32(case, monkeypatch):
    """Each TF32 path rounds every staged delta to nearest, in every channel of a K chunk: with the
    identity as the filter's centre tap and deltas 1 + 0.75 * 2^-10 (TF32 rounds them up to
    1 + 2^-10; the tensor cores' own conversion would truncate them to 1) every active output is
    exactly 1 + 2^-10. With input_tf32 the kernels read them as they are, truncated: exactly 1. A
    truncating path sums a bias frame after frame in the delta states."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    cin, k, s, d, (H, W) = case
    cout = max(8, -(-cin // 8) * 8)
    weight = torch.zeros(cout, cin, k, k, device="cuda")
    weight[torch.arange(cin), torch.arange(cin), k // 2, k // 2] = 1.0
    weight = weight.contiguous(memory_format=torch.channels_last)
    gen = torch.Generator().manual_seed(5)
    mask = (torch.rand(1, 1, H, W, generator=gen) < 0.5).cuda()
    delta = torch.full((1, cin, H, W), 1.0 + 0.75 * 2.0 ** -10, device="cuda").contiguous(
        memory_format=torch.channels_last)
    pad = k // 2 * d
    # the default kernels, then the warp-specialised 3x3 (coarse launch forced) and 1x1 ones
    paths = {"default": {}, "ring": {"DELTACONV_TC_STATIONARY": "0", "DELTACONV_TC_FINE_MAX": "-1",
                                     "DELTACONV_TC_SPLIT": "0"}, "ring1": {"DELTACONV_TC_RING1_MIN": "0"}}
    for path, env in paths.items():
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for input_tf32, want in ((False, 1.0 + 2.0 ** -10), (True, 1.0)):
            out, mo = ops().conv2d(delta, mask, weight, None, [s, s], [pad, pad], [d, d], 1, None,
                                   input_tf32=input_tf32)
            # the outputs whose centre tap is an active input pixel carry exactly one delta per channel
            centre = mask[:, :, ::s, ::s][:, :, :out.shape[2], :out.shape[3]].expand(-1, cin, -1, -1)
            got = out[:, :cin][centre]
            assert got.numel() > 0 and bool((got == want).all()), \
                (f"{path}, input_tf32={input_tf32}: {int((got != want).sum())} of {got.numel()} outputs differ "
                 f"from {want!r}; values {got.unique()[:6].tolist()}")
        for name in env:
            monkeypatch.delenv(name)


# float32 (TF32) cases of the Hopper kernels whose weights come by TMA, in K chunks of 32 channels:
# the weight-stationary 3x3 kernel (1 or 2 chunks: every tile; 4 chunks: beside the coarse launch),
# the warp-specialised 3x3 kernel (the coarse launch, forced) and the warp-specialised 1x1 GEMM
TF32_TMA_CASES = [
    ("stationary", (32, 64, (3, 3), 1, 1, 1, 1, (31, 45))),     # one chunk, 4 warpgroups
    ("stationary", (64, 136, (3, 3), 1, 1, 1, 1, (21, 30))),    # two chunks, 3 C_out blocks, the last partial
    ("stationary", (64, 64, (3, 3), 1, 1, 1, 1, (135, 240))),   # many tiles: several per warpgroup
    ("stationary", (128, 40, (3, 3), 1, 0, 1, 1, (13, 17))),    # four chunks, 32 channels per block, no padding
    ("stationary", (128, 136, (3, 3), 1, 1, 1, 1, (135, 240))),  # four chunks beside the coarse launch
    ("ring", (64, 128, (3, 3), 1, 1, 1, 1, (31, 45))),          # two chunks
    ("ring", (96, 136, (3, 3), 1, 1, 1, 1, (31, 45))),          # three chunks, 2 C_out blocks, the last partial
    ("ring", (64, 136, (3, 3), 2, 1, 1, 1, (31, 45))),          # stride 2
    ("ring", (64, 128, (3, 3), 1, 2, 2, 1, (31, 45))),          # dilation 2
    ("ring1", (64, 128, (1, 1), 1, 0, 1, 1, (31, 45))),         # two chunks
    ("ring1", (96, 136, (1, 1), 1, 0, 1, 1, (21, 30))),         # three chunks, 2 C_out blocks, the last partial
    ("ring1", (256, 256, (1, 1), 1, 0, 1, 1, (68, 120))),       # many items: several groups per block
    ("ring1", (512, 256, (1, 1), 2, 0, 1, 1, (45, 60))),        # stride 2, 16 chunks
]
TF32_TMA_SWITCH = {"stationary": "DELTACONV_TC_STATIONARY", "ring": "DELTACONV_TC_RING", "ring1": "DELTACONV_TC_RING1"}
TF32_TMA_KERNEL = {"stationary": "conv3x3_stationary_kernel<float", "ring": "conv3x3_ring_kernel<float",
                   "ring1": "conv1x1_ring_kernel<float"}


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,case", TF32_TMA_CASES, ids=[f"{k}-{_case_id(c)}" for k, c in TF32_TMA_CASES])
def test_conv2d_float32_tf32_on_the_tma_weight_kernels(kernel, case, monkeypatch):
    """In TF32 the weight-stationary 3x3 kernel, the warp-specialised 3x3 kernel (its coarse launch
    forced) and the warp-specialised 1x1 GEMM equal the float64 conv of the rounded delta and the
    truncated weight at every changed fraction and key pattern, run on Hopper (and not with their
    switch off), and give bit-identical outputs from call to call."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    if kernel == "ring":
        monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")
        monkeypatch.setenv("DELTACONV_TC_FINE_MAX", "-1")
        monkeypatch.setenv("DELTACONV_TC_SPLIT", "0")
    if kernel == "ring1":
        monkeypatch.setenv("DELTACONV_TC_RING1_MIN", "0")  # small frames too
    for i, fracs in enumerate(FRACS):
        for key in KEYS:
            run_tf32_conv2d(case, fracs, key, seed=80 + i, bias=i % 2 == 0 or key is not None)
    call = repeatable_conv2d(case, torch.float32, FRACS[2], seed=9)
    for switch in ("1", "0"):
        monkeypatch.setenv(TF32_TMA_SWITCH[kernel], switch)
        names = kernel_names_or_skip(call)
        ran = any(TF32_TMA_KERNEL[kernel] in n for n in names)
        assert ran == (runs_wgmma_kernels() and switch == "1"), f"{TF32_TMA_SWITCH[kernel]}={switch}: kernels {names}"


# 3x3 tensor-core cases (fp16 / bf16, Cin and Cout multiples of 8): the tile kernel, and the
# pixel-row gathered-taps kernel on the pixels of the sparse tiles (at most DELTACONV_TC_SPLIT active
# pixels) when they number at least DELTACONV_TC_SPLIT_MIN (decided on the device)
TC3_CASES = [
    (64, 64, (3, 3), 1, 1, 1, 1, (31, 45)),
    (96, 136, (3, 3), 1, 1, 1, 1, (13, 17)),     # 2 chunks of C_in, 2 C_out blocks, partial
    (32, 64, (3, 3), 2, 1, 1, 1, (31, 45)),      # stride 2
    (16, 24, (3, 3), 2, 0, 1, 1, (21, 30)),      # stride 2, no padding
    (64, 64, (3, 3), 1, 1, 1, 1, (135, 240)),    # many tiles
    (64, 64, (3, 3), 1, 2, 2, 1, (31, 45)),      # dilation 2 (segmentation backbones)
    (128, 136, (3, 3), 1, 2, 2, 1, (31, 45)),    # dilation 2, C_out > 64 (128-channel blocks), partial
    (96, 136, (3, 3), 1, 4, 4, 1, (21, 30)),     # dilation 4, 2 chunks of C_in, 2 C_out blocks
    (32, 64, (3, 3), 1, 1, 2, 1, (31, 45)),      # dilation 2, padding 1 (not "same")
    (64, 64, (3, 3), 1, 4, 4, 1, (135, 240)),    # dilation 4, many tiles
]


@pytest.mark.gpu
@pytest.mark.parametrize("split", ["0", "64/0", "40/0", "40/huge", "default"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", TC3_CASES, ids=_case_id)
def test_conv2d_3x3_tile_and_pixel_paths(case, dtype, split, monkeypatch):
    """The 3x3 tensor-core conv equals the reference at every changed fraction, with and without
    key streams: every tile on the tile kernel (split 0), every pixel on the pixel-row kernel
    (64/0), both in one call (40/0), the sparse tiles listed apart but run by the tile kernel
    (40/huge: too few pixel rows), and the default."""
    if split != "default":
        set_tile_split(monkeypatch, split)
    run_conv2d_every_fraction_and_key(case, dtype, seed=10)


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["coarse", "fine"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", TC3_CASES, ids=_case_id)
def test_conv2d_3x3_coarse_and_fine_launches(case, dtype, launch, monkeypatch):
    """The two launches of the 3x3 tile kernel (two tiles per block / one tile per block), each
    forced for every tile count, equal the reference."""
    monkeypatch.setenv("DELTACONV_TC_SPLIT", "0")
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")  # C_in = 64: not the weight-stationary kernel
    monkeypatch.setenv("DELTACONV_TC_FINE_MAX", "-1" if launch == "coarse" else str(1 << 30))
    for i, fracs in enumerate(FRACS):
        run_conv2d(case, dtype, fracs, KEYS[i % len(KEYS)], seed=20 + i, bias=i % 2 == 0)


# 3x3 cases of the weight-stationary kernel (stride 1, dilation 1; Hopper wgmma;
# conv3x3_stationary.cuh), unless DELTACONV_TC_STATIONARY=0: every tile for C_in = 64 or 128, and for
# C_in = 256 the tiles of conv3x3_tc_kernel's fine launch (few tiles, the coarse launch's tail)
STATIONARY_CASES = [
    (64, 64, (3, 3), 1, 1, 1, 1, (31, 45)),
    (64, 8, (3, 3), 1, 1, 1, 1, (13, 17)),       # one n8 tile of output channels
    (64, 136, (3, 3), 1, 1, 1, 1, (21, 30)),     # 3 C_out blocks, the last one partial
    (64, 64, (3, 3), 1, 0, 1, 1, (7, 9)),        # no padding: one partial output tile
    (64, 24, (3, 3), 1, 2, 1, 1, (19, 27)),      # padding 2: the output is larger than the input
    (64, 64, (3, 3), 1, 1, 1, 1, (135, 240)),    # many tiles: several per warpgroup
    (64, 200, (3, 3), 1, 1, 1, 1, (68, 120)),    # 4 C_out blocks, many tiles
    (128, 128, (3, 3), 1, 1, 1, 1, (31, 45)),    # two input chunks, 2 C_out blocks
    (128, 40, (3, 3), 1, 0, 1, 1, (13, 17)),     # two input chunks, one partial C_out block, no padding
    (128, 72, (3, 3), 1, 1, 1, 1, (135, 240)),   # two input chunks, many tiles, a partial 2nd C_out block
    (256, 256, (3, 3), 1, 1, 1, 1, (31, 45)),    # four input chunks, 32 channels per block: 8 C_out blocks
    (256, 40, (3, 3), 1, 0, 1, 1, (13, 17)),     # four input chunks, a partial 2nd C_out block, no padding
    (256, 136, (3, 3), 1, 1, 1, 1, (135, 240)),  # many tiles: beside the coarse launch of conv3x3_tc_kernel
]


@pytest.mark.gpu
@pytest.mark.parametrize("split", ["0", "40/0", "40/huge"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", STATIONARY_CASES, ids=_case_id)
def test_conv2d_3x3_weight_stationary(case, dtype, split, monkeypatch):
    """The weight-stationary 3x3 kernel equals the reference at every changed fraction, with and
    without key streams, alone (split 0), beside the pixel rows of the sparse tiles (40/0) and with
    the sparse tiles listed apart but run by it (40/huge); it is the kernel that runs on Hopper
    (and not with DELTACONV_TC_STATIONARY=0), and its outputs are bit-identical from call to call."""
    set_tile_split(monkeypatch, split)
    run_conv2d_every_fraction_and_key(case, dtype, seed=40)
    call = repeatable_conv2d(case, dtype, FRACS[1], seed=6)
    hopper = runs_wgmma_kernels()
    for switch in ("1", "0"):
        monkeypatch.setenv("DELTACONV_TC_STATIONARY", switch)
        names = kernel_names_or_skip(call)
        ran = any("conv3x3_stationary_kernel" in n for n in names)
        assert ran == (hopper and switch == "1"), f"DELTACONV_TC_STATIONARY={switch}: kernels {names}"


# 3x3 cases of the warp-specialised kernel (Hopper wgmma, stride 1 or 2, C_in % 64 == 0, C_out > 64;
# conv3x3_ring.cuh), which takes the coarse launch's tiles unless DELTACONV_TC_RING=0
RING_CASES = [
    (64, 128, (3, 3), 1, 1, 1, 1, (31, 45)),     # one input chunk: each tile's halo once
    (128, 136, (3, 3), 1, 1, 1, 1, (31, 45)),    # two input chunks, 2 C_out blocks, the last one partial
    (192, 72, (3, 3), 1, 0, 1, 1, (21, 30)),     # three input chunks, one partial C_out block, no padding
    (256, 256, (3, 3), 1, 1, 1, 1, (68, 120)),   # many tiles: several groups per block
    (128, 136, (3, 3), 1, 2, 2, 1, (31, 45)),    # dilation 2 (12 x 12 halos)
    (256, 128, (3, 3), 1, 1, 2, 1, (45, 60)),    # dilation 2, padding 1 (not "same")
    (128, 72, (3, 3), 1, 4, 4, 1, (31, 45)),     # dilation 4: 16 x 16 halos, two warpgroups per block
    (128, 136, (3, 3), 2, 1, 1, 1, (31, 45)),    # stride 2: 17 x 17 halos, even and odd columns apart
    (256, 128, (3, 3), 2, 0, 1, 1, (45, 60)),    # stride 2, no padding, four input chunks
]


@pytest.mark.gpu
@pytest.mark.parametrize("ring", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", RING_CASES, ids=_case_id)
def test_conv2d_3x3_warp_specialised_coarse_launch(case, dtype, ring, monkeypatch):
    """The coarse 3x3 launch, forced for every tile count, on the warp-specialised kernel (weights
    streamed by TMA through a ring that its warpgroups share, a tile per warpgroup) and with
    DELTACONV_TC_RING=0 on conv3x3_tc_kernel, equals the reference at every changed fraction, with
    and without key streams; the warp-specialised kernel runs exactly on Hopper with the switch on,
    and its outputs are bit-identical from call to call."""
    monkeypatch.setenv("DELTACONV_TC_RING", ring)
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")  # C_in = 64 / 128: not the weight-stationary kernel
    monkeypatch.setenv("DELTACONV_TC_FINE_MAX", "-1")
    monkeypatch.setenv("DELTACONV_TC_SPLIT", "0")
    run_conv2d_every_fraction_and_key(case, dtype, seed=60)
    call = repeatable_conv2d(case, dtype, FRACS[-1], seed=7)
    names = kernel_names_or_skip(call)
    ran = any("conv3x3_ring_kernel" in n for n in names)
    assert ran == (runs_wgmma_kernels() and ring == "1"), f"DELTACONV_TC_RING={ring}: kernels {names}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", STATIONARY_CASES[:3] + STATIONARY_CASES[7:8] + STATIONARY_CASES[10:11]
                         + RING_CASES[3:4], ids=_case_id)
def test_conv2d_3x3_unaligned_weight_view(case):
    """A channels_last weight view that is not 16-byte aligned (the kernels copy weights in 16-byte
    pieces, the weight-stationary and warp-specialised ones by a TMA tensor map that needs the
    alignment) gives the same outputs as an aligned copy of it, bit for bit."""
    cin, cout, k, s, p, d, g, (H, W) = case
    gen = torch.Generator().manual_seed(7)
    mask = make_mask(FRACS[1], H, W, gen).cuda()
    delta = make_delta(mask.shape[0], cin, H, W, mask.cpu(), torch.float16, gen)
    weight = (torch.randn(cout, cin, *k, generator=gen) / math.sqrt(cin * 9)).half().cuda()
    weight = weight.contiguous(memory_format=torch.channels_last)
    # the same values 2 bytes past a 16-byte boundary, still channels_last
    spare = torch.empty(weight.numel() + 8, dtype=weight.dtype, device="cuda")
    shifted = spare[1:1 + weight.numel()].view(cout, *k, cin).permute(0, 3, 1, 2)
    shifted.copy_(weight)
    assert shifted.is_contiguous(memory_format=torch.channels_last) and shifted.data_ptr() % 16 != 0
    y, mo = ops().conv2d(delta, mask, weight, None, [s, s], [p, p], [d, d], 1, None)
    y2, mo2 = ops().conv2d(delta, mask, shifted, None, [s, s], [p, p], [d, d], 1, None)
    active = mo.expand_as(y)
    assert mo.any() and torch.equal(mo2, mo) and torch.equal(y2[active], y[active])


# 3x3 cases for the fine launch's K split (whole and partial 64-channel chunks of C_in: 2, 3, 4, 5)
KSPLIT_CASES = [
    (96, 136, (3, 3), 1, 1, 1, 1, (13, 17)),     # 2 chunks, the last one partial; 2 C_out blocks
    (192, 64, (3, 3), 1, 1, 1, 1, (31, 45)),     # 3 chunks: halves of 1 and 2
    (256, 256, (3, 3), 1, 1, 1, 1, (21, 30)),    # 4 chunks, 2 C_out blocks of 128
    (256, 128, (3, 3), 2, 1, 1, 1, (21, 30)),    # stride 2 (mma.sync)
    (264, 64, (3, 3), 1, 2, 2, 1, (19, 27)),     # dilation 2, 5 chunks, the last one 8 channels
    (256, 256, (3, 3), 1, 1, 1, 1, (135, 240)),  # many tiles: the split falls to 2 and 1 as they grow
]


@pytest.mark.gpu
@pytest.mark.parametrize("ksplit", ["1", "2", "4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", KSPLIT_CASES, ids=_case_id)
def test_conv2d_3x3_fine_launch_k_split(case, dtype, ksplit, monkeypatch):
    """The fine launch in clusters of 1, 2 or 4 CTAs (DELTACONV_TC_KSPLIT), whose CTAs split a
    tile's K 4, 2 or 1 ways by the tile count, equals the reference at every changed fraction, with
    and without key streams, and gives bit-identical outputs from call to call (the first CTA of a
    tile adds the partial sums in rank order, whichever CTA finishes first)."""
    monkeypatch.setenv("DELTACONV_TC_SPLIT", "0")
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")  # C_in = 256: the fine launch, not the weight-stationary kernel
    monkeypatch.setenv("DELTACONV_TC_FINE_MAX", str(1 << 30))
    monkeypatch.setenv("DELTACONV_TC_KSPLIT", ksplit)
    for i, fracs in enumerate(FRACS):
        run_conv2d(case, dtype, fracs, KEYS[i % len(KEYS)], seed=30 + i, bias=i % 2 == 0)
    _check_k_split_calls(case, dtype, ksplit, seed=3, items_of=lambda c: c[0])  # the listed tiles


def _check_k_split_calls(case, dtype, ksplit: str, seed: int, items_of, min_chunks: int = 1) -> None:
    """At two changed fractions, three calls of `case` with zeroed counters give bit-identical
    outputs and masks, and each records in counters[3] the K split of _expected_k_split for its
    work items (`items_of(counters)`)."""
    cin, cout, k, s, p, d, g, (H, W) = case
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(cout, cin, *k, generator=gen) / math.sqrt(cin * k[0] * k[1])).cuda()
    for fracs in FRACS[:2]:
        mask = make_mask(fracs, H, W, gen).cuda()
        delta = make_delta(2, cin, H, W, mask.cpu(), dtype, gen)
        runs = []
        for _ in range(3):
            counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
            out, mo = ops().conv2d(delta, mask, weight, None, list(_pair(s)), list(_pair(p)), list(_pair(d)), 1, None,
                                   counters)
            runs.append((out, mo, counters.tolist()))
        active = runs[0][1].expand_as(runs[0][0])
        for out, mo, c in runs:
            assert torch.equal(mo, runs[0][1]) and torch.equal(out[active], runs[0][0][active]), \
                f"K split {ksplit}: outputs differ between calls (fracs {fracs})"
            expected = _expected_k_split(ksplit, cin, cout, items_of(c), min_chunks)
            assert c[3] == expected, f"K split recorded in counters {c}, expected {expected}"


def _expected_k_split(setting: str, cin: int, cout: int, items: int, min_chunks: int = 1) -> int:
    """The K split of the 3x3 fine launch or the gathered-rows GEMM (conv_tc.cuh: k_split_ctas) for
    DELTACONV_TC_KSPLIT = `setting` and `items` work items (tiles; GEMM items of 128 rows): clusters
    of at most `setting` CTAs and at most the 64-channel chunks of C_in (Hopper; none below
    `min_chunks` chunks), 4 CTAs per item up to a quarter of an (item, output-channel block) job per
    multiprocessor, 2 up to one."""
    props = torch.cuda.get_device_properties(0)
    kc = int(setting) if props.major >= 9 and -(-cin // 64) >= min_chunks else 1
    while kc > 1 and kc > -(-cin // 64):
        kc //= 2
    jobs = items * -(-cout // (128 if cout > 64 else 64))
    sms = props.multi_processor_count
    return 4 if kc >= 4 and 4 * jobs <= sms else 2 if kc >= 2 and jobs <= sms else 1


def _tile_centres_mask(H: int, W: int, tiles: int) -> torch.Tensor:
    """[1,1,H,W] bool with the centre pixel of the first `tiles` 8x8 tiles (row-major) active: a 3x3
    stride-1 conv with padding 1 then has exactly `tiles` active output tiles."""
    mask = torch.zeros(1, 1, H, W, dtype=torch.bool)
    for t in range(tiles):
        ty, tx = divmod(t, W // 8)
        mask[0, 0, ty * 8 + 4, tx * 8 + 4] = True
    return mask


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "deterministic", "off"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cin,cout,fine", [(256, 256, "tc"), (128, 128, "tc"), (192, 96, "tc"),
                                           (256, 256, "stationary"), (256, 72, "stationary")], ids=str)
def test_conv2d_3x3_coarse_tail_on_fine_launch(cin, cout, fine, dtype, mode, monkeypatch):
    """Tile counts just past one round of the coarse 3x3 launch (2 or 4 x the multiprocessors for
    two blocks of two tiles per multiprocessor and 2 / 1 channel blocks). By default the tail runs
    on the fine launch, whose CTAs split its K (conv_tc.cuh: coarse_tile_end), and counters[3]
    records that split; or, for C_in = 256 on Hopper (fine = "stationary"), on the weight-stationary
    kernel in its place, which records none. Under torch.use_deterministic_algorithms(True) and with
    DELTACONV_TC_TAIL=0 the coarse launch takes every tile, the fine one records nothing, and the
    outputs are bit-identical from call to call. Every call equals the reference."""
    monkeypatch.setenv("DELTACONV_TC_SPLIT", "0")
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "1" if fine == "stationary" else "0")
    monkeypatch.setenv("DELTACONV_TC_TAIL", "0" if mode == "off" else "1")
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    H, W = 8 * (-(-6 * sms // 32) + 1), 8 * 32  # more tiles than the largest count below
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(cout, cin, 3, 3, generator=gen) / math.sqrt(cin * 9)
    splits = set()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(mode == "deterministic")
    try:
        for tiles in (2 * sms + 1, 2 * sms + sms // 4, 2 * sms + sms // 2, 4 * sms + 1, 4 * sms + sms // 2, 5 * sms):
            mask = _tile_centres_mask(H, W, tiles)
            delta = make_delta(1, cin, H, W, mask, dtype, gen)
            r_out, r_mask = ref.conv2d(delta.double(), mask.cuda(), weight.to(dtype).double().cuda(), None, (1, 1),
                                       (1, 1), (1, 1), 1, None)  # float64 on the GPU: 60 GFLOP per count
            r_out, r_mask = r_out.cpu(), r_mask.cpu()
            runs = []
            for _ in range(3):
                counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
                out, mo = ops().conv2d(delta, mask.cuda(), weight.cuda(), None, [1, 1], [1, 1], [1, 1], 1, None,
                                       counters)
                runs.append((out, counters.tolist()))
                assert torch.equal(mo.cpu(), r_mask), f"{tiles} tiles: mask differs"
                assert_active_close(out, r_out, r_mask, dtype, f"conv2d 3x3 {cin}->{cout}, {tiles} tiles, {mode}")
            active = mo.expand_as(runs[0][0])
            for out, c in runs:
                assert c[0] == tiles, f"{tiles} tiles: counters {c}"
                assert c[3] in ((0, 2, 4) if mode == "default" else (0,)), f"{tiles} tiles, {mode}: counters {c}"
                if mode != "default":
                    assert torch.equal(out[active], runs[0][0][active]), f"{tiles} tiles: outputs differ between calls"
            splits.add(runs[0][1][3])
    finally:
        torch.use_deterministic_algorithms(deterministic)
    if mode == "default" and props.major >= 9 and fine == "tc":  # Hopper clusters: some count had a tail, split
        assert splits & {2, 4}, f"no tail ran on the fine launch (recorded splits {splits})"
    if fine == "stationary" and runs_wgmma_kernels():
        assert splits == {0}, f"the fine launch of conv3x3_tc_kernel ran (recorded splits {splits})"


@pytest.mark.gpu
def test_conv2d_k_split_rejects_other_values(monkeypatch):
    """DELTACONV_TC_KSPLIT accepts 1, 2 and 4; anything else is an error that names the variable and the value."""
    gen = torch.Generator().manual_seed(4)
    mask = make_mask(FRACS[1], 13, 17, gen)
    delta = make_delta(1, 96, 13, 17, mask, torch.float16, gen)
    weight = torch.randn(64, 96, 3, 3, generator=gen).cuda()
    for bad in ("3", "0", "two"):
        monkeypatch.setenv("DELTACONV_TC_KSPLIT", bad)
        with pytest.raises(RuntimeError, match=f"DELTACONV_TC_KSPLIT.*'{bad}'"):
            ops().conv2d(delta, mask.cuda(), weight, None, [1, 1], [1, 1], [1, 1], 1, None)


def _check_rank_tickets(c: list) -> None:
    """The block ranks of one call's 3x3 fine launch (counters[4:14], block_work in
    csrc/conv/conv_common.cuh): none taken, or the first-on-a-multiprocessor ticket equals the
    multiprocessor bits set (at most one per multiprocessor) and at least one block took it."""
    first, others, bits = c[4], c[5], c[6:14]
    set_bits = sum(bin(v & 0xFFFFFFFF).count("1") for v in bits)
    assert first == set_bits, f"first-on-multiprocessor ticket {first} against {set_bits} bits set ({c})"
    assert first <= torch.cuda.get_device_properties(0).multi_processor_count
    assert (first + others == 0) or first >= 1, f"ranks taken without a first block ({c})"


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["coarse", "fine", "default"])
@pytest.mark.parametrize("case", TC3_CASES[:2] + TC3_CASES[4:7], ids=_case_id)
def test_conv2d_block_order_never_changes_results(case, launch, monkeypatch):
    """The 3x3 tensor-core kernel's fine launch takes its tiles in block_work's rank order (spread
    over the multiprocessors; the default) or in block-index order (DELTACONV_SPREAD=0): the
    outputs and masks are bit-identical either way, at every changed fraction, with and without
    key streams, whichever launch runs (the coarse one never ranks); block-index order takes no
    ranks."""
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")  # C_in = 64: not the weight-stationary kernel
    if launch != "default":
        monkeypatch.setenv("DELTACONV_TC_FINE_MAX", "-1" if launch == "coarse" else str(1 << 30))
    cin, cout, k, s, p, d, g, (H, W) = case
    s, p, d = list(_pair(s)), list(_pair(p)), list(_pair(d))
    gen = torch.Generator().manual_seed(5)
    for i, fracs in enumerate(FRACS):
        mask = make_mask(fracs, H, W, gen).cuda()
        delta = make_delta(2, cin, H, W, mask.cpu(), torch.float16, gen)
        weight = (torch.randn(cout, cin, *k, generator=gen) / math.sqrt(cin * k[0] * k[1])).cuda()
        kt = cuda_or_none(make_key(KEYS[i % len(KEYS)], 2))
        runs = []
        for spread in ("1", "0"):
            monkeypatch.setenv("DELTACONV_SPREAD", spread)
            counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
            out, mo = ops().conv2d(delta, mask, weight, None, s, p, d, 1, kt, counters)
            runs.append((out, mo, counters.tolist()))
        (out, mo, c), (out0, mo0, c0) = runs
        assert torch.equal(mo, mo0), f"masks differ between block orders (fracs {fracs})"
        active = mo.expand_as(out)
        assert torch.equal(out[active], out0[active]), f"values differ between block orders (fracs {fracs})"
        assert c0[4:] == [0] * (COUNTERS - 4), f"block-index order took ranks ({c0})"
        assert c[:4] == c0[:4]
        _check_rank_tickets(c)


@pytest.mark.gpu
def test_conv2d_takes_block_ranks_when_few_tiles_have_work(monkeypatch):
    """Three active tiles of a 64-tile map and 256 output channels (two channel blocks): every
    block of the 3x3 kernel's fine launch takes a rank (the tickets count the whole grid: 64 tile slots x 2
    channel blocks), the first-on-a-multiprocessor ticket at most once per multiprocessor; with
    DELTACONV_SPREAD=0 none, and the outputs are the same."""
    monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")  # C_in = 64: not the weight-stationary kernel
    monkeypatch.setenv("DELTACONV_TC_RING", "0")  # the fine launch's grid of conv3x3_tc_kernel (64 tile slots)
    gen = torch.Generator().manual_seed(8)
    H = W = 64
    mask = torch.zeros(1, 1, H, W, dtype=torch.bool)
    for i, j in [(3, 4), (20, 50), (60, 10)]:
        mask[0, 0, i, j] = True  # three pixels in three 8x8 tiles, their 3x3 neighbourhoods too
    delta = make_delta(1, 64, H, W, mask, torch.float16, gen)
    weight = (torch.randn(256, 64, 3, 3, generator=gen) / 24).cuda()
    runs = []
    for spread in ("1", "0"):
        monkeypatch.setenv("DELTACONV_SPREAD", spread)
        counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
        out, mo = ops().conv2d(delta, mask.cuda(), weight, None, [1, 1], [1, 1], [1, 1], 1, None, counters)
        runs.append((out, mo, counters.tolist()))
    (out, mo, c), (out0, mo0, c0) = runs
    assert c[0] == c0[0] == _active_tiles(mo) == 3
    assert c[4] + c[5] == 64 * 2, f"not every block took a rank: {c}"
    _check_rank_tickets(c)
    assert c0[4:] == [0] * (COUNTERS - 4)
    assert torch.equal(mo, mo0) and torch.equal(out[mo.expand_as(out)], out0[mo.expand_as(out)])


# fp16 / bf16 cases of the gathered-rows GEMM kernel (1x1 convs, gathered taps, pixel rows)
GEMM_CASES = [
    (64, 96, (1, 1), 2, 0, 1, 1, (31, 45)),      # stride 2, wide block (Cout > 64), partial
    (136, 72, (1, 1), 1, 0, 1, 1, (19, 27)),     # 3 chunks of C_in, the last one k16 step
    (24, 16, (1, 1), 1, 0, 1, 1, (21, 30)),      # C_in 24: 2 k16 steps, narrow block
    (40, 48, (1, 1), 1, 1, 1, 1, (13, 17)),      # padding: border outputs read padding
    (256, 256, (1, 1), 1, 0, 1, 1, (45, 67)),    # many 128-row items per block
    (16, 24, (5, 5), 1, 2, 1, 1, (21, 30)),      # gathered taps
    (136, 72, (3, 3), (1, 2), 1, 1, 1, (19, 27)),  # gathered taps, unequal strides
    (96, 136, (3, 3), 1, 1, 1, 1, (13, 17)),     # 3x3: pixel rows when forced
]


@pytest.mark.gpu
@pytest.mark.parametrize("mma", ["wgmma", "mma.sync"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GEMM_CASES, ids=_case_id)
def test_conv2d_gemm_wgmma_and_mma_sync(case, dtype, mma, monkeypatch):
    """The gathered-rows GEMM on Hopper's wgmma (the default on H100 / H200) and on mma.sync
    (DELTACONV_WGMMA=0) equals the reference at every changed fraction."""
    monkeypatch.setenv("DELTACONV_WGMMA", "1" if mma == "wgmma" else "0")
    monkeypatch.setenv("DELTACONV_TC_SPLIT", "64")  # 3x3: the pixel-row GEMM
    monkeypatch.setenv("DELTACONV_TC_SPLIT_MIN", "0")
    for i, fracs in enumerate(FRACS):
        run_conv2d(case, dtype, fracs, KEYS[i % len(KEYS)], seed=30 + i, bias=i % 2 == 0)


# 1x1 cases of the warp-specialised GEMM (Hopper wgmma, C_in % 64 == 0, C_out > 64; conv1x1_ring.cuh),
# which takes the 1x1 convs of conv_gather_tc_kernel unless DELTACONV_TC_RING1=0
RING1_CASES = [
    (64, 128, (1, 1), 1, 0, 1, 1, (31, 45)),     # one input chunk
    (128, 136, (1, 1), 1, 0, 1, 1, (31, 45)),    # two chunks, 2 C_out blocks, the last one partial
    (192, 72, (1, 1), 1, 0, 1, 1, (21, 30)),     # three chunks, one partial C_out block
    (256, 256, (1, 1), 1, 0, 1, 1, (68, 120)),   # many items: several groups per block
    (512, 256, (1, 1), 2, 0, 1, 1, (45, 60)),    # stride 2: input pixels apart from output pixels
    (128, 96, (1, 1), 1, 1, 1, 1, (13, 17)),     # padding: border outputs read padding (zero rows)
    (2048, 512, (1, 1), 1, 0, 1, 1, (9, 15)),    # 32 chunks (resnet50's layer4), few items, 4 blocks
]


@pytest.mark.gpu
@pytest.mark.parametrize("ring", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", RING1_CASES, ids=_case_id)
def test_conv2d_1x1_warp_specialised(case, dtype, ring, monkeypatch):
    """The 1x1 GEMM on the warp-specialised kernel (weights streamed by TMA through a ring that its
    warpgroups share, 64 rows per warpgroup) and with DELTACONV_TC_RING1=0 on conv_gather_tc_kernel
    equals the reference at every changed fraction, with and without key streams; the
    warp-specialised kernel runs exactly on Hopper with the switch on, and its outputs are
    bit-identical from call to call."""
    monkeypatch.setenv("DELTACONV_TC_RING1", ring)
    monkeypatch.setenv("DELTACONV_TC_RING1_MIN", "0")  # small frames too
    run_conv2d_every_fraction_and_key(case, dtype, seed=70)
    call = repeatable_conv2d(case, dtype, FRACS[-1], seed=8)
    names = kernel_names_or_skip(call)
    ran = any("conv1x1_ring_kernel" in n for n in names)
    assert ran == (runs_wgmma_kernels() and ring == "1"), f"DELTACONV_TC_RING1={ring}: kernels {names}"


# gathered-rows GEMM cases for its K split (from 8 64-channel chunks of C_in on)
GEMM_KSPLIT_CASES = [
    (136, 72, (1, 1), 1, 0, 1, 1, (19, 27)),        # 3 chunks: no split
    (512, 256, (1, 1), 1, 0, 1, 1, (21, 30)),       # 8 chunks, 2 output-channel blocks
    (2048, 512, (1, 1), 1, 0, 1, 1, (9, 15)),       # 32 chunks (resnet50's layer4), 4 blocks
    (520, 128, (1, 1), 2, 0, 1, 1, (31, 45)),       # stride 2, 9 chunks, the last one 8 channels
    (520, 72, (3, 3), (1, 2), 1, 1, 1, (19, 27)),   # gathered taps, narrow block
    (512, 256, (1, 1), 1, 0, 1, 1, (68, 120)),      # many items: the split falls to 1
]


@pytest.mark.gpu
@pytest.mark.parametrize("ksplit", ["1", "2", "4"])
@pytest.mark.parametrize("mma", ["wgmma", "mma.sync"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GEMM_KSPLIT_CASES, ids=_case_id)
def test_conv2d_gemm_k_split(case, dtype, mma, ksplit, monkeypatch):
    """The gathered-rows GEMM in clusters of 1, 2 or 4 CTAs (DELTACONV_TC_KSPLIT), whose CTAs split
    an item's K 4, 2 or 1 ways by the item count, on wgmma and mma.sync, equals the reference at
    every changed fraction, gives bit-identical outputs from call to call, and records its split
    in counters[3]."""
    monkeypatch.setenv("DELTACONV_WGMMA", "1" if mma == "wgmma" else "0")
    monkeypatch.setenv("DELTACONV_TC_KSPLIT", ksplit)
    monkeypatch.setenv("DELTACONV_TC_RING1", "0")  # 1x1: conv_gather_tc_kernel, which splits K
    for i, fracs in enumerate(FRACS):
        run_conv2d(case, dtype, fracs, KEYS[i % len(KEYS)], seed=40 + i, bias=i % 2 == 0)
    rows_per_item = 64 if case[2] != (1, 1) else 1  # listed pixels, or the 64 pixels of each listed tile
    _check_k_split_calls(case, dtype, ksplit, seed=5, items_of=lambda c: -(-(c[0] * rows_per_item) // 128),
                         min_chunks=8)


@pytest.mark.gpu
@pytest.mark.parametrize("var, value", [("DELTACONV_TC_SPLIT", "0.3x"), ("DELTACONV_TC_SPLIT", "65"),
                                        ("DELTACONV_TC_SPLIT", "-1"), ("DELTACONV_TC_SPLIT_MIN", "-5"),
                                        ("DELTACONV_TC_FINE_MAX", "many"), ("DELTACONV_TC_FINE_MAX", "2.5"),
                                        ("DELTACONV_TC_PREFETCH1", "nan"), ("DELTACONV_TC_RING1_MIN", "1e-3"),
                                        ("DELTACONV_DW_PPT", "3"),
                                        ("DELTACONV_DW_PPT", "four")])
def test_conv2d_malformed_tuning_variable_names_it(var, value, monkeypatch):
    """A tuning variable that is not a number, or out of its range, is an error naming it and its
    value (not silently a default)."""
    monkeypatch.setenv(var, value)
    if var == "DELTACONV_TC_SPLIT_MIN":  # read only when the split is on
        monkeypatch.setenv("DELTACONV_TC_SPLIT", "16")
    if var == "DELTACONV_TC_FINE_MAX":  # read only by conv3x3_tc_kernel's launches
        monkeypatch.setenv("DELTACONV_TC_STATIONARY", "0")  # C_in = 64: not the weight-stationary kernel
    if var == "DELTACONV_TC_RING1_MIN" and not runs_wgmma_kernels():
        pytest.skip("read only where the warp-specialised 1x1 GEMM can run (Hopper wgmma)")
    gen = torch.Generator().manual_seed(0)
    mask = make_mask((0.3, 0.3), 17, 23, gen)
    delta = make_delta(2, 64, 17, 23, mask, torch.float16, gen)
    kernel = 1 if var in ("DELTACONV_TC_PREFETCH1", "DELTACONV_TC_RING1_MIN") else 3
    groups = 64 if var == "DELTACONV_DW_PPT" else 1  # read only by the depthwise kernel's launches
    cout = 128 if var == "DELTACONV_TC_RING1_MIN" else 64  # read for 128-channel blocks of C_out
    w = (torch.randn(cout, 64 // groups, kernel, kernel, generator=gen) / 20).cuda()
    with pytest.raises(RuntimeError, match=f"environment variable {var} must be an? .*, got '{value}'"):
        ops().conv2d(delta, mask.cuda(), w, None, [1, 1], [kernel // 2] * 2, [1, 1], groups, None)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [TC3_CASES[1], TC3_CASES[2], GEMM_CASES[0], GEMM_CASES[5],
                                  (3, 32, (3, 3), 2, 1, 1, 1, (31, 45)),      # the small-C_in stem path
                                  (24, 24, (3, 3), 1, 1, 1, 3, (21, 30))],    # grouped: CUDA cores
                         ids=_case_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_conv2d_weight_in_either_memory_format(case, dtype):
    """A weight in channels_last memory format (the tensor-core layout, read without a relayout
    copy) gives exactly the output of the same weight in the dense layout, on every path."""
    cin, cout, k, s, p, d, g, (H, W) = case
    gen = torch.Generator().manual_seed(5)
    mask = make_mask((0.02, 0.5, 1.0), H, W, gen)
    delta = make_delta(3, cin, H, W, mask, dtype, gen)
    weight = (torch.randn(cout, cin // g, *k, generator=gen) / math.sqrt(cin // g * k[0] * k[1])).to(dtype).cuda()
    b = torch.randn(cout, generator=gen).to(dtype).cuda()
    key = torch.tensor([True, False, False]).cuda()
    args = (list(_pair(s)), list(_pair(p)), list(_pair(d)), g, key)
    out, mo = ops().conv2d(delta, mask.cuda(), weight, b, *args)
    out_cl, mo_cl = ops().conv2d(delta, mask.cuda(), weight.contiguous(memory_format=torch.channels_last), b, *args)
    assert torch.equal(mo, mo_cl)
    m = mo.expand_as(out)
    assert torch.equal(out[m], out_cl[m])


@pytest.mark.gpu
def test_conv2d_non_channels_last_input_and_batch():
    """A contiguous (NCHW) delta is accepted; batch 3 with a key only on the middle stream."""
    for case in (CONV_CASES[0], CONV_CASES[5], CONV_CASES[11], CONV_CASES[22], CONV_CASES[-1]):
        run_conv2d(case, torch.float32, (0.01, 0.3, 0.0), (False, True, False), delta_format=torch.contiguous_format)


@pytest.mark.gpu
def test_conv2d_large_sparse_frame():
    """A 1080p-sized stream at 1 % clustered change, batch 2 (many tiles, long work lists)."""
    for case in ((32, 32, (3, 3), 1, 1, 1, 1, (270, 480)), (32, 64, (1, 1), 1, 0, 1, 1, (270, 480)),
                 (32, 32, (3, 3), 1, 1, 1, 32, (270, 480)), (64, 64, (3, 3), 1, 2, 2, 1, (135, 240))):
        run_conv2d(case, torch.float16, (0.01, 0.001), (False, False))


# depthwise cases of the vectorised kernel on a frame of 2 x 300 x 640 pixels (6,080 8x8 tiles at
# stride 1): more tiles than its grid (at most two waves of resident blocks), so blocks walk several
DEPTHWISE_LARGE = [
    (64, 64, (3, 3), 1, 1, 1, 64, (300, 640)),
    (96, 96, (3, 3), 2, 1, 1, 96, (300, 640)),   # fp16: blocks of 4 vectors
    (40, 40, (5, 5), 1, 2, 1, 40, (300, 640)),   # partial channel block
    (64, 64, (5, 5), 2, 2, 1, 64, (300, 640)),
    (32, 32, (3, 3), 1, 2, 2, 32, (300, 640)),   # fp16: blocks of 4 vectors
    (96, 96, (7, 7), 1, 3, 1, 96, (300, 640)),   # ConvNeXt's 7x7; fp16: blocks of 4 vectors
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", DEPTHWISE_LARGE, ids=_case_id)
def test_depthwise_on_frames_larger_than_its_grid(case, dtype):
    """The vectorised depthwise kernel stages the next tile's halo while it computes the current
    one: equal to the reference when each block walks several tiles (scattered, clustered and full
    masks; a key stream; NaN at inactive input pixels, which the halo copies read and must zero)."""
    run_conv2d(case, dtype, (0.3, 1.0), (False, True), seed=31)
    run_conv2d(case, dtype, (0.02, 0.6), None, seed=32, bias=False)


# depthwise cases of the vectorised kernel for each DELTACONV_DW_PPT (output pixels per thread):
# 8- and 4-vector channel blocks, 3x3 / 5x5, stride 1 / 2, dilation 2, a partial channel block
DEPTHWISE_PPT = [
    (64, 64, (3, 3), 1, 1, 1, 64, (31, 45)),
    (32, 32, (3, 3), 1, 1, 1, 32, (31, 45)),     # fp16: blocks of 4 vectors
    (96, 96, (3, 3), 2, 1, 1, 96, (31, 45)),     # fp16: blocks of 4 vectors
    (64, 64, (3, 3), 2, 1, 1, 64, (31, 45)),
    (40, 40, (5, 5), 1, 2, 1, 40, (21, 30)),
    (72, 72, (5, 5), 2, 2, 1, 72, (31, 45)),     # fp16: blocks of 4 vectors, a partial one
    (32, 32, (3, 3), 1, 2, 2, 32, (31, 45)),
    (64, 64, (7, 7), 1, 3, 1, 64, (31, 45)),     # ConvNeXt's 7x7: 8-vector blocks (TMA on Hopper)
    (96, 96, (7, 7), 1, 3, 1, 96, (31, 45)),     # fp16: blocks of 4 vectors
]


def run_depthwise_small_and_large(case, dtype, seed):
    """A DEPTHWISE_PPT case at every fraction and key pattern on its small map (seed), and on a
    300x640 frame of more tiles than the grid (seed + 1)."""
    run_conv2d_every_fraction_and_key(case, dtype, seed=seed)
    run_conv2d(case[:-1] + ((300, 640),), dtype, (0.3, 1.0), (False, True), seed=seed + 1)


def depthwise_kernel_names(case, dtype, seed: int) -> list[str]:
    """The CUDA kernels one conv2d call of a DEPTHWISE_PPT case runs (at the second fraction, seed)."""
    cin, cout, k, s, p, d, g, (H, W) = case
    gen = torch.Generator().manual_seed(seed)
    mask = make_mask(FRACS[1], H, W, gen).cuda()
    delta = make_delta(1, cin, H, W, mask.cpu(), dtype, gen)
    weight = torch.randn(cout, 1, *k, generator=gen).to(dtype).cuda()
    return kernel_names_or_skip(lambda: ops().conv2d(delta, mask, weight, None, [s, s], [p, p], [d, d], g, None))


@pytest.mark.gpu
@pytest.mark.parametrize("ppt", ["1", "2", "4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", DEPTHWISE_PPT, ids=_case_id)
def test_depthwise_each_pixels_per_thread(case, dtype, ppt, monkeypatch):
    """Every choice of output pixels per thread of the vectorised depthwise kernel equals the
    reference, on small maps at every fraction and on a frame of more tiles than its grid."""
    monkeypatch.setenv("DELTACONV_DW_PPT", ppt)
    run_depthwise_small_and_large(case, dtype, seed=50)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", DEPTHWISE_PPT, ids=_case_id)
def test_depthwise_halo_by_tma_or_cp_async(case, dtype, tma, monkeypatch):
    """The vectorised depthwise kernel with its halo copied by the copy engine (TMA: 8-vector channel
    blocks on Hopper, with DELTACONV_DW_TMA unset or 1; inactive pixels zeroed after the copy lands)
    and by cp.async (DELTACONV_DW_TMA=0) equals the reference on small maps at every fraction and on
    a frame of more tiles than its grid; the TMA kernel runs exactly where it should."""
    monkeypatch.setenv("DELTACONV_DW_TMA", tma)
    run_depthwise_small_and_large(case, dtype, seed=52)
    names = depthwise_kernel_names(case, dtype, seed=8)
    vectors = case[0] * dtype.itemsize // 16
    eight = -(-vectors // 8) * 8 - vectors <= -(-vectors // 4) * 4 - vectors  # dwconv_narrow_blocks
    expected = runs_wgmma_kernels() and tma == "1" and eight
    assert any("dwconv_vec_kernel" in n for n in names), names
    assert any(re.search(r"dwconv_vec_kernel<[^>]*, true>", n) for n in names) == expected, names


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [c for c in DEPTHWISE_PPT if c[0] in (32, 72, 96)], ids=_case_id)
def test_depthwise_wide_blocks_where_narrow_would_run(case, dtype, monkeypatch):
    """With DELTACONV_DW_NARROW=0 the channel counts that take 4-vector blocks (32, 72 and 96 channels
    of 16-bit types) run in 8-vector blocks, the last one partly past the channels, and equal the
    reference on small maps at every fraction and on a frame of more tiles than the grid."""
    monkeypatch.setenv("DELTACONV_DW_NARROW", "0")
    run_depthwise_small_and_large(case, dtype, seed=54)
    names = depthwise_kernel_names(case, dtype, seed=9)
    blocks = {m.group(1) for n in names for m in [re.search(r"dwconv_vec_kernel<[^,]*, \d+, \d+, \d+, (\d+),", n)] if m}
    assert blocks == {"8"}, names


# ----------------------------------------------------------------------------- conv_transpose2d
# (C_in, C_out, kernel, stride, padding, output_padding, groups, dilation, (H, W))
CONVT_CASES = [
    (17, 32, (3, 3), 2, 1, 1, 1, 1, (13, 17)),
    (32, 16, (4, 4), 2, 1, 0, 1, 1, (13, 17)),
    (32, 32, (3, 3), 1, 1, 0, 2, 1, (31, 45)),
    (16, 16, (3, 3), 2, 2, 1, 1, 2, (13, 17)),
    (3, 5, (5, 5), 3, 2, 2, 1, 1, (13, 17)),
    (8, 8, (1, 1), 2, 0, 1, 1, 1, (13, 17)),
    (64, 64, (2, 2), 2, 0, 0, 64, 1, (13, 17)),    # depthwise upsampling
    (6, 9, (3, 2), (2, 1), (1, 0), (1, 0), 3, (1, 2), (13, 17)),
    # kernels of whole strides: float16 / bfloat16 run them as one convolution per phase (tensor cores)
    (8, 8, (2, 2), 2, 0, 0, 1, 1, (13, 17)),        # U-Net upsampling: a 1x1 conv per phase
    (16, 24, (4, 4), 2, 1, 1, 1, 1, (13, 17)),      # output_padding: odd output
    (16, 32, (3, 3), 1, 1, 0, 1, 1, (13, 17)),      # stride 1: one phase, a 3x3 conv
    (16, 16, (4, 2), (2, 1), (1, 0), (0, 0), 1, 1, (13, 17)),
    (24, 16, (6, 6), 3, 2, 1, 1, 1, (11, 9)),
    (64, 64, (4, 4), 2, 3, 0, 1, 1, (13, 17)),      # padding past the taps (a phase skips rows)
    (16, 16, (4, 4), 2, 0, 0, 1, 1, (1, 3)),
]


def _convt_id(c):
    cin, cout, k, s, p, op, g, d, (H, W) = c
    return f"{cin}-{cout}-k{k[0]}x{k[1]}-s{s}-p{p}-op{op}-g{g}-d{d}-{H}x{W}".replace(" ", "")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CONVT_CASES, ids=_convt_id)
def test_conv_transpose2d(case, dtype):
    cin, cout, k, s, p, op, g, d, (H, W) = case
    s, p, op, d = _pair(s), _pair(p), _pair(op), _pair(d)
    for i, fracs in enumerate(FRACS):
        for key in KEYS:
            gen = torch.Generator().manual_seed(i)
            mask = make_mask(fracs, H, W, gen)
            delta = make_delta(2, cin, H, W, mask, dtype, gen)
            weight = torch.randn(cin, cout // g, *k, generator=gen) / math.sqrt(cin // g * k[0] * k[1])
            b = torch.randn(cout, generator=gen) if i % 2 == 0 else None
            kt = make_key(key, 2)
            out, mo = ops().conv_transpose2d(delta, mask.cuda(), weight.cuda(), cuda_or_none(b), list(s), list(p),
                                             list(op), g, list(d), cuda_or_none(kt))
            r_out, r_mask = ref.conv_transpose2d(delta.cpu().double(), mask, weight.to(dtype).double(),
                                                 None if b is None else b.to(dtype).double(), s, p, op, g, d, kt)
            check_layout(out, mo, 2, cout, r_out.shape[2], r_out.shape[3], dtype)
            assert torch.equal(mo.cpu(), r_mask), f"conv_transpose2d mask differs (fracs {fracs}, key {key})"
            assert_active_close(out, r_out, r_mask, dtype, f"conv_transpose2d (fracs {fracs}, key {key})")


def _runs_phases(case, dtype) -> bool:
    """Whether conv_transpose2d runs ``case`` as its phases' convolution (``transposed_phases_ok`` in
    conv_ops.cu; the cases' windows are at most 3x3)."""
    cin, cout, k, s, p, op, g, d, _ = case
    s, d = _pair(s), _pair(d)
    return (dtype != torch.float32 and g == 1 and d == (1, 1) and k[0] % s[0] == 0 and k[1] % s[1] == 0
            and cin % 8 == 0 and cout % 8 == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("phases", ["1", "0", "2x2"])
@pytest.mark.parametrize("case", [c for c in CONVT_CASES if _runs_phases(c, torch.float16)], ids=_convt_id)
def test_conv_transpose2d_phases_run_where_they_apply(case, phases, monkeypatch):
    """A transposed convolution of whole strides in float16 runs as the convolution of its phases
    (their filters built, the convolution, the scatter; no CUDA-core transposed kernel) unless
    DELTACONV_TC_TRANSPOSED=0; "2x2": DELTACONV_TC_TRANSPOSED_3X3=0, a 2x2 window of taps kept 2x2
    (the gathered-taps kernel; the others as by default). All paths give the same masks and the same values to float16's
    rounding."""
    cin, cout, k, s, p, op, g, d, (H, W) = case
    s, p, op, d = list(_pair(s)), list(_pair(p)), list(_pair(op)), list(_pair(d))
    gen = torch.Generator().manual_seed(5)
    mask = make_mask((0.05, 0.5), H, W, gen).cuda()
    delta = make_delta(2, cin, H, W, mask.cpu(), torch.float16, gen)
    weight = (torch.randn(cin, cout, *k, generator=gen) / math.sqrt(cin * k[0] * k[1])).cuda()
    args = (delta, mask, weight, None, s, p, op, g, d, None)
    monkeypatch.setenv("DELTACONV_TC_TRANSPOSED", "0")
    direct, direct_mask = ops().conv_transpose2d(*args)
    monkeypatch.setenv("DELTACONV_TC_TRANSPOSED", "0" if phases == "0" else "1")
    monkeypatch.setenv("DELTACONV_TC_TRANSPOSED_3X3", "0" if phases == "2x2" else "1")
    names = kernel_names_or_skip(lambda: ops().conv_transpose2d(*args))
    assert any("phase_scatter" in n for n in names) == (phases != "0"), names
    assert any("phase_filters" in n for n in names) == (phases != "0"), names
    assert any("conv_direct_kernel" in n for n in names) == (phases == "0"), names
    out, mo = ops().conv_transpose2d(*args)
    assert torch.equal(mo, direct_mask)
    active = mo.expand_as(out)
    torch.testing.assert_close(out[active].float(), direct[active].float(), rtol=2e-3, atol=2e-3)


# ----------------------------------------------------------------------------- counters argument
def _active_tiles(mask_out: torch.Tensor) -> int:
    """8x8 output tiles (per stream) holding an active pixel."""
    return int((F.max_pool2d(mask_out.float(), 8, 8, ceil_mode=True) > 0).sum())


@pytest.mark.gpu
@pytest.mark.parametrize("split", ["default", "40/0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CONV_CASES + TC3_CASES[4:6], ids=_case_id)
def test_conv2d_counters_argument(case, dtype, split, monkeypatch):
    """With zeroed ``counters`` given (what a DeltaModel passes, instead of the op zeroing its own)
    conv2d gives bit-identical outputs and masks, and counts its work list there: the listed
    pixels (1x1 convs) or tiles (tile paths; a 3x3 split counts its sparse tiles in counters[1]
    and their pixels in counters[2]); the fourth int is 0 or the K split of a tensor-core path
    (see test_conv2d_3x3_fine_launch_k_split, test_conv2d_gemm_k_split), and the ranks of the blocks (counters[4:14],
    see test_conv2d_block_order_never_changes_results) are consistent."""
    if split != "default":
        monkeypatch.setenv("DELTACONV_TC_SPLIT", "40")
        monkeypatch.setenv("DELTACONV_TC_SPLIT_MIN", "0")
    cin, cout, k, s, p, d, g, (H, W) = case
    s, p, d = list(_pair(s)), list(_pair(p)), list(_pair(d))
    gen = torch.Generator().manual_seed(3)
    for fracs, key in [((0.01, 0.3), None), ((0.0, 0.0), None), ((1.0, 0.01), (False, True))]:
        mask = make_mask(fracs, H, W, gen).cuda()
        delta = make_delta(2, cin, H, W, mask.cpu(), dtype, gen)
        weight = (torch.randn(cout, cin // g, *k, generator=gen) / math.sqrt(cin // g * k[0] * k[1])).cuda()
        kt = cuda_or_none(make_key(key, 2))
        out, mo = ops().conv2d(delta, mask, weight, None, s, p, d, g, kt)
        counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
        out2, mo2 = ops().conv2d(delta, mask, weight, None, s, p, d, g, kt, counters)
        assert torch.equal(mo2, mo), f"mask differs with counters (fracs {fracs})"
        active = mo.expand_as(out)
        assert torch.equal(out2[active], out[active]), f"values differ with counters (fracs {fracs})"
        c = counters.tolist()
        tc = dtype != torch.float32 and g == 1  # a tensor-core path may record its K split
        assert c[3] in ((0, 1, 2) if tc else (0,)), f"counters {c}: fourth int"
        depthwise = g > 1 and g == cin and cout == cin
        pixels = k == (1, 1) and not depthwise  # the 1x1 path lists pixels, the others tiles
        expected = int(mo.sum()) if pixels else _active_tiles(mo)
        assert c[0] + c[1] == expected, f"counters {c}, expected {expected} listed items (fracs {fracs})"
        _check_rank_tickets(c)


@pytest.mark.gpu
@pytest.mark.parametrize("key", [None, (False, True)])
def test_conv1x1_mask_at_any_byte_offset(key):
    """A stride-1 1x1 conv reads its mask four bytes at a time when the mask is 4-byte aligned and
    byte by byte otherwise: a mask that starts one byte into its buffer gives the same outputs, masks
    and listed pixels; the pixel count (2 x 13 x 17 = 442) leaves a partial word at the end."""
    gen = torch.Generator().manual_seed(6)
    N, C, H, W = 2, 16, 13, 17
    mask = make_mask((0.3, 0.01), H, W, gen).cuda()
    delta = make_delta(N, C, H, W, mask.cpu(), torch.float16, gen)
    weight = (torch.randn(24, C, 1, 1, generator=gen) / 4).cuda()
    kt = cuda_or_none(make_key(key, N))
    shifted = torch.zeros(N * H * W + 1, dtype=torch.bool, device="cuda")
    shifted[1:] = mask.flatten()
    mask_odd = shifted[1:].view(N, 1, H, W)
    assert mask_odd.is_contiguous() and mask_odd.data_ptr() % 4 != 0
    runs = []
    for m in (mask, mask_odd):
        counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
        runs.append(ops().conv2d(delta, m, weight, None, [1, 1], [0, 0], [1, 1], 1, kt, counters) + (counters,))
    (out, mo, c), (out2, mo2, c2) = runs
    assert torch.equal(mo2, mo) and torch.equal(c2, c)
    assert int(c[0]) == int(mo.sum())
    assert torch.equal(out2[mo.expand_as(out)], out[mo.expand_as(out)])
    expected = mask | (kt.view(N, 1, 1, 1) if kt is not None else False)
    assert torch.equal(mo, expected)


@pytest.mark.gpu
def test_conv_transpose2d_counters_argument(monkeypatch):
    """conv_transpose2d with zeroed ``counters``: the same outputs, its tiles counted there (those of the
    phases' combined convolution where it runs)."""
    gen = torch.Generator().manual_seed(4)
    mask = make_mask((0.01, 0.3), 13, 17, gen).cuda()
    delta = make_delta(2, 16, 13, 17, mask.cpu(), torch.float16, gen)
    w = (torch.randn(16, 8, 4, 4, generator=gen) / 8).cuda()
    args = (delta, mask, w, None, [2, 2], [1, 1], [0, 0], 1, [1, 1], None)
    out, mo = ops().conv_transpose2d(*args)
    counters = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
    out2, mo2 = ops().conv_transpose2d(*args, counters)
    assert torch.equal(mo2, mo) and torch.equal(out2[mo.expand_as(out)], out[mo.expand_as(out)])
    # float16 runs the phases' combined convolution: 4x4 at stride 2 with padding 1 a 3x3 window over the
    # input padded by 2 (output row t reads input rows t - 2 .. t, the first row's taps zero), with
    # DELTACONV_TC_TRANSPOSED_3X3=0 a 2x2 window padded by 1 (rows t - 1, t); its active tiles, those of
    # the input mask dilated by the window
    for window, switch in ((3, "1"), (2, "0")):
        monkeypatch.setenv("DELTACONV_TC_TRANSPOSED_3X3", switch)
        counters.zero_()
        out3, mo3 = ops().conv_transpose2d(*args, counters)
        assert torch.equal(mo3, mo) and torch.equal(out3[mo.expand_as(out)], out[mo.expand_as(out)])
        dilated = F.max_pool2d(F.pad(mask.float(), (window - 1,) * 4), window, 1)
        assert counters[0] + counters[1] == _active_tiles(dilated > 0), (window, counters.tolist())
    monkeypatch.setenv("DELTACONV_TC_TRANSPOSED", "0")  # the CUDA-core kernel: one call, its tiles
    counters.zero_()
    ops().conv_transpose2d(*args, counters)
    assert counters.tolist() == [_active_tiles(mo)] + [0] * (COUNTERS - 1)


@pytest.mark.gpu
def test_counters_argument_errors_name_it():
    d = torch.zeros(1, 4, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
    m = torch.ones(1, 1, 8, 8, dtype=torch.bool, device="cuda")
    w = torch.zeros(4, 4, 3, 3, device="cuda")
    wt = torch.zeros(4, 4, 2, 2, device="cuda")
    good = torch.zeros(COUNTERS, dtype=torch.int32, device="cuda")
    for bad, what in [(good.long(), "dtype"), (good[:13], "at least 14"), (good.cpu(), "CUDA"),
                      (torch.zeros(2 * COUNTERS, dtype=torch.int32, device="cuda")[::2], "contiguous"),
                      (good.view(2, -1), "1-D")]:
        with pytest.raises(RuntimeError, match="'counters'"):
            ops().conv2d(d, m, w, None, [1, 1], [1, 1], [1, 1], 1, None, bad)
        with pytest.raises(RuntimeError, match="'counters'"):
            ops().conv_transpose2d(d, m, wt, None, [2, 2], [0, 0], [0, 0], 1, [1, 1], None, bad)


# ----------------------------------------------------------------------------- max_pool2d
# (C, kernel, stride, padding, dilation, ceil_mode, (H, W))
MAXPOOL_CASES = [
    (17, 3, 2, 1, 1, False, (13, 17)),
    (32, 3, 2, 1, 1, True, (31, 45)),
    (64, 2, 2, 0, 1, False, (31, 45)),
    (3, 3, 1, 1, 1, False, (13, 17)),
    (17, 3, 2, 1, 2, True, (13, 17)),
    (96, 5, 3, 2, 1, True, (31, 45)),
    (33, (3, 2), (2, 1), (1, 0), (1, 2), True, (13, 17)),
    (8, 3, 1, 1, 1, False, (600, 640)),  # more pixels than the persistent kernels' resident threads
    # channels_last states with C <= 512 take maxpool_out_cl_kernel: one lane, several chunks of 128
    # channels per lane group (float32 acc; 256 channels of 2-byte whole values); 4 and 12 whole values of
    # 2 bytes load 4 per lane (C % 8 != 0), 10 and 6 channels 2 (MTCNN's PNet pools 10 with a 2x2 window),
    # 3, 17 and 33 one (above); 516 channels take maxpool_out_kernel
    (10, 2, 2, 0, 1, True, (31, 45)),
    (6, 3, 2, 1, 1, False, (13, 17)),
    (4, 3, 2, 1, 1, True, (13, 17)),
    (12, 3, 2, 1, 1, False, (13, 17)),
    (256, 3, 2, 1, 1, False, (13, 17)),
    (512, 3, 2, 1, 1, False, (7, 9)),
    (516, 2, 2, 0, 1, False, (7, 9)),
]


def _pool_id(c):
    return "-".join(str(v) for v in c).replace(" ", "")


@pytest.mark.gpu
@pytest.mark.parametrize("state_format", [torch.channels_last, torch.contiguous_format], ids=["cl", "nchw"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=_pool_id)
def test_max_pool2d(case, dtype, state_format):
    """A sequence of frames (key, sparse, partial key, ...) with state carried over: outputs, masks
    and both state tensors match the reference bit-exactly."""
    run_max_pool2d_frames(case, dtype, state_format)


@pytest.mark.gpu
@pytest.mark.parametrize("state_format", [torch.channels_last, torch.contiguous_format], ids=["cl", "nchw"])
@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=_pool_id)
def test_max_pool2d_tf32_sends(case, state_format):
    """float32 with ``tf32`` (both kernels): the changes sent are TF32 values, bit for bit the
    reference's, and what the rounding left stays pending in ``sent``, frame after frame; float16
    deltas with ``tf32`` are refused."""
    run_max_pool2d_frames(case, torch.float32, state_format, tf32=True)
    d = torch.zeros(1, 4, 5, 5, dtype=torch.float16, device="cuda").contiguous(memory_format=torch.channels_last)
    m = torch.ones(1, 1, 5, 5, dtype=torch.bool, device="cuda")
    with pytest.raises(RuntimeError, match="argument 'tf32' needs float32 deltas"):
        ops().max_pool2d(d, m, d.float(), d[:, :, :3, :3], [3, 3], [2, 2], [1, 1], [1, 1], False, 0.0, None,
                         False, True)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True], ids=["", "tf32"])
@pytest.mark.parametrize("state_format", [torch.channels_last, torch.contiguous_format], ids=["cl", "nchw"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=_pool_id)
def test_max_pool2d_values(case, dtype, state_format, tf32):
    """max_pool2d_values (value mode: the input's whole values, no accumulator) over a sequence of frames:
    outputs, masks and ``sent`` bit-identical to the reference's, both kernels, any input layout."""
    if tf32 and dtype != torch.float32:
        pytest.skip("tf32 sends: float32 only")
    run_max_pool2d_frames(case, dtype, state_format, tf32=tf32, values=True)


def test_max_pool2d_values_errors_name_the_argument():
    """max_pool2d_values' argument checks name the argument and the value received."""
    x = torch.zeros(1, 4, 5, 5, device="cuda").contiguous(memory_format=torch.channels_last)
    m = torch.ones(1, 1, 5, 5, dtype=torch.bool, device="cuda")
    sent = torch.zeros(1, 4, 3, 3, device="cuda")
    with pytest.raises(RuntimeError, match="max_pool2d_values: argument 'x' must be float32, float16 or bfloat16, "
                                           "got Int"):
        ops().max_pool2d_values(x.int(), m, sent, [3, 3], [2, 2], [1, 1], [1, 1], False, 0.0, None)
    with pytest.raises(RuntimeError, match=r"max_pool2d_values: argument 'sent' must have shape \[1, 4, 3, 3\]"):
        ops().max_pool2d_values(x, m, sent[:, :, :2], [3, 3], [2, 2], [1, 1], [1, 1], False, 0.0, None)
    with pytest.raises(RuntimeError, match="max_pool2d_values: argument 'sent' must have dtype Float, got Half"):
        ops().max_pool2d_values(x, m, sent.half(), [3, 3], [2, 2], [1, 1], [1, 1], False, 0.0, None)


def run_max_pool2d_frames(case, dtype, state_format, tf32=False, values=False):
    """max_pool2d over a sequence of frames on the kernel and on the reference (``ref``), at
    thresholds 0 and 0.7: masks, values at the sent pixels and both states bit-identical; with
    ``tf32`` the values sent are TF32 and ``sent`` is the window maximum less under one TF32
    step of the change (and its own float32 rounding). ``values``: max_pool2d_values of the input's
    whole values (``acc`` then holds them, in the delta dtype, updated on the active pixels)."""
    C, k, s, p, d, ceil, (H, W) = case
    k, s, p, d = _pair(k), _pair(s), _pair(p), _pair(d)
    for thr in (0.0, 0.7):
        gen = torch.Generator().manual_seed(int(thr * 10))
        acc = torch.zeros(2, C, H, W, dtype=dtype if values else torch.float32).contiguous(
            memory_format=state_format)
        Ho, Wo = torch.nn.functional.max_pool2d(torch.empty(1, 1, H, W), k, s, p, d, ceil).shape[2:]
        sent = torch.zeros(2, C, Ho, Wo, dtype=dtype).contiguous(memory_format=state_format)  # the delta dtype
        g_acc, g_sent = acc.cuda(), sent.cuda()
        frames = [((1.0, 1.0), (True, True))] + [(f, k_) for f in FRACS for k_ in KEYS]
        for t, (fracs, key) in enumerate(frames):
            mask = make_mask(fracs, H, W, gen)
            delta = make_delta(2, C, H, W, mask, dtype, gen)
            kt = make_key(key, 2)
            if values:  # the whole values change on the active pixels
                acc.copy_(torch.where(mask, acc + delta.cpu(), acc))
                g_acc.copy_(acc)
                out, mo = ops().max_pool2d_values(g_acc, mask.cuda(), g_sent, list(k), list(s), list(p), list(d),
                                                  ceil, thr, cuda_or_none(kt), False, tf32)
                r_out, r_mask = ref.max_pool2d_values(acc, mask, sent, k, s, p, d, ceil, thr, kt, tf32=tf32)
            else:
                out, mo = ops().max_pool2d(delta, mask.cuda(), g_acc, g_sent, list(k), list(s), list(p), list(d),
                                           ceil, thr, cuda_or_none(kt), False, tf32)
                r_out, r_mask = ref.max_pool2d(delta.cpu(), mask, acc, sent, k, s, p, d, ceil, thr, kt, tf32=tf32)
            what = f"max_pool2d{'_values' if values else ''} frame {t} (fracs {fracs}, key {key}, thr {thr})"
            check_layout(out, mo, 2, C, Ho, Wo, dtype)
            assert torch.equal(mo.cpu(), r_mask), f"{what}: mask differs"
            active = r_mask.expand_as(r_out)
            assert torch.equal(out.cpu()[active], r_out[active]), f"{what}: values differ"
            assert torch.equal(g_acc.cpu(), acc), f"{what}: acc differs"
            assert torch.equal(g_sent.cpu(), sent), f"{what}: sent differs"
            assert g_acc.stride() == acc.stride() and g_sent.stride() == sent.stride()
            if tf32:
                assert is_tf32(out.cpu()[active]), f"{what}: values sent are not TF32"
                y = torch.nn.functional.max_pool2d(acc.float(), k, s, p, d, ceil)
                residual = (y - sent)[active]
                bound = r_out[active].abs() * 2.0 ** -11 + y[active].abs() * 2.0 ** -22  # sent: rounded to float32
                assert (residual.abs() <= bound).all(), what


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MAXPOOL_CASES[:4], ids=_pool_id)
def test_max_pool2d_rms_measure(case, dtype):
    """max_pool2d with the rms measure: after a key frame, one partial frame; masks agree with the
    reference except where the RMS change is within rounding of the threshold, values and state
    agree on the other pixels."""
    C, k, s, p, d, ceil, (H, W) = case
    k, s, p, d = _pair(k), _pair(s), _pair(p), _pair(d)
    gen = torch.Generator().manual_seed(3)
    Ho, Wo = torch.nn.functional.max_pool2d(torch.empty(1, 1, H, W), k, s, p, d, ceil).shape[2:]
    acc = torch.zeros(2, C, H, W).contiguous(memory_format=torch.channels_last)
    sent = torch.zeros(2, C, Ho, Wo, dtype=dtype).contiguous(memory_format=torch.channels_last)
    g_acc, g_sent = acc.cuda(), sent.cuda()
    thr = 0.4
    for t, (fracs, key) in enumerate([((1.0, 1.0), (True, True)), ((0.3, 1.0), None)]):
        mask = make_mask(fracs, H, W, gen)
        delta = make_delta(2, C, H, W, mask, dtype, gen, scale=0.5)
        kt = make_key(key, 2)
        out, mo = ops().max_pool2d(delta, mask.cuda(), g_acc, g_sent, list(k), list(s), list(p), list(d), ceil,
                                   thr, cuda_or_none(kt), True)
        sent_before = sent.clone()
        r_out, r_mask = ref.max_pool2d(delta.cpu(), mask, acc, sent, k, s, p, d, ceil, thr, kt, "rms")
    y = torch.nn.functional.max_pool2d(acc, k, s, p, d, ceil)
    rms = (y.to(dtype).float() - sent_before.float()).square().mean(dim=1, keepdim=True).sqrt()
    amb = (rms - thr).abs() <= 1e-3 * (1 + y.abs().amax(dim=1, keepdim=True))
    diff = (mo.cpu() != r_mask) & ~amb
    assert not diff.any(), f"{int(diff.sum())} mask mismatches"
    agree = (mo.cpu() & r_mask).expand_as(r_out)
    assert torch.equal(out.cpu()[agree], r_out[agree])
    keep = ~amb.expand_as(sent)
    assert torch.equal(g_sent.cpu()[keep], sent[keep]) and torch.equal(g_acc.cpu(), acc)
    region = torch.nn.functional.max_pool2d(mask.float(), k, s, p, d, ceil) > 0
    assert r_mask.any() and (region & ~r_mask).any()  # the rms test really held pixels back


# ----------------------------------------------------------------------------- avg pooling
# (C, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, (H, W))
AVGPOOL_CASES = [
    (17, 3, 2, 1, False, True, None, (13, 17)),
    (32, 3, 2, 1, True, False, None, (31, 45)),
    (3, 2, 2, 0, False, True, None, (13, 17)),
    (64, (3, 2), (2, 1), (1, 0), True, True, None, (13, 17)),
    (17, 3, 1, 1, False, True, 5, (13, 17)),
    (96, 5, 3, 2, True, False, None, (31, 45)),
    (32, 3, 2, 1, True, True, 4, (31, 45)),
    (16, 64, 64, 0, False, True, None, (64, 64)),    # large windows on the op's own kernel (the backend's
    (24, 8, 8, 0, True, False, None, (32, 48)),      # avg_pool2d hands the first two to the adaptive pooling:
    (40, 8, 8, 0, False, True, None, (31, 45)),      # test_backend_avg_pool2d_runs_large_tiling_windows_...)
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", AVGPOOL_CASES, ids=_pool_id)
def test_avg_pool2d(case, dtype):
    C, k, s, p, ceil, cip, div, (H, W) = case
    k, s, p = _pair(k), _pair(s), _pair(p)
    for i, fracs in enumerate(FRACS):
        gen = torch.Generator().manual_seed(i)
        mask = make_mask(fracs, H, W, gen)
        delta = make_delta(2, C, H, W, mask, dtype, gen)
        out, mo = ops().avg_pool2d(delta, mask.cuda(), list(k), list(s), list(p), ceil, cip, div)
        r_out, r_mask = ref.avg_pool2d(delta.cpu().double(), mask, k, s, p, ceil, cip, div)
        check_layout(out, mo, 2, C, r_out.shape[2], r_out.shape[3], dtype)
        assert torch.equal(mo.cpu(), r_mask), f"avg_pool2d mask differs (fracs {fracs})"
        assert_active_close(out, r_out, r_mask, dtype, f"avg_pool2d (fracs {fracs})")


# (C, kernel, (H, W), adaptive): windows of at least LARGE_POOL_WINDOW pixels, tiling the map or not
LARGE_WINDOW_CASES = [
    (16, 64, (64, 64), True),     # a global pooling as a fixed window (TFLite squeeze-excite blocks)
    (24, 8, (32, 48), True),      # 8x8 windows tiling the map: 4x6 outputs
    (40, 8, (31, 45), False),     # rows and columns left over: the window kernel
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", LARGE_WINDOW_CASES, ids=_pool_id)
def test_backend_avg_pool2d_runs_large_tiling_windows_on_the_adaptive_kernels(case, dtype):
    """The backend's ``avg_pool2d`` (what ``DCAvgPool2d`` calls) hands a large window that tiles the map to
    the adaptive pooling's chunked kernels (not ``avgpool_kernel``'s thread per output element) and equals
    the reference either way."""
    from deltaconv.backends import cuda as cuda_backend

    C, k, (H, W), adaptive = case
    for i, fracs in enumerate(FRACS):
        gen = torch.Generator().manual_seed(i)
        mask = make_mask(fracs, H, W, gen)
        delta = make_delta(2, C, H, W, mask, dtype, gen)
        result = []
        names = cuda_kernel_names(lambda: result.extend(
            cuda_backend.avg_pool2d(delta, mask.cuda(), k, k, 0, False, True, None)))
        out, mo = result
        r_out, r_mask = ref.avg_pool2d(delta.cpu().double(), mask, k, k, 0, False, True, None)
        assert torch.equal(mo.cpu(), r_mask), f"avg_pool2d mask differs (fracs {fracs})"
        assert_active_close(out, r_out, r_mask, dtype, f"avg_pool2d (fracs {fracs})")
        if names:  # empty where the profiler records no kernels (CUPTI unavailable)
            assert any("adaptive_avgpool_kernel" in n for n in names) == adaptive, names
            assert any(re.search(r"\bavgpool_kernel", n) for n in names) != adaptive, names


# (C, output_size, (H, W))
ADAPTIVE_CASES = [
    (17, (1, 1), (13, 17)),
    (64, (1, 1), (31, 45)),
    (32, (7, 7), (13, 17)),
    (3, (5, 3), (31, 45)),
    (17, (20, 30), (13, 17)),   # output larger than input
    (96, (4, 4), (31, 45)),
    (40, (1, 1), (135, 240)),   # global pooling of a large map: 127 chunks, the finish's 32 rows
    (32, (1, 1), (300, 500)),   # 586 chunks (efficientnet_b0's first squeeze-excite at 1080p: 2,025)
    (72, (1, 1), (70, 121)),    # squeeze-excite of deeplabv3_mobilenet_v3_large: 34 chunks of 256 pixels
    (300, (2, 3), (45, 61)),    # channels in passes of 256 lanes, windows over two chunks
    (960, (1, 1), (17, 30)),    # four passes of 256 channel lanes
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=_pool_id)
def test_adaptive_avg_pool2d(case, dtype):
    C, osz, (H, W) = case
    for i, fracs in enumerate(FRACS):
        gen = torch.Generator().manual_seed(i)
        mask = make_mask(fracs, H, W, gen)
        delta = make_delta(2, C, H, W, mask, dtype, gen)
        out, mo = ops().adaptive_avg_pool2d(delta, mask.cuda(), list(osz))
        r_out, r_mask = ref.adaptive_avg_pool2d(delta.cpu().double(), mask, osz)
        check_layout(out, mo, 2, C, osz[0], osz[1], dtype)
        assert torch.equal(mo.cpu(), r_mask), f"adaptive_avg_pool2d mask differs (fracs {fracs})"
        assert_active_close(out, r_out, r_mask, dtype, f"adaptive_avg_pool2d (fracs {fracs})")


# ----------------------------------------------------------------------------- linear
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sizes", [(2, 17, 3), (3, 1280, 1000), (4, 96, 33)], ids=str)
def test_linear(sizes, dtype):
    N, K, M = sizes
    gen = torch.Generator().manual_seed(K)
    for rows in ([True, False, True, False], [False] * 4, [True] * 4):
        for key in (None, (True, True, False, False), (False, True, False, True)):
            mask = torch.tensor(rows[:N], dtype=torch.bool)[:, None]
            delta = torch.randn(N, K, generator=gen)
            delta = torch.where(mask, delta, torch.full((), float("nan"))).to(dtype)
            weight = torch.randn(M, K, generator=gen) / math.sqrt(K)
            b = torch.randn(M, generator=gen)
            kt = make_key(key, N)
            out, mo = ops().linear(delta.cuda(), mask.cuda(), weight.cuda(), b.cuda(), cuda_or_none(kt))
            r_out, r_mask = ref.linear(delta.double(), mask, weight.to(dtype).double(), b.to(dtype).double(), kt)
            assert out.shape == (N, M) and out.dtype == dtype and mo.shape == (N, 1)
            assert torch.equal(mo.cpu(), r_mask), f"linear mask differs (rows {rows}, key {key})"
            assert_active_close(out, r_out, r_mask, dtype, f"linear (rows {rows}, key {key})")


@pytest.mark.gpu
def test_linear_4d_mask_and_strided_key():
    """A [N, 1, 1, 1] row mask (as the CUDA backend passes it) and a non-contiguous key view."""
    gen = torch.Generator().manual_seed(3)
    N, K, M = 4, 50, 9
    mask = torch.tensor([True, False, False, True])[:, None]
    delta = torch.where(mask, torch.randn(N, K, generator=gen), torch.full((), float("nan")))
    weight = torch.randn(M, K, generator=gen) / 7
    b = torch.randn(M, generator=gen)
    key_full = torch.tensor([False, False, True, False, False, True, True, False])
    kt = key_full[::2]  # [False, True, False, True]
    out, mo = ops().linear(delta.cuda(), mask.cuda().view(N, 1, 1, 1), weight.cuda(), b.cuda(), key_full.cuda()[::2])
    r_out, r_mask = ref.linear(delta.double(), mask, weight.double(), b.double(), kt)
    assert mo.shape == (N, 1) and torch.equal(mo.cpu(), r_mask)
    assert_active_close(out, r_out, r_mask, torch.float32, "linear with a 4-D mask")


@pytest.mark.gpu
def test_conv2d_strided_key():
    """A non-contiguous key view gives the same result as its contiguous copy."""
    gen = torch.Generator().manual_seed(4)
    mask = make_mask((0.01, 0.0, 0.3), 13, 17, gen).cuda()
    delta = make_delta(3, 17, 13, 17, mask.cpu(), torch.float32, gen)
    w = (torch.randn(8, 17, 3, 3, generator=gen) / 12).cuda()
    b = torch.randn(8, generator=gen).cuda()
    key_full = torch.tensor([False, True, True, False, False, True], device="cuda")
    a = ops().conv2d(delta, mask, w, b, [1, 1], [1, 1], [1, 1], 1, key_full[::2])
    c = ops().conv2d(delta, mask, w, b, [1, 1], [1, 1], [1, 1], 1, key_full[::2].contiguous())
    assert torch.equal(a[1], c[1])
    active = c[1].expand_as(c[0])
    assert torch.equal(a[0][active], c[0][active])


# ----------------------------------------------------------------------------- argument checks
@pytest.mark.gpu
def test_errors_name_the_argument():
    d = torch.zeros(1, 4, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
    m = torch.ones(1, 1, 8, 8, dtype=torch.bool, device="cuda")
    w = torch.zeros(4, 4, 3, 3, device="cuda")
    o = ops()
    with pytest.raises(RuntimeError, match="'mask'"):
        o.conv2d(d, m.float(), w, None, [1, 1], [1, 1], [1, 1], 1, None)
    with pytest.raises(RuntimeError, match="'mask'"):
        o.conv2d(d, m[:, :, :4], w, None, [1, 1], [1, 1], [1, 1], 1, None)
    with pytest.raises(RuntimeError, match="'weight'"):
        o.conv2d(d, m, w[:, :3], None, [1, 1], [1, 1], [1, 1], 1, None)
    with pytest.raises(RuntimeError, match="'bias'"):
        o.conv2d(d, m, w, torch.zeros(3, device="cuda"), [1, 1], [1, 1], [1, 1], 1, None)
    with pytest.raises(RuntimeError, match="'key'"):
        o.conv2d(d, m, w, None, [1, 1], [1, 1], [1, 1], 1, torch.ones(2, dtype=torch.bool, device="cuda"))
    with pytest.raises(RuntimeError, match="'stride'"):
        o.conv2d(d, m, w, None, [0, 1], [1, 1], [1, 1], 1, None)
    with pytest.raises(RuntimeError, match="'delta'"):
        o.conv2d(d.double(), m, w, None, [1, 1], [1, 1], [1, 1], 1, None)
    with pytest.raises(RuntimeError, match="'padding'"):
        o.max_pool2d(d, m, torch.zeros_like(d), torch.zeros(1, 4, 8, 8, device="cuda"), [2, 2], [1, 1], [2, 2],
                     [1, 1], False, 0.0, None)
    with pytest.raises(RuntimeError, match="'sent'"):
        o.max_pool2d(d, m, torch.zeros_like(d), torch.zeros(1, 4, 5, 5, device="cuda"), [3, 3], [2, 2], [1, 1],
                     [1, 1], False, 0.0, None)
    with pytest.raises(RuntimeError, match="'acc'"):
        o.max_pool2d(d, m, torch.zeros_like(d).half(), torch.zeros(1, 4, 4, 4, device="cuda"), [3, 3], [2, 2],
                     [1, 1], [1, 1], False, 0.0, None)
    with pytest.raises(RuntimeError, match="'divisor_override'"):
        o.avg_pool2d(d, m, [2, 2], [2, 2], [0, 0], False, True, 0)
    with pytest.raises(RuntimeError, match="'output_padding'"):
        o.conv_transpose2d(d, m, w, None, [1, 1], [0, 0], [1, 1], 1, [1, 1], None)
    with pytest.raises(RuntimeError, match="'mask'"):
        o.linear(torch.zeros(2, 4, device="cuda"), torch.ones(2, dtype=torch.bool, device="cuda"),
                 torch.zeros(3, 4, device="cuda"), None, None)


# ----------------------------------------------------------------------------- CUDA graphs
@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    """All six ops in one captured graph (no host sync inside); replays on new inputs equal eager
    runs, max pooling state included."""
    gen = torch.Generator().manual_seed(5)
    H, W = 31, 45
    s_delta = make_delta(2, 32, H, W, torch.ones(2, 1, H, W, dtype=torch.bool), torch.float16, gen)
    s_mask = torch.ones(2, 1, H, W, dtype=torch.bool, device="cuda")
    s_key = torch.zeros(2, dtype=torch.bool, device="cuda")
    w3 = (torch.randn(64, 32, 3, 3, generator=gen) / 17).cuda()
    w1 = (torch.randn(48, 32, 1, 1, generator=gen) / 6).cuda()
    wdw = (torch.randn(32, 1, 5, 5, generator=gen) / 5).cuda()
    wt = (torch.randn(32, 8, 4, 4, generator=gen) / 20).cuda()
    wl = (torch.randn(10, 32, generator=gen) / 6).cuda()
    bias = torch.randn(64, generator=gen).cuda()
    Ho, Wo = 16, 23
    acc = torch.zeros(2, 32, H, W, device="cuda").contiguous(memory_format=torch.channels_last)
    sent = torch.zeros(2, 32, Ho, Wo, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    o = ops()

    def step():
        r = []
        r += o.conv2d(s_delta, s_mask, w3, bias, [1, 1], [1, 1], [1, 1], 1, s_key)
        r += o.conv2d(s_delta, s_mask, w1, None, [2, 2], [0, 0], [1, 1], 1, s_key)
        r += o.conv2d(s_delta, s_mask, wdw, None, [2, 2], [2, 2], [1, 1], 32, s_key)
        r += o.conv_transpose2d(s_delta, s_mask, wt, None, [2, 2], [1, 1], [0, 0], 1, [1, 1], s_key)
        r += o.max_pool2d(s_delta, s_mask, acc, sent, [3, 3], [2, 2], [1, 1], [1, 1], False, 0.1, s_key)
        r += o.avg_pool2d(s_delta, s_mask, [3, 3], [2, 2], [1, 1], True, False, None)
        pooled, pm = o.adaptive_avg_pool2d(s_delta, s_mask, [1, 1])
        r += [pooled, pm]
        r += o.linear(pooled.flatten(1), pm.flatten(1), wl, None, s_key)
        return r

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (and any one-time kernel attribute setting) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    for t, (fracs, key) in enumerate([((0.01, 0.3), (True, False)), ((1.0, 0.0), (False, False)),
                                      ((0.0, 0.01), (False, True))]):
        mask = make_mask(fracs, H, W, gen)
        s_delta.copy_(make_delta(2, 32, H, W, mask, torch.float16, gen))
        s_mask.copy_(mask)
        s_key.copy_(torch.tensor(key))
        acc0, sent0 = acc.clone(), sent.clone()
        graph.replay()
        torch.cuda.synchronize()
        got = [x.clone() for x in static_out]
        g_acc, g_sent = acc.clone(), sent.clone()
        acc.copy_(acc0)
        sent.copy_(sent0)
        eager = step()
        assert torch.equal(g_acc, acc) and torch.equal(g_sent, sent), f"replay {t}: max_pool2d state differs"
        for j in range(0, len(eager), 2):
            ev, em = eager[j], eager[j + 1]
            assert torch.equal(got[j + 1], em), f"replay {t}: mask of output {j // 2} differs"
            active = em.expand_as(ev)
            assert torch.equal(got[j][active], ev[active]), f"replay {t}: values of output {j // 2} differ"


# ----------------------------------------------------------------------------- opcheck
def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _pool_out(size, k, s, p, d, ceil):
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out = out - 1
    return out


def _fake_pair(delta, C, Ho, Wo):
    N = delta.shape[0]
    out = torch.empty((N, C, Ho, Wo), dtype=delta.dtype, device=delta.device, memory_format=torch.channels_last)
    return out, torch.empty((N, 1, Ho, Wo), dtype=torch.bool, device=delta.device)


def _fake_conv2d(delta, mask, weight, bias, stride, padding, dilation, groups, key, counters=None, input_tf32=False,
                 load_mask=None, bias_key=None):
    H, W = delta.shape[2:]
    return _fake_pair(delta, weight.shape[0], _conv_out(H, weight.shape[2], stride[0], padding[0], dilation[0]),
                      _conv_out(W, weight.shape[3], stride[1], padding[1], dilation[1]))


def _fake_conv_transpose2d(delta, mask, weight, bias, stride, padding, output_padding, groups, dilation, key,
                           counters=None):
    H, W = delta.shape[2:]
    Ho = (H - 1) * stride[0] - 2 * padding[0] + dilation[0] * (weight.shape[2] - 1) + output_padding[0] + 1
    Wo = (W - 1) * stride[1] - 2 * padding[1] + dilation[1] * (weight.shape[3] - 1) + output_padding[1] + 1
    return _fake_pair(delta, weight.shape[1] * groups, Ho, Wo)


def _fake_max_pool2d(delta, mask, acc, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold, key,
                     rms=False):
    H, W = delta.shape[2:]
    return _fake_pair(delta, delta.shape[1], _pool_out(H, kernel_size[0], stride[0], padding[0], dilation[0], ceil_mode),
                      _pool_out(W, kernel_size[1], stride[1], padding[1], dilation[1], ceil_mode))


def _fake_max_pool2d_values(x, mask, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold, key,
                            rms=False, tf32=False):
    return _fake_max_pool2d(x, mask, None, sent, kernel_size, stride, padding, dilation, ceil_mode, threshold, key)


def _fake_avg_pool2d(delta, mask, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    H, W = delta.shape[2:]
    return _fake_pair(delta, delta.shape[1], _pool_out(H, kernel_size[0], stride[0], padding[0], 1, ceil_mode),
                      _pool_out(W, kernel_size[1], stride[1], padding[1], 1, ceil_mode))


def _fake_adaptive_avg_pool2d(delta, mask, output_size):
    return _fake_pair(delta, delta.shape[1], output_size[0], output_size[1])


def _fake_linear(delta, mask, weight, bias, key):
    N = delta.shape[0]
    return (torch.empty((N, weight.shape[0]), dtype=delta.dtype, device=delta.device),
            torch.empty((N, 1), dtype=torch.bool, device=delta.device))


FAKES = {"conv2d": _fake_conv2d, "conv_transpose2d": _fake_conv_transpose2d, "max_pool2d": _fake_max_pool2d,
         "max_pool2d_values": _fake_max_pool2d_values, "avg_pool2d": _fake_avg_pool2d,
         "adaptive_avg_pool2d": _fake_adaptive_avg_pool2d, "linear": _fake_linear}


@pytest.fixture(scope="module")
def fakes():
    """Registers the fakes above for the ops that have none yet (normally deltaconv.backends.cuda
    does); they are unregistered again after this module's tests."""
    lib = torch.library.Library("deltaconv", "FRAGMENT")
    for name, fn in FAKES.items():
        try:
            torch.library.register_fake(f"deltaconv::{name}", fn, lib=lib)
        except RuntimeError:  # already registered (by deltaconv.backends.cuda)
            pass
    yield
    lib._destroy()


def _opcheck_args():
    """Inputs whose every output pixel is written (full masks, key on every stream), so that the
    eager and traced runs give identical outputs."""
    gen = torch.Generator().manual_seed(1)
    N, C, H, W = 2, 17, 13, 17
    full = torch.ones(N, 1, H, W, dtype=torch.bool)
    d = make_delta(N, C, H, W, full, torch.float32, gen)
    m = full.cuda()
    key = torch.ones(N, dtype=torch.bool, device="cuda")
    w = torch.randn(24, C, 3, 3, generator=gen).cuda() / 10
    wt = torch.randn(C, 8, 3, 3, generator=gen).cuda() / 10
    b = torch.randn(24, generator=gen).cuda()
    acc = torch.randn(N, C, H, W, generator=gen).cuda().contiguous(memory_format=torch.channels_last)
    sent = torch.zeros(N, C, 7, 9, device="cuda").contiguous(memory_format=torch.channels_last)
    return {
        "conv2d": (d, m, w, b, [2, 1], [1, 1], [1, 1], 1, key),
        "conv_transpose2d": (d, m, wt, None, [2, 2], [1, 1], [1, 1], 1, [1, 1], key),
        "max_pool2d": (d, m, acc, sent, [3, 3], [2, 2], [1, 1], [1, 1], False, 0.0, key),
        "max_pool2d_values": (acc, m, sent.clone(), [3, 3], [2, 2], [1, 1], [1, 1], False, 0.0, key),
        "avg_pool2d": (d, m, [3, 3], [2, 2], [1, 1], True, False, None),
        "adaptive_avg_pool2d": (d, m, [3, 4]),
        "linear": (torch.randn(N, 40, generator=gen).cuda(), torch.ones(N, 1, dtype=torch.bool, device="cuda"),
                   torch.randn(7, 40, generator=gen).cuda(), torch.randn(7, generator=gen).cuda(), key),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FAKES))
def test_opcheck(name, fakes):
    args = _opcheck_args()[name]
    torch.library.opcheck(getattr(ops(), name).default, args)
    if name in ("max_pool2d", "max_pool2d_values"):  # also with the rms measure
        torch.library.opcheck(getattr(ops(), name).default, tuple(args) + (True,))
    if name == "conv2d":  # also without key and bias (None arguments)
        a = list(args)
        a[3], a[8] = None, None
        torch.library.opcheck(ops().conv2d.default, tuple(a))
    if name == "conv2d":  # value mode: every input pixel read, the bias on every stream, no key
        a = list(args)
        a[8] = None
        torch.library.opcheck(ops().conv2d.default, tuple(a) + (None, False, torch.ones_like(a[1]),
                                                               torch.ones(a[0].shape[0], dtype=torch.bool,
                                                                          device="cuda")))
    if name in ("conv2d", "conv_transpose2d"):  # with the counters they write
        torch.library.opcheck(getattr(ops(), name).default,
                              tuple(args) + (torch.zeros(COUNTERS, dtype=torch.int32, device="cuda"),))
