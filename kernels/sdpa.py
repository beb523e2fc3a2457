"""``scaled_dot_product_attention`` with an explicit backend priority, as an ltx-core attention callable."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["SDPA_BACKENDS", "SDPAAttention", "backend_order", "sdpa_reference", "settle_default_priority",
           "traceable_default"]

# Knob value -> PyTorch backend. The fallback order after the chosen one is PyTorch 2.11's own default
# priority (cuDNN first on Hopper, docs/architecture.md), so a backend that cannot run a shape (e.g. cuDNN
# on a CPU) falls through exactly as the default would.
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_DEFAULT_PRIORITY = ("cudnn", "flash", "efficient", "math")


# PyTorch (2.11 and later, sdp_utils.cpp) sets its CUDA default priority lazily, at the first CUDA SDPA
# dispatch of the process: cuDNN first on Hopper/Blackwell, else flash first. If that first dispatch happens
# inside `sdpa_kernel(..., set_priority=True)`, the context saved the not-yet-initialised order (flash first)
# on entry and restores it on exit, and the lazy initialisation never runs again: every later default
# attention in the process runs flash instead of cuDNN. Found on the H200 (2026-12-03): a campaign worker's
# first attention is its baseline's noise-floor run (flash for every kind, through this module), and its
# baseline then ran stage 2 in 8.44 s against 6.54-6.60 s in a plain `vidtune bench` (video self-attention
# 28.3 ms flash vs 16.1 ms cuDNN, 144 calls a stage 2), so every trial that chose cuDNN looked faster than it
# is. One tiny attention outside any context settles the default before the first context is entered.
_SETTLED = False


def settle_default_priority(device: torch.device | str) -> None:
    """Make PyTorch fix its default CUDA SDPA priority now (one 1x1x8x64 attention), once per process, so
    that no ``sdpa_kernel(..., set_priority=True)`` context can save and restore the uninitialised order.
    A no-op on a CPU (its dispatch has no lazy state), while compiling, and after the first call."""
    global _SETTLED
    if _SETTLED or torch.device(device).type != "cuda" or torch.compiler.is_compiling():
        return
    x = torch.zeros(1, 1, 8, 64, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.nn.functional.scaled_dot_product_attention(x, x, x)
    _SETTLED = True


def traceable_default(fn: object) -> object | None:
    """ltx-core's default attention (an Enum member, whose ``__call__`` Dynamo cannot trace: a graph break at every
    attention) as the callable it stands for, ``PytorchAttention``, where xformers is absent; None for any other
    ``fn`` (a chosen backend, a technique's wrapper), which is traceable as it is."""
    from ltx_core.model.transformer.attention import AttentionFunction, PytorchAttention, memory_efficient_attention

    if fn is AttentionFunction.PYTORCH or (fn is AttentionFunction.DEFAULT and memory_efficient_attention is None):
        return PytorchAttention()
    return None


def backend_order(first: str) -> list[SDPBackend]:
    """Priority list with ``first`` in front of the default order."""
    if first not in SDPA_BACKENDS:
        raise ValueError(f"SDPA backend must be one of {sorted(SDPA_BACKENDS)}, got {first!r}")
    return [SDPA_BACKENDS[first]] + [SDPA_BACKENDS[b] for b in _DEFAULT_PRIORITY if b != first]


class SDPAAttention:
    """ltx-core ``AttentionCallable``: ``(q, k, v, heads, mask) -> out`` on [B, T, H*D] tensors.

    The layout handling is ltx-core's ``PytorchAttention``; only the backend priority is set around it.
    """

    def __init__(self, first: str) -> None:
        from ltx_core.model.transformer.attention import PytorchAttention

        self.first = first
        self.order = backend_order(first)
        self._impl = PytorchAttention()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        if not _SETTLED and q.is_cuda:
            settle_default_priority(q.device)
        with sdpa_kernel(self.order, set_priority=True):
            return self._impl(q, k, v, heads, mask)

    def __repr__(self) -> str:
        return f"SDPAAttention(first={self.first!r})"


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain float32 softmax(QK^T/sqrt(d))V on [B, T, H*D] tensors (the reference for every backend)."""
    b, tq, hd = q.shape
    d = hd // heads
    qh, kh, vh = (t.float().reshape(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    scores = qh @ kh.transpose(-1, -2) / d**0.5
    if mask is not None:
        scores = scores + mask.float()
    out = scores.softmax(-1) @ vh
    return out.transpose(1, 2).reshape(b, tq, hd).to(q.dtype)
