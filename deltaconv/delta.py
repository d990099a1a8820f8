"""The value that flows between converted layers: a delta and its update mask.

Shapes and layout
-----------------
``value``: ``[N, C, *pixel_dims]`` (4-D feature maps are kept channels-last); the change of
each element since the previous frame. ``mask``: ``[N, 1, *pixel_dims]`` bool, one flag per
pixel and stream; ``True`` where the pixel carries a change. For tensors of rank < 2 the mask
has one element per dimension of size 1 (it broadcasts against the value).

Values at inactive pixels carry no information: every op must ignore them. The reference
backend writes zeros there; the CUDA backend may leave them unwritten.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


def reduce_mask(active: torch.Tensor) -> torch.Tensor:
    """Collapse an element-wise activity tensor to a per-pixel mask (``any`` over dim 1)."""
    if active.dim() >= 2:
        return active.any(dim=1, keepdim=True)
    return active.any().reshape([1] * active.dim())


def mask_shape(value_shape: torch.Size) -> list[int]:
    """The mask shape that goes with a value of ``value_shape``."""
    shape = list(value_shape)
    if len(shape) >= 2:
        shape[1] = 1
        return shape
    return [1] * len(shape)


@dataclass
class RowList:
    """The pixels a layer sent (an activation, a product, an add), listed for the 1x1 convolutions
    that read its output (CUDA backend; see :class:`~deltaconv.modules.DCModule` ``lists_rows``).

    ``rows``: int32 ``[1 + 2 * N*H*W]``, the work list of ``torch.ops.deltaconv.conv1x1_rows``
    (``rows[1 + k]`` and ``rows[1 + N*H*W + k]`` the k-th listed pixel, as a linear index into the
    ``[N, H, W]`` map); ``counters``: the zeroed int32 work counters (a slice of
    :class:`~deltaconv.modules.WorkCounters`) whose ``[0]`` counts them, which the convolution
    then uses as its own. ``filled``: set by the backend when its kernel wrote the list (a reader
    must ignore a list that is not).
    """

    rows: torch.Tensor
    counters: torch.Tensor
    filled: bool = False


def require_changes(layer: str, *deltas: "Delta") -> None:
    """Raise unless every one of ``deltas`` holds its changes in ``value``: a layer reading changes got the
    output of an activation that did not write them (``DCActivation.changes_unread``, set by ``convert``
    where every reader takes whole values), because a reader's value mode was undone after ``convert``."""
    if any(getattr(d, "unwritten", False) for d in deltas):
        raise RuntimeError(f"{layer}: its input's changes were not written (the activation before it is marked "
                           "changes_unread, for readers that take whole values), and this layer reads the changes; "
                           "a value-mode mark was cleared after convert: clear changes_unread on the activations "
                           "before it too, or set deltaconv.convert.SKIP_UNREAD_CHANGES = False before convert")


def filled_rows(rows: Optional[RowList]) -> Optional[RowList]:
    """``rows`` when a backend kernel wrote it, else ``None`` (what a layer hands on with its output)."""
    return rows if rows is not None and rows.filled else None


@dataclass
class Delta:
    """A change of a tensor since the previous frame, and where it is (see module docstring).

    ``Delta`` answers the shape queries of a tensor (``shape``, ``size()``, ``dim()``, ``dtype``,
    ``device``) so that code in a traced model that reads shapes keeps working unchanged.
    """

    value: torch.Tensor
    mask: torch.Tensor
    #: the active pixels listed for a 1x1 convolution, when the layer that made this delta did so
    rows: Optional[RowList] = None
    #: whether the values are TF32 already (float32 with the 13 low mantissa bits zero): a layer that
    #: keeps a ``sent`` state sends its changes rounded so where the convolutions run in TF32
    #: (``sends_tf32``), and a convolution reading them then skips its own rounding (the CUDA op's
    #: ``input_tf32``)
    tf32: bool = False
    #: the tensor's whole current values (what downstream has received so far, every pixel), given
    #: by a layer that keeps them (an activation's, a max pooling's or the input sparsifier's
    #: ``sent``): a *recomputing* convolution after it (``DCConv2d.recomputes``) reads them
    whole: Optional[torch.Tensor] = None
    #: ``value`` holds the layer's whole new output on the active pixels, not a change: a recomputing
    #: convolution's output, read only by the activation after it (``ops.activation_values``)
    recomputed: bool = False
    #: ``value`` was left unwritten (``DCActivation.changes_unread``: every reader takes ``whole``); a
    #: reader of the changes refuses it (:func:`require_changes`)
    unwritten: bool = False

    # --- shape queries, so traced shape arithmetic runs on deltas unchanged ---
    @property
    def shape(self) -> torch.Size:
        """Shape of the value."""
        return self.value.shape

    def size(self, dim: int | None = None):
        """``value.size()`` or ``value.size(dim)``."""
        return self.value.size() if dim is None else self.value.size(dim)

    def dim(self) -> int:
        """Number of dimensions of the value."""
        return self.value.dim()

    @property
    def ndim(self) -> int:
        """Number of dimensions of the value."""
        return self.value.dim()

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the value (the mask is bool)."""
        return self.value.dtype

    @property
    def device(self) -> torch.device:
        """Device of the value and the mask."""
        return self.value.device

    def numel(self) -> int:
        """Number of elements of the value."""
        return self.value.numel()

    def masked_value(self) -> torch.Tensor:
        """The value with inactive pixels set to zero (what a linear op may consume)."""
        return self.value * self.mask.to(self.value.dtype)

    def density(self) -> torch.Tensor:
        """Fraction of active pixels, as a 0-d float tensor on the delta's device (no sync)."""
        return self.mask.float().mean()

    def __repr__(self) -> str:
        return f"Delta(shape={tuple(self.value.shape)}, dtype={self.value.dtype}, device={self.value.device})"
