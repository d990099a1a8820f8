"""The 3x3 tensor-core conv's fine launch in thread-block clusters of 1, 2 or 4 CTAs
(DELTACONV_TC_KSPLIT: the most CTAs that split a tile's K; the kernel picks 4, 2 or 1 by the tile
count), same process, alternated: (1) n listed tiles (random 8x8 tiles,
the fine launch forced: DELTACONV_TC_FINE_MAX = n), (2) the kernel sweep's clustered-blob cells
at 0 % / 1 % / 2 % / 5 % changed with the default launches, with cuDNN's graph-replay time beside them.
CUDA-graph replay, us (min of 2 medians of 60), fp16, batch 1, channels_last.
Usage: PYTHONPATH=. python benchmarks/experiments/fine_ksplit_ab.py [--splits 1 2 4] [--rounds 2]"""
import argparse
import os
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import capture_graph, clustered_mask, time_cuda  # noqa: E402
from deltaconv.modules.linear import kernel_weight_layout  # noqa: E402
import deltaconv.backends.cuda  # noqa: E402,F401

COUNTS = [4, 16, 33, 50, 66, 100, 132]
TILE_CONFIGS = [(128, (540, 960)), (256, (270, 480)), (512, (68, 120)), (192, (270, 480))]
SWEEP_CONFIGS = [(64, (1080, 1920)), (128, (540, 960)), (256, (270, 480))]


def timed(f, split):
    os.environ["DELTACONV_TC_KSPLIT"] = split
    gr = capture_graph(f)[0]
    return min(time_cuda(gr, iters=60) for _ in range(2)) * 1000


def conv_fn(c, h, w, mask):
    x = torch.randn(1, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) * (1.0 / (c * 9)) ** 0.5
    wdc = wt.contiguous(memory_format=kernel_weight_layout(wt, 1))
    delta = (x * mask).contiguous(memory_format=torch.channels_last)
    return (lambda: torch.ops.deltaconv.conv2d(delta, mask, wdc, None, [1, 1], [1, 1], [1, 1], 1, None)), x, wt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", nargs="+", default=["1", "2", "4"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    print("## 1. fine launch at n tiles (us per call; columns: DELTACONV_TC_KSPLIT, rounds alternated)")
    for c, (h, w) in TILE_CONFIGS:
        th, tw = (h + 7) // 8, (w + 7) // 8
        g = torch.Generator().manual_seed(0)
        perm = torch.randperm(th * tw, generator=g)
        for n in COUNTS:
            mask = torch.zeros(1, 1, h, w, dtype=torch.bool)
            for k in perm[:n].tolist():
                i, j = divmod(k, tw)
                mask[0, 0, i * 8 + 1:i * 8 + 7, j * 8 + 1:j * 8 + 7] = True  # halo inside the tile
            mask = mask.cuda()
            f = conv_fn(c, h, w, mask)[0]
            os.environ["DELTACONV_TC_FINE_MAX"] = str(n)
            res = {s: [] for s in args.splits}
            for _ in range(args.rounds):
                for s in args.splits:
                    res[s].append(timed(f, s))
            os.environ.pop("DELTACONV_TC_FINE_MAX")
            print(f"C={c} {h}x{w} tiles={n}: " + "  ".join(f"k{s} " + " ".join(f"{v:.1f}" for v in res[s])
                                                          for s in args.splits), flush=True)
    print("## 2. kernel-sweep cells (clustered 24-pixel blobs, default launches; us; cuDNN graph replay)")
    for c, (h, w) in SWEEP_CONFIGS:
        for frac in (0.0, 0.01, 0.02, 0.05):
            mask = clustered_mask(1, h, w, frac)
            f, x, wt = conv_fn(c, h, w, mask)
            dense = capture_graph(lambda: F.conv2d(x, wt, None, 1, 1))[0]
            cud = min(time_cuda(dense, iters=60) for _ in range(2)) * 1000
            res = {s: [] for s in args.splits}
            for _ in range(args.rounds):
                for s in args.splits:
                    res[s].append(timed(f, s))
            print(f"C={c} {h}x{w} f={frac}: cuDNN {cud:.1f}  " + "  ".join(
                f"k{s} " + " ".join(f"{v:.1f} ({cud / v:.2f}x)" for v in res[s]) for s in args.splits), flush=True)
    os.environ.pop("DELTACONV_TC_KSPLIT", None)


if __name__ == "__main__":
    main()
