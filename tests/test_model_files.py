"""Model files (.tflite, .onnx) named by their path wherever a model name is taken (deltaconv.model_files)."""
from __future__ import annotations

import pytest
import torch

from deltaconv import zoo
from deltaconv.model_files import INPUT_RANGES, FileModel, input_affine, is_model_file, load_model_file
from deltaconv.video import imagenet_to_unit


def test_input_affine_maps_imagenet_frames_to_each_range():
    std, mean = imagenet_to_unit()
    unit = torch.rand(1, 3, 4, 5)
    x = (unit - mean) / std  # an ImageNet-normalised frame
    expected = {"unit": unit, "signed": 2 * unit - 1, "byte": 255 * unit}
    for name, want in expected.items():
        scale, shift = input_affine(name)
        torch.testing.assert_close(x * scale + shift, want)
    assert input_affine("imagenet") is None and set(INPUT_RANGES) == {*expected, "imagenet"}
    with pytest.raises(ValueError, match=r"input_range: must be one of imagenet, unit, signed, byte, got 'bgr'"):
        input_affine("bgr")


def test_file_names_and_errors(tmp_path):
    assert is_model_file("a/b.TFLITE") and is_model_file("m.onnx") and not is_model_file("pkg.mod:fn")
    with pytest.raises(FileNotFoundError, match=r"model: no model file at '.*nope.tflite'"):
        zoo.load(str(tmp_path / "nope.tflite"))
    with pytest.raises(ValueError, match=r"model: a model file must end in .tflite or .onnx, got 'x.pt'"):
        load_model_file("x.pt")
    with pytest.raises(ValueError, match=r"--input-range: applies to model files .* got input range 'unit'"):
        zoo.load("mobilenet_v2", input_range="unit")


def test_tflite_file_is_blazepose_with_its_input_size():
    """MediaPipe's file by its path: [0, 1] input by default, the file's 256x256, the same outputs as the zoo's
    blazepose_full (which puts the same affine in front of the same network)."""
    pytest.importorskip("tflite")
    from deltaconv.blazepose import OUTPUT_NAMES, blazepose_full
    from deltaconv.weights import blazepose_full_tflite

    try:
        path = blazepose_full_tflite()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    entry = zoo.load(str(path))
    assert isinstance(entry.model, FileModel) and entry.name == "pose_landmark_full"
    assert entry.input_size == (256, 256) and entry.task is None
    assert entry.weights == "file pose_landmark_full.tflite (input unit)"
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        got, want = entry.model(x), blazepose_full()(x)
    file_order = ("landmarks", "pose_flag", "out", "heatmaps", "world_landmarks")  # the file's, before the dict
    assert set(file_order) == set(OUTPUT_NAMES)
    for name, value in zip(file_order, got):
        torch.testing.assert_close(value, want[name])
    byte = zoo.load(str(path), input_range="byte").model
    torch.testing.assert_close(byte.scale, 255 * imagenet_to_unit()[0])  # [0, 255] RGB from the same frames


def test_onnx_file_takes_the_given_input_range():
    """PP-OCR's ONNX file by its path with --input-range signed: its network on [-1, 1] RGB (RapidOCR feeds BGR;
    a file model keeps the frames' RGB order); its input size is dynamic, so none is declared."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnx2torch")
    from deltaconv.weights import ppocr_det_onnx

    try:
        path = ppocr_det_onnx()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    entry = zoo.load(str(path), input_range="signed")
    assert entry.input_size is None and entry.model.input_range == "signed"
    assert zoo.load(str(path)).model.input_range == "imagenet"
    std, mean = imagenet_to_unit()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(entry.model(x), entry.model.network(2 * (x * std + mean) - 1))


def test_cli_converts_a_model_file_and_names_a_misplaced_input_range(capsys):
    pytest.importorskip("tflite")
    from deltaconv import cli
    from deltaconv.weights import blazepose_full_tflite

    try:
        path = blazepose_full_tflite()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    assert cli.main(["convert", str(path), "--input-range", "unit"]) == 0
    out = capsys.readouterr().out
    assert "pose_landmark_full: 231 nodes: 223 converted" in out and "fallbacks: none" in out
    assert cli.main(["convert", "mobilenet_v2", "--input-range", "unit"]) == 1
    assert "--input-range: applies to model files" in capsys.readouterr().err


def test_selfie_segmentation_in_the_zoo():
    """The zoo's selfie_segmentation (alias selfie): MediaPipe's file behind the [0, 1] affine, 256x256, drawn as a
    segmentation (its one-channel probability map)."""
    pytest.importorskip("tflite")
    from deltaconv.weights import mediapipe_tflite

    try:
        path = mediapipe_tflite("selfie_segmentation.tflite")
    except FileNotFoundError as error:
        pytest.skip(str(error))
    entry = zoo.load("selfie")
    assert entry.name == "selfie_segmentation" and entry.task == "segmentation" and entry.input_size == (256, 256)
    assert isinstance(entry.model, FileModel) and entry.model.input_range == "unit" and "mediapipe" in entry.weights
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        torch.testing.assert_close(entry.model(x), zoo.load(str(path)).model(x))  # the file by its path, the same
