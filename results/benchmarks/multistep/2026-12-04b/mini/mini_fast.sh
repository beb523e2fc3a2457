# ltx2-mini multistep (the official schedule), default request 256x384x17 seed 0, CPU: quality of faster
# stage-1 schedules than `best` (issue 26's >= 3.0x on the H200), each against the stored multistep baseline
# on raw uint8 frames. One generation per setting; a setting whose JSON exists is not run again.
# The stage-1 work of a schedule (batched rows, the STG row from block 29 of 48) relative to the baseline's 160
# passes: `best` (skip every 3, guidance cache interval 2 from step 5) 0.43; the cases below 0.29-0.34.
cd "$(dirname "$0")/../../../../.."
out=results/benchmarks/multistep/2026-12-04b/mini
. results/benchmarks/multistep/mini_cases.sh
RC="caching.guidance_cache.refresh=computed"
gc() { echo "caching.guidance_cache.interval=$2 caching.guidance_cache.start=$1"; }
skip() { echo "caching.step_skip.every=$1 caching.step_skip.first_kept=$2 caching.step_skip.stage=stage1"; }
cases=(
  # (skip every, first kept, guidance cache start, interval): stage-1 work
  "i4:$(skip 3 1) $(gc 5 4) $BG $PFX $FP8"            # (3, 1, 5, 4): 0.34
  "i4_all:$(skip 3 1) $(gc 5 4) $BG $PFX $FP8ALL"     # the same, FP8 on all block linears
  "i3s6:$(skip 3 1) $(gc 6 3) $BG $PFX $FP8"          # (3, 1, 6, 3): 0.31
  "k2i3s4:$(skip 3 2) $(gc 4 3) $BG $PFX $FP8"        # (3, 2, 4, 3): 0.29
  "sk4i4s4:$(skip 4 1) $(gc 4 4) $BG $PFX $FP8"       # (4, 1, 4, 4): 0.32
  # caching.guidance_cache.refresh=computed (this commit): a refresh on a skipped step is deferred to the next
  # step that runs, and skipped steps reuse the guidance passes. Work with it (full steps of 29):
  "i3s6_rc:$(skip 3 1) $(gc 6 3) $RC $BG $PFX $FP8"    # 0.43 (17 full steps; 6 without the knob)
  "i4_all_rc:$(skip 3 1) $(gc 5 4) $RC $BG $PFX $FP8ALL"   # 0.38 (14; fast: 11)
  "i5_all_rc:$(skip 3 1) $(gc 5 5) $RC $BG $PFX $FP8ALL"   # 0.36 (12)
  "i6_all_rc:$(skip 3 1) $(gc 5 6) $RC $BG $PFX $FP8ALL"   # 0.34 (11, as fast)
  # 2026-12-04/mini's best and high_fp8 again on this session's CPU (AVX512-BF16: bf16 convolutions run natively,
  # where that session's AVX2 CPU upcast them), so the comparison with the cases above is on one machine
  "best_c:$(skip 3 1) $(gc 5 2) $BG $PFX $FP8 $COMPILE $VAE"
  "high_fp8_c:$(gc 5 2) $BG $PFX $FP8 $COMPILE $VAE"
)
[ -n "${COMPILED:-}" ] && cases=("${COMPILED}_c:${COMPILED_KNOBS} $COMPILE $VAE")
run_cases "${cases[@]}"
