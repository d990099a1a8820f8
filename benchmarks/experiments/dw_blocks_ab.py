"""A/B of the depthwise kernel's channel blocks: 4-vector blocks where they leave fewer vectors idle
(the default: 32, 96 and 144 channels of float16 run as 4-vector blocks on ``cp.async``) against
8-vector blocks everywhere (``DELTACONV_DW_NARROW=0``: those layers take the 8-vector kernel, its halo
by TMA on Hopper, the last block partly past the channels), and the dense model, the three replayed
as CUDA graphs and alternated frame by frame in one process (float16, 1080x1920, medians after
``--warmup`` frames; models as the video sweep builds them: real weights where shipped).

    PYTHONPATH=. python benchmarks/experiments/dw_blocks_ab.py [--models ...] [--videos ...]

The switch is read when a convolution is called, so each variant's graph keeps the blocks it was
captured with. Results: ``benchmarks/results/dwconv_ab.txt`` section 8.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (add_video_ab_arguments, alternate_frames, converted_under, environment, run_info,  # noqa: E402
                    video_models)

VARIANTS = {"narrow": "1", "wide": "0"}  # DELTACONV_DW_NARROW while the variant is captured


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["mobilenet_v2", "mobilenet_v3_large",
                                                   "deeplabv3_mobilenet_v3_large"])
    p.add_argument("--order", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                   help="the order in which the variants run on each frame")
    add_video_ab_arguments(p, (1080, 1920))
    a = p.parse_args(argv)
    from deltaconv.cuda_graphs import graphed_model

    variants = {v: converted_under(lambda value=value: environment({"DELTACONV_DW_NARROW": value}))
                for v, value in VARIANTS.items()}

    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}, order {' '.join(a.order)}", flush=True)
    for video, name, model, frames in video_models(a.videos, a.models, a.start, a.frames, a.size):
        for t in a.thresholds:
            with torch.no_grad():
                runs = {v: variants[v](model, frames, t) for v in a.order}  # key frame, then the captured frame
                runs["dense"] = graphed_model(model, frames[0])
                ms, diff = alternate_frames(runs, frames[2:], a.warmup, compared=a.order)
            cells = "  ".join(f"{v} {ms[v]:.3f} ms ({ms['dense'] / ms[v]:.3f}x)" for v in a.order)
            print(f"== {name} {a.size[0]}x{a.size[1]} fp16 {video} frames {a.start + 2}-{a.start + a.frames - 1} "
                  f"t={t:g}: dense graph {ms['dense']:.3f} ms  {cells}  narrow/wide {ms['narrow'] / ms['wide']:.3f}  "
                  f"max |diff| between the variants {diff:.3g}", flush=True)
            del runs
        del model, frames
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
