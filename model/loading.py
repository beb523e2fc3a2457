"""Build the pipeline's models: from a preset (seeded random weights) or a real LTX-2 checkpoint.

Every path ends in ltx-core's own classes; presets small enough to write (``tiny``) are materialised as a
checkpoint in the released key layout and read back through ltx_pipelines' ``ModelLedger``, exactly as a
real checkpoint is, so there is one loading path to trust.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vidtune.model.presets import Preset, get_preset
from vidtune.model.weights import build_random_component, materialise_preset

__all__ = ["ModelSource", "ModelSourceError", "Models", "load_models", "file_sha256", "check_lora_matches"]


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: a preset name, or a checkpoint path (+ upsampler path).

    Attributes:
        preset: preset name (``tiny``, ``ltx2-19b``) or None for a checkpoint.
        checkpoint: a real LTX-2 safetensors file (``config`` metadata, released key layout).
        upsampler: the latent spatial upsampler file that goes with the checkpoint.
        gemma_root: optional Gemma 3 folder; when given, the real text encoder runs once per request.
        stg_blocks: blocks whose self-attention STG skips (checkpoint default: the official [29]).
        distilled_lora: the distilled LoRA that the official two-stage pipeline (``TI2VidTwoStagesPipeline``)
            fuses into stage 2's transformer (ltx-core's LoRA loader); stage 1 runs the checkpoint as it is.
        distilled_lora_strength: its strength (the official default is 1.0).
    """

    preset: str | None = "tiny"
    checkpoint: str | None = None
    upsampler: str | None = None
    gemma_root: str | None = None
    stg_blocks: tuple[int, ...] | None = None
    distilled_lora: str | None = None
    distilled_lora_strength: float = 1.0

    def __post_init__(self) -> None:
        if (self.preset is None) == (self.checkpoint is None):
            raise ValueError("model: give exactly one of model.preset or model.checkpoint")
        if self.preset is not None:
            get_preset(self.preset)
        if self.checkpoint is not None:
            if not Path(self.checkpoint).is_file():
                raise ValueError(f"model.checkpoint must be an existing .safetensors file, got {self.checkpoint!r}")
            if self.upsampler is None or not Path(self.upsampler).is_file():
                raise ValueError(
                    f"model.upsampler must be the spatial upsampler .safetensors file for the checkpoint, got {self.upsampler!r}"
                )
            check_checkpoint(self.checkpoint, self.upsampler)  # headers only: before any model is built
        if self.distilled_lora is not None:
            if self.checkpoint is None:
                raise ValueError("model.distilled_lora needs model=checkpoint (a preset has no LoRA to fuse), "
                                 f"got preset={self.preset!r}")
            if not Path(self.distilled_lora).is_file():
                raise ValueError(f"model.distilled_lora must be an existing LoRA .safetensors file, got {self.distilled_lora!r}")
        if not isinstance(self.distilled_lora_strength, (int, float)) or not math.isfinite(self.distilled_lora_strength):
            raise ValueError(f"model.distilled_lora_strength must be a finite number, got {self.distilled_lora_strength!r}")
        if self.distilled_lora is not None:
            check_lora_matches(self.distilled_lora, self.checkpoint)  # headers only: before any model is built

    def identity(self) -> dict:
        """What the model is, for cache keys: preset name, or the checkpoint's content hash."""
        if self.preset is not None:
            return {"preset": self.preset}
        out = {"checkpoint_sha256": file_sha256(Path(self.checkpoint)), "upsampler_sha256": file_sha256(Path(self.upsampler))}
        if self.distilled_lora is not None:  # absent otherwise: keys of earlier baselines and configs stay valid
            out.update(distilled_lora_sha256=file_sha256(Path(self.distilled_lora)),
                       distilled_lora_strength=float(self.distilled_lora_strength))
        return out


_HASH_CACHE: dict[tuple[str, float, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (memoised on path, mtime and size)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime, st.st_size)
    if key not in _HASH_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _HASH_CACHE[key] = h.hexdigest()
    return _HASH_CACHE[key]


@dataclass
class Models:
    """The loaded components of the two-stage pipeline (ltx-core modules, eval mode)."""

    transformer: torch.nn.Module  # ltx_core X0Model wrapping LTXModel
    video_encoder: torch.nn.Module  # used for its per-channel statistics around the upsampler
    video_decoder: torch.nn.Module
    audio_decoder: torch.nn.Module
    vocoder: torch.nn.Module
    upsampler: torch.nn.Module
    stg_blocks: tuple[int, ...]
    context_tokens: int
    ledger: object | None = None  # ModelLedger when loaded from a file (used for the Gemma path)
    text_encoder: torch.nn.Module | None = None  # ltx2-mini's own small encoder (checkpoint metadata)
    # stage 2's own transformer: the checkpoint's with the distilled LoRA fused (ModelSource.distilled_lora),
    # as the official TI2VidTwoStagesPipeline runs stage 2; None: stage 2 uses ``transformer``
    stage2_transformer: torch.nn.Module | None = None

    @property
    def video_context_dim(self) -> int:
        return self.transformer.velocity_model.inner_dim

    @property
    def audio_context_dim(self) -> int:
        return self.transformer.velocity_model.audio_cross_attention_dim


def _from_files(checkpoint: str, upsampler: str, gemma_root: str | None, device: torch.device, dtype: torch.dtype,
                stg_blocks: tuple[int, ...], context_tokens: int, lora: tuple[str, float] | None = None) -> Models:
    from ltx_pipelines.utils.model_ledger import ModelLedger

    ledger = ModelLedger(
        dtype=dtype,
        device=device,
        checkpoint_path=checkpoint,
        spatial_upsampler_path=upsampler,
        gemma_root_path=gemma_root,
    )
    text_encoder = _mini_text_encoder(checkpoint, device, dtype)
    transformer = ledger.transformer()
    stage2 = _stage2_transformer(ledger, transformer, lora, dtype) if lora is not None else None
    return Models(
        transformer=transformer,
        video_encoder=ledger.video_encoder(),
        video_decoder=ledger.video_decoder(),
        audio_decoder=ledger.audio_decoder(),
        vocoder=ledger.vocoder(),
        upsampler=ledger.spatial_upsampler(),
        stg_blocks=stg_blocks,
        context_tokens=text_encoder.cfg.tokens if text_encoder is not None else context_tokens,
        ledger=ledger,
        text_encoder=text_encoder,
        stage2_transformer=stage2,
    )


class ModelSourceError(ValueError):
    """Model files that cannot go together (a LoRA for another checkpoint); the message names the field."""


def _shapes(path: str, field: str) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a safetensors file by key (header only, no tensor is read)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # a file safetensors cannot read
        raise ModelSourceError(f"{field}={path!r} is not a readable safetensors file: {exc}") from None


def check_checkpoint(checkpoint: str, upsampler: str) -> None:
    """Raise ``ModelSourceError`` naming the field unless both files read as safetensors and the checkpoint
    holds what ltx-core's loader needs: its ``config`` metadata and the transformer's ``diffusion_model.``
    weights (a garbage file raised safetensors' raw error from inside the loader)."""
    import json

    from safetensors import safe_open

    shapes = _shapes(checkpoint, "model.checkpoint")
    with safe_open(checkpoint, framework="pt") as f:
        meta = f.metadata() or {}
    try:
        config = json.loads(meta.get("config", ""))
    except ValueError:
        config = None
    if not isinstance(config, dict) or "transformer" not in config:
        raise ModelSourceError(f"model.checkpoint={checkpoint!r} has no LTX-2 'config' metadata (a JSON object with a "
                               f"'transformer' entry); metadata keys seen: {sorted(meta)[:5]}")
    if not any(k.startswith("model.diffusion_model.") or ".diffusion_model." in k for k in shapes):
        raise ModelSourceError(f"model.checkpoint={checkpoint!r} holds no transformer weights (keys "
                               f"model.diffusion_model.*); keys seen: {sorted(shapes)[:3]}")
    if not _shapes(upsampler, "model.upsampler"):
        raise ModelSourceError(f"model.upsampler={upsampler!r} holds no tensors")


def check_lora_matches(lora_path: str, checkpoint: str) -> int:
    """Raise ``ModelSourceError`` naming ``model.distilled_lora`` unless every LoRA pair in the file targets a
    linear weight of the checkpoint's transformer with matching shapes (A: [rank, in], B: [out, rank]);
    returns the number of pairs. Reads only the two files' headers, so it runs before any model is built.

    ltx-core's fusion skips keys it does not find, so a LoRA for another model would otherwise load
    silently as no LoRA at all."""
    marker = "diffusion_model."
    weights = {k.split(marker, 1)[1]: v for k, v in _shapes(checkpoint, "model.checkpoint").items() if marker in k}
    shapes = {k.removeprefix(marker): v for k, v in _shapes(lora_path, "model.distilled_lora").items()}
    prefixes = sorted({k[: -len(".lora_A.weight")] for k in shapes if k.endswith(".lora_A.weight")})
    if not prefixes:
        raise ModelSourceError(f"model.distilled_lora={lora_path!r} holds no LoRA pairs (<layer>.lora_A.weight and "
                               f"<layer>.lora_B.weight); keys seen: {sorted(shapes)[:3]}")
    for p in prefixes:
        a, b, w = shapes[f"{p}.lora_A.weight"], shapes.get(f"{p}.lora_B.weight"), weights.get(f"{p}.weight")
        if b is None:
            raise ModelSourceError(f"model.distilled_lora={lora_path!r}: {p}.lora_A.weight has no lora_B partner")
        if w is None:
            raise ModelSourceError(f"model.distilled_lora={lora_path!r} does not match the checkpoint: it targets {p}.weight, "
                                   f"which the checkpoint's transformer does not have")
        if len(w) != 2 or a[0] != b[1] or a[1] != w[1] or b[0] != w[0]:
            raise ModelSourceError(f"model.distilled_lora={lora_path!r} does not match the checkpoint: {p} is {list(w)} in the "
                                   f"checkpoint, the LoRA's A is {list(a)} and B is {list(b)}")
    return len(prefixes)


def _stage2_transformer(ledger: Any, stage1: torch.nn.Module, lora: tuple[str, float], dtype: torch.dtype) -> torch.nn.Module:
    """Stage 2's transformer as the official two-stage pipeline builds it: the ledger with the distilled
    LoRA added, through ltx-core's loader (the LoRA fused into the weights). Parameters the LoRA leaves
    unchanged share stage 1's storage, so the second transformer costs only the layers it changes."""
    from ltx_core.loader import LTXV_LORA_COMFY_RENAMING_MAP, LoraPathStrengthAndSDOps

    path, strength = lora
    if dtype != torch.bfloat16:
        raise ModelSourceError(f"model.distilled_lora needs bf16 weights (ltx-core fuses LoRAs into bf16 only), got {dtype}")
    stage2 = ledger.with_additional_loras((LoraPathStrengthAndSDOps(path, float(strength), LTXV_LORA_COMFY_RENAMING_MAP),)
                                          ).transformer()
    mine = dict(stage1.named_parameters())
    with torch.no_grad():
        for name, p in stage2.named_parameters():
            if name in mine and p.shape == mine[name].shape and torch.equal(p, mine[name]):
                p.data = mine[name].data
    return stage2


def _mini_text_encoder(checkpoint: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module | None:
    """vidtune's small text encoder when the checkpoint carries one (``ltx2-mini``), else None."""
    import json

    from safetensors import safe_open

    with safe_open(checkpoint, framework="pt") as f:
        meta = f.metadata() or {}
        if "vidtune_text_encoder" not in meta:
            return None
        from vidtune.model.mini.text_encoder import KEY_PREFIX, MiniTextEncoder, TextEncoderConfig

        module = MiniTextEncoder(TextEncoderConfig(**json.loads(meta["vidtune_text_encoder"])))
        state = {k[len(KEY_PREFIX):]: f.get_tensor(k) for k in f.keys() if k.startswith(KEY_PREFIX)}
    module.load_state_dict(state)
    return module.to(device=device, dtype=dtype).eval()


def mini_weights(folder: Path | None = None) -> "CheckpointFiles":
    """The shipped ``ltx2-mini`` checkpoint files; a clear error while they are not trained yet."""
    from vidtune.model.weights import CheckpointFiles

    folder = folder or Path(__file__).resolve().parent / "mini" / "weights"
    files = CheckpointFiles(folder / "model.safetensors", folder / "spatial_upsampler.safetensors")
    if not (files.checkpoint.is_file() and files.upsampler.is_file()):
        raise ValueError(
            f"model.preset=ltx2-mini: its trained weights are not in {folder} yet; train them with "
            "`python -m vidtune.model.mini.train` (model/mini/README.md) or use model=tiny"
        )
    return files


def load_models(source: ModelSource, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Models:
    """Load every component for ``source`` on ``device`` in ``dtype`` (bf16, as the official pipelines)."""
    from ltx_core.model.transformer import X0Model

    device = torch.device(device)
    if source.checkpoint is not None:
        stg = source.stg_blocks if source.stg_blocks is not None else (29,)
        lora = (source.distilled_lora, source.distilled_lora_strength) if source.distilled_lora else None
        return _from_files(source.checkpoint, source.upsampler, source.gemma_root, device, dtype, stg, 1024, lora)
    preset: Preset = get_preset(source.preset)
    tokens = preset.extra.get("context_tokens", 64)
    if preset.name == "ltx2-mini":
        files = mini_weights()
        return _from_files(str(files.checkpoint), str(files.upsampler), None, device, dtype, preset.stg_blocks, tokens)
    if preset.name == "tiny":
        files = materialise_preset(preset, dtype=dtype)
        return _from_files(str(files.checkpoint), str(files.upsampler), None, device, dtype, preset.stg_blocks, tokens)
    # Large presets: build on the device directly (writing 38 GB of random weights helps nobody).
    parts = {
        name: build_random_component(preset, name, device=device, dtype=dtype)
        for name in ("transformer", "video_encoder", "video_decoder", "audio_decoder", "vocoder", "upsampler")
    }
    return Models(
        transformer=X0Model(parts["transformer"]).eval(),
        video_encoder=parts["video_encoder"],
        video_decoder=parts["video_decoder"],
        audio_decoder=parts["audio_decoder"],
        vocoder=parts["vocoder"],
        upsampler=parts["upsampler"],
        stg_blocks=preset.stg_blocks,
        context_tokens=tokens,
    )
