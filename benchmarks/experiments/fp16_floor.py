"""Where the float16 error floor at threshold 0 comes from (an experiment; kept as it ran).

At threshold 0 a float16 converted MobileNetV2 should give the dense float16 model's output up to
rounding. This runs it on a sample video and reports the logit relative error per window of frames
against the dense float32 and float16 models, for the design as it is and for variants, most made
by patching the reference backend (``--backend reference``; ``--backend cuda`` runs the kernels):

- ``base``: every layer as designed: float32 accumulators, ``sent`` buffers and deltas in float16;
- ``sent32``: ``sent`` buffers in float32 (activation outputs still rounded to float16 before the
  change is taken), so what a layer has sent is tracked exactly, with no rounding residual lost;
- ``all32``: the whole converted model in float32 with the activation outputs rounded to float16
  (deltas and convolution outputs exact): what float16 storage of activations alone costs;
- ``w16``: ``all32`` with the parameters and the input frames rounded to float16 first (the model
  computes in float32 on float16 values);
- ``conv32``: ``base`` with the convolutions computed and their output deltas kept in float32
  (the non-linear layers still send float16 deltas);
- ``fold32``: ``base`` with the BatchNorm folded into float32 weights (not rounded to float16) and
  the convolutions computed in float32 from them, their output deltas rounded to float16;
- ``nofold``: ``base`` with every BatchNorm a layer of its own (``convert(..., fold_bn=False)``): the
  weights are rounded to float16 once, as the dense model's, and the BatchNorm scales the delta in
  float32 (runs on the CUDA backend too);
- ``refreshN``: ``base`` with a key frame every N frames (``convert(..., refresh_every=N)``);
- ``nearest``: ``base`` with each folded weight rounded to its nearest float16 value, as every fold
  was before the folds kept each filter's sum (``deltaconv.modules.folding.round_keeping_sums``);
- ``cast``: the float32 model converted, then cast (``convert(model).half()``): the exact fold of the
  float32 weights rounded once; ``castnearest``: the same rounded to nearest.

``base``, ``nofold``, ``refreshN``, ``nearest``, ``cast`` and ``castnearest`` run on the CUDA
backend too (``--backend cuda``).

    PYTHONPATH=. python benchmarks/experiments/fp16_floor.py --device cuda --size 540 960 \\
        --video one-by-one-person-detection.mp4 --start 200 --frames 401 --window 100 --backend cuda \\
        --variants base nofold

``--layers``: after the last frame, for every activation layer, the relative error of the
accumulated pre-activation (``acc``) of each variant, and of the dense float16 model's
pre-activation, against the dense float32 model's. Results and what they show:
``benchmarks/results/fp16_floor.txt``.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

import deltaconv
from deltaconv.backends import reference
from deltaconv.fidelity import relative_error, video_frames
from deltaconv.modules.base import DCModule
from deltaconv.weights import mobilenet_v2_imagenet


@contextlib.contextmanager
def patched(variant: str):
    """The reference backend and DCModule.state patched for ``variant`` (see the module doc)."""
    from deltaconv.modules import folding
    saved = (reference._target, DCModule.state, reference.conv2d, reference.truncate, folding.FoldedWeights.get,
             folding.round_keeping_sums)
    try:
        if variant == "fold32":
            get, conv2d = folding.FoldedWeights.get, reference.conv2d

            def get32(self, weight, bias, bn, out_dim, layout=None):
                if bn is None:
                    return get(self, weight, bias, bn, out_dim, layout)
                scale, shift = folding.bn_scale_shift(bn)
                shape = [1] * weight.dim()
                shape[out_dim] = -1
                w = weight.float() * scale.view(shape)
                b = shift if bias is None else bias.float() * scale + shift
                return w, b

            def conv2d_round(delta, mask, weight, bias, *rest, **kw):
                out, m = conv2d(delta.float(), mask, weight.float(), None if bias is None else bias.float(), *rest,
                                **kw)
                return out.to(delta.dtype), m
            folding.FoldedWeights.get, reference.conv2d = get32, conv2d_round
        if variant in ("nearest", "castnearest"):
            folding.round_keeping_sums = lambda weight, dtype, max_flips=None: weight.to(dtype)
        if variant == "conv32":
            conv2d, truncate = reference.conv2d, reference.truncate

            def conv2d32(delta, mask, weight, bias, *rest, **kw):
                return conv2d(delta.float(), mask, weight.float(), None if bias is None else bias.float(), *rest, **kw)

            def truncate16(y, region, sent, threshold, key, out_dtype, measure="max", tf32=False):
                return truncate(y, region, sent, threshold, key, sent.dtype, measure)
            reference.conv2d, reference.truncate = conv2d32, truncate16
        if variant in ("sent32", "all32", "w16"):
            def target(y, sent):  # activation outputs rounded to float16 as a float16 model stores them
                return y.to(torch.float16).to(torch.float32)
            reference._target = target
        if variant == "sent32":
            state = DCModule.state

            def state32(self, name, shape, device, dtype=torch.float32, sent=False):
                return state(self, name, shape, device, torch.float32 if sent else dtype, sent)
            DCModule.state = state32
        yield
    finally:
        (reference._target, DCModule.state, reference.conv2d, reference.truncate,
         folding.FoldedWeights.get, folding.round_keeping_sums) = saved


def pre_activations(model, frame) -> dict:
    """``{module name: input}`` of every activation module of ``model`` on ``frame``."""
    seen, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, (torch.nn.ReLU, torch.nn.ReLU6, torch.nn.Hardswish)):
            # a pre-hook and a copy: the activations of torchvision models run in place
            keep = (lambda mod, inp, name=name: seen.__setitem__(name, inp[0].clone()))
            hooks.append(m.register_forward_pre_hook(keep))
    try:
        with torch.no_grad():
            model(frame)
    finally:
        for h in hooks:
            h.remove()
    return seen


def layer_errors(dm, ref: dict) -> dict:
    """``{layer: ||acc - ref|| / ||ref||}`` over the activation layers of ``dm`` named in ``ref``."""
    out = {}
    for layer in dm.delta_layers():
        acc = layer._buffers.get("acc")
        if layer.kind == "activation" and acc is not None and layer.layer_name in ref:
            out[layer.layer_name] = float(relative_error(acc, ref[layer.layer_name].float()))
    return out


def run(variant: str, args, dense32, frames, layers=None) -> list[tuple[float, float]]:
    """Per delta frame: (error vs dense float32, error vs dense float16); with ``layers`` (the dense
    float32 pre-activations of the last frame) the per-layer errors of ``acc`` go into
    ``args.layer_rows[variant]``."""
    dtype = torch.float32 if variant in ("all32", "w16") else torch.float16
    cast = variant.startswith("cast")  # converted in float32, then cast
    model = mobilenet_v2_imagenet().to(args.device, torch.float32 if cast else dtype)
    if variant == "w16":
        model = model.half().float()
        frames = [f.half().float() for f in frames]
    dense16 = mobilenet_v2_imagenet().to(args.device, torch.float16)
    errs = []
    with patched(variant), torch.no_grad():
        refresh = int(variant[len("refresh"):]) if variant.startswith("refresh") else None
        dm = deltaconv.convert(model, threshold=0.0, backend=args.backend, thresholds=args.thresholds,
                               example_input=frames[0].to(model.features[0][0].weight.dtype),
                               check_finite=False, refresh_every=refresh, fold_bn=variant != "nofold").to(dtype)
        for i, f in enumerate(frames):
            y = dm(f.to(dtype)).float()
            if i:
                errs.append((float(relative_error(y, dense32(f).float())),
                             float(relative_error(y, dense16(f.half()).float()))))
        if layers is not None:
            args.layer_rows[variant] = layer_errors(dm, layers)
    return errs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--video", default="one-by-one-person-detection.mp4")
    p.add_argument("--size", type=int, nargs=2, default=[540, 960])
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=201)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="reference", choices=["reference", "cuda"])
    p.add_argument("--variants", nargs="+", default=["base", "sent32", "all32"])
    p.add_argument("--layers", action="store_true", help="per-layer errors of the accumulated pre-activations")
    p.add_argument("--thresholds", default=None, help="a thresholds file for convert() (default: threshold 0)")
    p.add_argument("--loops", type=int, default=1,
                   help="play the frames this many times in a row, one key frame (each restart is a scene cut)")
    a = p.parse_args(argv)
    patched_only = [v for v in a.variants
                    if v not in ("base", "nofold", "nearest", "cast", "castnearest") and not v.startswith("refresh")]
    if a.backend == "cuda" and patched_only:
        p.error(f"--variants {patched_only} patch the reference backend: run them with --backend reference")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    frames = [f.to(a.device) for f in video_frames(a.video, tuple(a.size), a.frames, start=a.start)] * a.loops
    dense32 = mobilenet_v2_imagenet().to(a.device)
    with torch.no_grad():
        d16 = [float(relative_error(mobilenet_v2_imagenet().to(a.device, torch.float16)(f.half()).float(),
                                    dense32(f))) for f in frames[1:4]]
    print(f"{a.video} frames {a.start}-{a.start + len(frames) - 1} at {a.size[0]}x{a.size[1]}, backend {a.backend}; "
          f"dense float16 vs float32: {statistics.fmean(d16):.2e}", flush=True)
    layers = pre_activations(dense32, frames[-1]) if a.layers else None
    a.layer_rows = {}
    for v in a.variants:
        errs = run(v, a, dense32, frames, layers)
        windows = [errs[i:i + a.window] for i in range(0, len(errs), a.window)]
        cells = "  ".join(f"{statistics.fmean(e for e, _ in w):.2e}/{statistics.fmean(e for _, e in w):.2e}"
                          for w in windows)
        print(f"  {v:<7} error vs dense fp32 / fp16 per {a.window} frames: {cells}", flush=True)

    if layers is not None:
        dense16 = pre_activations(mobilenet_v2_imagenet().to(a.device, torch.float16), frames[-1].half())
        print(f"  per layer, last frame: relative error of the pre-activation vs dense float32: "
              f"dense float16 | {' | '.join(a.layer_rows)}")
        for name, ref in layers.items():
            cells = " | ".join(f"{a.layer_rows[v].get(name, float('nan')):.2e}" for v in a.layer_rows)
            print(f"    {name:<24} {float(relative_error(dense16[name].float(), ref)):.2e} | {cells}")


if __name__ == "__main__":
    main()

