"""Stage timing: CUDA events on a GPU, perf_counter on a CPU; summaries over repeats."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

__all__ = ["StageTimer", "LatencySummary", "summarise"]


class StageTimer:
    """Times a block of work on ``device``. Use ``with timer.measure(): ...`` then ``timer.elapsed_ms``.

    On CUDA, events bracket the work on the current stream and the host synchronises once at the
    end, so the time is the GPU's, not the launch queue's.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.elapsed_ms = float("nan")

    def measure(self) -> "StageTimer":
        return self

    def __enter__(self) -> "StageTimer":
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self._end.record()
            self._end.synchronize()
            self.elapsed_ms = self._start.elapsed_time(self._end)
        else:
            self.elapsed_ms = (time.perf_counter() - self._t0) * 1e3


@dataclass(frozen=True)
class LatencySummary:
    """Median and spread of repeated timings, in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    stdev_ms: float
    repeats: int
    source: str = "measured"  # or "baseline" when a stage was reused, not re-run

    def to_dict(self) -> dict:
        return asdict(self)


def summarise(samples_ms: list[float], source: str = "measured") -> LatencySummary:
    """Summary of ``samples_ms`` (at least one sample)."""
    if not samples_ms:
        raise ValueError("no timing samples")
    return LatencySummary(
        median_ms=float(statistics.median(samples_ms)),
        min_ms=float(min(samples_ms)),
        max_ms=float(max(samples_ms)),
        stdev_ms=float(statistics.stdev(samples_ms)) if len(samples_ms) > 1 else 0.0,
        repeats=len(samples_ms),
        source=source,
    )
