# An experiment, not a maintained tool (it patches deltaconv.backends.reference.exceeds). Run from
# the repository root: PYTHONPATH=. python benchmarks/experiments/pooled_truncation.py --help
"""Experiment: a spatially pooled truncation measure in the non-linear layers (reference backend, CPU or GPU).

Per-pixel truncation (``rms``: ``sqrt(mean_c change^2) > t``) treats a pixel's pending change alone.
What reaches a classifier's logits is a weighted sum over pixels, so pending changes of random sign
(codec noise spread through the network) partly cancel, while a coherent change (an object moving)
does not. The pooled measure averages the *signed* change of each channel over a ``k x k`` window
before taking the rms over channels:

    pooled(x) = sqrt(mean_c box_k(change_c)(x)^2)
    measure   = max(pooled, pixel_rms / peak)        (a large change of one pixel still goes out)
    measure   = min(measure, pixel_rms / gate)       (gate > 0: a pixel must carry some change itself)

and sends the exact change where the measure exceeds the layer's threshold; the rest stays pending
(the reference backend's truncation, unchanged). Density is FLOPs-weighted, error the mean logit
relative error against the dense model, key frame excluded.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from deltaconv.backends import reference as R  # noqa: E402
from deltaconv.fidelity import video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import clip_arguments, summary, uniform_run  # noqa: E402

CFG = {"k": 0}
_exceeds = R.exceeds


def pooled_exceeds(change, threshold, measure="max"):
    k = CFG["k"]
    strides = CFG.get("strides")
    if strides and change.dim() == 4 and round(CFG["height"] / change.shape[-2]) not in strides:
        # a layer at a stride not pooled: per pixel, at its own threshold (or --t-other)
        return _exceeds(change, CFG["t_other"] if CFG["t_other"] is not None else threshold, measure)
    if k <= 1 or measure != "rms" or change.dim() != 4 or min(change.shape[-2:]) < k:
        return _exceeds(change, threshold, measure)
    c = change.float()
    pixel = c.square().mean(dim=1, keepdim=True).sqrt()
    box = F.avg_pool2d(c, k, 1, k // 2, count_include_pad=False)
    pooled = box.square().mean(dim=1, keepdim=True).sqrt() * CFG["gain"]
    m = torch.maximum(pooled, pixel / CFG["peak"])
    if CFG["gate"] > 0:
        m = torch.minimum(m, pixel / CFG["gate"])
    return m > threshold


R.exceeds = pooled_exceeds


def configure(spec: str, **rest) -> tuple[int, float, float, float]:
    """Set the measure from ``"k:gain:peak:gate"`` (and ``rest``: height, strides, t_other); returns them."""
    k, gain, peak, gate = (float(v) for v in spec.split(":"))
    CFG.update(k=int(k), gain=gain, peak=peak, gate=gate, **rest)
    return int(k), gain, peak, gate


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    clip_arguments(p, (540, 960), 12)
    p.add_argument("--configs", nargs="+", default=["3:1:4:0"],
                   help="k:gain:peak:gate per run (k 0 or 1: the per-pixel rms measure)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--pool-strides", type=int, nargs="*", default=[],
                   help="pool only the layers at these strides (of the input); the others per pixel at --t-other")
    p.add_argument("--t-other", type=float, default=None, help="threshold of the layers not pooled (default: t)")
    p.add_argument("--t-in", type=float, default=0.01, help="input sparsifier threshold")
    p.add_argument("--ts", type=float, nargs="+", default=[0.004])
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # float32 as on the CPU
    CFG.update(height=a.size[0], strides=set(a.pool_strides), t_other=a.t_other)
    only = f" pooled at strides {sorted(a.pool_strides)}, others t={a.t_other}" if a.pool_strides else ""
    model = mobilenet_v2_imagenet().eval().to(a.device)
    for video in a.videos:
        frames = [x.to(a.device) for x in video_frames(video, tuple(a.size), a.frames, a.start)]
        with torch.no_grad():
            dense = [model(x) for x in frames]
        for config in a.configs:
            k, gain, peak, gate = configure(config)
            for t in a.ts:
                rep, seconds = uniform_run(model, frames, dense, t, a.t_in)
                print(f"{video} {a.size[0]}x{a.size[1]} frames {a.start}-{a.start + a.frames - 1} k={k} "
                      f"gain={gain:g} peak={peak:g} gate={gate:g} t_in={a.t_in:g} t={t:g}{only}: "
                      f"{summary(rep, seconds)}", flush=True)


if __name__ == "__main__":
    main()
