"""Keep the cores out of idle while ranks talk: one ``SCHED_IDLE`` busy loop per core.

Why: a rank that waits for a message sleeps; when no other thread is runnable its core goes idle. On a virtual
machine an idle vCPU halts and exits to the host, and the wake-up that delivers the next message must wait for
the *host* to run that vCPU again, which can take a host scheduler tick (~4 ms). On the 2-core VM this project is
measured on, that wait hit most 2-rank all-reduce calls under 1 MB and made up half their mean (notebook 06).
Busy-polling transports (MPI's shared-memory and InfiniBand paths, NCCL) never let their cores idle for the same
reason; a ``SCHED_IDLE`` spinner does it for sleeping gloo ranks without taking their time: the kernel runs a
``SCHED_IDLE`` task only when nothing else on that core is runnable, and a waking rank preempts it at once.

Measured on that VM (``tinylearn bench dist``, 60 / 30 rounds at p = 2 / 4): without spinners the ring's and the
p2p floor's 256 KB means at p = 2 sat 32-40% above the model in 2 of 2 runs with a standard error of 3-5%, a
systematic bump at that message size rather than noise; with spinners, 28 of 28 validation means were within
+-25% in 3 of 4 runs. The cost: a vCPU that never halts is preempted by the host now and then for 20-50 ms (2-47
such samples in ~14000 per run, in bursts), which in the fourth run pushed two 256 KB means' SE to 18-23%.

``keep_cores_awake()`` is a context manager (Linux; elsewhere it does nothing and says why in ``.reason``). Each
spinner is a separate process pinned to one core; it exits when the context ends, and by itself when its parent
process is gone (it polls its parent pid), so a killed benchmark cannot leave spinners behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from types import TracebackType

from .._inputs import is_int

# The child: pin to one core, drop to SCHED_IDLE, spin until the parent pid changes (the parent died) or stdin
# closes (the parent ended the context). Polls the parent every ~1M iterations (~10-30 ms of spinning).
_CHILD = r"""
import os, select, sys
core, parent = int(sys.argv[1]), int(sys.argv[2])
os.sched_setaffinity(0, {core})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
sys.stdout.write("ready\n"); sys.stdout.flush()
fd = sys.stdin.fileno()
while os.getppid() == parent and not select.select([fd], [], [], 0)[0]:
    for _ in range(1000000):
        pass
"""


class keep_cores_awake:  # noqa: N801 - used like a function: ``with keep_cores_awake(): ...``
    """``with keep_cores_awake(cores=None): ...`` — one ``SCHED_IDLE`` spinner process per core in ``cores``
    (default: this process's affinity mask) for the duration of the block.

    Attributes: ``pids`` (the spinners), ``active`` (they run), ``reason`` (why not, when not). ``enabled=False``
    makes it a no-op, so callers can pass a flag through.
    """

    def __init__(self, cores: Iterable[int] | None = None, *, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        self.cores: list[int] = []
        if cores is not None:
            for c in cores:
                if not is_int(c) or c < 0:
                    raise ValueError(f"cores: expected core numbers >= 0, got {c!r}")
                self.cores.append(int(c))
        self.pids: list[int] = []
        self.reason = ""
        self._procs: list[subprocess.Popen] = []

    @property
    def active(self) -> bool:
        return bool(self._procs)

    def __enter__(self) -> keep_cores_awake:
        if not self.enabled:
            self.reason = "disabled (enabled=False)"
            return self
        if not (hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")):
            self.reason = f"SCHED_IDLE / sched_setaffinity not available on {sys.platform}"
            return self
        cores = self.cores or sorted(os.sched_getaffinity(0))
        try:
            for c in cores:
                p = subprocess.Popen(
                    [sys.executable, "-c", _CHILD, str(c), str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                self._procs.append(p)
            for p in self._procs:  # wait until each runs at SCHED_IDLE (or report why it could not)
                line = p.stdout.readline() if p.stdout else b""
                if line.strip() != b"ready":
                    err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
                    raise OSError(f"spinner for core {cores[self._procs.index(p)]} failed: {err[-300:]}")
        except OSError as e:
            self._stop()
            self.reason = str(e)
            return self
        self.pids = [p.pid for p in self._procs]
        return self

    def _stop(self) -> None:
        for p in self._procs:
            if p.stdin:
                p.stdin.close()  # the child sees stdin readable (EOF) and exits
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        self._procs = []

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()
