# ltx2-mini, multistep (the official schedule, 40 guided steps), default request 256x384x17, CPU: the guidance
# cache against the multistep baseline (quality and, on this 2-core CPU, latency of one generation)
cd /work/main
out=results/benchmarks/multistep/2026-12-02
for case in "i2_s10_reuse:interval=2 start=10" "i3_s10_reuse:interval=3 start=10" "i2_s5_reuse:interval=2 start=5" \
            "i2_s20_drop:interval=2 start=20 mode=drop" "i4_s10_reuse:interval=4 start=10"; do
  name=${case%%:*}; knobs=""
  for kv in ${case#*:}; do knobs="$knobs caching.guidance_cache.$kv"; done
  .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results name=ms \
    eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs $knobs > $out/$name.json 2> /tmp/ms_$name.log
  echo "$name rc=$?"
done
# batched guidance passes (kernel_choice.batched_guidance), alone
.venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results name=ms \
  eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs kernel_choice.batched_guidance.enabled=true \
  > $out/batched.json 2> /tmp/ms_batched.log
echo "batched rc=$?"
# through bench (A B, B A), each alone and together
for case in "bench_batched:kernel_choice.batched_guidance.enabled=true" \
            "bench_gcache_i2_s5:caching.guidance_cache.interval=2 caching.guidance_cache.start=5" \
            "bench_batched_gcache_i2_s5:kernel_choice.batched_guidance.enabled=true caching.guidance_cache.interval=2 caching.guidance_cache.start=5"; do
  name=${case%%:*}
  .venv/bin/python -m vidtune.cli bench model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results name=ms \
    compile_cache=false --repeats 2 --knobs ${case#*:} > $out/$name.json 2> $out/$name.log
done
