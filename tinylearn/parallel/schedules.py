"""Pipeline schedules as data, an event simulator for them and the bubble formula.

A schedule is, per stage (one rank), the ordered list of its operations: ``("F", mb)`` / ``("B", mb)`` for the
forward / backward of microbatch ``mb``; the interleaved schedule (n_chunks = v > 1 model chunks per rank, rank s
holding virtual stages s, s+p, ..., s+(v-1)p) uses ``("F", mb, chunk)`` / ``("B", mb, chunk)``.

* ``gpipe``: all m forwards, then all m backwards. Peak activations: m microbatches per stage.
* ``1f1b`` (PipeDream-flush): stage s runs w = min(p-s-1, m) warm-up forwards, then alternates one forward / one
  backward, then drains the remaining backwards. Peak activations p - s <= p microbatches, same bubble as GPipe.
* ``interleaved_1f1b`` (Megatron, Narayanan et al. 2021): virtual microbatch k -> chunk (k mod pv) // p (reversed
  for backward) and microbatch (k // pv)·p + k mod p; warm-up 2(p-s-1) + (v-1)p forwards (all of them if m = p);
  needs m divisible by p.

Bubble, with t_f + t_b the time of one microbatch through the whole stage (all chunks): the last stage starts
after p-1 forward slots and the first stage ends p-1 backward slots after the last stage, so every stage idles
(p-1)(t_f+t_b) out of a step of m(t_f+t_b) + (p-1)(t_f+t_b):

    bubble = (p-1) / (m + p - 1)            gpipe, 1f1b
    bubble = (p-1) / (v·m + p - 1)          interleaved: the ramp is made of chunk slots 1/v as long

(``simulate`` replays the dependency graph and reproduces both formulas exactly; tested.)
"""

from __future__ import annotations

from typing import Any

from tinylearn._inputs import as_int

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")

Op = tuple  # ("F"|"B", microbatch) or ("F"|"B", microbatch, chunk)


def _check(name: str, n_stages: int, n_microbatches: int, n_chunks: int) -> tuple[int, int, int]:
    """The three counts as Python ints (numpy integers accepted, bool/float refused), after validation."""
    if not isinstance(name, str) or name not in SCHEDULES:
        raise ValueError(f"name: unknown schedule {name!r}; expected one of {SCHEDULES}")
    n_stages, n_microbatches, n_chunks = (
        as_int(v, arg, min=1)
        for arg, v in (("n_stages", n_stages), ("n_microbatches", n_microbatches), ("n_chunks", n_chunks))
    )
    if name != "interleaved_1f1b" and n_chunks != 1:
        raise ValueError(f"n_chunks: only 'interleaved_1f1b' uses model chunks; got n_chunks={n_chunks} for {name!r}")
    if name == "interleaved_1f1b" and n_microbatches % n_stages:
        raise ValueError(
            f"n_microbatches: the interleaved schedule needs a multiple of n_stages={n_stages}, got {n_microbatches}"
        )
    return n_stages, n_microbatches, n_chunks


def pipeline_schedule(name: str, n_stages: int, n_microbatches: int, n_chunks: int = 1) -> list[list[Op]]:
    """Per stage, the ordered operations of one training step (see the module docstring)."""
    p, m, v = _check(name, n_stages, n_microbatches, n_chunks)
    out: list[list[Op]] = []
    for s in range(p):
        if name == "gpipe":
            ops: list[Op] = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        elif name == "1f1b":
            w = min(p - s - 1, m)
            ops = [("F", i) for i in range(w)]
            for i in range(m - w):
                ops += [("F", w + i), ("B", i)]
            ops += [("B", i) for i in range(m - w, m)]
        else:
            total = m * v

            def virt(k: int, forward: bool) -> Op:
                c = (k % (p * v)) // p
                mb = (k // (p * v)) * p + k % p
                return ("F", mb, c) if forward else ("B", mb, v - 1 - c)

            warm = total if m == p else min(total, 2 * (p - s - 1) + (v - 1) * p)
            ops = [virt(k, True) for k in range(warm)]
            for k in range(total - warm):
                ops += [virt(warm + k, True), virt(k, False)]
            ops += [virt(k, False) for k in range(total - warm, total)]
        out.append(ops)
    return out


def bubble_fraction(name: str, n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """Idle fraction of each stage: (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1)."""
    p, m, v = _check(name, n_stages, n_microbatches, n_chunks)
    return (p - 1) / (v * m + p - 1)


def _key(op: Op) -> tuple[str, int, int]:
    return (op[0], op[1], op[2] if len(op) > 2 else 0)


def _deps(op: tuple[str, int, int], s: int, p: int, v: int) -> list[tuple[int, tuple[str, int, int]]]:
    kind, mb, c = op
    if kind == "F":
        if s > 0:
            return [(s - 1, ("F", mb, c))]
        return [(p - 1, ("F", mb, c - 1))] if c > 0 else []
    deps = [(s, ("F", mb, c))]  # a stage needs its own activations
    if s < p - 1:
        deps.append((s + 1, ("B", mb, c)))
    elif c < v - 1:
        deps.append((0, ("B", mb, c + 1)))
    return deps


def validate_schedule(schedule: list[list[Op]], n_microbatches: int, n_chunks: int = 1) -> None:
    """ValueError unless every stage runs each (microbatch, chunk) forward and backward exactly once, F first."""
    for s, ops in enumerate(schedule):
        seen: set[tuple[str, int, int]] = set()
        for op in ops:
            k = _key(op)
            if k[0] not in ("F", "B"):
                raise ValueError(f"schedule: stage {s} has unknown operation {op!r}")
            if k in seen:
                raise ValueError(f"schedule: stage {s} runs {op!r} twice")
            if k[0] == "B" and ("F", k[1], k[2]) not in seen:
                raise ValueError(f"schedule: stage {s} runs {op!r} before its forward")
            seen.add(k)
        want = {(kd, mb, c) for kd in "FB" for mb in range(n_microbatches) for c in range(n_chunks)}
        if seen != want:
            missing = sorted(want - seen)[:4]
            raise ValueError(f"schedule: stage {s} misses operations, e.g. {missing}")


def simulate(schedule: list[list[Op]], t_f: float = 1.0, t_b: float = 2.0, n_chunks: int = 1) -> dict[str, Any]:
    """Replay ``schedule``: each stage runs its list in order; an op starts when the stage is free and its
    dependencies (previous stage's forward / next stage's backward, chunk hand-over between last and first
    stage) have finished. ``t_f``/``t_b`` are per microbatch through a whole stage (a chunk takes 1/n_chunks).

    Returns events [(stage, kind, mb, chunk, start, end)], makespan, busy time per stage, the bubble fraction
    1 - busy / (p·makespan) and the peak number of microbatch-chunks whose activations a stage holds.
    ValueError if the dependencies deadlock (an invalid order)."""
    p, v = len(schedule), n_chunks
    done: dict[tuple[int, tuple[str, int, int]], float] = {}
    pos, free = [0] * p, [0.0] * p
    events: list[tuple[int, str, int, int, float, float]] = []
    remaining = sum(len(o) for o in schedule)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(schedule[s]):
                op = _key(schedule[s][pos[s]])
                deps = _deps(op, s, p, v)
                if any(d not in done for d in deps):
                    break
                start = max([free[s]] + [done[d] for d in deps])
                end = start + (t_f if op[0] == "F" else t_b) / v
                done[(s, op)] = end
                free[s] = end
                events.append((s, op[0], op[1], op[2], start, end))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: schedule[s][pos[s]] for s in range(p) if pos[s] < len(schedule[s])}
            raise ValueError(f"schedule: deadlock, every stage waits: next ops {stuck}")
    makespan = max(e[5] for e in events)
    busy = [sum(e[5] - e[4] for e in events if e[0] == s) for s in range(p)]
    return {
        "events": events,
        "makespan": makespan,
        "busy": busy,
        "bubble": 1 - sum(busy) / (p * makespan),
        "peak_in_flight": [peak_in_flight(ops) for ops in schedule],
    }


def peak_in_flight(ops: list[Op]) -> int:
    """Most forwards whose backward has not run yet, over one stage's op list (activations held)."""
    cur = peak = 0
    for op in ops:
        cur += 1 if op[0] == "F" else -1
        peak = max(peak, cur)
    return peak
