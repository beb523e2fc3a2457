#!/usr/bin/env bash
# Round 8 (device tool, one H200): the routing's compaction fused into one Triton pass (kernels/sol_triton.py
# route, fused=True: compare with tau, add the neighbours, write mask, kept-first list and counts) against
# the PyTorch routing (comparison, neighbours, stable argsort), then the GPU tests and end to end.
#   bash results/benchmarks/sparse/round8/run.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m pytest -q -m gpu tests/test_sparse_attention.py tests/test_gpu.py -p no:cacheprovider > "$OUT/gpu_tests8.log" 2>&1
tail -3 "$OUT/gpu_tests8.log"
python3 - > "$OUT/routing8.log" 2>&1 <<'PY'
# the routing alone, fused vs PyTorch, interleaved (A B A B), 7 repeats after a warm-up; equal outputs
import statistics, torch
from vidtune.benchmarks.bench_sparse import SEQUENCES, _inputs, _time
from vidtune.kernels.sol_triton import route
dev = torch.device("cuda")
for name, n in SEQUENCES.items():
    q, k, v = _inputs(n, 32, 128, dev)
    for beta in (1.0, 1.5):
        a, b = route(q, k, v, beta, 64, "exact", 1, fused=True), route(q, k, v, beta, 64, "exact", 1, fused=False)
        assert all(torch.equal(a[x], b[x]) for x in ("keep", "idx", "nkept")), "fused routing differs"
        fused, plain = [], []
        for _ in range(7):
            fused.append(_time(lambda: route(q, k, v, beta, 64, "exact", 1, fused=True), dev))
            plain.append(_time(lambda: route(q, k, v, beta, 64, "exact", 1, fused=False), dev))
        print(f"{name} ({n} tokens) beta {beta}: density {float(a['density']):.4f}; routing fused "
              f"{statistics.median(fused):.2f} ms {[round(x, 2) for x in fused]}, PyTorch {statistics.median(plain):.2f} ms "
              f"{[round(x, 2) for x in plain]}; x{statistics.median(plain) / statistics.median(fused):.2f}")
PY
cat "$OUT/routing8.log"
python3 -m vidtune.benchmarks.bench_sparse --betas 1.0 1.5 --skip-pass --repeats 3 --out "$OUT/sparse8.json" > "$OUT/sparse8.log" 2>&1
grep -E "beta|x[0-9.]+" "$OUT/sparse8.log" | tail -6
