# ltx2-mini multistep (the official schedule), default request 256x384x17 seed 0, CPU: quality of the per-pass
# residual caches (issue 26 item 3: first_block / teacache on the multistep pipeline), of FP8 on all block
# linears and of the H200's combinations, each against the stored multistep baseline on raw uint8 frames. One
# generation per setting; a setting whose JSON exists is not run again.
cd "$(dirname "$0")/../../../../.."
out=results/benchmarks/multistep/2026-12-04/mini
. results/benchmarks/multistep/mini_cases.sh
GC="caching.guidance_cache.interval=2 caching.guidance_cache.start=5"
SKIP="caching.step_skip.every=3 caching.step_skip.stage=stage1"
run_cases "fb05:caching.first_block.threshold=0.05" \
            "fb10:caching.first_block.threshold=0.1" \
            "fb20:caching.first_block.threshold=0.2" \
            "tc10:caching.teacache.threshold=0.1" \
            "tc30:caching.teacache.threshold=0.3" \
            "tc60:caching.teacache.threshold=0.6" \
            "stg_prefix:$PFX" \
            "fp8all:$FP8ALL" \
            `# the 2026-12-03 combination with the first-block cache (0.1) in place of step skip every 3 (no` \
            `# stg_prefix: both patch the block loop). combo_fb10_per_batch.json: the same run while the cache` \
            `# decided per batch, before it decided per row` \
            "combo_fb10:$GC $BG caching.first_block.threshold=0.1 $FP8" \
            `# the same with stg_prefix running inside the first-block cache's loop (a composition rule since` \
            `# the commit that added this case)` \
            "combo_fb10_p:$GC $BG caching.first_block.threshold=0.1 $PFX $FP8" \
            "combo_p_fp8all:$GC $BG $SKIP $PFX $FP8ALL" \
            `# the H200's best setting (h200/run.sh best): what compile's reordered rounding adds (Inductor's CPU` \
            `# code here, not the GPU's kernels)` \
            "best:$GC $BG $SKIP $PFX $FP8 $COMPILE $VAE" \
            `# candidates for a high-tier point: the combination without step skip, with and without FP8` \
            "high_fp8:$GC $BG $PFX $FP8 $COMPILE $VAE" \
            "high:$GC $BG $PFX $COMPILE $VAE"
