"""Where a converted float16 model's rounding departs from the dense float16 model's: each activation's whole
values (``sent``) against the float64 dense model's, next to the dense float16 model's own, at threshold 0 on the
reference backend (``benchmarks/results/stem_value_mode.txt``, 2026-12-07 evening). A ratio that grows with depth
points at a rounding the dense model does not make; ``--head``: the outputs of the dense float16 layers after the
last activation over pixels run on the converted model's values of it, which separates the classifier head's
share.

    DELTACONV_VIDEOS=../shared/videos PYTHONPATH=. python benchmarks/experiments/activation_fidelity.py \\
        --model path/to/hand_landmark_full.tflite --crop 585 227 148 148 --start 28 --frames 10 --head
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.fx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from stem_fidelity import clip_arguments, model_and_clip  # noqa: E402
from zoo_speed import named_outputs, output_errors  # noqa: E402

import deltaconv  # noqa: E402
from deltaconv.modules import DCActivation  # noqa: E402


def values(gm: torch.fx.GraphModule, x: torch.Tensor, override: dict | None = None) -> tuple:
    """``(output, {node name: value})`` of the traced model on ``x``, nodes of ``override`` taking its values."""
    run = torch.fx.Interpreter(gm, garbage_collect_values=False)
    env = {n: override[n.name] for n in gm.graph.nodes if override and n.name in override}
    out = run.run(x, initial_env=env)
    return out, {n.name: v for n, v in run.env.items()}


def node_of(layer_name: str, names) -> str | None:
    """The traced node of a converted layer: its dotted name with underscores, or that without the first part
    (a model file's ``network.`` prefix)."""
    for candidate in (layer_name.replace(".", "_"), layer_name.split(".", 1)[-1].replace(".", "_")):
        if candidate in names:
            return candidate
    return None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    clip_arguments(p, 10)
    p.add_argument("--head", action="store_true", help="also the outputs of a dense head on the last activation")
    a = p.parse_args(argv)
    entry, frames = model_and_clip(a)
    half = entry.model.half().eval()
    gm64, gm16 = torch.fx.symbolic_trace(copy.deepcopy(entry.model).double().eval()), torch.fx.symbolic_trace(half)
    names = {n.name for n in gm16.graph.nodes}
    dm = deltaconv.convert(half, threshold=0, backend="reference", example_input=frames[0].half())
    acts = [(m, node_of(m.layer_name, names)) for m in dm.delta_layers() if isinstance(m, DCActivation)]
    acts = [(m, n) for m, n in acts if n is not None]
    sq = {n: [0.0, 0.0, 0.0] for _, n in acts}  # dense, converted, reference
    outs = {"dense": [], "converted": [], "dense head": [], "exact": []}
    with torch.no_grad():
        for t, f in enumerate(frames):
            o64, e64 = values(gm64, f.double())
            o16, e16 = values(gm16, f.half())
            got = dm(f.half())
            outs["exact"].append(named_outputs(o64))
            outs["dense"].append(named_outputs(o16))
            outs["converted"].append(named_outputs(got))
            if a.head:
                last, n = [(m, n) for m, n in acts if m.sent.dim() == 4][-1]  # the last one over pixels
                outs["dense head"].append(named_outputs(values(gm16, f.half(), {n: last.sent.contiguous()})[0]))
            if t == 0:
                continue  # the key frame (output_errors leaves it out too)
            for m, n in acts:
                if m.sent.shape != e64[n].shape:
                    continue
                sq[n][0] += float((e16[n].double() - e64[n]).norm() ** 2)
                sq[n][1] += float((m.sent.double() - e64[n]).norm() ** 2)
                sq[n][2] += float(e64[n].norm() ** 2)
    print(f"# {a.model}, {a.video} frames {a.start + 1}-{a.start + a.frames - 1} (after the key frame), float16, "
          "threshold 0, reference backend; relative error against float64")
    for n, (d, c, r) in sq.items():
        if r > 0:
            print(f"{n:<28} dense {(d / r) ** 0.5:.3e}  converted {(c / r) ** 0.5:.3e}  ratio {(c / d) ** 0.5:.2f}")
    for kind in ("dense", "converted", "dense head"):
        if outs[kind]:
            errs = output_errors(outs[kind], outs["exact"])
            print(f"outputs, {kind:<10} " + " ".join(f"{k} {e:.2e}" for k, e in errs.items()))


if __name__ == "__main__":
    main()
