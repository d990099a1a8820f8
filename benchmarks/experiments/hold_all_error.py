"""The error at FLOPs density 0: how far the dense MobileNetV2's logits move after a key frame
(benchmarks/results/density_experiments.txt section 16).

For each sample video, the dense model (``--model``: MobileNetV2 with its ImageNet weights, or CRAFT,
EasyOCR's text detector, with its real weights: its region / affinity map; float32, CPU) on frames START..START+N-1
at H x W; per delta frame k, the relative error of the output (logits, or the map)
  * ``held``: the key frame's logits (START): a delta model that sends nothing after its key frame;
  * ``stale``: the previous frame's logits: one that is one frame late;
  * ``smooth``: the mean of the logits of frames k-2..k+2 (frames with two on each side): an estimate of
    an output that follows the scene's motion but not the frame-to-frame noise;
and the mean, median and 95th percentile of each over the delta frames; then ``cos``, the mean cosine
between consecutive frames' logit changes (-0.5 for changes that are independent noise around a still
output, near 0 for independent steps of a random walk, near 1 for steady motion). The fidelity issue's 2 %
tolerance against ``held`` says what share of the output's motion a delta model may hold back.

    PYTHONPATH=. python benchmarks/experiments/hold_all_error.py --size 1080 1920 --start 200 --frames 24
"""
import argparse
import time

import numpy as np
import torch

from deltaconv.craft import craft_mlt_25k
from deltaconv.fidelity import primary_output, relative_error, video_frames
from deltaconv.weights import mobilenet_v2_imagenet

MODELS = {"mobilenet_v2": mobilenet_v2_imagenet, "craft": craft_mlt_25k}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, nargs=2, default=(1080, 1920), metavar=("H", "W"))
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--model", default="mobilenet_v2", choices=list(MODELS))
    p.add_argument("--videos", nargs="+", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    args = p.parse_args()
    torch.set_num_threads(2)
    model = MODELS[args.model]().eval()
    for video in args.videos:
        t0 = time.time()
        with torch.no_grad():
            outputs = [primary_output(model(f)) for f in video_frames(video, tuple(args.size), args.frames, args.start)]
        held = np.array([float(relative_error(y, outputs[0])) for y in outputs[1:]])
        stale = np.array([float(relative_error(b, a)) for a, b in zip(outputs, outputs[1:])])
        steps = [(b - a).double().flatten() for a, b in zip(outputs, outputs[1:])]
        cos = np.array([float(torch.nn.functional.cosine_similarity(u, v, dim=0)) for u, v in zip(steps, steps[1:])])
        where = f"{args.model} {video:34s}"
        print(f"{where} cos of consecutive output changes: mean {cos.mean():.3f} median {np.median(cos):.3f}")
        smooth = np.array([float(relative_error(torch.stack(outputs[k - 2:k + 3]).mean(0), outputs[k]))
                           for k in range(2, len(outputs) - 2)])
        frames = f"{args.size[0]}x{args.size[1]} frames {args.start}-{args.start + args.frames - 1}"
        for name, e in (("held", held), ("stale", stale), ("smooth", smooth)):
            print(f"{where} {frames} {name:6s} mean {e.mean():.4f} median {np.median(e):.4f} "
                  f"p95 {np.quantile(e, 0.95):.4f} max {e.max():.4f} ({time.time() - t0:.0f} s)")

if __name__ == "__main__":
    main()
