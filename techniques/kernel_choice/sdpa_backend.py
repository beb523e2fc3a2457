"""Kernel choice: the SDPA backend per attention kind (video self, audio self, text cross, a2v, v2a).

Attention shapes in LTX-2 differ by orders of magnitude (24k video queries over 24k keys, 126 audio
queries over 24k video keys), and the best backend differs with them (docs/architecture.md: cuDNN 16.1 ms
vs flash 28.3 ms on video self-attention; flash 0.15 ms vs cuDNN 0.26 ms on audio-over-video). Each
knob puts one backend first in the priority list; the rest follow PyTorch's default order, so an
unsupported shape falls back instead of failing.
"""

from __future__ import annotations

from typing import Any

from vidtune.kernels.sdpa import SDPA_BACKENDS, SDPAAttention, settle_default_priority
from vidtune.model.generation import ATTENTION_KINDS
from vidtune.techniques.registry import Knob, Patch, Technique, register

_CHOICES = ("off", *sorted(SDPA_BACKENDS))


@register("kernel_choice.sdpa_backend")
class SDPABackend(Technique):
    """Choose the scaled-dot-product-attention backend per attention kind."""

    knobs = tuple(
        Knob(kind, "categorical", off="off", choices=_CHOICES,
             help=f"SDPA backend tried first for {kind} attention (off: ltx-core's default attention)")
        for kind in ATTENTION_KINDS
    )
    # Bit-exactness across backends is not promised (different accumulation orders); each backend is
    # an exact attention, so only the floating-point noise floor changes.
    stages = ("stage1", "stage2")
    uniform_passes = True
    independent_knobs = True  # (one attention kind's backend does not change another's cost)
    seams = tuple(f"attention.{kind}" for kind in ATTENTION_KINDS)
    description = "SDPA backend priority per attention kind (cuDNN, flash, efficient, math)"

    inexact = "on CUDA each backend accumulates in its own order; no choice is the default's kernel for every shape"

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        # On a CPU, PyTorch's default dispatch for these shapes is the flash CPU kernel (tested bit for bit)
        return {"video_self": "flash", "audio_self": "flash"} if device.type == "cpu" else None

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        # before any attention of this setting runs, compiled or not (kernels/sdpa.py: else the process's
        # default attention can be left on flash for good)
        settle_default_priority(getattr(pipeline, "device", "cpu"))
        for kind, backend in values.items():
            if backend == "off":
                continue
            fn = SDPAAttention(backend)
            for module in pipeline.attention_modules(kind):
                patch.set_attr(module, "attention_function", fn)
        return patch
