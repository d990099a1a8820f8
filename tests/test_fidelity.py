"""deltaconv.fidelity metrics on synthetic inputs, compare(), and the FLOPs accounting of stats()."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import deltaconv
from deltaconv import fidelity as F_


# ----------------------------------------------------------------------------- metrics
def test_relative_error_known_values():
    ref = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    y = torch.tensor([[3.0, 4.0 + 0.5], [1.1, 0.0]])
    e = F_.relative_error(y, ref)
    assert e.shape == (2,)
    assert math.isclose(float(e[0]), 0.5 / 5.0, rel_tol=1e-12)
    assert math.isclose(float(e[1]), 0.1, rel_tol=1e-6)  # 1.1 is not exact in float32
    assert float(F_.relative_error(ref, ref).max()) == 0.0
    # multi-dimensional outputs: one value per batch entry
    r = torch.randn(3, 4, 5, 6)
    torch.testing.assert_close(F_.relative_error(r * 1.02, r), torch.full((3,), 0.02, dtype=torch.float64))


def test_topk_containment_and_top1():
    ref = torch.tensor([[0.0, 5.0, 1.0, 2.0, 3.0, 4.0, -1.0]])           # dense top-1 is class 1
    y_in = torch.tensor([[9.0, 4.0, 8.0, 7.0, 6.0, 0.0, -1.0]])           # class 1 ranked 5th
    y_out = torch.tensor([[9.0, 4.0, 8.0, 7.0, 6.0, 5.0, -1.0]])          # class 1 ranked 6th
    assert float(F_.topk_contains(y_in, ref, 5)) == 1.0
    assert float(F_.topk_contains(y_out, ref, 5)) == 0.0
    assert float(F_.top1_agrees(y_in, ref)) == 0.0
    assert float(F_.top1_agrees(ref, ref)) == 1.0
    both = F_.topk_contains(torch.cat([y_in, y_out]), torch.cat([ref, ref]), 5)
    assert both.tolist() == [1.0, 0.0]


def test_mask_iou_and_label_iou():
    ref = torch.zeros(2, 1, 4, 4)
    y = torch.zeros(2, 1, 4, 4)
    ref[0, 0, :2, :2] = 1.0      # 4 pixels
    y[0, 0, :2, :3] = 1.0        # 6 pixels, 4 shared -> IoU 4/6
    iou = F_.mask_iou(y, ref, threshold=0.5)
    assert math.isclose(float(iou[0]), 4 / 6, rel_tol=1e-12)
    assert float(iou[1]) == 1.0  # both empty
    # argmax labels, two classes: class 0 IoU 10/12, class 1 IoU 4/6
    a = torch.zeros(1, 2, 4, 4)
    b = torch.zeros(1, 2, 4, 4)
    a[0, 1, :2, :3] = 1.0
    b[0, 1, :2, :2] = 1.0
    miou = F_.label_iou(a, b)
    assert math.isclose(float(miou[0]), (10 / 12 + 4 / 6) / 2, rel_tol=1e-12)


def test_prob_iou_thresholds_probabilities_at_a_half():
    """``prob_iou``: a sigmoid output's masks (> 0.5); ``iou`` (logits > 0) would count every pixel of it."""
    ref = torch.full((1, 1, 4, 4), 0.1)
    y = torch.full((1, 1, 4, 4), 0.2)
    ref[0, 0, :2, :2] = 0.9
    y[0, 0, :2, :3] = 0.8
    prob_iou, _ = F_.METRICS["prob_iou"]
    iou, _ = F_.METRICS["iou"]
    assert math.isclose(float(prob_iou(y, ref)[0]), 4 / 6, rel_tol=1e-12) and float(iou(y, ref)[0]) == 1.0


def test_flops_density_ignores_layers_without_flops_or_frames():
    stats = [{"flops_dense": 100.0, "mean_flops_done": 25.0}, {"flops_dense": 300.0, "mean_flops_done": 75.0},
             {"flops_dense": 0.0, "mean_flops_done": 0.0}, {"flops_dense": 0.0, "mean_flops_done": float("nan")}]
    assert F_.flops_density(stats) == 0.25
    assert math.isnan(F_.flops_density([]))


def test_primary_output_forms():
    t = torch.ones(2)
    assert F_.primary_output(t) is t
    assert F_.primary_output({"out": t, "aux": t * 2}) is t
    assert F_.primary_output({"x": t}) is t
    assert F_.primary_output((t, t * 2)) is t
    with pytest.raises(TypeError):
        F_.primary_output(3)


# ----------------------------------------------------------------------------- compare
def _tiny_classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).eval()


def _frames(n: int, h: int = 16, w: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    bg = torch.rand(1, 3, h, w, generator=g)
    out = []
    for t in range(n):
        f = bg.clone()
        f[:, :, 4:8, t:t + 4] += 1.0
        out.append(f)
    return out


def test_compare_exact_at_threshold_zero_and_key_frame_excluded():
    model = _tiny_classifier()
    frames = _frames(5)
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", example_input=frames[0])
    rep = F_.compare(model, dm, frames)
    assert rep.frames == 4 and len(rep.per_frame["rel_err"]) == 4
    assert rep.max("rel_err") < 1e-5
    assert rep.mean("top5") == 1.0 and rep.mean("top1") == 1.0
    # only the moving square changes: well below dense, and the key frame (density 1) is excluded
    assert 0.0 < rep.density < 0.9
    s = rep.summary()
    assert set(s) >= {"density", "frames", "rel_err_mean", "rel_err_max", "rel_err_p95", "top5_mean", "top5_min"}
    # a static video: nothing to do after the key frame
    rep_static = F_.compare(model, dm, [frames[0]] * 4)
    assert rep_static.density == 0.0


def test_compare_dense_task_and_thresholds_cost_fidelity():
    torch.manual_seed(0)
    seg = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 3, padding=1)).eval()
    frames = _frames(6)
    dm0 = deltaconv.convert(seg, threshold=0.0, backend="reference", example_input=frames[0])
    exact = F_.compare(seg, dm0, frames, task="dense")
    assert exact.max("rel_err") < 1e-5 and exact.min("iou") == 1.0
    dm = deltaconv.convert(seg, threshold=0.5, backend="reference", example_input=frames[0])
    lossy = F_.compare(seg, dm, frames, task="dense")
    assert lossy.mean("rel_err") > exact.mean("rel_err")
    assert lossy.density <= exact.density
    with pytest.raises(ValueError, match="task"):
        F_.compare(seg, dm, frames, task="nope")


# ----------------------------------------------------------------------------- FLOPs accounting
def _by_kind(dm, kind):
    return [s for s in dm.stats() if s["kind"] == kind]


def test_flops_dense_matches_analytic_counts():
    """Per frame, dense FLOPs (2 x multiply-adds) of conv (strided, grouped), linear and pooling."""
    torch.manual_seed(0)
    n, h, w = 2, 12, 16
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),                       # 12x16 out
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=4),   # 6x8 out
        nn.MaxPool2d(2),                                     # 3x4 out
        nn.Conv2d(8, 6, 1),
        nn.AvgPool2d(3, stride=1, padding=1),                # 3x4 out
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5)).eval()
    x = torch.rand(n, 3, h, w)
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", example_input=x)
    with torch.no_grad():
        dm(x)
    convs = _by_kind(dm, "conv2d")
    assert [c["flops_dense"] for c in convs] == [
        n * 12 * 16 * 8 * (3 * 9) * 2,            # 3->8, 3x3
        n * 6 * 8 * 8 * (8 // 4 * 9) * 2,         # grouped: 2 input channels per output channel
        n * 3 * 4 * 6 * 8 * 2]                    # 1x1, 8->6
    assert _by_kind(dm, "max_pool2d")[0]["flops_dense"] == n * 3 * 4 * 8 * 4
    assert _by_kind(dm, "avg_pool2d")[0]["flops_dense"] == n * 3 * 4 * 6 * 9
    assert _by_kind(dm, "linear")[0]["flops_dense"] == n * 6 * 5 * 2
    # key frame: everything dense
    for s in dm.stats():
        if s["flops_dense"] > 0:
            assert s["flops_done"] == pytest.approx(s["flops_dense"])


def test_flops_done_follows_the_receptive_field():
    """One changed input pixel: each conv computes exactly the outputs whose window holds it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, stride=2, padding=1),
                          nn.Conv2d(4, 2, 1)).eval()
    x = torch.rand(1, 3, 16, 16)
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", example_input=x)
    x2 = x.clone()
    x2[0, 1, 8, 8] += 1.0
    with torch.no_grad():
        dm(x)
        dm.reset_stats()
        dm(x2)
    c1, c2, c3 = _by_kind(dm, "conv2d")
    # conv1: rows/cols 7..9 of 16x16 (3x3 outputs); conv2 (3x3, stride 2, pad 1): output i reads
    # inputs 2i-1..2i+1, which meet 7..9 for i = 3, 4, 5 -> 3x3 of 8x8; conv3 (1x1): the same 9
    assert c1["mean_flops_done"] == pytest.approx(c1["flops_dense"] * 9 / 256)
    assert c2["mean_flops_done"] == pytest.approx(c2["flops_dense"] * 9 / 64)
    assert c3["mean_flops_done"] == pytest.approx(c3["flops_dense"] * 9 / 64)
    total = F_.flops_density(dm.stats())
    expected = (c1["flops_dense"] * 9 / 256 + (c2["flops_dense"] + c3["flops_dense"]) * 9 / 64) / \
        sum(s["flops_dense"] for s in dm.stats())
    assert total == pytest.approx(expected)


def test_flops_of_linear_over_the_last_dim_of_a_feature_map():
    """nn.Linear applied to [N, C, H, W] (over W): every output element costs in_features MACs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Linear(16, 5)).eval()
    x = torch.rand(2, 3, 6, 16)
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", example_input=x)
    with torch.no_grad():
        dm(x)
    assert _by_kind(dm, "linear")[0]["flops_dense"] == 2 * 16 * (2 * 4 * 6 * 5)


def test_element_density_weights_layers_by_their_output_elements():
    stats = [{"elements_dense": 100.0, "mean_elements_done": 10.0, "flops_dense": 900.0, "mean_flops_done": 90.0},
             {"elements_dense": 300.0, "mean_elements_done": 270.0, "flops_dense": 100.0, "mean_flops_done": 90.0},
             {"flops_dense": 5.0, "mean_flops_done": 5.0}]  # a layer from before elements were counted
    assert F_.element_density(stats) == pytest.approx(280 / 400)
    assert F_.flops_density(stats) == pytest.approx(185 / 1005)
    assert F_.cost_totals(stats, "elements") == (280.0, 400.0)
    with pytest.raises(ValueError, match="cost must be one of .*'bytes'"):
        F_.cost_totals(stats, "bytes")


def test_stats_pixels_give_each_layers_stride():
    """``pixels`` is a layer's output pixels per frame (all streams), so sqrt(frame pixels / pixels)
    is its stride against the frame: how to pick layers by stride, e.g. for per-layer measures."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, stride=2, padding=1), torch.nn.ReLU()).eval()
    frame = torch.randn(2, 3, 32, 48)
    dm = deltaconv.convert(model, backend="reference", example_input=frame)
    dm(frame)
    strides = {s["name"]: round(math.sqrt(2 * 32 * 48 / s["pixels"])) for s in dm.stats() if s["kind"] == "activation"}
    assert sorted(strides.values()) == [2, 4]
    dm.truncation = {name: "rms" if stride == 2 else "pooled" for name, stride in strides.items()}
    assert sorted(dm.measures().values()) == ["pooled", "rms"]


def test_stats_count_output_elements_on_updated_pixels():
    """elements_dense is a layer's output elements per frame (all channels and streams) and
    mean_elements_done its share on updated pixels, so element_density matches the masks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 1)).eval()
    key = torch.randn(2, 3, 16, 16)
    frame = key.clone()
    frame[0, :, 4, 4] += 1.0  # stream 0: one pixel; stream 1: nothing
    dm = deltaconv.convert(model, backend="reference", example_input=key)
    dm(key)
    dm.reset_stats()
    dm(frame)
    by_name = {s["name"]: s for s in dm.stats()}
    conv = [s for s in dm.stats() if s["kind"] == "conv2d"][0]
    assert conv["elements_dense"] == 2 * 8 * 16 * 16 and conv["pixels"] == 2 * 16 * 16
    assert conv["mean_elements_done"] == pytest.approx(9 / (2 * 256) * conv["elements_dense"])
    counted = [s for s in by_name.values() if math.isfinite(s["mean_elements_done"])]  # not the output densifier
    assert len(counted) >= 4
    done = sum(s["mean_elements_done"] for s in counted)
    dense = sum(s["elements_dense"] for s in counted)
    assert F_.element_density(dm.stats()) == pytest.approx(done / dense)
