#!/usr/bin/env bash
# Round 3 (device tool, two H200s): `vidtune bench --nproc 2` and `vidtune parallel-check --nproc 2` on
# NCCL, the measurement path a deployment uses (warm-up, then baseline and setting alternated, timed on
# rank 0 across the group). Each command has its own time limit so one that hangs does not take the rest.
#   bash results/benchmarks/parallel/round3/run.sh   (vidtune, ltx-core, PyAV, hydra on PYTHONPATH; writes $OUT)
set -u
run() {  # name, limit_s, args...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m vidtune.cli "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc $? in $((SECONDS - t0)) s"; tail -c 1500 "$OUT/$name.json"
}
# the default model (ltx2-mini, 256x384x33): stage-2 tiles over two GPUs
run bench_mini_tile2 120 bench --nproc 2 --repeats 5 --knobs parallelism.tile_parallel.degree=2
# every strategy against one process, NCCL
run parallel_check 100 parallel-check --nproc 2
# ltx2-19b (random bf16 weights) at 1536x1024x121: sequence parallel over two GPUs, whole generations
run bench_19b_seq2 290 bench --nproc 2 --repeats 3 model=ltx2-19b request.height=1024 request.width=1536 \
  request.frames=121 --knobs parallelism.sequence_parallel.degree=2
