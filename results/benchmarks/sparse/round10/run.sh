#!/usr/bin/env bash
# Round 10 (device tool, one H200): fold (the softmax scale inside the exponent's multiply-add) and pairs
# of kept blocks as two TMA tiles under one maximum and one accumulator rescale (pair with tma). The GPU
# tests, sweep 10 (kernel alone, interleaved), the fastest setting's accuracy on the steep inputs
# (--check) and end to end against cuDNN dense, then the 4K ltx2-19b pass at beta 1.5 with it.
#   bash results/benchmarks/sparse/round10/run.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m pytest -q -m gpu tests/test_sparse_attention.py -k "launch_settings or matches_reference_on_gpu" \
  -p no:cacheprovider > "$OUT/gpu_tests10.log" 2>&1
tail -3 "$OUT/gpu_tests10.log"
python3 -m vidtune.benchmarks.bench_sparse --sweep 10 --skip-attention --skip-pass --repeats 3 --out "$OUT/sweep10.json" > "$OUT/sweep10.log" 2>&1
grep -E "^sweep" "$OUT/sweep10.log" | sed 's/.num_warps.*query_blocks/ ... query_blocks/' | cut -c1-330
BEST=$(python3 - "$OUT/sweep10.json" <<'PY'
import json, sys
from vidtune.kernels.sol_triton import LAUNCH
rows = [r for r in json.load(open(sys.argv[1]))["sweep"] if r.get("median_ms")]
best = min(rows, key=lambda r: r["median_ms"])
print(" ".join(f"{k}={best[k]}" for k in LAUNCH if best.get(k) != LAUNCH[k] and k != "tma"))
PY
)
echo "fastest: $BEST"
python3 -m vidtune.benchmarks.bench_sparse --check --betas 1.0 1.5 --skip-pass --repeats 5 --launch $BEST \
  --out "$OUT/sparse10.json" > "$OUT/sparse10.log" 2>&1
grep -E "^check|beta" "$OUT/sparse10.log" | cut -c1-240 | tail -14
python3 -m vidtune.benchmarks.bench_sparse --skip-attention --pass-betas 1.5 --pass-repeats 1 --launch $BEST \
  --out "$OUT/pass10.json" > "$OUT/pass10.log" 2>&1
grep -E "4K pass" "$OUT/pass10.log"
