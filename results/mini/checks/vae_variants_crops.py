"""Does the ltx2-mini video VAE learn colour when shapes keep their full-scale size? (CPU, fresh weights)

    python results/mini/checks/vae_variants_crops.py VARIANT STEPS     (NOISE=s: latent noise std, default 0.05)
    PLAIN=1 with any variant: both halves plain PyTorch, as in plainae (the fast control);
    PLAIN=enc / PLAIN=dec: only that half plain, the other ltx-core's (which half blocks a fix)
    For the GPU (results/mini/checks/vae_grey_h200_sweep.sh): DEVICE=cuda (bf16 autocast, as the trainer),
    CROP=0 (whole 256x384 frames; default 64), BATCH (4), FRAMES (9), SECONDS (stop after this much
    training time; 0: STEPS only), EVAL (steps between held-out measures, 250), SATW (satw's weight, 10),
    LR (3e-4), SAVE=path (the final encoder and decoder state dicts, bf16); WEIGHTED=1: satw's loss with
    any variant (e.g. gn)

The first grey-decoder probes trained on whole 64x64 renders, where the shapes are 5-10 px across
(video_vae_grey_2.md, section 5). Here each step renders 4 new scenes at the shipped size (256x384x9)
and trains encoder + decoder jointly on one 64x64 crop of each (32-aligned), with the trainer's loss
(L1 + MSE + chroma L1, latent noise 0.05, small L2 on the means). Every 100 steps the whole 256x384
frames of 3 held-out scenes are reconstructed: PSNR and colour kept (1 = the clip's colour range back,
0 = grey). VARIANT changes one thing in the preset's video VAE config:
  base   the shipped config (pixel_norm, decoder base channels 4 -> 32 channels at every level)
  gn     GroupNorm instead of PixelNorm
  wide   decoder base channels 8 (64 channels at every level)
  lr1e3  base with lr 1e-3 instead of 3e-4
  decnores  the decoder's compress_all blocks without their residual skip (``residual: False``): the skip
         pixel-shuffles 32 channels into 4 and then 1 distinct value per pixel, a common mode that the
         last PixelNorm turns into a sign (vae_flat_zero_init.py's notes)
  ycc    base, trained in a fixed opponent colour space: luma (R+G+B)/3 and two chroma channels
         scaled x4, (R-G)/2 and (R+G-2B)/4, at the encoder's input and the decoder's output (L1 + MSE
         there, no separate chroma term). In RGB the three output rows of conv_out are pushed alike by
         the luma error, and chroma must grow as their small differences; here chroma has its own rows.
         The transform is linear, so it folds into conv_in and conv_out afterwards (same architecture).
  fanin:C  base with the trainer's per-layer rate (``lr_fan_in``=C): a layer of fan-in F at
         min(3e-4, C / F)
  encfanin:C  the same for the encoder's layers only; the decoder at 3e-4
  satw   base with every pixel's loss weighted by 1 + 10 x its RGB range in the clip (the coloured
         shapes are a few percent of the pixels; this makes them count about as much as the background)
  cast   base with a random colour cast on every training crop (each channel shifted by U(-0.3, 0.3),
         clipped to [-1, 1]): chroma in every pixel, not only in the few coloured shapes; held-out clips
         are not cast
  rowlock  base, but after every step the chroma part of the decoder's output rows (conv_out weights
         minus their R/G/B mean) is scaled back up to its norm at initialisation when it fell below it
         (video_vae_grey_4.md, section 5: those rows collapse first)
  decaux base plus a training-only 1x1 head on the decoder's last features (before its last norm)
         that predicts the clip's colour deviation from grey pooled to that grid (weight 10): the
         decoder's trunk must carry colour, whatever its output rows do (video_vae_grey_4.md, section 5)
  slim   the decoder without its res_x blocks and without the compress_all blocks' residual skip (conv_in,
         three upsampling convolutions, conv_out): on flat colours it learns far faster than the shipped
         decoder (vae_flat_swap_parts.py: 23.4 against 13.7 dB after 200 steps)
  plaindec  a control: the ltx-core encoder with a plain PyTorch decoder instead of ltx-core's (nearest
         upsampling x2 in time, height and width, dropping the first frame as ltx-core does, then
         GroupNorm, SiLU and a 3x3x3 convolution; 64, 64, 48, 32 channels; 3x3x3 convolution to the 48
         patch channels and ltx-core's unpatchify; 0.53 M parameters). If it keeps colour where the ltx-core
         decoder does not, the decoder's design is the cause; if not, the data, loss or compression.
  plainae   both halves plain PyTorch: plaindec's decoder and an encoder in its image (ltx-core's
         patchify, 7 copies of the first frame in front, three GroupNorm-SiLU-conv blocks of stride 2 in
         time, height and width; 32, 64, 96, 128 channels; a 3x3x3 convolution to the 128 latent channels)
  greybg  the background's colour removed from every clip (training and held out): pixels whose RGB
         range is under 0.3 (the background's is at most ~0.25, the named colours' far more) are set to
         their grey level, so colour is only in the shapes
  icnr   base with the decoder's sub-pixel convolutions initialised ICNR-style (Aitken et al. 2017): the
         compress_all convolutions (out channel c*8 + p, p the sub-position of the 2x2x2 depth-to-space)
         and conv_out (channel colour*16 + p, p the sub-pixel of the 4x4 unpatchify) start with the same
         weights and bias for every p, so each starts as a convolution followed by nearest upsampling
         (the plaindec control's upsampling) instead of a random per-sub-position pattern
  icnr+nores  icnr, and the compress_all blocks without their residual skip
  aux    base plus a training-only 1x1 head that predicts, from the latent, the clip's colour deviation
         from grey pooled to the latent grid (weight 10): it makes the encoder put colour in the latent
"""
import copy, math, random, sys, time
import torch, torch.nn.functional as F
import vidtune  # noqa: F401
from vidtune.model.mini.train import HELD_OUT_SEED, PRESET, clip_batch, colour_range_ratio, pixel_weights
from vidtune.model.presets import get_preset
from vidtune.model.weights import _configurators, identity_latent_statistics

ENV = __import__("os").environ
torch.set_num_threads(int(ENV.get('THREADS', '2')))
variant, steps = sys.argv[1], int(sys.argv[2])
cfg = copy.deepcopy(get_preset(PRESET).config)
lr = float(ENV.get("LR", "3e-4"))
DEVICE = torch.device(ENV.get("DEVICE", "cpu"))
CROP, BATCH, FRAMES = int(ENV.get("CROP", "64")), int(ENV.get("BATCH", "4")), int(ENV.get("FRAMES", "9"))
SECONDS, EVAL, SATW = float(ENV.get("SECONDS", "0")), int(ENV.get("EVAL", "250")), float(ENV.get("SATW", "10"))
WEIGHTED = variant == "satw" or ENV.get("WEIGHTED") == "1"
if variant == "gn":
    cfg["vae"]["norm_layer"] = "group_norm"
elif variant == "wide":
    cfg["vae"]["decoder_base_channels"] = 8
elif variant == "lr1e3":
    lr = 1e-3
elif variant == "decnores":
    for name, args in cfg["vae"]["decoder_blocks"]:
        if name == "compress_all":
            args["residual"] = False
elif variant in ("icnr", "icnr+nores"):
    if variant == "icnr+nores":
        for name, args in cfg["vae"]["decoder_blocks"]:
            if name == "compress_all":
                args["residual"] = False
elif variant in ("plaindec", "plainae"):
    pass  # replaced below
elif variant == "slim":
    cfg["vae"]["decoder_blocks"] = [[n, {**a, "residual": False}] for n, a in cfg["vae"]["decoder_blocks"] if n != "res_x"]
elif variant not in ("base", "aux", "ycc", "satw", "cast", "rowlock", "decaux", "greybg") and not variant.startswith(("fanin:", "encfanin:")):
    raise SystemExit(f"variant must be one of base, gn, wide, lr1e3, decnores, ycc, aux; got {variant}")
T = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [2.0, -2.0, 0.0], [1.0, 1.0, -2.0]]) if variant == "ycc" else torch.eye(3)


def to_space(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij,bjfhw->bifhw", m, v)
torch.manual_seed(0)
enc = _configurators()["video_encoder"].from_config(cfg).float()
dec = _configurators()["video_decoder"].from_config(cfg).float()
for m in (enc, dec):  # raw latents in training, as the trainer does
    identity_latent_statistics(m)


class PlainDecoder(torch.nn.Module):
    """The ``plaindec`` control (no ltx-core classes): upsample, norm, SiLU, convolution, three times."""

    def __init__(self, ch: tuple[int, ...] = (64, 64, 48, 32)) -> None:
        super().__init__()
        nn = torch.nn
        self.inp = nn.Conv3d(128, ch[0], 3, padding=1)
        self.ups = nn.ModuleList(nn.Sequential(nn.GroupNorm(8, ch[i]), nn.SiLU(), nn.Conv3d(ch[i], ch[i + 1], 3, padding=1))
                                 for i in range(3))
        self.out = nn.Sequential(nn.GroupNorm(8, ch[3]), nn.SiLU(), nn.Conv3d(ch[3], 48, 3, padding=1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        from ltx_core.model.video_vae.ops import unpatchify

        h = self.inp(z)
        for up in self.ups:
            h = up(F.interpolate(h, scale_factor=2, mode="nearest")[:, :, 1:])  # T -> 2T - 1, like ltx-core
        return unpatchify(self.out(h), patch_size_hw=4, patch_size_t=1)


class PlainEncoder(torch.nn.Module):
    """The ``plainae`` control's encoder (no ltx-core classes but patchify)."""

    def __init__(self, ch: tuple[int, ...] = (32, 64, 96, 128)) -> None:
        super().__init__()
        nn = torch.nn
        self.inp = nn.Conv3d(48, ch[0], 3, padding=1)
        self.downs = nn.ModuleList(nn.Sequential(nn.GroupNorm(8, ch[i]), nn.SiLU(),
                                                 nn.Conv3d(ch[i], ch[i + 1], 3, stride=2, padding=1)) for i in range(3))
        self.out = nn.Sequential(nn.GroupNorm(8, ch[3]), nn.SiLU(), nn.Conv3d(ch[3], 128, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ltx_core.model.video_vae.ops import patchify

        h = self.inp(F.pad(patchify(x, patch_size_hw=4, patch_size_t=1), (0, 0, 0, 0, 7, 0), mode="replicate"))
        for down in self.downs:  # 1 + 8k frames -> 8 + 8k -> 1 + k latent frames
            h = down(h)
        return self.out(h)


PLAIN = __import__("os").environ.get("PLAIN", "")
if variant in ("plaindec", "plainae") or PLAIN in ("1", "dec"):
    torch.manual_seed(1)
    dec = PlainDecoder()
if variant == "plainae" or PLAIN in ("1", "enc"):
    torch.manual_seed(2)
    enc = PlainEncoder()


def icnr_(conv: torch.nn.Conv3d, sub: int) -> None:
    """Give the ``sub`` outputs of each group (channels g*sub .. g*sub + sub - 1) the first one's weights."""
    with torch.no_grad():
        w = conv.weight.reshape(-1, sub, *conv.weight.shape[1:])
        w.copy_(w[:, :1].expand_as(w))
        if conv.bias is not None:
            b = conv.bias.reshape(-1, sub)
            b.copy_(b[:, :1].expand_as(b))


if variant.startswith("icnr"):
    from ltx_core.model.video_vae.sampling import DepthToSpaceUpsample

    for m in dec.modules():
        if isinstance(m, DepthToSpaceUpsample):
            icnr_(m.conv.conv, 8)
    icnr_(dec.conv_out.conv, 16)
enc, dec, T = enc.to(DEVICE), dec.to(DEVICE), T.to(DEVICE)
head = torch.nn.Conv3d(128, 3, 1).to(DEVICE)  # used by "aux" only; never part of the VAE
dec_head = torch.nn.Conv3d(32 if isinstance(dec, PlainDecoder) else dec.conv_out.conv.in_channels, 3, 1).to(DEVICE)  # "decaux" only
dec_feats: list[torch.Tensor] = []
if variant == "decaux":
    dec.up_blocks[-1].register_forward_hook(lambda m, a, out: dec_feats.append(out))
params = [*enc.parameters(), *dec.parameters(), *(head.parameters() if variant == "aux" else []),
          *(dec_head.parameters() if variant == "decaux" else [])]
if variant.startswith(("fanin:", "encfanin:")):
    from vidtune.model.mini.train import param_groups

    c = float(variant.split(":")[1])
    groups = param_groups([enc, dec], lr, c) if variant.startswith("fanin:") else \
        param_groups([enc], lr, c) + param_groups([dec], lr, 0.0)
    for gr in groups:
        gr["lr"] = lr * gr["lr_scale"]
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
else:
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
held = clip_batch([HELD_OUT_SEED + i for i in range(3)], FRAMES, 256, 384, 24.0, DEVICE)["video"]
rng, g = random.Random(0), torch.Generator().manual_seed(0)
FIXED = __import__("os").environ.get("FIXED") == "1"
NOISE = float(__import__("os").environ.get("NOISE", "0.05"))  # the trainer's latent noise (std, constant)
if FIXED:  # measured on the whole frames of the 4 training scenes instead of held-out ones
    held = clip_batch([0, 1, 2, 3], FRAMES, 256, 384, 24.0, DEVICE)["video"]


def grey_background(v: torch.Tensor) -> torch.Tensor:
    """``greybg``: pixels with an RGB range under 0.3 (the background) set to their grey level."""
    grey = v.mean(1, keepdim=True).expand_as(v)
    return torch.where((v.amax(1, keepdim=True) - v.amin(1, keepdim=True)) < 0.3, grey, v)


if variant == "greybg":
    held = grey_background(held)
print(variant, {"1": "plain halves", "enc": "plain encoder", "dec": "plain decoder"}.get(PLAIN, ""), "decoder params", sum(p.numel() for p in dec.parameters()), "lr", lr,
      "latent noise", NOISE, "device", DEVICE, "crop", CROP, "batch", BATCH, "frames", FRAMES,
      *(("satw weight", SATW) if WEIGHTED else ()), flush=True)
amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEVICE.type == "cuda")
t = time.time()
for s in range(steps + 1):
    last = s == steps or (SECONDS and time.time() - t > SECONDS)
    if s % EVAL == 0 or last:
        with torch.no_grad(), amp:
            rec = to_space(dec(enc(to_space(held, T))).float(), torch.linalg.inv(T))
        print(variant, s, "held-out PSNR", round(10 * math.log10(4 / float(F.mse_loss(rec, held))), 2),
              "colour kept", round(colour_range_ratio(rec, held), 3), f"{time.time() - t:.0f}s", flush=True)
    if last:
        break
    # FIXED=1: the same scenes every step (memorisation); else BATCH new scenes per step
    full = clip_batch([(0 if FIXED else s * BATCH) + i for i in range(BATCH)], FRAMES, 256, 384, 24.0, DEVICE)["video"]
    crops = []
    for b in range(BATCH):
        if not CROP:
            crops.append(full[b])
            continue
        y, x = rng.randrange(0, 256 - CROP + 1, 32), rng.randrange(0, 384 - CROP + 1, 32)
        crops.append(full[b, :, :, y:y + CROP, x:x + CROP])
    xb = to_space(torch.stack(crops), T)
    if variant == "greybg":
        xb = grey_background(xb)
    if variant == "cast":
        xb = (xb + (torch.rand(BATCH, 3, 1, 1, 1, generator=g).to(DEVICE) * 0.6 - 0.3)).clamp(-1, 1)
    with amp:
        means = enc(xb)
        rec = dec(means + NOISE * torch.randn(means.shape, generator=g).to(DEVICE))
    means, rec = means.float(), rec.float()
    chroma = F.l1_loss(rec - rec.mean(1, keepdim=True), xb - xb.mean(1, keepdim=True)) if variant != "ycc" else 0.0
    if WEIGHTED:
        w = pixel_weights(xb, SATW)  # the trainer's colour_weight (TrainConfig)
        err = rec - xb
        chroma = (w * ((rec - rec.mean(1, keepdim=True)) - (xb - xb.mean(1, keepdim=True))).abs()).mean() / w.mean()
        loss = ((w * err.abs()).mean() + (w * err.pow(2)).mean()) / w.mean() + 1e-4 * means.pow(2).mean() + chroma
    else:
        loss = F.l1_loss(rec, xb) + F.mse_loss(rec, xb) + 1e-4 * means.pow(2).mean() + chroma
    if variant == "decaux":
        feats = dec_feats[-1]
        target = F.adaptive_avg_pool3d(xb - xb.mean(1, keepdim=True), feats.shape[2:])
        loss = loss + 10 * F.mse_loss(dec_head(feats.float()), target)
    dec_feats.clear()
    if variant == "aux":
        target = F.adaptive_avg_pool3d(xb - xb.mean(1, keepdim=True), means.shape[2:])
        loss = loss + 10 * F.mse_loss(head(means), target)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
    if variant == "rowlock":
        with torch.no_grad():
            w = dec.conv_out.conv.weight  # (48, C, kt, kh, kw); output channel c is colour c // 16
            per = w.reshape(3, 16, *w.shape[1:])
            chroma = per - per.mean(0, keepdim=True)
            if s == 0:
                floor = float(chroma.norm())
            norm = float(chroma.norm())
            if norm < floor:
                per += chroma * (floor / norm - 1)
if ENV.get("SAVE"):
    from safetensors.torch import save_file

    save_file({**{f"encoder.{k}": v.to(torch.bfloat16).contiguous() for k, v in enc.state_dict().items()},
               **{f"decoder.{k}": v.to(torch.bfloat16).contiguous() for k, v in dec.state_dict().items()}}, ENV["SAVE"])
