"""``DeltaModel``: a converted network, its per-stream state, thresholds and statistics."""
from __future__ import annotations

import json
import os
from typing import Iterable, Optional, Union

import torch
import torch.fx as fx
import torch.nn as nn

from . import backends
from .modules import DCModule, FrameContext
from .report import ConversionReport


class DeltaModel(nn.Module):
    """A dense model converted by :func:`deltaconv.convert`.

    Call it on consecutive frames ``[N, 3, H, W]`` (one video stream per batch entry); it returns
    what the dense model returns (tensor, tuple or dict). The first frame after construction or
    :meth:`reset`, and any frame whose shape, dtype or device differs from the previous one, is a
    key frame: it runs dense and fills the state. Later frames process only changed pixels.

    The module tree is the dense model's (so its ``state_dict`` loads unchanged), with each layer
    replaced by its ``DC*`` layer and extra layers for functional ops added next to where they
    were called. Per-frame state lives in non-persistent buffers: it is per stream, so one model
    instance serves one set of streams at a time.
    """

    def __init__(self, dense: nn.Module, graph: fx.Graph, report: ConversionReport, backend: str = "auto"):
        super().__init__()
        for name, child in dense.named_children():
            self.add_module(name, child)
        for name, p in dense.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in dense.named_buffers(recurse=False):
            self.register_buffer(name, b, persistent=name not in dense._non_persistent_buffers_set)
        self.backend = backends.check_name(backend)
        self._report = report
        self._context = FrameContext()
        # the graph runner shares this module's layers; kept out of the module tree
        self.__dict__["_runner"] = fx.GraphModule(self, graph, class_name=f"{type(dense).__name__}Delta")
        self._layer_names = [n.target for n in graph.nodes if n.op == "call_module"]
        self._layer_names = list(dict.fromkeys(self._layer_names))
        for name in self._layer_names:
            layer = self.get_submodule(name)
            layer.layer_name = name
            layer.context = self._context
        self._signature = None
        self._pending_key: Optional[list[bool]] = None

    # ------------------------------------------------------------------ running
    def forward(self, *frames: torch.Tensor):
        frames = tuple(f.contiguous(memory_format=torch.channels_last) if f.dim() == 4 else f for f in frames)
        signature = tuple((tuple(f.shape), f.dtype, f.device) for f in frames)
        if signature != self._signature:
            self._release_state()
            self._signature = signature
            self._pending_key = [True] * frames[0].shape[0]
        ctx = self._context
        device = frames[0].device
        ctx.ops = backends.select(self.backend, device)
        if self._pending_key is not None and any(self._pending_key):
            ctx.key = torch.tensor(self._pending_key, dtype=torch.bool).to(device, non_blocking=True)
        else:
            ctx.key = None
        try:
            out = self._runner(*frames)
        finally:
            ctx.key = None
        self._pending_key = None
        return out

    def reset(self, streams: Optional[Iterable[int]] = None) -> None:
        """Make the next frame a key frame, for all streams or only the given batch indices."""
        if streams is None:
            for layer in self.layers():
                layer.reset_state()
            self._pending_key = None if self._signature is None else [True] * self._signature[0][0][0]
            return
        streams = [int(s) for s in streams]
        if self._signature is None:
            return  # nothing ran yet: the next frame is a key frame for every stream anyway
        n = self._signature[0][0][0]
        bad = [s for s in streams if not 0 <= s < n]
        if bad:
            raise IndexError(f"reset: streams must be batch indices in [0, {n}), got {bad}")
        for layer in self.layers():
            layer.reset_state(streams)
        key = self._pending_key or [False] * n
        for s in streams:
            key[s] = True
        self._pending_key = key

    def _release_state(self) -> None:
        for layer in self.layers():
            layer.release_state()

    # ------------------------------------------------------------------ introspection
    @property
    def report(self) -> ConversionReport:
        """What the converter made of every node (see :class:`ConversionReport`)."""
        return self._report

    def layers(self) -> list[DCModule]:
        """The DC layers in execution order, the input sparsifier first."""
        return [self.get_submodule(n) for n in self._layer_names]

    def stats(self) -> list[dict]:
        """One dict per DC layer in execution order: ``name``, ``kind``, ``density`` (fraction of
        output pixels updated in the last frame), ``mean_density`` since reset, ``frames``,
        ``flops_dense`` / ``flops_done`` / ``mean_flops_done`` (per frame), ``state_bytes`` and,
        for truncating layers, ``threshold``."""
        return [layer.stats() for layer in self.layers()]

    def state_bytes(self) -> int:
        """Bytes of per-frame state held by all layers."""
        return sum(layer.state_bytes() for layer in self.layers())

    # ------------------------------------------------------------------ thresholds
    def thresholds(self) -> dict[str, float]:
        """``{layer name: threshold}`` of the sparsifier and every non-linear layer."""
        return {layer.layer_name: layer.threshold for layer in self.layers() if layer.truncates}

    def set_threshold_all(self, value: float) -> None:
        """Set every truncating layer's threshold to ``value``."""
        for layer in self.layers():
            if layer.truncates:
                layer.threshold = float(value)

    def load_thresholds(self, thresholds: Union[dict, str, os.PathLike], strict: bool = True) -> None:
        """Set thresholds from ``{layer name: value}`` or a JSON file written by
        :meth:`save_thresholds`. With ``strict``, unknown names raise ``KeyError``."""
        if not isinstance(thresholds, dict):
            with open(thresholds) as f:
                thresholds = json.load(f)
            thresholds = thresholds.get("thresholds", thresholds)
        known = {layer.layer_name: layer for layer in self.layers() if layer.truncates}
        unknown = sorted(set(thresholds) - set(known))
        if unknown and strict:
            raise KeyError(f"load_thresholds: no truncating layer named {unknown[:5]}"
                           f"{' ...' if len(unknown) > 5 else ''}; known names: {sorted(known)[:8]} ...")
        for name, value in thresholds.items():
            if name in known:
                if not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"load_thresholds: threshold of {name!r} must be a number >= 0, got {value!r}")
                known[name].threshold = float(value)

    def save_thresholds(self, path: Union[str, os.PathLike]) -> None:
        """Write the thresholds as JSON (``{"thresholds": {layer name: value}}``)."""
        with open(path, "w") as f:
            json.dump({"thresholds": self.thresholds()}, f, indent=1, sort_keys=True)
