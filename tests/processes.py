"""Processes of a campaign started by a test: found by a tag in their environment (a driver's Ray and its actors
inherit it), so that a test can kill every one of them at once, as a machine's crash would."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if tag.encode() in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:  # gone, or not ours to read
                continue
    return found


def kill_tagged(tag: str, timeout: float = 30.0) -> None:
    """SIGKILL every process carrying ``tag`` until none is left (a Ray worker left running after its driver
    died would otherwise go on working, and write, for up to a second)."""
    deadline = time.time() + timeout
    while (pids := tagged_pids(tag)) and time.time() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        time.sleep(0.05)
    left = tagged_pids(tag)  # (a zombie's environment reads empty: only running processes count)
    assert not left, f"processes still running after SIGKILL: {left}"
