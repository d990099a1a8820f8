"""Where the time of a converted model goes: per-layer timing of eager frames.

``profile_layers(dm, frames)`` runs the frames through ``dm`` with timing hooks on every DC layer
(CUDA events on the GPU, ``time.perf_counter`` on the CPU) and returns one dict per layer in
execution order: ``name``, ``kind``, ``ms`` (median per frame, excluding the first, key frame),
``share`` of the summed layer time, ``mean_density``. Hooks add a little overhead per layer, so
compare layers with each other, not the sum with an un-hooked run.

``dense_activation_bytes(model, example)`` gives the dense model's activation memory, the yardstick
for a converted model's state (``DeltaModel.state_bytes()``): the sum of all its layer outputs
(what a stateful method has to keep), and on CUDA the peak of one dense forward.
"""
from __future__ import annotations

import statistics
import time
from typing import Iterable

import torch
import torch.nn as nn

from .model import DeltaModel


class _Timer:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.pending: list = []
        self.start = None

    def begin(self, *_):
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter()

    def end(self, *_):
        if self.cuda:
            stop = torch.cuda.Event(enable_timing=True)
            stop.record()
            self.pending.append((self.start, stop))
        else:
            self.pending.append(1000.0 * (time.perf_counter() - self.start))

    def times_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.pending]
        return list(self.pending)


def profile_layers(dm: DeltaModel, frames: Iterable[torch.Tensor]) -> list[dict]:
    """Per-layer median milliseconds over ``frames`` (the first frame, a key frame, is excluded)."""
    if not isinstance(dm, DeltaModel):
        raise TypeError(f"profile_layers: dm must be a DeltaModel, got {type(dm).__name__}")
    frames = list(frames)
    if len(frames) < 2:
        raise ValueError(f"profile_layers: needs at least 2 frames (the first is a key frame), got {len(frames)}")
    cuda = frames[0].is_cuda
    layers = dm.delta_layers()
    timers, handles = [], []
    for layer in layers:
        timer = _Timer(cuda)
        handles.append(layer.register_forward_pre_hook(timer.begin))
        handles.append(layer.register_forward_hook(timer.end))
        timers.append(timer)
    graph_mode, dm.cuda_graph, dm._graph = dm.cuda_graph, False, None
    try:
        for f in frames:
            dm(f)
    finally:
        dm.cuda_graph = graph_mode
        for h in handles:
            h.remove()
    stats = dm.stats()
    rows = []
    for layer, timer, st in zip(layers, timers, stats):
        times = timer.times_ms()[1:]  # drop the key frame
        rows.append({"name": layer.layer_name, "kind": layer.kind,
                     "ms": statistics.median(times) if times else float("nan"),
                     "mean_density": st["mean_density"]})
    total = sum(r["ms"] for r in rows if r["ms"] == r["ms"]) or 1.0
    for r in rows:
        r["share"] = r["ms"] / total
    return rows


def format_profile(rows: list[dict], top: int = 20) -> str:
    """The ``top`` most expensive layers as a text table."""
    lines = [f"{'layer':40s} {'kind':18s} {'ms':>8s} {'share':>6s} {'density':>8s}"]
    for r in sorted(rows, key=lambda r: -r["ms"])[:top]:
        lines.append(f"{r['name'][:40]:40s} {r['kind'][:18]:18s} {r['ms']:8.3f} {r['share']:6.1%} "
                     f"{r['mean_density']:8.3f}")
    return "\n".join(lines)


def dense_activation_bytes(model: nn.Module, example: torch.Tensor) -> dict:
    """Activation memory of one dense forward of ``model`` on ``example``.

    Returns ``{"sum": bytes, "peak": bytes or None}``. ``sum``: every distinct output tensor of a
    leaf module (an in-place op's output shares its input's storage and is counted once). All
    outputs are kept alive until the forward ends, so a freed block that the allocator hands out
    again is not mistaken for the same tensor. ``peak``: on CUDA, the peak memory of the forward
    above what was allocated before it (weights, input); ``None`` on other devices.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"dense_activation_bytes: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"dense_activation_bytes: example must be a Tensor, got {type(example).__name__}")
    kept: dict[int, torch.Tensor] = {}

    def hook(_module, _args, out):
        outs = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
        for t in outs:
            if isinstance(t, torch.Tensor):
                kept.setdefault(t.untyped_storage().data_ptr(), t)

    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    total = sum(t.untyped_storage().nbytes() for t in kept.values())
    kept.clear()
    if not example.is_cuda:
        return {"sum": total, "peak": None}
    # the hooked forward kept every output alive; the dense peak comes from a plain forward
    torch.cuda.synchronize(example.device)
    torch.cuda.reset_peak_memory_stats(example.device)
    base = torch.cuda.memory_allocated(example.device)
    with torch.no_grad():
        model(example)
    torch.cuda.synchronize(example.device)
    return {"sum": total, "peak": torch.cuda.max_memory_allocated(example.device) - base}
