"""The GPU memory a trial worker's process may use: an explicit budget (eval.memory_budget_gb), or the card
less what a quality model's process beside it needs."""

from __future__ import annotations

from typing import Any

__all__ = ["enforce_memory_budget", "beside_quality_process", "QUALITY_RESERVE_GIB"]


def enforce_memory_budget(budget_gb: float | None, device: str) -> dict[str, Any] | None:
    """Cap this process's allocations on a CUDA ``device`` at ``budget_gb`` GiB (a fraction of the card);
    returns what was set, or None (no budget, or not a CUDA device: nothing can be enforced there)."""
    import torch

    if budget_gb is None or not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    if dev.index is None:  # "cuda": the current device (set_per_process_memory_fraction wants an index; seen on
        dev = torch.device("cuda", torch.cuda.current_device())  # the H200, every budgeted trial raised)
    total = torch.cuda.get_device_properties(dev).total_memory
    fraction = min(1.0, budget_gb * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return {"budget_gb": budget_gb, "fraction": fraction, "device_total_gb": total / 2**30}


# GiB of the card left to the quality model's process beside a trial worker that has no eval.memory_budget_gb.
# Without a cap, the caching allocator of ltx2-19b's worker held 76.8 GiB of an 80 GB H100 after its baseline at
# 1536x1024x121 (41.7 GiB in use at its peak, results/benchmarks/memory/), and ltx2-mini's process, starting
# beside it, ran out of memory (2026-12-05). Capped, the allocator frees cached blocks before it fails.
QUALITY_RESERVE_GIB = 12.0


def beside_quality_process(device: str) -> float | None:
    """The memory budget (GiB) of a worker whose quality model runs in another process on the same CUDA
    ``device``: the card less ``QUALITY_RESERVE_GIB``; None on a CPU (nothing to share)."""
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    total = torch.cuda.get_device_properties(dev.index if dev.index is not None else torch.cuda.current_device())
    return max(1.0, total.total_memory / 2**30 - QUALITY_RESERVE_GIB)
