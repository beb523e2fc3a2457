"""Train ``ltx2-mini``: every component of the two-stage pipeline, on procedural clips made on the fly.

    python -m vidtune.model.mini.train video_vae   --out runs/mini --steps 4000 --device cuda --time-budget 540
    python -m vidtune.model.mini.train audio_vae   --out runs/mini ...
    python -m vidtune.model.mini.train vocoder     --out runs/mini ...
    python -m vidtune.model.mini.train upsampler   --out runs/mini ...   (needs video_vae)
    python -m vidtune.model.mini.train transformer --out runs/mini ...   (needs video_vae, audio_vae; trains the text encoder too)
    python -m vidtune.model.mini.train export      --out runs/mini --to model/mini/weights
    python -m vidtune.model.mini.train import      --out runs/mini --to model/mini/weights  (continue later)

Every component is an ltx-core class built from the ``ltx2-mini`` preset's config (the text encoder is
vidtune's). Each run resumes from ``<out>/<component>.pt`` (weights, optimiser, step, data position,
log), saves every ``--save-every`` steps and when ``--time-budget`` seconds are spent, so training
can be spread over several short device calls. Objectives:

- video VAE: L1 + MSE reconstruction of clips in [-1, 1], Gaussian noise on the latent means (0.05)
  and a small L2 pull on them (the encoder's log-variance channel is not used). The per-channel
  latent statistics are measured after training (``stats``) so that latents are unit-scale for the
  transformer, as in LTX-2.
- audio VAE: L1 on the log-mel spectrogram (ltx-core's ``AudioProcessor``: 16 kHz, 64 bins, hop 160).
- vocoder: multi-resolution STFT loss (log magnitude L1 + spectral convergence) between the vocoder's
  24 kHz output from the true log-mel and the clip's 24 kHz audio.
- upsampler: MSE between upsample(latent of the half-resolution render) and the latent of the
  full-resolution render of the same scene (ltx-core's ``upsample_video`` normalisation).
- transformer + text encoder: flow matching (x_s = (1 - s) x0 + s eps, target eps - x0) on video and
  audio latents, stage 1 at half resolution with sigmas from the distilled stage-1 schedule and stage 2
  at full resolution with the stage-2 schedule (70%), uniform sigmas otherwise (30%); the prompt is
  dropped 10% of the time, so the multistep mode's CFG has an unconditional model.
- transformer with ``--distill-cfg W --teacher DIR``: guidance and trajectory distillation for the
  distilled pipeline (``TrainConfig.distill_cfg``): over each interval of the distilled schedules, the
  velocity that lands where the teacher's CFG-W Euler substeps land.

    python -m vidtune.model.mini.train teacher --to EXPORT --out DIR   (DIR/teacher.safetensors: a teacher)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from vidtune.model.mini.export import export, import_export, load_teacher, write_teacher
from vidtune.model.mini.objectives import STEPS, colour_range_ratio, distill_step
from vidtune.model.mini.parts import (COMPONENTS, HELD_OUT_SEED, TrainConfig, apply_stats, build, clip_batch, load_frozen,
                                      make_batch, measure_stats, param_groups, parts_of, processor)

# the training entry points, and the parts other modules (the evidence, the tests) take from here
__all__ = ["TrainConfig", "COMPONENTS", "STEPS", "train", "export", "import_export", "write_teacher", "build",
           "clip_batch", "make_batch", "colour_range_ratio", "HELD_OUT_SEED"]


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train (or resume) one component; returns the saved state's summary."""
    if cfg.component not in COMPONENTS:
        raise ValueError(f"component must be one of {list(COMPONENTS)}, got {cfg.component!r}")
    if cfg.reuse < 1:
        raise ValueError(f"reuse must be >= 1, got {cfg.reuse}")
    if cfg.chroma < 0:
        raise ValueError(f"chroma must be >= 0 (a loss weight), got {cfg.chroma}")
    if not 0 <= cfg.colour_cast <= 1 or (cfg.colour_cast and cfg.component != "video_vae"):
        raise ValueError(f"colour_cast must be in [0, 1], and above 0 only for video_vae; got {cfg.colour_cast} "
                         f"for {cfg.component}")
    if cfg.colour_weight < 0 or (cfg.colour_weight and cfg.component != "video_vae"):
        raise ValueError(f"colour_weight must be >= 0, and above 0 only for video_vae; got {cfg.colour_weight} "
                         f"for {cfg.component}")
    if cfg.freeze_encoder not in (0, 1) or (cfg.freeze_encoder and cfg.component != "video_vae"):
        raise ValueError(f"freeze_encoder must be 0 or 1, and 1 only for video_vae; got {cfg.freeze_encoder} "
                         f"for {cfg.component}")
    if cfg.distill_cfg < 0 or (cfg.distill_cfg and cfg.component != "transformer"):
        raise ValueError(f"distill_cfg must be >= 0 (0: off), and above 0 only for transformer; got "
                         f"{cfg.distill_cfg} for {cfg.component}")
    if cfg.distill_cfg and not cfg.distill_max_step > 0:
        raise ValueError(f"distill_max_step must be > 0, got {cfg.distill_max_step}")
    if cfg.distill_cfg and not cfg.teacher:
        raise ValueError("teacher: distill_cfg > 0 needs a teacher folder, an export or teacher.safetensors "
                         "(--teacher DIR)")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device)
    teacher_info = load_teacher(cfg.teacher, device) if cfg.distill_cfg else None
    path = out / f"{cfg.component}.pt"
    mods: dict[str, Any] = {p: build(p, device).train() for p in parts_of(cfg.component)}
    if cfg.component in ("upsampler", "transformer"):
        mods.update({k: v for k, v in load_frozen(out, "video_vae", device).items() if k == "video_encoder"})
        apply_stats(mods["video_encoder"], out / "video_vae.pt")
    if cfg.component == "transformer":
        mods.update({k: v for k, v in load_frozen(out, "audio_vae", device).items() if k == "audio_encoder"})
        apply_stats(mods["audio_encoder"], out / "audio_vae.pt")
    mods["processor"] = processor(device)
    if teacher_info is not None:
        mods["teacher"], mods["teacher_text"] = teacher_info.pop("modules")
    frozen = ("video_encoder",) if cfg.freeze_encoder else ()
    trained_parts = [mods[part] for part in parts_of(cfg.component) if part not in frozen]
    trainable = [p for m in trained_parts for p in m.parameters()]
    opt = torch.optim.AdamW(param_groups(trained_parts, cfg.lr, cfg.lr_fan_in), lr=cfg.lr, weight_decay=0.0,
                            betas=(0.9, 0.99))
    # seconds: trained since the last import (the schedule's clock); seconds_before: trained before it
    state: dict[str, Any] = {"step": 0, "log": [], "config": asdict(cfg), "seconds": 0.0, "seconds_before": 0.0}
    warm_from = 0
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=False)
        for part in parts_of(cfg.component):
            mods[part].load_state_dict(saved["model"][part])
        same_params = saved.get("config", {}).get("freeze_encoder", 0) == cfg.freeze_encoder
        # the saved optimiser fits only the same parameter groups (lr_fan_in on or off changes them)
        same_groups = saved.get("opt") is not None and \
            [len(g["params"]) for g in saved["opt"]["param_groups"]] == [len(g["params"]) for g in opt.param_groups]
        if same_params and same_groups:  # an imported export has no optimiser state
            opt.load_state_dict(saved["opt"])
        else:  # a fresh optimiser (also when freeze_encoder changes the trained parameters) warms up again
            warm_from = saved["step"]
        state.update(step=saved["step"], log=saved["log"], seconds=saved.get("seconds", 0.0),
                     seconds_before=saved.get("seconds_before", 0.0))
        if "stats" in saved:
            state["stats"] = saved["stats"]
        if saved.get("distilled"):
            state["distilled"] = saved["distilled"]
        if cfg.restart_schedule:
            state["seconds_before"] += state["seconds"]
            state["seconds"] = 0.0
            warm_from = state["step"]
    if state.get("distilled") and not cfg.distill_cfg:
        raise ValueError(f"{path} holds a guidance-distilled transformer ({state['distilled']}): plain flow "
                         "matching would undo the distillation; continue with --distill-cfg and --teacher")
    if teacher_info is not None:  # the first distilled step and the teacher's provenance ride with the state
        state["distilled"] = {"cfg": cfg.distill_cfg, "max_step": cfg.distill_max_step, **teacher_info,
                              "from_step": state.get("distilled", {}).get("from_step", state["step"])}
    for part in frozen:  # after loading: the saved encoder is the one kept
        mods[part].eval().requires_grad_(False)
    # the transformer's flow-matching noise is drawn on the GPU when training there (no host draw and copy,
    # which waits for the GPU, every step); the other components and the CPU keep the CPU generator
    on_gpu_noise = cfg.component == "transformer" and device.type == "cuda"
    g = torch.Generator(device=device) if on_gpu_noise else torch.Generator()
    g.manual_seed(cfg.seed * 65_537 + state["step"])
    step_fn = distill_step if cfg.distill_cfg else STEPS[cfg.component]
    start = time.time()
    use_bf16 = device.type == "cuda" if cfg.amp is None else cfg.amp

    def save() -> None:
        state["seconds"] += time.time() - start_save[0]
        start_save[0] = time.time()
        blob = {"model": {p: mods[p].state_dict() for p in parts_of(cfg.component)}, "opt": opt.state_dict(),
                "step": state["step"], "log": state["log"], "config": asdict(cfg), "seconds": state["seconds"],
                "seconds_before": state["seconds_before"]}
        if state.get("distilled"):
            blob["distilled"] = state["distilled"]
        if cfg.component in ("video_vae", "audio_vae"):
            blob["stats"] = measure_stats(cfg, mods, device)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(blob, tmp)
        os.replace(tmp, path)

    start_save = [time.time()]
    cached: list[Any] = [None, None]
    while state["step"] < cfg.steps:
        lr = cfg.lr * min(1.0, (state["step"] - warm_from + 1) / 100)  # warm-up
        progress = state["step"] / max(cfg.steps, 1)
        if cfg.schedule_s:  # on a time budget the schedule follows the seconds spent, summed over resumes
            progress = max(progress, (state["seconds"] + time.time() - start_save[0]) / cfg.schedule_s)
        lr *= 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # cosine to 2% of the peak
        for group in opt.param_groups:
            group["lr"] = max(lr, cfg.lr * 0.02) * group["lr_scale"]
        g.manual_seed(cfg.seed * 65_537 + state["step"])  # per-step noise: a resumed run continues exactly
        data_index = state["step"] // cfg.reuse  # resumes exactly: the batch is re-rendered from its index
        if cached[0] != data_index:
            cached[:] = [data_index, make_batch(cfg, data_index, device)]
        batch = cached[1]
        batch["step_seed"] = cfg.seed * 1_000_003 + state["step"]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, info = step_fn(mods, batch, cfg, g)
        logging = (state["step"] + 1) % cfg.log_every == 0 or state["step"] + 1 == cfg.steps
        saving = (state["step"] + 1) % cfg.save_every == 0
        out_of_time = bool(cfg.time_budget_s) and time.time() - start > cfg.time_budget_s
        # reading the loss waits for the GPU: there it is checked when logging or saving (a non-finite loss
        # spreads to every later one, and nothing non-finite is saved), on the CPU every step
        if (device.type != "cuda" or logging or saving or out_of_time) and not torch.isfinite(loss):
            raise FloatingPointError(f"{cfg.component}: loss is {float(loss.detach())} at step {state['step']}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        state["step"] += 1
        if logging:
            state["log"].append({"step": state["step"], "loss": float(loss.detach()),
                                 **{k: float(v) if torch.is_tensor(v) else v for k, v in info.items()},
                                 "elapsed_s": round(state["seconds"] + time.time() - start_save[0], 1)})
            print(json.dumps(state["log"][-1]), flush=True)
        if saving:
            save()
        if out_of_time:
            break
    save()
    return {"component": cfg.component, "step": state["step"], "last": state["log"][-1] if state["log"] else None}



_CLI_INT = tuple(f.name for f in fields(TrainConfig) if f.type in (int, "int") and f.name not in ("component", "out"))
_CLI_FLOAT = tuple(f.name for f in fields(TrainConfig) if f.type in (float, "float"))
_CLI_STR = tuple(f.name for f in fields(TrainConfig) if f.type in (str, "str") and f.name not in ("component", "out", "device"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vidtune.model.mini.train", description=__doc__.split("\n\n")[0])
    p.add_argument("component", choices=[*COMPONENTS, "export", "import", "teacher"],
                   help="teacher: write --out/teacher.safetensors from the export in --to (distillation's teacher)")
    p.add_argument("--audio-encoder", default="results/mini/audio_encoder.safetensors",
                   help="import: the audio encoder kept beside the export")
    p.add_argument("--out", required=True, help="run folder (resumable state per component)")
    p.add_argument("--to", default="model/mini/weights", help="export: folder of the shipped checkpoint")
    for f in _CLI_INT:
        p.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(TrainConfig, f))
    for f in _CLI_FLOAT:
        p.add_argument(f"--{f.removesuffix('_s').replace('_', '-')}", dest=f, type=float, default=getattr(TrainConfig, f))
    for f in _CLI_STR:
        p.add_argument(f"--{f.replace('_', '-')}", default=getattr(TrainConfig, f))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    if a.component == "export":
        print(json.dumps(export(a.out, a.to), indent=2))
        return 0
    if a.component == "teacher":
        print(json.dumps(write_teacher(a.to, a.out), indent=2))
        return 0
    if a.component == "import":
        print(json.dumps(import_export(a.to, a.audio_encoder, a.out), indent=2))
        return 0
    cfg = TrainConfig(component=a.component, out=a.out, device=a.device, **{k: getattr(a, k) for k in _CLI_INT + _CLI_FLOAT + _CLI_STR})
    print(json.dumps(train(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
