"""Reliability of a converted model: bad input, stream changes, long videos, many streams, copies,
threads, failures mid-frame, and random networks (hypothesis)."""
from __future__ import annotations

import copy
import gc
import io
import math
import threading
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deltaconv
from helpers import device_backends, video_frames

torch.backends.mkldnn.deterministic = True


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


class SmallNet(nn.Module):
    """Conv/BN/ReLU/max-pool/upsample/skip-add: a cheap model for many-frame tests."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.c3 = nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.b1.running_mean.uniform_(-0.2, 0.2)
            self.b1.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        z = F.max_pool2d(F.relu(self.c2(y)), 2)
        z = F.interpolate(z, scale_factor=2, mode="bilinear", align_corners=False)
        return self.c3(torch.sigmoid(z + y))


@pytest.fixture()
def small():
    torch.manual_seed(0)
    return SmallNet().eval()


def frames_of(n, size=(32, 48), name="vtest.avi"):
    return video_frames(n, size, name)


# ----------------------------------------------------------------------------- validation
def test_rejects_uint8_with_conversion_hint(small):
    dm = deltaconv.convert(small, example_input=torch.randn(1, 3, 32, 48))
    with pytest.raises(TypeError, match=r"floating-point.*uint8.*float\(\)\.div\(255\)"):
        dm(torch.zeros(1, 3, 32, 48, dtype=torch.uint8))


@pytest.mark.parametrize("shape, pattern", [((3, 32, 48), "must be 4-D"), ((1, 4, 32, 48), "must have 3 channels")])
def test_rejects_wrong_rank_and_channels(small, shape, pattern):
    dm = deltaconv.convert(small, example_input=torch.randn(1, 3, 32, 48))
    with pytest.raises(ValueError, match=pattern):
        dm(torch.randn(shape))


def test_rejects_non_tensor_and_wrong_dtype(small):
    dm = deltaconv.convert(small, example_input=torch.randn(1, 3, 32, 48))
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        dm([1, 2, 3])
    with pytest.raises(TypeError, match=r"dtype torch.float64 but the model's parameters are torch.float32"):
        dm(torch.randn(1, 3, 32, 48, dtype=torch.float64))


def test_nan_frame_rejected_before_state_changes(small):
    frames = frames_of(4)
    dm = deltaconv.convert(small, threshold=0.0)
    dm(frames[0])
    dm(frames[1])
    bad = frames[2].clone()
    bad[0, 1, 5, 7] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        dm(bad)
    bad[0, 1, 5, 7] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        dm(bad)
    for f in frames[2:]:
        assert rel_err(dm(f), small(f)) < 1e-5


# ----------------------------------------------------------------------------- stream changes
def test_resolution_batch_and_dtype_change_start_key_frames(small):
    dm = deltaconv.convert(small)
    a, b = frames_of(2, (32, 48))
    assert rel_err(dm(a), small(a)) < 1e-5
    c, d = frames_of(2, (40, 56))  # new resolution
    assert rel_err(dm(c), small(c)) < 1e-5 and dm.stats()[0]["density"] == 1.0
    assert rel_err(dm(d), small(d)) < 1e-5
    batch = torch.cat([c, d])  # new batch size
    assert rel_err(dm(batch), small(batch)) < 1e-5
    dm.double()  # new dtype (model and frames)
    dense64 = copy.deepcopy(small).double()
    assert rel_err(dm(batch.double()), dense64(batch.double())) < 1e-10
    assert rel_err(dm(torch.cat([d, c]).double()), dense64(torch.cat([d, c]).double())) < 1e-10


def test_streams_are_independent_and_reset_one(small):
    a = frames_of(6, (32, 48), "vtest.avi")
    b = frames_of(6, (32, 48), "one-by-one-person-detection.mp4")
    batch_model = deltaconv.convert(small, threshold=0.05)
    solo = [deltaconv.convert(small, threshold=0.05) for _ in range(2)]
    for t in range(6):
        if t == 3:
            batch_model.reset(streams=[1])
            solo[1].reset()
        y = batch_model(torch.cat([a[t], b[t]]))
        for i, f in enumerate((a[t], b[t])):
            torch.testing.assert_close(y[i:i + 1], solo[i](f), rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match=r"streams must be batch indices in \[0, 2\), got \[2\]"):
        batch_model.reset(streams=[2])


def test_reset_one_stream_is_a_key_frame_for_it_only(small):
    a = frames_of(3, (32, 48))
    dm = deltaconv.convert(small)
    dm(torch.cat([a[0], a[0]]))
    dm(torch.cat([a[1], a[1]]))
    dm.reset(streams=[0])
    y = dm(torch.cat([a[2], a[2]]))
    dense = small(a[2])
    assert rel_err(y[:1], dense) < 1e-5 and rel_err(y[1:], dense) < 1e-5
    sparsifier = dm.delta_layers()[0]
    assert sparsifier.stats()["density"] > 0.5  # stream 0 sent everything


# ----------------------------------------------------------------------------- long videos
@pytest.mark.parametrize("dtype, truncation", [(torch.float32, "max"), (torch.float16, "max"), (torch.float32, "rms")],
                         ids=["float32", "float16", "float32-rms"])
def test_error_bounded_over_1000_frames(small, dtype, truncation):
    """With thresholds > 0 the error vs dense does not drift: after 1,000 frames it is as small as
    that of a model restarted 200 frames before the end (same thresholds, same frames). In float16
    the ``sent`` states hold float16 values, like the dense model's outputs."""
    small = small.to(dtype)
    frames = [f.to(dtype) for f in video_frames(1000, (24, 40), "one-by-one-person-detection.mp4")]
    long_run = deltaconv.convert(small, threshold=0.03, example_input=frames[0], truncation=truncation)
    restarted = deltaconv.convert(small, threshold=0.03, example_input=frames[0], truncation=truncation)
    long_err, fresh_err, densities = [], [], []
    for t, f in enumerate(frames):
        dense = small(f)
        long_err.append(rel_err(long_run(f), dense))
        densities.append(long_run.stats()[0]["density"])
        if t >= 800:
            fresh_err.append(rel_err(restarted(f), dense))
    sent_dtypes = {b.dtype for layer in long_run.delta_layers() for n, b in layer.named_buffers() if "sent" in n}
    assert sent_dtypes == {dtype}
    long_last = sum(long_err[-100:]) / 100
    fresh_last = sum(fresh_err[-100:]) / 100
    assert long_last < 1.5 * fresh_last + 1e-3, (long_last, fresh_last)
    assert max(long_err) < 0.05, max(long_err)  # never far from the dense result
    assert sum(densities[1:]) / (len(densities) - 1) < 0.5  # sparsity really appears


def test_refresh_every_forces_key_frames(small):
    frames = frames_of(7)
    dm = deltaconv.convert(small, threshold=0.1, refresh_every=3)
    full = []
    for f in frames:
        dm(f)
        full.append(dm.stats()[0]["density"] == 1.0)
    assert full == [True, False, False, True, False, False, True]
    with pytest.raises(ValueError, match="refresh_every must be a positive int, 'auto' or None, got 0"):
        deltaconv.convert(small, refresh_every=0)


def test_auto_refresh_follows_the_frames_dtype(small, monkeypatch):
    """refresh_every="auto" (the default): periodic key frames for float16 / bfloat16 frames
    (deltaconv.model.AUTO_REFRESH) and for float32 frames on a GPU with TF32 convolutions
    (AUTO_REFRESH_TF32), none for exact float32; an int or None applies to every dtype."""
    from deltaconv import model as model_module
    dm = deltaconv.convert(small)
    assert dm.refresh_every == "auto"
    assert dm.refresh_interval(torch.float16) == 1000 and dm.refresh_interval(torch.bfloat16) == 1000
    assert dm.refresh_interval(torch.float32) is None
    assert deltaconv.convert(small, refresh_every=7).refresh_interval(torch.float32) == 7
    # float32 frames on a GPU whose convolutions run in TF32 (PyTorch's default) drift as float16's
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert dm.refresh_interval(torch.float32, torch.device("cuda", 0)) == model_module.AUTO_REFRESH_TF32 == 1000
    assert dm.refresh_interval(torch.float32, "cpu") is None and dm.refresh_interval(torch.float64, "cuda") is None
    assert deltaconv.convert(small, refresh_every=None).refresh_interval(torch.float32, "cuda") is None
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert dm.refresh_interval(torch.float32, "cuda") is None
    assert deltaconv.convert(small, refresh_every=None).refresh_interval(torch.float16) is None
    monkeypatch.setitem(model_module.AUTO_REFRESH, torch.float16, 3)
    for dtype, expected in ((torch.float16, [True, False, False, True, False, False, True]),
                            (torch.float32, [True] + [False] * 6)):
        half = copy.deepcopy(small).to(dtype)
        dm = deltaconv.convert(half, threshold=0.1, example_input=frames_of(1)[0].to(dtype))
        full = []
        for f in frames_of(7):
            dm(f.to(dtype))
            full.append(dm.stats()[0]["density"] == 1.0)
        assert full == expected, dtype


def test_refresh_key_frames_keep_the_statistics_going(small):
    """A periodic key frame restarts the state, not the statistics: the means since reset_stats()
    cover every frame (they covered only the frames since the last refresh, so a window that ended on
    a refresh read a density of 1)."""
    frames = frames_of(8)
    dm = deltaconv.convert(small, threshold=0.1, refresh_every=3)
    dm(frames[0])
    dm.reset_stats()
    per_frame = []
    for f in frames[1:]:
        dm(f)
        per_frame.append(dm.stats()[0]["density"])
    first = dm.stats()[0]
    assert first["frames"] == 7 and per_frame[2] == 1.0 and per_frame[5] == 1.0
    assert first["mean_density"] == pytest.approx(sum(per_frame) / 7)
    assert first["mean_density"] < 1.0


def _live_tensor_bytes() -> int:
    gc.collect()
    return sum(o.numel() * o.element_size() for o in gc.get_objects()
               if isinstance(o, torch.Tensor) and not o.is_meta)


def test_no_memory_growth_over_frames(small):
    frames = frames_of(60)
    dm = deltaconv.convert(small, threshold=0.02)
    for f in frames[:10]:
        dm(f)
    before, state_before = _live_tensor_bytes(), dm.state_bytes()
    for f in frames[10:]:
        dm(f)
    after = _live_tensor_bytes()
    assert dm.state_bytes() == state_before
    assert after - before <= 64 * 1024, (before, after)


# ----------------------------------------------------------------------------- copies, devices, modes
def test_deepcopy_state_dict_and_to_mid_stream(small):
    frames = frames_of(6)
    dm = deltaconv.convert(small, threshold=0.05)
    for f in frames[:3]:
        dm(f)
    twin = copy.deepcopy(dm)
    for f in frames[3:]:
        torch.testing.assert_close(twin(f), dm(f), rtol=0, atol=0)
    buf = io.BytesIO()
    torch.save(dm.state_dict(), buf)
    fresh = deltaconv.convert(SmallNet().eval())
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    assert rel_err(fresh(frames[0]), small(frames[0])) < 1e-5
    fresh.to(torch.float64)
    assert rel_err(fresh(frames[1].double()), copy.deepcopy(small).double()(frames[1].double())) < 1e-10


def test_inference_mode_switch_mid_stream(small):
    frames = frames_of(5)
    dm = deltaconv.convert(small)
    with torch.inference_mode():
        dm(frames[0])
        dm(frames[1])
    assert rel_err(dm(frames[2]), small(frames[2])) < 1e-5
    with torch.inference_mode():
        assert rel_err(dm(frames[3]), small(frames[3])) < 1e-5
    assert rel_err(dm(frames[4]), small(frames[4])) < 1e-5


# ----------------------------------------------------------------------------- threads, failures
class Slow(nn.Module):
    """A leaf without a delta rule (so a fallback) that can sleep or fail on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.sleep = 0.0
        self.fail = False

    def forward(self, x):
        if self.fail:
            raise RuntimeError("CUDA out of memory (simulated)")
        time.sleep(self.sleep)
        return x * 2


class WithSlow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.slow = Slow()

    def forward(self, x):
        return self.slow(F.relu(self.conv(x)))


def test_concurrent_use_fails_loudly():
    model = WithSlow().eval()
    dm = deltaconv.convert(model, leaf_modules=(Slow,))
    assert [n.target for n in dm.report.fallbacks] == ["Slow:slow"]
    frames = frames_of(2)
    dm(frames[0])
    dm.get_submodule("slow_fallback").fn.sleep = 0.5
    errors = []

    def run():
        try:
            dm(frames[1])
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join()
    assert len(errors) == 1 and "another thread" in errors[0] and "deepcopy" in errors[0]


def test_failure_mid_frame_leaves_model_usable():
    model = WithSlow().eval()
    dm = deltaconv.convert(model, leaf_modules=(Slow,))
    frames = frames_of(4)
    dm(frames[0])
    slow = dm.get_submodule("slow_fallback").fn
    slow.fail = True
    with pytest.raises(RuntimeError, match="out of memory"):
        dm(frames[1])
    slow.fail = False
    assert rel_err(dm(frames[2]), model(frames[2])) < 1e-5  # automatic key frame
    dm.reset()
    assert rel_err(dm(frames[3]), model(frames[3])) < 1e-5


def _cuda_kernels_reason() -> str:
    from helpers import cuda_backend_reason
    return cuda_backend_reason()


def _take_all_cuda_memory(fillers: list) -> None:
    """Allocate until the caching allocator (capped by set_per_process_memory_fraction) is full,
    holes in its cached segments included, so the next allocation of any size fails."""
    size = 1 << 30
    while size >= 512:
        try:
            fillers.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            size //= 2


@pytest.mark.gpu
@pytest.mark.skipif(bool(_cuda_kernels_reason()), reason=_cuda_kernels_reason() or "ok")
def test_real_cuda_out_of_memory_mid_frame_then_reset():
    """A real CUDA OOM in the middle of a delta frame (after the first conv ran, the memory is
    taken, so the allocations of the next layer's kernels fail) raises torch.OutOfMemoryError;
    with the memory back, the next frame (a key frame) and a frame after ``reset()`` equal dense."""
    torch.manual_seed(0)
    model = SmallNet().eval().cuda().to(memory_format=torch.channels_last)
    dm = deltaconv.convert(model, backend="cuda")
    frames = [f.cuda() for f in frames_of(6, size=(240, 320))]
    with torch.no_grad():
        dense = [model(f) for f in frames]
    dm(frames[0])
    dm(frames[1])
    convs = [m for m in dm.modules() if type(m).__name__ == "DCConv2d"]
    assert len(convs) >= 2
    fillers: list = []
    ran = []
    total = torch.cuda.get_device_properties(0).total_memory

    def take_memory(*_):  # returns None: the layer's inputs stay as they are
        ran.append(1)
        _take_all_cuda_memory(fillers)

    hook = convs[1].register_forward_pre_hook(take_memory)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    try:
        # the cap leaves 64 MiB for the layers before the hook; the hook takes the rest
        torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + (64 << 20)) / total)
        with pytest.raises(torch.OutOfMemoryError):
            dm(frames[2])
            torch.cuda.synchronize()
    finally:
        hook.remove()
        fillers.clear()
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert ran == [1]  # the OOM came from inside the frame, after the first conv
    assert rel_err(dm(frames[3]), dense[3]) < 1e-4  # automatic key frame after the failure
    assert rel_err(dm(frames[4]), dense[4]) < 1e-4  # and deltas after it
    dm.reset()
    assert rel_err(dm(frames[5]), dense[5]) < 1e-4


# ----------------------------------------------------------------------------- random networks
_OPS = ["conv3", "conv1", "dwconv", "conv_s2", "bn", "relu", "hardswish", "sigmoid", "maxpool", "avgpool",
        "up_nearest", "up_bilinear", "residual", "concat", "se", "leaky"]


class RandomNet(nn.Module):
    """A chain of supported ops chosen by hypothesis, channels kept small."""

    def __init__(self, ops: list[str], width: int) -> None:
        super().__init__()
        self.ops = ops
        self.layers = nn.ModuleList()
        c = 3
        for op in ops:
            if op in ("conv3", "residual"):
                self.layers.append(nn.Conv2d(c, width, 3, padding=1))
                c = width if op == "conv3" else c
                if op == "residual":
                    self.layers[-1] = nn.Conv2d(c, c, 3, padding=1)
            elif op == "conv1":
                self.layers.append(nn.Conv2d(c, width, 1, bias=False))
                c = width
            elif op == "dwconv":
                self.layers.append(nn.Conv2d(c, c, 3, padding=2, dilation=2, groups=c))
            elif op == "conv_s2":
                self.layers.append(nn.Conv2d(c, width, 3, stride=2, padding=1))
                c = width
            elif op == "bn":
                bn = nn.BatchNorm2d(c)
                with torch.no_grad():
                    bn.running_mean.uniform_(-0.3, 0.3)
                    bn.running_var.uniform_(0.5, 2.0)
                    bn.weight.uniform_(0.5, 1.5)
                self.layers.append(bn)
            elif op == "concat":
                self.layers.append(nn.Conv2d(c, 2, 1))
                c = c + 2
            elif op == "se":
                self.layers.append(nn.Conv2d(c, c, 1))
            else:
                self.layers.append(nn.Identity())

    def forward(self, x):
        for op, layer in zip(self.ops, self.layers):
            if op in ("conv3", "conv1", "dwconv", "conv_s2", "bn"):
                x = layer(x)
            elif op == "relu":
                x = F.relu(x)
            elif op == "leaky":
                x = F.leaky_relu(x, 0.1)
            elif op == "hardswish":
                x = F.hardswish(x)
            elif op == "sigmoid":
                x = torch.sigmoid(x)
            elif op == "maxpool":
                x = F.max_pool2d(x, 3, 2, 1, ceil_mode=True)
            elif op == "avgpool":
                x = F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False)
            elif op == "up_nearest":
                x = F.interpolate(x, scale_factor=2, mode="nearest")
            elif op == "up_bilinear":
                x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
            elif op == "residual":
                x = x + layer(F.relu(x))
            elif op == "concat":
                x = torch.cat([x, layer(x)], dim=1)
            elif op == "se":
                x = x * torch.sigmoid(layer(F.adaptive_avg_pool2d(x, 1)))
        return x


@pytest.mark.parametrize("device, backend", device_backends())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(_OPS), min_size=1, max_size=7), width=st.integers(1, 6),
       size=st.tuples(st.integers(5, 17), st.integers(5, 17)), batch=st.integers(1, 2),
       fractions=st.lists(st.sampled_from([0.0, 0.02, 0.2, 1.0]), min_size=1, max_size=4),
       seed=st.integers(0, 2**16))
def test_random_networks_equal_dense_at_threshold_0(device, backend, ops, width, size, batch, fractions, seed):
    torch.manual_seed(seed)
    model = RandomNet(ops, width).eval().to(device)
    x = torch.randn(batch, 3, *size)
    dm = deltaconv.convert(model, example_input=x.to(device), backend=backend)
    assert not dm.report.fallbacks, str(dm.report)
    g = torch.Generator().manual_seed(seed)
    for frac in [None] + fractions:
        if frac is not None:
            change = (torch.rand(batch, 1, *size, generator=g) < frac).float()
            x = x + change * torch.randn(batch, 3, *size, generator=g)
        y, ref = dm(x.to(device)), model(x.to(device))
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * (ref.abs().max().item() + 1e-6))


# ----------------------------------------------------------------------------- in-place aliasing
class InplaceAlias(nn.Module):
    """A tensor read after an in-place op mutated it (dense semantics: the reader sees the result)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        h = self.c1(x)
        skip = h
        h = self.relu(h)
        y = self.c2(h)
        y += skip  # reads the ReLU'd tensor, then mutates y in place
        z = y
        y = torch.relu_(y)
        return torch.cat([y, z, skip], dim=1)


def test_inplace_ops_seen_by_later_readers():
    torch.manual_seed(0)
    model = InplaceAlias().eval()
    frames = frames_of(3)
    dm = deltaconv.convert(model)
    for f in frames:
        assert rel_err(dm(f), model(f.clone())) < 1e-5


# ----------------------------------------------------------------------------- calibration files
def test_thresholds_file_with_change_detector_and_reset_stats(small, tmp_path):
    from deltaconv.calibrate import Calibration
    from deltaconv.sparsify import TileEnergy

    frames = frames_of(4)
    probe = deltaconv.convert(small)
    names = list(probe.thresholds())
    cal = Calibration({names[0]: 0.05, names[1]: 0.01}, {"type": "tile"})
    cal.save(tmp_path / "cal.json")
    dm = deltaconv.convert(small, thresholds=tmp_path / "cal.json")
    assert dm.thresholds()[names[0]] == 0.05 and dm.thresholds()[names[1]] == 0.01
    assert isinstance(dm.delta_layers()[0].change_detector, TileEnergy)
    twin = deltaconv.convert(small, thresholds=cal)
    assert twin.delta_layers()[0].change_detector is not dm.delta_layers()[0].change_detector
    for f in frames:
        dm(f)
    assert dm.stats()[0]["frames"] == 4
    dm.reset_stats()
    assert dm.stats()[0]["frames"] == 0
    dm(frames[0])
    assert dm.stats()[0]["frames"] == 1 and dm.stats()[0]["density"] < 1.0  # state kept: not a key frame


class SharedConvBN(nn.Module):
    """One conv called twice with a different BN after each; one BN shared by two convs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn_a, self.bn_b, self.bn_shared = nn.BatchNorm2d(4), nn.BatchNorm2d(4), nn.BatchNorm2d(4)
        self.c1, self.c2 = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)
        for bn in (self.bn_a, self.bn_b, self.bn_shared):
            with torch.no_grad():
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.3, 0.3)

    def forward(self, x):
        a = self.bn_a(self.conv(x))
        b = self.bn_b(self.conv(x * 0.5))
        return self.bn_shared(self.c1(a)) + self.bn_shared(self.c2(b))


def test_shared_conv_and_shared_bn_are_not_folded_wrongly():
    torch.manual_seed(0)
    model = SharedConvBN().eval()
    frames = frames_of(3)
    dm = deltaconv.convert(model)
    assert not [n for n in dm.report.nodes if n.status == "folded"]
    for f in frames:
        assert rel_err(dm(f), model(f)) < 1e-5
    dm.double()
    dense64 = copy.deepcopy(model).double()
    assert rel_err(dm(frames[0].double()), dense64(frames[0].double())) < 1e-10


def test_stats_counts_and_record_stats_switch(small):
    frames = frames_of(3)
    dm = deltaconv.convert(small, threshold=0.02)
    for f in frames:
        dm(f)
    sparsifier = dm.stats()[0]
    last_sent = dm.delta_layers()[0]._stats[0].item()  # active input pixels of the last frame
    assert sparsifier["density"] == pytest.approx(last_sent / (32 * 48))
    conv = next(s for s in dm.stats() if s["kind"] == "conv2d")
    assert conv["flops_done"] == pytest.approx(conv["density"] * conv["flops_dense"])
    assert 0 < conv["mean_density"] <= 1 and conv["frames"] == 3
    dm.record_stats = False
    before = dm.stats()
    dm(frames[0])
    assert not dm.record_stats
    assert [s["density"] for s in dm.stats()] == pytest.approx([s["density"] for s in before], nan_ok=True)


def test_stats_of_a_layer_called_twice_per_frame():
    """Counts are deferred to the end of the frame and batched; a stateless layer that runs twice
    in a frame (one conv serving two call sites) keeps statistics per call: the first call's in the
    layer's entry, the second's in ``<name>#2``, each with its own last count and running sum."""
    torch.manual_seed(0)
    model = SharedConvBN().eval()
    dm = deltaconv.convert(model, threshold=0.02)
    shared = [m for m in dm.delta_layers() if m.kind == "conv2d" and m.in_channels == 3]
    assert len(shared) == 1
    counts = []
    shared[0].register_forward_hook(lambda mod, args, out: counts.append(int(out.mask.sum())))
    for f in frames_of(3):
        dm(f)
    assert len(counts) == 6
    first, second = shared[0]._stats, shared[0]._later_calls[0].counts
    assert first[0].item() == counts[-2] and first[1].item() == sum(counts[0::2])
    assert second[0].item() == counts[-1] and second[1].item() == sum(counts[1::2])
    assert first[2:].abs().sum().item() == 0 and second[2:].abs().sum().item() == 0
    names = [d["name"] for d in dm.stats()]
    name = shared[0].layer_name
    assert names.count(name) == 1 and names.index(name + "#2") == names.index(name) + 1


class TwoScales(nn.Module):
    """One conv applied at two resolutions (as detection heads apply theirs at every pyramid level)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        return self.conv(x).mean((2, 3)) + self.conv(self.pool(x)).mean((2, 3))


def test_a_conv_shared_across_resolutions_counts_each_call_at_its_size():
    """Each call of a shared conv has its own densities (at most 1) and dense FLOPs (the second call
    on a quarter of the pixels), so the model's FLOPs-weighted density stays a fraction; before,
    the two calls were summed against the last one's size (mean density about 5)."""
    torch.manual_seed(0)
    model = TwoScales().eval()
    frames = frames_of(4)
    dm = deltaconv.convert(model, threshold=0.02, example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            dm(f)
    stats = {d["name"]: d for d in dm.stats()}
    first, second = stats["conv"], stats["conv#2"]
    assert second["flops_dense"] == first["flops_dense"] / 4
    for d in (first, second):
        assert 0 < d["mean_density"] <= 1 and d["frames"] == 4
    assert 0 < deltaconv.fidelity.flops_density(dm.stats()) <= 1
    dm.reset_stats()
    assert all(math.isnan(d["mean_density"]) for d in dm.stats() if d["name"].startswith("conv"))


# ----------------------------------------------------------------------------- functional conv / linear
class StandardizedConv(nn.Conv2d):
    """A conv with weight standardisation: calls F.conv2d with a weight computed from its parameter."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class FunctionalNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ws = StandardizedConv(3, 6, 3, padding=1, groups=3)
        self.head_w = nn.Parameter(torch.randn(5, 6) * 0.3)
        self.head_b = nn.Parameter(torch.randn(5))

    def forward(self, x):
        y = F.relu(self.ws(x))
        y = torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)
        return F.linear(y, self.head_w, self.head_b)


@pytest.mark.parametrize("make", [FunctionalNet, lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1)],
                         ids=["custom-modules", "bare-conv"])
def test_functional_conv_and_linear_have_delta_rules(make):
    torch.manual_seed(0)
    model = make().eval()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 32, 48), strict=True)
    assert {"DCFunctionalConv2d"} <= {n.dc_class for n in dm.report.nodes}
    for f in frames_of(3):
        assert rel_err(dm(f), model(f)) < 1e-5


# ----------------------------------------------------------------------------- recorded frames
class _CountingGraph:
    """Stands in for a torch.cuda.CUDAGraph on the CPU: counts replays."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def _with_fake_graph(dm, frame):
    """Give ``dm`` a recorded frame of its current settings whose replay only counts (CPU)."""
    from deltaconv.model import _CapturedFrame
    fake = _CountingGraph()
    dm._graph = _CapturedFrame(fake, (torch.empty_like(frame),), torch.zeros(1), dm._settings())
    return fake


@pytest.mark.parametrize("change", ["none", "threshold", "set_threshold_all", "load_thresholds", "truncation",
                                    "change_detector", "record_stats", "backend", "same_threshold"])
def test_recorded_frame_is_dropped_when_settings_change(small, change):
    """A recorded frame replays only with the settings its kernels were given: a changed threshold,
    measure, change detector, statistics switch or backend drops it, that frame runs eagerly (and
    on CUDA records a new one), while setting a value to what it was keeps the recording."""
    frames = frames_of(4)
    dm = deltaconv.convert(small, threshold=0.01, example_input=frames[0])
    dm(frames[0])
    dm(frames[1])
    fake = _with_fake_graph(dm, frames[2])
    relu = next(layer.layer_name for layer in dm.delta_layers() if layer.truncates and layer.kind != "sparsify")
    if change == "threshold":
        dm.get_submodule(relu).threshold = 0.02
    elif change == "set_threshold_all":
        dm.set_threshold_all(0.05)
    elif change == "load_thresholds":
        dm.load_thresholds({relu: 0.3})
    elif change == "truncation":
        dm.truncation = "rms"
    elif change == "change_detector":
        dm.delta_layers()[0].change_detector = deltaconv.sparsify.BoxBlur(5)
    elif change == "record_stats":
        dm.record_stats = False
    elif change == "backend":
        dm.backend = "reference"
    elif change == "same_threshold":
        dm.set_threshold_all(0.01)
    out = dm(frames[2])
    kept = change in ("none", "same_threshold")
    assert fake.replays == int(kept)
    assert (dm._graph is not None) == kept
    assert dm._recapture == (not kept)  # the next delta frame on CUDA records again
    if not kept:
        assert out.shape == (1, 4, 32, 48)  # this frame ran eagerly


def _with_fake_key_graph(dm, frame):
    """Give ``dm`` a recorded key frame of its current settings whose replay only counts (CPU)."""
    from deltaconv.model import _CapturedFrame
    fake = _CountingGraph()
    dm._key_graph = _CapturedFrame(fake, (torch.empty_like(frame),), torch.ones(1), dm._settings())
    return fake


def test_key_frames_of_every_stream_replay_the_recorded_key_frame(small):
    """With a recorded key frame, a periodic key frame replays it without zeroing the state eagerly
    (the recording zeroes it), and so does the key frame after reset(); a key frame of one stream
    only runs eagerly; a change of settings drops both recordings."""
    frames = [torch.cat([a, b]) for a, b in zip(frames_of(9), frames_of(9, name="one-by-one-person-detection.mp4"))]
    dm = deltaconv.convert(small, threshold=0.01, example_input=frames[0], refresh_every=3)
    dm(frames[0])
    dm(frames[1])
    delta, key = _with_fake_graph(dm, frames[2]), _with_fake_key_graph(dm, frames[2])
    zeroed = []
    for layer in dm.delta_layers():
        reset_state = layer.reset_state
        layer.reset_state = lambda *a, _reset=reset_state, **k: (zeroed.append(1), _reset(*a, **k))[1]
    dm(frames[2])  # a delta frame: replays the delta recording
    assert (delta.replays, key.replays, dm.frames_since_key) == (1, 0, 3)
    out = dm(frames[3])  # the periodic key frame (every 3): replays the key recording
    assert (delta.replays, key.replays, dm.frames_since_key, zeroed) == (1, 1, 1, [])
    assert torch.equal(out, torch.ones(1)) and dm._pending_key is None
    dm(frames[4])
    dm.reset()  # every stream: the next frame replays the key recording (reset() zeroed eagerly)
    dm(frames[5])
    assert (delta.replays, key.replays, dm.frames_since_key) == (2, 2, 1)
    dm.reset(streams=[1])  # a key frame of one stream of the two runs eagerly
    out = dm(frames[6])
    assert (delta.replays, key.replays, out.shape) == (2, 2, (2, 4, 32, 48))
    dm.set_threshold_all(0.05)  # a change of settings drops both recordings
    dm(frames[7])
    assert dm._graph is None and dm._key_graph is None and (delta.replays, key.replays) == (2, 2)


def test_recorded_frame_is_dropped_when_leaving_inference_mode(small):
    """State made under torch.inference_mode is copied when frames run outside it; a recording that
    reads and writes the old buffers is dropped first."""
    frames = frames_of(4)
    dm = deltaconv.convert(small, threshold=0.01, example_input=frames[0])
    with torch.inference_mode():
        dm(frames[0])
        dm(frames[1])
        fake = _with_fake_graph(dm, frames[2])
        dm(frames[2])
    assert fake.replays == 1
    fake = _with_fake_graph(dm, frames[3])
    assert rel_err(dm(frames[3]), small(frames[3])) < 0.05
    assert fake.replays == 0 and dm._graph is None
