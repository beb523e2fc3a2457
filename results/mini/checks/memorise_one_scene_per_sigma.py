import sys, torch, torch.nn.functional as F
import vidtune
from vidtune.model.mini import train as T
from ltx_core.guidance.perturbations import BatchedPerturbationConfig
from ltx_core.model.transformer.modality import Modality
torch.set_num_threads(2)
run = sys.argv[1]
cfg = T.TrainConfig(component="transformer", out=run, height=256, width=384, frames=9)
mods = {p: T.build(p, "cpu") for p in ("transformer", "text_encoder")}
st = torch.load(f"{run}/transformer.pt", weights_only=False)
for p in mods: mods[p].load_state_dict(st["model"][p]); mods[p].eval()
mods.update({k: v for k, v in T._load_frozen(T.Path(run), "video_vae", "cpu").items() if k == "video_encoder"})
T._apply_stats(mods["video_encoder"], T.Path(run) / "video_vae.pt")
mods.update({k: v for k, v in T._load_frozen(T.Path(run), "audio_vae", "cpu").items() if k == "audio_encoder"})
T._apply_stats(mods["audio_encoder"], T.Path(run) / "audio_vae.pt")
proc = T._processor("cpu")
b = T.clip_batch([11], 9, 256, 384, 24.0, "cpu", audio_rate=T.AUDIO_RATE)
with torch.no_grad():
    vlat = mods["video_encoder"](b["video"]); alat = mods["audio_encoder"](T._mel(b["audio"], proc))
    print("video latent std", float(vlat.std()), "mean", float(vlat.mean()))
    ids = torch.stack([T.tokenize(p, mods["text_encoder"].cfg.tokens) for p in b["prompts"]])
    vctx, actx = mods["text_encoder"](ids)
    for s in (1.0, 0.95, 0.9, 0.7, 0.4, 0.1, 0.02):
        g = torch.Generator().manual_seed(0)
        sigma = torch.tensor([s])
        inp = T.flow_inputs(vlat, alat, 24.0, 9, 256, 384, sigma, g)
        mv = Modality(latent=inp["video"]["xs"], sigma=sigma, timesteps=inp["video"]["timesteps"], positions=inp["video"]["state"].positions, context=vctx)
        ma = Modality(latent=inp["audio"]["xs"], sigma=sigma, timesteps=inp["audio"]["timesteps"], positions=inp["audio"]["state"].positions, context=actx)
        vv, va = mods["transformer"](mv, ma, BatchedPerturbationConfig.empty(1))
        tv = inp["video"]["eps"] - inp["video"]["x0"]
        # x0 estimate from the prediction
        x0_hat = inp["video"]["xs"] - s * vv
        print(f"sigma {s}: video v-mse {float(F.mse_loss(vv, tv)):.3f}  zero-pred {float(tv.pow(2).mean()):.3f}  "
              f"x0-mse {float(F.mse_loss(x0_hat, inp['video']['x0'])):.3f}  audio v-mse {float(F.mse_loss(va, inp['audio']['eps'] - inp['audio']['x0'])):.3f}")
