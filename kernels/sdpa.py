"""``scaled_dot_product_attention`` with an explicit backend priority, as an ltx-core attention callable."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["SDPA_BACKENDS", "SDPAAttention", "backend_order", "sdpa_reference"]

# Knob value -> PyTorch backend. The fallback order after the chosen one is PyTorch 2.11's own default
# priority (cuDNN first on Hopper, ARCHITECTURE.md), so a backend that cannot run a shape (e.g. cuDNN
# on a CPU) falls through exactly as the default would.
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_DEFAULT_PRIORITY = ("cudnn", "flash", "efficient", "math")


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
