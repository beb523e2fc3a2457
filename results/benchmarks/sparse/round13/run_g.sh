#!/usr/bin/env bash
# Round 13g: the final state's GPU tests: the CuTe backend (tests/test_sol_cute.py, float32 inputs
# included) and the Triton kernel's GPU tests (tests/test_sparse_attention.py -m gpu), after the Triton
# kernel gained the init path the CuTe backend's "triton" correction uses.
#   call 1: carry [".dw5/0"]  command: mkdir -p /tmp/vt-chunks && cp .dw5/0/chunk /tmp/vt-chunks/0
#   call 2: carry [".dw5/1"]  command: bash results/benchmarks/sparse/round13/run_g.sh
set -u
source results/benchmarks/sparse/round13/install.sh
timeout 500 python3 -m pytest -q tests/test_sol_cute.py tests/test_sparse_attention.py -m gpu -p no:cacheprovider \
  > "$OUT/gpu_tests13g.log" 2>&1
tail -3 "$OUT/gpu_tests13g.log"
# 13g (gpu_tests13g.log): 82 passed, 1 failed: the float32 test compared against the reference on the
# float32 inputs, whose routing flips a few blocks at the threshold (density 0.1340 against 0.1343).
# Fixed to compare on the same bf16-rounded inputs; rerun on the same machine (gpu_tests13g2.log):
#   python3 -m pytest -q tests/test_sol_cute.py -m gpu -k "float32 or 4096"    -> 19 passed
