#!/usr/bin/env bash
# The benchmark sweeps on a CUDA machine (called by benchmarks/gpu_suite.sh, or alone):
# kernel sweep (benchmarks/results/kernels.csv + PNG) and video sweep (video.csv + PNG).
# Knobs: BENCH_QUICK=1 (small sweeps), VIDEO_FRAMES (default 40), VIDEO_THRESHOLDS (default "0 0.1").
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
quick=${BENCH_QUICK:+--quick}
"$PY" benchmarks/kernel_sweep.py --dtypes float16 $quick
# shellcheck disable=SC2086
"$PY" benchmarks/video_sweep.py --frames "${VIDEO_FRAMES:-40}" --thresholds ${VIDEO_THRESHOLDS:-0 0.1} $quick
