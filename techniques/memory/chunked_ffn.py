"""Chunked feed-forward: the blocks' feed-forward layers (video ``ff``, audio ``audio_ff``) run over the tokens
in chunks, so that their 4x-wide intermediate activation exists for ``chunk_tokens`` tokens at a time instead
of the whole sequence (at 3840x2176x121, stage 2's 130,560 video tokens x 16,384 features in bf16 are 4.3 GB
for that one tensor). The feed-forward acts on each token alone, so the chunks compute the same function;
whether a GEMM rounds a row the same way in a smaller batch of rows depends on the kernel, so no bit-equality
is claimed for chunks smaller than the sequence (tests/test_memory.py measures the difference).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["ChunkedFFN"]


def _chunked_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A patched ``FeedForward.forward``: the original forward over ``vt_chunk_tokens`` tokens at a time."""
    n = self.vt_chunk_tokens
    if x.shape[-2] <= n:
        return self.vt_ffn_forward(x)
    return torch.cat([self.vt_ffn_forward(part) for part in x.split(n, dim=-2)], dim=-2)


@register("memory.chunked_ffn")
class ChunkedFFN(Technique):
    """Run the blocks' feed-forward layers over the tokens in chunks."""

    knobs = (Knob("chunk_tokens", "int", off=0, low=0, high=65536, step=1024, log=False,
                  help="tokens per feed-forward chunk (0: the whole sequence at once)"),)
    switch = "chunk_tokens"
    stages = ("stage1", "stage2")
    uniform_passes = True
    seams = ("blocks.feed_forward",)
    description = "feed-forward layers over the tokens in chunks (a smaller activation peak)"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        return {"chunk_tokens": 65536}  # (patched, but every sequence of these requests fits one chunk)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        count = 0
        for block in pipeline.transformer_blocks():
            for attr in ("ff", "audio_ff"):
                ff = getattr(block, attr, None)
                if ff is None:
                    continue
                patch.set_attr(ff, "vt_ffn_forward", ff.forward)
                patch.set_attr(ff, "vt_chunk_tokens", int(values["chunk_tokens"]))
                patch.set_attr(ff, "forward", types.MethodType(_chunked_forward, ff))
                count += 1
        pipeline.applied_info[self.name] = {"chunk_tokens": values["chunk_tokens"], "feed_forwards": count}
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        return patch
