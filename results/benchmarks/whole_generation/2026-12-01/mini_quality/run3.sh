cd /work/main
T="tiling.vae_tiles.spatial_px=768 tiling.vae_tiles.spatial_overlap_px=64 tiling.vae_tiles.temporal_frames=128 tiling.vae_tiles.temporal_overlap_frames=24"
V="kernel_choice.vae_decode.compile=default kernel_choice.vae_decode.channels_last=true kernel_choice.vae_decode.cudnn_benchmark=true"
for case in "L_vae_tiles_768:$T" "L_vae_knobs_tiles_768:$V $T"; do
  name=${case%%:*}; knobs=${case#*:}
  .venv/bin/python -m vidtune.cli evaluate model=ltx2-mini request.height=512 request.width=768 request.frames=33 results_dir=/tmp/mq/results name=mqL eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs $knobs > /tmp/mq/$name.json 2> /tmp/mq/$name.log
  echo "$name rc=$?"
done
