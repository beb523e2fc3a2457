"""Attempts to stop the collapse, joint ltx2-mini VAE on flat colours (CPU, fresh weights)

    python results/mini/checks/vae_flat_fixes.py NAME STEPS LR WEIGHT_DECAY PENALTY
    ENC_NORES=1 python results/mini/checks/vae_flat_fixes.py nores 300 3e-4 0 0

The trainer's loss (L1 + MSE + chroma L1, latent noise 0.05, clip 1.0) plus PENALTY x mean over every
PixelNorm of log(RMS of its input)^2, which keeps the features entering each norm near unit scale.
SGD=1 uses SGD with momentum 0.9 instead of AdamW. ENC_NORES=1 builds the encoder with strided convolutions (compress_*) instead of the residual
space-to-depth blocks (compress_*_res). Prints held-out PSNR and the largest pre-norm RMS every 50 steps.
"""
import torch, math, sys, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(2)
mode = sys.argv[1]; steps=int(sys.argv[2]); lr=float(sys.argv[3]); wd=float(sys.argv[4]); pen=float(sys.argv[5])
import os, copy
if os.environ.get("ENC_NORES"):
    from vidtune.model.presets import get_preset
    from vidtune.model.weights import _configurators, identity_latent_statistics
    cfg = copy.deepcopy(get_preset("ltx2-mini").config)
    cfg["vae"]["encoder_blocks"] = [[n.replace("_res", ""), a] for n, a in cfg["vae"]["encoder_blocks"]]
    torch.manual_seed(0)
    enc = _configurators()["video_encoder"].from_config(cfg).float(); identity_latent_statistics(enc)
    dec = build("video_decoder","cpu")
else:
    enc, dec = build("video_encoder","cpu"), build("video_decoder","cpu")
rms_log = []
def pre(m, args):
    x = args[0]
    rms_log.append(x.pow(2).mean(1).clamp_min(1e-12).sqrt().mean())
for mod in (enc, dec):
    for m in mod.modules():
        if type(m).__name__ == "PixelNorm":
            m.register_forward_pre_hook(pre)
g=torch.Generator().manual_seed(0)
def clips(n):
    c = torch.rand(n,3,1,1,1,generator=g)*2-1
    return c.expand(n,3,9,64,64).clone()
held = clips(8)
gn = torch.Generator().manual_seed(1)
params=[*enc.parameters(),*dec.parameters()]
opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=wd) if os.environ.get("SGD") else torch.optim.AdamW(params, lr=lr, weight_decay=wd, betas=(0.9, 0.99))
for s in range(steps+1):
    if s%50==0:
        rms_log.clear()
        with torch.no_grad(): rh=dec(enc(held))
        print(mode, "lr", lr, "wd", wd, "pen", pen, s, "held %.2f dB"%(10*math.log10(4/F.mse_loss(rh,held).item())),
              "max pre-norm rms %.3g"%max(float(r) for r in rms_log), flush=True)
    rms_log.clear()
    x=clips(4); means=enc(x); r=dec(means + 0.05*torch.randn(means.shape, generator=gn))
    chroma = F.l1_loss(r - r.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    loss = F.l1_loss(r, x) + F.mse_loss(r, x) + 1e-4 * means.pow(2).mean() + chroma
    if pen:
        loss = loss + pen * torch.stack([torch.log(v).pow(2) for v in rms_log]).mean()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params,1.0); opt.step()
