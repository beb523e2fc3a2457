#!/usr/bin/env bash
# Round 7b (device tool, one H200): TMA loads without the value sums' lo part, under other stage / warp /
# chunk counts; then the fastest of them end to end and in the 4K ltx2-19b pass.
#   bash results/benchmarks/sparse/round7/run_b.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m vidtune.benchmarks.bench_sparse --sweep 7b --skip-attention --skip-pass --repeats 3 --out "$OUT/sweep7b.json" \
  > "$OUT/sweep7b.log" 2>&1
grep "^sweep" "$OUT/sweep7b.log"
best=$(python3 - "$OUT/sweep7b.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["sweep"] if "median_ms" in r]
best = min(rows, key=lambda r: r["median_ms"])
print(" ".join(f"{k}={v}" for k, v in best.items() if k not in ("ms", "median_ms", "max_abs_vs_default")))
PY
)
echo "fastest: $best"
python3 -m vidtune.benchmarks.bench_sparse --launch $best --betas 1.0 1.5 --pass-betas 1.0 --pass-repeats 2 --repeats 3 \
  --out "$OUT/sparse7b.json" > "$OUT/sparse7b.log" 2>&1
tail -6 "$OUT/sparse7b.log"
