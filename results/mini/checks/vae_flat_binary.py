"""Joint ltx2-mini VAE on flat random colours: the decoder's output takes two values (CPU, fresh weights)

    python results/mini/checks/vae_flat_binary.py

Trains encoder + decoder jointly (MSE only, lr 3e-4, no clipping) for 100 steps on flat random colours,
then prints the held-out clips' output mean colours against the truth, the pairwise distances of their
mean latents, and the norm and cosine (to clip 0) of the features entering the encoder's and the
decoder's last PixelNorm.
"""
import torch, math, sys, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import build
torch.set_num_threads(2)
enc, dec = build("video_encoder","cpu"), build("video_decoder","cpu")
g=torch.Generator().manual_seed(0)
def clips(n):
    c = torch.rand(n,3,1,1,1,generator=g)*2-1
    return c.expand(n,3,9,64,64).clone()
held = clips(8)
params=[*enc.parameters(),*dec.parameters()]
opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0, betas=(0.9, 0.99))
for s in range(101):
    x=clips(4); z=enc(x); r=dec(z)
    loss=F.mse_loss(r,x)
    opt.zero_grad(); loss.backward(); opt.step()
    if s%50==0:
        with torch.no_grad():
            zh=enc(held); rh=dec(zh)
        print(s, "loss %.3f held %.2f dB | latent std across clips %.3f within clip %.3f | out std across clips %.3f within clip %.3f"%(
            loss.item(), 10*math.log10(4/F.mse_loss(rh,held).item()), zh.mean((2,3,4)).std(0).mean(), zh.std((2,3,4)).mean(),
            rh.mean((2,3,4)).std(0).mean(), rh.std((2,3,4)).mean()), flush=True)
with torch.no_grad():
    zh=enc(held); rh=dec(zh)
pm = rh.mean((2,3,4)); tm = held.mean((2,3,4))
print("pred\n", pm.numpy().round(2)); print("truth\n", tm.numpy().round(2))
print("per-frame mean of clip0 channel0:", rh[0,0].mean((1,2)).numpy().round(2))
print("spatial pattern clip0 ch0 frame4 rows:", rh[0,0,4,::16,::16].numpy().round(2))
zm = zh.mean((2,3,4))
d = torch.cdist(zm, zm)
print("latent pairwise distances\n", d.numpy().round(2))
# encoder internals: last features before conv_norm_out
feats = {}
def hook(name):
    def f(m, i, o): feats[name] = i[0].detach()
    return f
enc.conv_norm_out.register_forward_hook(hook("enc_pre_norm")); dec.conv_norm_out.register_forward_hook(hook("dec_pre_norm"))
with torch.no_grad(): dec(enc(held))
for k, v in feats.items():
    vm = v.mean((2,3,4)); n = vm / vm.norm(dim=1, keepdim=True)
    print(k, "norm per clip", vm.norm(dim=1).numpy().round(3), "cos to clip0", (n @ n[0]).numpy().round(3))
