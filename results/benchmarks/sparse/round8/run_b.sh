#!/usr/bin/env bash
# Round 8b (device tool, one H200): the correction without the block means' lo part (kmean_lo=False, one
# dot fewer per chunk): the kernel alone against round 7's default (sweep 8, interleaved), its error on the
# GPU test's steep inputs against the reference (--check), and end to end against cuDNN dense.
#   bash results/benchmarks/sparse/round8/run_b.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m vidtune.benchmarks.bench_sparse --sweep 8 --skip-attention --skip-pass --repeats 3 --out "$OUT/sweep8.json" > "$OUT/sweep8.log" 2>&1
grep -E "^sweep" "$OUT/sweep8.log" | sed 's/.num_warps.*kmean_lo/ ... kmean_lo/' | tail -5
python3 -m vidtune.benchmarks.bench_sparse --check --betas 1.0 1.5 --skip-pass --repeats 3 --launch kmean_lo=false \
  --out "$OUT/sparse8b.json" > "$OUT/sparse8b.log" 2>&1
grep -E "^check|beta" "$OUT/sparse8b.log" | cut -c1-260 | tail -14
