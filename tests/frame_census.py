"""What one delta frame of a torchvision model runs on the CUDA backend, counted without a GPU, in a process of its
own: ``python tests/frame_census.py NAME H W`` prints a JSON object of op name (``"deltaconv.conv2d"``,
``"aten.zero_"``, ...) to count. Each deltaconv op launches one or more of the extension's kernels, each torch op
one of torch's. The model (``torchvision.models.get_model(NAME)``, random weights, float16), its conversion
(``backend="cuda"``) and three frames of ``1 x 3 x H x W`` (a key frame, a delta frame, the counted frame) are
FakeTensors on a fake CUDA device; the extension's ops run their ``register_fake`` shapes. Views, allocations and
metadata ops are left out (:data:`NO_KERNEL_OPS`). Two switches are patched to make that possible: the CUDA
backend's availability (no GPU) and ``torch.cuda.is_current_stream_capturing``, reported true so that the float16
BatchNorm fold's rounding (``round_keeping_sums``) runs its fixed rounds instead of stopping on a value it cannot
read.

Models whose constructors compute with tensors (torchvision's RegNets derive their widths so) do not build under the
fake mode (``DataDependentOutputException``). Why a process of its own: after such a run the process's heap was corrupted (torch 2.11, this CPU, 2026-12-08: a
later allocation or garbage collection aborted with "corrupted double-linked list" or a segfault, also with no
deltaconv op lacking a fake implementation); the census prints its result and leaves with ``os._exit``."""
from __future__ import annotations

import json
import os
import sys
from unittest import mock

import torch

#: torch ops that launch no kernel (metadata, allocation): left out of the count
NO_KERNEL_OPS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "promote_types", "detach",
                 "lift_fresh", "result_type", "is_contiguous", "sym_size", "sym_stride", "sym_numel",
                 "sym_storage_offset"}


def census(name: str, height: int, width: int) -> dict:
    """The ops of one delta frame of torchvision's ``name`` in float16 at ``height x width`` (module docstring)."""
    import torchvision
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import deltaconv
    import deltaconv.backends.cuda as cuda_backend

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: dict = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            op = func.overloadpacket.__name__
            if func.namespace != "prim" and not func.is_view and op not in NO_KERNEL_OPS:
                key = f"{func.namespace}.{op}"
                self.ops[key] = self.ops.get(key, 0) + 1
            return func(*args, **(kwargs or {}))

    counter = Counter()
    with mock.patch.object(cuda_backend, "is_available", lambda: True), \
            mock.patch.object(torch.cuda, "is_current_stream_capturing", lambda: True), \
            FakeTensorMode(allow_non_fake_inputs=True):
        torch.set_default_device("cuda")
        torch.set_default_dtype(torch.float16)
        model = torchvision.models.get_model(name).eval()
        frames = [torch.rand(1, 3, height, width) for _ in range(3)]
        dm = deltaconv.convert(model, backend="cuda", example_input=frames[0], check_finite=False)
        with torch.no_grad():
            dm(frames[0])
            dm(frames[1])
            with counter:
                dm(frames[2])
    return counter.ops


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python tests/frame_census.py NAME H W")
    print(json.dumps(census(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))), flush=True)
    os._exit(0)
