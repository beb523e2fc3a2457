"""Where vidtune's Triton kernels can run, shared by every kernel module."""

from __future__ import annotations

import os

import torch

__all__ = ["triton_available"]


def triton_available(device: torch.device) -> bool:
    """True on a CUDA device, and anywhere under TRITON_INTERPRET=1 (Triton's CPU interpreter, which
    reads the variable when Triton is first imported)."""
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
