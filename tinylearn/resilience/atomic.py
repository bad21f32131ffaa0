"""Crash-consistent file writes: a temporary name in the same directory, fsync, atomic rename, fsync of the directory.

A reader sees either the old file or the complete new one, never a prefix: ``os.replace`` is atomic within one
filesystem (POSIX rename(2)), the file's bytes are on disk before the rename (``fsync`` of the file) and the rename
itself is on disk before the call returns (``fsync`` of the directory). A writer killed at any byte leaves only a
``.tmp-*`` file, which readers ignore and ``remove_stale_temps`` deletes.

**Crash points** (fault drills): ``set_crash_point(fn)`` makes every ``atomic_write`` of this process call
``fn(event, path, nbytes)`` before each step -- ``"open"`` (the temporary file), ``"write"`` (after each chunk, with
the bytes so far), ``"fsync"``, ``"rename"`` (before ``os.replace``), ``"fsync_dir"`` -- so a drill can SIGKILL the
writer at any point of a save sequence (faults.torn_sequence_drill). None (the default) calls nothing.

Errors name what failed: a full disk (ENOSPC) or a file-size limit (EFBIG, ``RLIMIT_FSIZE``) becomes ``DiskFull``
with the path and the byte count, the temporary file is removed, and the old file (if any) is untouched.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

TMP_PREFIX = ".tmp-"
_crash_point: Callable[[str, Path, int], None] | None = None


def set_crash_point(fn: Callable[[str, Path, int], None] | None) -> Callable[[str, Path, int], None] | None:
    """Install ``fn(event, path, nbytes)``, called before each step of every ``atomic_write`` in this process (see the
    module docstring); None removes it. Returns the previous one. For fault drills in a child process."""
    global _crash_point
    if fn is not None and not callable(fn):
        raise TypeError(f"fn: expected a callable or None, got {type(fn).__name__}")
    old, _crash_point = _crash_point, fn
    return old


def _point(event: str, path: Path, nbytes: int) -> None:
    if _crash_point is not None:
        _crash_point(event, path, nbytes)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message names the path and the cause."""


class CorruptCheckpoint(CheckpointError):
    """A file's bytes do not match the checksum in its manifest, or a file the manifest lists is missing."""


class IncompleteCheckpoint(CheckpointError):
    """A checkpoint directory without a committed manifest (a writer died before its last step)."""


class DiskFull(CheckpointError):
    """No space (ENOSPC) or a file-size limit (EFBIG) while writing; nothing was overwritten."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename or a new file) to disk."""
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_free_space(dirpath: str | os.PathLike[str], nbytes: int) -> None:
    """Raise ``DiskFull`` before writing anything when the filesystem under ``dirpath`` has < ``nbytes`` free."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    free = shutil.disk_usage(os.fspath(dirpath)).free
    if free < nbytes:
        raise DiskFull(f"{os.fspath(dirpath)}: {nbytes} bytes needed, {free} free")


def _chunks(data: bytes | bytearray | memoryview | Iterable[bytes]) -> Iterable[bytes | memoryview]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield memoryview(data).cast("B") if isinstance(data, memoryview) else data
    else:
        yield from data


def publish(tmp: Path, path: Path, nbytes: int, *, fsync: bool) -> None:
    """The commit point of a write: rename ``tmp`` over ``path`` (crash point ``"rename"``), then flush the directory
    entry (``"fsync_dir"``) when ``fsync``. Shared by ``atomic_write`` and the O_DIRECT writer (async_writer.py)."""
    _point("rename", path, nbytes)
    os.replace(tmp, path)
    if fsync:
        _point("fsync_dir", path.parent, nbytes)
        fsync_dir(path.parent)


def discard(tmp: Path, path: Path, written: int, error: BaseException) -> NoReturn:
    """After a failed write: remove ``tmp`` and raise -- ``DiskFull`` (naming ``path`` and the bytes written) for
    ENOSPC / EFBIG / EDQUOT, else ``error`` itself. The old ``path``, if any, is untouched."""
    _unlink_quiet(tmp)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        raise DiskFull(
            f"{os.fspath(path)}: {errno.errorcode.get(error.errno, error.errno)} after {written} bytes; "
            f"the previous file (if any) is untouched"
        ) from error
    raise error


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | bytearray | memoryview | Iterable[bytes],
    *,
    fsync: bool = True,
) -> int:
    """Write ``data`` (bytes, or an iterable of byte chunks) to ``path`` atomically; return the bytes written.

    On any error the temporary file is removed and the exception re-raised (ENOSPC/EFBIG as ``DiskFull``);
    an existing ``path`` keeps its old content.
    """
    path = Path(path)
    if not path.name or path.name.startswith(TMP_PREFIX):
        raise ValueError(f"path must name a file not starting with {TMP_PREFIX!r}, got {os.fspath(path)!r}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"path's directory does not exist: {os.fspath(path.parent)!r}")
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{threading.get_ident()}")
    written = 0
    # a write past RLIMIT_FSIZE raises SIGXFSZ (default: kill); ignored, the write fails with EFBIG instead
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN) if _main_thread() else None
    try:
        _point("open", tmp, 0)
        with open(tmp, "wb") as f:
            for chunk in _chunks(data):
                f.write(chunk)
                written += len(chunk) if not isinstance(chunk, memoryview) else chunk.nbytes
                _point("write", tmp, written)
            f.flush()
            if fsync:
                _point("fsync", tmp, written)
                os.fsync(f.fileno())
        publish(tmp, path, written, fsync=fsync)
    except BaseException as e:
        discard(tmp, path, written, e)
    finally:
        if old is not None:
            signal.signal(signal.SIGXFSZ, old)
    return written


def read_commit_record(path: str | os.PathLike[str], fmt: str, what: str, missing: str) -> dict:
    """A checkpoint's commit record (a JSON manifest or index, written last with ``atomic_write``).

    Absent: IncompleteCheckpoint with the message ``missing`` (the save did not commit). Unparseable, or its
    ``"format"`` is not ``fmt``: CorruptCheckpoint naming the file and ``what`` it should have been.
    """
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise IncompleteCheckpoint(missing) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpoint(f"{p}: {what} does not parse ({e})") from e
    if not isinstance(d, dict) or d.get("format") != fmt:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise CorruptCheckpoint(f"{p}: not a {fmt} {what} (format={got!r})")
    return d


def remove_stale_temps(dirpath: str | os.PathLike[str]) -> list[Path]:
    """Delete the ``.tmp-*`` files a killed writer left in ``dirpath``; return what was removed."""
    out = []
    for p in Path(dirpath).glob(f"{TMP_PREFIX}*"):
        if p.is_file():
            _unlink_quiet(p)
            out.append(p)
    return out


def _unlink_quiet(p: str | os.PathLike[str]) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
