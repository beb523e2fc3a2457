"""Can the ltx2-mini video VAE carry colour at all? Flat random colours (CPU, fresh weights)

    python results/mini/checks/vae_flat_colours.py STEPS [shapes|flat] [LR] [WEIGHT_DECAY]

Each clip is one uniform colour, drawn at random in [-1, 1]^3 (64x64x9, 4 new clips per step); with
``shapes`` a square of a second random colour (16-40 px, random place) is drawn over it. Encoder and
decoder are trained jointly with the trainer's loss. A VAE that cannot reproduce a flat colour from a
stream of them has a defect, not a capacity limit: 3 numbers per clip must pass through 128 latent
channels. Every 50 steps: PSNR and colour kept on 8 held-out clips.
"""
import math, sys, time
import torch, torch.nn.functional as F
import vidtune  # noqa: F401
from vidtune.model.mini.train import build, colour_range_ratio

torch.set_num_threads(2)
steps, with_shapes = int(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "shapes"
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-4  # the trainer's
wd = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0  # the trainer's


def clips(n: int, g: torch.Generator) -> torch.Tensor:
    c = torch.rand(n, 3, 1, 1, 1, generator=g) * 2 - 1
    x = c.expand(n, 3, 9, 64, 64).clone()
    if with_shapes:
        for i in range(n):
            s = int(torch.randint(16, 41, (1,), generator=g))
            y, z = (int(v) for v in torch.randint(0, 64 - s + 1, (2,), generator=g))
            x[i, :, :, y:y + s, z:z + s] = (torch.rand(3, 1, 1, 1, generator=g) * 2 - 1)
    return x


enc, dec = build("video_encoder", "cpu"), build("video_decoder", "cpu")
params = [*enc.parameters(), *dec.parameters()]
opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd, betas=(0.9, 0.99))
held = clips(8, torch.Generator().manual_seed(123))
g, gn = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
t = time.time()
for s in range(steps + 1):
    if s % 50 == 0:
        with torch.no_grad():
            rec = dec(enc(held))
        print("shapes" if with_shapes else "flat", f"lr {lr} wd {wd}", s, "held-out PSNR",
              round(10 * math.log10(4 / float(F.mse_loss(rec, held))), 2), "colour kept",
              round(colour_range_ratio(rec, held), 3), f"{time.time() - t:.0f}s", flush=True)
    x = clips(4, g)
    means = enc(x)
    rec = dec(means + 0.05 * torch.randn(means.shape, generator=gn))
    chroma = F.l1_loss(rec - rec.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * means.pow(2).mean() + chroma
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
