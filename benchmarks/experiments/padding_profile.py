"""GPU time per kernel of the converted depth network of ``padding_ab.py`` (its default layout:
``ReflectionPad2d`` + 3x3 convolution blocks), float16, t=0.02, eager, 8 delta frames under
torch.profiler after 4 frames, vtest and one-by-one frames 200-211 at 1088x1920:

    PYTHONPATH=. python benchmarks/experiments/padding_profile.py

Prints the GPU time per frame and the 14 largest kernels (``benchmarks/results/padding_ab.txt``).
"""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import padding_ab  # noqa: E402


def main() -> None:
    import deltaconv
    from deltaconv.video import find_sample_video, read_frames
    from torch.profiler import ProfilerActivity, profile
    for video in ["vtest.avi", "one-by-one-person-detection.mp4"]:
        cpu = list(read_frames(find_sample_video(video), start=200, max_frames=12, size=(1088, 1920)))
        model = padding_ab.build(cpu, False).half().to(memory_format=torch.channels_last)
        frames = [f.cuda().half() for f in cpu]
        with torch.no_grad():
            dm = deltaconv.convert(model, backend="cuda", example_input=frames[0], check_finite=False, threshold=0.02)
            for f in frames[:4]:
                dm(f)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for f in frames[4:12]:
                    dm(f)
                torch.cuda.synchronize()
        per_frame = collections.Counter()
        for e in prof.key_averages():
            if e.device_type.name == "CUDA":
                per_frame[e.key[:60]] += e.self_device_time_total / 8
        total = sum(per_frame.values())
        print(f"== {video} busy {total / 1000:.3f} ms per frame")
        for name, us in per_frame.most_common(14):
            print(f"  {name:60s} {us:8.1f} us {100 * us / total:5.1f}%")


if __name__ == "__main__":
    main()
