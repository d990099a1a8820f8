"""Every ``.tflite`` model of the mediapipe wheel through :func:`deltaconv.load_tflite`: whether it loads (else the
error), its input size, each output against the reference runtime, and its conversion: the README's *MediaPipe's
models* figures (``tests/test_tflite.py`` asserts bounds on the same comparisons).

The reference is TFLite's runtime (``ai-edge-litert``) on a ``vtest.avi`` crop (frame 30, the region x=585, y=227,
148x148, resized to the model's input, RGB in [0, 1]); for the selfie segmentation models, whose custom op that
runtime lacks, MediaPipe's own (its ``SelfieSegmentation`` solution) on a region with people at the model's size.
Conversion: ``deltaconv.convert`` in float64 (reference backend), the number of converted layers and fallbacks, and
the largest relative error against the loaded network at threshold 0 over three frames. CPU::

    DELTACONV_VIDEOS=../shared/videos PYTHONPATH=. python benchmarks/experiments/mediapipe_models.py
"""
from __future__ import annotations

import numpy as np
import torch

import deltaconv
from deltaconv.tflite_models import load_tflite
from deltaconv.video import read_frames
from deltaconv.weights import MEDIAPIPE_PACKAGE, packaged_file

#: the selfie segmentation files: MediaPipe's solution's model_selection, and a vtest.avi region with people
SELFIE = {"selfie_segmentation.tflite": (0, (450, 150, 300, 300)),
          "selfie_segmentation_landscape.tflite": (1, (300, 140, 448, 252))}


def runtime_errors(path, network, x: torch.Tensor) -> list[float]:
    """Relative error of each output of ``network(x)`` against the reference runtime's."""
    with torch.no_grad():
        outs = network(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if path.name in SELFIE:
        from mediapipe.python.solutions import selfie_segmentation

        rgb = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        ref = selfie_segmentation.SelfieSegmentation(model_selection=SELFIE[path.name][0]).process(rgb)
        refs = [ref.segmentation_mask[None, None]]
    else:
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.permute(0, 2, 3, 1).numpy().copy())
        interpreter.invoke()
        refs = [interpreter.get_tensor(t) for t in network.output_ids]
        refs = [r.transpose(0, 3, 1, 2) if r.ndim == 4 else r for r in refs]
    return [float(np.linalg.norm(o.numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, refs)]


def main() -> None:
    root = packaged_file(*MEDIAPIPE_PACKAGE, "pose_landmark_full.tflite").parents[1]  # modules/
    for path in sorted(root.rglob("*.tflite")):
        try:
            network = load_tflite(path)
        except Exception as error:  # the loader's message names what stops it
            print(f"{path.name}: does not load: {type(error).__name__}: {error}")
            continue
        h, w = network.input_hw
        crop = SELFIE.get(path.name, (None, (585, 227, 148, 148)))[1]
        x = next(read_frames(max_frames=1, start=30, size=(h, w), crop=crop, normalize=False))
        x = (x * 255).round() / 255  # the uint8 frame a runtime gets
        errors = runtime_errors(path, network, x)
        net = network.double()
        dm = deltaconv.convert(net, example_input=x.double())
        worst = 0.0
        with torch.no_grad():
            for frame in (x, x.flip(-1), x):
                got, want = dm(frame.double()), net(frame.double())
                for g, r in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                    worst = max(worst, float((g - r).norm() / r.norm().clamp_min(1e-300)))
        print(f"{path.name}: {h}x{w}; vs {'MediaPipe' if path.name in SELFIE else 'TFLite'}'s runtime, per output "
              + " ".join(f"{e:.1e}" for e in errors) + f"; converted {len(dm.report.converted)} layers, "
              f"{len(dm.report.fallbacks)} fallbacks, at threshold 0 {worst:.1e} off", flush=True)


if __name__ == "__main__":
    main()
