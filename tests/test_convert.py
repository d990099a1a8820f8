"""convert(): the report, fallbacks and strict mode, the original model left untouched, BatchNorm
folding, shared modules, state_dict compatibility, stats(), reset() and error messages."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import deltaconv
from deltaconv import DCActivation, DCAdd, DCConv2d, DCFallback, DCMaxPool2d, activations
from deltaconv.modules import DCModule, DCResample
from deltaconv.modules.linear import DeferredSum
from deltaconv.report import STATUSES
from helpers import (FRACTIONS, HAS_CUDA, changing_frames, compare_over_frames, device_backends, make_unet, max_rel_err,
                     randomize_bn, video_frames)

TOL = 1e-4
SIZE = (64, 96)


@pytest.fixture(scope="module")
def frames():
    return video_frames(4, SIZE)


def resnet18(seed=0):
    torch.manual_seed(seed)
    return randomize_bn(torchvision.models.resnet18(weights=None), seed).eval()


class WithFallback(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.InstanceNorm2d(4)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        y = torch.cumsum(self.conv(x), dim=3)
        return self.head(torch.relu(self.norm(y)))


# ----------------------------------------------------------------------------- report
def test_report_lists_every_node(frames):
    model = resnet18()
    dm = deltaconv.convert(model, example_input=frames[0])
    traced = fx.symbolic_trace(copy.deepcopy(model))
    names = [n.name for n in traced.graph.nodes if n.op != "output"]
    reported = [n.node for n in dm.report.nodes]
    for name in names:
        assert name in reported, name
    text = str(dm.report)
    for n in dm.report.nodes:
        assert n.node in text and n.status in STATUSES
        if n.status in ("converted", "fallback", "input", "output"):
            assert n.layer and n.dc_class, n
    counts = dm.report.counts()
    assert sum(counts.values()) == len(dm.report.nodes)
    assert f"{len(dm.report.nodes)} nodes" in text
    assert counts["input"] == 1 and counts["output"] == 1 and counts["folded"] == 20
    assert "fallback" not in counts and "fallbacks:" not in text
    # every layer named in the report exists in the converted model, with the reported class
    for n in dm.report.nodes:
        if n.layer and n.status != "folded":
            assert type(dm.get_submodule(n.layer)).__name__ == n.dc_class, n


def test_fallbacks_are_named_and_still_exact(frames):
    model = WithFallback().eval()
    dm = deltaconv.convert(model, example_input=frames[0])
    fb = {n.node: n for n in dm.report.fallbacks}
    assert set(fb) == {"cumsum", "norm"}, str(dm.report)
    assert fb["norm"].target == "InstanceNorm2d:norm"
    for n in fb.values():
        assert isinstance(dm.get_submodule(n.layer), DCFallback)
    text = str(dm.report)
    assert "fallbacks: " in text and "cumsum" in text.split("fallbacks: ")[1] and "norm" in text.split("fallbacks: ")[1]
    with torch.no_grad():
        for f in frames:
            assert max_rel_err(model(f), dm(f)) <= TOL


def test_strict_raises_conversion_error_naming_the_op(frames):
    with pytest.raises(deltaconv.ConversionError, match="cumsum"):
        deltaconv.convert(WithFallback(), strict=True, example_input=frames[0])
    assert issubclass(deltaconv.ConversionError, Exception)
    dm = deltaconv.convert(resnet18(), strict=True, example_input=frames[0])  # no fallback: fine
    assert not dm.report.fallbacks


def test_original_model_untouched(frames):
    model = resnet18()
    model.train()  # a model in training mode stays in training mode
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    module_types = {k: type(m) for k, m in model.named_modules()}
    model.eval()
    with torch.no_grad():
        before = [model(f) for f in frames]
    model.train()
    dm = deltaconv.convert(model, example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            dm(f)
    assert model.training
    assert {k: type(m) for k, m in model.named_modules()} == module_types
    for k, v in model.state_dict().items():
        assert torch.equal(v, params[k]), k
    for p_dm in dm.parameters():
        assert all(p_dm is not p for p in model.parameters())  # no parameter is shared
    model.eval()
    with torch.no_grad():
        for f, y in zip(frames, before):
            assert torch.equal(model(f), y)


def test_batchnorm_folded(frames):
    dm = deltaconv.convert(resnet18(), example_input=frames[0])
    folded = [n for n in dm.report.nodes if n.status == "folded"]
    assert len(folded) == 20 and all(n.target.startswith("BatchNorm2d:") for n in folded)
    assert {n.target for n in folded} >= {"BatchNorm2d:bn1", "BatchNorm2d:layer1.0.bn1", "BatchNorm2d:layer4.1.bn2",
                                          "BatchNorm2d:layer2.0.downsample.1"}
    conv1 = dm.get_submodule("conv1")
    assert isinstance(conv1, DCConv2d) and conv1.folded_bn is dm.get_submodule("bn1")
    assert [n.status for n in dm.report.nodes if n.node == "conv1"] == ["converted"]
    assert "BatchNorm folded" in [n.note for n in dm.report.nodes if n.node == "conv1"][0]


class _Decoder(torch.nn.Module):
    """Transposed convolutions, each followed by a BatchNorm: one group (folded) and four (kept)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.up = nn.ConvTranspose2d(3, 8, 4, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.up2 = nn.ConvTranspose2d(8, 8, 2, stride=2, groups=4)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn2(self.up2(torch.relu(self.bn(self.up(x)))))


def _random_bn(model):
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen))
    return model.eval()


def test_batchnorm_folded_into_a_transposed_convolution(frames):
    """A BatchNorm after a transposed convolution of one group folds into it (its weight's dim 1 are
    the output channels), one after a grouped one stays a layer; the outputs equal the dense model's
    at threshold 0, as with fold_bn=False; a cast after the conversion rounds the exact fold."""
    from deltaconv.modules import DCBatchNorm2d, DCConvTranspose2d
    from deltaconv.modules.folding import FoldedWeights, round_keeping_sums
    torch.manual_seed(0)
    model = _random_bn(_Decoder()).double()
    xs = [f[..., :24, :32].double() for f in frames[:3]]
    dm = deltaconv.convert(model, example_input=xs[0], threshold=0.0)
    kept = deltaconv.convert(model, example_input=xs[0], threshold=0.0, fold_bn=False)
    folded = [n.target for n in dm.report.nodes if n.status == "folded"]
    assert folded == ["BatchNorm2d:bn"]
    up = dm.get_submodule("up")
    assert isinstance(up, DCConvTranspose2d) and up.folded_bn is dm.get_submodule("bn") and "bn folded" in repr(up)
    assert dm.get_submodule("up2").folded_bn is None
    assert sum(isinstance(m, DCBatchNorm2d) for m in dm.modules()) == 1
    assert sum(isinstance(m, DCBatchNorm2d) for m in kept.modules()) == 2
    with torch.no_grad():
        for x in xs:
            y = model(x)
            torch.testing.assert_close(dm(x), y, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(kept(x), y, rtol=1e-10, atol=1e-10)
    float_model = _random_bn(_Decoder())
    exact_w, exact_b = FoldedWeights.exact(float_model.up.weight, float_model.up.bias, float_model.bn, 1)
    half = deltaconv.convert(float_model, example_input=xs[0].float()).half()
    w, b = half.get_submodule("up").folded_weight_bias()
    assert torch.equal(w, round_keeping_sums(exact_w.float(), torch.float16))
    assert torch.equal(b, exact_b.float().half())
    with pytest.raises(ValueError, match="groups=4"):
        DCConvTranspose2d.from_dense(model.up2, bn=model.bn2)


def test_batchnorm_kept_with_fold_bn_false(frames):
    """fold_bn=False keeps every BatchNorm a layer of its own (a per-channel scale of the delta),
    with the same outputs as the dense model and the same truncating layers as the folded model."""
    from deltaconv.modules import DCBatchNorm2d
    model = resnet18().eval().double()
    dm = deltaconv.convert(model, example_input=frames[0].double(), fold_bn=False)
    folded = deltaconv.convert(model, example_input=frames[0].double())
    assert not [n for n in dm.report.nodes if n.status == "folded"]
    assert sum(isinstance(m, DCBatchNorm2d) for m in dm.modules()) == 20
    assert dm.get_submodule("conv1").folded_bn is None
    assert list(dm.thresholds()) == list(folded.thresholds())
    with torch.no_grad():
        for f in frames[:3]:
            f = f.double()
            torch.testing.assert_close(dm(f), model(f), rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError, match="fold_bn must be a bool or None, got 'no'"):
        deltaconv.convert(model, fold_bn="no")


def test_shared_relu_gets_one_stateful_layer_per_call_site(frames):
    """resnet BasicBlock calls self.relu twice: two DCActivation layers with their own state."""
    model = resnet18()
    dm = deltaconv.convert(model, example_input=frames[0])
    sites = [n for n in dm.report.nodes if n.target == "ReLU:layer1.0.relu"]
    assert len(sites) == 2 and sites[0].layer != sites[1].layer
    a, b = (dm.get_submodule(s.layer) for s in sites)
    assert isinstance(a, DCActivation) and isinstance(b, DCActivation) and a is not b
    with torch.no_grad():
        for f in frames:
            assert max_rel_err(model(f), dm(f)) <= TOL
    assert a.sent.data_ptr() != b.sent.data_ptr() and not torch.equal(a.sent, b.sent)
    # every ReLU call site of the network: 1 stem + 2 per block x 8 blocks
    relus = [layer for layer in dm.delta_layers() if isinstance(layer, DCActivation)]
    assert len(relus) == 17 and len({id(r) for r in relus}) == 17


def test_shared_modules_stateless_and_stateful():
    """A conv used at two call sites serves both (stateless); a max-pool used twice (the U-Net's
    self.pool) gets one instance per site."""
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.pool = nn.MaxPool2d(2)

        def forward(self, x):
            return self.conv(self.pool(self.conv(self.pool(x))))

    model = Shared().eval()
    x = torch.randn(2, 3, 16, 24)
    dm = deltaconv.convert(model, example_input=x)
    convs = [n for n in dm.report.nodes if n.target == "Conv2d:conv"]
    assert len(convs) == 2 and convs[0].layer == convs[1].layer == "conv"
    assert "shared call site" in convs[1].note
    pools = [dm.get_submodule(n.layer) for n in dm.report.nodes if n.target == "MaxPool2d:pool"]
    assert len(pools) == 2 and all(isinstance(p, DCMaxPool2d) for p in pools) and pools[0] is not pools[1]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(4):
            x = x.clone()
            x[:, :, :4] += torch.randn(2, 3, 4, 24, generator=g)
            assert max_rel_err(model(x), dm(x)) <= TOL
    assert pools[0].sent.shape != pools[1].sent.shape  # one state per call site


# ----------------------------------------------------------------------------- state_dict
def test_dense_state_dict_loads_and_changes_outputs(frames):
    model, other = resnet18(0), resnet18(1)
    dm = deltaconv.convert(model, example_input=frames[0])
    assert list(dm.state_dict().keys()) == list(model.state_dict().keys())
    for k, v in dm.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    with torch.no_grad():
        for f in frames[:2]:
            dm(f)
        dm.load_state_dict(other.state_dict())
        dm.reset()
        for f in frames:
            out = dm(f)
            assert max_rel_err(other(f), out) <= TOL
            assert max_rel_err(model(f), out) > 1e-2  # really changed
    # strict loading catches a wrong model
    with pytest.raises(RuntimeError):
        dm.load_state_dict(torchvision.models.resnet34(weights=None).state_dict())


def test_state_dict_keys_unet_and_segmentation():
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large
    for model in (make_unet(), randomize_bn(lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)).eval()):
        dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 64, 96))
        assert list(dm.state_dict().keys()) == list(model.state_dict().keys())


class MadeConstant(nn.Module):
    """A model that makes a tensor in ``forward``: torch.fx stores it on the traced model
    (``_tensor_constant0``) and the graph reads it from there."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x) * torch.tensor([0.1, 2.0, -1.0]).view(1, 3, 1, 1)  # 0.1: not exact in float32


def test_constants_made_in_forward_are_held_and_move_with_the_model(frames):
    torch.manual_seed(0)
    model = MadeConstant().eval()
    # fold_bn=False: the scale stays a layer reading the constant (else it folds into the conv)
    dm = deltaconv.convert(model, example_input=frames[0], fold_bn=False)  # failed: no attribute '_tensor_constant0'
    assert list(dm.state_dict().keys()) == list(model.state_dict().keys())
    assert [name for name, _ in dm.named_buffers()] == ["_tensor_constant0"]
    dm64, model64 = copy.deepcopy(dm).double(), copy.deepcopy(model).double()
    assert dm64._tensor_constant0.dtype == torch.float64
    assert dm64._runner._tensor_constant0 is dm64._tensor_constant0  # the graph reads the cast one
    with torch.no_grad():
        for f in frames:
            assert max_rel_err(model(f), dm(f)) <= TOL
            assert max_rel_err(model64(f.double()), dm64(f.double())) <= 1e-12


# ----------------------------------------------------------------------------- stats
def test_stats_one_dict_per_layer_in_execution_order(frames):
    model = make_unet()
    dm = deltaconv.convert(model, example_input=frames[0])
    order = []
    for layer in dm.delta_layers():
        layer.register_forward_pre_hook(lambda mod, args: order.append(mod.layer_name))
    densities = []
    with torch.no_grad():
        for f in frames:
            order.clear()
            dm(f)
            densities.append(dm.stats()[0]["density"])
    stats = dm.stats()
    assert [s["name"] for s in stats] == list(dict.fromkeys(order))
    assert len(stats) == len(dm.delta_layers())
    assert stats[0]["kind"] == "sparsify" and stats[-1]["kind"] == "densify"
    for s in stats:
        assert {"name", "kind", "density", "mean_density"} <= set(s)
        if s["kind"] != "densify":
            assert 0.0 <= s["density"] <= 1.0 and 0.0 <= s["mean_density"] <= 1.0, s
    assert densities[0] == 1.0 and all(d < 1.0 for d in densities[1:])
    assert stats[0]["mean_density"] == pytest.approx(sum(densities) / len(densities), rel=1e-5)
    kinds = {s["kind"] for s in stats}
    assert {"conv2d", "activation", "max_pool2d", "conv_transpose2d", "cat", "upsample"} <= kinds


# ----------------------------------------------------------------------------- reset
@pytest.mark.parametrize("device,backend", device_backends())
def test_reset_makes_a_key_frame(frames, device, backend):
    model = make_unet().to(device)
    fr = [f.to(device) for f in frames]
    dm = deltaconv.convert(model, backend=backend, example_input=fr[0])
    with torch.no_grad():
        for f in fr:
            dm(f)
        dm.reset()
        for f in (fr[0], fr[2]):  # a jump back in time, then forward: exact only after a key frame
            out = dm(f)
            assert max_rel_err(model(f), out) <= TOL
        assert dm.stats()[0]["frames"] == 2  # stats restarted with the reset
    # without reset, a jump is still exact (deltas are differences), just less sparse
    with torch.no_grad():
        assert max_rel_err(model(fr[3]), dm(fr[3])) <= TOL


@pytest.mark.parametrize("device,backend", device_backends())
def test_reset_one_stream_leaves_the_other_intact(device, backend):
    model = make_unet().to(device)
    a = [f.to(device) for f in video_frames(5, SIZE, "vtest.avi")]
    b = [f.to(device) for f in video_frames(5, SIZE, "one-by-one-person-detection.mp4")]
    dm = deltaconv.convert(model, backend=backend, example_input=a[0])
    twin = copy.deepcopy(dm)
    with torch.no_grad():
        for i in range(3):
            batch = torch.cat([a[i], b[i]])
            dm(batch)
            twin(batch)
        dm.reset(streams=[1])
        masks = {}
        for name, net in (("dm", dm), ("twin", twin)):
            net.get_submodule(net.stats()[0]["name"]).register_forward_hook(
                lambda mod, args, out, _n=name: masks.__setitem__(_n, out.mask.clone()))
        # stream 1 jumps to another video: only exact if it restarted from a key frame
        batch = torch.cat([a[3], a[0]])
        out, ref = dm(batch), model(batch)
        assert max_rel_err(ref, out) <= TOL
        twin_out = twin(batch)
        # stream 0 is exactly what it would have been without the reset; stream 1 is a key frame
        assert torch.equal(out[0], twin_out[0])
        assert torch.equal(masks["dm"][0], masks["twin"][0]) and masks["dm"][0].float().mean() < 1
        assert masks["dm"][1].all()
        out = dm(torch.cat([a[4], a[1]]))
        assert max_rel_err(model(torch.cat([a[4], a[1]])), out) <= TOL
    with pytest.raises(IndexError, match="2"):
        dm.reset(streams=[2])


# ----------------------------------------------------------------------------- errors
def test_bad_backend_names_argument_and_value():
    with pytest.raises(ValueError, match=r"backend.*'gpu'"):
        deltaconv.convert(make_unet(), backend="gpu", example_input=torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("value", [-1, -0.5, "0.1", None])
def test_bad_threshold_names_argument_and_value(value):
    with pytest.raises((ValueError, TypeError), match=rf"threshold.*{value!r}"):
        deltaconv.convert(make_unet(), threshold=value, example_input=torch.randn(1, 3, 32, 32))


def test_backend_cuda_on_cpu_frames_is_refused_with_reason():
    dm = deltaconv.convert(make_unet(), backend="cuda", example_input=torch.randn(1, 3, 32, 32))
    with pytest.raises(RuntimeError, match=r"backend='cuda'.*cpu"):
        dm(torch.randn(1, 3, 32, 32))
    # the refusal left the model usable: another backend runs the same frames exactly
    dm.backend = "reference"
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert max_rel_err(make_unet()(x), dm(x)) <= TOL


def test_not_a_module_is_refused():
    with pytest.raises(TypeError, match="model"):
        deltaconv.convert(lambda x: x)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("make", [make_unet, MadeConstant], ids=["unet", "made_constant"])
def test_converted_model_moves_to_cuda(frames, make):
    """Converted on the CPU, then moved; a constant the traced forward made moves too (the graph
    read the CPU one before: a device mismatch)."""
    torch.manual_seed(0)
    model = make().eval()
    dm = deltaconv.convert(model, example_input=frames[0]).to("cuda")
    with torch.no_grad():
        for f in frames:  # the dense model stays on the CPU: MadeConstant's forward makes a CPU tensor
            assert max_rel_err(model(f), dm(f.to("cuda")).cpu()) <= TOL


# ----------------------------------------------------------------------------- fusion
def _fused_pairs(dm) -> set:
    return {(n.layer, n.note.split("fused with ")[1]) for n in dm.report.fused}


def test_residual_add_fused_with_the_relu_after_it(frames):
    """resnet18: each block's ``relu(out + identity)`` runs as one layer pass (DCAdd.fuse_with_next),
    with the same outputs, statistics, layer names and thresholds as with fuse=False."""
    model = resnet18()
    runs = {}
    for fuse in (True, False):
        dm = deltaconv.convert(model, threshold=0.05, fuse=fuse, example_input=frames[0])
        with torch.no_grad():
            runs[fuse] = (dm, [dm(f) for f in frames])
    fused, plain = runs[True][0], runs[False][0]
    adds = [layer for layer in fused.delta_layers() if isinstance(layer, DCAdd)]
    assert len(adds) == 8 and all(a.fuse_with_next for a in adds)
    assert not any(a.fuse_with_next for a in plain.delta_layers() if isinstance(a, DCAdd))
    pairs = _fused_pairs(fused)
    assert ("layer1.0.add", "layer1.0.relu_1") in pairs and ("layer1.0.relu_1", "layer1.0.add") in pairs
    assert len(pairs) == 16 and not plain.report.fused
    for a, b in zip(runs[True][1], runs[False][1]):
        assert torch.equal(a, b)
    assert fused.thresholds() == plain.thresholds()
    sf, sp = fused.stats(), plain.stats()
    assert [s["name"] for s in sf] == [s["name"] for s in sp]
    for a, b in zip(sf, sp):  # the fused add still counts its own output pixels
        assert a["mean_density"] == pytest.approx(b["mean_density"], nan_ok=True), a["name"]
    assert any(0 < s["mean_density"] < 1 for s in sf if s["kind"] == "add")


class AddReadTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        s = self.a(x) + self.b(x)
        return torch.relu(s), s * 2.0


class AddBroadcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        return torch.relu(y + y.mean(dim=(2, 3), keepdim=True))


@pytest.mark.parametrize("model", [AddReadTwice(), AddBroadcast()], ids=["read_twice", "broadcast"])
def test_add_not_fused_where_another_layer_reads_it_or_it_broadcasts(model, frames):
    dm = deltaconv.convert(model.eval(), example_input=frames[0])
    assert not dm.report.fused
    assert not any(getattr(layer, "fuse_with_next", False) for layer in dm.delta_layers())
    with torch.no_grad():
        for f in frames:
            y, r = dm(f), model(f)
            y, r = (y, r) if isinstance(r, tuple) else ((y,), (r,))
            for a, b in zip(y, r):
                assert max_rel_err(b, a) <= TOL


def test_deferred_sum_read_by_another_layer_is_computed_then(frames):
    """A fused add's output read by something other than its activation (a layer called by hand)
    is computed on first read, once, and counted in the add's statistics."""
    dm = deltaconv.convert(resnet18(), fuse=True, example_input=frames[0])
    add = next(layer for layer in dm.delta_layers() if isinstance(layer, DCAdd))
    a = deltaconv.Delta(torch.randn(1, 4, 5, 6), torch.rand(1, 1, 5, 6) > 0.5)
    b = deltaconv.Delta(torch.randn(1, 4, 5, 6), torch.rand(1, 1, 5, 6) > 0.5)
    s = add(a, b)
    assert isinstance(s, DeferredSum) and s.shape == (1, 4, 5, 6) and s.dtype == torch.float32
    expected = torch.where(a.mask, a.value, 0) + torch.where(b.mask, b.value, 0)
    torch.testing.assert_close(torch.where(s.mask, s.value, 0), expected)
    assert s.materialize() is s.materialize() and not s.fusable
    assert torch.equal(s.mask, a.mask | b.mask)


def test_fuse_argument_checked(frames):
    with pytest.raises(TypeError, match="convert: fuse must be a bool, got 'yes'"):
        deltaconv.convert(resnet18(), fuse="yes", example_input=frames[0])


def test_fused_model_deepcopies_and_pickles(frames):
    import pickle
    dm = deltaconv.convert(resnet18(), threshold=0.02, example_input=frames[0])
    with torch.no_grad():
        dm(frames[0])
        twins = [copy.deepcopy(dm), pickle.loads(pickle.dumps(dm))]
        y = dm(frames[1])
        for twin in twins:
            assert twin.report.fused and all(a.fuse_with_next for a in twin.delta_layers() if isinstance(a, DCAdd))
            torch.testing.assert_close(twin(frames[1]), y, rtol=0, atol=0)


def test_eager_frame_host_path(frames, monkeypatch):
    """The runner calls each layer by one flat attribute (not its dotted path), and an eager delta
    frame's layers write no attribute through nn.Module.__setattr__ (the two largest host costs of a frame,
    benchmarks/results/host_overhead.txt), with the layers, their names and the output unchanged."""
    model = resnet18()
    dm = deltaconv.convert(model, threshold=0.0, example_input=frames[0])
    called = [n.target for n in dm._runner.graph.nodes if n.op == "call_module"]
    assert called and not any("." in t for t in called)
    layers = {id(layer) for layer in dm.delta_layers()}
    assert {id(dm._runner.get_submodule(t)) for t in called} == layers  # the model's own layers, shared
    assert [layer.layer_name for layer in dm.delta_layers()][:2] == ["input", "conv1"]
    with torch.no_grad():
        dm(frames[0])
        dm(frames[1])
        writes = []
        real = nn.Module.__setattr__
        monkeypatch.setattr(nn.Module, "__setattr__",
                            lambda self, k, v: isinstance(self, DCModule) and writes.append(k) or real(self, k, v))
        y = dm(frames[2])
        monkeypatch.undo()
        torch.testing.assert_close(y, model(frames[2]), rtol=1e-4, atol=1e-4)
    assert writes == []
    assert [s["density"] for s in dm.stats()][:1] and dm.stats()[1]["name"] == "conv1"


class EndsInUpsampling(nn.Module):
    """A segmentation-like head: features at 1/2 resolution, then upsampled to the input's size."""

    def __init__(self, module_upsample: bool = False, twice: bool = False):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 5, 1))
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest") if module_upsample else None
        self.twice = twice

    def forward(self, x):
        y = self.body(x)
        if self.twice:
            y = F.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=False)
            y = F.interpolate(y, scale_factor=2.0, mode="nearest")
        up = self.up(y) if self.up is not None else F.interpolate(y, size=x.shape[-2:], mode="bilinear",
                                                                  align_corners=False)
        return {"out": up} if self.twice else {"out": up, "aux": y}


@pytest.mark.parametrize("variant", ["function", "module", "chain"])
def test_output_upsampling_runs_dense_after_the_densifier(variant, frames):
    """A model whose output is an upsampling of a delta (the segmentation models' final
    F.interpolate, nn.Upsample, or a chain of them) densifies the smaller map and resamples it
    dense: same outputs as the dense model and as fuse=False, less state; the report marks the
    nodes ``dense``. A second output (``aux``) reading the upsampling's input does not stop it."""
    model = EndsInUpsampling(module_upsample=variant == "module", twice=variant == "chain").eval()
    fused = deltaconv.convert(model, threshold=0.0, example_input=frames[0])
    plain = deltaconv.convert(model, threshold=0.0, example_input=frames[0], fuse=False)
    dense_nodes = [n for n in fused.report.nodes if n.status == "dense"]
    assert len(dense_nodes) == (3 if variant == "chain" else 1)
    assert all(n.note and n.dc_class == "DCResample" for n in dense_nodes) and "dense" in STATUSES
    assert all(isinstance(fused.get_submodule(n.layer), DCResample) for n in dense_nodes)
    assert not [n for n in plain.report.nodes if n.status == "dense"]
    with torch.no_grad():
        for f in frames:
            want, a, b = model(f), fused(f), plain(f)
            for k in want:
                assert max_rel_err(want[k], a[k]) <= TOL and max_rel_err(want[k], b[k]) <= TOL, k
    assert fused.state_bytes() < plain.state_bytes()
    assert not any(s["kind"] == "upsample" for s in fused.stats())
    assert any(s["kind"] == "upsample" for s in plain.stats())
    y = fused(frames[0])["out"]
    assert y.is_contiguous()  # the dense resampling writes NCHW


class UpsampleReadTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        up = F.interpolate(self.conv(x), scale_factor=2.0, mode="nearest")
        return up, torch.relu(up)


def test_output_upsampling_read_by_a_layer_stays_delta(frames):
    dm = deltaconv.convert(UpsampleReadTwice().eval(), example_input=frames[0])
    assert not [n for n in dm.report.nodes if n.status == "dense"]
    assert any(s["kind"] == "upsample" for s in dm.stats())


class _ChannelSoftmaxes(nn.Module):
    """A head with each spelling of a softmax over the channels, and softmaxes that are not over them."""

    def __init__(self, other: str = "none") -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Conv2d(6, 5, 1)
        self.softmax, self.log_softmax = nn.Softmax(dim=1), nn.LogSoftmax(dim=1)
        self.implicit = nn.Softmax(dim=None)  # torch picks dim 1 for 4-D inputs, with a warning
        self.softmax2d, self.last_three = nn.Softmax2d(), nn.LogSoftmax(dim=-3)
        self.other = other

    def forward(self, x):
        y = self.head(torch.relu(self.conv(x)))
        outs = [self.softmax(y), self.log_softmax(y), F.softmax(y, dim=1), torch.log_softmax(y, 1), y.softmax(1),
                y.log_softmax(dim=1)]
        if self.other != "flat":  # dim -3 or the implicit dim of a 4-D input: its dim 1
            outs += [self.softmax2d(y), self.last_three(y), self.implicit(y), F.softmax(y, -3), y.log_softmax(-3)]
        if self.other == "dims":  # over a spatial dim, with an output dtype: not channels
            outs += [F.softmax(y, dim=-1), torch.softmax(y, 1, dtype=torch.float64)]
        if self.other == "flat":  # a 3-D view [N, C, H * W]: Softmax2d's dim -3 is N there, the implicit dim 0
            flat = y.flatten(2)
            outs += [nn.functional.softmax(flat, dim=1), self.softmax2d(flat), self.implicit(flat)]
        if self.other == "view":  # a channels-last view's softmax over its dim 1 (a spatial dim)
            outs.append(F.linear(y.permute(0, 2, 3, 1), torch.eye(5, dtype=y.dtype)).softmax(1).permute(0, 3, 1, 2))
        return outs


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
def test_softmax_over_channels_is_an_activation():
    """A softmax or log-softmax over dim 1 (nn.Softmax(dim=1), F.softmax, torch.log_softmax, the methods; of a
    4-D input dim -3 too, nn.Softmax2d, and the implicit dim) converts to an activation of kind "softmax" /
    "log_softmax" (a function of each pixel's channels) and equals the dense head at threshold 0 on frames where
    some pixels change (float64, reference backend)."""
    model = _ChannelSoftmaxes().double().eval()
    frames = [f.double() for f in changing_frames((1, 3, 12, 16), FRACTIONS)]
    dm, errors, _ = compare_over_frames(model, frames, threshold=0.0)
    assert not dm.report.fallbacks
    kinds = sorted(layer.fn.kind for layer in dm.delta_layers() if isinstance(layer, DCActivation))
    assert kinds == ["log_softmax"] * 5 + ["relu"] + ["softmax"] * 6
    assert max(errors) < 1e-12


def test_softmax_over_a_classifiers_logits_is_an_activation():
    """A classifier's softmax over its logits ([N, classes]: dim -1 is dim 1 there) converts and equals dense."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 5), nn.Softmax(dim=-1)).double().eval()
    frames = [f.double() for f in changing_frames((1, 3, 12, 16), FRACTIONS)]
    dm, errors, _ = compare_over_frames(model, frames, threshold=0.0)
    assert not dm.report.fallbacks
    assert [layer.fn.kind for layer in dm.delta_layers() if isinstance(layer, DCActivation)] == ["relu", "softmax"]
    assert max(errors) < 1e-12


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
def test_softmax_dim_resolves_as_torch():
    """softmax_dim gives the dim torch normalises: negative dims from the end, the implicit dim as
    torch.nn.functional._get_softmax_dim, and None where the rank is needed but not known."""
    for rank in range(5):
        for dim in [None, *range(-rank, rank)]:
            if dim is None:
                expected = F._get_softmax_dim("softmax", rank, 3)
            else:
                expected = dim % rank
            assert activations.softmax_dim(dim, rank) == expected, (dim, rank)
    assert activations.softmax_dim(1, None) == 1
    assert activations.softmax_dim(-3, None) is None and activations.softmax_dim(None, None) is None
    assert activations.softmax_dim("1", 4) is None


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
def test_softmax_not_over_channels_falls_back():
    """Softmaxes over another dim or with an output dtype stay dense fallbacks, and so do nn.Softmax2d and the
    implicit dim on a 3-D view (dims 0 there; its softmax over dim 1 converts). One over dim 1 of a channels-last
    view (a spatial dim) is not taken into a block run channels-first (deltaconv.layout, where dim 1 would become
    the channels): it converts on the view, where the update mask has one flag per (w, c) column, the vector it
    normalises, and equals the dense model."""
    for other, fallbacks in (("dims", 2), ("view", 0), ("flat", 2)):
        model = _ChannelSoftmaxes(other).double().eval()
        frames = [f.double() for f in changing_frames((1, 3, 12, 16), FRACTIONS)]
        dm, errors, _ = compare_over_frames(model, frames, threshold=0.0)
        assert len(dm.report.fallbacks) == fallbacks, (other, dm.report.fallbacks)
        assert max(errors) < 1e-12, other
