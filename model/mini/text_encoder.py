"""vidtune's small text encoder for ``ltx2-mini`` (stands in for LTX-2's Gemma encoder and connector).

The mini model's prompts come from a closed grammar (colours, shapes, "bouncing", camera pans), so a
word-level tokenizer and a two-layer transformer encoder are enough. It produces what the LTX-2
transformer expects from the text path: a video context [B, T, video_dim] and an audio context
[B, T, audio_dim], T fixed. Its weights travel in the mini checkpoint under ``text_encoder.`` with
their configuration in the file's ``vidtune_text_encoder`` metadata.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch
from torch import nn

from vidtune.model.mini.data import COLOURS, PANS, SHAPES

__all__ = ["VOCAB", "TextEncoderConfig", "MiniTextEncoder", "tokenize", "KEY_PREFIX"]

KEY_PREFIX = "text_encoder."
VOCAB: tuple[str, ...] = ("<pad>", "<unk>", "<bos>", "a", "and", ",", "bouncing", "camera", "panning",
                          *sorted(COLOURS), *SHAPES, *[p for p in PANS if p != "none"])
_INDEX = {w: i for i, w in enumerate(VOCAB)}


def tokenize(prompt: str, length: int) -> torch.Tensor:
    """Word ids [length]: <bos>, the words (unknown ones -> <unk>), then <pad>; too long raises."""
    words = re.findall(r"[a-z]+|,", prompt.lower())
    ids = [_INDEX["<bos>"]] + [_INDEX.get(w, _INDEX["<unk>"]) for w in words]
    if len(ids) > length:
        raise ValueError(f"prompt has {len(ids) - 1} words; the mini text encoder takes at most {length - 1}")
    return torch.tensor(ids + [_INDEX["<pad>"]] * (length - len(ids)), dtype=torch.long)


@dataclass(frozen=True)
class TextEncoderConfig:
    video_dim: int
    audio_dim: int
    width: int = 128
    layers: int = 2
    heads: int = 4
    tokens: int = 24  # context length the transformer sees (prompt words + <bos> + padding)


class MiniTextEncoder(nn.Module):
    """Word embeddings + positions -> transformer encoder -> video and audio context projections."""

    def __init__(self, cfg: TextEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(len(VOCAB), cfg.width)
        self.pos = nn.Parameter(torch.zeros(cfg.tokens, cfg.width))
        layer = nn.TransformerEncoderLayer(cfg.width, cfg.heads, 4 * cfg.width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.to_video = nn.Linear(cfg.width, cfg.video_dim)
        self.to_audio = nn.Linear(cfg.width, cfg.audio_dim)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(ids) + self.pos[: ids.shape[1]]
        h = self.norm(self.encoder(h))
        return self.to_video(h), self.to_audio(h)

    @torch.no_grad()
    def encode(self, prompts: list[str], dtype: torch.dtype, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Contexts for ``prompts``: ([B, T, video_dim], [B, T, audio_dim]) in ``dtype``."""
        ids = torch.stack([tokenize(p, self.cfg.tokens) for p in prompts]).to(device)
        v, a = self(ids)
        return v.to(dtype), a.to(dtype)

    def config_dict(self) -> dict:
        return asdict(self.cfg)
