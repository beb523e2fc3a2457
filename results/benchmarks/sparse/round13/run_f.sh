#!/usr/bin/env bash
# Round 13f: the default CuTe settings after rounds 13b-e (3 stages, fused correction, Q in registers)
# against Triton and cuDNN at 24,576 and 130,560 tokens (beta 1.0 and 1.25; interleaved, 7 repeats),
# then one 4K ltx2-19b stage-2 pass dense vs Sol with backend=cute at beta 1.0 and 1.25 (2 repeats).
#   call 1: carry [".dw5/0"]  command: mkdir -p /tmp/vt-chunks && cp .dw5/0/chunk /tmp/vt-chunks/0
#   call 2: carry [".dw5/1"]  command: bash results/benchmarks/sparse/round13/run_f.sh
set -u
source results/benchmarks/sparse/round13/install.sh
timeout 560 python3 -m vidtune.benchmarks.bench_sparse --compare-backends --betas 1.0 1.25 --repeats 7 --skip-attention \
  --pass-betas 1.25 1.0 --backend cute --pass-repeats 2 --out "$OUT/cmp13f.json" > "$OUT/cmp13f.log" 2>&1
grep -E "beta|Error" "$OUT/cmp13f.log"
