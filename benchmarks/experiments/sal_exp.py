# The script behind benchmarks/results/density_experiments.txt, committed as it ran (2026-11-21, CPU):
# an experiment, not a maintained tool (it patches DCActivation.forward). Run from the repository root.
"""Experiment: input-saliency-weighted sparsifier (CPU, reference backend); layers exact."""
import sys, time, argparse
import torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, '.')
import deltaconv
from deltaconv.fidelity import compare, video_frames
from deltaconv.weights import mobilenet_v2_imagenet

p = argparse.ArgumentParser()
p.add_argument('--video', default='vtest.avi')
p.add_argument('--size', type=int, nargs=2, default=(540, 960))
p.add_argument('--start', type=int, default=200)
p.add_argument('--frames', type=int, default=12)
p.add_argument('--mode', default='plain')
p.add_argument('--ts', type=float, nargs='+', default=[0.02])
p.add_argument('--blur', type=int, default=15)
p.add_argument('--proj', type=int, default=8)
p.add_argument('--layer-t', type=float, default=0.0)
a = p.parse_args()
torch.set_num_threads(2)
model = mobilenet_v2_imagenet().eval()
frames = list(video_frames(a.video, tuple(a.size), a.frames, a.start))

class Sal(nn.Module):
    def __init__(self, w): super().__init__(); self.register_buffer('w', w)
    def forward(self, change): return change.float().abs().amax(dim=1, keepdim=True) * self.w

det = None
if a.mode != 'plain':
    cal = list(video_frames(a.video, tuple(a.size), 3, max(0, a.start - 100))) if a.mode == 'sal' else frames[:1]
    g = torch.Generator().manual_seed(0); acc = 0
    for x in cal:
        for r in range(a.proj):
            xx = x.clone().requires_grad_(True)
            y = model(xx); (y * torch.randn(y.shape, generator=g)).sum().backward()
            acc = acc + xx.grad.square().sum(1, keepdim=True)
    s = acc.sqrt()
    s = F.avg_pool2d(s, a.blur, 1, a.blur // 2, count_include_pad=False)
    s = s / s.mean()
    print('saliency quantiles', [round(float(q), 2) for q in torch.quantile(s.flatten(), torch.tensor([.1, .5, .9, .99]))])
    det = Sal(s)
for t in a.ts:
    dm = deltaconv.convert(model, threshold=a.layer_t, truncation='rms', backend='reference', example_input=frames[0],
                           change_detector=det)
    sp = dm.delta_layers()[0].layer_name
    dm.load_thresholds({sp: t})
    t1 = time.time()
    rep = compare(model, dm, frames)
    inp = [s for s in rep.layers if s['name'] == sp][0]['mean_density']
    print(f'{a.video} {a.mode} t_in={t:g} layers={a.layer_t:g}: density {rep.density:.3f} input {inp:.3f} err mean {rep.mean("rel_err"):.4f} '
          f'p95 {rep.quantile("rel_err", 0.95):.4f} ({time.time()-t1:.0f}s)', flush=True)
