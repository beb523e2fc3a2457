"""Seeded random weights for presets, and checkpoints in the real LTX-2 key layout.

A preset's components are the real ltx-core classes built by ltx-core's configurators. Random weights
are drawn from one seeded generator in a fixed parameter order, so a preset and a seed always give the
same model. ``save_checkpoint`` writes them with the key prefixes and ``config`` metadata of a released
LTX-2 safetensors file, so that the same ``ModelLedger`` loaders read presets and real checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from vidtune.model.presets import Preset

__all__ = [
    "CheckpointFiles",
    "configurators",
    "build_random_component",
    "identity_latent_statistics",
    "init_random_",
    "materialise_preset",
    "save_checkpoint",
    "COMPONENT_PREFIXES",
]

# Key prefixes of a released LTX-2 checkpoint, per component (ltx-core's *_COMFY_KEYS_FILTER ops strip
# exactly these).
COMPONENT_PREFIXES: dict[str, str] = {
    "transformer": "model.diffusion_model.",
    "video_encoder": "vae.",
    "video_decoder": "vae.",
    "audio_decoder": "audio_vae.",
    "vocoder": "vocoder.",
}

def configurators() -> dict:
    from ltx_core.model.audio_vae import AudioDecoderConfigurator, VocoderConfigurator
    from ltx_core.model.transformer import LTXModelConfigurator
    from ltx_core.model.upsampler import LatentUpsamplerConfigurator
    from ltx_core.model.video_vae import VideoDecoderConfigurator, VideoEncoderConfigurator

    return {
        "transformer": LTXModelConfigurator,
        "video_encoder": VideoEncoderConfigurator,
        "video_decoder": VideoDecoderConfigurator,
        "audio_decoder": AudioDecoderConfigurator,
        "vocoder": VocoderConfigurator,
        "upsampler": LatentUpsamplerConfigurator,
    }


@torch.no_grad()
def init_random_(module: torch.nn.Module, *, std: float | None, generator: torch.Generator) -> None:
    """Overwrite every parameter of ``module`` with seeded values, in named order.

    Biases are zero, norm scales and other 1-D gains are one, and matrices/filters are normal with
    ``std`` (the transformer's visible-effect scale) or, when ``std`` is None, 1/sqrt(fan_in) so that
    convolutional decoders keep activations of order one.
    """
    for name, param in module.named_parameters():
        if name.endswith("bias"):
            param.zero_()
        elif param.ndim < 2:  # norm scales, snake alphas, scalar multipliers: neutral gains
            param.fill_(1.0)
        else:
            fan_in = param[0].numel() if param.ndim > 1 else 1
            scale = std if std is not None else 1.0 / math.sqrt(max(fan_in, 1))
            if "scale_shift_table" in name:
                scale = std if std is not None else 0.1
            noise = torch.randn(param.shape, generator=generator, device=generator.device, dtype=torch.float32)
            param.copy_(noise * scale)
    identity_latent_statistics(module)


@torch.no_grad()
def identity_latent_statistics(module: torch.nn.Module) -> None:
    """Per-channel latent statistics (VAE ``per_channel_statistics`` buffers) set to mean 0, std 1."""
    for name, buf in module.named_buffers():
        if name.endswith("std-of-means"):
            buf.fill_(1.0)
        elif name.endswith("mean-of-means"):
            buf.zero_()


def build_random_component(
    preset: Preset,
    component: str,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """Build one component of ``preset`` with seeded random weights.

    The transformer is built on the meta device and materialised directly on ``device`` in ``dtype`` (the
    19B shape never exists in host memory, nor in float32); the small components are built on the CPU so that their computed
    buffers (vocoder filters, windows) are real, then moved.
    """
    configurator = configurators()[component]
    config = preset.upsampler_config if component == "upsampler" else preset.config
    device = torch.device(device)
    seed = int.from_bytes(hashlib.sha256(f"{preset.name}/{preset.weight_seed}/{component}".encode()).digest()[:4], "little")
    if component == "transformer":
        with torch.device("meta"):
            module = configurator.from_config(config)
        # materialised in ``dtype``: the same values as in float32 then cast (init_random_ draws float32 noise
        # and copies it in, rounding once either way), without the float32 copy, 4 bytes a parameter (the
        # 19B's 76.8 GiB filled an 80 GB H100 before anything else ran)
        module = module.to(dtype=dtype).to_empty(device=device)
        generator = torch.Generator(device=device).manual_seed(seed)
        init_random_(module, std=preset.init_std, generator=generator)
    else:
        module = configurator.from_config(config)
        init_random_(module, std=None, generator=torch.Generator().manual_seed(seed))
    return module.to(device=device, dtype=dtype).eval()


@dataclass(frozen=True)
class CheckpointFiles:
    """Paths of a checkpoint in the released layout: the main file and the upsampler file."""

    checkpoint: Path
    upsampler: Path


def save_checkpoint(components: dict[str, torch.nn.Module], config: dict, upsampler_config: dict, out_dir: Path) -> CheckpointFiles:
    """Write ``components`` as an LTX-2 checkpoint (main file + upsampler file) under ``out_dir``.

    Keys carry the released prefixes (``model.diffusion_model.``, ``vae.encoder.``, ``vae.decoder.``,
    ``vae.per_channel_statistics.``, ``audio_vae.decoder.``, ``vocoder.``) and the metadata carries the
    ``config`` JSON that ltx-core's configurators read.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for component, module in components.items():
        if component == "upsampler":
            continue
        prefix = COMPONENT_PREFIXES[component]
        for key, value in module.state_dict().items():
            if component == "video_encoder" and not key.startswith("per_channel_statistics."):
                key = "encoder." + key
            elif component == "video_decoder" and not key.startswith("per_channel_statistics."):
                key = "decoder." + key
            elif component == "audio_decoder" and not key.startswith("per_channel_statistics."):
                key = "decoder." + key
            tensors[prefix + key] = value.detach().contiguous().cpu()
    checkpoint = out_dir / "model.safetensors"
    upsampler = out_dir / "spatial_upsampler.safetensors"
    _atomic_save(tensors, checkpoint, {"config": json.dumps(config)})
    up_tensors = {k: v.detach().contiguous().cpu() for k, v in components["upsampler"].state_dict().items()}
    _atomic_save(up_tensors, upsampler, {"config": json.dumps(upsampler_config)})
    return CheckpointFiles(checkpoint=checkpoint, upsampler=upsampler)


def _atomic_save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def cache_root() -> Path:
    """Folder for materialised preset checkpoints (``VIDTUNE_CACHE`` or ``~/.cache/vidtune``)."""
    return Path(os.environ.get("VIDTUNE_CACHE", Path.home() / ".cache" / "vidtune"))


def materialise_preset(preset: Preset, dtype: torch.dtype = torch.bfloat16) -> CheckpointFiles:
    """Write ``preset``'s seeded random weights as a checkpoint (once; cached by a content key).

    Only for presets small enough to write (tiny); the 19B shape is built directly on the GPU.
    """
    key_src = json.dumps(
        {"config": preset.config, "up": preset.upsampler_config, "std": preset.init_std, "seed": preset.weight_seed,
         "dtype": str(dtype), "torch": torch.__version__.split("+")[0]},
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    out_dir = cache_root() / "presets" / f"{preset.name}-{key}"
    files = CheckpointFiles(out_dir / "model.safetensors", out_dir / "spatial_upsampler.safetensors")
    if files.checkpoint.exists() and files.upsampler.exists():
        return files
    components = {
        name: build_random_component(preset, name, dtype=dtype)
        for name in ("transformer", "video_encoder", "video_decoder", "audio_decoder", "vocoder", "upsampler")
    }
    return save_checkpoint(components, preset.config, preset.upsampler_config, out_dir)
