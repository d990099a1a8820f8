"""Build script of deltaconv: the Python package plus one CUDA extension, ``deltaconv._C``.

Metadata lives in pyproject.toml; this file only adds the extension. Build with the torch that is
already installed (build isolation would download another, CPU-only or mismatched, torch)::

    pip install --no-build-isolation -e .        # editable install, builds deltaconv/_C.abi3.so
    python setup.py build_ext --inplace           # just (re)build the extension in the package

The extension is one stable-ABI (abi3) shared library: built under any Python >= 3.9 it loads
under every later one. It holds only ``TORCH_LIBRARY`` registrations (no pybind), loaded by
``deltaconv._extension.load()`` through ``torch.ops.load_library``.

It is built when ``nvcc`` is found, the installed torch has CUDA (``torch.version.cuda``) and
``DELTACONV_NO_CUDA`` is unset; otherwise the package installs as pure Python (reference backend
only) with a printed note. No GPU is needed to build. Environment knobs:

* ``TORCH_CUDA_ARCH_LIST`` (default ``9.0a``: H100/H200 with their wgmma instructions; a list
  without an ``a`` target builds the mma.sync paths only), ``MAX_JOBS`` (default 2),
* ``DELTACONV_NO_CUDA=1`` to skip the extension, ``DELTACONV_DEBUG=1`` for ``-O0 -g -G``.

Machines without a system CUDA toolkit beyond ``nvcc`` work too: the CUDA headers that
``ATen/cuda/CUDAContext.h`` pulls in (cublas, cusparse, ...) are taken from the pip wheels under
``site-packages/nvidia/*/include``, and ``-lcudart`` is resolved through a ``libcudart.so``
symlink (created under ``build/``) to ``site-packages/nvidia/cu13/lib/libcudart.so.13``.
"""
from __future__ import annotations

import glob
import os
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
os.environ.setdefault("MAX_JOBS", "2")


def _nvidia_dirs() -> list[str]:
    """The ``site-packages/nvidia`` folders of the pip CUDA wheels (possibly none)."""
    dirs = []
    for entry in sys.path:
        cand = os.path.join(entry, "nvidia")
        if entry and os.path.isdir(cand) and cand not in dirs:
            dirs.append(cand)
    return dirs


def _cuda_include_dirs() -> list[str]:
    return sorted({d for base in _nvidia_dirs() for d in glob.glob(os.path.join(base, "*", "include"))})


def _cudart_link_dir() -> list[str]:
    """A folder under build/ holding ``libcudart.so`` -> the pip wheel's ``libcudart.so.N``."""
    for base in _nvidia_dirs():
        libs = sorted(glob.glob(os.path.join(base, "cu*", "lib", "libcudart.so.*"))
                      + glob.glob(os.path.join(base, "cuda_runtime", "lib", "libcudart.so.*")))
        if not libs:
            continue
        link_dir = os.path.join(ROOT, "build", "deltaconv_cudart")
        os.makedirs(link_dir, exist_ok=True)
        link = os.path.join(link_dir, "libcudart.so")
        if os.path.islink(link) or os.path.exists(link):
            os.remove(link)
        os.symlink(libs[0], link)
        return [link_dir]
    return []


def _why_no_cuda() -> str:
    """Empty when the extension can be built, else the reason it is skipped."""
    if os.environ.get("DELTACONV_NO_CUDA"):
        return "DELTACONV_NO_CUDA is set"
    try:
        import torch
    except ImportError:
        return "torch is not installed (install torch first and build with --no-build-isolation)"
    if not torch.version.cuda:
        return f"the installed torch {torch.__version__} has no CUDA support"
    from torch.utils.cpp_extension import CUDA_HOME
    nvcc = shutil.which("nvcc") or (os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None)
    if not nvcc or not os.path.exists(nvcc):
        return "nvcc was not found (put the CUDA toolkit's bin/ on PATH or set CUDA_HOME)"
    return ""


def _extensions_and_cmdclass():
    reason = _why_no_cuda()
    if reason:
        print(f"deltaconv: NOT building the CUDA extension ({reason}); installing pure Python "
              "(the reference backend only).", file=sys.stderr)
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp"))) + sorted(
        glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    debug = bool(os.environ.get("DELTACONV_DEBUG"))
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # no --use_fast_math: the kernels must match the reference backend's float32 arithmetic
    nvcc_flags = opt + ["-std=c++17", "-lineinfo"] + (["-G"] if debug else [])
    # the host code may launch the wgmma kernels only when the build has their sm_90a machine code
    arches = os.environ["TORCH_CUDA_ARCH_LIST"].replace(" ", ";").split(";")
    if any(a.startswith("9.0a") for a in arches):
        nvcc_flags.append("-DDC_SM90A=1")
    cxx_flags = opt + ["-std=c++17"]
    from torch.utils import cpp_extension
    if not hasattr(cpp_extension, "min_supported_cpython"):
        # newer torch defines Py_LIMITED_API itself (to its own minimum, 3.10 in torch 2.11)
        cxx_flags.append("-DPy_LIMITED_API=0x03090000")
    ext = CUDAExtension(
        name="deltaconv._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")] + _cuda_include_dirs(),
        library_dirs=_cudart_link_dir(),
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )
    use_ninja = shutil.which("ninja") is not None
    print(f"deltaconv: building the CUDA extension for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']} "
          f"with MAX_JOBS={os.environ['MAX_JOBS']} ({'ninja' if use_ninja else 'no ninja'}); "
          f"{len(sources)} sources", file=sys.stderr)
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=use_ninja)}


ext_modules, cmdclass = _extensions_and_cmdclass()

setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp39"}} if ext_modules else {},
)
