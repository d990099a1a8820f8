"""Per-call GPU times of one converted frame: the kernels of one frame in launch order and their
sum per kernel family, for the four zoo models at 1080x1920 (fp16, channels_last, CUDA backend,
eager calls under torch.profiler, one frame after six) with nothing changed (threshold 1e6, vtest.avi)
and at t=0.02 (one-by-one's quiet start and vtest.avi). Kept as it ran for
benchmarks/results/fixed_cost.txt sections 12-13. Run on a CUDA machine from the repository root:
    PYTHONPATH=. python benchmarks/experiments/kernel_calls.py OUT.txt
"""
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import deltaconv
from deltaconv import zoo
from deltaconv.fidelity import video_frames

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import kernel_family  # noqa: E402


def run(model_name: str, video: str, threshold: float, out) -> None:
    model = zoo.load(model_name).model.cuda().half().to(memory_format=torch.channels_last)
    xs = [f.cuda().half() for f in video_frames(video, (1080, 1920), max_frames=8)]
    dm = deltaconv.convert(model, threshold=threshold, backend="cuda", example_input=xs[0], check_finite=False)
    with torch.no_grad():
        for x in xs[:6]:
            dm(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            dm(xs[6])
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = defaultdict(lambda: [0, 0.0])
    for e in events:
        per[kernel_family(e.name)][0] += 1
        per[kernel_family(e.name)][1] += e.device_time
    busy = sum(e.device_time for e in events)
    print(f"=== {model_name} {video} t={threshold}: {len(events)} kernels, busy {busy:.1f} us", file=out)
    for k, (calls, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:60s} {calls:4d} calls {us:8.1f} us  {us / calls:6.2f}/call", file=out)
    print("  -- calls in order (index, family, us)", file=out)
    for i, e in enumerate(events):
        print(f"  {i:4d} {kernel_family(e.name):60s} {e.device_time:7.2f}", file=out)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script profiles the CUDA kernels")
    with open(sys.argv[1], "w") as out:
        for name in ["mobilenet_v2", "resnet50", "fcn_resnet50", "deeplabv3_mobilenet_v3_large"]:
            run(name, "vtest.avi", 1e6, out)
            run(name, "one-by-one-person-detection.mp4", 0.02, out)
            run(name, "vtest.avi", 0.02, out)
            out.flush()
