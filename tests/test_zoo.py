"""The model registry (deltaconv.zoo) and the CRAFT definition with its real weights."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn as nn

import deltaconv
from deltaconv import zoo
from deltaconv.craft import CRAFT, VGG16BN, _vgg16_bn_features, craft_mlt_25k, load_state_dict
from deltaconv.video import find_sample_video, read_frames, to_tensor
from deltaconv.weights import craft_checkpoint


@functools.lru_cache(maxsize=None)
def _craft() -> CRAFT:
    return craft_mlt_25k()


def _first_frame_bgr(size_hw):
    import cv2

    cap = cv2.VideoCapture(str(find_sample_video()))
    ok, frame = cap.read()
    cap.release()
    assert ok
    return cv2.resize(frame, (size_hw[1], size_hw[0]), interpolation=cv2.INTER_AREA)


# ----------------------------------------------------------------------------- registry
def test_names_cover_real_weights_and_torchvision():
    names = zoo.names()
    assert names[:2] == ["mobilenet_v2", "craft"]
    assert {"resnet18", "fcn_resnet50", "lraspp_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_fpn",
            "keypointrcnn_resnet50_fpn"} <= set(names)
    assert not any(n.startswith(("raft_", "quantized_", "r3d_")) for n in names)
    assert zoo.torchvision_names()["retinanet_resnet50_fpn"] == "detection"


def test_detection_entry_has_random_weights_and_no_backbone_download():
    entry = zoo.load("fasterrcnn_mobilenet_v3_large_320_fpn")
    assert entry.task == "detection" and entry.weights.startswith("random")
    assert not entry.model.training


def test_unknown_name_lists_options():
    with pytest.raises(zoo.UnknownModelError) as e:
        zoo.load("resnett18")
    msg = str(e.value)
    assert "'resnett18'" in msg and "Did you mean resnet18" in msg
    assert "mobilenet_v2" in msg and "craft" in msg and "pkg.module:factory" in msg


@pytest.mark.parametrize("spec, fragment", [
    ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
    ("torch.nn:NoSuchThing", "has no attribute 'NoSuchThing'"),
    (":make", "must look like 'pkg.module:factory'"),
])
def test_bad_import_paths(spec, fragment):
    with pytest.raises(zoo.UnknownModelError, match=fragment):
        zoo.load(spec)


def test_import_path_must_give_a_module():
    with pytest.raises(TypeError, match="'math:pi' must give a torch.nn.Module.*got float"):
        zoo.load("math:pi")


def test_import_path_factory():
    entry = zoo.load("torchvision.models:resnet18")
    assert isinstance(entry.model, nn.Module) and not entry.model.training
    assert entry.task is None  # inferred by the demo from the output


class _SizedNet(nn.Conv2d):
    deltaconv_input_size = (32, "wide")

    def __init__(self) -> None:
        super().__init__(3, 4, 3)


def test_import_path_input_size_is_checked():
    with pytest.raises(ValueError, match=r"sets deltaconv_input_size to \(32, 'wide'\); expected \(height, width\)"):
        zoo.load(f"{__name__}:_SizedNet")


def test_mobilenet_v2_has_real_imagenet_weights():
    entry = zoo.load("mobilenet_v2")
    assert entry.task == "classification" and len(entry.categories) == 1000
    assert entry.categories[0] == "tench"
    from deltaconv.weights import TORCHVISION_FILES, packaged_file

    package, import_name = TORCHVISION_FILES["mobilenet_v2-b0353104.pth"]
    ref = torch.load(packaged_file(package, import_name, "mobilenet_v2-b0353104.pth"), map_location="cpu",
                     weights_only=True)
    assert torch.equal(entry.model.state_dict()["features.0.0.weight"], ref["features.0.0.weight"])


def test_torchvision_segmentation_entry():
    entry = zoo.load("lraspp_mobilenet_v3_large")
    assert entry.task == "segmentation"


# ----------------------------------------------------------------------------- CRAFT
def test_craft_checkpoint_keys_match_exactly():
    state = load_state_dict(craft_checkpoint())
    assert not any(k.startswith("module.") for k in state)
    assert set(state) == set(CRAFT().state_dict())
    model = _craft()  # loads with strict=True
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(20.8e6, rel=0.01)


def test_craft_slicing_matches_easyocr_in_place_relus():
    """EasyOCR slices before the in-place ReLU that opens the next slice; ours ends each slice after
    it. Both compute the same outputs on a real frame."""

    class EasyOCRSlicing(VGG16BN):
        def __init__(self):
            nn.Module.__init__(self)
            features = _vgg16_bn_features()
            self.slice1, self.slice2, self.slice3, self.slice4 = (nn.Sequential() for _ in range(4))
            for lo, hi, s in ((0, 12, self.slice1), (12, 19, self.slice2), (19, 29, self.slice3), (29, 39, self.slice4)):
                for x in range(lo, hi):
                    s.add_module(str(x), features[x])
            self.slice5 = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(512, 1024, 3, padding=6, dilation=6),
                                        nn.Conv2d(1024, 1024, 1))

    ref = CRAFT()
    ref.basenet = EasyOCRSlicing()
    ref.load_state_dict(load_state_dict(craft_checkpoint()), strict=True)
    ref.eval()
    x = next(read_frames(max_frames=1, size=(64, 96)))
    with torch.no_grad():
        a, b = ref(x), _craft()(x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_craft_finds_text_on_a_real_frame():
    """The real weights see text drawn on a vtest.avi frame, and little elsewhere."""
    import cv2

    frame = _first_frame_bgr((160, 224))
    cv2.putText(frame, "TEXT", (20, 50), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (255, 255, 255), 3)
    with torch.no_grad():
        score, feature = _craft()(to_tensor(frame))
    assert score.shape == (1, 80, 112, 2) and feature.shape == (1, 32, 80, 112)
    region = score[0, ..., 0].numpy()
    assert region[5:30, 8:60].max() > 0.7
    assert np.delete(region, np.s_[0:35], axis=0).max() < 0.3


def test_converted_craft_equals_dense_at_threshold_zero():
    model = _craft()
    frames = list(read_frames(max_frames=3, size=(64, 96)))
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", example_input=frames[0])
    assert not dm.report.fallbacks
    with torch.no_grad():
        for x in frames:
            ref, out = model(x), dm(x)
            for r, o in zip(ref, out):
                assert o.shape == r.shape
                assert ((o - r).norm() / r.norm()).item() < 1e-4
