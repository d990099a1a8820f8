"""The ``deltaconv`` command line (also ``python -m deltaconv``).

Subcommands::

    deltaconv demo      [--video PATH | --camera N] [--model NAME] [--threshold T] [--device cpu|cuda]
                        [--max-frames N] [--start N] [--size HxW] [--crop X,Y,W,H] [--out out.mp4] ...
    deltaconv convert   MODEL --report [--size HxW]
    deltaconv bench     {kernel,video,all} [args forwarded to benchmarks/<name>_sweep.py]
    deltaconv calibrate [--video PATH] [--model NAME] --tolerance E [--start JSON] [--out thresholds.json]
                        [--frames N] [--size HxW] [--crop X,Y,W,H] [--output NAME] [--metric M] [--plot PNG]

``main(argv)`` returns the exit status: 0 on success, 1 when the command failed, 2 for a usage error
(argparse errors exit with status 2 as usual).
"""
from __future__ import annotations

import argparse
import json
import math
import runpy
import sys
from pathlib import Path
from typing import Optional, Sequence

#: the zoo's other real-weight models, named in the help (kept here so that ``--help`` imports no torch; a test
#: checks it against ``deltaconv.zoo.REAL_WEIGHT_MODELS``)
REAL_WEIGHT_NAMES = "craft, ppocr_det, mtcnn_pnet, selfie_segmentation, blazepose_full"
#: the benchmark scripts ``deltaconv bench`` runs, by sweep name
BENCH_SCRIPTS = {"kernel": "kernel_sweep.py", "video": "video_sweep.py"}


class CLIError(Exception):
    """A user-facing error of a subcommand: printed as ``deltaconv <cmd>: error: ...``, status 2."""


# ----------------------------------------------------------------------------- argument types
def parse_size(text: str) -> tuple[int, int]:
    """``"HxW"`` (e.g. ``"224x320"``) as ``(height, width)``, the order of :mod:`deltaconv.video`."""
    parts = str(text).lower().replace("*", "x").split("x")
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW (height x width) such as 224x320, got {text!r}") from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"height and width must be >= 1, got {text!r}")
    return h, w


def _number(parse, valid, expected: str):
    """An argparse ``type``: ``parse(text)``, rejected with "expected <expected>" unless ``valid``."""
    def convert(text: str):
        try:
            v = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not valid(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return v
    return convert


_nonneg_float = _number(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
_positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
_nonneg_int = _number(int, lambda v: v >= 0, "an integer >= 0 (0: all frames)")
_frame_index = _number(int, lambda v: v >= 0, "a frame index >= 0")


def _count_or_all(text: str) -> Optional[int]:
    return _nonneg_int(text) or None


def parse_crop(text: str) -> tuple[int, int, int, int]:
    """``"X,Y,W,H"`` (e.g. ``"585,227,148,148"``) as ``(x, y, width, height)`` in the video's pixels, the order of
    :func:`deltaconv.video.read_frames`' ``crop``."""
    try:
        x, y, w, h = (int(t) for t in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X,Y,W,H (corner and size in pixels) such as 585,227,148,148, "
                                         f"got {text!r}") from None
    if min(x, y) < 0 or min(w, h) < 1:
        raise argparse.ArgumentTypeError(f"expected a corner >= 0 and a size >= 1, got {text!r}")
    return x, y, w, h


def _add_input_range(parser: argparse.ArgumentParser) -> None:
    """The ``--input-range`` option of a model file (``.onnx`` / ``.tflite`` given as the model)."""
    parser.add_argument("--input-range", choices=("imagenet", "unit", "signed", "byte"), default=None,  # INPUT_RANGES
                        help="a model file's input scaling: ImageNet-normalised, [0, 1], [-1, 1] or [0, 255] RGB "
                             "(default: unit for .tflite, imagenet for .onnx)")


def _float_list(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0,0.05,0.1, got {text!r}") from None
    if not values or any(v < 0 or not math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0, got {text!r}")
    return values


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The ``deltaconv`` argument parser with its four subcommands."""
    p = argparse.ArgumentParser(prog="deltaconv", description="Sparse delta inference for video CNNs: convert a "
                                "dense PyTorch CNN so that after a key frame every layer processes only changed pixels.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="{demo,convert,bench,calibrate}")
    sub.required = True

    d = sub.add_parser("demo", help="dense vs converted model side by side on a video -> annotated mp4",
                       description="Run the dense model and its converted delta model on a video, side by side, "
                       "and write an annotated mp4 (results, update mask, ms, speedup, density, agreement).")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--video", metavar="PATH", help="video file (default: the sample vtest.avi)")
    src.add_argument("--camera", metavar="N", type=int, help="camera index for cv2.VideoCapture")
    d.add_argument("--model", default="mobilenet_v2", metavar="NAME",
                   help=f"mobilenet_v2 (default, real ImageNet weights), {REAL_WEIGHT_NAMES} (real weights), a "
                   "torchvision name, pkg.module:factory, or a .onnx / .tflite file")
    _add_input_range(d)
    d.add_argument("--task", choices=("classification", "segmentation", "text", "faces", "pose"),  # demo.DRAWN_TASKS
                   help="how to draw the output (default: the zoo's for the model, else inferred from its shape)")
    d.add_argument("--threshold", type=_nonneg_float, default=0.02, metavar="T",
                   help="uniform threshold of the sparsifier and non-linear layers (default 0.02)")
    d.add_argument("--thresholds", metavar="JSON", help="per-layer thresholds (from deltaconv calibrate)")
    d.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    d.add_argument("--backend", default="auto", choices=("auto", "reference", "cuda"))
    d.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="both models' dtype (default auto: float16 on cuda, float32 on cpu)")
    d.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="replay both models as CUDA graphs (default: on with --device cuda and the CUDA backend)")
    d.add_argument("--no-fold-bn", action="store_true",
                   help="keep each BatchNorm a layer of its own (convert(fold_bn=False): one more pass per "
                        "BatchNorm, for about the dense float16 model's error at threshold 0, which folding also "
                        "keeps; default: as the --thresholds file records it, else folded)")
    d.add_argument("--no-recompute", action="store_true",
                   help="delta mode everywhere (convert(recompute=False)); by default a convolution between a "
                        "layer with whole values and an activation (or a residual add fused with one, whose other "
                        "operand is whole) recomputes its output, and that activation keeps no float32 "
                        "accumulator")
    d.add_argument("--max-frames", type=_count_or_all, default=150, metavar="N",
                   help="frames to process (default 150; 0: the whole video)")
    d.add_argument("--size", type=parse_size, metavar="HxW",
                   help="model input size (default: the model's own size if it has one, else the video's)")
    d.add_argument("--crop", type=parse_crop, metavar="X,Y,W,H",
                   help="the region of every frame the models see, in the video's pixels, before the resize to "
                        "--size: a fixed person crop for a pose model such as blazepose_full (default: whole frames)")
    d.add_argument("--start", type=_frame_index, default=0, metavar="N",
                   help="the first frame of the video to run (default 0)")
    d.add_argument("--out", default="demo.mp4", metavar="out.mp4", help="annotated video to write (default demo.mp4)")
    d.add_argument("--snapshot", metavar="PNG", help="also save one annotated frame as PNG")
    d.add_argument("--snapshot-frame", type=int, default=-1, metavar="I",
                   help="index of the frame --snapshot saves (default: the last)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser("convert", help="convert a model and print the conversion table",
                       description=f"Convert a model (torchvision name, mobilenet_v2, {REAL_WEIGHT_NAMES}, "
                       "pkg.module:factory, or a .onnx / .tflite file) "
                       "and print what became of every node, and the fallbacks.")
    c.add_argument("model", metavar="MODEL")
    _add_input_range(c)
    c.add_argument("--report", action="store_true", help="print the full conversion table (default: counts only)")
    c.add_argument("--size", type=parse_size, metavar="HxW",
                   help="example input size used to trace shapes (default: the model's own, else 224x224)")
    c.set_defaults(func=cmd_convert)

    b = sub.add_parser("bench", help="run the benchmark sweeps (benchmarks/*_sweep.py)",
                       description="Run benchmarks/kernel_sweep.py or benchmarks/video_sweep.py of the source "
                       "checkout; the remaining arguments are passed to the script.")
    b.add_argument("sweep", choices=(*BENCH_SCRIPTS, "all"), help="which sweep ('all': each in turn, no extra args)")
    b.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    b.set_defaults(func=cmd_bench)

    k = sub.add_parser("calibrate", help="per-layer thresholds for an error tolerance -> thresholds.json",
                       description="Calibrate per-layer thresholds with deltaconv.calibrate on video frames, save "
                       "the JSON that convert(..., thresholds=PATH) loads, print the trade-off and plot error and "
                       "density against a uniform threshold. For a detection model, its backbone's thresholds, "
                       "with the error over every feature map, for deltaconv.convert_backbone.")
    k.add_argument("--video", metavar="PATH", help="video file (default: the sample vtest.avi)")
    k.add_argument("--model", default="mobilenet_v2", metavar="NAME")
    _add_input_range(k)
    k.add_argument("--tolerance", type=_nonneg_float, required=True, metavar="E",
                   help="largest acceptable error: relative error for rel_err, 1 - score for "
                        "top1/top5/iou/prob_iou/miou")
    k.add_argument("--metric", default="rel_err",
                   help="error metric of deltaconv.calibrate: rel_err (default), top1, top5, iou (of logits > 0), "
                        "prob_iou (of probabilities > 0.5), miou")
    k.add_argument("--max-evals", type=_positive_int, default=None, metavar="N",
                   help="model runs the calibration may spend (default: deltaconv.calibrate's)")
    k.add_argument("--truncation", default="max", choices=("max", "rms", "pooled", "hybrid"),
                   help="change measure of the layer thresholds: max_c |change|, sqrt(mean_c change^2), that of "
                        "the change averaged over each pixel's 3x3 window, or hybrid: pooled in the layers at "
                        "stride 4 and coarser, rms nearer the input (default max)")
    k.add_argument("--cost", default="flops", choices=("flops", "elements"),
                   help="what the calibration minimises: the FLOPs-weighted density, or updated pixels weighted by "
                        "each layer's output elements (memory traffic, most of a GPU frame) (default flops)")
    k.add_argument("--start", metavar="JSON",
                   help="refine these thresholds (an earlier calibration's file) instead of searching from scratch "
                        "(calibrate(start=...)); give the --truncation they were calibrated with")
    k.add_argument("--step", type=_positive_int, default=None, metavar="K",
                   help="refinement moves in K steps of sqrt(2) (default: deltaconv.calibrate's, 2); 1 with --start "
                        "refines a calibration of step 2 more finely")
    k.add_argument("--out", default="thresholds.json", metavar="thresholds.json")
    k.add_argument("--frames", type=_positive_int, default=8, metavar="N", help="frames to calibrate on (default 8)")
    k.add_argument("--size", type=parse_size, metavar="HxW",
                   help="model input size (default: the model's own size if it has one, else the video's)")
    k.add_argument("--crop", type=parse_crop, metavar="X,Y,W,H",
                   help="calibrate on this region of every frame (as demo --crop; default: whole frames)")
    k.add_argument("--output", metavar="NAME",
                   help="the output the error is measured on: a key of a dict output (landmarks of blazepose_full) "
                        "or the index of a tuple's (default: the primary output, a dict's 'out' or first value)")
    k.add_argument("--sweep", type=_float_list, default=[0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5], metavar="T,T,...",
                   help="uniform thresholds of the trade-off table and plot")
    k.add_argument("--plot", metavar="PNG", help="trade-off plot (default: <out>.png)")
    k.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the models run while calibrating (default cpu)")
    k.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                   help="the models' dtype while calibrating: the one you will deploy in (default float32)")
    k.add_argument("--backend", default="auto", choices=("auto", "reference", "cuda"),
                   help="the converted model's backend while calibrating (default auto: the CUDA kernels on "
                        "--device cuda, else the reference)")
    k.add_argument("--no-fold-bn", action="store_true",
                   help="calibrate the conversion that keeps each BatchNorm a layer (convert(fold_bn=False)); "
                        "deploy it the same way")
    k.set_defaults(func=cmd_calibrate)
    return p


def _version() -> str:
    from . import __version__

    return __version__


# ----------------------------------------------------------------------------- commands
def cmd_demo(args: argparse.Namespace) -> int:
    """``deltaconv demo``: run :func:`deltaconv.demo.run_demo` and print its summary."""
    from .demo import run_demo

    run_demo(video=args.video, camera=args.camera, model=args.model, threshold=args.threshold, device=args.device,
             max_frames=args.max_frames, size=args.size, out=args.out, backend=args.backend,
             thresholds=args.thresholds, snapshot=args.snapshot, snapshot_frame=args.snapshot_frame,
             progress=not args.no_progress, verbose=True, dtype=args.dtype, cuda_graph=args.cuda_graph,
             fold_bn=False if args.no_fold_bn else None, recompute=not args.no_recompute, crop=args.crop,
             start=args.start, input_range=args.input_range, task=args.task)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """``deltaconv convert MODEL [--report]``: print the conversion table and the fallbacks."""
    import torch

    from . import zoo
    from .convert import convert

    entry = zoo.load(args.model, args.input_range)
    size = args.size or entry.input_size or (224, 224)
    part = ""
    if entry.task == "detection":  # does not trace whole: its backbone, on what its transform makes of a frame
        from .detection import convert_backbone

        dm = convert_backbone(entry.model, torch.rand(1, 3, *size)).backbone
        part = " (its backbone; the heads stay dense)"
    else:
        dm = convert(entry.model, example_input=torch.randn(1, 3, *size))
    report = dm.report
    if args.report:
        if part:
            print(f"{entry.name}{part}:")
        print(str(report))
    else:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(report.counts().items()))
        print(f"{entry.name}{part}: {len(report.nodes)} nodes: {counts}")
    fallbacks = report.fallbacks
    if fallbacks:
        if not args.report:  # the table already lists them
            print("fallbacks: " + ", ".join(f"{n.node} ({n.target})" for n in fallbacks))
    else:
        print("fallbacks: none")
    return 0


def _bench_dirs() -> list[Path]:
    root = Path(__file__).resolve().parent.parent
    dirs = [root / "benchmarks", Path.cwd() / "benchmarks"]
    return list(dict.fromkeys(dirs))


def find_bench_script(sweep: str) -> Path:
    """Path of ``benchmarks/<sweep>_sweep.py`` (in the source checkout, then the working directory);
    ``FileNotFoundError`` naming the places searched otherwise."""
    if sweep not in BENCH_SCRIPTS:
        raise ValueError(f"sweep must be one of {sorted(BENCH_SCRIPTS)}, got {sweep!r}")
    for d in _bench_dirs():
        if (d / BENCH_SCRIPTS[sweep]).is_file():
            return d / BENCH_SCRIPTS[sweep]
    raise FileNotFoundError(f"benchmark script {BENCH_SCRIPTS[sweep]!r} for sweep {sweep!r} not found (searched "
                            f"{', '.join(str(d) for d in _bench_dirs())}); the benchmark scripts ship with the "
                            "source checkout, not with the installed package")


def cmd_bench(args: argparse.Namespace) -> int:
    """``deltaconv bench SWEEP [args]``: run the benchmark script via runpy with ``args`` as its argv."""
    extra = [a for a in args.args if a != "--"] if args.args[:1] == ["--"] else list(args.args)
    if args.sweep == "all" and extra:
        raise CLIError(f"sweep: 'all' takes no script arguments (got {extra!r}); run one sweep to pass arguments")
    sweeps = list(BENCH_SCRIPTS) if args.sweep == "all" else [args.sweep]
    try:
        scripts = [find_bench_script(s) for s in sweeps]
    except FileNotFoundError as e:
        raise CLIError(str(e)) from None
    status = 0
    for script in scripts:
        saved = sys.argv[:]
        sys.argv = [str(script), *extra]
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as e:  # the script's own exit status
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code not in (None, 0) and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
            status = status or code
        finally:
            sys.argv = saved
    return status


def _load_frames(video, frames: int, size, normalize: bool = True, crop=None):
    from .video import read_frames

    if video is not None and not Path(video).is_file():
        from .video import SAMPLE_VIDEO_HELP

        raise CLIError(f"--video: {video!r} does not exist. {SAMPLE_VIDEO_HELP}")
    if crop is not None:  # inside the video's frames, or an error that names the option
        from .video import check_crop_inside, find_sample_video, video_info

        info = video_info(video if video is not None else find_sample_video())
        try:
            check_crop_inside(crop, info["width"], info["height"], "--crop")
        except ValueError as error:
            raise CLIError(str(error)) from None
    out = list(read_frames(video, max_frames=frames, size=size, normalize=normalize, crop=crop))
    if len(out) < 2:
        raise CLIError(f"--video: {str(video)!r} gave {len(out)} frame(s); at least 2 are needed")
    return out


def _save_thresholds(result, path: Path) -> dict:
    """Write what ``deltaconv.calibrate`` returned as the JSON ``convert(..., thresholds=PATH)``
    loads (``{"thresholds": {name: value}, ...}``); returns the thresholds."""
    if not isinstance(result, dict) or not all(isinstance(v, (int, float)) for v in result.values()):
        raise CLIError(f"calibrate: deltaconv.calibrate returned {type(result).__name__}, expected a dict of "
                       "{layer name: threshold}")
    if callable(getattr(result, "save", None)):
        result.save(path)  # a Calibration: thresholds plus the change detector and what was measured
    else:
        with open(path, "w") as f:
            json.dump({"thresholds": dict(result)}, f, indent=1, sort_keys=True)
    return dict(result)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``deltaconv calibrate``: per-layer thresholds within ``--tolerance``, saved as JSON, with the
    trade-off table (uniform thresholds and the calibrated ones) and a plot."""
    import importlib

    try:
        mod = importlib.import_module("deltaconv.calibrate")
    except ModuleNotFoundError as e:
        if e.name != "deltaconv.calibrate":
            raise
        raise CLIError("deltaconv.calibrate is not available yet (deltaconv/calibrate.py is missing from this "
                       "version); meanwhile pick a uniform --threshold for `deltaconv demo`") from None
    calibrate = getattr(mod, "calibrate", None)
    if not callable(calibrate):
        raise CLIError("deltaconv.calibrate has no calibrate() function")

    from . import zoo
    from .demo import format_sweep, plot_tradeoff, threshold_sweep
    from .video import find_sample_video

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device: 'cuda' asked but torch.cuda.is_available() is False")
    entry = zoo.load(args.model, args.input_range)
    dtype = getattr(torch, args.dtype)
    video = args.video if args.video is not None else str(find_sample_video())
    kwargs = {} if args.max_evals is None else {"max_evals": args.max_evals}
    if args.start is not None:
        if not Path(args.start).is_file():
            raise CLIError(f"--start: no thresholds file at {args.start!r}")
        kwargs["start"] = args.start
    if args.step is not None:
        kwargs["step"] = args.step
    output_fn, what = None, entry.name
    if args.output is not None and entry.task == "detection":
        raise CLIError(f"--output: a detector's backbone is calibrated on all its feature maps; got --output "
                       f"{args.output!r} for {entry.name}")
    if entry.task == "detection":  # calibrate the backbone that convert_backbone converts, on every pyramid level
        from .detection import backbone_input, feature_maps

        full_model = entry.model.to(args.device, dtype).eval()
        images = _load_frames(video, args.frames, args.size, normalize=False, crop=args.crop)  # normalised by it
        model = full_model.backbone
        frames = [backbone_input(full_model, f.to(args.device, dtype)) for f in images]
        output_fn, what = feature_maps, f"{entry.name}'s backbone"
        kwargs["output_fn"] = feature_maps
    else:
        model = entry.model.to(args.device, dtype)
        size = args.size or entry.input_size  # the one size the model takes, else the video's
        frames = [f.to(args.device, dtype) for f in _load_frames(video, args.frames, size, crop=args.crop)]
        if args.output is not None:
            from .fidelity import OutputPicker

            output_fn, what = OutputPicker(args.output), f"{entry.name} ({args.output})"
            kwargs["output_fn"] = output_fn
    if args.cost != "flops":
        kwargs["cost"] = args.cost
    backend = args.backend
    if backend == "auto":  # calibrate()'s own default is the reference backend
        backend = "cuda" if args.device == "cuda" else "reference"
    if args.no_fold_bn:
        kwargs["fold_bn"] = False
    result = calibrate(model, frames, args.tolerance, metric=args.metric, truncation=args.truncation,
                       backend=backend, **kwargs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    thresholds = _save_thresholds(result, out)
    detector = result.detector() if callable(getattr(result, "detector", None)) else None
    sweep_kw = {} if output_fn is None else {"output_fn": output_fn}
    rows = threshold_sweep(model, frames, args.sweep, backend=backend, calibrated=thresholds,
                           change_detector=detector, truncation=args.truncation, fold_bn=not args.no_fold_bn,
                           **sweep_kw)
    h, w = frames[0].shape[-2:]
    from .video import describe_crop

    print(f"calibrated {len(thresholds)} thresholds of {what} on {len(frames)} frames of {video} at {h}x{w}"
          f"{describe_crop(args.crop)} "
          f"in {args.dtype} on {args.device} ({backend} backend) for tolerance {args.tolerance:g} ({args.metric}); "
          f"wrote {out}")
    if entry.task == "detection":
        print(f"use them with deltaconv.convert_backbone(model, frames, thresholds={str(out)!r})")
    print(format_sweep(rows))
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    plot_tradeoff(rows, plot, title=f"{what} on {Path(video).name} at {h}x{w}, {len(frames)} frames",
                  tolerance=args.tolerance)
    print(f"wrote {plot}")
    return 0


# ----------------------------------------------------------------------------- entry point
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``deltaconv`` command line with ``argv`` (default ``sys.argv[1:]``); returns the
    exit status (usage errors raise ``SystemExit(2)`` from argparse)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    from .zoo import UnknownModelError

    try:
        return int(args.func(args) or 0)
    except (CLIError, UnknownModelError) as e:
        print(f"deltaconv {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, RuntimeError, TypeError, KeyError) as e:
        print(f"deltaconv {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"deltaconv {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
