"""Kernel choice family: which kernel runs each operation (SDPA backend, FP8 linears, compile, CUDA graphs,
the VAE decode's kernels)."""

from vidtune.techniques.kernel_choice import compile, cuda_graphs, fp8_linear, fused_norms, sdpa_backend, vae_decode  # noqa: F401,E501  (registers)
