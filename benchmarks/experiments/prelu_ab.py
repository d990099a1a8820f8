"""A/B of per-channel PReLU on the activation kernels ("kernels", since 2026-12-07: kind ``prelu``, each
element's slope read by its channel, in value mode on kernels with the kind fixed at compile time) against
the kernel that switches on the kind per element ("switch", ``DELTACONV_ACT_FIXED=0``) and against what a
per-channel PReLU was before, a dense fallback ("fallback": the dense module on the densified input, then
re-sparsified), in one process, with the dense model replayed as a CUDA graph as the baseline.

    PYTHONPATH=. python benchmarks/experiments/prelu_ab.py [--size 1080 1920] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--thresholds 0.02] [--frames 24] [--start 200]

The model: torchvision's resnet18 (random weights, BatchNorms re-estimated on the first 4 frames) with
each ReLU an ``nn.PReLU`` of one slope per channel (slopes in [-0.5, 1), seeded; a BasicBlock calls its
ReLU twice on ``planes`` channels, so one PReLU of that size stands for it), as in face-recognition and
segmentation networks built on PReLU (IR-ResNets, ENet). Float16, channels-last, CUDA-graph replay, the
variants frame by frame in turn on the same frames. Results: ``benchmarks/results/prelu_ab.txt``.

``--ops`` first times the ops alone: ``activation_values`` and ``activation`` of kinds ``relu``, ``leaky_relu``
and ``prelu`` (the last two fixed and switched) on the same ``[1, C, H, W]`` float16 channels-last maps, every
pixel active, per call inside a CUDA graph of 20 calls; "sends": a key frame, every pixel sent (both passes),
"quiet": none exceeds the threshold (the first pass only). (Before the change that runs PReLU only on kernels of
its own, delta mode kept the switching kernel for both; since, "prelu switch" runs the same kernel as "prelu fixed".)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (activation_op_maps, activation_op_state, add_video_ab_arguments,  # noqa: E402
                    compare_variants_on_videos, converted_under, environment, patched, reestimate_batchnorm,
                    time_in_graph)

OP_SHAPES = ((64, 540, 960), (256, 136, 240))


def time_ops() -> None:
    """One line per op, shape and case: microseconds per call of relu (fixed at compile time), and of
    leaky_relu and prelu fixed ("fixed") and switched per element ("switch", ``DELTACONV_ACT_FIXED=0``)."""
    ops = torch.ops.deltaconv
    for (c, h, w), x, mask, g in activation_op_maps(OP_SHAPES, "prelu_ab"):
        slopes = torch.rand(c, device="cuda", generator=g) * 1.5 - 0.5
        for case in ("sends", "quiet"):
            key, sent, acc = activation_op_state(x, case)
            for op in ("activation_values", "activation"):
                us = {}
                for kind, param, s, fixed in (("relu", 0.0, None, "1"), ("leaky_relu", 0.1, None, "1"),
                                              ("leaky_relu", 0.1, None, "0"), ("prelu", 0.0, slopes, "1"),
                                              ("prelu", 0.0, slopes, "0")):
                    if op == "activation_values":
                        def fn(kind=kind, param=param, s=s):
                            return ops.activation_values(x, mask, sent, kind, param, 1e9, key, slopes=s)
                    else:
                        def fn(kind=kind, param=param, s=s):
                            return ops.activation(x, mask, acc, sent, kind, param, 1e9, key, slopes=s)
                    with environment({"DELTACONV_ACT_FIXED": fixed}):
                        us[kind if kind == "relu" else f"{kind} {'fixed' if fixed == '1' else 'switch'}"] = \
                            1e3 * time_in_graph(fn)
                cells = "  ".join(f"{name} {t:6.1f} us" for name, t in us.items())
                print(f"op {op:17s} {c}x{h}x{w} {case}: {cells}  prelu fixed/relu "
                      f"{us['prelu fixed'] / us['relu']:.3f}", flush=True)


def with_per_channel_prelus(model: nn.Module, seed: int = 0) -> nn.Module:
    """A torchvision ResNet of BasicBlocks (resnet18, resnet34) with each ReLU an ``nn.PReLU`` of one slope per
    channel, slopes uniform in [-0.5, 1) (seeded), in place: after the stem's convolution and in every block,
    where one ReLU is called on two maps of ``planes`` channels (after conv1, and after the residual add), so one
    PReLU of that size stands for it. Returns ``model``."""
    g = torch.Generator().manual_seed(seed)

    def prelu(channels: int) -> nn.PReLU:
        p = nn.PReLU(channels)
        with torch.no_grad():
            p.weight.copy_(torch.rand(channels, generator=g) * 1.5 - 0.5)
        return p

    model.relu = prelu(model.conv1.out_channels)
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            block.relu = prelu(block.conv1.out_channels)
    return model


def resnet18_with_prelus(frames) -> nn.Module:
    """resnet18 (random weights) with per-channel PReLUs for its ReLUs, BatchNorms re-estimated on ``frames[:4]``."""
    import torchvision
    torch.manual_seed(0)
    return reestimate_batchnorm(with_per_channel_prelus(torchvision.models.resnet18()), torch.cat(list(frames[:4])))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_video_ab_arguments(p, (1080, 1920))
    p.add_argument("--order", nargs="+", default=["kernels", "switch", "fallback"],
                   choices=["kernels", "switch", "fallback"])
    p.add_argument("--ops", action="store_true", help="first time the activation ops alone (prelu, relu, leaky_relu)")
    p.add_argument("--no-models", action="store_true", help="skip the whole-model A/B")
    a = p.parse_args(argv)
    if a.ops:
        time_ops()
    if a.no_models:
        return
    from deltaconv import activations

    dense_rule = activations.from_module  # "fallback": no delta rule for a per-channel PReLU, as before
    variants = {"kernels": converted_under(),
                "switch": converted_under(lambda: environment({"DELTACONV_ACT_FIXED": "0"})),
                "fallback": converted_under(lambda: patched(
                    activations, "from_module",
                    lambda m: None if isinstance(m, nn.PReLU) and m.weight.numel() > 1 else dense_rule(m)))}
    compare_variants_on_videos(a, {f"resnet18 with per-channel PReLUs {a.size[0]}x{a.size[1]}":
                                   resnet18_with_prelus}, variants)


if __name__ == "__main__":
    main()
