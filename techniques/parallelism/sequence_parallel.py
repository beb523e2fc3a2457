"""Sequence parallelism: video tokens split across ranks, audio replicated.

Each transformer pass pads the video tokens to a multiple of the degree P (copies of the last token)
and gives rank r the r-th contiguous shard; every per-token operation (projections, AdaLN, RoPE, the
feed-forward, text cross-attention, video queries over audio keys) then runs on the shard alone. Only
two operations see other ranks' video tokens:

- video self-attention. ``comm=ulysses`` (DeepSpeed-Ulysses): an all-to-all turns [S tokens, H heads]
  shards into [P*S tokens, H/P heads], the installed attention function (dense backend, sparse routing,
  window) runs on whole sequences with the padded keys and queries dropped, and a second all-to-all
  returns the shards; P must divide the heads. ``comm=allgather_kv``: keys and values are gathered and
  each rank attends with its own queries (any P; only dense attention functions, since sparse routing
  needs whole query sequences).
- audio queries over video keys (v2a). ``v2a=lse``: each rank attends to its own key shard (padded keys
  dropped) and the ranks exchange partial outputs with their log-sum-exp, merged exactly
  (kernels/lse_attention.py): [B, H, ~126, D] per rank instead of all video keys and values.
  ``v2a=gather_kv``: keys and values gathered (the comparison point).

The outputs are gathered after the pass; every rank ends with the whole prediction. Caches reduce their
statistics over the video shards (``pipeline.video_shard``) so every rank decides alike. Bytes sent per
rank per collective kind are recorded in the trial record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vidtune.kernels.lse_attention import attention_with_lse, merge_partials
from vidtune.techniques.parallelism.distributed import (
    RankGroup,
    all_gather_cat,
    all_reduce_sum,
    all_to_all,
    rank_group,
    require_world,
    feasible_degrees,
    suggest_with_feasible_degree,
    world_size,
)
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["SequenceParallel", "shard_tokens", "SharedTokens", "LSEMerge", "Ulysses"]


def _pad_tokens(t: torch.Tensor, dim: int, n_pad: int) -> torch.Tensor:
    n = t.shape[dim]
    if n_pad == n:
        return t
    last = t.narrow(dim, n - 1, 1)
    reps = [1] * t.dim()
    reps[dim] = n_pad - n
    return torch.cat([t, last.repeat(*reps)], dim=dim)


def shard_tokens(t: torch.Tensor, dim: int, n: int, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous shard of ``t``'s ``n`` tokens along ``dim``, padded with copies of the last."""
    s = -(-n // size)
    return _pad_tokens(t, dim, s * size).narrow(dim, rank * s, s)


@dataclass
class SharedTokens:
    rg: RankGroup
    n_real: int = 0  # video tokens of the current pass
    shard: int = 0  # tokens per rank (padded)
    bytes: dict[str, int] = field(default_factory=dict)

    def local_tokens(self, rank: int | None = None) -> int:
        """Real (unpadded) tokens in rank ``rank``'s shard (default: this rank's)."""
        rank = self.rg.rank if rank is None else rank
        return max(0, min(self.shard, self.n_real - rank * self.shard))

    def count(self, kind: str, t: torch.Tensor) -> None:
        self.bytes[kind] = self.bytes.get(kind, 0) + t.numel() * t.element_size()


class Ulysses:
    """Video self-attention over all-to-all head scatter: whole sequences, H/P heads per rank."""

    def __init__(self, inner: Any, shared: SharedTokens) -> None:
        self.inner, self.s = inner, shared

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            raise ValueError("sequence_parallel does not split a video self-attention mask (conditioned requests)")
        rg, n = self.s.rg, self.s.n_real
        p = rg.size
        b, s, hd = q.shape
        d, hp = hd // heads, heads // p

        def scatter_heads(x: torch.Tensor) -> torch.Tensor:  # [B, S, H*D] -> [B, n, H/P*D]
            x = x.reshape(b, s, p, hp, d).permute(2, 0, 1, 3, 4)  # [P (head group), B, S, hp, D]
            self.s.count("video_self", x)
            x = all_to_all(x, rg)  # [P (sequence shard), B, S, hp, D]
            return x.permute(1, 0, 2, 3, 4).reshape(b, p * s, hp * d)[:, :n]

        out = self.inner(scatter_heads(q), scatter_heads(k), scatter_heads(v), hp, None)  # [B, n, hp*D]
        out = torch.cat([out, out.new_zeros(b, p * s - n, hp * d)], dim=1) if p * s > n else out
        out = out.reshape(b, p, s, hp, d).permute(1, 0, 2, 3, 4)  # [P (sequence shard), B, S, hp, D]
        self.s.count("video_self", out)
        out = all_to_all(out, rg)  # [P (head group), B, S, hp, D]
        return out.permute(1, 2, 0, 3, 4).reshape(b, s, heads * d)


class _GatherKV:
    """Attention of the local queries over keys/values gathered from every shard (padding dropped)."""

    def __init__(self, inner: Any, shared: SharedTokens, kind: str) -> None:
        self.inner, self.s, self.kind = inner, shared, kind

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            raise ValueError(f"sequence_parallel does not split a {self.kind} attention mask")
        n = self.s.n_real
        self.s.count(self.kind, k)
        self.s.count(self.kind, v)
        kf = all_gather_cat(k, 1, self.s.rg)[:, :n]
        vf = all_gather_cat(v, 1, self.s.rg)[:, :n]
        return self.inner(q, kf, vf, heads, None)


class LSEMerge:
    """Audio queries over the local video key shard; partial outputs merged by log-sum-exp."""

    def __init__(self, shared: SharedTokens) -> None:
        self.s = shared

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            raise ValueError("sequence_parallel does not split an audio-over-video attention mask")
        rg = self.s.rg
        valid = self.s.local_tokens()  # this shard's real keys; the padding is dropped
        out, lse = attention_with_lse(q, k[:, :valid], v[:, :valid], heads)
        self.s.count("v2a", out)
        self.s.count("v2a", lse)
        outs = all_gather_cat(out[None], 0, rg)
        lses = all_gather_cat(lse[None], 0, rg)
        merged, _ = merge_partials(outs, lses)  # [B, H, Tq, D]
        b, h, tq, d = merged.shape
        return merged.transpose(1, 2).reshape(b, tq, h * d).to(q.dtype)


class _ShardView:
    """What a cache needs to reduce a video statistic: this shard's real tokens, and a sum over ranks."""

    def __init__(self, shared: SharedTokens) -> None:
        self.s = shared

    def valid(self, t: torch.Tensor) -> torch.Tensor:
        """Tokens [B, S, ...] of this rank's shard without the padding."""
        return t[:, : self.s.local_tokens()]

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t, self.s.rg)


def _shard_modality(video: Any, s: SharedTokens) -> Any:
    rg, n = s.rg, s.n_real

    def cut(t: torch.Tensor | None, dim: int) -> torch.Tensor | None:
        if t is None or t.dim() <= dim or t.shape[dim] != n:
            return t  # per-sample values (broadcast over tokens) stay whole
        return shard_tokens(t, dim, n, rg.rank, rg.size)

    return replace(video, latent=cut(video.latent, 1), timesteps=cut(video.timesteps, 1),
                   positions=cut(video.positions, 2))


@register("parallelism.sequence_parallel")
class SequenceParallel(Technique):
    """Video tokens split over ranks (Ulysses or gathered keys), audio replicated, v2a merged by LSE."""

    knobs = (
        Knob("degree", "categorical", off=1, choices=(1, 2, 4, 8), help="ranks sharing the video tokens (1: off)"),
        Knob("comm", "categorical", off="ulysses", choices=("ulysses", "allgather_kv"),
             help="video self-attention: all-to-all over heads (heads % degree == 0) or gathered keys/values"),
        Knob("v2a", "categorical", off="lse", choices=("lse", "gather_kv"),
             help="audio queries over video keys: exchange partial outputs + log-sum-exp, or gather keys/values"),
    )
    switch = "degree"
    stages = ("stage1", "stage2")
    # wraps the pass (shards its inputs, gathers its output), video self-attention and v2a, and publishes the
    # shard the caches reduce their statistics over
    seams = ("parallel.ranks", "transformer.pass", "attention.video_self", "attention.v2a", "parallel.video_shard")
    apply_last = True  # wraps whatever attention functions and passes the other techniques installed
    _WHOLE = ("with comm=ulysses the wrapped function sees whole query sequences (H/P heads per rank); "
              "comm=allgather_kv is refused at apply for functions that need whole queries")
    composes_with = {
        "kernel_choice.sdpa_backend": "the parallel wrappers call the chosen backend, on whole sequences (ulysses) or "
                                      "on local queries over gathered keys/values",
        "kernel_choice.attention8": "the parallel wrappers call the 8-bit attention on whole sequences of local heads "
                                    "(ulysses) or on local queries over gathered keys/values (their mean smooths the keys)",
        "sparse_attention.sol": _WHOLE,
        "sparse_attention.block_sparse": _WHOLE,
        "sparse_attention.window": _WHOLE,
        "caching.step_skip": "sequence parallelism (applied last) wraps the pass around step_skip's: the reused "
                             "velocity is per token, so each rank reuses its own shard's",
    }
    description = "Ulysses / gathered-KV sequence parallelism over video tokens, v2a by log-sum-exp merge"

    def applicable(self, request: Any = None) -> bool:
        return world_size() > 1

    inexact = ("on GPUs a matmul over fewer rows may pick another kernel (held to parallel_check's SEQUENCE_ATOL); "
               "bit-identical on the CPU with gathered keys and values")

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        degrees = [d for d in feasible_degrees(self.knob("degree").choices) if d > 1]
        if not degrees or device.type != "cpu":
            return None
        return {"degree": degrees[0], "comm": "allgather_kv", "v2a": "gather_kv"}

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        return suggest_with_feasible_degree(self, trial)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["degree"] > 1:
            require_world(f"{self.name}.degree", values["degree"])

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        degree = values["degree"]
        video_self = pipeline.attention_modules("video_self")
        if values["comm"] == "ulysses":
            heads = {m.heads for m in video_self}
            if any(h % degree for h in heads):
                raise KnobError(f"{self.name}.comm=ulysses needs the video heads {sorted(heads)} to divide by "
                                f"degree={degree}; use comm=allgather_kv or a smaller degree")
        else:
            whole = [type(m.attention_function).__name__ for m in video_self
                     if getattr(m.attention_function, "needs_whole_queries", False)]
            if whole:
                raise KnobError(f"{self.name}.comm=allgather_kv hands the attention function a query shard, but "
                                f"{whole[0]} needs whole query sequences; use comm=ulysses")
        rg = rank_group(f"{self.name}.degree", degree)  # after the checks above: they need no world
        shared = SharedTokens(rg)
        patch = Patch(self.name)
        for m in video_self:
            fn = Ulysses(m.attention_function, shared) if values["comm"] == "ulysses" else \
                _GatherKV(m.attention_function, shared, "video_self")
            patch.set_attr(m, "attention_function", fn)
        for m in pipeline.attention_modules("v2a"):
            fn = LSEMerge(shared) if values["v2a"] == "lse" else _GatherKV(m.attention_function, shared, "v2a")
            patch.set_attr(m, "attention_function", fn)

        inner_pass = pipeline.transformer_pass
        record = {"degree": degree, "comm": values["comm"], "v2a": values["v2a"], "rank": rg.rank}

        def transformer_pass(video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
            if video is None or not video.enabled:
                return inner_pass(video, audio, perturbations)
            if video.attention_mask is not None:
                raise ValueError("sequence_parallel cannot split a conditioned request's video attention mask")
            n = video.latent.shape[1]
            shared.n_real, shared.shard = n, -(-n // degree)
            if self.name not in pipeline.records:  # a new run (records are per run): count its bytes afresh
                shared.bytes.clear()
            v_out, a_out = inner_pass(_shard_modality(video, shared), audio, perturbations)
            shared.count("gather_output", v_out)
            v_full = all_gather_cat(v_out, 1, rg)[:, :n]
            rec = pipeline.records.setdefault(self.name, dict(record))
            rec["bytes_sent_per_rank"] = dict(shared.bytes)
            return v_full, a_out

        patch.set_attr(pipeline, "transformer_pass", transformer_pass)
        # Caches compare statistics of their inputs: video sums are per shard and padded (caching/_common.py).
        patch.set_attr(pipeline, "video_shard", _ShardView(shared))
        return patch
