"""Files that a later command reads, written so that a crash or a full disk never leaves half of one.

Every file vidtune writes for another command (tuned configs, a campaign's spec and summary, the report, a
baseline's records, MP4s and raw frames) goes through ``atomic_path``/``atomic_write_*``: the bytes go to a
temporary file in the same folder, are flushed to disk (``fsync``), and replace the target in one
``os.replace``. A reader sees the old file or the new one, never a 0-byte or half-written one; a write that
fails (``ENOSPC``) removes its temporary file and raises ``OutputError`` with one line to print.

YAML read from users (``--config``, sign-off) is read through ``load_user_yaml``: a size limit and an
alias-expansion limit, so a few hundred bytes of nested aliases cannot expand into hundreds of MB.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator

__all__ = ["OutputError", "atomic_path", "atomic_write_bytes", "atomic_write_text", "check_free_space",
           "load_user_yaml", "strict_json", "MAX_USER_YAML_BYTES"]

MAX_USER_YAML_BYTES = 1 << 20  # a tuned config is a few kB; 1 MiB leaves room for long notes
_MAX_YAML_ALIASES = 64  # a tuned config uses none; PyYAML's own dumper writes a few at most
_MAX_YAML_NODES = 100_000  # values once aliases are expanded (a tuned config holds a few hundred)


class OutputError(OSError):
    """A file could not be written (full disk, read-only folder); nothing partial was left behind."""


def _describe(path: Path, exc: OSError) -> str:
    why = {errno.ENOSPC: "no space left on the device", errno.EROFS: "a read-only file system",
           errno.EACCES: "permission denied", errno.EDQUOT: "disk quota exceeded"}.get(exc.errno or 0,
                                                                                       exc.strerror or str(exc))
    return f"cannot write {path}: {why}; nothing partial was left there"


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on leaving the block it is flushed and renamed onto
    ``path``. On an error inside the block or in the rename, the temporary file is removed: ``path`` keeps
    its old content (or stays absent). The temporary name ends with ``path``'s suffix, for writers that pick
    a format from it (PyAV)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp" + target.suffix, dir=target.parent)
    except OSError as exc:
        raise OutputError(exc.errno or 0, _describe(target, exc)) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OutputError):
            raise
        raise OutputError(exc.errno or 0, _describe(target, exc)) from exc
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if "No space left on device" in str(exc):  # (safetensors and PyAV wrap the OSError in their own types)
            raise OutputError(errno.ENOSPC, _describe(target, OSError(errno.ENOSPC, "no space"))) from exc
        raise
    # the rename reaches the disk with the folder's entry; best effort: some file systems refuse fsync on a folder
    # (the file itself is already whole on disk, so nothing is lost where they do)
    with suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module's docstring); returns the path."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def strict_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that stays standard JSON: NaN and infinities become null (Python's default writes the
    tokens ``NaN`` and ``Infinity``, which other readers of trials.jsonl and the journal refuse)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    default = kwargs.pop("default", str)
    return json.dumps(clean(json.loads(json.dumps(value, default=default))), allow_nan=False, **kwargs)


def check_free_space(folder: str | os.PathLike[str], need_bytes: int, field: str) -> None:
    """Raise ``OutputError`` when ``folder``'s file system has less than ``need_bytes`` free (checked before a
    run that will write that much, so a full disk is said before the generation, not after it)."""
    place = Path(folder)
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    if free < need_bytes:
        raise OutputError(errno.ENOSPC, f"{field}={folder}: its outputs need about {need_bytes / 2**20:.1f} MiB and "
                                        f"{place} has {free / 2**20:.1f} MiB free; free some space or choose another "
                                        f"folder")


def load_user_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """Read a YAML file a user hands vidtune, within limits: at most ``MAX_USER_YAML_BYTES`` and
    ``_MAX_YAML_ALIASES`` aliases (a billion-laughs file of nested aliases is refused, not expanded).
    Raises ``ValueError`` naming ``what`` and the limit."""
    import yaml

    p = Path(path)
    size = p.stat().st_size
    if size > MAX_USER_YAML_BYTES:
        raise ValueError(f"{what} {p}: {size} bytes, over the limit of {MAX_USER_YAML_BYTES} bytes for a config file")
    text = p.read_text(errors="replace")
    try:
        aliases = sum(1 for event in yaml.parse(text) if isinstance(event, yaml.AliasEvent))
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {p}: not valid YAML ({str(exc).splitlines()[0][:200]})") from None
    if aliases > _MAX_YAML_ALIASES:
        raise ValueError(f"{what} {p}: {aliases} YAML aliases, over the limit of {_MAX_YAML_ALIASES} (a config file "
                         f"needs none)")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {p}: not valid YAML ({str(exc).splitlines()[0][:200]})") from None
    # a few aliases nested can still expand past any use: count the values as a printer would see them
    stack, seen = [doc], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > _MAX_YAML_NODES:
            raise ValueError(f"{what} {p}: expands to more than {_MAX_YAML_NODES} values (nested YAML aliases)")
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return doc
