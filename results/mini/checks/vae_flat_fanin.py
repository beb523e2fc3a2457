# Whole VAE on flat colours with per-layer rates: a conv of fan-in F at min(3e-4, C/F), C separate for
# encoder and decoder (0: frozen).   python results/mini/checks/vae_flat_fanin.py C_ENC C_DEC STEPS
import math, sys, time, torch, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(1)
c_enc, c_dec, steps = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
enc, dec = build("video_encoder", "cpu"), build("video_decoder", "cpu")
def groups(mod, c, cap=3e-4):
    out = []
    for m in mod.modules():
        if isinstance(m, torch.nn.Conv3d):
            fan = m.weight[0].numel()
            lr = min(cap, c / fan) if c > 0 else 0.0
            if lr > 0: out.append({"params": [p for p in m.parameters()], "lr": lr})
    return out
g_all = groups(enc, c_enc) + groups(dec, c_dec)
if c_enc <= 0: enc.requires_grad_(False)
opt = torch.optim.AdamW(g_all, weight_decay=0.0, betas=(0.9, 0.99))
params = [p for gr in g_all for p in gr["params"]]
def clips(n, g):
    c = torch.rand(n, 3, 1, 1, 1, generator=g) * 2 - 1
    return c.expand(n, 3, 9, 64, 64).contiguous()
g, gn = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
held = clips(8, torch.Generator().manual_seed(123)); t = time.time()
for s in range(steps + 1):
    if s % 50 == 0:
        with torch.no_grad(): r = dec(enc(held))
        print("c_enc", c_enc, "c_dec", c_dec, s, "PSNR %.2f" % (10 * math.log10(4 / F.mse_loss(r, held).item())), f"{time.time()-t:.0f}s", flush=True)
    x = clips(4, g); m = enc(x); r = dec(m + 0.05 * torch.randn(m.shape, generator=gn))
    loss = F.l1_loss(r, x) + F.mse_loss(r, x) + 1e-4 * m.pow(2).mean()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
