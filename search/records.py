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
from pathlib import Path
from typing import Any, Iterator

from vidtune._io import OutputError, strict_json

__all__ = ["RecordLog"]


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

    def read(self) -> list[dict[str, Any]]:
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

    def append(self, record: dict[str, Any]) -> str | None:
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
