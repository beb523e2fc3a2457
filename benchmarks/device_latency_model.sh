#!/usr/bin/env bash
# The latency model against paired whole generations on a GPU machine without network (docs/offline-gpu.md):
# ltx2-19b (random weights: latency only) at one request size, each variant measured by benchmarks/latency_model.py
# (paired whole generations, then the estimate, then the lean estimate).
#
#   bash benchmarks/device_latency_model.sh HxWxF NAME VARIANT [VARIANT ...]   # VARIANT: name=knob=value,knob=value
#
# Needs the wheels `vidtune bench` needs in ${WHEELS:-.dws/whl} (docs/offline-gpu.md); installs them into /tmp/site
# once per machine. Env: PAIRS (the reference's pairs, 2), EST_PAIRS (the estimate's rounds, 3), LM_LIMIT_S (540).
# The stored baseline stays in /tmp while the machine is held, so a later call at the same size reuses it.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/ltx_core ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${WHEELS:-.dws/whl}"/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site
size=${1:?HxWxF}
name=${2:?name}
shift 2
args=()
for v in "$@"; do args+=(--variant "$v"); done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/$name.gpu.txt" 2>&1
timeout "${LM_LIMIT_S:-540}" python3 -m vidtune.benchmarks.latency_model --preset ltx2-19b --size "$size" --device cuda \
  --pairs "${PAIRS:-2}" --estimate-pairs "${EST_PAIRS:-3}" --lean --baseline-dir "/tmp/lm-baseline-$size" \
  --out "$out/$name.json" "${args[@]}" > "$out/$name.log" 2>&1
echo "exit status $?" >> "$out/$name.log"
grep -v -i "warn" "$out/$name.log" | tail -40
