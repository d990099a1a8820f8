#!/usr/bin/env bash
# A / B of an unfolded BatchNorm's scale and shift derived once (DCModule.derived) against once per
# frame (10 small kernels per BatchNorm and frame before). "old" is the package of the commit before,
# taken out of git beside this tree (same extension):
#   mkdir -p scratch/old && git archive 262a146 deltaconv | tar -x -C scratch/old
# then, from the repository root on a CUDA machine: bash benchmarks/experiments/unfolded_bn_ab.sh
# Results: benchmarks/results/unfolded_bn_ab.txt
set -euo pipefail
export DELTACONV_VIDEOS=$PWD/.carry/videos TORCH_HOME=$PWD/.carry/torch_home
cp deltaconv/_C.abi3.so scratch/old/deltaconv/
date -u
for round in 1 2; do
for tag in new old; do
  case $tag in new) export PYTHONPATH=$PWD;; *) export PYTHONPATH=$PWD/scratch/old;; esac
  d=/tmp/bn_${tag}_$round; mkdir -p $d
  python benchmarks/video_sweep.py --models densenet121 densenet169 --dtypes float16 --thresholds 0.02 --resolutions 1080x1920 --frames 24 --warmup 5 --video $DELTACONV_VIDEOS/one-by-one-person-detection.mp4 --start 200 --out $d > $d.log 2>&1 || tail -5 $d.log
  python - <<P
import csv
for r in csv.DictReader(open('$d/video.csv')):
    print('$tag $round', r['model'], r['baseline'], r['deltaconv_mode'], r['dense_ms'], r['deltaconv_ms'], r['speedup'], r['rel_err'], r['mean_density'])
P
  cp $d/video.csv $OUT/video_bn_${tag}_$round.csv
done
done
date -u
