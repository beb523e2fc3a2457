"""Sol-style block-sparse attention as a Triton kernel (Hopper target), same maths as the reference.

Routing is cheap (O(N/64) blocks per row): PyTorch computes the block means, the block scores and the
threshold tau = mu + beta * sigma; one Triton pass (``route``) then compares, adds the neighbours and
writes the kept-block mask and a compacted list of the kept key blocks per (batch, head, query block),
kept blocks first. The kernel then, for one query block of 64 tokens:

1. streams the kept key/value blocks with an online softmax (padded keys of the last block are
   dropped: their logits are -inf, so they add nothing);
2. with ``correction``, streams the key-block means (split hi + lo in bf16, see the kernel) in chunks and adds, for every rejected block j,
   ``count_j * exp(q . kmean_j / sqrt(d) - m)`` to the denominator and ``exp(...) * vsum_j`` to the
   numerator, in the same online-softmax state, so the skipped probability mass is approximated.

Work is proportional to the kept blocks (plus one pass over the block means, 1/64 of dense), which is
where the speed comes from. Off a GPU the kernel runs in Triton's interpreter when TRITON_INTERPRET=1
is set before the first call (how CI tests it against ``sol_attention_reference``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from vidtune.kernels.sol_attention import with_neighbours, block_sums, route_scores
from vidtune.kernels.triton_runtime import triton_available

__all__ = ["sol_attention_triton", "route", "launch", "union_routing", "LAUNCH", "split_hi_lo"]

_KERNEL: dict[str, Any] = {}
_sol_online_softmax: Any = None  # built with the kernel (``_kernel``)


def _kernel() -> Any:
    """Build (once) the jitted kernel; the interpreter choice is made when it is built."""
    if "k" in _KERNEL:
        return _KERNEL["k"]
    import triton
    import triton.language as tl

    global _sol_online_softmax  # the kernel finds its helper among this module's globals

    @triton.jit
    def _sol_online_softmax(m_i, l_i, acc, s, LAZY: tl.constexpr, EXP2: tl.constexpr):
        """Online softmax: bring the running row maxima, sums and accumulator up to the scores ``s``
        and return them with exp(s - max). LAZY rescales only when a row's maximum grows by more than
        e^8 (FlashAttention-4's trick); the exponentials then stay below e^8, safe in float32. EXP2: the
        scores come in base-2 units (the softmax scale times log2(e), folded in by the caller) and the
        exponentials are exp2, the GPU's native one (tl.exp multiplies by log2(e) first)."""
        if LAZY:
            m_blk = tl.max(s, 1)
            if tl.max(m_blk - m_i, 0) > 8.0:
                m_new = tl.maximum(m_i, m_blk)
                alpha = tl.exp2(m_i - m_new) if EXP2 else tl.exp(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new) if EXP2 else tl.exp(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        if EXP2:
            return m_i, l_i, acc, tl.exp2(s - m_i[:, None])
        return m_i, l_i, acc, tl.exp(s - m_i[:, None])

    @triton.jit
    def sol_fwd(Q, K, V, KMEAN, KMEAN_LO, VSUM, VSUM_LO, KCOUNT, KEEP, IDX, NKEPT, O, O_IN, LSE_IN,
                stride_qb, stride_qn, stride_mb, stride_mn, stride_kb, stride_ib,
                n, nqb, nkb, nprog, scale,
                BLOCK: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, CORRECTION: tl.constexpr,
                VALUE_LO: tl.constexpr, LAZY: tl.constexpr, PAIR: tl.constexpr, QB: tl.constexpr,
                TMA: tl.constexpr, EXP2: tl.constexpr, MEAN_LO: tl.constexpr, INIT: tl.constexpr):
        # One program: QB query blocks (QB * BLOCK rows). With QB = 2 it walks the union of the two
        # blocks' kept lists (IDX / NKEPT hold the union) and masks, row by row, the key blocks its own
        # query block did not keep, so each row still attends to exactly its own kept set; every key
        # block loaded serves 128 queries instead of 64 (half the key/value traffic).
        pid = tl.program_id(0)
        bh = tl.program_id(1)
        M: tl.constexpr = QB * BLOCK
        offs_m = pid * M + tl.arange(0, M)
        offs_d = tl.arange(0, D)
        # the keep rows of the program's query blocks (QB = 2: the second clamped for an odd count; each
        # row selects its own with ``first`` instead of gathering per row, which measured slower, round 6)
        keep_a = KEEP + bh * stride_kb + (pid * QB) * nkb
        keep_b = KEEP + bh * stride_kb + tl.minimum(pid * QB + 1, nqb - 1) * nkb
        first = (tl.arange(0, M) < BLOCK)[:, None]
        # dots take the inputs' dtype (bf16 on the GPU: tensor cores) and accumulate in float32
        # TMA: Q, K, V and the block statistics arrive as tensor descriptors over [B*H, rows, D] and
        # each tile is one bulk copy (Hopper's TMA engine; rows past the end read as zeros), instead of
        # 64 x 128 per-thread address computations and masked loads
        if TMA:
            q = Q.load([bh, pid * M, 0]).reshape(M, D)
        else:
            q = tl.load(Q + bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :],
                        mask=offs_m[:, None] < n, other=0.0)
        if INIT:
            # the kept blocks were done elsewhere (the CuTe kernel): start from their normalised output
            # and log-sum-exp, the same softmax state up to a common factor (m = lse, l = 1, acc = O)
            # rows past the end: any finite state (not stored)
            m_i = tl.load(LSE_IN + bh * n + offs_m, mask=offs_m < n, other=0.0)
            l_i = tl.full([M], 1.0, tl.float32)
            acc = tl.load(O_IN + bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :],
                          mask=offs_m[:, None] < n, other=0.0).to(tl.float32)
            kept = 0
        else:
            # QB = 2: a finite start, because a row may meet key blocks it did not keep (all -inf) first
            m_i = tl.full([M], float("-inf") if QB == 1 else -1.0e30, tl.float32)
            l_i = tl.zeros([M], tl.float32)
            acc = tl.zeros([M, D], tl.float32)
            kept = tl.load(NKEPT + bh * nprog + pid)
        row = bh * stride_ib + pid * nkb
        for t in range(0, kept, 2 if PAIR else 1):
            if PAIR:  # two kept blocks per step: a 64 x 128 score tile (the second may be absent)
                r = tl.arange(0, 2 * BLOCK)
                present = t + r // BLOCK < kept
                jt = tl.load(IDX + row + t + r // BLOCK, mask=present, other=0)
                offs_n = jt * BLOCK + r % BLOCK
                valid = present & (offs_n < n)
            else:
                j = tl.load(IDX + row + t)
                offs_n = j * BLOCK + tl.arange(0, BLOCK)
                valid = offs_n < n
            if TMA:  # one key block (launch rejects TMA with PAIR)
                k = K.load([bh, j * BLOCK, 0]).reshape(BLOCK, D)
                v = V.load([bh, j * BLOCK, 0]).reshape(BLOCK, D)
            else:
                k = tl.load(K + bh * stride_qb + offs_n[:, None] * stride_qn + offs_d[None, :],
                            mask=valid[:, None], other=0.0)
                v = tl.load(V + bh * stride_qb + offs_n[:, None] * stride_qn + offs_d[None, :],
                            mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))  # padded keys (and an absent pair) are dropped
            if QB > 1:  # the union's blocks that this row's query block did not keep
                jb = offs_n // BLOCK
                ka = tl.load(keep_a + jb, mask=valid, other=0)
                kb = tl.load(keep_b + jb, mask=valid, other=0)
                s = tl.where(tl.where(first, ka[None, :], kb[None, :]) != 0, s, float("-inf"))
            m_i, l_i, acc, p = _sol_online_softmax(m_i, l_i, acc, s, LAZY, EXP2)
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(v.dtype), v)
        if CORRECTION:
            # Block means and value sums come split in two parts of the dots' dtype (hi + lo, bf16 on the
            # GPU), so every dot is a tensor-core dot on the inputs' dtype and the pair carries ~16
            # mantissa bits: q is exact in bf16, so q.(hi + lo) misses only lo's rounding. (A tf32 dot on
            # float32 means, the first version, was off by e^2 where logits reach thousands, measured on
            # the H200, and held q in float32 registers, which spilled.)
            for c0 in range(0, nkb, CHUNK):
                offs_c = c0 + tl.arange(0, CHUNK)
                in_range = offs_c < nkb
                moff = bh * stride_mb + offs_c[:, None] * stride_mn + offs_d[None, :]
                if TMA:
                    km_h = KMEAN.load([bh, c0, 0]).reshape(CHUNK, D)
                else:
                    km_h = tl.load(KMEAN + moff, mask=in_range[:, None], other=0.0)
                cnt = tl.load(KCOUNT + offs_c, mask=in_range, other=0.0)
                if QB == 1:  # one query block: one keep row for the whole tile
                    keep = tl.load(keep_a + offs_c, mask=in_range, other=1)
                    rejected = (in_range & (keep == 0))[None, :]
                else:
                    ka = tl.load(keep_a + offs_c, mask=in_range, other=1)
                    kb = tl.load(keep_b + offs_c, mask=in_range, other=1)
                    rejected = in_range[None, :] & (tl.where(first, ka[None, :], kb[None, :]) == 0)
                s = tl.dot(q, tl.trans(km_h))
                if MEAN_LO:  # off: the means' bf16 8 bits alone (one dot fewer per chunk; kmean_lo below)
                    if TMA:
                        km_l = KMEAN_LO.load([bh, c0, 0]).reshape(CHUNK, D)
                    else:
                        km_l = tl.load(KMEAN_LO + moff, mask=in_range[:, None], other=0.0)
                    s += tl.dot(q, tl.trans(km_l))
                s = s * scale
                s = tl.where(rejected, s, float("-inf"))
                # (lazy: the kept blocks hold the largest scores, so a rescale here is rare)
                m_i, l_i, acc, p = _sol_online_softmax(m_i, l_i, acc, s, LAZY, EXP2)
                l_i = l_i + tl.sum(p * cnt[None, :], 1)
                if TMA:
                    vs_h = VSUM.load([bh, c0, 0]).reshape(CHUNK, D)
                else:
                    vs_h = tl.load(VSUM + moff, mask=in_range[:, None], other=0.0)
                pd = p.to(vs_h.dtype)
                acc = acc + tl.dot(pd, vs_h)
                if VALUE_LO:  # without it the value sums carry bf16's 8 bits, like the values themselves
                    if TMA:
                        vs_l = VSUM_LO.load([bh, c0, 0]).reshape(CHUNK, D)
                    else:
                        vs_l = tl.load(VSUM_LO + moff, mask=in_range[:, None], other=0.0)
                    acc += tl.dot(pd, vs_l)
        out = acc / l_i[:, None]
        tl.store(O + bh * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=offs_m[:, None] < n)

    _KERNEL["k"] = sol_fwd
    return sol_fwd


def split_hi_lo(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``t`` as hi + lo in ``dtype`` (bf16: ~16 mantissa bits together; float32: lo is zero)."""
    hi = t.to(dtype)
    return hi.contiguous(), (t - hi.float()).to(dtype).contiguous()


def route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int, sigma: str,
          neighbours: int, fused: bool | None = None) -> dict[str, torch.Tensor]:
    """Block means, the kept-block mask and its compacted index list ([B*H, Nqb, Nkb], kept first, each
    part in ascending order: a stable sort's order).

    ``fused`` (default: where Triton runs) compares the scores with tau, adds the neighbours, and writes
    the mask, the list and the counts in one Triton pass, one program per (batch x head, query block)
    row; otherwise PyTorch does it in several (a stable argsort for the list). Both compare the same
    float32 scores with the same tau (``route_scores``), so they keep the same blocks to the bit.
    """
    b, h, n, d = q.shape
    scores, tau, kmean, kcount = route_scores(q, k, beta, block, sigma)  # [B, H, Nqb, Nkb], [B, H, Nqb, 1]
    vsum, _ = block_sums(v, block)
    nqb, nkb = scores.shape[-2:]
    out = {"kmean": kmean.reshape(b * h, nkb, d).contiguous(), "vsum": vsum.reshape(b * h, nkb, d).contiguous(),
           "kcount": kcount.contiguous()}
    if fused is None:
        fused = triton_available(q.device)
    if fused:
        keep = torch.empty(b * h, nqb, nkb, dtype=torch.int8, device=q.device)
        idx = torch.empty(b * h, nqb, nkb, dtype=torch.int32, device=q.device)
        nkept = torch.empty(b * h, nqb, dtype=torch.int32, device=q.device)
        _compact_kernel()[(b * h * nqb,)](scores.contiguous(), tau.contiguous(), keep, idx, nkept, nqb, nkb,
                                          neighbours, BLOCK_N=max(16, 1 << (nkb - 1).bit_length()))
        return {**out, "keep": keep, "idx": idx, "nkept": nkept,
                "density": nkept.sum().to(torch.float32) / (b * h * nqb * nkb)}
    flat = with_neighbours(scores >= tau, neighbours).reshape(b * h, nqb, nkb)
    # kept blocks first. (Round 7 tried a compaction by running counts and a scatter in PyTorch: 4.1 ms
    # against this sort's 2.4 ms on the 133 M flags at 130,560 tokens.)
    idx = torch.argsort((~flat).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return {**out, "keep": flat.to(torch.int8).contiguous(), "idx": idx.contiguous(),
            "nkept": flat.sum(-1).to(torch.int32).contiguous(), "density": flat.float().mean()}


def _compact_kernel() -> Any:
    """Build (once) the routing's compaction kernel (see ``route``)."""
    if "compact" in _KERNEL:
        return _KERNEL["compact"]
    import triton
    import triton.language as tl

    @triton.jit
    def sol_route_compact(S, TAU, KEEP, IDX, NKEPT, nqb, nkb, neighbours, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)  # (batch x head) * nqb + query block
        qi = row % nqb
        offs = tl.arange(0, BLOCK_N)
        inside = offs < nkb
        s = tl.load(S + row.to(tl.int64) * nkb + offs, mask=inside, other=float("-inf"))
        tau = tl.load(TAU + row)
        near = tl.abs(offs - qi) <= neighbours
        keep = ((s >= tau) | near) & inside
        kept = keep.to(tl.int32)
        before = tl.cumsum(kept, 0)  # kept blocks up to and including each block
        total = tl.sum(kept, 0)
        # kept block j goes to (kept before it); a rejected one after all kept, in order: total + (j - kept before)
        pos = tl.where(keep, before - 1, total + offs - before)
        base = row.to(tl.int64) * nkb
        tl.store(IDX + base + pos, offs, mask=inside)
        tl.store(KEEP + base + offs, kept.to(tl.int8), mask=inside)
        tl.store(NKEPT + row, total)

    _KERNEL["compact"] = sol_route_compact
    return sol_route_compact


# Launch settings on the GPU; ``bench_sparse --sweep`` measures the alternatives on the H200
# (results/benchmarks/sparse/README.md). lazy: rescale the running sums only when a row's maximum grows
# by e^8 or more; pair: two kept key blocks per step of the exact loop (64 x 128 score tiles);
# query_blocks 2: two neighbouring query blocks per program over the union of their kept lists. All
# three were slower (rounds 5, 6 and 7): off. Round 7 (130,560 tokens, density 0.105, kernel alone):
# tma (tensor-descriptor loads, Hopper's TMA) + value_lo off 82 ms, + exp2 79 ms, against 104 ms for the
# round-3 settings. value_lo off: the value sums carry bf16's 8 bits, like the values themselves.
# tma "auto": on GPUs of compute capability 9 or more (TMA) unless pair is on; True forces it (the
# interpreter runs it) and refuses pair.
# kmean_lo off: the correction scores rejected blocks against the bf16 block means alone (8 bits): a
# logit L is then off by up to ~L x 2^-8, against ~L x 2^-16 with the lo part; round 8 measures the time.
LAUNCH = {"num_warps": 4, "num_stages": 3, "chunk": 32, "value_lo": False, "lazy": False, "pair": False,
          "query_blocks": 1, "tma": "auto", "exp2": True, "kmean_lo": True}


def sol_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                         sigma: str = "exact", neighbours: int = 1, correction: bool = True
                         ) -> tuple[torch.Tensor, float]:
    """Same contract as ``sol_attention_reference``: [B, H, N, D] in, (output in q's dtype, density) out."""
    out, density = sol_attention_triton_t(q, k, v, beta, block, sigma, neighbours, correction)
    return out, float(density)


def sol_attention_triton_t(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                           sigma: str = "exact", neighbours: int = 1, correction: bool = True
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``sol_attention_triton`` with the density as a 0-d tensor on q's device (no host read)."""
    if not triton_available(q.device):
        raise RuntimeError("the Triton Sol kernel needs a CUDA GPU (or TRITON_INTERPRET=1 for Triton's CPU interpreter); "
                           "use sparse_attention backend=reference on this machine")
    if q.shape[-1] not in (16, 32, 64, 128, 256):
        raise ValueError(f"head dim must be a power of two in [16, 256] for the Triton kernel, got {q.shape[-1]}")
    r = route(q, k, v, beta, block, sigma, neighbours)
    return launch(q, k, v, r, block, correction), r["density"]


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: dict[str, torch.Tensor], block: int = 64,
           correction: bool = True, init: tuple[torch.Tensor, torch.Tensor] | None = None,
           **settings: Any) -> torch.Tensor:
    """The kernel alone on a routing ``r`` from ``route`` (``settings`` override ``LAUNCH``).

    ``init`` = (O [B*H, N, D], base-2 log-sum-exp [B*H, N]) over the kept blocks, computed elsewhere:
    the kernel then skips its kept loop and adds the correction to that state (needs correction and
    query_blocks 1).
    """
    cfg = {**LAUNCH, **settings}
    if init is not None and (not correction or cfg["query_blocks"] != 1):
        raise ValueError("init (the kept blocks' state) needs correction=True and query_blocks=1")
    b, h, n, d = q.shape
    dtype = q.dtype
    if q.device.type != "cuda":  # Triton 3.x's interpreter computes bf16 tl.dot wrongly (measured): use fp32
        q, k, v = q.float(), k.float(), v.float()
    qf, kf, vf = (t.reshape(b * h, n, d).contiguous() for t in (q, k, v))
    km_h, km_l = split_hi_lo(r["kmean"], qf.dtype)
    vs_h, vs_l = split_hi_lo(r["vsum"], qf.dtype)
    out = torch.empty_like(qf)
    if init is None:
        o_in, lse_in = out, out  # not read
    else:
        o_in = init[0].reshape(b * h, n, d).to(qf.dtype).contiguous()
        # the kernel's scores are in base-2 units with exp2, natural units without
        lse_in = init[1].float().contiguous() * (1.0 if cfg["exp2"] else math.log(2.0))
    nqb = r["keep"].shape[1]
    nkb = r["keep"].shape[2]
    qbs = cfg["query_blocks"]
    if qbs not in (1, 2):
        raise ValueError(f"query_blocks must be 1 or 2, got {qbs}")
    idx, nkept = (r["idx"], r["nkept"]) if qbs == 1 else union_routing(r)
    nprog = idx.shape[1]
    tensors: tuple[Any, ...] = (qf, kf, vf, km_h, km_l, vs_h, vs_l)
    if cfg["tma"] not in (True, False, "auto"):
        raise ValueError(f"tma must be True, False or 'auto', got {cfg['tma']!r}")
    if cfg["tma"] is True and cfg["pair"]:
        raise ValueError("tma loads one key block per step: it cannot be combined with pair=True")
    tma = cfg["tma"] is True or (cfg["tma"] == "auto" and not cfg["pair"] and q.is_cuda
                                 and torch.cuda.get_device_capability(q.device)[0] >= 9)
    if tma:
        tensors = _descriptors(tensors, block, qbs * block, cfg["chunk"], b * h, nkb, d)
    _kernel()[(nprog, b * h)](
        *tensors, r["kcount"], r["keep"], idx, nkept, out, o_in, lse_in,
        n * d, d, nkb * d, d, nqb * nkb, nprog * nkb,
        n, nqb, nkb, nprog, (math.log2(math.e) if cfg["exp2"] else 1.0) / math.sqrt(d),
        BLOCK=block, D=d, CHUNK=cfg["chunk"], CORRECTION=correction, VALUE_LO=cfg["value_lo"],
        LAZY=cfg["lazy"], PAIR=cfg["pair"], QB=qbs, TMA=tma, EXP2=cfg["exp2"], MEAN_LO=cfg["kmean_lo"],
        INIT=init is not None,
        **({"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]} if q.is_cuda else {}),
    )
    return out.reshape(b, h, n, d).to(dtype)


def _descriptors(tensors: tuple[torch.Tensor, ...], block: int, rows_q: int, chunk: int, bh: int, nkb: int,
                 d: int) -> tuple[Any, ...]:
    """Host tensor descriptors over [B*H, rows, D] views: Q in tiles of ``rows_q`` rows, K and V of one
    key block, the block statistics of ``chunk`` blocks. TMA reads rows past the end as zeros."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t: torch.Tensor, rows: int) -> Any:
        t3 = t.reshape(bh, -1, d)
        return TensorDescriptor(t3, list(t3.shape), list(t3.stride()), [1, rows, d])

    qf, kf, vf, *stats = tensors
    return (desc(qf, rows_q), desc(kf, block), desc(vf, block), *(desc(t.reshape(bh, nkb, d), chunk) for t in stats))


def union_routing(r: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept lists of query-block pairs (2i, 2i + 1): the union of the two kept sets, kept first.

    Computed once per routing and kept in ``r`` (``query_blocks=2`` launches reuse it); an odd last
    block pairs with nothing. ``r["union_density"]`` is the fraction of blocks the kernel loads.
    """
    if "union_idx" not in r:
        keep = r["keep"].bool()
        if keep.shape[1] % 2:
            keep = torch.cat([keep, torch.zeros_like(keep[:, :1])], 1)
        union = keep[:, 0::2] | keep[:, 1::2]
        r["union_idx"] = torch.argsort((~union).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
        r["union_nkept"] = union.sum(-1).to(torch.int32).contiguous()
        r["union_density"] = union.float().mean()
    return r["union_idx"], r["union_nkept"]
