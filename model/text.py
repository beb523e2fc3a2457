"""Prompt contexts: a seeded stand-in embedding, a stored embedding file, or the real Gemma encoder."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

__all__ = ["PromptContexts", "standin_context", "load_embedding_file", "DEFAULT_NEGATIVE_PROMPT"]

try:  # the official default negative prompt (multistep mode)
    from ltx_pipelines.utils.constants import DEFAULT_NEGATIVE_PROMPT
except Exception:  # pragma: no cover - ltx_pipelines is a hard dependency; keep import-light paths alive
    DEFAULT_NEGATIVE_PROMPT = "blurry, out of focus"


@dataclass(frozen=True)
class PromptContexts:
    """Text conditioning for both modalities; negatives only for multistep guidance."""

    video: torch.Tensor  # [1, L, video inner dim]
    audio: torch.Tensor  # [1, L, audio inner dim]
    negative_video: torch.Tensor | None = None
    negative_audio: torch.Tensor | None = None


def standin_context(prompt: str, dim: int, tokens: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A seeded N(0, 1) context of shape [1, tokens, dim]; the seed is the sha256 of the prompt.

    Stands in for Gemma + the embeddings connector when no text encoder is available: different prompts
    give different contexts, the same prompt always the same one.
    """
    seed = int.from_bytes(hashlib.sha256(f"{prompt}|{dim}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, tokens, dim, generator=g).to(device=device, dtype=dtype)


def load_embedding_file(path: str, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Read a prompt embedding file (keys ``video_context``, ``audio_context``, optional ``negative_*``)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"request.prompt_embedding must be an existing .safetensors file, got {path!r}")
    tensors = safetensors.torch.load_file(str(p))
    missing = {"video_context", "audio_context"} - set(tensors)
    if missing:
        raise ValueError(f"request.prompt_embedding {path!r} lacks keys {sorted(missing)}; has {sorted(tensors)}")
    return {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
