"""How the rounding of BatchNorm-folded weights moves a float16 model's output (an experiment).

Dense MobileNetV2 (ImageNet weights) in float64 with the BatchNorms folded (``torch.fx``'s
``fuse``), on frames of a sample video, against the unfolded float64 model: the logit relative
error when only the weights are rounded to float16 and everything else stays exact. So it isolates
what the rounding of the folded weights costs, without the activations' rounding:

1. every conv's weights rounded: the unfolded model's weights to nearest, the folded weights to
   nearest, and the folded weights by ``round_keeping_sums`` (each filter's sum kept close);
2. each folded conv alone rounded to nearest: the layers that move the logits by more than 1e-3;
3. the most sensitive layer alone, over random roundings (each weight scaled by ``1 + u`` with
   ``|u| <= 2^-11`` before rounding to nearest): how much the error depends on which way its
   weights happen to round, folded and unfolded.

    PYTHONPATH=. python benchmarks/experiments/fold_rounding.py --size 64 96 --frames 6

Results: ``benchmarks/results/fp16_floor.txt`` (section 4).
"""
from __future__ import annotations

import argparse
import statistics

import torch
from torch.fx.experimental.optimization import fuse

from deltaconv.fidelity import relative_error, video_frames
from deltaconv.modules.folding import round_keeping_sums
from deltaconv.weights import mobilenet_v2_imagenet


def convs(model) -> dict:
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}


def rounded(fused: bool, how, only=None):
    """MobileNetV2 in float64 (BatchNorm folded if ``fused``) with the weights of ``only`` (default:
    every conv) replaced by ``how(weight)``."""
    model = mobilenet_v2_imagenet().double().eval()
    model = fuse(model) if fused else model
    for name, conv in convs(model).items():
        if only is None or name == only:
            conv.weight.data = how(conv.weight.data)
    return model


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--video", default="one-by-one-person-detection.mp4")
    p.add_argument("--size", type=int, nargs=2, default=[64, 96])
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--trials", type=int, default=6)
    a = p.parse_args(argv)
    frames = [f.double() for f in video_frames(a.video, tuple(a.size), a.frames)]
    exact = mobilenet_v2_imagenet().double().eval()
    with torch.no_grad():
        refs = [exact(f) for f in frames]

    def error(model) -> float:
        with torch.no_grad():
            return statistics.fmean(float(relative_error(model(f), r)) for f, r in zip(frames, refs))

    def nearest(w):
        return w.half().double()

    def keeping_sums(w):
        return round_keeping_sums(w, torch.float16).double()

    print(f"{a.video}, {len(frames)} frames at {a.size[0]}x{a.size[1]}; logit relative error against the "
          f"float64 model, only the weights rounded to float16:")
    print(f"1. unfolded, to nearest: {error(rounded(False, nearest)):.2e}; folded, to nearest: "
          f"{error(rounded(True, nearest)):.2e}; folded, keeping sums: {error(rounded(True, keeping_sums)):.2e}")
    print("2. one folded conv rounded to nearest (the others exact), where the error exceeds 1e-3:")
    worst = None
    for name in convs(fuse(mobilenet_v2_imagenet().double().eval())):
        e = error(rounded(True, nearest, only=name))
        if e > 1e-3:
            print(f"   {name:<24} {e:.2e}  (keeping sums: {error(rounded(True, keeping_sums, only=name)):.2e})")
        worst = max(worst or (e, name), (e, name))
    name = worst[1]
    gen = torch.Generator().manual_seed(0)

    def jittered(w):
        return (w * (1 + (torch.rand(w.shape, generator=gen, dtype=w.dtype) - 0.5) * 2 ** -10)).half().double()

    for fused in (True, False):
        errs = [error(rounded(fused, jittered, only=name)) for _ in range(a.trials)]
        print(f"3. {name} alone, {'folded' if fused else 'unfolded'}, {a.trials} random roundings: "
              + " ".join(f"{e:.2e}" for e in errs)
              + f"; to nearest: {error(rounded(fused, nearest, only=name)):.2e}")


if __name__ == "__main__":
    main()
