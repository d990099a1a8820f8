"""Linear layers: they commute with deltas and keep no state.

Each applies the layer to the delta (without its constant term) and propagates the mask through
the layer's footprint; affine layers add their constant term (bias, BN shift) once, on key frames.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Optional

import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair

from ..delta import Delta, filled_rows, mask_shape, reduce_mask, require_changes
from .base import DCModule
from .folding import FoldedWeights, bn_scale_shift, round_to_tf32
from .padding import conv_input_padding, pad_delta


def _adopt(target: nn.Module, dense: nn.Module, names) -> None:
    """Register ``dense``'s parameters and buffers ``names`` on ``target`` under the same names,
    so that the dense model's state_dict loads into the converted one."""
    for n in names:
        if n in dense._parameters:
            target.register_parameter(n, dense._parameters[n])
        elif n in dense._buffers:
            target.register_buffer(n, dense._buffers[n], persistent=n not in dense._non_persistent_buffers_set)


#: weight dtypes of the tensor-core convolutions of the CUDA backend (float32 too in TF32: see
#: :func:`runs_tensor_cores`)
_TC_DTYPES = (torch.float16, torch.bfloat16)


def runs_tensor_cores(dtype: torch.dtype) -> bool:
    """Whether the CUDA backend's one-group convolutions of ``dtype`` may run on the tensor cores:
    float16 and bfloat16, and float32 in TF32 where PyTorch lets cuDNN's float32 convolutions use TF32
    (``torch.backends.cudnn.allow_tf32``, on by default; the op reads it on every call, as cuDNN
    does) and ``DELTACONV_TC_TF32=0`` is not set (``tf32_ok`` in ``csrc/conv_ops.cu``)."""
    if dtype in _TC_DTYPES:
        return True
    return (dtype == torch.float32 and torch.backends.cudnn.allow_tf32
            and os.environ.get("DELTACONV_TC_TF32") != "0")


def sends_tf32(value: torch.Tensor) -> bool:
    """Whether a layer that keeps a ``sent`` state (an activation, a product, a layer norm, a max
    pooling, a dense fallback, the input sparsifier) sends the changes of ``value`` rounded to TF32
    (the ops' ``tf32``; ``Delta.tf32``): float32 on the GPU where
    the convolutions run in TF32 (:func:`runs_tensor_cores`), unless ``DELTACONV_TF32_SENDS=0`` is
    set (read on every call; for A/B runs). The convolutions after it then read the changes as they
    are instead of rounding them to TF32 themselves (a pass over their staged input in every
    tensor-core kernel), and what the rounding leaves stays pending in the sender's state instead of
    being lost frame after frame (a drift)."""
    return (value.dtype == torch.float32 and value.is_cuda and runs_tensor_cores(torch.float32)
            and os.environ.get("DELTACONV_TF32_SENDS") != "0")


#: grouped convolutions run on the GPU in float16 / bfloat16 (and float32 in TF32) as one group with
#: a block-diagonal weight, on the tensor-core kernels, where :func:`runs_block_diagonal` says so:
#: ``groups`` times the multiply-adds, yet at the 1080p shapes of RegNet and ResNeXt up to 512 input
#: channels, 32 groups and maps of 4,096 pixels or more 1.1-8.2x faster than the grouped CUDA-core
#: kernel at 30-100 % changed pixels in float16 (0.8-4x at 1-5 %, where the tensor-core path's fixed
#: cost shows); past those bounds 0.5-1.1x (``benchmarks/results/grouped_conv_ab.txt``, which also
#: has the float32 runs)
BLOCK_DIAGONAL_MAX_CIN, BLOCK_DIAGONAL_MAX_GROUPS, BLOCK_DIAGONAL_MIN_PIXELS = 512, 32, 4096


def runs_block_diagonal(groups: int, in_channels: int, dtype: torch.dtype, on_gpu: bool,
                        pixels: Optional[int] = None) -> bool:
    """Whether a grouped convolution runs as one group with a block-diagonal weight (see
    ``BLOCK_DIAGONAL_MAX_CIN``): on the GPU in a dtype of the tensor cores (:func:`runs_tensor_cores`:
    float16, bfloat16, float32 in TF32), 2 to ``BLOCK_DIAGONAL_MAX_GROUPS``
    groups of two or more input channels, at most ``BLOCK_DIAGONAL_MAX_CIN`` input channels in all,
    a multiple of 8 (the tensor-core kernels' rows), and at least ``BLOCK_DIAGONAL_MIN_PIXELS``
    output pixels per frame (``pixels``, all streams; ``None``: not checked)."""
    return (on_gpu and runs_tensor_cores(dtype) and 1 < groups <= BLOCK_DIAGONAL_MAX_GROUPS
            and in_channels // groups >= 2 and in_channels <= BLOCK_DIAGONAL_MAX_CIN and in_channels % 8 == 0
            and (pixels is None or pixels >= BLOCK_DIAGONAL_MIN_PIXELS))


def kernel_weight_layout(weight: torch.Tensor, groups: int, out_channels: Optional[int] = None,
                         in_channels: Optional[int] = None) -> Optional[torch.memory_format]:
    """The memory format in which the CUDA kernels read a conv weight without a copy per call:
    channels_last (``[C_out][KH][KW][C_in]``) for the tensor-core convolutions (groups 1, channels
    multiples of 8, fp16 / bf16 or fp32 in TF32: :func:`runs_tensor_cores`; ``out_channels``: the
    filters once padded, default ``weight.shape[0]``; ``in_channels``: the filters' input channels
    as the kernel runs them, default ``weight.shape[1]``, all of them for a grouped weight made
    block-diagonal), the dense layout for the others; ``None`` (as it is) off the GPU."""
    if not weight.is_cuda or weight.dim() != 4:
        return None
    out = weight.shape[0] if out_channels is None else out_channels
    cin = weight.shape[1] if in_channels is None else in_channels
    tc = runs_tensor_cores(weight.dtype) and groups == 1 and out % 8 == 0 and cin % 8 == 0
    return torch.channels_last if tc else torch.contiguous_format


def reads_tf32_weights(dtype: torch.dtype, layout: Optional[torch.memory_format]) -> bool:
    """Whether the tensor-core convolutions read a weight of ``dtype`` in ``layout`` (as
    :func:`kernel_weight_layout` gives it) in TF32: float32 on their channels_last layout. They read
    it truncated to TF32, so the convolution rounds it to nearest first (:func:`round_to_tf32`)."""
    return dtype == torch.float32 and layout == torch.channels_last


def padded_out_channels(out_channels: int, in_channels: int, groups: int, taps: int, dtype: torch.dtype,
                        on_gpu: bool) -> int:
    """The output channels a convolution's filters are padded to once, beside their fold: the next
    multiple of 8 for a one-group convolution on the GPU in a tensor-core dtype
    (:func:`runs_tensor_cores`: float16, bfloat16, float32 in TF32) with input channels a
    multiple of 8 and at most 32 taps, which the tensor-core convolutions take only with a multiple of
    8 output channels (the CUDA op pads such filters itself, on every call: ``padded_cout`` in
    ``csrc/conv_ops.cu``, three more launches); else ``out_channels``. ``DELTACONV_TC_PAD=0`` in the
    environment keeps ``out_channels``, as it keeps the op's own padding off."""
    out8 = -(-out_channels // 8) * 8
    if (out8 == out_channels or not on_gpu or not runs_tensor_cores(dtype) or groups != 1 or in_channels % 8
            or taps > 32 or os.environ.get("DELTACONV_TC_PAD") == "0"):
        return out_channels
    return out8


class FoldsBatchNorm:
    """A convolution with an optional BatchNorm folded in (``folded_bn``, kept outside the module tree:
    it stays registered where it was in the dense model) through a :class:`FoldedWeights` ``_folded``
    of its ``weight`` and ``bias``; ``fold_dim``: the weight's output-channel dim (1 for a transposed
    convolution's ``[C_in, C_out, KH, KW]``)."""

    fold_dim = 0

    def _fold(self, bn: Optional[nn.Module]) -> None:
        object.__setattr__(self, "folded_bn", bn)
        self._folded = FoldedWeights()

    def fold_before_cast(self) -> tuple:
        """What :meth:`keep_fold` needs after a cast (``DeltaModel._apply``): the parameters as
        they were and their fold, not rounded (or the one kept while they are unchanged)."""
        return self._folded.before_cast(self.weight, self.bias, self.folded_bn, out_dim=self.fold_dim)

    def keep_fold(self, before: tuple) -> None:
        """After a cast: keep the fold of :meth:`fold_before_cast`, rounded to the parameters' new
        dtype on their device, until a parameter of this convolution or of its BatchNorm changes
        (see :meth:`FoldedWeights.after_cast` for when it is not kept)."""
        self._folded.after_cast(before, self.weight, self.bias, self.folded_bn)


class DCConv2d(FoldsBatchNorm, DCModule):
    """Conv2d (any kernel, stride, padding, dilation, groups), with an optional BatchNorm folded in.

    Delta rule: ``d_out = W * d_in``; mask dilated by the receptive field; bias on key frames.
    ``weight``/``bias`` are the dense module's parameters (PyTorch layout); a folded BatchNorm
    stays a module of its own in the converted model, so the dense state_dict still loads.
    A ``padding_mode`` other than ``"zeros"`` (reflect, replicate, circular) pads the input delta in
    that mode first (``input_pad``: ``F.pad``'s tuple; :func:`~deltaconv.modules.padding.pad_delta`) and
    convolves it without padding, as ``nn.Conv2d`` does: the sparse kernels then run it as any other.
    """

    kind = "conv2d"
    #: ``(left, right, top, bottom)`` pixels the input is padded by in ``input_pad_mode`` before the
    #: convolution (whose ``padding`` is then 0): a dense ``padding_mode`` other than ``"zeros"``
    input_pad: Optional[tuple] = None
    input_pad_mode = "zeros"
    #: set by :func:`~deltaconv.convert` (``fuse=True``) when the layer before it lists its output's
    #: active pixels (``lists_rows``): then, in delta frames on the CUDA backend, this 1x1
    #: convolution runs on that list (``conv1x1_rows``) instead of making its own from the mask, and
    #: with ``lists_rows`` of its own passes the same list on (its output pixels are its input's).
    takes_rows = False
    #: value mode (set by ``convert``, ``recompute=True``): the input's producer keeps its whole values
    #: (``Delta.whole``: an activation, a max pooling, the input sparsifier) and this convolution's only
    #: reader is an activation. It then computes its whole new output on the active pixels from those
    #: values, bias included (``ops.conv2d``'s ``load_mask`` / ``bias_key``), and the activation needs
    #: no float32 accumulator (``ops.activation_values``): the same work here, about half the
    #: activation's memory traffic, and no rounding of deltas to accumulate. Not where the input
    #: arrives as TF32 sends (``Delta.tf32``: float32 on a GPU with TF32 convolutions, where the
    #: convolutions read those changes without rounding them again, which whole values are not:
    #: resnet50 was 3-7 % slower in value mode there); that setting changes only with a key frame
    #: (``DeltaModel``'s frame signature), so a layer never switches modes between key frames.
    recomputes = False
    #: value mode before a residual add (set by ``convert``, ``recompute=True``): the input's producer
    #: keeps its whole values, this is a 1x1 convolution (:meth:`is_pointwise`) and its only reader is
    #: an add fused with the activation after it whose other operand is whole too (a layer's sent
    #: values: the identity of a ResNet bottleneck; or another such convolution: its downsampling
    #: identity). It recomputes its whole output on the active pixels as a recomputing convolution
    #: does, into a state buffer that keeps the other pixels (``output``, the values' dtype; on the
    #: CUDA backend the GEMM writes its pixels there: ``conv1x1_rows_into`` on a row list,
    #: ``conv1x1_into`` off one), so the add has its whole value at every pixel the identity changes
    #: too, and that activation keeps no float32 accumulator (``ops.add_activation_values``). Not on
    #: TF32 sends, as ``recomputes``.
    keeps_output = False
    lazy_states = ("output",)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros") -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.groups, self.padding_mode = groups, padding_mode
        self._pad_input_first()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._fold(None)

    @classmethod
    def from_dense(cls, conv: nn.Conv2d, bn: Optional[nn.Module] = None) -> "DCConv2d":
        """Build from a dense ``nn.Conv2d`` (sharing its parameters), folding ``bn`` if given."""
        return cls._sharing(conv, bn, in_channels=conv.in_channels, out_channels=conv.out_channels,
                            kernel_size=conv.kernel_size, stride=conv.stride, dilation=conv.dilation,
                            padding=conv.padding, groups=conv.groups, padding_mode=conv.padding_mode)

    @classmethod
    def _sharing(cls, dense: nn.Module, bn: Optional[nn.Module], **geometry) -> "DCConv2d":
        """A layer with the convolution ``geometry`` (its attributes) sharing ``dense``'s weight and
        bias, folding ``bn`` if given."""
        m = cls.__new__(cls)
        DCModule.__init__(m)
        for name, value in geometry.items():
            setattr(m, name, value)
        _adopt(m, dense, ["weight", "bias"])  # buffers where a graph pass made the conv (deltaconv.exported)
        if "bias" not in m._parameters and "bias" not in m._buffers:
            m.bias = None
        m._fold(bn)
        m._pad_input_first()
        return m

    def _pad_input_first(self) -> None:
        """A ``padding_mode`` other than ``"zeros"``: pad the input in that mode (``input_pad``) and convolve
        it with ``padding`` 0 in zeros mode, so every kernel takes the convolution."""
        pad = conv_input_padding(self.padding, self.padding_mode, self.kernel_size, self.dilation)
        if pad is None:
            return
        if any(pad):
            self.input_pad, self.input_pad_mode = pad, self.padding_mode
            self.padding = (0, 0)
        self.padding_mode = "zeros"  # no padding at all ("valid", 0) is the same in every mode

    #: run a grouped convolution as one group with a block-diagonal weight where that is faster
    #: (see :meth:`kernel_groups`); ``False`` on a layer (or the class), set before its first frame,
    #: keeps the grouped kernel
    block_diagonal_ok = True

    def kernel_groups(self, pixels: Optional[int] = None) -> int:
        """The groups the convolution runs with on a frame of ``pixels`` output pixels (all streams;
        ``None``: any): 1 for a grouped one that :func:`runs_block_diagonal` (on the tensor-core
        kernels with the weight made block-diagonal, :func:`~deltaconv.modules.folding.block_diagonal`),
        else ``groups``."""
        w = self.weight
        fits = self.block_diagonal_ok and runs_block_diagonal(self.groups, self.in_channels, w.dtype, w.is_cuda,
                                                              pixels)
        return 1 if fits else self.groups

    def output_size(self, x: Delta) -> tuple[int, int]:
        """The output's height and width for the input delta ``x`` ``[N, C, H, W]``."""
        (h, w), (kh, kw) = x.shape[2:], self.kernel_size
        if self.padding == "same":  # stride 1
            return h, w
        ph, pw = (0, 0) if self.padding == "valid" else self.padding
        return ((h + 2 * ph - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1,
                (w + 2 * pw - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1)

    def output_pixels(self, x: Delta) -> int:
        """Output pixels per frame, all streams, for the input delta ``x`` ``[N, C, H, W]``."""
        return x.shape[0] * math.prod(self.output_size(x))

    def folded_weight_bias(self, pixels: Optional[int] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Weight and bias with the BatchNorm folded in, for :meth:`kernel_groups` groups at ``pixels``
        output pixels (a grouped weight made block-diagonal); on a GPU the weight in the memory format
        that the CUDA kernels read (channels_last for tensor-core convs, see kernel_weight_layout)."""
        groups, w = self.kernel_groups(pixels), self.weight
        out = padded_out_channels(self.out_channels, self.in_channels, groups, math.prod(self.kernel_size),
                                  w.dtype, w.is_cuda)
        layout = kernel_weight_layout(w, groups, out, in_channels=self.in_channels // groups)
        return self._folded.get(w, self.bias, self.folded_bn, out_dim=0, layout=layout,
                                expand_groups=self.groups if groups != self.groups else 1,
                                out_channels=out if out != self.out_channels else None,
                                tf32=reads_tf32_weights(w.dtype, layout))

    def is_pointwise(self) -> bool:
        """Whether this is a 1x1 convolution of one group, zero padding mode and a numeric padding, of any
        stride (``ops.conv1x1_into`` takes it)."""
        return (tuple(self.kernel_size) == (1, 1) and self.groups == 1 and not isinstance(self.padding, str)
                and self.padding_mode == "zeros" and self.input_pad is None)

    def row_list_ok(self) -> bool:
        """Whether this convolution can run on the row list of the layer before it: 1x1, stride 1, no padding,
        one group, zero padding mode (its output pixels are its input pixels)."""
        return self.is_pointwise() and tuple(self.stride) == (1, 1) and tuple(self.padding) == (0, 0)

    def forward(self, x: Delta) -> Delta:
        # value mode (recomputes, keeps_output; not on TF32 sends): the whole new output on the active
        # pixels from the input's whole values, every input pixel read and the bias on every stream
        # delta mode where the input has no whole values this frame (its producer in delta mode: TF32
        # sends, which change only with a key frame); an input of whole values only, never
        values = (self.recomputes or self.keeps_output) and not x.tf32 and x.whole is not None
        if self.input_pad is not None:  # padding_mode reflect / replicate / circular: the part it reads padded
            x = pad_delta(x, self.input_pad, self.input_pad_mode, values=not values, whole=values)
        w, b = self.folded_weight_bias(self.output_pixels(x) if self.groups > 1 else None)
        if x.recomputed and not values:
            raise RuntimeError(f"{self.layer_name}: the input holds whole values (a layer keeping its output), "
                               "which only a convolution in value mode can read; convert with recompute=False")
        if not values:
            require_changes(self.layer_name, x)
        source, input_tf32 = (x.whole, False) if values else (x.value, x.tf32)
        load_mask, bias_key = all_set(self, x.mask) if values else (None, None)
        keep = values and self.keeps_output
        rows = x.rows if self.takes_rows else None
        if rows is not None and rows.filled and self.key is None and self.row_list_ok():
            # stride 1, no padding: the input's active pixels, and so its list
            listed = rows if self.lists_rows else None
            if keep:
                kept = self._kept_output((x.shape[0], self.out_channels) + tuple(x.shape[2:]), x.value)
                if w.shape[0] == self.out_channels and self.ops.conv1x1_rows_into(
                        source, x.mask, w, b, rows, kept, input_tf32=input_tf32, bias_key=bias_key):
                    return self.observe(Delta(kept, x.mask, listed, recomputed=True, whole=kept))
            v = self._unpadded(self.ops.conv1x1_rows(source, x.mask, w, b, rows, input_tf32=input_tf32,
                                                     bias_key=bias_key))
            return self.observe(self._output(v, x.mask, values, keep, listed))
        if keep and self.is_pointwise() and w.shape[0] == self.out_channels:
            # off a row list (a stride, a padding, no list before it; any key frame): the output pixels go
            # straight into the kept whole output
            kept = self._kept_output((x.shape[0], self.out_channels) + self.output_size(x), x.value)
            m = self.ops.conv1x1_into(source, x.mask, w, b, self.stride, self.padding, self.key, kept,
                                      self.work_counters(x), input_tf32=input_tf32, load_mask=load_mask,
                                      bias_key=bias_key)
            return self.observe(Delta(kept, m, None, recomputed=True, whole=kept))
        groups = self.groups if w.shape[1] * self.groups == self.in_channels else 1  # 1: block-diagonal
        v, m = self.ops.conv2d(source, x.mask, w, b, self.stride, self.padding, self.dilation, groups, self.key,
                               self.padding_mode, self.work_counters(x), input_tf32=input_tf32, load_mask=load_mask,
                               bias_key=bias_key)
        return self.observe(self._output(self._unpadded(v), m, values, keep))

    def _output(self, v: torch.Tensor, m: torch.Tensor, values: bool, keep: bool, rows=None) -> Delta:
        """The output delta of ``v`` on ``m``; with ``keep`` (``keeps_output`` in value mode) ``v`` goes into
        the kept whole output on ``m`` first (``ops.keep_output``) and the delta holds that buffer."""
        if not keep:
            return Delta(v, m, rows, recomputed=values)
        kept = self.ops.keep_output(self._kept_output(v.shape, v), v, m)
        return Delta(kept, m, rows, recomputed=True, whole=kept)

    def _kept_output(self, shape, like: torch.Tensor) -> torch.Tensor:
        """The kept whole output (``keeps_output``): the ``output`` state of ``shape``, ``like``'s dtype."""
        return self.state("output", shape, like.device, like.dtype, sent=True)

    def _unpadded(self, v: torch.Tensor) -> torch.Tensor:
        """The first ``out_channels`` channels of an output of filters padded to a multiple of 8
        (:func:`padded_out_channels`), channels-last; ``v`` itself when not padded."""
        if v.shape[1] == self.out_channels:
            return v
        return v.narrow(1, 0, self.out_channels).contiguous(memory_format=torch.channels_last)

    def flops_per_output_pixel(self, out: Delta) -> float:
        return 2.0 * self.in_channels // self.groups * math.prod(self.kernel_size) * self.out_channels

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}")
        if self.input_pad is not None:
            s += f", input padded {self.input_pad} ({self.input_pad_mode})"
        return s + (", bn folded" if self.folded_bn is not None else "") + ", " + super().extra_repr()


class DCPixelLinear(DCConv2d):
    """An ``nn.Linear`` over the channels of a channels-last view (ConvNeXt's pointwise layers,
    between ``permute(0, 2, 3, 1)`` and ``permute(0, 3, 1, 2)``), run channels-first as the 1x1
    convolution it is (``deltaconv.layout``): its weight ``[out, in]`` viewed as ``[out, in, 1, 1]``.
    Keeps the dense module's parameters under their names (the dense state_dict loads)."""

    @classmethod
    def from_dense(cls, lin: nn.Linear) -> "DCPixelLinear":
        """Build from a dense ``nn.Linear`` (sharing its parameters)."""
        return cls._sharing(lin, None, in_channels=lin.in_features, out_channels=lin.out_features, kernel_size=(1, 1),
                            stride=(1, 1), dilation=(1, 1), padding=(0, 0), groups=1, padding_mode="zeros")

    def folded_weight_bias(self, pixels: Optional[int] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The weight as a 1x1 convolution's ``[out, in, 1, 1]`` (a view: contiguous is also
        channels_last at 1x1), and the bias (one group: ``pixels`` does not matter)."""
        w, b = self._folded.get(self.weight, self.bias, None, out_dim=0)
        return w.view(self.out_channels, self.in_channels, 1, 1), b


class DCFunctionalConv2d(DCModule):
    """``F.conv2d(x, weight, bias, ...)`` with weights that do not depend on the frames (a custom
    conv module, weight standardisation, a bare ``nn.Conv2d`` traced as the whole model): the
    delta rule of :class:`DCConv2d`, with weight and bias arriving per call."""

    kind = "conv2d"

    def __init__(self, stride=1, padding=0, dilation=1, groups: int = 1) -> None:
        super().__init__()
        self.stride, self.dilation = _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.groups = groups
        self._flops_per_pixel = 0.0

    def forward(self, x: Delta, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> Delta:
        self._flops_per_pixel = 2.0 * math.prod(weight.shape)
        if self.groups == 1 and reads_tf32_weights(weight.dtype, kernel_weight_layout(weight, 1)):
            weight = round_to_tf32(weight)  # per call: the weight may change
        v, m = self.ops.conv2d(x.value, x.mask, weight, bias, self.stride, self.padding, self.dilation, self.groups,
                               self.key, counters=self.work_counters(x), input_tf32=x.tf32)
        return self.observe(Delta(v, m))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return self._flops_per_pixel


class DCFunctionalLinear(DCModule):
    """``F.linear(x, weight, bias)`` with weights that do not depend on the frames."""

    kind = "linear"

    def forward(self, x: Delta, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> Delta:
        v, m = self.ops.linear(x.value, x.mask, weight, bias, self.key)
        return self.observe(Delta(v, m))


class DCConvTranspose2d(FoldsBatchNorm, DCModule):
    """ConvTranspose2d: ``d_out = W^T * d_in``; the mask is scattered through the footprint; with an
    optional BatchNorm folded in (one group), as :class:`DCConv2d` folds one."""

    kind = "conv_transpose2d"
    fold_dim = 1  # weight [C_in, C_out / groups, KH, KW]

    @classmethod
    def from_dense(cls, conv: nn.ConvTranspose2d, bn: Optional[nn.Module] = None) -> "DCConvTranspose2d":
        """Build from a dense ``nn.ConvTranspose2d`` (sharing its parameters), folding ``bn`` if given
        (``conv.groups`` must then be 1)."""
        if bn is not None and conv.groups != 1:
            raise ValueError(f"DCConvTranspose2d.from_dense: a BatchNorm folds into one group only, got groups="
                             f"{conv.groups}")
        m = cls()
        for a in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding", "groups",
                  "dilation"):
            setattr(m, a, getattr(conv, a))
        _adopt(m, conv, ["weight", "bias"])
        if "bias" not in m._parameters:
            m.bias = None
        m._fold(bn)
        return m

    def folded_weight_bias(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Weight and bias with the BatchNorm folded in (the parameters without one), cached."""
        return self._folded.get(self.weight, self.bias, self.folded_bn, out_dim=self.fold_dim)

    def forward(self, x: Delta) -> Delta:
        w, b = self.folded_weight_bias()
        v, m = self.ops.conv_transpose2d(x.value, x.mask, w, b, self.stride, self.padding, self.output_padding,
                                         self.groups, self.dilation, self.key, self.work_counters(x))
        return self.observe(Delta(v, m))

    def extra_repr(self) -> str:
        return ("bn folded, " if self.folded_bn is not None else "") + super().extra_repr()

    def flops_per_output_pixel(self, out: Delta) -> float:
        s = self.stride[0] * self.stride[1]
        return 2.0 * self.in_channels * self.out_channels // self.groups * math.prod(self.kernel_size) / s


def all_set(layer: nn.Module, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An all-set mask of ``mask``'s shape and an all-set ``[N]`` key (a bias on every stream), kept by
    ``layer`` while the shape and device stay (made outside a CUDA graph's capture: its first frame runs
    eagerly)."""
    held = layer.__dict__.get("_all_set_flags")
    if held is None or held[0].shape != mask.shape or held[0].device != mask.device:
        held = (torch.ones_like(mask, dtype=torch.bool), torch.ones(mask.shape[0], dtype=torch.bool,
                                                                    device=mask.device))
        layer.__dict__["_all_set_flags"] = held
    return held


class DCLinear(DCModule):
    """Linear over the last dim (after flatten + pooling): ``d_out = W d_in``, bias on key frames.
    In a whole head (an input of whole values, ``Delta.recomputed``: :attr:`DCAdaptiveAvgPool2d.takes_whole`)
    its whole output from them, the bias included, on every sample."""

    kind = "linear"

    @classmethod
    def from_dense(cls, lin: nn.Linear) -> "DCLinear":
        """Build from a dense ``nn.Linear`` (sharing its parameters)."""
        m = cls()
        m.in_features, m.out_features = lin.in_features, lin.out_features
        _adopt(m, lin, ["weight", "bias"])
        if "bias" not in m._parameters:
            m.bias = None
        return m

    def forward(self, x: Delta) -> Delta:
        if x.recomputed:  # a whole head: whole values in and out, every sample; changed where its input did
            mask, key = all_set(self, x.mask)
            v, _ = self.ops.linear(x.value, mask, self.weight, self.bias, key)
            return self.observe(Delta(v, x.mask, recomputed=True, whole=v))
        v, m = self.ops.linear(x.value, x.mask, self.weight, self.bias, self.key)
        return self.observe(Delta(v, m))

    def flops_per_output_pixel(self, out: Delta) -> float:
        # every output element costs in_features multiply-adds; a mask element stands for
        # value.numel() / mask.numel() of them (out_features for [N, out], C for [N, C, ..., out])
        return 2.0 * self.in_features * out.value.numel() / max(out.mask.numel(), 1)


class DCBatchNorm2d(DCModule):
    """A BatchNorm that could not be folded into a conv: ``d_out = scale * d_in``, shift on key
    frames. Holds the dense module's parameters and running statistics under their own names."""

    kind = "batchnorm"
    _names = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")

    @classmethod
    def from_dense(cls, bn: nn.modules.batchnorm._BatchNorm) -> "DCBatchNorm2d":
        """Build from a BatchNorm layer in eval mode (its running statistics and affine parameters)."""
        m = cls()
        m.eps = bn.eps
        _adopt(m, bn, cls._names)
        for n in ("weight", "bias"):
            if n not in m._parameters:
                setattr(m, n, None)
        return m

    def forward(self, x: Delta) -> Delta:
        scale, shift = self.derived("scale_shift", (self.weight, self.bias, self.running_mean, self.running_var),
                                    lambda: bn_scale_shift(self))
        v, m = self.ops.affine_channel(x.value, x.mask, scale, shift, self.key)
        return self.observe(Delta(v, m))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return 2.0 * out.value.shape[1]


class DCAvgPool2d(DCModule):
    """Average pooling: linear; mask by the pooling footprint."""

    kind = "avg_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride) if stride not in (None, [], ()) else self.kernel_size
        self.padding = _pair(padding)
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    @classmethod
    def from_dense(cls, pool: nn.AvgPool2d) -> "DCAvgPool2d":
        """Build from a dense ``nn.AvgPool2d`` (same window, stride, padding and divisor)."""
        return cls(pool.kernel_size, pool.stride, pool.padding, pool.ceil_mode, pool.count_include_pad,
                   pool.divisor_override)

    def forward(self, x: Delta) -> Delta:
        v, m = self.ops.avg_pool2d(x.value, x.mask, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                   self.count_include_pad, self.divisor_override)
        return self.observe(Delta(v, m))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return float(out.value.shape[1] * math.prod(self.kernel_size))


class DCAdaptiveAvgPool2d(DCModule):
    """Adaptive (and global) average pooling: linear; an output pixel is active when any input
    pixel of its window is."""

    kind = "adaptive_avg_pool2d"
    #: a whole head (set by :func:`~deltaconv.convert`, ``recompute=True``, on a global pooling of a layer
    #: that keeps its whole values, an activation's, read only by reshapes, linear layers, activations and
    #: the output): the pooling of the whole values, every sample, every frame, handed on as whole values
    #: (``Delta.recomputed``) to the linear layers after it, whose whole outputs the output takes as they
    #: are (the masks still say which samples changed, as in delta mode). Summing the rounded changes of the
    #: mean and the fully connected layers in the output's float32 accumulator instead cost float16
    #: classifiers up to a fifth more error against float64 than the dense model's (resnet18, resnet50:
    #: benchmarks/results/stem_value_mode.txt).
    takes_whole = False

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    @classmethod
    def from_dense(cls, pool: nn.AdaptiveAvgPool2d) -> "DCAdaptiveAvgPool2d":
        """Build from a dense ``nn.AdaptiveAvgPool2d`` (same output size)."""
        return cls(pool.output_size)

    def _resolved_size(self, x: Delta) -> tuple[int, int]:
        size = _pair(self.output_size)
        return tuple(x.shape[-2 + i] if s is None else int(s) for i, s in enumerate(size))

    def forward(self, x: Delta) -> Delta:
        if self.takes_whole and x.whole is not None and not x.tf32:  # global: every sample's mean of its values
            v, _ = self.ops.adaptive_avg_pool2d(x.whole, all_set(self, x.mask)[0], self._resolved_size(x))
            changed = x.mask.flatten(1).any(dim=1).view(-1, 1, 1, 1)  # the samples whose mean changed
            return self.observe(Delta(v, changed, recomputed=True, whole=v))
        v, m = self.ops.adaptive_avg_pool2d(x.value, x.mask, self._resolved_size(x))
        return self.observe(Delta(v, m))


class DCSpatialMean(DCAdaptiveAvgPool2d):
    """``x.mean((2, 3), keepdim)`` of a 4-D delta (ShuffleNet's and MnasNet's global pooling): the
    global average pooling it is, ``[N, C]`` (or ``[N, C, 1, 1]`` with ``keepdim``); the output is
    active when any input pixel is."""

    kind = "mean"

    def __init__(self, keepdim: bool = False) -> None:
        super().__init__(1)
        self.keepdim = keepdim

    def forward(self, x: Delta) -> Delta:
        out = super().forward(x)  # [N, C, 1, 1], observed
        if self.keepdim:
            return out
        value = out.value.flatten(1)
        return Delta(value, out.mask.flatten(1), recomputed=out.recomputed, whole=value if out.recomputed else None)

    def extra_repr(self) -> str:
        return f"keepdim={self.keepdim}, " + super().extra_repr()


class DCUpsample(DCModule):
    """Nearest / bilinear / bicubic resampling (``nn.Upsample``, ``F.interpolate``): linear; the mask
    follows the same resampling (both ``align_corners``; bicubic: its 4x4 taps' footprint, see
    ``reference.interpolate``; on the CUDA backend it runs through torch's op). ``size`` may also
    arrive per call."""

    kind = "upsample"
    MODES = ("nearest", "nearest-exact", "bilinear", "bicubic")

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: Optional[bool] = None):
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"DCUpsample: mode must be one of {self.MODES}, got {mode!r}")
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    @classmethod
    def from_dense(cls, up: nn.Upsample) -> "DCUpsample":
        """Build from a dense ``nn.Upsample`` (same size or scale, mode and corner alignment)."""
        return cls(up.size, up.scale_factor, up.mode, up.align_corners)

    def forward(self, x: Delta, size=None, scale_factor=None) -> Delta:
        size = self.size if size is None else size
        scale = self.scale_factor if scale_factor is None else scale_factor
        v, m = self.ops.interpolate(x.value, x.mask, size, scale, self.mode, bool(self.align_corners))
        return self.observe(Delta(v, m))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return float(out.value.shape[1] * {"bilinear": 8, "bicubic": 32}.get(self.mode, 1))


class DCAdd(DCModule):
    """``a + alpha * b`` (add, sub, rsub): linear. With two deltas the masks are united; with one
    static operand the constant is added once, on key frames.

    ``fuse_with_next`` (set by :func:`deltaconv.convert` when the only reader of this add's output
    is the activation after it, a residual block's ``relu(out + identity)``): with two deltas it
    returns a :class:`DeferredSum`, and the activation runs the add inside its own pass
    (``ops.add_activation``), saving the sum's round trip through memory and a kernel launch."""

    kind = "add"
    #: value mode (set by ``convert`` under ``deltaconv.convert.WHOLE_SUMS``): both operands give their
    #: whole values (``Delta.whole``) and every reader of the sum takes whole values (convolutions that
    #: recompute or keep their outputs, activations, such adds). The add then sums the two whole
    #: operands on the union of their masks into a state buffer that keeps the other pixels (``sum``,
    #: the values' dtype; ``ops.add_values``), and gives that buffer as its whole output: MobileNet's
    #: expansions after a residual add recompute from it. Delta mode on frames where an operand has
    #: no whole values (its producer in delta mode, TF32 sends), which change only with a key frame.
    keeps_sum = False
    #: with one static operand (set by ``convert`` when a layer taking whole values reads this add, through
    #: paddings and other such layers): the output also gives the whole sum (``Delta.whole``), computed from
    #: the changing operand's whole values as the dense model computes it, so that a convolution after it
    #: can recompute (a model file's input affine ``x * scale + shift`` before its stem)
    gives_whole = False
    lazy_states = ("sum",)

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha
        self.fuse_with_next = False

    def forward(self, a, b) -> Delta:
        if isinstance(a, Delta) and isinstance(b, Delta):
            if getattr(self, "fuse_with_next", False):  # layers pickled before it lack the attribute
                return DeferredSum(a, b, self)
            if self.keeps_sum and a.whole is not None and b.whole is not None:
                return self.add_values(a, b)
            return self.add(a, b)
        if isinstance(a, Delta):
            d, const, sign = a, b, 1.0
            const = const * self.alpha
        else:
            d, const, sign = b, a, self.alpha
        out = _with_constant(d, sign, const, self.key)
        if self.gives_whole and d.whole is not None:  # as the dense model computes it, every pixel
            out.whole = torch.add(a.whole if a is d else a, b.whole if b is d else b, alpha=self.alpha)
        return self.observe(out)

    def add(self, a: Delta, b: Delta) -> Delta:
        """The sum of two deltas, observed as this layer's output (with its row list, see ``lists_rows``)."""
        if a.recomputed or b.recomputed:
            raise RuntimeError(f"{self.layer_name}: an operand holds whole values (a layer keeping its output), "
                               "which an add of changes cannot sum; convert with recompute=False")
        require_changes(self.layer_name, a, b)
        rows = None if getattr(self, "fuse_with_next", False) else self.row_list(a.shape, a.device)
        v, m = self.ops.add(a.value, a.mask, b.value, b.mask, self.alpha, rows)
        return self.observe(Delta(v, m, filled_rows(rows)))

    def add_values(self, a: Delta, b: Delta) -> Delta:
        """Value mode (``keeps_sum``): the whole sum of two whole operands on the union of their masks,
        kept in the ``sum`` state, observed as this layer's output (with its row list)."""
        kept = self.state("sum", a.shape, a.device, a.whole.dtype, sent=True)
        rows = self.row_list(a.shape, a.device)
        m = self.ops.add_values(a.whole, a.mask, b.whole, b.mask, self.alpha, kept, rows)
        return self.observe(Delta(kept, m, filled_rows(rows), recomputed=True, whole=kept))

    def flops_per_output_pixel(self, out: Delta) -> float:
        return float(out.value.shape[1]) if out.value.dim() > 1 else 1.0


class DeferredSum(Delta):
    """The output of a :class:`DCAdd` fused with the activation after it: its operands, not yet
    added. The activation takes them (:meth:`DCActivation.forward`); any other reader of ``value``
    or ``mask`` gets the sum computed then, so the result never depends on who reads it. Shape
    queries answer without computing it."""

    def __init__(self, a: Delta, b: Delta, layer: DCAdd) -> None:  # noqa: D107 - no dataclass fields set
        self.a, self.b, self.layer = a, b, layer
        self._sum: Optional[Delta] = None

    def materialize(self) -> Delta:
        """The sum (computed once, by the add layer, which records it in its statistics)."""
        if self.a.recomputed or self.b.recomputed:
            raise RuntimeError(f"{self.layer.layer_name}: an operand holds whole values (a convolution keeping its "
                               "output), which only the activation fused with this add can sum; convert with "
                               "recompute=False")
        if self._sum is None:
            self._sum = self.layer.add(self.a, self.b)
        return self._sum

    @property
    def fusable(self) -> bool:
        """Whether an activation can take the operands as they are: not yet summed, equal shapes and dtypes."""
        return (self._sum is None and self.a.value.shape == self.b.value.shape
                and self.a.value.dtype == self.b.value.dtype)

    @property
    def value(self) -> torch.Tensor:  # type: ignore[override]
        """The sum's value (computes the sum)."""
        return self.materialize().value

    @property
    def mask(self) -> torch.Tensor:  # type: ignore[override]
        """The sum's mask (computes the sum)."""
        return self.materialize().mask

    @property
    def shape(self) -> torch.Size:
        """Shape of the sum (the operands' broadcast shape)."""
        return torch.broadcast_shapes(self.a.value.shape, self.b.value.shape)

    def size(self, dim: int | None = None):
        """``shape`` or ``shape[dim]``."""
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        """Number of dimensions of the sum."""
        return len(self.shape)

    @property
    def ndim(self) -> int:
        """Number of dimensions of the sum."""
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the sum (the operands' promoted dtype)."""
        return torch.promote_types(self.a.value.dtype, self.b.value.dtype)

    @property
    def device(self) -> torch.device:
        """Device of the operands."""
        return self.a.value.device

    def numel(self) -> int:
        """Number of elements of the sum."""
        return self.shape.numel()

    def __repr__(self) -> str:
        return f"DeferredSum(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


def _with_constant(d: Delta, sign: float, const, key) -> Delta:
    """``sign * d`` plus ``const`` on key streams, broadcast to the output shape."""
    value = d.value * sign if sign != 1.0 else d.value
    out_shape = torch.broadcast_shapes(value.shape, torch.as_tensor(const).shape) if torch.is_tensor(const) \
        else value.shape
    mask = d.mask
    if tuple(out_shape) != tuple(value.shape):
        value = value.expand(out_shape)
        mask = mask.expand([out_shape[0], 1] + list(out_shape[2:]))
    value = torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))
    if key is not None:
        k = key.view([-1] + [1] * (value.dim() - 1))
        value = value + torch.as_tensor(const, dtype=value.dtype, device=value.device) * k.to(value.dtype)
        mask = mask | k
    return Delta(value, mask)


class DCScale(DCModule):
    """Multiplication or division of a delta by a static tensor or number: linear."""

    kind = "scale"
    #: set by ``convert`` when a layer taking whole values reads this one (through paddings and the like):
    #: the output also gives the whole product (``Delta.whole``, the input's whole values times the
    #: static operand, every pixel, as the dense model computes it), as :attr:`DCAdd.gives_whole`
    gives_whole = False

    def __init__(self, divide: bool = False) -> None:
        super().__init__()
        self.divide = divide

    def forward(self, a, b) -> Delta:
        d, s = (a, b) if isinstance(a, Delta) else (b, a)
        whole = None
        if self.gives_whole and d.whole is not None:
            whole = d.whole / s if self.divide else d.whole * s  # a division's delta is its dividend
        if not self.divide and _per_channel(s, d.value):  # ConvNeXt's layer_scale: on the active pixels only
            value, mask = self.ops.affine_channel(d.value, d.mask, self.work_vector("scale", s), None, None)
            return self.observe(Delta(value, mask, whole=whole))
        value = d.value / s if self.divide else d.value * s
        mask = d.mask
        if tuple(value.shape) != tuple(d.value.shape):
            mask = mask.expand(list(value.shape[:1]) + [1] + list(value.shape[2:]))
        return self.observe(Delta(value, mask, whole=whole))


def _per_channel(s, value: torch.Tensor) -> bool:
    """Whether ``s`` is a per-channel scale of the 4-D ``value`` (``[C, 1, 1]`` or ``[1, C, 1, 1]``) in a
    dtype no finer than the value's, so that ``value * s`` is ``affine_channel``'s product."""
    if not torch.is_tensor(s) or value.dim() != 4 or s.dim() not in (3, 4) or s.numel() != value.shape[1]:
        return False
    if s.shape[-3] != value.shape[1] or any(n != 1 for n in s.shape[-2:]):
        return False
    return torch.promote_types(s.dtype, value.dtype) == value.dtype


def _expanded_mask(d: Delta) -> torch.Tensor:
    """The mask as a float tensor with the value's shape and strides (1 where active)."""
    out = torch.empty_like(d.value, dtype=torch.float32)
    return out.copy_(d.mask.expand_as(d.value))


def _rebuild(like, items: list):
    """A list or tuple of ``items`` of the same type as ``like`` (named tuples included)."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*items)
    return type(like)(items)


def _map_leaves(obj, fn, is_leaf):
    """``obj`` with ``fn`` applied to every element for which ``is_leaf`` holds, found through lists,
    tuples (named ones too) and dicts; everything else as it is."""
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return _rebuild(obj, [_map_leaves(o, fn, is_leaf) for o in obj])
    if isinstance(obj, dict):
        return {k: _map_leaves(v, fn, is_leaf) for k, v in obj.items()}
    return obj


def _map_deltas(obj, fn):
    """``obj`` with ``fn`` applied to every :class:`Delta` in it (:func:`_map_leaves`)."""
    return _map_leaves(obj, fn, lambda o: isinstance(o, Delta))


class DCLinearFunction(DCModule):
    """Any bias-free linear op with non-negative coefficients on its delta inputs: data movement
    (view, reshape, permute, flatten, split, chunk, getitem, channel shuffle, pad, pixel shuffle,
    ...) and reductions (mean, sum). The op runs on the delta values and, to find the mask, on the
    masks expanded to the values' shape: an output pixel is active when any element it is made from
    is active."""

    kind = "linear_fn"

    def __init__(self, fn: Callable, label: str = "") -> None:
        super().__init__()
        self.fn = fn
        self.label = label or getattr(fn, "__name__", str(fn))

    def forward(self, *args, **kwargs):
        out = self._per_sample_reshape(args, kwargs)
        if out is None:
            out = self._channels_only(args, kwargs)
        if out is None:
            out = self._pixel_shuffle(args, kwargs)
        if out is not None:
            return self.observe(out) if isinstance(out, Delta) else out
        if any(isinstance(a, Delta) and a.recomputed for a in list(args) + list(kwargs.values())):
            raise RuntimeError(f"{self.layer_name}: whole values (a whole head) reach {self.fn!r}, which only "
                               "takes changes; convert with recompute=False")
        values = self.fn(*_map_deltas(args, lambda d: torch.where(d.mask, d.value, 0)),
                         **_map_deltas(kwargs, lambda d: torch.where(d.mask, d.value, 0)))
        masks = self.fn(*_map_deltas(args, _expanded_mask), **_map_deltas(kwargs, _expanded_mask))
        out = _zip_outputs(values, masks)
        return self.observe(out) if isinstance(out, Delta) else out

    def _per_sample_reshape(self, args: tuple, kwargs: dict) -> Optional[Delta]:
        """The classifier head's ``flatten(x, 1)`` of a globally pooled ``[N, C, 1, 1]`` delta
        (and a reshape or view of it, or of an ``[N, C]`` delta with one flag per sample, to
        ``[N, K, 1, ...]``) without launching anything: each sample is one pixel, so each output row
        is one sample and the mask is the input's, reshaped; the general path's masking and mask
        reduction took four kernels. Whole values (a whole head) stay whole. ``None`` where this does
        not apply (the general path then runs)."""
        if not reshapes_samples(self.fn) or len(args) == 0 or not isinstance(args[0], Delta):
            return None
        d = args[0]
        per_sample = d.value.dim() >= 3 or (d.value.dim() == 2 and tuple(d.mask.shape) == (d.value.shape[0], 1))
        if not per_sample or any(n != 1 for n in d.value.shape[2:]) or any(
                isinstance(a, Delta) for a in list(args[1:]) + list(kwargs.values())):
            return None
        value = self.fn(d.value, *args[1:], **kwargs)
        if not torch.is_tensor(value) or value.dim() < 2 or value.shape[0] != d.value.shape[0] or any(
                n != 1 for n in value.shape[2:]):
            return None  # its mask would not be one flag per sample
        return Delta(value, d.mask.reshape(mask_shape(value.shape)), recomputed=d.recomputed,
                     whole=value if d.recomputed else None)

    def _channels_only(self, args: tuple, kwargs: dict):
        """A channel shuffle, or a chunk, split or narrow along the channels, of one 4-D delta: each
        output pixel is made of its own input pixel's channels only, so the output masks are the
        input's mask as it is and only the values move (one copy for a shuffle, views for the
        rest); the general path's masking, expanded masks and mask reductions took several passes
        over the whole map. ``None`` where this does not apply (the general path then runs)."""
        if len(args) == 0 or not isinstance(args[0], Delta) or args[0].value.dim() != 4 or any(
                isinstance(a, Delta) for a in list(args[1:]) + list(kwargs.values())):
            return None
        d = args[0]
        if self.fn in _CHANNEL_SHUFFLES:
            groups = args[1] if len(args) > 1 else kwargs.get("groups")
            if not isinstance(groups, int) or groups < 1 or d.value.shape[1] % groups:
                return None
            return Delta(channel_shuffle(d.value, groups), d.mask)
        dim = _split_dim(self.fn, args, kwargs)
        if dim is None or dim % 4 != 1:
            return None
        values = self.fn(d.value, *args[1:], **kwargs)
        if torch.is_tensor(values):
            return Delta(values, d.mask)
        return _rebuild(values, [Delta(v, d.mask) for v in values])

    def _pixel_shuffle(self, args: tuple, kwargs: dict) -> Optional[Delta]:
        """A pixel shuffle or unshuffle (``nn.PixelShuffle``, ``F.pixel_shuffle`` and their inverses) of
        one 4-D delta: output pixel ``(y, x)`` of a shuffle by ``r`` is made of input pixel ``(y // r,
        x // r)`` alone, so its mask is the input's repeated ``r x r`` times and the values move in one
        copy, channels-last kept (:func:`pixel_shuffle`); an unshuffle's output pixel is made of the
        ``r x r`` input pixels it gathers, its mask their union, and the inactive ones' values are
        zeroed before the move. The general path's masking, expanded masks and mask reduction took
        several passes over the whole map. ``None`` where this does not apply
        (the general path then runs)."""
        factor = _shuffle_factor(self.fn, args, kwargs)
        if factor is None or len(args) == 0 or not isinstance(args[0], Delta) or args[0].value.dim() != 4:
            return None
        d, r = args[0], abs(factor)
        n, c, h, w = d.value.shape
        if (factor > 0 and c % (r * r)) or (factor < 0 and (h % r or w % r)):
            return None  # torch's own error, from the general path
        # an unshuffle's active output pixel gathers inactive input pixels too, whose values are not
        # changes (a layer leaves them unwritten): zeros there
        value = pixel_shuffle(d.value if factor > 0 else torch.where(d.mask, d.value, 0), factor)
        if factor > 0:
            mask = d.mask[:, :, :, None, :, None].expand(n, 1, h, r, w, r).reshape(n, 1, h * r, w * r)
        else:
            mask = d.mask.reshape(n, 1, h // r, r, w // r, r).any(5).any(3)
        return Delta(value, mask, tf32=d.tf32)  # moved values stay TF32 values

    def extra_repr(self) -> str:
        return f"{self.label}, " + super().extra_repr()


_CHANNEL_SHUFFLES = (torch.channel_shuffle, nn.functional.channel_shuffle)
#: the pixel shuffle functions: the name of their factor argument and its sign (1 shuffle, -1 unshuffle)
_PIXEL_SHUFFLES = {torch.pixel_shuffle: ("upscale_factor", 1), nn.functional.pixel_shuffle: ("upscale_factor", 1),
                   torch.pixel_unshuffle: ("downscale_factor", -1),
                   nn.functional.pixel_unshuffle: ("downscale_factor", -1)}


def _shuffle_factor(fn, args: tuple, kwargs: dict) -> Optional[int]:
    """The factor of a pixel shuffle call (``fn`` an ``nn.PixelShuffle`` / ``nn.PixelUnshuffle`` or a
    function of ``_PIXEL_SHUFFLES``, ``args`` starting with its tensor), negative for an unshuffle;
    ``None`` for anything else or a call with more arguments than the factor."""
    if isinstance(fn, nn.PixelShuffle):
        factor, rest = fn.upscale_factor, list(args[1:]) + list(kwargs.values())
    elif isinstance(fn, nn.PixelUnshuffle):
        factor, rest = -fn.downscale_factor, list(args[1:]) + list(kwargs.values())
    elif fn in _PIXEL_SHUFFLES:
        name, sign = _PIXEL_SHUFFLES[fn]
        r = args[1] if len(args) > 1 else kwargs.get(name)
        factor = sign * r if isinstance(r, int) and r >= 1 else None
        rest = list(args[2:]) + [v for k, v in kwargs.items() if k != name]
    else:
        return None
    return None if rest else factor
#: functions and methods that cut a tensor along one dim: the position of ``dim`` among the
#: arguments (the tensor first) and its default
_SPLITS = {fn: (2, 0) for fn in (torch.chunk, torch.split, torch.tensor_split, torch.Tensor.chunk,
                                 torch.Tensor.split, torch.Tensor.tensor_split)}
_SPLITS.update({torch.narrow: (1, None), torch.Tensor.narrow: (1, None)})


def _split_dim(fn, args: tuple, kwargs: dict) -> Optional[int]:
    """The dim a chunk, split, tensor_split or narrow call cuts (``args`` start with the tensor),
    else ``None``."""
    if fn not in _SPLITS:
        return None
    position, default = _SPLITS[fn]
    dim = args[position] if len(args) > position else kwargs.get("dim", default)
    return dim if isinstance(dim, int) else None


def channel_shuffle(value: torch.Tensor, groups: int) -> torch.Tensor:
    """``torch.channel_shuffle(value, groups)`` of a 4-D ``[N, C, H, W]`` tensor, channels-last in
    and out when ``value`` is channels-last (one copy; torch's own returns NCHW on CUDA)."""
    if not value.is_contiguous(memory_format=torch.channels_last) or value.is_contiguous():
        return torch.channel_shuffle(value, groups)
    n, c, h, w = value.shape
    pixels = value.permute(0, 2, 3, 1)  # [N, H, W, C], contiguous
    shuffled = pixels.unflatten(3, (groups, c // groups)).transpose(3, 4).reshape(n, h, w, c)
    return shuffled.permute(0, 3, 1, 2)


def pixel_shuffle(value: torch.Tensor, factor: int) -> torch.Tensor:
    """``torch.pixel_shuffle(value, factor)`` of a 4-D ``[N, C, H, W]`` tensor for ``factor > 0``,
    ``torch.pixel_unshuffle(value, -factor)`` for ``factor < 0``; channels-last in and out when
    ``value`` is channels-last (one copy)."""
    r = abs(factor)
    if not value.is_contiguous(memory_format=torch.channels_last) or value.is_contiguous():
        return torch.pixel_shuffle(value, r) if factor > 0 else torch.pixel_unshuffle(value, r)
    n, c, h, w = value.shape
    pixels = value.permute(0, 2, 3, 1)  # [N, H, W, C], contiguous
    if factor > 0:  # input channel k * r * r + i * r + j -> output channel k at (y * r + i, x * r + j)
        moved = pixels.reshape(n, h, w, c // (r * r), r, r).permute(0, 1, 4, 2, 5, 3)
        moved = moved.reshape(n, h * r, w * r, c // (r * r))
    else:
        moved = pixels.reshape(n, h // r, r, w // r, r, c).permute(0, 1, 3, 5, 2, 4)
        moved = moved.reshape(n, h // r, w // r, c * r * r)
    return moved.permute(0, 3, 1, 2)


def shuffled_concatenate(tensors, groups: int, chunks: Optional[int] = None):
    """``torch.channel_shuffle(torch.cat(tensors, 1), groups)`` of dense tensors, and when ``chunks``
    is set that cut into ``chunks`` along the channels (a tuple): the call that
    :func:`deltaconv.layout.fold_shuffled_concatenations` puts in place of such a chain, and that
    :class:`DCShuffledConcatenate` converts."""
    out = torch.channel_shuffle(torch.cat(list(tensors), 1), groups)
    return out if chunks is None else out.chunk(chunks, 1)


def reshapes_samples(fn) -> bool:
    """Whether ``fn`` only reshapes (flatten, reshape, view): with dim 0 of its output equal to the
    batch, each output row then holds exactly one sample's elements."""
    return isinstance(fn, nn.Flatten) or fn in (torch.flatten, torch.reshape, torch.Tensor.flatten,
                                                  torch.Tensor.reshape, torch.Tensor.view)


def _zip_outputs(values, masks):
    if torch.is_tensor(values):
        return Delta(values, reduce_mask(masks != 0))
    if isinstance(values, (list, tuple)):
        return _rebuild(values, [_zip_outputs(v, m) for v, m in zip(values, masks)])
    return values


class DCConcatenate(DCModule):
    """``torch.cat`` of deltas: along channels the masks are united, along other dims joined."""

    kind = "cat"

    def __init__(self, dim: int = 0) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, tensors) -> Delta:
        v, m = self.ops.concatenate([t.value for t in tensors], [t.mask for t in tensors], self.dim)
        return self.observe(Delta(v, m))


class DCShuffledConcatenate(DCModule):
    """``torch.channel_shuffle(torch.cat(tensors, 1), groups)``, and when ``chunks`` is set that cut
    into ``chunks`` along the channels (a tuple, as ``.chunk`` gives): the call that
    :func:`deltaconv.layout.fold_shuffled_concatenations` puts in place of such a chain (ShuffleNet
    V2's block tail and the next block's split). The masks are united and every output shares the
    one mask. Two deltas of one shape in two groups take the backend's ``interleave_channels`` (on
    the CUDA backend one kernel that writes each chunk contiguous: the chain took a concatenation,
    a shuffle copy and a copy of each chunk that its reader needs contiguous); anything else runs
    the concatenation, the shuffle and the chunk in turn. The outputs hold TF32 values where every
    input does (``Delta.tf32``)."""

    kind = "cat_shuffle"

    def __init__(self, groups: int, chunks: Optional[int] = None) -> None:
        super().__init__()
        self.groups, self.chunks = groups, chunks

    def forward(self, tensors):
        values, masks = [t.value for t in tensors], [t.mask for t in tensors]
        if (self.groups == len(values) == 2 and values[0].dim() == 4 and values[1].shape == values[0].shape
                and values[1].dtype == values[0].dtype):  # any chunk count: the backends cut as .chunk does
            outs, mask = self.ops.interleave_channels(values[0], masks[0], values[1], masks[1],
                                                      1 if self.chunks is None else self.chunks)
        else:
            joined, mask = self.ops.concatenate(values, masks, 1)
            shuffled = channel_shuffle(joined, self.groups)
            outs = [shuffled] if self.chunks is None else list(shuffled.chunk(self.chunks, 1))
        tf32 = all(t.tf32 for t in tensors)  # moved values stay TF32 values
        out = tuple(Delta(v, mask, tf32=tf32) for v in outs)
        self.observe(out)
        return out[0] if self.chunks is None else out

    def extra_repr(self) -> str:
        return f"groups={self.groups}, chunks={self.chunks}, " + super().extra_repr()
