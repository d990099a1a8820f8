# An experiment, not a maintained tool: benchmarks/fidelity_sweep.py with the pooled truncation
# measure of pooled_truncation.py in place of the per-pixel "rms" (run it with --truncation rms).
# Run from the repository root:
#   PYTHONPATH=. python benchmarks/experiments/pooled_calibration.py K:GAIN:PEAK:GATE[:S,S,...] [fidelity_sweep args]
# S,S,...: pool only the layers at these strides of the input (the others per pixel, "rms"); needs --size.
"""Per-layer calibration (fidelity_sweep.py) with the pooled truncation measure."""
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/experiments")
import pooled_truncation as pt  # noqa: E402  (patches reference.exceeds on import)
import fidelity_sweep  # noqa: E402

if __name__ == "__main__":
    parts = sys.argv[1].split(":")
    measure, strides = ":".join(parts[:4]), {int(s) for s in parts[4].split(",")} if len(parts) > 4 else set()
    height = int(sys.argv[sys.argv.index("--size") + 1]) if strides else None
    pt.configure(measure, height=height, strides=strides, t_other=None)
    fidelity_sweep.main(sys.argv[2:])
