"""Video sweep: converted models against the same dense model on real video, per frame.

For each model, resolution, dtype and threshold it runs the frames of a sample video (``vtest.avi``,
native 576x768 and upscaled to 1080x1920) through

* the dense model (channels_last, ``cudnn.benchmark``), eager and replayed as a CUDA graph;
* the converted model (``backend="cuda"``), eager and with ``cuda_graph=True``;

timing every frame with CUDA events after warm-up and taking medians. It also records the output
relative error vs the dense model at the same dtype (and, for scale, the dense model's own error at
that dtype against float32: ``dense_rel_err_vs_fp32``), the mean fraction of updated pixels per layer
and the FLOPs-weighted density, and the converted model's state memory against the dense model's
activation memory: its peak, and the sum of all layer outputs (what a stateful method has to
keep). Writes ``benchmarks/results/video.csv`` (rewritten after every threshold, so a run cut short
by a time limit keeps the rows it finished) and ``video_density.png`` (per-layer density of one
configuration). A threshold of ``1e6`` sends nothing after the key frame: the time of such a frame
is the converted model's fixed cost per frame (its output drifts from dense). Run on a CUDA machine
with the sample videos reachable (see ``deltaconv.video.video_dirs``)::

    PYTHONPATH=. python benchmarks/video_sweep.py [--models resnet50 ...] [--frames 60] [--quick]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, graphed_model, reestimate_batchnorm, run_info, time_frames, write_csv  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.profile import dense_activation_bytes  # noqa: E402
from deltaconv.sparsify import from_spec  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402

MODELS = ["resnet50", "fcn_resnet50", "mobilenet_v2", "deeplabv3_mobilenet_v3_large"]
RESOLUTIONS = [(576, 768), (1080, 1920)]
THRESHOLDS = [0.0, 0.05, 0.1]


def build(name: str, frames: list, device: str = "cuda") -> torch.nn.Module:
    """The model with real weights where a package ships them (mobilenet_v2), else random weights
    whose BatchNorm statistics are re-estimated on ``frames`` (one float32 batch), so that activations
    keep the scale they have in a trained network (with default statistics, deep random networks
    such as deeplabv3_mobilenet_v3_large give a nearly constant output)."""
    if name == "mobilenet_v2":
        from deltaconv.weights import mobilenet_v2_imagenet
        return mobilenet_v2_imagenet()
    fn = getattr(torchvision.models, name, None) or getattr(torchvision.models.segmentation, name)
    kwargs = {"weights": None}
    if name.startswith(("fcn", "deeplab", "lraspp")):
        kwargs.update(weights_backbone=None, aux_loss=False)
    torch.manual_seed(0)
    # one batch: ASPP's pooled branch needs more than one value
    return reestimate_batchnorm(fn(**kwargs).to(device), torch.cat(frames).to(device)).cpu()


def main_out(y):
    return y["out"] if isinstance(y, dict) else y


def rel_err(a, b) -> float:
    a, b = main_out(a).float(), main_out(b).float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def sweep(models, resolutions, dtypes, thresholds, n_frames: int, warmup: int, video: Path, detector=None,
          start: int = 0, on_rows=None):
    """The rows of the sweep, and the per-layer density of one configuration; ``on_rows(rows)`` (if
    given) receives the rows so far after every threshold."""
    torch.backends.cudnn.benchmark = True
    info = run_info()
    rows, density_profile = [], None
    for name in models:
        for (h, w) in resolutions:
            frames_cpu = list(read_frames(video, max_frames=n_frames, size=(h, w), start=start))
            for dtype in dtypes:
                model = build(name, frames_cpu[:4]).cuda().to(dtype).to(memory_format=torch.channels_last)
                frames = [f.cuda().to(dtype) for f in frames_cpu]
                with torch.no_grad():
                    dense_eager_ms, dense_outs = time_frames(model, frames, warmup)
                    # the dense model's own rounding: this dtype against float32, same frames
                    model32, tf32 = copy.deepcopy(model).float(), torch.backends.cudnn.allow_tf32
                    torch.backends.cudnn.allow_tf32 = False
                    dense_err = statistics.mean(rel_err(d, model32(f.float())) for d, f in
                                                zip(dense_outs[1:], frames[1:]))
                    torch.backends.cudnn.allow_tf32 = tf32
                    del model32
                dense_graph_ms, _ = time_frames(graphed_model(model, frames[0]), frames, warmup)
                act = dense_activation_bytes(model, frames[0])
                for t in thresholds:
                    for use_graph in (False, True):
                        # a number: one threshold everywhere; a path: per-layer thresholds (calibrate's JSON,
                        # with its change detector and truncation measure)
                        per_layer = isinstance(t, Path)
                        dm = deltaconv.convert(model, threshold=0.0 if per_layer else t,
                                               thresholds=str(t) if per_layer else None,
                                               backend="cuda", example_input=frames[0],
                                               cuda_graph=use_graph, check_finite=False,
                                               change_detector=from_spec(detector))
                        ms, outs = time_frames(dm, frames, warmup)
                        errs = [rel_err(o, d) for o, d in zip(outs[1:], dense_outs[1:])]
                        stats = [s for s in dm.stats() if s["mean_density"] == s["mean_density"]]  # no NaN
                        mean_density = statistics.mean(s["mean_density"] for s in stats[1:])
                        flops_dense = sum(s["flops_dense"] for s in stats)
                        flops_done = sum(s["mean_flops_done"] for s in stats)
                        for baseline, dense_ms in (("eager", dense_eager_ms), ("cudagraph", dense_graph_ms)):
                            rows.append({
                                "model": name, "resolution": f"{h}x{w}", "dtype": str(dtype).replace("torch.", ""),
                                "baseline": baseline, "deltaconv_mode": "cudagraph" if use_graph else "eager",
                                "threshold": t.name if per_layer else t, "dense_ms": round(dense_ms, 3),
                                "deltaconv_ms": round(ms, 3),
                                "speedup": round(dense_ms / ms, 3), "rel_err": f"{statistics.mean(errs):.3e}",
                                "max_rel_err": f"{max(errs):.3e}", "dense_rel_err_vs_fp32": f"{dense_err:.3e}",
                                "mean_density": round(mean_density, 4),
                                "flops_density": round(flops_done / max(flops_dense, 1.0), 4),
                                "input_density": round(stats[0]["mean_density"], 4),
                                "state_mb": round(dm.state_bytes() / 2**20, 1),
                                "dense_activation_mb": round(act["peak"] / 2**20, 1),
                                "dense_activation_sum_mb": round(act["sum"] / 2**20, 1),
                                "detector": json.dumps(detector) if detector else "pixel",
                                "video": video.name, "start": start, "frames": len(frames), "device": info["device"],
                                "date": info["date"]})
                            print(" ".join(f"{k}={v}" for k, v in rows[-1].items() if k not in ("device", "date")),
                                  flush=True)
                        if density_profile is None and name == "mobilenet_v2" and (per_layer or t > 0):
                            density_profile = (f"{name} {h}x{w} {dtype} t={t}",
                                               [(s["name"], s["mean_density"]) for s in stats])
                        del dm
                        torch.cuda.empty_cache()
                    if on_rows is not None:
                        on_rows(rows)
                del model, frames
                torch.cuda.empty_cache()
    return rows, density_profile


def plot_density(profile, path: Path, info: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, layers = profile
    fig, ax = plt.subplots(figsize=(max(8, len(layers) * 0.08), 4))
    ax.bar(range(len(layers)), [d for _, d in layers], width=1.0)
    ax.set_xlabel("layer (execution order)")
    ax.set_ylabel("mean fraction of pixels updated")
    ax.set_title(f"per-layer density: {title} ({info['device']}, {info['date']})")
    ax.set_xlim(-1, len(layers))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _threshold_arg(text: str):
    """A number, or the path of an existing thresholds JSON file."""
    try:
        return float(text)
    except ValueError:
        path = Path(text)
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"expected a number or a thresholds JSON file, got {text!r}") from None
        return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--dtypes", nargs="+", default=["float16"], choices=["float16", "bfloat16", "float32"])
    p.add_argument("--thresholds", nargs="+", type=_threshold_arg, default=THRESHOLDS,
                   help="uniform thresholds, or paths of per-layer thresholds JSON (deltaconv calibrate's)")
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="native resolution only, 20 frames")
    p.add_argument("--video", type=Path, default=None)
    p.add_argument("--start", type=int, default=0, help="first frame of the video to use (default 0)")
    p.add_argument("--resolutions", nargs="+", default=None, metavar="HxW",
                   help="default: 576x768 and 1080x1920 (576x768 only with --quick)")
    p.add_argument("--detector", type=json.loads, default=None, metavar="JSON",
                   help='input change detector spec, e.g. \'{"type": "tile", "tile": 16}\' (default: per pixel)')
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    video = args.video or find_sample_video("vtest.avi")
    resolutions = RESOLUTIONS[:1] if args.quick else RESOLUTIONS
    if args.resolutions:
        resolutions = [tuple(int(v) for v in r.lower().split("x")) for r in args.resolutions]
    n = 20 if args.quick else args.frames
    rows, profile = sweep(args.models, resolutions, [getattr(torch, d) for d in args.dtypes], args.thresholds, n,
                          min(args.warmup, n // 2), video, args.detector, args.start,
                          on_rows=lambda so_far: write_csv(args.out / "video.csv", so_far))
    if not rows:  # else on_rows has written them all, after the last threshold
        raise SystemExit("video_sweep: no rows (no model, resolution, dtype or threshold given)")
    if profile is not None:
        plot_density(profile, args.out / "video_density.png", run_info())
    print(f"wrote {args.out / 'video.csv'}")


if __name__ == "__main__":
    main()
