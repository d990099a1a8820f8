"""Per-layer threshold calibration: the most FLOPs (or memory traffic) saved within a fidelity tolerance.

``calibrate(model, frames, tolerance)`` returns ``{layer name: threshold}`` for the input
sparsifier and every non-linear layer of ``deltaconv.convert(model)`` (the names of
``DeltaModel.thresholds()``), chosen so that the converted model's FLOPs-weighted density
(:func:`deltaconv.fidelity.flops_density`; with ``cost="elements"`` the element-weighted one,
:func:`deltaconv.fidelity.element_density`, closer to what a GPU frame pays) over ``frames`` is as
low as the search finds while its fidelity ``metric`` against the dense model over the same frames
stays within ``tolerance``::

    clips = [frames[0:32], frames[168:200]]  # long clips spread over the video's start
    cal = deltaconv.calibrate.calibrate(model, clips, tolerance=2e-2)
    dm = deltaconv.convert(model, thresholds=cal, change_detector=cal.detector())
    cal.save("thresholds.json")            # convert(model, thresholds="thresholds.json") reads it

Search (deterministic; every step is one run of the converted model over ``frames``, with the
dense outputs computed once; clips of equal length run together as the streams of one batch):

1. Bases. ``uniform``: every layer's base is 1; ``rms``: one key frame with all thresholds 0
   leaves each truncating layer's exact output in its ``sent`` state, and its base is the RMS of
   that (the input sparsifier's: the frame's RMS). Thresholds are
   ``t_l = s * base_l * 2 ** (k_l / 2)``: a global scale ``s`` and a per-layer step ``k_l`` on a
   ladder of factors sqrt(2).
2. Global bisection on ``log s`` for each (change detector, base) candidate, within
   ``tolerance * first_share`` (within ``tolerance * margin`` where the smallest scale already
   exceeds that share: an error floor such as float16 rounding; all 0 where it exceeds even that);
   the candidate with the lowest density is kept.
3. Greedy per-layer refinement, in rounds: probe each layer alone one ``step`` up, rank the
   layers by density saved per error added, accept the raises in that order while the error stays
   within ``tolerance * margin``.
4. Final global rescale: the largest multiple (up to 4x) of all thresholds still within
   ``tolerance * margin``.

With ``start`` (the thresholds of an earlier calibration, say), steps 1-2 are replaced by those
thresholds as the bases at ``s = 1`` (halved while over the tolerance), and 3-4 go on from there:
a finer ``step`` then refines what a coarser search found.

Measured (``benchmarks/results/fidelity.csv``; MobileNetV2 with ImageNet weights at 1080x1920 on
an H200, calibrated on 2 clips of 32 frames from the first 200, measured on held-out frames
200-499; ``PYTHONPATH=. python benchmarks/fidelity_sweep.py --size 1080 1920 --device cuda
--max-evals 180``), tolerance 0.02 on the mean logit relative error:

==========  ==========================  ==========================  =========================
video       calibration frames          held-out frames             uniform t=0.01, held-out
==========  ==========================  ==========================  =========================
vtest.avi   density 0.574, err 0.0199   density 0.590, err 0.0198   density 0.809, err 0.016
one-by-one  density 0.302, err 0.0191   density 0.292, err 0.0250   density 0.377, err 0.033
==========  ==========================  ==========================  =========================

(180 runs, about 170 s per video on the GPU.) Both chose the per-pixel input measure and uniform
bases: the input threshold stays below one grey level, as do the first conv's and the last
layer's, the other layers end at 2-4x that. Clips must be long: calibrated on 4 clips of 8 frames (with
an earlier search, steps 2-3 only), the held-out error was 2x (tolerance 0.02) to 4.6x (tolerance
0.05, TileEnergy chosen) the calibration error, because pending sub-threshold change keeps building
up long after a key frame.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn

from .fidelity import COSTS, METRICS, cost_totals, primary_output
from .backends.reference import check_truncation
from .sparsify import ChangeDetector, default_detector, from_spec

Tensor = torch.Tensor

__all__ = ["calibrate", "Calibration", "layer_scales", "Evaluator", "start_thresholds"]


class Calibration(dict):
    """``{layer name: threshold}`` as returned by :func:`calibrate`, with what was measured.

    Attributes: ``change_detector`` (spec dict or ``None``), ``truncation`` (the non-linear
    layers' change measure the thresholds apply to, ``"max"``, ``"rms"``, ``"pooled"`` or a dict of
    layer-name patterns to measures), ``density`` and ``error`` on the
    calibration frames, ``cost`` (what ``density`` weights: ``"flops"`` or ``"elements"``),
    ``tolerance``, ``metric``, ``evals`` (model runs spent), ``fold_bn`` (the conversion it was
    calibrated with, see ``convert``), ``history`` (one dict per evaluation). Pass it to ``convert(model, thresholds=cal,
    change_detector=cal.detector())``; :meth:`save` writes JSON that ``convert`` and
    ``DeltaModel.load_thresholds`` read directly (:meth:`load` reads it back with the detector).
    """

    def __init__(self, thresholds: dict, change_detector: Optional[dict] = None, **info) -> None:
        super().__init__(thresholds)
        self.change_detector = change_detector
        self.truncation = info.get("truncation", "max")
        self.density = info.get("density", float("nan"))
        self.cost = info.get("cost", "flops")
        self.error = info.get("error", float("nan"))
        self.tolerance = info.get("tolerance", float("nan"))
        self.metric = info.get("metric", "rel_err")
        self.evals = info.get("evals", 0)
        self.fold_bn = bool(info.get("fold_bn", True))
        self.history: list[dict] = info.get("history", [])

    def detector(self) -> Optional[ChangeDetector]:
        """A fresh instance of the chosen change detector (``None``: per-pixel measure)."""
        return from_spec(self.change_detector)

    def to_json(self) -> dict:
        """The JSON object :meth:`save` writes: thresholds, change detector, truncation and results."""
        return {"thresholds": dict(self), "change_detector": self.change_detector, "truncation": self.truncation,
                "density": self.density, "cost": self.cost,
                "error": self.error, "tolerance": self.tolerance, "metric": self.metric, "evals": self.evals,
                "fold_bn": self.fold_bn}

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write :meth:`to_json` to ``path`` (what ``convert(model, thresholds=path)`` reads)."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1, sort_keys=True)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Calibration":
        """Read a file written by :meth:`save`, or a plain ``{layer name: threshold}`` JSON object."""
        with open(path) as f:
            d = json.load(f)
        th = d.pop("thresholds", None)
        if th is None:  # a plain {name: value} file
            return cls(d)
        return cls(th, d.pop("change_detector", None), **d)


# ----------------------------------------------------------------------------- evaluation
def _as_clips(frames) -> list[list[Tensor]]:
    """Calibration frames as a list of clips of consecutive ``[N, 3, H, W]`` frames."""
    if torch.is_tensor(frames):
        if frames.dim() == 4:
            frames = [f.unsqueeze(0) for f in frames]
        elif frames.dim() == 5:
            frames = list(frames)
        else:
            raise ValueError(f"calibrate: frames must be [T,3,H,W], [T,N,3,H,W] or a list of [N,3,H,W], "
                             f"got shape {tuple(frames.shape)}")
    frames = list(frames)
    clips = frames if frames and not torch.is_tensor(frames[0]) else [frames]
    clips = [list(c) for c in clips]
    if not clips or any(len(c) < 2 for c in clips):
        raise ValueError(f"calibrate: need at least 2 frames (a key frame and one delta frame) per clip, got "
                         f"{[len(c) for c in clips]}")
    return clips


def _stack_clips(clips: list[list[Tensor]]) -> list[list[Tensor]]:
    """Clips of equal length and frame shape run as the streams of one batch (one pass, and the
    accelerator sees larger batches); others stay separate."""
    if len(clips) < 2 or len({len(c) for c in clips}) != 1 or \
            len({(tuple(f.shape), f.dtype, f.device) for c in clips for f in c}) != 1:
        return clips
    return [[torch.cat(step, dim=0) for step in zip(*clips)]]


def _metric_fn(metric: Union[str, Callable]) -> Callable[[Tensor, Tensor], Tensor]:
    """``error(y, ref) -> [N]`` float64 on the CPU (lower is better) for a metric name or callable."""
    if callable(metric):
        return lambda y, r: torch.as_tensor(metric(y, r), dtype=torch.float64).detach().cpu().reshape(-1)
    if metric not in METRICS:
        raise ValueError(f"calibrate: metric must be one of {sorted(METRICS)} or a callable, got {metric!r}")
    fn, higher = METRICS[metric]
    if higher:
        return lambda y, r: 1.0 - fn(y, r).double().cpu().reshape(-1)
    return lambda y, r: fn(y, r).double().cpu().reshape(-1)


class Evaluator:
    """Runs a converted model over fixed frames against cached dense outputs.

    ``__call__(thresholds, detector) -> (error, density)``: error is the per-frame metric reduced
    over the non-key frames (``reduce``: ``"mean"``, ``"max"`` or ``"p95"``), density the
    ``cost``-weighted density over the same frames (``"flops"`` or ``"elements"``, see
    :data:`deltaconv.fidelity.COSTS`).
    """

    def __init__(self, model: nn.Module, frames, metric="rel_err", reduce: str = "mean",
                 output_fn: Callable = primary_output, backend: str = "reference", truncation: Union[str, dict] = "max",
                 cost: str = "flops", fold_bn: bool = True) -> None:
        from .convert import convert

        if cost not in COSTS:
            raise ValueError(f"calibrate: cost must be one of {COSTS}, got {cost!r}")
        self.cost = cost
        self.clips = _stack_clips(_as_clips(frames))
        self.frames = self.clips[0]
        if reduce not in ("mean", "max", "p95"):
            raise ValueError(f"calibrate: reduce must be 'mean', 'max' or 'p95', got {reduce!r}")
        self.reduce, self.output_fn, self.error_fn = reduce, output_fn, _metric_fn(metric)
        with torch.no_grad():
            self.dense = [[output_fn(model(f)) for f in clip] for clip in self.clips]
        self.dm = convert(model, threshold=0.0, backend=backend, example_input=self.frames[0], truncation=truncation,
                          fold_bn=fold_bn)
        self.names = list(self.dm.thresholds())
        self.evals = 0

    def __call__(self, thresholds: dict, detector: Optional[ChangeDetector]) -> tuple[float, float]:
        dm = self.dm
        dm.load_thresholds(thresholds)
        for layer in dm.delta_layers():
            if layer.kind == "sparsify":
                layer.change_detector = detector
        errors, cost_done, cost_dense = [], 0.0, 0.0
        with torch.no_grad():
            for clip, dense in zip(self.clips, self.dense):
                dm.reset()
                if detector is not None:
                    detector.reset()
                for i, (x, ref) in enumerate(zip(clip, dense)):
                    y = self.output_fn(dm(x))
                    if i == 0:
                        dm.reset_stats()
                        continue
                    errors.append(self.error_fn(y, ref))
                # density over all delta frames of all clips: weight each clip by its frame count
                done, dense_total = cost_totals(dm.stats(), self.cost)
                cost_done += done * (len(clip) - 1)
                cost_dense += dense_total * (len(clip) - 1)
        self.evals += 1
        e = torch.cat(errors)
        err = float(e.mean() if self.reduce == "mean" else e.max() if self.reduce == "max" else e.quantile(0.95))
        return err, cost_done / cost_dense if cost_dense > 0 else float("nan")


def layer_scales(ev: Evaluator) -> dict[str, float]:
    """RMS of every truncating layer's exact output on the first frame (see module docstring)."""
    dm = ev.dm
    dm.set_threshold_all(0.0)
    for layer in dm.delta_layers():
        if layer.kind == "sparsify":
            layer.change_detector = None
    dm.reset()
    with torch.no_grad():
        dm(ev.frames[0])
    scales = {}
    for layer in dm.delta_layers():
        if not layer.truncates:
            continue
        sq, n = 0.0, 0
        for name in layer._state_names:
            buf = layer._buffers.get(name)
            if name.startswith("sent") and buf is not None:
                sq += float(buf.double().pow(2).sum())
                n += buf.numel()
        rms = math.sqrt(sq / n) if n else 0.0
        scales[layer.layer_name] = rms if rms > 0 else 1.0
    return scales


def start_thresholds(start, dm, truncation) -> tuple[dict, Optional[dict]]:
    """``(thresholds, change detector spec)`` of :func:`calibrate`'s ``start`` argument, checked
    against the truncating layers of ``dm`` (the conversion calibrated, a ``DeltaModel``) and
    ``truncation``: a :class:`Calibration`'s must give every layer the measure ``truncation`` gives it. A
    start calibrated with another ``fold_bn`` (a :class:`Calibration`'s, or ``"fold_bn"`` in its file) is
    taken with a warning, as ``DeltaModel.load_thresholds`` takes it."""
    from .model import read_thresholds, warn_fold_bn_mismatch

    names = list(dm.thresholds())
    if not isinstance(start, (str, os.PathLike, Mapping)):
        raise TypeError(f"calibrate: start must be a Calibration, a dict of thresholds or a JSON path, got "
                        f"{type(start).__name__}")
    values, spec, measure, fold_bn = read_thresholds(start if isinstance(start, (str, os.PathLike, dict))
                                                     else dict(start))
    warn_fold_bn_mismatch(fold_bn, dm.fold_bn, "calibrate: start was", "this calibration converts with", stacklevel=4)
    if measure is not None and measure != truncation and _measures_under(dm, measure) != dm.measures():
        raise ValueError(f"calibrate: start was calibrated with truncation={measure!r}, got "
                         f"truncation={truncation!r}; pass truncation={measure!r}")
    missing, unknown = sorted(set(names) - set(values)), sorted(set(values) - set(names))
    if missing or unknown:
        raise ValueError(f"calibrate: start must give a threshold for every truncating layer of the conversion; "
                         f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, unknown "
                         f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    bad = {n: v for n, v in values.items()
           if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0}
    if bad:
        raise ValueError(f"calibrate: start's thresholds must be finite numbers >= 0, got {bad}")
    return {n: float(values[n]) for n in names}, spec


def _measures_under(dm, truncation) -> Optional[dict]:
    """``dm.measures()`` were ``dm.truncation`` set to ``truncation`` (``None`` where it cannot be);
    ``dm`` is left as it was."""
    mine = dm.measures()
    try:
        dm.truncation = truncation
        return dm.measures()
    except (ValueError, TypeError):
        return None
    finally:
        dm.truncation = mine


# ----------------------------------------------------------------------------- search
class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _progress_bar(total: int, enabled: bool):
    """A tqdm bar (a silent stand-in when disabled or when tqdm is not installed)."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="calibrate", unit="run")


def calibrate(model: nn.Module, frames, tolerance: float = 2e-2, metric: Union[str, Callable] = "rel_err", *,
              reduce: str = "mean", change_detectors: Optional[Sequence] = (None, "default"),
              bases: Sequence[str] = ("uniform", "rms"), first_share: float = 0.5, margin: float = 1.0,
              step: int = 2, max_steps: int = 8, max_evals: int = 120, bisect_steps: int = 7,
              final_steps: int = 5, s_range: tuple[float, float] = (1e-3, 2.0),
              output_fn: Callable = primary_output, backend: str = "reference", truncation: Union[str, dict] = "max",
              cost: str = "flops", fold_bn: bool = True,
              start: Union[None, Mapping[str, float], str, os.PathLike] = None, progress: bool = True) -> Calibration:
    """Per-layer thresholds for ``deltaconv.convert(model)`` within a fidelity tolerance.

    Args:
        model: the dense model (eval mode, on the frames' device).
        frames: consecutive frames, a list of ``[N, 3, H, W]`` tensors or a ``[T, 3, H, W]``
            tensor; the first is the key frame, the error and density are over the others. Or a
            list of such clips (each starts with a key frame): clips spread over a video represent
            it better than its first frames alone. Clips should be long (tens of frames): pending
            sub-threshold change builds up over time, so short clips under-estimate the error.
        tolerance: the largest admissible error: for ``"rel_err"`` the output relative error,
            for ``"top5"`` / ``"top1"`` / ``"iou"`` / ``"prob_iou"`` / ``"miou"`` one minus the mean score.
        metric: a name of :data:`deltaconv.fidelity.METRICS` or ``fn(y, ref) -> error`` (lower
            is better).
        reduce: how per-frame errors combine: ``"mean"``, ``"max"`` or ``"p95"``.
        change_detectors: candidates for the input sparsifier (specs, detectors, ``None`` for
            the per-pixel measure, ``"default"`` for :func:`deltaconv.sparsify.default_detector`).
        bases: per-layer threshold shapes tried by the global bisection: ``"uniform"`` (the same
            threshold everywhere) and ``"rms"`` (proportional to each layer's output RMS).
            The (detector, base) pair with the lowest density within ``tolerance * first_share``
            is refined.
        first_share: share of the tolerance the global bisection may use (the rest is left to
            the per-layer refinement and the final rescale).
        margin: the result keeps the error on ``frames`` within ``tolerance * margin``.
        step: ladder steps (of sqrt(2)) per refinement move; ``max_steps``: most steps per layer.
        max_evals: model runs allowed in all (at least one per bisection candidate is made);
            ``final_steps`` of them are kept for the final global rescale.
        bisect_steps: bisection steps per (detector, base) candidate.
        s_range: bracket of the global scale.
        output_fn: picks the compared tensor from a model output.
        backend: the converted model's backend while calibrating.
        truncation: the change measure of the non-linear layers' thresholds (``"max"``, ``"rms"``,
            ``"pooled"``, ``"hybrid"`` or a dict of layer-name patterns to measures, see
            ``deltaconv.convert``);
            the result records it and ``convert`` /
            ``load_thresholds`` apply it with the thresholds.
        cost: what the search minimises: ``"flops"``, the FLOPs-weighted density, or
            ``"elements"``, each layer's updated pixels weighted by its output elements (the
            memory traffic that most of a GPU frame pays for, see
            ``benchmarks/work_density.py``). The result's ``density`` is in that measure.
        fold_bn: whether the converted model folds BatchNorm into its convolutions, as
            ``convert(..., fold_bn=...)``: calibrate with the setting you deploy with (in float16 it
            changes the error at threshold 0).
        start: thresholds to refine instead of searching from scratch: a :class:`Calibration`, a
            ``{layer name: threshold}`` dict or the path of a JSON file :meth:`Calibration.save` (or
            ``DeltaModel.save_thresholds``) wrote, with every layer of the conversion. The global
            bisection is skipped: each layer's base is its start threshold and the search goes on
            from there with the refinement (with ``step``, e.g. ``step=1`` for finer moves than the
            search that made ``start``) and the final rescale. Where ``start`` exceeds the tolerance,
            all its thresholds are first halved until it does not (at most ``max_steps`` times; then
            all 0). Layers at 0 in ``start`` stay at 0. The change detector is ``start``'s (a plain
            dict: the per-pixel measure); a :class:`Calibration`'s ``truncation`` must give every
            layer the measure ``truncation`` gives it (``"hybrid"`` and the dict it amounts to agree).
        progress: show a tqdm progress bar.

    Returns:
        a :class:`Calibration` (a ``dict`` of thresholds with the chosen ``change_detector``).
    """
    if not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise ValueError(f"calibrate: tolerance must be a number >= 0, got {tolerance!r}")
    check_truncation(truncation, "calibrate: truncation")
    if not 0 < first_share <= 1:
        raise ValueError(f"calibrate: first_share must be in (0, 1], got {first_share!r}")
    bad = [b for b in bases if b not in ("uniform", "rms")]
    if bad or not bases:
        raise ValueError(f"calibrate: bases must be a non-empty list of 'uniform' / 'rms', got {list(bases)!r}")
    ev = Evaluator(model, frames, metric, reduce, output_fn, backend, truncation, cost, fold_bn)
    names = ev.names
    begin = None if start is None else start_thresholds(start, ev.dm, truncation)
    rms = layer_scales(ev) if "rms" in bases and begin is None else {}
    base_scales = {"uniform": {n: 1.0 for n in names}, "rms": rms}
    if begin is not None:
        base_scales["start"] = begin[0]
    specs = []
    for c in ([None] if not change_detectors else list(change_detectors)):
        det = default_detector() if c == "default" else from_spec(c)
        spec = None if det is None else det.spec()
        if spec not in specs:
            specs.append(spec)
    bar = _progress_bar(max_evals, progress)
    history: list[dict] = []
    limit = tolerance * margin

    def thresholds_of(s: float, k: dict, base: str) -> dict:
        sc = base_scales[base]
        return {n: s * sc[n] * 2.0 ** (k.get(n, 0) / 2.0) for n in names}

    def run(s: float, k: dict, spec, base: str, phase: str) -> tuple[float, float]:
        err, dens = ev(thresholds_of(s, k, base), from_spec(spec))
        history.append({"phase": phase, "s": s, "k": dict(k), "detector": spec, "base": base, "error": err,
                        "density": dens})
        bar.update(1)
        bar.set_postfix(err=f"{err:.3g}", density=f"{dens:.3f}", phase=phase)
        return err, dens

    def bisect(lo: float, hi: float, steps: int, k: dict, spec, base: str, budget: float, phase: str, good):
        """Largest scale in [lo, hi] (log bisection) with error <= budget; ``good`` = (s, err, dens) at lo."""
        a, b = math.log(lo), math.log(hi)
        for _ in range(steps):
            if ev.evals >= max_evals:
                break
            mid = 0.5 * (a + b)
            e, d = run(math.exp(mid), k, spec, base, phase)
            if e <= budget:
                a, good = mid, (math.exp(mid), e, d)
            else:
                b = mid
        return good

    budget2 = max_evals - final_steps
    # ---- 1. global bisection per (detector, base); from ``start``: its thresholds, halved while over the limit
    budget1 = tolerance * first_share
    best = None  # (s, err, density, spec, base)
    lo_s, hi_s = s_range
    if begin is not None:
        spec = begin[1]
        s = 1.0
        err, dens = run(s, {}, spec, "start", "start")
        for _ in range(max_steps):
            if err <= limit or ev.evals >= budget2:
                break
            s /= 2
            err, dens = run(s, {}, spec, "start", "start")
        if err > limit:
            s = 0.0
            err, dens = run(s, {}, spec, "start", "start")
        best = (s, err, dens, spec, "start")
    else:
        for spec in specs:
            for base in bases:
                if best is not None and ev.evals >= max_evals:
                    break
                e_lo, d_lo = run(lo_s, {}, spec, base, "bisect")
                # the error floor (float16 rounding, say) may take more than the first share: then the
                # bisection may use the whole tolerance, and only where even that is exceeded all stay 0
                budget = budget1 if e_lo <= budget1 else limit
                if e_lo > budget:
                    cand = (0.0, *run(0.0, {}, spec, base, "bisect"), spec, base) if best is None else None
                else:
                    g = bisect(lo_s, hi_s, bisect_steps, {}, spec, base, budget, "bisect", (lo_s, e_lo, d_lo))
                    cand = (g[0], g[1], g[2], spec, base)
                if cand is not None and (best is None or cand[2] < best[2]):
                    best = cand
    s, err, dens, spec, base = best
    k: dict = {}
    # ---- 2. greedy per-layer refinement
    while s > 0 and ev.evals < budget2:
        gains = []
        for n in names:
            if k.get(n, 0) + step > max_steps or ev.evals >= budget2:
                continue
            trial = dict(k)
            trial[n] = trial.get(n, 0) + step
            e, d = run(s, trial, spec, base, "probe")
            if d < dens and e <= limit:
                gains.append(((dens - d) / max(e - err, 1e-3 * tolerance), n, e, d))
        if not gains:
            break
        gains.sort(key=lambda g: (-g[0], g[1]))
        accepted = 0
        for i, (_, n, e, d) in enumerate(gains):
            if ev.evals >= budget2 and i > 0:
                break
            trial = dict(k)
            trial[n] = trial.get(n, 0) + step
            if i > 0:  # the best probe was measured alone on the current state: accept it as is
                e, d = run(s, trial, spec, base, "accept")
            if e <= limit and d < dens:
                k, err, dens = trial, e, d
                accepted += 1
        if not accepted:
            break
    # ---- 3. final global rescale into the remaining tolerance
    if s > 0 and err < limit and ev.evals < max_evals:
        g = bisect(s, s * 4.0, final_steps, k, spec, base, limit, "rescale", (s, err, dens))
        if g[2] <= dens:
            s, err, dens = g
    bar.close()
    return Calibration(thresholds_of(s, k, base), spec, density=dens, error=err, tolerance=tolerance,
                       metric=metric if isinstance(metric, str) else getattr(metric, "__name__", "custom"),
                       evals=ev.evals, history=history, truncation=truncation, cost=cost, fold_bn=fold_bn)


# ``deltaconv/__init__.py`` may re-export the function as ``deltaconv.calibrate``, which hides this
# module behind it; these keep ``deltaconv.calibrate.calibrate(...)`` (and the class) working then.
calibrate.calibrate = calibrate  # type: ignore[attr-defined]
calibrate.Calibration = Calibration  # type: ignore[attr-defined]
