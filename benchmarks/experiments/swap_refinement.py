# An experiment, not a maintained tool. Run from the repository root:
#   PYTHONPATH=. python benchmarks/experiments/swap_refinement.py --help
"""Experiment: does a refinement that also lowers thresholds get further than calibrate's raises?

calibrate()'s refinement only raises thresholds and stops when no single raise fits the tolerance
(from a coarse calibration, ``start=`` with ``step=1`` stops after a few raises: density_experiments.txt
sections 11-12). Here, when no raise fits, each layer is also probed one step *down*, and pairs (one
raise, one lowering) are ranked by their predicted effect (the two probes' changes added); the best
few are run, and the first within the tolerance with a lower density is taken. Compared with
``calibrate(start=fine, step=1)`` at the same extra budget of runs, both from where
``calibrate(start=coarse, step=1)`` stopped (``coarse``: ``calibrate(step=2)``), on the calibration
clips and on held-out frames. MobileNetV2 (ImageNet
weights), reference backend, float32, this CPU by default.
"""
import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
import deltaconv  # noqa: E402
from deltaconv.calibrate import Evaluator, calibrate  # noqa: E402
from deltaconv.fidelity import compare, video_frames  # noqa: E402
from deltaconv.weights import mobilenet_v2_imagenet  # noqa: E402


def swap_refine(ev: Evaluator, start: dict, limit: float, budget: int, pairs: int = 3, log=print):
    """``(thresholds, error, density, runs)``: one raise per round of probes (step 1, the best ratio
    of those within ``limit``), and where none fits, a raise paired with a lowering (see the module
    docstring); ``start`` gives each layer's base."""
    names = list(start)
    k = {n: 0 for n in names}

    def th(kk):
        return {n: start[n] * 2.0 ** (kk[n] / 2.0) for n in names}

    err, dens = ev(th(k), None)
    used = 1
    while used < budget:
        up = {}
        for n in names:
            if start[n] <= 0 or used >= budget:
                continue
            kk = dict(k, **{n: k[n] + 1})
            up[n] = ev(th(kk), None)
            used += 1
        fits = sorted(((dens - d) / max(e - err, 1e-5), n) for n, (e, d) in up.items() if e <= limit and d < dens)
        if fits:
            n = fits[-1][1]
            k[n] += 1
            err, dens = up[n]
            log(f"  raise {n}: err {err:.4f} density {dens:.4f} ({used} runs)")
            continue
        down = {}
        for n in names:
            if start[n] <= 0 or used >= budget:
                continue
            kk = dict(k, **{n: k[n] - 1})
            down[n] = ev(th(kk), None)
            used += 1
        cands = []
        for i, (ei, di) in up.items():
            for j, (ej, dj) in down.items():
                if i != j and di < dens:
                    pe, pd = ei + ej - err, di + dj - dens
                    if pe <= limit and pd < dens:
                        cands.append((pd, i, j))
        cands.sort()
        taken = False
        for _, i, j in cands[:pairs]:
            if used >= budget:
                break
            kk = dict(k, **{i: k[i] + 1, j: k[j] - 1})
            e, d = ev(th(kk), None)
            used += 1
            if e <= limit and d < dens:
                k, err, dens, taken = kk, e, d, True
                log(f"  swap +{i} -{j}: err {err:.4f} density {dens:.4f} ({used} runs)")
                break
        if not taken:
            break
    return th(k), err, dens, used


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--video", default="vtest.avi")
    p.add_argument("--size", type=int, nargs=2, default=(144, 256))
    p.add_argument("--clip-frames", type=int, default=16)
    p.add_argument("--held-out", type=int, default=100, help="held-out frames from frame 200")
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--coarse-evals", type=int, default=80)
    p.add_argument("--budget", type=int, default=200, help="runs of the refinement from the coarse calibration")
    p.add_argument("--extra", type=int, default=120, help="runs of each refinement after that")
    p.add_argument("--truncation", default="hybrid")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model = mobilenet_v2_imagenet().eval().to(a.device)
    frames = [f.to(a.device) for f in video_frames(a.video, tuple(a.size), 200 + a.held_out)]
    clips = [frames[0:a.clip_frames], frames[200 - a.clip_frames - 16:200 - 16]]
    held = frames[200:]
    kw = dict(truncation=a.truncation, change_detectors=None, progress=False)
    t0 = time.time()
    coarse = calibrate(model, clips, a.tolerance, max_evals=a.coarse_evals, **kw)
    print(f"coarse (step 2, {coarse.evals} runs, {time.time() - t0:.0f}s): clips err {coarse.error:.4f} "
          f"density {coarse.density:.4f}", flush=True)
    t0 = time.time()
    fine = calibrate(model, clips, a.tolerance, max_evals=a.budget, start=coarse, step=1, **kw)
    print(f"start=coarse, step 1 ({fine.evals} runs, {time.time() - t0:.0f}s): clips err {fine.error:.4f} "
          f"density {fine.density:.4f}", flush=True)
    # from there, the same extra budget: calibrate's raises again, or raises and swaps
    t0 = time.time()
    again = calibrate(model, clips, a.tolerance, max_evals=a.extra, start=fine, step=1, **kw)
    print(f"start=fine, step 1 ({again.evals} runs, {time.time() - t0:.0f}s): clips err {again.error:.4f} "
          f"density {again.density:.4f}", flush=True)
    ev = Evaluator(model, clips, truncation=a.truncation)
    t0 = time.time()
    swapped, err, dens, used = swap_refine(ev, dict(fine), a.tolerance, a.extra)
    print(f"swaps from fine ({used} runs, {time.time() - t0:.0f}s): clips err {err:.4f} density {dens:.4f}",
          flush=True)
    results = (("coarse", dict(coarse)), ("start=coarse", dict(fine)), ("start=fine", dict(again)),
               ("swaps", swapped))
    for name, th in results:
        dm = deltaconv.convert(model, thresholds=th, truncation=a.truncation, backend="reference",
                               example_input=held[0])
        rep = compare(model, dm, held)
        print(f"{a.video} {a.size[0]}x{a.size[1]} held out 200-{199 + a.held_out} {name}: density "
              f"{rep.density:.4f} err mean {rep.mean('rel_err'):.4f} p95 {rep.quantile('rel_err', 0.95):.4f}",
              flush=True)


if __name__ == "__main__":
    main()
