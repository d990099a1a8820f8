"""MTCNN's PNet with its real weights (deltaconv.mtcnn), converted: per-channel PReLUs and a softmax over the
channels, no dense fallback."""
from __future__ import annotations

import copy
import functools

import pytest
import torch

import deltaconv
from deltaconv.mtcnn import PNet, mtcnn_normalize, mtcnn_pnet
from deltaconv.modules import DCActivation
from deltaconv.video import read_frames
from helpers import cuda_backend_reason


@functools.lru_cache(maxsize=None)
def _released_pnet() -> PNet:
    return mtcnn_pnet()


def _pnet() -> PNet:
    """A copy of the released PNet (tests cast and move their model: ``.double()``, ``.cuda()`` act in place)."""
    return copy.deepcopy(_released_pnet())


def _frames(n: int, size=(120, 160), start: int = 0) -> list[torch.Tensor]:
    return [mtcnn_normalize(f) for f in read_frames(max_frames=n, size=size, normalize=False, start=start)]


def test_pnet_loads_the_released_weights():
    """facenet-pytorch's pnet.pt loads with strict=True into deltaconv's PNet (the same names), and the outputs
    have PNet's shapes: boxes [N, 4, h, w] and face probabilities [N, 2, h, w] that sum to 1 at every pixel."""
    model = _pnet()
    assert not model.training
    assert model.prelu1.weight.shape == (10,) and not torch.allclose(model.prelu1.weight, torch.full((10,), 0.25))
    with torch.no_grad():
        boxes, prob = model(_frames(1)[0])
    h, w = (120 - 2 + 1) // 2 - 4, (160 - 2 + 1) // 2 - 4  # conv1, the ceil-mode pooling, conv2 and conv3
    assert boxes.shape == (1, 4, h, w) and prob.shape == (1, 2, h, w)
    torch.testing.assert_close(prob.sum(1), torch.ones(1, h, w))


def test_mtcnn_pnet_names_a_missing_file():
    with pytest.raises(FileNotFoundError, match=r"mtcnn_pnet: path '/nonexistent/pnet.pt' does not exist"):
        mtcnn_pnet("/nonexistent/pnet.pt")


def test_converted_pnet_equals_dense_on_real_video():
    """Converted with no fallback (its PReLUs of one slope per channel and its softmax over the two channels
    are activations): at threshold 0 it equals the dense model on vtest.avi frames (float64, reference backend);
    at 0.005 it skips pixels and the face probabilities stay within 0.01 of the dense ones (vtest.avi's codec
    noise at 120x160 keeps most pixels active: FLOPs density 0.99; 0.94 at 0.01 with errors up to 0.1)."""
    model = _pnet().double()
    frames = [f.double() for f in _frames(5)]
    dm = deltaconv.convert(model, threshold=0.0, backend="reference", example_input=frames[0])
    assert not dm.report.fallbacks
    kinds = [layer.fn.kind for layer in dm.delta_layers() if isinstance(layer, DCActivation)]
    assert kinds == ["prelu", "prelu", "prelu", "softmax"]
    loose = deltaconv.convert(model, threshold=0.005, backend="reference", example_input=frames[0])
    with torch.no_grad():
        for f in frames:
            ref_boxes, ref_prob = model(f)
            boxes, prob = dm(f)
            torch.testing.assert_close(boxes, ref_boxes, rtol=0, atol=1e-12)
            torch.testing.assert_close(prob, ref_prob, rtol=0, atol=1e-12)
            _, prob_loose = loose(f)
            assert (prob_loose - ref_prob).abs().max() < 0.01
    stats = loose.stats()
    assert sum(s["mean_flops_done"] for s in stats if s["flops_dense"]) < sum(s["flops_dense"] for s in stats)


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
def test_pnet_on_the_cuda_backend():
    """float32 on the CUDA kernels equals the dense model at threshold 0 (the softmax runs through PyTorch);
    float16 replayed as a CUDA graph stays within the dense float16 model's own rounding of the probabilities."""
    torch.backends.cudnn.allow_tf32 = False
    model = _pnet().float().cuda()
    frames = [f.cuda() for f in _frames(4, (240, 320))]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0])
    assert not dm.report.fallbacks
    with torch.no_grad():
        for x in frames:
            for got, ref in zip(dm(x), model(x)):
                assert (got - ref).abs().max().item() < 1e-4
    half = mtcnn_pnet().cuda().half()
    frames16 = [f.half() for f in frames]
    dm16 = deltaconv.convert(half, backend="cuda", example_input=frames16[0], cuda_graph=True, check_finite=False)
    with torch.no_grad():
        for x in frames16:
            _, prob = dm16(x)
            assert (prob.float() - half(x)[1].float()).abs().max().item() < 2e-2


def test_pnet_faces_is_pnet_on_imagenet_frames():
    """The zoo's ``mtcnn_pnet`` (aliases ``pnet``, ``mtcnn``) is PNetFaces: on ImageNet-normalised frames it gives
    PNet's face probability (channel 1) and boxes on MTCNN's scaling of the same frames; converted, its input affine
    folds into the first convolution, nothing falls back, and it equals the dense model at threshold 0."""
    from deltaconv import zoo
    from deltaconv.mtcnn import PNetFaces

    entry = zoo.load("pnet")
    assert entry.name == "mtcnn_pnet" and entry.task == "faces" and "facenet-pytorch" in entry.weights
    assert isinstance(entry.model, PNetFaces) and zoo.load("MTCNN").name == "mtcnn_pnet"
    frames = list(read_frames(max_frames=3, size=(120, 160)))
    with torch.no_grad():
        faces, boxes = entry.model(frames[0])
        ref_boxes, ref_prob = _pnet()(_frames(1)[0])
    torch.testing.assert_close(faces, ref_prob[:, 1:2], rtol=0, atol=1e-5)
    torch.testing.assert_close(boxes, ref_boxes, rtol=0, atol=1e-5)
    dm = deltaconv.convert(entry.model, threshold=0.0, example_input=frames[0])
    assert not dm.report.fallbacks
    # the report's output rows name the layers they densify (the getitem of the face channel, conv4_2's boxes)
    assert sorted(n.target for n in dm.report.nodes if n.status == "output") == ["getitem", "pnet.conv4_2"]
    with torch.no_grad():
        for x in frames:
            for got, ref in zip(dm(x), entry.model(x)):
                torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(bool(cuda_backend_reason()), reason=cuda_backend_reason() or "ok")
def test_pnet_faces_on_the_cuda_backend():
    """The zoo's PNetFaces (input affine folded into conv1, the face channel sliced out) in float16 on the CUDA
    kernels, replayed as a CUDA graph, stays within the dense float16 model's rounding of the face probabilities."""
    from deltaconv.mtcnn import mtcnn_pnet_faces

    model = mtcnn_pnet_faces().cuda().half()
    frames = [f.cuda().half() for f in read_frames(max_frames=4, size=(240, 320))]
    dm = deltaconv.convert(model, backend="cuda", example_input=frames[0], cuda_graph=True, check_finite=False)
    assert not dm.report.fallbacks
    with torch.no_grad():
        for x in frames:
            faces, boxes = dm(x)
            ref_faces, ref_boxes = model(x)
            assert (faces.float() - ref_faces.float()).abs().max().item() < 2e-2
            assert (boxes.float() - ref_boxes.float()).abs().max().item() < 5e-2
