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

__all__ = ["block_scores", "select_blocks", "sol_attention_reference"]


def _pad_blocks(t: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, N, D] -> [B, H, Nb, block, D] zero-padded, and the validity mask [Nb, block]."""
    b, h, n, d = t.shape
    nb = math.ceil(n / block)
    pad = nb * block - n
    if pad:
        t = torch.cat([t, t.new_zeros(b, h, pad, d)], dim=2)
    valid = torch.arange(nb * block, device=t.device) < n
    return t.reshape(b, h, nb, block, d), valid.reshape(nb, block)


def block_scores(q: torch.Tensor, k: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean query per query block against mean key per key block: ([B, H, Nqb, Nkb], kmean, kcount)."""
    d = q.shape[-1]
    qb, qvalid = _pad_blocks(q.float(), block)
    kb, kvalid = _pad_blocks(k.float(), block)
    qcount = qvalid.sum(-1).clamp(min=1).to(q.device)  # [Nqb]
    kcount = kvalid.sum(-1).clamp(min=1).to(k.device)  # [Nkb]
    qmean = qb.sum(3) / qcount[:, None]
    kmean = kb.sum(3) / kcount[:, None]
    return qmean @ kmean.transpose(-1, -2) / math.sqrt(d), kmean, kcount


def select_blocks(scores: torch.Tensor, beta: float, sigma: str = "exact", neighbours: int = 1,
                  kmean: torch.Tensor | None = None, qmean_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean [B, H, Nqb, Nkb]: key blocks computed exactly for each query block.

    ``sigma="exact"`` takes the standard deviation of the row's block scores; ``"diag"`` estimates it
    from a diagonal covariance of the key-block means (Var_j(q . k_j) ~ sum_d q_d^2 Var_j(k_jd) / d),
    which costs O(D) per row instead of O(Nkb) once the per-dimension variances are known.
    """
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
    keep = scores >= mu + beta * sd
    nq, nk = scores.shape[-2:]
    i = torch.arange(nq, device=scores.device)[:, None]
    j = torch.arange(nk, device=scores.device)[None, :]
    return keep | ((i - j).abs() <= neighbours)


def sol_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                            sigma: str = "exact", neighbours: int = 1, correction: bool = True
                            ) -> tuple[torch.Tensor, float]:
    """Sparse attention on [B, H, N, D] tensors (self-attention: the same N for q and k).

    Returns the output (q's dtype) and the density: the fraction of (query block, key block) pairs
    computed exactly.
    """
    b, h, n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    scores, kmean, kcount = block_scores(q, k, block)
    qmean = None
    if sigma == "diag":
        qb, qvalid = _pad_blocks(q.float(), block)
        qmean = qb.sum(3) / qvalid.sum(-1).clamp(min=1).to(q.device)[:, None]
    keep = select_blocks(scores, beta, sigma, neighbours, kmean, qmean)  # [B, H, Nqb, Nkb]
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
        vb, _ = _pad_blocks(vf, block)
        vsum = vb.sum(3)  # padded values are zero: dropped from the sums
        pa = torch.where(rejected, torch.exp(approx - m), torch.zeros_like(approx))
        num = num + pa @ vsum
        den = den + (pa * kcount.to(pa.dtype)).sum(-1, keepdim=True)
    out = num / den
    density = float(keep.float().mean())
    return out.to(q.dtype), density
