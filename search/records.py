"""A campaign's record log, ``trials.jsonl``: one JSON object per line, one line per finished trial or
combination, appended as each finishes. The one reader and writer of that file (the driver, ``tell`` and the
report all go through ``RecordLog``).

A crash mid-append leaves a last line without its newline, or half a record. Readers skip such a line; the
next append first cuts the torn tail back to the last complete record, keeping the file as it was beside it
(``trials.jsonl.torn-<time>``), so the new record never lands glued to half an old one. A garbled line in
the middle (not a crash's doing) is skipped by readers and reported by ``damaged_lines``.
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, TypedDict

from vidtune._io import OutputError, strict_json

if TYPE_CHECKING:
    from vidtune.search.timing import LatencyRecord
    from vidtune.techniques.setting import KnobValues

__all__ = ["Reason", "RecordLog", "Status", "TrialRecord", "failure_reason", "inject_fault"]


class Status(StrEnum):
    """A measured trial's or combination's outcome (a record's ``status``)."""

    OK = "ok"
    FAIL = "fail"


class Reason(StrEnum):
    """Why a trial failed or was not measured: a record's ``reason``, or an Optuna trial's user attribute."""

    OOM = "oom"  # out of memory, on the GPU or the host
    NON_FINITE = "non-finite"  # NaN or inf in a stage's output
    INVALID = "invalid"  # knob values, seams or the request refused before any model work
    ERROR = "error"  # any other exception (its type and message in ``message``)
    TIMEOUT = "timeout"  # ran past budget.trial_timeout_s: its actor was replaced
    ACTOR_DIED = "actor-died"  # its worker process died (a crash, the OOM killer)
    INTERRUPTED = "interrupted"  # left running by a killed campaign, or not started for lack of time: queued again
    NO_OP = "no-op"  # the sampled setting changes nothing for the request: not measured
    DUPLICATE = "duplicate"  # the study measured (or is measuring) the same parameters: not measured
    KNOWN_LOSER = "known-loser"  # slower than the baseline on this GPU class (catalogue, earlier campaigns)


class TrialRecord(TypedDict, total=False):
    """One line of ``trials.jsonl``: a family's trial (``family``, ``trial``) or a combination (``family``
    "integrator", ``combo``). The evaluation's fields (``Evaluation.record``) where it ran; ``status`` fail
    with its ``reason`` and ``message`` where it did not."""

    family: str
    trial: int
    status: Status
    reason: Reason
    message: str
    knobs: KnobValues  # the setting (a Setting, written as JSON)
    total_ms: float
    latency: dict[str, LatencyRecord]  # stage -> its latency summary
    quality: dict[str, Any] | None
    paired: dict[str, Any]  # the interleaved pairs' ratios, interval, faster / slower
    timing: dict[str, Any]
    peak_memory_bytes: int
    constraints: list[float]  # the gate's constraint values (<= 0: within it)
    combo: str  # a combination's key
    passes_gate: bool
    time: float


class RecordLog:
    """``trials.jsonl`` of one campaign folder."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _lines(self) -> Iterator[tuple[int, bytes, bool]]:
        """(line number, bytes, whether it ended with a newline) of each line of the file."""
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        parts = data.split(b"\n")
        for number, line in enumerate(parts, start=1):
            complete = number < len(parts)
            if line or complete:
                yield number, line, complete

    def read(self) -> list[TrialRecord]:
        """Every complete record, in order (a torn or garbled line is skipped: its work is measured again)."""
        out = []
        for _, line, _complete in self._lines():
            rec = _parse(line)
            if rec is not None:
                out.append(rec)
        return out

    def damaged_lines(self) -> list[int]:
        """Line numbers that hold no record (a torn tail, or damage in the middle)."""
        return [n for n, line, _ in self._lines() if line.strip() and _parse(line) is None]

    def repair(self) -> str | None:
        """Cut a torn tail (bytes after the last newline, or a garbled last line) back to the last complete
        record; the file as it was is kept beside it. Returns what was done, or None when nothing was torn."""
        if not self.path.is_file():
            return None
        data = self.path.read_bytes()
        end = len(data)
        if data and not data.endswith(b"\n"):
            end = data.rfind(b"\n") + 1  # 0 when the only line is torn
        while end > 0:  # a garbled last complete line is a torn write too (its newline reached the disk first)
            start = data.rfind(b"\n", 0, end - 1) + 1
            line = data[start:end - 1]
            if not line.strip() or _parse(line) is not None:
                break
            end = start
        if end == len(data):
            return None
        backup = self.path.with_name(f"{self.path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        backup.write_bytes(data)
        with open(self.path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
        return (f"{self.path}: cut a torn last record ({len(data) - end} bytes, a write a crash interrupted) back to "
                f"the last complete one; the file as it was is kept in {backup.name}")

    def append(self, record: TrialRecord | dict[str, Any]) -> str | None:
        """Append ``record`` as one line (standard JSON: non-finite numbers become null), in one write, flushed
        to disk. A torn tail is cut back first; returns ``repair``'s message (None when nothing was torn)."""
        line = (strict_json(record) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        message = self.repair()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(28, "short write")
                os.fsync(fd)
            except OSError as exc:  # (a full disk) leave no half line behind for the next reader
                os.ftruncate(fd, size)
                raise OutputError(exc.errno or 0, f"cannot append to {self.path}: {exc.strerror or exc}; the record "
                                                  f"was not written (the file is as it was)") from exc
        finally:
            os.close(fd)
        return message


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def failure_reason(exc: BaseException) -> tuple[Reason, str]:
    """(kind, message) of a failed trial: oom, non-finite, invalid, or error."""
    import torch

    from vidtune.search.stages import NonFiniteOutput
    from vidtune.techniques.registry import KnobError
    from vidtune.techniques.setting import CompositionError

    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return Reason.OOM, str(exc).splitlines()[0][:500]
    if isinstance(exc, NonFiniteOutput):
        return Reason.NON_FINITE, str(exc)
    if isinstance(exc, (KnobError, CompositionError)):
        return Reason.INVALID, str(exc)
    return Reason.ERROR, f"{type(exc).__name__}: {exc}"[:1000]


def inject_fault(where: str = "evaluate") -> None:
    """Fault injection for tests of the driver, from ``VIDTUNE_FAULT_INJECT``, one or more of (comma-separated;
    ``where``: the worker's call, ``evaluate``, ``bench`` or ``bench-of-the-baseline``): ``die-once:<marker file>``
    makes the first evaluation (in any worker) kill its own process, as a crash or the OOM killer would;
    ``slow:<seconds>`` makes every evaluation wait that long first, without using the CPU (a long trial for the
    tests of concurrent drivers, which otherwise paid for it in generations on a 2-core CPU);
    ``oom-stuck-once:<marker>`` makes the first evaluation run out of memory and leave memory held in its process
    (search/gpu_memory.py), as a CUDA graph's pool outliving its failed capture did on an H100;
    ``bench-oom-once:<marker>`` makes the first bench of a setting run out of memory."""
    for spec in filter(None, os.environ.get("VIDTUNE_FAULT_INJECT", "").split(",")):
        kind, _, arg = spec.partition(":")
        if kind == "slow" and where == "evaluate":
            time.sleep(float(arg))
        elif (kind, where) in (("die-once", "evaluate"), ("oom-stuck-once", "evaluate"), ("bench-oom-once", "bench")):
            try:
                fd = os.open(Path(arg), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            if kind == "die-once":
                os._exit(1)
            import torch

            if kind == "oom-stuck-once":
                from vidtune.search.gpu_memory import HELD_BY_FAULT, RELEASE_SLACK_BYTES

                HELD_BY_FAULT.append(torch.empty(2 * RELEASE_SLACK_BYTES, dtype=torch.uint8))  # (untouched: no pages)
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by VIDTUNE_FAULT_INJECT {spec})")
