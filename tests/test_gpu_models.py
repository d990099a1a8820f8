"""Whole converted models on the GPU: the CUDA backend at threshold 0 equals dense (fp32), stays
within the dense model's own rounding in fp16/bf16, and CUDA-graph replay gives eager outputs."""
from __future__ import annotations

import functools

import pytest
import torch

import deltaconv
from helpers import (cuda_backend_reason, cuda_kernel_names, is_tf32, main_output, torchvision_model as build,
                     video_frames, without_kept_outputs)

REASON = cuda_backend_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=REASON or "ok")]

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf",
          "shufflenet_v2_x1_0", "densenet121", "squeezenet1_1", "vgg11_bn", "deeplabv3_mobilenet_v3_large",
          "lraspp_mobilenet_v3_large", "convnext_tiny", "resnext50_32x4d"]


def rel(a, b) -> float:
    a, b = main_output(a).double(), main_output(b).double()
    return ((a - b).norm() / b.norm()).item()


def eager_and_graphed(model, example, **kw):
    """``model`` converted twice on the CUDA backend at threshold 0.02 (``kw`` to both): run eagerly,
    and replayed as a CUDA graph (``check_finite`` off)."""
    convert = functools.partial(deltaconv.convert, model, threshold=0.02, backend="cuda", example_input=example, **kw)
    return convert(), convert(cuda_graph=True, check_finite=False)


@pytest.mark.parametrize("name", MODELS)
def test_cuda_backend_equals_dense_fp32(name):
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(name).cuda()
    frames = [f.cuda() for f in video_frames(4, (96, 128))]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            assert rel(dm(f), model(f)) <= 1e-4
    assert dm.stats()[0]["density"] < 1.0


@pytest.mark.parametrize("truncation", ["max", "rms", "pooled", "hybrid"])
@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
def test_cuda_backend_equals_reference_with_thresholds(name, truncation):
    """At thresholds > 0 (every measure, and the hybrid of pooled and rms) the CUDA kernels make the reference
    backend's decisions: the outputs over video agree far below the truncation error itself."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(name).cuda()
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    t = 0.02 if truncation == "max" else 0.005
    cuda = deltaconv.convert(model, threshold=t, truncation=truncation, backend="cuda", example_input=frames[0])
    ref = deltaconv.convert(model, threshold=t, truncation=truncation, backend="reference", example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            dense, a, b = model(f), cuda(f), ref(f)
            assert rel(a, b) <= 0.1 * max(rel(b, dense), 1e-5)
    assert any(0 < s["mean_density"] < 1 for s in cuda.stats() if s["kind"] == "activation")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", MODELS)
def test_half_precision_within_dense_rounding(name, dtype):
    torch.backends.cudnn.allow_tf32 = False
    model = build(name).cuda()
    frames = [f.cuda() for f in video_frames(4, (96, 128))]
    low = build(name).cuda().to(dtype)
    dm = deltaconv.convert(low, backend="cuda", example_input=frames[0].to(dtype))
    with torch.no_grad():
        for f in frames:
            ref = model(f)
            dense_err = rel(low(f.to(dtype)), ref)
            delta_err = rel(dm(f.to(dtype)), ref)
            assert delta_err <= 3 * dense_err + 1e-3, (dense_err, delta_err)


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "regnet_y_400mf", "fcn_resnet50"])
def test_float32_in_tf32_within_the_dense_tf32_rounding(name, monkeypatch):
    """With TF32 allowed (``torch.backends.cudnn.allow_tf32``, PyTorch's default) a float32 model's
    one-group convolutions run on the tensor cores in TF32: against the float64 dense model its error
    at threshold 0 stays near the dense TF32 model's own, a replayed graph gives the eager outputs
    bit for bit, and its key frames come every AUTO_REFRESH_TF32 frames."""
    import copy
    from deltaconv.model import AUTO_REFRESH_TF32
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    model = build(name).cuda()
    exact = copy.deepcopy(model).double()
    frames = [f.cuda() for f in video_frames(4, (96, 128), "one-by-one-person-detection.mp4", start=200)]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    graphed = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], cuda_graph=True,
                                check_finite=False)
    eager = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0])
    with torch.no_grad():
        for t, f in enumerate(frames):
            ref = exact(f.double())
            dense_err, delta_err = rel(model(f), ref), rel(dm(f), ref)
            assert delta_err <= 3 * dense_err + 2e-3, (t, dense_err, delta_err)
            torch.testing.assert_close(graphed(f), eager(f), rtol=0, atol=0, msg=f"frame {t}")
        names = cuda_kernel_names(lambda: dm(frames[0]))
    assert any("conv_gather_tc_kernel<float" in n for n in names), names
    assert dm.refresh_interval(torch.float32, frames[0].device) == AUTO_REFRESH_TF32


# model: the kinds of layer that must send TF32 changes (max pooling: resnet18's stem; the
# squeeze-excite product: mobilenet_v3_small; the per-pixel layer norm: convnext_tiny)
TF32_SENDERS = {"resnet18": {"sparsify", "activation", "max_pool2d"}, "mobilenet_v2": {"sparsify", "activation"},
                "mobilenet_v3_small": {"sparsify", "activation", "mul"},
                "convnext_tiny": {"sparsify", "activation", "layer_norm"}}


@pytest.mark.parametrize("name", sorted(TF32_SENDERS))
def test_float32_senders_send_tf32_to_the_convolutions(name, monkeypatch):
    """In TF32 the layers that keep a ``sent`` state (activations, max pooling, products, layer norms
    and the input sparsifier) send their changes rounded to TF32 (``sends_tf32``: TF32 values,
    ``Delta.tf32``) and the convolutions reading them take them as they are (``input_tf32``): the
    converted model stays as close to the float64 model as with every convolution rounding its input
    itself (``DELTACONV_TF32_SENDS=0``), at thresholds 0 and 0.02; in float16 nothing is flagged."""
    import copy
    from deltaconv.modules import DCConv2d
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    model = build(name).cuda()
    exact = copy.deepcopy(model).double()
    frames = [f.cuda() for f in video_frames(6, (96, 128), "one-by-one-person-detection.mp4", start=200)]
    senders, reads = set(), [0]

    def sent_hook(layer, args, out):
        if isinstance(out, deltaconv.Delta) and out.tf32:
            sel = out.mask.expand_as(out.value)
            assert is_tf32(out.value[sel]), layer.layer_name
            senders.add(layer.kind)

    def read_hook(layer, args):
        reads[0] += bool(args[0].tf32)

    def watch(dm):
        for layer in dm.modules():
            if getattr(layer, "truncates", False):
                layer.register_forward_hook(sent_hook)
            if type(layer) is DCConv2d:
                layer.register_forward_pre_hook(read_hook)
        return dm

    errors = {}
    for sends in ("1", "0"):
        monkeypatch.setenv("DELTACONV_TF32_SENDS", sends)
        senders.clear()
        reads[0] = 0
        for threshold in (0.0, 0.02):
            dm = watch(deltaconv.convert(model, threshold=threshold, backend="cuda", example_input=frames[0]))
            with torch.no_grad():
                errors[sends, threshold] = max(rel(dm(f), exact(f.double())) for f in frames)
        if sends == "1":
            assert TF32_SENDERS[name] <= senders and reads[0] > 0, (senders, reads)
        else:
            assert not senders and reads[0] == 0, (senders, reads)
    for threshold in (0.0, 0.02):
        assert errors["1", threshold] <= 1.5 * errors["0", threshold] + 1e-3, errors
    half = watch(deltaconv.convert(copy.deepcopy(model).half(), backend="cuda", example_input=frames[0].half()))
    with torch.no_grad():
        for f in frames[:2]:
            half(f.half())
    assert not senders and reads[0] == 0


class _ComputedWeightConv(torch.nn.Module):
    """A conv whose weight arrives per call (``F.conv2d`` with a computed weight: DCFunctionalConv2d)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.w = torch.nn.Parameter(weight.clone())

    def forward(self, x):
        return torch.nn.functional.conv2d(torch.relu(self.stem(x)), self.w * 1.0, padding=1)


def test_a_float32_conv_with_a_computed_weight_rounds_it_to_tf32(monkeypatch):
    """In TF32 a conv whose weight arrives per call rounds it to nearest on each call (the tensor
    cores would truncate it): it equals, bit for bit, the same conv given that weight rounded first."""
    from deltaconv.modules.folding import round_to_tf32
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    torch.manual_seed(0)
    w = torch.randn(32, 16, 3, 3) / 12
    model = _ComputedWeightConv(w).cuda().eval()
    rounded = _ComputedWeightConv(round_to_tf32(w)).cuda().eval()
    rounded.stem.load_state_dict(model.stem.state_dict())
    assert not torch.equal(rounded.w, model.w)
    frames = [f.cuda() for f in video_frames(3, (48, 64), "one-by-one-person-detection.mp4", start=200)]
    dms = [deltaconv.convert(m, backend="cuda", example_input=frames[0]) for m in (model, rounded)]
    assert {"DCFunctionalConv2d"} <= {n.dc_class for n in dms[0].report.nodes}
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(dms[0](f), dms[1](f), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["regnet_y_400mf", "resnext50_32x4d"])
def test_grouped_convs_run_block_diagonal_on_the_tensor_cores(name, dtype, monkeypatch):
    """Grouped 3x3 convolutions within the limits run as one group with a block-diagonal weight
    (``DCConv2d.kernel_groups``; float32 in TF32): the same outputs as the grouped kernel to the
    dtype's rounding at threshold 0, and a replayed graph gives the eager outputs bit for bit at 0.02."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    model = build(name).cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(6, (288, 512), "one-by-one-person-detection.mp4", start=200)]
    block = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    grouped = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    for layer in grouped.modules():
        if isinstance(layer, deltaconv.DCConv2d):
            layer.block_diagonal_ok = False
    convs = [m for m in block.modules() if isinstance(m, deltaconv.DCConv2d) and m.groups > 1]
    pixels = {}
    for m in convs:
        m.register_forward_hook(lambda mod, args, out: pixels.__setitem__(mod, out.value[:, 0].numel()))
    with torch.no_grad():
        block(frames[0])
    ran = [m.kernel_groups(pixels[m]) == 1 for m in convs]
    assert any(ran) and not all(ran), ran  # the 288x512 frames' first stages run block-diagonal, not the rest
    assert ran == [1 < m.groups <= 32 and m.in_channels <= 512 and pixels[m] >= 4096 for m in convs], ran
    assert [m._folded._value[0].shape[1] == m.in_channels for m in convs] == ran  # the weight the frame used
    eager, graphed = eager_and_graphed(model, frames[0])
    with torch.no_grad():
        for t, f in enumerate(frames):
            a, b = block(f), grouped(f)
            assert rel(a, b) <= (5e-2 if dtype == torch.bfloat16 else 1e-2), (t, rel(a, b))
            torch.testing.assert_close(graphed(f), eager(f), rtol=0, atol=0, msg=f"frame {t}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_odd_output_channels_pad_their_filters_once(dtype):
    """A convolution with output channels not a multiple of 8 (a segmentation classifier, a
    squeeze-excite reduction) keeps its filters padded with zeros beside its fold
    (``padded_out_channels``) instead of the op padding them on every call: its output has its own
    channels, equals the op's own padding's to the dtype's rounding and dense at threshold 0, and a
    replayed graph gives the eager outputs bit for bit."""
    import torch.nn as nn
    from helpers import randomize_bn
    torch.manual_seed(0)
    model = randomize_bn(nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 21, 3, padding=1),
                                       nn.BatchNorm2d(21), nn.ReLU(), nn.Conv2d(21, 5, 1))).eval().cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(5, (96, 128), "one-by-one-person-detection.mp4", start=200)]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    graphed = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], cuda_graph=True,
                                check_finite=False)
    eager = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0])
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    with torch.no_grad():
        for t, f in enumerate(frames):
            y, r = dm(f), model(f)
            assert y.shape == r.shape and rel(y, r) <= tol, (t, rel(y, r))
            torch.testing.assert_close(graphed(f), eager(f), rtol=0, atol=0, msg=f"frame {t}")
    w, b = dm.get_submodule("2")._folded._value
    assert w.shape[0] == 24 and not w[21:].any() and not b[21:].any()
    assert dm.get_submodule("5")._folded._value[0].shape[0] == 5  # 21 input channels: not padded


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_graph_replay_equals_eager_over_video(dtype):
    model = build("mobilenet_v3_large").cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(12, (96, 128))]
    eager, graphed = eager_and_graphed(model, frames[0])
    with torch.no_grad():
        for t, f in enumerate(frames):
            ye, yg = eager(f), graphed(f)
            torch.testing.assert_close(yg, ye, rtol=0, atol=0, msg=f"frame {t}")
    assert graphed._graph is not None
    e_stats, g_stats = eager.stats(), graphed.stats()
    assert [s["mean_density"] for s in g_stats] == pytest.approx([s["mean_density"] for s in e_stats], nan_ok=True)
    graphed.reset()  # a key frame runs eagerly, then replay resumes
    eager.reset()
    with torch.no_grad():
        for f in frames[:3]:
            torch.testing.assert_close(graphed(f), eager(f), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", ["mobilenet_v3_large", "resnet18"])
def test_key_frames_of_every_stream_replay_their_own_graph(name, dtype):
    """With refresh_every=4 the first periodic key frame after the delta frame's graph runs eagerly
    and records a graph of a key frame; the later periodic key frames, and the key frame after a
    reset() of every stream, replay it. Outputs and statistics equal an eager model's bit for bit."""
    model = build(name).cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(14, (96, 128))]
    eager, graphed = eager_and_graphed(model, frames[0], refresh_every=4)
    eager_runs = []
    run_eager = graphed._run_eager
    graphed._run_eager = lambda f: (eager_runs.append(graphed.frames_since_key), run_eager(f))[1]
    key_graphs = []
    with torch.no_grad():
        for t, f in enumerate(frames):
            torch.testing.assert_close(main_output(graphed(f)), main_output(eager(f)), rtol=0, atol=0,
                                       msg=f"frame {t}")
            key_graphs.append(graphed._key_graph)
        # frame 0: the first key frame; 1: records the delta graph; 4: the first periodic key frame
        # records the key graph; 8 and 12 replay it
        assert len(eager_runs) == 3, eager_runs
        assert key_graphs[3] is None and key_graphs[4] is not None
        assert all(g is key_graphs[4] for g in key_graphs[4:])
        e_stats, g_stats = eager.stats(), graphed.stats()
        assert [s["mean_density"] for s in g_stats] == pytest.approx([s["mean_density"] for s in e_stats],
                                                                     nan_ok=True)
        graphed.reset()
        eager.reset()
        for f in frames[:3]:
            torch.testing.assert_close(main_output(graphed(f)), main_output(eager(f)), rtol=0, atol=0)
        assert len(eager_runs) == 3 and graphed.frames_since_key == 3


def test_key_frame_graph_owns_its_key_flags():
    """The key-frame graph reads every stream's key flag from a tensor made before its capture; it
    holds it, so memory the allocator hands out between the capture (frame 4) and the replays
    (frames 8 and 12), here filled with zeros, does not change what a replayed key frame computes
    (it did, once in about 30 runs of the suite, while that tensor was freed after the capture)."""
    model = build("resnet18").cuda()
    frames = [f.cuda() for f in video_frames(13, (96, 128))]
    eager, graphed = eager_and_graphed(model, frames[0], refresh_every=4)
    with torch.no_grad():
        for t, f in enumerate(frames):
            if t == 5:  # the small blocks free now, the key flags' among them if they were freed
                torch.cuda.empty_cache()  # only segments with a live block keep free blocks
                zeros = [torch.zeros(1, dtype=torch.bool, device="cuda") for _ in range(20000)]
            torch.testing.assert_close(graphed(f), eager(f), rtol=0, atol=0, msg=f"frame {t}")
    assert graphed._key_graph is not None and len(zeros) == 20000


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_large", "lraspp_mobilenet_v3_large"])
def test_programmatic_launch_equals_plain_launch(name, monkeypatch):
    """Kernels that may start before the previous one has finished (programmatic dependent launch,
    opt-in with DELTACONV_PDL=1, Hopper and newer) give bit-equal outputs to plain launches
    (DELTACONV_PDL=0), eager and replayed from a CUDA graph: convs, pooling, adds, products,
    interpolation and the input sparsifier all wait for their inputs."""
    model = build(name).cuda().half()
    frames = [f.cuda().half() for f in video_frames(8, (96, 128))]
    outs = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("DELTACONV_PDL", pdl)
        runs = {"eager": deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0]),
                "graph": deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0],
                                           cuda_graph=True, check_finite=False)}
        with torch.no_grad():
            for mode, dm in runs.items():
                outs[pdl, mode] = [main_output(dm(f)).clone() for f in frames]
        assert runs["graph"]._graph is not None
    for key in [("1", "graph"), ("0", "eager"), ("0", "graph")]:
        for t, (y, ref) in enumerate(zip(outs[key], outs["1", "eager"])):
            torch.testing.assert_close(y, ref, rtol=0, atol=0, msg=f"{key} frame {t}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_fused_residual_add_equals_separate_layers(name, dtype):
    """The residual adds fused into the ReLU after them (convert's default, one add_activation
    kernel each) give bit-equal outputs and the same per-layer densities as the add and activation
    kernels run one after the other (fuse=False), eager and replayed from a CUDA graph. (In value mode
    a bottleneck's add takes whole operands, fused in the ReLU, ``DCConv2d.keeps_output``, or separate,
    ``DCAdd.keeps_sum``: kept in delta mode here, tests/test_recompute.py covers both.)"""
    model = build(name).cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(8, (96, 128))]
    runs = {"plain": deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], fuse=False),
            "fused": deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0]),
            "fused_graph": deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0],
                                             cuda_graph=True, check_finite=False)}
    assert runs["fused"].report.fused and not runs["plain"].report.fused
    for dm in runs.values():
        without_kept_outputs(dm)
    outs = {}
    with torch.no_grad():
        for mode, dm in runs.items():
            outs[mode] = [dm(f).clone() for f in frames]
    for mode in ("fused", "fused_graph"):
        for t, (y, ref) in enumerate(zip(outs[mode], outs["plain"])):
            torch.testing.assert_close(y, ref, rtol=0, atol=0, msg=f"{mode} frame {t}")
        densities = [s["mean_density"] for s in runs[mode].stats()]
        assert densities == pytest.approx([s["mean_density"] for s in runs["plain"].stats()], nan_ok=True)
    with torch.no_grad():
        names = cuda_kernel_names(lambda: runs["fused"](frames[0]))
    if names:  # none recorded under compute-sanitizer
        assert any("activation_kernel" in k and "true, false>" in k for k in names), names
        assert not any("add_kernel" in k for k in names), names


def _resnet18_with_prelus() -> torch.nn.Module:
    """resnet18 with each ReLU a PReLU of one slope per channel, as benchmarks/experiments/prelu_ab.py times it
    (``with_per_channel_prelus``): after its convolutions (value mode) and after its residual adds (fused)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "experiments" / "prelu_ab.py"
    spec = importlib.util.spec_from_file_location("prelu_ab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.with_per_channel_prelus(build("resnet18"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_per_channel_prelu_runs_on_the_kernels(dtype):
    """Per-channel PReLUs (resnet18 with one for each ReLU) convert with no fallback and run on the activation
    kernels (none of torch's prelu kernels in a frame; every one with the kind fixed at compile time, value mode
    after the convolutions in float16, delta mode in the fused residual adds): at threshold 0 equal to the dense
    model (float32) or within the dense model's own rounding (float16), and at 0.02 replayed as a CUDA graph
    equal to eager."""
    torch.backends.cudnn.allow_tf32 = False
    model = _resnet18_with_prelus().cuda()
    frames = [f.cuda() for f in video_frames(6, (96, 128))]
    low = _resnet18_with_prelus().cuda().to(dtype)
    dm = deltaconv.convert(low, backend="cuda", example_input=frames[0].to(dtype))
    assert not dm.report.fallbacks
    kinds = [layer.fn.kind for layer in dm.delta_layers() if isinstance(layer, deltaconv.DCActivation)]
    assert kinds == ["prelu"] * 17  # the stem's and two per block
    with torch.no_grad():
        for f in frames:
            ref = model(f)
            if dtype == torch.float32:
                assert rel(dm(f), ref) <= 1e-4
            else:
                assert rel(dm(f.to(dtype)), ref) <= 3 * rel(low(f.to(dtype)), ref) + 1e-3
        names = cuda_kernel_names(lambda: dm(frames[1].to(dtype)))
    if names:  # none recorded under compute-sanitizer
        assert any("activation_kernel" in k for k in names) and not any("prelu" in k.lower() for k in names), names
        if dtype == torch.float16:  # after the convolutions in value mode: PReLU fixed at compile time (kind 11)
            assert any("activation_kernel" in k and ", 11, false, true>" in k for k in names), names
        # every activation kernel has the kind fixed (the fused residual adds' delta mode too): the switching
        # kernel (kind -1) reads no slopes
        assert all(", 11, " in k for k in names if "activation_kernel" in k), names
        assert any("activation_kernel" in k and ", 11, true, false>" in k for k in names), names
    eager, graphed = eager_and_graphed(low, frames[0].to(dtype))
    with torch.no_grad():
        for t, f in enumerate(frames):
            torch.testing.assert_close(graphed(f.to(dtype)), eager(f.to(dtype)), rtol=0, atol=0, msg=f"frame {t}")
    assert any(0 < s["mean_density"] < 1 for s in eager.stats() if s["kind"] == "activation")


def test_cuda_graph_follows_changed_settings():
    """Settings changed mid-stream reach a replayed model as they reach an eager one: after a change
    of thresholds, of the truncation measure, of the input's change detector or of the statistics
    switch, the model records its frame again, and its outputs stay bit-equal to eager ones."""
    from deltaconv.sparsify import BoxBlur
    model = build("resnet18").cuda().half()
    frames = [f.cuda().half() for f in video_frames(14, (96, 128))]
    runs = [deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], check_finite=False,
                              cuda_graph=graph) for graph in (False, True)]
    relu = next(layer.layer_name for layer in runs[0].delta_layers() if layer.kind == "activation")
    changes = {3: lambda dm: dm.set_threshold_all(0.1),
               5: lambda dm: setattr(dm, "truncation", "rms"),
               7: lambda dm: dm.load_thresholds({relu: 0.0}),
               9: lambda dm: setattr(dm.delta_layers()[0], "change_detector", BoxBlur(3)),
               11: lambda dm: setattr(dm, "record_stats", False),
               12: lambda dm: setattr(dm, "truncation", "rms")}  # what it is: the recording stays
    recorded = []
    with torch.no_grad():
        for t, f in enumerate(frames):
            for dm in runs:
                changes.get(t, lambda dm: None)(dm)
            eager, graphed = runs[0](f), runs[1](f)
            torch.testing.assert_close(graphed, eager, rtol=0, atol=0, msg=f"frame {t}")
            if not recorded or recorded[-1] is not runs[1]._graph:
                recorded.append(runs[1]._graph)
    assert len(recorded) == 7  # None at the key frame, then recorded at frames 1, 3, 5, 7, 9 and 11
    assert recorded[0] is None and all(g is not None for g in recorded[1:])
    e_stats, g_stats = runs[0].stats(), runs[1].stats()
    assert [s["mean_density"] for s in g_stats] == pytest.approx([s["mean_density"] for s in e_stats], nan_ok=True)


def test_cuda_graph_across_inference_mode():
    """Frames under torch.inference_mode, then outside it, then a reset: a replayed model gives an
    eager one's outputs bit for bit (its state is copied out of inference mode and recorded again)."""
    model = build("resnet18").cuda().half()
    frames = [f.cuda().half() for f in video_frames(8, (64, 96))]
    runs = [deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], check_finite=False,
                              cuda_graph=graph) for graph in (False, True)]
    for t, f in enumerate(frames):
        if t == 5:
            for dm in runs:
                dm.reset()
        with torch.inference_mode(t < 3):
            eager, graphed = runs[0](f), runs[1](f)
        torch.testing.assert_close(graphed, eager, rtol=0, atol=0, msg=f"frame {t}")
    assert runs[1]._graph is not None


def test_graphed_model_keeps_its_model_alive():
    """The dense baseline of the demo and the benchmarks, deltaconv.cuda_graphs.graphed_model, holds
    the model it recorded: with every other reference dropped and the freed memory reused, replays
    still give the eager outputs (a graph reads the parameters where they were when recorded)."""
    import copy
    import gc

    from deltaconv.cuda_graphs import graphed_model
    model = build("resnet18").cuda()
    frames = [f.cuda() for f in video_frames(3, (64, 96))]
    with torch.no_grad():
        want = [model(f) for f in frames]
        run = graphed_model(copy.deepcopy(model), frames[0])
        gc.collect()
        junk = [torch.full((1 << 18,), float("nan"), device="cuda") for _ in range(256)]  # reuses freed blocks
        for f, w in zip(frames, want):
            torch.testing.assert_close(run(f), w, rtol=1e-4, atol=1e-4)
    del junk


def test_capture_one_line():
    model = build("resnet18").cuda()
    frames = [f.cuda() for f in video_frames(5, (64, 96))]
    dm = deltaconv.convert(model, backend="cuda", check_finite=False)
    with torch.no_grad():
        dm(frames[0])
        dm.capture(frames[1])
        for f in frames[2:]:
            assert rel(dm(f), model(f)) <= 1e-4


def test_torch_compile_of_converted_model_runs():
    model = build("resnet18").cuda()
    frames = [f.cuda() for f in video_frames(3, (64, 96))]
    dm = deltaconv.convert(model, backend="cuda", check_finite=False)
    compiled = torch.compile(dm._runner, fullgraph=False)
    with torch.no_grad():
        dm(frames[0])
        dm._context.ops = deltaconv.backends.select("cuda", frames[1].device)
        y = compiled(frames[1])
        assert rel(y, model(frames[1])) <= 1e-4


def test_frame_zeroes_the_convolutions_work_counters_once():
    """Within a DeltaModel frame every convolution counts its work list in the model's
    WorkCounters (one slice per conv call, all zeroed by one kernel per frame): no per-conv
    counter-clearing kernel runs, eager or replayed, while a conv called on its own still clears
    its own (so the profiler would see them)."""
    from deltaconv.modules import DCConv2d
    model = build("resnet18").cuda().half()
    frames = [f.cuda().half() for f in video_frames(4, (64, 96))]
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())

    x = torch.zeros(1, 64, 16, 16, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    m = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="cuda")
    w = torch.zeros(64, 64, 3, 3, device="cuda", dtype=torch.half)
    alone = cuda_kernel_names(lambda: torch.ops.deltaconv.conv2d(x, m, w, None, [1, 1], [1, 1], [1, 1], 1, None))
    if not alone:
        pytest.skip("the CUDA profiler recorded no kernel (CUPTI unavailable, e.g. under compute-sanitizer)")
    assert any("clear_counters" in n for n in alone), alone
    for cuda_graph in (False, True):
        dm = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0],
                               cuda_graph=cuda_graph, check_finite=False)
        with torch.no_grad():
            dm(frames[0])
            dm(frames[1])  # captures when cuda_graph
            names = cuda_kernel_names(lambda: dm(frames[2]))
        assert any("conv" in n for n in names), names
        assert not any("clear_counters" in n for n in names), cuda_graph
        assert dm._context.work_counters.taken == convs
        assert sum(isinstance(m, DCConv2d) for m in dm.modules()) == convs


def test_float32_fallbacks_send_tf32(monkeypatch):
    """A dense fallback (``torch.cumsum``, which has no delta rule) in TF32 re-sparsifies its output
    with the changes rounded to TF32, as the other layers with a ``sent`` state do, the convolution
    after it reads them as they are, and the model stays within TF32's error of the float64 one."""
    import copy
    from deltaconv.modules import DCConv2d, DCFallback

    class Cumsum(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 3)

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setenv("DELTACONV_TF32_SENDS", "1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), Cumsum(), torch.nn.Conv2d(16, 8, 1))
    model = model.cuda().eval()
    exact = copy.deepcopy(model).double()
    frames = [f.cuda() for f in video_frames(4, (48, 64), "one-by-one-person-detection.mp4", start=200)]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    sent, read = [], []
    fallbacks = [m for m in dm.modules() if isinstance(m, DCFallback)]
    assert len(fallbacks) == 1
    fallbacks[0].register_forward_hook(lambda layer, args, out: sent.append(
        out.tf32 and is_tf32(out.value[out.mask.expand_as(out.value)])))
    for m in dm.modules():
        if type(m) is DCConv2d:  # the stem reads the sparsifier's changes, the head the fallback's
            m.register_forward_pre_hook(lambda layer, args: read.append(args[0].tf32))
    with torch.no_grad():
        errors = [rel(dm(f), exact(f.double())) for f in frames]
    assert sent == [True] * 4 and read == [True] * 8, (sent, read)
    assert max(errors) < 1e-2, errors
