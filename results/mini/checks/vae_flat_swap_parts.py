"""Which half of the ltx2-mini video VAE is slow to learn flat colours? (CPU, fresh weights)

    ABL=... LR=... python results/mini/checks/vae_flat_swap_parts.py MODE STEPS

MODE: ``trivial`` (both halves replaced), ``ltxenc`` (ltx-core encoder + trivial decoder), ``ltxdec``
(trivial encoder + ltx-core decoder) or ``both`` (the real VAE). The trivial encoder averages each
8x32x32 cell (first frame replicated in front, as the causal encoder sees it) and applies two 1x1
convolutions with a SiLU between them (128 latent channels); the trivial decoder applies two 1x1
convolutions and repeats each latent cell over its 8x32x32 pixels. Same task, loss, optimiser and
held-out clips as `vae_flat_colours.py` (flat random colours at 64x64x9, the trainer's loss, AdamW
3e-4 unless LR says otherwise, gradient clip 1.0). ABL changes the ltx-core decoder ('+'-joined):
  nores   its compress_all blocks without their residual skip (``residual: False``, an ltx-core option)
  nox     no res_x blocks (only the three upsampling blocks between conv_in and conv_out)
  normoff every PixelNorm the identity (a diagnostic, not an ltx-core option)
  gn      GroupNorm instead of PixelNorm (an ltx-core option)
  zres    the second convolution of every residual block zeroed (blocks start as the identity)
"""
import math, os, sys
import torch, torch.nn as nn, torch.nn.functional as F
import vidtune  # noqa: F401
from vidtune.model.mini.train import build
from vidtune.model.presets import get_preset

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
mode, steps = sys.argv[1], int(sys.argv[2])
if mode not in ("trivial", "ltxenc", "ltxdec", "both"):
    raise SystemExit(f"MODE must be trivial, ltxenc, ltxdec or both, got {mode!r}")
abl = [a for a in os.environ.get("ABL", "").split("+") if a]
lr = float(os.environ.get("LR", "3e-4"))


def clips(n: int, g: torch.Generator) -> torch.Tensor:
    return (torch.rand(n, 3, 1, 1, 1, generator=g) * 2 - 1).expand(n, 3, 9, 64, 64).clone()


class PoolEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.o = nn.Conv3d(3, 128, 1), nn.Conv3d(128, 128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 0, 0, 0, 7, 0), mode="replicate")  # 9 frames -> 16: 2 latent frames, as ltx-core's
        return self.o(F.silu(self.c(F.avg_pool3d(x, (8, 32, 32)))))


class RepeatDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.o = nn.Conv3d(128, 128, 1), nn.Conv3d(128, 3, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.o(F.silu(self.c(z))), scale_factor=(8, 32, 32))[:, :, 7:]


vcfg = get_preset("ltx2-mini").config["vae"]
if "nores" in abl:
    for name, args in vcfg["decoder_blocks"]:
        if name == "compress_all":
            args["residual"] = False
if "nox" in abl:
    vcfg["decoder_blocks"] = [b for b in vcfg["decoder_blocks"] if b[0] != "res_x"]
if "gn" in abl:
    vcfg["norm_layer"] = "group_norm"
if "normoff" in abl:
    from ltx_core.model.common.normalization import PixelNorm
    PixelNorm.forward = lambda self, x: x
torch.manual_seed(0)
enc = build("video_encoder", "cpu") if mode in ("ltxenc", "both") else PoolEncoder()
torch.manual_seed(1)
dec = build("video_decoder", "cpu") if mode in ("ltxdec", "both") else RepeatDecoder()
if "zres" in abl:
    from ltx_core.model.video_vae.resnet import ResnetBlock3D
    for m in dec.modules():
        if isinstance(m, ResnetBlock3D):
            nn.init.zeros_(m.conv2.conv.weight); nn.init.zeros_(m.conv2.conv.bias)
params = [*enc.parameters(), *dec.parameters()]
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
held = clips(8, torch.Generator().manual_seed(123))
g, gn = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
tag = f"{mode} abl={'+'.join(abl) or '-'} lr={lr}"
for s in range(steps + 1):
    if s % 25 == 0:
        with torch.no_grad():
            rec = dec(enc(held))
        print(tag, s, "held-out PSNR %.2f" % (10 * math.log10(4 / F.mse_loss(rec, held).item())), flush=True)
    x = clips(4, g)
    means = enc(x)
    rec = dec(means + 0.05 * torch.randn(means.shape, generator=gn))
    chroma = F.l1_loss(rec - rec.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * means.pow(2).mean() + chroma
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
