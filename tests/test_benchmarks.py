"""CPU checks of the benchmark scripts' plumbing (the timings themselves need a GPU; one timing check runs there)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def _row(op, changed, speedup):
    return {"op": op, "dtype": "float16", "channels": 64, "resolution": "1080x1920", "changed": changed,
            "speedup": speedup, "device": "test", "date": "2026-11-21"}


@pytest.mark.parametrize("ops", [["stem7x7"], ["conv3x3", "stem3x3"]], ids=["one op", "two ops"])
def test_kernel_sweep_plots_the_ops_of_its_rows(tmp_path, ops):
    pytest.importorskip("matplotlib")
    ks = load("kernel_sweep")
    rows = [_row(op, f, s) for op in ops for f, s in [(0.0, 9.0), (0.01, 2.0), (1.0, 0.5)]]
    out = tmp_path / "k.png"
    ks.plot(rows, out)
    assert out.stat().st_size > 0


def test_kernel_sweep_ops_are_known_and_stems_have_three_input_channels():
    ks = load("kernel_sweep")
    assert set(ks.DEFAULT_OPS) == {"conv3x3", "conv1x1", "dwconv3x3"}
    for op in ("stem3x3", "stem7x7"):
        assert ks.OPS[op]["cin"] == 3 and ks.OPS[op]["stride"] == 2
    with pytest.raises(SystemExit):
        ks.main(["--ops", "nope"])


def test_kernel_sweep_dilated_ops_and_missing_library_is_named(tmp_path, capsys):
    ks = load("kernel_sweep")
    assert ks.OPS["conv3x3d2"]["dilation"] == 2 and ks.OPS["conv3x3d4"]["dilation"] == 4
    missing = tmp_path / "nope.so"
    with pytest.raises(SystemExit):
        ks.main(["--library", str(missing)])
    err = capsys.readouterr().err
    assert "--library" in err and str(missing) in err


def test_fidelity_speed_finds_the_committed_thresholds_files_of_calibrated_rows():
    fs = load("fidelity_speed")
    rows = [r for r in fs.read_csv(fs.RESULTS / "fidelity.csv") if r["method"] == "calibrated"]
    assert len(rows) >= 4
    for r in rows:
        path = fs.thresholds_file(r, fs.RESULTS)
        assert path.is_file(), path
        assert ("_rms" in path.name) == (r["truncation"] == "rms")


def test_fidelity_plot_adds_speed_panels_for_timed_rows(tmp_path):
    pytest.importorskip("matplotlib")
    fs = load("fidelity_sweep")
    rows = fs.read_csv(fs.RESULTS / "fidelity.csv")
    for i, r in enumerate(rows):
        r["ms_per_frame"], r["dense_ms_per_frame"] = str(1.0 + 0.1 * i), "1.7"
    import matplotlib.pyplot as plt
    fs.plot(rows, tmp_path / "f.png")
    fig = plt.gcf()
    assert len(fig.axes) == 4  # density and speed, per video
    assert (tmp_path / "f.png").stat().st_size > 0


def test_launch_ab_sets_the_variable_only_inside_a_variant(monkeypatch):
    ab = load("launch_ab")
    monkeypatch.setenv("DELTACONV_PDL", "7")
    seen = {v: ab.with_variant(v, lambda: os.environ["DELTACONV_PDL"]) for v in ab.VARIANTS}
    assert seen == {"pdl": "1", "plain": "0"}
    assert os.environ["DELTACONV_PDL"] == "7"
    monkeypatch.delenv("DELTACONV_PDL")
    with pytest.raises(RuntimeError):
        ab.with_variant("pdl", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert "DELTACONV_PDL" not in os.environ


def test_launch_ab_rejects_unknown_ops_and_needs_the_cuda_backend(capsys):
    ab = load("launch_ab")
    with pytest.raises(SystemExit):
        ab.main(["--ops", "nope"])
    assert "nope" in capsys.readouterr().err
    from deltaconv.backends import cuda as dc
    if not dc.is_available():
        with pytest.raises(SystemExit, match="CUDA backend is unavailable"):
            ab.main(["--models"])


def test_video_sweep_keeps_finished_rows_when_cut_short(tmp_path, monkeypatch):
    """video.csv is rewritten after every threshold: a run stopped midway (a time limit) keeps the
    rows it finished."""
    vs = load("video_sweep")
    row = {"model": "m", "resolution": "8x8", "threshold": 0.02, "deltaconv_ms": 1.0}

    def cut_short(*args, on_rows=None, **kwargs):
        rows = [row]
        on_rows(rows)
        raise KeyboardInterrupt  # killed before the next threshold

    monkeypatch.setattr(vs, "sweep", cut_short)
    video = tmp_path / "v.avi"
    video.write_bytes(b"")
    with pytest.raises(KeyboardInterrupt):
        vs.main(["--models", "m", "--video", str(video), "--out", str(tmp_path)])
    lines = (tmp_path / "video.csv").read_text().splitlines()
    assert lines == ["model,resolution,threshold,deltaconv_ms", "m,8x8,0.02,1.0"]


def test_video_sweep_without_rows_says_so(tmp_path, monkeypatch):
    vs = load("video_sweep")
    monkeypatch.setattr(vs, "sweep", lambda *a, **k: ([], None))
    video = tmp_path / "v.avi"
    video.write_bytes(b"")
    with pytest.raises(SystemExit, match="no rows"):
        vs.main(["--models", "m", "--video", str(video), "--out", str(tmp_path)])


def test_work_density_counts_tiles_for_tiled_convs_and_input_pixels_for_activations():
    """One changed input pixel in a corner of a 16x16 frame: the 3x3 conv's output changes on 2x2
    pixels (4 of 256) inside one of its four 8x8 tiles, so its work is 0.25 of its tiles; the
    activation after it works on those 4 input pixels whatever it sends."""
    import torch

    wd = load("work_density")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 1)).eval()
    key = torch.randn(1, 3, 16, 16)
    changed = key.clone()
    changed[0, :, 0, 0] += 1.0
    summary, rows = wd.measure(model, [key, changed], 0.0)
    by_kind = {r["kind"]: r for r in rows}
    assert set(by_kind) == {"sparsify", "conv", "activation", "depthwise", "1x1 conv"}
    assert by_kind["conv"]["pixel_density"] == pytest.approx(4 / 256, abs=1e-4)  # rounded to 4 digits
    assert by_kind["conv"]["work_density"] == pytest.approx(0.25)
    assert by_kind["activation"]["layers"] == 2
    assert by_kind["activation"]["work_density"] >= by_kind["activation"]["pixel_density"] > 0
    assert by_kind["depthwise"]["work_density"] > by_kind["depthwise"]["pixel_density"]
    assert summary["frames"] == 1 and summary["rel_err"] < 1e-5
    assert 0 < summary["element_density"] < summary["work_density"] <= 1


def test_work_density_layer_kinds():
    import torch

    wd = load("work_density")
    from deltaconv.modules.linear import DCConv2d
    assert wd.layer_kind(DCConv2d.from_dense(torch.nn.Conv2d(8, 8, 1))) == "1x1 conv"
    assert wd.layer_kind(DCConv2d.from_dense(torch.nn.Conv2d(8, 8, 3, groups=8))) == "depthwise"
    assert wd.layer_kind(DCConv2d.from_dense(torch.nn.Conv2d(8, 16, 3, groups=2))) == "conv"
    assert wd.is_tiled("depthwise") and wd.is_tiled("conv") and not wd.is_tiled("1x1 conv")


def test_fidelity_sweep_names_thresholds_files_by_truncation_and_cost(tmp_path):
    fs = load("fidelity_sweep")
    assert fs.thresholds_path(tmp_path, "vtest.avi", 0.02, "max").name == "fidelity_thresholds_vtest_0.02.json"
    assert fs.thresholds_path(tmp_path, "vtest.avi", 0.02, "rms", "elements").name == \
        "fidelity_thresholds_vtest_0.02_rms_elements.json"
    assert fs.thresholds_path(tmp_path, "one-by-one-person-detection.mp4", 0.02, "rms", "flops", "float16").name == \
        "fidelity_thresholds_one_0.02_rms_float16.json"
    speed = load("fidelity_speed")
    row = {"video": "vtest.avi", "param": "0.02", "truncation": "rms", "cost": "elements"}
    assert speed.thresholds_file(row, tmp_path).name == "fidelity_thresholds_vtest_0.02_rms_elements.json"
    row.pop("cost")  # rows written before the column existed: FLOPs
    assert speed.thresholds_file(row, tmp_path).name == "fidelity_thresholds_vtest_0.02_rms.json"
    with pytest.raises(SystemExit):
        fs.main(["--cost", "time"])


def _tiny_fidelity_sweep(monkeypatch, out):
    """fidelity_sweep.py with a small model on random frames in place of MobileNetV2 and the video,
    and the arguments of a calibration-only run writing ``out``: ``(module, arguments)``."""
    import torch

    fs = load("fidelity_sweep")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    frames = [torch.rand(1, 3, 16, 16) for _ in range(6)]
    monkeypatch.setattr(fs, "load_model", lambda device, dtype=torch.float32: model.to(dtype))
    monkeypatch.setattr(fs, "video_frames", lambda video, size, n: frames[:n])
    return fs, ["--videos", "vtest.avi", "--size", "16", "16", "--device", "cpu", "--uniform", "--detectors", "none",
                "--calib-clips", "1", "--calib-frames", "3", "--calib-span", "3", "--eval-frames", "3",
                "--max-evals", "4", "--out", str(out), "--quiet"]


def test_fidelity_sweep_calibrates_alone_into_a_new_folder(tmp_path, monkeypatch):
    """``--uniform`` with no values runs only the calibration, and its thresholds file is written
    even where the CSV's folder does not exist yet (a small model on random frames)."""
    out = tmp_path / "new" / "f.csv"
    fs, common = _tiny_fidelity_sweep(monkeypatch, out)
    fs.main(common)
    rows = fs.read_csv(out)
    assert [r["method"] for r in rows] == ["calibrated"]
    assert rows[0]["dtype"] == "float32" and rows[0]["backend"] == "reference"
    assert (out.parent / "fidelity_thresholds_vtest_0.02.json").is_file()
    # in another dtype the thresholds file says so, and the rows record it
    fs.main(common + ["--dtype", "bfloat16", "--append"])
    rows = fs.read_csv(out)
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    assert (out.parent / "fidelity_thresholds_vtest_0.02_bfloat16.json").is_file()


def test_fidelity_sweep_refines_a_thresholds_file(tmp_path, monkeypatch):
    """``--start`` (``{video}`` replaced by the video's short name) refines a calibration: the row's
    method is ``refined``, its thresholds go to a ``_refined`` file, the one it started from stays."""
    out = tmp_path / "f.csv"
    fs, common = _tiny_fidelity_sweep(monkeypatch, out)
    fs.main(common)
    first = tmp_path / "fidelity_thresholds_vtest_0.02.json"
    before = first.read_text()
    fs.main(common + ["--append", "--step", "1", "--start", str(tmp_path / "fidelity_thresholds_{video}_0.02.json")])
    rows = fs.read_csv(out)
    assert [r["method"] for r in rows] == ["calibrated", "refined"]
    assert (tmp_path / "fidelity_thresholds_vtest_0.02_refined.json").is_file() and first.read_text() == before
    assert float(rows[1]["cal_density"]) <= float(rows[0]["cal_density"])
    speed = load("fidelity_speed")
    assert speed.thresholds_file(rows[1], tmp_path).name == "fidelity_thresholds_vtest_0.02_refined.json"


def test_kernel_sweep_in_graph_calls_below_one_is_named(capsys):
    ks = load("kernel_sweep")
    with pytest.raises(SystemExit):
        ks.main(["--in-graph-calls", "0"])
    assert "--in-graph-calls must be >= 1, got 0" in capsys.readouterr().err
    common = load("common")
    with pytest.raises(ValueError, match="calls must be >= 1, got -2"):
        common.time_in_graph(lambda: None, calls=-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_time_in_graph_is_per_call_and_leaves_out_the_graph_launch():
    common = load("common")
    x = torch.zeros(1 << 20, device="cuda")
    one = common.time_cuda(common.capture_graph(lambda: x.add_(1))[0], iters=30)
    per_call = common.time_in_graph(lambda: x.add_(1), calls=20)
    # a 4 MiB add takes a few us; one replay of a one-call graph adds the host's launch to it
    assert 0 < per_call < one


def test_calibration_holdout_windows_and_whole_stretch():
    ch = load("calibration_holdout")
    errors = [0.01, 0.03, 0.02, 0.05, 0.04]
    rows = ch.window_rows(errors, [0.5, 0.7, 0.6, 0.8, 0.9], window=2)
    assert [r["window"] for r in rows] == ["0", "1", "2", "all"]
    assert [r["frames"] for r in rows] == [2, 2, 1, 5] and [r["first"] for r in rows] == [0, 2, 4, 0]
    assert rows[1]["rel_err_max"] == 0.05 and rows[1]["rel_err_mean"] == pytest.approx(0.035)
    assert rows[-1]["rel_err_max"] == 0.05 and rows[-1]["density"] == pytest.approx(0.7)
    with pytest.raises(SystemExit):
        ch.main(["--window", "0"])


def test_calibration_holdout_files_exist_and_name_their_video():
    ch = load("calibration_holdout")
    for name, video in ch.FILES.items():
        assert (BENCH / "results" / name).is_file(), name
        assert video in ("vtest.avi", "one-by-one-person-detection.mp4") and ch.video_of(name) == video
    assert ch.video_of("fidelity_thresholds_one_0.02_rms_float16.json") == "one-by-one-person-detection.mp4"
    with pytest.raises(SystemExit):
        ch.main(["--files", "thresholds.json"])


def test_long_run_plays_from_start_then_loops_and_summarises_windows():
    lr = load("long_run")
    assert list(lr.stream_order(5, 3, 9)) == [3, 4, 0, 1, 2, 3, 4, 0, 1]
    assert list(lr.stream_order(5, 0, 3)) == [0, 1, 2]
    s = lr.summary(torch.tensor([0.03, 0.01, 0.02], dtype=torch.float64), 0.4)
    assert s["frames"] == 3 and s["rel_err_max"] == 0.03 and s["rel_err_mean"] == pytest.approx(0.02)
    assert s["rel_err_p95"] == 0.03 and s["density"] == 0.4
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            lr.main(["--file", "fidelity_thresholds_one_0.02_rms_float16.json"])


def test_kernel_family_drops_templates_unless_asked():
    """profile_model's rows: a kernel's family without namespaces and parameters; with ``templates`` its
    specialisation too (namespaces inside the arguments dropped), so that specialisations stay apart."""
    common = load("common")
    name = ("void deltaconv::pw::activation_kernel<__half, 8, 2, false, true>"
            "(deltaconv::pw::ActivationParams<__half>)")
    assert common.kernel_family(name) == "activation_kernel"
    assert common.kernel_family(name, templates=True) == "activation_kernel<__half, 8, 2, false, true>"
    other = "void deltaconv::conv::dwconv_vec_kernel<__half, 3, 1, 1, 8, 4, true>(const __half*, int)"
    assert common.kernel_family(other, templates=True) != common.kernel_family(
        other.replace("8, 4, true", "4, 4, false"), templates=True)


def test_layer_density_groups_layers_by_their_stride_against_the_frame():
    """A 64x64 frame: layers of 4096, 1024 (and 1000: rounded to stride 2) and 16 output pixels fall at
    strides 1, 2 and 16, and one of a single pixel (a classifier after global pooling) at GLOBAL, last;
    each group's density is its FLOPs done over its dense FLOPs, its shares add up to
    1, and layers without FLOPs or never run (NaN) count nothing done."""
    ld = load("layer_density")
    nan = float("nan")
    layers = [{"pixels": 4096, "flops_dense": 100.0, "mean_flops_done": 50.0},
              {"pixels": 1024, "flops_dense": 200.0, "mean_flops_done": 20.0},
              {"pixels": 1000, "flops_dense": 100.0, "mean_flops_done": nan},
              {"pixels": 16, "flops_dense": 600.0, "mean_flops_done": 30.0},
              {"pixels": 16, "flops_dense": 0.0, "mean_flops_done": 0.0},
              {"pixels": 1, "flops_dense": 100.0, "mean_flops_done": 100.0}]
    assert [ld.layer_stride(n, 4096) for n in (4096, 1024, 1000, 16, 5000, 1)] == [1, 2, 2, 16, 1, ld.GLOBAL]
    assert ld.layer_stride(1, 1) == 1  # a one-pixel frame: its one-pixel layers are at stride 1
    rows = ld.stride_table(layers, 4096)
    assert [(r["stride"], r["layers"]) for r in rows] == [(1, 1), (2, 2), (16, 1), (ld.GLOBAL, 1)]
    assert [ld.stride_label(r["stride"]) for r in rows] == ["1", "2", "16", "global"]
    assert [r["density"] for r in rows] == pytest.approx([0.5, 20 / 300, 0.05, 1.0])
    assert [r["share_dense"] for r in rows] == pytest.approx([100 / 1100, 300 / 1100, 600 / 1100, 100 / 1100])
    assert [r["share_done"] for r in rows] == pytest.approx([50 / 200, 20 / 200, 30 / 200, 100 / 200])


def test_zoo_speed_takes_the_models_own_input_size_and_rejects_another():
    zs = load("zoo_speed")
    own = zs.zoo.ZooModel("pose", torch.nn.Identity(), None, "none", input_size=(256, 256))
    anything = zs.zoo.ZooModel("any", torch.nn.Identity(), None, "none")
    assert zs.input_size(own, None) == (256, 256)
    assert zs.input_size(own, [256, 256]) == (256, 256)
    assert zs.input_size(anything, [576, 768]) == (576, 768)
    with pytest.raises(ValueError, match=r"--size: pose takes only 256x256, got 576x768"):
        zs.input_size(own, [576, 768])
    with pytest.raises(ValueError, match=r"--size: any takes any input size"):
        zs.input_size(anything, None)


def test_zoo_speed_checks_frames_against_warmup():
    zs = load("zoo_speed")
    with pytest.raises(SystemExit):
        zs.main(["--frames", "5", "--warmup", "8"])


def test_zoo_speed_output_errors_are_over_the_whole_sequence_after_the_key_frame():
    zs = load("zoo_speed")
    ref = [{"a": torch.tensor([9.0]), "p": torch.tensor([0.0])}, {"a": torch.tensor([3.0]), "p": torch.tensor([0.0])},
           {"a": torch.tensor([4.0]), "p": torch.tensor([1.0])}]
    got = [{"a": torch.tensor([0.0]), "p": torch.tensor([5.0])}, {"a": torch.tensor([3.0]), "p": torch.tensor([1e-4])},
           {"a": torch.tensor([4.0 + 5.0]), "p": torch.tensor([1.0])}]
    errors = zs.output_errors(got, ref)
    assert errors["a"] == pytest.approx(1.0)  # sqrt(25 / (9 + 16)); the key frame's 9 is not counted
    assert errors["p"] == pytest.approx(1e-4)  # finite although the reference is 0 on a frame
    assert zs.named_outputs((torch.ones(1), "x", torch.zeros(1))).keys() == {"out0", "out2"}
    assert zs.named_outputs(torch.ones(1)).keys() == {"out"}


def test_cloned_output_copies_tensors_in_any_nesting():
    common = load("common")
    a, b = torch.zeros(2), torch.ones(1)
    got = common.cloned_output({"out": a, "rest": (b, [a], "name")})
    a.add_(5)
    b.add_(5)
    assert torch.equal(got["out"], torch.zeros(2)) and torch.equal(got["rest"][0], torch.ones(1))
    assert isinstance(got["rest"], tuple) and got["rest"][2] == "name"
    assert torch.equal(got["rest"][1][0], torch.zeros(2))
