#!/usr/bin/env bash
# A campaign on a GPU machine without network (docs/offline-gpu.md), in runs made back to back while /tmp survives.
#
# The GPU image lacks Ray, Optuna, Hydra, PyAV, ltx-core, FLIP, ...: the wheels of docs/offline-gpu.md plus Ray,
# one tar (126 MB with plotly==7.1.0 omegaconf==2.3.1 av==18.1.0, the versions CI uses) into
# chunks under .dw/ (ignored; split into 4 chunks of 33 MB so that a chunk plus the tracked tree stays
# under a call's 64 MiB; the tracked tree was 30.0 MB on 2026-11-29, so a chunk of 33.0 MB leaves 4 MB). Then:
#   call k = 0, 1, 2:  carry [".dw/k"]  command: bash benchmarks/device_campaign.sh chunk k
#   last call:         carry [".dw/3"]  command: bash benchmarks/device_campaign.sh run 3 [overrides...]
# `run` adds the last chunk, installs the wheels and vidtune into /tmp (kept while the machine is held),
# runs `vidtune campaign` with the overrides (default: ltx2-19b at 768x512x121, stage-2 families) under
# a time limit (CAMPAIGN_LIMIT_S, 500 s; a cut campaign resumes with `run -` in the next call, as the
# first H200 campaign did twice), and packs what comes back into $OUT (at most 8 files): the campaign's records, tuned
# config, report and videos, without the raw frames (too large to return).
# On a machine that already has everything (a CPU check), `SKIP_INSTALL=1 bash benchmarks/device_campaign.sh
# run - model=tiny ...` runs the same campaign and packing steps.
# Fewer calls (2026-12-02): the device does not need the tracked results/ (14 MB); with it moved out of the
# working tree for the calls (and put back after), the tree is 20 MB and the 127 MB of wheels fit 3 chunks of
# 44 MB: `cat .dw/*/chunk > /tmp/vt.tar; split -n 3 -d -a 1 /tmp/vt.tar part.` into CHUNKS=.dwx/{0,1,2}/chunk.
# Keep every call back to back: the machine is given back 30 s after a call, and /tmp with it. If it was given back
# anyway, carry the last call's campaign.tar.gz and set RESUME_ARCHIVE (below) in a `run K` call on the new machine.
set -euo pipefail
what=${1:?usage: device_campaign.sh chunk K | install K|- | run K|- [overrides...]}
k=${2:?chunk number}
shift 2
out=${OUT:-/tmp/out}
mkdir -p /tmp/vt-chunks "$out"
if [ "$k" != - ]; then
  cp "${CHUNKS:-.dw}/$k/chunk" "/tmp/vt-chunks/$k"
fi
[ "$what" = chunk ] && { ls -l /tmp/vt-chunks; exit 0; }
case "$what" in run|install) ;; *) echo "first argument must be chunk, install or run, got $what" >&2; exit 2 ;; esac
if [ -z "${SKIP_INSTALL:-}" ]; then
  if [ ! -d /tmp/site/ray ]; then
    cat $(ls /tmp/vt-chunks/* | sort -V) > /tmp/vt.tar
    mkdir -p /tmp/vt-whl && tar -xf /tmp/vt.tar -C /tmp/vt-whl
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/vt-whl/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/vt .
  export PYTHONPATH=/tmp/vt:/tmp/site
fi
# install: the last chunk and the install only, so that the same call can go on with something else on this
# machine (a `vidtune bench` through device_bench.sh, which finds /tmp/site installed)
[ "$what" = install ] && { python3 -c "import ray, ltx_core, optuna; print('installed: ray', ray.__version__)"; exit 0; }
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
results=${CAMPAIGN_RESULTS:-/tmp/vt-results}
name=${CAMPAIGN_NAME:-h200-ltx2-19b}
if [ $# -eq 0 ]; then
  set -- model=ltx2-19b request.height=512 request.width=768 request.frames=121 \
    "families=[caching,tiling,kernel_choice,sparse_attention]" budget.trials_per_family=4 integrator.final_repeats=5
fi
# A machine lost between calls (given back, or taken for other work) takes /tmp with it: the campaign goes on on a
# fresh one from the campaign.tar.gz an earlier call brought back, carried in this call (RESUME_ARCHIVE=its path in
# the tree). Its trials, combinations and verdicts are kept; the baseline's tensors are not in the archive, so the
# baseline (and the quality model's) is computed again first (its key is the same; tests/test_device_scripts.py).
if [ -n "${RESUME_ARCHIVE:-}" ] && [ ! -d "$results/$name" ]; then
  mkdir -p "$results" && tar xzf "$RESUME_ARCHIVE" -C "$results"
  [ -d "$results/$name" ] || { echo "RESUME_ARCHIVE=$RESUME_ARCHIVE holds no campaign named $name" >&2; exit 2; }
  echo "resuming $name from $RESUME_ARCHIVE (its baseline's tensors computed again)"
fi
rc=0
# budget.run_minutes: the campaign itself starts nothing that would end past the call's limit (minus 40 s for
# packing what comes back), and exits 75 (paused, resumable) instead of being cut mid-trial by `timeout`, which
# stays as the backstop. The install above counts: the limit is measured from here.
limit=${CAMPAIGN_LIMIT_S:-500}
run_minutes=$(python3 -c "print(round(max(1.0, $limit - 40) / 60, 2))")
timeout "$limit" python3 -m vidtune.cli campaign "name=$name" "results_dir=$results" "budget.run_minutes=$run_minutes" \
  "$@" > "$out/campaign.log" 2>&1 || rc=$?
echo "campaign exit status $rc$([ $rc = 75 ] && echo ' (paused by budget.run_minutes: run again with run - to go on)')" \
  >> "$out/campaign.log"
# what comes back: everything of the campaign but the raw tensors, as one archive, plus the report
if [ -d "$results/$name" ]; then
  # the records without the raw tensors and videos (at 1536x1024x121 the MP4s alone are ~114 MB each and
  # made the archive 238 MB, over the 16 MiB a returned file may have: campaign h200x2-ranks2); the videos
  # come back separately where they fit
  tar czf "$out/campaign.tar.gz" -C "$results" --exclude='*.safetensors' --exclude='*.mp4' --exclude=report.html "$name"
  [ -f "$results/$name/report.html" ] && cp "$results/$name/report.html" "$out/"
  [ -f "$results/$name/tuned.yaml" ] && cp "$results/$name/tuned.yaml" "$out/"
  for v in baseline tuned; do
    f="$results/$name/$v/video.mp4"
    if [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 16000000 ]; then cp "$f" "$out/${v}_video.mp4"; fi
  done
fi
tail -n 25 "$out/campaign.log"
ls -la "$out"
[ "$rc" = 75 ] && exit 0  # paused between evaluations: nothing lost
exit "$rc"
