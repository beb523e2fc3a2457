#!/usr/bin/env bash
# Round 7c (device tool, one H200): base-2 exponentials and query-block pairs on top of round 7b's fastest
# (TMA loads, no value lo part); the GPU tests; then the fastest end to end and in the 4K ltx2-19b pass.
#   bash results/benchmarks/sparse/round7/run_c.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m pytest -q -m gpu tests/test_sparse_attention.py -p no:cacheprovider > "$OUT/gpu_tests7c.log" 2>&1
tail -3 "$OUT/gpu_tests7c.log"
python3 -m vidtune.benchmarks.bench_sparse --sweep 7c --skip-attention --skip-pass --repeats 3 --out "$OUT/sweep7c.json" \
  > "$OUT/sweep7c.log" 2>&1
grep "^sweep" "$OUT/sweep7c.log"
best=$(python3 - "$OUT/sweep7c.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["sweep"] if "median_ms" in r]
best = min(rows, key=lambda r: r["median_ms"])
print(" ".join(f"{k}={v}" for k, v in best.items() if k not in ("ms", "median_ms", "max_abs_vs_default")))
PY
)
echo "fastest: $best"
python3 -m vidtune.benchmarks.bench_sparse --launch $best --betas 1.0 1.5 --pass-betas 1.0 --pass-repeats 2 --repeats 3 \
  --out "$OUT/sparse7c.json" > "$OUT/sparse7c.log" 2>&1
tail -6 "$OUT/sparse7c.log"
