"""A/B on the H200: a fresh ltx2-mini video VAE trained with and without per-layer rates (lr_fan_in)

    python results/mini/checks/vae_h200_fanin_ab.py train OUT SECONDS   # both runs side by side
    python results/mini/checks/vae_h200_fanin_ab.py eval OUT            # held-out PSNR and colour kept

Both runs use the recipe's phase-A settings for the video VAE (batch 6, 17 frames at 256x384, lr 3e-4,
chroma 1, schedule 1,200 s) from fresh weights for the same wall time on the same GPU; ``fanin`` adds
``--lr-fan-in 0.03`` (a layer of fan-in F at min(3e-4, 0.03 / F): the encoder's 128-channel
convolutions at 8.7e-6, the decoder's 32-channel ones at 3.5e-5). ``eval`` reconstructs 4 held-out
scenes (256x384x17) with each and prints PSNR and colour kept (1: the clip's colour range, 0: grey).
"""
import json, math, subprocess, sys
from pathlib import Path

import torch
import torch.nn.functional as F

import vidtune  # noqa: F401
from vidtune.model.mini.train import HELD_OUT_SEED, build, clip_batch, colour_range_ratio

mode, out = sys.argv[1], Path(sys.argv[2])
RUNS = {"plain": [], "fanin": ["--lr-fan-in", "0.03"]}
if mode == "train":
    procs = []
    for name, extra in RUNS.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "vidtune.model.mini.train", "video_vae", "--out", str(out / name),
               "--device", "cuda", "--time-budget", sys.argv[3], "--save-every", "500", "--log-every", "100",
               "--steps", "200000", "--schedule", "1200", "--batch", "6", "--frames", "17", "--lr", "3e-4",
               "--chroma", "1", *extra]
        procs.append(subprocess.Popen(cmd, stdout=open(out / f"train_{name}.log", "w"), stderr=subprocess.STDOUT))
    raise SystemExit(max(p.wait() for p in procs))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
held = clip_batch([HELD_OUT_SEED + i for i in range(4)], 17, 256, 384, 24.0, device)["video"]
report = {}
for name in RUNS:
    state = torch.load(out / name / "video_vae.pt", map_location="cpu", weights_only=False)
    enc, dec = build("video_encoder", device).eval(), build("video_decoder", device).eval()
    enc.load_state_dict(state["model"]["video_encoder"]); dec.load_state_dict(state["model"]["video_decoder"])
    with torch.no_grad():
        rec = torch.cat([dec(enc(held[i:i + 1])) for i in range(len(held))]).clamp(-1, 1)
    report[name] = {"steps": state["step"], "held_out_psnr_db": 10 * math.log10(4 / float(F.mse_loss(rec, held))),
                    "colour_kept": colour_range_ratio(rec, held)}
    # bf16 weights come back (the run state with its optimiser is too large to return)
    from safetensors.torch import save_file
    save_file({f"{part}.{k}": v.to(torch.bfloat16).contiguous() for part in ("video_encoder", "video_decoder")
               for k, v in state["model"][part].items()}, str(out / f"video_vae_{name}.safetensors"))
print(json.dumps(report, indent=1))
(out / "eval.json").write_text(json.dumps(report, indent=1))
