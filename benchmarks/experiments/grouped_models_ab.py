"""Models with grouped convolutions (RegNet, ResNeXt), their grouped 3x3 convs run block-diagonal
on the tensor cores (``DCConv2d.block_diagonal_ok``, the default) against the grouped CUDA-core kernel,
and against the dense model, the three replayed as CUDA graphs and alternated frame by frame in one
process (float16 by default, float32 in TF32 with ``--dtype float32``; 1080x1920, medians after
``--warmup`` frames; random weights, BatchNorm statistics randomised as the tests do). Run on a CUDA
machine::

    PYTHONPATH=. python benchmarks/experiments/grouped_models_ab.py [--models ...] [--videos ...] [--dtype ...]
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
    p.add_argument("--models", nargs="*", default=["regnet_y_400mf", "regnet_x_400mf", "regnet_y_1_6gf",
                                                   "resnext50_32x4d"])
    p.add_argument("--videos", nargs="*", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--size", type=int, nargs=2, default=[1080, 1920])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    torch.backends.cudnn.allow_tf32 = True  # float32: TF32, as PyTorch's default
    import deltaconv
    from deltaconv.cuda_graphs import graphed_model
    from deltaconv.video import find_sample_video, read_frames

    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}, {a.dtype} {a.size[0]}x{a.size[1]}, "
          f"t={a.threshold:g}, frames {a.start + 2}-{a.start + a.frames - 1}", flush=True)
    for name in a.models:
        model = torchvision_model(name).cuda().to(dtype).to(memory_format=torch.channels_last)
        for video in a.videos:
            frames = [f.cuda().to(dtype) for f in read_frames(find_sample_video(video), start=a.start,
                                                           max_frames=a.frames, size=tuple(a.size))]
            runs = {}
            with torch.no_grad():
                runs["dense"] = graphed_model(model, frames[0])
                for variant in ("block_diagonal", "grouped"):
                    dm = deltaconv.convert(model, threshold=a.threshold, backend="cuda", example_input=frames[0],
                                           cuda_graph=True, check_finite=False)
                    for layer in dm.modules():
                        if isinstance(layer, deltaconv.DCConv2d):
                            layer.block_diagonal_ok = variant == "block_diagonal"
                    dm(frames[0]), dm(frames[1])  # key frame, then the captured frame
                    runs[variant] = dm
                ms, _ = alternate_frames(runs, frames[2:], a.warmup)
                grouped_convs = [m for m in runs["block_diagonal"].modules()
                                 if isinstance(m, deltaconv.DCConv2d) and m.groups > 1]
                total = len(grouped_convs)
                # those that ran with the block-diagonal weight (the one their last frame used)
                ran = sum(m._folded._value[0].shape[1] == m.in_channels for m in grouped_convs)
                dens = [s["mean_density"] for s in runs["grouped"].stats() if s["kind"] != "densify"]
            print(f"== {name} {video}: dense graph {ms['dense']:.3f} ms | block-diagonal {ms['block_diagonal']:.3f} ms "
                  f"({ms['dense'] / ms['block_diagonal']:.2f}x) | grouped {ms['grouped']:.3f} ms "
                  f"({ms['dense'] / ms['grouped']:.2f}x) | {ran} of {total} grouped convs block-diagonal | mean "
                  f"density {sum(dens) / len(dens):.2f}", flush=True)
            del runs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
