"""pytest configuration: markers, import path of ``helpers``, deterministic seeds."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    # The tests use small tensors, for which intra-op threads only cost: on a loaded machine with
    # few cores, two OpenMP threads made a 64x112 conv 100x slower than one. Override with
    # DELTACONV_TEST_THREADS.
    torch.set_num_threads(int(os.environ.get("DELTACONV_TEST_THREADS", "1")))
    # Full float32 on the GPU for every test: with cuDNN's TF32 default a dense float32 conv is off
    # by ~3e-4, which fails the 1e-4 tolerance of test_modules' cuda-reference cases when they run
    # on their own (the full suite passed them only because test_gpu_models switched TF32 off first).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (and, for backend='cuda', the built extension)")
    config.addinivalue_line("markers", "slow: long-running (hundreds of frames or large models)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def devices():
    from helpers import DEVICES
    return DEVICES
