"""The graph passes of ``deltaconv.layout`` and what they feed.

Channels-last blocks kept channels-first and the per-pixel layer norm (``DCLayerNorm``): ConvNeXt
converts without fallbacks, keeps per-pixel masks inside its blocks and its dense state_dict; chains
that are not per-pixel are left alone and stay exact. Channel shuffles through a 5-D view become one
``torch.channel_shuffle`` whose delta keeps its input's mask (ShuffleNet); other views stay as they are.
A concatenation, the shuffle after it and the chunk after that become one ``shuffled_concatenate``
call (``DCShuffledConcatenate``: one pass that writes each chunk contiguous).
"""
from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn as nn
import torch.nn.functional as F

import deltaconv
from deltaconv.backends import reference as ref
from deltaconv.delta import Delta
from deltaconv.layout import fold_channel_shuffles, fold_shuffled_concatenations
from deltaconv.modules import DCFallback, DCLayerNorm, DCLinearFunction, DCPixelLinear, DCShuffledConcatenate
from deltaconv.modules.linear import channel_shuffle, shuffled_concatenate
from helpers import (compare_over_frames, cuda_backend_reason, cuda_kernel_names, randomize_layer_norms,
                     torchvision_model, video_frames)

TOL = 1e-4


class Block(nn.Module):
    """A ConvNeXt block: depthwise 7x7, then LayerNorm, Linear, GELU, Linear on a channels-last view."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1, self.act, self.pw2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c, 1, 1), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(self.act(self.pw1(self.norm(y))))
        return x + self.gamma * y.permute(0, 3, 1, 2)


class LayerNorm2d(nn.LayerNorm):
    """torchvision's LayerNorm2d: ``F.layer_norm`` between two permutes."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Net(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 2, stride=2), LayerNorm2d(c))
        self.block = Block(c)

    def forward(self, x):
        return self.block(self.stem(x))


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_layer_norms(Net()).eval()


def _status(dm) -> dict:
    return {(n.node, n.status): n for n in dm.report.nodes}


def test_block_runs_channels_first_without_fallbacks():
    dm = deltaconv.convert(_net(), example_input=torch.randn(1, 3, 32, 48))
    assert dm.report.fallbacks == []
    assert isinstance(dm.block.norm, DCLayerNorm) and isinstance(dm.stem[1].layer_norm, DCLayerNorm)
    assert isinstance(dm.block.pw1, DCPixelLinear) and isinstance(dm.block.pw2, DCPixelLinear)
    removed = [n for n in dm.report.nodes if n.status == "removed" and "deltaconv.layout" in n.note]
    assert len(removed) == 4  # two permutes per chain


def test_dense_state_dict_loads():
    model = _net()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 32, 48))
    other = _net(seed=1)
    dm.load_state_dict(other.state_dict())  # strict: the dense names all exist
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(dm(x), other(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_block_equals_dense_over_video(threshold):
    model = _net().double()
    frames = [f.double() for f in video_frames(4, (64, 96), "one-by-one-person-detection.mp4", start=40)]
    dm, errors, _ = compare_over_frames(model, frames, threshold=threshold)
    bound = 1e-12 if threshold == 0 else 0.2
    assert max(errors) <= bound, errors
    if threshold > 0:
        assert max(errors) > 1e-12  # the threshold truncates something: the test can fail


def test_masks_stay_per_pixel_inside_the_block():
    """One changed input pixel reaches a 7x7 square of the block's output (the depthwise conv's
    footprint at stride 2), not whole rows or columns of the channels-last view."""
    model = _net().double()
    x = torch.randn(1, 3, 32, 48, dtype=torch.float64)
    dm = deltaconv.convert(model, example_input=x)
    masks = {}
    dm.block.pw2.register_forward_hook(lambda mod, args, out: masks.__setitem__("pw2", out.mask.clone()))
    with torch.no_grad():
        dm(x)
        y = x.clone()
        y[0, :, 10, 20] += 1.0
        dm(y)
    rows, cols = torch.nonzero(masks["pw2"][0, 0], as_tuple=True)
    assert (rows.min().item(), rows.max().item(), cols.min().item(), cols.max().item()) == (2, 8, 7, 13)
    assert int(masks["pw2"].sum()) == 49


def test_chains_that_are_not_per_pixel_are_left_alone():
    """A channels-last view with two readers, or a reduction over a pixel dim inside, keeps its
    permutes (a LayerNorm on it falls back) and the model stays exact."""
    class TwoReaders(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            y = self.conv(x).permute(0, 2, 3, 1)
            z = self.norm(y) + y  # y read twice
            w = self.norm(z).mean(dim=1, keepdim=True)  # a mean over the rows: not per pixel
            return z.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)

    torch.manual_seed(0)
    model = randomize_layer_norms(TwoReaders()).eval().double()
    frames = [f.double() for f in video_frames(3, (24, 32))]
    dm, errors, _ = compare_over_frames(model, frames)
    assert max(errors) <= 1e-12
    assert {n.target for n in dm.report.fallbacks} >= {"LayerNorm:norm"}
    assert not any("deltaconv.layout" in n.note for n in dm.report.nodes)


def test_layer_norm_of_a_flat_vector_runs_per_sample():
    """A LayerNorm (module or F.layer_norm) over the features of ``[N, C]`` converts too."""
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.norm = nn.LayerNorm(16)
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            v = self.conv(x).mean(dim=(2, 3))
            return self.fc(F.layer_norm(self.norm(v), (16,)))

    torch.manual_seed(0)
    model = randomize_layer_norms(Head()).eval().double()
    frames = [f.double() for f in video_frames(3, (24, 32))]
    dm, errors, _ = compare_over_frames(model, frames)
    assert max(errors) <= 1e-12
    assert dm.report.fallbacks == []
    assert sum(isinstance(m, DCLayerNorm) for m in dm.modules()) == 2


def test_a_dense_module_on_constants_stays_dense():
    """A module that reads only constants (Swin V2's position-bias MLP on its coordinate table) is
    not a delta layer: conversion used to fail with "'Linear' object has no attribute 'truncates'"."""
    class ConstantBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.mlp = nn.Linear(2, 4)
            self.register_buffer("table", torch.randn(1, 2))

        def forward(self, x):
            return self.conv(x) + self.mlp(self.table).view(1, 4, 1, 1)

    torch.manual_seed(0)
    model = ConstantBias().eval().double()
    frames = [f.double() for f in video_frames(3, (24, 32))]
    dm, errors, _ = compare_over_frames(model, frames)
    assert max(errors) <= 1e-12
    assert "mlp" not in {layer.layer_name for layer in dm.delta_layers()}


def test_layer_norm_wrong_channels_names_the_layer():
    layer = DCLayerNorm(8)
    layer.layer_name = "block.norm"
    from deltaconv.delta import Delta
    d = Delta(torch.zeros(1, 4, 3, 3), torch.ones(1, 1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"block.norm: expected a delta with 8 channels in dim 1, got shape \(1, 4"):
        layer(d)


def test_reference_layer_norm_keeps_what_it_does_not_send():
    """Below the threshold the change stays pending (sent unchanged, acc updated); once the
    accumulated change crosses it, what is sent makes ``sent`` the layer norm of the whole input."""
    torch.manual_seed(0)
    n, c, h, w = 1, 6, 2, 3
    x0 = torch.randn(n, c, h, w, dtype=torch.float64)
    acc, sent = torch.zeros_like(x0), torch.zeros_like(x0)
    everywhere = torch.ones(n, 1, h, w, dtype=torch.bool)
    ref.layer_norm(x0, everywhere, acc, sent, None, None, 1e-5, 0.0, torch.tensor([True]))
    dense = lambda t: F.layer_norm(t.movedim(1, -1), (c,), eps=1e-5).movedim(-1, 1)  # noqa: E731
    torch.testing.assert_close(sent, dense(x0))
    step = torch.zeros_like(x0)
    step[0, 0, 1, 2] = 0.01
    out, mask = ref.layer_norm(step, everywhere, acc, sent, None, None, 1e-5, 0.1, None)
    assert not mask.any() and torch.equal(sent, dense(x0))
    for _ in range(30):  # the same small step again and again: sent once it has built up
        out, mask = ref.layer_norm(step, everywhere, acc, sent, None, None, 1e-5, 0.1, None)
        if mask.any():
            break
    assert mask.sum() == 1 and bool(mask[0, 0, 1, 2])
    torch.testing.assert_close(sent[0, :, 1, 2], dense(acc)[0, :, 1, 2])
    torch.testing.assert_close(acc, x0 + step * (2 + _))


def test_convnext_converts_without_fallbacks():
    dm = deltaconv.convert(torchvision_model("convnext_tiny"), example_input=torch.randn(1, 3, 64, 96))
    assert dm.report.fallbacks == []
    assert sum(isinstance(m, DCLayerNorm) for m in dm.modules()) == 23
    assert not any(isinstance(m, DCFallback) for m in dm.modules())


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_convnext_on_the_gpu_replays_its_layer_norm_kernel(dtype):
    """ConvNeXt on the CUDA backend: the layer norms run the kernel (``layer_norm_kernel``), the
    pointwise Linears the 1x1 convolutions, a replayed CUDA graph gives the eager outputs bit for
    bit, and at threshold 0 the output is the dense model's to its own rounding."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = torchvision_model("convnext_tiny").cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(8, (96, 128), "one-by-one-person-detection.mp4", start=40)]
    eager = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0])
    graphed = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], cuda_graph=True,
                                check_finite=False)
    exact = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    dense32 = torchvision_model("convnext_tiny").cuda()
    with torch.no_grad():
        for t, f in enumerate(frames):
            torch.testing.assert_close(graphed(f), eager(f), rtol=0, atol=0, msg=f"frame {t}")
            y, r, r32 = exact(f).double(), model(f).double(), dense32(f.float()).double()
            err, dense_err = ((y - r32).norm() / r32.norm()).item(), ((r - r32).norm() / r32.norm()).item()
            assert err <= (1e-4 if dtype == torch.float32 else 3 * dense_err + 1e-3), (t, err, dense_err)
        names = cuda_kernel_names(lambda: exact(frames[-1]))
    if names:
        assert any("layer_norm_kernel" in n for n in names)
    assert graphed._graph is not None


@pytest.mark.parametrize("shape", [(6, 1, 1), (1, 6, 1, 1), (6,), (1, 1, 6), (6, 1, 6)], ids=str)
@pytest.mark.parametrize("divide", [False, True])
def test_scale_by_a_tensor_equals_the_dense_product(shape, divide):
    """``DCScale`` (ConvNeXt's ``layer_scale * x``): a per-channel scale runs as ``affine_channel`` on the
    active pixels; any other broadcast (a ``[C]`` scale broadcasts over the width, here as wide as the
    channels) keeps the plain product. Both equal the dense op where the mask is set."""
    from deltaconv.delta import Delta
    from deltaconv.modules import DCScale
    torch.manual_seed(0)
    value = torch.randn(2, 6, 5, 6, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 6) < 0.5
    s = torch.rand(shape, dtype=torch.float64) + 0.5
    layer = DCScale(divide=divide)
    out = layer(Delta(torch.where(mask, value, torch.nan), mask), s)
    want = value / s if divide else value * s
    assert out.value.shape == want.shape
    sel = out.mask.expand_as(want)
    assert torch.equal(out.mask, mask.expand(out.mask.shape))
    torch.testing.assert_close(out.value[sel], want[sel], rtol=0, atol=0)


def test_a_model_that_rejects_the_example_names_example_input():
    """A model with a fixed input size (torchvision's ViT asserts 224x224) fails on a smaller example:
    ``ConversionError`` naming ``example_input``, its shape and the model's own message."""
    class FixedSize(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            torch._assert(x.shape[-1] == 32, "Wrong image width! Expected 32")
            return self.conv(x)

    with pytest.raises(deltaconv.ConversionError,
                       match=r"FixedSize failed on example_input \(\(1, 3, 16, 24\) float32\).*Wrong image width"):
        deltaconv.convert(FixedSize().eval(), example_input=torch.randn(1, 3, 16, 24))
    dm = deltaconv.convert(FixedSize().eval(), example_input=torch.randn(1, 3, 16, 32))
    assert dm.report.fallbacks == []


# ----------------------------------------------------------------------------- channel shuffles
class Shuffle(nn.Module):
    """torchvision's ShuffleNet block tail: a cat of two branches, then ``channel_shuffle`` written
    with a 5-D view, then a chunk whose halves feed the next convolutions. ``dims`` is what the
    transpose swaps (``(1, 2)`` is a channel shuffle) and ``reader`` reads the transposed view a
    second time when set."""

    def __init__(self, dims=(1, 2), reader: bool = False, contiguous: bool = True) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.c, self.d = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1)
        self.dims, self.reader, self.contiguous = dims, reader, contiguous

    def forward(self, x):
        y = torch.cat((self.a(x), self.b(x)), dim=1)
        n, c, h, w = y.size()
        y = y.view(n, 2, c // 2, h, w)
        t = torch.transpose(y, *self.dims)
        z = (t.contiguous() if self.contiguous else t).reshape(n, c, h, w)
        first, second = z.chunk(2, dim=1)
        out = torch.cat((self.c(first), self.d(second)), dim=1)
        return (out, t.sum()) if self.reader else out


def _targets(dm) -> list:
    return [str(getattr(n.target, "__name__", n.target)) for n in dm._runner.graph.nodes if n.op != "placeholder"]


@pytest.mark.parametrize("contiguous", [True, False])
def test_cat_shuffle_chunk_becomes_one_shuffled_concatenation(contiguous):
    torch.manual_seed(0)
    model = Shuffle(contiguous=contiguous).eval()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 16, 24))
    assert [(m.groups, m.chunks) for m in dm.modules() if isinstance(m, DCShuffledConcatenate)] == [(2, 2)]
    assert not any(isinstance(m, DCLinearFunction) for m in dm.modules())
    targets = _targets(dm)
    assert not {"view", "transpose", "contiguous", "size", "floordiv", "reshape", "chunk", "channel_shuffle"} & set(
        targets), targets
    assert dm.report.fallbacks == []
    replaced = ["cat", "view", "transpose"] + (["contiguous"] if contiguous else []) + ["reshape", "chunk"]
    notes = [n.note for n in dm.report.nodes if "deltaconv.layout" in n.note]
    assert notes == [f"concatenation, channel shuffle and chunk of {', '.join(replaced)} (deltaconv.layout)"], notes


class ShuffleTails(nn.Module):
    """Shuffles after a concatenation, and others: ``kind`` "no-cat" shuffles a convolution's
    output, "cat-read-twice" a concatenation that is also added to the result, "no-chunk" feeds the
    shuffled concatenation to a convolution whole, "module" shuffles with ``nn.ChannelShuffle`` and
    chunks the result."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a, self.b, self.c = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1), nn.Conv2d(8, 4, 1)
        self.shuffle = nn.ChannelShuffle(2)

    def forward(self, x):
        y = torch.cat((self.a(x), self.b(x)), dim=1)
        if self.kind == "module":
            first, second = self.shuffle(y).chunk(2, dim=1)
            return self.c(torch.cat((second, first), 1))
        if self.kind == "no-cat":
            return self.c(F.channel_shuffle(self.c(y).repeat(1, 2, 1, 1), 2))
        z = F.channel_shuffle(y, 2)
        if self.kind == "cat-read-twice":
            return self.c(z + y)
        return self.c(z)


@pytest.mark.parametrize("kind,modules", [("no-cat", {"DCLinearFunction": 2, "DCConcatenate": 1}),
                                          ("cat-read-twice", {"DCLinearFunction": 1, "DCConcatenate": 1}),
                                          ("no-chunk", {"DCShuffledConcatenate": 1}),
                                          ("module", {"DCShuffledConcatenate": 1, "DCConcatenate": 1})])
def test_only_a_concatenation_read_by_its_shuffle_alone_is_folded(kind, modules):
    torch.manual_seed(0)
    model = ShuffleTails(kind).eval().double()
    dm, errors, _ = compare_over_frames(model, [f.double() for f in video_frames(3, (16, 24))])
    assert max(errors) <= 1e-12
    kinds = collections.Counter(type(m).__name__ for m in dm.modules()
                                if isinstance(m, (DCLinearFunction, DCShuffledConcatenate))
                                or type(m).__name__ == "DCConcatenate")
    assert dict(kinds) == modules
    folded = [m for m in dm.modules() if isinstance(m, DCShuffledConcatenate)]
    assert [(m.groups, m.chunks) for m in folded] == {"no-chunk": [(2, None)], "module": [(2, 2)]}.get(kind, [])


@settings(max_examples=25, deadline=None)
@given(channels=st.lists(st.integers(1, 5), min_size=1, max_size=4), groups=st.integers(1, 4),
       chunks=st.sampled_from([None, 1, 2, 3]), frac=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 99))
def test_shuffled_concatenation_of_deltas_equals_the_dense_call(channels, groups, chunks, frac, seed):
    """``DCShuffledConcatenate`` on the reference backend, in any number of deltas, groups and chunks
    (the interleaving op for two of one shape in two groups, else concatenation, shuffle and chunk):
    the dense call's values on the united mask, one mask shared by every output."""
    total = sum(channels)
    if total % groups:
        channels = channels + [groups - total % groups]
    g = torch.Generator().manual_seed(seed)
    deltas = [Delta(torch.randn(2, c, 3, 4, generator=g).contiguous(memory_format=torch.channels_last),
                    torch.rand(2, 1, 3, 4, generator=g) < frac, tf32=seed % 3 != i) for i, c in enumerate(channels)]
    out = DCShuffledConcatenate(groups, chunks)(deltas)
    dense = shuffled_concatenate([torch.where(d.mask, d.value, 0) for d in deltas], groups, chunks)
    outs, dense = ((out,), (dense,)) if chunks is None else (out, dense)
    mask = deltas[0].mask
    for d in deltas[1:]:
        mask = mask | d.mask
    assert len(outs) == len(dense)
    for o, want in zip(outs, dense):
        assert o.mask is outs[0].mask and torch.equal(o.mask, mask)
        assert o.tf32 == all(d.tf32 for d in deltas)  # data movement keeps TF32 values TF32
        assert torch.equal(torch.where(mask, o.value, 0), want)


def test_fold_shuffled_concatenations_keeps_the_dense_graph_exact():
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp
    torch.manual_seed(0)
    model = Shuffle().eval()
    traced = fx.symbolic_trace(model)
    ShapeProp(traced).propagate(torch.randn(1, 3, 8, 10))
    assert fold_channel_shuffles(traced.graph) == 1
    assert fold_shuffled_concatenations(traced.graph) == 1
    assert fold_shuffled_concatenations(traced.graph) == 0  # nothing left to fold
    traced.recompile()
    targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert targets.count(shuffled_concatenate) == 1 and torch.channel_shuffle not in targets
    x = torch.randn(2, 3, 8, 10)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)


def test_shuffled_concatenation_counts_the_elements_of_every_chunk():
    torch.manual_seed(0)
    dm = deltaconv.convert(Shuffle().eval(), example_input=torch.randn(1, 3, 16, 24))
    dm(torch.randn(1, 3, 16, 24))
    entry = next(s for s in dm.stats() if s["kind"] == "cat_shuffle")
    assert entry["elements_dense"] == 8 * 16 * 24 and entry["density"] == 1.0


@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_folded_shuffle_equals_dense_over_video(threshold):
    torch.manual_seed(0)
    model = Shuffle().eval().double()
    frames = [f.double() for f in video_frames(4, (48, 64), "one-by-one-person-detection.mp4", start=40)]
    dm, errors, _ = compare_over_frames(model, frames, threshold=threshold)
    assert max(errors) <= (1e-12 if threshold == 0 else 0.2), errors
    if threshold > 0:
        assert max(errors) > 1e-12  # the threshold truncates something: the test can fail


@pytest.mark.parametrize("model", [Shuffle(dims=(2, 3)), Shuffle(reader=True)], ids=["transpose-2-3", "two-readers"])
def test_views_that_are_not_a_channel_shuffle_are_kept(model):
    torch.manual_seed(0)
    model = model.eval().double()
    dm, errors, _ = compare_over_frames(model, [f.double() for f in video_frames(3, (16, 24))])
    assert max(errors) <= 1e-12
    assert "channel_shuffle" not in _targets(dm) and "view" in _targets(dm)


@settings(max_examples=20, deadline=None)
@given(groups=st.integers(1, 5), per_group=st.integers(1, 4), size=st.tuples(st.integers(1, 5), st.integers(1, 6)),
       split=st.sampled_from(["view", "reshape", "unflatten"]), join=st.sampled_from(["view", "flatten", "reshape"]),
       swap=st.sampled_from([(1, 2), (2, 1), (-3, -4)]))
def test_any_row_major_shuffle_chain_folds_to_the_same_values(groups, per_group, size, split, join, swap):
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp
    c = groups * per_group

    class Net(nn.Module):
        def forward(self, x):
            n, ch, h, w = x.shape
            y = {"view": lambda: x.view(n, groups, ch // groups, h, w),
                 "reshape": lambda: torch.reshape(x, (n, groups, ch // groups, h, w)),
                 "unflatten": lambda: x.unflatten(1, (groups, ch // groups))}[split]()
            y = y.transpose(*swap)
            return {"view": lambda: y.contiguous().view(n, ch, h, w), "flatten": lambda: torch.flatten(y, 1, 2),
                    "reshape": lambda: y.reshape(n, -1, h, w)}[join]() * 2
    traced = fx.symbolic_trace(Net())
    x = torch.randn(2, c, *size)
    ShapeProp(traced).propagate(x)
    assert fold_channel_shuffles(traced.graph) == 1
    traced.recompile()
    assert [n.target for n in traced.graph.nodes if n.op != "placeholder"][:1] == [torch.channel_shuffle]
    torch.testing.assert_close(traced(x), Net()(x), rtol=0, atol=0)


def test_fold_channel_shuffles_counts_chains_and_leaves_shape_reads_others_need():
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    class TwoShuffles(Shuffle):
        def forward(self, x):
            y = super().forward(x)
            n, c, h, w = y.size()
            z = y.view(n, 2, c // 2, h, w).transpose(2, 1).reshape(n, c, h, w)
            return z + h  # h is read after the shuffle: it must stay
    torch.manual_seed(0)
    model = TwoShuffles().eval()
    traced = fx.symbolic_trace(model)
    ShapeProp(traced).propagate(torch.randn(1, 3, 8, 8))
    assert fold_channel_shuffles(traced.graph) == 2
    traced.recompile()
    targets = [getattr(n.target, "__name__", n.target) for n in traced.graph.nodes]
    assert targets.count("channel_shuffle") == 2 and "view" not in targets and "size" in targets
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)


def test_channel_moves_keep_the_mask():
    """A channel shuffle and a chunk along the channels hand on their input's mask (no mask work);
    a chunk along a pixel dim takes the general path (its own masks)."""
    value = torch.randn(2, 6, 5, 7).contiguous(memory_format=torch.channels_last)
    d = Delta(value, torch.rand(2, 1, 5, 7) > 0.5)
    out = DCLinearFunction(torch.channel_shuffle)(d, 3)
    assert out.mask is d.mask and out.value.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out.value, torch.channel_shuffle(value.contiguous(), 3), rtol=0, atol=0)
    halves = DCLinearFunction(torch.Tensor.chunk)(d, 2, 1)
    assert all(h.mask is d.mask for h in halves) and torch.equal(torch.cat([h.value for h in halves], 1), value)
    rows = DCLinearFunction(torch.Tensor.chunk)(d, 2, dim=2)
    assert [tuple(r.mask.shape) for r in rows] == [(2, 1, 3, 7), (2, 1, 2, 7)]
    assert all(r.mask is not d.mask for r in rows)


@pytest.mark.parametrize("shuffle", [nn.PixelShuffle(2), nn.PixelUnshuffle(2), (F.pixel_shuffle, 3),
                                     (F.pixel_unshuffle, 3), (torch.pixel_shuffle, 1)],
                         ids=["PixelShuffle", "PixelUnshuffle", "pixel_shuffle", "pixel_unshuffle", "factor-1"])
def test_pixel_shuffles_move_values_and_masks_without_the_general_path(shuffle, monkeypatch):
    """A pixel shuffle (unshuffle) of a channels-last delta moves its values in one copy, channels-last
    kept (an unshuffle zeroes the inactive pixels first), and repeats (unites) the masks of the pixels
    each output pixel is made of: the same mask and active values as the general path (the op on masked
    values and on the masks expanded to the values' shape)."""
    fn, args = (shuffle, ()) if isinstance(shuffle, nn.Module) else (shuffle[0], (shuffle[1],))
    gen = torch.Generator().manual_seed(0)
    value = torch.randn(2, 36, 6, 12, generator=gen).contiguous(memory_format=torch.channels_last)
    d = Delta(value, torch.rand(2, 1, 6, 12, generator=gen) > 0.7, tf32=True)
    general = DCLinearFunction(fn)
    monkeypatch.setattr(general, "_pixel_shuffle", lambda *a: None)
    expected = general(d, *args)
    out = DCLinearFunction(fn)(d, *args)
    assert out.value.is_contiguous(memory_format=torch.channels_last) and out.tf32
    assert torch.equal(out.mask, expected.mask) and out.mask.any() and not out.mask.all()
    torch.testing.assert_close(torch.where(out.mask, out.value, 0), expected.value, rtol=0, atol=0)
    # what does not fit falls back to the general path, and its error
    with pytest.raises(RuntimeError):
        DCLinearFunction(torch.pixel_shuffle)(Delta(value[:, :35], d.mask), 2)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_channel_shuffle_equals_torch(layout):
    value = torch.randn(2, 12, 3, 5)
    if layout == "channels_last":
        value = value.contiguous(memory_format=torch.channels_last)
    for groups in (1, 2, 3, 4, 12):
        torch.testing.assert_close(channel_shuffle(value, groups), torch.channel_shuffle(value, groups),
                                   rtol=0, atol=0)


def test_shufflenet_runs_each_block_tail_and_split_as_one_call():
    dm = deltaconv.convert(torchvision_model("shufflenet_v2_x1_0"), example_input=torch.randn(1, 3, 64, 96))
    assert dm.report.fallbacks == []
    assert not any(isinstance(m, DCLinearFunction) for m in dm.modules())
    chunks = collections.Counter(m.chunks for m in dm.modules() if isinstance(m, DCShuffledConcatenate))
    assert chunks == {2: 13, None: 3}, chunks  # the blocks of stride 1 split their input; the 3 others read it whole
