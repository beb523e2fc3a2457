#!/usr/bin/env bash
# Transformer batch size A/B on the device, then continue training at the chosen batch, then export.
#   bash results/mini/checks/transformer_batch_ab.sh 35 "16 32 64" 360
# Each batch trains from the same imported state (a copy of runs/mini) for SECONDS; the log's steps and
# seconds give steps/s and clips/s. The choice: the batch with the most clips/s among those keeping at
# least half of batch 16's steps/s (a step of 4x the clips is worth at least 2 steps of 1x when the
# flow-matching gradient is noise-dominated; the rule is stated here, not measured). Then
# `BATCH=<choice> device_train.sh T TRAIN_SECONDS` on runs/mini and the export (phase C).
set -euo pipefail
secs=${1:-35}; batches=${2:-16 32 64}; train_s=${3:-360}
out=${OUT:-/tmp/out}; mkdir -p "$out"
[ -f runs/mini/transformer.pt ] || bash model/mini/device_train.sh I
for b in $batches; do
  rm -rf "runs/ab$b"; cp -r runs/mini "runs/ab$b"
  python3 -m vidtune.model.mini.train transformer --out "runs/ab$b" --device cuda --time-budget "$secs" \
    --save-every 1000000 --log-every 10 --steps 400000 --schedule "$secs" --batch "$b" --frames 33 --lr 1e-3 \
    --reuse 4 > "$out/ab_batch$b.log" 2>&1
  rm -rf "runs/ab$b"
done
best=$(python3 - "$out" $batches <<'PY'
import json, sys
out, batches = sys.argv[1], [int(b) for b in sys.argv[2:]]
rows = {}
for b in batches:
    log = [json.loads(l) for l in open(f"{out}/ab_batch{b}.log") if l.startswith('{"step"')]
    first, last = log[1], log[-1]  # log[0] includes the first step's compile/allocation; skip it
    sps = (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])
    tail = log[-6:]
    rows[b] = {"batch": b, "steps": last["step"] - log[0]["step"] + 10, "steps_per_s": round(sps, 2),
               "clips_per_s": round(sps * b, 1),
               "video_mse_last6": round(sum(r["video_mse"] for r in tail) / len(tail), 3)}
ref = rows[batches[0]]["steps_per_s"]
ok = [r for r in rows.values() if r["steps_per_s"] >= 0.5 * ref]
best = max(ok, key=lambda r: r["clips_per_s"])["batch"]
json.dump({"rows": list(rows.values()), "chosen": best, "rule": "most clips/s with steps/s >= 0.5 x first batch's"},
          open(f"{out}/ab_batch.json", "w"), indent=1)
print(best)
PY
)
cat "$out/ab_batch.json"
tar czf "$out/ab_logs.tar.gz" -C "$out" $(cd "$out" && ls ab_batch*.log) && rm -f "$out"/ab_batch*.log
BATCH=$best bash model/mini/device_train.sh T "$train_s" "$train_s"
exec bash model/mini/device_train.sh C
