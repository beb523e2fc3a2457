#!/usr/bin/env bash
# Round 12 (device tool, one H200): beta 1.25, new knob value, for the issue's ~10% density. Attention
# alone at 24,576 and 130,560 tokens (Sol vs cuDNN dense, interleaved, 5 repeats), then one 4K ltx2-19b
# stage-2 pass dense vs Sol at beta 1.25 on every block (2 repeats, interleaved), default launch.
#   bash results/benchmarks/sparse/round12/run.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m vidtune.benchmarks.bench_sparse --betas 1.25 --pass-betas 1.25 --pass-repeats 2 --repeats 5 \
  --out "$OUT/sparse12.json" > "$OUT/sparse12.log" 2>&1
grep -E "beta|x[0-9.]+" "$OUT/sparse12.log" | tail -6
