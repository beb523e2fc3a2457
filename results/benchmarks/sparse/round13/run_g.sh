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
