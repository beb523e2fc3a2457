"""Weights kept in host memory and put back on the device on demand: what ``block_offload``,
``stage_placement`` and ``fp8_weights`` share. A slot is one tensor a module holds, its host copy (pinned
when the tensor lives on CUDA, so that a copy back can be asynchronous) and how to put a tensor in its place."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["HostSlot", "host_copy", "empty_on", "parameter_slots"]


class HostSlot:
    """One tensor a module holds: its host copy, and how to put a tensor in its place."""

    def __init__(self, host: torch.Tensor, put: Callable[[torch.Tensor], None]) -> None:
        self.host, self.put = host, put


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t``, pinned when ``t`` is on CUDA."""
    host = t.detach().to("cpu", copy=True)
    return host.pin_memory() if t.device.type == "cuda" else host


def empty_on(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An empty tensor of ``host``'s dtype and rank on ``device``: what a slot holds while its weights are away."""
    return torch.empty((0,) * max(1, host.dim()), dtype=host.dtype, device=device)


def parameter_slots(module: torch.nn.Module, buffers: bool = False) -> list[HostSlot]:
    """A slot per non-empty parameter of ``module`` (and buffer, with ``buffers``); one another technique emptied
    is left alone."""
    tensors = list(module.parameters()) + (list(module.buffers()) if buffers else [])
    return [HostSlot(host_copy(t.data), lambda v, t=t: setattr(t, "data", v)) for t in tensors if t.numel()]
