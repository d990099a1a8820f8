"""A/B of bicubic resampling's delta rule (``DCUpsample`` in mode ``"bicubic"``: the delta resampled by
torch's op, the mask by the footprint of its 4x4 taps: "delta") against the dense fallback it was
before ("fallback": ``"bicubic"`` left out of ``DCUpsample.MODES`` while converting), in one process,
with the dense model replayed as a CUDA graph as the baseline.

    PYTHONPATH=. python benchmarks/experiments/bicubic_ab.py [--size 1080 1920] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--thresholds 0.02] [--frames 24] [--start 200]

The model (random weights): an encoder to a quarter of the frame (3x3 convolutions of stride 2, 3 -> 32
-> 64 channels, ReLU), a 3x3 convolution, ``nn.Upsample(scale_factor=4, mode="bicubic")`` back to the
frame's size, ReLU and a 3x3 convolution to 2 channels. Float16, CUDA-graph replay, the variants frame by
frame in turn on the same frames.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import add_video_ab_arguments, compare_variants_on_videos, converted_under, patched  # noqa: E402


def decoder_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(64, 16, 3, padding=1),
                         nn.Upsample(scale_factor=4, mode="bicubic"), nn.ReLU(), nn.Conv2d(16, 2, 3, padding=1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_video_ab_arguments(p, (1080, 1920))
    p.add_argument("--order", nargs="+", default=["delta", "fallback"], choices=["delta", "fallback"])
    a = p.parse_args(argv)
    from deltaconv.modules import DCUpsample

    without = tuple(m for m in DCUpsample.MODES if m != "bicubic")  # the dense fallback it was
    variants = {"delta": converted_under(), "fallback": converted_under(lambda: patched(DCUpsample, "MODES", without))}
    label = f"decoder {a.size[0]}x{a.size[1]} bicubic x4"
    compare_variants_on_videos(a, {label: lambda cpu: decoder_model()}, variants)


if __name__ == "__main__":
    main()
