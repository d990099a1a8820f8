"""Which torchvision models ``deltaconv.convert`` takes, and how exactly: every classification and
semantic segmentation model, random weights (BatchNorm statistics, LayerNorm affine terms and
ConvNeXt's ``layer_scale`` randomised as the tests do), float64, three consecutive frames of
``vtest.avi`` at 64x96 (224x224 for the models that only take that size), the converted model's
largest relative error against the dense one at threshold 0, and the ops that ran as dense
fallbacks. CPU, reference backend::

    PYTHONPATH=. python benchmarks/experiments/model_coverage.py [NAME ...] > benchmarks/results/model_coverage.txt
"""
from __future__ import annotations

import collections
import sys
import time
import warnings
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import compare_over_frames, torchvision_model, video_frames  # noqa: E402

import deltaconv  # noqa: E402

SIZES = ((64, 96), (224, 224))


def build(name: str) -> torch.nn.Module:
    return torchvision_model(name).double()


def check(name: str) -> str:
    model = build(name)
    for size in SIZES:
        frames = [f.double() for f in video_frames(3, size)]
        try:
            dm, errors, _ = compare_over_frames(model, frames)
        except deltaconv.ConversionError as error:
            if size != SIZES[-1] and "failed on example_input" in str(error):
                continue  # a model that takes one input size only (ViT, MaxViT)
            return f"not converted: {str(error).splitlines()[0][:200]}"
        fallbacks = collections.Counter(n.target.split(":")[0] for n in dm.report.fallbacks)
        listed = ", ".join(f"{k} x{v}" for k, v in fallbacks.most_common()) or "none"
        return f"{size[0]}x{size[1]}, max rel. error {max(errors):.1e}, fallbacks: {listed}"
    return "no size fits"


def main(argv=None) -> None:
    warnings.filterwarnings("ignore")
    names = list(argv if argv is not None else sys.argv[1:]) or (
        torchvision.models.list_models(module=torchvision.models)
        + torchvision.models.list_models(module=torchvision.models.segmentation))
    print(f"# deltaconv model coverage: torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"CPU reference backend, float64, threshold 0, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          flush=True)
    for name in names:
        t0 = time.time()
        print(f"{name:32s} {check(name)} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
