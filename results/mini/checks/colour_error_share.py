"""Share of the video VAE reconstruction error that is colour (the error minus its RGB mean), held-out clips."""
import torch, vidtune
from vidtune.model import ModelSource, load_models
from vidtune.model.mini.train import HELD_OUT_SEED, clip_batch
torch.set_num_threads(2)
w="model/mini/weights"
m = load_models(ModelSource(preset=None, checkpoint=w+"/model.safetensors", upsampler=w+"/spatial_upsampler.safetensors"))
for i in range(3):
    x = clip_batch([HELD_OUT_SEED + i], 17, 256, 384, 24.0, "cpu")["video"]
    with torch.no_grad():
        r = m.video_decoder(m.video_encoder(x.bfloat16())).float()
    e = r - x
    lum = e.mean(1, keepdim=True)
    chrom = e - lum
    print(i, "mse", round(float(e.pow(2).mean()),4), "luma part", round(float(lum.pow(2).mean()*3),4), "chroma part", round(float(chrom.pow(2).mean()),4),
          "x chroma energy", round(float((x - x.mean(1, keepdim=True)).pow(2).mean()),4), "rec luma mean", [round(float(v),3) for v in r.mean((0,2,3,4))], "x", [round(float(v),3) for v in x.mean((0,2,3,4))])
