"""Recording a function or a dense model as a CUDA graph and replaying it (the dense baselines of
the demo and the benchmarks; a converted model records itself, :meth:`DeltaModel.capture`)."""
from __future__ import annotations

from typing import Callable

import torch


def capture_graph(fn: Callable[[], object]) -> tuple[Callable[[], None], object]:
    """``fn`` recorded in a CUDA graph after three warm-up calls on a side stream (as capture
    requires); returns the replay callable and the output of the captured call (overwritten by
    every replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def graphed_model(model, example: torch.Tensor) -> Callable[[torch.Tensor], object]:
    """The dense ``model`` replayed as one CUDA graph per frame: copy the frame in, replay. The
    output is the graph's own tensor, overwritten by the next call. The returned callable holds
    ``model`` (as ``run.model``): the graph reads its parameters where they were when it was
    recorded, so they must outlive it."""
    static_in = example.clone()
    with torch.no_grad():
        replay, static_out = capture_graph(lambda: model(static_in))

    def run(frame):
        static_in.copy_(frame)
        replay()
        return static_out
    run.model = model
    return run
