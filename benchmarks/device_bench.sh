#!/usr/bin/env bash
# Whole generations and GPU tests on a GPU machine without network (docs/offline-gpu.md), with `vidtune bench` as the one timer.
#
#   once, on a machine with network: the wheels bench needs (no Ray), with FLIP, into .dw/whl
#   (docs/offline-gpu.md, 41 MB); then on the GPU machine, with .dw/ beside the checkout:
#   bash benchmarks/device_bench.sh STEP [STEP ...]
#
# Where a transfer to the GPU machine is limited in size, copy the code without the recorded results/
# (docs/offline-gpu.md: git archive of the code folders).
# STEPs (each writes its log under $OUT): tests (the reference-clip tests on this machine's CPU, then the
# GPU tests of Sol and compile), or bench:NAME:SIZE:KNOBS (KNOBS comma-separated; SIZE HxWxF), run with
# ltx2-19b; env BENCH_OVERRIDES adds Hydra overrides (e.g. "eval.repeats=1 eval.warmup=0": a baseline of
# two generations, not five), BENCH_FLAGS bench flags (--no-rewarm). The stored baseline and Inductor's caches stay in /tmp while the machine is held, so a later
# call reuses them.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/ltx_core ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dw/whl/*.whl || exit 1
fi
# a source checkout imports as the package (vidtune/__init__.py extends its path to the checkout root)
export PYTHONPATH=$PWD:/tmp/site
for step in "$@"; do
  case "$step" in
    tests)
      CUDA_VISIBLE_DEVICES= timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mini.py -k reference \
        > "$out/tests_cpu_reference_clip.log" 2>&1
      lscpu | grep -i "model name\|flags" | cut -c1-400 >> "$out/tests_cpu_reference_clip.log"
      timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_compile_composes.py \
        tests/test_sparse_attention.py tests/test_vae_decode.py tests/test_sync_free.py > "$out/tests_gpu.log" 2>&1
      ;;
    gputests)
      # -v and the durations: a run cut by its limit still shows which tests finished and what they cost
      # one pytest a file (GPU_TESTS to choose), so that a failure's report is written before a later file
      # runs into the limit
      for t in ${GPU_TESTS:-tests/test_fp8.py tests/test_sync_free.py tests/test_vae_decode.py tests/test_compile_composes.py}; do
        timeout "${BENCH_LIMIT_S:-400}" python3 -m pytest -v -rA --durations=0 --tb=short -p no:cacheprovider -m gpu "$t" \
          >> "$out/tests_gpu.log" 2>&1
        echo "$t: exit status $?" >> "$out/tests_gpu.log"
      done
      ;;
    bench:*|benchcfg:*|generate:*|baseline:*)
      # bench:NAME:SIZE:KNOBS, benchcfg:NAME:SIZE:CONFIG (bench --config), generate:NAME:SIZE:CONFIG
      # (vidtune generate --config: one generation in a new process), baseline:NAME:SIZE (store it only)
      IFS=: read -r kind name size arg <<< "$step"
      IFS=x read -r h w f <<< "$size"
      case "$kind" in
        bench) cmd=(bench --repeats "${REPEATS:-3}" ${BENCH_FLAGS:-} --knobs ${arg//,/ }) ;;
        benchcfg) cmd=(bench --repeats "${REPEATS:-3}" ${BENCH_FLAGS:-} --config "$arg") ;;
        generate) cmd=(generate "out=/tmp/vt-generate/$name" --config "$arg") ;;
        baseline) cmd=(baseline) ;;
      esac
      start=$(date +%s)
      # shellcheck disable=SC2086
      timeout "${BENCH_LIMIT_S:-540}" python3 -m vidtune.cli "${cmd[0]}" model=ltx2-19b "request.height=$h" \
        "request.width=$w" "request.frames=$f" results_dir=/tmp/vt-results name=wg ${BENCH_OVERRIDES:-} \
        "${cmd[@]:1}" > "$out/${kind}_$name.json" 2> "$out/${kind}_$name.log"
      echo "exit status $? after $(( $(date +%s) - start )) s" >> "$out/${kind}_$name.log"
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$out/gpu.txt" 2>&1
ls -la /tmp/vt-results/wg/baseline 2>/dev/null >> "$out/gpu.txt"
