"""Timing shared by the op-alone A/B scripts of this folder (adaptive_pool_ab.py, resample_ab.py)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import time_in_graph  # noqa: E402

CALLS = 10  # calls per captured graph


def deltaconv_ops():
    """``torch.ops.deltaconv``, after checking for a CUDA device and the built extension (else
    SystemExit with what is missing)."""
    import deltaconv._extension as extension

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark times the CUDA kernels")
    if not extension.load():
        raise SystemExit("deltaconv's CUDA extension did not load (build it: python setup.py build_ext --inplace)")
    return torch.ops.deltaconv


def per_call_us(fn) -> float:
    """Microseconds per call of ``fn`` inside a CUDA graph of ``CALLS`` calls (common.time_in_graph:
    CUDA events around each replay, the median of 30 after 5 replays of warm-up)."""
    return time_in_graph(fn, calls=CALLS) * 1e3
