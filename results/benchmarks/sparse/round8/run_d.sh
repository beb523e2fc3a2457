#!/usr/bin/env bash
# Round 8d (device tool, one H200): one 4K stage-2 pass of ltx2-19b (3840x2176x121, random bf16 weights),
# dense against Sol on every block at betas above 1.0, looking for the issue's ~10% density on the model's
# own q/k (beta 1.0 gave 0.172 in rounds 6-7); one repeat each after a warm-up (the device time left).
#   bash results/benchmarks/sparse/round8/run_d.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m vidtune.benchmarks.bench_sparse --skip-attention --pass-betas 1.25 1.5 --pass-repeats 1 \
  --out "$OUT/pass8d.json" > "$OUT/pass8d.log" 2>&1
tail -n 4 "$OUT/pass8d.log"; python3 -c "import json; print(json.dumps(json.load(open('$OUT/pass8d.json'))['pass_4k'])[:1500])"
