"""A/B from the shipped checkpoint at full scale (256x384, 2 clips x 9 frames per step, recipe loss):
argv[1] = joint (encoder + decoder trained, as train.py does) or decoder (encoder frozen).
Held-out PSNR and colour range ratio (4 clips of 17 frames, seeds >= HELD_OUT_SEED) every 40 steps."""
import sys, math, time, torch, torch.nn.functional as F
import vidtune
from vidtune.model.mini.train import clip_batch, colour_range_ratio, HELD_OUT_SEED
from vidtune.model import ModelSource, load_models
torch.set_num_threads(1); torch.manual_seed(0)
w = "model/mini/weights"
m = load_models(ModelSource(preset=None, checkpoint=w + "/model.safetensors", upsampler=w + "/spatial_upsampler.safetensors"))
enc, dec = m.video_encoder.float(), m.video_decoder.float().train()
params = list(dec.parameters())
if sys.argv[1] == "joint":
    enc.train(); params += list(enc.parameters())
else:
    enc.eval().requires_grad_(False)
opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0, betas=(0.9, 0.99))
held = [clip_batch([HELD_OUT_SEED + i], 17, 256, 384, 24.0, "cpu")["video"] for i in range(4)]
g = torch.Generator().manual_seed(0)

def evaluate(step):
    ps, cs = [], []
    with torch.no_grad():
        for x in held:
            r = dec(enc(x))
            a = ((x + 1) / 2).clamp(0, 1).mul(255).round(); b = ((r + 1) / 2).clamp(0, 1).mul(255).round()
            ps.append(10 * math.log10(255 ** 2 / float((a - b).pow(2).mean()))); cs.append(colour_range_ratio(b, a))
    print(sys.argv[1], "step", step, "held-out PSNR", round(sum(ps) / 4, 2), "colour kept", round(sum(cs) / 4, 3), flush=True)

t = time.time()
for s in range(int(sys.argv[2]) + 1):
    if s % 40 == 0:
        evaluate(s)
    if s == int(sys.argv[2]):
        break
    x = clip_batch([s * 2 + i for i in range(2)], 9, 256, 384, 24.0, "cpu")["video"]
    means = enc(x)
    z = means + 0.05 * torch.randn(means.shape, generator=g)
    rec = dec(z)
    loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * means.pow(2).mean() + \
        F.l1_loss(rec - rec.mean(1, keepdim=True), x - x.mean(1, keepdim=True))
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
print(sys.argv[1], "seconds", round(time.time() - t), flush=True)
