"""Attention and matmul kernels, each beside a plain PyTorch reference of the same function.

GPU-only packages (natten, nvidia-cutlass-dsl) are imported lazily inside the kernels that need them,
so importing ``vidtune.kernels`` works on a CPU-only machine.
"""

from vidtune.kernels.sdpa import SDPA_BACKENDS, SDPAAttention, backend_order

__all__ = ["SDPA_BACKENDS", "SDPAAttention", "backend_order"]
