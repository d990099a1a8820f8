"""Per-call GPU time of conv_tile_mask_kernel (the tile mask pass of every non-1x1 convolution) in
deeplabv3_mobilenet_v3_large (deltaconv.zoo, fp16, channels_last) at 1080x1920 with nothing
changed (threshold 1e6), beside each convolution's geometry, from torch.profiler over two frames
after four (the second frame's calls are printed, in graph order). Kept as it ran for
benchmarks/results/fixed_cost.txt section 10. Run on a CUDA machine from the repository root:
    PYTHONPATH=. python benchmarks/experiments/tile_mask_calls.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

import deltaconv
from deltaconv import zoo
from deltaconv.fidelity import video_frames
from deltaconv.modules import DCConv2d

if not torch.cuda.is_available():
    raise SystemExit("no CUDA device: this script profiles the CUDA kernels")
model = zoo.load("deeplabv3_mobilenet_v3_large").model.cuda().half().to(memory_format=torch.channels_last)
xs = [f.cuda().half() for f in video_frames("vtest.avi", (1080, 1920), max_frames=6)]
dm = deltaconv.convert(model, threshold=1e6, backend="cuda", example_input=xs[0], check_finite=False)
convs = [(n, m) for n, m in dm.named_modules() if isinstance(m, DCConv2d) and tuple(m.kernel_size) != (1, 1)]
with torch.no_grad():
    for x in xs[:4]:
        dm(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dm(xs[4])
        dm(xs[5])
        torch.cuda.synchronize()
calls = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "conv_tile_mask" in e.name]
print(len(calls), "tile mask calls in 2 frames;", len(convs), "non-1x1 convolutions")
for i, e in enumerate(calls[len(calls) // 2:]):
    name, m = convs[i] if i < len(convs) else ("?", None)
    geometry = "" if m is None else f"k{tuple(m.kernel_size)} s{tuple(m.stride)} d{tuple(m.dilation)} g{m.groups}"
    print(f"{e.device_time:7.2f} us  {e.name[e.name.find('conv_tile_mask'):][:40]:40s} {name} {geometry}")
