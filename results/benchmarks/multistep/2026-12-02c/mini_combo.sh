# ltx2-mini multistep (the official schedule), default request 256x384x17 seed 0, CPU: the quality of the knob
# values results/benchmarks/multistep/h200/run.sh measures on the H200 (random 19B weights: latency only).
# One generation per setting against the stored multistep baseline (raw uint8 frames).
cd "$(dirname "$0")/../../../.."
out=results/benchmarks/multistep/2026-12-02c
GC="caching.guidance_cache.interval=2 caching.guidance_cache.start=5"
BG="kernel_choice.batched_guidance.enabled=true"
FP8="kernel_choice.fp8_linear.layers=feed_forward kernel_choice.fp8_linear.quantiser=traced"
for case in "skip3:caching.step_skip.every=3 caching.step_skip.stage=stage1" \
            "skip2:caching.step_skip.every=2 caching.step_skip.stage=stage1" \
            "fp8:$FP8" \
            "combo_skip3:$GC $BG caching.step_skip.every=3 caching.step_skip.stage=stage1 $FP8" \
            "combo_skip2:$GC $BG caching.step_skip.every=2 caching.step_skip.stage=stage1 $FP8"; do
  name=${case%%:*}
  .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results name=ms \
    eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs ${case#*:} > $out/$name.json 2> $out/$name.log
  echo "$name rc=$?"
done
