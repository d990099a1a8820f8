"""The CUDA extension: built wherever nvcc and a CUDA torch are present (so CI compiles it and
broken CUDA fails CI), loadable without a GPU, and never breaking ``import deltaconv``."""
import os
import re
import shutil

import pytest
import torch

import deltaconv
from deltaconv import _extension, backends

BUILDABLE = bool(shutil.which("nvcc")) and bool(torch.version.cuda) and not os.environ.get("DELTACONV_NO_CUDA")


@pytest.mark.skipif(not BUILDABLE, reason="no nvcc or no CUDA torch: the extension is not built here")
def test_extension_is_built_and_registers_every_op():
    assert _extension.load(), _extension.unavailable_reason()
    for op in ("sparsify", "densify", "activation", "add_activation", "affine_channel", "add", "mul", "concatenate",
               "interleave_channels", "interpolate", "resample", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
               "adaptive_avg_pool2d", "linear", "layer_norm", "max_pool2d_values"):
        assert hasattr(torch.ops.deltaconv, op), op
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"deltaconv::{op}", "CUDA"), op


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_backend_says_why_it_is_unavailable_on_cpu():
    module, reason = backends.cuda_backend()
    assert module is None and reason
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    dm = deltaconv.convert(model, backend="cuda", example_input=torch.randn(1, 3, 16, 16))
    with pytest.raises(RuntimeError, match="backend='cuda' needs the model and frames on a CUDA device; they are on cpu"):
        dm(torch.randn(1, 3, 16, 16))
    auto = deltaconv.convert(model, backend="auto", example_input=torch.randn(1, 3, 16, 16))
    x = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(auto(x), model(x), rtol=1e-5, atol=1e-6)  # auto falls back to the reference


def _kernel_bodies(source: str):
    """(name, body text) of every ``__global__`` function defined in a CUDA source."""
    for m in re.finditer(r"__global__\b", source):
        head = source[m.end():]
        lb = re.match(r"\s*void\s+(__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(", head)
        assert lb, head[:120]
        depth, i = 0, m.end() + lb.end() - 1
        while True:  # skip the parameter list
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
            if depth == 0:
                break
        brace = source.index("{", i)
        yield lb.group(2), source[brace + 1:brace + 6000]


# Kernels that copy their weights (which no kernel of their op writes) before grid_dependency_sync():
# only through the weight's tensor map; every other argument is read after it.
EARLY_WEIGHT_COPY = {"conv3x3_stationary_kernel": "w_map"}


def test_every_kernel_waits_for_the_previous_kernel_first_and_is_launched_by_launch_kernel():
    """Programmatic dependent launch (DELTACONV_PDL=1) is only safe if every kernel calls
    grid_dependency_sync() before touching global memory and every launch goes through
    launch_kernel (csrc/kernels/grid_dependency.cuh); the kernels of EARLY_WEIGHT_COPY touch only
    their weights' tensor map before it."""
    from pathlib import Path
    csrc = Path(__file__).resolve().parent.parent / "csrc"
    names = []
    for path in sorted(csrc.rglob("*.cu*")):
        text = path.read_text()
        assert "<<<" not in text, f"{path.name}: launch with <<<...>>> instead of launch_kernel"
        for name, body in _kernel_bodies(text):
            first = body.strip().split(";")[0].strip()
            names.append(name)
            if name in EARLY_WEIGHT_COPY:
                before = body[:body.index("grid_dependency_sync();")]
                assert EARLY_WEIGHT_COPY[name] in before and "tma_load_2d" in before, name
                assert not re.search(r"\ba\.(x|y|mask|key|list|count|split_counts|w|bias)\b", before), (
                    f"{path.name}: {name} reads an argument other than its weight map before grid_dependency_sync()")
                continue
            assert first == "grid_dependency_sync()", f"{path.name}: {name} starts with {first!r}"
    assert {"conv3x3_tc_kernel", "conv_gather_tc_kernel", "activation_kernel", "clear_counters_kernel"} <= set(names)
    assert len(names) >= 24


def test_states4_hands_4d_views_and_copies_back_only_what_it_copied():
    """The CUDA backend's in-place states (``_states4``): a channels-last 4-D state and a contiguous
    2-D one are handed over as views of their storage; an NCHW state as a channels-last copy, which
    is copied back after the block, and not when the block raises."""
    from deltaconv.backends import cuda as cuda_backend

    cl = torch.zeros(1, 8, 3, 5).contiguous(memory_format=torch.channels_last)
    flat = torch.zeros(2, 8)
    nchw = torch.zeros(1, 8, 3, 5)
    with cuda_backend._states4(cl, flat, nchw) as (a, b, c):
        assert a.data_ptr() == cl.data_ptr() and b.data_ptr() == flat.data_ptr() and b.shape == (2, 8, 1, 1)
        assert c.data_ptr() != nchw.data_ptr() and c.is_contiguous(memory_format=torch.channels_last)
        for t in (a, b, c):
            t.fill_(1.0)
    assert bool((cl == 1).all() and (flat == 1).all() and (nchw == 1).all())
    with pytest.raises(RuntimeError, match="op failed"):
        with cuda_backend._states4(nchw) as (c,):
            c.fill_(2.0)
            raise RuntimeError("op failed")
    assert bool((nchw == 1).all())  # the failed op's copy is not written back


@pytest.mark.parametrize("size, kernel, stride, padding, ceil_mode, divisor, expected", [
    ((64, 64), 64, 64, 0, False, None, [1, 1]),     # a global pooling as a fixed window (TFLite squeeze-excite)
    ((64, 64), 64, None, 0, True, None, [1, 1]),     # stride None is the window
    ((32, 48), 8, 8, 0, True, None, [4, 6]),         # 8x8 windows tiling the map
    ((32, 48), (16, 4), (16, 4), 0, False, None, [2, 12]),
    ((31, 45), 8, 8, 0, False, None, None),          # rows left over: not the adaptive windows
    ((31, 45), 8, 8, 0, True, None, None),           # a ceil-mode partial window: not either
    ((64, 64), 4, 4, 0, False, None, None),          # a small window: the window kernel
    ((64, 64), 64, 32, 0, False, None, None),        # overlapping windows
    ((64, 64), 64, 64, 1, False, None, None),        # padding
    ((64, 64), 64, 64, 0, False, 7, None),           # a divisor override
])
def test_large_tiling_average_poolings_run_as_adaptive_poolings(size, kernel, stride, padding, ceil_mode, divisor,
                                                                expected):
    """The CUDA backend's ``avg_pool2d`` hands a window of at least ``LARGE_POOL_WINDOW`` pixels that tiles
    the map exactly to the adaptive pooling (the same windows), and nothing else."""
    from deltaconv.backends import cuda as cuda_backend

    assert cuda_backend._tiling_pool_output(size, kernel, stride, padding, ceil_mode, divisor) == expected
