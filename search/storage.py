"""A campaign's storage and run control: the Optuna storage (a journal file repaired after a crash, or an RDB
URL), the one-owner lock of a campaign folder, and the stop signals."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from vidtune.search.errors import CampaignBusy, CampaignStopped, StorageError
from vidtune.search.spec import CampaignSpec

__all__ = ["repair_journal", "check_stop", "StopOnSignals", "campaign_lock", "campaign_running", "storage_for", "rdb_storage",
           "rdb_url"]


def repair_journal(path: Path) -> str | None:
    """Make a journal that a crash tore readable again, before Optuna opens it.

    Optuna appends one JSON record per line. A crash mid-write leaves a last line without its newline
    (or half a record); Optuna then fails on every later read ("Expecting ':' delimiter"), and a new run
    appends after the torn bytes. The torn tail is cut back to the last complete record, the file as it
    was is kept beside it (``<name>.torn-<time>``), and a message says so (None when nothing was torn).
    A damaged record before the last is not a crash's doing: ``StorageError`` names its line.
    """
    import json

    if not path.is_file():
        return None
    data = path.read_bytes()
    lines = data.split(b"\n")  # the last element is what follows the last newline (b"" when none is torn)
    good_end = 0
    for number, line in enumerate(lines[:-1], start=1):
        try:
            json.loads(line)
        except ValueError as e:
            if number == len(lines) - 1 and not lines[-1]:
                break  # the last line is complete but garbled: a torn write too (its newline came first)
            raise StorageError(f"{path}: line {number} of {len(lines) - 1} is not a journal record ({e}); "
                               f"it is not the torn tail a crash leaves. Restore the file from a backup, or "
                               f"move it away to start the campaign's studies afresh") from None
        good_end += len(line) + 1
    if good_end == len(data):
        return None
    backup = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}")
    backup.write_bytes(data)
    with open(path, "r+b") as f:
        f.truncate(good_end)
        f.flush()
        os.fsync(f.fileno())
    return (f"{path}: cut a torn last record ({len(data) - good_end} bytes, a write a crash interrupted) back to "
            f"the last complete one; the file as it was is kept in {backup.name}")


_STOP: list[int] = []  # the signal that asked the running campaign to stop (set by StopOnSignals)


def check_stop() -> None:
    """Raise ``CampaignStopped`` if a stop signal arrived (the driver's waits call it every half second)."""
    if _STOP:
        raise CampaignStopped(_STOP[0])


class StopOnSignals:
    """SIGTERM and SIGINT stop the campaign through its cleanup (the pool kills its actors and ends the Ray
    it started): by default SIGTERM ended the driver on the spot, Ray printed its stack dump, and actors
    (in their own process groups) lived on for seconds. The handler only records the signal; the driver
    waits on Ray in half-second polls (``_Pool.get``/``wait``) and raises ``CampaignStopped`` there, in
    Python (raised from inside the handler, it landed in Ray's C++ wait: "SystemError: CoreWorker.wait
    returned a result with an exception set"). Later signals are ignored; SIGKILL still ends everything.

    ``ray.init`` installs Ray's own SIGTERM handler over this one (seen: "*** SIGTERM received ***" and
    the driver gone), so the pool calls ``install`` again once Ray is up."""

    def __enter__(self) -> "StopOnSignals":
        import signal
        import threading

        _STOP.clear()
        self.active = threading.current_thread() is threading.main_thread()
        self.previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if self.active else {}
        self.install()
        return self

    def install(self) -> None:
        import signal

        def stop(signum: int, frame: Any) -> None:
            if not _STOP:
                _STOP.append(signum)

        for s in self.previous:
            signal.signal(s, stop)

    def __exit__(self, *exc: Any) -> None:
        import signal

        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        _STOP.clear()


@contextmanager
def campaign_lock(directory: Path) -> Iterator[None]:
    """One campaign, one owner: an exclusive ``flock`` on ``<directory>/campaign.lock`` for the whole run.

    The kernel drops the lock when its process ends, however it ends, so a killed campaign leaves no stale
    lock to clean up; the file says who holds it (pid, host, since) for the refusal of a second run.
    """
    import fcntl
    import socket

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "campaign.lock"
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process (no details written yet)"
        f.close()
        raise CampaignBusy(f"campaign {directory.name!r} is running already: {holder} holds {path}; wait for it to "
                           f"end, or stop it (a killed campaign resumes where it stopped)") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n")
        f.flush()
        yield
    finally:
        f.truncate(0)
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def campaign_running(directory: Path) -> bool:
    """Whether a run of the campaign in ``directory`` holds its lock now, on this host: the lock file names a live
    process (``campaign_lock`` writes "pid N on HOST since ..." and empties it at the end; a killed run's pid is
    gone). Read, not locked: trying the flock would refuse a campaign starting at that instant."""
    import socket

    lock = Path(directory) / "campaign.lock"
    words = lock.read_text(errors="replace").split() if lock.is_file() else []
    if len(words) < 4 or words[0] != "pid" or words[3] != socket.gethostname():
        return False
    try:
        os.kill(int(words[1]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # (alive, another user's)
        return True
    return True


def storage_for(spec: CampaignSpec, log: Any = None) -> Any:
    """The Optuna storage: a journal file per campaign by default, or an RDB URL (PostgreSQL). A torn
    journal is repaired first (``repair_journal``; ``log`` gets the message, else stderr)."""
    if spec.storage:
        return rdb_storage(spec.storage)
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    spec.directory.mkdir(parents=True, exist_ok=True)
    path = spec.directory / "optuna.journal"
    message = repair_journal(path)
    if message:
        (log or (lambda m: print(m, file=sys.stderr)))(message)
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except ValueError as e:  # (json's errors are ValueErrors) a record Optuna cannot replay
        raise StorageError(f"{path}: Optuna cannot replay this journal ({e}); restore it from a backup, or move "
                           f"it away to start the campaign's studies afresh") from None


def rdb_url(url: str) -> str:
    """``postgresql://`` with the driver ``[postgres]`` installs: SQLAlchemy 2.1 reads a bare ``postgresql://`` as
    psycopg 3, and with only psycopg2 installed the README's own URL failed with an ImportError."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if scheme == "postgresql" and importlib.util.find_spec("psycopg") is None and \
            importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql+psycopg2{sep}{rest}"
    return url


def _hide_password(url: str) -> str:
    import re

    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def rdb_storage(url: str) -> Any:
    """Optuna's RDB storage on ``url``; a missing driver, an unreachable server or an unwritable database file is
    a ``StorageError`` of one line naming the URL (password hidden) and what to do."""
    import optuna

    shown = _hide_password(url)
    try:
        return optuna.storages.RDBStorage(rdb_url(url))
    except ImportError as exc:
        raise StorageError(f"storage={shown}: its database driver is not installed ({exc}); for PostgreSQL install "
                           f"vidtune's extra: pip install 'vidtune[postgres]'") from None
    except Exception as exc:  # sqlalchemy's OperationalError, ArgumentError, ... (not imported here: optional)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StorageError(f"storage={shown}: cannot open the study storage ({type(exc).__name__}: {first}); check "
                           f"that the server is running and reachable, or the database file's folder is writable") from None
