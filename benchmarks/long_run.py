"""An hour of video: a converted model replayed as a CUDA graph over a looped video.

deltaconv aims to stay trustworthy over hours of video. This runs MobileNetV2 (ImageNet weights),
converted with a thresholds file of ``fidelity_sweep.py`` and replayed as a CUDA graph, over that
file's video from ``--start`` to its end and then over the whole video again and again, for
``--minutes`` of video at the video's own frame rate. Key frames come at the start and then as
``convert(refresh_every=...)`` places them (``--refresh-every``: by default ``auto``, every 1,000
frames in float16 and bfloat16; ``none`` for the start only); each restart of the video is a scene
cut the model must follow. The reference is the dense model in the same dtype, also replayed as a
CUDA graph. Per window of ``--window`` frames it reports the logit relative error (mean, p95, max)
and the FLOPs density, so drift or a growing error would show (it does in float16 without
periodic key frames: README, *Reliability*).

The frames are decoded once (``deltaconv.video.read_frames``, as the calibration read them) and
kept on the GPU: 17 GB for the 1,394 frames of one-by-one at 1080x1920 in float16::

    PYTHONPATH=. python benchmarks/long_run.py --file fidelity_thresholds_one_0.02_rms_float16.json \\
        --minutes 60 [--dtype float16] [--size 1080 1920] [--window 3000]

Writes ``long_run_<file stem>[_<dtype>][_norefresh|_refreshN].csv`` to ``--out`` (one row per window, the whole run as window
``all``) and prints the same.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_holdout import video_of  # noqa: E402
from common import RESULTS, write_csv  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.cuda_graphs import graphed_model  # noqa: E402
from deltaconv.fidelity import flops_density, relative_error, video_frames  # noqa: E402
from deltaconv.demo import open_source  # noqa: E402
from deltaconv.video import find_sample_video  # noqa: E402


def stream_order(n_video: int, start: int, total: int):
    """Indices into the video's frames: ``start`` to the end, then from 0 again, ``total`` in all."""
    return itertools.islice(itertools.chain(range(start, n_video), itertools.cycle(range(n_video))), total)


def summary(errors: torch.Tensor, density: float) -> dict:
    """Mean, p95 and max of a window's per-frame errors (float64 on the CPU), with its density."""
    e = errors.sort().values
    return {"frames": len(e), "rel_err_mean": float(e.mean()), "rel_err_p95": float(e[min(len(e) - 1, int(0.95 * len(e)))]),
            "rel_err_max": float(e[-1]), "density": density}


def _refresh(text: str):
    """``--refresh-every``: a positive int, ``auto`` or ``none``."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, 'auto' or 'none', got {text!r}")
    return int(text)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--file", required=True, help="a thresholds file of fidelity_sweep.py in --thresholds-dir")
    p.add_argument("--thresholds-dir", default=str(RESULTS))
    p.add_argument("--minutes", type=float, default=60.0, help="minutes of video at its frame rate (default 60)")
    p.add_argument("--size", type=int, nargs=2, default=[1080, 1920], metavar=("H", "W"))
    p.add_argument("--start", type=int, default=200, help="the key frame (default 200, after the calibration frames)")
    p.add_argument("--window", type=int, default=3000, help="frames per reported window")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--refresh-every", type=_refresh, default="auto", metavar="N|auto|none",
                   help="convert(refresh_every=...): a key frame every N frames; auto (the default): every "
                        "1,000 in float16 and bfloat16, none in float32; none: only the first")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("long_run.py replays CUDA graphs: it needs a CUDA GPU")
    if a.window < 1 or a.minutes <= 0:
        p.error(f"--window must be >= 1 and --minutes > 0, got {a.window} and {a.minutes}")
    try:
        video = video_of(a.file)
    except ValueError as e:
        p.error(str(e))
    path = Path(a.thresholds_dir) / a.file
    spec = json.loads(path.read_text())
    dtype = getattr(torch, a.dtype)
    cap, _, fps, _ = open_source(find_sample_video(video))  # the container's frame rate
    cap.release()
    total = int(round(a.minutes * 60 * fps))

    interval = deltaconv.model.AUTO_REFRESH.get(dtype) if a.refresh_every == "auto" else a.refresh_every
    t0 = time.perf_counter()
    frames = [f.to("cuda", dtype).contiguous(memory_format=torch.channels_last)
              for f in video_frames(video, tuple(a.size))]
    if not 0 <= a.start < len(frames):
        p.error(f"--start must be in [0, {len(frames)}), got {a.start}")
    print(f"{video}: {len(frames)} frames at {a.size[0]}x{a.size[1]}, {fps:g} fps, decoded in "
          f"{time.perf_counter() - t0:.0f} s; {total} frames ({a.minutes:g} min) from frame {a.start}, "
          f"{a.file}, {a.dtype}, both models replayed as CUDA graphs, key frames "
          f"{'at the start only' if interval is None else f'every {interval} frames'}", flush=True)

    from deltaconv.weights import mobilenet_v2_imagenet
    model = mobilenet_v2_imagenet().to("cuda", dtype).to(memory_format=torch.channels_last)
    dense = graphed_model(model, frames[a.start])
    dm = deltaconv.convert(model, thresholds=str(path), backend="cuda", example_input=frames[a.start],
                           cuda_graph=True, check_finite=False, refresh_every=a.refresh_every)
    errors = torch.empty(total, dtype=torch.float64, device="cuda")
    rows, densities = [], []
    t0 = time.perf_counter()
    with torch.inference_mode():
        order = stream_order(len(frames), a.start, total + 1)  # + the key frame
        dm(frames[next(order)])
        for i, index in enumerate(order):
            if i % a.window == 0:
                dm.reset_stats()
            x = frames[index]
            errors[i] = relative_error(dm(x), dense(x))[0]
            if (i + 1) % a.window == 0 or i + 1 == total:
                first = i // a.window * a.window
                densities.append((i + 1 - first, flops_density(dm.stats())))
                rows.append({"window": str(len(rows)), "first": first + 1,
                             **summary(errors[first:i + 1].cpu(), densities[-1][1])})
                r = rows[-1]
                print(f"   window {r['window']:>3} from frame {r['first']:6d} of the run, {r['frames']:5d} frames: "
                      f"logit rel. error mean {r['rel_err_mean']:.4f} p95 {r['rel_err_p95']:.4f} max "
                      f"{r['rel_err_max']:.4f}, FLOPs density {r['density']:.3f}", flush=True)
    seconds = time.perf_counter() - t0
    overall = sum(n * d for n, d in densities) / sum(n for n, _ in densities)
    rows.append({"window": "all", "first": 1, **summary(errors.cpu(), overall)})
    for r in rows:
        r.update({"file": a.file, "video": video, "size": f"{a.size[0]}x{a.size[1]}", "start": a.start,
                  "minutes": a.minutes, "fps": fps, "dtype": a.dtype, "refresh_every": interval,
                  "truncation": spec.get("truncation"),
                  "tolerance": spec.get("tolerance"), "device": torch.cuda.get_device_name(),
                  "date": time.strftime("%Y-%m-%d", time.gmtime())})
    r = rows[-1]
    print(f"== all {r['frames']} frames ({seconds:.0f} s): logit rel. error mean {r['rel_err_mean']:.4f} p95 "
          f"{r['rel_err_p95']:.4f} max {r['rel_err_max']:.4f}, FLOPs density {r['density']:.3f}", flush=True)
    refresh = {"auto": "", None: "_norefresh"}.get(a.refresh_every, f"_refresh{a.refresh_every}")
    suffix = ("" if a.dtype == "float16" else f"_{a.dtype}") + refresh
    out = a.out / f"long_run_{Path(a.file).stem}{suffix}.csv"
    write_csv(out, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
