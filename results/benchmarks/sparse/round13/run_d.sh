#!/usr/bin/env bash
# Round 13d: the kept loop issues a block's P V and the next block's S = Q K^T back to back (one wait for
# both), and the correction issues both score products of a chunk (lo, hi) before one wait. GPU tests;
# the backends compared at 24,576 and 130,560 tokens (beta 1.0 and 1.25; interleaved, 5 repeats); one 4K
# ltx2-19b stage-2 pass dense vs Sol with backend=cute at beta 1.25 (2 repeats, interleaved).
#   call 1: carry [".dw5/0"]  command: mkdir -p /tmp/vt-chunks && cp .dw5/0/chunk /tmp/vt-chunks/0
#   call 2: carry [".dw5/1"]  command: bash results/benchmarks/sparse/round13/run_d.sh
set -u
source results/benchmarks/sparse/round13/install.sh
timeout 200 python3 -m pytest -q tests/test_sol_cute.py -p no:cacheprovider > "$OUT/gpu_tests13d.log" 2>&1
tail -2 "$OUT/gpu_tests13d.log"
timeout 330 python3 -m vidtune.benchmarks.bench_sparse --compare-backends --betas 1.0 1.25 --repeats 5 --skip-attention \
  --pass-betas 1.25 --backend cute --pass-repeats 2 --out "$OUT/cmp13d.json" > "$OUT/cmp13d.log" 2>&1
grep -E "beta|Error" "$OUT/cmp13d.log"
