"""Row lists: an activation (or an add, or a 1x1 convolution that itself runs on a list) lists its
output's active pixels for the 1x1 convolution after it (``lists_rows``,
``torch.ops.deltaconv.conv1x1_rows``), so that the convolution needs no mask pass of its own. The
conversion pass runs everywhere; the kernels need a CUDA GPU and the built extension (those tests
are skipped otherwise)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import deltaconv
from deltaconv.activations import Activation
from deltaconv.delta import RowList
from deltaconv.modules import DCAdd, DCConv2d, DCModule, DCMul
from helpers import cuda_backend_reason, cuda_kernel_names, main_output, torchvision_model, video_frames

REASON = cuda_backend_reason()
needs_gpu = pytest.mark.skipif(bool(REASON), reason=REASON or "ok")
CL = torch.channels_last


class Block(nn.Module):
    """relu -> 1x1 (linked), relu -> 3x3 (not: 3x3), a residual add fused into a relu -> 1x1 (linked)
    and a 1x1 of stride 2 on the same output (not: stride 2)."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.r1, self.r2, self.r3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.c1 = nn.Conv2d(c, c, 1)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.c3 = nn.Conv2d(c, 2 * c, 1)
        self.down = nn.Conv2d(c, 2 * c, 1, stride=2)

    def forward(self, x):
        x = self.r1(self.stem(x))
        y = self.c2(self.r2(self.c1(x)))
        y = self.r3(y + x)
        return self.c3(y).mean() + self.down(y).mean()


def linked(dm) -> tuple[set, set]:
    """(names of the layers that list rows, names of the convolutions that take them)."""
    listers = {n for n, m in dm.named_modules() if isinstance(m, DCModule) and m.lists_rows}
    convs = {n for n, m in dm.named_modules() if isinstance(m, DCConv2d) and m.takes_rows}
    return listers, convs


# ----------------------------------------------------------------------------- conversion
def test_convert_links_each_activation_to_the_1x1_convolution_after_it():
    dm = deltaconv.convert(Block().eval(), example_input=torch.randn(1, 3, 16, 16))
    acts, convs = linked(dm)
    assert acts == {"r1", "r3"} and convs == {"c1", "c3"}
    notes = {n.layer: n.note for n in dm.report.nodes if n.layer}
    assert "lists rows for c1" in notes["r1"] and "rows from r1" in notes["c1"]
    assert "lists rows for c3" in notes["r3"] and "fused with" in notes["r3"]
    off = deltaconv.convert(Block().eval(), example_input=torch.randn(1, 3, 16, 16), fuse=False)
    assert linked(off) == (set(), set())


def test_convert_links_adds_and_chains_of_1x1_convolutions():
    """An add not fused with an activation lists its active pixels, and a 1x1 convolution that runs
    on a list passes it on to the 1x1 convolution after it (mobilenet_v2's projections and
    expansions)."""
    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.r = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
            self.p1, self.p2, self.p3 = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            b = self.p1(self.r(self.stem(x)))
            return self.p3(self.p2(b) + b)

    model = Chain().eval()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 8, 8))
    listers, convs = linked(dm)
    adds = [n for n, m in dm.named_modules() if isinstance(m, DCAdd)]
    assert len(adds) == 1
    assert listers == {"r", "p1", adds[0]} and convs == {"p1", "p2", "p3"}
    with torch.no_grad():
        for x in (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)):
            torch.testing.assert_close(dm(x), model(x), rtol=1e-5, atol=1e-5)


def test_every_1x1_reader_of_a_layer_takes_its_list():
    """fcn_resnet50's first dilated blocks: the block's input feeds conv1 and the downsampling conv,
    both 1x1 of stride 1; a squeeze-excite product lists for the projection after it."""
    class Readers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.r = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
            self.a, self.b = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)
            self.pool, self.fc, self.gate, self.proj = nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1), nn.Sigmoid(), \
                nn.Conv2d(8, 4, 1)

        def forward(self, x):
            y = self.r(self.stem(x))
            z = self.a(y) + self.b(y)
            return self.proj(z * self.gate(self.fc(self.pool(z))))

    model = Readers().eval()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 8, 8))
    listers, convs = linked(dm)
    muls = [n for n, m in dm.named_modules() if isinstance(m, DCMul)]
    assert len(muls) == 1 and {"r", muls[0]} <= listers
    assert {"a", "b", "proj"} <= convs and "fc" not in convs  # fc reads the pooled map: not a DCActivation's
    with torch.no_grad():
        for x in (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)):
            torch.testing.assert_close(dm(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,on_lists,of", [("resnet50", 31, 36), ("mobilenet_v2", 34, 34), ("fcn_resnet50", 34, 37),
                                              ("deeplabv3_mobilenet_v3_large", 40, 50)])
def test_zoo_models_run_their_1x1_convolutions_on_lists(name, on_lists, of):
    """How many of each model's 1x1 convolutions convert() links to a row list (CPU: the conversion
    only). The rest read a max pooling, have stride 2, or read a pooled or broadcast map."""
    dm = deltaconv.convert(torchvision_model(name), example_input=torch.randn(1, 3, 64, 96))
    ones = [m for m in dm.modules() if isinstance(m, DCConv2d) and tuple(m.kernel_size) == (1, 1)]
    assert (sum(m.takes_rows for m in ones), len(ones)) == (on_lists, of)


def test_a_layer_called_at_two_sites_is_not_linked():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.relu, self.pw = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return self.pw(self.relu(self.conv(x))) + self.pw(self.relu(self.conv(x)))

    dm = deltaconv.convert(Shared().eval(), example_input=torch.randn(1, 3, 8, 8))
    assert linked(dm) == (set(), set())


def test_the_cuda_backend_takes_every_reference_argument_in_the_same_place():
    """The layers call either backend with the same positional arguments (``rows`` included): each
    reference function's parameters open the CUDA function of the same name, in order."""
    import inspect

    from deltaconv.backends import cuda as dcc
    from deltaconv.backends import reference as ref
    for name, fn in inspect.getmembers(ref, inspect.isfunction):
        if name.startswith("_") or fn.__module__ != ref.__name__ or not hasattr(dcc, name):
            continue
        want = list(inspect.signature(fn).parameters)
        got = list(inspect.signature(getattr(dcc, name)).parameters)
        assert got[:len(want)] == want, (name, want, got)
    for name in ("activation", "add_activation", "add"):
        assert "rows" in inspect.signature(getattr(ref, name)).parameters, name


def test_row_lists_switch_is_read_once_per_frame(monkeypatch):
    from deltaconv.modules import WorkCounters
    counters = WorkCounters()
    assert counters.row_lists
    monkeypatch.setenv("DELTACONV_ROW_LISTS", "0")
    assert counters.row_lists  # not before the next frame
    counters.begin_frame()
    assert not counters.row_lists
    monkeypatch.delenv("DELTACONV_ROW_LISTS")
    counters.begin_frame()
    assert counters.row_lists


def test_reference_backend_runs_linked_layers_as_before():
    """The reference backend has no row lists: a linked model gives the dense outputs (threshold 0)."""
    torch.manual_seed(0)
    model = Block().eval()
    dm = deltaconv.convert(model, example_input=torch.randn(1, 3, 16, 16), backend="reference")
    assert linked(dm)[0]
    for t in range(3):
        x = torch.randn(1, 3, 16, 16) if t != 1 else torch.zeros(1, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(dm(x), model(x), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- kernels
def _activation_case(dtype, c, frac, shape=(2, 13, 21), seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n, h, w = shape
    mask = torch.rand((n, 1, h, w), generator=g, device="cuda") < frac
    mask_b = torch.rand((n, 1, h, w), generator=g, device="cuda") < frac / 2

    def value(m):
        v = torch.randn((n, c, h, w), generator=g, device="cuda") * 0.1
        return torch.where(m, v, torch.full((), float("nan"), device="cuda")).to(dtype).contiguous(memory_format=CL)

    acc = (torch.randn((n, c, h, w), generator=g, device="cuda") * 0.1).contiguous(memory_format=CL)
    sent = torch.zeros((n, c, h, w), device="cuda", dtype=dtype).contiguous(memory_format=CL)
    return value(mask), mask, value(mask_b), mask_b, acc, sent


def _run(ops, case, op, rows):
    """op: "activation", "add_activation", "add" (the lists of the add: its active pixels), "mul",
    "mul_values" or "layer_norm"; "..._pooled": with the pooled measure (whose second kernel lists the rows)."""
    d, m, db, mb, acc, sent = case
    extra = {} if rows is None else {"rows": rows}
    if op.endswith("_pooled"):
        op, extra["measure"] = op[:-len("_pooled")], "pooled"
    if op == "add":
        return ops.add(d, m, db, mb, -0.5, **extra)
    if op == "mul":  # the product (squeeze-excite's scaling when broadcast), truncated like an activation
        return ops.mul(d, m, acc, db, mb, acc.clone(), sent, 0.02, None, **extra)
    if op == "mul_values":  # a product in value mode: the operands whole at every pixel
        return ops.mul_values(d.nan_to_num(0.25), m, db.nan_to_num(-0.5), mb, sent, 0.02, None, **extra)
    if op == "layer_norm":  # ConvNeXt's per-pixel layer norm, before its first pointwise linear
        return ops.layer_norm(d, m, acc, sent, None, None, 1e-6, 0.02, None, **extra)
    if op == "add_activation":
        out, mo, _ = ops.add_activation(d, m, db, mb, 1.0, acc, sent, Activation("relu"), 0.02, None, **extra)
    else:
        out, mo = ops.activation(d, m, acc, sent, Activation("relu"), 0.02, None, **extra)
    return out, mo


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("op", ["activation", "add_activation", "add", "mul", "mul_values", "layer_norm",
                                "activation_pooled", "add_activation_pooled"])
@pytest.mark.parametrize("frac", [0.0, 0.01, 0.3, 1.0])
@pytest.mark.parametrize("c", [1, 3, 17, 32, 64, 130, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layers_list_exactly_the_pixels_they_send(dtype, c, frac, op):
    from deltaconv.backends import cuda as dcc
    shape = (2, 13, 21) if c < 130 else (1, 9, 11)
    case = _activation_case(dtype, c, frac, shape)
    plain = [t.clone() for t in case]
    pixels = shape[0] * shape[1] * shape[2]
    rows = RowList(torch.full((1 + 2 * pixels,), -7, dtype=torch.int32, device="cuda"),
                   torch.zeros(16, dtype=torch.int32, device="cuda"))
    out, mo = _run(dcc, case, op, rows)
    out_p, mo_p = _run(dcc, plain, op, None)
    assert rows.filled
    # the same results as without the list: outputs at sent pixels, masks and both states
    assert torch.equal(mo, mo_p)
    sel = mo.expand_as(out)
    assert torch.equal(out[sel], out_p[sel])
    assert torch.equal(case[4], plain[4]) and torch.equal(case[5], plain[5])
    # the list: every sent pixel once, both halves equal, nothing written past the count
    n = int(rows.counters[0])
    sent_pixels = torch.nonzero(mo.reshape(-1)).reshape(-1).to(torch.int32)
    assert n == sent_pixels.numel()
    listed = rows.rows[1:1 + n]
    assert torch.equal(torch.sort(listed).values, sent_pixels)
    assert torch.equal(rows.rows[1 + pixels:1 + pixels + n], listed)
    assert bool((rows.rows[1 + n:1 + pixels] == -7).all()) and bool((rows.rows[1 + pixels + n:] == -7).all())
    assert bool((rows.counters[1:] == 0).all())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("frac", [0.01, 0.3])
def test_activation_lists_rows_on_large_frames(frac):
    """More pixels than the persistent grid's groups: the warps walk several batches."""
    from deltaconv.backends import cuda as dcc
    for c in (32, 256):  # 4 and 32 lanes per pixel (fp16)
        shape = (2, 600, 640) if c == 32 else (1, 300, 320)
        case = _activation_case(torch.float16, c, frac, shape, seed=3)
        pixels = shape[0] * shape[1] * shape[2]
        rows = RowList(torch.empty(1 + 2 * pixels, dtype=torch.int32, device="cuda"),
                       torch.zeros(16, dtype=torch.int32, device="cuda"))
        _, mo = _run(dcc, case, "activation", rows)
        n = int(rows.counters[0])
        assert n == int(mo.sum()) > 0
        assert torch.equal(torch.sort(rows.rows[1:1 + n]).values,
                           torch.nonzero(mo.reshape(-1)).reshape(-1).to(torch.int32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cin,cout,dtype,tf32", [(64, 128, torch.float16, False), (64, 64, torch.bfloat16, False),
                                                 (256, 512, torch.float16, False), (24, 40, torch.float32, False),
                                                 (20, 16, torch.float16, False), (64, 21, torch.float16, False),
                                                 (24, 40, torch.float32, True), (256, 96, torch.float32, True),
                                                 (64, 21, torch.float32, True)])
def test_conv1x1_rows_equals_conv2d_at_the_listed_pixels(cin, cout, dtype, tf32, monkeypatch):
    """The GEMM over an activation's list gives conv2d's output bit for bit at the active pixels:
    the tensor-core paths (warp-specialised and gathered-rows; float32 in TF32 where
    ``torch.backends.cudnn.allow_tf32``) and the CUDA-core kernel."""
    from deltaconv.backends import cuda as dcc
    monkeypatch.setenv("DELTACONV_TC_RING1_MIN", "0")  # the warp-specialised kernel on small maps too
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    g = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn((cout, cin, 1, 1), generator=g, device="cuda") / cin ** 0.5).to(dtype)
    b = torch.randn(cout, generator=g, device="cuda").to(dtype)
    for frac in (0.0, 0.05, 0.5, 1.0):
        case = _activation_case(dtype, cin, frac, (2, 19, 23), seed=int(frac * 100))
        pixels = 2 * 19 * 23
        rows = RowList(torch.empty(1 + 2 * pixels, dtype=torch.int32, device="cuda"),
                       torch.zeros(16, dtype=torch.int32, device="cuda"))
        d, m = _run(dcc, case, "activation" if frac < 0.5 else "add", rows)
        y = dcc.conv1x1_rows(d, m, w, b, rows)
        y_ref, m_ref = dcc.conv2d(d, m, w, b, 1, 0, 1, 1, None)
        assert torch.equal(m_ref, m)
        sel = m.expand_as(y)
        assert torch.equal(y[sel], y_ref[sel]), frac


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cin,cout,dtype", [(64, 128, torch.float16), (64, 64, torch.bfloat16), (24, 40, torch.float32),
                                            (256, 512, torch.float16), (20, 16, torch.float16)])
def test_conv1x1_rows_into_writes_the_listed_pixels_and_keeps_the_others(cin, cout, dtype, monkeypatch):
    """conv1x1_rows_into (a convolution keeping its whole output): conv1x1_rows' output bit for bit at
    the listed pixels of ``out``, every other element as it was (a sentinel); the warp-specialised,
    gathered-rows and CUDA-core kernels (float32 without TF32)."""
    from deltaconv.backends import cuda as dcc
    monkeypatch.setenv("DELTACONV_TC_RING1_MIN", "0")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    g = torch.Generator(device="cuda").manual_seed(6)
    w = (torch.randn((cout, cin, 1, 1), generator=g, device="cuda") / cin ** 0.5).to(dtype)
    b = torch.randn(cout, generator=g, device="cuda").to(dtype)
    shape = (2, 19, 23)
    pixels = shape[0] * shape[1] * shape[2]
    for frac in (0.0, 0.05, 0.5, 1.0):
        lists = []
        for _ in range(2):  # the same list twice: each convolution takes its counters as its own
            case = _activation_case(dtype, cin, frac, shape, seed=int(frac * 100) + 1)
            rows = RowList(torch.empty(1 + 2 * pixels, dtype=torch.int32, device="cuda"),
                           torch.zeros(16, dtype=torch.int32, device="cuda"))
            d, m = _run(dcc, case, "activation", rows)
            lists.append(rows)
        y = dcc.conv1x1_rows(d, m, w, b, lists[0])
        out = torch.full((shape[0], cout) + shape[1:], 7.0, dtype=dtype, device="cuda").contiguous(memory_format=CL)
        assert dcc.conv1x1_rows_into(d, m, w, b, lists[1], out)
        sel = m.expand_as(y)
        assert torch.equal(out[sel], y[sel]), frac
        assert bool((out[~sel] == 7.0).all()), frac


@pytest.mark.gpu
@needs_gpu
def test_conv1x1_rows_into_declines_what_its_kernel_does_not_take():
    """Output channels not a multiple of 8 (the tensor cores would pad them) or an ``out`` of another
    layout: the wrapper says so (``False``) and leaves ``out`` as it was; the op itself names the argument."""
    from deltaconv.backends import cuda as dcc
    d, m, _, _, acc, sent = _activation_case(torch.float16, 16, 0.5, (1, 5, 7))
    rows = RowList(torch.zeros(71, dtype=torch.int32, device="cuda"), torch.zeros(16, dtype=torch.int32, device="cuda"))
    w = torch.randn(21, 16, 1, 1, device="cuda", dtype=torch.float16)
    out = torch.zeros(1, 21, 5, 7, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    assert not dcc.conv1x1_rows_into(d, m, w, None, rows, out) and not out.any()
    w8 = w[:16].contiguous()
    nchw = torch.zeros(1, 16, 5, 7, device="cuda", dtype=torch.float16)
    assert not dcc.conv1x1_rows_into(d, m, w8, None, rows, nchw) and not nchw.any()
    with pytest.raises(RuntimeError, match=r"conv1x1_rows_into: argument 'out' must be a channels_last contiguous "
                                           r"\[N, Cout, H, W\] = \[1, 16, 5, 7\] tensor, got shape \[1, 16, 5, 7\]"):
        torch.ops.deltaconv.conv1x1_rows_into(d, m, w8, None, rows.rows, rows.counters, nchw)
    with pytest.raises(RuntimeError, match=r"conv1x1_rows_into: argument 'weight' must have a multiple of 8 output "
                                           r"channels on the tensor cores \(pad the filters once\), got 21"):
        torch.ops.deltaconv.conv1x1_rows_into(d, m, w, None, rows.rows, rows.counters, out)
    with pytest.raises(RuntimeError, match=r"conv1x1_rows_into: argument 'out' must have dtype Float"):
        torch.ops.deltaconv.conv1x1_rows_into(d.float(), m, w8.float(), None, rows.rows, rows.counters, out[:, :16])


@pytest.mark.gpu
@needs_gpu
def test_row_list_arguments_are_checked():
    ops = torch.ops.deltaconv
    d, m, _, _, acc, sent = _activation_case(torch.float16, 8, 0.5, (1, 4, 5))
    rows = torch.zeros(41, dtype=torch.int32, device="cuda")
    count = torch.zeros(16, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="'rows' and 'rows_count' must be given together, got 'rows' only"):
        ops.activation(d, m, acc, sent, "relu", 0.0, 0.0, None, False, rows, None)
    with pytest.raises(RuntimeError, match="argument 'rows' must be a contiguous 1-D tensor of at least 41 elements, "
                                           "got shape \\[40\\]"):
        ops.activation(d, m, acc, sent, "relu", 0.0, 0.0, None, False, rows[:40], count)
    with pytest.raises(RuntimeError, match="activation: argument 'rows_count' must have dtype Int, got Long"):
        ops.activation(d, m, acc, sent, "relu", 0.0, 0.0, None, False, rows, count.long())
    with pytest.raises(RuntimeError, match="add: arguments 'rows' and 'rows_count' must be given together, got "
                                           "'rows_count' only"):
        ops.add(d, m, d, m, 1.0, None, count)
    w = torch.zeros(8, 8, 3, 3, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"conv1x1_rows: argument 'weight' must have shape \[Cout, 8, 1, 1\], "
                                           r"got \[8, 8, 3, 3\]"):
        ops.conv1x1_rows(d, m, w, None, rows, count)
    with pytest.raises(RuntimeError, match="conv1x1_rows: argument 'rows' must be a contiguous 1-D tensor of at "
                                           "least 41 elements"):
        ops.conv1x1_rows(d, m, w[:, :, :1, :1].contiguous(), None, rows[:40], count)


@pytest.mark.gpu
@needs_gpu
def test_opcheck_of_the_row_list_ops():
    ops = torch.ops.deltaconv
    d, m, db, mb, acc, sent = _activation_case(torch.float16, 16, 1.0, (1, 5, 7))
    m = torch.ones_like(m)
    d = torch.where(m, d, 0).contiguous(memory_format=CL)
    rows = torch.zeros(71, dtype=torch.int32, device="cuda")
    count = torch.zeros(16, dtype=torch.int32, device="cuda")
    w = torch.randn(24, 16, 1, 1, device="cuda", dtype=torch.float16) / 4
    # every pixel sent (threshold 0, fresh state): the list is complete, so conv1x1_rows writes every output
    torch.library.opcheck(ops.activation.default, (d, m, acc, sent, "relu", 0.0, -1.0, None, False, rows, count),
                          test_utils=("test_schema", "test_faketensor"))
    count.zero_()
    ops.activation(d, m, acc.clone(), sent.clone(), "relu", 0.0, -1.0, None, False, rows, count)
    torch.library.opcheck(ops.conv1x1_rows.default, (d, m, w, None, rows, count))
    out = torch.zeros(1, 24, 5, 7, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    torch.library.opcheck(ops.conv1x1_rows_into.default, (d, m, w, None, rows, count, out))
    torch.library.opcheck(ops.add_activation.default,
                          (d, m, d, m, 1.0, acc, sent, "relu", 0.0, -1.0, None, False, rows, count),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(ops.add.default, (d, m, d, m, 1.0, rows, count),
                          test_utils=("test_schema", "test_faketensor"))
    scale = torch.rand(1, 16, 1, 1, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    scale_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device="cuda")
    scale_acc = torch.zeros(1, 16, 1, 1, device="cuda").contiguous(memory_format=CL)
    torch.library.opcheck(ops.mul.default, (d, m, acc.clone(), scale, scale_mask, scale_acc, sent,
                                            0.0, None, False, rows, count),
                          test_utils=("test_schema", "test_faketensor"))


# ----------------------------------------------------------------------------- whole models
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "fcn_resnet50", "deeplabv3_mobilenet_v3_large"])
def test_row_lists_change_no_output_and_drop_the_mask_passes(name, dtype, monkeypatch):
    """Converted with row lists (the default) and without (DELTACONV_ROW_LISTS=0): bit-equal
    outputs over key and delta frames, eager and replayed from a CUDA graph; the linked 1x1
    convolutions launch no conv1x1_mask_kernel. fcn_resnet50: two 1x1 readers share a list;
    deeplabv3_mobilenet_v3_large: squeeze-excite products list their pixels."""
    model = torchvision_model(name).cuda().to(dtype)
    frames = [f.cuda().to(dtype) for f in video_frames(6, (96, 128))]
    outs, held = {}, {}
    for lists in ("1", "0"):
        monkeypatch.setenv("DELTACONV_ROW_LISTS", lists)
        for graph in (False, True):
            dm = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0],
                                   cuda_graph=graph, check_finite=False)
            with torch.no_grad():
                outs[lists, graph] = [main_output(dm(f)).clone() for f in frames[:4]]
                dm.reset()
                outs[lists, graph] += [main_output(dm(f)).clone() for f in frames[4:]]
            if not graph:
                held[lists] = dm.state_bytes()
                rows = [m._rows_buf for m in dm.modules() if getattr(m, "_rows_buf", None) is not None]
                assert (len(rows) > 0) == (lists == "1")
                if lists == "1":  # the lists' storage is counted with the state
                    extra = sum(r.numel() * r.element_size() for r in rows)
                acts, convs = linked(dm)
                assert 0 < len(acts) <= len(convs)
                with torch.no_grad():
                    names = cuda_kernel_names(lambda: dm(frames[1]))
                if names:  # none recorded under compute-sanitizer
                    masks = sum("conv1x1_mask_kernel" in k for k in names)
                    total = sum(isinstance(m, DCConv2d) and m.kernel_size == (1, 1) for m in dm.modules())
                    assert masks == (total if lists == "0" else total - len(convs)), (masks, total, len(convs))
    assert held["1"] - held["0"] == extra > 0
    for key, ys in outs.items():
        for t, (y, ref) in enumerate(zip(ys, outs["0", False])):
            torch.testing.assert_close(y, ref, rtol=0, atol=0, msg=f"{key} frame {t}")


@pytest.mark.gpu
@needs_gpu
def test_torch_compile_of_a_model_with_row_lists():
    """torch.compile traces the row-list ops (their fake kernels) and gives the eager outputs."""
    model = torchvision_model("mobilenet_v2").cuda().half()
    frames = [f.cuda().half() for f in video_frames(4, (64, 96))]
    eager = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], check_finite=False)
    traced = deltaconv.convert(model, threshold=0.02, backend="cuda", example_input=frames[0], check_finite=False)
    assert linked(traced)[1]
    compiled = torch.compile(traced._runner, fullgraph=False)
    with torch.no_grad():
        eager(frames[0])
        traced(frames[0])
        traced._context.ops = deltaconv.backends.select("cuda", frames[1].device)
        for f in frames[1:]:
            counters = traced._context.work_counters
            counters.begin_frame()  # what a DeltaModel frame does around its runner: the lists need it
            y = compiled(f)
            counters.end_frame()
            torch.testing.assert_close(y, eager(f), rtol=0, atol=0)
    assert any(getattr(m, "_rows_buf", None) is not None for m in traced.modules())  # the lists ran
