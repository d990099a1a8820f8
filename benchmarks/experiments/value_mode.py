# An experiment, not a maintained tool. Run from the repository root:
#   PYTHONPATH=. python benchmarks/experiments/value_mode.py --help
"""Experiment: "value mode" against the library's delta mode, in fidelity and FLOPs density.

Delta mode (the library): between layers flow changes; every non-linear layer accumulates its input
changes in a float32 accumulator ``A`` (rounded deltas summed: in float16 the rounding drifts) and
sends ``f(A) - S`` where the truncation measure allows.

Value mode (not in the library): every tensor between layers is kept whole (the sent output ``S`` of
a non-linear layer, the output of a linear layer), and a convolution recomputes its output on the
active pixels from its input's whole values, bias included: exactly what the dense model computes
from the sent values. A non-linear layer needs no accumulator, only ``S``: it computes ``f(x)`` from
the recomputed input ``x`` and sends where ``measure(f(x) - S)`` exceeds its threshold. The
convolutions do the same work (the same active pixels), the activations' float32 state traffic is
gone, and nothing drifts.

Its outputs equal those of the dense model whose non-linear layers output their ``S`` (a pixel's
value is recomputed where its inputs changed and unchanged elsewhere, where recomputing would give the
same), so this script emulates it that way: the dense model, each truncating layer (the names of
``DeltaModel.thresholds()``) replaced by a module that keeps ``S``, and the input by a sparsifier
that keeps the sent frame. FLOPs density is counted by hooks as the library counts it: a convolution
(or linear layer) is active on the output pixels whose window holds an input pixel that changed, an
activation on the pixels whose input changed.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, ".")
import deltaconv  # noqa: E402
from deltaconv.fidelity import compare, relative_error, video_frames  # noqa: E402
from deltaconv.modules.folding import FoldedWeights  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import clip_arguments  # noqa: E402


def changed_pixels(x: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """``[N, 1, ...]`` bool: the pixels where any channel of ``x`` differs from ``prev``."""
    return (x != prev).any(dim=1, keepdim=True)


class Truncating(nn.Module):
    """A pointwise non-linearity in value mode: keeps what it sent (``S``) and sends ``f(x)`` on the
    pixels whose input changed and whose change ``f(x) - S`` has an rms over channels above the
    threshold."""

    def __init__(self, fn: nn.Module, threshold: float, measure: str = "rms"):
        super().__init__()
        self.fn, self.threshold, self.measure = fn, threshold, measure
        self.sent = self.prev = None
        self.flops = [0.0, 0.0]  # done, dense (per frame, summed over frames after the key frame)

    def forward(self, x):
        y = self.fn(x)
        if self.sent is None or self.sent.shape != y.shape:
            # one memory format on every frame: another one picks other kernels, whose rounding
            # changes every pixel once
            self.sent, self.prev = y.contiguous().clone(), x.clone()
            return self.sent
        region = changed_pixels(x, self.prev)
        self.prev = x.clone()
        change = y.float() - self.sent.float()
        size = change.abs().amax(1, keepdim=True) if self.measure == "max" else change.square().mean(1, keepdim=True).sqrt()
        send = region & (size > self.threshold)
        self.sent = torch.where(send, y, self.sent).contiguous()
        pixels = region[:, 0].numel()
        self.flops[0] += float(send.sum()) * y.shape[1]  # as the library: the pixels sent
        self.flops[1] += float(pixels) * y.shape[1]
        return self.sent


class InputSparsifier(nn.Module):
    """The input in value mode: sends the frame's pixels whose largest channel change exceeds the
    threshold (the library's per-pixel input measure) and passes the sent frame on."""

    def __init__(self, model: nn.Module, threshold: float):
        super().__init__()
        self.model, self.threshold, self.sent = model, threshold, None

    def forward(self, x):
        if self.sent is None or self.sent.shape != x.shape:
            self.sent = x.contiguous().clone()
        else:
            send = ((x - self.sent).abs().amax(1, keepdim=True) > self.threshold)
            self.sent = torch.where(send, x, self.sent).contiguous()
        return self.model(self.sent)


class LinearFlops:
    """Forward pre-hooks on the convolutions and linear layers of a model: the FLOPs a sparse run
    does (output pixels whose window holds a changed input pixel) against the dense FLOPs."""

    def __init__(self, model: nn.Module):
        self.prev, self.done, self.dense, self.counting = {}, 0.0, 0.0, False
        for name, m in model.named_modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.register_forward_hook(self._hook(name))

    def _hook(self, name):
        def hook(m, args, out):
            x = args[0]
            prev = self.prev.get(name)
            self.prev[name] = x.clone()
            if not self.counting or prev is None or prev.shape != x.shape:
                return
            if isinstance(m, nn.Conv2d):
                per_pixel = 2.0 * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                ch = changed_pixels(x, prev).float()
                active = F.max_pool2d(ch, m.kernel_size, m.stride, m.padding, m.dilation) > 0
                self.done += per_pixel * float(active.sum())
                self.dense += per_pixel * active[:, 0].numel()
            else:
                per_row = 2.0 * m.in_features * m.out_features
                rows = x.reshape(-1, x.shape[-1])
                self.done += per_row * float((rows != prev.reshape(-1, x.shape[-1])).any(1).sum())
                self.dense += per_row * rows.shape[0]
        return hook


def fold_batchnorms(model: nn.Module) -> nn.Module:
    """``model`` (in place) with every BatchNorm that follows a convolution in a Sequential folded
    into it as ``convert`` folds it (``FoldedWeights``: in float32, rounded once to the weight's
    dtype keeping each filter's sum) and replaced by an identity."""
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            conv, bn = seq[i], seq[i + 1]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                w, b = FoldedWeights.exact(conv.weight, conv.bias, bn, out_dim=0)
                w, b = FoldedWeights.rounded(w, b, conv.weight.dtype)
                conv.weight = nn.Parameter(w, requires_grad=False)
                conv.bias = nn.Parameter(b, requires_grad=False)
                seq[i + 1] = nn.Identity()
    return model


def value_model(model: nn.Module, thresholds: dict, measure: str = "rms", fold: bool = False):
    """The dense ``model`` (deep-copied; ``fold``: its BatchNorms folded as the library folds them)
    in value mode at ``thresholds`` (``{"input": t, layer name: t}``, names as
    ``DeltaModel.thresholds()``), with its FLOPs counter and truncating layers."""
    import copy
    m = copy.deepcopy(model)
    if fold:
        fold_batchnorms(m)
    layers = []
    for name, t in thresholds.items():
        if name == "input":
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = m.get_submodule(parent_name) if parent_name else m
        fn = getattr(parent, leaf)
        fn = type(fn)() if hasattr(fn, "inplace") else fn  # not in place: S is returned
        layer = Truncating(fn, t, measure)
        setattr(parent, leaf, layer)
        layers.append(layer)
    counter = LinearFlops(m)
    return InputSparsifier(m, thresholds.get("input", 0.0)), counter, layers


def run_value(model, frames, dense, thresholds, measure="rms", fold=False):
    """``(density, errors per frame after the key frame)`` of value mode over ``frames``."""
    vm, counter, layers = value_model(model, thresholds, measure, fold)
    errors = []
    with torch.no_grad():
        for i, x in enumerate(frames):
            counter.counting = i > 0
            y = vm(x)
            if i > 0:
                errors.append(float(relative_error(y, dense[i]).mean()))
    done = counter.done + sum(l.flops[0] for l in layers)
    total = counter.dense + sum(l.flops[1] for l in layers)
    return done / total, errors


def run_delta(model, frames, dense, thresholds, truncation="rms", backend="auto"):
    """``(density, errors per frame after the key frame)`` of the library in delta mode (as it was
    when section 2 of value_mode.txt ran, before value mode existed)."""
    dm = deltaconv.convert(model, thresholds=thresholds, truncation=truncation, backend=backend,
                           example_input=frames[0], recompute=False)
    rep = compare(model, dm, frames, dense_outputs=dense)
    return rep.density, rep.per_frame["rel_err"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    clip_arguments(p, (288, 512), 12)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--thresholds", nargs="*", default=[],
                   help="per video, a thresholds JSON (calibration file); none: --uniform in every layer")
    p.add_argument("--uniform", type=float, nargs=2, default=(0.004, 0.01), metavar=("T", "T_IN"))
    p.add_argument("--scales", type=float, nargs="+", default=[1.0], help="multiply every threshold")
    p.add_argument("--modes", nargs="+", default=["delta", "value", "value-folded"],
                   choices=["delta", "value", "value-folded"],
                   help="value-folded: value mode with the BatchNorms folded as the library folds them")
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, a.dtype)
    model = mobilenet_v2_imagenet().eval().to(a.device, dtype)
    names = deltaconv.convert(model, backend="reference", example_input=torch.zeros(
        1, 3, 64, 64, device=a.device, dtype=dtype)).thresholds()
    for vi, video in enumerate(a.videos):
        frames = [x.to(a.device, dtype) for x in video_frames(video, tuple(a.size), a.frames, a.start)]
        with torch.no_grad():
            dense = [model(x) for x in frames]
        if a.thresholds:
            base = json.load(open(a.thresholds[vi]))["thresholds"]
        else:
            base = {n: a.uniform[0] for n in names}
            base["input"] = a.uniform[1]
        for s in a.scales:
            th = {n: v * s for n, v in base.items()}
            for mode in a.modes:
                start = time.time()
                if mode == "delta":
                    density, errors = run_delta(model, frames, dense, th)
                else:
                    density, errors = run_value(model, frames, dense, th, fold=mode == "value-folded")
                e = torch.tensor(errors)
                thirds = " / ".join(f"{t.mean():.4f}" for t in e.tensor_split(3))
                print(f"{video} {a.size[0]}x{a.size[1]} {a.dtype} frames {a.start}-{a.start + a.frames - 1} "
                      f"thresholds {a.thresholds[vi] if a.thresholds else a.uniform} x{s:g} {mode}: density "
                      f"{density:.3f} err mean {e.mean():.4f} p95 {e.quantile(0.95):.4f} by thirds {thirds} "
                      f"({time.time() - start:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
