"""Kernel choice family: which kernel runs each operation (SDPA backend, 8-bit video self-attention, FP8 linears,
compile, CUDA graphs, the guidance passes of a multistep step as one batch, the VAE decode's kernels)."""

from vidtune.techniques.kernel_choice import (  # noqa: F401  (registers)
    attention8, batched_guidance, compile, cuda_graphs, fp8_linear, fused_norms, sdpa_backend, vae_decode)
