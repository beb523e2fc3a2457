# ltx2-mini, multistep (the official schedule, 40 guided steps), default request 256x384x17, CPU: the guidance
# cache's frequency split (split=fft) against plain reuse at the settings where plain reuse lost most (interval
# 3 and 4 from step 10; 2026-12-02/i3_s10_reuse.json, i4_s10_reuse.json), one generation each against the stored
# multistep baseline
cd /work/main
out=results/benchmarks/multistep/2026-12-02b
for case in "i3_s10_fft_low1.2:interval=3 start=10 split=fft low_gain=1.2" \
            "i3_s10_fft_high1.2:interval=3 start=10 split=fft high_gain=1.2" \
            "i3_s10_fft_low0.8:interval=3 start=10 split=fft low_gain=0.8" \
            ; do  # (4 more cases, i3 high 0.8, i4 low/high 1.2 and i3 plain, were stopped for time: see README)
  name=${case%%:*}; knobs=""
  for kv in ${case#*:}; do knobs="$knobs caching.guidance_cache.$kv"; done
  .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.mode=multistep results_dir=/tmp/ms/results name=ms \
    eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs $knobs > $out/$name.json 2> /tmp/ms_$name.log
  echo "$name rc=$?"
done
