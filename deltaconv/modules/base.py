"""Base class of every converted layer: state handling, statistics and the frame context."""
from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..backends import reference
from ..delta import Delta, RowList
from .folding import tensor_versions
from .work_counters import WorkCounters


@dataclass
class CallStats:
    """Statistics of one call of a layer within a frame, after its first (which the layer itself
    holds): ``counts`` float64 ``[active pixels last frame, sum since reset, 2 x kernel scratch]``."""

    counts: Optional[torch.Tensor] = None
    pixels: int = 0
    elements: int = 0
    flops_dense: float = 0.0


@dataclass
class FrameContext:
    """Per-frame information shared by all layers of one converted model.

    ``key``: ``None``, or ``[N]`` bool on the model's device marking streams that start a key frame.
    ``ops``: the backend module that runs this frame. ``record_stats``: collect densities.
    ``frames``: frames run since the statistics were last reset. ``pending_stats``: during a
    frame run by :class:`~deltaconv.DeltaModel`, the ``(mask, stats)`` pairs whose active pixels
    are counted together when the frame ends (:meth:`flush_stats`); ``None`` outside a frame.
    ``work_counters``: the zeroed counters that the model's CUDA convolutions take per call
    (:class:`~deltaconv.modules.WorkCounters`; a copy of the context gets its own).
    """

    key: Optional[torch.Tensor] = None
    ops: ModuleType = reference
    record_stats: bool = True
    frames: int = 0
    extra: dict = field(default_factory=dict)
    pending_stats: Optional[list] = None
    work_counters: WorkCounters = field(default_factory=WorkCounters)
    #: counts the runs of the layers (each frame, and each recording of one); a layer that runs
    #: several times in one run (a stateless layer serving every call site of a shared module)
    #: keeps separate statistics per call (``DCModule.call_stats``)
    run: int = 0

    def flush_stats(self) -> None:
        """Count the pending masks (one backend call per run of distinct stats buffers, so a layer
        that runs twice in a frame keeps "last call" semantics) and clear the list."""
        pending, self.pending_stats = self.pending_stats or [], None
        start = 0
        while start < len(pending):
            seen, end = set(), start
            while end < len(pending) and id(pending[end][1]) not in seen:
                seen.add(id(pending[end][1]))
                end += 1
            self.ops.count_active([m for m, _ in pending[start:end]], [s for _, s in pending[start:end]])
            start = end

    def __deepcopy__(self, memo) -> "FrameContext":
        # backend modules are shared, never copied; ``key`` only lives during a frame
        return FrameContext(None, self.ops, self.record_stats, self.frames, copy.deepcopy(self.extra, memo))

    def __getstate__(self) -> dict:
        return {"ops": self.ops.__name__, "record_stats": self.record_stats, "frames": self.frames,
                "extra": self.extra}

    def __setstate__(self, state: dict) -> None:
        self.__init__(None, importlib.import_module(state["ops"]), state["record_stats"], state["frames"],
                      state["extra"])


class DCModule(nn.Module):
    """A converted layer. Subclasses implement ``forward`` on :class:`~deltaconv.Delta` inputs.

    Per-frame state lives in non-persistent buffers (``.to()`` moves them; state_dict ignores
    them), allocated on first use with the shape of the data and zeroed by ``reset``: float32
    accumulators of inputs, and ``sent`` buffers in the dtype of the values sent.
    """

    #: short description shown in reports and stats
    kind: str = "layer"
    #: whether the layer truncates its output with a threshold (sparsifier and non-linear layers)
    truncates: bool = False
    #: which measure of a change the threshold applies to (non-linear layers: ``"max"``, ``"rms"``
    #: or ``"pooled"``, see ``reference.MEASURES``; the input sparsifier always uses max)
    measure: str = "max"
    #: set by :func:`~deltaconv.convert` (``fuse=True``) on an activation, a product, an add or a
    #: row-list 1x1 convolution whose output 1x1 convolutions of stride 1, no padding and one group read
    #: (``DCConv2d.takes_rows``): on the CUDA backend, in delta frames, the layer then hands those
    #: convolutions the list of its output's active pixels (a :class:`~deltaconv.delta.RowList` on
    #: its output), which then run without a mask pass of their own. ``DELTACONV_ROW_LISTS=0`` in the
    #: environment (read once per frame, ``WorkCounters.begin_frame``) turns the lists off.
    lists_rows: bool = False
    #: state buffers that only some layers of a class allocate (a kept output, a kept sum), registered
    #: empty (``None``) at construction so that every layer of the class has the name: torch.compile's
    #: guards of one layer's ``forward`` look the buffer up on another layer of the class when it
    #: recompiles, and torch 2.11 fails with ``KeyError`` on a name that layer lacks (the CUDA
    #: backend's ``test_torch_compile_of_a_model_with_row_lists``, H200, 2026-12-01)
    lazy_states: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.layer_name = ""
        #: the stride of this layer's output against the frame on the example ``convert`` traced (the
        #: nearest power of two; ``None``: not an image): what ``truncation="hybrid"`` reads
        self.frame_stride: Optional[int] = None
        self.threshold = 0.0
        self.context = FrameContext()
        self._state_names: list[str] = []
        self._stats: Optional[torch.Tensor] = None
        self._flops_dense = 0.0
        self._pixels = 0
        self._elements = 0
        self._rows_buf: Optional[torch.Tensor] = None  # row list storage (row_list)
        self._later_calls: list[CallStats] = []  # statistics of the 2nd, 3rd, ... call within a frame
        self._call, self._call_run = 0, -1  # calls so far in the context's run ``_call_run``
        self._work_vectors: dict = {}  # name -> (what identifies the sources, the value, the sources): derived
        for name in self.lazy_states:  # see lazy_states
            self.register_buffer(name, None, persistent=False)

    # ------------------------------------------------------------------ state
    def state(self, name: str, shape, device: torch.device, dtype: torch.dtype = torch.float32,
              sent: bool = False) -> torch.Tensor:
        """The state buffer ``name``, allocated as zeros if absent or of another shape, device or
        dtype. An accumulator is float32 (float64 for a float64 ``dtype``) so that summing deltas
        does not drift; with ``sent=True`` the buffer holds what was sent downstream and has the
        values' own ``dtype`` (float16 for a float16 model: the dense model rounds its outputs to
        it too)."""
        dtype = dtype if sent else torch.promote_types(dtype, torch.float32)
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.device != device or buf.dtype != dtype:
            buf = torch.zeros(tuple(shape), dtype=dtype, device=device)
            if len(shape) == 4:
                buf = buf.contiguous(memory_format=torch.channels_last)
            if name not in self._state_names:
                self._state_names.append(name)
            self.register_buffer(name, buf, persistent=False)
        return buf

    def derived(self, name: str, sources: tuple, make: Callable[[], object]) -> object:
        """``make()``, a value computed from the tensors ``sources`` only, kept under ``name`` while
        none of them changes (identity, in-place version, device, dtype: ``load_state_dict`` or
        ``.half()`` make it again), so what a layer derives from its parameters is computed once, not
        in kernels on every frame. The sources are kept with the value: a tensor made anew on every call (a
        scale computed in the model's forward) would otherwise be freed, and the next one could take its
        identity with the same version and be given the old value."""
        source = tensor_versions(*sources)
        held = self._work_vectors.get(name)
        if held is None or held[0] != source:
            with torch.no_grad():
                held = self._work_vectors[name] = (source, make(), sources)
        return held[1]

    def work_vector(self, name: str, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """``t`` (a per-channel parameter: ``[C]``, ``[C, 1, 1]``, ...) flattened to a contiguous ``[C]``
        in the dtype the delta rules compute in (float32; float64 for float64), as the CUDA kernels
        read it (:meth:`derived`: a float16 model converts its scales once, not in a kernel per frame)."""
        if t is None:
            return None
        return self.derived(name, (t,), lambda: t.detach().reshape(-1).to(torch.promote_types(t.dtype, torch.float32))
                            .contiguous())

    def reset_state(self, streams: Optional[list[int]] = None, keep_stats: bool = False) -> None:
        """Zero the state of all streams, or of the given stream indices only; for all streams the
        statistics too, unless ``keep_stats`` (a periodic key frame, ``refresh_every``)."""
        for name in self._state_names:
            buf = self._buffers.get(name)
            if buf is None:
                continue
            if streams is None:
                buf.zero_()
            elif buf.dim() >= 1 and len(streams):
                buf[torch.as_tensor(streams, device=buf.device)] = 0
        if streams is None and not keep_stats:
            self.reset_stats()

    def release_state(self) -> None:
        """Drop all state (the next frame reallocates it; used when the input shape changes)."""
        for name in self._state_names:
            self._buffers[name] = None
        self._stats = None
        self._later_calls = []
        self._rows_buf = None

    def state_bytes(self) -> int:
        """Bytes held by this layer's per-frame state (and its row list's storage, see ``lists_rows``)."""
        held = sum(b.numel() * b.element_size() for n in self._state_names if (b := self._buffers.get(n)) is not None)
        rows = self._rows_buf
        return held + (0 if rows is None else rows.numel() * rows.element_size())

    # ------------------------------------------------------------------ statistics
    def reset_stats(self) -> None:
        """Zero this layer's statistics (frames counted, active pixels) in place."""
        for counts in [self._stats] + [c.counts for c in getattr(self, "_later_calls", [])]:
            if counts is not None:
                counts.zero_()  # in place: a captured CUDA graph keeps writing here

    def flops_per_output_pixel(self, out: Delta) -> float:
        """Multiply-adds x2 that the dense layer spends per output pixel (all channels)."""
        return 0.0

    def observe(self, out):
        """Record how many output pixels are active and return ``out``: a :class:`Delta`, or a
        tuple of deltas that share one mask (the chunks of one output: their elements add up).
        Inside a frame of a DeltaModel the mask is counted with every other layer's when the frame
        ends (one kernel per 256 layers on the GPU, no host synchronisation, so it also accumulates
        under CUDA-graph replay); a layer called on its own counts at once. ``record_stats = False``
        skips it."""
        ctx = self.context
        if not ctx.record_stats:
            return out
        if isinstance(out, Delta):
            mask, elements = out.mask, out.value.numel()
        elif isinstance(out, tuple) and out and all(isinstance(o, Delta) and o.mask is out[0].mask for o in out):
            mask, elements = out[0].mask, sum(o.value.numel() for o in out)
        else:
            return out
        call = self._next_call()
        if call > 0:  # a later call of a stateless layer shared by several call sites
            calls = self.__dict__.setdefault("_later_calls", [])
            while len(calls) < call:
                calls.append(CallStats())
            record = calls[call - 1]
            if record.counts is None or record.counts.device != mask.device:
                record.counts = torch.zeros(4, dtype=torch.float64, device=mask.device)
            ctx.pending_stats.append((mask, record.counts))
            record.pixels, record.elements = mask.numel(), elements
            record.flops_dense = self.flops_per_output_pixel(out) * record.pixels
            return out
        if self._stats is None or self._stats.device != mask.device:
            # float64 [active pixels last frame, sum since reset, 2 x kernel scratch]
            self._stats = torch.zeros(4, dtype=torch.float64, device=mask.device)
        if ctx.pending_stats is None:
            self.ops.count_active([mask], [self._stats])
        else:
            ctx.pending_stats.append((mask, self._stats))
        # plain attributes written straight into __dict__: nn.Module.__setattr__ (six calls per layer
        # and frame here and in _next_call) was the largest host cost of an eager frame
        attrs = self.__dict__
        attrs["_pixels"] = pixels = mask.numel()
        attrs["_elements"] = elements
        attrs["_flops_dense"] = self.flops_per_output_pixel(out) * pixels
        return out

    def _next_call(self) -> int:
        """Which call of this layer within the current run of a DeltaModel this is (0, 1, ...);
        0 outside one (a layer called on its own)."""
        ctx = self.context
        if ctx.pending_stats is None:
            return 0
        attrs = self.__dict__  # plain attributes (see observe)
        if attrs.get("_call_run", -1) != ctx.run:
            attrs["_call_run"], call = ctx.run, 0
        else:
            call = attrs["_call"]
        attrs["_call"] = call + 1
        return call

    def stats(self) -> dict:
        """Statistics of the last frame and the mean since reset (reads device values), of the
        layer's first call in a frame (see :meth:`call_stats` for a layer called several times)."""
        return self._stats_dict(self.layer_name, self._stats, self._pixels, getattr(self, "_elements", 0),
                                self._flops_dense)

    def call_stats(self) -> list[dict]:
        """:meth:`stats` of every call of this layer in a frame: one dict, or for a stateless layer
        that serves several call sites of a shared module one per call, the later ones named
        ``<layer name>#2``, ``#3``, ... in call order."""
        later = [self._stats_dict(f"{self.layer_name}#{k + 2}", c.counts, c.pixels, c.elements, c.flops_dense)
                 for k, c in enumerate(getattr(self, "_later_calls", []))]
        return [self.stats()] + later

    def _stats_dict(self, name: str, counts: Optional[torch.Tensor], pixels: int, elements: int,
                    flops_dense: float) -> dict:
        frames = self.context.frames
        last_density = mean_density = float("nan")
        if counts is not None and frames and pixels:
            last, total = counts[:2].tolist()
            last_density, mean_density = last / pixels, total / frames / pixels
        d = {
            "name": name,
            "kind": self.kind,
            "density": last_density,
            "mean_density": mean_density,
            "frames": frames,
            "flops_dense": float(flops_dense),
            "flops_done": last_density * flops_dense,
            "mean_flops_done": mean_density * flops_dense,
            "elements_dense": float(elements),  # layers pickled before it: 0
            "pixels": int(pixels or 0),
            "mean_elements_done": mean_density * elements,
            "state_bytes": self.state_bytes() if name == self.layer_name else 0,
        }
        if self.truncates:
            d["threshold"] = self.threshold
            d["measure"] = self.measure
        return d

    # ------------------------------------------------------------------ helpers
    @property
    def ops(self) -> ModuleType:
        """The backend module running the current frame (``reference`` or ``cuda``)."""
        return self.context.ops

    def work_counters(self, x: Delta) -> Optional[torch.Tensor]:
        """Zeroed counters for one CUDA convolution call on ``x`` within a frame of a DeltaModel, or
        ``None`` (the op then zeroes its own): see :class:`~deltaconv.modules.WorkCounters`."""
        return self.context.work_counters.take(x.value.device) if x.value.is_cuda else None

    def row_list(self, shape, device: torch.device) -> Optional[RowList]:
        """An empty row list for this call's output of ``shape`` (see ``lists_rows``), or ``None``:
        not asked for, a key frame, a backend without lists, not a 4-D map, or outside a frame of a
        DeltaModel. The list's storage stays this layer's from frame to frame (CUDA graphs replay it)."""
        work = self.context.work_counters
        if not (self.lists_rows and work.row_lists and self.key is None and getattr(self.ops, "ROW_LISTS", False)
                and len(shape) == 4 and device.type == "cuda"):
            return None
        counters = work.take(device)
        if counters is None:
            return None
        need = 1 + 2 * shape[0] * shape[2] * shape[3]
        buf = self._rows_buf
        if buf is None or buf.numel() != need or buf.device != device:
            with torch.inference_mode(False):  # shared by frames in and out of inference mode
                buf = torch.empty(need, dtype=torch.int32, device=device)
            self._rows_buf = buf
        return RowList(buf, counters)

    @property
    def key(self) -> Optional[torch.Tensor]:
        """``[N]`` bool marking the streams that start a key frame in the current frame, or None."""
        return self.context.key

    def extra_repr(self) -> str:
        measure = f", measure={self.measure!r}" if self.measure != "max" else ""
        return f"name={self.layer_name!r}" + (f", threshold={self.threshold:g}{measure}" if self.truncates else "")
