"""Base class of every converted layer: state handling, statistics and the frame context."""
from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Optional

import torch
import torch.nn as nn

from ..backends import reference
from ..delta import Delta


@dataclass
class FrameContext:
    """Per-frame information shared by all layers of one converted model.

    ``key``: ``None``, or ``[N]`` bool on the model's device marking streams that start a key frame.
    ``ops``: the backend module that runs this frame. ``record_stats``: collect densities.
    """

    key: Optional[torch.Tensor] = None
    ops: ModuleType = reference
    record_stats: bool = True
    extra: dict = field(default_factory=dict)

    def __deepcopy__(self, memo) -> "FrameContext":
        # backend modules are shared, never copied; ``key`` only lives during a frame
        return FrameContext(None, self.ops, self.record_stats, copy.deepcopy(self.extra, memo))

    def __getstate__(self) -> dict:
        return {"ops": self.ops.__name__, "record_stats": self.record_stats, "extra": self.extra}

    def __setstate__(self, state: dict) -> None:
        self.__init__(None, importlib.import_module(state["ops"]), state["record_stats"], state["extra"])


class DCModule(nn.Module):
    """A converted layer. Subclasses implement ``forward`` on :class:`~deltaconv.Delta` inputs.

    Per-frame state lives in non-persistent float32 buffers (``.to()`` moves them; state_dict
    ignores them), allocated on first use with the shape of the data and zeroed by ``reset``.
    """

    #: short description shown in reports and stats
    kind: str = "layer"
    #: whether the layer truncates its output with a threshold (sparsifier and non-linear layers)
    truncates: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.layer_name = ""
        self.threshold = 0.0
        self.context = FrameContext()
        self._state_names: list[str] = []
        self._frames = 0
        self._density_last: Optional[torch.Tensor] = None
        self._density_sum: Optional[torch.Tensor] = None
        self._flops_dense = 0.0
        self._flops_done_last: Optional[torch.Tensor] = None
        self._flops_done_sum: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ state
    def state(self, name: str, shape, device: torch.device) -> torch.Tensor:
        """The float32 state buffer ``name``, allocated as zeros if absent or of another shape."""
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.device != device:
            buf = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
            if len(shape) == 4:
                buf = buf.contiguous(memory_format=torch.channels_last)
            if name not in self._buffers:
                self._state_names.append(name)
            self.register_buffer(name, buf, persistent=False)
        return buf

    def reset_state(self, streams: Optional[list[int]] = None) -> None:
        """Zero the state of all streams, or of the given stream indices only."""
        for name in self._state_names:
            buf = self._buffers.get(name)
            if buf is None:
                continue
            if streams is None:
                buf.zero_()
            elif buf.dim() >= 1 and len(streams):
                buf[torch.as_tensor(streams, device=buf.device)] = 0
        if streams is None:
            self.reset_stats()

    def release_state(self) -> None:
        """Drop all state (the next frame reallocates it; used when the input shape changes)."""
        for name in self._state_names:
            self._buffers[name] = None
        self.reset_stats()

    def state_bytes(self) -> int:
        """Bytes held by this layer's per-frame state."""
        return sum(b.numel() * b.element_size() for n in self._state_names
                   if (b := self._buffers.get(n)) is not None)

    # ------------------------------------------------------------------ statistics
    def reset_stats(self) -> None:
        self._frames = 0
        self._density_last = self._density_sum = None
        self._flops_done_last = self._flops_done_sum = None

    def flops_per_output_pixel(self, out: Delta) -> float:
        """Multiply-adds x2 that the dense layer spends per output pixel (all channels)."""
        return 0.0

    def observe(self, out: Delta) -> Delta:
        """Record the density of an output delta (no host synchronisation) and return it."""
        if not self.context.record_stats or not isinstance(out, Delta):
            return out
        density = out.mask.float().mean()
        pixels = out.mask.numel()
        fpp = self.flops_per_output_pixel(out)
        self._flops_dense = fpp * pixels
        done = density * self._flops_dense
        if self._density_sum is None or self._density_sum.device != density.device:
            self._density_sum = torch.zeros((), device=density.device)
            self._flops_done_sum = torch.zeros((), device=density.device)
            self._frames = 0
        self._density_last = density
        self._flops_done_last = done
        self._density_sum = self._density_sum + density
        self._flops_done_sum = self._flops_done_sum + done
        self._frames += 1
        return out

    def stats(self) -> dict:
        """Statistics of the last frame and the mean since reset (reads device values)."""
        frames = max(self._frames, 1)
        d = {
            "name": self.layer_name,
            "kind": self.kind,
            "density": float(self._density_last) if self._density_last is not None else float("nan"),
            "mean_density": float(self._density_sum) / frames if self._density_sum is not None else float("nan"),
            "frames": self._frames,
            "flops_dense": float(self._flops_dense),
            "flops_done": float(self._flops_done_last) if self._flops_done_last is not None else float("nan"),
            "mean_flops_done": float(self._flops_done_sum) / frames if self._flops_done_sum is not None
            else float("nan"),
            "state_bytes": self.state_bytes(),
        }
        if self.truncates:
            d["threshold"] = self.threshold
        return d

    # ------------------------------------------------------------------ helpers
    @property
    def ops(self) -> ModuleType:
        return self.context.ops

    @property
    def key(self) -> Optional[torch.Tensor]:
        return self.context.key

    def extra_repr(self) -> str:
        return f"name={self.layer_name!r}" + (f", threshold={self.threshold:g}" if self.truncates else "")
