import torch, vidtune
from vidtune.model import ModelSource, load_models
from vidtune.model.mini.train import HELD_OUT_SEED, clip_batch
torch.set_num_threads(2)
w="model/mini/weights"
m = load_models(ModelSource(preset=None, checkpoint=w+"/model.safetensors", upsampler=w+"/spatial_upsampler.safetensors"))
clip = clip_batch([HELD_OUT_SEED], 17, 256, 384, 24.0, "cpu")["video"].to(torch.bfloat16)
with torch.no_grad():
    z1 = m.video_encoder(clip).float()
    z2 = m.video_encoder(clip[:, [2, 0, 1]]).float()
    zg = m.video_encoder(clip.mean(1, keepdim=True).expand_as(clip).contiguous()).float()
    print("latent std", z1.std().item(), "perm diff", (z1 - z2).std().item(), "grey-input diff", (z1 - zg).std().item())
    # decoder: perturb latent along random directions, does output colour change?
    r1 = m.video_decoder(z1.to(torch.bfloat16)).float()
    print("decoded chroma std", (r1 - r1.mean(1, keepdim=True)).std().item(), "input chroma std", (clip.float() - clip.float().mean(1, keepdim=True)).std().item())
    enc = m.video_encoder
    print([n for n, _ in enc.named_children()])
