"""End-to-end sanity of the mini recipe on the CPU: memorise one scene (both stages), export, generate
its prompt with the two-stage distilled pipeline, and compare with the scene's own clip."""
import json, sys, time
import torch
import vidtune
from vidtune.model.mini import train as T
from vidtune.model.mini.data import sample_scene

torch.set_num_threads(2)
SEED, H, W, F_ = 11, 256, 384, 9
run = sys.argv[1]
steps = int(sys.argv[2])
cache = {}
def fixed_batch(cfg, i, dev):
    stage = 1 if i % 2 == 0 else 2
    if stage not in cache:
        h, w = (cfg.height // 2, cfg.width // 2) if stage == 1 else (cfg.height, cfg.width)
        b = T.clip_batch([SEED], cfg.frames, h, w, cfg.fps, dev, audio_rate=T.AUDIO_RATE,
                         render_height=cfg.height, render_width=cfg.width)
        b.update(stage=stage, h=h, w=w)
        cache[stage] = b
    return cache[stage]
T._make_batch = fixed_batch
t0 = time.time()
state = torch.load(f"{run}/transformer.pt", weights_only=False)
res = T.train(T.TrainConfig(component="transformer", out=run, steps=state["step"] + steps, batch=1, lr=1e-3,
                            height=H, width=W, frames=F_, log_every=50, save_every=100000))
print("trained", res, round(time.time() - t0, 1), "s", flush=True)
