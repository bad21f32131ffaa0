"""launch(fn, world_size, *args): run ``fn(*args)`` on ``world_size`` local processes joined in one process group.

Contract (what the parent guarantees):

* every rank runs in its own process (``forkserver`` by default, torch preloaded once per parent so a launch
  costs milliseconds instead of a fresh ``import torch`` per rank; ``spawn`` also works), with
  ``RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT`` set and
  ``torch.distributed`` initialised (rendezvous through a TCPStore the parent owns on a free port: no port race);
* the return value is ``[fn(*args) on rank 0, ..., on rank world_size-1]`` (results must be picklable);
* the first rank that raises is re-raised in the parent: same built-in exception type (else RuntimeError), the
  message names the rank and carries that rank's traceback; a rank that dies without a result (``os._exit``,
  a signal) is a RuntimeError naming its exit code;
* nothing outlives the call: on success, failure or timeout every child is joined, terminated or killed, and
  children die with the parent (PR_SET_PDEATHSIG) — no orphans;
* ``timeout_s`` bounds ``fn``'s run, counted from the moment every rank has joined the process group (start-up —
  process creation, imports, rendezvous — gets up to 60 s more). It is also the process-group timeout, so a rank
  waiting on a dead peer gets an error from gloo instead of blocking forever. A job that runs over is stopped and
  raises TimeoutError.

``fn`` must be picklable: a function defined at module top level in an importable module (not a lambda, not a
closure, not a function typed into a notebook — spawned children cannot import ``__main__`` of a kernel).

Under ``torchrun`` (``TORCHELASTIC_RUN_ID`` set) nothing is spawned: this process is one rank, the default group
is initialised from the environment if needed, ``fn`` runs here and the per-rank results are all-gathered, so
the same script works both ways.
"""

from __future__ import annotations

import atexit
import builtins
import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from .._inputs import is_int, is_real

_CHILD_ENV = "TINYLEARN_DIST_CHILD"
_STARTUP_S = 60.0  # extra allowance for process start, imports and rendezvous, on top of timeout_s


def _set_pdeathsig() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _worker(
    rank: int, world_size: int, port: int, backend: str, timeout_s: float, threads: int, payload: bytes, conn: Any
) -> None:
    _set_pdeathsig()
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
    )
    os.environ[_CHILD_ENV] = "1"
    ok = False
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        fn, args = pickle.loads(payload)
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timedelta(seconds=timeout_s))
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        conn.send(("ready", None))
        result = fn(*args)
        dist.barrier()  # nobody tears down while a peer still has messages in flight to it
        conn.send(("ok", pickle.dumps(result)))
        ok = True
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        try:
            exc_bytes = pickle.dumps(e)
        except Exception:
            exc_bytes = None
        try:
            conn.send(("err", (type(e).__module__, type(e).__name__, str(e), traceback.format_exc(), exc_bytes)))
        except Exception:
            pass
    finally:
        try:
            conn.close()
        except Exception:
            pass
    if ok:
        try:
            import torch.distributed as dist

            dist.destroy_process_group()
        except Exception:
            pass
        os._exit(0)
    # a failed rank may have peers still blocked on it: leave at once, skipping interpreter teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class RankFailure:
    """What one rank reported: a result, an exception (type, message, traceback) or a bare exit code."""

    def __init__(self, rank: int, module: str, name: str, message: str, tb: str, exc_bytes: bytes | None) -> None:
        self.rank, self.module, self.name, self.message, self.tb, self.exc_bytes = (
            rank,
            module,
            name,
            message,
            tb,
            exc_bytes,
        )

    def to_exception(self, summary: str) -> BaseException:
        text = (
            f"rank {self.rank} raised {self.name}: {self.message}\n{summary}\n"
            f"--- traceback of rank {self.rank} ---\n{self.tb.rstrip()}"
        )
        exc: BaseException
        builtin = getattr(builtins, self.name, None)
        if self.module == "builtins" and isinstance(builtin, type) and issubclass(builtin, Exception):
            try:
                exc = builtin(text)
            except Exception:
                exc = RuntimeError(text)
        else:
            exc = RuntimeError(text)
        exc.rank = self.rank
        exc.remote_traceback = self.tb
        return exc


def _destroy_at_exit() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass


def _in_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and _CHILD_ENV not in os.environ


def _launch_torchrun(fn: Callable[..., Any], world_size: int, args: tuple, backend: str, timeout_s: float) -> list:
    import torch.distributed as dist

    env_ws = int(os.environ["WORLD_SIZE"])
    if env_ws != world_size:
        raise ValueError(f"world_size: launch asked for {world_size} ranks but torchrun started WORLD_SIZE={env_ws}")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        atexit.register(_destroy_at_exit)  # we created it: tear it down before interpreter exit (gloo threads)
    result = fn(*args)
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, result)
    return out


def _check_picklable(fn: Callable[..., Any], args: tuple) -> bytes:
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    mod = getattr(fn, "__module__", None)
    main = sys.modules.get("__main__")
    if mod == "__main__" and not getattr(main, "__file__", None):
        raise TypeError(
            f"fn: {getattr(fn, '__qualname__', fn)!r} is defined in an interactive __main__ (notebook/REPL); child "
            "processes cannot import it. Define it at top level in an importable module (e.g. tinylearn.dist.workers)."
        )
    try:
        return pickle.dumps((fn, args))
    except Exception as e:
        raise TypeError(
            f"fn: {getattr(fn, '__qualname__', fn)!r} and its args must be picklable to reach child processes "
            f"(top-level function in an importable module, no lambdas/closures): {type(e).__name__}: {e}"
        ) from e


_CTX_CACHE: dict[str, Any] = {}


def _context(start_method: str) -> Any:
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method: expected 'forkserver' or 'spawn', got {start_method!r}")
    if start_method not in _CTX_CACHE:
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # the guard (only armed by this env var, inherited by the server) ends the server with its launcher
            os.environ["TINYLEARN_FORKSERVER_GUARD"] = "1"
            # torch._dynamo: torch.optim imports it on a process's first optimizer step (~10 s per rank on 2 loaded
            # cores when 4 ranks do it at once); preloaded, every rank inherits it
            ctx.set_forkserver_preload(
                ["torch", "torch._dynamo", "torch.distributed", "tinylearn.dist", "tinylearn.dist._forkserver_guard"]
            )
        _CTX_CACHE[start_method] = ctx
    return _CTX_CACHE[start_method]


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2.0)


def _dead_rank(rank: int, proc: Any) -> RankFailure:
    """The failure of a rank whose process died without sending a result (killed, segfault, os._exit)."""
    proc.join(1.0)
    return RankFailure(
        rank,
        "builtins",
        "RuntimeError",
        f"process exited with code {proc.exitcode} without returning a result",
        "(no Python traceback: the process died)",
        None,
    )


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 60,
    threads_per_rank: int = 1,
    start_method: str = "forkserver",
) -> list[Any]:
    """Run ``fn(*args)`` on ranks ``0..world_size-1`` (each a process in one ``torch.distributed`` group).

    Returns the per-rank return values in rank order. See the module docstring for the failure contract.
    ``threads_per_rank`` sets torch/OpenMP threads in each child (1 by default: ranks share this box's cores).
    """
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    world_size = int(world_size)
    real = is_real(timeout_s)
    if not (real and timeout_s > 0):
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    timeout_s = float(timeout_s)
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(f"backend: expected 'gloo', 'nccl' or 'mpi', got {backend!r}")
    if _in_torchrun():
        return _launch_torchrun(fn, world_size, args, backend, timeout_s)
    payload = _check_picklable(fn, args)
    import torch.distributed as dist

    ctx = _context(start_method)
    deadline = time.monotonic() + timeout_s + _STARTUP_S  # until every rank has joined the group
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    procs, conns = [], []
    try:
        for rank in range(world_size):
            r_conn, w_conn = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_worker,
                args=(rank, world_size, store.port, backend, float(timeout_s), threads_per_rank, payload, w_conn),
                daemon=True,
                name=f"tinylearn-rank{rank}",
            )
            p.start()
            w_conn.close()
            procs.append(p)
            conns.append(r_conn)
        results: dict[int, Any] = {}
        failures: list[RankFailure] = []
        pending = set(range(world_size))
        joined: set[int] = set()
        grace_end: float | None = None
        while pending:
            now = time.monotonic()
            limit = deadline if grace_end is None else min(deadline, grace_end)
            if now >= limit:
                break
            waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
            ready = wait(waitables, timeout=limit - now)
            for r in sorted(pending):
                c, p = conns[r], procs[r]
                if c in ready or (p.sentinel in ready and c.poll()):
                    try:
                        status, data = c.recv()
                    except (EOFError, OSError):
                        failures.append(_dead_rank(r, p))
                        pending.discard(r)
                        continue
                    if status == "ready":
                        joined.add(r)
                        if len(joined) == world_size:  # from now on timeout_s bounds fn itself
                            deadline = time.monotonic() + timeout_s
                        continue
                    pending.discard(r)
                    if status == "ok":
                        results[r] = pickle.loads(data)
                    else:
                        failures.append(RankFailure(r, *data))
                elif p.sentinel in ready:
                    failures.append(_dead_rank(r, p))
                    pending.discard(r)
            if failures and grace_end is None:
                # peers of a failed rank usually fail fast (connection closed); give them a moment to say so
                grace_end = time.monotonic() + min(2.0, max(0.0, deadline - time.monotonic()))
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        del store
    if failures:
        # root cause first: a rank that died or raised on its own beats peers that only saw the connection drop
        def secondary(f: RankFailure) -> bool:
            text = f"{f.name} {f.message}".lower()
            return f.name.startswith("Dist") or any(w in text for w in ("connection", "peer", "timed out", "gloo"))

        failures.sort(key=secondary)  # stable: arrival order within each class
        first = failures[0]
        others = ", ".join(f"rank {f.rank}: {f.name}" for f in failures[1:])
        summary = (
            f"(world_size={world_size}; finished: {sorted(results)}; other failures: {others or 'none'}; "
            f"unfinished and stopped: {sorted(pending)})"
        )
        raise first.to_exception(summary)
    if pending:
        raise TimeoutError(
            f"timeout_s: ranks {sorted(pending)} of world_size={world_size} did not finish within "
            f"timeout_s={timeout_s} (finished: {sorted(results)}); all ranks were stopped"
        )
    return [results[r] for r in range(world_size)]
