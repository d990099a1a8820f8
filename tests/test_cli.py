"""The ``deltaconv`` command line: parsing, errors, convert --report, bench forwarding, calibrate."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from deltaconv import cli

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    """``(status, stdout, stderr)`` of ``deltaconv argv``; argparse usage errors give status 2."""
    try:
        status = cli.main(list(argv))
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


# ----------------------------------------------------------------------------- parsing
def test_parse_size():
    assert cli.parse_size("64x96") == (64, 96)
    assert cli.parse_size("480X640") == (480, 640)
    for bad in ("64", "64x", "axb", "0x10", "1x2x3"):
        with pytest.raises(Exception, match=repr(bad)):
            cli.parse_size(bad)


def test_parse_crop():
    assert cli.parse_crop("585,227,148,148") == (585, 227, 148, 148)
    assert cli.parse_crop(" 0, 0,1,2") == (0, 0, 1, 2)
    for bad in ("1,2,3", "a,b,c,d", "1,2,0,4", "-1,2,3,4", "1x2x3x4"):
        with pytest.raises(Exception, match=repr(bad)):
            cli.parse_crop(bad)


def test_demo_task_choices_are_the_drawn_tasks():
    from deltaconv.demo import DRAWN_TASKS

    demo_parser = cli.build_parser()._subparsers._group_actions[0].choices["demo"]
    task = next(a for a in demo_parser._actions if a.dest == "task")
    assert tuple(task.choices) == DRAWN_TASKS


def test_input_range_choices_are_the_model_files_ranges():
    from deltaconv.model_files import INPUT_RANGES

    for command in ("demo", "convert", "calibrate"):
        sub = cli.build_parser()._subparsers._group_actions[0].choices[command]
        assert tuple(next(a for a in sub._actions if a.dest == "input_range").choices) == INPUT_RANGES


def test_help_names_every_real_weight_model():
    from deltaconv import zoo

    assert cli.REAL_WEIGHT_NAMES.split(", ") == [n for n in zoo.REAL_WEIGHT_MODELS if n != "mobilenet_v2"]


def test_demo_defaults():
    args = cli.build_parser().parse_args(["demo"])
    assert args.model == "mobilenet_v2" and args.video is None and args.camera is None
    assert args.device == "cpu" and args.size is None and args.out == "demo.mp4" and args.threshold >= 0
    args = cli.build_parser().parse_args(["demo", "--camera", "1", "--size", "120x160", "--max-frames", "0"])
    assert args.camera == 1 and args.size == (120, 160) and args.max_frames is None
    assert not args.no_recompute and cli.build_parser().parse_args(["demo", "--no-recompute"]).no_recompute


@pytest.mark.parametrize("argv, fragments", [
    (["demo", "--size", "12"], ["argument --size", "'12'"]),
    (["demo", "--threshold", "-1"], ["argument --threshold", "'-1'"]),
    (["demo", "--max-frames", "many"], ["argument --max-frames", "'many'"]),
    (["demo", "--device", "tpu"], ["argument --device", "'tpu'"]),
    (["demo", "--video", "a.avi", "--camera", "0"], ["argument --camera", "not allowed with argument --video"]),
    (["calibrate"], ["--tolerance"]),
    (["demo", "--crop", "1,2,3"], ["argument --crop", "'1,2,3'"]),
    (["demo", "--start", "-2"], ["argument --start", "a frame index >= 0", "'-2'"]),
    (["demo", "--task", "boxes"], ["argument --task", "'boxes'"]),
    (["bench", "gpu"], ["argument sweep", "'gpu'"]),
    ([], ["demo,convert,bench,calibrate"]),
])
def test_usage_errors_name_argument_and_value(capsys, argv, fragments):
    status, _, err = run(capsys, *argv)
    assert status == 2
    for f in fragments:
        assert f in err


def test_unknown_model_lists_options(capsys):
    status, _, err = run(capsys, "convert", "mobilenet_v7", "--report")
    assert status == 2
    assert "unknown name 'mobilenet_v7'" in err and "mobilenet_v2" in err and "craft" in err
    assert "resnet18" in err and "pkg.module:factory" in err


def test_missing_video_names_search_paths(capsys, tmp_path, monkeypatch):
    import deltaconv.video as video

    monkeypatch.setattr(video, "video_dirs", lambda: [tmp_path / "videos"])
    monkeypatch.setattr(video, "_DEBIAN_VTEST", str(tmp_path / "debian" / "vtest.avi"))
    status, _, err = run(capsys, "demo", "--size", "32x32", "--no-progress", "--out", str(tmp_path / "x.mp4"))
    assert status == 1
    assert "vtest.avi" in err and str(tmp_path / "videos") in err and str(tmp_path / "debian") in err
    status, _, err = run(capsys, "demo", "--video", str(tmp_path / "none.mp4"))
    assert status == 1 and f"--video: '{tmp_path / 'none.mp4'}' does not exist" in err


# ----------------------------------------------------------------------------- convert
def test_convert_report(capsys):
    status, out, _ = run(capsys, "convert", "mobilenet_v2", "--report", "--size", "64x64")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["node", "target", "status", "layer", "class"]
    assert any("features.0.0" in line and "converted" in line for line in lines)
    assert any("folded" in line for line in lines)
    assert "fallbacks: none" in out or "fallbacks: " in out
    assert any(line.split()[0].isdigit() and "nodes:" in line for line in lines)


def test_convert_import_path_without_report(capsys):
    status, out, _ = run(capsys, "convert", "torchvision.models:squeezenet1_1", "--size", "64x64")
    assert status == 0
    assert out.startswith("torchvision.models:squeezenet1_1: ") and "converted" in out and "fallbacks" in out


def test_convert_uses_the_models_own_input_size(capsys):
    """A zoo model that takes one input size (BlazePose's 256x256 crops, its input_size) is traced at that size
    when --size is not given (224x224 would break its landmark heads' reshapes)."""
    status, out, _ = run(capsys, "convert", "blazepose")
    assert status == 0, out
    assert out.startswith("blazepose_full: ") and "223 converted" in out and "fallbacks: none" in out


def test_convert_detector_converts_its_backbone(capsys):
    status, out, _ = run(capsys, "convert", "fasterrcnn_mobilenet_v3_large_320_fpn", "--size", "64x64")
    assert status == 0, out
    assert out.startswith("fasterrcnn_mobilenet_v3_large_320_fpn (its backbone; the heads stay dense): ")
    assert "fallbacks: none" in out
    status, out, _ = run(capsys, "convert", "fasterrcnn_mobilenet_v3_large_320_fpn", "--report", "--size", "64x64")
    assert status == 0 and out.splitlines()[0].endswith("(its backbone; the heads stay dense):")
    assert any(line.startswith("body_0_0 ") and "Conv2d:body.0.0" in line and "converted" in line
               for line in out.splitlines())


def test_demo_refuses_a_detector(capsys):
    status, _, err = run(capsys, "demo", "--model", "fasterrcnn_mobilenet_v3_large_320_fpn", "--max-frames", "1")
    assert status == 1 and "is a detection model" in err and "convert_backbone" in err


def test_calibrate_a_detector_calibrates_its_backbone(capsys, tmp_path):
    """``deltaconv calibrate --model <detector>``: thresholds of the backbone (its layer names), with the
    error over every feature map, that ``convert_backbone`` loads; the trade-off table and plot too."""
    import torch
    import torchvision

    import deltaconv
    out = tmp_path / "det.json"
    status, stdout, err = run(capsys, "calibrate", "--model", "fasterrcnn_mobilenet_v3_large_320_fpn", "--tolerance",
                              "0.05", "--frames", "3", "--size", "48x64", "--max-evals", "6", "--sweep", "0,0.05",
                              "--out", str(out))
    assert status == 0, err
    assert "thresholds of fasterrcnn_mobilenet_v3_large_320_fpn's backbone" in stdout
    assert "deltaconv.convert_backbone(model, frames, thresholds=" in stdout
    assert out.is_file() and out.with_suffix(".png").is_file()
    names = set(json.loads(out.read_text())["thresholds"])
    assert any(n.startswith("body.") for n in names) and any(n.startswith("fpn.") for n in names)
    torch.manual_seed(0)
    det = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None,
                                                                             weights_backbone=None).eval()
    converted = deltaconv.convert_backbone(det, torch.rand(1, 3, 48, 64), thresholds=str(out))
    assert set(converted.backbone.thresholds()) >= names


# ----------------------------------------------------------------------------- bench
def test_bench_forwards_args_via_runpy(capsys, tmp_path, monkeypatch):
    (tmp_path / "kernel_sweep.py").write_text(
        "import sys, json, pathlib\n"
        "pathlib.Path(sys.argv[1]).write_text(json.dumps(sys.argv[2:]))\n"
        "print('kernel sweep ran')\n"
        "if '--fail' in sys.argv: sys.exit(3)\n")
    monkeypatch.setattr(cli, "_bench_dirs", lambda: [tmp_path])
    log = tmp_path / "argv.json"
    status, out, _ = run(capsys, "bench", "kernel", str(log), "--sizes", "64,128", "-n", "2")
    assert status == 0 and "kernel sweep ran" in out
    assert json.loads(log.read_text()) == ["--sizes", "64,128", "-n", "2"]
    status, _, _ = run(capsys, "bench", "kernel", str(log), "--fail")
    assert status == 3


def test_bench_missing_script_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_bench_dirs", lambda: [tmp_path / "benchmarks"])
    status, _, err = run(capsys, "bench", "video", "--frames", "10")
    assert status == 2
    assert "video_sweep.py" in err and str(tmp_path / "benchmarks") in err


# ----------------------------------------------------------------------------- calibrate
def test_calibrate_without_the_module_says_so(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "deltaconv.calibrate", None)
    status, _, err = run(capsys, "calibrate", "--tolerance", "0.1")
    assert status == 2 and "deltaconv.calibrate is not available" in err


def test_calibrate_writes_loadable_thresholds_table_and_plot(capsys, tmp_path, monkeypatch):
    import deltaconv

    calls = {}

    def fake_calibrate(model, frames, tolerance, metric="rel_err", **kw):
        calls.update(frames=len(frames), shape=tuple(frames[0].shape), tolerance=tolerance, metric=metric, **kw)
        names = deltaconv.convert(model, example_input=frames[0]).thresholds()
        return {n: 0.01 for n in names}

    monkeypatch.setitem(sys.modules, "deltaconv.calibrate", types.SimpleNamespace(calibrate=fake_calibrate))
    out = tmp_path / "cal" / "thresholds.json"
    status, stdout, err = run(capsys, "calibrate", "--model", "mobilenet_v2", "--tolerance", "0.05", "--frames", "3",
                              "--size", "32x48", "--out", str(out), "--sweep", "0,0.1", "--max-evals", "5")
    assert status == 0, err
    assert calls == {"frames": 3, "shape": (1, 3, 32, 48), "tolerance": 0.05, "metric": "rel_err", "max_evals": 5,
                     "truncation": "max", "backend": "reference"}
    data = json.loads(out.read_text())
    assert set(data) >= {"thresholds"} and all(v == 0.01 for v in data["thresholds"].values())
    assert "per-layer" in stdout and "threshold" in stdout and str(out) in stdout
    assert out.with_suffix(".png").stat().st_size > 1000
    from deltaconv.weights import mobilenet_v2_imagenet
    dm = deltaconv.convert(mobilenet_v2_imagenet(), thresholds=str(out))  # the format convert loads
    assert set(dm.thresholds().values()) == {0.01}


def test_calibrate_crop_takes_a_region_and_names_one_outside_the_frame(capsys, tmp_path, monkeypatch):
    calls = {}

    def fake_calibrate(model, frames, tolerance, metric="rel_err", **kw):
        calls.update(shape=tuple(frames[0].shape))
        return {}

    monkeypatch.setitem(sys.modules, "deltaconv.calibrate", types.SimpleNamespace(calibrate=fake_calibrate))
    common = ("calibrate", "--tolerance", "0.05", "--frames", "2", "--sweep", "0", "--out", str(tmp_path / "t.json"))
    status, _, err = run(capsys, *common, "--crop", "700,500,69,77")  # vtest.avi is 768x576
    assert status == 2
    assert "--crop: the region (x=700, y=500, width=69, height=77) does not lie inside the 768x576" in err
    status, out, err = run(capsys, *common, "--crop", "700,500,68,76")
    assert calls == {"shape": (1, 3, 76, 68)}  # the region at its own size (no --size)
    assert "at 76x68 (each frame's region x=700, y=500, width 68, height 76)" in out, (status, out, err)


def test_calibrate_output_measures_the_named_output(capsys, tmp_path, monkeypatch):
    """--output NAME: calibrate() and the trade-off table compare that output of a dict (or tuple) model."""
    import torch
    import torch.nn as nn

    from deltaconv import zoo
    from deltaconv.fidelity import OutputPicker

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 2, 3, padding=1), nn.Conv2d(3, 1, 1)

        def forward(self, x):
            return {"out": self.a(x), "aux": self.b(x)}

    calls = {}

    def fake_calibrate(model, frames, tolerance, metric="rel_err", **kw):
        calls.update(kw)
        return {}

    entry = zoo.ZooModel("two_heads", TwoHeads().eval(), "segmentation", "random")
    monkeypatch.setattr(zoo, "load", lambda name, input_range=None: entry)
    monkeypatch.setitem(sys.modules, "deltaconv.calibrate", types.SimpleNamespace(calibrate=fake_calibrate))
    common = ("calibrate", "--tolerance", "0.05", "--frames", "2", "--size", "16x24", "--sweep", "0",
              "--out", str(tmp_path / "t.json"))
    status, out, err = run(capsys, *common, "--output", "aux")
    assert status == 0, err
    assert isinstance(calls["output_fn"], OutputPicker) and calls["output_fn"].name == "aux"
    assert "thresholds of two_heads (aux) on 2 frames" in out and "convert_backbone" not in out
    x = torch.zeros(1, 3, 4, 4)
    assert calls["output_fn"](entry.model(x)).shape == (1, 1, 4, 4)
    status, out, err = run(capsys, *common, "--output", "landmarks")
    assert status != 0 and "output: the model's output has no 'landmarks'; its outputs: ['aux', 'out']" in out + err


def test_output_picker_names_what_there_is():
    import torch

    from deltaconv.fidelity import OutputPicker

    t = torch.ones(1)
    assert OutputPicker("1")((t, 2 * t))[0] == 2 and OutputPicker("-1")([t, 3 * t])[0] == 3
    with pytest.raises(ValueError, match=r"no '2'; its outputs: \[0, 1\]"):
        OutputPicker("2")((t, t))
    with pytest.raises(ValueError, match=r"no 'x'; its outputs: none \(a single tensor\)"):
        OutputPicker("x")(t)


# ----------------------------------------------------------------------------- entry points
def test_console_script_declared():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        pytest.skip("tomllib needs Python 3.11")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["deltaconv"] == "deltaconv.cli:main"


def test_python_dash_m(tmp_path):
    r = subprocess.run([sys.executable, "-m", "deltaconv", "convert", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "--report" in r.stdout


def test_calibrate_truncation_option(capsys, tmp_path, monkeypatch):
    """--truncation rms (and pooled, hybrid) reaches calibrate() and the sweep's uniform rows, --cost, --start
    and --step reach calibrate(); a bad value or a missing start file is refused."""
    import deltaconv
    from deltaconv import demo

    calls, sweeps = {}, {}

    def fake_calibrate(model, frames, tolerance, metric="rel_err", **kw):
        calls.update(kw)
        return {n: 0.01 for n in deltaconv.convert(model, example_input=frames[0]).thresholds()}

    real_sweep = demo.threshold_sweep

    def spy_sweep(*args, **kw):
        sweeps.update(kw)
        return real_sweep(*args, **kw)

    monkeypatch.setitem(sys.modules, "deltaconv.calibrate", types.SimpleNamespace(calibrate=fake_calibrate))
    monkeypatch.setattr(demo, "threshold_sweep", spy_sweep)
    out = tmp_path / "thresholds.json"
    status, _, err = run(capsys, "calibrate", "--tolerance", "0.05", "--frames", "3", "--size", "32x48",
                         "--out", str(out), "--sweep", "0.1", "--truncation", "rms", "--cost", "elements")
    assert status == 0, err
    assert calls["truncation"] == "rms" and sweeps["truncation"] == "rms" and calls["cost"] == "elements"
    for truncation in ("pooled", "hybrid"):
        status, _, err = run(capsys, "calibrate", "--tolerance", "0.05", "--frames", "3", "--size", "32x48",
                             "--out", str(out), "--sweep", "0.1", "--truncation", truncation)
        assert status == 0, err
        assert calls["truncation"] == truncation and sweeps["truncation"] == truncation
    status, _, err = run(capsys, "calibrate", "--tolerance", "0.05", "--frames", "3", "--size", "32x48",
                         "--out", str(tmp_path / "fine.json"), "--sweep", "0.1", "--start", str(out), "--step", "1")
    assert status == 0, err
    assert calls["start"] == str(out) and calls["step"] == 1
    status, _, err = run(capsys, "calibrate", "--tolerance", "0.05", "--start", str(tmp_path / "none.json"))
    assert status != 0 and "--start: no thresholds file at" in err and "none.json" in err
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--tolerance", "0.05", "--truncation", "l1"])
    assert "invalid choice: 'l1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--tolerance", "0.05", "--cost", "time"])
    assert "invalid choice: 'time'" in capsys.readouterr().err


def test_calibrate_device_dtype_and_backend_options(capsys, tmp_path, monkeypatch):
    """--dtype converts the model and the frames before calibrate() and the sweep see them, --backend
    reaches both (auto: the reference backend on the CPU); --device cuda without a GPU is refused."""
    import torch

    import deltaconv
    from deltaconv import demo

    calls, sweeps = {}, {}

    def fake_calibrate(model, frames, tolerance, metric="rel_err", **kw):
        calls.update(kw, model_dtype=next(model.parameters()).dtype, frame_dtype=frames[0].dtype)
        return {n: 0.01 for n in deltaconv.convert(model, example_input=frames[0]).thresholds()}

    def spy_sweep(model, frames, thresholds, **kw):
        sweeps.update(kw, frame_dtype=frames[0].dtype)
        return [{"threshold": None, "rel_error": 0.0, "max_rel_error": 0.0, "top1_agreement": 1.0, "density": 0.5,
                 "work": 0.5}]

    monkeypatch.setitem(sys.modules, "deltaconv.calibrate", types.SimpleNamespace(calibrate=fake_calibrate))
    monkeypatch.setattr(demo, "threshold_sweep", spy_sweep)
    out = tmp_path / "thresholds.json"
    status, stdout, err = run(capsys, "calibrate", "--tolerance", "0.05", "--frames", "2", "--size", "32x48",
                              "--out", str(out), "--dtype", "bfloat16")
    assert status == 0, err
    assert calls["model_dtype"] == calls["frame_dtype"] == sweeps["frame_dtype"] == torch.bfloat16
    assert calls["backend"] == sweeps["backend"] == "reference"
    assert "fold_bn" not in calls and sweeps["fold_bn"] is True
    assert "in bfloat16 on cpu (reference backend)" in stdout
    status, _, err = run(capsys, "calibrate", "--tolerance", "0.05", "--frames", "2", "--size", "32x48",
                         "--out", str(out), "--backend", "cuda", "--no-fold-bn")
    assert status == 0, err
    assert calls["backend"] == sweeps["backend"] == "cuda"  # as given
    assert calls["fold_bn"] is False and sweeps["fold_bn"] is False
    if not torch.cuda.is_available():
        status, _, err = run(capsys, "calibrate", "--tolerance", "0.05", "--device", "cuda")
        assert status == 2 and "--device: 'cuda' asked but torch.cuda.is_available() is False" in err
