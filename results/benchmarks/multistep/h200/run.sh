#!/usr/bin/env bash
# Issue 26's whole-generation target on one H200: ltx2-19b, 1536x1024x121, request.mode=multistep (the official
# schedule: 40 guided stage-1 steps of 4 passes, then the distilled stage 2), through `vidtune bench`.
# Written 2026-12-02; combo and the parts ran 2026-12-03 (../2026-12-03, README beside this folder); combo_compile
# not run yet.
#
#   ../shared/tools/device-wheels .dws --slim flip-evaluator==1.7        # here, once (42 MB)
#   (take results/ out of the working tree for the call: tree 20 MB + wheels 42 MB < 64 MiB)
#   device call: carry [".dws"]  command: bash results/benchmarks/multistep/h200/run.sh CASE
#
# CASE combo: the combination alone, A B, B A (3 baseline + 3 setting generations; ~400 s if a multistep
#   baseline generation is ~85 s, the estimate from the distilled numbers: the first thing this call measures);
# CASE parts: the guidance cache, batched passes, step skip and FP8 + SDPA backends each against the same
#   baseline runs, one round (bench --also: A B gc bg, then nothing: REPEATS=1).
# Quality of the same knob values comes from ltx2-mini multistep on the CPU (../2026-12-02c, README beside this
# folder: the combination 39.1 dB, worst frame 34.4 dB; the guidance cache alone 45.5 dB); the random 19B weights
# give latency only.
set -u
case_=${1:-combo}
# (or the full set, installed already by `benchmarks/device_campaign.sh install K` in the same call)
[ -d /tmp/site/ltx_core ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dws/whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
GC="caching.guidance_cache.interval=2,caching.guidance_cache.start=5"
BG="kernel_choice.batched_guidance.enabled=true"
GC4="caching.guidance_cache.interval=4,caching.guidance_cache.start=5"
RC="caching.guidance_cache.refresh=computed"
SKIP="caching.step_skip.every=3,caching.step_skip.stage=stage1"
PFX="caching.stg_prefix.enabled=true"
FB="caching.first_block.threshold=0.1"
TC="caching.teacache.threshold=0.1"
VAE="kernel_choice.vae_decode.compile=default,kernel_choice.vae_decode.channels_last=true,kernel_choice.vae_decode.cudnn_benchmark=true,tiling.vae_tiles.spatial_px=768,tiling.vae_tiles.spatial_overlap_px=64,tiling.vae_tiles.temporal_frames=128,tiling.vae_tiles.temporal_overlap_frames=24"
SDPA="kernel_choice.sdpa_backend.video_self=cudnn,kernel_choice.sdpa_backend.audio_self=flash,kernel_choice.sdpa_backend.a2v=cudnn"
FP8="kernel_choice.fp8_linear.layers=feed_forward,kernel_choice.fp8_linear.quantiser=traced,$SDPA"
FP8ALL="kernel_choice.fp8_linear.layers=all,kernel_choice.fp8_linear.quantiser=traced,$SDPA"
export BENCH_OVERRIDES="quality_model.model=self eval.warmup=0 request.mode=multistep"
export BENCH_FLAGS="--no-rewarm --reference run"
export BENCH_LIMIT_S=${BENCH_LIMIT_S:-555}
case "$case_" in
  combo) REPEATS=2 bash benchmarks/device_bench.sh "bench:ms_combo:1024x1536x121:$GC,$BG,$SKIP,$FP8" ;;
  # the combination compiled (static shapes): the one per-pass gain left on one GPU (compile + FP8 1.35x a pass on
  # the distilled 1536x1024 pass). Composes on tiny multistep (CPU, 2026-12-03: no graph compiled while timed, 29 of
  # 40 steps run, 51 of 120 guidance passes reused); the 19B's static compile warmed up in ~41 s in campaign
  # h200-19b-1536c, so the call fits (~470 s estimated)
  combo_compile) REPEATS=2 bash benchmarks/device_bench.sh \
           "bench:ms_combo_compile:1024x1536x121:$GC,$BG,$SKIP,$FP8,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false" ;;
  # caching.stg_prefix (exact: the STG pass runs blocks 29-47 only, from the conditional pass's tokens) alone as
  # the setting, the combination with it and without it as --also, one round: A B combo_p combo
  prefix) REPEATS=1 BENCH_FLAGS="$BENCH_FLAGS --also combo_p:$PFX,$GC,$BG,$SKIP,$FP8 --also combo:$GC,$BG,$SKIP,$FP8" \
           bash benchmarks/device_bench.sh "bench:ms_prefix:1024x1536x121:$PFX" ;;
  # the combination with the prefix, compiled (static shapes: batch 1, 3 and 4 graphs), A B
  prefix_compile) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_prefix_compile:1024x1536x121:$PFX,$GC,$BG,$SKIP,$FP8,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false" ;;
  # issue 26 item 3's residual caches on the multistep pipeline: first_block 0.1 as the setting, --also teacache
  # 0.1, one round (A B tc), eager. (With the batched guidance passes first_block reused 3 of 40 steps on ltx2-mini:
  # a batch's rows change together more than one pass does, so the combination is not timed with it.)
  # On ltx2-mini multistep (2026-12-04/mini): first_block 0.1 44.2 dB (67 of 160 passes reused), teacache 0.1
  # 40.2 dB (84 reused); on the random 19B weights their thresholds reuse what they reuse (the JSON counts it)
  caches) REPEATS=1 BENCH_FLAGS="$BENCH_FLAGS --also tc:$TC" \
           bash benchmarks/device_bench.sh "bench:ms_caches:1024x1536x121:$FB" ;;
  # combo_p compiled, with the VAE decode knobs of the whole-generation configs (decoder compiled, channels-last,
  # cuDNN tuned; 768 px tiles), A B
  best) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_best:1024x1536x121:$PFX,$GC,$BG,$SKIP,$FP8,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false,$VAE" ;;
  # the `high`-tier point on ltx2-mini (2026-12-04/mini high_fp8: worst FLIP 0.047): best without step skip, A B
  high) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_high:1024x1536x121:$PFX,$GC,$BG,$FP8,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false,$VAE" ;;
  # the same eager (no compile, no decode knobs: fits a short call), one A B round
  high_eager) REPEATS=1 bash benchmarks/device_bench.sh "bench:ms_high_eager:1024x1536x121:$PFX,$GC,$BG,$FP8" ;;
  # faster stage-1 schedules for issue 26's >= 3.0x (ltx2-mini quality: ../2026-12-04b/mini, the `balanced`
  # tier): guidance cache interval 4 from step 5 with step skip every 3 (its refresh steps 5, 9, ..., 37 fall
  # on skipped steps at 9, 21, 33, so 11 steps run all four rows: 0.34 of the baseline's stage-1 work against
  # best's 0.43). fast: FP8 on all block linears, compiled static, VAE decode knobs, A B (B A with REPEATS=2);
  # measured 2026-12-04 with REPEATS=2: 3.40x (21.2 s against 72.0 s), ~555 s a call; high: 1.99x, one round, 437 s
  fast) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_fast:1024x1536x121:$PFX,$GC4,$BG,$SKIP,$FP8ALL,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false,$VAE" ;;
  # the same schedule with FP8 on the feed-forward only (better on ltx2-mini: 34.0 against 31.6 dB)
  fast_ff) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_fast_ff:1024x1536x121:$PFX,$GC4,$BG,$SKIP,$FP8,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false,$VAE" ;;
  # with caching.guidance_cache.refresh=computed (a refresh on a skipped step deferred to the next step that runs):
  # high_rc, interval 3 from step 6 (17 full steps of 29 as in best; ltx2-mini compiled: 40.5 dB, worst FLIP 0.049,
  # the high tier); fast_rc, interval 6 from step 5 with FP8 all (11 full steps as in fast; 33.1 dB). Not run yet
  high_rc) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_high_rc:1024x1536x121:$PFX,$RC,caching.guidance_cache.interval=3,caching.guidance_cache.start=6,$BG,$SKIP,$FP8,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false,$VAE" ;;
  fast_rc) REPEATS=${REPEATS:-1} bash benchmarks/device_bench.sh \
           "bench:ms_fast_rc:1024x1536x121:$PFX,$RC,caching.guidance_cache.interval=6,caching.guidance_cache.start=5,$BG,$SKIP,$FP8ALL,kernel_choice.compile.mode=default,kernel_choice.compile.dynamic=false,$VAE" ;;
  parts) REPEATS=1 BENCH_FLAGS="$BENCH_FLAGS --also gc:$GC --also bg:$BG" \
           bash benchmarks/device_bench.sh "bench:ms_parts:1024x1536x121:$FP8" ;;
  *) echo "unknown case $case_ (combo, combo_compile, prefix, prefix_compile, caches, best, high, high_eager, fast, fast_ff, high_rc, fast_rc, parts)" >&2; exit 2 ;;
esac
tail -12 "${OUT:-/tmp/out}"/bench_ms_*.log
