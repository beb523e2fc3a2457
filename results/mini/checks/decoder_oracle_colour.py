"""Can the ltx2-mini video decoder route colour at all on the distribution? (CPU, fresh weights)

    python results/mini/checks/decoder_oracle_colour.py oracle 300   # latent channels 0-2 = the clip's colour
    python results/mini/checks/decoder_oracle_colour.py plain 300    # the same run without it

The decoder alone is trained on 64x64x9 procedural clips (4 per step, new scenes every step) from a
frozen fresh encoder's latent. With ``oracle`` the first three latent channels are replaced by the
clip's colour deviation from grey, average-pooled to the latent grid (x5): the information is handed to
the decoder, so a decoder that still decodes in grey cannot use colour it is given.
"""
import math, sys, time
import torch, torch.nn.functional as F
import vidtune  # noqa: F401
from vidtune.model.mini.train import build, clip_batch, colour_range_ratio
torch.set_num_threads(2); torch.manual_seed(0)
mode, steps = sys.argv[1], int(sys.argv[2])
enc, dec = build("video_encoder", "cpu").eval().requires_grad_(False), build("video_decoder", "cpu")
opt = torch.optim.AdamW(dec.parameters(), lr=3e-4, weight_decay=0.0, betas=(0.9, 0.99))
t = time.time()
for s in range(steps + 1):
    x = clip_batch([s * 4 + i for i in range(4)], 9, 64, 64, 24.0, "cpu")["video"]
    chroma_x = x - x.mean(1, keepdim=True)
    with torch.no_grad():
        z = enc(x)
        if mode == "oracle":
            z = torch.cat([5 * F.adaptive_avg_pool3d(chroma_x, z.shape[2:]), z[:, 3:]], 1)
    rec = dec(z)
    loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + F.l1_loss(rec - rec.mean(1, keepdim=True), chroma_x)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(dec.parameters(), 1.0); opt.step()
    if s % 25 == 0:
        print(mode, s, "PSNR", round(10 * math.log10(4 / float(F.mse_loss(rec.detach(), x))), 2), "colour kept",
              round(colour_range_ratio(rec.detach(), x), 3), round(time.time() - t), flush=True)
