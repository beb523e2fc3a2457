#!/usr/bin/env bash
# Round 2 (device tool, two H200s): the deployment path, `vidtune generate --nproc 2`, on NCCL.
# ltx2-19b (random bf16 weights), one distilled two-stage request at 1536x1024x121: one process, then two
# processes with sequence_parallel degree 2 (stage 2's video self-attention split over the GPUs). Each
# run is ONE generation in a fresh process (no warm-up), so its per-stage latencies include first-call
# costs (cuDNN plans, allocator growth): a functional check of the launch path with rough times, not a
# speed-up claim (round 1 has the interleaved, warmed-up measurements). The outputs are compared as raw
# uint8 frames (PSNR) and float32 audio.
#   bash results/benchmarks/parallel/round2/run.sh   (vidtune, ltx-core and PyAV on PYTHONPATH; writes $OUT)
set -u
req="model=ltx2-19b request.height=1024 request.width=1536 request.frames=121"
python3 -m vidtune.cli generate $req out=/tmp/gen1 > "$OUT/gen_nproc1.json" 2> "$OUT/gen_nproc1.err"
echo "nproc 1 rc $?"; grep -A6 latency_ms "$OUT/gen_nproc1.json"
python3 -m vidtune.cli generate --nproc 2 $req out=/tmp/gen2 --knobs parallelism.sequence_parallel.degree=2 \
  > "$OUT/gen_nproc2_sp.json" 2> "$OUT/gen_nproc2_sp.err"
echo "nproc 2 rc $?"; grep -A6 latency_ms "$OUT/gen_nproc2_sp.json"
python3 - > "$OUT/compare.json" <<'PY'
import json, torch
from vidtune.model.media import read_raw, probe_mp4
from vidtune.search.metrics import psnr_db
f1, a1, sr1, _ = read_raw("/tmp/gen1/output.safetensors")
f2, a2, sr2, _ = read_raw("/tmp/gen2/output.safetensors")
p = psnr_db(f1, f2)
print(json.dumps({"frames": list(f1.shape), "psnr_db_min": float(p.min()), "psnr_db_mean": float(p.mean()),
                  "frames_identical": bool(torch.equal(f1, f2)),
                  "max_abs_uint8": int((f1.int() - f2.int()).abs().max()),
                  "audio_max_abs": float((a1 - a2).abs().max()), "sample_rates": [sr1, sr2],
                  "mp4_nproc2": probe_mp4("/tmp/gen2/video.mp4")}, indent=2, default=str))
PY
cat "$OUT/compare.json"
