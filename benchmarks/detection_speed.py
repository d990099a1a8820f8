"""Detectors and pose models with a converted backbone (``deltaconv.convert_backbone``) on real video.

torchvision's detection models do not trace whole; their backbone (feature extractor and feature
pyramid) does, and the heads (proposals, ROI pooling, non-maximum suppression) stay dense. This
measures what that buys per frame on a static camera: for each model, window of frames and
threshold, three variants of the same detector run frame by frame in turn on the same frames:

* ``dense``: the dense detector, eager (what a user runs today);
* ``dense_graph``: the dense detector with its backbone replayed as a CUDA graph (the fair
  baseline of the backbone; the heads run eager in every variant);
* ``delta``: the backbone converted (``backend="cuda"``, ``cuda_graph=True``).

Each frame is timed with CUDA events around the whole detector call and around the backbone call;
the medians over the frames after ``--warmup`` go into ``benchmarks/results/detection.csv`` with the
converted backbone's FLOPs density and the relative error of its feature maps (all pyramid levels
together) against the dense backbone's, and, for scale, both backbones' errors against the float32
backbone (TF32 off). The weights are random (no detector weights install
offline): the BatchNorm statistics are re-estimated on the video's frames, so that activations
keep a trained network's scale, but the detections themselves mean nothing, so no task metric is
reported. Frames are upscaled to ``--size`` and the transform keeps that size (``min_size``,
``max_size``). (``benchmarks/results/detection.csv`` also has the columns of heads converted with
the backbone, from this script at commit 4b95272, where ``convert_backbone(heads=...)`` existed:
README, *Detection and pose*.) Run on a CUDA machine with the sample videos reachable::

    PYTHONPATH=. python benchmarks/detection_speed.py [--models ...] [--thresholds 0 0.02] [--starts 0 200]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.nn as nn
from torchvision.models import detection

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, graphed_model, reestimate_batchnorm, run_info, write_csv  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.detection import backbone_input  # noqa: E402
from deltaconv.fidelity import flops_density  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402

MODELS = ["fasterrcnn_mobilenet_v3_large_fpn", "keypointrcnn_resnet50_fpn", "retinanet_resnet50_fpn"]


class TimedBackbone(nn.Module):
    """Wraps a backbone: CUDA events around each call (``last_ms()`` after the frame)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.events = None

    def forward(self, x):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = self.inner(x)
        end.record()
        self.events = (start, end)
        self.features = y
        return y

    def last_ms(self) -> float:
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1])


class GraphedBackbone(nn.Module):
    """A dense backbone replayed as one CUDA graph per call (its output dict is the graph's own)."""

    def __init__(self, backbone, example):
        super().__init__()
        self.run = graphed_model(backbone, example.contiguous(memory_format=torch.channels_last))

    def forward(self, x):
        return self.run(x)


def build(name: str, size, frames) -> nn.Module:
    """The detector with random weights, its transform keeping ``size``, and its BatchNorm statistics
    re-estimated on ``frames`` (one float32 batch through the backbone), in float32 on the GPU."""
    torch.manual_seed(0)
    model = getattr(detection, name)(weights=None, weights_backbone=None, min_size=size[0], max_size=size[1])
    model = model.cuda().eval()
    batch = backbone_input(model, [f[0].cuda() for f in frames])
    reestimate_batchnorm(model.backbone, batch)
    return model.eval()


def feature_error(got: dict, want: dict) -> float:
    num = sum((g.double() - want[k].double()).norm() ** 2 for k, g in got.items())
    den = sum(w.double().norm() ** 2 for w in want.values())
    return float((num / den).sqrt())


def run(name, frames, start, threshold, dtype, warmup, size, video) -> dict:
    images = [[f[0].cuda().to(dtype)] for f in frames]
    dense = build(name, size, frames[:4])
    reference = copy.deepcopy(dense)  # float32, TF32 off: the scale of the float16 rounding
    dense.to(dtype).backbone.to(memory_format=torch.channels_last)
    example = backbone_input(dense, images[0])
    dense_graph = copy.deepcopy(dense)
    dense_graph.backbone = TimedBackbone(GraphedBackbone(dense.backbone, example))
    delta = deltaconv.convert_backbone(dense, images[0], backend="cuda", threshold=threshold, cuda_graph=True,
                                       check_finite=False)
    delta.backbone = TimedBackbone(delta.backbone)
    variants = {"dense": dense, "dense_graph": dense_graph, "delta": delta}
    times = {v: [] for v in variants}
    backbone_times = {"dense_graph": [], "delta": []}
    errors, dense_vs_fp32, delta_vs_fp32 = [], [], []
    with torch.no_grad():
        for i, frame in enumerate(images):
            for v, model in variants.items():
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                model(frame)
                end.record()
                end.synchronize()
                if i >= warmup:
                    times[v].append(begin.elapsed_time(end))
                    if v in backbone_times:
                        backbone_times[v].append(model.backbone.last_ms())
            if i >= warmup:
                exact = reference.backbone(backbone_input(reference, [im.float() for im in frame]))
                errors.append(feature_error(delta.backbone.features, dense_graph.backbone.features))
                dense_vs_fp32.append(feature_error(dense_graph.backbone.features, exact))
                delta_vs_fp32.append(feature_error(delta.backbone.features, exact))
            if i == warmup - 1:
                delta.backbone.inner.reset_stats()
    med = {v: statistics.median(t) for v, t in times.items()}
    bb = {v: statistics.median(t) for v, t in backbone_times.items()}
    dm = delta.backbone.inner
    return {"model": name, "video": video.name, "start": start, "frames": len(frames) - warmup,
            "resolution": f"{size[0]}x{size[1]}", "backbone_input": "x".join(map(str, example.shape[-2:])),
            "dtype": str(dtype).replace("torch.", ""), "threshold": threshold,
            "dense_ms": med["dense"], "dense_graph_ms": med["dense_graph"], "delta_ms": med["delta"],
            "speedup_vs_dense_graph": med["dense_graph"] / med["delta"],
            "backbone_dense_graph_ms": bb["dense_graph"], "backbone_delta_ms": bb["delta"],
            "backbone_speedup": bb["dense_graph"] / bb["delta"],
            "outside_backbone_ms": med["dense_graph"] - bb["dense_graph"],
            "feature_rel_err": statistics.fmean(errors), "feature_rel_err_max": max(errors),
            "dense_feature_err_vs_fp32": statistics.fmean(dense_vs_fp32),
            "delta_feature_err_vs_fp32": statistics.fmean(delta_vs_fp32),
            "flops_density": flops_density(dm.stats()), **run_info()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--video", default="one-by-one-person-detection.mp4")
    p.add_argument("--size", nargs=2, type=int, default=[1080, 1920], metavar=("H", "W"))
    p.add_argument("--starts", nargs="+", type=int, default=[0, 200], help="first frame of each window")
    p.add_argument("--frames", type=int, default=40, help="frames per window, warm-up included")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--thresholds", nargs="+", type=float, default=[0.0, 0.02])
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    p.add_argument("--out", type=Path, default=RESULTS / "detection.csv")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("detection_speed.py: needs a CUDA GPU")
    if a.frames <= a.warmup:
        sys.exit(f"detection_speed.py: --frames must exceed --warmup, got {a.frames} and {a.warmup}")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # the float32 reference
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, a.dtype)
    video = find_sample_video(a.video)
    rows = []
    for start in a.starts:
        frames = list(read_frames(video, max_frames=a.frames, size=tuple(a.size), normalize=False, start=start))
        for name in a.models:
            for t in a.thresholds:
                try:
                    row = run(name, frames, start, t, dtype, a.warmup, tuple(a.size), video)
                except Exception as error:  # one model failing (say, a head without float16) keeps the others
                    print(f"{name} frames {start}- t={t}: failed: {type(error).__name__}: {error}", flush=True)
                    traceback.print_exc()
                    continue
                rows.append(row)
                print(f"{name} frames {start}-{start + a.frames - 1} t={t}: dense {row['dense_ms']:.2f} ms, "
                      f"dense+graph backbone {row['dense_graph_ms']:.2f} ms (backbone "
                      f"{row['backbone_dense_graph_ms']:.2f}), delta {row['delta_ms']:.2f} ms (backbone "
                      f"{row['backbone_delta_ms']:.2f}, {row['backbone_speedup']:.2f}x): "
                      f"{row['speedup_vs_dense_graph']:.2f}x per frame; feature error "
                      f"{row['feature_rel_err']:.2e} (dense {row['dense_feature_err_vs_fp32']:.2e} / delta "
                      f"{row['delta_feature_err_vs_fp32']:.2e} off float32), FLOPs density "
                      f"{row['flops_density']:.3f}", flush=True)
                write_csv(a.out, rows)
    if not rows:
        sys.exit("detection_speed.py: every configuration failed")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
