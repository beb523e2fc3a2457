# Sourced by the dated ltx2-mini multistep scripts (2026-12-04/mini/mini_caches.sh, 2026-12-04b/mini/mini_fast.sh):
# the knob groups they share, and the loop that evaluates each "name:knobs" case once (a case whose JSON exists
# in $out is not run again) with `vidtune evaluate` against the stored multistep baseline (256x384x17, seed 0).
BG="kernel_choice.batched_guidance.enabled=true"
PFX="caching.stg_prefix.enabled=true"
FP8="kernel_choice.fp8_linear.layers=feed_forward kernel_choice.fp8_linear.quantiser=traced"
FP8ALL="kernel_choice.fp8_linear.layers=all kernel_choice.fp8_linear.quantiser=traced"
COMPILE="kernel_choice.compile.mode=default kernel_choice.compile.dynamic=false"
VAE="kernel_choice.vae_decode.compile=default kernel_choice.vae_decode.channels_last=true kernel_choice.vae_decode.cudnn_benchmark=true"

run_cases() {  # out=DIR run_cases "name:knobs" ...
  local case name
  for case in "$@"; do
    name=${case%%:*}
    [ -s "$out/$name.json" ] && continue
    # shellcheck disable=SC2086
    .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results \
      name=ms eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs ${case#*:} \
      > "$out/$name.json" 2> "$out/$name.log"
    echo "$name rc=$?"
  done
}
