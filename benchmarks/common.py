"""Timing helpers shared by the benchmark sweeps: CUDA events, warm-up, medians, clustered masks."""
from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import os
import platform
import re
import statistics
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F

from deltaconv.cuda_graphs import capture_graph, graphed_model  # noqa: F401 (re-exported)

RESULTS = Path(__file__).resolve().parent / "results"


def time_cuda(fn: Callable[[], object], warmup: int = 10, iters: int = 50) -> float:
    """Median milliseconds of ``fn()`` on the current stream, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_in_graph(fn: Callable[[], object], calls: int = 20, warmup: int = 5, iters: int = 30) -> float:
    """Median milliseconds per call of ``fn`` inside one CUDA graph of ``calls`` calls in a row, timed
    with CUDA events around each replay.

    ``time_cuda(capture_graph(fn)[0])`` times one replay of a one-call graph between two events, so
    the host's graph launch falls inside the time (a graph of one tiny kernel measures about 13 us so
    on an H200, ``block_spread_ab.txt`` section 4). Inside a converted model's graph a layer's kernels
    follow one another without it; this is that per-call time."""
    if calls < 1:
        raise ValueError(f"time_in_graph: calls must be >= 1, got {calls}")

    def many():
        for _ in range(calls):
            fn()
    replay = capture_graph(many)[0]
    return time_cuda(replay, warmup=warmup, iters=iters) / calls


def activation_op_maps(shapes, script: str) -> Iterator[tuple[tuple[int, int, int], torch.Tensor, torch.Tensor,
                                                                torch.Generator]]:
    """The inputs of the activation ops' timings, per ``(C, H, W)`` of ``shapes``: ``(shape, x, mask, generator)``,
    ``x`` a ``[1, C, H, W]`` float16 channels-last map of seeded normal values on the GPU, ``mask`` every pixel
    active, ``generator`` the one that drew ``x`` (for more seeded tensors). Loads the extension first; a
    ``SystemExit`` naming ``script`` says why it is unavailable."""
    from deltaconv import _extension
    if not _extension.load():
        raise SystemExit(f"{script}: {_extension.unavailable_reason()}")
    for c, h, w in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, c, h, w, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
        yield (c, h, w), x, torch.ones(1, 1, h, w, dtype=torch.bool, device="cuda"), g


def activation_op_state(x: torch.Tensor, case: str) -> tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
    """``(key, sent, acc)`` of an activation op's timing case on ``x``: "sends", a key frame (every active pixel
    sent, both passes); "quiet", no key (with a threshold no change exceeds, the first pass only)."""
    key = torch.ones(1, dtype=torch.bool, device=x.device) if case == "sends" else None
    return key, torch.zeros_like(x), torch.zeros_like(x, dtype=torch.float32)


def timed_call(fn, *args) -> tuple[float, object]:
    """Milliseconds of one ``fn(*args)`` on the current stream (CUDA events, synchronised), and its result."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    y = fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end), y


def time_frames(fn, frames, warmup: int) -> tuple[float, list]:
    """Median ms per frame of ``fn(frame)`` over ``frames`` (after ``warmup`` frames), timed with
    CUDA events, and copies of the outputs."""
    times, outs = [], []
    for i, f in enumerate(frames):
        ms, y = timed_call(fn, f)
        if i >= warmup:
            times.append(ms)
        outs.append(cloned_output(y))
    return statistics.median(times), outs


def cloned_output(y):
    """A copy of a model's output: a tensor, or a dict, tuple or list of them (nested), other values as they are (a
    CUDA graph's outputs are overwritten by its next replay)."""
    if torch.is_tensor(y):
        return y.clone()
    if isinstance(y, dict):
        return {k: cloned_output(v) for k, v in y.items()}
    if isinstance(y, (tuple, list)):
        return type(y)(cloned_output(v) for v in y)
    return y


def alternate_frames(runs: dict, frames, warmup: int, compared=None) -> tuple[dict, float]:
    """Variants of one model run frame by frame in turn on the same frames: ``{variant: median ms
    per frame}`` (CUDA events, after ``warmup`` frames) and the largest absolute difference between the
    primary output (``deltaconv.fidelity.primary_output``) of any variant in ``compared`` (default: all) and the
    first variant's (0 when they compute the same)."""
    from deltaconv.fidelity import primary_output
    times, diff = {v: [] for v in runs}, 0.0
    compared = set(runs if compared is None else compared)
    for i, f in enumerate(frames):
        outs = []
        for v, fn in runs.items():
            ms, y = timed_call(fn, f)
            if i >= warmup:
                times[v].append(ms)
            if v in compared or not outs:
                outs.append(primary_output(y).float())
        diff = max([diff] + [(o - outs[0]).abs().max().item() for o in outs[1:]])
    return {v: statistics.median(x) for v, x in times.items()}, diff


def video_models(videos, models, start: int, frames: int, size, dtype: torch.dtype = torch.float16,
                 device: str = "cuda"):
    """For each sample video and model name: ``(video, name, model, frames)``, the model as the video
    sweep builds it (``video_sweep.build``: real weights where shipped, else BatchNorms re-estimated on
    the first frames) on ``device`` in ``dtype`` and channels_last, and ``frames`` consecutive frames
    from ``start`` at ``size`` on ``device`` (the A/B scripts' loop)."""
    from deltaconv.video import find_sample_video, read_frames
    from video_sweep import build
    for video in videos:
        frames_cpu = list(read_frames(find_sample_video(video), start=start, max_frames=frames, size=tuple(size)))
        for name in models:  # no locals held across the yield: the caller frees model and frames
            yield (video, name, build(name, frames_cpu[:4], device).to(device, dtype)
                   .to(memory_format=torch.channels_last), [f.to(device, dtype) for f in frames_cpu])


def clustered_mask(n: int, h: int, w: int, fraction: float, blob: int = 24, seed: int = 0,
                   device: str = "cuda") -> torch.Tensor:
    """A ``[n, 1, h, w]`` bool mask with about ``fraction`` of the pixels active, in square blobs of
    ``blob`` pixels like the moving regions of a static-camera video."""
    if fraction <= 0:
        return torch.zeros(n, 1, h, w, dtype=torch.bool, device=device)
    if fraction >= 1:
        return torch.ones(n, 1, h, w, dtype=torch.bool, device=device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    gh, gw = -(-h // blob), -(-w // blob)
    cells = torch.rand(n, 1, gh, gw, generator=g) < fraction
    mask = cells.repeat_interleave(blob, 2).repeat_interleave(blob, 3)[:, :, :h, :w]
    return mask.to(device)


def spread_tiles_mask(h: int, w: int, tiles: int, dilation: int = 1, seed: int = 0,
                      device: str = "cuda") -> Optional[torch.Tensor]:
    """A ``[1, 1, h, w]`` bool mask that makes exactly ``tiles`` 8x8 output tiles of a 3x3 conv
    (dilation and padding ``dilation``) active, chosen at random over the map (the same prefix of one
    permutation for every count): each a block inset by ``dilation`` so that its footprint stays in
    its tile, so ``dilation`` is 1, 2 or 3. ``None`` when the map has fewer tiles."""
    if not 1 <= dilation <= 3:
        raise ValueError(f"spread_tiles_mask: dilation must be 1, 2 or 3 (an 8x8 block inset by it on every "
                         f"side keeps a pixel), got {dilation}")
    th, tw = (h + 7) // 8, (w + 7) // 8
    if tiles > th * tw:
        return None
    g = torch.Generator().manual_seed(seed)
    cand = torch.tensor([(i, j) for i in range(th) for j in range(tw)])
    mask = torch.zeros(1, 1, h, w, dtype=torch.bool)
    d = dilation
    for i, j in cand[torch.randperm(len(cand), generator=g)[:tiles]].tolist():
        mask[0, 0, i * 8 + d:i * 8 + 8 - d, j * 8 + d:j * 8 + 8 - d] = True
    return mask.to(device)


def tile_stats(out_mask: torch.Tensor) -> tuple[float, float, float]:
    """(active pixel fraction, active 8x8 tile fraction, fill) of an ``[N, 1, H, W]`` output mask:
    fill = active pixels / (64 x active tiles), the pixels the 3x3 tensor-core kernel computes (tiles
    that overhang the image count 64 pixels); NaN when no tile is active."""
    m = out_mask.float()
    tiles = F.max_pool2d(m, 8, 8, ceil_mode=True) > 0
    pixels, active_tiles = float(m.sum()), float(tiles.sum())
    fill = pixels / (64.0 * active_tiles) if active_tiles else float("nan")
    return pixels / m.numel(), active_tiles / tiles.numel(), fill


def kernel_family(name: str, templates: bool = False) -> str:
    """A profiled kernel's short family name: parameters and namespaces dropped, and its template
    arguments too unless ``templates`` (then up to 100 characters, so that specialisations stay apart)."""
    name = re.sub(r"\(.*", "", name)
    if not templates:
        name = re.sub(r"<.*", "", name)
        return name.split("::")[-1][:60]
    head, sep, tail = name.partition("<")
    return (head.split("::")[-1] + sep + tail.replace("deltaconv::", "").replace("pw::", ""))[:100]


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"


def write_csv(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` (dicts with the same keys) to ``path``, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)


def reestimate_batchnorm(model: torch.nn.Module, batch) -> torch.nn.Module:
    """``model`` with the statistics of its BatchNorms re-estimated on one ``batch`` (a cumulative
    average over it; random weights then keep the scale they have in a trained network), in eval mode."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(batch)
    return model.eval()


def add_video_ab_arguments(parser, size) -> None:
    """The arguments of the A/B scripts that time variants of a converted model on the sample videos:
    ``--videos``, ``--thresholds``, ``--start``, ``--frames``, ``--warmup`` and ``--size`` (default
    ``size``)."""
    parser.add_argument("--videos", nargs="*", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    parser.add_argument("--thresholds", type=float, nargs="*", default=[0.02])
    parser.add_argument("--start", type=int, default=200)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--size", type=int, nargs=2, default=list(size))


def video_ab_frames(args) -> Iterator[tuple[str, list]]:
    """After a ``# device, date, torch`` line: per video of ``args`` (:func:`add_video_ab_arguments`),
    ``(video, frames)``, its ``--frames`` frames from ``--start`` at ``--size`` on the CPU."""
    from deltaconv.video import find_sample_video, read_frames
    info = run_info()
    print(f"# {info['device']}, {info['date']}, torch {torch.__version__}", flush=True)
    for video in args.videos:
        yield video, list(read_frames(find_sample_video(video), start=args.start, max_frames=args.frames,
                                      size=tuple(args.size)))


def dense_baseline(model: torch.nn.Module, frames) -> tuple[Callable, list]:
    """The dense ``model`` replayed as a CUDA graph (captured on ``frames[0]``) and its float32 outputs
    on every frame (the primary output: a segmentation model's ``"out"`` map), the A/B scripts'
    baseline and reference."""
    from deltaconv.fidelity import primary_output
    with torch.no_grad():
        return graphed_model(model, frames[0]), [primary_output(model(f)).float() for f in frames]


def captured(convert: Callable, frames, threshold: float):
    """``convert(**kw)`` (``deltaconv.convert`` of a model, or a variant of it) on the CUDA backend at
    ``threshold`` with ``cuda_graph=True``, after its key frame ``frames[0]`` and the capture on
    ``frames[1]``."""
    dm = convert(backend="cuda", example_input=frames[0], cuda_graph=True, check_finite=False, threshold=threshold)
    with torch.no_grad():
        dm(frames[0]), dm(frames[1])
    return dm


def compare_variants(variants: dict, dense: Callable, frames, reference, warmup: int) -> str:
    """The variants (converted models after :func:`captured`) and the dense graph timed frame by frame
    in turn on ``frames[2:]`` (:func:`alternate_frames`), then each run again for its error and FLOPs
    density (:func:`error_and_density`): one line, ``dense graph X ms; name Y ms (Zx of dense; error E;
    FLOPs density D; F fallbacks); ...``."""
    with torch.no_grad():
        ms, _ = alternate_frames({**variants, "dense": dense}, frames[2:], warmup)
        parts = [f"dense graph {ms['dense']:.3f} ms"]
        for name, dm in variants.items():
            err, density = error_and_density(dm, frames, reference)
            parts.append(f"{name} {ms[name]:.3f} ms ({ms['dense'] / ms[name]:.2f}x of dense; error {err:.4f}; "
                         f"FLOPs density {density:.3f}; {len(dm.report.fallbacks)} fallbacks)")
    return "; ".join(parts)


def patched(owner, name: str, value):
    """A context manager that sets ``owner.name = value`` and restores it on exit (the A/B scripts'
    variants of a class's behaviour while a model is converted and captured)."""
    @contextlib.contextmanager
    def scope():
        old = getattr(owner, name)
        setattr(owner, name, value)
        try:
            yield
        finally:
            setattr(owner, name, old)
    return scope()


@contextlib.contextmanager
def environment(values: dict):
    """Sets the environment variables ``values`` (name -> string) and restores them on exit (the A/B
    scripts' variants of the ops' switches, which the extension reads on every call)."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def converted_under(context: Callable = contextlib.nullcontext, convert: Optional[Callable] = None) -> Callable:
    """A variant of :func:`compare_variants_on_videos`: ``(model, frames, threshold) -> DeltaModel``, the
    model converted by ``convert`` (``(model, **kw) -> DeltaModel``, default ``deltaconv.convert``) and
    captured (:func:`captured`) while ``context()`` is active."""
    def variant(model, frames, threshold: float):
        import deltaconv
        with context():
            return captured(functools.partial(convert or deltaconv.convert, model), frames, threshold)
    return variant


def compare_variants_on_videos(args, models: dict, variants: dict) -> None:
    """The A/B scripts' loop: per video of ``args`` (:func:`video_ab_frames`), model (``models``: label ->
    a builder of the dense model from the video's CPU frames) and threshold, the model in float16 and
    channels-last converted by each variant of ``args.order`` (``variants``: name -> a callable of
    :func:`converted_under`'s kind), timed against its dense graph (:func:`compare_variants`); one ``==
    label float16 video frames t: ...`` line each."""
    for video, cpu in video_ab_frames(args):
        frames = [f.cuda().half() for f in cpu]
        for label, build in models.items():
            model = build(cpu).cuda().half().to(memory_format=torch.channels_last)
            dense, reference = dense_baseline(model, frames)
            for t in args.thresholds:
                runs = {name: variants[name](model, frames, t) for name in args.order}
                line = compare_variants(runs, dense, frames, reference, args.warmup)
                print(f"== {label} float16 {video} frames {args.start + 2}-{args.start + args.frames - 1} t={t:g}: "
                      f"{line}", flush=True)
                del runs
            del model, dense, reference
            torch.cuda.empty_cache()


def error_and_density(dm, frames, reference) -> tuple[float, float]:
    """A converted model run again over ``frames`` from a key frame: the mean relative error of its
    outputs against ``reference`` (the dense model's, one per frame) on the frames after the key
    frame, and its FLOPs density over them (``dm.stats()`` reset after the key frame)."""
    from deltaconv.fidelity import flops_density, primary_output, relative_error
    dm.reset()
    errs = []
    for i, f in enumerate(frames):
        y = primary_output(dm(f)).float()
        if i == 0:
            dm.reset_stats()
            continue
        errs.append(float(relative_error(y, reference[i]).mean()))
    return sum(errs) / len(errs), flops_density(dm.stats())


def run_info() -> dict:
    """Device, date and software versions, written next to every result."""
    return {"device": device_name(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "cuda": torch.version.cuda or "", "cudnn": str(torch.backends.cudnn.version() or ""),
            "host": os.uname().nodename}
