#!/usr/bin/env bash
# Round 9 (device tool, one H200): the correction as its own kernel run first (split) so that the kept
# loop, alone in its kernel, can be warp-specialised by Triton's Hopper pass (ws; it fails on the fused
# two-loop kernel); the GPU tests of the new settings, sweep 9 (kernel alone, interleaved), then end to
# end against cuDNN dense with the sweep's fastest setting.
#   bash results/benchmarks/sparse/round9/run.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m pytest -q -m gpu tests/test_sparse_attention.py -k "launch_settings or matches_reference_on_gpu" \
  -p no:cacheprovider > "$OUT/gpu_tests9.log" 2>&1
tail -3 "$OUT/gpu_tests9.log"
python3 -m vidtune.search.bench_sparse --sweep 9 --skip-attention --skip-pass --repeats 3 --out "$OUT/sweep9.json" > "$OUT/sweep9.log" 2>&1
grep -E "^sweep" "$OUT/sweep9.log" | sed 's/.num_warps.*kmean_lo/ ... kmean_lo/' | cut -c1-330
# the fastest setting, as --launch overrides of the defaults
BEST=$(python3 - "$OUT/sweep9.json" <<'PY'
import json, sys
from vidtune.kernels.sol_triton import LAUNCH
rows = [r for r in json.load(open(sys.argv[1]))["sweep"] if r.get("median_ms")]
best = min(rows, key=lambda r: r["median_ms"])
print(" ".join(f"{k}={best[k]}" for k in LAUNCH if best.get(k) != LAUNCH[k] and k != "tma"))
PY
)
echo "fastest: $BEST"
python3 -m vidtune.search.bench_sparse --betas 1.0 1.5 --skip-pass --repeats 5 --launch $BEST \
  --out "$OUT/sparse9.json" > "$OUT/sparse9.log" 2>&1
grep -E "beta|x[0-9.]+" "$OUT/sparse9.log" | tail -6
