"""PP-OCRv4's text detector (real weights, ONNX through onnx2torch) converted, on the sample videos.

For each video, resolution and threshold it runs the frames through the dense model (float16,
channels_last, in plain torch calls (``deltaconv.onnx_models.plain_torch``), replayed as a CUDA graph) and the converted model (``backend="cuda"``, float16,
``cuda_graph=True``), timing every frame with CUDA events after warm-up (medians), and compares the
outputs the way RapidOCR reads them: the text mask (probability > 0.3, ``deltaconv.ppocr.TEXT_THRESHOLD``)
as IoU against the dense model's (1 when both are empty), the largest probability difference, and
the share of pixels the dense model marks as text. Writes ``benchmarks/results/text_detector.csv``.
Run on a CUDA machine with the sample videos reachable (``deltaconv.video.video_dirs``)::

    PYTHONPATH=. python benchmarks/text_detector.py [--size 1088 1920] [--thresholds 0.01 0.02]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import graphed_model, run_info, time_frames, write_csv  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.fidelity import flops_density, mask_iou  # noqa: E402
from deltaconv.onnx_models import plain_torch  # noqa: E402
from deltaconv.ppocr import TEXT_THRESHOLD, ppocr_v4_det  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "text_detector.csv"


def run(video: str, size: tuple, thresholds: list, n_frames: int, start: int, warmup: int, info: dict) -> list:
    """The rows of one video at one size: the dense graph, then the converted model per threshold."""
    # the dense model in plain torch calls (onnx2torch's resize reads its scales on the host: no CUDA graph)
    model = plain_torch(ppocr_v4_det()).cuda().half().to(memory_format=torch.channels_last)
    frames = [f.cuda().half() for f in read_frames(find_sample_video(video), max_frames=n_frames, size=size,
                                                   start=start)]
    with torch.no_grad():
        _, dense = time_frames(model, frames, warmup)
    dense_ms, _ = time_frames(graphed_model(model, frames[0]), frames, warmup)
    text = statistics.mean(float((d > TEXT_THRESHOLD).float().mean()) for d in dense[1:])
    rows = []
    for t in thresholds:
        dm = deltaconv.convert(model, threshold=t, truncation="rms", backend="cuda", example_input=frames[0],
                               cuda_graph=True, check_finite=False)
        assert not dm.report.fallbacks, dm.report.fallbacks
        ms, outs = time_frames(dm, frames, warmup)
        pairs = list(zip(outs[1:], dense[1:]))  # the key frame left out
        iou = statistics.mean(float(mask_iou(o, d, TEXT_THRESHOLD).mean()) for o, d in pairs)
        diff = max(float((o.float() - d.float()).abs().max()) for o, d in pairs)
        rows.append({"model": "ppocr_v4_det", "resolution": f"{size[0]}x{size[1]}", "dtype": "float16",
                     "baseline": "cudagraph", "truncation": "rms", "threshold": t, "dense_ms": round(dense_ms, 3),
                     "deltaconv_ms": round(ms, 3), "speedup": round(dense_ms / ms, 3), "mask_iou": round(iou, 4),
                     "max_prob_diff": f"{diff:.3e}", "text_fraction": f"{text:.2e}",
                     "flops_density": round(flops_density(dm.stats()), 4), "video": video, "start": start,
                     "frames": len(frames), "device": info["device"], "date": info["date"]})
        print(" ".join(f"{k}={v}" for k, v in rows[-1].items() if k not in ("device", "date")), flush=True)
        del dm
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", nargs="+", default=["vtest.avi", "one-by-one-person-detection.mp4"])
    p.add_argument("--size", type=int, nargs=2, default=[1088, 1920], help="H W, multiples of 32")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 0.01, 0.02, 0.05])
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--start", type=int, default=200)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.size[0] % 32 or a.size[1] % 32:
        p.error(f"--size must be multiples of 32 (the detector's FPN adds maps of strides 4-32), got {a.size}")
    torch.backends.cudnn.benchmark = True
    info = run_info()
    rows = []
    for video in a.videos:
        rows += run(video, tuple(a.size), a.thresholds, a.frames, a.start, a.warmup, info)
    write_csv(a.out, rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
