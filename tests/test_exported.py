"""The graph passes for exported models' written-out ops (``deltaconv.exported``): a BatchNorm as a
multiply-add after a convolution, an affine before a convolution, hardswish as
``x * relu6(x + 3) / 6``; the converted model stays the dense one."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deltaconv
from deltaconv.exported import fold_constant_affines, fold_hardswish, fold_input_affines
from helpers import changing_frames


class Exported(nn.Module):
    """A block as exporters write it: conv * c + b, hardswish spelled out, an affine by scalars before a
    padded depthwise conv and one before a 1x1 conv; ``shared`` reads the first conv's output twice."""

    def __init__(self, shared: bool = False) -> None:
        super().__init__()
        self.shared = shared
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 6, 1)
        g = torch.Generator().manual_seed(1)
        self.register_buffer("c", torch.rand(1, 8, 1, 1, generator=g) + 0.5)
        self.register_buffer("b", torch.randn(1, 8, 1, 1, generator=g))
        self.register_buffer("three", torch.tensor(3.0))
        self.register_buffer("six", torch.tensor(6.0))
        self.register_buffer("a1", torch.tensor(0.7))
        self.register_buffer("s1", torch.tensor(-0.2))
        self.register_buffer("a2", torch.tensor(1.3))
        self.register_buffer("s2", torch.tensor(0.4))

    def forward(self, x):
        y = self.conv(x)
        z = self.c * y + self.b
        h = z * F.relu6(z + self.three) / self.six
        h = self.dw(h * self.a1 + self.s1)
        out = self.pw(F.relu(h) * self.a2 + self.s2)
        return out + y.mean() if self.shared else out


def _traced(model, x):
    from torch.fx.passes.shape_prop import ShapeProp

    gm = torch.fx.symbolic_trace(model)
    ShapeProp(gm).propagate(x)
    return gm


def test_the_passes_find_each_pattern():
    x = torch.randn(1, 3, 12, 16)
    model = Exported().eval()
    with torch.no_grad():
        ref = model(x)
    gm = _traced(model, x)
    assert fold_hardswish(gm.graph, gm) == 1
    assert fold_constant_affines(gm.graph, gm) == 1
    assert fold_input_affines(gm.graph, gm) == 2
    gm.recompile()
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert F.hardswish in targets and F.relu6 not in targets
    with torch.no_grad():
        torch.testing.assert_close(gm(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 1.0])
def test_converted_exported_block_equals_dense(fraction):
    """Folded: no product of deltas and no scale left, the multiply-add a BatchNorm folded into the conv."""
    model = Exported().eval()
    frames = changing_frames((1, 3, 14, 18), [fraction, 0.3])
    dm = deltaconv.convert(model, backend="reference", example_input=frames[0])
    kinds = [type(layer).__name__ for layer in dm.delta_layers()]
    assert "DCMul" not in kinds and "DCScale" not in kinds and not dm.report.fallbacks
    assert any(n.status == "folded" for n in dm.report.nodes)
    with torch.no_grad():
        for x in frames:
            torch.testing.assert_close(dm(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_conv_read_twice_keeps_its_multiply_add():
    model = Exported(shared=True).eval()
    x = torch.randn(1, 3, 12, 16)
    gm = _traced(model, x)
    assert fold_constant_affines(gm.graph, gm) == 0
    dm = deltaconv.convert(model, backend="reference", example_input=x)
    with torch.no_grad():
        torch.testing.assert_close(dm(x), model(x), rtol=1e-5, atol=1e-5)


def test_without_fold_bn_the_affines_stay_layers():
    model = Exported().eval()
    x = torch.randn(1, 3, 12, 16)
    dm = deltaconv.convert(model, backend="reference", example_input=x, fold_bn=False)
    assert "DCScale" in [type(layer).__name__ for layer in dm.delta_layers()]
    with torch.no_grad():
        torch.testing.assert_close(dm(x), model(x), rtol=1e-5, atol=1e-5)


def test_folded_block_keeps_the_dense_state_dict_and_casts():
    """What the passes add stays out of ``state_dict`` (the dense one loads), and the converted model casts
    (to float32's rounding: an affine folded into the conv after it was folded when converting)."""
    model = Exported().eval()
    x = torch.randn(1, 3, 12, 16)
    dm = deltaconv.convert(model, backend="reference", example_input=x)
    assert list(dm.state_dict().keys()) == list(model.state_dict().keys())
    dm.load_state_dict(model.state_dict())
    dm64, model64 = dm.double(), model.double()
    with torch.no_grad():
        torch.testing.assert_close(dm64(x.double()), model64(x.double()), rtol=1e-5, atol=1e-6)
