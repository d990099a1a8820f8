"""Float16 fidelity of the stems in value mode against delta mode: each output of a converted model against the
float64 model, next to the dense float16 model's, at threshold 0 (``benchmarks/results/stem_value_mode.txt``).

In delta mode a stem (a convolution of fewer than 8 input channels, ``deltaconv.convert.MIN_RECOMPUTE_CHANNELS``)
sends its changes, rounded to float16, to its activation, which sums them in a float32 accumulator: the roundings
add up from frame to frame. In value mode (the default since 2026-12-07) the stem recomputes its whole output from
the input's whole values, as the dense model does. Variants: ``dense`` (the float16 model), ``value`` (the
defaults), ``delta_stem`` (``MIN_RECOMPUTE_CHANNELS = 8``, the default before). The errors are taken over the
frames after the key frame (``zoo_speed.output_errors``); a sigmoid output's (a probability) in logit space
(``--logits``), where a value near 0 or 1 keeps its precision. CPU (reference backend) or ``--device cuda``::

    DELTACONV_VIDEOS=../shared/videos PYTHONPATH=. python benchmarks/experiments/stem_fidelity.py \\
        --model path/to/hand_landmark_full.tflite --crop 585 227 148 148 --start 28 --frames 30 --logits out1 out2
    PYTHONPATH=. python benchmarks/experiments/stem_fidelity.py --model mobilenet_v2 --size 288 384 --frames 30
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zoo_speed import input_size, named_outputs, output_errors  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv import zoo  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402

#: variant -> ``MIN_RECOMPUTE_CHANNELS`` while converting (``None``: the dense float16 model)
VARIANTS = {"dense": None, "value": 1, "delta_stem": 8}


def outputs(model, frames, logits) -> list[dict]:
    """``model``'s outputs on ``frames`` by name, float64, the ``logits`` ones through ``torch.logit``."""
    with torch.no_grad():
        return [{k: torch.logit(v.double()) if k in logits else v.double() for k, v in named_outputs(model(f)).items()}
                for f in frames]


def clip_arguments(p: argparse.ArgumentParser, frames: int) -> None:
    """``--model`` and the clip it runs on: ``--video``, ``--size``, ``--crop``, ``--start``, ``--frames``."""
    p.add_argument("--model", required=True, help="a zoo name, a torchvision name or a .tflite / .onnx file")
    p.add_argument("--video", default="vtest.avi")
    p.add_argument("--size", nargs=2, type=int, metavar=("H", "W"), help="default: the model's own input size")
    p.add_argument("--crop", nargs=4, type=int, metavar=("X", "Y", "W", "H"))
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--frames", type=int, default=frames)


def model_and_clip(a: argparse.Namespace) -> tuple:
    """``(zoo entry, frames)`` of :func:`clip_arguments`' ``a``: the model loaded, the frames at its input size.
    A torchvision classification or segmentation model without real weights (the zoo's random ones) comes as the
    video sweep builds it (``video_sweep.build``: seeded, its BatchNorm statistics re-estimated on the first 4
    frames), so that its activations keep a trained network's scale: with the default statistics deep random
    networks (efficientnet_b0, mobilenet_v3_large) overflow float16."""
    entry = zoo.load(a.model)
    frames = list(read_frames(find_sample_video(a.video), max_frames=a.frames, size=input_size(entry, a.size),
                              start=a.start, crop=tuple(a.crop) if a.crop else None))
    if "random" in entry.weights and zoo.torchvision_names().get(a.model) in ("classification", "segmentation"):
        from video_sweep import build

        entry = dataclasses.replace(entry, model=build(a.model, frames[:4], device="cpu").eval(),
                                    weights="random, BatchNorm statistics re-estimated on the clip's first 4 frames")
    return entry, frames


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    clip_arguments(p, 30)
    p.add_argument("--logits", nargs="*", default=[], help="outputs that are probabilities, compared as logits")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args(argv)
    entry, frames = model_and_clip(a)
    exact = copy.deepcopy(entry.model).double().eval().to(a.device)
    model = entry.model.half().eval().to(a.device)
    half = [f.to(a.device, torch.float16) for f in frames]
    want = outputs(exact, [f.to(a.device, torch.float64) for f in frames], a.logits)
    convert_module = importlib.import_module("deltaconv.convert")  # the module (deltaconv.convert is the function)
    default = convert_module.MIN_RECOMPUTE_CHANNELS
    print(f"# {a.model}, {a.video} frames {a.start}-{a.start + a.frames - 1}"
          + (f", crop {a.crop}" if a.crop else "") + f", {tuple(frames[0].shape[-2:])}, float16, threshold 0, "
          f"{a.device}; relative error against float64 per output" + (f" ({' '.join(a.logits)} as logits)"
                                                                     if a.logits else ""))
    for variant, channels in VARIANTS.items():
        if channels is None:
            got = outputs(model, half, a.logits)
        else:
            convert_module.MIN_RECOMPUTE_CHANNELS = channels
            try:
                dm = deltaconv.convert(model, threshold=0, backend="reference" if a.device == "cpu" else "cuda",
                                       example_input=half[0])
            finally:
                convert_module.MIN_RECOMPUTE_CHANNELS = default
            got = outputs(dm, half, a.logits)
        print(f"{variant:11s}" + " ".join(f"{k} {v:.2e}" for k, v in output_errors(got, want).items()), flush=True)


if __name__ == "__main__":
    main()
