#!/usr/bin/env bash
# Round 13 (device tool, one H200): the CuTe DSL kernel of Sol's kept blocks (kernels/sol_cute_sm90.py)
# with Triton's correction after it (kernels/sol_cute.py). GPU tests, then the backends compared at
# 24,576 and 130,560 tokens (agreement; interleaved times of dense cuDNN, Sol end to end with each backend,
# and the kept part alone with each).
#   call 1: carry [".dw5/0"]  command: mkdir -p /tmp/vt-chunks && cp .dw5/0/chunk /tmp/vt-chunks/0
#   call 2: carry [".dw5/1"]  command: bash results/benchmarks/sparse/round13/run.sh
# .dw5/k/chunk: halves of one tar holding cdsl.tar.xz (nvidia-cutlass-dsl 4.8.1 with its cu13 libraries,
# unpacked wheels, xz) and the ltx-core, ltx-pipelines and PyAV wheels.
set -u
source results/benchmarks/sparse/round13/install.sh
STAGE=${STAGE:-all}
if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
  timeout 300 python3 -m pytest -q -x tests/test_sol_cute.py -p no:cacheprovider > "$OUT/gpu_tests13.log" 2>&1
  tail -25 "$OUT/gpu_tests13.log"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
  timeout 400 python3 -m vidtune.benchmarks.bench_sparse --compare-backends --betas 1.0 1.25 --repeats 3 --skip-attention \
    --skip-pass --out "$OUT/cmp13.json" > "$OUT/cmp13.log" 2>&1
  tail -8 "$OUT/cmp13.log"
fi
