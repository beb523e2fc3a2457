#!/usr/bin/env bash
# The default job (`make run`'s campaign) N times, each in a fresh results folder (no stored baseline, no compile
# cache), one after another: its wall time and what it exported, one JSON summary per run under OUT.
#   bash benchmarks/default_runs.sh [N=5] [OUT=results/default_runs]
set -euo pipefail
n=${1:-5}
out=${2:-results/default_runs}
bin=${VIDTUNE:-.venv/bin/vidtune}
mkdir -p "$out"
for i in $(seq 1 "$n"); do
  dir=$(mktemp -d)
  start=$(date +%s.%N)
  "$bin" campaign "results_dir=$dir" > "$dir/summary.json" 2> "$dir/campaign.log" || echo "run $i: exit status $?" >&2
  wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  python3 - "$dir" "$wall" "$i" "$out" <<'PY'
import json, sys
from pathlib import Path
d, wall, i, out = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
s = json.loads((d / "default" / "campaign.json").read_text())  # (stdout's summary is the short one)
f = s.get("final") or {}
row = {"run": int(i), "wall_s": wall, "exported": s.get("chosen") or {}, "speedup": f.get("speedup"),
       "p_value": f.get("p_value"), "psnr_db": (f.get("quality") or {}).get("psnr_db"),
       "verdict": s.get("verdict"), "rejected": s.get("rejected"), "provenance": s.get("provenance"),
       # (per tier, the default since 2026-12-06; the top-level fields above are the strictest tier's)
       "tiers": {t: {"exported": v.get("chosen") or {}, "speedup": (v.get("final") or {}).get("speedup"),
                     "p_value": (v.get("final") or {}).get("p_value"),
                     "psnr_db": ((v.get("final") or {}).get("quality") or {}).get("psnr_db")}
                 for t, v in (s.get("tiers") or {}).items()}}
(out / f"run{i}.json").write_text(json.dumps(row, indent=1, default=str) + "\n")
(out / f"run{i}.log").write_text((d / "campaign.log").read_text()[-20000:])
print(f"run {i}: {wall:.0f} s, x{row['speedup']} p={row['p_value']} {list(row['exported'])}",
      {t: (v["speedup"], list(v["exported"])) for t, v in row["tiers"].items()})
PY
  rm -rf "$dir"
done
