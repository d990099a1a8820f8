"""What one delta frame runs on the CUDA backend, counted without a GPU (``tests/frame_census.py``, in a process of
its own: the model and frames as FakeTensors on a fake CUDA device, the extension's ops by their ``register_fake``
shapes). These run on CPU-only machines and CI, where the GPU tests skip: they pin the per-frame launches that the
speed figures rest on, so that a torch op slipping into every frame, or a layer leaving its kernel, fails here and
not only on a GPU. The census counts ops, not kernels (a deltaconv op may launch two); it agreed with the H100
profile of MediaPipe's selfie segmentation (39 torch kernels a frame, 2026-12-07 23:29 UTC)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltaconv import _extension

pytestmark = pytest.mark.skipif(not _extension.load(), reason="the extension did not load")

ROOT = Path(__file__).resolve().parents[1]


def _census(name: str, height: int = 64, width: int = 96) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "frame_census.py"), name, str(height), str(width)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, f"frame_census.py {name} printed no result (rc {run.returncode}): {run.stderr[-2000:]}"
    return json.loads(lines[-1])


def _torch_ops(ops: dict) -> dict:
    return {k: v for k, v in ops.items() if not k.startswith("deltaconv.")}


def test_a_mobilenet_v2_frame_runs_five_torch_kernels():
    """MobileNetV2, float16, a 64x96 frame: 101 deltaconv ops and five torch kernels: the frame's channels-last
    copy (``clone``; the frames here are NCHW), the input sparsifier's frame values (``where``), the per-frame
    work counters (``zero_``), and the whole head's changed samples (``any``) and output copy (``clone``)."""
    ops = _census("mobilenet_v2")
    assert _torch_ops(ops) == {"aten.clone": 2, "aten.where": 1, "aten.zero_": 1, "aten.any": 1}, ops
    assert sum(v for k, v in ops.items() if k.startswith("deltaconv.")) == 101, ops
    # value mode: every activation from whole values, the 17 projections keeping their outputs for the adds
    assert ops["deltaconv.activation_values"] == 35 and ops["deltaconv.conv1x1_rows_into"] == 17, ops


def test_a_resnet50_frame_runs_six_torch_kernels():
    """ResNet-50, float16: mobilenet_v2's five and the stem's whole max pooling (torch's ``max_pool2d`` of the
    stem activation's whole values)."""
    ops = _census("resnet50")
    assert _torch_ops(ops) == {"aten.clone": 2, "aten.where": 1, "aten.zero_": 1, "aten.any": 1,
                               "aten.max_pool2d_with_indices": 1}, ops
