#!/usr/bin/env bash
# Grey video VAE, part 6 (video_vae_grey_6.md): the CPU crop variants of vae_variants_crops.py on whole
# 256x384x9 frames on one H200, all side by side in one device call, each for SECONDS of training.
#   bash results/mini/checks/vae_grey_h200_sweep.sh 420     (needs the ltx-core wheels on PYTHONPATH)
# Writes $OUT/sweep_logs.txt (every variant's log, each line prefixed by its name) and, for the variants
# built only from ltx-core classes, their final weights ($OUT/<name>.safetensors, bf16).
set -uo pipefail
secs=${1:-420}
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/sweep
cd results/mini/checks
# name | environment | variant
runs=(
  "ltx_satw10||satw"
  "plain_satw10|PLAIN=1|satw"
  "ltxenc_plaindec_satw10|PLAIN=dec|satw"
  "plainenc_ltxdec_satw10|PLAIN=enc|satw"
  "ltx_satw30|SATW=30|satw"
  "ltx_gn_satw10|WEIGHTED=1|gn"
  "ltx_base||base"
  "ltx_satw10_lr1e-3|LR=1e-3|satw"
)
for r in "${runs[@]}"; do
  IFS='|' read -r name envs variant <<< "$r"
  save=""
  [[ "$envs" == *PLAIN* ]] || save="SAVE=$out/$name.safetensors"
  env THREADS=2 DEVICE=cuda CROP=0 BATCH=4 FRAMES=9 SECONDS="$secs" EVAL=250 $envs $save \
    python vae_variants_crops.py "$variant" 1000000 > "/tmp/sweep/$name.log" 2>&1 &
done
wait
for r in "${runs[@]}"; do
  name=${r%%|*}
  sed "s/^/$name: /" "/tmp/sweep/$name.log" >> "$out/sweep_logs.txt"
done
