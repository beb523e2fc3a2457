"""Query-dependent block-sparse attention (Sol-Attn style): exact PyTorch reference.

Tokens are grouped in blocks of ``block`` (queries and keys). For every query block and head, each key
block is scored by the mean query of the block against the key block's mean key; key blocks scoring
at least tau = mu + beta * sigma (mu, sigma over the key blocks of that row) are computed exactly, and
so are the query's own block and its ``neighbours`` on either side. With ``correction`` a rejected block
still contributes, as ``count`` copies of its mean key carrying its mean value: exp(q . k_mean / sqrt(d))
times the block's value sum in the numerator and times its key count in the denominator, so the
skipped probability mass is approximated rather than dropped. Padded keys (a sequence not a multiple of
the block size) are dropped from every sum rather than masked with -inf.

This reference materialises the full score matrix: it is for CPUs, tests and small shapes; the GPU
kernels compute only the selected blocks.
"""

from __future__ import annotations

import math

import torch

__all__ = ["block_sums", "block_scores", "block_threshold", "kept_attention_reference", "route_blocks",
           "route_scores", "select_blocks", "with_neighbours", "sol_attention_reference"]


def block_sums(t: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 sums of ``block``-token blocks of [B, H, N, D] and each block's token count.

    The last block is zero-padded in t's own dtype (exact), so no float32 copy of t is made, and
    padded tokens add nothing: they are dropped from the sums and the counts.
    """
    b, h, n, d = t.shape
    nb = math.ceil(n / block)
    if nb * block > n:
        t = torch.cat([t, t.new_zeros(b, h, nb * block - n, d)], dim=2)
    sums = t.reshape(b, h, nb, block, d).sum(3, dtype=torch.float32)
    counts = (n - torch.arange(nb, device=t.device) * block).clamp(max=block).to(torch.float32)
    return sums, counts


def block_scores(q: torch.Tensor, k: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean query per query block against mean key per key block: ([B, H, Nqb, Nkb], kmean, kcount)."""
    scores, kmean, kcount, _ = _block_scores(q, k, block)
    return scores, kmean, kcount


def _block_scores(q: torch.Tensor, k: torch.Tensor, block: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    qsum, qcount = block_sums(q, block)
    ksum, kcount = block_sums(k, block)
    qmean = qsum / qcount[:, None]
    kmean = ksum / kcount[:, None]
    return qmean @ kmean.transpose(-1, -2) / math.sqrt(q.shape[-1]), kmean, kcount, qmean


def route_blocks(q: torch.Tensor, k: torch.Tensor, beta: float, block: int = 64, sigma: str = "exact",
                 neighbours: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routing decision, shared by the reference and the GPU kernels so that they keep the same
    blocks to the bit (a block on the threshold must not flip between two summation orders):
    (keep [B, H, Nqb, Nkb], kmean [B, H, Nkb, D], kcount [Nkb])."""
    scores, tau, kmean, kcount = route_scores(q, k, beta, block, sigma)
    return with_neighbours(scores >= tau, neighbours), kmean, kcount


def route_scores(q: torch.Tensor, k: torch.Tensor, beta: float, block: int = 64, sigma: str = "exact"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``route_blocks`` up to the comparison: (scores, tau, kmean, kcount); keep = scores >= tau, or within
    the neighbours of the diagonal (the GPU routing fuses that step with the compaction)."""
    scores, kmean, kcount, qmean = _block_scores(q, k, block)
    return scores, block_threshold(scores, beta, sigma, kmean, qmean), kmean, kcount


def select_blocks(scores: torch.Tensor, beta: float, sigma: str = "exact", neighbours: int = 1,
                  kmean: torch.Tensor | None = None, qmean_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean [B, H, Nqb, Nkb]: key blocks computed exactly for each query block.

    ``sigma="exact"`` takes the standard deviation of the row's block scores; ``"diag"`` estimates it
    from a diagonal covariance of the key-block means (Var_j(q . k_j) ~ sum_d q_d^2 Var_j(k_jd) / d),
    which costs O(D) per row instead of O(Nkb) once the per-dimension variances are known.
    """
    return with_neighbours(scores >= block_threshold(scores, beta, sigma, kmean, qmean_scale), neighbours)


def with_neighbours(keep: torch.Tensor, neighbours: int) -> torch.Tensor:
    """``keep`` [..., Nqb, Nkb] with each query block's own key block and ``neighbours`` either side kept."""
    nq, nk = keep.shape[-2:]
    i = torch.arange(nq, device=keep.device)[:, None]
    j = torch.arange(nk, device=keep.device)[None, :]
    return keep | ((i - j).abs() <= neighbours)


def block_threshold(scores: torch.Tensor, beta: float, sigma: str = "exact", kmean: torch.Tensor | None = None,
                    qmean_scale: torch.Tensor | None = None) -> torch.Tensor:
    """tau = mu + beta * sigma per row of block scores ([..., Nqb, 1]); ``select_blocks`` keeps scores >= tau.
    Shared with the GPU routing so that both compare the same float32 numbers."""
    mu = scores.mean(-1, keepdim=True)
    if sigma == "exact":
        sd = scores.std(-1, keepdim=True, unbiased=False)
    elif sigma == "diag":
        if kmean is None or qmean_scale is None:
            raise ValueError("sigma='diag' needs kmean and the query-block means")
        var_k = kmean.var(dim=2, unbiased=False)  # [B, H, D]
        sd = torch.sqrt((qmean_scale**2 * var_k[:, :, None, :]).sum(-1, keepdim=True) / kmean.shape[-1])
    else:
        raise ValueError(f"sigma must be 'exact' or 'diag', got {sigma!r}")
    return mu + beta * sd


def sol_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                            sigma: str = "exact", neighbours: int = 1, correction: bool = True
                            ) -> tuple[torch.Tensor, float]:
    """Sparse attention on [B, H, N, D] tensors (self-attention: the same N for q and k).

    Returns the output (q's dtype) and the density: the fraction of (query block, key block) pairs
    computed exactly.
    """
    out, density = sol_attention_reference_t(q, k, v, beta, block, sigma, neighbours, correction)
    return out, float(density)


def sol_attention_reference_t(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                              sigma: str = "exact", neighbours: int = 1, correction: bool = True
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``sol_attention_reference`` with the density as a 0-d float32 tensor on q's device (no host read)."""
    b, h, n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    keep, kmean, kcount = route_blocks(q, k, beta, block, sigma, neighbours)  # keep: [B, H, Nqb, Nkb]
    nkb = keep.shape[-1]
    qf, kf, vf = q.float(), k.float(), v.float()
    logits = qf @ kf.transpose(-1, -2) * scale  # [B, H, N, N]
    key_block = torch.arange(n, device=q.device) // block
    query_block = key_block
    exact = keep[:, :, query_block][:, :, :, key_block]  # [B, H, N, N]
    # per-query scores against each key block's mean key, for the rejected blocks' correction
    approx = qf @ kmean.transpose(-1, -2) * scale  # [B, H, N, Nkb]
    rejected = ~keep[:, :, query_block]  # [B, H, N, Nkb]
    neg = torch.finfo(torch.float32).min
    m = torch.where(exact, logits, torch.full_like(logits, neg)).amax(-1, keepdim=True)
    if correction:
        m = torch.maximum(m, torch.where(rejected, approx, torch.full_like(approx, neg)).amax(-1, keepdim=True))
    p = torch.where(exact, torch.exp(logits - m), torch.zeros_like(logits))
    num = p @ vf
    den = p.sum(-1, keepdim=True)
    if correction:
        vsum, _ = block_sums(v, block)  # padded values are zero: dropped from the sums
        pa = torch.where(rejected, torch.exp(approx - m), torch.zeros_like(approx))
        num = num + pa @ vsum
        den = den + (pa * kcount.to(pa.dtype)).sum(-1, keepdim=True)
    out = num / den
    return out.to(q.dtype), keep.float().mean()


def kept_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, block: int = 64
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the kept key blocks alone (no correction), in float32, with the rows' log-sum-exp in
    base 2: ([B*H, N, D], [B*H, N]). ``keep``: [B*H, Nqb, Nkb] (``route``'s mask). The reference of the
    CuTe kernel's output, and the state the correction pass starts from."""
    b, h, n, d = q.shape
    qf, kf, vf = (t.reshape(b * h, n, d).float() for t in (q, k, v))
    mask = keep.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)[:, :n, :n]
    s = (qf @ kf.transpose(1, 2)) / math.sqrt(d)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ vf, lse / math.log(2.0)
