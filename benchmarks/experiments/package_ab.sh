#!/usr/bin/env bash
# A / B of a Python-only change: this tree's package against the package of an older commit, with the
# same extension, on whole models replayed as CUDA graphs, alternated twice in one call.
#
#   bash benchmarks/experiments/package_ab.sh OLD_COMMIT MODEL [MODEL ...]
#
# The old package is taken out of git into scratch/old (git-ignored; on a machine without the
# repository's history, make it beforehand: git archive OLD_COMMIT deltaconv | tar -x -C scratch/old,
# and pass "-" as OLD_COMMIT). Each round runs video_sweep.py for both (float16, 1080x1920, t=0.02,
# one-by-one frames 200-215, $VIDEO_ARGS to change) and prints the graph-against-graph rows; the CSVs
# go to $OUT (default /tmp). Used for benchmarks/results/densenet_ab.txt.
set -euo pipefail
old=$1; shift
models=("$@")
out=${OUT:-/tmp}
export DELTACONV_VIDEOS=${DELTACONV_VIDEOS:-$PWD/.carry/videos} TORCH_HOME=${TORCH_HOME:-$PWD/.carry/torch_home}
if [ "$old" != - ]; then
  rm -rf scratch/old && mkdir -p scratch/old && git archive "$old" deltaconv | tar -x -C scratch/old
fi
cp deltaconv/_C*.so scratch/old/deltaconv/
args=${VIDEO_ARGS:-"--dtypes float16 --thresholds 0.02 --resolutions 1080x1920 --frames 16 --warmup 4 --video $DELTACONV_VIDEOS/one-by-one-person-detection.mp4 --start 200"}
date -u
for round in 1 2; do
  for tag in new old; do
    case $tag in new) root=$PWD;; *) root=$PWD/scratch/old;; esac
    d=/tmp/package_ab_${tag}_$round; mkdir -p "$d"
    # shellcheck disable=SC2086
    PYTHONPATH=$root python benchmarks/video_sweep.py --models "${models[@]}" $args --out "$d" > "$d.log" 2>&1 \
      || tail -5 "$d.log"
    python - "$d/video.csv" "$tag $round" <<'P'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r["baseline"] == "cudagraph" and r["deltaconv_mode"] == "cudagraph":
        print(sys.argv[2], r["model"], r["dense_ms"], r["deltaconv_ms"], r["speedup"], r["rel_err"],
              r["mean_density"], r["flops_density"])
P
    cp "$d/video.csv" "$out/video_package_ab_${tag}_$round.csv"
  done
done
date -u
