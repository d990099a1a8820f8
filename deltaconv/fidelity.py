"""Task-level fidelity of a converted model against the dense model, and its FLOPs.

Per-frame metrics (each returns one value per batch entry, i.e. per stream):

* :func:`relative_error` - ``||y - ref|| / ||ref||`` (L2 over all non-batch elements): logits of a
  classifier, or the output map of a dense-prediction model.
* :func:`topk_contains` - whether the dense model's top-1 class is among the converted model's
  top-k (k=5: "top-5 containment"); :func:`top1_agrees` is k=1.
* :func:`mask_iou` - IoU of the masks ``y > threshold`` and ``ref > threshold`` (per-pixel
  logits / probabilities of a dense-prediction model); 1 when both are empty.

:func:`compare` runs a dense model and its :class:`~deltaconv.DeltaModel` side by side over a
sequence of frames (a whole video by default, see :func:`video_frames`), and returns a
:class:`FidelityReport`: every metric per frame, their mean / max / 95th percentile over the
non-key frames, and the FLOPs-weighted density of the converted model over the same frames
(``sum(mean_flops_done) / sum(flops_dense)`` of the layers' stats, :func:`flops_density`).
The key frame is dense by construction and is left out of both (its metrics are exact).

Command line (whole vtest.avi, MobileNetV2 with real weights, one uniform threshold)::

    python -m deltaconv.fidelity --video vtest.avi --size 288 384 --threshold 0.05
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence, Union

import torch

Tensor = torch.Tensor

__all__ = ["relative_error", "topk_contains", "top1_agrees", "mask_iou", "label_iou", "flops_density", "flops_totals",
           "element_density", "cost_totals", "COSTS", "primary_output", "OutputPicker", "METRICS", "TASK_METRICS",
           "FidelityReport", "compare", "video_frames"]


# ----------------------------------------------------------------------------- per-frame metrics
def relative_error(y: Tensor, ref: Tensor, eps: float = 1e-12) -> Tensor:
    """``||y - ref||_2 / ||ref||_2`` per batch entry (float64, shape ``[N]``)."""
    y, ref = y.detach().double().flatten(1), ref.detach().double().flatten(1)
    return (y - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(eps)


def topk_contains(logits: Tensor, ref_logits: Tensor, k: int = 5) -> Tensor:
    """Per batch entry: is the reference's top-1 class among ``logits``' top-``k``? (float 0/1)."""
    ref_top1 = ref_logits.detach().flatten(1).argmax(dim=1, keepdim=True)
    k = min(k, logits.flatten(1).shape[1])
    topk = logits.detach().flatten(1).topk(k, dim=1).indices
    return (topk == ref_top1).any(dim=1).double()


def top1_agrees(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Per batch entry: same top-1 class as the reference (float 0/1)."""
    return topk_contains(logits, ref_logits, k=1)


def mask_iou(y: Tensor, ref: Tensor, threshold: float = 0.0) -> Tensor:
    """Per batch entry: IoU of ``y > threshold`` and ``ref > threshold`` (1 when both empty).

    For several output channels (per-class logits) each element counts, i.e. the IoU of the
    union of all class masks; pass one channel (``y[:, c:c+1]``) for a per-class IoU, or argmax
    labels compared with :func:`label_iou`.
    """
    a = (y.detach() > threshold).flatten(1)
    b = (ref.detach() > threshold).flatten(1)
    inter = (a & b).sum(dim=1).double()
    union = (a | b).sum(dim=1).double()
    return torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))


def label_iou(y: Tensor, ref: Tensor) -> Tensor:
    """Per batch entry: mean over classes present in either map of the IoU of the argmax labels
    (``[N, classes, H, W]`` logits): the usual segmentation mIoU, against the dense labels."""
    a, b = y.detach().argmax(dim=1).flatten(1), ref.detach().argmax(dim=1).flatten(1)
    classes = y.shape[1]
    out = []
    for i in range(a.shape[0]):
        ious = []
        for c in range(classes):
            pa, pb = a[i] == c, b[i] == c
            union = (pa | pb).sum()
            if union > 0:
                ious.append(float((pa & pb).sum()) / float(union))
        out.append(sum(ious) / len(ious) if ious else 1.0)
    return torch.tensor(out, dtype=torch.float64)


#: metric name -> (function(y, ref) -> [N], higher_is_better); ``iou`` thresholds logits at 0, ``prob_iou``
#: probabilities at 0.5 (a sigmoid output such as MediaPipe's selfie mask, whose values are all > 0)
METRICS: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], bool]] = {
    "rel_err": (relative_error, False),
    "top5": (lambda y, r: topk_contains(y, r, 5), True),
    "top1": (top1_agrees, True),
    "iou": (lambda y, r: mask_iou(y, r, 0.0), True),
    "prob_iou": (lambda y, r: mask_iou(y, r, 0.5), True),
    "miou": (label_iou, True),
}

#: the metrics :func:`compare` reports for each task
TASK_METRICS = {"classification": ("rel_err", "top5", "top1"), "dense": ("rel_err", "iou")}


#: what a density weights each layer by: ``"flops"`` (its dense multiply-adds x2: what
#: compute-bound kernels pay) or ``"elements"`` (its output elements: what memory-bound kernels,
#: activations, depthwise convs and mask passes, pay; on the GPU most of a frame goes to those,
#: see ``benchmarks/work_density.py``)
COSTS = ("flops", "elements")


def cost_totals(stats: Sequence[dict], cost: str = "flops") -> tuple[float, float]:
    """``(sum(mean_<cost>_done), sum(<cost>_dense))`` over the layers of ``DeltaModel.stats()``
    that have that cost and frames (per frame, since the statistics were reset); ``cost`` is one
    of :data:`COSTS`."""
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
    dense_key, done_key = f"{cost}_dense", f"mean_{cost}_done"
    rows = [s for s in stats if _finite(s.get(dense_key)) and _finite(s.get(done_key))]
    return sum(s[done_key] for s in rows), sum(s[dense_key] for s in rows)


def flops_totals(stats: Sequence[dict]) -> tuple[float, float]:
    """``(sum(mean_flops_done), sum(flops_dense))`` over the layers of ``DeltaModel.stats()`` that
    have FLOPs and frames (per frame, since the statistics were reset)."""
    return cost_totals(stats, "flops")


def flops_density(stats: Sequence[dict]) -> float:
    """FLOPs-weighted density of a converted model: ``sum(mean_flops_done) / sum(flops_dense)``
    over the layers of ``DeltaModel.stats()`` (layers without FLOPs or without frames count 0)."""
    done, dense = flops_totals(stats)
    return done / dense if dense > 0 else float("nan")


def element_density(stats: Sequence[dict]) -> float:
    """Element-weighted density of a converted model: each layer's updated output pixels weighted
    by its output elements, ``sum(mean_elements_done) / sum(elements_dense)``."""
    done, dense = cost_totals(stats, "elements")
    return done / dense if dense > 0 else float("nan")


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def primary_output(out) -> Tensor:
    """The tensor a metric compares: the output itself, ``out["out"]`` (torchvision segmentation)
    or the first value of a dict, or the first element of a tuple/list."""
    if torch.is_tensor(out):
        return out
    if isinstance(out, dict):
        return primary_output(out["out"] if "out" in out else next(iter(out.values())))
    if isinstance(out, (tuple, list)):
        return primary_output(out[0])
    raise TypeError(f"primary_output: expected a tensor, dict or tuple output, got {type(out).__name__}")


class OutputPicker:
    """An ``output_fn`` that picks one named output: ``out[name]`` of a dict output, ``out[int(name)]`` of a tuple or
    list (``deltaconv calibrate --output landmarks`` for BlazePose's landmarks instead of its mask); a ``ValueError``
    that lists the names the output has otherwise. A class, not a closure, so that it pickles."""

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __call__(self, out) -> Tensor:
        if isinstance(out, dict) and self.name in out:
            return out[self.name]
        index = int(self.name) if self.name.lstrip("-").isdigit() else None
        if isinstance(out, (tuple, list)) and index is not None and -len(out) <= index < len(out):
            return out[index]
        names = (sorted(out) if isinstance(out, dict) else list(range(len(out))) if isinstance(out, (tuple, list))
                 else "none (a single tensor)")
        raise ValueError(f"output: the model's output has no {self.name!r}; its outputs: {names}")

    def __repr__(self) -> str:
        return f"OutputPicker({self.name!r})"


# ----------------------------------------------------------------------------- running both models
@dataclass
class FidelityReport:
    """What :func:`compare` measured. ``per_frame[metric]``: one value per non-key frame (mean
    over streams); ``density``: FLOPs-weighted density over those frames; ``layers``: the stats."""

    per_frame: dict[str, list[float]] = field(default_factory=dict)
    density: float = float("nan")
    frames: int = 0
    layers: list[dict] = field(default_factory=list)

    def mean(self, metric: str) -> float:
        """Mean of ``metric`` over the compared frames (NaN when none)."""
        v = self.per_frame[metric]
        return sum(v) / len(v) if v else float("nan")

    def max(self, metric: str) -> float:
        """Largest per-frame value of ``metric`` (NaN when no frame)."""
        v = self.per_frame[metric]
        return max(v) if v else float("nan")

    def min(self, metric: str) -> float:
        """Smallest per-frame value of ``metric`` (NaN when no frame)."""
        v = self.per_frame[metric]
        return min(v) if v else float("nan")

    def quantile(self, metric: str, q: float) -> float:
        """The ``q`` quantile (0..1) of the per-frame values of ``metric`` (NaN when no frame)."""
        v = self.per_frame[metric]
        return float(torch.tensor(v, dtype=torch.float64).quantile(q)) if v else float("nan")

    def summary(self) -> dict:
        """``{"density", "frames", "<metric>_mean", "<metric>_max" / "_min", "<metric>_p95"}``."""
        d = {"density": self.density, "frames": self.frames}
        for m in self.per_frame:
            higher = METRICS[m][1] if m in METRICS else False
            d[f"{m}_mean"] = self.mean(m)
            d[f"{m}_min" if higher else f"{m}_max"] = self.min(m) if higher else self.max(m)
            if not higher:
                d[f"{m}_p95"] = self.quantile(m, 0.95)
        return d


def compare(dense: torch.nn.Module, delta: torch.nn.Module, frames: Iterable[Tensor],
            task: str = "classification", metrics: Optional[Sequence[str]] = None,
            dense_outputs: Optional[Sequence[Tensor]] = None, reset: bool = True,
            output_fn: Callable = primary_output, device: Union[str, torch.device, None] = None,
            progress: bool = False) -> FidelityReport:
    """Run ``dense`` and the converted ``delta`` on ``frames`` and measure the converted model.

    Args:
        dense, delta: the dense model and its :class:`~deltaconv.DeltaModel` (same device).
        frames: ``[N, 3, H, W]`` tensors, consecutive frames of N streams.
        task: ``"classification"`` (rel_err, top5, top1) or ``"dense"`` (rel_err, iou).
        metrics: override the metric names (keys of :data:`METRICS`).
        dense_outputs: the dense model's outputs for ``frames``, if already computed.
        reset: start with a key frame (``delta.reset()``).
        output_fn: picks the compared tensor from a model output.
        device: move frames there first.
    """
    if task not in TASK_METRICS and metrics is None:
        raise ValueError(f"compare: task must be one of {sorted(TASK_METRICS)}, got {task!r}")
    names = list(metrics if metrics is not None else TASK_METRICS[task])
    bad = [m for m in names if m not in METRICS]
    if bad:
        raise ValueError(f"compare: unknown metrics {bad}; known: {sorted(METRICS)}")
    report = FidelityReport(per_frame={m: [] for m in names})
    if reset:
        delta.reset()
    it = frames
    if progress:
        try:
            from tqdm.auto import tqdm
            it = tqdm(frames, desc="fidelity", unit="frame")
        except ImportError:
            pass
    with torch.no_grad():
        for i, x in enumerate(it):
            if device is not None:
                x = x.to(device)
            ref = output_fn(dense(x)) if dense_outputs is None else dense_outputs[i]
            y = output_fn(delta(x))
            if i == 0 and reset:
                delta.reset_stats()  # the key frame is dense: leave it out of density and metrics
                continue
            for m in names:
                report.per_frame[m].append(float(METRICS[m][0](y, ref).mean()))
            report.frames += 1
    report.layers = delta.stats()
    report.density = flops_density(report.layers)
    return report


def video_frames(video: str = "vtest.avi", size: Optional[tuple[int, int]] = None,
                 max_frames: Optional[int] = None, start: int = 0, stride: int = 1):
    """Frames of a sample video (by file name, see :func:`deltaconv.video.find_sample_video`) or
    of a video path, as ``[1, 3, h, w]`` ImageNet-normalised tensors; the whole video by default."""
    from pathlib import Path

    from .video import find_sample_video, read_frames

    path = Path(video) if Path(video).is_file() else find_sample_video(video)
    return read_frames(path, max_frames=max_frames, size=size, start=start, stride=stride)


def _main(argv=None) -> None:
    import argparse
    import json

    from . import convert
    from .sparsify import from_spec
    from .weights import mobilenet_v2_imagenet

    p = argparse.ArgumentParser(description="Fidelity and FLOPs density of MobileNetV2 (ImageNet weights) "
                                "converted with deltaconv, against the dense model, over a video.")
    p.add_argument("--video", default="vtest.avi")
    p.add_argument("--size", type=int, nargs=2, default=(288, 384), metavar=("H", "W"))
    p.add_argument("--frames", type=int, default=None, help="at most this many frames (default: whole video)")
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--thresholds", default=None, help="JSON file of per-layer thresholds")
    p.add_argument("--detector", default=None, help="change detector spec as JSON or a type name")
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    model = mobilenet_v2_imagenet().to(a.device)
    det = None
    if a.detector:
        det = from_spec(json.loads(a.detector) if a.detector.startswith("{") else a.detector)
    frames = list(video_frames(a.video, tuple(a.size), a.frames))
    dm = convert(model, threshold=a.threshold, thresholds=a.thresholds, change_detector=det,
                 example_input=frames[0].to(a.device))
    rep = compare(model, dm, frames, device=a.device, progress=True)
    print(json.dumps(rep.summary(), indent=1))


if __name__ == "__main__":
    _main()
