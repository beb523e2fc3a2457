# Fresh encoder + LTX decoder on flat colours, encoder lr separate (0: frozen); decoder lr 3e-4.
#   python results/mini/checks/vae_flat_enc_dec.py NAME STEPS ENC_LR [LATENT_NOISE]
import math, sys, time, torch, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(1)
variant, steps, enc_lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
enc, dec = build("video_encoder","cpu"), build("video_decoder","cpu")
groups = [{"params": dec.parameters(), "lr": 3e-4}]
if enc_lr > 0: groups.append({"params": enc.parameters(), "lr": enc_lr})
else: enc.requires_grad_(False)
opt = torch.optim.AdamW(groups, weight_decay=0.0, betas=(0.9, 0.99))
def clips(n, g):
    c = torch.rand(n,3,1,1,1,generator=g)*2-1
    return c.expand(n,3,9,64,64).contiguous()
g, gn = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
held = clips(8, torch.Generator().manual_seed(123)); t=time.time()
noise = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
for s in range(steps+1):
    if s % 50 == 0:
        with torch.no_grad(): z = enc(held); r = dec(z)
        print(variant, enc_lr, noise, s, "PSNR %.2f" % (10*math.log10(4/F.mse_loss(r, held).item())), "latent rms %.3g" % z.pow(2).mean().sqrt().item(), f"{time.time()-t:.0f}s", flush=True)
    x = clips(4, g); m = enc(x); r = dec(m + noise*torch.randn(m.shape, generator=gn))
    loss = F.l1_loss(r,x) + F.mse_loss(r,x) + 1e-4*m.pow(2).mean()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_([p for gr in opt.param_groups for p in gr["params"]], 1.0); opt.step()
