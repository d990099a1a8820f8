"""Change detectors of deltaconv.sparsify: exactness at threshold 0, no drift, specs, copies."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn as nn

import deltaconv
from deltaconv import sparsify as S
from deltaconv.modules import DCSparsify

ALL = [S.PixelMax(), S.BoxBlur(5), S.BoxBlur(3, peak=2.0), S.BoxBlur(5, gate=0.25), S.GaussianBlur(1.5),
       S.SignedBlur(5), S.CoherentChange(5), S.CoherentChange(5, gate=0.25), S.TileEnergy(8),
       S.TileEnergy(5), S.NoiseFloor(S.BoxBlur(5)), S.NoiseFloor()]
IDS = ["-".join(f"{v}" for v in d.spec().values() if not isinstance(v, dict)) + ("-nf" if "inner" in d.spec() else "")
       for d in ALL]


def _small_cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU6(),
        nn.MaxPool2d(2), nn.Conv2d(8, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)).eval()


def _video(n: int, h: int = 24, w: int = 32, noise: float = 0.03, seed: int = 0) -> list[torch.Tensor]:
    """A bright square moving over a static textured background, plus per-frame noise."""
    g = torch.Generator().manual_seed(seed)
    bg = torch.rand(1, 3, h, w, generator=g)
    out = []
    for t in range(n):
        f = bg.clone()
        x = 2 + t % (w - 8)
        f[:, :, 6:12, x:x + 6] += 1.0
        f = f + noise * torch.randn(1, 3, h, w, generator=g)
        out.append(f)
    return out


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_measure_shape_and_support(det):
    """[N,1,H,W], >= 0, and positive wherever a pixel changed (so threshold 0 sends every change)."""
    det = copy.deepcopy(det)
    change = torch.zeros(2, 3, 17, 23)
    change[0, 1, 4, 5] = 1e-3
    change[1, 0, 16, 22] = -2.0
    change[1, 2, 0, 0] = 0.5
    m = det(change)
    assert m.shape == (2, 1, 17, 23)
    assert (m >= 0).all()
    changed = change.abs().amax(1, keepdim=True) > 0
    assert (m[changed] > 0).all()


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_threshold_zero_is_dense_equal(det):
    model = _small_cnn()
    frames = _video(4)
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", change_detector=copy.deepcopy(det),
                           example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(dm(f), model(f), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_no_drift_over_many_frames(det):
    """Values sent are exact and pending change is kept: after many frames a purely linear model's
    output is its dense output on what was sent, and the pending change stays bounded."""
    torch.manual_seed(2)
    lin = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1)).eval()
    frames = _video(60, noise=0.02, seed=3)
    t = 0.05
    det = copy.deepcopy(det)
    dm = deltaconv.convert(lin, threshold=t, backend="reference", change_detector=det, example_input=frames[0])
    sp = next(layer for layer in dm.delta_layers() if isinstance(layer, DCSparsify))
    peak = getattr(det, "peak", None) or getattr(getattr(det, "inner", None), "peak", None)
    with torch.no_grad():
        for f in frames:
            y = dm(f)
            sent = sp._buffers["sent"]
            torch.testing.assert_close(y, lin(sent), atol=1e-4, rtol=1e-4)
            pending = (f - sent).abs().amax(1)
            if peak is not None and not isinstance(det, S.NoiseFloor):
                assert float(pending.max()) <= peak * t + 1e-5
    # the scene comes to rest: a pixel once sent has no pending change left, so sends stop after
    # a few frames (a signed detector may send a neighbour whose window changed) and the output
    # stays put frame after frame: no drift
    with torch.no_grad():
        outs = [dm(frames[-1]).clone() for _ in range(12)]
    for o in outs[-4:]:
        torch.testing.assert_close(o, outs[-1], atol=1e-6, rtol=0)
    # without a sliding window (or with a gate) nothing is sent once settled; an ungated window
    # may keep marking pixels with nothing pending (sent with a ~0 change: wasted work, no error)
    if getattr(det, "gate", None) is not None or isinstance(det, (S.PixelMax, S.TileEnergy)):
        assert sp.stats()["density"] == 0.0


def test_box_blur_rejects_isolated_noise_but_keeps_objects():
    change = torch.zeros(1, 3, 32, 32)
    change[0, :, 3, 3] = 0.1          # one noisy pixel
    change[0, :, 16:24, 16:24] = 0.1  # a coherent change (an object)
    m = S.BoxBlur(5, peak=4.0)(change)
    t = 0.05
    assert not (m[0, 0, 3, 3] > t)
    assert (m[0, 0, 18:22, 18:22] > t).all()
    assert (S.PixelMax()(change)[0, 0, 3, 3] > t)
    # a large isolated change still goes out through the peak term
    change[0, 0, 3, 3] = 0.25
    assert S.BoxBlur(5, peak=4.0)(change)[0, 0, 3, 3] > t


def test_gate_stops_windows_from_sending_settled_pixels():
    change = torch.zeros(1, 3, 16, 16)
    change[0, :, 8, 8] = 0.12   # held back alone (below peak * t), lifts its neighbours' windows
    change[0, :, 8, 9] = 0.12
    t = 0.005
    ungated, gated = S.BoxBlur(3)(change), S.BoxBlur(3, gate=0.5)(change)
    assert (ungated[0, 0, 7, 7] > t)      # a pixel with nothing pending is marked
    assert not (gated[0, 0, 7, 7] > t)    # not with a gate
    assert (gated[0, 0, 8, 8] > t) and (gated[0, 0, 8, 9] > t)


def test_signed_blur_cancels_zero_mean_noise():
    g = torch.Generator().manual_seed(0)
    noise = 0.05 * torch.randn(1, 3, 64, 64, generator=g)
    ms, mb = S.SignedBlur(7)(noise), S.BoxBlur(7)(noise)
    assert float(ms.mean()) < 0.5 * float(mb.mean())


def test_tile_energy_is_constant_per_tile():
    g = torch.Generator().manual_seed(0)
    change = 0.01 * torch.rand(1, 3, 20, 27, generator=g)
    m = S.TileEnergy(8, peak=1e9)(change)
    assert m.shape == (1, 1, 20, 27)
    tile = m[0, 0, 8:16, 8:16]
    assert torch.allclose(tile, tile[0, 0].expand_as(tile))
    pix = change.abs().amax(1)[0]
    assert torch.allclose(m[0, 0, 0, 0], pix[:8, :8].mean())
    assert torch.allclose(m[0, 0, 19, 26], pix[16:, 24:].mean())  # partial tile at the border


def test_noise_floor_scales_with_noise_per_stream():
    g = torch.Generator().manual_seed(0)
    det = S.NoiseFloor(quantile=0.5, ref=0.01, momentum=0.0, sample_stride=1)
    change = torch.zeros(2, 3, 32, 32)
    change[0] = 0.1 * torch.randn(3, 32, 32, generator=g)   # noisy stream
    change[1, :, 4:8, 4:8] = 0.3                              # clean stream, one object
    m = det(change)
    raw = S.PixelMax()(change)
    assert torch.allclose(m[1], raw[1])                       # clean: unchanged
    assert float(det.noise[0]) > 0.01
    assert torch.allclose(m[0], raw[0] * 0.01 / det.noise[0])
    det.reset()
    assert det.noise is None


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_spec_roundtrip_pickle_deepcopy(det):
    spec = det.spec()
    import json
    again = S.from_spec(json.loads(json.dumps(spec)))
    assert type(again) is type(det) and again.spec() == spec
    x = torch.randn(1, 3, 9, 11)
    for other in (pickle.loads(pickle.dumps(det)), copy.deepcopy(det), again):
        other.reset()
        fresh = copy.deepcopy(det)
        fresh.reset()
        torch.testing.assert_close(other(x), fresh(x))
    assert not list(det.parameters())


def test_from_spec_forms_and_errors():
    assert S.from_spec(None) is None
    assert isinstance(S.from_spec("box"), S.BoxBlur)
    d = S.BoxBlur(3)
    assert S.from_spec(d) is d
    assert isinstance(S.default_detector(), S.ChangeDetector)
    with pytest.raises(ValueError, match="type"):
        S.from_spec({"type": "nope"})
    with pytest.raises(ValueError, match="k must be an odd"):
        S.BoxBlur(4)
    with pytest.raises(ValueError, match="peak"):
        S.BoxBlur(5, peak=float("inf"))
