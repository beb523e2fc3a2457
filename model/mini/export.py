"""ltx2-mini's export and import: the trained components written as an LTX-2 checkpoint with the text
encoder, an export read back for more training, and the teacher a distillation run learns from."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vidtune.model.weights import identity_latent_statistics
from vidtune.model.mini.parts import COMPONENTS, PRESET, build, parts_of, set_stats

__all__ = ["TEACHER_PARTS", "TEACHER_FILE", "load_teacher", "write_teacher", "export", "import_export"]


def _export_models(folder: Path, dtype: torch.dtype) -> Any:
    """Every component of an export folder, loaded on the CPU through the checkpoint path."""
    from vidtune.model.loading import ModelSource, load_models

    return load_models(ModelSource(preset=None, checkpoint=str(folder / "model.safetensors"),
                                   upsampler=str(folder / "spatial_upsampler.safetensors")), dtype=dtype)


def _training_summary(checkpoint: Path) -> dict[str, Any]:
    """The per-component training summary an export (or a teacher file) carries in its metadata."""
    from safetensors import safe_open

    with safe_open(str(checkpoint), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("vidtune_training", "{}"))


TEACHER_PARTS = ("transformer", "text_encoder")
TEACHER_FILE = "teacher.safetensors"


def _teacher_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """A teacher's transformer and text encoder, keys prefixed by the part: from ``teacher.safetensors``,
    or taken out of an export folder."""
    import safetensors.torch

    if (folder / TEACHER_FILE).is_file():
        return safetensors.torch.load_file(str(folder / TEACHER_FILE))
    models = _export_models(folder, torch.bfloat16)
    return {f"{part}.{k}": v.contiguous() for part, m in zip(TEACHER_PARTS, (models.transformer.velocity_model,
                                                                             models.text_encoder))
            for k, v in m.state_dict().items()}


def load_teacher(folder: str, device: Any) -> dict[str, Any]:
    """The frozen float32 teacher transformer and text encoder of a teacher folder (``teacher.safetensors``,
    or an export), with its provenance; a guidance-distilled teacher is refused (distilling from it would
    compound the guidance)."""
    files = Path(folder)
    checkpoint = files / TEACHER_FILE if (files / TEACHER_FILE).is_file() else files / "model.safetensors"
    if not checkpoint.is_file():
        raise ValueError(f"teacher: {folder} holds neither {TEACHER_FILE} (`train teacher`) nor model.safetensors "
                         "(an export folder)")
    training = _training_summary(checkpoint).get("transformer", {})
    if training.get("distilled"):
        raise ValueError(f"teacher: {checkpoint} is itself guidance-distilled ({training['distilled']}); use the "
                         "undistilled checkpoint it was distilled from (its `teacher_steps`; model/mini/README.md)")
    tensors = _teacher_tensors(files)
    modules = []
    for part in TEACHER_PARTS:
        m = build(part, device)
        m.load_state_dict({k[len(part) + 1:]: v.float() for k, v in tensors.items() if k.startswith(part + ".")})
        modules.append(m.eval().requires_grad_(False))
    return {"modules": tuple(modules), "teacher_steps": int(training.get("steps", 0))}


def write_teacher(export_folder: str, to: str) -> dict[str, Any]:
    """The parts of an export a distillation teacher uses, the transformer and the text encoder (bf16,
    5.9 MB against the export's 18.7 MB, so the teacher fits in a device call beside the tree), as
    ``<to>/teacher.safetensors`` with the export's training summary."""
    import safetensors.torch

    files = Path(export_folder)
    out = Path(to)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(_teacher_tensors(files), str(out / TEACHER_FILE), metadata={
        "vidtune_training": json.dumps(_training_summary(files / "model.safetensors"))})
    return {"teacher": str(out / TEACHER_FILE), "bytes": (out / TEACHER_FILE).stat().st_size}



# ----------------------------------------------------------------------------- export
def export(out: str, to: str) -> dict[str, Any]:
    """Write the trained components as an LTX-2 checkpoint (bf16) + the text encoder under ``text_encoder.``."""
    import safetensors.torch

    from vidtune.model.presets import get_preset
    from vidtune.model.weights import save_checkpoint

    run = Path(out)
    mods: dict[str, torch.nn.Module] = {}
    summary: dict[str, Any] = {}
    for component in COMPONENTS:
        state = torch.load(run / f"{component}.pt", map_location="cpu", weights_only=False)
        for part in parts_of(component):
            m = build(part, "cpu")
            m.load_state_dict(state["model"][part])
            mods[part] = m
        summary[component] = {"steps": state["step"],
                              "seconds": round(state.get("seconds", 0.0) + state.get("seconds_before", 0.0), 1),
                              "last": state["log"][-1] if state["log"] else None}
        if state.get("distilled"):
            summary[component]["distilled"] = state["distilled"]
        if component == "video_vae":
            set_stats(mods["video_encoder"], state["stats"])
            set_stats(mods["video_decoder"], state["stats"])
        if component == "audio_vae":
            set_stats(mods["audio_decoder"], state["stats"])
    preset = get_preset(PRESET)
    target = Path(to)
    components = {k: mods[k].to(torch.bfloat16) for k in ("transformer", "video_encoder", "video_decoder",
                                                          "audio_decoder", "vocoder", "upsampler")}
    files = save_checkpoint(components, preset.config, preset.upsampler_config, target)
    # the text encoder joins the main file under its own prefix; ltx-core's loaders ignore it
    tensors = safetensors.torch.load_file(str(files.checkpoint))
    for k, v in mods["text_encoder"].to(torch.bfloat16).state_dict().items():
        tensors["text_encoder." + k] = v.contiguous()
    meta = {"config": json.dumps(preset.config),
            "vidtune_text_encoder": json.dumps(mods["text_encoder"].config_dict()),
            "vidtune_training": json.dumps(summary)}
    safetensors.torch.save_file(tensors, str(files.checkpoint), metadata=meta)
    # the audio encoder is not part of the pipeline (nor of the shipped 20 MB); it is kept beside the
    # run so a later session can continue training in the same audio latent space (``import``)
    safetensors.torch.save_file({k: v.contiguous() for k, v in mods["audio_encoder"].to(torch.bfloat16).state_dict().items()},
                                str(run / "audio_encoder.safetensors"), metadata={"stats": json.dumps(
                                    torch.load(run / "audio_vae.pt", map_location="cpu", weights_only=False)["stats"])})
    sizes = {p.name: p.stat().st_size for p in (files.checkpoint, files.upsampler)}
    return {"files": {k: str(v) for k, v in asdict(files).items()}, "bytes": sizes, "training": summary}


def import_export(weights: str, audio_encoder: str, out: str) -> dict[str, Any]:
    """Turn a shipped export (+ the audio encoder kept beside it) back into run states to continue training.

    Weights come back in float32 from bf16, the optimiser starts afresh (its state is not shipped), and
    each component keeps its step count and log summary from the export's ``vidtune_training`` metadata.
    """
    import safetensors.torch
    from safetensors import safe_open

    files = Path(weights)
    models = _export_models(files, torch.float32)
    training = _training_summary(files / "model.safetensors")
    with safe_open(audio_encoder, framework="pt") as f:
        audio_stats = json.loads((f.metadata() or {})["stats"])
    enc_state = {k: v.float() for k, v in safetensors.torch.load_file(audio_encoder).items()}
    loaded = {"transformer": models.transformer.velocity_model, "video_encoder": models.video_encoder,
              "video_decoder": models.video_decoder, "audio_decoder": models.audio_decoder, "vocoder": models.vocoder,
              "upsampler": models.upsampler, "text_encoder": models.text_encoder}
    stats = {"video_vae": {"mean": models.video_encoder.per_channel_statistics.get_buffer("mean-of-means").tolist(),
                           "std": models.video_encoder.per_channel_statistics.get_buffer("std-of-means").tolist()},
             "audio_vae": audio_stats}
    run = Path(out)
    run.mkdir(parents=True, exist_ok=True)
    for component in COMPONENTS:
        state = {}
        for part in parts_of(component):
            module = build(part, "cpu")
            src = enc_state if part == "audio_encoder" else {k: v.float() for k, v in loaded[part].state_dict().items()}
            module.load_state_dict(src)
            if component in stats:  # training runs with identity statistics; the measured ones ride along
                identity_latent_statistics(module)
            state[part] = module.state_dict()
        info = training.get(component, {})
        # the learning-rate schedule of the continued run starts afresh: its clock (seconds) restarts
        blob = {"model": state, "opt": None, "step": int(info.get("steps", 0)), "seconds": 0.0,
                "seconds_before": float(info.get("seconds", 0.0)),
                "log": [info["last"]] if info.get("last") else [], "config": {"imported_from": str(files)}}
        if component in stats:
            blob["stats"] = stats[component]
        if info.get("distilled"):
            blob["distilled"] = info["distilled"]
        torch.save(blob, run / f"{component}.pt")
    return {"run": str(run), "steps": {c: training.get(c, {}).get("steps", 0) for c in COMPONENTS}}


# Every TrainConfig field but component, out, device (their own options) and amp (automatic) is a command-line
# option, listed from the dataclass so none is parsed and then dropped (--colour-weight was, until
# 2026-11-30: the third checkpoint's phase-A VAE steps ran unweighted; results/mini/checks/video_vae_grey_6.md).
