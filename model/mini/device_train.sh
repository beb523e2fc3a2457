#!/usr/bin/env bash
# Train ltx2-mini on one H200 without network (docs/offline-gpu.md), in runs of under 10 minutes.
#   bash model/mini/device_train.sh A 420   # video VAE, audio VAE and vocoder side by side (420 s each)
#   bash model/mini/device_train.sh B 420   # upsampler and transformer (+ text encoder) side by side
#   bash model/mini/device_train.sh C       # export (bf16, <= 20 MB), copied to $OUT with the logs
#   bash model/mini/device_train.sh ABC 270 240   # all in one call: A for 270 s, then B for 240 s, then C
#   bash model/mini/device_train.sh ITC 480   # one call: import the shipped weights (unless a held
#                                                 # machine still has the run), transformer alone, export
#   bash model/mini/device_train.sh IABC 220 260  # one call: import, then A, B and C (continue every component)
#   bash model/mini/device_train.sh IGC 500   # one call: import; guidance + trajectory distillation of the
#                                                 # transformer (G) from the teacher in $TEACHER; export
#     The teacher is undistilled: an export folder, or a folder with teacher.safetensors (its transformer and
#     text encoder, 5.9 MB). The shipped weights are distilled since the fifth checkpoint, so bring the
#     fourth checkpoint (13,468 flow-matching steps) from git, here, before the call:
#       mkdir -p /tmp/t4 && for f in model.safetensors spatial_upsampler.safetensors; do
#         git show 55e8c7c:model/mini/weights/$f > /tmp/t4/$f; done
#       python -m vidtune.model.mini.train teacher --to /tmp/t4 --out .teacher
#       TEACHER=.teacher bash model/mini/device_train.sh IGC 450   (carry .whl and .teacher; the call carries
#       64 MiB: delete results/campaigns/h200-ltx2-19b/report.html.xz and results/mini/contact_sheet.png
#       from the working tree for the call, then git checkout them)
#   bash model/mini/device_train.sh IDBC 450      # one call: import; the video decoder alone (encoder frozen)
#                                                 # beside B (upsampler, transformer) for 450 s; export
#   LR_FAN_IN=0.03 COLOUR_CAST=0.3 bash model/mini/device_train.sh IRBC 300 240   # one call: import; a
#                                                 # fresh video VAE (R, 300 s; optional per-layer rates and
#                                                 # colour casts), then B on its latent, export
# The evidence (python -m vidtune.model.mini.evidence) runs on the CPU afterwards, at no device time.
# Run state lives in runs/mini (ignored by git; it stays on the device machine while it is held). To
# continue in a later session, phase I imports the shipped weights back into run states first.
# Each phase appends the training log to $OUT. Needs the ltx-core wheels on PYTHONPATH (.whl, README).
set -euo pipefail
phase=${1:?phase A, B, D, R, T, G, C, ABC, IABC, IDBC, IRBC, ITC, IGC or I}
budget=${2:-420}
if [ "$phase" = ITC ]; then  # continue the transformer from the shipped checkpoint (VAEs frozen)
  [ -f runs/mini/transformer.pt ] || bash "$0" I
  bash "$0" T "$2" "$2"; exec bash "$0" C
fi
if [ "$phase" = IGC ]; then  # distil the transformer from the teacher (VAEs frozen)
  [ -f runs/mini/transformer.pt ] || bash "$0" I
  teacher=${TEACHER:-runs/mini/teacher}
  [ -f "$teacher/model.safetensors" ] || [ -f "$teacher/teacher.safetensors" ] || cp -r model/mini/weights "$teacher"
  bash "$0" G "$2" "$2"; exec bash "$0" C
fi
if [ "$phase" = IABC ]; then  # continue everything from the shipped checkpoint in one call
  [ -f runs/mini/video_vae.pt ] || bash "$0" I
  exec bash "$0" ABC "$2" "$3"
fi
if [ "$phase" = IDBC ]; then  # continue from the shipped checkpoint with the latent space fixed
  [ -f runs/mini/video_vae.pt ] || bash "$0" I
  bash "$0" D "$2" "$2" & bash "$0" B "$2" "$2" & wait; exec bash "$0" C
fi
if [ "$phase" = IRBC ]; then  # import the rest, retrain the video VAE from fresh weights, then B on its latent
  [ -f runs/mini/audio_vae.pt ] || bash "$0" I
  bash "$0" R "$2" "$2"; bash "$0" B "$3" "$3"; exec bash "$0" C
fi
if [ "$phase" = ABC ]; then  # one call: the learning-rate schedules end with this call's budgets
  bash "$0" A "$2" "$2"; bash "$0" B "$3" "$3"; exec bash "$0" C
fi
schedule=${3:-}
run=runs/mini
out=${OUT:-/tmp/out}
mkdir -p "$run" "$out"
export PYTHONUNBUFFERED=1
train() {  # component, extra args...
  local c=$1; shift
  python3 -m vidtune.model.mini.train "$c" --out "$run" --device "${DEVICE:-cuda}" --time-budget "$budget" --save-every 500 \
    --log-every 50 "$@" > "$out/train_$c.log" 2>&1
}
# video VAE --chroma 1: the first H200 VAE decoded everything in grey (see TrainConfig.chroma); the log's
# "saturation" (reconstruction's colour range over the clip's) shows whether colour comes back.
# --colour-weight 10 (COLOUR_WEIGHT; TrainConfig.colour_weight) is what finally kept the colour
# (results/mini/checks/video_vae_grey_6.md); 0 turns it off.
# transformer lr 1e-3, not 3e-4: on the CPU, from the shipped checkpoint, on a fixed batch of two clips
# the video flow-matching MSE after 300 steps was 0.33 at 1e-3 against 0.62-0.75 at 3e-4
# (results/mini/checks/); these runs are ~10^4 steps long, where the larger rate pays.
case "$phase" in
  I) python3 -m vidtune.model.mini.train import --out "$run" --to model/mini/weights \
       --audio-encoder results/mini/audio_encoder.safetensors ;;
  A) train video_vae --steps 200000 --schedule ${schedule:-1200} --batch 6 --frames 17 --lr 3e-4 --chroma 1 \
       --colour-weight "${COLOUR_WEIGHT:-10}" &
     train audio_vae --steps 200000 --schedule ${schedule:-800} --batch 16 --frames 33 --lr 4e-4 &
     train vocoder --steps 200000 --schedule ${schedule:-800} --batch 16 --frames 33 --lr 4e-4 &
     wait ;;
  B) train upsampler --steps 200000 --schedule ${schedule:-600} --batch 8 --frames 17 --lr 4e-4 --reuse 2 &
     train transformer --steps 400000 --schedule ${schedule:-1200} --batch "${BATCH:-64}" --frames 33 --lr 1e-3 --reuse 4 &
     wait ;;
  # the decoder alone: the encoder, hence the latent space phase B learns, stays as it is (TrainConfig.freeze_encoder)
  D) train video_vae --steps 200000 --schedule ${schedule:-1200} --batch 6 --frames 17 --lr 3e-4 --chroma 1 \
       --freeze-encoder 1 --colour-weight "${COLOUR_WEIGHT:-10}" ;;
  # a fresh video VAE, optionally with per-layer rates (LR_FAN_IN: TrainConfig.lr_fan_in) and colour
  # casts (COLOUR_CAST: TrainConfig.colour_cast); neither has fixed the grey decoder so far
  # (results/mini/checks/video_vae_grey_4.md), so both default to off
  R) rm -f "$run/video_vae.pt"
     train video_vae --steps 200000 --schedule ${schedule:-1200} --batch 6 --frames 17 --lr 3e-4 --chroma 1 \
       --lr-fan-in "${LR_FAN_IN:-0}" --colour-cast "${COLOUR_CAST:-0}" --colour-weight "${COLOUR_WEIGHT:-10}" ;;
  # BATCH: the transformer's batch, default 64: on one H200 (results/mini/training/call5/ab_batch.json, 35 s
  # each) batch 16, 32, 64 ran 9.2, 9.1, 6.1 steps/s, i.e. 147, 290, 392 clips/s (launch-bound below 64)
  # --restart-schedule 1: one cosine over this call's schedule, also on a held machine whose run continued
  # from an earlier call (call 6 of 2026-11-30 trained at the 2% floor without it: results/mini/training/call6)
  T) train transformer --steps 400000 --schedule ${schedule:-1200} --batch "${BATCH:-64}" --frames 33 --lr 1e-3 --reuse 4 \
       --restart-schedule 1 ;;
  # G: guidance + trajectory distillation (TrainConfig.distill_cfg): the student's step over each interval of
  # the distilled schedules lands where the teacher's CFG-7 Euler substeps land; lr 5e-4 (DISTILL_LR),
  # below flow matching's 1e-3 because the student starts at the teacher and moves toward a nearby target
  G) train transformer --steps 400000 --schedule ${schedule:-1200} --batch "${BATCH:-64}" --frames 33 \
       --lr "${DISTILL_LR:-5e-4}" --reuse 4 --restart-schedule 1 --distill-cfg "${DISTILL_CFG:-7}" \
       --teacher "${TEACHER:-runs/mini/teacher}" ;;
  C) python3 -m vidtune.model.mini.train export --out "$run" --to model/mini/weights > "$out/export.json"
     cp "$run/audio_encoder.safetensors" "$out/"
     # the main file is over the 16 MiB a returned file may have: it comes back in two pieces
     split -b 15M -d model/mini/weights/model.safetensors "$out/model.safetensors.part"
     cp model/mini/weights/spatial_upsampler.safetensors "$out/"
     # at most 8 files come back: the logs travel as one archive
     tar czf "$out/logs.tar.gz" -C "$out" $(cd "$out" && ls *.log export.json)
     tail -n 3 "$out"/*.log; rm -f "$out"/*.log "$out/export.json"; ls -la "$out"; exit 0 ;;
  *) echo "phase must be A, B, D, R, T, G, C, ABC, IABC, IDBC, IRBC, ITC, IGC or I" >&2; exit 2 ;;
esac
tail -n 3 "$out"/*.log || true
