# An experiment, not a maintained tool (it patches deltaconv.backends.reference.truncate). Run from
# the repository root: PYTHONPATH=. python benchmarks/experiments/damped_send.py --help
"""Experiment: damped sends of small changes in the non-linear layers (reference backend, CPU or GPU).

A pixel sent with its exact pending change resets what downstream holds to the current value,
codec noise included: for noise of standard deviation s around a still value, what is held back
afterwards has variance 2 s^2 (the new noise less the noise sent), so the pixel is soon over the
threshold again. Sending only ``alpha`` of a small change (a pixel whose own rms is at most ``K``
times the threshold) makes what downstream holds an average of the samples sent, nearer the still
value: less is held back on later frames and fewer pixels go out. What is not sent stays pending
(the bookkeeping is the library's: ``sent`` holds what went out), so nothing drifts; key frames and
large changes (own rms over K t) go out whole. Density is FLOPs-weighted, error the mean logit
relative error against the dense model, key frame excluded.
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from deltaconv.backends import reference as R  # noqa: E402
from deltaconv.fidelity import video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import clip_arguments, summary, uniform_run  # noqa: E402

CFG = {"alpha": 1.0, "K": 0.0}


def damped_truncate(y, region, sent, threshold, key, out_dtype, measure="max", tf32=False):
    target = R._target(y, sent)
    zero = torch.zeros((), dtype=target.dtype, device=y.device)
    change = torch.where(region, target - sent.to(target.dtype), zero)
    out_mask = region & R.exceeds(change, threshold, measure)
    whole = torch.zeros_like(out_mask)
    k = R._key_view(key, out_mask.dim())
    if k is not None:
        whole = k & region
        out_mask = out_mask | whole
    if CFG["alpha"] < 1 and change.dim() >= 2:
        rms = change.square().mean(dim=1, keepdim=True).sqrt()
        small = out_mask & ~whole & (rms <= CFG["K"] * threshold)
        part = torch.where(small, change * CFG["alpha"], change)
        target = torch.where(small, sent.to(target.dtype) + part, target)
        change = part
    return R._send(target, sent, change, out_mask, out_dtype, R._check_tf32(tf32, out_dtype)), out_mask


R.truncate = damped_truncate


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    clip_arguments(p, (540, 960), 24)
    p.add_argument("--configs", nargs="+", default=["1:0", "0.5:4"], help="alpha:K per run (alpha 1: exact sends)")
    p.add_argument("--truncation", default="rms", help="the library's truncation (rms, pooled, hybrid)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--t-in", type=float, default=0.01, help="input sparsifier threshold")
    p.add_argument("--ts", type=float, nargs="+", default=[0.004])
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # float32 as on the CPU
    model = mobilenet_v2_imagenet().eval().to(a.device)
    for video in a.videos:
        frames = [x.to(a.device) for x in video_frames(video, tuple(a.size), a.frames, a.start)]
        with torch.no_grad():
            dense = [model(x) for x in frames]
        for config in a.configs:
            alpha, K = (float(v) for v in config.split(":"))
            CFG.update(alpha=alpha, K=K)
            for t in a.ts:
                rep, seconds = uniform_run(model, frames, dense, t, a.t_in, a.truncation)
                print(f"{video} {a.size[0]}x{a.size[1]} frames {a.start}-{a.start + a.frames - 1} "
                      f"{a.truncation} alpha={alpha:g} K={K:g} t_in={a.t_in:g} t={t:g}: {summary(rep, seconds)}",
                      flush=True)


if __name__ == "__main__":
    main()
