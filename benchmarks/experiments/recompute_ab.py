"""A/B of ``convert(recompute=True)`` (value mode: convolutions that read an activation's, a max
pooling's or the input sparsifier's whole values and feed only an activation recompute their whole
output, and that activation keeps no float32 accumulator) against delta mode, in one process, with
the dense model replayed as a CUDA graph as the baseline.

    PYTHONPATH=. python benchmarks/experiments/recompute_ab.py [--models mobilenet_v2 resnet50] \\
        [--videos vtest.avi one-by-one-person-detection.mp4] [--thresholds 0.02 1e6] [--calibrated]

Each variant (float16 unless ``--dtype float32``, TF32, 1080x1920, CUDA-graph replay) and the dense graph run frame by frame in turn on
the same frames (``--start``, ``--frames``; the first two are the key frame and the captured one):
the median ms per frame after ``--warmup`` frames, the mean logit relative error of each variant
against the dense model of the same dtype, and the FLOPs density; "value_before_sums" is value mode without the
residual adds of whole operands (ResNet's third ReLU per block in delta mode, as before 2026-12-01);
"value_on_row_lists" without those whose downsampling identity is off a row list (as before ``conv1x1_into``);
"value_without_whole_sums" with ``deltaconv.convert.WHOLE_SUMS`` off (MobileNet's projections and adds in delta mode);
"value_without_whole_products" with ``deltaconv.convert.WHOLE_PRODUCTS`` off (squeeze-excite products in delta mode);
"value_writing_changes" with ``deltaconv.convert.SKIP_UNREAD_CHANGES`` off;
"value_pooling_changes" with ``deltaconv.convert.WHOLE_MAX_POOLING`` off (max poolings keep accumulators);
"value_writing_fused_changes" with only the activations fused with a residual add writing their changes;
"value_with_stem" lets the stems recompute too
(3 input channels: their tensor-core kernel reads a copy of the frame padded to 8 channels, which value
mode pads at every pixel; ``MIN_RECOMPUTE_CHANNELS`` 1, the default since 2026-12-07, so now the same as "value");
"value_delta_stem" leaves them in delta mode (``MIN_RECOMPUTE_CHANNELS`` 8, the default before).
``--calibrated``: mobilenet_v2 also at its
float16 thresholds calibrated for 1 % (``benchmarks/results/fidelity_thresholds_*_0.01_rms_float16.json``).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (add_video_ab_arguments, alternate_frames, dense_baseline, error_and_density, run_info,  # noqa: E402
                    video_models)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import without_kept_outputs, writing_changes  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
def only_on_row_lists(dm):
    """``dm`` (a torchvision ResNet) with the adds of a downsampling identity off any row list in delta
    mode (both convolutions' ``keeps_output`` cleared, before the first frame): value mode through the
    residual adds as it was before ``conv1x1_into`` (2026-12-01, 12 of resnet50's 16 blocks); the activations
    write their changes (:func:`~helpers.writing_changes`: those convolutions read them now). Returns ``dm``."""
    for name, layer in dm.named_modules():
        if getattr(layer, "keeps_output", False) and not layer.takes_rows and name.endswith(".downsample.0"):
            layer.keeps_output = False
            dm.get_submodule(name[:-len("downsample.0")] + "conv3").keeps_output = False
    return writing_changes(dm)


def reading_sent(dm) -> None:
    """The input sparsifiers give their ``sent`` as their whole values (``whole_from_frame`` off)."""
    for layer in dm.delta_layers():
        if hasattr(layer, "whole_from_frame"):
            layer.whole_from_frame = False


#: the variants: ``convert(recompute=)``, what is undone before the first frame (``None``: nothing), and the
#: ``deltaconv.convert`` flags set for the conversion (the others at their defaults);
#: "value": the default (projections and adds keep whole values: MobileNet's expansions recompute; the
#: squeeze-excite products and the max poolings take whole values); "value_without_whole_sums": without the
#: first (``WHOLE_SUMS`` off, the default before 2026-12-01 23:00 UTC); "value_without_whole_products": without
#: the second (``WHOLE_PRODUCTS`` off, the default before 2026-12-02 01:15 UTC); "value_pooling_changes": the
#: max poolings keep accumulators (``WHOLE_MAX_POOLING`` off, the default before 2026-12-02 04:30 UTC);
#: "value_writing_changes": the activations write their changes also where no reader reads them
#: (``SKIP_UNREAD_CHANGES`` off); "value_writing_fused_changes": only those fused with a residual add do (as
#: before 2026-12-02 03:20 UTC, :func:`~helpers.writing_changes`); "value_with_stem": the stems (3 input
#: channels) recompute too (``MIN_RECOMPUTE_CHANNELS`` 1, the default since 2026-12-07); "value_delta_stem": they
#: do not (8, the default before); "value_stem_reading_sent": the stems recompute from the sparsifier's ``sent``
#: instead of the frame's values (``DCSparsify.whole_from_frame`` off, the default before 2026-12-07 22:00 UTC,
#: :func:`reading_sent`); "value_delta_heads": the classifier heads in delta mode (``WHOLE_HEADS`` off, the
#: default before branch whole-head); "value_before_sums": value mode as it was before the
#: residual adds took it (ResNet's first two ReLUs per block only, every activation writing its changes,
#: :func:`~helpers.without_kept_outputs`); "value_on_row_lists": the residual adds in value mode only where the
#: kept outputs are on row lists (:func:`only_on_row_lists`)
VARIANTS = {"delta": (False, None, {}), "value": (True, None, {}),
            "value_without_whole_sums": (True, None, {"WHOLE_SUMS": False}),
            "value_without_whole_products": (True, None, {"WHOLE_PRODUCTS": False}),
            "value_pooling_changes": (True, None, {"WHOLE_MAX_POOLING": False}),
            "value_writing_changes": (True, None, {"SKIP_UNREAD_CHANGES": False}),
            "value_writing_fused_changes": (True, partial(writing_changes, fused_only=True), {}),
            "value_with_stem": (True, None, {"MIN_RECOMPUTE_CHANNELS": 1}),
            "value_delta_stem": (True, None, {"MIN_RECOMPUTE_CHANNELS": 8}),
            "value_stem_reading_sent": (True, reading_sent, {}),
            "value_delta_heads": (True, None, {"WHOLE_HEADS": False}),
            "value_before_sums": (True, without_kept_outputs, {}),
            "value_on_row_lists": (True, only_on_row_lists, {}),
            "delta_again": (False, None, {})}
CALIBRATED = {"vtest.avi": "fidelity_thresholds_vtest_0.01_rms_float16.json",
              "one-by-one-person-detection.mp4": "fidelity_thresholds_one_0.01_rms_float16.json"}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["mobilenet_v2", "resnet50"])
    add_video_ab_arguments(p, (1080, 1920))
    p.set_defaults(thresholds=[0.02, 1e6])
    p.add_argument("--calibrated", action="store_true")
    p.add_argument("--order", nargs="+", default=["delta", "value", "value_with_stem"], choices=list(VARIANTS),
                   help="the variants in the order each frame runs them (the dense graph last); delta_again: "
                        "delta mode once more, an A/A control of the order's own effect")
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"],
                   help="float32: the convolutions in TF32 on both sides (PyTorch's default for cuDNN)")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    import deltaconv
    convert_module = importlib.import_module("deltaconv.convert")  # the module (deltaconv.convert is the function)

    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}", flush=True)
    for video, name, model, frames in video_models(a.videos, a.models, a.start, a.frames, a.size, dtype):
        settings = [(f"t={t:g}", dict(threshold=t)) for t in a.thresholds]
        if a.calibrated and name == "mobilenet_v2":
            settings.append((CALIBRATED[video], dict(thresholds=str(RESULTS / CALIBRATED[video]))))
        dense_graph, reference = dense_baseline(model, frames)
        for label, kw in settings:
            runs = {}
            with torch.no_grad():
                for v in a.order:
                    recompute, undo, flags = VARIANTS[v]
                    defaults = {k: getattr(convert_module, k) for k in flags}
                    for k, value in flags.items():
                        setattr(convert_module, k, value)
                    try:
                        dm = deltaconv.convert(model, backend="cuda", example_input=frames[0], cuda_graph=True,
                                               check_finite=False, recompute=recompute, **kw)
                    finally:
                        for k, value in defaults.items():
                            setattr(convert_module, k, value)
                    if undo is not None:  # before the first frame: those adds then run in delta mode
                        undo(dm)
                    dm(frames[0]), dm(frames[1])  # key frame, then the captured frame
                    dm.reset_stats()
                    runs[v] = dm
                runs["dense"] = dense_graph
                ms, _ = alternate_frames(runs, frames[2:], a.warmup)
                # errors and densities over the same frames, from the key frame
                errors = {v: error_and_density(runs[v], frames, reference) for v in a.order}
            first = a.order[0]
            parts = [f"{v} {ms[v]:.3f} ms ({ms['dense'] / ms[v]:.2f}x, {ms[first] / ms[v]:.3f}x of {first}; error / "
                     f"FLOPs density {errors[v][0]:.4f} / {errors[v][1]:.3f}; state "
                     f"{runs[v].state_bytes() / 2**20:.0f} MiB; {len(runs[v].report.recomputing) // 2} convs "
                     "recompute)" for v in a.order]
            print(f"== {name} {a.size[0]}x{a.size[1]} {a.dtype} {video} frames {a.start + 2}-{a.start + a.frames - 1} "
                  f"{label}: dense graph {ms['dense']:.3f} ms; " + "; ".join(parts) +
                  f"; order {' '.join(a.order)} dense", flush=True)
            del runs
        del model, frames, dense_graph
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
