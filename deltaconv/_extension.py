"""Loading the compiled CUDA extension ``deltaconv._C`` (the ``torch.ops.deltaconv`` operators).

``load()`` never raises: ``import deltaconv`` must work on machines without the extension, a GPU
or a CUDA build of torch (the reference backend then runs everything). ``unavailable_reason()``
says what is missing and how to fix it.
"""
from __future__ import annotations

import glob
import os

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REBUILD = ("rebuild it from the repository root with `pip install --no-build-isolation -e .` or "
            "`python setup.py build_ext --inplace` (needs nvcc and a CUDA build of torch)")

_state = {"tried": False, "loaded": False, "error": "", "path": ""}


def library_path() -> str:
    """Path of the built extension next to the package, or ``""`` when there is none."""
    candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_C*.so")) + glob.glob(os.path.join(_PACKAGE_DIR, "_C*.pyd")))
    # prefer the stable-ABI build when several are present
    candidates.sort(key=lambda p: (".abi3." not in p, p))
    return candidates[0] if candidates else ""


def load() -> bool:
    """Load the extension once (idempotent); ``True`` when ``torch.ops.deltaconv`` is usable."""
    if _state["tried"]:
        return _state["loaded"]
    _state["tried"] = True
    path = library_path()
    _state["path"] = path
    if not path:
        _state["error"] = "not built"
        return False
    try:
        torch.ops.load_library(path)
    except Exception as exc:  # noqa: BLE001 - any failure only disables the CUDA backend
        _state["error"] = f"{type(exc).__name__}: {exc}"
        return False
    _state["loaded"] = True
    return True


def loaded() -> bool:
    """Whether the extension is loaded (without trying to load it)."""
    return bool(_state["loaded"])


def unavailable_reason() -> str:
    """Why the CUDA kernels cannot run here, as an actionable sentence; ``""`` when they can."""
    ok = load()
    if not ok:
        if _state["error"] == "not built":
            return (f"the CUDA extension deltaconv._C is not built (no _C*.so in {_PACKAGE_DIR}); {_REBUILD}")
        return (f"the CUDA extension {_state['path']} failed to load ({_state['error']}); it must be built "
                f"against the installed torch {torch.__version__}: {_REBUILD}")
    if not torch.version.cuda:
        return (f"the installed torch {torch.__version__} has no CUDA support; install a CUDA build of torch "
                "(the extension is built against it)")
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False); check the driver and CUDA_VISIBLE_DEVICES"
    return ""
