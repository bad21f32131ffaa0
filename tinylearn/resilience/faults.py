"""Fault drills for checkpoint storage, on real processes and real filesystems (no mocks).

**Torn write** (``torn_write_drill``): step 1 is a committed checkpoint. A child process (fork) writes step 2; the
parent watches the child's temporary rank file (``.tmp-rank00000.bin.*``) grow and SIGKILLs the child when it
reaches a random byte offset. The child gets no chance to clean up -- exactly a power cut for the writer (the page
cache survives a SIGKILL; a power cut loses unsynced bytes too, which is why atomic_write fsyncs before the rename).
Whatever the offset, step 2 has no ``manifest.json`` (the commit record is written last), so ``latest_checkpoint``
returns step 1 and loading it gives step 1's bytes. The child writes in small pieces with a short sleep after each
(``throttle_s``) so that the parent's polling can stop it at the chosen byte and not a few MiB later.

**Torn at any point of the save sequence** (``torn_sequence_drill``): a save is many steps -- for a 2-rank sharded
checkpoint: rank 0's data file (open, every write, fsync, rename, directory fsync), rank 0's index, the same for
rank 1, then the manifest; for ``AsyncCheckpointer`` (its writer process, crash points forwarded to the caller; or
its thread) and ``DeltaCheckpointer``: the data file then the manifest / index. A child process (fork) installs
``atomic.set_crash_point`` and SIGKILLs *itself* when the
chosen event is reached (``os.kill(getpid(), SIGKILL)``: no handler, no ``finally``, no flush -- a kill at exactly
that point, from any thread). A first child counts the events of the same save in a copy of the directory; the kill
point is then drawn over all of them (or given). The checkpoint that loads must be step 1 bitwise when the kill
came before the commit record's rename, and the complete step 2 bitwise after it -- never a mix.

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


SEQUENCE_WRITERS = ("sharded", "sharded_async", "async", "delta")


def sequence_state(writer: str, step: int, nbytes: int = 1 << 16, rank: int | None = None) -> dict[str, Any]:
    """The state ``writer`` saves at ``step`` in the sequence drill (rank ``rank``'s part for the sharded writers,
    the whole state when None). Sharded: a global fp32 tensor split over 2 ranks + a replicated one + an object.
    Delta: only the first quarter of one tensor changes between steps (the delta references step 1's blocks)."""
    n = max(8, nbytes // 8)
    if writer.startswith("sharded"):
        from .sharded import Shard

        g = np.random.default_rng(step).standard_normal(2 * n).astype(np.float32)
        b = np.full(n // 4 + 1, step, np.float32)
        if rank is None:
            return {"w": g, "b": b, "step": step}
        lo, hi = rank * n, (rank + 1) * n
        return {"w": Shard(g[lo:hi], (lo,), g.shape), "b": b, "step": step}
    if writer == "delta":
        w = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        v = np.zeros(n, np.float32)
        v[: n // 4] = step
        return {"w": w, "m": {"v": v}, "step": step}
    return drill_state(step, nbytes)


def _seq_save(writer: str, root: Path, step: int, nbytes: int) -> None:
    if writer.startswith("sharded"):
        for r in range(2):
            out = save_sharded(
                sequence_state(writer, step, nbytes, rank=r), step_dir(root, step), rank=r, world_size=2, step=step,
                async_=writer == "sharded_async", piece_bytes=max(1, nbytes // 4),
            )  # fmt: skip
            if writer == "sharded_async":
                out.wait(60)
    elif writer == "async":
        from .async_ckpt import AsyncCheckpointer

        with AsyncCheckpointer(root, full_every=1) as ck:
            ck.save(sequence_state(writer, step, nbytes), step)
    else:
        from .incremental import DeltaCheckpointer

        DeltaCheckpointer(root, block_size=max(64, nbytes // 8), full_every=8).save(
            sequence_state(writer, step, nbytes), step
        )


def _seq_load(writer: str, root: Path) -> tuple[int | None, dict[str, Any]]:
    """(step of the checkpoint that loads, its flattened state) -- what a restart would get."""
    if writer.startswith("sharded"):
        latest = latest_checkpoint(root)
        if latest is None:
            return None, {}
        got = load_sharded(latest)
        return int(got["step"]), got
    if writer == "async":
        from .async_ckpt import load_async

        got = load_async(root)
        return int(got["step"]), got
    from .incremental import restore

    got = restore(root)
    return int(got["step"]), got


def _flat_arrays(state: dict[str, Any], prefix: str = "") -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_flat_arrays(v, f"{prefix}{k}."))
        elif isinstance(v, np.ndarray):
            out[f"{prefix}{k}"] = v.tobytes()
    return out


def _child_sequence(writer: str, root: str, nbytes: int, kill_at: int, conn: Any) -> None:
    from . import atomic

    events: list[tuple[str, str, int]] = []

    def point(event: str, path: Path, n: int) -> None:
        name = Path(path).name
        events.append((event, name.rsplit(".", 2)[0] if name.startswith(TMP_PREFIX) else name, int(n)))
        if len(events) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        atomic.set_crash_point(point)
        _seq_save(writer, Path(root), 2, nbytes)
        conn.send(("ok", events))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("err", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
        os._exit(0)


def _run_sequence_child(writer: str, root: Path, nbytes: int, kill_at: int, timeout_s: float) -> tuple[Any, int]:
    parent, child = _ctx().Pipe(duplex=False)
    proc = _ctx().Process(target=_child_sequence, args=(writer, str(root), nbytes, kill_at, child))
    proc.start()
    child.close()
    try:
        msg = parent.recv() if parent.poll(timeout_s) else ("timeout", f"no answer in {timeout_s} s")
    except EOFError:
        msg = ("killed", None)
    finally:
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    return msg, proc.exitcode


def _seq_step1(writer: str, root: Path, nbytes: int) -> None:
    """Commit step 1 with ``writer`` unless it is there."""
    if not (step_dir(root, 1) / ("index.json" if writer == "delta" else "manifest.json")).exists():
        _seq_save(writer, root, 1, nbytes)


def sequence_events(writer: str, root: str | os.PathLike[str], *, nbytes: int = 1 << 16) -> list[tuple[str, str, int]]:
    """The crash points (event, file name, bytes) of saving step 2 with ``writer`` after a committed step 1, counted
    by a child process in a copy of ``root`` (prepared with step 1 first)."""
    import shutil
    import tempfile

    if writer not in SEQUENCE_WRITERS:
        raise ValueError(f"writer must be one of {SEQUENCE_WRITERS}, got {writer!r}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _seq_step1(writer, root, nbytes)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".tl-count-") as t:
        copy = Path(t) / "c"
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(f"{TMP_PREFIX}*", "step_00000002"))
        msg, _ = _run_sequence_child(writer, copy, nbytes, 0, 60.0)
    if msg[0] != "ok":
        raise CheckpointError(f"{writer}: the counting save failed: {msg[1]}")
    return [tuple(e) for e in msg[1]]


def torn_sequence_drill(
    root: str | os.PathLike[str],
    writer: str,
    *,
    seed: int | None = None,
    kill_at: int | None = None,
    nbytes: int = 1 << 16,
    events: list[tuple[str, str, int]] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """SIGKILL ``writer`` (one of SEQUENCE_WRITERS) saving step 2 at event ``kill_at`` (1-based; drawn from ``seed``
    over every event when None); see the module docstring. ``events``: from ``sequence_events`` (counted if None).

    Returns {writer, kill_at, n_events, event (the one killed at), commit_at (index of the commit record's rename),
    killed, expected_step (1 before the commit rename, else 2), loaded_step, equal (the loaded state is bitwise the
    expected step's), temps_left}."""
    if writer not in SEQUENCE_WRITERS:
        raise ValueError(f"writer must be one of {SEQUENCE_WRITERS}, got {writer!r}")
    root = Path(root)
    if events is None:
        events = sequence_events(writer, root, nbytes=nbytes)
    else:
        _seq_step1(writer, root, nbytes)
    commit = "index.json" if writer == "delta" else "manifest.json"
    commit_at = next(i for i, e in enumerate(events, 1) if e[0] == "rename" and e[1] == commit)
    if kill_at is None:
        if seed is None:
            raise ValueError("torn_sequence_drill: pass seed or kill_at")
        kill_at = int(np.random.default_rng(as_int(seed, "seed", min=0)).integers(1, len(events) + 1))
    kill_at = as_int(kill_at, "kill_at", min=1)
    if kill_at > len(events):
        raise ValueError(f"kill_at: {kill_at} is past the last of {len(events)} events")
    d2 = step_dir(root, 2)
    if d2.exists():  # a previous drill's leftovers
        import shutil

        shutil.rmtree(d2)
    msg, code = _run_sequence_child(writer, root, nbytes, kill_at, timeout_s)
    expected = 2 if kill_at > commit_at else 1
    loaded, got = _seq_load(writer, root)
    ref = sequence_state(writer, expected, nbytes)
    equal = loaded == expected and _flat_arrays(got) == _flat_arrays(_nest(ref)) if got else False
    return {
        "writer": writer,
        "kill_at": kill_at,
        "n_events": len(events),
        "event": events[kill_at - 1],
        "commit_at": commit_at,
        "killed": code == -signal.SIGKILL and msg[0] == "killed",
        "expected_step": expected,
        "loaded_step": loaded,
        "equal": bool(equal),
        "temps_left": sorted(p.name for p in d2.glob(f"{TMP_PREFIX}*")) if d2.exists() else [],
    }


def _nest(state: dict[str, Any]) -> dict[str, Any]:
    """Flattened-key form of a nested state (as the loaders return it): {"m": {"v": a}} -> {"m.v": a}."""
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in _nest(v).items()})
        else:
            out[k] = v
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
