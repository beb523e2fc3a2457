"""Put a sweep's video VAE (vae_variants_crops.py SAVE=...) into a run folder imported from the shipped
checkpoint, with its latent statistics measured, so that the device recipe continues from it (CPU).

    python -m vidtune.model.mini.train import --out runs/mini
    python results/mini/checks/seed_video_vae.py SWEEP.safetensors runs/mini STEPS [SECONDS]
    python -m vidtune.model.mini.train export --out runs/mini --to model/mini/weights

STEPS, SECONDS: the sweep run's step count and training seconds (its log), kept in the state so the export's summary counts them.
"""
import sys

import torch
from safetensors.torch import load_file

import vidtune  # noqa: F401
from vidtune.model.mini.train import TrainConfig, _measure_stats, build

src, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
tensors = load_file(src)
model = {}
for part, prefix in (("video_encoder", "encoder."), ("video_decoder", "decoder.")):
    m = build(part, "cpu")  # identity statistics, as in training
    m.load_state_dict({k[len(prefix):]: v.float() for k, v in tensors.items() if k.startswith(prefix)})
    model[part] = m
cfg = TrainConfig(component="video_vae", out=run)
with torch.no_grad():
    stats = _measure_stats(cfg, model, "cpu")
torch.save({"model": {k: m.state_dict() for k, m in model.items()}, "opt": None, "step": steps, "seconds": 0.0,
            "seconds_before": float(sys.argv[4]) if len(sys.argv) > 4 else 0.0, "log": [{"step": steps, "seeded_from": src}], "stats": stats,
            "config": {"seeded_from": src}}, f"{run}/video_vae.pt")
print("seeded", run, "video_vae from", src, "step", steps, "latent std median",
      sorted(stats["std"])[len(stats["std"]) // 2])
