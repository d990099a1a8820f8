"""Per-launch activation_kernel times of converted mobilenet_v2 / resnet50 (fp16, 1080p, vtest,
t=0.02) with each layer's channels, size, active input pixels and an estimated achieved bandwidth.
Usage: PYTHONPATH=. python benchmarks/experiments/activation_layers.py <label> <outcsv>
(SMOKE=1: a CPU run at 72x128 with the reference backend, to check the plumbing; no timings)"""
import statistics, sys, csv, os
import torch
sys.path.insert(0, "benchmarks")
import deltaconv
from deltaconv import zoo
from deltaconv.video import read_frames
from torch.profiler import ProfilerActivity, profile

label, out = sys.argv[1], sys.argv[2]
SMOKE = os.environ.get("SMOKE") == "1"
frames = list(read_frames(None, max_frames=14, size=(72, 128) if SMOKE else (1080, 1920), start=200))
dev = "cpu" if SMOKE else "cuda"
rows = []
for name in ("mobilenet_v2", "resnet50"):
    dt = torch.float32 if SMOKE else torch.half
    model = zoo.load(name).model.to(dev).to(dt).to(memory_format=torch.channels_last)
    xs = [f.to(dev).to(dt) for f in frames]
    dm = deltaconv.convert(model, threshold=0.02, backend="reference" if SMOKE else "cuda", example_input=xs[0], check_finite=False)
    layers = dm.delta_layers()
    # input masks of activation layers: count active pixels with hooks in a stats pass
    act = [l for l in layers if l.kind == "activation"]
    act_in = {id(l): [] for l in act}
    hs = [l.register_forward_pre_hook(lambda m, a: act_in[id(m)].append(a[0].mask.float().mean())) for l in act]
    with torch.no_grad():
        for x in xs[:6]:
            dm(x)
    for v in act_in.values():
        v.clear()
    dm.reset_stats()
    with torch.no_grad():
        with profile(activities=[ProfilerActivity.CPU if SMOKE else ProfilerActivity.CUDA]) as prof:
            for x in xs[6:]:
                dm(x)
            if not SMOKE: torch.cuda.synchronize()
    for h in hs:
        h.remove()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "activation_kernel" in e.name]
    n = len(act)
    if SMOKE:
        evs = [type("E", (), {"device_time": 1.0})()] * (n * 8)
    nf = len(evs) // n
    st = {s["name"]: s for s in dm.stats()}
    for i, l in enumerate(act):
        us = statistics.median(evs[f * n + i].device_time for f in range(nf))
        s = st[l.layer_name]
        C = s["elements_dense"]  # elements per frame
        din = statistics.mean(float(v) for v in act_in[id(l)])
        dout = s["mean_density"]
        el = s["elements_dense"]
        byts = el * (din * 12 + dout * 4)  # fp16 delta, fp32 acc rw, fp16 sent r, (+ out, sent w)
        rows.append(dict(label=label, model=name, layer=l.layer_name, elements=el, din=round(din, 3),
                         dout=round(dout, 3), us=round(us, 2), gbps=round(byts / us / 1e3, 1)))
    tot = sum(r["us"] for r in rows if r["model"] == name)
    print(f"{label} {name}: activation sum {tot:.1f} us over {n} layers, {nf} frames", flush=True)
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader(); w.writerows(rows)
