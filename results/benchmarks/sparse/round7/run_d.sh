#!/usr/bin/env bash
# Round 7d (device tool, one H200): the new default launch (TMA loads, exp2, no value lo part) and the
# routing's compaction by running counts instead of a stable sort; GPU tests, then end to end and the
# 4K ltx2-19b pass.
#   bash results/benchmarks/sparse/round7/run_d.sh     (vidtune and ltx-core on PYTHONPATH; writes $OUT)
set -u
python3 -m pytest -q -m gpu tests/test_sparse_attention.py -p no:cacheprovider > "$OUT/gpu_tests7d.log" 2>&1
tail -3 "$OUT/gpu_tests7d.log"
python3 - > "$OUT/compaction7d.log" 2>&1 <<'PY'
# the compaction alone on the routing mask at 130,560 tokens, beta 1.0: stable argsort vs kept_first
import statistics, torch
from vidtune.benchmarks.bench_sparse import SEQUENCES, _inputs, _time
from vidtune.kernels.sol_attention import route_blocks

def kept_first(keep):  # the compaction tried in round 7 (removed from kernels/sol_triton.py after this run)
    k32 = keep.to(torch.int32)
    nkept = k32.sum(-1, dtype=torch.int32)
    kept_pos = k32.cumsum(-1, dtype=torch.int32) - 1
    rejected_pos = nkept[..., None] + (1 - k32).cumsum(-1, dtype=torch.int32) - 1
    pos = torch.where(keep, kept_pos, rejected_pos).long()
    cols = torch.arange(keep.shape[-1], dtype=torch.int32, device=keep.device).expand_as(k32)
    return torch.empty_like(k32).scatter_(-1, pos, cols), nkept
dev = torch.device("cuda")
q, k, v = _inputs(SEQUENCES["3840x2176x121"], 32, 128, dev)
keep, _, _ = route_blocks(q, k, 1.0, 64, "exact", 1)
flat = keep.reshape(32, -1, keep.shape[-1])
sort = lambda: torch.argsort((~flat).to(torch.int8), dim=-1, stable=True).to(torch.int32)
assert torch.equal(sort(), kept_first(flat)[0])
a, b = [], []
for _ in range(5):
    a.append(_time(sort, dev)); b.append(_time(lambda: kept_first(flat), dev))
print("stable argsort ms", a, "median", statistics.median(a))
print("kept_first ms", b, "median", statistics.median(b))
PY
cat "$OUT/compaction7d.log"
python3 -m vidtune.benchmarks.bench_sparse --sweep 7d --betas 1.0 1.5 --pass-betas 1.0 --pass-repeats 2 --repeats 3 \
  --out "$OUT/sparse7d.json" > "$OUT/sparse7d.log" 2>&1
grep -E "^sweep|x[0-9.]+" "$OUT/sparse7d.log" | tail -9
