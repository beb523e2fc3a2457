# ltx2-mini quality of the 4K config's stage-2 thin tiles (CPU), 512x768x33 (stage-2 latent 16 x 24: the
# smallest default-like request a 2 x 2 grid with overlap 4 fits; 256x384 is 8 x 12, too small for it)
cd /work/main
for case in "thin_tiles:tiling.stage2_tiles.rows=2 tiling.stage2_tiles.cols=2 tiling.stage2_tiles.overlap=4" \
            "sol_both_125:sparse_attention.sol.beta=1.25 sparse_attention.sol.stages=both" \
            "sol_both_125_thin_tiles:sparse_attention.sol.beta=1.25 sparse_attention.sol.stages=both tiling.stage2_tiles.rows=2 tiling.stage2_tiles.cols=2 tiling.stage2_tiles.overlap=4"; do
  name=${case%%:*}; knobs=${case#*:}
  .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.height=512 request.width=768 request.frames=33 \
    results_dir=/tmp/mq/results name=mq eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs $knobs \
    > results/benchmarks/whole_generation/2026-12-02/mini_quality/$name.json 2> /tmp/mq/$name.log
  echo "$name rc=$?"
done
