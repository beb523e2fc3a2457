"""The generation request: what to generate, validated before any model is built."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["GenerationRequest", "RequestError", "MODES"]

MODES = ("distilled", "multistep")


class RequestError(ValueError):
    """A request field is invalid; the message names the field and the allowed values."""


@dataclass(frozen=True)
class GenerationRequest:
    """One audio+video generation.

    Attributes:
        prompt: text prompt (mapped to a seeded stand-in embedding without a text encoder).
        prompt_embedding: optional safetensors file with ``video_context``/``audio_context`` (and
            optionally ``negative_video_context``/``negative_audio_context``); overrides ``prompt``.
        negative_prompt: multistep mode's negative prompt (empty: the official default).
        seed: noise seed.
        height: output height in pixels; multiple of 64 (two stages at /2 then x2, latent /32).
        width: output width in pixels; multiple of 64.
        frames: number of frames, 8k+1 (the VAE's 8x temporal compression plus the first frame).
        fps: frames per second (> 0); positions of the video tokens in time depend on it.
        mode: ``distilled`` (8 + 3 steps, one pass each) or ``multistep`` (guided stage 1).
        steps: stage-1 steps in multistep mode (distilled mode uses the official 8).
        stage1_sigmas: explicit stage-1 sigmas overriding the mode's schedule (decreasing, ends 0).
        cfg_scale: video classifier-free guidance scale (multistep).
        audio_cfg_scale: audio CFG scale (multistep).
        stg_scale: spatio-temporal guidance scale, video and audio (multistep).
        modality_scale: audio-video modality guidance scale (multistep).
        rescale_scale: guidance rescale (multistep).
    """

    prompt: str = "a red circle and a blue square bouncing"
    prompt_embedding: str | None = None
    negative_prompt: str = ""
    seed: int = 0
    height: int = 256
    width: int = 384
    frames: int = 17
    fps: float = 24.0
    mode: str = "distilled"
    steps: int = 40
    stage1_sigmas: tuple[float, ...] | None = None
    cfg_scale: float = 3.0
    audio_cfg_scale: float = 7.0
    stg_scale: float = 1.0
    modality_scale: float = 3.0
    rescale_scale: float = 0.7
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.stage1_sigmas is not None and not isinstance(self.stage1_sigmas, tuple):
            object.__setattr__(self, "stage1_sigmas", tuple(float(s) for s in self.stage1_sigmas))
        self.validate()

    def validate(self) -> None:
        """Raise ``RequestError`` naming the first invalid field and what is allowed."""
        for name in ("height", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % 64:
                raise RequestError(
                    f"request.{name} must be a positive multiple of 64 (two-stage pipeline: half "
                    f"resolution then x2, latent /32), got {value!r}"
                )
        if not isinstance(self.frames, int) or isinstance(self.frames, bool) or self.frames < 1 or (self.frames - 1) % 8:
            raise RequestError(f"request.frames must be 8k+1 (1, 9, 17, 25, ..., 121), got {self.frames!r}")
        if not isinstance(self.fps, (int, float)) or isinstance(self.fps, bool) or not self.fps > 0:
            raise RequestError(f"request.fps must be a positive number, got {self.fps!r}")
        if self.mode not in MODES:
            raise RequestError(f"request.mode must be one of {list(MODES)}, got {self.mode!r}")
        # (torch's generators take 64-bit seeds; 10**23 overflowed in stage 1, after the prompt's encoding)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise RequestError(f"request.seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or not 1 <= self.steps <= 1000:
            raise RequestError(f"request.steps must be an integer in [1, 1000], got {self.steps!r}")
        if self.stage1_sigmas is not None:
            s = self.stage1_sigmas
            if len(s) < 2 or any(b >= a for a, b in zip(s, s[1:])) or s[-1] != 0.0 or s[0] > 1.0:
                raise RequestError(
                    f"request.stage1_sigmas must be strictly decreasing from <= 1.0 to 0.0 with at least "
                    f"2 values, got {list(s)!r}"
                )
        for name in ("cfg_scale", "audio_cfg_scale", "stg_scale", "modality_scale", "rescale_scale"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise RequestError(f"request.{name} must be a number >= 0, got {value!r}")
        if not isinstance(self.prompt, str) or (not self.prompt and self.prompt_embedding is None):
            raise RequestError("request.prompt must be a non-empty string (or give request.prompt_embedding)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationRequest":
        """Build a request from a mapping, rejecting unknown fields by name."""
        known = {f.name for f in fields(cls) if f.name != "extra"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RequestError(f"unknown request field(s) {unknown}; allowed fields: {sorted(known)}")
        return cls(**dict(data))

    @classmethod
    def of(cls, value: "GenerationRequest | dict[str, Any]") -> "GenerationRequest":
        """``value`` as a request (a mapping of its fields is validated by ``from_dict``)."""
        return value if isinstance(value, cls) else cls.from_dict(dict(value))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the request."""
        d = asdict(self)
        d.pop("extra", None)
        if d["stage1_sigmas"] is not None:
            d["stage1_sigmas"] = list(d["stage1_sigmas"])
        return d

    def key(self) -> str:
        """sha256 of the sorted JSON of the request (docs/conventions.md: cache keys)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @property
    def stage1_shape(self) -> tuple[int, int]:
        """(height, width) of stage 1: half the output resolution."""
        return self.height // 2, self.width // 2

    def latent_grid(self, stage: int) -> tuple[int, int, int]:
        """(frames, height, width) of the video latent at ``stage`` (1: half resolution, 2: full)."""
        div = 64 if stage == 1 else 32
        return (self.frames - 1) // 8 + 1, self.height // div, self.width // div

    @property
    def pixels(self) -> int:
        """height x width x frames: the output's size (what an out-of-memory record is compared by)."""
        return self.height * self.width * self.frames

    def video_tokens(self, stage: int) -> int:
        """Number of video latent tokens at ``stage`` (1: half resolution, 2: full)."""
        f, h, w = self.latent_grid(stage)
        return f * h * w
