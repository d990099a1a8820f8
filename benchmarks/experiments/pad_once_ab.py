"""Output channels not a multiple of 8 (squeeze-excite reductions, segmentation classifiers): filters
padded with zeros once, beside the fold (``DCConv2d``, ``padded_out_channels``), against the CUDA op
padding them on every call (``padded_cout`` in ``csrc/conv_ops.cu``: three more launches per call),
and against the dense model, the three replayed as CUDA graphs and alternated frame by frame in one
process (float16, 1080x1920, t=0.02, medians after ``--warmup`` frames; random weights, BatchNorm
statistics randomised as the tests do). Run on a CUDA machine::

    PYTHONPATH=. python benchmarks/experiments/pad_once_ab.py [--models ...] [--start S]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from common import alternate_frames, run_info  # noqa: E402
from helpers import torchvision_model  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["regnet_y_400mf", "efficientnet_b0", "mobilenet_v3_large",
                                                   "deeplabv3_mobilenet_v3_large", "fcn_resnet50"])
    p.add_argument("--video", default="one-by-one-person-detection.mp4")
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4)
    a = p.parse_args(argv)
    import deltaconv
    from deltaconv.cuda_graphs import graphed_model
    from deltaconv.modules import linear
    from deltaconv.video import find_sample_video, read_frames

    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}, float16 1080x1920, t={a.threshold:g}, "
          f"{a.video} frames {a.start + 2}-{a.start + a.frames - 1}", flush=True)
    frames = [f.cuda().half() for f in read_frames(find_sample_video(a.video), start=a.start, max_frames=a.frames,
                                                   size=(1080, 1920))]
    once = linear.padded_out_channels
    for name in a.models:
        model = torchvision_model(name).cuda().half().to(memory_format=torch.channels_last)
        runs = {}
        with torch.no_grad():
            runs["dense"] = graphed_model(model, frames[0])
            for variant in ("once", "per_call"):
                # the weights a graph replays are those of the frame it recorded
                linear.padded_out_channels = once if variant == "once" else (lambda out, *args: out)
                dm = deltaconv.convert(model, threshold=a.threshold, backend="cuda", example_input=frames[0],
                                       cuda_graph=True, check_finite=False)
                dm(frames[0]), dm(frames[1])  # key frame, then the captured frame
                linear.padded_out_channels = once
                runs[variant] = dm
            ms, _ = alternate_frames(runs, frames[2:], a.warmup)
            odd = sum(m.out_channels % 8 != 0 for m in runs["once"].modules() if isinstance(m, deltaconv.DCConv2d))
        print(f"== {name}: dense graph {ms['dense']:.3f} ms | padded once {ms['once']:.3f} ms "
              f"({ms['dense'] / ms['once']:.3f}x) | padded per call {ms['per_call']:.3f} ms "
              f"({ms['dense'] / ms['per_call']:.3f}x) | {odd} convs with output channels not a multiple of 8",
              flush=True)
        del runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
