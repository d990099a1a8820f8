"""Reading frames of the sample videos (OpenCV, imported lazily) as model-ready tensors."""
from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np
import torch

#: ImageNet normalisation used by torchvision's pretrained models
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_DEBIAN_VTEST = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"
SAMPLE_VIDEO_HELP = (
    "Pass a video path, or set DELTACONV_VIDEOS to a folder holding vtest.avi. The project's sample "
    "videos live in ../shared/videos next to the checkout. On Debian/Ubuntu get vtest.avi with: "
    "apt-get download opencv-doc && dpkg-deb --fsys-tarfile opencv-doc_*.deb | "
    "tar -xO ./usr/share/doc/opencv-doc/examples/data/vtest.avi > vtest.avi")


def video_dirs() -> list[Path]:
    """Folders searched for sample videos, in order: ``$DELTACONV_VIDEOS``, ``../shared/videos``
    beside the checkout (and beside the working directory), and for a clone of a local checkout
    (``git clone /work/main /tmp/x``) the ``shared/videos`` beside the checkout it was cloned from."""
    dirs = []
    if os.environ.get("DELTACONV_VIDEOS"):
        dirs.append(Path(os.environ["DELTACONV_VIDEOS"]))
    root = Path(__file__).resolve().parent.parent
    dirs += [root.parent / "shared" / "videos", Path.cwd().parent / "shared" / "videos",
             Path.cwd() / "shared" / "videos"]
    origin = local_origin(root)
    if origin is not None:
        dirs.append(origin.parent / "shared" / "videos")
    return dirs


def local_origin(checkout: Path) -> Optional[Path]:
    """The folder that the git checkout ``checkout`` was cloned from, read from its
    ``.git/config`` (``remote "origin"``'s url, a path or a ``file://`` url); ``None`` when it has
    none, or when the url names no local folder."""
    config = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        config.read(checkout / ".git" / "config")
        url = config.get('remote "origin"', "url", fallback=None)
    except (configparser.Error, OSError):
        return None
    if not url:
        return None
    url = url.strip().removeprefix("file://")
    path = Path(url) if Path(url).is_absolute() else checkout / url
    return path.resolve() if path.is_dir() else None


def find_sample_video(name: str = "vtest.avi") -> Path:
    """Path of a sample video: the folders of :func:`video_dirs`, then (for vtest.avi) Debian's
    ``opencv-doc`` package. Raises ``FileNotFoundError`` naming every option."""
    for d in video_dirs():
        if (d / name).is_file():
            return d / name
    if name == "vtest.avi" and Path(_DEBIAN_VTEST).is_file():
        return Path(_DEBIAN_VTEST)
    searched = ", ".join(str(d) for d in video_dirs())
    raise FileNotFoundError(f"sample video {name!r} not found (searched {searched}"
                            f"{', ' + _DEBIAN_VTEST if name == 'vtest.avi' else ''}). {SAMPLE_VIDEO_HELP}")


def imagenet_to_unit() -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, shift)``, ``[1, 3, 1, 1]`` each: an ImageNet-normalised RGB frame ``x`` (:func:`to_tensor`'s) is
    ``x * scale + shift`` in [0, 1]. Models that take another input scaling put an affine made from it in front,
    which the converter folds into their first convolution."""
    return torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)


def to_tensor(frame_bgr, size: Optional[tuple[int, int]] = None, normalize: bool = True) -> torch.Tensor:
    """An OpenCV BGR ``uint8`` frame ``[H, W, 3]`` as a float tensor ``[1, 3, h, w]`` (RGB, in
    [0, 1], ImageNet-normalised if ``normalize``), resized to ``size = (h, w)`` if given."""
    import cv2

    if size is not None and tuple(frame_bgr.shape[:2]) != tuple(size):
        interp = cv2.INTER_AREA if size[0] < frame_bgr.shape[0] else cv2.INTER_LINEAR
        frame_bgr = cv2.resize(frame_bgr, (size[1], size[0]), interpolation=interp)
    rgb = torch.from_numpy(frame_bgr[:, :, ::-1].copy()).permute(2, 0, 1).float().div_(255.0)
    if normalize:
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        rgb = (rgb - mean) / std
    return rgb.unsqueeze(0).contiguous(memory_format=torch.channels_last)


def check_crop(crop: Optional[tuple[int, int, int, int]], name: str = "crop") -> None:
    """Raise a ``ValueError`` naming ``name`` unless ``crop`` is ``None`` or ``(x, y, width, height)``: ints, the
    corner >= 0 and the size > 0."""
    if crop is not None and not (isinstance(crop, (tuple, list)) and len(crop) == 4
                                 and all(isinstance(v, int) for v in crop) and min(crop) >= 0 and min(crop[2:]) > 0):
        raise ValueError(f"{name} must be (x, y, width, height), ints >= 0 and a size > 0; got {crop!r}")


def check_crop_inside(crop: tuple[int, int, int, int], width: int, height: int, name: str = "crop") -> None:
    """A ``ValueError`` naming ``name`` and the frame's size when the region ``crop`` does not lie inside a frame of
    ``width`` x ``height``."""
    x, y, w, h = crop
    if x + w > width or y + h > height:
        raise ValueError(f"{name}: the region (x={x}, y={y}, width={w}, height={h}) does not lie inside the "
                         f"{width}x{height} (width x height) frame")


def crop_frame(frame: np.ndarray, crop: Optional[tuple[int, int, int, int]], name: str = "crop") -> np.ndarray:
    """The region ``crop = (x, y, width, height)`` of an image ``[H, W, ...]`` (all of it for ``None``); a
    ``ValueError`` (:func:`check_crop_inside`) when the region does not lie inside the frame."""
    if crop is None:
        return frame
    check_crop_inside(crop, frame.shape[1], frame.shape[0], name)
    x, y, w, h = crop
    return frame[y:y + h, x:x + w]


def describe_crop(crop: Optional[tuple[int, int, int, int]]) -> str:
    """`` (each frame's region x=..., y=..., width ..., height ...)`` for a crop, ``""`` for ``None`` (the demo's and
    the CLI's summaries)."""
    if crop is None:
        return ""
    x, y, w, h = crop
    return f" (each frame's region x={x}, y={y}, width {w}, height {h})"


def read_frames(path: Union[str, os.PathLike, None] = None, max_frames: Optional[int] = None,
                size: Optional[tuple[int, int]] = None, normalize: bool = True, start: int = 0,
                stride: int = 1, crop: Optional[tuple[int, int, int, int]] = None) -> Iterator[torch.Tensor]:
    """Yield frames of a video as ``[1, 3, h, w]`` float tensors (see :func:`to_tensor`).

    ``path`` defaults to the sample ``vtest.avi``; ``start``/``stride`` select frames;
    ``max_frames`` bounds how many are yielded; ``crop = (x, y, width, height)`` in the video's pixels takes that
    region of each frame before the resize to ``size`` (a fixed region of a static camera's view, as a model of
    person crops watches one person).
    """
    import cv2

    check_crop(crop, "read_frames: crop")
    path = find_sample_video() if path is None else Path(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"read_frames: video {str(path)!r} does not exist. {SAMPLE_VIDEO_HELP}")
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise RuntimeError(f"read_frames: OpenCV could not open {str(path)!r}")
    try:
        index = yielded = 0
        while max_frames is None or yielded < max_frames:
            ok, frame = cap.read()
            if not ok:
                break
            if index >= start and (index - start) % stride == 0:
                yield to_tensor(crop_frame(frame, crop, "read_frames: crop"), size, normalize)
                yielded += 1
            index += 1
    finally:
        cap.release()


def video_info(path: Union[str, os.PathLike]) -> dict:
    """``{"frames", "fps", "height", "width"}`` of a video file."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        return {"frames": int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), "fps": float(cap.get(cv2.CAP_PROP_FPS)),
                "height": int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)), "width": int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))}
    finally:
        cap.release()
