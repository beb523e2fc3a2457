"""The GPU memory a trial worker's process may use: an explicit budget (eval.memory_budget_gb), or the card
less what a quality model's process beside it needs."""

from __future__ import annotations

import os
from typing import Any, Callable

__all__ = ["enforce_memory_budget", "beside_quality_process", "QUALITY_RESERVE_GIB", "allocated", "before_run",
           "release_after_failure", "RELEASE_SLACK_BYTES", "HELD_BY_FAULT", "quality_concurrent", "worker_budget",
           "memory_cap_gib"]


def _cuda_device(device: Any) -> Any:
    """``device`` as an indexed CUDA device ("cuda": the current one), or None on a CPU or without CUDA."""
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    # (set_per_process_memory_fraction wants an index: seen on the H200, every budgeted trial raised without one)
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def _card_bytes(dev: Any) -> int:
    import torch

    return torch.cuda.get_device_properties(dev).total_memory


def enforce_memory_budget(budget_gb: float | None, device: str) -> dict[str, Any] | None:
    """Cap this process's allocations on a CUDA ``device`` at ``budget_gb`` GiB (a fraction of the card);
    returns what was set, or None (no budget, or not a CUDA device: nothing can be enforced there)."""
    import torch

    dev = _cuda_device(device)
    if budget_gb is None or dev is None:
        return None
    total = _card_bytes(dev)
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
    dev = _cuda_device(device)
    return None if dev is None else max(1.0, _card_bytes(dev) / 2**30 - QUALITY_RESERVE_GIB)


def quality_concurrent(spec: Any) -> bool:
    """Whether the quality model of a ``WorkerSpec`` runs in its own process beside the worker's (``QualityProcess``):
    on a GPU by default; on a CPU both would share the same cores, so there it runs in the worker, after the trial
    (quality_model.concurrent: auto, true, false)."""
    q = spec.quality
    return str(spec.device).startswith("cuda") if q is None or q.concurrent is None else bool(q.concurrent)


def worker_budget(spec: Any) -> float | None:
    """The GiB a trial worker of ``spec`` caps its process at: ``memory_budget_gb``, else (its quality model in
    a process beside it on the same GPU) the card less ``QUALITY_RESERVE_GIB``; None: the whole card."""
    if spec.memory_budget_gb is None and spec.quality and quality_concurrent(spec):
        return beside_quality_process(spec.device)
    return spec.memory_budget_gb


def memory_cap_gib(device: Any, budget_gb: float | None) -> float | None:
    """The device memory (GiB) a process capped at ``budget_gb`` may allocate on ``device``: the budget, the card's
    memory, or None on a CPU (nothing is capped there). What an out-of-memory record is compared by."""
    dev = _cuda_device(device)
    if dev is None:
        return None
    card = _card_bytes(dev) / 2**30
    return round(card if budget_gb is None else min(card, budget_gb), 2)


# Bytes a failed run may leave held above what its process held before it without the process being replaced
# (the allocator's rounding, a workspace a kernel library keeps).
RELEASE_SLACK_BYTES = 1 << 30
# Tensors held by an injected fault (search/records.py ``inject_fault``, ``oom-stuck-once``), counted as this
# process's device memory on a CPU while a fault is injected: the tests' stand-in for a CUDA graph's pool that
# outlives its failed capture.
HELD_BY_FAULT: list[Any] = []


def allocated(device: Any) -> int | None:
    """Bytes of tensors this process holds on ``device`` (CUDA); None where that is not known (a CPU)."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.memory_allocated(torch.device(device))
    if os.environ.get("VIDTUNE_FAULT_INJECT"):
        return sum(t.numel() * t.element_size() for t in HELD_BY_FAULT)
    return None


def before_run(device: Any, setting: Any) -> int | None:
    """Before ``setting`` runs: what the techniques it does not hold kept from earlier settings is freed (captured
    CUDA graphs: another setting's leftovers must not take this one's memory); returns ``allocated``."""
    from vidtune.techniques.registry import release_kept

    release_kept(setting)
    return allocated(device)


def release_after_failure(device: Any, held_before: int | None, measure: Callable[[Any], int | None] = allocated,
                          slack: int = RELEASE_SLACK_BYTES) -> str | None:
    """After a run that failed (call it once the exception and its frames are gone): what the run allocated is
    freed (what techniques keep between applications, ``gc`` for reference cycles, the caching allocator's blocks returned to the driver; if still held,
    Dynamo's graphs are dropped too, as compiled CUDA graph trees keep their pools). Returns why the process
    must be replaced when more than ``slack`` bytes stay held above ``held_before``, else None.

    Why: on an H100 (ltx2-19b at 1536x1024x121, 2026-12-07) one trial with CUDA graphs ran out of memory and left
    19.6 GiB held in its process; the 48 evaluations after it in that process failed as OOM (its 46 combinations in
    40 s), and the campaign exported what its first trials had measured."""
    import gc

    if held_before is None:
        return None
    from vidtune.techniques.registry import release_kept

    release_kept()  # (the failed setting's techniques are undone by now)
    for drop_graphs in (False, True):
        if drop_graphs:  # (as a new process would start: no graph, no compile-cache blob counted as loaded)
            import torch._dynamo

            from vidtune.techniques.kernel_choice.compile_cache import forget_loads

            torch._dynamo.reset()
            forget_loads()
        gc.collect()
        _empty_cache(device)
        now = measure(device)
        if now is None or now - held_before <= slack:
            return None
    return (f"{(now - held_before) / 2**30:.1f} GiB stayed held after the failure ({now / 2**30:.1f} GiB against "
            f"{held_before / 2**30:.1f} GiB before the run): every later run of this process would run out of memory")


def _empty_cache(device: Any) -> None:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(torch.device(device))
        torch.cuda.empty_cache()
