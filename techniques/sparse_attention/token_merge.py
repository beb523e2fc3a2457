"""Token merging in stage 2: the keys and values of neighbouring video tokens merged before self-attention.

Stage 2 refines a latent upsampled 2x from stage 1, so the video tokens of a 2x2 cell of its latent grid start
out nearly alike, and they stay close through its few steps. This technique averages the keys and the values
of each ``temporal`` x ``spatial`` x ``spatial`` cell of the (frames, height, width) grid into one key and one
value, after RoPE (each merged key carries its cell's mean rotation), and lets every query attend to the merged
ones: the attention's cost falls by the cell's size (4x for 2x2) while every token keeps its own query, so
nothing has to be unmerged (the token downsampling of ToDo, Smith et al. 2024, applied to video latents; ToMe's
bipartite matching would merge queries too and copy outputs back). Each merged key stands for the same number
of tokens, so the softmax needs no size term (a constant shift); a grid side that the cell does not divide is
padded by repeating its last row, column or frame.

Knobs: the cell (``spatial``, ``temporal``; 1 and 1: off), the first stage-2 steps kept whole
(``dense_steps``), the first blocks kept whole (``dense_layers``). Stage 2 only; with stage-2 tiles each tile
merges its own grid. It takes the ``attention.video_self.sparse`` seam: Sol and the window would route or
window the merged keys, which they do not model, so a setting with either is refused by the seam rule.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["merge_cells", "TokenMergeAttention", "TokenMerge"]


def merge_cells(t: torch.Tensor, grid: tuple[int, int, int], cell: tuple[int, int, int]) -> torch.Tensor:
    """[B, N, C] tokens in raster order over ``grid`` (frames, height, width) -> [B, M, C], the mean of each
    ``cell``; a side the cell does not divide is padded by repeating its last slice."""
    b, n, c = t.shape
    f, h, w = grid
    ct, ch, cw = cell
    x = t.reshape(b, f, h, w, c)
    pad_f, pad_h, pad_w = (-f) % ct, (-h) % ch, (-w) % cw
    if pad_f or pad_h or pad_w:  # (replicate on [B, C, F, H, W]: F.pad pads the last dims first)
        x = F.pad(x.permute(0, 4, 1, 2, 3), (0, pad_w, 0, pad_h, 0, pad_f), mode="replicate").permute(0, 2, 3, 4, 1)
        f, h, w = f + pad_f, h + pad_h, w + pad_w
    x = x.reshape(b, f // ct, ct, h // ch, ch, w // cw, cw, c)
    # (the mean in float32: a bf16 sum of up to 8 values would round at every step)
    return x.float().mean(dim=(2, 4, 6)).to(t.dtype).reshape(b, -1, c)


class TokenMergeAttention:
    """ltx-core attention callable: in stage 2 past the whole steps, keys and values merged per cell; else, and
    where the tokens are not the grid's (a mask, cross-attention), the previous callable as it was."""

    needs_whole_queries = True  # the cells are cut from the whole sequence (sequence_parallel gathers it)

    def __init__(self, previous: Any, pipeline: Any, values: dict[str, Any]) -> None:
        self.previous, self.pipeline, self.values = previous, pipeline, values
        self.cell = (values["temporal"], values["spatial"], values["spatial"])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        ctx = self.pipeline.context
        if (mask is not None or ctx is None or ctx.stage != "stage2" or ctx.step < self.values["dense_steps"]
                or ctx.grid is None or q.shape[1] != k.shape[1] or k.shape[1] != ctx.grid[0] * ctx.grid[1] * ctx.grid[2]):
            return self.previous(q, k, v, heads, mask)
        return self.previous(q, merge_cells(k, ctx.grid, self.cell), merge_cells(v, ctx.grid, self.cell), heads, None)


@register("sparse_attention.token_merge")
class TokenMerge(Technique):
    """Stage-2 video self-attention over merged keys and values of neighbouring tokens."""

    knobs = (
        Knob("spatial", "categorical", off=1, choices=(1, 2, 3, 4), fast=4,
             help="cell side in latent pixels whose keys and values merge into one (1: none)"),
        Knob("temporal", "categorical", off=1, choices=(1, 2), fast=2, help="cell length in latent frames (1: none)"),
        Knob("dense_steps", "int", off=0, low=0, high=3, help="first stage-2 steps kept whole", fast="low"),
        Knob("dense_layers", "int", off=0, low=0, high=48, help="first transformer blocks kept whole", scales="depth",
             fast="low"),
    )
    stages = ("stage2",)
    seams = ("attention.video_self.sparse",)
    composes_with = {"kernel_choice.sdpa_backend": "the merged keys go to the chosen dense backend"}
    description = "token merging: stage-2 video self-attention over the mean keys and values of each 2x2 (..) cell"
    inexact = "every query attends to cell means instead of the cell's own keys and values"

    def is_off(self, values: dict[str, Any]) -> bool:  # a cell of one token merges nothing
        full = self.validate(values)
        return full["spatial"] == 1 and full["temporal"] == 1

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        # a used technique merges within the frame: a cell of one token would re-measure the baseline, and a
        # frame-only cell (1 x 1 x 2) is left to a setting written by hand
        return self.suggest_restricted(trial, {"spatial": [2, 3, 4]})

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        from vidtune.model.generation import stage_steps

        # the wrapper on every layer, every stage-2 step kept whole: it passes everything through
        return {"spatial": 2, "temporal": 1, "dense_steps": min(3, stage_steps(request)["stage2"])}

    def pass_steps(self, values: dict[str, Any], stage: str) -> int | None:
        return values["dense_steps"]

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.generation import stage_steps

        return values["dense_steps"] < stage_steps(request)["stage2"]  # otherwise every step stays whole

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        for layer, module in pipeline.attention_layers("video_self"):
            if layer >= values["dense_layers"]:
                patch.set_attr(module, "attention_function", TokenMergeAttention(module.attention_function, pipeline, values))
        return patch
