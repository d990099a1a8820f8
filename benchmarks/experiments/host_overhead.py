"""The host's share of an eager delta frame (``cuda_graph=False``, the default): per model, the time
per frame with the GPU synchronised at the end of a run of frames (``eager_ms``), the host's time to
issue a frame (``host_ms``: the same loop without the synchronisation, once the GPU has caught up),
and, with ``--profile``, the Python functions that take the most host time (cProfile, sorted by own
time). A frame whose ``host_ms`` exceeds its GPU time is bound by the host.

float16, random weights (``zoo.load``), CUDA backend, t=0.02, one-by-one-person-detection.mp4 frames
200-239 at ``--size``, 10 warm-up frames. Run on a CUDA machine from the repository root::

    PYTHONPATH=. python benchmarks/experiments/host_overhead.py [--profile] [MODEL ...]

Used for the A/B in ``benchmarks/results/host_overhead.txt`` (two packages, alternated: run it once
with each on ``PYTHONPATH``).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def run(name: str, size: tuple, profile: bool) -> str:
    import deltaconv
    from deltaconv import zoo
    from deltaconv.video import find_sample_video, read_frames

    model = zoo.load(name).model.cuda().half().to(memory_format=torch.channels_last)
    video = find_sample_video("one-by-one-person-detection.mp4")
    frames = [f.cuda().half() for f in read_frames(video, max_frames=40, size=size, start=200)]
    dm = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], check_finite=False)
    with torch.inference_mode():
        for f in frames[:10]:
            dm(f)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for f in frames[10:]:
            dm(f)
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t) / len(frames[10:])
        t = time.perf_counter()
        for f in frames[10:]:
            dm(f)
        host = (time.perf_counter() - t) / len(frames[10:])
        torch.cuda.synchronize()
        line = f"{name:32s} eager_ms {1e3 * eager:7.3f}  host_ms {1e3 * host:7.3f}"
        if profile:
            pr = cProfile.Profile()
            pr.enable()
            for f in frames[10:]:
                dm(f)
            torch.cuda.synchronize()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
            line += "\n" + "\n".join(l[:150] for l in s.getvalue().splitlines() if l.strip())
    return line


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["mobilenet_v2", "resnet50", "efficientnet_b0"])
    p.add_argument("--size", default="1080x1920", help="HxW (default 1080x1920)")
    p.add_argument("--profile", action="store_true", help="also list the top Python functions by own time")
    args = p.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    import deltaconv
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, deltaconv from {deltaconv.__file__}",
          flush=True)
    for name in args.models:
        print(run(name, size, args.profile), flush=True)


if __name__ == "__main__":
    main()
