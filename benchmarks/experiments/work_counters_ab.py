"""A/B of the per-frame work-list counters (deltaconv.modules.WorkCounters; DELTACONV_WORK_COUNTERS=1
against 0, where every convolution zeroes its own with a kernel): median ms per replayed frame (CUDA
events, 5 warm-up frames) of the CUDA-graphed DeltaModel on vtest.avi at 1080x1920 in fp16, at
threshold 0.02 and with no change (1e6), the two settings alternated twice per model in one process;
``equal_to_first``: outputs bit-equal to the first run's. Results: benchmarks/results/work_counters_ab.txt.
Usage: PYTHONPATH=. python benchmarks/experiments/work_counters_ab.py OUT.csv [models...]
(SMOKE=1: a CPU run at 72x128 on the reference backend, for checking the script.)"""
import csv
import os
import sys

import torch
sys.path.insert(0, "benchmarks")
from common import time_frames, graphed_model
from video_sweep import build, main_out
import deltaconv
from deltaconv.video import read_frames

out = sys.argv[1]
models = sys.argv[2:] or ["mobilenet_v2", "resnet50", "deeplabv3_mobilenet_v3_large"]
SMOKE = os.environ.get("SMOKE") == "1"
size = (72, 128) if SMOKE else (1080, 1920)
dev, dt = ("cpu", torch.float32) if SMOKE else ("cuda", torch.half)
frames_cpu = list(read_frames(None, max_frames=8 if SMOKE else 24, size=size))
rows = []
for name in models:
    model = build(name, frames_cpu[:4], device=dev).to(dev).to(dt).to(memory_format=torch.channels_last)
    frames = [f.to(dev).to(dt) for f in frames_cpu]
    if not SMOKE:
        dense_ms, _ = time_frames(graphed_model(model, frames[0]), frames, 5)
    for t in (0.02, 1e6):
        ref = None
        for rep in range(2):
            for mode in ("1", "0"):
                os.environ["DELTACONV_WORK_COUNTERS"] = mode
                dm = deltaconv.convert(model, threshold=t, backend="reference" if SMOKE else "cuda",
                                       example_input=frames[0], cuda_graph=not SMOKE, check_finite=False)
                with torch.no_grad():
                    ms, outs = (0.0, [dm(f) for f in frames]) if SMOKE else time_frames(dm, frames, 5)
                outs = [main_out(o) for o in outs]
                if ref is None:
                    ref = outs
                same = all(torch.equal(a, b) for a, b in zip(outs, ref))
                rows.append(dict(model=name, threshold=t, rep=rep, work_counters=mode, ms=round(ms, 4),
                                 dense_graph_ms=0 if SMOKE else round(dense_ms, 4), equal_to_first=same,
                                 taken=dm._context.work_counters.taken))
                print(rows[-1], flush=True)
                del dm
                if not SMOKE:
                    torch.cuda.empty_cache()
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader(); w.writerows(rows)
