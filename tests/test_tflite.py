"""TFLite models through deltaconv.load_tflite: MediaPipe's BlazePose full landmark network (real weights, the
mediapipe package's pose_landmark_full.tflite) against TFLite's own runtime (LiteRT), and converted."""
from __future__ import annotations

import copy
import functools
import importlib.util
from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import deltaconv
from deltaconv.blazepose import OUTPUT_NAMES, blazepose_full
from deltaconv.fidelity import flops_density
from deltaconv.tflite_models import TFLiteModule, _same_padding, load_tflite
from deltaconv.video import read_frames
from deltaconv.weights import blazepose_full_tflite
from helpers import cuda_backend_reason, cuda_kernel_names, cudnn_tf32_off


@functools.lru_cache(maxsize=None)
def _network() -> TFLiteModule:
    return load_tflite(blazepose_full_tflite())


def _crops(n: int, normalize: bool = True) -> list[torch.Tensor]:
    """The first ``n`` frames of vtest.avi resized to the network's 256x256 crop."""
    return list(read_frames(max_frames=n, size=(256, 256), normalize=normalize))


def test_same_padding_is_tensorflows():
    """TensorFlow's SAME padding: out = ceil(size / stride), the odd pixel of the total after (bottom, right)."""
    assert _same_padding(128, 3, 2, 1) == (0, 1)
    assert _same_padding(129, 3, 2, 1) == (1, 1)
    assert _same_padding(64, 3, 1, 1) == (1, 1)
    assert _same_padding(64, 5, 1, 2) == (4, 4)
    assert _same_padding(7, 1, 2, 1) == (0, 0)


def _one_op_model(op_code: int) -> bytes:
    """A .tflite file of one builtin op ``op_code`` from a float32 input [1, 4, 4, 3] to an output of that shape (built
    with the flatbuffers builder functions of the tflite package)."""
    import flatbuffers
    import tflite

    b = flatbuffers.Builder(1024)

    def int_vector(start, values):
        start(b, len(values))
        for v in reversed(values):
            b.PrependInt32(v)
        return b.EndVector()

    def offset_vector(start, offsets):
        start(b, len(offsets))
        for o in reversed(offsets):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    tflite.BufferStart(b)
    empty = tflite.BufferEnd(b)
    tensors = []
    for name in ("x", "y"):
        label = b.CreateString(name)
        shape = int_vector(tflite.TensorStartShapeVector, [1, 4, 4, 3])
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, 0)
        tflite.TensorAddBuffer(b, 0)
        tflite.TensorAddName(b, label)
        tensors.append(tflite.TensorEnd(b))
    ins, outs = int_vector(tflite.OperatorStartInputsVector, [0]), int_vector(tflite.OperatorStartOutputsVector, [1])
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, 0)
    tflite.OperatorAddInputs(b, ins)
    tflite.OperatorAddOutputs(b, outs)
    op = tflite.OperatorEnd(b)
    tensor_vec = offset_vector(tflite.SubGraphStartTensorsVector, tensors)
    g_ins = int_vector(tflite.SubGraphStartInputsVector, [0])
    g_outs = int_vector(tflite.SubGraphStartOutputsVector, [1])
    ops = offset_vector(tflite.SubGraphStartOperatorsVector, [op])
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensor_vec)
    tflite.SubGraphAddInputs(b, g_ins)
    tflite.SubGraphAddOutputs(b, g_outs)
    tflite.SubGraphAddOperators(b, ops)
    graph = tflite.SubGraphEnd(b)
    tflite.OperatorCodeStart(b)
    tflite.OperatorCodeAddBuiltinCode(b, op_code)
    tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(op_code, 127))
    tflite.OperatorCodeAddVersion(b, 1)
    code = tflite.OperatorCodeEnd(b)
    codes = offset_vector(tflite.ModelStartOperatorCodesVector, [code])
    graphs = offset_vector(tflite.ModelStartSubgraphsVector, [graph])
    buffers = offset_vector(tflite.ModelStartBuffersVector, [empty])
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes)
    tflite.ModelAddSubgraphs(b, graphs)
    tflite.ModelAddBuffers(b, buffers)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _litert_outputs(path, x: torch.Tensor) -> Optional[dict]:
    """TFLite's runtime's outputs by tensor id for the NHWC input ``x`` (``None`` without ai-edge-litert)."""
    if importlib.util.find_spec("ai_edge_litert") is None:
        return None
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.numpy().copy())
    interpreter.invoke()
    return {d["index"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


@pytest.mark.parametrize("op, torch_fn", [("LOGISTIC", torch.sigmoid), ("RELU", F.relu), ("RELU6", F.relu6),
                                          ("TANH", torch.tanh), ("HARD_SWISH", F.hardswish)])
def test_one_op_graphs(tmp_path, op, torch_fn):
    """A one-op graph of each element-wise op loads and computes its torch function (and what TFLite's runtime
    computes, where it is installed)."""
    import tflite

    path = tmp_path / f"{op}.tflite"
    path.write_bytes(_one_op_model(getattr(tflite.BuiltinOperator, op)))
    x = torch.linspace(-8, 8, 48).view(1, 4, 4, 3)
    with torch.no_grad():
        y = load_tflite(path)(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(y, torch_fn(x))
    ref = _litert_outputs(path, x)
    if ref is not None:
        np.testing.assert_allclose(y.numpy(), ref[1], rtol=1e-6, atol=1e-6)


def test_an_unsupported_op_is_named(tmp_path):
    import tflite

    from deltaconv.tflite_models import TFLiteUnsupportedError

    path = tmp_path / "exp.tflite"
    path.write_bytes(_one_op_model(tflite.BuiltinOperator.EXP))
    with pytest.raises(TFLiteUnsupportedError, match="load_tflite: op 0 is EXP; supported: CONV_2D"):
        load_tflite(path)


def test_load_tflite_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_tflite: path .*nothing.tflite"):
        load_tflite(tmp_path / "nothing.tflite")


@pytest.mark.skipif(importlib.util.find_spec("ai_edge_litert") is None, reason="needs ai-edge-litert (TFLite runtime)")
def test_blazepose_network_equals_tflite_runtime():
    """Every output of the loaded network equals what TFLite's runtime computes from the same file, on a real frame
    and on noise (relative error of each output <= 2e-3; measured <= 6e-4, the largest on the pose flag, a
    probability near 4e-5 on these crops). The 4-D outputs come channels first."""
    from ai_edge_litert.interpreter import Interpreter

    network = _network()
    interpreter = Interpreter(model_path=str(blazepose_full_tflite()))
    interpreter.allocate_tensors()
    noise = torch.from_numpy(np.random.default_rng(0).random((1, 3, 256, 256), dtype=np.float32))
    for x in (_crops(1, normalize=False)[0], noise):
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.permute(0, 2, 3, 1).numpy().copy())
        interpreter.invoke()
        with torch.no_grad():
            outs = network(x)
        assert len(outs) == len(network.output_ids) == 5
        for tid, out in zip(network.output_ids, outs):
            ref = interpreter.get_tensor(tid)
            ref = ref.transpose(0, 3, 1, 2) if ref.ndim == 4 else ref
            assert out.shape == ref.shape
            assert np.linalg.norm(out.numpy() - ref) <= 2e-3 * np.linalg.norm(ref), tid


def test_blazepose_converts_and_equals_dense():
    """BlazePoseFull (ImageNet-normalised input, its affine folded into the first convolution) converts with no
    fallback; at threshold 0 every output equals the dense model on changing vtest frames (float64); at 0.01 the
    layers skip work (FLOPs density below 1) and the heatmaps stay within 1 % of the dense ones."""
    model = blazepose_full()
    frames = _crops(4)
    with torch.no_grad():
        assert tuple(model(frames[0])) == OUTPUT_NAMES
    dense = blazepose_full().double()
    dm = deltaconv.convert(dense, threshold=0.0, example_input=frames[0].double())
    assert not dm.report.fallbacks
    with torch.no_grad():
        for x in frames:
            got, ref = dm(x.double()), dense(x.double())
            for name in OUTPUT_NAMES:
                assert (got[name] - ref[name]).norm() <= 1e-9 * ref[name].norm(), name
    sparse = deltaconv.convert(model, threshold=0.01, example_input=frames[0])
    with torch.no_grad():
        for x in frames:
            got, ref = sparse(x), model(x)
            assert (got["heatmaps"] - ref["heatmaps"]).norm() <= 0.01 * ref["heatmaps"].norm()
    assert flops_density(sparse.stats()) < 1.0


def test_blazepose_in_the_zoo():
    """The zoo's blazepose_full (alias blazepose): BlazePoseFull with its input size and task pose (the demo draws its
    person mask and its skeleton)."""
    from deltaconv import zoo
    from deltaconv.blazepose import BlazePoseFull

    entry = zoo.load("BlazePose")
    assert entry.name == "blazepose_full" and isinstance(entry.model, BlazePoseFull)
    assert entry.input_size == (256, 256) and entry.task == "pose" and "mediapipe" in entry.weights
    assert "blazepose_full" in zoo.names() and zoo.load("mobilenet_v2").input_size is None
    by_path = zoo.load("deltaconv.blazepose:blazepose_full")  # the module names its size and task itself
    assert by_path.input_size == (256, 256) and by_path.task == "pose"


def _vtest_crops(box: tuple[int, int, int], first: int, count: int) -> list[torch.Tensor]:
    """Square crops ``box = (x0, y0, side)`` of vtest.avi frames ``first`` .. ``first + count - 1``, resized to 256x256
    and ImageNet-normalised (a fixed region of the static camera's frame, as a pose stage watches one person)."""
    x0, y0, side = box
    return list(read_frames(max_frames=count, size=(256, 256), start=first, crop=(x0, y0, side, side)))


#: two pedestrians of vtest.avi's frame 30 (boxes found from the difference to the median frame) and an empty corner
_PEDESTRIANS, _EMPTY = ((585, 227, 148), (318, 154, 166)), (0, 0, 150)


def test_blazepose_keypoints_lie_on_the_person_and_the_demo_draws_them():
    """keypoints(): (x, y) in input pixels and a visibility probability; on two pedestrians of vtest.avi most body
    landmarks are visible and lie on the network's own person mask; the demo's pose panel draws them."""
    from deltaconv import demo
    from deltaconv.blazepose import keypoints

    model = blazepose_full()
    for box in _PEDESTRIANS:
        with torch.no_grad():
            out = model(_vtest_crops(box, 30, 1)[0])
        xy, visible = keypoints(out["landmarks"])
        assert xy.shape == (1, 33, 2) and visible.shape == (1, 33) and 0 <= visible.min() <= visible.max() <= 1
        shown = visible[0] >= 0.5
        assert shown.sum() >= 20, box
        px = xy[0][shown].round().long().clamp(0, 255)
        # the mask (sigmoid > 0.5 covers 8-9 % of the crop) grown by 4 pixels: hands and feet sit on its edge
        person = F.max_pool2d((out["out"] > 0).float(), 9, stride=1, padding=4)[0, 0] > 0
        on_person, swapped = (person[px[:, 1], px[:, 0]].float().mean().item(),
                              person[px[:, 0], px[:, 1]].float().mean().item())
        assert on_person > 0.85 and swapped < 0.5, (box, on_person, swapped)  # 0.92-0.96 and 0.17 here
    panel = np.full((128, 128, 3), 128, np.uint8)
    drawn = demo.draw_result(panel, out, "pose")
    points = (xy[0][shown] / 2).round().long().clamp(0, 127)  # the panel is half the input's size
    colours = drawn[points[:, 1], points[:, 0]].astype(int)  # BGR: the landmarks' amber dots, over mask and lines
    assert ((colours[:, 0] < 60) & (colours[:, 1] > 180) & (colours[:, 2] > 220)).mean() > 0.8
    with pytest.raises(ValueError, match=r"keypoints: landmarks must be \[N, 195\].*got \(1, 117\)"):
        keypoints(out["world_landmarks"])


def test_blazepose_finds_the_pedestrians():
    """The real weights: the pose flag is above 0.99 on crops around two pedestrians of vtest.avi and below 1e-3 on
    a crop of buildings. Converted (threshold 0.01), the fixed crop of the first pedestrian over frames 28-39, while
    they walk through it: the pose flag within 0.01 and the landmarks' x, y within 0.1 crop pixels of the dense
    model's (measured: 0.035 px; 0.006 px at 0.005, 4.2 px at 0.02)."""
    model = blazepose_full()
    with torch.no_grad():
        for box in _PEDESTRIANS:
            assert model(_vtest_crops(box, 30, 1)[0])["pose_flag"].item() > 0.99, box
        assert model(_vtest_crops(_EMPTY, 30, 1)[0])["pose_flag"].item() < 1e-3
    crops = _vtest_crops(_PEDESTRIANS[0], 28, 12)
    dm = deltaconv.convert(model, threshold=0.01, example_input=crops[0])
    with torch.no_grad():
        for x in crops:
            got, ref = dm(x), model(x)
            assert abs(got["pose_flag"].item() - ref["pose_flag"].item()) < 0.01
            assert (got["landmarks"] - ref["landmarks"]).view(-1, 39, 5)[..., :2].abs().max().item() < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
def test_blazepose_on_the_cuda_backend():
    """float16 on the CUDA kernels, replayed as a CUDA graph, at threshold 0: the heatmaps and landmarks as close to
    the float32 model (TF32 off) as the dense float16 model is, within 3x its error over the frames. Not to the dense
    float16 model itself: this network's float16 rounding alone moves its landmarks by 0.2-1.4 % of their norm from
    frame to frame, so two float16 computations of it differ by as much (an H100 gave 1.4 % on the fourth frame)."""
    exact = blazepose_full().cuda()
    model = blazepose_full().cuda().half()
    frames = [f.cuda() for f in _crops(6)]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0].half(), cuda_graph=True, check_finite=False)
    assert not dm.report.fallbacks
    squares = {(who, name): 0.0 for who in ("delta", "dense", "exact") for name in ("heatmaps", "landmarks")}
    allow_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            for x in frames:
                outs = {"delta": dm(x.half()), "dense": model(x.half()), "exact": exact(x)}
                for who, out in outs.items():
                    for name in ("heatmaps", "landmarks"):
                        diff = out[name].double() - (0 if who == "exact" else outs["exact"][name].double())
                        squares[who, name] += float(diff.norm() ** 2)
    finally:
        torch.backends.cudnn.allow_tf32 = allow_tf32
    for name in ("heatmaps", "landmarks"):
        delta, dense = ((squares[who, name] / squares["exact", name]) ** 0.5 for who in ("delta", "dense"))
        assert delta <= 3 * dense and delta < 0.05, (name, delta, dense)


# ----------------------------------------------------------------------------- the other MediaPipe models
#: MediaPipe's other models that load (file, its layers converted): PReLUs, channel pads, concatenations of the
#: reshaped detection heads, a mean and fully connected layers (the hand landmarks), channel slices (hand re-crop),
#: sparse weights (DENSIFY) and DEPTH_TO_SPACE (the pose and full-range face detectors)
MEDIAPIPE_MODELS = [("face_detection_short_range.tflite", 98), ("face_landmark.tflite", 104),
                    ("hand_landmark_full.tflite", 104), ("hand_landmark_lite.tflite", 106),
                    ("iris_landmark.tflite", 172), ("palm_detection_full.tflite", 148),
                    ("palm_detection_lite.tflite", 128), ("hand_recrop.tflite", 64),
                    ("pose_detection.tflite", 161), ("face_detection_full_range_sparse.tflite", 213)]


def _mediapipe_file(filename: str):
    from deltaconv.weights import mediapipe_tflite

    try:
        return mediapipe_tflite(filename)
    except FileNotFoundError as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("filename, converted", MEDIAPIPE_MODELS, ids=[m[0].split(".")[0] for m in MEDIAPIPE_MODELS])
def test_mediapipe_model_equals_tflite_runtime_and_converts(filename, converted):
    """Each file loads at its own input size; on a vtest.avi crop every output equals TFLite's runtime's (relative
    error <= 1e-4; measured <= 6e-6), and converted it has no fallback and equals the loaded network at threshold 0
    (float64, reference backend)."""
    path = _mediapipe_file(filename)
    network = load_tflite(path)
    h, w = network.input_hw
    x = next(read_frames(max_frames=1, start=30, size=(h, w), crop=(585, 227, 148, 148), normalize=False))
    with torch.no_grad():
        outs = network(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    ref = _litert_outputs(path, x.permute(0, 2, 3, 1))
    if ref is not None:
        for tid, out in zip(network.output_ids, outs):
            want = ref[tid].transpose(0, 3, 1, 2) if ref[tid].ndim == 4 else ref[tid]
            err = np.linalg.norm(out.numpy() - want) / np.linalg.norm(want)
            assert err <= 1e-4, (filename, tid, err)
    network = network.double()
    dm = deltaconv.convert(network, example_input=x.double())
    assert not dm.report.fallbacks and len(dm.report.converted) == converted
    with torch.no_grad():
        for frame in (x, x.flip(-1), x):
            got, want = dm(frame.double()), network(frame.double())
            for g, w_ in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(g, w_, rtol=1e-9, atol=1e-9)


def _errors(outputs: list, reference: list) -> list[float]:
    """Each output's relative error over the frames after the first (the key frame): sqrt(sum of squared
    differences / sum of squares of the reference)."""
    return [float(sum((o[i] - r[i]).double().norm() ** 2 for o, r in zip(outputs[1:], reference[1:]))
                  / sum(r[i].double().norm() ** 2 for r in reference[1:])) ** 0.5 for i in range(len(reference[0]))]


def _hand_landmarks() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """MediaPipe's hand landmark file as a model (eval mode, ImageNet-normalised frames in) and 10 vtest frames of a
    pedestrian crop at its 224x224 (the first the key frame)."""
    from deltaconv import zoo

    entry = zoo.load(str(_mediapipe_file("hand_landmark_full.tflite")))
    frames = list(read_frames(max_frames=10, start=28, size=entry.input_size, crop=(585, 227, 148, 148)))
    return entry.model.eval(), frames


def test_hand_landmarks_in_float16_stay_as_close_to_float64_as_the_dense_model():
    """MediaPipe's hand landmark file as a model (its input affine ``x * scale + shift``, then a stem of 3
    input channels), float16, reference backend, threshold 0, 10 vtest frames: the landmarks and world landmarks
    within 1.5x the dense float16 model's error against float64 (1.19x and 0.99x measured). The input affine gives
    its whole values and the stem recomputes from them; with the stem summing float16-rounded changes in a float32
    accumulator (delta mode, ``MIN_RECOMPUTE_CHANNELS = 8``) the roundings added up to 11x and 7x; with the stem
    reading the sparsifier's rounded sends instead of the frame (before ``whole_from_frame``) and the reference's
    convolutions rounding before their bias, 2.4x and 1.5x."""
    model, frames = _hand_landmarks()
    exact, model = model.double(), copy.deepcopy(model).half()
    dm = deltaconv.convert(model, threshold=0, backend="reference", example_input=frames[0].half())
    notes = {n.layer: n.note for n in dm.report.nodes}
    assert "gives its whole output" in notes["mul"] and "gives its whole output" in notes["add"]
    assert "recomputes for" in notes["network.layers.op002_conv_2d"]
    with torch.no_grad():
        want = [exact(f.double()) for f in frames]
        dense = _errors([model(f.half()) for f in frames], want)
        delta = _errors([dm(f.half()) for f in frames], want)
    for i in (0, 3):  # landmarks, world landmarks
        assert delta[i] <= 1.5 * dense[i], (i, delta[i], dense[i])


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
def test_hand_landmarks_on_the_cuda_backend():
    """The float16 test above on the CUDA kernels, replayed as a CUDA graph, against the float32 model (TF32 off):
    the landmarks and world landmarks within 2x the dense float16 model's error. On an H200 with the stem in delta
    mode (2026-12-07 18:45 UTC, ``benchmarks/results/mediapipe_cuda.txt``) they were 6.3x and 4.2x; with it
    recomputing from the sparsifier's sends (H100, 21:10 UTC) 1.29x and 1.04x."""
    model, frames = _hand_landmarks()
    frames = [f.cuda() for f in frames]
    exact, model = copy.deepcopy(model).cuda(), model.cuda().half()
    dm = deltaconv.convert(model, threshold=0, backend="cuda", example_input=frames[0].half(), cuda_graph=True,
                           check_finite=False)
    assert not dm.report.fallbacks
    with cudnn_tf32_off(), torch.no_grad():
        want = [exact(f) for f in frames]
        dense = _errors([model(f.half()) for f in frames], want)
        delta = _errors([tuple(o.clone() for o in dm(f.half())) for f in frames], want)
    for i in (0, 3):  # landmarks, world landmarks
        assert delta[i] <= 2 * dense[i], (i, delta[i], dense[i])


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
def test_selfie_segmentation_on_the_cuda_backend():
    """MediaPipe's general selfie segmentation (ten squeeze-excite poolings spelled as whole-map AVERAGE_POOL_2Ds,
    64x64 to 128x128 windows) on the CUDA kernels, float16, replayed as a CUDA graph, 8 whole vtest frames at its
    256x256: its poolings run on the adaptive pooling's kernels (no ``avgpool_kernel`` in a frame: the window
    kernel's thread per output element made the model 3.8x slower, ``benchmarks/results/mediapipe_cuda.txt``) and
    its mask is within 2x the dense float16 model's error against the float32 model (TF32 off; 1.4x over 40 vtest
    frames in ``zoo_speed.py``, H100, 2026-12-07; passed there 2026-12-08 00:04 UTC)."""
    from deltaconv import zoo

    entry = zoo.load(str(_mediapipe_file("selfie_segmentation.tflite")))
    frames = [f.cuda() for f in read_frames(max_frames=8, start=200, size=entry.input_size)]
    model = entry.model.eval().cuda()
    exact, model = copy.deepcopy(model), model.half()
    dm = deltaconv.convert(model, threshold=0, backend="cuda", example_input=frames[0].half(), cuda_graph=True,
                           check_finite=False)
    assert not dm.report.fallbacks
    with cudnn_tf32_off(), torch.no_grad():
        want = [(exact(f),) for f in frames]
        dense = _errors([(model(f.half()),) for f in frames], want)
        delta = [(dm(f.half()).clone(),) for f in frames[:3]]  # the key frame, then the graph's capture
        names = cuda_kernel_names(lambda: delta.append((dm(frames[3].half()).clone(),)))
        delta += [(dm(f.half()).clone(),) for f in frames[4:]]
    assert delta[0][0].shape == want[0][0].shape
    if names:  # empty where the profiler records no kernels
        assert any("adaptive_avgpool_kernel" in n for n in names), names
        assert not any("::avgpool_kernel" in n for n in names), [n for n in names if "avgpool" in n]
    assert _errors(delta, want)[0] <= 2 * dense[0], (_errors(delta, want), dense)


def test_the_mediapipe_model_that_does_not_load_says_why():
    from deltaconv.tflite_models import TFLiteUnsupportedError

    with pytest.raises(TFLiteUnsupportedError, match="op 192 is CUSTOM:Landmarks2TransformMatrix; supported: "):
        load_tflite(_mediapipe_file("face_landmark_with_attention.tflite"))


#: the selfie segmentation files, MediaPipe's solution's model_selection for each, and a vtest.avi region with people
SELFIE_MODELS = [("selfie_segmentation.tflite", 0, (450, 150, 300, 300)),
                 ("selfie_segmentation_landscape.tflite", 1, (300, 140, 448, 252))]


@pytest.mark.parametrize("filename, selection, crop", SELFIE_MODELS, ids=["general", "landscape"])
def test_selfie_segmentation_equals_mediapipes_runtime_and_converts(filename, selection, crop):
    """MediaPipe's selfie segmentation (squeeze-excite MULs, AVERAGE_POOL_2D or MEAN, HARD_SWISH, and its custom
    Convolution2DTransposeBias as an nn.ConvTranspose2d): on a vtest.avi region with people, at the file's own size,
    its mask equals what MediaPipe's own runtime (its SelfieSegmentation solution, which registers the custom op)
    computes, within 1e-4 of its norm (measured 1e-5 / 8e-6); converted, no fallback and equal at threshold 0
    (float64, reference backend)."""
    path = _mediapipe_file(filename)
    network = load_tflite(path)
    h, w = network.input_hw
    x = next(read_frames(max_frames=1, start=30, size=(h, w), crop=crop, normalize=False))
    rgb = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    x = torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255  # the uint8 frame MediaPipe gets, as it scales it
    with torch.no_grad():
        mask = network(x)[0, 0].numpy()
    try:
        from mediapipe.python.solutions import selfie_segmentation
    except ImportError as error:  # mediapipe's runtime needs attrs (requirements-dev.txt)
        pytest.skip(f"MediaPipe's runtime does not import: {error}")
    ref = selfie_segmentation.SelfieSegmentation(model_selection=selection).process(rgb).segmentation_mask
    assert ref.shape == mask.shape and (ref > 0.5).mean() > 0.01  # people in the region
    assert np.linalg.norm(mask - ref) / np.linalg.norm(ref) <= 1e-4
    network = network.double()
    dm = deltaconv.convert(network, example_input=x.double())
    assert not dm.report.fallbacks
    with torch.no_grad():
        for frame in (x, x.flip(-1), x):
            torch.testing.assert_close(dm(frame.double()), network(frame.double()), rtol=1e-9, atol=1e-9)
