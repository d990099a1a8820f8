# An experiment, not a maintained tool (it patches deltaconv.backends.reference.exceeds). Run from
# the repository root: PYTHONPATH=. python benchmarks/experiments/gram_truncation.py --help
"""Experiment: measure a pending change by what it does to the next layer (MobileNetV2, reference backend).

Per-pixel truncation (``rms``) sends a pixel when ``sqrt(mean_c d_c^2) > t``, with ``d`` the pixel's
pending change over the activation's ``C`` channels. What reaches the rest of the network is what the
consumer (the next convolution, its BatchNorm folded in) makes of it: a pixel's change ``d`` adds
``W_k d`` to the output at tap ``k``, of squared size ``d^T G d`` with ``G = sum_k W_k^T W_k``
(``C x C``; diagonal for a depthwise consumer). The "gram" measure is

    sqrt(d^T G d / C) with G scaled so that trace(G) = C    (= rms when d is isotropic)

For a projection 1x1 convolution (6C -> C) ``G`` has rank C: changes in its null space (a random
pending change is mostly there) do not reach the next layer and stop counting. ``--rank r`` keeps
the top ``r`` eigenvectors of ``G`` (a measure a kernel could afford: ``r`` dot products per pixel).
``--measure pooled-gram`` applies it to the 3x3 box average of the signed change (the pooled measure's
window) with the pooled measure's peak guard. The values sent stay exact, the rest pending; FLOPs
density and mean logit relative error against the dense model, key frame excluded.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/experiments")
import deltaconv  # noqa: E402
from deltaconv.backends import reference as R  # noqa: E402
from deltaconv.fidelity import compare, video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import clip_arguments, summary  # noqa: E402

_exceeds = R.exceeds
CURRENT = {"basis": None, "mode": "gram"}


def gram_exceeds(change, threshold, measure="max"):
    """``R.exceeds`` with the consumer-weighted measure where the current layer has a basis."""
    basis = CURRENT["basis"]
    if basis is None or change.dim() != 4 or measure != "rms":
        return _exceeds(change, threshold, measure)
    c = change.float()
    pixel_rms = c.square().mean(dim=1, keepdim=True).sqrt()
    src = c
    if CURRENT["mode"] == "pooled-gram":
        src = F.avg_pool2d(c, R.POOL_SIZE, 1, R.POOL_SIZE // 2, count_include_pad=False)
    # basis [r, C]: rows sqrt(lambda_i) u_i^T (scaled so that the full sum of lambda_i is C)
    proj = torch.einsum("rc,nchw->nrhw", basis, src)
    m = proj.square().sum(dim=1, keepdim=True).div(c.shape[1]).sqrt()
    if CURRENT["mode"] == "pooled-gram":
        return (m > threshold) | (pixel_rms > R.POOL_PEAK * threshold)
    return m > threshold


R.exceeds = gram_exceeds


def folded(conv: nn.Conv2d, bn) -> torch.Tensor:
    """``conv``'s weight with the eval BatchNorm ``bn``'s scale folded in (``[Co, Ci/g, k, k]``)."""
    w = conv.weight.detach().double()
    if bn is not None:
        w = w * (bn.weight.detach().double() / (bn.running_var.double() + bn.eps).sqrt()).view(-1, 1, 1, 1)
    return w


def gram(w: torch.Tensor, groups: int, channels: int) -> torch.Tensor:
    """``sum_k W_k^T W_k`` over the taps of a conv weight ``w`` (``[channels, channels]``)."""
    if groups == 1:
        wk = w.permute(2, 3, 0, 1).reshape(-1, w.shape[0], w.shape[1])  # [taps, Co, Ci]
        return torch.einsum("koc,kod->cd", wk, wk)
    assert groups == channels == w.shape[0], "only depthwise grouped consumers"
    return torch.diag(w.square().sum(dim=(1, 2, 3)))


def consumers(model) -> dict:
    """Activation name -> ``G`` of its consumer for torchvision's MobileNetV2 (BatchNorms folded)."""
    out = {"features.0.2": (model.features[1].conv[0][0], model.features[1].conv[0][1])}
    for i in range(1, 18):
        conv = model.features[i].conv
        if i == 1:  # dw -> project
            out["features.1.conv.0.2"] = (conv[1], conv[2])
            continue
        out[f"features.{i}.conv.0.2"] = (conv[1][0], conv[1][1])
        out[f"features.{i}.conv.1.2"] = (conv[2], conv[3])
    grams = {}
    for name, (cv, bn) in out.items():
        grams[name] = gram(folded(cv, bn), cv.groups, cv.in_channels)
    lin = model.classifier[1].weight.detach().double()
    grams["features.18.2"] = lin.T @ lin
    return grams


def bases(grams: dict, rank: int) -> dict:
    """Name -> ``[r, C]`` float32 rows ``sqrt(lambda_i) u_i^T`` of ``G`` scaled to trace C (``r`` = ``rank``,
    0: all)."""
    out = {}
    for name, g in grams.items():
        c = g.shape[0]
        g = g * (c / torch.trace(g))
        lam, u = torch.linalg.eigh(g)
        lam, u = lam.flip(0).clamp_min(0), u.flip(1)
        r = c if rank <= 0 else min(rank, c)
        out[name] = (lam[:r].sqrt().unsqueeze(1) * u[:, :r].T).float()
    return out


def run(model, frames, dense, t, t_in, basis_of, layers):
    dm = deltaconv.convert(model, threshold=t, truncation="rms", backend="reference", example_input=frames[0])
    dm.load_thresholds({dm.delta_layers()[0].layer_name: t_in})
    hooked = 0
    for layer in dm.delta_layers():
        b = basis_of.get(layer.layer_name)
        if b is None or (layers and layer.layer_name not in layers):
            continue
        layer.register_forward_pre_hook(lambda mod, args, b=b.to(frames[0].device): CURRENT.__setitem__("basis", b))
        layer.register_forward_hook(lambda mod, args, out: CURRENT.__setitem__("basis", None))
        hooked += 1
    start = time.time()
    rep = compare(model, dm, frames, dense_outputs=dense)
    return rep, time.time() - start, hooked


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    clip_arguments(p, (540, 960), 12)
    p.add_argument("--device", default="cpu")
    p.add_argument("--t-in", type=float, default=0.01)
    p.add_argument("--ts", type=float, nargs="+", default=[0.004])
    p.add_argument("--measure", choices=("rms", "gram", "pooled-gram"), default="gram")
    p.add_argument("--rank", type=int, default=0, help="eigenvectors of G kept (0: all)")
    p.add_argument("--only", choices=("all", "project", "depthwise"), default="all",
                   help="which activations get the measure: those feeding a projection 1x1 (and the head), "
                        "those feeding a depthwise conv, or all")
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model = mobilenet_v2_imagenet().eval().to(a.device)
    CURRENT["mode"] = a.measure
    basis_of = {} if a.measure == "rms" else bases(consumers(model.cpu()), a.rank)
    model.to(a.device)
    dw = {n for n in basis_of if n.endswith("conv.0.2") and n != "features.1.conv.0.2"} | {"features.0.2"}
    layers = {"all": set(), "depthwise": dw, "project": set(basis_of) - dw}[a.only]
    for video in a.videos:
        frames = [x.to(a.device) for x in video_frames(video, tuple(a.size), a.frames, a.start)]
        with torch.no_grad():
            dense = [model(x) for x in frames]
        for t in a.ts:
            rep, seconds, n = run(model, frames, dense, t, a.t_in, basis_of, layers)
            print(f"{video} {a.size[0]}x{a.size[1]} frames {a.start}-{a.start + a.frames - 1} {a.measure} "
                  f"rank {a.rank} only {a.only} t={t:g} ({n} layers): {summary(rep, seconds)}", flush=True)


if __name__ == "__main__":
    main()
