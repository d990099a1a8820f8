"""A/B of the activation kernel with SiLU and hardswish fixed at compile time ("fixed", the default since
2026-12-03) against the kernel that switches on the kind per element ("switch", ``DELTACONV_ACT_FIXED=0``),
in one process: first each kind's op alone, then whole models, each against its dense graph.

    PYTHONPATH=. python benchmarks/experiments/activation_fixed_ab.py [--models efficientnet_b0 ...] \\
        [--videos one-by-one-person-detection.mp4] [--size 1080 1920] [--thresholds 0.02] [--start 200]

Ops: ``activation_values`` (value mode, the activations after a recomputing convolution) and
``activation`` (delta mode, with an accumulator) on ``[1, C, H, W]`` float16 channels-last maps, every
pixel active, timed per call inside a CUDA graph of 20 calls (``time_in_graph``); "sends": a key frame,
every pixel sent (both passes run), "quiet": none exceeds the threshold (the first pass only).
Models: as the video sweep builds them (random weights, BatchNorm statistics re-estimated), float16,
CUDA-graph replay, the variants frame by frame in turn on the same frames.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (activation_op_maps, activation_op_state, add_video_ab_arguments,  # noqa: E402
                    compare_variants_on_videos, converted_under, environment, time_in_graph)

VARIANTS = {"fixed": {"DELTACONV_ACT_FIXED": "1"}, "switch": {"DELTACONV_ACT_FIXED": "0"}}
KINDS = ("relu6", "silu", "hardswish", "gelu")
SHAPES = ((96, 540, 960), (240, 136, 240))


def time_ops(order, kinds=KINDS) -> None:
    """One line per op, kind, shape and case: microseconds per call of each variant (the kind's parameter 0)."""
    ops = torch.ops.deltaconv
    for (c, h, w), x, mask, _ in activation_op_maps(SHAPES, "activation_fixed_ab"):
        for kind in kinds:
            for case in ("sends", "quiet"):
                key, sent, acc = activation_op_state(x, case)
                calls = {"activation_values": lambda: ops.activation_values(x, mask, sent, kind, 0.0, 1e9, key),
                         "activation": lambda: ops.activation(x, mask, acc, sent, kind, 0.0, 1e9, key)}
                for op, fn in calls.items():
                    us = {}
                    for name in order:
                        with environment(VARIANTS[name]):
                            us[name] = 1e3 * time_in_graph(fn)
                    cells = "  ".join(f"{name} {t:7.1f} us" for name, t in us.items())
                    print(f"op {op:17s} {kind:9s} {c}x{h}x{w} {case}: {cells}  "
                          f"switch/fixed {us.get('switch', float('nan')) / us.get('fixed', float('nan')):.3f}",
                          flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_video_ab_arguments(p, (1080, 1920))
    p.add_argument("--order", nargs="+", default=["fixed", "switch"], choices=list(VARIANTS))
    p.add_argument("--models", nargs="+", default=["efficientnet_b0", "efficientnet_v2_s", "mobilenet_v3_large",
                                                   "regnet_y_400mf"])
    p.add_argument("--no-ops", action="store_true", help="skip the single-op timings")
    p.add_argument("--kinds", nargs="+", default=list(KINDS),
                   help="the activation kinds of the single-op timings (sigmoid, tanh, elu, leaky_relu, ...: kinds "
                        "that run on the switching kernel whatever the variant)")
    a = p.parse_args(argv)
    if not a.no_ops:
        time_ops(a.order, a.kinds)
    from video_sweep import build
    variants = {name: converted_under(lambda env=env: environment(env)) for name, env in VARIANTS.items()}
    models = {name: (lambda cpu, name=name: build(name, cpu[:4])) for name in a.models}
    compare_variants_on_videos(a, models, variants)


if __name__ == "__main__":
    main()
