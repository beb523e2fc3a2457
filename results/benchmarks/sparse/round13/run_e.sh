#!/usr/bin/env bash
# Round 13e: Q read once into registers (q_regs; S = Q K^T reads only K from shared memory) against Q
# from shared memory: GPU tests of both, the kept part alone and Sol end to end (fused correction) at
# 130,560 tokens, beta 1.0 and 1.25, interleaved, 7 repeats after a warm-up, with cuDNN dense.
#   call 1: carry [".dw5/0"]  command: mkdir -p /tmp/vt-chunks && cp .dw5/0/chunk /tmp/vt-chunks/0
#   call 2: carry [".dw5/1"]  command: bash results/benchmarks/sparse/round13/run_e.sh
set -u
source results/benchmarks/sparse/round13/install.sh
timeout 240 python3 -m pytest -q tests/test_sol_cute.py -p no:cacheprovider > "$OUT/gpu_tests13e.log" 2>&1
tail -2 "$OUT/gpu_tests13e.log"
timeout 300 python3 - > "$OUT/sweep13e.log" 2>&1 <<'PY'
import json, statistics, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from vidtune.benchmarks.bench_sparse import _inputs, _time
from vidtune.kernels import sol_cute
from vidtune.kernels.sol_triton import route
dev = torch.device("cuda")
q, k, v = _inputs(130_560, 32, 128, dev)
def dense():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
def with_q_regs(flag, fn):
    def run():
        sol_cute.CUTE_LAUNCH["q_regs"] = flag
        return fn()
    return run
rows = {}
for beta in (1.0, 1.25):
    r = route(q, k, v, beta, 64, "exact", 1)
    fns = {"dense_cudnn": dense}
    for flag in (False, True):
        fns[f"kept q_regs={flag}"] = with_q_regs(flag, lambda: sol_cute.kept_attention_cute(q, k, v, r))
        fns[f"sol q_regs={flag}"] = with_q_regs(flag, lambda: sol_cute.sol_attention_cute(q, k, v, beta))
        outs = [fns[f"kept q_regs={flag}"]()[0], fns[f"sol q_regs={flag}"]()[0]]  # compile
    times = {key: [] for key in fns}
    for _ in range(7):
        for key, fn in fns.items():
            times[key].append(_time(fn, dev))
    med = {key: statistics.median(t) for key, t in times.items()}
    for key, t in times.items():
        extra = f" x{med['dense_cudnn'] / med[key]:.2f}" if key.startswith("sol") else ""
        print(f"beta {beta} {key}: median {med[key]:.2f} ms {[round(x, 2) for x in t]}{extra}", flush=True)
    rows[str(beta)] = {"density": float(r["density"]), "times_ms": times}
json.dump(rows, open("/tmp/sweep13e.json", "w"), indent=1)
PY
cp /tmp/sweep13e.json "$OUT/" 2>/dev/null
grep -E "beta|Error" "$OUT/sweep13e.log"
