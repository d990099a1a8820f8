"""Where the float32 accumulators are left: for each model, the truncating layers (activations, max
pooling, products, layer norms; not the input sparsifier) that still keep one after ``convert``'s
default value mode, and their share of those layers' output elements (the state traffic value mode
removes elsewhere). Random weights, the reference backend on the CPU, two frames.

    PYTHONPATH=. python benchmarks/experiments/accumulator_share.py [--models resnet50 mobilenet_v2] [--size 272 480] \
        [--no-whole-sums] [--no-whole-products] [--state]

``--no-whole-sums``: with ``deltaconv.convert.WHOLE_SUMS`` off (projections, adds between blocks and
products in delta mode, the default before 2026-12-01 23:00 UTC). ``--state``: also the state bytes of
the model converted in float16 (on this CPU) and how many layers value mode marked.
``--no-whole-products``: with ``deltaconv.convert.WHOLE_PRODUCTS`` off (the squeeze-excite products keep
accumulators, the default before 2026-12-02 01:15 UTC).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import torchvision_model  # noqa: E402  (seeded, BatchNorm statistics randomised)


def converted(name: str, size: tuple[int, int], dtype: torch.dtype = torch.float32):
    """Torchvision's ``name`` in ``dtype`` converted with the defaults, after two frames of ``size``."""
    import deltaconv
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(0))
    dm = deltaconv.convert(torchvision_model(name).to(dtype), backend="reference", example_input=x.to(dtype))
    with torch.no_grad():
        dm(x.to(dtype)), dm((x + 0.01 * torch.randn_like(x)).to(dtype))
    return dm


def marks(dm) -> dict:
    """How many layers value mode marked: recomputing and output-keeping convolutions, sum-keeping adds,
    products taking whole values, activations not writing their changes (read only as whole values)."""
    return {flag: sum(bool(getattr(m, flag, False)) for m in dm.modules())
            for flag in ("recomputes", "keeps_output", "keeps_sum", "takes_whole", "changes_unread")}


def accumulator_share(name: str, size: tuple[int, int]) -> tuple[int, int, float, dict]:
    """(layers keeping an accumulator, truncating layers, their share of the output elements, the share
    by layer kind) of torchvision's ``name`` converted with the defaults, after two frames of ``size``."""
    dm = converted(name, size)
    layers = [layer for layer in dm.delta_layers() if layer.truncates and layer.kind != "sparsify"]
    total, kept, n_acc, by_kind = 0.0, 0.0, 0, {}
    for layer in layers:
        elements = layer.stats()["elements_dense"]
        total += elements
        if any(n.startswith("acc") and b is not None for n, b in layer._buffers.items()):
            kept, n_acc = kept + elements, n_acc + 1
            by_kind[layer.kind] = by_kind.get(layer.kind, 0.0) + elements
    return n_acc, len(layers), kept / total, {k: v / total for k, v in by_kind.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "fcn_resnet50", "resnext50_32x4d", "mobilenet_v2",
                                                   "deeplabv3_mobilenet_v3_large"])
    p.add_argument("--size", type=int, nargs=2, default=[272, 480])
    p.add_argument("--no-whole-sums", action="store_true", help="convert with deltaconv.convert.WHOLE_SUMS off")
    p.add_argument("--no-whole-products", action="store_true",
                   help="convert with deltaconv.convert.WHOLE_PRODUCTS off")
    p.add_argument("--state", action="store_true",
                   help="also the state of the model converted in float16 and how many layers value mode marked")
    a = p.parse_args(argv)
    import importlib
    if a.no_whole_sums:
        importlib.import_module("deltaconv.convert").WHOLE_SUMS = False
    if a.no_whole_products:
        importlib.import_module("deltaconv.convert").WHOLE_PRODUCTS = False
    for name in a.models:
        n_acc, n, share, kinds = accumulator_share(name, tuple(a.size))
        print(f"{name}: {n_acc} of {n} truncating layers keep an accumulator, {share:.3f} of their output elements "
              f"(" + ", ".join(f"{k} {v:.3f}" for k, v in kinds.items()) + ")", flush=True)
        if a.state:
            dm = converted(name, tuple(a.size), torch.float16)
            print(f"  {name}: state in float16 {dm.state_bytes() / 2**20:.1f} MiB; marked: "
                  + ", ".join(f"{k} {v}" for k, v in marks(dm).items()), flush=True)


if __name__ == "__main__":
    main()
