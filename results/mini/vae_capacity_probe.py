"""Which video-decoder shape can ltx2-mini afford? Overfit two clips and compare (CPU, 1 thread).

    python results/mini/vae_capacity_probe.py              # ~6 minutes on 2 cores
    python results/mini/vae_capacity_probe.py --objective  # the trainer's objective, ~2 minutes

Two procedural clips (scene seeds 1 and 2, 64x64x9), encoder + decoder of the mini preset with the
decoder variant given, Adam 3e-4, L1 + MSE, 450 steps; PSNR (dB, [-1, 1] range, peak-to-peak 2) every
50 steps. A decoder that cannot overfit two clips cannot learn the distribution.
"""

import math
import sys

import torch
import torch.nn.functional as F

import vidtune  # noqa: F401
from vidtune.model.mini.train import build, clip_batch
from vidtune.model.presets import PRESETS, _video_vae

VARIANTS = {"halving, base 8 (the released shape's rule)": dict(base_channels=8, decoder_multiplier=2),
            "32 channels at every level (base 4, multiplier 1)": dict(base_channels=4, decoder_multiplier=1)}


def run(base_channels: int, decoder_multiplier: int, steps: int = 451) -> list[float]:
    PRESETS["ltx2-mini"].config["vae"] = _video_vae(1, 1, base_channels, decoder_multiplier)
    torch.manual_seed(0)
    enc, dec = build("video_encoder", "cpu"), build("video_decoder", "cpu")
    x = clip_batch([1, 2], 9, 64, 64, 24.0, "cpu")["video"]
    opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), lr=3e-4)
    out = []
    for i in range(steps):
        rec = dec(enc(x))
        loss = F.l1_loss(rec, x) + F.mse_loss(rec, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 50 == 0:
            out.append(round(10 * math.log10(4 / float(F.mse_loss(rec, x).detach())), 2))
    return out, sum(p.numel() for p in dec.parameters())


def run_objective(steps: int = 251) -> list[float]:
    """The trainer's own step (latent noise, L2 pull, AdamW, clipping) overfitting the same two clips."""
    from vidtune.model.mini.train import _vae_step

    torch.manual_seed(0)
    mods = {"video_encoder": build("video_encoder", "cpu"), "video_decoder": build("video_decoder", "cpu")}
    batch = clip_batch([1, 2], 9, 64, 64, 24.0, "cpu")
    params = [p for m in mods.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(steps):
        loss, info = _vae_step(mods, batch, None, g)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if i % 50 == 0:
            out.append(round(info["psnr_db"], 2))
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    if "--objective" in sys.argv:  # the preset's decoder, the trainer's objective
        print(f"ltx2-mini decoder, train.py's VAE objective: PSNR every 50 steps: {run_objective()}", flush=True)
        raise SystemExit(0)
    for name, kw in VARIANTS.items():
        curve, n = run(**kw)
        print(f"{name}: decoder {n / 1e6:.2f} M params; PSNR every 50 steps: {curve}", flush=True)
