"""Kernel choice: video self-attention in 8 bits (kernels/attention8.py: INT8 Q.K^T with smoothed keys, FP8 P.V).

Why: at 1536x1024x121 stage 2's dense video self-attention over 24,576 tokens is about half of a compiled FP8
pass on the H200 (cuDNN attention 843 ms of 1,616 ms, results/benchmarks/), untouched by every exact knob;
Hopper's tensor cores run INT8 and FP8 dots at twice bf16's rate on half the bytes (SageAttention 2's design,
FlashAttention-3's FP8 path). Only video self-attention: the other kinds are short (126 audio tokens, 1,024
text tokens) and not where the time is.

Knobs: the stages it acts in, the first blocks kept in the dense backend, the backend (the Triton kernel or
the PyTorch reference of the same arithmetic). It wraps whatever video self-attention function is installed
(the chosen SDPA backend runs where it does not act), as the sparse techniques do, and shares their seam:
one technique decides what video self-attention computes. Under compile the kernel is one opaque operator
(``vidtune::attention8``, with a fake implementation), so a compiled block stays one graph.
"""

from __future__ import annotations

from typing import Any

import torch

from vidtune.kernels.sdpa import traceable_default
from vidtune.kernels.triton_runtime import triton_available
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

_STAGES = {"stage2": ("stage2",), "both": ("stage1", "stage2")}


class VideoAttention8:
    """ltx-core attention callable: video self-attention in 8 bits in the chosen stages, else the previous
    function (the installed backend; cross-attention calls, masked calls and the layers kept dense too)."""

    def __init__(self, previous: Any, pipeline: Any, stages: tuple[str, ...], backend: str) -> None:
        # (ltx-core's default attention as the callable it stands for: a compiled block traces the fallback too)
        self.previous = traceable_default(previous) or previous
        self.pipeline, self.stages, self.backend = pipeline, stages, backend

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        from vidtune.kernels.attention8 import attention8_op

        ctx = self.pipeline.context
        if mask is not None or ctx is None or ctx.stage not in self.stages:
            return self.previous(q, k, v, heads, mask)
        b, n, hd = q.shape
        d = hd // heads
        qh, kh, vh = (t.reshape(b, t.shape[1], heads, d).transpose(1, 2) for t in (q, k, v))
        out = attention8_op(qh, kh, vh, self.backend)
        return out.transpose(1, 2).reshape(b, n, hd)


@register("kernel_choice.attention8")
class Attention8(Technique):
    """Video self-attention with INT8 scores and FP8 probabilities and values."""

    knobs = (
        Knob("stages", "categorical", off="off", choices=("off", "stage2", "both"),
             help="where video self-attention runs in 8 bits: off, stage 2, or stages 1 and 2"),
        Knob("dense_layers", "int", off=0, low=0, high=48, scales="depth", fast="low",
             help="first transformer blocks kept in the dense backend"),
        Knob("backend", "categorical", off="triton", choices=("triton", "reference"),
             help="the Triton kernel (CUDA; CPU only under TRITON_INTERPRET=1) or the PyTorch reference of the "
                  "same arithmetic (any device)"),
    )
    switch = "stages"
    stages = ("stage1", "stage2")
    seams = ("attention.video_self.sparse",)
    composes_with = {"kernel_choice.sdpa_backend": "8-bit attention falls back to the chosen dense backend"}
    uniform_passes = True
    description = "8-bit video self-attention (INT8 Q.K with smoothed keys, FP8 P.V; SageAttention 2 style)"
    inexact = "scores from INT8 queries and keys, FP8 probabilities and values: about 4% relative error on random inputs"

    def applicable(self, request: Any = None) -> bool:
        # Not offered to a search yet: the first Triton kernel ran at x0.30-0.38 of cuDNN bf16 on an H100
        # (results/benchmarks/attention8/), so every trial of it would be a first pair lost. It stays a knob to
        # apply, bench and evaluate by hand while the kernel is made faster.
        return False

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        # the Triton kernel only where it runs (a campaign runs on one kind of device)
        here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        runs = [b for b in self.knob("backend").choices if b != "triton" or triton_available(here)]
        return self.suggest_restricted(trial, {"backend": runs})

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # a wrapper on every video self-attention, every layer kept in the dense backend: each falls back
        return {"stages": "both", "dense_layers": 48, "backend": "reference"}

    def stages_for(self, values: dict[str, Any]) -> tuple[str, ...]:
        return _STAGES[values["stages"]]

    def check_device(self, values: dict[str, Any], device: Any) -> None:
        if values["backend"] == "triton" and not triton_available(device):
            raise KnobError(f"{self.name}.backend=triton needs a CUDA device (the pipeline runs on {device}); use "
                            "backend=reference, or TRITON_INTERPRET=1 to test on a CPU")

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        self.check_device(values, pipeline.device)
        layers = pipeline.attention_layers("video_self")
        if values["backend"] == "triton":  # (the kernel's tiles span the head dim)
            dims = sorted({m.dim_head for _, m in layers if m.dim_head < 16 or m.dim_head & (m.dim_head - 1)})
            if dims:
                raise KnobError(f"{self.name}.backend=triton takes head dims that are powers of two >= 16; this "
                                f"model's video self-attention has {dims}: use backend=reference")
        patch = Patch(self.name)
        for layer, module in layers:  # (a layer kept dense gets a wrapper that acts nowhere: what it runs is plain)
            stages = _STAGES[values["stages"]] if layer >= values["dense_layers"] else ()
            patch.set_attr(module, "attention_function",
                           VideoAttention8(module.attention_function, pipeline, stages, values["backend"]))
        return patch
