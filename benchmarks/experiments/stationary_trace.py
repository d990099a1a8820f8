"""Timeline of the weight-stationary 3x3 kernel's warpgroups (stationary_ab.txt section 13), kept as
it ran (2026-11-22). Needs a scratch build with stationary_trace.patch applied (against the kernel of
commit 57a8ee2): warpgroup leader threads write %globaltimer and clock64() at kernel start (event 0),
weights ready (1), each stage's start and wgmma end (2 + 2 s, 3 + 2 s) and exit (39) into the unused
end of the output (inactive tiles are never written: the mask's last 24 rows are cleared).

Usage: PYTHONPATH=. python benchmarks/experiments/stationary_trace.py run trace.json   (CUDA, patched build)
       python benchmarks/experiments/stationary_trace.py show trace.json               (anywhere)
"""
import collections
import json
import statistics as st
import sys

# config -> (channel blocks, warpgroups per block, the most blocks along x)
GRIDS = {"256x270x480": (8, 3, 16), "128x540x960": (2, 3, 66), "64x1080x1920": (1, 4, 132)}
CASES = [("256x270x480", 0.01), ("256x270x480", 0.05), ("128x540x960", 0.01), ("128x540x960", 0.05),
         ("64x1080x1920", 0.01), ("64x1080x1920", 0.05), ("128x540x960", 1.0)]


def run(path):
    sys.path.insert(0, "benchmarks")
    import torch
    from torch.profiler import ProfilerActivity, profile
    from common import clustered_mask
    from deltaconv.modules.linear import kernel_weight_layout
    import deltaconv.backends.cuda  # noqa: F401

    res = {}
    for cfg, frac in CASES:
        c, h, w = (int(v) for v in cfg.split("x"))
        x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
        wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
        mask = clustered_mask(1, h, w, frac)
        mask[:, :, -24:, :] = False
        delta = (x * mask).contiguous(memory_format=torch.channels_last)

        def conv():
            return torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [1, 1], [1, 1], 1, None)
        for _ in range(5):
            conv()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                conv()
            torch.cuda.synchronize()
        kt = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                kt.setdefault(e.name.split("(")[0].split("<")[0][-40:], []).append(e.device_time)
        y = conv()[0]
        torch.cuda.synchronize()
        flat = y.permute(0, 2, 3, 1).contiguous().view(-1).view(torch.int64)
        res[f"{cfg} {frac}"] = {"trace": flat[-140 * 8 * 4 * 80:].cpu().tolist(),
                                "kernels": {k: sorted(v) for k, v in kt.items()}}
    json.dump(res, open(path, "w"))


def grid_x(tr, gy, wgs, gxmax):
    """The launch's blocks along x: the largest grid whose warpgroups' start stamps (each warpgroup's
    80 slots, the grid's slots at the end of the trace) all fall within 2 ms of one another."""
    for gx in range(gxmax, 0, -1):
        base = len(tr) - gx * gy * 320
        starts = [tr[base + ((by * gx + bx) * 4 + wg) * 80]
                  for by in range(gy) for bx in range(gx) for wg in range(wgs)]
        if max(starts) - min(starts) < 2e6:
            return gx
    raise ValueError("no grid fits the trace")


def show(path):
    for name, v in json.load(open(path)).items():
        tr, n = v["trace"], len(v["trace"])
        gy, wgs, gxmax = GRIDS[name.split()[0]]
        gx = grid_x(tr, gy, wgs, gxmax)
        base = n - gx * gy * 320
        rows = {}
        for by in range(gy):
            for bx in range(gx):
                for wg in range(wgs):
                    o = base + ((by * gx + bx) * 4 + wg) * 80
                    ev = [(tr[o + 2 * k], tr[o + 2 * k + 1]) for k in range(40)]
                    rows[bx, by, wg] = {k: e for k, e in enumerate(ev) if 0 <= e[0] - ev[0][0] < 1e6}
        t0 = min(r[0][0] for r in rows.values())
        ready = [r[1][0] - t0 for r in rows.values() if 1 in r]
        ends = [max(e[0] for e in r.values()) - t0 for r in rows.values()]
        mma, gap = [], []
        for r in rows.values():
            s = 0
            while 2 + 2 * s in r and 3 + 2 * s in r:
                mma.append(r[3 + 2 * s][1] - r[2 + 2 * s][1])
                if 4 + 2 * s in r:
                    gap.append(r[4 + 2 * s][1] - r[3 + 2 * s][1])
                s += 1
        kern = [t for k, t in v["kernels"].items() if "stationary" in k][0]
        print(f"{name}: grid {gx}x{gy}, kernel {st.median(kern):.1f} us (profiler); weights ready at "
              f"{st.median(ready) / 1000:.2f} us (median), last {max(ready) / 1000:.2f}; warpgroups done "
              f"{st.median(ends) / 1000:.2f} / {max(ends) / 1000:.2f} us; per stage (clocks, median) wgmma "
              f"{st.median(mma):.0f}, to the next stage {st.median(gap) if gap else 0:.0f}")


if __name__ == "__main__":
    {"run": run, "show": show}[sys.argv[1]](sys.argv[2])
