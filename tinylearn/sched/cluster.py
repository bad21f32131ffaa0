"""A real cluster on this machine's cores: jobs are worker processes, one policy decides at every event.

``Cluster(devices={"cpu": 2, "mem_gb": 4.0}, policy=FIFO(), preempt="suspend", step_timeout_s=30)`` queues jobs
with ``submit(job, at_s=..., priority=..., deadline_s=..., demand=...)`` (validated by ``validate_job``: a bad
submission raises and queues nothing) and ``run(timeout_s)`` executes them and returns a ``ClusterReport``.

The event loop is one thread (as in Slurm's slurmctld main loop or the Kubernetes scheduler's scheduling cycle,
reduced to one node): it waits with a timeout on the workers' stdout pipes (``select``) and on the next arrival;
every event -- an arrival, a step boundary, a pause/stop acknowledgement, a completion, a failure -- updates the
``JobState``s and calls ``policy.select(waiting, running, free, now)``. The engine then

    preempts   the jobs the policy names: preempt="suspend" sends "pause" (the worker blocks at its next step
               boundary; its cores are released when it acknowledges; "resume" later carries the new cores, which
               may be other ones; the accounting releases the job's whole demand although a suspended process
               keeps its memory resident -- "mem_gb" is booked, not enforced, on this VM) or
               preempt="checkpoint" sends "stop" (the worker checkpoints and exits; a new worker resumes from the
               checkpoint, bitwise the same final state as an uninterrupted run)
    starts     the jobs the policy names whose whole demand fits (gang: all cores at once) on concrete free core
               ids: a new worker process (``python -m tinylearn.sched.worker``, pinned with sched_setaffinity,
               OMP/BLAS threads = cores) or a resumed one

Faults stay local: a worker that reports no step boundary for ``step_timeout_s`` (plus ``STARTUP_GRACE_S`` before
its first report), or whose job ran longer than its ``max_runtime_s``, is SIGKILLed (state "killed"); a worker that
raises is "failed" with the error text; the run's own ``timeout_s`` kills what is left ("killed", "cluster run
timeout"). Every submitted job ends in a final state in the report -- nothing is lost. All times are wall-clock
seconds on real processes, measured from the start of ``run()``; ``at_s`` is an arrival time on that clock.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from .._inputs import is_real
from ..data.datasets import load_digits
from .jobs import Job, JobState, take, validate_job
from .metrics import ClusterReport, summarize
from .policies import FIFO, Policy, make_policy

PREEMPT_MODES = ("suspend", "checkpoint")
STARTUP_GRACE_S = 10.0  # added to step_timeout_s until a new worker reports "ready" (interpreter + imports)
EXIT_GRACE_S = 5.0  # a worker that reported "done" (or was killed) and has not exited after this is SIGKILLed
_ROOT = str(Path(__file__).resolve().parents[2])


@dataclasses.dataclass(eq=False)
class _Proc:
    js: JobState
    popen: subprocess.Popen
    err: IO[bytes]
    cores: list[int]
    seg_start: float
    last_t: float  # last sign of progress (spawn, ready, step, resume)
    phase: str = "running"  # running | pausing | stopping | paused
    buf: bytes = b""
    ready: bool = False  # the worker has started (imports done); before that the step limit has a start-up grace


class Cluster:
    """Real jobs on this machine's cores under one ``Policy`` (see the module docstring)."""

    def __init__(
        self,
        devices: Mapping[str, float] | None = None,
        policy: Policy | str | None = None,
        preempt: str = "suspend",
        step_timeout_s: float = 30.0,
    ) -> None:
        devices = {"cpu": 2, "mem_gb": 4.0} if devices is None else dict(devices)
        ncpu = devices.get("cpu")
        has_aff = hasattr(os, "sched_getaffinity")
        avail = sorted(os.sched_getaffinity(0)) if has_aff else list(range(os.cpu_count() or 1))
        if isinstance(ncpu, bool) or not isinstance(ncpu, int) or not 1 <= ncpu <= len(avail):
            raise ValueError(f"devices: cpu must be an int in [1, {len(avail)}] (this machine's cores), got {ncpu!r}")
        for r, a in devices.items():
            if not is_real(a) or not math.isfinite(float(a)) or float(a) < 0:
                raise ValueError(f"devices: {r}={a!r} must be a finite number >= 0")
        if preempt not in PREEMPT_MODES:
            raise ValueError(f"preempt: expected one of {PREEMPT_MODES}, got {preempt!r}")
        if not is_real(step_timeout_s) or not float(step_timeout_s) > 0:
            raise ValueError(f"step_timeout_s: expected a number > 0, got {step_timeout_s!r}")
        self.capacity = {r: float(a) for r, a in devices.items()}
        self.core_ids = avail[:ncpu]
        self.policy = make_policy(FIFO() if policy is None else policy)
        self.preempt = preempt
        self.step_timeout_s = float(step_timeout_s)
        self.queue: list[JobState] = []

    def submit(
        self,
        job: Job,
        *,
        at_s: float = 0.0,
        priority: int | None = None,
        deadline_s: float | None = None,
        demand: Mapping[str, float] | None = None,
    ) -> JobState:
        """Queue ``job`` (keyword arguments override its fields) to arrive ``at_s`` seconds into ``run()``."""
        if not isinstance(job, Job):
            raise TypeError(f"job: expected a tinylearn.sched.Job, got {type(job).__name__}")
        over: dict[str, Any] = {}
        if priority is not None:
            over["priority"] = priority
        if deadline_s is not None:
            over["deadline_s"] = deadline_s
        if demand is not None:
            if not isinstance(demand, Mapping):
                raise ValueError(f"demand: expected a dict of resource -> amount, got {demand!r}")
            over["demand"] = dict(demand)
        job = validate_job(dataclasses.replace(job, **over), self.capacity)
        if not is_real(at_s) or not math.isfinite(float(at_s)) or float(at_s) < 0:
            raise ValueError(f"at_s: expected a finite arrival time >= 0 s, got {at_s!r}")
        cpu = float(job.demand.get("cpu", 0.0))
        if cpu < 1 or cpu != int(cpu):
            raise ValueError(f"demand: cpu={cpu!r} must be a whole number of cores >= 1 on the real cluster")
        if any(js.name == job.name for js in self.queue):
            raise ValueError(f"name: a job named {job.name!r} is already queued")
        js = JobState(job, submit_t=float(at_s))
        js.extra["seq"] = len(self.queue)  # submission order breaks ties between equal arrival times
        self.queue.append(js)
        return js

    # -- the event loop -------------------------------------------------------------------------------------------
    def run(self, timeout_s: float = 60.0) -> ClusterReport:
        """Run every queued job to a final state (or until ``timeout_s``) and report (see the module docstring)."""
        if not is_real(timeout_s) or not float(timeout_s) > 0:
            raise ValueError(f"timeout_s: expected a number > 0, got {timeout_s!r}")
        jobs, self.queue = self.queue, []
        self._events: list[tuple[float, str, str, str]] = []
        self._free = dict(self.capacity)
        self._cores = list(self.core_ids)
        self._procs: dict[int, _Proc] = {}  # id(JobState) -> its live worker
        self._exiting: list[tuple[_Proc, float]] = []  # finished workers still exiting, with a kill deadline
        self._tmp = tempfile.TemporaryDirectory(prefix="tl_sched_")
        if any(js.job.workload == "cnn" for js in jobs):  # one copy of the digits for every cnn worker
            X, y = load_digits()
            np.savez(Path(self._tmp.name) / "digits.npz", X=X, y=y)
        self._t0 = time.perf_counter()  # the run's clock starts once the shared data is ready
        arrivals = sorted(jobs, key=lambda j: (j.submit_t, j.extra.get("seq", 0)))
        arrived: list[JobState] = []
        try:
            while True:
                now = self._now()
                while arrivals and arrivals[0].submit_t <= now:
                    js = arrivals.pop(0)
                    arrived.append(js)
                    self._event("arrive", js, f"demand={js.job.demand}")
                self._check_limits(now)
                self._reap()
                self._schedule(self._waiting(arrived))
                waiting = self._waiting(arrived)
                if not arrivals and not waiting and not self._procs:
                    break
                if now > timeout_s:
                    for p in list(self._procs.values()):
                        self._kill(p, "cluster run timeout")
                    for js in [*waiting, *arrivals]:
                        js.state, js.finish_t, js.error = "killed", now, "cluster run timeout (never finished)"
                        self._event("killed", js, "cluster run timeout")
                    break
                wait = min(0.25, timeout_s - now + 0.01)
                if arrivals:
                    wait = min(wait, max(0.0, arrivals[0].submit_t - now))
                self._pump(max(0.0, wait))
        finally:
            for p in list(self._procs.values()):
                self._kill(p, "cluster shut down")
            self._reap(block=True)
            self._tmp.cleanup()
        return summarize(jobs, self._events, len(self.core_ids), policy=self.policy.name)

    def _waiting(self, arrived: list[JobState]) -> list[JobState]:
        """Arrived jobs the policy may start: queued, suspended (worker paused) or checkpointed (no worker)."""
        out = []
        for js in arrived:
            p = self._procs.get(id(js))
            if js.state in ("waiting", "paused") and (p is None or p.phase == "paused"):
                out.append(js)
        return out

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _event(self, kind: str, js: JobState, detail: str = "") -> None:
        self._events.append((self._now(), kind, js.name, detail))

    def _schedule(self, waiting: list[JobState]) -> None:
        # jobs still being paused/stopped hold their cores until they acknowledge: the policy sees them as running
        # (so it counts their resources in the cluster); preempting them again is a no-op
        running = [p.js for p in self._procs.values() if p.phase in ("running", "pausing", "stopping")]
        now = self._now()
        for p in self._procs.values():  # service so far = time holding the cores (the running segment included)
            if p.phase != "paused":
                p.js.attained_s = p.js.extra.get("closed_s", 0.0) + (now - p.seg_start)
        start, preempt = self.policy.select(list(waiting), running, dict(self._free), self._now())
        for js in preempt:
            p = self._procs.get(id(js))
            if p is not None and p.phase == "running":
                p.phase = "pausing" if self.preempt == "suspend" else "stopping"
                self._send(p, "pause" if self.preempt == "suspend" else "stop")
                js.preemptions += 1
                self._event("preempt", js, self.preempt)
        for js in start:
            if js.state not in ("waiting", "paused") or not all(
                float(a) <= self._free.get(r, 0.0) + 1e-9 for r, a in js.job.demand.items()
            ):
                continue
            cores, self._cores = self._cores[: js.job.gang], self._cores[js.job.gang :]
            self._free = take(self._free, js.job.demand)
            p = self._procs.get(id(js))
            if p is not None and p.phase == "paused":  # suspended worker: resume on (possibly other) cores
                p.cores, p.phase, p.seg_start, p.last_t = cores, "running", self._now(), self._now()
                self._send(p, "resume " + json.dumps(cores))
                self._event("resume", js, "cores=" + ",".join(map(str, cores)))
            else:
                self._spawn(js, cores, resume=bool(js.extra.get("ckpt_saved")))
            if "_paused_at" in js.extra:  # the idle interval, paused/stopped -> resume/restart event (calibrate.py)
                js.extra.setdefault("pauses", []).append((js.extra.pop("_paused_at"), self._events[-1][0]))
            js.state = "running"
            if js.start_t is None:
                js.start_t = self._now()

    def _spawn(self, js: JobState, cores: list[int], resume: bool) -> None:
        d = Path(self._tmp.name)
        spec = {
            "name": js.name,
            "workload": js.job.workload,
            "steps": js.job.steps,
            "size": js.job.size,
            "seed": js.job.seed,
            "sleep_s": js.job.est_step_s or 0.02,
            "cores": cores,
            "ckpt": str(d / f"{js.name}.ckpt.npz"),
            "result": str(d / f"{js.name}.result.npz"),
            "resume": resume,
            "data": str(d / "digits.npz") if js.job.workload == "cnn" else None,
        }
        n = str(len(cores))
        env = dict(os.environ, OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n)
        env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
        err = tempfile.TemporaryFile(dir=d)
        popen = subprocess.Popen(
            [sys.executable, "-m", "tinylearn.sched.worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
        now = self._now()
        self._procs[id(js)] = _Proc(js, popen, err, cores, seg_start=now, last_t=now)
        self._event("restart" if resume else "start", js, "cores=" + ",".join(map(str, cores)) + f" pid={popen.pid}")

    def _send(self, p: _Proc, msg: str) -> None:
        try:
            assert p.popen.stdin is not None
            p.popen.stdin.write((msg + "\n").encode())
            p.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is gone; its EOF on stdout reports it

    def _release(self, p: _Proc) -> None:
        """End ``p``'s run segment: service accounted, cores and resources back to the pool."""
        js, now = p.js, self._now()
        js.attained_s = js.extra.get("closed_s", 0.0) + (now - p.seg_start)
        js.extra["closed_s"] = js.attained_s
        js.extra.setdefault("segments", []).append((p.seg_start, now, tuple(p.cores)))
        self._free = take(self._free, js.job.demand, sign=-1)
        self._cores = sorted(self._cores + p.cores)
        p.cores = []

    def _finish(self, p: _Proc, state: str, error: str | None = None) -> None:
        js = p.js
        if p.cores:
            self._release(p)
        js.state, js.finish_t, js.error = state, self._now(), error
        self._event(state, js, error or "")
        self._procs.pop(id(js), None)
        self._exiting.append((p, self._now() + EXIT_GRACE_S))  # reaped by the loop: waiting here would stall it

    def _reap(self, block: bool = False) -> None:
        """Close the finished workers that have exited; SIGKILL one still alive ``EXIT_GRACE_S`` after its end (all
        of them, waiting, when ``block``). The loop never waits for an exit: a worker's interpreter teardown takes
        tens of ms, and blocking on it delayed the next job's start by as much (seen as the dispatch delay)."""
        keep = []
        for p, deadline in self._exiting:
            if p.popen.poll() is None:
                if not block and self._now() < deadline:
                    keep.append((p, deadline))
                    continue
                try:
                    p.popen.wait(timeout=max(0.0, deadline - self._now()) if block else 0)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait(timeout=5)
            for f in (p.popen.stdin, p.popen.stdout, p.err):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
        self._exiting = keep

    def _kill(self, p: _Proc, why: str) -> None:
        p.popen.kill()  # SIGKILL: the job gets no say
        self._finish(p, "killed", why)

    def _check_limits(self, now: float) -> None:
        for p in list(self._procs.values()):
            if p.phase not in ("running", "pausing", "stopping"):
                continue
            limit = self.step_timeout_s + (0.0 if p.ready else STARTUP_GRACE_S)
            if now - p.last_t > limit:
                self._kill(p, f"step timeout: no step boundary for {now - p.last_t:.1f} s (> {limit} s)")
                continue
            lim = p.js.job.max_runtime_s
            if lim is not None and p.js.extra.get("closed_s", 0.0) + (now - p.seg_start) > float(lim):
                self._kill(p, f"max_runtime_s exceeded ({float(lim)} s)")

    def _pump(self, timeout: float) -> None:
        fds = {p.popen.stdout.fileno(): p for p in self._procs.values() if p.popen.stdout is not None}
        if not fds:
            time.sleep(timeout)
            return
        ready, _, _ = select.select(list(fds), [], [], timeout)
        for fd in ready:
            p = fds[fd]
            chunk = os.read(fd, 65536)
            if not chunk:
                self._on_eof(p)
                continue
            *lines, p.buf = (p.buf + chunk).split(b"\n")
            for ln in lines:
                if ln.strip() and id(p.js) in self._procs:
                    try:
                        msg = json.loads(ln)
                    except json.JSONDecodeError:
                        p.popen.kill()
                        self._finish(p, "failed", f"worker wrote a line that is not JSON: {ln[:200]!r}")
                        continue
                    self._on_message(p, msg)

    def _on_eof(self, p: _Proc) -> None:
        if id(p.js) not in self._procs:
            return
        p.popen.wait(timeout=5)
        p.err.seek(0)
        tail = p.err.read()[-400:].decode(errors="replace").strip()
        self._finish(p, "failed", f"worker exited with code {p.popen.returncode} without finishing: {tail}")

    def _on_message(self, p: _Proc, m: dict[str, Any]) -> None:
        js, now, ev = p.js, self._now(), m.get("ev")
        p.last_t = now
        if ev == "ready":
            p.ready = True
        elif ev == "step":
            js.done_steps = int(m["step"])
            js.step_times.append(float(m["dt"]))
            js.extra.setdefault("step_ends", []).append(now)  # when the scheduler heard of it (calibrate.py reads it)
            js.attained_s = js.extra.get("closed_s", 0.0) + (now - p.seg_start)
        elif ev == "paused":
            self._release(p)
            p.phase, js.state = "paused", "paused"
            self._event("paused", js, f"step={m['step']}")
            js.extra["_paused_at"] = self._events[-1][0]
        elif ev == "stopped":
            self._release(p)
            js.extra["ckpt_saved"] = True
            js.state = "paused"
            self._event("stopped", js, f"step={m['step']} checkpoint")
            js.extra["_paused_at"] = self._events[-1][0]
            self._procs.pop(id(js), None)
            self._exiting.append((p, now + EXIT_GRACE_S))
        elif ev == "done":
            js.done_steps = int(m["step"])
            js.extra["digest"] = m["digest"]
            self._finish(p, "done")
        elif ev == "error":
            self._finish(p, "failed", str(m.get("msg")))
