"""Joint ltx2-mini VAE on flat colours: conv bias init and learning rate (CPU, fresh weights)

    python results/mini/checks/vae_flat_bias_lr.py BIAS_STD STEPS [LR]   # e.g. 1.0 250, 0 300 3e-5

The trainer's loss; every Conv3d bias of encoder and decoder redrawn from N(0, BIAS_STD) (0: PyTorch's
default init kept). Prints held-out PSNR every 50 steps.
"""
import torch, math, sys, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(2)
bstd = float(sys.argv[1]); steps=int(sys.argv[2]); lr=float(sys.argv[3]) if len(sys.argv)>3 else 3e-4
enc, dec = build("video_encoder","cpu"), build("video_decoder","cpu")
gb = torch.Generator().manual_seed(5)
with torch.no_grad():
    for mod in (enc, dec):
        for m in mod.modules():
            if isinstance(m, torch.nn.Conv3d) and m.bias is not None and bstd > 0:
                m.bias.copy_(torch.randn(m.bias.shape, generator=gb) * bstd)
g=torch.Generator().manual_seed(0)
def clips(n):
    c = torch.rand(n,3,1,1,1,generator=g)*2-1
    return c.expand(n,3,9,64,64).clone()
held = clips(8)
gn = torch.Generator().manual_seed(1)
params=[*enc.parameters(),*dec.parameters()]
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
for s in range(steps+1):
    if s%50==0:
        with torch.no_grad(): rh=dec(enc(held))
        print("bias std", bstd, "lr", lr, s, "held %.2f dB"%(10*math.log10(4/F.mse_loss(rh,held).item())), flush=True)
    x=clips(4); means=enc(x); r=dec(means + 0.05*torch.randn(means.shape, generator=gn))
    chroma = F.l1_loss(r - r.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    loss = F.l1_loss(r, x) + F.mse_loss(r, x) + 1e-4 * means.pow(2).mean() + chroma
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params,1.0); opt.step()
