"""Each half of the ltx2-mini video VAE alone, on flat random colours (CPU, fresh weights)

    python results/mini/checks/vae_flat_halves.py dec LR STEPS   # decoder from an oracle latent
    python results/mini/checks/vae_flat_halves.py enc LR STEPS   # encoder + linear read-out of the colour

Clips are one uniform colour in [-1, 1]^3 (64x64x9, 4 new per step; 8 held out). ``dec``: the latent
is the colour itself in channels 0-2 (zeros elsewhere), so the decoder only has to learn an affine map
from 3 numbers to a flat frame; MSE. ``enc``: a linear head on the latent's mean predicts the colour.
Environment switches (diagnostics only; none of them is part of the shipped model):
KAIMING=1 re-initialises every Conv3d (Kaiming normal, zero bias); NO_OUT_NORM=1 removes the decoder's
last PixelNorm; NO_NORM=1 removes every PixelNorm of the decoder.
"""
import torch, math, sys, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(2)
part = sys.argv[1]
enc, dec = build("video_encoder","cpu"), build("video_decoder","cpu")
import os
if os.environ.get("KAIMING"):
    for mod in [enc, dec]:
        for m in mod.modules():
            if isinstance(m, torch.nn.Conv3d):
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu"); torch.nn.init.zeros_(m.bias)
if os.environ.get("NO_OUT_NORM"): dec.conv_norm_out = torch.nn.Identity()
if os.environ.get("NO_NORM"):
    import ltx_core.model.video_vae.video_vae as V
    for n,m in list(dec.named_modules()):
        for cn,c in list(m.named_children()):
            if type(c).__name__=="PixelNorm": setattr(m,cn,torch.nn.Identity())
g=torch.Generator().manual_seed(0)
def clips(n):
    c = torch.rand(n,3,1,1,1,generator=g)*2-1
    return c, c.expand(n,3,9,64,64).clone()
hc, held = clips(8)
head = torch.nn.Linear(128,3)
params=[*dec.parameters()] if part=="dec" else [*enc.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=float(sys.argv[2]) if len(sys.argv)>2 else 3e-4, weight_decay=0.0, betas=(0.9, 0.99))
def oracle(c):
    z = torch.zeros(c.shape[0],128,2,2,2); z[:, :3] = c.view(-1,3,1,1,1); return z
for s in range(int(sys.argv[3]) if len(sys.argv)>3 else 151):
    c,x=clips(4)
    if part=="dec":
        r=dec(oracle(c)); loss=F.mse_loss(r,x)
    else:
        z=enc(x); p=head(z.mean((2,3,4))); loss=F.mse_loss(p,c.view(-1,3))
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params,1.0); opt.step()
    if s%100==0:
        with torch.no_grad():
            if part=="dec": m=F.mse_loss(dec(oracle(hc)),held).item()
            else: m=F.mse_loss(head(enc(held).mean((2,3,4))),hc.view(-1,3)).item()
        print(part, s, "loss %.4f held mse %.4f PSNR %.2f"%(loss.item(), m, 10*math.log10(4/m)), flush=True)
