# Decoder alone from a clean linear code of the colour (latent = colour @ P^T, P fixed random), flat colours.
#   SCALE=s python results/mini/checks/vae_flat_dec_only.py VARIANT STEPS LR   (VARIANT: base | nores | gn)
import math, sys, time, copy, torch, torch.nn.functional as F
import vidtune
from vidtune.model.presets import get_preset
from vidtune.model.weights import _configurators, identity_latent_statistics
torch.set_num_threads(1)
variant, steps, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cfg = copy.deepcopy(get_preset("ltx2-mini").config)
if "nores" in variant:
    for n, a in cfg["vae"]["decoder_blocks"]:
        if n == "compress_all": a["residual"] = False
if "gn" in variant: cfg["vae"]["norm_layer"] = "group_norm"
torch.manual_seed(0)
dec = _configurators()["video_decoder"].from_config(cfg).float(); identity_latent_statistics(dec)
P = torch.randn(128, 3, generator=torch.Generator().manual_seed(5)) / math.sqrt(3) * float(__import__("os").environ.get("SCALE", "1"))
def batch(n, g):
    c = torch.rand(n, 3, generator=g) * 2 - 1
    z = (c @ P.T)[:, :, None, None, None].expand(n, 128, 2, 2, 2).contiguous()
    return z, c[:, :, None, None, None].expand(n, 3, 9, 64, 64)
opt = torch.optim.AdamW(dec.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
g = torch.Generator().manual_seed(0); hz, hx = batch(8, torch.Generator().manual_seed(1)); t=time.time()
for s in range(steps + 1):
    if s % 50 == 0:
        with torch.no_grad(): r = dec(hz)
        print(variant, lr, s, "PSNR %.2f" % (10 * math.log10(4 / F.mse_loss(r, hx).item())), f"{time.time()-t:.0f}s", flush=True)
    z, x = batch(4, g); r = dec(z)
    loss = F.l1_loss(r, x) + F.mse_loss(r, x)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(dec.parameters(), 1.0); opt.step()
