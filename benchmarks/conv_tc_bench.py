"""Tensor-core sparse conv: correctness spot checks + timings against dense cuDNN.

    PYTHONPATH=. python3 benchmarks/conv_tc_bench.py [--quick]

1. Correctness of every tensor-core configuration (3x3 stride 1/2, 1x1; coarse and fine launch
   forced through DELTACONV_TC_FINE_MAX; fp16/bf16; batch 2 with key streams) against
   deltaconv.backends.reference on the GPU (float32 math on the same rounded inputs); output
   memory is pre-poisoned with NaN so unwritten active outputs fail; masks compared exactly.
2. Timings (CUDA events, medians; CUDA-graph replay and eager): cuDNN (F.conv2d, channels_last,
   cudnn.benchmark) vs deltaconv.conv2d at clustered change fractions (24x24-pixel blobs).
3. A torch.profiler breakdown (mask pass vs compute vs weight relayout) for a few cases.

``--paths``: the two paths of the 3x3 conv, each forced for every tile through DELTACONV_TC_SPLIT
(0: tile kernel, 64: pixel rows), against the default per-tile split, on clustered and scattered
masks, with the fill of the active tiles (active output pixels / pixels of active tiles).
"""
from __future__ import annotations

import datetime
import math
import os
import sys

import torch
import torch.nn.functional as F

from deltaconv import _extension
from deltaconv.backends import reference as ref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tile_stats, time_cuda  # noqa: E402

QUICK = "--quick" in sys.argv
EXPERIMENT = "--experiment" in sys.argv  # A/B of the tuning knobs instead of the full table
PATHS = "--paths" in sys.argv  # 3x3 tile path vs pixel-row path
FRACS = [0.01, 0.05, 0.25, 1.0]
COARSE, FINE = "-1", str(1 << 30)


ENV_KEYS = ("DELTACONV_TC_FINE_MAX", "DELTACONV_TC", "DELTACONV_TC_PREFETCH1", "DELTACONV_TC_SPLIT",
            "DELTACONV_TC_SPLIT_MIN")


def set_mode(mode):
    """mode: None (auto), 'coarse', 'fine' (3x3 launch forced), 'tiles', 'pixels' (3x3 path forced),
    'old' (CUDA-core kernels), 'p2'/'p4' (prefetch depth of the gathered-rows kernel)."""
    for k in ENV_KEYS:
        os.environ.pop(k, None)
    if mode in ("tiles", "pixels"):
        os.environ["DELTACONV_TC_SPLIT"] = "0" if mode == "tiles" else "64"
        os.environ["DELTACONV_TC_SPLIT_MIN"] = "0"
    elif mode in ("p1", "p2", "p4", "p5"):
        os.environ["DELTACONV_TC_PREFETCH1"] = mode[1]
    elif mode == "coarse":
        os.environ["DELTACONV_TC_FINE_MAX"] = COARSE
    elif mode == "fine":
        os.environ["DELTACONV_TC_FINE_MAX"] = FINE
    elif mode == "old":
        os.environ["DELTACONV_TC"] = "0"


def blob_mask(N, H, W, f, gen=None, cell=24):
    m = (torch.rand(N, 1, H // cell + 1, W // cell + 1, generator=gen) < f)
    return m.repeat_interleave(cell, 2).repeat_interleave(cell, 3)[:, :, :H, :W].contiguous()


# ------------------------------------------------------------------------------ correctness
def check_case(cin, cout, k, s, p, H, W, dtype, mode, fracs=(0.05, 1.0), key=(True, False), seed=0):
    gen = torch.Generator().manual_seed(seed)
    N = len(fracs)
    mask = torch.cat([blob_mask(1, H, W, f, gen, cell=7) if f < 1 else torch.ones(1, 1, H, W, dtype=torch.bool)
                      for f in fracs])
    d = torch.randn(N, cin, H, W, generator=gen)
    d = torch.where(mask, d, torch.full((), float("nan")))
    d = d.to(dtype).cuda().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(cout, cin, k, k, generator=gen) / math.sqrt(cin * k * k)).to(dtype).cuda()
    b = torch.randn(cout, generator=gen).to(dtype).cuda()
    kt = torch.tensor(key[:N], dtype=torch.bool).cuda()
    mc = mask.cuda()
    r_out, r_mask = ref.conv2d(d.float(), mc, w.float(), b.float(), (s, s), (p, p), (1, 1), 1, kt)
    set_mode(mode)
    poison = torch.full((r_out.numel() * 2,), float("nan"), dtype=dtype, device="cuda")
    del poison  # the op's output likely reuses this NaN-filled block
    out, mo = torch.ops.deltaconv.conv2d(d, mc, w, b, [s, s], [p, p], [1, 1], 1, kt)
    torch.cuda.synchronize()
    set_mode(None)
    ok_mask = torch.equal(mo, r_mask)
    act = r_mask.expand_as(r_out)
    got, exp = out.float()[act], r_out[act]
    scale = max(float(exp.abs().max()), 1e-3) if exp.numel() else 1.0
    err = float((got - exp).abs().max() / scale) if exp.numel() else 0.0
    nan = bool(torch.isnan(got).any())
    tol = 8e-3 if dtype == torch.float16 else 3e-2
    ok = ok_mask and not nan and err < tol and out.is_contiguous(memory_format=torch.channels_last)
    return ok, err, ok_mask, nan


def correctness():
    cases = [
        # cin, cout, k, s, p, H, W
        (64, 64, 3, 1, 1, 37, 53),
        (128, 128, 3, 1, 1, 29, 45),
        (256, 256, 3, 1, 1, 21, 30),
        (96, 96, 3, 1, 1, 19, 27),
        (40, 24, 3, 1, 1, 17, 23),
        (64, 136, 3, 1, 0, 23, 31),
        (64, 128, 3, 2, 1, 37, 53),
        (128, 64, 3, 2, 1, 30, 41),
        (32, 48, 3, 2, 0, 33, 37),
        (64, 64, 1, 1, 0, 37, 53),
        (256, 128, 1, 1, 0, 21, 30),
        (64, 96, 1, 2, 0, 37, 53),
        (24, 40, 1, 1, 1, 17, 23),
        (200, 72, 1, 1, 0, 19, 21),
    ]
    bad = 0
    lines = []
    for dtype in (torch.float16, torch.bfloat16):
        for c in cases:
            modes = [None, "coarse", "fine", "tiles", "pixels"] if c[2] == 3 else [None]
            for mode in modes:
                for fr, key in (((0.05, 1.0), (True, False)), ((0.2, 0.0), (False, False))):
                    ok, err, okm, nan = check_case(*c, dtype, mode, fr, key)
                    if not ok:
                        bad += 1
                    lines.append(f"  {'ok ' if ok else 'BAD'} {str(dtype)[6:]:8s} {c} mode={mode} fr={fr} "
                                 f"err={err:.2e} mask={okm} nan={nan}")
    print("\n".join(l for l in lines if "BAD" in l) or "  (all ok)")
    print(f"correctness: {len(lines) - bad}/{len(lines)} ok")
    return bad == 0


# ------------------------------------------------------------------------------ timing
def _median_events(run, reps=7):
    return time_cuda(run, warmup=0, iters=reps)


def time_eager(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def run():
        for _ in range(iters):
            fn()
    return _median_events(run) / iters


def time_graph(fn, iters=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t = _median_events(g.replay) / iters
    del g
    return t


def active_tiles(mask, k, s, p):
    """(active output pixel fraction, active tile fraction) of a k x k, stride s conv's output."""
    m = mask.float()
    om = F.max_pool2d(m, k, s, p) > 0 if k > 1 else m[:, :, ::s, ::s] > 0
    pix, tiles, _ = tile_stats(om)
    return pix, tiles


def scattered_mask(N, H, W, f, gen):
    """Each pixel active with probability f (noise-like changes)."""
    return torch.rand(N, 1, H, W, generator=gen) < f


def bench_conv(rows, cin, cout, k, s, H, W, dtype, fracs, modes, groups=1, tag="3x3", scattered=False):
    p = k // 2
    dev = "cuda"
    w = (torch.randn(cout, cin // groups, k, k, device=dev) / math.sqrt(cin // groups * k * k)).to(dtype)
    xd = torch.randn(1, cin, H, W, device=dev).to(dtype).contiguous(memory_format=torch.channels_last)
    wcl = w.contiguous(memory_format=torch.channels_last)
    t_cudnn_g = time_graph(lambda: F.conv2d(xd, wcl, None, s, p, 1, groups))
    t_cudnn_e = time_eager(lambda: F.conv2d(xd, wcl, None, s, p, 1, groups))
    flops = 2.0 * cout * (cin // groups) * k * k * (H // s) * (W // s)
    print(f"[{tag} C{cin}->{cout} {H}x{W} s{s} g{groups} {str(dtype)[6:]}] cuDNN graph {t_cudnn_g*1e3:.1f} us "
          f"({flops / t_cudnn_g / 1e9:.0f} TFLOP/s), eager {t_cudnn_e*1e3:.1f} us", flush=True)
    gen = torch.Generator().manual_seed(1)
    for f in fracs:
        mask = (scattered_mask if scattered else blob_mask)(1, H, W, f, gen).cuda()
        pix, tiles = active_tiles(mask, k, s, p)
        res = {}
        for mode in modes:
            set_mode(mode if mode not in ("eager", "auto") else None)
            fn = lambda: torch.ops.deltaconv.conv2d(xd, mask, w, None, [s, s], [p, p], [1, 1], groups, None)
            try:
                if mode == "eager":
                    res[mode] = time_eager(fn)
                else:
                    res[mode] = time_graph(fn)
            except Exception as e:  # noqa: BLE001
                print("   error", mode, e)
                res[mode] = float("nan")
            set_mode(None)
        auto = res[modes[0]]
        row = dict(tag=tag, cin=cin, cout=cout, H=H, W=W, s=s, dtype=str(dtype)[6:], frac=f, pix=pix, tiles=tiles,
                   cudnn=t_cudnn_g, main=auto, **{"t_" + m: v for m, v in res.items()})
        rows.append(row)
        extra = " ".join(f"{m}={res[m]*1e3:.1f}" for m in modes[1:])
        print(f"   f={f:<5} out-px {pix*100:5.1f}% tiles {tiles*100:5.1f}% fill {pix / max(tiles, 1e-9):.2f}  "
              f"{modes[0]} {auto*1e3:8.1f} us  "
              f"x{t_cudnn_g / auto:6.2f} vs cuDNN   ({extra})", flush=True)


def profile_case(cin, cout, k, H, W, f, dtype=torch.float16, mode=None):
    from torch.profiler import ProfilerActivity, profile
    p = k // 2
    w = (torch.randn(cout, cin, k, k, device="cuda") / math.sqrt(cin * k * k)).to(dtype)
    xd = torch.randn(1, cin, H, W, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    mask = blob_mask(1, H, W, f, torch.Generator().manual_seed(2)).cuda()
    set_mode(mode)
    fn = lambda: torch.ops.deltaconv.conv2d(xd, mask, w, None, [1, 1], [p, p], [1, 1], 1, None)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    set_mode(None)
    print(f"[profile k{k} C{cin}->{cout} {H}x{W} f={f} mode={mode}] per call:")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total <= 0:
            continue
        print(f"   {e.device_time_total / 10:8.1f} us  x{e.count // 10:<2} {e.key[:110]}")


def main():
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    assert _extension.load(), "deltaconv extension not built"
    props = torch.cuda.get_device_properties(0)
    print(f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, device {props.name}, {props.multi_processor_count} SMs, "
          f"torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}")
    ok = correctness()
    rows = []
    if EXPERIMENT:
        modes = ["auto", "coarse", "fine", "eager"]
        for cin, H, W in ((64, 1080, 1920), (128, 540, 960), (256, 270, 480)):
            bench_conv(rows, cin, cin, 3, 1, H, W, torch.float16, FRACS, modes)
        for cin, cout, H, W in ((64, 64, 1080, 1920), (128, 256, 540, 960)):
            bench_conv(rows, cin, cout, 1, 1, H, W, torch.float16, [0.05, 1.0], ["auto", "p2", "p4"], tag="1x1")
        bench_conv(rows, 64, 128, 3, 2, 1080, 1920, torch.float16, [0.05, 1.0], ["auto", "coarse", "fine"],
                   tag="3x3-s2")
    if PATHS:
        for cin, H, W in ((64, 1080, 1920), (256, 270, 480)):
            for scattered in (False, True):
                bench_conv(rows, cin, cin, 3, 1, H, W, torch.float16, [0.002, 0.01, 0.05, 0.25, 1.0],
                           ["auto", "tiles", "pixels"], tag="3x3-scattered" if scattered else "3x3-clustered",
                           scattered=scattered)
    modes = ["auto", "coarse", "fine", "eager"]
    for cin, H, W in ((64, 1080, 1920), (128, 540, 960), (256, 270, 480)):
        if EXPERIMENT or PATHS:
            break
        bench_conv(rows, cin, cin, 3, 1, H, W, torch.float16, FRACS, modes)
        if not QUICK:
            bench_conv(rows, cin, cin, 3, 1, H, W, torch.float16, [0.01, 1.0], ["old"], tag="3x3-old")
    if not QUICK and not EXPERIMENT and not PATHS:
        bench_conv(rows, 128, 128, 3, 1, 540, 960, torch.bfloat16, [0.05, 1.0], ["auto"], tag="3x3-bf16")
        bench_conv(rows, 64, 128, 3, 2, 1080, 1920, torch.float16, [0.05, 1.0], ["auto", "coarse", "fine"],
                   tag="3x3-s2")
        for cin, cout, H, W in ((64, 64, 1080, 1920), (128, 256, 540, 960), (256, 64, 270, 480)):
            bench_conv(rows, cin, cout, 1, 1, H, W, torch.float16, [0.01, 0.05, 1.0], ["auto", "eager"], tag="1x1")
        for c, H, W in ((96, 540, 960), (384, 135, 240)):
            bench_conv(rows, c, c, 3, 1, H, W, torch.float16, [0.01, 0.05, 1.0], ["auto"], groups=c, tag="dw3x3")
    print()
    if PATHS:
        print("correctness", "OK" if ok else "FAILED")
        return
    profile_case(64, 64, 3, 1080, 1920, 0.01)
    profile_case(64, 64, 3, 1080, 1920, 1.0)
    profile_case(256, 256, 3, 270, 480, 0.01)
    print("\nSUMMARY (graph replay, fp16 unless noted; speedup = cuDNN time / deltaconv time)")
    print(f"{'case':34s} {'frac':>5s} {'tiles%':>6s} {'cuDNN us':>9s} {'dc us':>9s} {'speedup':>8s}")
    for r in rows:
        name = f"{r['tag']} {r['cin']}->{r['cout']} {r['H']}x{r['W']} s{r['s']} {r['dtype']}"
        print(f"{name:34s} {r['frac']:5.2f} {r['tiles']*100:6.1f} {r['cudnn']*1e3:9.1f} {r['main']*1e3:9.1f} "
              f"{r['cudnn'] / r['main']:8.2f}")
    print("correctness", "OK" if ok else "FAILED")


if __name__ == "__main__":
    main()
