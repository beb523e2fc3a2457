#!/usr/bin/env bash
# Round 7 (device tool, one H200): tensor-descriptor (TMA) loads in the Sol kernel.
#   bash results/benchmarks/sparse/round7/run.sh        (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m pytest -q -m gpu tests/test_sparse_attention.py -p no:cacheprovider > "$OUT/gpu_tests7.log" 2>&1
tail -3 "$OUT/gpu_tests7.log"
python3 -m vidtune.benchmarks.bench_sparse --sweep --skip-attention --skip-pass --repeats 3 --out "$OUT/sweep7.json" \
  > "$OUT/sweep7.log" 2>&1
grep "^sweep" "$OUT/sweep7.log"
python3 -m vidtune.benchmarks.bench_sparse --launch tma=True --betas 1.0 1.5 --skip-pass --repeats 3 --out "$OUT/sparse7.json" \
  > "$OUT/sparse7.log" 2>&1
tail -12 "$OUT/sparse7.log"
