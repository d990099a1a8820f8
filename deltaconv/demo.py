"""Side-by-side demo: the dense model and its converted delta model on a video (headless).

:func:`run_demo` runs both models on every frame, draws their results (class name and confidence
for classifiers, a class overlay for segmentation, the text heat map for CRAFT), the input
sparsifier's update mask, and per-frame timings, density and agreement, into an mp4. It returns
(and prints) a summary. :func:`threshold_sweep` and :func:`plot_tradeoff` measure and draw the
error / density trade-off of a uniform threshold.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from . import fidelity as _fid
from .fidelity import primary_output
from .video import SAMPLE_VIDEO_HELP, check_crop, crop_frame, describe_crop, find_sample_video, to_tensor

#: the tasks whose output the demo draws (draw_result)
DRAWN_TASKS = ("classification", "segmentation", "text", "faces", "pose")
#: height of each panel of the demo video (pixels); widths keep the frame's aspect ratio
PANEL_HEIGHT = 288
_FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX


# ----------------------------------------------------------------------------- frames
def open_source(video: Union[str, os.PathLike, None] = None, camera: Optional[int] = None):
    """An opened ``cv2.VideoCapture`` for ``video`` (a path), ``camera`` (a device index) or, with
    neither, the sample video of :func:`deltaconv.video.find_sample_video`; with a description,
    the frame rate (10 when unknown) and the frame count (``None`` for a camera)."""
    import cv2

    if video is not None and camera is not None:
        raise ValueError(f"open_source: give video or camera, not both (got video={str(video)!r}, camera={camera!r})")
    if camera is not None:
        cap = cv2.VideoCapture(int(camera))
        if not cap.isOpened():
            raise RuntimeError(f"--camera: OpenCV could not open camera {camera!r}")
        fps = cap.get(cv2.CAP_PROP_FPS) or 10.0
        return cap, f"camera {camera}", float(fps), None
    path = find_sample_video() if video is None else Path(video)
    if not path.is_file():
        raise FileNotFoundError(f"--video: {str(video)!r} does not exist. {SAMPLE_VIDEO_HELP}")
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise RuntimeError(f"--video: OpenCV could not open {str(path)!r}")
    fps = cap.get(cv2.CAP_PROP_FPS)
    count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    return cap, str(path), float(fps) if fps and fps > 0 else 10.0, count if count > 0 else None


def _read(cap, max_frames: Optional[int], start: int = 0) -> Iterator[np.ndarray]:
    """Up to ``max_frames`` frames of ``cap`` after skipping its first ``start`` (read, so exact for any codec)."""
    n = 0
    try:
        for _ in range(start):
            if not cap.grab():
                return
        while max_frames is None or n < max_frames:
            ok, frame = cap.read()
            if not ok:
                return
            yield frame
            n += 1
    finally:
        cap.release()


# ----------------------------------------------------------------------------- outputs
def infer_task(out: Any) -> str:
    """``classification`` for ``[N, C]`` outputs, ``segmentation`` for ``[N, C, h, w]``, else ``"none"`` (an output
    the demo does not draw, such as a detector's ``[N, anchors, values]``; its error and timings are still shown)."""
    rank = primary_output(out).dim()
    return "classification" if rank == 2 else "segmentation" if rank == 4 else "none"


def relative_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` of the primary outputs (:func:`deltaconv.fidelity.relative_error`),
    averaged over the batch."""
    return float(_fid.relative_error(primary_output(out).float(), primary_output(ref).float()).mean())


def _input_mask(dm, replayed: bool = False, key: bool = False) -> Optional[torch.Tensor]:
    """The input sparsifier's update mask of the last frame: the recorded graph's mask tensor when
    that frame was replayed (hooks do not run in a replay; the key frame's graph's for a key frame),
    else the last eager one."""
    if not replayed:
        return dm.__dict__.get("_demo_last_mask")
    return dm.__dict__.get("_demo_key_replay_mask" if key else "_demo_replay_mask")


def _eager_runs(dm) -> int:
    """How many frames the input sparsifier of ``dm`` ran outside a graph replay (see ``_hook_sparsifier``)."""
    return dm.__dict__.get("_demo_eager_runs", 0)


def _hook_sparsifier(dm) -> None:
    """Keep the input sparsifier's last update mask ([N, 1, H, W]) on ``dm``: the eager one in
    ``_demo_last_mask`` (counting ``_demo_eager_runs``), and the one made while a CUDA graph is
    recorded in ``_demo_replay_mask`` (each replay rewrites that tensor; ``_demo_key_replay_mask``
    for the graph of a key frame)."""
    from .modules import DCSparsify

    def keep(module, args, out):
        if out.mask.is_cuda and torch.cuda.is_current_stream_capturing():
            dm.__dict__["_demo_key_replay_mask" if module.key is not None else "_demo_replay_mask"] = out.mask
        else:
            dm.__dict__["_demo_last_mask"] = out.mask
            dm.__dict__["_demo_eager_runs"] = _eager_runs(dm) + 1

    for layer in dm.delta_layers():
        if isinstance(layer, DCSparsify):
            layer.register_forward_hook(keep)
            return


def work_fraction(stats: Sequence[dict]) -> float:
    """FLOPs done / dense FLOPs of the last frame, over the layers that report both."""
    done = dense = 0.0
    for s in stats:
        if math.isfinite(s.get("flops_done", math.nan)) and s.get("flops_dense", 0) > 0:
            done += s["flops_done"]
            dense += s["flops_dense"]
    return done / dense if dense > 0 else math.nan


# ----------------------------------------------------------------------------- drawing
def _panel(frame_bgr: np.ndarray, height: int = PANEL_HEIGHT) -> np.ndarray:
    import cv2

    h, w = frame_bgr.shape[:2]
    width = max(1, round(w * height / h))
    interp = cv2.INTER_AREA if height < h else cv2.INTER_LINEAR
    return cv2.resize(frame_bgr, (width, height), interpolation=interp)


def _text(img: np.ndarray, text: str, org, scale: float = 0.5, color=(255, 255, 255), bg=(0, 0, 0)) -> None:
    import cv2

    (tw, th), base = cv2.getTextSize(text, _FONT, scale, 1)
    x, y = org
    cv2.rectangle(img, (x - 2, y - th - 3), (x + tw + 2, y + base + 1), bg, -1)
    cv2.putText(img, text, (x, y), _FONT, scale, color, 1, cv2.LINE_AA)


def _heat(values: np.ndarray, size_wh, colormap: int) -> np.ndarray:
    import cv2

    v = np.clip(values, 0.0, 1.0)
    v = cv2.resize((v * 255).astype(np.uint8), size_wh, interpolation=cv2.INTER_LINEAR)
    return cv2.applyColorMap(v, colormap)


def _palette(n: int) -> np.ndarray:
    """The PASCAL VOC colour map (BGR) for ``n`` classes."""
    pal = np.zeros((n, 3), np.uint8)
    for i in range(n):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal[i] = (b, g, r)
    return pal


def draw_result(panel: np.ndarray, out: Any, task: str, categories: Optional[Sequence[str]] = None,
                ref_label: Optional[int] = None, probabilities: Optional[bool] = None) -> np.ndarray:
    """Draw a model's output on a BGR panel (a copy is returned).

    ``classification``: top-1 name and softmax confidence (green when it equals ``ref_label``, red
    when not); ``segmentation``: argmax classes in VOC colours over the frame (a heat map for one
    channel: of its values if ``probabilities`` (default: whether they all lie in [0, 1]; the demo decides once, from
    the dense model's first output, so that the converted model's small excursions do not change the drawing), else
    of their sigmoid); ``text``: CRAFT's region score (PP-OCR's text probability) as a heat map; ``faces``: the face
    probability map as a heat map; ``pose``: BlazePose's person mask as a heat map and its skeleton (landmarks whose
    visibility is below 0.5 left out; their pixels are those of the mask, the model's input); ``none``: the frame
    with the output's shape (:func:`infer_task` for an output it cannot draw).
    """
    import cv2

    img = panel.copy()
    h, w = img.shape[:2]
    t = primary_output(out).detach().float().cpu()
    if task == "none":
        _text(img, f"output {list(t.shape)} not drawn (--task)", (6, h - 10), 0.45)
        return img
    if task == "classification":
        prob = torch.softmax(t[0].flatten(), 0)
        conf, idx = prob.max(0)
        idx = int(idx)
        name = categories[idx] if categories is not None and idx < len(categories) else f"class {idx}"
        color = (255, 255, 255) if ref_label is None else (80, 255, 80) if idx == ref_label else (80, 80, 255)
        _text(img, f"{name}  {conf.item():.0%}", (6, h - 10), 0.55, color)
        return img
    if task in ("text", "faces"):  # CRAFT: score [N, h, w, 2], channel 0 the region score; else [N, 1, h, w]
        score = t[0, ..., 0].numpy() if t.dim() == 4 and t.shape[-1] == 2 else t[0, 0].numpy()
        heat = _heat(score, (w, h), cv2.COLORMAP_JET)
        alpha = np.clip(cv2.resize(score, (w, h)), 0, 1)[..., None] * 0.7 + 0.15
        return (img * (1 - alpha) + heat * alpha).astype(np.uint8)
    if task == "pose":
        return _draw_pose(cv2.addWeighted(img, 0.6, _heat(torch.sigmoid(t[0, 0]).numpy(), (w, h), cv2.COLORMAP_JET),
                                          0.4, 0), out, t.shape[-2:])
    if task == "segmentation":
        if t.dim() != 4:
            raise ValueError(f"draw_result: segmentation output must be [N, C, h, w], got shape {tuple(t.shape)}")
        if t.shape[1] == 1:  # a probability map as it is (MediaPipe's selfie mask), logits through a sigmoid
            if probabilities is None:
                probabilities = is_probability_map(t)
            s = (t[0, 0].clamp(0, 1) if probabilities else torch.sigmoid(t[0, 0])).numpy()
            return cv2.addWeighted(img, 0.5, _heat(s, (w, h), cv2.COLORMAP_JET), 0.5, 0)
        cls = t[0].argmax(0).numpy().astype(np.int32)
        cls = cv2.resize(cls.astype(np.uint8) if cls.max() < 256 else cls.astype(np.float32), (w, h),
                         interpolation=cv2.INTER_NEAREST).astype(np.int32)
        colors = _palette(int(t.shape[1]))[cls]
        fg = (cls > 0)[..., None]
        return np.where(fg, (img * 0.45 + colors * 0.55).astype(np.uint8), img)
    raise ValueError(f"draw_result: task must be one of {', '.join(DRAWN_TASKS)} or none; got {task!r}")


def is_probability_map(t: torch.Tensor) -> bool:
    """Whether a one-channel map holds probabilities (all its values in [0, 1]) rather than logits."""
    return bool(0 <= t.min() and t.max() <= 1)


def _draw_pose(img: np.ndarray, out: dict, input_hw) -> np.ndarray:
    """BlazePose's skeleton on ``img`` (in place): its body landmarks (``out["landmarks"]``, in pixels of an input of
    ``input_hw``) scaled to the panel, the visible ones (visibility >= 0.5) and the edges between them."""
    import cv2

    from .blazepose import POSE_CONNECTIONS, keypoints

    if not isinstance(out, dict) or not torch.is_tensor(out.get("landmarks")):
        raise ValueError(f"draw_result: a pose output must be a dict with BlazePose's 'landmarks' [N, 195], got "
                         f"{type(out).__name__}" + (f" with keys {sorted(out)}" if isinstance(out, dict) else ""))
    xy, visible = keypoints(out["landmarks"].detach().float().cpu())
    h, w = img.shape[:2]
    points = (xy[0] * torch.tensor([w / input_hw[1], h / input_hw[0]])).round().int().tolist()
    shown = (visible[0] >= 0.5).tolist()
    for a, b in POSE_CONNECTIONS:
        if shown[a] and shown[b]:
            cv2.line(img, tuple(points[a]), tuple(points[b]), (255, 255, 255), 2, cv2.LINE_AA)
    for (x, y), on in zip(points, shown):
        if on:
            cv2.circle(img, (x, y), 3, (0, 220, 255), -1, cv2.LINE_AA)
    return img


def draw_mask(panel: np.ndarray, mask: Optional[torch.Tensor]) -> np.ndarray:
    """The input sparsifier's update mask (``[N, 1, H, W]`` bool), upsampled to the panel, as a
    heat map over the dimmed grey frame (bright: pixels sent this frame)."""
    import cv2

    h, w = panel.shape[:2]
    grey = cv2.cvtColor(cv2.cvtColor(panel, cv2.COLOR_BGR2GRAY), cv2.COLOR_GRAY2BGR)
    if mask is None:
        return (grey * 0.4).astype(np.uint8)
    m = mask[0, 0].float().cpu().numpy()
    up = cv2.resize(m, (w, h), interpolation=cv2.INTER_NEAREST)
    heat = cv2.applyColorMap((up * 255).astype(np.uint8), cv2.COLORMAP_INFERNO)
    a = up[..., None] * 0.85 + 0.25
    return np.clip(grey * 0.4 * (1 - a) + heat * a, 0, 255).astype(np.uint8)


def _titled(panel: np.ndarray, title: str) -> np.ndarray:
    _text(panel, title, (6, 18), 0.55, (255, 255, 255), (40, 40, 40))
    return panel


def compose(dense_panel: np.ndarray, delta_panel: np.ndarray, mask_panel: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """The demo frame: three panels side by side over an information bar of ``lines``."""
    top = np.concatenate([dense_panel, delta_panel, mask_panel], axis=1)
    bar = np.full((10 + 22 * len(lines), top.shape[1], 3), 24, np.uint8)
    import cv2

    for i, line in enumerate(lines):
        cv2.putText(bar, line, (8, 22 + 22 * i), _FONT, 0.55, (235, 235, 235), 1, cv2.LINE_AA)
    return np.concatenate([top, bar], axis=0)


# ----------------------------------------------------------------------------- timing
class _Timer:
    """Milliseconds of a call: CUDA events (with synchronisation) on a GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn, *args):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            out = fn(*args)
            end.record()
            torch.cuda.synchronize()
            return out, start.elapsed_time(end)
        t0 = time.perf_counter()
        out = fn(*args)
        return out, (time.perf_counter() - t0) * 1e3


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: Union[None, str, torch.dtype], device: torch.device) -> torch.dtype:
    """The demo's model dtype: ``None`` / ``"auto"`` gives float16 on a GPU (what a fast deployment
    runs there, and what the CUDA kernels are built for) and float32 on the CPU."""
    if dtype is None or dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    raise ValueError(f"--dtype: must be auto, float32, float16 or bfloat16, got {dtype!r}")


# ----------------------------------------------------------------------------- the demo
class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: Optional[int], desc: str, enabled: bool):
    """A tqdm progress bar, or a silent stand-in when disabled or tqdm is not installed."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="frame", desc=desc)


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def run_demo(video: Union[str, os.PathLike, None] = None, camera: Optional[int] = None, model: str = "mobilenet_v2",
             threshold: float = 0.02, device: str = "cpu", max_frames: Optional[int] = 150,
             size: Optional[tuple[int, int]] = None, out: Union[str, os.PathLike, None] = "demo.mp4",
             backend: str = "auto", thresholds: Union[None, dict, str] = None,
             snapshot: Union[str, os.PathLike, None] = None, snapshot_frame: int = -1,
             progress: bool = True, verbose: bool = True, dtype: Union[None, str, torch.dtype] = None,
             cuda_graph: Optional[bool] = None, fold_bn: Optional[bool] = None, recompute: bool = True,
             crop: Optional[tuple[int, int, int, int]] = None, start: int = 0,
             input_range: Optional[str] = None, task: Optional[str] = None) -> dict:
    """Run the dense ``model`` and its converted delta model side by side on a video.

    Args:
        video / camera: a video path or a camera index (default: the sample video ``vtest.avi``).
        model: a :mod:`deltaconv.zoo` name (``mobilenet_v2``, ``craft``, ``ppocr_det``, ``mtcnn_pnet``,
            ``blazepose_full``, torchvision names), ``pkg.module:factory``, or a ``.onnx`` / ``.tflite`` file.
        threshold / thresholds: the conversion's uniform threshold and optional per-layer values
            (a dict, or the JSON of ``DeltaModel.save_thresholds`` / ``deltaconv calibrate``, whose
            change detector is used too).
        device: ``cpu`` or ``cuda``; ``backend``: ``auto``, ``reference`` or ``cuda``.
        max_frames: frames to process (``None``: all); ``size``: model input ``(h, w)`` (default:
            the model's ``input_size`` in the zoo if it has one, else the video's own resolution).
        out: the mp4 to write (``None``: none); ``snapshot``: a PNG of one annotated frame
            (``snapshot_frame``, default the last).
        dtype: both models' dtype, ``"float32"``, ``"float16"`` or ``"bfloat16"`` (``None``: float16
            on a GPU, float32 on the CPU; see :func:`resolve_dtype`).
        cuda_graph: replay both models as CUDA graphs (``None``: on a GPU with the CUDA backend), the
            comparison that matters on a GPU; the dense one is recorded before the first frame, the
            delta one on its first frame that is not a key frame (frame 1), which is left out of the
            mean timings.
        fold_bn: fold BatchNorm into the convolutions (``convert(..., fold_bn=...)``; ``None``: as
            the thresholds file records it, else folded).
        recompute: value mode where the graph allows (``convert(..., recompute=...)``, the default);
            ``False``: delta mode everywhere.
        crop: ``(x, y, width, height)`` in the video's pixels: the region of every frame the models see (and the
            panels show), before the resize to ``size``: a fixed person crop for a pose model such as
            ``blazepose_full``, which takes 256x256 crops (``None``: the whole frame).
        start: the first frame of the video to run (the ones before are skipped).
        input_range: a model file's input scaling (``.onnx`` / ``.tflite`` as ``model``;
            :data:`deltaconv.model_files.INPUT_RANGES`, default: its format's).
        task: how to draw the output (:data:`DRAWN_TASKS`; default: the zoo's task for the model, else inferred
            from the output's shape), for a model file or an import path whose output the zoo does not know.

    Returns the summary dict (also printed when ``verbose``): frame count, ``thresholds`` (what was
    used, in words), ``size``, ``crop``, ``start``, ``dtype``, ``cuda_graph``, ``fold_bn``, ``recompute``,
    mean dense and delta milliseconds and their ratio ``speedup`` over the non-key frames (the first,
    and in float16 / bfloat16, and float32 in TF32 on a GPU, one every 1,000 frames,
    ``refresh_every="auto"``) and those that
    recorded a graph, mean input ``density`` and
    FLOP fraction ``work``, mean and max relative error of the delta output against the dense one,
    and ``top1_agreement`` for classifiers (``None`` otherwise).
    """
    import cv2

    from . import zoo
    from .convert import convert
    from .cuda_graphs import graphed_model

    if not isinstance(threshold, (int, float)) or threshold < 0:
        raise ValueError(f"--threshold: must be a number >= 0, got {threshold!r}")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"--max-frames: must be >= 1, got {max_frames!r}")
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise ValueError(f"--size: must be (height, width) >= 1, got {size!r}")
    check_crop(crop, "--crop")
    if task is not None and task not in DRAWN_TASKS:
        raise ValueError(f"--task: must be one of {', '.join(DRAWN_TASKS)}, got {task!r}")
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"--start: must be an integer >= 0, got {start!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device: {device!r} asked but torch.cuda.is_available() is False")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: must be cpu or cuda, got {device!r}")
    dtype = resolve_dtype(dtype, dev)
    if cuda_graph and dev.type != "cuda":
        raise ValueError(f"--cuda-graph: CUDA graphs need --device cuda, got device {device!r}")

    change_detector = None
    if isinstance(thresholds, (str, os.PathLike)):
        if not Path(thresholds).is_file():
            raise FileNotFoundError(f"--thresholds: {str(thresholds)!r} does not exist")
        with open(thresholds) as f:
            data = json.load(f)
        spec = data.get("change_detector") if isinstance(data, dict) else None
        if spec is not None:  # written by deltaconv calibrate (Calibration.save)
            from .sparsify import from_spec

            change_detector = from_spec(spec)
    elif thresholds is not None and callable(getattr(thresholds, "detector", None)):
        change_detector = thresholds.detector()
    entry = zoo.load(model, input_range)
    if entry.task == "detection":
        raise ValueError(f"--model: {entry.name} is a detection model; the demo draws classification, segmentation "
                         "and text models. Convert a detector's backbone with deltaconv.convert_backbone (README, "
                         "Detection and pose)")
    dense = entry.model.to(dev, dtype)
    cap, source, fps, count = open_source(video, camera)
    frames = (crop_frame(frame, crop, "--crop") for frame in _read(cap, max_frames, start))
    first = next(frames, None)
    if first is None:
        raise RuntimeError(f"--video: no frame could be read from {source!r}"
                           + (f" after skipping {start} (--start)" if start else ""))
    if count is not None:
        count = max(count - start, 1)
    if size is None:  # the one size the model takes (zoo input_size), else the video's
        size = entry.input_size or tuple(first.shape[:2])
    x0 = to_tensor(first, size).to(dev, dtype)
    dm = convert(dense, threshold=float(threshold), backend=backend, thresholds=thresholds, example_input=x0,
                 change_detector=change_detector, fold_bn=fold_bn, recompute=recompute)
    _hook_sparsifier(dm)
    from . import backends

    used_backend = backends.select(dm.backend, dev).__name__.rsplit(".", 1)[-1]
    # what the frames' bar and the summary say about the thresholds
    if isinstance(thresholds, (str, os.PathLike)):
        threshold_label = f"thresholds {Path(thresholds).name}"
    elif thresholds is not None:
        threshold_label = f"per-layer thresholds (default {threshold:g})"
    else:
        threshold_label = f"threshold {threshold:g}"
    if cuda_graph is None:
        cuda_graph = dev.type == "cuda" and used_backend == "cuda"
    elif cuda_graph and used_backend != "cuda":
        raise ValueError(f"--cuda-graph: CUDA graphs need the CUDA backend, got backend {used_backend!r} "
                         f"(--backend {backend})")
    run_dense = dense
    if cuda_graph:
        dm.cuda_graph, dm.check_finite = True, False  # decoded frames are finite; a check costs a sync
        run_dense = graphed_model(dense, x0)
    timer = _Timer(dev)
    total = min(count, max_frames) if count is not None and max_frames is not None else (count or max_frames)

    writer = None
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    task = task or entry.task
    probabilities = None  # whether a one-channel map is drawn as probabilities (draw_result)
    snap_img = None
    agree_so_far = []
    try:
        bar = _progress(total, f"demo {entry.name}", progress)

        def all_frames():
            yield first
            yield from frames

        for i, frame in enumerate(all_frames()):
            x = to_tensor(frame, size).to(dev, dtype)
            with torch.no_grad():
                y_dense, ms_dense = timer(run_dense, x)
                eager_runs = _eager_runs(dm)
                y_delta, ms_delta = timer(dm, x)
                replayed = _eager_runs(dm) == eager_runs
            if task is None:
                task = infer_task(y_dense)
            stats = dm.stats()
            density = stats[0]["density"] if stats else math.nan
            # key: the first frame, and the periodic ones of refresh_every="auto" (float16 / bfloat16, TF32)
            row = {"frame": i, "key": dm.frames_since_key == 1, "records_graph": bool(cuda_graph) and i == 1,
                   "dense_ms": ms_dense, "delta_ms": ms_delta,
                   "density": density, "work": work_fraction(stats),
                   "rel_error": relative_error(y_delta, y_dense), "top1": None}
            mask = _input_mask(dm, replayed, key=row["key"])
            # the update mask drawn in the right panel, as a fraction of pixels (equals "density")
            row["mask_density"] = float(mask.float().mean()) if mask is not None else math.nan
            ref_label = None
            if task == "classification":
                ref_label = int(primary_output(y_dense)[0].argmax())
                row["top1"] = ref_label == int(primary_output(y_delta)[0].argmax())
                agree_so_far.append(row["top1"])
            rows.append(row)

            base = _panel(frame)
            categories = entry.categories
            if probabilities is None:  # decided once, from the dense model's first output
                probabilities = is_probability_map(primary_output(y_dense).detach().float())
            p_dense = _titled(draw_result(base, y_dense, task, categories, probabilities=probabilities),
                              f"dense {entry.name}")
            p_delta = _titled(draw_result(base, y_delta, task, categories, ref_label, probabilities),
                              "delta (converted)")
            p_mask = _titled(draw_mask(base, mask), "update mask (input sparsifier)")
            speed = ms_dense / ms_delta if ms_delta > 0 else math.nan
            agree = (f"top-1 {'agrees' if row['top1'] else 'DIFFERS'} ({sum(agree_so_far)}/{len(agree_so_far)})"
                     if row["top1"] is not None else "")
            note = " (key frame)" if row["key"] else " (records its graph)" if row["records_graph"] else ""
            lines = [f"frame {i + 1}{'/' + str(total) if total else ''}{note}   "
                     f"dense {ms_dense:.1f} ms   delta {ms_delta:.1f} ms   speedup {speed:.2f}x   "
                     f"input density {density:.1%}   FLOPs {row['work']:.1%}",
                     f"rel. error vs dense {row['rel_error']:.2e}   {agree}   {threshold_label}   "
                     f"{size[0]}x{size[1]}   {dev.type}/{used_backend} {str(dtype).split('.')[-1]}"
                     f"{'   CUDA graphs' if cuda_graph else ''}"]
            img = compose(p_dense, p_delta, p_mask, lines)
            if writer is None and out is not None:
                writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"), fps, (img.shape[1], img.shape[0]))
                if not writer.isOpened():
                    raise RuntimeError(f"--out: OpenCV could not open {str(out)!r} for writing (mp4v)")
            if writer is not None:
                writer.write(img)
            if snapshot is not None and (snapshot_frame < 0 or i == snapshot_frame):
                snap_img = img
            bar.update(1)
            bar.set_postfix(speedup=f"{speed:.2f}x", density=f"{density:.1%}", err=f"{row['rel_error']:.1e}")
        bar.close()
    finally:
        if writer is not None:
            writer.release()
    if snapshot is not None and snap_img is not None:
        Path(snapshot).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(snapshot), snap_img)

    steady = [r for r in rows if not r["key"] and not r["records_graph"]] or rows
    dense_ms, delta_ms = _mean([r["dense_ms"] for r in steady]), _mean([r["delta_ms"] for r in steady])
    tops = [r["top1"] for r in rows if r["top1"] is not None]
    summary = {
        "model": entry.name, "weights": entry.weights, "task": task, "source": source, "frames": len(rows),
        "size": tuple(size), "crop": tuple(crop) if crop is not None else None, "start": start,
        "threshold": float(threshold), "thresholds": threshold_label,
        "device": dev.type, "backend": used_backend,
        "dtype": str(dtype).split(".")[-1], "cuda_graph": bool(cuda_graph), "fold_bn": dm.fold_bn,
        "recompute": bool(recompute),
        "dense_ms": dense_ms, "delta_ms": delta_ms, "speedup": dense_ms / delta_ms if delta_ms > 0 else math.nan,
        "density": _mean([r["density"] for r in steady]), "work": _mean([r["work"] for r in steady]),
        "rel_error": _mean([r["rel_error"] for r in steady]),
        "max_rel_error": max((r["rel_error"] for r in rows), default=math.nan),
        "top1_agreement": sum(tops) / len(tops) if tops else None,
        "out": str(out) if out is not None else None,
        "snapshot": str(snapshot) if snapshot is not None and snap_img is not None else None,
        "per_frame": rows,
    }
    if verbose:
        print(format_summary(summary))
    return summary


def format_summary(summary: dict) -> str:
    """The demo summary as a few human-readable lines."""
    s = summary
    region = describe_crop(s.get("crop"))
    first = f" from frame {s['start']}" if s.get("start") else ""
    lines = [f"deltaconv demo: {s['model']} ({s['weights']}) on {s['source']}, {s['frames']} frames{first} at "
             f"{s['size'][0]}x{s['size'][1]}{region}, {s.get('thresholds') or 'threshold %g' % s['threshold']}, "
             f"{s['device']}/{s['backend']} "
             f"{s.get('dtype', 'float32')}{', both as CUDA graphs' if s.get('cuda_graph') else ''}",
             f"  mean over non-key frames: dense {s['dense_ms']:.1f} ms, delta {s['delta_ms']:.1f} ms, "
             f"speedup {s['speedup']:.2f}x, input density {s['density']:.1%}, FLOPs {s['work']:.1%} of dense",
             f"  agreement with dense: mean relative error {s['rel_error']:.2e} (max {s['max_rel_error']:.2e})"
             + (f", top-1 agreement {s['top1_agreement']:.1%}" if s.get("top1_agreement") is not None else "")]
    if s.get("out"):
        lines.append(f"  wrote {s['out']}" + (f" and {s['snapshot']}" if s.get("snapshot") else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- threshold sweep
def threshold_sweep(model: torch.nn.Module, frames: Sequence[torch.Tensor], thresholds: Sequence[float],
                    backend: str = "auto", calibrated: Optional[dict] = None, change_detector=None,
                    truncation: str = "max", fold_bn: bool = True, output_fn=primary_output) -> list[dict]:
    """Error and density of the converted ``model`` for each uniform ``threshold`` on ``frames``
    (measured with :func:`deltaconv.fidelity.compare` against dense outputs computed once).

    One conversion serves all uniform thresholds; ``calibrated`` (per-layer thresholds, e.g. a
    :class:`deltaconv.calibrate.Calibration`, with its ``change_detector`` and ``truncation``) adds
    one row whose ``threshold`` is ``None``; ``truncation`` is the measure of the uniform rows;
    ``fold_bn`` as in ``convert``; ``output_fn`` picks the compared tensor from an output (e.g.
    :func:`deltaconv.detection.feature_maps` for a detector's backbone). Each
    row: ``threshold``, ``rel_error`` (mean relative error of the primary output over the non-key
    frames), ``max_rel_error``, ``top1_agreement`` (classifiers, else ``None``), ``density`` (input
    sparsifier, mean) and ``work`` (FLOPs-weighted density).
    """
    from .convert import convert

    frames = list(frames)
    if len(frames) < 2:
        raise ValueError(f"threshold_sweep: frames must hold at least 2 frames (a key frame and one more), "
                         f"got {len(frames)}")
    with torch.no_grad():
        refs = [output_fn(model(f)) for f in frames]
    metrics = ("rel_err", "top1") if refs[0].dim() == 2 and output_fn is primary_output else ("rel_err",)

    def measure(dm, threshold) -> dict:
        rep = _fid.compare(model, dm, frames, metrics=metrics, dense_outputs=refs, output_fn=output_fn)
        return {"threshold": threshold, "rel_error": rep.mean("rel_err"), "max_rel_error": rep.max("rel_err"),
                "top1_agreement": rep.mean("top1") if "top1" in metrics else None,
                "density": rep.layers[0]["mean_density"], "work": rep.density}

    dm = convert(model, backend=backend, example_input=frames[0], truncation=truncation, fold_bn=fold_bn)
    rows = []
    for t in thresholds:
        dm.set_threshold_all(float(t))
        rows.append(measure(dm, float(t)))
    if calibrated is not None:
        # a Calibration brings its own truncation measure (load_thresholds applies it)
        dm = convert(model, backend=backend, example_input=frames[0], thresholds=calibrated,
                     change_detector=change_detector, truncation=truncation, fold_bn=fold_bn)
        rows.append(measure(dm, None))
    return rows


def format_sweep(rows: Sequence[dict]) -> str:
    """A threshold sweep as a table."""
    lines = [f"{'threshold':>10}  {'rel.error':>9}  {'max err':>9}  {'top-1':>6}  {'density':>8}  {'FLOPs':>7}"]
    for r in rows:
        t = "per-layer" if r["threshold"] is None else f"{r['threshold']:g}"
        top = "-" if r["top1_agreement"] is None else f"{r['top1_agreement']:.0%}"
        lines.append(f"{t:>10}  {r['rel_error']:9.2e}  {r['max_rel_error']:9.2e}  {top:>6}  "
                     f"{r['density']:8.1%}  {r['work']:7.1%}")
    return "\n".join(lines)


def plot_tradeoff(rows: Sequence[dict], path: Union[str, os.PathLike], title: str = "",
                  tolerance: Optional[float] = None) -> Path:
    """Plot relative error (log scale, left) and input density / FLOPs fraction (right) against
    the uniform threshold (matplotlib, Agg); a ``threshold=None`` row (per-layer thresholds) is
    drawn as stars at the right edge, at the tick "per-layer". Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    uni = [r for r in rows if r["threshold"] is not None]
    cal = [r for r in rows if r["threshold"] is None]
    xs = [r["threshold"] for r in uni]
    fig, ax = plt.subplots(figsize=(7, 4.8), dpi=110)
    err = [max(r["rel_error"], 1e-9) for r in uni]
    ax.plot(xs, err, "o-", color="tab:red", label="relative error vs dense (mean)")
    ax.set_yscale("log")
    ax.set_xlabel("uniform threshold (all truncating layers)")
    ax.set_ylabel("relative error of the output", color="tab:red")
    ax.tick_params(axis="y", colors="tab:red")
    if tolerance is not None:
        ax.axhline(tolerance, color="tab:red", ls=":", lw=1, label=f"tolerance {tolerance:g}")
    ax2 = ax.twinx()
    ax2.plot(xs, [r["density"] * 100 for r in uni], "s-", color="tab:blue", label="input density")
    ax2.plot(xs, [r["work"] * 100 for r in uni], "^--", color="tab:green", label="FLOPs done")
    ax2.set_ylabel("% of dense", color="tab:blue")
    ax2.set_ylim(0, 105)
    ax2.tick_params(axis="y", colors="tab:blue")
    x_cal = None
    if cal and xs:
        x_cal = max(xs) * 1.8 if max(xs) > 0 else 1.0
        ax.plot([x_cal], [max(cal[0]["rel_error"], 1e-9)], "*", ms=14, color="tab:red",
                label="calibrated per-layer: error")
        ax2.plot([x_cal], [cal[0]["work"] * 100], "*", ms=14, color="tab:green", label="calibrated: FLOPs")
    positive = [x for x in xs if x > 0]
    if positive and max(positive) / min(positive) > 20:  # many decades: log x, linear around 0
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.5)
    ticks = xs + ([x_cal] if x_cal is not None else [])
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{x:g}" for x in xs] + (["per-layer"] if x_cal is not None else []), fontsize=8)
    ax.minorticks_off()
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.11, right=0.89, top=0.92, bottom=0.24)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
