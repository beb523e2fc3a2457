"""Does training the ltx2-mini video encoder keep the colour it has at initialisation? (CPU, flat colours)

    python results/mini/checks/vae_encoder_linear_head.py frozen 300 3e-3        # encoder frozen, head lr 3e-3
    python results/mini/checks/vae_encoder_linear_head.py joint 100 3e-3 3e-4    # encoder trained at 3e-4

The decoder is replaced by the simplest one: the latent averaged over its positions, then a linear map
to the clip's colour (flat random colours in [-1, 1]^3, 64x64x9, 4 clips per step, L1 + MSE). So what
is measured is how much colour the encoder's latent carries and whether its training keeps it.
Arguments: mode (frozen | joint), steps, head lr, encoder lr (default: the head's).
"""
import math, sys, time, torch, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(1)
mode, steps, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
enc = build("video_encoder", "cpu")
head = torch.nn.Linear(128, 3)
enc_lr = float(sys.argv[4]) if len(sys.argv) > 4 else lr
groups = [{"params": list(head.parameters()), "lr": lr}]
if mode != "frozen": groups.append({"params": list(enc.parameters()), "lr": enc_lr})
params = [p for gr in groups for p in gr["params"]]
opt = torch.optim.AdamW(groups, weight_decay=0.0, betas=(0.9, 0.99))
def clips(n, g):
    c = torch.rand(n, 3, 1, 1, 1, generator=g) * 2 - 1
    return c.expand(n, 3, 9, 64, 64).contiguous(), c.flatten(1)
g = torch.Generator().manual_seed(0); hx, hc = clips(8, torch.Generator().manual_seed(123)); t = time.time()
for s in range(steps + 1):
    if s % 50 == 0:
        with torch.no_grad(): p = head(enc(hx).mean((2, 3, 4)))
        print(mode, lr, enc_lr, s, "PSNR %.2f" % (10 * math.log10(4 / F.mse_loss(p, hc).item())), f"{time.time()-t:.0f}s", flush=True)
    x, c = clips(4, g); p = head(enc(x).mean((2, 3, 4)))
    loss = F.l1_loss(p, c) + F.mse_loss(p, c)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
