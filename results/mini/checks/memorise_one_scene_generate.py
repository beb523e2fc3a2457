import sys, torch
import vidtune
from vidtune.model.mini import train as T
from vidtune.model.mini.data import sample_scene
from vidtune.model.mini.evidence import colour_presence
from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, load_models
from vidtune.search.metrics import psnr_db
torch.set_num_threads(2)
run, to = sys.argv[1], sys.argv[2]
T.export(run, to)
models = load_models(ModelSource(preset=None, checkpoint=f"{to}/model.safetensors", upsampler=f"{to}/spatial_upsampler.safetensors"))
sc = sample_scene(11)
print("prompt:", sc.prompt)
truth = T.clip_batch([11], 9, 256, 384, 24.0, "cpu")["video"]  # [1,3,F,H,W] in [-1,1]
truth_u8 = ((truth[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
with torch.no_grad():
    dt = next(models.video_encoder.parameters()).dtype
    rec = models.video_decoder(models.video_encoder(truth.to(dt)))
rec_u8 = ((rec[0].permute(1, 2, 3, 0).float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
print("VAE recon PSNR", float(psnr_db(truth_u8, rec_u8).mean()))
for seed in (0, 1):
    out = ReferencePipeline(models).run(GenerationRequest(prompt=sc.prompt, seed=seed, height=256, width=384, frames=9, fps=24.0))
    f = out.frames
    print("seed", seed, "PSNR vs truth", float(psnr_db(truth_u8, f).mean()), "colours", {k: v for k, v in colour_presence(f).items() if v})
other = ReferencePipeline(models).run(GenerationRequest(prompt=sample_scene(12).prompt, seed=0, height=256, width=384, frames=9, fps=24.0))
print("other prompt PSNR vs truth", float(psnr_db(truth_u8, other.frames).mean()))
print("truth colours", {k: v for k, v in colour_presence(truth_u8).items() if v})
import numpy as np
from PIL import Image
Image.fromarray(np.concatenate([truth_u8[4].numpy(), rec_u8[4].numpy(), f[4].numpy()], 1)).save(f"{run}/compare.png")
