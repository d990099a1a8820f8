# A helper of the experiment scripts in this folder (imported by them; run them from the repository root).
"""One converted model at a uniform threshold against the dense model: what the density experiments
(pooled_truncation.py, damped_send.py, hybrid_models.py) measure per configuration."""
import argparse
import time

import torch

import deltaconv
from deltaconv.fidelity import FidelityReport, compare, video_frames


def uniform_run(model, frames: list, dense: list, t: float, t_in: float, truncation: str = "rms",
                task: str = "classification") -> tuple[FidelityReport, float]:
    """``(report, seconds)`` of ``model`` converted at threshold ``t`` in every non-linear layer and
    ``t_in`` in the input sparsifier (reference backend) over ``frames`` against ``dense`` (the dense
    model's primary outputs); the seconds are the converted model's run."""
    dm = deltaconv.convert(model, threshold=t, truncation=truncation, backend="reference", example_input=frames[0])
    dm.load_thresholds({dm.delta_layers()[0].layer_name: t_in})
    start = time.time()
    rep = compare(model, dm, frames, task=task, dense_outputs=dense)
    return rep, time.time() - start


def summary(rep: FidelityReport, seconds: float) -> str:
    """``density D err mean E p95 P (Ss)``: the line the experiments print per run."""
    return (f"density {rep.density:.3f} err mean {rep.mean('rel_err'):.4f} "
            f"p95 {rep.quantile('rel_err', 0.95):.4f} ({seconds:.0f}s)")


def clip_arguments(p: argparse.ArgumentParser, size: tuple[int, int], frames: int) -> None:
    """``--videos``, ``--size``, ``--start`` and ``--frames``: the clip of each sample video an
    experiment runs on (``frames`` frames from ``--start``, the first the key frame, at ``size``)."""
    p.add_argument("--videos", nargs="+", default=["vtest.avi"])
    p.add_argument("--size", type=int, nargs=2, default=size)
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--frames", type=int, default=frames)


def clips(model, a: argparse.Namespace, device: str = "cpu"):
    """``(video, frames, dense)`` of each clip of :func:`clip_arguments`' ``a``: the frames on ``device`` and
    ``model``'s outputs on them (two CPU threads, TF32 off: float32 as on the CPU)."""
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    for video in a.videos:
        frames = [x.to(device) for x in video_frames(video, tuple(a.size), a.frames, a.start)]
        with torch.no_grad():
            yield video, frames, [model(x) for x in frames]
