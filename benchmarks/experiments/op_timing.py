"""Timing shared by the op-alone A/B scripts of this folder (adaptive_pool_ab.py, resample_ab.py)."""
import statistics

import torch

CALLS = 10  # calls per captured graph


def deltaconv_ops():
    """``torch.ops.deltaconv``, after checking for a CUDA device and the built extension (else
    SystemExit with what is missing)."""
    import deltaconv._extension as extension

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark times the CUDA kernels")
    if not extension.load():
        raise SystemExit("deltaconv's CUDA extension did not load (build it: python setup.py build_ext --inplace)")
    return torch.ops.deltaconv


def per_call_us(fn) -> float:
    """Microseconds per call of ``fn``: ``CALLS`` calls captured in one CUDA graph (after a warm-up
    call on a side stream), CUDA events around 5 replays, the median of 30 such pairs after 5
    replays of warm-up."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (5 * CALLS))
    return statistics.median(times)
