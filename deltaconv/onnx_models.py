"""ONNX models through onnx2torch: load one, and trace onnx2torch's op modules as the torch calls they make.

``onnx2torch.convert`` turns an ONNX graph into a ``torch.fx.GraphModule`` whose ops are small modules
(``OnnxBinaryMathOperation``, ``OnnxResize``, ...). Some branch on their inputs in Python (a
division checks whether its operands are floating point, a resize reads its scales with
``.tolist()``), which torch.fx cannot trace. :func:`deltaconv.convert` traces each such module as
the call it amounts to (:func:`trace_onnx_module`, called by its tracer), so an ONNX model converts
like any other: ``deltaconv.convert(deltaconv.load_onnx("model.onnx"), example_input=frame)``;
:func:`plain_torch` gives the dense model so traced (what to compare with, and to capture as a CUDA
graph: onnx2torch's resize copies its scales to the host every call).

``onnx`` and ``onnx2torch`` are imported only by :func:`load_onnx`; tracing an onnx2torch model
needs neither import (the modules are recognised by their class names).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Union

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["load_onnx", "onnx_div", "onnx_prelu", "plain_torch"]

#: onnx2torch's interpolation modes -> torch's, for 2-D maps
_RESIZE_MODES = {"nearest": "nearest", "linear": "bilinear", "cubic": "bicubic"}


def onnx_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """ONNX ``Div``: true division of floating-point operands, truncating division of integers."""
    if a.is_floating_point() or b.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def onnx_prelu(x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """ONNX ``PRelu`` with one slope, or one per channel of ``x`` (dim 1) in a slope of shape ``[C, 1, ...]``:
    ``F.prelu`` of the slopes flattened."""
    return F.prelu(x, slope.reshape(-1))


def _constant(tracer: fx.Tracer, value: Any) -> Optional[torch.Tensor]:
    """The tensor ``value`` holds at trace time: itself, or the buffer a ``get_attr`` proxy reads;
    ``None`` for anything computed in the graph."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, fx.Proxy) and value.node.op == "get_attr":
        obj = tracer.root
        for part in value.node.target.split("."):
            obj = getattr(obj, part)
        return obj if isinstance(obj, torch.Tensor) else None
    return None


def _binary_forward(tracer: fx.Tracer, module: nn.Module) -> Optional[Callable]:
    """``OnnxBinaryMathOperation`` (Add, Sub, Mul, Div) as ``torch.add`` / ``sub`` / ``mul`` or
    :func:`onnx_div` (recorded as one call: which division it is depends on the dtypes)."""
    if module.broadcast == 1 and module.axis is not None:  # opset-1 broadcasting: left to onnx2torch
        return None
    fn = module.math_op_function
    if fn in (torch.add, torch.sub, torch.mul):
        return fn
    if getattr(fn, "__name__", "") == "_onnx_div":
        return lambda a, b: tracer.create_proxy("call_function", onnx_div, (a, b), {})
    return None


def _resize_forward(tracer: fx.Tracer, module: nn.Module) -> Optional[Callable]:
    """``OnnxResize`` of a 4-D map with constant scales or sizes as ``F.interpolate`` with literal
    ``scale_factor`` / ``size``; anything else is left to onnx2torch (and fails to trace)."""
    mode = _RESIZE_MODES.get(module.onnx_mode)
    if mode is None:
        return None

    def forward(x, roi=None, scales=None, sizes=None):
        roi_value, scale_value, size_value = (_constant(tracer, v) for v in (roi, scales, sizes))
        if (roi is not None and roi_value is None) or (scales is not None and scale_value is None) or \
                (sizes is not None and size_value is None):
            raise torch.fx.proxy.TraceError("deltaconv: an ONNX Resize whose roi, scales or sizes are computed "
                                            "in the graph cannot be traced")
        if not module.ignore_roi and roi_value is not None and roi_value.numel():
            raise torch.fx.proxy.TraceError("deltaconv: an ONNX Resize with a region of interest cannot be traced")
        size = scale = None
        if size_value is not None and size_value.numel():
            size = [int(v) for v in size_value.tolist()[2:]]
        elif scale_value is not None and scale_value.numel():
            values = scale_value.tolist()
            if values[:2] != [1, 1]:
                raise torch.fx.proxy.TraceError(f"deltaconv: an ONNX Resize scales batch or channels ({values})")
            scale = [float(v) for v in values[2:]]
        return F.interpolate(x, size=size, scale_factor=scale, mode=mode, align_corners=module.align_corners)
    return forward


def _prelu_forward(tracer: fx.Tracer, module: nn.Module) -> Optional[Callable]:
    """``OnnxPReLU`` with a constant slope of one value or of shape ``[C, 1, ...]`` (onnx2torch's own
    ``F.prelu`` case) as one :func:`onnx_prelu` call; any other slope cannot be traced (onnx2torch branches
    on its shape)."""
    def forward(x, slope):
        value = _constant(tracer, slope)
        if value is None or not (value.numel() == 1 or (value.dim() >= 1 and all(s == 1 for s in value.shape[1:]))):
            raise torch.fx.proxy.TraceError("deltaconv: an ONNX PRelu whose slope is computed in the graph, or is "
                                            "not one value or one per channel ([C, 1, ...]), cannot be traced")
        return tracer.create_proxy("call_function", onnx_prelu, (x, slope), {})
    return forward


#: onnx2torch class name -> builder ``(tracer, module) -> forward or None`` (``None``: trace the module's own)
_FORWARDS = {
    "OnnxBinaryMathOperation": _binary_forward,
    "OnnxResize": _resize_forward,
    "OnnxPReLU": _prelu_forward,
}


def traced_forward(tracer: fx.Tracer, module: nn.Module, forward: Callable) -> Callable:
    """The forward to trace for ``module``: a traceable equivalent of an onnx2torch op that branches on
    its inputs in Python (:data:`_FORWARDS`), else ``forward`` itself."""
    builder = _FORWARDS.get(type(module).__name__)
    if builder is None or not type(module).__module__.startswith("onnx2torch."):
        return forward
    return builder(tracer, module) or forward


def plain_torch(model: nn.Module) -> fx.GraphModule:
    """``model`` retraced as ``deltaconv.convert`` traces it: onnx2torch's ops that branch on their inputs
    become the torch calls they make (:func:`traced_forward`). The same outputs; and where onnx2torch's
    resize reads its scales on the host every call (which a CUDA graph cannot capture), this one has
    them as literals, so the dense model replays as a CUDA graph too."""
    from .convert import _ScopedTracer

    return fx.GraphModule(model, _ScopedTracer().trace(model)).eval()


def _constants_to_initializers(model) -> int:
    """Move ``Constant`` nodes that hold a tensor into the graph's initializers (in place); returns how
    many. Exporters such as paddle2onnx store every weight so, and onnx2torch reads weights from
    initializers only."""
    from onnx import numpy_helper

    graph, kept, moved = model.graph, [], 0
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t),
                                                             node.output[0]))
            moved += 1
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return moved


def load_onnx(model: Union[str, os.PathLike, Any]) -> fx.GraphModule:
    """An ONNX model (a file path or an ``onnx.ModelProto``) as the eval-mode ``torch.fx.GraphModule``
    ``onnx2torch.convert`` makes of it, after moving tensor-valued ``Constant`` nodes into initializers
    (exporters such as paddle2onnx store weights so; onnx2torch reads initializers only). The result
    runs as the ONNX model does and :func:`deltaconv.convert` takes it.

    Needs the ``onnx`` and ``onnx2torch`` packages (``pip install onnx onnx2torch``)."""
    try:
        import onnx
        import onnx2torch
    except ImportError as error:
        raise ImportError(f"load_onnx needs the onnx and onnx2torch packages (pip install onnx onnx2torch): "
                          f"{error}") from error
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"load_onnx: no ONNX file at {os.fspath(model)!r}")
        model = onnx.load(os.fspath(model))
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"load_onnx: model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    else:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    _constants_to_initializers(model)
    return onnx2torch.convert(model).eval()
