#!/usr/bin/env bash
# Round 4 (device tool, two H200s; NOT RUN YET): round 3 again after its fixes.
#   bash results/benchmarks/parallel/round4/run.sh small   # ~5 min: parallel-check, tile_parallel on 2 tiles
#   bash results/benchmarks/parallel/round4/run.sh 19b     # ~9 min: ltx2-19b sequence_parallel, whole generations
# (vidtune, ltx-core, PyAV, hydra on PYTHONPATH; carry .whl and .whl2; writes $OUT). bench prints its
# progress on stderr (*.err), so a run cut at its limit shows where it was.
set -u
run() {  # name, limit_s, args...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m vidtune.cli "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo "$name rc $? in $((SECONDS - t0)) s"; tail -c 1500 "$OUT/$name.out"; tail -n 5 "$OUT/$name.err"
}
case "${1:?small or 19b}" in
  small)
    # the log-sum-exp scenarios against the sharded one-process reference (round 3: 0.188 and 0.203
    # against float32 attention over all keys)
    run parallel_check 150 parallel-check --nproc 2
    # stage 2 in two tiles (one per GPU) on the default model; the baseline has the same two tiles
    run bench_mini_tile2x 200 bench --nproc 2 --repeats 5 eval.stage2_tiles.rows=1 eval.stage2_tiles.cols=2 \
      --knobs parallelism.tile_parallel.degree=2 ;;
  19b)
    # eval.repeats=1: the stored baseline gives bench its reference frames; bench times the baseline
    # itself, interleaved, so the stored baseline's own repeats only cost time (round 3 ran out of it)
    run bench_19b_seq2 540 bench --nproc 2 --repeats 3 model=ltx2-19b request.height=1024 request.width=1536 \
      request.frames=121 eval.repeats=1 --knobs parallelism.sequence_parallel.degree=2 ;;
  *) echo "small or 19b" >&2; exit 2 ;;
esac
