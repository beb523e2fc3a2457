"""Stage timing: CUDA events on a GPU, perf_counter on a CPU; summaries over repeats."""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["StageTimer", "PeakMemory", "LatencySummary", "summarise"]

_OPEN: list["PeakMemory"] = []  # CUDA windows open in this process (PeakMemory)


class PeakMemory:
    """The peak memory of one evaluation (a trial's window, not the process's lifetime).

    On CUDA: ``max_memory_allocated`` (and ``max_memory_reserved``) after a reset at the start. On a CPU the
    process's resident set, sampled every 2 ms by a thread from ``/proc/self/statm`` while the window is
    open (an allocation shorter than 2 ms can be missed); without ``/proc`` the process-lifetime peak
    (``ru_maxrss``), marked as such in ``kind``. Windows nest: a stage's (``StageTimer(memory=True)``) inside
    an evaluation's; on CUDA each stage resets the allocator's peak and hands its own to the open windows."""

    _STATM = "/proc/self/statm"

    def __init__(self, device: torch.device) -> None:
        import os
        import threading

        self.device, self.peak, self.reserved = torch.device(device), 0, None
        device = self.device
        self.kind = "cuda_allocated" if device.type == "cuda" else (
            "cpu_rss_window" if os.path.exists(self._STATM) else "cpu_rss_lifetime")
        self._stop = threading.Event()
        self._thread: Any = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        elif self.kind == "cpu_rss_window":
            self._page = os.sysconf("SC_PAGE_SIZE")
            self.peak = self._rss()
            self._thread = threading.Thread(target=self._sample, daemon=True, name="vidtune-peak-memory")
            self._thread.start()

    def _rss(self) -> int:
        with open(self._STATM) as f:
            return int(f.read().split()[1]) * self._page

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> dict[str, Any]:
        """Close the window (again: the same answer); returns ``peak_memory_bytes`` (and the reserved peak on
        CUDA) and the ``kind``."""
        if getattr(self, "_result", None) is not None:
            return self._result
        if self.device.type == "cuda":
            self.peak = max(self.peak, int(torch.cuda.max_memory_allocated(self.device)))
            self.reserved = max(self.reserved or 0, int(torch.cuda.max_memory_reserved(self.device)))
            if self in _OPEN:
                _OPEN.remove(self)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._rss())
        else:
            self.peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        self._result = {"peak_memory_bytes": int(self.peak), "peak_memory_reserved_bytes": self.reserved,
                        "peak_memory_kind": self.kind}
        return self._result


class StageTimer:
    """Times a block of work on ``device``. Use ``with timer.measure(): ...`` then ``timer.elapsed_ms``.

    On CUDA, events bracket the work on the current stream and the host synchronises once at the
    end, so the time is the GPU's, not the launch queue's. ``memory``: also the block's peak memory
    (``peak_bytes``: CUDA's allocated peak, or the CPU's resident set; ``PeakMemory``).
    """

    def __init__(self, device: torch.device, memory: bool = False) -> None:
        self.device = torch.device(device)
        self.elapsed_ms = float("nan")
        self.memory, self.peak_bytes = memory, None

    def measure(self) -> "StageTimer":
        return self

    def __enter__(self) -> "StageTimer":
        if self.memory:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            else:
                self._window = PeakMemory(self.device)
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
        if self.memory:
            if self.device.type == "cuda":
                self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
                reserved = int(torch.cuda.max_memory_reserved(self.device))
                for window in _OPEN:
                    window.peak = max(window.peak, self.peak_bytes)
                    window.reserved = max(window.reserved or 0, reserved)
            else:
                self.peak_bytes = self._window.stop()["peak_memory_bytes"]


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
