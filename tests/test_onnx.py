"""ONNX models through onnx2torch (``deltaconv.load_onnx``): loading, tracing onnx2torch's ops as torch
calls, conversion against the dense model and onnx's own reference runtime, and PP-OCRv4's real
text detector (``deltaconv.ppocr``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import deltaconv
from deltaconv.onnx_models import onnx_div
from helpers import changing_frames, cuda_backend_reason, video_frames

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx2torch")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _const(name: str, value) -> "onnx.NodeProto":
    """A ``Constant`` node holding ``value`` (how paddle2onnx stores weights)."""
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.float32), name))


def _checked_model(nodes, name: str, out_channels: int) -> "onnx.ModelProto":
    """An opset-13 model of ``nodes`` from input ``x`` [1, 3, h, w] to output ``y`` [1, out_channels, h, w],
    checked by onnx."""
    graph = helper.make_graph(nodes, name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, "h", "w"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def _tiny_model(resize_sizes: bool = False) -> "onnx.ModelProto":
    """A small CNN in the style of PP-OCR's exports, every weight a Constant node: conv, affine by
    constants, hardswish written out (``x * clip(x + 3, 0, 6) / 6``), a squeeze-excite gate
    (global pooling, HardSigmoid), a nearest Resize by constant scales (or by a computed size with
    ``resize_sizes``), a concatenation and a sigmoid. Input ``x`` [1, 3, H, W], H and W even."""
    g = np.random.default_rng(0)
    w = lambda *s: (g.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    nodes = [
        _const("w1", w(8, 3, 3, 3)), _const("b1", w(8)),
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        _const("s1", w(1, 8, 1, 1)), _const("t1", w(1, 8, 1, 1)),
        helper.make_node("Mul", ["s1", "c1"], ["a1"]), helper.make_node("Add", ["a1", "t1"], ["a2"]),
        _const("three", 3.0), _const("zero", 0.0), _const("six", 6.0),
        helper.make_node("Add", ["a2", "three"], ["h1"]), helper.make_node("Clip", ["h1", "zero", "six"], ["h2"]),
        helper.make_node("Mul", ["a2", "h2"], ["h3"]), helper.make_node("Div", ["h3", "six"], ["hs"]),
        helper.make_node("GlobalAveragePool", ["hs"], ["gp"]),
        _const("w2", w(8, 8, 1, 1)), helper.make_node("Conv", ["gp", "w2"], ["g1"]),
        helper.make_node("HardSigmoid", ["g1"], ["g2"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["hs", "g2"], ["se"]),
        _const("w3", w(4, 8, 3, 3)), helper.make_node("Conv", ["se", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        _const("roi", np.zeros(0)),
    ]
    if resize_sizes:  # a size computed from the input's shape: not traceable
        nodes += [helper.make_node("Shape", ["x"], ["shape"]),
                  helper.make_node("Resize", ["c3", "roi", "", "shape"], ["up"], mode="nearest",
                                   coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    else:
        nodes += [_const("scales", [1.0, 1.0, 2.0, 2.0]),
                  helper.make_node("Resize", ["c3", "roi", "scales"], ["up"], mode="nearest",
                                   coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    nodes += [_const("w4", w(4, 3, 1, 1)), helper.make_node("Conv", ["x", "w4"], ["c4"]),
              helper.make_node("Concat", ["up", "c4"], ["cat"], axis=1),
              _const("w5", w(1, 8, 1, 1)), helper.make_node("Conv", ["cat", "w5"], ["c5"]),
              helper.make_node("Sigmoid", ["c5"], ["y"])]
    return _checked_model(nodes, "tiny", out_channels=1)


def _onnx_reference(model, x: torch.Tensor) -> torch.Tensor:
    """``model``'s output on ``x`` by onnx's own reference runtime."""
    from onnx.reference import ReferenceEvaluator

    return torch.from_numpy(ReferenceEvaluator(model).run(None, {"x": x.numpy()})[0])


def test_load_onnx_moves_constant_weights_and_matches_onnx_reference():
    import onnx2torch

    model = _tiny_model()
    with pytest.raises(KeyError):  # onnx2torch alone reads weights from initializers only
        onnx2torch.convert(model)
    gm = deltaconv.load_onnx(model)
    assert len(model.graph.initializer) == 0  # the caller's model is left as it was
    x = torch.randn(1, 3, 16, 24)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), _onnx_reference(model, x), rtol=1e-5, atol=1e-6)


def test_load_onnx_reads_files(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(), str(path))
    x = torch.randn(1, 3, 8, 12)
    with torch.no_grad():
        torch.testing.assert_close(deltaconv.load_onnx(path)(x), deltaconv.load_onnx(str(path))(x))


def test_load_onnx_errors_name_the_argument(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ONNX file at .*missing.onnx"):
        deltaconv.load_onnx(tmp_path / "missing.onnx")
    with pytest.raises(TypeError, match="path or an onnx.ModelProto, got int"):
        deltaconv.load_onnx(3)


def test_onnx_div_divides_floats_and_truncates_integers():
    assert torch.equal(onnx_div(torch.tensor([7.0, -7.0]), torch.tensor(2.0)), torch.tensor([3.5, -3.5]))
    assert torch.equal(onnx_div(torch.tensor([7, -7]), torch.tensor(2)), torch.tensor([3, -3]))


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.5, 1.0])
def test_converted_onnx_model_equals_dense_at_threshold_zero(fraction):
    """Every op of the export converts (no fallbacks; Div as a scale, Resize as an upsampling), and the
    converted model equals the dense one frame after frame at threshold 0."""
    gm = deltaconv.load_onnx(_tiny_model())
    frames = changing_frames((1, 3, 18, 30), [fraction, fraction, 1.0 - fraction])
    dm = deltaconv.convert(gm, threshold=0.0, backend="reference", example_input=frames[0])
    assert not dm.report.fallbacks
    kinds = {type(layer).__name__ for layer in dm.delta_layers()}
    assert {"DCUpsample", "DCConcatenate", "DCMul", "DCSpatialMean"} <= kinds
    # the multiply-add after the first conv and the gate's 0.2 x + 0.5 fold into their convs
    assert sum(n.status == "folded" for n in dm.report.nodes) == 2
    with torch.no_grad():
        for x in frames:
            torch.testing.assert_close(dm(x), gm(x), rtol=1e-5, atol=1e-6)


def test_plain_torch_gives_the_same_outputs_without_onnx2torch_calls():
    from deltaconv.onnx_models import plain_torch

    gm = deltaconv.load_onnx(_tiny_model())
    plain = plain_torch(gm)
    called = {type(plain.get_submodule(n.target)).__module__ for n in plain.graph.nodes if n.op == "call_module"}
    assert not any(m.startswith("onnx2torch.node_converters.binary") or m.endswith("resize") for m in called)
    x = torch.randn(1, 3, 10, 14)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), gm(x), rtol=0, atol=0)
    dm = deltaconv.convert(plain, backend="reference", example_input=x)  # retraced: onnx_div stays one call
    assert not dm.report.fallbacks
    with torch.no_grad():
        torch.testing.assert_close(dm(x), gm(x), rtol=1e-5, atol=1e-6)


def test_resize_by_a_computed_size_is_a_conversion_error():
    gm = deltaconv.load_onnx(_tiny_model(resize_sizes=True))
    with pytest.raises(deltaconv.ConversionError, match="Resize whose roi, scales or sizes are computed"):
        deltaconv.convert(gm, example_input=torch.randn(1, 3, 8, 12))


def _prelu_model(slope_shape=(6, 1, 1)) -> "onnx.ModelProto":
    """Conv, PRelu (slopes of ``slope_shape``: one per channel as exporters write them, or one value), conv,
    PRelu of one slope: how face detectors and recognisers exported to ONNX (RetinaFace, ArcFace) spell
    PReLU. Input ``x`` [1, 3, H, W]."""
    g = np.random.default_rng(1)
    w = lambda *s: (g.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    slopes = np.linspace(-0.5, 0.75, int(np.prod(slope_shape)), dtype=np.float32).reshape(slope_shape)
    nodes = [_const("w1", w(6, 3, 3, 3)), helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             _const("a1", slopes), helper.make_node("PRelu", ["c1", "a1"], ["p1"]),
             _const("w2", w(4, 6, 3, 3)), helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             _const("a2", [0.2]), helper.make_node("PRelu", ["c2", "a2"], ["y"])]
    return _checked_model(nodes, "prelu", out_channels=4)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0])
def test_onnx_prelu_converts_to_the_activation_kernels_rule(fraction):
    """ONNX PRelu (onnx2torch's ``OnnxPReLU``, which branches on its slope's shape and did not trace) is one
    ``onnx_prelu`` call: a PReLU with its slopes per call, one per channel or one for all, no fallback, equal
    to onnx's reference runtime and to the dense model frame after frame at threshold 0; retraced by
    ``plain_torch`` it stays one call."""
    from deltaconv.onnx_models import onnx_prelu, plain_torch

    model = _prelu_model()
    gm = deltaconv.load_onnx(model)
    frames = changing_frames((1, 3, 12, 20), [fraction, fraction, 1.0 - fraction])
    with torch.no_grad():
        torch.testing.assert_close(plain_torch(gm)(frames[0]), _onnx_reference(model, frames[0]), rtol=1e-5,
                                   atol=1e-6)
    assert sum(n.target is onnx_prelu for n in plain_torch(gm).graph.nodes) == 2
    dm = deltaconv.convert(gm, threshold=0.0, backend="reference", example_input=frames[0])
    assert not dm.report.fallbacks
    fns = [repr(layer.fn) for layer in dm.delta_layers() if isinstance(layer, deltaconv.DCActivation)]
    assert fns == ["Activation(prelu, slopes per call)"] * 2
    with torch.no_grad():
        for x in frames:
            torch.testing.assert_close(dm(x), _onnx_reference(model, x), rtol=1e-5, atol=1e-5)


def test_onnx_prelu_of_another_broadcast_is_a_conversion_error():
    gm = deltaconv.load_onnx(_prelu_model(slope_shape=(1, 6, 1, 1)))
    with pytest.raises(deltaconv.ConversionError, match="ONNX PRelu whose slope .* cannot be traced"):
        deltaconv.convert(gm, example_input=torch.randn(1, 3, 8, 12))


@pytest.mark.parametrize("axis", [1, -3])
def test_onnx_softmax_over_channels_is_an_activation(axis):
    """An ONNX ``Softmax`` over axis 1 or -3 of a 4-D map (opset 13: onnx2torch's ``nn.Softmax(dim=axis)``), a
    segmentation head's class probabilities, converts to an activation of kind softmax (no fallback) and equals onnx's
    reference runtime frame after frame at threshold 0."""
    g = np.random.default_rng(2)
    nodes = [_const("w1", (g.standard_normal((5, 3, 3, 3)) * 0.5).astype(np.float32)),
             helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             _const("w2", (g.standard_normal((5, 5, 1, 1)) * 0.5).astype(np.float32)),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]), helper.make_node("Softmax", ["c2"], ["y"], axis=axis)]
    model = _checked_model(nodes, "softmax", out_channels=5)
    gm = deltaconv.load_onnx(model)
    frames = changing_frames((1, 3, 12, 20), [0.3, 0.0, 1.0])
    dm = deltaconv.convert(gm, threshold=0.0, backend="reference", example_input=frames[0])
    assert not dm.report.fallbacks
    kinds = [layer.fn.kind for layer in dm.delta_layers() if isinstance(layer, deltaconv.DCActivation)]
    assert kinds == ["relu", "softmax"]
    with torch.no_grad():
        for x in frames:
            torch.testing.assert_close(dm(x), _onnx_reference(model, x), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- PP-OCRv4's text detector
@pytest.fixture(scope="module")
def ppocr():
    from deltaconv.ppocr import ppocr_v4_det

    return ppocr_v4_det()


def test_ppocr_finds_text_on_a_real_frame(ppocr):
    """The real weights, with RapidOCR's input convention, see text drawn on a vtest.avi frame and
    nothing elsewhere (the probability map thresholded as RapidOCR does; DBNet marks a shrunk core
    of each text line, which its post-processing grows back into a box)."""
    import cv2

    from deltaconv.ppocr import TEXT_THRESHOLD
    from deltaconv.video import find_sample_video, to_tensor

    cap = cv2.VideoCapture(str(find_sample_video()))
    ok, frame = cap.read()
    cap.release()
    assert ok
    frame = cv2.resize(frame, (448, 320), interpolation=cv2.INTER_AREA)
    cv2.putText(frame, "TEXT", (40, 100), cv2.FONT_HERSHEY_SIMPLEX, 2.0, (255, 255, 255), 6)
    with torch.no_grad():
        prob = ppocr(to_tensor(frame))
    assert prob.shape == (1, 1, 320, 448)
    text = prob[0, 0] > TEXT_THRESHOLD
    assert text[50:110, 40:200].float().mean() > 0.1
    assert not text[150:].any() and not text[:, 260:].any()


def test_converted_ppocr_equals_dense_at_threshold_zero(ppocr):
    frames = video_frames(3, (96, 160))
    dm = deltaconv.convert(ppocr, threshold=0.0, backend="reference", example_input=frames[0])
    assert not dm.report.fallbacks
    with torch.no_grad():
        for x in frames:
            ref, out = ppocr(x), dm(x)
            assert (out - ref).abs().max().item() < 1e-5


def test_zoo_loads_ppocr_by_name_and_aliases():
    from deltaconv import zoo

    entry = zoo.load("dbnet")
    assert entry.name == "ppocr_det" and entry.task == "text" and "RapidOCR" in entry.weights
    assert "ppocr_det" in zoo.names()


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
def test_ppocr_on_the_cuda_backend(ppocr):
    """float32 on the CUDA kernels equals the dense model at threshold 0; float16 replayed as a CUDA
    graph stays within the dense float16 model's own rounding of the probability map."""
    torch.backends.cudnn.allow_tf32 = False
    model = ppocr.cuda()
    frames = [f.cuda() for f in video_frames(4, (96, 160))]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    assert not dm.report.fallbacks
    with torch.no_grad():
        for x in frames:
            assert (dm(x) - model(x)).abs().max().item() < 1e-4
    half = model.half()
    frames16 = [f.half() for f in frames]
    dm16 = deltaconv.convert(half, backend="cuda", example_input=frames16[0], cuda_graph=True, check_finite=False)
    with torch.no_grad():
        for x in frames16:
            out, ref = dm16(x).float(), half(x).float()
            assert (out - ref).abs().max().item() < 2e-2
