# An experiment, not a maintained tool (it patches deltaconv.backends.reference.exceeds). Run from the repository
# root: PYTHONPATH=. python benchmarks/experiments/pooled_sketch.py --help
"""Experiment: the pooled truncation measure from a few projections of each pixel's change (a sketch), against the
exact measure (``truncation="pooled"``, reference backend).

The pooled measure (``reference.exceeds``) averages each channel's signed pending change over the 3x3 window
around a pixel and takes the rms over channels: ``pooled(x) = ||box(change)(x)|| / sqrt(C)``. On the GPU its second
pass reads all C channels of every neighbour of every active pixel (``pooled_send_kernel``, about 1 ms per
MobileNetV2 frame at 1080p, more than the convolutions save: ``benchmarks/results/density_experiments.txt``
section 5a). The box filter is linear, so for fixed vectors ``r_j`` of C random signs
``r_j . box(change) = box(r_j . change)``, and ``E[(r_j . v)^2] = ||v||^2``. The sketch: the first pass writes
``k`` scalars per pixel, ``p_j = r_j . change``, and the measure becomes

    pooled_k(x) = sqrt(mean_j box(p_j)(x)^2 / C)

(``k`` reads per neighbour instead of C), with the same peak guard (the pixel's own exact rms against
``POOL_PEAK`` times the threshold). Its estimate of the squared norm has a relative spread of sqrt(2 / k). This
measures what that spread costs: FLOPs density and logit error of MobileNetV2 at the same thresholds, exact
against sketched. The values sent stay exact either way; only the choice of pixels changes.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from deltaconv.backends import reference as R  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import clip_arguments, clips, summary, uniform_run  # noqa: E402

#: projections per pixel (0: the exact measure)
SKETCH = {"k": 0, "seed": 0}
_exceeds = R.exceeds
_signs: dict = {}


def signs(channels: int, k: int, device) -> torch.Tensor:
    """``[k, C]`` fixed random signs (one set per channel count, seeded by it and ``--seed``), float32."""
    key = (channels, k, SKETCH["seed"], str(device))
    if key not in _signs:
        g = torch.Generator().manual_seed(1000 * (SKETCH["seed"] + 1) + channels)
        _signs[key] = (torch.randint(0, 2, (k, channels), generator=g) * 2 - 1).float().to(device)
    return _signs[key]


def sketched_exceeds(change, threshold, measure="max"):
    k = SKETCH["k"]
    if k <= 0 or measure != "pooled" or change.dim() != 4:
        return _exceeds(change, threshold, measure)
    c = change.float()
    channels = c.shape[1]
    pixel_rms = c.square().mean(dim=1, keepdim=True).sqrt()
    p = torch.einsum("nchw,kc->nkhw", c, signs(channels, k, c.device))  # the first pass's k scalars per pixel
    box = F.avg_pool2d(p, R.POOL_SIZE, 1, R.POOL_SIZE // 2, count_include_pad=False)
    pooled = (box.square().mean(dim=1, keepdim=True) / channels).sqrt()
    return (pooled > threshold) | (pixel_rms > R.POOL_PEAK * threshold)


R.exceeds = sketched_exceeds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    clip_arguments(p, (540, 960), 12)
    p.add_argument("--ks", type=int, nargs="+", default=[0, 4, 8, 16], help="projections (0: the exact measure)")
    p.add_argument("--t-in", type=float, default=0.01, help="input sparsifier threshold")
    p.add_argument("--ts", type=float, nargs="+", default=[0.004])
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="draws of the signs (0: section 18's)")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    model = mobilenet_v2_imagenet().eval().to(a.device)
    for video, frames, dense in clips(model, a, a.device):
        for t in a.ts:
            for k in a.ks:
                for seed in a.seeds if k else [0]:
                    SKETCH.update(k=k, seed=seed)
                    rep, seconds = uniform_run(model, frames, dense, t, a.t_in, truncation="pooled")
                    print(f"{video} {a.size[0]}x{a.size[1]} frames {a.start}-{a.start + a.frames - 1} pooled "
                          f"{'exact' if k == 0 else f'sketch k={k} seed {seed}'} t_in={a.t_in:g} t={t:g}: "
                          f"{summary(rep, seconds)}", flush=True)


if __name__ == "__main__":
    main()
