"""compute-sanitizer driver for the row-list ops (*How it works*, Row lists): activation,
add_activation, add and mul with ``rows=``, and conv1x1_rows against conv2d, on small maps (2x9x13),
fp32 / fp16 / bf16, 1-256 channels, changed fractions 0 / 0.3 / 1. Prints ``bad N``: the count of
lists whose length is not the sent pixels' count plus the conv1x1_rows outputs that differ from
conv2d's; the sanitizer reports memory and barrier errors. Run on a CUDA machine:

    compute-sanitizer --tool memcheck --error-exitcode 86 python benchmarks/experiments/sanitize_row_lists.py
    compute-sanitizer --tool synccheck --error-exitcode 86 python benchmarks/experiments/sanitize_row_lists.py
"""
import torch
import deltaconv._extension as _e

if not torch.cuda.is_available():
    raise SystemExit("no CUDA device: this driver runs the CUDA kernels")
if not _e.load():
    raise SystemExit("deltaconv's CUDA extension did not load (build it: python setup.py build_ext --inplace)")
from deltaconv.backends import cuda as dcc
from deltaconv.activations import Activation
from deltaconv.delta import RowList
CL = torch.channels_last
torch.manual_seed(0)
bad = 0
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for c in (1, 3, 17, 32, 64, 256):
        for frac in (0.0, 0.3, 1.0):
            for res in (False, True):
                n, h, w = 2, 9, 13
                m = torch.rand(n, 1, h, w, device="cuda") < frac
                d = (torch.randn(n, c, h, w, device="cuda") * 0.1).to(dtype).contiguous(memory_format=CL)
                acc = torch.zeros(n, c, h, w, device="cuda").contiguous(memory_format=CL)
                sent = torch.zeros(n, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=CL)
                rows = RowList(torch.empty(1 + 2 * n * h * w, dtype=torch.int32, device="cuda"),
                               torch.zeros(16, dtype=torch.int32, device="cuda"))
                if res:
                    out, mo, _ = dcc.add_activation(d, m, d, m, 1.0, acc, sent, Activation("relu"), 0.02, None, rows=rows)
                else:
                    out, mo = dcc.activation(d, m, acc, sent, Activation("relu"), 0.02, None, rows=rows)
                for op in ("add", "mul"):
                    r2 = RowList(torch.empty_like(rows.rows), torch.zeros(16, dtype=torch.int32, device="cuda"))
                    if op == "add":
                        _, m2 = dcc.add(d, m, d, m, 1.0, rows=r2)
                    else:
                        _, m2 = dcc.mul(d, m, acc.clone(), d, m, acc.clone(), sent.clone(), 0.02, None, rows=r2)
                    bad += int(r2.counters[0]) != int(m2.sum())
                k = int(rows.counters[0])
                bad += k != int(mo.sum())
                if c in (32, 256) and dtype != torch.float32 or c == 17:
                    wt = (torch.randn(48, c, 1, 1, device="cuda") / 8).to(dtype)
                    y = dcc.conv1x1_rows(out, mo, wt, None, rows)
                    y2, _ = dcc.conv2d(out, mo, wt, None, 1, 0, 1, 1, None)
                    sel = mo.expand_as(y)
                    bad += not torch.equal(y[sel], y2[sel])
torch.cuda.synchronize()
print("bad", bad)
raise SystemExit(1 if bad else 0)
