# An experiment, not a maintained tool. Run from the repository root:
#   PYTHONPATH=. python benchmarks/experiments/hybrid_models.py --help
"""Experiment: the ``truncation="hybrid"`` preset against per-pixel ``"rms"`` on the real-weight models.

MobileNetV2 (ImageNet, logit relative error) and CRAFT (EasyOCR's VGG16-BN U-Net text detector,
relative error of its region/affinity map), each converted with the library's truncation at
uniform thresholds (reference backend, float32), on consecutive frames of a sample video. Density
is FLOPs-weighted; the key frame is excluded. Whether pooling the layers at stride 4 and coarser
lowers the density at the same error beyond the model it was chosen on.
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from deltaconv.craft import craft_mlt_25k  # noqa: E402
from deltaconv.fidelity import primary_output, video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import summary, uniform_run  # noqa: E402

MODELS = {"mobilenet_v2": (mobilenet_v2_imagenet, "classification"), "craft": (craft_mlt_25k, "dense")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--video", default="vtest.avi")
    p.add_argument("--size", type=int, nargs=2, default=(288, 512))
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--truncations", nargs="+", default=["rms", "hybrid"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--t-in", type=float, default=0.01, help="input sparsifier threshold")
    p.add_argument("--ts", type=float, nargs="+", default=[0.002, 0.004])
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # float32 as on the CPU
    frames = [x.to(a.device) for x in video_frames(a.video, tuple(a.size), a.frames, a.start)]
    for name in a.models:
        build, task = MODELS[name]
        model = build().eval().to(a.device)
        with torch.no_grad():
            dense = [primary_output(model(x)) for x in frames]
        for truncation in a.truncations:
            for t in a.ts:
                rep, seconds = uniform_run(model, frames, dense, t, a.t_in, truncation, task)
                print(f"{name} {a.video} {a.size[0]}x{a.size[1]} frames {a.start}-{a.start + a.frames - 1} "
                      f"{truncation} t_in={a.t_in:g} t={t:g}: {summary(rep, seconds)}", flush=True)


if __name__ == "__main__":
    main()
