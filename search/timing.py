"""Stage timing: CUDA events on a GPU, perf_counter on a CPU; summaries over repeats."""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch

__all__ = ["StageTimer", "PeakMemory", "LatencyRecord", "LatencySummary", "summarise", "alternating", "stage_split", "Interleaved",
           "interleaved", "time_call"]

T = TypeVar("T")
K = TypeVar("K")  # a side's name: a setting's, a backend's, a launch row's index

_OPEN: list["PeakMemory"] = []  # windows open in this process, outermost first (PeakMemory)
_CLEAR_REFS, _STATUS = "/proc/self/clear_refs", "/proc/self/status"


def _cpu_peak_resettable() -> bool:
    """Whether this Linux lets the process reset its own resident-set high-water mark (``VmHWM``)."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """The peak memory of a window of work (a trial's runs, a stage), not the process's lifetime.

    The device keeps a high-water mark that can be reset: on CUDA the allocator's (``max_memory_allocated``,
    ``max_memory_reserved``, ``reset_peak_memory_stats``), on Linux the kernel's of the resident set
    (``VmHWM`` in ``/proc/self/status``, reset by writing 5 to ``/proc/self/clear_refs``): exact, and with
    no sampling thread beside the timed work. Windows nest (a stage's inside an evaluation's): before a
    window resets the mark it hands the mark so far to every open window, and so does each window when it
    closes. Where the mark cannot be reset, the process-lifetime peak (``ru_maxrss``), said in ``kind``."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak, self.reserved = torch.device(device), 0, None
        if self.device.type == "cuda":
            self.kind = "cuda_allocated"
        else:
            self.kind = "cpu_rss_window" if _cpu_peak_resettable() else "cpu_rss_lifetime"
        self._result: dict[str, Any] | None = None
        if self.kind != "cpu_rss_lifetime":
            self._flush()
            self._reset()
            _OPEN.append(self)

    def _read(self) -> tuple[int, int | None]:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), int(torch.cuda.max_memory_reserved(self.device))
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, None
        return 0, None

    def _reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _cpu_peak_resettable()

    def _flush(self) -> None:
        """Hand the mark so far to every open window of this device kind."""
        peak, reserved = self._read()
        for w in _OPEN:
            if w.device.type == self.device.type:
                w.peak = max(w.peak, peak)
                if reserved is not None:
                    w.reserved = max(w.reserved or 0, reserved)

    def stop(self) -> dict[str, Any]:
        """Close the window (again: the same answer); returns ``peak_memory_bytes`` (and the reserved peak on
        CUDA) and the ``kind``."""
        if self._result is not None:
            return self._result
        if self.kind == "cpu_rss_lifetime":
            self.peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        else:
            self._flush()
            if self in _OPEN:
                _OPEN.remove(self)
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
            self.peak_bytes = self._window.stop()["peak_memory_bytes"]


# A stage's LatencySummary as written to a record (``to_dict``), ``source`` "baseline" where it was reused
LatencyRecord = dict[str, Any]


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


# Interleaved timing: the one order every comparison of this project is timed in (the evaluator's pairs, the
# bench's repeats, the latency model's replayed passes, the benchmarks' passes and kernels). Two settings timed
# one after the other meet different machine states (clocks, heat, another process); in alternating order
# (A B, B A, ...) a drift lands on both alike, and the ratio of the pairs stays honest.


def alternating(sides: Sequence[K], rounds: int) -> Iterator[list[K]]:
    """The order of each of ``rounds`` rounds over ``sides``: A B C, C B A, A B C, ... (each side as often
    early as late in a round)."""
    for i in range(rounds):
        yield list(sides) if i % 2 == 0 else list(reversed(sides))


class Interleaved:
    """Runs under sides applied in turn, a side kept applied while its runs follow one another (B B of
    A B, B A runs under one application: a setting is applied as often as a round changes side, not once a run).

    ``apply(side)`` applies a side and returns what undoes it (a callable) or None for a side that needs nothing
    applied (the baseline). ``run(side, fn)`` runs ``fn`` under ``side``; ``release()``
    undoes the side applied (also on leaving the ``with`` block, an error included)."""

    def __init__(self, apply: Callable[[Any], Any]) -> None:
        self._apply, self._side, self._undo = apply, None, None

    def run(self, side: Any, fn: Callable[[], T]) -> T:
        if side != self._side:
            self.release()
            self._undo, self._side = self._apply(side), side
        return fn()

    def release(self) -> None:
        undo, self._undo, self._side = self._undo, None, None
        if undo is not None:
            undo()

    def __enter__(self) -> "Interleaved":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def interleaved(sides: Sequence[K], rounds: int, apply: Callable[[K], Any], run: Callable[[K], T],
                untimed: int = 1) -> dict[K, list[T]]:
    """``run(side)`` for each side over ``untimed`` rounds left out of the result (a compile, an autotune, the
    allocator: nothing of a warm-up lands in a kept run) and then ``rounds`` rounds in ``alternating`` order,
    under ``Interleaved(apply)``; each side's kept results in order."""
    kept: dict[K, list[T]] = {side: [] for side in sides}
    with Interleaved(apply) as il:
        for i, order in enumerate(alternating(sides, untimed + rounds)):
            for side in order:
                got = il.run(side, lambda: run(side))
                if i >= untimed:
                    kept[side].append(got)
    return kept


def time_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call of ``fn`` on ``device`` (``StageTimer``: CUDA events on a GPU)."""
    timer = StageTimer(device)
    with timer:
        fn()
    return timer.elapsed_ms


def stage_split(a_stages: list[Any], b_stages: list[Any]) -> dict[str, Any]:
    """Per stage, from each side's per-run stage times (a {stage: ms} per run): medians, ranges, B's speed-up."""
    out: dict[str, Any] = {
        s: {"baseline_ms": statistics.median(r[s] for r in a_stages), "tuned_ms": statistics.median(r[s] for r in b_stages),
            "baseline_range_ms": [min(r[s] for r in a_stages), max(r[s] for r in a_stages)],
            "tuned_range_ms": [min(r[s] for r in b_stages), max(r[s] for r in b_stages)]}
        for s in a_stages[0]}
    for v in out.values():
        v["speedup"] = v["baseline_ms"] / v["tuned_ms"] if v["tuned_ms"] > 0 else None
    return out
