"""Kernel choice family: which kernel runs each operation (SDPA backend; later FP8, compile, graphs)."""

from vidtune.techniques.kernel_choice import sdpa_backend  # noqa: F401  (registers)
