"""deltaconv.calibrate: determinism, tolerance on calibration and held-out frames, round trips."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn as nn

import deltaconv
from deltaconv.calibrate import Calibration, calibrate
from deltaconv.fidelity import compare


TOL = 0.01  # the synthetic video's output drifts by ~0.026 when nothing is sent after the key frame


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d((3, 4)), nn.Flatten(), nn.Linear(16 * 12, 10)).eval()


def _video(n: int, h: int = 24, w: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """A textured static scene with a square walking across it, plus small sensor noise."""
    g = torch.Generator().manual_seed(seed)
    bg = torch.rand(1, 3, h, w, generator=g) * 0.2
    out = []
    for t in range(n):
        f = bg.clone()
        x = 1 + t % (w - 10)
        f[:, :, 6:18, x:x + 9] = 2.0 + 0.3 * torch.rand(3, 1, 1, generator=g)
        out.append(f + 0.01 * torch.randn(1, 3, h, w, generator=g))
    return out


@pytest.fixture(scope="module")
def setup():
    model = _model()
    frames = _video(24)
    kw = dict(max_evals=40, progress=False, change_detectors=[None, "default"])
    cal = calibrate(model, frames[:10], TOL, **kw)
    return model, frames, kw, cal


def test_keys_values_and_tolerance_on_calibration_frames(setup):
    model, frames, kw, cal = setup
    dm = deltaconv.convert(model, backend="reference", example_input=frames[0])
    assert set(cal) == set(dm.thresholds())
    assert all(isinstance(v, float) and v >= 0 for v in cal.values())
    assert cal.error <= TOL and cal.evals <= kw["max_evals"] + 2
    # what calibrate measured is what convert(thresholds=...) gives on the same frames
    dm = deltaconv.convert(model, thresholds=cal, change_detector=cal.detector(), backend="reference",
                           example_input=frames[0])
    rep = compare(model, dm, frames[:10])
    assert rep.mean("rel_err") == pytest.approx(cal.error, rel=1e-6, abs=1e-9)
    assert rep.density == pytest.approx(cal.density, rel=1e-6)
    # and it saves FLOPs over the exact conversion
    exact = compare(model, deltaconv.convert(model, backend="reference", example_input=frames[0]), frames[:10])
    assert rep.density < exact.density


def test_deterministic(setup):
    model, frames, kw, cal = setup
    again = calibrate(model, frames[:10], TOL, **kw)
    assert dict(again) == dict(cal)
    assert again.change_detector == cal.change_detector


def test_tolerance_holds_on_held_out_frames(setup):
    model, frames, kw, cal = setup
    dm = deltaconv.convert(model, thresholds=dict(cal), change_detector=cal.detector(), backend="reference",
                           example_input=frames[0])
    rep = compare(model, dm, frames[9:])
    frozen = compare(model, deltaconv.convert(model, threshold=1e9, backend="reference", example_input=frames[0]),
                     frames[9:])
    assert frozen.mean("rel_err") > 1.5 * TOL  # the test is not trivial
    assert rep.mean("rel_err") <= 1.5 * TOL


def test_save_load_and_convert_from_json(setup, tmp_path):
    model, frames, kw, cal = setup
    path = tmp_path / "th.json"
    cal.save(path)
    d = json.loads(path.read_text())
    assert d["thresholds"] == dict(cal) and d["change_detector"] == cal.change_detector
    back = Calibration.load(path)
    assert dict(back) == dict(cal) and back.change_detector == cal.change_detector
    dm = deltaconv.convert(model, thresholds=str(path), backend="reference", example_input=frames[0])
    assert dm.thresholds() == pytest.approx(dict(cal))


def test_other_metrics_and_errors():
    model = _model()
    frames = _video(5)
    cal = calibrate(model, frames, 0.0, metric="top1", max_evals=6, progress=False, change_detectors=None)
    assert cal.error == 0.0
    with pytest.raises(ValueError, match="metric"):
        calibrate(model, frames, 0.1, metric="nope", progress=False)
    with pytest.raises(ValueError, match="at least 2 frames"):
        calibrate(model, frames[:1], 0.1, progress=False)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(model, frames, -1.0, progress=False)


def test_error_floor_over_the_first_share_still_calibrates():
    """Where the error at the smallest thresholds already exceeds the share of the tolerance that the
    global search starts from (an error floor, as float16 rounding makes one), the search uses the
    whole tolerance instead of returning all zeros; a floor over the whole tolerance still gives 0."""
    from deltaconv.fidelity import relative_error
    model = _model()
    frames = _video(10)
    tol = 0.05

    def with_floor(floor):
        return lambda y, ref: relative_error(y, ref) + floor

    cal = calibrate(model, frames, tol, metric=with_floor(0.6 * tol), max_evals=20, progress=False,
                    change_detectors=None, bases=("uniform",))
    assert max(cal.values()) > 0 and 0.6 * tol <= cal.error <= tol
    cal = calibrate(model, frames, tol, metric=with_floor(1.2 * tol), max_evals=20, progress=False,
                    change_detectors=None, bases=("uniform",))
    assert max(cal.values()) == 0


def test_clips_run_as_streams_and_match_compare():
    """Several clips (each starting with a key frame) are measured as the streams of one batch."""
    from deltaconv.calibrate import Evaluator

    model = _model()
    frames = _video(16)
    clips = [frames[0:4], frames[6:10], frames[12:16]]
    ev = Evaluator(model, clips)
    assert len(ev.clips) == 1 and ev.clips[0][0].shape[0] == 3
    th = {n: 0.05 for n in ev.names}
    err, dens = ev(th, None)
    errs, dens_sum = [], 0.0
    for c in clips:
        dm = deltaconv.convert(model, thresholds=th, backend="reference", example_input=c[0])
        rep = compare(model, dm, c)
        errs += rep.per_frame["rel_err"]
        dens_sum += rep.density
    assert err == pytest.approx(sum(errs) / len(errs), rel=1e-4)
    assert dens == pytest.approx(dens_sum / 3, rel=1e-4)
    assert not any(layer.kind == "batchnorm" for layer in ev.dm.delta_layers())
    assert calibrate(model, clips[0], 0.05, max_evals=3, progress=False, change_detectors=None,
                     fold_bn=False).fold_bn is False  # recorded in the result and its file
    unfolded = Evaluator(model, clips, fold_bn=False)  # calibrate(..., fold_bn=False) converts the same way
    assert unfolded.names == ev.names and any(layer.kind == "batchnorm" for layer in unfolded.dm.delta_layers())
    # unequal clips run one after the other
    ev2 = Evaluator(model, [frames[0:4], frames[6:9]])
    assert len(ev2.clips) == 2
    assert ev2(th, None)[0] >= 0


def test_cost_elements_minimises_the_element_weighted_density(tmp_path):
    """cost="elements": the result's density is the element-weighted density of what convert
    makes of it, the file records the cost, and a bad cost names itself."""
    from deltaconv.fidelity import element_density

    model = _model()
    frames = _video(10)
    cal = calibrate(model, frames, TOL, max_evals=20, progress=False, change_detectors=None, cost="elements")
    assert cal.cost == "elements" and cal.error <= TOL
    dm = deltaconv.convert(model, thresholds=cal, backend="reference", example_input=frames[0])
    rep = compare(model, dm, frames)
    assert element_density(rep.layers) == pytest.approx(cal.density, rel=1e-6)
    assert rep.density != pytest.approx(cal.density, rel=1e-3)  # not the FLOPs density
    path = tmp_path / "th.json"
    cal.save(path)
    assert json.loads(path.read_text())["cost"] == "elements" and Calibration.load(path).cost == "elements"
    with pytest.raises(ValueError, match="cost must be one of .*'time'"):
        calibrate(model, frames, TOL, progress=False, cost="time")


def test_start_refines_a_calibration(setup, tmp_path):
    """start=: the search begins at the given thresholds (its first run measures them, as the
    calibration that made them measured), only lowers the density from there, stays within the
    tolerance, keeps the start's change detector, and reads the same start from a JSON file."""
    model, frames, kw, cal = setup
    fine = calibrate(model, frames[:10], TOL, start=cal, step=1, max_evals=20, progress=False)
    first = fine.history[0]
    assert first["phase"] == "start" and first["density"] == pytest.approx(cal.density, rel=1e-9)
    assert first["error"] == pytest.approx(cal.error, rel=1e-9, abs=1e-12)
    assert fine.error <= TOL and fine.density <= cal.density
    assert fine.change_detector == cal.change_detector
    assert not any(h["phase"] == "bisect" for h in fine.history)
    assert 2 <= fine.evals <= 20
    path = tmp_path / "start.json"
    cal.save(path)
    again = calibrate(model, frames[:10], TOL, start=str(path), step=1, max_evals=20, progress=False)
    assert dict(again) == dict(fine) and again.change_detector == fine.change_detector
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(dict(cal)))
    from_plain = calibrate(model, frames[:10], TOL, start=plain, step=1, max_evals=4, progress=False)
    assert from_plain.change_detector is None and from_plain.history[0]["phase"] == "start"


def test_start_from_another_fold_bn_warns(setup, tmp_path):
    """A start calibrated with another fold_bn (a Calibration's, or its file's) is refined with a warning
    naming both settings, as load_thresholds warns; the same setting and a plain dict do not warn."""
    model, frames, kw, cal = setup
    clip = frames[:4]
    with pytest.warns(UserWarning, match="start was calibrated with fold_bn=True, this calibration converts with "
                                         "fold_bn=False"):
        calibrate(model, clip, TOL, start=cal, fold_bn=False, max_evals=2, progress=False)
    path = tmp_path / "start.json"
    cal.save(path)
    with pytest.warns(UserWarning, match="fold_bn=True"):
        calibrate(model, clip, TOL, start=path, fold_bn=False, max_evals=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate(model, clip, TOL, start=cal, max_evals=2, progress=False)
        calibrate(model, clip, TOL, start=dict(cal), fold_bn=False, max_evals=2, progress=False)


def test_start_over_the_tolerance_is_halved_first():
    """Thresholds that exceed the tolerance are halved together until they do not; those at 0 stay 0."""
    model = _model()
    frames = _video(10)
    names = list(deltaconv.convert(model, backend="reference", example_input=frames[0]).thresholds())
    start = {n: 0.06 for n in names}
    start[names[0]] = 0.0
    cal = calibrate(model, frames, TOL, start=start, max_evals=14, progress=False)
    starts = [h for h in cal.history if h["phase"] == "start"]
    assert len(starts) >= 2 and starts[0]["error"] > TOL and starts[-1]["error"] <= TOL
    assert [h["s"] for h in starts] == [2.0 ** -i for i in range(len(starts))]
    assert cal.error <= TOL and cal[names[0]] == 0.0 and max(cal.values()) > 0


def test_start_errors_name_the_problem(setup):
    model, frames, kw, cal = setup
    names = list(cal)
    clip = frames[:4]
    with pytest.raises(ValueError, match=r"missing \['" + names[0]):
        calibrate(model, clip, TOL, start={n: 0.1 for n in names[1:]}, progress=False)
    with pytest.raises(ValueError, match=r"unknown \['nope'\]"):
        calibrate(model, clip, TOL, start={**dict(cal), "nope": 0.1}, progress=False)
    with pytest.raises(ValueError, match="finite numbers >= 0, got .*-1"):
        calibrate(model, clip, TOL, start={**dict(cal), names[1]: -1.0}, progress=False)
    with pytest.raises(ValueError, match="start was calibrated with truncation='max', got truncation='rms'"):
        calibrate(model, clip, TOL, start=cal, truncation="rms", progress=False)
    # another spelling of the same measures is accepted: on this model "hybrid" is "rms" everywhere (strides < 4)
    as_rms = Calibration(dict(cal), cal.change_detector, truncation={"*": "rms"})
    refined = calibrate(model, clip, TOL, start=as_rms, truncation="hybrid", max_evals=2, progress=False)
    assert refined.history[0]["phase"] == "start" and refined.truncation == "hybrid"
    with pytest.raises(ValueError, match=r"start was calibrated with truncation=\{'\*': 'rms'\}"):
        calibrate(model, clip, TOL, start=as_rms, truncation="pooled", progress=False)
    with pytest.raises(TypeError, match="start must be a Calibration, a dict .* got list"):
        calibrate(model, clip, TOL, start=[0.1], progress=False)
