"""MediaPipe's BlazePose (full) pose landmark network with its real weights, from the TFLite file that the PyPI
package ``mediapipe`` ships (:func:`deltaconv.weights.blazepose_full_tflite`), through :func:`deltaconv.load_tflite`.

The second stage of MediaPipe's pose pipeline: a 256x256 crop around one person in, RGB in [0, 1]; out, in the
file's order, 39 landmarks of (x, y, z, visibility, presence) in crop pixels ``[N, 195]``, the pose flag (the
probability that the crop holds a pose) ``[N, 1]``, segmentation logits ``[N, 1, 256, 256]``, landmark heatmaps
``[N, 39, 64, 64]`` and world landmarks in metres ``[N, 117]``. Its layers: convolutions, depthwise convolutions,
ReLU6, residual adds, max pooling, bilinear upsampling (its decoder to the heatmaps and the mask). The landmark
heads reduce the map to 1x1 before their reshapes, so the network runs at 256x256 only.
"""
from __future__ import annotations

import os
from typing import Union

import torch

from .model_files import FileModel
from .tflite_models import TFLiteModule, load_tflite

#: the names of :class:`BlazePoseFull`'s outputs, the file's order after the mask ("out")
OUTPUT_NAMES = ("out", "heatmaps", "landmarks", "pose_flag", "world_landmarks")
#: the crop size the file was made for
INPUT_SIZE = (256, 256)
#: the body landmarks among the 39 (the last 6 are MediaPipe's auxiliary ones for its crop tracking)
BODY_LANDMARKS = 33
#: the skeleton's edges between body landmarks (MediaPipe's ``POSE_CONNECTIONS``,
#: ``mediapipe/python/solutions/pose_connections.py``, Apache-2.0)
POSE_CONNECTIONS = ((0, 1), (1, 2), (2, 3), (3, 7), (0, 4), (4, 5), (5, 6), (6, 8), (9, 10), (11, 12), (11, 13),
                    (13, 15), (15, 17), (15, 19), (15, 21), (17, 19), (12, 14), (14, 16), (16, 18), (16, 20),
                    (16, 22), (18, 20), (11, 23), (12, 24), (23, 24), (23, 25), (24, 26), (25, 27), (26, 28),
                    (27, 29), (28, 30), (29, 31), (30, 32), (27, 31), (28, 32))


def keypoints(landmarks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The body landmarks of the ``"landmarks"`` output ``[N, 195]`` (39 x (x, y, z, visibility, presence), x and y
    in input pixels): their ``(x, y)`` ``[N, 33, 2]`` and their visibility as a probability ``[N, 33]`` (the
    sigmoid of the visibility logit, as MediaPipe decodes it)."""
    if landmarks.dim() != 2 or landmarks.shape[1] != 195:
        raise ValueError(f"keypoints: landmarks must be [N, 195] (39 landmarks x 5), got {tuple(landmarks.shape)}")
    points = landmarks.reshape(-1, 39, 5)[:, :BODY_LANDMARKS]
    return points[..., :2], torch.sigmoid(points[..., 3])


class BlazePoseFull(FileModel):
    """The pose landmark network on ImageNet-normalised RGB crops (what :func:`deltaconv.video.read_frames` gives):
    a :class:`~deltaconv.model_files.FileModel` of MediaPipe's file, whose [0, 1] input a per-channel affine in front
    makes; its outputs as a dict, the segmentation logits first as ``"out"`` (the output that
    :func:`deltaconv.fidelity.primary_output` compares), then ``"heatmaps"`` ``[N, 39, 64, 64]``, ``"landmarks"``
    ``[N, 195]``, ``"pose_flag"`` ``[N, 1]``, ``"world_landmarks"`` ``[N, 117]``."""

    deltaconv_task = "pose"              # the demo draws its person mask and its skeleton (keypoints())

    def __init__(self, network: TFLiteModule) -> None:
        super().__init__(network, "unit", INPUT_SIZE)  # the one size it takes (the zoo, the demo and the CLI read it)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``x``: ``[N, 3, 256, 256]`` ImageNet-normalised RGB; returns the dict of the class docstring."""
        landmarks, pose_flag, mask, heatmaps, world = super().forward(x)
        return {"out": mask, "heatmaps": heatmaps, "landmarks": landmarks, "pose_flag": pose_flag,
                "world_landmarks": world}


def blazepose_full(path: Union[str, os.PathLike, None] = None) -> BlazePoseFull:
    """:class:`BlazePoseFull` of the released ``pose_landmark_full.tflite`` (or the file at ``path``), float32, eval
    mode, on the CPU."""
    from .weights import blazepose_full_tflite

    return BlazePoseFull(load_tflite(blazepose_full_tflite() if path is None else path)).eval()
