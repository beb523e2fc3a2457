#!/usr/bin/env bash
# Round 13c: the correction fused into the CuTe kernel (CUTE_LAUNCH correction="fused": after the kept
# blocks the loader streams the block means, 64 at a time, through the same slots). GPU tests (both
# placements of the correction), then the backends compared at 24,576 and 130,560 tokens (beta 1.0 and
# 1.25; interleaved, 5 repeats; Sol with the fused correction, with Triton's, and Triton's kernel).
#   call 1: carry [".dw5/0"]  command: mkdir -p /tmp/vt-chunks && cp .dw5/0/chunk /tmp/vt-chunks/0
#   call 2: carry [".dw5/1"]  command: bash results/benchmarks/sparse/round13/run_c.sh
set -u
source results/benchmarks/sparse/round13/install.sh
timeout 300 python3 -m pytest -q tests/test_sol_cute.py -p no:cacheprovider > "$OUT/gpu_tests13c.log" 2>&1
tail -4 "$OUT/gpu_tests13c.log"
timeout 280 python3 -m vidtune.benchmarks.bench_sparse --compare-backends --betas 1.0 1.25 --repeats 5 --skip-attention \
  --skip-pass --out "$OUT/cmp13c.json" > "$OUT/cmp13c.log" 2>&1
grep -E "beta|Error" "$OUT/cmp13c.log"
