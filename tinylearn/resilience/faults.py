"""Fault drills for checkpoint storage, on real processes and real filesystems (no mocks).

**Torn write** (``torn_write_drill``): step 1 is a committed checkpoint. A child process (fork) writes step 2; the
parent watches the child's temporary rank file (``.tmp-rank00000.bin.*``) grow and SIGKILLs the child when it
reaches a random byte offset. The child gets no chance to clean up -- exactly a power cut for the writer (the page
cache survives a SIGKILL; a power cut loses unsynced bytes too, which is why atomic_write fsyncs before the rename).
Whatever the offset, step 2 has no ``manifest.json`` (the commit record is written last), so ``latest_checkpoint``
returns step 1 and loading it gives step 1's bytes. The child writes in small pieces with a short sleep after each
(``throttle_s``) so that the parent's polling can stop it at the chosen byte and not a few MiB later.

**Disk full**: ``disk_full_rlimit`` runs the save in a child with ``RLIMIT_FSIZE`` below the rank file's size (the
kernel fails the write with EFBIG; atomic_write ignores SIGXFSZ so it is an error, not a kill) and
``disk_full_tmpfs`` mounts a small tmpfs (root only; the drill reports why when ``mount`` is refused) and fills it
(ENOSPC, or the up-front ``check_free_space``). Both must raise ``DiskFull`` naming the path, leaving the previous
checkpoint loadable.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._inputs import as_int
from .atomic import TMP_PREFIX, CheckpointError, DiskFull
from .manifest import latest_checkpoint, list_checkpoints, step_dir
from .sharded import load_sharded, save_sharded


def drill_state(step: int, nbytes: int = 1 << 21) -> dict[str, Any]:
    """A deterministic state of about ``nbytes`` (two fp32 tensors + objects), different for every step."""
    rng = np.random.default_rng(step)
    n = max(2, nbytes // 4)
    return {
        "w": rng.standard_normal(n // 2).astype(np.float32),
        "m": {"v": np.full(n - n // 2, step, np.float32)},
        "step": step,
    }


def _ctx() -> Any:
    return mp.get_context("fork")


def _child_save(root: str, step: int, nbytes: int, piece: int, throttle_s: float, fsize: int, conn: Any) -> None:
    try:
        if fsize > 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

        def slow(_: int) -> None:
            if throttle_s > 0:
                time.sleep(throttle_s)

        save_sharded(drill_state(step, nbytes), step_dir(root, step), step=step, on_write=slow, piece_bytes=piece)
        conn.send(("ok", "", ""))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("err", type(e).__name__, str(e)))
    finally:
        conn.close()
        os._exit(0)


def _ensure_step1(root: Path, nbytes: int) -> Path:
    d = step_dir(root, 1)
    if not (d / "manifest.json").exists():
        save_sharded(drill_state(1, nbytes), d, step=1)
    return d


def torn_write_drill(
    root: str | os.PathLike[str],
    seed: int,
    *,
    nbytes: int = 1 << 21,
    piece_bytes: int = 1 << 16,
    throttle_s: float = 0.002,
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    """Kill a child writing step 2 when its rank file reaches a random byte (from ``seed``); see the docstring.

    Returns {seed, offset (the chosen byte), killed_at (temp file size seen at the kill, >= offset), killed,
    latest (latest_checkpoint), listed (list_checkpoints), equal (the latest loads bitwise equal to step 1)}.
    """
    seed = as_int(seed, "seed", min=0)
    nbytes = as_int(nbytes, "nbytes", min=8)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _ensure_step1(root, nbytes)
    total = sum(v.nbytes for v in _tensors(drill_state(2, nbytes)))
    offset = int(np.random.default_rng(seed).integers(1, total + 1))
    d2 = step_dir(root, 2)
    d2.mkdir(exist_ok=True)
    for p in d2.iterdir():  # a previous drill's leftovers
        p.unlink()
    parent, child = _ctx().Pipe(duplex=False)
    proc = _ctx().Process(target=_child_save, args=(str(root), 2, nbytes, piece_bytes, throttle_s, 0, child))
    proc.start()
    child.close()
    killed_at, deadline = -1, time.monotonic() + timeout_s
    try:
        while proc.is_alive() and time.monotonic() < deadline:
            size = max((p.stat().st_size for p in d2.glob(f"{TMP_PREFIX}rank00000.bin.*") if p.exists()), default=-1)
            if size >= offset:
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = size
                break
            time.sleep(0.0002)
    except FileNotFoundError:
        pass
    finally:
        if proc.is_alive() and killed_at < 0:
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout_s)
        parent.close()
    latest = latest_checkpoint(root)
    equal = False
    if latest is not None:
        got = load_sharded(latest)
        ref = drill_state(int(latest.name.split("_")[1]), nbytes)
        equal = got["w"].tobytes() == ref["w"].tobytes() and got["m.v"].tobytes() == ref["m"]["v"].tobytes()
    return {
        "seed": seed,
        "offset": offset,
        "total": total,
        "killed_at": killed_at,
        "killed": proc.exitcode == -signal.SIGKILL,
        "latest": latest,
        "listed": list_checkpoints(root),
        "temps_left": sorted(p.name for p in d2.glob(f"{TMP_PREFIX}*")),
        "equal_step1": equal and latest is not None and latest.name == step_dir(root, 1).name,
    }


def _tensors(state: dict[str, Any]) -> list[np.ndarray]:
    out = []
    for v in state.values():
        if isinstance(v, dict):
            out.extend(_tensors(v))
        elif isinstance(v, np.ndarray):
            out.append(v)
    return out


def disk_full_rlimit(root: str | os.PathLike[str], *, nbytes: int = 1 << 21, limit: int = 1 << 20) -> dict[str, Any]:
    """Save step 2 in a child whose RLIMIT_FSIZE is ``limit`` bytes (< ``nbytes``): {error, message, latest}."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _ensure_step1(root, nbytes)
    parent, child = _ctx().Pipe(duplex=False)
    proc = _ctx().Process(target=_child_save, args=(str(root), 2, nbytes, 1 << 20, 0.0, int(limit), child))
    proc.start()
    child.close()
    try:
        status, name, msg = parent.recv() if parent.poll(30) else ("timeout", "", "child gave no answer in 30 s")
    except EOFError:
        status, name, msg = "died", "", "child died without an answer"
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    return {"status": status, "error": name, "message": msg, "latest": latest_checkpoint(root)}


def mount_tmpfs(mountpoint: str | os.PathLike[str], size_bytes: int) -> str | None:
    """Mount a tmpfs of ``size_bytes`` at ``mountpoint``; None on success, else why it could not."""
    Path(mountpoint).mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={int(size_bytes)}", "tinylearn-ckpt", os.fspath(mountpoint)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mount failed: {type(e).__name__}: {e}"
    return None if r.returncode == 0 else f"mount failed (rc {r.returncode}): {r.stderr.strip() or r.stdout.strip()}"


def umount(mountpoint: str | os.PathLike[str]) -> None:
    subprocess.run(["umount", os.fspath(mountpoint)], capture_output=True, timeout=10)


def disk_full_tmpfs(
    mountpoint: str | os.PathLike[str], *, size_bytes: int = 1 << 20, check_space: bool = True
) -> dict[str, Any]:
    """Mount a ``size_bytes`` tmpfs, commit a small step 1, then save a step 2 larger than what is left.

    Returns {skipped: reason | None, error, message, latest, equal_step1}; the tmpfs is unmounted on return.
    """
    why = mount_tmpfs(mountpoint, size_bytes)
    if why is not None:
        return {"skipped": why}
    try:
        root = Path(mountpoint)
        small = size_bytes // 4
        save_sharded(drill_state(1, small), step_dir(root, 1), step=1)
        err, msg = None, ""
        try:
            save_sharded(drill_state(2, size_bytes), step_dir(root, 2), step=2, check_space=check_space)
        except DiskFull as e:
            err, msg = "DiskFull", str(e)
        except CheckpointError as e:
            err, msg = type(e).__name__, str(e)
        latest = latest_checkpoint(root)
        got = load_sharded(latest) if latest is not None else {}
        ref = drill_state(1, small)
        equal = latest is not None and got["w"].tobytes() == ref["w"].tobytes()
        return {"skipped": None, "error": err, "message": msg, "latest": latest, "equal_step1": equal}
    finally:
        umount(mountpoint)
