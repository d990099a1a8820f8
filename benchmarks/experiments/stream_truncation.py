# An experiment, not a maintained tool. Run from the repository root:
#   PYTHONPATH=. python benchmarks/experiments/stream_truncation.py --help
"""Experiment: truncate MobileNetV2's linear residual stream too, not only its ReLU6 outputs.

MobileNetV2's blocks end in a linear projection (1x1 conv + BN, no activation) added to the
block's input. Linear layers do not truncate, so the next block's expansion 1x1 convolution (the
largest FLOPs share of a block) runs on every pixel where the stream changed at all: the union of
what the depthwise ReLU6s of the stage before it sent. Here a truncation point is put after every
block (features.1-17): an identity activation (``nn.LeakyReLU(1.0)``, exactly the identity, so the
dense model's outputs do not change) with its own threshold ``--t-stream``; the ReLU6s keep ``t``.
The rest is as pooled_truncation.py: reference backend, input sparsifier at ``--t-in``, FLOPs
density and mean logit relative error against the dense model, key frame excluded.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/experiments")
import deltaconv  # noqa: E402
from deltaconv.fidelity import compare, video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402
from uniform_run import clip_arguments, summary  # noqa: E402


def with_stream_points(model: nn.Module, blocks=range(1, 18)) -> nn.Module:
    """``model`` (a torchvision MobileNetV2) with an identity activation after each block in ``blocks``."""
    for i in blocks:
        model.features[i] = nn.Sequential(model.features[i], nn.LeakyReLU(1.0))
    return model


def run(model, frames, dense, t, t_stream, t_in, truncation):
    """``(report, seconds, stream points)``: ``model`` converted at ``t`` (ReLU6s), ``t_stream`` (the
    identity activations) and ``t_in`` (input sparsifier) against the dense outputs ``dense``."""
    dm = deltaconv.convert(model, threshold=t, truncation=truncation, backend="reference", example_input=frames[0])
    stream = {layer.layer_name: t_stream for layer in dm.delta_layers()
              if layer.truncates and getattr(getattr(layer, "fn", None), "kind", "") == "leaky_relu"}
    dm.load_thresholds({dm.delta_layers()[0].layer_name: t_in, **stream})
    start = time.time()
    rep = compare(model, dm, frames, dense_outputs=dense)
    return rep, time.time() - start, len(stream)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    clip_arguments(p, (540, 960), 12)
    p.add_argument("--device", default="cpu")
    p.add_argument("--t-in", type=float, default=0.01, help="input sparsifier threshold")
    p.add_argument("--truncation", default="rms")
    p.add_argument("--ts", type=float, nargs="+", default=[0.004], help="ReLU6 thresholds")
    p.add_argument("--t-streams", type=float, nargs="+", default=[0.0], help="stream thresholds (0: exact)")
    p.add_argument("--blocks", type=int, nargs="+", default=list(range(1, 18)),
                   help="blocks of model.features followed by a stream point (default 1-17)")
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model = with_stream_points(mobilenet_v2_imagenet().eval(), a.blocks).to(a.device)
    for video in a.videos:
        frames = [x.to(a.device) for x in video_frames(video, tuple(a.size), a.frames, a.start)]
        with torch.no_grad():
            dense = [model(x) for x in frames]
        for t in a.ts:
            for ts in a.t_streams:
                rep, seconds, n = run(model, frames, dense, t, ts, a.t_in, a.truncation)
                print(f"{video} {a.size[0]}x{a.size[1]} frames {a.start}-{a.start + a.frames - 1} {a.truncation} "
                      f"t={t:g} t_stream={ts:g} ({n} points, blocks {a.blocks[0]}-{a.blocks[-1]}): {summary(rep, seconds)}", flush=True)


if __name__ == "__main__":
    main()
