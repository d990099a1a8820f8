"""Any zoo model (``deltaconv.zoo.load``: a real-weight entry such as ``mtcnn_pnet`` or ``blazepose_full``, a
torchvision name, an import path or a ``.onnx`` / ``.tflite`` file) converted and timed against the same dense model
on real video.

For each model and threshold, three variants run frame by frame in turn on the same frames (CUDA events around
each call, medians after ``--warmup`` frames): the dense model eager, the dense model replayed as a CUDA graph
(captured on the first frame), and the converted model (``backend="cuda"``, ``cuda_graph=True``, key frame and
capture on the first two frames). All in ``--dtype`` and channels_last. Then the converted model runs the frames
again from its key frame for the relative error of each of its outputs against the dense model's (over the whole
sequence, :func:`output_errors`; ``rel_err`` is the first output's) and, for scale, both models' against the float32
model's, and its FLOPs density. Frames are taken at the model's own input size (the zoo's
``input_size``, e.g. BlazePose's 256x256) or ``--size``; ``--crop x y w h`` takes a fixed region of each frame
first (a person crop for a pose model). Writes ``benchmarks/results/zoo_speed.csv``. On a CUDA machine with the
sample videos reachable::

    PYTHONPATH=. python benchmarks/zoo_speed.py --models mtcnn_pnet --size 576 768
    PYTHONPATH=. python benchmarks/zoo_speed.py --models blazepose_full --crop 585 227 148 148 --start 28
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, alternate_frames, captured, graphed_model, patched, run_info, write_csv  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv import zoo  # noqa: E402
from deltaconv.fidelity import flops_density, relative_error  # noqa: E402
from deltaconv.model_files import INPUT_RANGES  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402


def input_size(entry: zoo.ZooModel, size) -> tuple[int, int]:
    """``size`` if given (it must then be the model's own size, when it has one), else the model's own size; a
    ``ValueError`` naming the model when neither is known or they differ."""
    if size is not None and entry.input_size is not None and tuple(size) != entry.input_size:
        raise ValueError(f"--size: {entry.name} takes only {entry.input_size[0]}x{entry.input_size[1]}, "
                         f"got {size[0]}x{size[1]}")
    if size is None and entry.input_size is None:
        raise ValueError(f"--size: {entry.name} takes any input size; give one (H W)")
    return tuple(size) if size is not None else entry.input_size


def named_outputs(y) -> dict[str, torch.Tensor]:
    """The tensors of a model's output by name: a dict's keys, ``out0, out1, ...`` of a tuple, ``out`` of a tensor."""
    if torch.is_tensor(y):
        return {"out": y}
    items = y.items() if isinstance(y, dict) else ((f"out{i}", v) for i, v in enumerate(y))
    return {k: v for k, v in items if torch.is_tensor(v)}


def output_errors(outputs: list[dict], reference: list[dict]) -> dict[str, float]:
    """Relative error of each named output in ``outputs`` (one dict per frame) against ``reference``'s over the
    frames after the first (the key frame), taken over the whole sequence: ``sqrt(sum ||o - r||^2 / sum ||r||^2)``
    (a per-frame ratio would divide by ~0 where an output is a probability near 0 on some frames, such as
    BlazePose's pose flag when nobody is in the crop, which underflows to 0 in float16)."""
    pairs = list(zip(outputs[1:], reference[1:]))

    def squares(tensors) -> float:
        return sum(float(t.double().norm() ** 2) for t in tensors)

    return {k: (squares(o[k] - r[k] for o, r in pairs) / max(squares(r[k] for _, r in pairs), 1e-300)) ** 0.5
            for k in reference[0]}


def outputs_from_key_frame(model, frames) -> tuple[list[dict], list]:
    """``model``'s outputs (float32, by name) on ``frames``, a converted model reset to a key frame on the first
    one, and its stats over the rest (``[]`` for a dense model)."""
    converted = isinstance(model, deltaconv.DeltaModel)
    outs = []
    with torch.no_grad():
        if converted:
            model.reset()
        for i, f in enumerate(frames):
            outs.append({k: v.float() for k, v in named_outputs(model(f)).items()})
            if converted and i == 0:
                model.reset_stats()
    return outs, model.stats() if converted else []


def run(entry: zoo.ZooModel, frames: list, thresholds, warmup: int) -> list[dict]:
    """One row per threshold for ``entry`` on ``frames`` (already on the GPU in the model's dtype): the median ms
    per frame of the dense model eager, replayed as a CUDA graph and converted; the mean relative error of each
    output against the dense model's (``rel_err_<name>``; ``rel_err`` of the primary output), and for scale the
    dense model's and the converted model's against the float32 model's (``dense_vs_fp32_<name>``,
    ``deltaconv_vs_fp32_<name>``; TF32 off); the FLOPs density."""
    dense32 = copy.deepcopy(entry.model).to(frames[0].device).to(memory_format=torch.channels_last)
    dense = entry.model.to(frames[0].device, frames[0].dtype).to(memory_format=torch.channels_last)
    with patched(torch.backends.cudnn, "allow_tf32", False):
        exact, _ = outputs_from_key_frame(dense32, [f.float() for f in frames])
    del dense32
    reference, _ = outputs_from_key_frame(dense, frames)
    dense_vs_fp32 = output_errors(reference, exact)
    primary = next(iter(reference[0]))
    graph = graphed_model(dense, frames[0])
    rows = []
    for t in thresholds:
        dm = captured(lambda **kw: deltaconv.convert(dense, **kw), frames, t)
        with torch.no_grad():
            ms, _ = alternate_frames({"dense": dense, "dense_graph": graph, "delta": dm}, frames[2:], warmup)
        outputs, stats = outputs_from_key_frame(dm, frames)
        errors, density = output_errors(outputs, reference), flops_density(stats)
        rows.append({"model": entry.name, "resolution": "x".join(map(str, frames[0].shape[-2:])),
                     "dtype": str(frames[0].dtype).replace("torch.", ""), "threshold": t,
                     "frames": len(frames) - 2 - warmup, "dense_ms": ms["dense"], "dense_graph_ms": ms["dense_graph"],
                     "deltaconv_ms": ms["delta"], "speedup_vs_dense_graph": ms["dense_graph"] / ms["delta"],
                     "primary_output": primary, "rel_err": errors[primary], "flops_density": density,
                     "fallbacks": len(dm.report.fallbacks),
                     **{f"rel_err_{k}": v for k, v in errors.items()},
                     **{f"dense_vs_fp32_{k}": v for k, v in dense_vs_fp32.items()},
                     **{f"deltaconv_vs_fp32_{k}": v for k, v in output_errors(outputs, exact).items()}})
        print(f"{entry.name} {rows[-1]['resolution']} t={t}: dense {ms['dense']:.3f} ms, dense graph "
              f"{ms['dense_graph']:.3f} ms, deltaconv {ms['delta']:.3f} ms ({rows[-1]['speedup_vs_dense_graph']:.2f}x "
              f"of the dense graph); FLOPs density {density:.3f}; error vs dense (dense / deltaconv vs float32): "
              + ", ".join(f"{k} {v:.2e} ({dense_vs_fp32[k]:.2e} / {rows[-1][f'deltaconv_vs_fp32_{k}']:.2e})"
                         for k, v in errors.items()), flush=True)
        del dm
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["mtcnn_pnet", "blazepose_full"])
    p.add_argument("--video", default="vtest.avi")
    p.add_argument("--size", nargs=2, type=int, metavar=("H", "W"), help="default: the model's own input size")
    p.add_argument("--crop", nargs=4, type=int, metavar=("X", "Y", "W", "H"), help="a fixed region of each frame")
    p.add_argument("--input-range", choices=INPUT_RANGES,
                   help="a model file's input scaling (deltaconv.model_files; default: its format's)")
    p.add_argument("--start", type=int, default=0, help="first frame")
    p.add_argument("--frames", type=int, default=60, help="frames, the key frame and capture frame included")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--thresholds", nargs="+", type=float, default=[0.0, 0.01, 0.02])
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    p.add_argument("--out", type=Path, default=RESULTS / "zoo_speed.csv")
    a = p.parse_args(argv)
    if a.frames < a.warmup + 3:
        p.error(f"--frames must be at least --warmup + 3, got {a.frames} and {a.warmup}")
    if not torch.cuda.is_available():
        sys.exit("zoo_speed.py: needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    video, rows = find_sample_video(a.video), []
    for name in a.models:
        entry = zoo.load(name, a.input_range)
        size = input_size(entry, a.size)
        frames = [f.to("cuda", getattr(torch, a.dtype)) for f in
                  read_frames(video, max_frames=a.frames, size=size, start=a.start,
                              crop=tuple(a.crop) if a.crop else None)]
        for row in run(entry, frames, a.thresholds, a.warmup):
            rows.append({**row, "video": video.name, "start": a.start,
                         "crop": "x".join(map(str, a.crop)) if a.crop else "", **run_info()})
        write_csv(a.out, rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
