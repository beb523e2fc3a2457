"""Does a zero-initialised residual branch let the ltx2-mini video VAE learn flat colours? (CPU)

    python results/mini/checks/vae_flat_zero_init.py VARIANT STEPS [LR] [shapes]

VARIANT: ``base`` (the trainer's fresh weights) or a '+'-joined set of
  ``res``   zero the second convolution of every ResnetBlock3D (the block starts as the identity);
  ``down``  zero the convolution of every SpaceToDepthDownsample (encoder: starts as average pooling);
  ``up``    zero the convolution of every residual DepthToSpaceUpsample (decoder: starts as a pixel
            shuffle of its input, repeated);
  ``const``  add 3.0 to the bias of 8 of the encoder's conv_in channels and 4 of the decoder's conv_in
            channels: a large constant rides in each residual stream, so every PixelNorm divides by a
            nearly constant norm and passes the colour (including its magnitude) nearly linearly;
  ``decnores`` build the decoder's ``compress_all`` blocks with ``residual: False`` (an ltx-core config
            option): no skip path around the upsampling convolutions.
With all three the VAE starts as conv_in -> pooling -> norm -> conv_out and back through pixel shuffles:
the colour of every 32x32x8 block reaches the latent linearly, instead of through four random residual
branches whose outputs the last PixelNorm has to untangle. Same data, loss and optimiser as
``vae_flat_colours.py`` (flat random colours in [-1, 1]^3, 64x64x9, 4 clips per step, AdamW
lr 3e-4, latent noise 0.05, the trainer's loss). Prints held-out PSNR and colour kept every 50 steps.
"""
import math, sys, time
import torch, torch.nn.functional as F
import vidtune  # noqa: F401
from vidtune.model.mini.train import build, colour_range_ratio

torch.set_num_threads(int(__import__("os").environ.get("THREADS", "2")))
variant, steps = sys.argv[1], int(sys.argv[2])
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-4
with_shapes = len(sys.argv) > 4 and sys.argv[4] == "shapes"
parts = set() if variant == "base" else set(variant.split("+"))
if parts - {"res", "down", "up", "decnores", "const"}:
    raise SystemExit(f"VARIANT: base or a '+'-joined set of res, down, up, decnores, const; got {variant!r}")

enc, dec = build("video_encoder", "cpu"), build("video_decoder", "cpu")
if "decnores" in parts:
    import copy
    from vidtune.model.presets import get_preset
    from vidtune.model.weights import _configurators, identity_latent_statistics
    cfg = copy.deepcopy(get_preset("ltx2-mini").config)
    for name, args in cfg["vae"]["decoder_blocks"]:
        if name == "compress_all":
            args["residual"] = False
    torch.manual_seed(sum(map(ord, "video_decoder")))  # build()'s seed
    dec = _configurators()["video_decoder"].from_config(cfg).float()
    identity_latent_statistics(dec)
with torch.no_grad():
    for m in [*enc.modules(), *dec.modules()]:
        kind = type(m).__name__
        if ("res" in parts and kind == "ResnetBlock3D") or ("down" in parts and kind == "SpaceToDepthDownsample") \
                or ("up" in parts and kind == "DepthToSpaceUpsample" and m.residual):
            conv = m.conv2.conv if kind == "ResnetBlock3D" else m.conv.conv
            conv.weight.zero_(); conv.bias.zero_()
    if "const" in parts:
        enc.conv_in.conv.bias[:8] += 3.0
        dec.conv_in.conv.bias[:4] += 3.0


def clips(n: int, g: torch.Generator) -> torch.Tensor:
    c = torch.rand(n, 3, 1, 1, 1, generator=g) * 2 - 1
    x = c.expand(n, 3, 9, 64, 64).clone()
    if with_shapes:
        for i in range(n):
            s = int(torch.randint(16, 41, (1,), generator=g))
            y, z = (int(v) for v in torch.randint(0, 64 - s + 1, (2,), generator=g))
            x[i, :, :, y:y + s, z:z + s] = (torch.rand(3, 1, 1, 1, generator=g) * 2 - 1)
    return x


params = [*enc.parameters(), *dec.parameters()]
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
held = clips(8, torch.Generator().manual_seed(123))
g, gn = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
t = time.time()
for s in range(steps + 1):
    if s % 50 == 0:
        with torch.no_grad():
            rec = dec(enc(held))
        print(variant, "shapes" if with_shapes else "flat", f"lr {lr}", s, "held-out PSNR",
              round(10 * math.log10(4 / float(F.mse_loss(rec, held))), 2), "colour kept",
              round(colour_range_ratio(rec, held), 3), f"{time.time() - t:.0f}s", flush=True)
    x = clips(4, g)
    means = enc(x)
    rec = dec(means + 0.05 * torch.randn(means.shape, generator=gn))
    chroma = F.l1_loss(rec - rec.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * means.pow(2).mean() + chroma
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
