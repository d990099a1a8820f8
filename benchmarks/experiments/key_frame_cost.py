"""What a periodic key frame costs in a CUDA-graph deployment (``refresh_every``).

A converted model replays a CUDA graph for its delta frames; a key frame (the first, and in
float16 every 1,000th with ``refresh_every="auto"``) zeroes the state and runs eagerly. This times,
frame by frame, the host's wall time of the call (``perf_counter`` around it, synchronised) and the
GPU time between CUDA events, for replayed frames and for periodic key frames, with the dense model
replayed as a CUDA graph on the same frames for scale. MobileNetV2 with its ImageNet weights (the
thresholds file's model) and resnet50 (random weights, threshold 0.02), float16, 1080x1920, vtest::

    PYTHONPATH=. python benchmarks/experiments/key_frame_cost.py [--frames 120] [--every 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import RESULTS, graphed_model  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.video import find_sample_video, read_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402


def timed(fn, x):
    """(host wall ms, GPU ms between events) of one synchronised call."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    fn(x)
    end.record()
    end.synchronize()
    return (time.perf_counter() - t0) * 1e3, start.elapsed_time(end)


def run(name, model, frames, every, thresholds):
    dense = graphed_model(model, frames[0])
    kwargs = dict(thresholds=thresholds) if thresholds else dict(threshold=0.02)
    dm = deltaconv.convert(model, backend="cuda", cuda_graph=True, check_finite=False, refresh_every=every,
                           example_input=frames[0], **kwargs)
    rows = {"replay": [], "key": [], "dense": []}
    with torch.no_grad():
        for i, x in enumerate(frames):
            rows["dense"].append(timed(dense, x))
            wall, gpu = timed(dm, x)
            if i >= 2:  # frame 0 is the first key frame, frame 1 records the graph
                rows["key" if dm.frames_since_key == 1 else "replay"].append((wall, gpu))
    out = []
    for kind, xs in rows.items():
        walls, gpus = [w for w, _ in xs], [g for _, g in xs]
        out.append(f"{name:13s} {kind:7s} {len(xs):4d} frames: host wall median {statistics.median(walls):7.3f} ms "
                   f"(max {max(walls):7.3f}), GPU median {statistics.median(gpus):7.3f} ms (max {max(gpus):7.3f})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--every", type=int, default=20, help="refresh_every: a key frame every this many frames")
    p.add_argument("--size", nargs=2, type=int, default=[1080, 1920])
    p.add_argument("--thresholds", default=str(RESULTS / "fidelity_thresholds_vtest_0.02_rms_float16.json"))
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    frames = [f.cuda().half().contiguous(memory_format=torch.channels_last)
              for f in read_frames(find_sample_video(), max_frames=a.frames, size=tuple(a.size), start=200)]
    lines = [f"# {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, float16, "
             f"{a.size[0]}x{a.size[1]}, vtest frames 200-{200 + a.frames - 1}, refresh_every={a.every}"]
    mobilenet = mobilenet_v2_imagenet().cuda().half().to(memory_format=torch.channels_last)
    lines += run("mobilenet_v2", mobilenet, frames, a.every, a.thresholds)
    torch.manual_seed(0)
    resnet = torchvision.models.resnet50(weights=None).eval().cuda().half().to(memory_format=torch.channels_last)
    lines += run("resnet50", resnet, frames, a.every, None)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
