"""Successive halving over interleaved pairs: a family trial's first pair decides whether its other pairs are
spent (``evaluate_paired``'s ``prune``).

A family's survivors are its Pareto front over (latency, PSNR) among the settings measured faster than the
baseline (``Campaign.survivors``). After the first pair of a new setting its ratio is known to about the noise
of one pair; a setting that reads slower than the baseline, or slower beyond ``margin`` than a survivor of at
least its PSNR, cannot join that front, and its remaining pairs (most of a timed trial) would only measure a
loser. It is recorded with its one pair (``paired["pruned"]``, not ``faster``), so TPE still learns from it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["pair_pruner", "front_points"]


def front_points(survivors: Iterable[dict[str, Any]]) -> list[tuple[float, float]]:
    """(total ms, PSNR dB) of a family's survivors, as a trial's ``front``."""
    return [(float(s["total_ms"]), float(s["psnr_db"])) for s in survivors]


def pair_pruner(front: list[tuple[float, float]], baseline: Any, margin: float,
                psnr: Callable[[], float | None]) -> Callable[..., str | None]:
    """The ``prune`` of one evaluation: a reason when the first pair's ``ratio`` (or the latency model's, named by
    ``source``) shows the setting cannot win, else None. ``baseline``: the stored baseline (its per-stage medians give the whole generation's ms);
    ``psnr``: the setting's PSNR as screened after its warm-up (None, unscreened: only the baseline test)."""
    total = sum(v["median_ms"] for v in baseline.latency.values())

    def prune(ratio: float, source: str = "its first pair") -> str | None:
        if ratio >= 1.0:
            return f"{source} read x{1 / ratio:.3f}: not faster than the baseline"
        mine = psnr()
        if mine is None:
            return None
        ms = total * ratio
        better = [(t, p) for t, p in front if p >= mine and t < ms * (1.0 - margin)]
        if not better:
            return None
        t, p = min(better)
        return (f"{source} read {ms:.0f} ms at {mine:.2f} dB; its family measured {t:.0f} ms at {p:.2f} dB, "
                f"faster beyond {margin:g}")

    return prune
