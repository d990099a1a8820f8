"""Detectors and pose models: torchvision's detection models do not trace whole, so convert()
says what to do, and convert_backbone() converts their backbone inside the running detector.

Random weights (no downloads). Their detections are near-ties (every score about 1/classes), so
the end-to-end comparison runs in float64, where the backbone's rounding (1e-15) cannot reorder
them; in float32 the backbone's feature maps are compared, which is what the heads read.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torchvision.models import detection

import deltaconv
from deltaconv.detection import backbone_input, feature_maps
from helpers import cuda_backend_reason, randomize_bn, video_frames

SIZE = (108, 192)
SMALL = dict(min_size=SIZE[0], max_size=SIZE[1])  # the detectors' transform keeps the frames' size


def _detector(name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    extra = SMALL if "320" not in name else {}
    return randomize_bn(getattr(detection, name)(weights=None, weights_backbone=None, **extra, **kwargs)).eval()


def _two_streams(n: int) -> list[list[torch.Tensor]]:
    """``n`` frames of a batch of two cameras: each frame a list of two ``[3, H, W]`` images."""
    a = video_frames(n, SIZE, "vtest.avi")
    b = video_frames(n, SIZE, "one-by-one-person-detection.mp4")
    return [[x[0], y[0]] for x, y in zip(a, b)]


def _feature_hook(module: nn.Module, store: list):
    return module.register_forward_hook(lambda m, args, out: store.append({k: v.clone() for k, v in out.items()}))


def test_convert_names_convert_backbone_for_a_detector():
    model = _detector("fasterrcnn_mobilenet_v3_large_320_fpn")
    expected = r"cannot trace FasterRCNN .*convert_backbone\(model, example_input\) converts the backbone"
    with pytest.raises(deltaconv.ConversionError, match=expected):
        deltaconv.convert(model)


def test_convert_suggests_leaf_modules_for_value_dependent_control_flow():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return y if y.sum() > 0 else -y  # depends on the values: fx cannot trace it

    with pytest.raises(deltaconv.ConversionError, match=r"cannot trace Branchy .*leaf_modules") as info:
        deltaconv.convert(Branchy())
    assert "convert_backbone" not in str(info.value)


def test_detector_equals_dense_at_threshold_zero_in_float64():
    """Faster R-CNN with its backbone converted gives the dense boxes, labels and scores, frame by
    frame, for a batch of two cameras (two streams), and the backbone runs sparse after frame 0."""
    dense = _detector("fasterrcnn_mobilenet_v3_large_320_fpn", box_score_thresh=0.0).double()
    frames = [[im.double() for im in f] for f in _two_streams(4)]
    model = deltaconv.convert_backbone(dense, frames[0])
    assert isinstance(model.backbone, deltaconv.DeltaModel)
    assert not model.backbone.report.fallbacks
    with torch.no_grad():
        for f in frames:
            want, got = dense(f), model(f)
            assert len(got) == 2
            for w, g in zip(want, got):
                assert w.keys() == g.keys()
                assert w["boxes"].shape[0] > 0
                for key in w:
                    torch.testing.assert_close(g[key], w[key], rtol=1e-9, atol=1e-9)
    density = model.backbone.stats()[0]["mean_density"]
    assert 0.0 < density < 1.0, density


@pytest.mark.parametrize("name", ["retinanet_resnet50_fpn", "fcos_resnet50_fpn", "keypointrcnn_resnet50_fpn",
                                  "ssdlite320_mobilenet_v3_large"])
def test_backbone_features_equal_dense_inside_the_detector(name):
    """Inside a full call of the detector, the converted backbone's feature maps (every FPN level)
    equal the dense backbone's on the same frames (float32, relative error <= 1e-4)."""
    dense = _detector(name)
    frames = _two_streams(3)
    model = deltaconv.convert_backbone(dense, frames[0])
    want, got = [], []
    hooks = [_feature_hook(dense.backbone, want), _feature_hook(model.backbone, got)]
    try:
        with torch.no_grad():
            for f in frames:
                dense(f)
                model(f)
    finally:
        for h in hooks:
            h.remove()
    assert len(got) == len(frames)
    for w, g in zip(want, got):
        assert w.keys() == g.keys() and len(w) >= 3
        for key in w:
            err = ((g[key] - w[key]).norm() / w[key].norm()).item()
            assert err <= 1e-4, (key, err)
    assert not model.backbone.report.fallbacks, str(model.backbone.report)


def test_calibrated_backbone_thresholds_hold_every_pyramid_level():
    """deltaconv.calibrate on a detector's dense backbone, its input frames and feature_maps as the
    output: convert_backbone with those thresholds keeps the relative error of all feature maps
    together within the tolerance on the calibration frames, and saves work."""
    dense = _detector("fasterrcnn_mobilenet_v3_large_fpn")
    clip = [f[0] for f in video_frames(6, SIZE, "one-by-one-person-detection.mp4")]
    inputs = [backbone_input(dense, [im]) for im in clip]
    tolerance = 0.05
    calibration = deltaconv.calibrate(dense.backbone, inputs, tolerance, output_fn=feature_maps, max_evals=40,
                                      progress=False)
    model = deltaconv.convert_backbone(dense, [clip[0]], thresholds=calibration)
    assert any(t > 0 for t in model.backbone.thresholds().values())
    want, got = [], []
    hooks = [_feature_hook(dense.backbone, want), _feature_hook(model.backbone, got)]
    try:
        with torch.no_grad():
            for im in clip:
                dense([im])
                model([im])
    finally:
        for h in hooks:
            h.remove()
    errors = [deltaconv.fidelity.relative_error(feature_maps(g), feature_maps(w)).item() for g, w in zip(got, want)]
    assert sum(errors[1:]) / len(errors[1:]) <= tolerance * 1.01, errors
    assert deltaconv.fidelity.flops_density(model.backbone.stats()) < 1.0


def test_feature_maps_flattens_every_level():
    maps = {"0": torch.ones(2, 3, 4, 4), "pool": torch.zeros(2, 3, 2, 2)}
    flat = feature_maps(maps)
    assert flat.shape == (2, 60) and flat[:, :48].eq(1).all() and flat[:, 48:].eq(0).all()
    assert feature_maps([maps["0"]]).shape == (2, 48) and feature_maps(maps["pool"]).shape == (2, 12)
    with pytest.raises(TypeError, match="feature_maps: expected a tensor, or a dict or list of tensors, got str"):
        feature_maps("maps")


def test_convert_backbone_copies_and_keeps_parameter_names():
    dense = _detector("fasterrcnn_mobilenet_v3_large_320_fpn")
    before = {k: v.clone() for k, v in dense.state_dict().items()}
    frames = _two_streams(1)
    model = deltaconv.convert_backbone(dense, frames[0], threshold=0.01)
    assert not isinstance(dense.backbone, deltaconv.DeltaModel)  # the original is untouched
    assert all(torch.equal(before[k], v) for k, v in dense.state_dict().items())
    assert set(model.backbone.thresholds().values()) == {0.01}  # convert()'s arguments reach the backbone
    # a dense checkpoint loads into the converted detector
    model.load_state_dict(dense.state_dict())
    assert set(model.state_dict()) == set(before)


def test_convert_backbone_with_a_nested_attribute():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Module()
            self.net.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 1))

        def forward(self, x):
            y = self.net.body(x)
            return y.flatten(1).argmax(1)  # not a delta op: stays outside

    frames = video_frames(3, (32, 48))
    dense = Wrapper().eval()
    model = deltaconv.convert_backbone(dense, frames[0], attribute="net.body")
    assert isinstance(model.net.body, deltaconv.DeltaModel)
    with torch.no_grad():
        for f in frames:
            torch.testing.assert_close(model.net.body(f), dense.net.body(f), rtol=1e-4, atol=1e-5)


def test_backbone_input_is_the_transformed_batch():
    dense = _detector("fasterrcnn_mobilenet_v3_large_fpn")
    frames = _two_streams(1)[0]
    batch = backbone_input(dense, frames)
    assert batch.shape[0] == 2 and batch.shape[-2] % 32 == 0 and batch.shape[-1] % 32 == 0
    assert backbone_input(nn.Conv2d(3, 3, 1), torch.stack(frames)).shape == (2, 3) + SIZE


@pytest.mark.parametrize("kwargs,error,fragment", [
    (dict(attribute="neck"), ValueError, r"no sub-module 'neck' \(its children: transform, backbone"),
    (dict(attribute=""), ValueError, "attribute must be a module path"),
    (dict(example_input=torch.zeros(1, 3, 8, 8)), TypeError, "multiple values for argument 'example_input'"),
])
def test_convert_backbone_errors_name_the_argument(kwargs, error, fragment):
    dense = _detector("fasterrcnn_mobilenet_v3_large_320_fpn")
    with pytest.raises(error, match=fragment):
        deltaconv.convert_backbone(dense, torch.zeros(1, 3, 64, 64), **kwargs)


@pytest.mark.parametrize("frames,fragment", [
    (torch.zeros(3, 8, 8), r"got shape \(3, 8, 8\)"),
    ([], "got list"),
    ("frame.png", "got str"),
])
def test_backbone_input_errors(frames, fragment):
    with pytest.raises((TypeError, ValueError), match=fragment):
        backbone_input(nn.Identity(), frames)


REASON = cuda_backend_reason()


@pytest.mark.gpu
@pytest.mark.skipif(bool(REASON), reason=REASON or "ok")
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_detector_backbone_on_the_cuda_kernels(dtype, cuda_graph):
    """The CUDA backend inside a running detector, eager and replayed as a CUDA graph: float32 feature
    maps equal dense; float16 ones stay within the dense float16 backbone's own rounding."""
    torch.backends.cudnn.allow_tf32 = False
    reference = _detector("fasterrcnn_mobilenet_v3_large_fpn").cuda()
    dense = _detector("fasterrcnn_mobilenet_v3_large_fpn").cuda().to(dtype)
    frames = [[im.cuda().to(dtype) for im in f] for f in _two_streams(5)]
    model = deltaconv.convert_backbone(dense, frames[0], backend="cuda", cuda_graph=cuda_graph,
                                       check_finite=not cuda_graph)
    want, low, got = [], [], []
    hooks = [_feature_hook(reference.backbone, want), _feature_hook(dense.backbone, low),
             _feature_hook(model.backbone, got)]
    try:
        with torch.no_grad():
            for f in frames:
                reference([im.float() for im in f])
                dense(f)
                out = model(f)
                assert len(out) == 2 and out[0]["boxes"].dtype == dtype
    finally:
        for h in hooks:
            h.remove()
    for w, d, g in zip(want, low, got):
        for key in w:
            ref = w[key].double()
            err = ((g[key].double() - ref).norm() / ref.norm()).item()
            if dtype == torch.float32:
                assert err <= 1e-4, (key, err)
            else:
                dense_err = ((d[key].double() - ref).norm() / ref.norm()).item()
                assert err <= 3 * dense_err + 1e-3, (key, err, dense_err)
    assert model.backbone.stats()[0]["mean_density"] < 1.0
