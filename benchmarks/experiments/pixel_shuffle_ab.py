"""A/B of the pixel shuffle's own path in ``DCLinearFunction`` (values moved in one channels-last copy,
the mask repeated: "moves") against the general path of a linear function ("general": the shuffle of
the masked values and of the masks expanded to the values' shape, then a mask reduction), in one
process, with the dense model replayed as a CUDA graph as the baseline.

    PYTHONPATH=. python benchmarks/experiments/pixel_shuffle_ab.py [--size 540 960] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--thresholds 0.02] [--frames 24] [--start 200]

The model (random weights): a super-resolution upsampler of the ESRGAN kind on a frame of ``--size``:
3x3 convolutions 3 -> 64 -> 64 (ReLU), 64 -> 256, ``nn.PixelShuffle(2)`` to 64 channels at twice the
size, ReLU, a 3x3 convolution to 3 channels. Float16, CUDA-graph replay, the variants frame by frame in
turn on the same frames.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import add_video_ab_arguments, compare_variants_on_videos, converted_under, patched  # noqa: E402


def upsampler(width: int = 64, factor: int = 2) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.Conv2d(width, width * factor * factor, 3, padding=1),
                         nn.PixelShuffle(factor), nn.ReLU(), nn.Conv2d(width, 3, 3, padding=1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_video_ab_arguments(p, (540, 960))
    p.add_argument("--order", nargs="+", default=["moves", "general"], choices=["moves", "general"])
    a = p.parse_args(argv)
    from deltaconv.modules import DCLinearFunction

    # the general path: the class's own path turned off while converting and capturing
    variants = {"moves": converted_under(),
                "general": converted_under(lambda: patched(DCLinearFunction, "_pixel_shuffle",
                                                           lambda self, args, kwargs: None))}
    compare_variants_on_videos(a, {f"upsampler {a.size[0]}x{a.size[1]} -> x2": lambda cpu: upsampler()}, variants)


if __name__ == "__main__":
    main()
