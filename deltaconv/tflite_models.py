"""TFLite models as PyTorch modules, for :func:`deltaconv.convert` (``deltaconv.load_tflite``).

A ``.tflite`` file's graph (one subgraph of float32 activations; weights in float32, or float16 behind
``DEQUANTIZE`` ops) becomes a :class:`TFLiteModule` that runs the same ops channels-first: each
convolution an ``nn.Conv2d`` (its weights ``[O, KH, KW, I]`` / depthwise ``[1, KH, KW, O]`` transposed to
PyTorch's), ``FULLY_CONNECTED`` an ``nn.Linear`` (a map flattened in TensorFlow's NHWC element order), ``PRELU``
an ``nn.PReLU`` of one slope per channel, fused activations and ``RELU`` / ``RELU6`` / ``TANH`` / ``HARD_SWISH``
as ``F.relu`` / ``F.relu6`` / ``torch.tanh`` / ``F.hardswish`` calls, ``PAD`` (of height, width or channels) and
TensorFlow's ``SAME`` padding of strided ops as ``F.pad`` (TensorFlow pads the extra row and column at the bottom
and right), ``RESIZE_BILINEAR`` as ``F.interpolate`` (``half_pixel_centers``, PyTorch's ``align_corners=False``),
``MAX_POOL_2D`` / ``AVERAGE_POOL_2D`` as ``nn.MaxPool2d`` / ``nn.AvgPool2d``, ``MEAN`` over height and width,
``CONCATENATION`` along the axis's channels-first dim, ``STRIDED_SLICE`` of a box of a map (unit strides) as
indexing, ``RESHAPE`` of a map in TensorFlow's NHWC element order. Its
forward is a fixed sequence of these calls, so it traces with torch.fx like any model.

Input: ``[N, C, H, W]`` (the file's one NHWC input, channels first). Outputs: the file's outputs in order, 4-D ones
channels first (``[N, C, H, W]``), the others as TFLite gives them; one output is returned as a tensor, several
as a tuple.

Supported ops (:data:`SUPPORTED_OPS`; the error names any other): the above, ``ADD`` and ``MUL`` of two activations,
``AVERAGE_POOL_2D``, ``LOGISTIC``, ``DEQUANTIZE`` (of constant float16 tensors) and MediaPipe's custom
``Convolution2DTransposeBias`` (an ``nn.ConvTranspose2d``), ``DEPTH_TO_SPACE`` in TensorFlow's channel order, and
sparse weights behind ``DENSIFY`` whose last dim is compressed (made dense when loaded); other custom ops are not.
13 of the 14 models in the ``mediapipe==0.10.14`` wheel load (pose, hand and face landmarks, iris, palm, pose and
face detection, selfie segmentation, hand re-crop), equal TFLite's runtime (MediaPipe's own for the selfie models,
whose custom op TFLite's lacks) and convert with no fallback (``tests/test_tflite.py``).
Parsing uses the PyPI package ``tflite`` (flatbuffer bindings of TFLite's schema), imported lazily.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

#: TFLite's TensorType codes of the tensors this loader reads (schema.fbs)
_FLOAT32, _FLOAT16, _INT32 = 0, 1, 2
_NUMPY_TYPES = {_FLOAT32: np.float32, _FLOAT16: np.float16, _INT32: np.int32}
#: element-wise ops, as ops of their own and as fused activations after an op (``_Step.activation``)
_ELEMENTWISE = {"RELU": F.relu, "RELU6": F.relu6, "TANH": torch.tanh, "HARD_SWISH": F.hardswish,
                "LOGISTIC": torch.sigmoid}
#: ActivationFunctionType -> the element-wise op after the op (None: no activation)
_FUSED = {0: None, 1: "RELU", 3: "RELU6", 4: "TANH"}
#: Padding: SAME = 0, VALID = 1
_SAME = 0
#: a 4-D tensor's NHWC axis -> its dim channels first
_NHWC_TO_NCHW = {0: 0, 1: 2, 2: 3, 3: 1}
#: the builtin ops load_tflite translates
SUPPORTED_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "MUL", "CONCATENATION", "PAD", "MAX_POOL_2D",
                 "AVERAGE_POOL_2D", "MEAN", "RESIZE_BILINEAR", "RESHAPE", "LOGISTIC", "RELU", "RELU6", "TANH",
                 "HARD_SWISH", "PRELU", "STRIDED_SLICE", "DEPTH_TO_SPACE", "DEQUANTIZE", "DENSIFY",
                 "CUSTOM:Convolution2DTransposeBias")


class TFLiteUnsupportedError(ValueError):
    """A ``.tflite`` graph with an op, a layout or a dtype this loader does not translate."""


@dataclass
class _Step:
    """One op of the graph: ``kind``, the tensor ids it reads (activations) and writes, and its parameters."""

    kind: str
    inputs: tuple
    output: int
    module: str = ""              # the registered submodule it calls (convolutions, pooling)
    pad: tuple = ()               # F.pad's (left, right, top, bottom) before the op
    activation: Optional[str] = None
    size: tuple = ()              # RESIZE_BILINEAR's output size; RESHAPE's target shape
    from_map: bool = False        # RESHAPE / FULLY_CONNECTED of a 4-D map (its elements read in NHWC order)
    dims: tuple = ()              # CONCATENATION's dim (one), MEAN's dims, channels first
    keep: bool = False            # MEAN's keep_dims


def _import_tflite():
    try:
        import tflite
    except ImportError as e:
        raise ImportError("load_tflite needs the PyPI package 'tflite' (TFLite's flatbuffer schema; with "
                          "'flatbuffers'): `pip install --no-deps tflite==2.18.0 && pip install flatbuffers`") from e
    return tflite


def _fused_activation(opts, i: int, kind: str) -> Optional[str]:
    """The call after op ``i`` (``kind``) for its options' fused activation (``None``: none)."""
    code = opts.FusedActivationFunction()
    if code not in _FUSED:
        raise TFLiteUnsupportedError(f"load_tflite: op {i} {kind} has fused activation {code}; supported: NONE, RELU, "
                                     f"RELU6, TANH")
    return _FUSED[code]


def _with_parameters(module: nn.Module, weight: np.ndarray, bias: Optional[np.ndarray] = None) -> nn.Module:
    """``module`` with its ``weight`` (already in PyTorch's layout) and ``bias`` copied from the file's arrays."""
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(np.array(weight, np.float32)).reshape(module.weight.shape))
        if bias is not None:
            module.bias.copy_(torch.from_numpy(bias.astype(np.float32)))
    return module


def _densify(values: np.ndarray, sparsity, dims: list, tflite, name: str) -> np.ndarray:
    """The dense value of a sparse constant whose last dim is compressed (SPARSE_CSR) and the others dense, in
    their own order and without blocks (the layout of MediaPipe's sparse detectors); other layouts raise."""
    order = sparsity.TraversalOrderAsNumpy().tolist() if sparsity.TraversalOrderLength() else []
    meta = [sparsity.DimMetadata(d) for d in range(sparsity.DimMetadataLength())]
    if (order != list(range(len(dims))) or sparsity.BlockMapLength() or len(meta) != len(dims)
            or any(m.Format() != 0 for m in meta[:-1]) or meta[-1].Format() != 1):
        raise TFLiteUnsupportedError(f"load_tflite: constant tensor {name!r} is sparse in a layout other than its last "
                                     f"dim compressed (CSR) without blocks")
    vectors = {1: tflite.Int32Vector, 2: tflite.Uint16Vector, 3: tflite.Uint8Vector}

    def array(kind: int, table) -> np.ndarray:
        vector = vectors[kind]()
        vector.Init(table.Bytes, table.Pos)
        return vector.ValuesAsNumpy().astype(np.int64)

    segments = array(meta[-1].ArraySegmentsType(), meta[-1].ArraySegments())
    columns = array(meta[-1].ArrayIndicesType(), meta[-1].ArrayIndices())
    dense = np.zeros((int(np.prod(dims[:-1])), dims[-1]), values.dtype)
    rows = np.repeat(np.arange(len(segments) - 1), np.diff(segments))
    dense[rows, columns] = values[:len(columns)]
    return dense.reshape(dims)


def _strided_slice(options, tflite, constants: dict, ins: list, shape, i: int) -> tuple:
    """``STRIDED_SLICE`` of a map with unit strides, constant bounds and no ellipsis, new or shrunk axes: its
    ``(start, stop)`` per channels-first dim (the batch whole)."""
    opts = tflite.StridedSliceOptions()
    opts.Init(options.Bytes, options.Pos)
    dims = shape(ins[0])
    begin, end, strides = (constants.get(t) for t in ins[1:4])
    if (len(dims) != 4 or begin is None or end is None or (strides is not None and (strides != 1).any())
            or opts.EllipsisMask() or opts.NewAxisMask() or opts.ShrinkAxisMask() or opts.Offset()):
        raise TFLiteUnsupportedError(f"load_tflite: op {i} STRIDED_SLICE must take a box of a map with unit strides "
                                     f"(no ellipsis, new or shrunk axes)")
    bounds = []
    for axis, size in enumerate(dims):  # a masked bound is the whole axis; a negative one counts from its end
        lo = 0 if opts.BeginMask() >> axis & 1 else int(begin[axis]) + (size if begin[axis] < 0 else 0)
        hi = size if opts.EndMask() >> axis & 1 else min(int(end[axis]) + (size if end[axis] < 0 else 0), size)
        bounds.append((lo, hi))
    if bounds[0] != (0, dims[0]):
        raise TFLiteUnsupportedError(f"load_tflite: op {i} STRIDED_SLICE slices the batch")
    return tuple(bounds[a] for a in (0, 3, 1, 2))


def _transpose_conv_bias(op, constants: dict, in_shape: list, out_shape: list, ins: list, i: int) -> nn.ConvTranspose2d:
    """MediaPipe's custom ``Convolution2DTransposeBias`` (inputs: the map, weights ``[O, KH, KW, I]``, bias ``[O]``;
    custom options: int32 padding (1 SAME, 2 VALID), stride width, stride height) as an ``nn.ConvTranspose2d``: the
    weights as PyTorch's ``[I, O, KH, KW]`` (the gradient of the convolution whose filters they are, unflipped). SAME
    padding that would crop the output unevenly is not supported."""
    weight, bias = constants.get(ins[1]), constants.get(ins[2]) if len(ins) > 2 else None
    params = op.CustomOptionsAsNumpy()
    if weight is None or isinstance(params, int) or params.size != 12:
        raise TFLiteUnsupportedError(f"load_tflite: op {i} Convolution2DTransposeBias needs constant weights and "
                                     f"12 bytes of options (padding, stride width, stride height)")
    padding, stride_w, stride_h = params.view(np.int32).tolist()
    o, kh, kw, c = weight.shape
    pads = []
    for size, out, k, s in ((in_shape[1], out_shape[1], kh, stride_h), (in_shape[2], out_shape[2], kw, stride_w)):
        total = (size - 1) * s + k - out if padding == 1 else 0
        if total < 0 or total % 2:
            raise TFLiteUnsupportedError(f"load_tflite: op {i} Convolution2DTransposeBias pads its output unevenly "
                                         f"(padding {padding}, kernel {k}, stride {s}, {size} -> {out})")
        pads.append(total // 2)
    conv = nn.ConvTranspose2d(c, o, (kh, kw), (stride_h, stride_w), tuple(pads), bias=bias is not None)
    _with_parameters(conv, weight.transpose(3, 0, 1, 2), bias)
    expected = [(in_shape[1] - 1) * stride_h - 2 * pads[0] + kh, (in_shape[2] - 1) * stride_w - 2 * pads[1] + kw]
    if expected != list(out_shape[1:3]):
        raise TFLiteUnsupportedError(f"load_tflite: op {i} Convolution2DTransposeBias makes {expected}, the file says "
                                     f"{out_shape[1:3]}")
    return conv


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one spatial dim: (before, after), the odd one after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class TFLiteModule(nn.Module):
    """A TFLite graph run channels-first (see the module docstring); build it with :func:`load_tflite`."""

    def __init__(self, steps: list[_Step], inputs: list[int], outputs: list[int], modules: dict[str, nn.Module],
                 constants: dict[int, torch.Tensor], input_hw: tuple[int, int]) -> None:
        super().__init__()
        self.steps, self.input_ids, self.output_ids = steps, inputs, outputs
        self.input_hw = input_hw  # the file's input height and width
        self.layers = nn.ModuleDict(modules)
        for tid, value in constants.items():  # buffer constant_<tensor id>
            self.register_buffer(f"constant_{tid}", value)

    def _tensor(self, env: dict, tid: int) -> torch.Tensor:
        """Tensor ``tid``: an activation computed in this call, else a constant of the file."""
        return env[tid] if tid in env else getattr(self, f"constant_{tid}")

    def forward(self, x: torch.Tensor):
        """``x``: the file's input channels first; returns its outputs (see the module docstring)."""
        env = {self.input_ids[0]: x}
        for step in self.steps:
            x = [self._tensor(env, t) for t in step.inputs]
            if step.pad:
                x[0] = F.pad(x[0], step.pad)
            if step.kind in ("CONV_2D", "DEPTHWISE_CONV_2D", "CONV_TRANSPOSE_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D",
                             "PRELU"):
                y = self.layers[step.module](x[0])
            elif step.kind == "FULLY_CONNECTED":  # TFLite flattens its input to [-1, in_features], NHWC order
                flat = x[0].permute(0, 2, 3, 1) if step.from_map else x[0]
                y = self.layers[step.module](flat.reshape(-1, self.layers[step.module].in_features))
            elif step.kind == "ADD":
                y = x[0] + x[1]
            elif step.kind == "MUL":
                y = x[0] * x[1]
            elif step.kind == "DEPTH_TO_SPACE":  # TensorFlow's order: channel (i * r + j) * C + c -> pixel (i, j)
                b, c, h, w = x[0].shape
                r = step.size[0]
                y = x[0].reshape(b, r, r, c // (r * r), h, w).permute(0, 3, 4, 1, 5, 2).reshape(b, c // (r * r), h * r,
                                                                                                   w * r)
            elif step.kind == "STRIDED_SLICE":  # (start, stop) per channels-first dim
                y = x[0][tuple(slice(a, b) for a, b in step.size)]
            elif step.kind == "CONCATENATION":
                y = torch.cat(x, dim=step.dims[0])
            elif step.kind == "MEAN":
                y = x[0].mean(dim=step.dims, keepdim=step.keep)
            elif step.kind in _ELEMENTWISE:
                y = _ELEMENTWISE[step.kind](x[0])
            elif step.kind == "PAD":
                y = x[0]
            elif step.kind == "RESIZE_BILINEAR":
                y = F.interpolate(x[0], size=step.size, mode="bilinear", align_corners=False)
            else:  # RESHAPE, in TensorFlow's NHWC element order
                y = (x[0].permute(0, 2, 3, 1) if step.from_map else x[0]).reshape(step.size)
            if step.activation is not None:
                y = _ELEMENTWISE[step.activation](y)
            env[step.output] = y
        outs = tuple(env[t] for t in self.output_ids)
        return outs[0] if len(outs) == 1 else outs


def load_tflite(path: Union[str, os.PathLike]) -> TFLiteModule:
    """The ``.tflite`` file at ``path`` as a :class:`TFLiteModule` (float32, eval mode, on the CPU).

    Raises ``FileNotFoundError`` for a missing file and :class:`TFLiteUnsupportedError` naming the op, tensor
    or dtype it cannot translate."""
    tflite = _import_tflite()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_tflite: path {str(path)!r} does not exist")
    model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    if model.SubgraphsLength() != 1:
        raise TFLiteUnsupportedError(f"load_tflite: {path.name} has {model.SubgraphsLength()} subgraphs; one is "
                                     f"supported")
    graph = model.Subgraphs(0)
    if graph.InputsLength() != 1:
        raise TFLiteUnsupportedError(f"load_tflite: {path.name} has {graph.InputsLength()} inputs; one is supported")
    source = graph.Tensors(graph.Inputs(0))
    if source.Type() != _FLOAT32 or source.ShapeLength() != 4:
        raise TFLiteUnsupportedError(f"load_tflite: {path.name}'s input must be a float32 NHWC image, got TFLite type "
                                     f"{source.Type()} of {source.ShapeLength()} dims")
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}

    def shape(tid: int) -> list[int]:
        t = graph.Tensors(tid)
        return t.ShapeAsNumpy().tolist() if t.ShapeLength() else []

    def constant(tid: int) -> Optional[np.ndarray]:
        t = graph.Tensors(tid)
        data = model.Buffers(t.Buffer()).DataAsNumpy()
        if isinstance(data, int) or data.size == 0:
            return None
        if t.Type() not in _NUMPY_TYPES:
            raise TFLiteUnsupportedError(f"load_tflite: constant tensor {t.Name().decode()!r} has TFLite type "
                                         f"{t.Type()}; float32, float16 and int32 are supported")
        values = data.view(_NUMPY_TYPES[t.Type()])
        if t.Sparsity() is not None:  # read by DENSIFY: its dense value, made here
            return _densify(values, t.Sparsity(), shape(tid), tflite, t.Name().decode())
        return values.reshape(shape(tid))

    constants: dict[int, np.ndarray] = {}
    steps: list[_Step] = []
    modules: dict[str, nn.Module] = {}
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        kind = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
        if kind == "CUSTOM":
            kind = f"CUSTOM:{(code.CustomCode() or b'').decode()}"
        ins = [op.Inputs(j) for j in range(op.InputsLength())]
        out = op.Outputs(0)
        for tid in ins:
            if tid >= 0 and tid not in constants:
                value = constant(tid)
                if value is not None:
                    constants[tid] = value
        options = op.BuiltinOptions()
        name = f"op{i:03d}_{kind.lower()}"
        if kind == "DENSIFY":  # the sparse constant is dense already (constant())
            constants[out] = constants[ins[0]]
        elif kind == "DEQUANTIZE":
            if ins[0] not in constants:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} DEQUANTIZE of a non-constant tensor")
            constants[out] = constants[ins[0]].astype(np.float32)
        elif kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            opts = (tflite.Conv2DOptions if kind == "CONV_2D" else tflite.DepthwiseConv2DOptions)()
            opts.Init(options.Bytes, options.Pos)
            weight = constants.get(ins[1])
            bias = constants.get(ins[2]) if len(ins) > 2 and ins[2] >= 0 else None
            if weight is None:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} {kind} with non-constant weights")
            _, h, w, c = shape(ins[0])
            if kind == "CONV_2D" and weight.shape[3] != c:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} CONV_2D is grouped ({c} input channels, filters "
                                             f"of {weight.shape[3]}); grouped CONV_2D is not supported")
            # [O, KH, KW, I] -> [O, I, KH, KW]; depthwise [1, KH, KW, C * M] -> [C * M, 1, KH, KW]
            w_t = weight.transpose((0, 3, 1, 2) if kind == "CONV_2D" else (3, 0, 1, 2))
            groups = 1 if kind == "CONV_2D" else c
            cout, _, kh, kw = w_t.shape
            stride, dilation = (opts.StrideH(), opts.StrideW()), (opts.DilationHFactor(), opts.DilationWFactor())
            pad_h = _same_padding(h, kh, stride[0], dilation[0]) if opts.Padding() == _SAME else (0, 0)
            pad_w = _same_padding(w, kw, stride[1], dilation[1]) if opts.Padding() == _SAME else (0, 0)
            symmetric = pad_h[0] == pad_h[1] and pad_w[0] == pad_w[1]
            modules[name] = _with_parameters(nn.Conv2d(c, cout, (kh, kw), stride, (pad_h[0], pad_w[0]) if symmetric
                                                       else 0, dilation, groups, bias=bias is not None), w_t, bias)
            steps.append(_Step(kind, (ins[0],), out, name, () if symmetric else (*pad_w, *pad_h),
                               _fused_activation(opts, i, kind)))
        elif kind in ("ADD", "MUL"):
            opts = (tflite.AddOptions if kind == "ADD" else tflite.MulOptions)()
            opts.Init(options.Bytes, options.Pos)
            if any(t in constants for t in ins) and len(shape(out)) == 4:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} {kind} of a constant and a map (its layout) is not "
                                             f"supported")
            steps.append(_Step(kind, tuple(ins), out, activation=_fused_activation(opts, i, kind)))
        elif kind == "CONCATENATION":
            opts = tflite.ConcatenationOptions()
            opts.Init(options.Bytes, options.Pos)
            rank = len(shape(out))
            axis = opts.Axis() % rank
            steps.append(_Step(kind, tuple(ins), out, dims=(_NHWC_TO_NCHW[axis] if rank == 4 else axis,),
                               activation=_fused_activation(opts, i, kind)))
        elif kind in _ELEMENTWISE:
            steps.append(_Step(kind, (ins[0],), out))
        elif kind == "PRELU":
            alpha = constants.get(ins[1])
            channels = shape(ins[0])[-1]
            if alpha is None or alpha.size != channels or alpha.shape[-1] != channels:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} PRELU needs one constant slope per channel "
                                             f"({channels}), got {None if alpha is None else alpha.shape}")
            modules[name] = _with_parameters(nn.PReLU(channels), alpha)
            steps.append(_Step(kind, (ins[0],), out, name))
        elif kind == "MEAN":
            opts = tflite.ReducerOptions()
            opts.Init(options.Bytes, options.Pos)
            axes = constants.get(ins[1])
            rank = len(shape(ins[0]))
            axes = None if axes is None else sorted(int(a) % rank for a in np.atleast_1d(axes))
            if rank != 4 or axes is None or not set(axes) <= {1, 2}:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} MEAN must average a map over its height and width, "
                                             f"got axes {axes} of a rank-{rank} tensor")
            steps.append(_Step(kind, (ins[0],), out, dims=tuple(_NHWC_TO_NCHW[a] for a in axes),
                               keep=bool(opts.KeepDims())))
        elif kind == "FULLY_CONNECTED":
            opts = tflite.FullyConnectedOptions()
            opts.Init(options.Bytes, options.Pos)
            weight = constants.get(ins[1])
            bias = constants.get(ins[2]) if len(ins) > 2 and ins[2] >= 0 else None
            if weight is None or weight.ndim != 2 or opts.KeepNumDims() or opts.WeightsFormat() != 0:
                raise TFLiteUnsupportedError(f"load_tflite: op {i} FULLY_CONNECTED needs constant [out, in] weights "
                                             f"in the default format, without keep_num_dims")
            modules[name] = _with_parameters(nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None), weight,
                                             bias)
            steps.append(_Step(kind, (ins[0],), out, name, activation=_fused_activation(opts, i, kind),
                               from_map=len(shape(ins[0])) == 4))
        elif kind == "PAD":
            pads = constants.get(ins[1])
            if pads is None or pads.shape != (4, 2) or pads[0].any() or (pads < 0).any():
                raise TFLiteUnsupportedError(f"load_tflite: op {i} PAD must pad H, W or C of a map by constants")
            pad = (int(pads[2, 0]), int(pads[2, 1]), int(pads[1, 0]), int(pads[1, 1]))  # F.pad's order: W, H, C
            steps.append(_Step(kind, (ins[0],), out, pad=pad + (int(pads[3, 0]), int(pads[3, 1])) if pads[3].any()
                               else pad))
        elif kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
            opts = tflite.Pool2DOptions()
            opts.Init(options.Bytes, options.Pos)
            kernel, stride = (opts.FilterHeight(), opts.FilterWidth()), (opts.StrideH(), opts.StrideW())
            _, h, w, _ = shape(ins[0])
            if opts.Padding() == _SAME and (any(_same_padding(h, kernel[0], stride[0], 1))
                                            or any(_same_padding(w, kernel[1], stride[1], 1))):
                raise TFLiteUnsupportedError(f"load_tflite: op {i} {kind} with SAME padding that pads")
            modules[name] = (nn.MaxPool2d if kind == "MAX_POOL_2D" else nn.AvgPool2d)(kernel, stride)
            steps.append(_Step(kind, (ins[0],), out, name, activation=_fused_activation(opts, i, kind)))
        elif kind == "RESIZE_BILINEAR":
            opts = tflite.ResizeBilinearOptions()
            opts.Init(options.Bytes, options.Pos)
            if opts.AlignCorners() or not opts.HalfPixelCenters():
                raise TFLiteUnsupportedError(f"load_tflite: op {i} RESIZE_BILINEAR needs half_pixel_centers and no "
                                             f"align_corners (PyTorch's align_corners=False)")
            steps.append(_Step(kind, (ins[0],), out, size=tuple(shape(out)[1:3])))
        elif kind == "RESHAPE":
            steps.append(_Step(kind, (ins[0],), out, size=tuple(shape(out)), from_map=len(shape(ins[0])) == 4))
        elif kind == "DEPTH_TO_SPACE":
            opts = tflite.DepthToSpaceOptions()
            opts.Init(options.Bytes, options.Pos)
            steps.append(_Step(kind, (ins[0],), out, size=(opts.BlockSize(),)))
        elif kind == "STRIDED_SLICE":
            bounds = _strided_slice(options, tflite, constants, ins, shape, i)
            steps.append(_Step(kind, (ins[0],), out, size=bounds))
        elif kind == "CUSTOM:Convolution2DTransposeBias":  # MediaPipe's: TF's conv2d_transpose, then a bias
            modules[name] = _transpose_conv_bias(op, constants, shape(ins[0]), shape(out), ins, i)
            steps.append(_Step("CONV_TRANSPOSE_2D", (ins[0],), out, name))
        else:
            raise TFLiteUnsupportedError(f"load_tflite: op {i} is {kind}; supported: {', '.join(SUPPORTED_OPS)}")
    read = {t for s in steps for t in s.inputs}
    used = {t: torch.from_numpy(np.ascontiguousarray(v.astype(np.float32))) for t, v in constants.items()
            if t in read and v.dtype != np.int32}
    inputs = [graph.Inputs(j) for j in range(graph.InputsLength())]
    outputs = [graph.Outputs(j) for j in range(graph.OutputsLength())]
    input_hw = tuple(int(v) for v in shape(inputs[0])[1:3])  # NHWC
    return TFLiteModule(steps, inputs, outputs, modules, used, input_hw).eval()
