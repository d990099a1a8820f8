"""BlazePose (deltaconv.blazepose, real weights) against TFLite's runtime, on vtest.avi's pedestrians, and converted
at a few thresholds: the figures of the README's *TFLite models* paragraph (CPU, reference backend, float32).

1. Each output of the loaded network against ai-edge-litert's interpreter on a real crop and on noise
   (``||torch - tflite|| / ||tflite||``).
2. The pose flag on crops around two pedestrians of frame 30 and on one of buildings (tests/test_tflite.py's boxes).
3. The converted model at each threshold over frames 28-39 of the first pedestrian's fixed crop (they walk through
   it): the largest landmark x, y difference from the dense model in crop pixels, the heatmaps' relative error on
   the last frame, and the FLOPs density (``deltaconv.fidelity.flops_density``).

    DELTACONV_VIDEOS=../shared/videos PYTHONPATH=. python benchmarks/experiments/blazepose_thresholds.py
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import deltaconv
from deltaconv.blazepose import blazepose_full
from deltaconv.fidelity import flops_density
from deltaconv.video import read_frames
from deltaconv.weights import blazepose_full_tflite

PEDESTRIANS, EMPTY = ((585, 227, 148), (318, 154, 166)), (0, 0, 150)


def crops(box, first: int, count: int, normalize: bool = True) -> list[torch.Tensor]:
    x, y, side = box
    return list(read_frames(max_frames=count, size=(256, 256), start=first, crop=(x, y, side, side),
                            normalize=normalize))


def against_tflite() -> None:
    from ai_edge_litert.interpreter import Interpreter

    network = blazepose_full().network
    interpreter = Interpreter(model_path=str(blazepose_full_tflite()))
    interpreter.allocate_tensors()
    noise = torch.from_numpy(np.random.default_rng(0).random((1, 3, 256, 256), dtype=np.float32))
    for label, x in (("pedestrian crop", crops(PEDESTRIANS[0], 30, 1, normalize=False)[0]), ("noise", noise)):
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.permute(0, 2, 3, 1).numpy().copy())
        interpreter.invoke()
        with torch.no_grad():
            outs = network(x)
        errors = []
        for tid, out in zip(network.output_ids, outs):
            ref = interpreter.get_tensor(tid)
            ref = ref.transpose(0, 3, 1, 2) if ref.ndim == 4 else ref
            errors.append(float(np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)))
        print(f"vs tflite, {label}: relative error per output " + " ".join(f"{e:.2e}" for e in errors))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.005, 0.01, 0.02])
    a = p.parse_args(argv)
    against_tflite()
    model = blazepose_full()
    with torch.no_grad():
        for box in (*PEDESTRIANS, EMPTY):
            print(f"pose flag, crop {box} of frame 30: {model(crops(box, 30, 1)[0])['pose_flag'].item():.3e}")
    frames = crops(PEDESTRIANS[0], 28, 12)
    for t in a.thresholds:
        dm = deltaconv.convert(model, threshold=t, example_input=frames[0])
        worst = 0.0
        with torch.no_grad():
            for x in frames:
                got, ref = dm(x), model(x)
                worst = max(worst, (got["landmarks"] - ref["landmarks"]).view(-1, 39, 5)[..., :2].abs().max().item())
            heat = ((got["heatmaps"] - ref["heatmaps"]).norm() / ref["heatmaps"].norm()).item()
        print(f"threshold {t:g}: landmarks x, y at most {worst:.4f} crop px from dense, heatmaps {heat:.2e} "
              f"(last frame), FLOPs density {flops_density(dm.stats()):.3f}")


if __name__ == "__main__":
    main()
