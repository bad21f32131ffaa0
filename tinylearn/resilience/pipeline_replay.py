"""Pipeline schedules as dependency DAGs, and recovering a failed stage by replaying only its lost work.

**The DAG.** A pipeline-parallel step runs S stages over M micro-batches. Its ops are (stage s, micro-batch m, F|B):

    F(s, m) needs F(s−1, m)   (the activation of the stage before)
    B(s, m) needs B(s+1, m)   (the gradient from the stage after; the last stage's comes from its own loss)
    B(s, m) needs F(s, m)     (the stashed activations of its own forward)

plus each stage's own program order: GPipe runs all M forwards, then all M backwards (M stashes live at the peak);
1F1B runs min(S − s − 1, M) warm-up forwards, then alternates one forward, one backward, then drains the backwards
(at most S − s stashes on stage s). ``build_schedule`` list-schedules both (F costs ``f_cost``, B ``b_cost``): the
makespan, the bubble ((S − 1)/(M + S − 1) of the time for F = B = 1) and every op's start/end.

**Checkpoints at micro-batch boundaries.** What crosses a stage boundary (the input activation of F(s, m), the output
gradient of B(s, m)) is kept by its sender until the step ends (upstream backup, a micro-batch activation
checkpoint). When stage s fails after some ops, it loses its *internal* state: the stashed activations of its
forwards and its accumulated weight gradients. Everything it already *sent* is safe downstream/upstream, so no other
stage redoes anything. The minimal replay is stage s's completed ops, in their original order, without re-sending:

* F(s, m) for every completed forward (its stash is needed by B(s, m), done or not) — input from the kept boundary;
* B(s, m) for every completed backward (it re-accumulates the lost weight gradients) — output gradient from the
  kept boundary.

A full restart of the step re-executes every completed op of every stage. ``PipelineExecutor`` runs a real pipeline
(each stage tanh(x·W + b) in numpy, squared loss), injects the failure by discarding the stage's stash, gradient
accumulators and parameters (re-read from the step-start copy), replays ``replay_set`` and finishes the step: the
gradients equal the no-failure run's *bitwise*, because every op sees the same inputs and the weight gradients are
accumulated in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Op", "PipelineExecutor", "Schedule", "build_schedule", "dependencies", "replay_set", "stage_programs"]

KINDS = ("gpipe", "1f1b")


class Op(NamedTuple):
    """One op of the pipeline step: ``kind`` "F" (forward) or "B" (backward) of micro-batch ``micro`` on ``stage``."""

    stage: int
    micro: int
    kind: str


def _int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return int(v)


def stage_programs(n_stages: int, n_micro: int, kind: str = "1f1b") -> list[list[Op]]:
    """Each stage's ops in its program order, for ``kind`` "gpipe" or "1f1b"."""
    s_n, m_n = _int("n_stages", n_stages, 1), _int("n_micro", n_micro, 1)
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    progs = []
    for s in range(s_n):
        if kind == "gpipe":
            prog = [Op(s, m, "F") for m in range(m_n)] + [Op(s, m, "B") for m in range(m_n)]
        else:
            warm = min(s_n - s - 1, m_n)
            prog = [Op(s, m, "F") for m in range(warm)]
            f, b = warm, 0
            while b < m_n:
                if f < m_n:
                    prog.append(Op(s, f, "F"))
                    f += 1
                prog.append(Op(s, b, "B"))
                b += 1
        progs.append(prog)
    return progs


def dependencies(op: Op, n_stages: int) -> list[Op]:
    """The data dependencies of ``op`` (program order aside): F(s,m) ← F(s−1,m); B(s,m) ← F(s,m), B(s+1,m)."""
    s, m, k = op
    if k == "F":
        return [Op(s - 1, m, "F")] if s > 0 else []
    if k == "B":
        return [Op(s, m, "F")] + ([Op(s + 1, m, "B")] if s < n_stages - 1 else [])
    raise ValueError(f"op: expected kind 'F' or 'B', got {k!r}")


@dataclass
class Schedule:
    """A list-scheduled pipeline step: ``ops`` in global execution order (by start time, then stage), ``start`` and
    ``end`` per op, ``makespan``, ``bubble`` (idle fraction of S × makespan), ``peak_stash`` per stage."""

    n_stages: int
    n_micro: int
    kind: str
    ops: list[Op]
    start: dict[Op, float]
    end: dict[Op, float]
    makespan: float
    bubble: float
    peak_stash: list[int] = field(default_factory=list)


def build_schedule(
    n_stages: int, n_micro: int, kind: str = "1f1b", f_cost: float = 1.0, b_cost: float = 2.0
) -> Schedule:
    """List-schedule ``stage_programs``: each op starts when its stage is free and its dependencies have ended."""
    progs = stage_programs(n_stages, n_micro, kind)
    for name, c in (("f_cost", f_cost), ("b_cost", b_cost)):
        if isinstance(c, bool) or not isinstance(c, int | float) or not c > 0:
            raise ValueError(f"{name}: expected a number > 0, got {c!r}")
    cost = {"F": float(f_cost), "B": float(b_cost)}
    start, end = {}, {}
    nxt, free = [0] * n_stages, [0.0] * n_stages
    remaining = sum(len(p) for p in progs)
    while remaining:
        progressed = False
        for s, prog in enumerate(progs):
            while nxt[s] < len(prog):
                op = prog[nxt[s]]
                deps = dependencies(op, n_stages)
                if any(d not in end for d in deps):
                    break
                start[op] = max([free[s]] + [end[d] for d in deps])
                end[op] = free[s] = start[op] + cost[op.kind]
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the two built-in programs
            raise RuntimeError(f"build_schedule: program order of {kind!r} deadlocks")
    ops = sorted(start, key=lambda o: (start[o], o.stage))
    makespan = max(end.values())
    busy = sum(end[o] - start[o] for o in ops)
    peak = []
    for prog in progs:
        live = best = 0
        for op in prog:
            live += 1 if op.kind == "F" else -1
            best = max(best, live)
        peak.append(best)
    return Schedule(n_stages, n_micro, kind, ops, start, end, makespan, 1 - busy / (n_stages * makespan), peak)


def replay_set(schedule: Schedule, failed_stage: int, n_done: int) -> list[Op]:
    """The ops to replay when ``failed_stage`` fails after the first ``n_done`` ops of ``schedule.ops``: its completed
    forwards (to rebuild the stash) and backwards (to rebuild the weight gradients), in original order."""
    s = _int("failed_stage", failed_stage, 0)
    if s >= schedule.n_stages:
        raise ValueError(f"failed_stage: expected < n_stages={schedule.n_stages}, got {failed_stage!r}")
    k = _int("n_done", n_done, 0)
    if k > len(schedule.ops):
        raise ValueError(f"n_done: expected <= {len(schedule.ops)} ops, got {n_done!r}")
    return [op for op in schedule.ops[:k] if op.stage == s]


class PipelineExecutor:
    """A real S-stage pipeline in one process: stage s computes tanh(x·W_s + b_s); loss ½·Σ(y − target)² / n.

    ``run(schedule, x, target, fail_stage=None, fail_after=None)`` executes the schedule micro-batch by micro-batch;
    with a failure it discards the stage's state after ``fail_after`` ops, replays ``replay_set`` and continues.
    Returns ``grads`` [(dW, db) per stage], ``loss``, ``executed`` (ops run), ``replayed`` (ops replayed).
    """

    def __init__(self, n_stages: int, width: int, seed: int = 0) -> None:
        self.n_stages, self.width = _int("n_stages", n_stages, 1), _int("width", width, 1)
        rng = np.random.default_rng(_int("seed", seed, 0))
        self.params = [
            (rng.standard_normal((width, width)) / np.sqrt(width), 0.1 * rng.standard_normal(width))
            for _ in range(self.n_stages)
        ]

    def run(
        self,
        schedule: Schedule,
        x: np.ndarray,
        target: np.ndarray,
        fail_stage: int | None = None,
        fail_after: int | None = None,
        replay: list[Op] | None = None,
    ) -> dict[str, Any]:
        """Run one step (see the class docstring); ``replay`` overrides ``replay_set`` (to show what too little
        replay does: a missing stash raises KeyError, missing backwards give wrong gradients)."""
        if schedule.n_stages != self.n_stages:
            raise ValueError(f"schedule: expected {self.n_stages} stages, got {schedule.n_stages}")
        x, target = np.asarray(x, dtype=np.float64), np.asarray(target, dtype=np.float64)
        m_n = schedule.n_micro
        if x.shape != target.shape or x.ndim != 2 or x.shape[1] != self.width or x.shape[0] % m_n:
            raise ValueError(f"x: expected (n, {self.width}) with n divisible by n_micro={m_n}, got {x.shape}")
        if (fail_stage is None) != (fail_after is None):
            raise ValueError(f"fail_stage/fail_after: give both or neither, got {fail_stage!r}, {fail_after!r}")
        n, s_n = x.shape[0], self.n_stages
        if fail_after is not None:
            if _int("fail_stage", fail_stage, 0) >= s_n:
                raise ValueError(f"fail_stage: expected < {s_n}, got {fail_stage!r}")
            if _int("fail_after", fail_after, 0) >= len(schedule.ops):
                raise ValueError(f"fail_after: expected < {len(schedule.ops)} (a failure before the step ends)")
        xs, ts = np.split(x, m_n), np.split(target, m_n)
        live = [(w.copy(), b.copy()) for w, b in self.params]  # the stages' working copies
        acts = {(0, m): xs[m] for m in range(m_n)}  # boundary inputs, kept by their sender (upstream backup)
        gouts: dict[tuple[int, int], np.ndarray] = {}  # boundary output gradients, kept by their sender
        stash: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(s_n)]
        acc = [(np.zeros_like(w), np.zeros_like(b)) for w, b in live]
        losses = [0.0] * m_n

        def execute(op: Op, send: bool) -> None:
            s, m, k = op
            w, b = live[s]
            if k == "F":
                xin = acts[(s, m)]
                y = np.tanh(xin @ w + b)
                stash[s][m] = (xin, y)
                if send and s < s_n - 1:
                    acts[(s + 1, m)] = y
                elif send:
                    losses[m] = 0.5 * float(np.sum((y - ts[m]) ** 2)) / n
                return
            xin, y = stash[s].pop(m)
            gy = gouts[(s, m)] if s < s_n - 1 else (y - ts[m]) / n
            gz = gy * (1 - y * y)
            acc[s][0][...] += xin.T @ gz
            acc[s][1][...] += gz.sum(axis=0)
            if send and s > 0:
                gouts[(s - 1, m)] = gz @ w.T

        replayed = []
        for i, op in enumerate(schedule.ops):
            if fail_after is not None and i == fail_after:
                fs = int(fail_stage)
                # the failure: stage fs loses its stash, its gradient accumulators and its parameters
                stash[fs] = {}
                acc[fs] = (np.zeros_like(acc[fs][0]), np.zeros_like(acc[fs][1]))
                live[fs] = (self.params[fs][0].copy(), self.params[fs][1].copy())  # re-read the step-start copy
                replayed = replay_set(schedule, fs, i) if replay is None else list(replay)
                for r in replayed:
                    execute(r, send=False)
            execute(op, send=True)
        return {
            "grads": acc,
            "loss": float(sum(losses)),
            "executed": len(schedule.ops) + len(replayed),
            "replayed": len(replayed),
            "restart_replayed": 0 if fail_after is None else int(fail_after),
        }
