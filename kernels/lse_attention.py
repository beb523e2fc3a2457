"""Attention that also returns its log-sum-exp, and the exact merge of partial attentions.

Sequence parallelism splits the video keys across ranks. Audio queries (about a hundred) attend to
every video key; instead of gathering the keys and values (tens of MB per layer at 4K), each rank
attends to its own key shard and the ranks exchange (partial output, log-sum-exp) pairs, a few hundred
KB, which merge exactly:

    out = sum_r exp(lse_r - m) * out_r / sum_r exp(lse_r - m),   m = max_r lse_r

because each partial output is its shard's softmax-weighted value mean and exp(lse_r) its shard's
softmax denominator.
"""

from __future__ import annotations

import torch

__all__ = ["attention_with_lse", "merge_partials"]


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:  # [B, T, H*D] -> [B, H, T, D]
    b, n, hd = t.shape
    return t.reshape(b, n, heads, hd // heads).transpose(1, 2)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QK^T/sqrt(d))V and logsumexp(QK^T/sqrt(d)) on [B, T, H*D] inputs.

    Returns (out [B, H, Tq, D] float32, lse [B, H, Tq] float32). An empty key set gives out 0 and
    lse -inf (a rank whose shard holds only padding contributes nothing to the merge). On CUDA the
    memory-efficient SDPA kernel returns the log-sum-exp itself; elsewhere float32 math.
    """
    b, tq, hd = q.shape
    d = hd // heads
    if k.shape[1] == 0:
        return (torch.zeros(b, heads, tq, d, dtype=torch.float32, device=q.device),
                torch.full((b, heads, tq), float("-inf"), dtype=torch.float32, device=q.device))
    qh, kh, vh = _heads(q, heads), _heads(k, heads), _heads(v, heads)
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            qh.contiguous(), kh.contiguous(), vh.contiguous(), None, True)[:2]
        return out.float(), lse[..., :tq].float()
    scores = qh.float() @ kh.float().transpose(-1, -2) / d**0.5
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ vh.float()
    return out, lse


def merge_partials(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partial attentions over disjoint key sets: outs [R, B, H, T, D], lses [R, B, H, T].

    Returns (out [B, H, T, D], lse [B, H, T]) equal to attention over the union of the key sets.
    """
    m = lses.max(dim=0).values
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lses - m)  # [R, B, H, T]; exp(-inf) = 0 for empty shards
    denom = w.sum(0)
    out = (w[..., None] * outs).sum(0) / denom[..., None]
    return out, m + torch.log(denom)
