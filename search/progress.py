"""Lines while a long step runs (a setting's warm-up: its compiles, its autotune): what runs, for how long, and
what it would take without them.

A warm-up prints nothing of its own until it ends, and a compile at a new size can take minutes (the 19B's
VAE decoder's first compiled run took 228 s on an H100 at 1536x1024x121): a bench of two compiled settings was
cut after 9 minutes with nothing printed. ``Heartbeat`` says, every ``every_s`` seconds from a daemon thread,
which stage is running, for how long, and the stage's time uncompiled (the baseline's), so that the reader sees
how much of it is the compile.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

__all__ = ["Heartbeat", "HEARTBEAT_S", "warming_up", "TerminalLog"]

# Seconds between two lines of a long warm-up (read at each use, so a test can shorten it)
HEARTBEAT_S = 30.0


class Heartbeat:
    """``with Heartbeat(say, "bench: warming up") as hb: evaluate(..., on_stage=hb.stage)``.

    ``floor_ms``: each stage's time without the setting's first-use costs (the baseline's medians), said beside
    the stage's elapsed time; ``compiling``: whether the setting compiles graphs (said as the likely reason).
    ``stage(name)`` is called as each stage starts; ``what(text)`` renames the step (e.g. which setting).
    Nothing is said for a step shorter than ``every_s``."""

    def __init__(self, say: Callable[[str], None], what: str, every_s: float = 30.0,
                 floor_ms: dict[str, float] | None = None, compiling: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if every_s <= 0:
            raise ValueError(f"Heartbeat: every_s must be > 0, got {every_s}")
        self.say, self._what, self.every_s = say, what, every_s
        self.floor_ms, self.compiling, self.clock = dict(floor_ms or {}), compiling, clock
        self._stage: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = self._since = clock()

    def stage(self, name: str) -> None:
        with self._lock:
            self._stage, self._since = name, self.clock()

    def what(self, text: str) -> None:
        with self._lock:
            self._what = text

    def line(self) -> str:
        """The line said now."""
        with self._lock:
            what, stage, since = self._what, self._stage, self._since
        now = self.clock()
        text = f"{what}: {now - self._t0:.0f} s so far"
        if stage is None:
            return text
        text += f"; {stage} running for {now - since:.0f} s"
        floor = self.floor_ms.get(stage)
        if floor is not None:
            text += f" (~{floor / 1000:.1f} s once warm"
            if now - since > floor / 1000:
                text += ("; the rest is the first run's compile" if self.compiling else
                         "; the rest is the first run's setup: autotune, allocator")
            text += ")"
        return text

    def _beat(self) -> None:
        while not self._done.wait(self.every_s):
            self.say(self.line())

    def __enter__(self) -> "Heartbeat":
        self._t0 = self._since = self.clock()
        self._thread = threading.Thread(target=self._beat, name="vidtune-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def warming_up(say: Callable[[str], None], what: str, baseline: Any, settings: Iterable[Any]) -> Heartbeat:
    """A ``Heartbeat`` for runs of ``settings``: the floor is ``baseline``'s stage medians (its ``latency``,
    none for a baseline run kept in memory), and it speaks of a compile where a setting compiles graphs."""
    from vidtune.techniques.setting import compile_signature

    floor = {stage: v["median_ms"] for stage, v in (getattr(baseline, "latency", None) or {}).items()}
    compiling = any(compile_signature(k) is not None for k in settings)
    return Heartbeat(say, what, HEARTBEAT_S, floor, compiling)


class TerminalLog:
    """A command's progress for a person at a terminal, plain lines for a log.

    ``log(line)`` prints a line; ``status(line, fraction)`` gives the campaign's progress (each family's count and
    best, the ETA; ``fraction``: done over done plus the ETA). On a terminal the status is one line at the bottom,
    redrawn in place with a bar (``[#####-----] 50%``) and cut to the terminal's width, the other lines printed
    above it; on a stream that is not a terminal (a file, a pipe: CI, ``tee``) every status is a plain line too."""

    BAR = 20

    def __init__(self, stream: Any = None) -> None:
        import sys

        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._status = ""
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def __call__(self, line: str) -> None:
        with self._lock:
            self._write(f"\r\x1b[K{line}\n{self._status}" if self.tty else f"{line}\n")

    def status(self, line: str, fraction: float | None = None) -> None:
        if not self.tty:
            return self(line)
        import shutil

        bar = ""
        if fraction is not None:
            done = round(min(max(fraction, 0.0), 1.0) * self.BAR)
            bar = f"[{'#' * done}{'-' * (self.BAR - done)}] {min(max(fraction, 0.0), 1.0):4.0%} "
        width = shutil.get_terminal_size((100, 24)).columns
        with self._lock:
            self._status = (bar + line)[:max(1, width - 1)]
            self._write(f"\r\x1b[K{self._status}")

    def close(self) -> None:
        """End the status line (the next output starts on a line of its own)."""
        with self._lock:
            if self.tty and self._status:
                self._write("\n")
            self._status = ""

