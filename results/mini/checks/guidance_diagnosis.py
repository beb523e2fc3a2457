import sys, json, torch
sys.path.insert(0, ".")
from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, load_models
from vidtune.model.mini.evidence import _prompts, colour_presence, H, W, FRAMES, FPS
from vidtune.model.mini.data import COLOURS
from ltx_pipelines.utils.constants import DISTILLED_SIGMA_VALUES
torch.set_num_threads(2)
pipe = ReferencePipeline(load_models(ModelSource(preset="ltx2-mini")))
modes = {
 "distilled": dict(),
 "ms_plain": dict(mode="multistep", cfg_scale=1.0, audio_cfg_scale=1.0, stg_scale=0.0, modality_scale=1.0),
 "ms_cfg7_only": dict(mode="multistep", cfg_scale=7.0, audio_cfg_scale=7.0, stg_scale=0.0, modality_scale=1.0),
 "ms8_cfg7_only": dict(mode="multistep", cfg_scale=7.0, audio_cfg_scale=7.0, stg_scale=0.0, modality_scale=1.0, stage1_sigmas=[float(s) for s in DISTILLED_SIGMA_VALUES]),
 "ms_cfg7_default": dict(mode="multistep", cfg_scale=7.0),
}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
for name, kw in modes.items():
    rec, fp, ch = [], [], []
    for i, sc in enumerate(_prompts(n)):
        gen = pipe.run(GenerationRequest(prompt=sc.prompt, seed=i, height=H, width=W, frames=FRAMES, fps=FPS, **kw))
        pres = colour_presence(gen.frames); pr = {s.colour for s in sc.shapes}
        rec.append(sum(pres[c] for c in pr) / len(pr)); others = [c for c in COLOURS if c not in pr]
        fp.append(sum(pres[c] for c in others) / len(others))
        ch.append(float((gen.frames[1:].float() - gen.frames[:-1].float()).abs().mean() / 255))
    print(name, json.dumps(dict(recall=sum(rec)/n, fp=sum(fp)/n, change=sum(ch)/n)), flush=True)
