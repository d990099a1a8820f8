"""Backends implement the delta rule of every layer: ``reference`` (PyTorch, any device) and
``cuda`` (the compiled kernels). Both expose the same functions; see ``reference.py``."""
from __future__ import annotations

from types import ModuleType

import torch

from . import reference

BACKENDS = ("auto", "reference", "cuda")


def check_name(backend: str) -> str:
    """Validate a backend name, naming the argument and value on error."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def cuda_backend() -> tuple[ModuleType | None, str]:
    """The CUDA backend module and ``""``, or ``None`` and the reason it cannot be used."""
    try:
        from . import cuda
    except Exception as exc:  # noqa: BLE001 - any import failure makes the backend unavailable
        return None, f"the CUDA backend failed to import: {exc}"
    if not cuda.is_available():
        return None, cuda.unavailable_reason()
    return cuda, ""


def select(backend: str, device: torch.device) -> ModuleType:
    """The backend module that runs a frame on ``device`` for the requested ``backend`` name."""
    if backend == "reference":
        return reference
    if device.type != "cuda":
        if backend == "cuda":
            raise RuntimeError(f"backend='cuda' needs the model and frames on a CUDA device; they are on {device}. "
                               "Move the model with .to('cuda') or use backend='auto' or 'reference'.")
        return reference
    module, reason = cuda_backend()
    if module is None:
        if backend == "cuda":
            raise RuntimeError(f"backend='cuda' is unavailable: {reason}")
        return reference
    return module
