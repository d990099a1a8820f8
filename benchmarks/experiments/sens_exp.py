# The script behind benchmarks/results/density_experiments.txt, committed as it ran (2026-11-21, CPU):
# an experiment, not a maintained tool (it patches DCActivation.forward). Run from the repository root.
"""Experiment: channel-sensitivity-weighted truncation (CPU, reference backend)."""
import sys, time, argparse
import torch, torch.nn as nn
sys.path.insert(0, '.')
import deltaconv
from deltaconv.backends import reference as R
from deltaconv.modules.nonlinear import DCActivation
from deltaconv.fidelity import compare, video_frames
from deltaconv.weights import mobilenet_v2_imagenet

p = argparse.ArgumentParser()
p.add_argument('--video', default='vtest.avi')
p.add_argument('--size', type=int, nargs=2, default=(540, 960))
p.add_argument('--start', type=int, default=200)
p.add_argument('--frames', type=int, default=16)
p.add_argument('--mode', default='rms')  # rms | wrms | abs
p.add_argument('--ts', type=float, nargs='+', default=[0.004])
p.add_argument('--proj', type=int, default=8)
a = p.parse_args()
torch.set_num_threads(2)
model = mobilenet_v2_imagenet().eval()
frames = list(video_frames(a.video, tuple(a.size), a.frames, a.start))
# sensitivities from calibration frames (video frames 0..3 of the clip start, before start)
cal = list(video_frames(a.video, tuple(a.size), 3, max(0, a.start - 100)))
acts = {n: m for n, m in model.named_modules() if isinstance(m, nn.ReLU6)}
sq = {n: 0.0 for n in acts}; cnt = 0
outs = {}
hooks = [m.register_forward_hook(lambda mod, i, o, n=n: (o.retain_grad(), outs.__setitem__(n, o)) and None) for n, m in acts.items()]
g = torch.Generator().manual_seed(0)
t0 = time.time()
for x in cal:
    for r in range(a.proj):
        outs.clear()
        y = model(x)
        v = torch.randn(y.shape, generator=g)
        (y * v).sum().backward()
        for n, o in outs.items():
            sq[n] = sq[n] + o.grad.square().mean(dim=(0, 2, 3))
        cnt += 1
for h in hooks: h.remove()
sens = {n: (s / cnt).sqrt() for n, s in sq.items()}
ynorm = float(torch.stack([model(x).detach().norm() for x in cal]).mean())
print(f'sensitivities in {time.time()-t0:.0f}s; logit norm {ynorm:.1f}', flush=True)

orig = DCActivation.forward
def fwd(self, x):
    w = getattr(self, '_w', None)
    if w is None: return orig(self, x)
    acc = self.state('acc', x.shape, x.device, x.dtype)
    sent = self.state('sent', x.shape, x.device, x.dtype, sent=True)
    d, m = x.value, x.mask
    acc += R._zero_inactive(d, m).to(acc.dtype)
    y = self.fn(acc)
    target = R._target(y, sent)
    change = torch.where(m, target - sent.to(target.dtype), torch.zeros((), dtype=target.dtype))
    meas = (change * w.view(1, -1, 1, 1)).square().mean(dim=1, keepdim=True).sqrt()
    om = m & (meas > self.threshold)
    k = R._key_view(self.key, om.dim())
    if k is not None: om = om | (k & m)
    v = R._send(target, sent, change, om, d.dtype)
    from deltaconv.delta import Delta
    return self.observe(Delta(v, om))
DCActivation.forward = fwd

for t in a.ts:
    dm = deltaconv.convert(model, threshold=t, truncation='rms', backend='reference', example_input=frames[0])
    sp = dm.delta_layers()[0].layer_name
    dm.load_thresholds({sp: 0.01})
    n_w = 0
    for name, mod in dm.named_modules():
        if isinstance(mod, DCActivation):
            dn = mod.layer_name
            if a.mode != 'rms' and dn in sens:
                s = sens[dn]
                mod._w = s / s.square().mean().sqrt() if a.mode == 'wrms' else s * (s.numel() ** 0.5) / ynorm * 1e3
                n_w += 1
    t1 = time.time()
    rep = compare(model, dm, frames)
    print(f'{a.video} {a.mode} t={t:g} weighted={n_w}: density {rep.density:.3f} err mean {rep.mean("rel_err"):.4f} '
          f'p95 {rep.quantile("rel_err", 0.95):.4f} ({time.time()-t1:.0f}s)', flush=True)
