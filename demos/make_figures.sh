#!/usr/bin/env bash
# Regenerate the figures in docs/ (see docs/README_figures.md for what each shows).
#   bash demos/make_figures.sh tradeoff   # CPU, ~10 min on 2 busy cores
#   bash demos/make_figures.sh frame      # needs a CUDA GPU and the built extension (seconds on an H200)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
case "${1:-tradeoff}" in
  tradeoff)
    "$PY" -m deltaconv calibrate --model mobilenet_v2 --size 144x192 --frames 12 --tolerance 0.05 --max-evals 30 \
      --sweep 0,0.005,0.01,0.02,0.05,0.1,0.2,0.5 --out /tmp/fig/thresholds.json --plot docs/threshold_tradeoff.png ;;
  frame)
    "$PY" -m deltaconv demo --device cuda --max-frames 100 --threshold 0.02 --out demo.mp4 \
      --snapshot docs/demo_frame.png --no-progress ;;
  *) echo "make_figures.sh: unknown figure '$1' (expected tradeoff or frame)" >&2; exit 2 ;;
esac
