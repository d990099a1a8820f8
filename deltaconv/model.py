"""``DeltaModel``: a converted network, its per-stream state, thresholds and statistics."""
from __future__ import annotations

import copy
import fnmatch
import functools
import json
import math
import os
import threading
import warnings
from typing import Iterable, Optional, Union

import torch
import torch.fx as fx
import torch.nn as nn

from . import backends
from .modules import DCModule, FrameContext
from .modules.linear import FoldsBatchNorm
from .report import ConversionReport


#: ``refresh_every="auto"``: a key frame every this many frames, by the frames' dtype. In float16
#: the rounding of the deltas that each layer sums drifts slowly: mobilenet_v2 with thresholds
#: calibrated for a 2 % logit error went from 2.2 % over its first 1,394 frames to 20 % after 12,000
#: with a key frame only at the start, and stayed at 2.2 % over 12,000 frames with one every 1,000
#: (one-by-one at 1080x1920, H200; README, *Reliability*). Exact float32 does not drift (2.4 % throughout).
AUTO_REFRESH = {torch.float16: 1000, torch.bfloat16: 1000}
#: ``refresh_every="auto"`` for float32 frames on a GPU whose convolutions run in TF32
#: (``torch.backends.cudnn.allow_tf32``, PyTorch's default): TF32 keeps float16's 10-bit mantissa in
#: the products and drifts too, slowly: mobilenet_v2's logit error went from 2.47 % to 2.84 % over
#: 12,000 frames with a key frame only at the start, and stayed at 2.43-2.46 % with one every 1,000
#: (H100; README, *Status*, Float32 models in TF32).
AUTO_REFRESH_TF32 = 1000


def _flat_runner(root: nn.Module, graph: fx.Graph, class_name: str) -> fx.GraphModule:
    """A GraphModule running a copy of ``graph`` on ``root``'s modules, each called module held by the
    runner under one flat name (``features_0_conv_0`` for ``features.0.conv.0``): its generated
    forward then looks a layer up in one step, not one per level of its path (812 ``nn.Module``
    attribute lookups per eager mobilenet_v2 frame, half of them these paths). ``graph`` is left as
    it is (its node targets name the layers)."""
    flat = fx.Graph()
    flat.output(flat.graph_copy(graph, {}))
    held: dict = {}
    for node in flat.nodes:
        if node.op == "call_module":
            module = root.get_submodule(node.target)
            name = node.target.replace(".", "_")
            while name in held and held[name] is not module:
                name += "_"
            held[name] = module
            node.target = name
        elif node.op == "get_attr":
            held[node.target] = _attr_at(root, node.target)
    return fx.GraphModule(held, flat, class_name=class_name)


def _attr_at(obj: object, target: str) -> object:
    """The attribute at the dotted path ``target`` of ``obj`` (a ``get_attr`` node's target)."""
    return functools.reduce(getattr, target.split("."), obj)


def _traced_constants(dense: nn.Module, graph: fx.Graph) -> list[str]:
    """Names of the plain tensor attributes of ``dense`` that ``graph`` reads: the constants torch.fx
    stores on the traced model (``_tensor_constant0``, ... for a ``torch.tensor(...)`` made in
    ``forward``). Held as non-persistent buffers, they move with the model and stay out of its
    state_dict, as the dense model's own computation of them does."""
    names = []
    for node in graph.nodes:
        if node.op != "get_attr" or "." in node.target or node.target in names:
            continue
        value = dense.__dict__.get(node.target)
        if torch.is_tensor(value) and not isinstance(value, nn.Parameter):
            names.append(node.target)
    return names


def _frame_signature(frames: tuple) -> tuple:
    """What makes a frame a key frame when it differs from the previous one's: per input, its shape
    (first: ``[0][0][0]`` is the batch size), dtype, device, and for float32 on a GPU whether the
    convolutions run in TF32 (``torch.backends.cudnn.allow_tf32``: the layers then send TF32-rounded
    changes, and recomputing convolutions run in delta mode, ``DCConv2d.recomputes``)."""
    return tuple((tuple(f.shape), f.dtype, f.device,
                  bool(f.is_cuda and f.dtype == torch.float32 and torch.backends.cudnn.allow_tf32)) for f in frames)


class DeltaModel(nn.Module):
    """A dense model converted by :func:`deltaconv.convert`.

    Call it on consecutive frames ``[N, 3, H, W]`` (one video stream per batch entry); it returns
    what the dense model returns (tensor, tuple or dict). The first frame after construction or
    :meth:`reset`, and any frame whose shape, dtype or device differs from the previous one (or, for
    float32 on a GPU, PyTorch's TF32 setting for convolutions), is a
    key frame: it runs dense and fills the state. Later frames process only changed pixels.

    The module tree is the dense model's (so its ``state_dict`` loads unchanged), with each layer
    replaced by its ``DC*`` layer and extra layers for functional ops added next to where they
    were called. Per-frame state lives in non-persistent buffers: it is per stream, so one model
    instance serves one set of streams at a time; using it from two threads at once raises
    (give each thread its own ``copy.deepcopy(dm)``).

    Frames are checked before any state changes: they must be floating-point tensors of the
    traced rank and channel count, on the model's device and dtype, and (when ``check_finite``)
    free of NaN/Inf. A frame that fails raises and leaves the state as it was. If a frame fails
    midway (out of memory, ...), the next frame is a key frame. Converted models are inference
    only: frames run under ``torch.no_grad()``.
    """

    #: whether the conversion folded BatchNorm into the convolutions (``convert(..., fold_bn=...)``)
    fold_bn: bool = True

    def __init__(self, dense: nn.Module, graph: fx.Graph, report: ConversionReport, backend: str = "auto",
                 refresh_every: Union[int, str, None] = "auto", check_finite: bool = True, cuda_graph: bool = False):
        super().__init__()
        for name, child in dense.named_children():
            self.add_module(name, child)
        for name, p in dense.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in dense.named_buffers(recurse=False):
            self.register_buffer(name, b, persistent=name not in dense._non_persistent_buffers_set)
        for name in _traced_constants(dense, graph):  # tensors the tracer stored on the model (torch.tensor(...))
            self.register_buffer(name, getattr(dense, name), persistent=False)
        self.backend = backends.check_name(backend)
        self._report = report
        self._context = FrameContext()
        # the graph runner shares this module's layers; kept out of the module tree
        self.__dict__["_runner"] = _flat_runner(self, graph, class_name=f"{type(dense).__name__}Delta")
        # the DC layers; a dense module left in the graph (one that only reads constants, e.g. Swin V2's
        # position-bias MLP on its coordinate table) is not one
        self._layer_names = [name for name in dict.fromkeys(n.target for n in graph.nodes if n.op == "call_module")
                             if isinstance(self.get_submodule(name), DCModule)]
        self._inputs = [n.meta.get("tensor_meta") for n in graph.nodes if n.op == "placeholder"]
        strides = _frame_strides(graph, self._inputs)
        for name in self._layer_names:
            layer = self.get_submodule(name)
            layer.layer_name = name
            layer.context = self._context
            layer.frame_stride = strides.get(name)
        # read before every replay (``_settings``); a plain list, so deepcopy maps it to the copy's layers
        self._truncating_layers = [layer for layer in self.delta_layers() if layer.truncates]
        self._signature = None
        self._pending_key: Optional[list[bool]] = None
        if refresh_every not in (None, "auto") and (not isinstance(refresh_every, int) or refresh_every < 1):
            raise ValueError(f"refresh_every must be a positive int, 'auto' or None, got {refresh_every!r}")
        self.refresh_every = refresh_every
        self.check_finite = check_finite
        self._frames_since_key = 0
        self._inference_state = False
        self._lock = _FrameLock()
        self.cuda_graph = cuda_graph
        self._graph: Optional[_CapturedFrame] = None
        # a recorded key frame of every stream (the state zeroed, then the dense pass), recorded at the
        # first such key frame after the delta frame's graph and replayed for later ones
        self._key_graph: Optional[_CapturedFrame] = None
        self._recapture = False  # a graph was dropped for a change of settings: record it again

    # ------------------------------------------------------------------ running
    def forward(self, *frames: torch.Tensor):
        if not self._lock.acquire():
            raise RuntimeError("DeltaModel is already running a frame in another thread; it holds per-stream "
                               "state, so give each thread its own copy (copy.deepcopy(dm))")
        try:
            return self._run_frame(frames)
        finally:
            self._lock.release()

    def _run_frame(self, frames: tuple) -> object:
        self._validate(frames)
        frames = tuple(f.contiguous(memory_format=torch.channels_last) if f.dim() == 4 else f for f in frames)
        signature = _frame_signature(frames)
        if self._graph is not None and (self._graph.settings != self._settings()
                                        or (self._inference_state and not torch.is_inference_mode_enabled())):
            # thresholds, measures, detector, statistics or backend changed since capture, or the state
            # made under inference mode is about to be copied (``_match_inference_mode``)
            self._drop_graph()
        if signature != self._signature:
            self._release_state()
            self._signature = signature
            self._pending_key = [True] * frames[0].shape[0]
        elif ((interval := self.refresh_interval(frames[0].dtype, frames[0].device)) is not None
              and self._frames_since_key >= interval):
            if self._key_graph is None:
                self._reset_all(keep_stats=True)
            else:  # the recorded key frame zeroes the state itself
                self._pending_key = [True] * frames[0].shape[0]
        key_frame = self._pending_key is not None and any(self._pending_key)
        every_stream = key_frame and all(self._pending_key)
        if self._graph is not None and not key_frame:
            return self._replay(frames)
        if self._key_graph is not None and every_stream:
            return self._replay_key(frames)
        if (self.cuda_graph or self._recapture) and not key_frame and frames[0].is_cuda:
            return self._capture(frames)
        if self._graph is not None and every_stream:
            return self._capture(frames, key=True)
        return self._run_eager(frames)

    def _run_eager(self, frames: tuple) -> object:
        self._match_inference_mode()
        ctx = self._context
        device = frames[0].device
        ctx.ops = backends.select(self.backend, device)
        if self._pending_key is not None and any(self._pending_key):
            ctx.key = torch.tensor(self._pending_key, dtype=torch.bool).to(device, non_blocking=True)
            if all(self._pending_key):
                self._frames_since_key = 0
        else:
            ctx.key = None
        try:
            if torch.is_inference_mode_enabled():
                out = self._run_layers(frames)
            else:
                with torch.no_grad():
                    out = self._run_layers(frames)
        except BaseException:
            self._signature = None  # state may be half-updated: the next frame is a key frame
            raise
        finally:
            ctx.key = None
        self._pending_key = None
        self._frames_since_key += 1
        ctx.frames += 1
        return out

    def _run_layers(self, frames: tuple) -> object:
        """The converted graph on one frame, then the frame's statistics in one backend call; the
        convolutions' work-list counters are zeroed once for the whole frame."""
        ctx = self._context
        ctx.pending_stats = []
        ctx.run += 1
        ctx.work_counters.begin_frame()
        try:
            out = self._runner(*frames)
            ctx.flush_stats()
        finally:
            ctx.pending_stats = None
            ctx.work_counters.end_frame()
        return out

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self, frames: torch.Tensor) -> object:
        """Process ``frames`` as the next frame and record a CUDA graph of one delta frame; later
        frames of the same shape, dtype and device replay it (one launch per frame).

        Replayed frames return the same output tensors each time, overwritten by the next frame
        (clone what you keep). The first key frame, key frames of some streams only and those after a
        shape change run eagerly; the first key frame of every stream after this graph exists (a
        periodic one of ``refresh_every``, or after ``reset()``) also records a graph of a key frame,
        which later ones replay (returning that graph's own output tensors). A shape, dtype or
        device change drops the graphs. A change of what the recorded kernels
        were given (a threshold, the truncation measure, the input's change detector,
        :attr:`record_stats`, the backend) drops it too, and the next delta frame records it again.
        Capture after loading new weights, and after changing a change detector's own settings.
        ``check_finite`` costs a device sync per frame: turn it off for full speed.
        """
        if not frames.is_cuda:
            raise ValueError(f"capture: frames must be on a CUDA device, got {frames.device}")
        self._validate((frames,))
        frames = frames.contiguous(memory_format=torch.channels_last)
        signature = _frame_signature((frames,))
        if signature != self._signature or (self._pending_key is not None and any(self._pending_key)):
            self._run_frame((frames,))  # key frame first: the graph records delta frames
        return self._capture((frames,))

    def _capture(self, frames: tuple, key: bool = False) -> object:
        """Run ``frames`` eagerly on a side stream (the warm-up that CUDA graph capture requires), then
        record one frame as a CUDA graph: a delta frame, replayed by later delta frames; or with
        ``key`` a key frame of every stream, in the delta frame's memory pool (the state zeroed as
        ``reset_state`` zeroes it, then every layer with every stream's key flag set), replayed by
        later key frames of every stream (``_replay_key``)."""
        device = frames[0].device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self._run_eager(frames)
        torch.cuda.current_stream().wait_stream(side)
        static_in = tuple(f.clone() for f in frames)
        every_stream = torch.ones(frames[0].shape[0], dtype=torch.bool, device=device) if key else None
        graph = torch.cuda.CUDAGraph()
        ctx = self._context
        try:
            with torch.no_grad(), torch.cuda.graph(graph, pool=self._graph.graph.pool() if key else None):
                if key:
                    for layer in self.delta_layers():
                        layer.reset_state(keep_stats=True)
                ctx.key = every_stream
                static_out = self._run_layers(static_in)
        finally:
            ctx.key = None
        # the key flags live as long as the graph, which reads them at every replay (freed, their memory
        # went back to the allocator, and whatever its next user wrote there decided which streams a
        # replayed key frame treated as key streams: test_key_frame_graph_owns_its_key_flags)
        captured = _CapturedFrame(graph, static_in, static_out, self._settings(), keep=(every_stream,))
        if key:
            self._key_graph = captured
        else:
            self._graph, self._recapture = captured, False
        return out

    def _replay_key(self, frames: tuple) -> object:
        self._pending_key = None
        self._frames_since_key = 0
        return self._replay(frames, self._key_graph)

    def _settings(self) -> tuple:
        """What a recorded frame's kernels were given besides the state: the backend, whether
        statistics are counted, and every truncating layer's threshold, measure and change
        detector (compared before each replay: a few microseconds of host time)."""
        return (self.backend, self._context.record_stats,
                tuple((layer.threshold, layer.measure, layer._modules.get("change_detector"))
                      for layer in self._truncating_layers))

    def _drop_graph(self) -> None:
        """Forget the recorded frame (its settings or buffers are out of date); the next delta frame
        records a new one."""
        self._graph = self._key_graph = None
        self._recapture = True

    def _replay(self, frames: tuple, captured: Optional["_CapturedFrame"] = None) -> object:
        """Copy ``frames`` into a recorded frame's inputs and replay it (the delta frame's unless
        ``captured`` is given); returns its output tensors."""
        captured = self._graph if captured is None else captured
        for static, f in zip(captured.inputs, frames):
            static.copy_(f)
        captured.graph.replay()
        self._frames_since_key += 1
        self._context.frames += 1
        return captured.outputs

    def _validate(self, frames: tuple) -> None:
        """Check frames against the traced inputs and the model, before any state changes."""
        if len(frames) != len(self._inputs):
            raise TypeError(f"DeltaModel expects {len(self._inputs)} input tensor(s), got {len(frames)}")
        param = next(self.parameters(), None)
        for i, (f, meta) in enumerate(zip(frames, self._inputs)):
            name = "frames" if len(frames) == 1 else f"input {i}"
            if not isinstance(f, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(f).__name__}")
            if not f.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got dtype {f.dtype}; convert decoder "
                                f"output with frames.float().div(255) (then normalise as the model expects), or "
                                f"use deltaconv.video.to_tensor")
            if meta is not None and f.dim() != len(meta.shape):
                raise ValueError(f"{name} must be {len(meta.shape)}-D like the traced input "
                                 f"{list(meta.shape)}, got shape {list(f.shape)}")
            if meta is not None and f.dim() >= 2 and f.shape[1] != meta.shape[1]:
                raise ValueError(f"{name} must have {meta.shape[1]} channels (dim 1), got shape {list(f.shape)}")
            if param is not None and f.device != param.device:
                raise ValueError(f"{name} are on {f.device} but the model is on {param.device}; move one of them "
                                 f"(dm.to({str(f.device)!r}) or frames.to({str(param.device)!r}))")
            if param is not None and param.is_floating_point() and f.dtype != param.dtype:
                raise TypeError(f"{name} have dtype {f.dtype} but the model's parameters are {param.dtype}; "
                                f"convert the frames (frames.to({param.dtype})) or the model (dm.to({f.dtype}))")
            if self.check_finite and not bool(torch.isfinite(f).all()):
                raise ValueError(f"{name} contain NaN or Inf; the frame was rejected and the state is unchanged")

    def _match_inference_mode(self) -> None:
        """State made under ``torch.inference_mode`` cannot be updated outside it: copy it then."""
        inference = torch.is_inference_mode_enabled()
        if self._inference_state and not inference:
            for layer in self.delta_layers():
                for name in layer._state_names:
                    buf = layer._buffers.get(name)
                    if buf is not None and buf.is_inference():
                        layer._buffers[name] = buf.clone()
                if layer._stats is not None and layer._stats.is_inference():
                    layer._stats = layer._stats.clone()
                for call in layer._later_calls:
                    if call.counts is not None and call.counts.is_inference():
                        call.counts = call.counts.clone()
        self._inference_state = inference

    def _apply(self, fn, recurse: bool = True):
        """Casts and moves (``.half()``, ``.to(...)``, ``.cuda()``) as any module, except that each
        BatchNorm folded into a convolution is folded before the cast, at the model's precision, and
        that fold rounded to the new dtype. So ``convert(model).half()`` rounds the exact fold once,
        while ``convert(model.half())`` can only fold weights that were rounded already."""
        convs = [m for m in self.modules() if isinstance(m, FoldsBatchNorm) and m.folded_bn is not None]
        before = [m.fold_before_cast() for m in convs]
        super()._apply(fn, recurse)
        for m, b in zip(convs, before):
            m.keep_fold(b)
        self._sync_runner_constants()
        return self

    def _sync_runner_constants(self) -> None:
        """Point the runner's constants (the graph's ``get_attr`` tensors, e.g. a ``torch.tensor(...)``
        the traced forward made) at this model's own again: a cast or move replaces buffers, and the
        runner (outside the module tree) would keep reading the old ones, on the old device."""
        runner = self.__dict__.get("_runner")
        for node in runner.graph.nodes if runner is not None else ():
            if node.op == "get_attr":
                value = _attr_at(self, node.target)
                path, _, field = node.target.rpartition(".")
                owner = _attr_at(runner, path) if path else runner
                if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                    owner.register_buffer(field, value)
                else:
                    setattr(owner, field, value)

    @property
    def frames_since_key(self) -> int:
        """Frames run since the last key frame, counting it: 1 right after a key frame (the first,
        after :meth:`reset`, or a periodic one of ``refresh_every``), 0 before any frame."""
        return self._frames_since_key

    def refresh_interval(self, dtype: torch.dtype, device: Union[torch.device, str, None] = None) -> Optional[int]:
        """Frames between periodic key frames for frames of ``dtype`` on ``device``:
        :attr:`refresh_every`, or for ``"auto"`` :data:`AUTO_REFRESH`'s value, and for float32 frames on
        a CUDA device while PyTorch lets float32 convolutions use TF32 (``torch.backends.cudnn.allow_tf32``:
        both backends' convolutions then round their products to TF32) :data:`AUTO_REFRESH_TF32`
        (``None``, never, for exact float32 and float64)."""
        if self.refresh_every != "auto":
            return self.refresh_every
        if (dtype == torch.float32 and device is not None and torch.device(device).type == "cuda"
                and torch.backends.cudnn.allow_tf32):
            return AUTO_REFRESH_TF32
        return AUTO_REFRESH.get(dtype)

    def _reset_all(self, keep_stats: bool = False) -> None:
        """Zero every stream's state so that the next frame is a key frame; the statistics too,
        unless ``keep_stats`` (the periodic key frames of ``refresh_every``: their means since the
        last :meth:`reset_stats` go on and include them)."""
        if not keep_stats:
            self._context.frames = 0
        for layer in self.delta_layers():
            layer.reset_state(keep_stats=keep_stats)
        self._pending_key = None if self._signature is None else [True] * self._signature[0][0][0]

    def reset(self, streams: Optional[Iterable[int]] = None) -> None:
        """Make the next frame a key frame, for all streams or only the given batch indices."""
        if streams is None:
            self._reset_all()
            return
        streams = [int(s) for s in streams]
        if self._signature is None:
            return  # nothing ran yet: the next frame is a key frame for every stream anyway
        n = self._signature[0][0][0]
        bad = [s for s in streams if not 0 <= s < n]
        if bad:
            raise IndexError(f"reset: streams must be batch indices in [0, {n}), got {bad}")
        for layer in self.delta_layers():
            layer.reset_state(streams)
        key = self._pending_key or [False] * n
        for s in streams:
            key[s] = True
        self._pending_key = key

    def _release_state(self) -> None:
        self._graph = self._key_graph = None
        self._recapture = False
        self._context.frames = 0
        for layer in self.delta_layers():
            layer.release_state()

    # ------------------------------------------------------------------ introspection
    @property
    def report(self) -> ConversionReport:
        """What the converter made of every node (see :class:`ConversionReport`)."""
        return self._report

    def delta_layers(self) -> list[DCModule]:
        """The DC layers in execution order, the input sparsifier first."""
        return [self.get_submodule(n) for n in self._layer_names]

    def stats(self) -> list[dict]:
        """One dict per DC layer in execution order (per call for a stateless layer that serves
        several call sites of a shared module: ``name#2``, ... after its first): ``name``, ``kind``,
        ``density`` (fraction of output pixels updated in the last frame), ``mean_density`` since
        reset, ``frames``, ``flops_dense`` / ``flops_done`` / ``mean_flops_done`` (per frame),
        ``elements_dense`` (output elements per frame) / ``mean_elements_done`` (of those, on updated
        pixels), ``pixels`` (output pixels per frame, all streams: a layer's stride against the frame
        is ``sqrt(frame pixels / pixels)``), ``state_bytes`` and, for truncating layers,
        ``threshold`` and ``measure``."""
        return [d for layer in self.delta_layers() for d in layer.call_stats()]

    @property
    def record_stats(self) -> bool:
        """Whether layers count their active pixels each frame (for :meth:`stats`; two small device
        ops per layer). Set to ``False`` for the fewest launches per frame."""
        return self._context.record_stats

    @record_stats.setter
    def record_stats(self, value: bool) -> None:
        self._context.record_stats = bool(value)

    def reset_stats(self) -> None:
        """Restart the statistics of :meth:`stats` (not the state): means cover frames from now on."""
        self._context.frames = 0
        for layer in self.delta_layers():
            layer.reset_stats()

    def state_bytes(self) -> int:
        """Bytes of per-frame state held by all layers."""
        return sum(layer.state_bytes() for layer in self.delta_layers())

    # ------------------------------------------------------------------ thresholds
    def thresholds(self) -> dict[str, float]:
        """``{layer name: threshold}`` of the sparsifier and every non-linear layer."""
        return {layer.layer_name: layer.threshold for layer in self.delta_layers() if layer.truncates}

    def set_threshold_all(self, value: float) -> None:
        """Set every truncating layer's threshold to ``value``."""
        for layer in self.delta_layers():
            if layer.truncates:
                layer.threshold = float(value)

    @property
    def truncation(self) -> str:
        """The change measure the non-linear layers compare with their thresholds: ``"max"``
        (``max_c |change|``, the default), ``"rms"`` (``sqrt(mean_c change^2)``) or ``"pooled"``
        (the rms of the change averaged over each pixel's 3x3 window; ``reference.exceeds``), or
        ``"mixed"`` when the layers differ (:meth:`measures` lists them). Setting a measure sets
        every non-linear layer (the input sparsifier keeps its own measure). Setting a dict of layer
        names or ``fnmatch`` patterns to measures, e.g. ``{"features.0.*": "rms", "*": "pooled"}``,
        sets the layers they match and leaves the others as they are; where several match a layer
        the most specific wins, whatever the dict's order (JSON files keep none): its exact name,
        else the pattern with the most characters that are not wildcards (``*?[]``); two such
        patterns naming different measures, or a pattern that matches no non-linear layer, raise
        ``ValueError``. Setting ``"hybrid"`` (``reference.PRESETS``) sets ``"pooled"`` in the layers
        whose output is at a stride of 4 or more against the frame (``layer.frame_stride``, from the
        example ``convert`` traced) and ``"rms"`` in the others: in MobileNetV2 the same as the dict
        above with ``features.2.conv.0.*`` also ``"rms"``."""
        measures = {layer.measure for layer in self._measured_layers()}
        return measures.pop() if len(measures) == 1 else "max" if not measures else "mixed"

    @truncation.setter
    def truncation(self, truncation: Union[str, dict]) -> None:
        from .backends.reference import HYBRID_MIN_STRIDE, check_truncation
        check_truncation(truncation, "truncation")
        layers = self._measured_layers()
        if truncation == "hybrid":
            if layers and all(layer.frame_stride is None for layer in layers):
                warnings.warn("truncation='hybrid': no non-linear layer has a stride against the frame (the traced "
                              "example is not [N, C, H, W], or the layers' outputs are not images); every layer "
                              "uses 'rms'", stacklevel=2)
            for layer in layers:
                stride = layer.frame_stride
                layer.measure = "pooled" if stride is not None and stride >= HYBRID_MIN_STRIDE else "rms"
            return
        if isinstance(truncation, str):
            for layer in layers:
                layer.measure = truncation
            return
        chosen = {layer.layer_name: _most_specific(layer.layer_name, truncation) for layer in layers}
        unused = [p for p in truncation if p not in chosen and not any(fnmatch.fnmatchcase(n, p) for n in chosen)]
        if unused:
            raise ValueError(f"truncation: the patterns {sorted(unused)} match no non-linear layer; names are "
                             f"like {[layer.layer_name for layer in layers[:4]]}")
        for layer in layers:
            pattern = chosen[layer.layer_name]
            if pattern is not None:
                layer.measure = truncation[pattern]

    def measures(self) -> dict[str, str]:
        """``{layer name: measure}`` of every non-linear layer (see :attr:`truncation`)."""
        return {layer.layer_name: layer.measure for layer in self._measured_layers()}

    def _measured_layers(self) -> list[DCModule]:
        return [layer for layer in self.delta_layers() if layer.truncates and layer.kind != "sparsify"]

    def load_thresholds(self, thresholds: Union[dict, str, os.PathLike], strict: bool = True) -> None:
        """Set thresholds from ``{layer name: value}``, a :class:`deltaconv.calibrate.Calibration`,
        or a JSON file written by :meth:`save_thresholds` or ``Calibration.save``. A change detector
        named there (``"change_detector"``) is installed in the input sparsifier, and a
        ``"truncation"`` measure (or dict of layer names or patterns to measures) sets
        :attr:`truncation`. With ``strict``, unknown names raise ``KeyError``. Thresholds calibrated
        with another ``fold_bn`` than this model's conversion (``"fold_bn"`` in the file) load with a
        warning: in float16 the error at threshold 0 differs."""
        thresholds, detector_spec, truncation, fold_bn = read_thresholds(thresholds)
        warn_fold_bn_mismatch(fold_bn, self.fold_bn, "load_thresholds: these thresholds were",
                              "this model was converted with", stacklevel=3)
        if truncation is not None:
            self.truncation = truncation
        if detector_spec is not None:
            from .modules import DCSparsify
            from .sparsify import from_spec
            for layer in self.delta_layers():
                if isinstance(layer, DCSparsify):  # a copy each: some detectors keep per-stream state
                    layer.change_detector = copy.deepcopy(from_spec(detector_spec))
        known = {layer.layer_name: layer for layer in self.delta_layers() if layer.truncates}
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
        """Write the thresholds as JSON (``{"thresholds": {layer name: value}, "truncation": measure
        (``{layer name: measure}`` when the layers' measures differ), "fold_bn": bool}``)."""
        truncation = self.truncation if self.truncation != "mixed" else self.measures()
        with open(path, "w") as f:
            json.dump({"thresholds": self.thresholds(), "truncation": truncation, "fold_bn": self.fold_bn}, f,
                      indent=1, sort_keys=True)


def _frame_strides(graph: fx.Graph, inputs: list) -> dict[str, Optional[int]]:
    """``{module target: stride}`` of each call_module node whose output and the graph's first input
    (``inputs``: the placeholders' tensor metadata) are ``[N, C, H, W]`` on the traced example:
    ``sqrt(input H * W / output H * W)`` rounded to the nearest power of two (a shared layer: its
    first call)."""
    shape = getattr(inputs[0], "shape", None) if inputs else None
    strides: dict[str, Optional[int]] = {}
    if shape is None or len(shape) != 4:
        return strides
    for node in graph.nodes:
        out = getattr(node.meta.get("tensor_meta"), "shape", None)
        if node.op != "call_module" or node.target in strides or out is None or len(out) != 4 or out[2] * out[3] == 0:
            continue
        strides[node.target] = 2 ** round(math.log2(math.sqrt(shape[2] * shape[3] / (out[2] * out[3]))))
    return strides


def _most_specific(name: str, patterns: dict) -> Optional[str]:
    """The key of ``patterns`` (layer names or ``fnmatch`` patterns) that sets layer ``name``'s
    measure: ``name`` itself, else the matching pattern with the most characters that are not
    wildcards; ``None`` where none matches; ``ValueError`` where two equally specific patterns
    name different measures."""
    if name in patterns:
        return name
    matches = [p for p in patterns if fnmatch.fnmatchcase(name, p)]
    if not matches:
        return None

    def literal(p: str) -> int:
        return sum(ch not in "*?[]" for ch in p)
    best = max(literal(p) for p in matches)
    tied = [p for p in matches if literal(p) == best]
    if len({patterns[p] for p in tied}) > 1:
        raise ValueError(f"truncation: the patterns {sorted(tied)} match layer {name!r} equally and name "
                         f"different measures {sorted({patterns[p] for p in tied})}")
    return tied[0]


def warn_fold_bn_mismatch(recorded: Optional[bool], current: bool, what: str, against: str, stacklevel: int) -> None:
    """Warn when thresholds calibrated with ``fold_bn=recorded`` (``None``: not recorded) are used with a
    conversion of ``fold_bn=current``: "``what`` calibrated with fold_bn=..., ``against`` fold_bn=...".
    In float16 the error at threshold 0 differs between the two (the folded weights round otherwise)."""
    if recorded is not None and bool(recorded) != current:
        warnings.warn(f"{what} calibrated with fold_bn={bool(recorded)}, {against} fold_bn={current}; in float16 "
                      "the error at threshold 0 differs (README, Fidelity and calibration, In float16)",
                      stacklevel=stacklevel)


def read_thresholds(thresholds: Union[dict, str, os.PathLike]) -> tuple[dict, Optional[dict],
                                                                          Union[str, dict, None], Optional[bool]]:
    """``(values, change detector spec, truncation, fold_bn)`` of ``{layer name: value}``, a
    :class:`deltaconv.calibrate.Calibration` or a JSON file written by ``save_thresholds`` or
    ``Calibration.save``; ``None`` where it records no such setting (a plain dict or file)."""
    if isinstance(thresholds, dict):
        return (thresholds, getattr(thresholds, "change_detector", None), getattr(thresholds, "truncation", None),
                getattr(thresholds, "fold_bn", None))
    with open(thresholds) as f:
        data = json.load(f)
    if "thresholds" not in data:  # a plain {name: value} file
        return data, None, None, None
    return data["thresholds"], data.get("change_detector"), data.get("truncation"), data.get("fold_bn")


class _FrameLock:
    """A non-blocking lock that copies (``deepcopy``/pickle) as a fresh, unlocked lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        return self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    def __deepcopy__(self, memo) -> "_FrameLock":
        return _FrameLock()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


class _CapturedFrame:
    """A recorded frame (a delta frame, or a key frame of every stream): the graph, its static
    input and output tensors, and ``keep``: tensors made before the capture that the graph reads
    (they must live as long as it does)."""

    def __init__(self, graph, inputs: tuple, outputs, settings: tuple, keep: tuple = ()) -> None:
        self.graph, self.inputs, self.outputs, self.settings = graph, inputs, outputs, settings
        self.keep = keep

    def __deepcopy__(self, memo) -> None:
        return None  # a copy re-captures (the graph points at the original's buffers)
