"""Static spatio-temporal neighbourhood attention for stage-2 video self-attention (NATTEN ``na3d``).

Every video query attends to a fixed window of the latent T x H x W grid around it instead of all
tokens; stage 1, the first ``dense_steps`` stage-2 steps and the first ``dense_layers`` blocks stay
dense (with whichever dense backend is installed). ``backend`` chooses NATTEN (Hopper FNA on the H200,
its flex path on a CPU) or the PyTorch masked reference.
"""

from __future__ import annotations

from typing import Any

import torch

from vidtune.kernels.neighborhood import na3d, na3d_reference, natten_available
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

# The masked reference builds the whole [heads, N, N] fp32 score matrix of stage 2's video tokens: at the 19B's
# 32 heads and 1536x1024x121 (24,576 tokens) that is 77 GB before the softmax's copy, and it ran out of memory on
# the H200 in both 1536x1024 campaigns (h200-19b-1536d, -1536e), a trial lost each time. Up to 8,192 tokens
# (768x512x121 has 6,144) the scores are <= 8.6 GB at 32 heads: a reference, not a fast path, so no larger.
REFERENCE_MAX_TOKENS = 8192


def _reference_fits(request: Any) -> bool:
    """Whether the masked reference's dense scores fit for ``request`` (None: no request to judge, yes)."""
    return request is None or request.video_tokens(2) <= REFERENCE_MAX_TOKENS


class WindowVideoAttention:
    """ltx-core attention callable: a 3-D window in stage 2 past the dense steps, else the previous one."""

    needs_whole_queries = True  # routing and windows see every query of the sequence (sequence_parallel)

    def __init__(self, previous: Any, pipeline: Any, values: dict[str, Any]) -> None:
        self.previous, self.pipeline, self.values = previous, pipeline, values

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        ctx = self.pipeline.context
        if (mask is not None or ctx is None or ctx.stage != "stage2" or ctx.step < self.values["dense_steps"]
                or ctx.grid is None or q.shape[1] != k.shape[1]):
            return self.previous(q, k, v, heads, mask)
        b, n, hd = q.shape
        d = hd // heads
        qh, kh, vh = (t.reshape(b, n, heads, d).transpose(1, 2) for t in (q, k, v))
        kernel = (self.values["kernel_t"], self.values["kernel_h"], self.values["kernel_w"])
        fn = na3d if self.values["backend"] == "natten" else na3d_reference
        out = fn(qh, kh, vh, ctx.grid, kernel)
        return out.transpose(1, 2).reshape(b, n, hd).to(q.dtype)


@register("sparse_attention.window")
class Window(Technique):
    """Neighbourhood attention over the latent grid (kernel per axis)."""

    knobs = (
        Knob("kernel_t", "categorical", off=0, choices=(0, 3, 5, 7, 9), fast=3, help="window frames (0: off, dense)",
             scales="frames"),
        Knob("kernel_h", "categorical", off=0, choices=(0, 3, 7, 11, 15, 23, 31), fast=3, help="window height in latent pixels",
             scales="size"),
        Knob("kernel_w", "categorical", off=0, choices=(0, 3, 7, 11, 15, 23, 31), fast=3, help="window width in latent pixels",
             scales="size"),
        Knob("dense_steps", "int", off=0, low=0, high=3, help="first stage-2 steps kept dense", fast="low"),
        Knob("dense_layers", "int", off=0, low=0, high=48, help="first transformer blocks kept dense", scales="depth", fast="low"),
        Knob("backend", "categorical", off="natten", choices=("natten", "reference"),
             help="NATTEN na3d (Hopper FNA / flex) or the PyTorch masked reference"),
    )
    stages = ("stage2",)
    seams = ("attention.video_self.sparse",)
    composes_with = {"kernel_choice.sdpa_backend": "the window falls back to the chosen dense backend"}
    description = "static 3-D neighbourhood attention (NATTEN na3d) on stage-2 video self-attention"

    def is_off(self, values: dict[str, Any]) -> bool:  # any kernel 0 means dense attention
        full = self.validate(values)
        return 0 in (full["kernel_t"], full["kernel_h"], full["kernel_w"])

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        # NATTEN is offered only where it imports (the same for a whole study: one kind of machine);
        # a used window never has a 0 (dense) kernel: that trial would re-measure the baseline
        restrict = {k: [c for c in self.knob(k).choices if c != 0] for k in ("kernel_t", "kernel_h", "kernel_w")}
        if not natten_available():
            restrict["backend"] = ["reference"]
        elif not _reference_fits(request):
            restrict["backend"] = ["natten"]  # (the reference would not fit: check_request)
        return self.suggest_restricted(trial, restrict)

    def applicable(self, request: Any = None) -> bool:
        """Not offered where the only backend here is the reference and stage 2 has more video tokens than it
        can hold (``REFERENCE_MAX_TOKENS``)."""
        return natten_available() or _reference_fits(request)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["backend"] == "reference" and not _reference_fits(request):  # (values: validated, active)
            raise KnobError(
                f"{self.name}.backend=reference computes stage 2's dense [heads, N, N] scores, and this request has "
                f"N = {request.video_tokens(2):,} video tokens (at most {REFERENCE_MAX_TOKENS:,}: its scores would "
                f"not fit in memory); use backend=natten (allowed values: natten, reference) or a smaller request")

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        from vidtune.model.generation import stage_steps

        # the wrapper is installed on every layer, but every stage-2 step is a dense step: it falls back
        return {"kernel_t": 3, "kernel_h": 3, "kernel_w": 3, "dense_steps": min(3, stage_steps(request)["stage2"]),
                "backend": "reference"}

    def pass_steps(self, values: dict[str, Any], stage: str) -> int | None:
        return values["dense_steps"]

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.generation import stage_steps

        return values["dense_steps"] < stage_steps(request)["stage2"]  # otherwise every step stays dense

    def check_device(self, values: dict[str, Any], device: Any) -> None:
        if values["backend"] == "natten" and not natten_available():
            raise KnobError(f"{self.name}.backend=natten needs the natten package, which does not import here; "
                            "use backend=reference (allowed values: natten, reference)")

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        self.check_device(values, pipeline.device)
        patch = Patch(self.name)
        for layer, module in pipeline.attention_layers("video_self"):
            if layer >= values["dense_layers"]:
                patch.set_attr(module, "attention_function", WindowVideoAttention(module.attention_function, pipeline, values))
        return patch
