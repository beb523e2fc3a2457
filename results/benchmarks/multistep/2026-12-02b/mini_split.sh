# ltx2-mini, multistep (the official schedule, 40 guided steps), default request 256x384x17, CPU: the guidance
# cache's frequency split (split=fft) against plain reuse at interval 3 from step 10 (2026-12-02/i3_s10_reuse.json),
# one generation each against the stored multistep baseline. Four more cases (high_gain 0.8, interval 4 with
# either gain, plain reuse again) were stopped for time.
cd /work/main
out=results/benchmarks/multistep/2026-12-02b
evaluate() {  # NAME GAIN_KNOB=VALUE
  .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results name=ms \
    eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs caching.guidance_cache.interval=3 \
    caching.guidance_cache.start=10 caching.guidance_cache.split=fft "caching.guidance_cache.$2" > "$out/$1.json"
}
evaluate i3_s10_fft_low1.2 low_gain=1.2
evaluate i3_s10_fft_high1.2 high_gain=1.2
evaluate i3_s10_fft_low0.8 low_gain=0.8
