"""Where the joint ltx2-mini VAE's features blow up on flat colours (CPU, fresh weights)

    python results/mini/checks/vae_flat_collapse.py STEPS LR     # e.g. 100 3e-4, 100 3e-5

Trains encoder + decoder jointly (MSE, no clipping) on flat random colours for STEPS, then prints, for
each encoder stage on 8 held-out clips, the feature RMS and the cosine of each clip's mean feature to
clip 0's (+-1 everywhere: one direction, only its sign differs between colours), and every encoder
parameter's norm before and after.
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
w0 = {n: p.detach().clone() for n, p in enc.named_parameters()}
opt = torch.optim.AdamW(params, lr=float(sys.argv[2]), weight_decay=0.0, betas=(0.9, 0.99))
for s in range(int(sys.argv[1])):
    x=clips(4); z=enc(x); r=dec(z)
    loss=F.mse_loss(r,x)
    opt.zero_grad(); loss.backward(); opt.step()
feats=[]
for name, m in enc.named_modules():
    if (name.count(".")<=1 and name) or name.endswith("res_blocks.0") :
        m.register_forward_hook(lambda mod, i, o, name=name: feats.append((name, o)))
with torch.no_grad(): enc(held)
for name, o in feats:
    if not torch.is_tensor(o): continue
    vm = o.mean((2,3,4)); n = vm / vm.norm(dim=1, keepdim=True).clamp_min(1e-9)
    print("%-28s"%name, tuple(o.shape), "rms %.3g"%o.pow(2).mean().sqrt(), "cos to clip0", (n @ n[0]).numpy().round(2))
for n, p in enc.named_parameters():
    print("%-50s norm0 %.3g now %.3g"%(n, w0[n].norm(), p.norm()))
