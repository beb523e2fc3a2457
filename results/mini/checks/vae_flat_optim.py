"""Is the optimiser what keeps the ltx2-mini video VAE from learning flat colours? (CPU, fresh weights)

    python results/mini/checks/vae_flat_optim.py OPT STEPS

Same task, loss and held-out clips as `vae_flat_colours.py` (flat random colours, 64x64x9, encoder and
decoder jointly, the trainer's loss, gradient clip 1.0): only the optimiser changes.
`video_vae_grey_3.md` (section 3) found the joint VAE's encoder features growing ~6x per downsample
within 100 Adam steps while every weight norm moved by 3% or less: Adam moves each of a 3x3x3x128
convolution's 3,456 taps by about lr per step whatever its gradient's size, and on smooth inputs
(flat colours, the shapes' colour) those taps' gradients agree in sign, so the DC gain runs away.
Optimisers whose steps scale with the gradient should not do that. OPT:
  adam          AdamW lr 3e-4, eps 1e-8 (the trainer's)
  adam-eps:E    AdamW lr 3e-4 with eps E (steps shrink where |grad| << E: Adam turns into SGD there)
  adam-wd:W     AdamW lr 3e-4, decoupled weight decay W
  sgd:LR        SGD, Nesterov momentum 0.9, lr LR
PAD=MODE (environment) builds the VAE with spatial_padding_mode MODE (ltx-core: zeros, reflect,
replicate, circular) instead of the preset's zeros: at 64x64 the latent is 2x2, so every
position of every decoder level is at a border.
NORM=off (environment, a diagnostic, not an ltx-core option) makes every PixelNorm the identity.
"""
import math, sys, time
import torch, torch.nn.functional as F
import vidtune  # noqa: F401
from vidtune.model.mini.train import build, colour_range_ratio

torch.set_num_threads(int(__import__("os").environ.get("THREADS", "1")))
opt_name, steps = sys.argv[1], int(sys.argv[2])
kind, _, arg = opt_name.partition(":")


def clips(n: int, g: torch.Generator) -> torch.Tensor:
    return (torch.rand(n, 3, 1, 1, 1, generator=g) * 2 - 1).expand(n, 3, 9, 64, 64).clone()


if "PAD" in __import__("os").environ:
    from vidtune.model.presets import get_preset
    get_preset("ltx2-mini").config["vae"]["spatial_padding_mode"] = __import__("os").environ["PAD"]
if __import__("os").environ.get("NORM") == "off":
    from ltx_core.model.common.normalization import PixelNorm
    PixelNorm.forward = lambda self, x: x
enc, dec = build("video_encoder", "cpu"), build("video_decoder", "cpu")
params = [*enc.parameters(), *dec.parameters()]
if kind == "adam":
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0, betas=(0.9, 0.99))
elif kind == "adam-eps":
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0, betas=(0.9, 0.99), eps=float(arg))
elif kind == "adam-wd":
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=float(arg), betas=(0.9, 0.99))
elif kind == "sgd":
    opt = torch.optim.SGD(params, lr=float(arg), momentum=0.9, nesterov=True)
else:
    raise SystemExit(f"OPT must be adam, adam-eps:E, adam-wd:W or sgd:LR, got {opt_name!r}")
held = clips(8, torch.Generator().manual_seed(123))
g, gn = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
t = time.time()
for s in range(steps + 1):
    if s % 50 == 0:
        with torch.no_grad():
            lat = enc(held)
            rec = dec(lat)
        print(opt_name, "pad", __import__("os").environ.get("PAD", "zeros"), "norm", __import__("os").environ.get("NORM", "on"), s, "held-out PSNR", round(10 * math.log10(4 / float(F.mse_loss(rec, held))), 2),
              "colour kept", round(colour_range_ratio(rec, held), 3), "latent rms", round(float(lat.pow(2).mean().sqrt()), 3),
              f"{time.time() - t:.0f}s", flush=True)
    x = clips(4, g)
    means = enc(x)
    rec = dec(means + 0.05 * torch.randn(means.shape, generator=gn))
    chroma = F.l1_loss(rec - rec.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * means.pow(2).mean() + chroma
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
