"""A/B of ``convert(fuse=True)`` (the default) against ``fuse=False``, in one process: the residual
add fused into the activation after it, and an output upsampling run dense after the densifier
(the segmentation models' final ``F.interpolate``), against every layer's own pass.

    PYTHONPATH=. python benchmarks/experiments/fuse_ab.py [--models resnet50 fcn_resnet50] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--thresholds 0.02 1e6]

Both variants of each model (fp16, 1080x1920, CUDA-graph replay) run frame by frame in turn on the
same frames (``--start``, ``--frames``; the first two are the key frame and the captured one), the
median ms per frame after ``--warmup`` frames, and the largest output difference (0: the fused
kernel does the same arithmetic; without ``--deterministic`` the 3x3 convs' K-split tail may round
differently from call to call, see the README). Threshold 1e6: nothing is sent after the key frame (the fixed
cost of a frame). Results: ``benchmarks/results/fuse_ab.txt``.
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import add_video_ab_arguments, alternate_frames, converted_under, run_info, video_models  # noqa: E402

VARIANTS = {"fused": True, "separate": False}


def resample_timing() -> None:
    """The output resampling alone, median of 50 calls (CUDA events)."""
    import torch.nn.functional as F
    from common import time_cuda
    from deltaconv.backends import cuda as dc  # loads the extension
    if not dc.is_available():
        raise SystemExit(f"fuse_ab: the CUDA backend is unavailable: {dc.unavailable_reason()}")
    x = torch.randn(1, 21, 135, 240, device="cuda", dtype=torch.float16)
    cl = x.contiguous(memory_format=torch.channels_last)
    calls = {
        "deltaconv resample (channels_last in, NCHW out)":
            lambda: torch.ops.deltaconv.resample(cl, [1080, 1920], None, None, "bilinear", False),
        "F.interpolate, NCHW": lambda: F.interpolate(x, size=(1080, 1920), mode="bilinear", align_corners=False),
        "F.interpolate, channels_last":
            lambda: F.interpolate(cl, size=(1080, 1920), mode="bilinear", align_corners=False),
    }
    for label, fn in calls.items():
        print(f"resample 21x135x240 -> 1080x1920 fp16 bilinear, {label}: {time_cuda(fn) * 1e3:.1f} us", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["resnet50", "fcn_resnet50"])
    add_video_ab_arguments(p, (1080, 1920))
    p.set_defaults(thresholds=[0.02, 1e6])
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True): the 3x3 convs keep their tail in the coarse "
                        "launch, so outputs repeat bit for bit from run to run (and the two variants agree)")
    p.add_argument("--resample-timing", action="store_true",
                   help="first time the output resampling alone: fcn_resnet50's 21 classes from 135x240 to "
                        "1080x1920, fp16 bilinear, deltaconv's resample kernel against F.interpolate")
    a = p.parse_args(argv)
    if a.resample_timing:
        resample_timing()
    if a.deterministic:
        torch.use_deterministic_algorithms(True)
    import deltaconv

    variants = {v: converted_under(convert=functools.partial(deltaconv.convert, fuse=fuse))
                for v, fuse in VARIANTS.items()}
    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}", flush=True)
    for video, name, model, frames in video_models(a.videos, a.models, a.start, a.frames, a.size):
        for t in a.thresholds:
            with torch.no_grad():
                runs = {v: variants[v](model, frames, t) for v in VARIANTS}  # key frame, then the captured frame
                ms, diff = alternate_frames(runs, frames[2:], a.warmup)
            pairs = len(runs["fused"].report.fused) // 2
            dense = sum(n.status == "dense" for n in runs["fused"].report.nodes)
            print(f"== {name} {a.size[0]}x{a.size[1]} fp16 {video} frames {a.start + 2}-{a.start + a.frames - 1} "
                  f"t={t:g}: fused {ms['fused']:.3f} ms  separate {ms['separate']:.3f} ms  "
                  f"({ms['separate'] / ms['fused']:.3f}x, {pairs} pairs, {dense} dense tail)  "
                  f"max |diff| {diff:.3g}", flush=True)
            del runs
        del model, frames
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
