"""Experiment: a non-linear layer's time in delta mode (the library's float32 accumulator) against
value mode (no accumulator; benchmarks/experiments/value_mode.py), on the activation shapes of
MobileNetV2 and ResNet-50 at 1080x1920, float16, batch 1 (value_activation.cu says what each
kernel reads and writes). Per model, active-pixel fraction and send case (none or all of the active
pixels sent): the sum over the model's activation layers of one launch each, CUDA events around the
whole model's launches, median of --reps after --warmup. Kept as it ran. Build the kernels on the
CPU machine, then on the GPU machine:
    nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -cudart shared \\
        benchmarks/experiments/value_activation.cu -o value_activation.so
    python benchmarks/experiments/value_activation.py value_activation.so"""
import argparse
import ctypes
import statistics

import torch

# (channels, stride against the frame) of every activation; ResNet-50's add + ReLU counted as one
MOBILENET_V2 = ([(32, 2), (32, 2), (96, 2), (96, 4)] + [(144, 4)] * 3 + [(144, 8)] + [(192, 8)] * 5
                + [(192, 16)] + [(384, 16)] * 6 + [(576, 16)] * 7 + [(576, 32)] + [(960, 32)] * 6 + [(1280, 32)])
RESNET50 = ([(64, 2)] + [(64, 4), (64, 4), (256, 4)] * 3 + [(128, 4), (128, 8), (512, 8)]
            + [(128, 8), (128, 8), (512, 8)] * 3 + [(256, 8), (256, 16), (1024, 16)]
            + [(256, 16), (256, 16), (1024, 16)] * 5 + [(512, 16), (512, 32), (2048, 32)]
            + [(512, 32), (512, 32), (2048, 32)] * 2)
MODELS = {"mobilenet_v2": MOBILENET_V2, "resnet50": RESNET50}


def map_size(size: tuple[int, int], stride: int) -> tuple[int, int]:
    """The map of a stride-``stride`` layer of a ``size`` frame (each stride-2 step rounds up)."""
    h, w = size
    while stride > 1:
        h, w, stride = (h + 1) // 2, (w + 1) // 2, stride // 2
    return h, w


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("library", nargs="?", default="value_activation.so")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--size", type=int, nargs=2, default=(1080, 1920))
    p.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    lib = ctypes.CDLL(a.library)
    lib.launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_int]
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {a.size[0]}x{a.size[1]}, float16")
    print("model          active  sent   delta_ms  value_ms  value/delta")
    for model in a.models:
        layers = []
        for c, s in MODELS[model]:
            h, w = map_size(tuple(a.size), s)
            layers.append(dict(C=c, P=h * w, x=(torch.randn(h * w, c, generator=gen) * 2).to(dev, torch.float16),
                               acc=torch.randn(h * w, c, generator=gen).to(dev), sent=torch.zeros(h * w, c, device=dev,
                               dtype=torch.float16), out=torch.empty(h * w, c, device=dev, dtype=torch.float16)))
        for frac in a.fractions:
            for L in layers:
                n = max(1, round(frac * L["P"]))
                L["rows"] = torch.randperm(L["P"], generator=gen)[:n].sort().values.to(dev, torch.int32)
            for send in (0, 1):
                ms = {}
                for value in (0, 1):
                    def frame():
                        for L in layers:
                            rc = lib.launch(value, L["rows"].data_ptr(), L["rows"].numel(), L["C"], L["x"].data_ptr(),
                                            L["acc"].data_ptr(), L["sent"].data_ptr(), L["out"].data_ptr(), 0.0, send)
                            assert rc == 0, rc
                    times = []
                    for i in range(a.warmup + a.reps):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        torch.cuda._sleep(20_000_000)  # the GPU waits while the host queues the launches
                        start.record()
                        frame()
                        end.record()
                        end.synchronize()
                        if i >= a.warmup:
                            times.append(start.elapsed_time(end))
                    ms[value] = statistics.median(times)
                print(f"{model:14s} {frac:5.2f}  {'all' if send else 'none':5s}  {ms[0]:8.3f}  {ms[1]:8.3f}  "
                      f"{ms[1] / ms[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
