"""The side-by-side demo (deltaconv.demo) on real video with real weights, and its drawing helpers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from deltaconv import demo


def test_tiny_demo_mobilenet_v2_real_weights(tmp_path):
    import cv2

    out = tmp_path / "demo.mp4"
    snap = tmp_path / "frame.png"
    s = demo.run_demo(model="mobilenet_v2", threshold=0.0, device="cpu", max_frames=3, size=(64, 96), out=out,
                      snapshot=snap, progress=False, verbose=False)
    cap = cv2.VideoCapture(str(out))
    assert cap.isOpened()
    n, shape = 0, None
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        n, shape = n + 1, frame.shape
    cap.release()
    assert n == 3
    img = cv2.imread(str(snap))
    assert img is not None and img.shape == shape
    # three panels of the source frame's aspect (vtest.avi: 768x576) over an information bar
    assert img.shape[0] > demo.PANEL_HEIGHT and img.shape[1] == 3 * round(demo.PANEL_HEIGHT * 768 / 576)
    assert s["frames"] == 3 and s["size"] == (64, 96) and s["task"] == "classification"
    assert s["backend"] == "reference" and s["device"] == "cpu"
    assert s["top1_agreement"] == 1.0
    assert s["rel_error"] < 1e-4 and s["max_rel_error"] < 1e-4
    assert 0 < s["density"] <= 1 and s["dense_ms"] > 0 and s["delta_ms"] > 0
    assert math.isclose(s["speedup"], s["dense_ms"] / s["delta_ms"])
    assert [r["key"] for r in s["per_frame"]] == [True, False, False]
    assert s["dtype"] == "float32" and s["cuda_graph"] is False and s["fold_bn"] is True  # the CPU's defaults
    assert s["recompute"] is True
    assert not any(r["records_graph"] for r in s["per_frame"])
    # the right panel draws the input sparsifier's mask of the frame
    assert [r["mask_density"] for r in s["per_frame"]] == pytest.approx([r["density"] for r in s["per_frame"]])
    text = demo.format_summary(s)
    assert "top-1 agreement 100.0%" in text and "speedup" in text and "float32" in text
    assert s["thresholds"] == "threshold 0" and "threshold 0," in text


def test_demo_crop_and_start_choose_what_the_models_see():
    """``crop``: the models see (and the panels show) a fixed region of every frame; one outside the frame is named.
    ``start``: the first frame run is that frame of the video."""
    import unittest.mock

    import cv2

    from deltaconv import zoo
    from deltaconv.video import find_sample_video, to_tensor

    seen = []
    model = nn.Conv2d(3, 2, 3, padding=1)
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    entry = zoo.ZooModel("conv", model, "segmentation", "random")
    with unittest.mock.patch.object(zoo, "load", lambda name, input_range=None: entry):
        s = demo.run_demo(model="conv", device="cpu", max_frames=2, out=None, crop=(100, 50, 40, 30), progress=False,
                          verbose=False)
        assert s["crop"] == (100, 50, 40, 30) and s["size"] == (30, 40)  # the region's own size without --size
        assert {tuple(x.shape) for x in seen} == {(1, 3, 30, 40)}
        assert "each frame's region x=100, y=50, width 40, height 30" in demo.format_summary(s)
        with pytest.raises(ValueError, match=r"--crop: the region \(x=700, y=0, width=100, height=10\) does not lie "
                                             r"inside the 768x576"):
            demo.run_demo(model="conv", device="cpu", max_frames=1, out=None, crop=(700, 0, 100, 10), progress=False,
                          verbose=False)
        with pytest.raises(ValueError, match=r"--crop must be \(x, y, width, height\).* got \(1, 2, 3\)"):
            demo.run_demo(model="conv", out=None, crop=(1, 2, 3))
        seen.clear()
        s = demo.run_demo(model="conv", device="cpu", max_frames=1, out=None, start=5, size=(8, 8), progress=False,
                          verbose=False)
        assert s["start"] == 5 and "1 frames from frame 5 at" in demo.format_summary(s)
        with pytest.raises(ValueError, match=r"--start: must be an integer >= 0, got -1"):
            demo.run_demo(model="conv", out=None, start=-1)
        s = demo.run_demo(model="conv", device="cpu", max_frames=1, out=None, size=(8, 8), task="faces",
                          progress=False, verbose=False)
        assert s["task"] == "faces"  # the given task over the zoo's ("segmentation")
        with pytest.raises(ValueError, match=r"--task: must be one of classification, .*, pose, got 'boxes'"):
            demo.run_demo(model="conv", out=None, task="boxes")
    cap = cv2.VideoCapture(str(find_sample_video()))
    frames = [cap.read()[1] for _ in range(6)]
    cap.release()
    torch.testing.assert_close(seen[0], to_tensor(frames[5], (8, 8)))  # frame 5, not 4 or 6
    assert not torch.equal(seen[0], to_tensor(frames[4], (8, 8)))


def test_demo_names_per_layer_thresholds(tmp_path):
    """With a thresholds file the bar and the summary name the file, not the uniform default."""
    import json

    import deltaconv
    from deltaconv.weights import mobilenet_v2_imagenet
    names = deltaconv.convert(mobilenet_v2_imagenet(), example_input=torch.randn(1, 3, 32, 48)).thresholds()
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"thresholds": {n: 0.0 for n in names}}))
    s = demo.run_demo(model="mobilenet_v2", device="cpu", max_frames=2, size=(32, 48), out=None,
                      thresholds=str(path), progress=False, verbose=False)
    assert s["thresholds"] == "thresholds cal.json" and "thresholds cal.json" in demo.format_summary(s)
    assert s["rel_error"] < 1e-4  # every layer at 0, the file's values, not the default 0.02
    assert s["fold_bn"] is True
    path.write_text(json.dumps({"thresholds": {n: 0.0 for n in names}, "fold_bn": False}))
    s = demo.run_demo(model="mobilenet_v2", device="cpu", max_frames=2, size=(32, 48), out=None,
                      thresholds=str(path), progress=False, verbose=False)
    assert s["fold_bn"] is False  # the conversion the file was calibrated with


def test_demo_leaves_periodic_key_frames_out_of_the_means(monkeypatch):
    """In float16 the converted model makes a key frame every AUTO_REFRESH frames: the demo marks
    them as key frames (eager, dense work) and leaves them out of the mean timings."""
    from deltaconv import model as model_module
    monkeypatch.setitem(model_module.AUTO_REFRESH, torch.float16, 2)
    s = demo.run_demo(model="mobilenet_v2", threshold=0.0, device="cpu", max_frames=5, size=(32, 48), out=None,
                      progress=False, verbose=False, dtype="float16")
    assert [r["key"] for r in s["per_frame"]] == [True, False, True, False, True]
    steady = [r["delta_ms"] for r in s["per_frame"] if not r["key"]]
    assert s["delta_ms"] == pytest.approx(sum(steady) / len(steady))


def test_missing_video_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="--video: '.*nope.avi' does not exist"):
        demo.run_demo(video=tmp_path / "nope.avi", out=None, progress=False, verbose=False)
    with pytest.raises(ValueError, match="--threshold: must be a number >= 0, got -1"):
        demo.run_demo(threshold=-1, out=None)
    with pytest.raises(ValueError, match="--max-frames: must be >= 1, got 0"):
        demo.run_demo(max_frames=0, out=None)
    with pytest.raises(ValueError, match="--dtype: must be auto, float32, float16 or bfloat16, got 'half'"):
        demo.run_demo(dtype="half", out=None)
    with pytest.raises(ValueError, match="--cuda-graph: CUDA graphs need --device cuda, got device 'cpu'"):
        demo.run_demo(cuda_graph=True, device="cpu", out=None)


def test_demo_dtype_defaults():
    assert demo.resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert demo.resolve_dtype("auto", torch.device("cuda")) == torch.float16
    assert demo.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert demo.resolve_dtype(torch.float16, torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="got torch.int8"):
        demo.resolve_dtype(torch.int8, torch.device("cpu"))


def test_draw_result_tasks():
    panel = np.full((48, 64, 3), 128, np.uint8)
    logits = torch.zeros(1, 1000)
    logits[0, 3] = 10
    img = demo.draw_result(panel, logits, "classification", ["a", "b", "c", "tiger shark"], ref_label=3)
    assert img.shape == panel.shape and not np.array_equal(img, panel)
    seg = torch.zeros(1, 21, 12, 16)
    seg[:, 15, :6] = 5  # "person" in the top half
    img = demo.draw_result(panel, {"out": seg}, "segmentation")
    assert not np.array_equal(img[:20], panel[:20]) and np.array_equal(img[30:], panel[30:])
    score = torch.zeros(1, 24, 32, 2)
    score[0, 2:8, 2:10, 0] = 0.9
    img = demo.draw_result(panel, (score, torch.zeros(1, 32, 24, 32)), "text")
    assert img.shape == panel.shape
    assert img[10, 12, 2] > 180 and img[10, 12, 0] < 80  # red where the region score is high
    assert np.abs(img[30:, 40:].astype(int) - 128).max() < 40  # only a light tint elsewhere
    faces = torch.zeros(1, 1, 24, 32)  # MTCNN PNet's face probability map first, then its boxes
    faces[0, 0, 2:8, 2:10] = 0.9
    img = demo.draw_result(panel, (faces, torch.zeros(1, 4, 24, 32)), "faces")
    assert img[10, 12, 2] > 180 and img[10, 12, 0] < 80
    assert np.abs(img[30:, 40:].astype(int) - 128).max() < 40
    with pytest.raises(ValueError, match="task must be one of .* got 'boxes'"):
        demo.draw_result(panel, logits, "boxes")
    probability = torch.zeros(1, 1, 12, 16)
    probability[..., :6, :] = 1.0  # a one-channel probability map is drawn as it is, logits through a sigmoid
    drawn = demo.draw_result(panel, probability, "segmentation")
    assert drawn[3, 3, 2] > drawn[40, 3, 2] + 40 and drawn[40, 3, 0] > drawn[3, 3, 0] + 40  # JET's red at 1, blue at 0
    logits = demo.draw_result(panel, probability * 20 - 10, "segmentation")  # sigmoid(+-10): 1 and 0 to 5e-5
    assert np.abs(logits.astype(int) - drawn).max() <= 2
    off = demo.draw_result(panel, probability - 0.01, "segmentation", probabilities=True)  # a delta model's -0.01
    assert np.abs(off.astype(int) - drawn).max() <= 10 and demo.is_probability_map(probability)
    guessed = demo.draw_result(panel, probability - 0.01, "segmentation")  # guessed logits: sigmoid, washed out
    assert np.abs(guessed.astype(int) - drawn).max() > 40
    anchors = (torch.zeros(1, 896, 16), torch.zeros(1, 896, 1))  # a detector's boxes and scores (BlazeFace)
    assert demo.infer_task(anchors) == "none" and demo.infer_task(seg) == "segmentation"
    img = demo.draw_result(panel, anchors, "none")
    assert img.shape == panel.shape and np.array_equal(img[:20], panel[:20]) and not np.array_equal(img, panel)
    with pytest.raises(ValueError, match=r"a pose output must be a dict with BlazePose's 'landmarks' \[N, 195\], got "
                                         r"dict with keys \['out'\]"):
        demo.draw_result(panel, {"out": faces}, "pose")
    mask = torch.zeros(1, 1, 12, 16, dtype=torch.bool)
    mask[..., :4, :4] = True
    m = demo.draw_mask(panel, mask)
    assert m[:10, :10].mean() > m[30:, 30:].mean()


def test_threshold_sweep_and_plot(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1)).eval()
    base = torch.randn(1, 3, 16, 16)
    frames = [base + 0.2 * i * torch.randn(1, 3, 16, 16) * (torch.rand(1, 1, 16, 16) < 0.2) for i in range(4)]
    rows = demo.threshold_sweep(model, frames, [0.0, 0.1, 1.0], backend="reference",
                                calibrated={"input": 0.05, "1": 0.05})
    assert [r["threshold"] for r in rows] == [0.0, 0.1, 1.0, None]
    assert rows[0]["rel_error"] < 1e-5 and rows[0]["top1_agreement"] is None
    assert rows[2]["density"] <= rows[0]["density"]
    table = demo.format_sweep(rows)
    assert "per-layer" in table
    png = demo.plot_tradeoff(rows, tmp_path / "t.png", title="tiny", tolerance=0.1)
    assert png.stat().st_size > 1000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_tiny_demo_on_gpu(tmp_path):
    s = demo.run_demo(model="mobilenet_v2", threshold=0.0, device="cuda", max_frames=3, size=(64, 96),
                      out=tmp_path / "gpu.mp4", progress=False, verbose=False, dtype="float32", cuda_graph=False)
    assert s["device"] == "cuda" and s["frames"] == 3
    assert s["top1_agreement"] == 1.0 and s["rel_error"] < 1e-2  # TF32 / kernel rounding on the GPU
    assert s["dense_ms"] > 0 and s["delta_ms"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_demo_on_gpu_defaults_to_float16_graphs(tmp_path):
    """On a GPU the demo compares float16 models replayed as CUDA graphs (the frames that record a
    graph are left out of the means), with the same outputs and masks as eager runs of both."""
    runs = {graph: demo.run_demo(model="mobilenet_v2", threshold=0.02, device="cuda", max_frames=6, size=(64, 96),
                                 out=None, progress=False, verbose=False, cuda_graph=graph)
            for graph in (None, False)}
    s, eager = runs[None], runs[False]
    assert s["dtype"] == "float16" and s["cuda_graph"] is True and eager["cuda_graph"] is False
    assert [r["records_graph"] for r in s["per_frame"]] == [False, True, False, False, False, False]
    steady = [r["delta_ms"] for r in s["per_frame"][2:]]
    assert s["delta_ms"] == pytest.approx(sum(steady) / len(steady))
    assert "both as CUDA graphs" in demo.format_summary(s)
    for a, b in zip(s["per_frame"], eager["per_frame"]):
        assert a["rel_error"] == pytest.approx(b["rel_error"], rel=1e-3, abs=1e-6), a["frame"]
        assert a["density"] == b["density"], a["frame"]
        assert a["mask_density"] == pytest.approx(a["density"]), a["frame"]  # the replayed frame's mask
    assert 0 < s["density"] < 1
    with pytest.raises(ValueError, match="--cuda-graph: CUDA graphs need the CUDA backend, got backend 'reference'"):
        demo.run_demo(model="mobilenet_v2", device="cuda", backend="reference", cuda_graph=True, max_frames=2,
                      size=(32, 48), out=None, progress=False, verbose=False)
