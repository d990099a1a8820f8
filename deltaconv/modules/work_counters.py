"""``WorkCounters``: the work-list counters of a converted model's CUDA convolutions, zeroed once
per frame for all of them."""
from __future__ import annotations

import os
from typing import Optional

import torch


class WorkCounters:
    """Zeroed int32 counters for the CUDA convolutions of one converted model.

    Each CUDA convolution counts the tiles or pixels of its work list in ints that must be zero
    when it starts (``counters`` of ``torch.ops.deltaconv.conv2d``). Left to itself the op zeroes
    them with a small kernel per call, one CUDA-graph node per convolution. Within a frame of a
    :class:`~deltaconv.DeltaModel` each convolution call takes its own :data:`PER_CALL` ints
    instead (:meth:`take`), and :meth:`begin_frame` zeroes all of them with one kernel per chunk of
    :data:`CHUNK` ints (one chunk serves 256 convolution calls).

    Chunks are never freed while the object lives: a captured CUDA graph keeps the addresses it
    recorded, so a chunk left behind by a device change stays allocated (16 KiB each). They are
    made outside inference mode, so frames in and out of ``torch.inference_mode`` share them.
    """

    #: ints per convolution call (>= conv::kConvCounters = 14 in csrc/conv/conv_common.cuh; 64 bytes)
    PER_CALL = 16
    #: ints per chunk
    CHUNK = 4096

    def __init__(self) -> None:
        self._chunks: list[torch.Tensor] = []  # of the current device; zeroed by begin_frame
        self._slices: list[torch.Tensor] = []  # PER_CALL-int views of the chunks, in order
        self._retired: list[torch.Tensor] = []  # chunks of an earlier device, kept alive
        self._next = 0  # index of the next slice to hand out in this frame
        self._in_frame = False
        #: whether the layers list their rows this frame (``DELTACONV_ROW_LISTS=0``, read by
        #: :meth:`begin_frame`, turns it off: see ``DCModule.lists_rows``)
        self.row_lists = True

    def begin_frame(self) -> None:
        """Zero every chunk (on the current stream) and start handing out slices from the first.
        ``DELTACONV_WORK_COUNTERS=0`` in the environment (read here, for A/B runs) hands out none:
        every convolution zeroes its own counters again; ``DELTACONV_ROW_LISTS=0`` turns the row
        lists off for the frame."""
        for chunk in self._chunks:
            chunk.zero_()
        self._next = 0
        self._in_frame = os.environ.get("DELTACONV_WORK_COUNTERS") != "0"
        self.row_lists = os.environ.get("DELTACONV_ROW_LISTS") != "0"

    def end_frame(self) -> None:
        """Stop handing out slices until the next :meth:`begin_frame`."""
        self._in_frame = False

    def take(self, device: torch.device) -> Optional[torch.Tensor]:
        """The next :data:`PER_CALL` zeroed ints on ``device`` for one convolution call, or ``None``
        outside a frame (the op then zeroes its own)."""
        if not self._in_frame:
            return None
        if self._chunks and self._chunks[0].device != device:
            self._retired += self._chunks
            self._chunks, self._slices, self._next = [], [], 0
        if self._next == len(self._slices):
            with torch.inference_mode(False):
                chunk = torch.zeros(self.CHUNK, dtype=torch.int32, device=device)
                self._chunks.append(chunk)
                self._slices += list(chunk.view(-1, self.PER_CALL).unbind(0))
        counters = self._slices[self._next]
        self._next += 1
        return counters

    @property
    def taken(self) -> int:
        """Slices handed out since the last :meth:`begin_frame` (the convolution calls of a frame)."""
        return self._next

    def nbytes(self) -> int:
        """Bytes of device memory the counters hold."""
        return sum(c.numel() * c.element_size() for c in self._chunks + self._retired)
