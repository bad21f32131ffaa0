"""List scheduling of a basic block on a machine with latencies, issue width and functional units.

A block is three-address code, ``Op(dst, kind, srcs, mem)``: ``kind`` names the operation (its unit and latency come
from the ``Machine``), ``mem`` the memory location a ``load`` reads or a ``store`` writes. Its dependence DAG has an
edge u -> v with a latency (v may issue at the earliest ``latency`` cycles after u issues):

    RAW  v reads what u wrote (register or memory)      latency(u)                      true dependence
    WAR  v overwrites what u reads                      0  (u reads at issue, v writes >= 1 cycle later)
    WAW  v overwrites what u wrote                      max(1, latency(u) - latency(v) + 1)  (v's write lands last)

WAR/WAW exist only because a name is reused; renaming (what an out-of-order core's register renaming does) removes
them. The machine issues at most ``issue_width`` ops per cycle and at most ``units[u]`` ops per cycle on unit u
(every unit is pipelined: a new op each cycle, its result ``latency`` cycles later).

    priority      height(v) = max(latency(v), max over edges v -> w of latency(edge) + height(w)): the longest
                  latency-weighted path from v to the end of the block (critical-path first)
    scheduler     cycle by cycle: the ready ops (every predecessor issued and its latency elapsed), highest
                  priority first, issue while an issue slot and a unit of their kind are free
    makespan      max over ops of issue cycle + latency: when the last result is ready
    lower bounds  critical path = max height; resource bound for unit u = ceil(n_u / units[u]) - 1 + the smallest
                  latency on u (the last of n_u ops cannot issue before that cycle); issue bound likewise with
                  the issue width. List scheduling is a greedy heuristic: optimal with unlimited resources (it is
                  then ASAP); with limited ones the problem is NP-hard and only worst-case bounds hold (Graham's
                  2 - 1/m for m identical units and no latencies).

Interleaving (``dot_product``): with one accumulator a reduction is a chain, one FMA per latency (4 cycles on
Zen 4); with a accumulators a chains overlap, so the gain is min(a, latency x FMA ports) = up to 4 x 2 = 8 until
another resource binds (with operands loaded from memory: 2 loads per FMA on 2 load ports, 1 FMA per cycle, gain 4).

Latencies of the ``ZEN4`` model: Agner Fog, "Instruction tables" (AMD Zen 4): VFMADD*PS/PD 4 cycles, VMULPS 3,
VADDPS 3, each with reciprocal throughput 0.5 on two pipes (FMA/MUL on FP0/FP1, ADD on FP2/FP3; the same split
in Agner Fog's "The microarchitecture of Intel, AMD and VIA CPUs", Zen 4 chapter); simple integer ALU ops 1 cycle
on 4 ALUs; 6 macro-ops dispatched per cycle. Memory is simplified: a vector load hitting L1 about 7 cycles
(4 for integer), 2 vector loads and 1 store per cycle (approximate; AMD's Zen 4 software optimisation guide has
the exact port rules). ``TOY`` is a smaller round-number machine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .._inputs import is_int


@dataclass(frozen=True)
class Op:
    dst: str | None
    kind: str
    srcs: tuple[str, ...] = ()
    mem: str | None = None  # load: the location read; store: the location written (value in srcs[0])

    def __str__(self) -> str:
        rhs = " ".join([self.kind, *self.srcs] + ([f"[{self.mem}]"] if self.mem is not None else []))
        return f"{self.dst} = {rhs}" if self.dst is not None else rhs


@dataclass(frozen=True)
class Machine:
    name: str
    issue_width: int
    units: dict[str, int]  # unit -> how many (each pipelined: one new op per cycle)
    ops: dict[str, tuple[str, int]]  # op kind -> (unit, latency in cycles)

    def __post_init__(self) -> None:
        if not isinstance(self.issue_width, int) or self.issue_width < 1:
            raise ValueError(f"issue_width: expected a positive int, got {self.issue_width!r}")
        for u, n in self.units.items():
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"units[{u!r}]: expected a positive int, got {n!r}")
        for kind, (u, lat) in self.ops.items():
            if u not in self.units or not isinstance(lat, int) or lat < 1:
                raise ValueError(
                    f"ops[{kind!r}]: expected (a unit of {list(self.units)}, latency >= 1), got {(u, lat)}"
                )

    def unit(self, kind: str) -> str:
        return self._entry(kind)[0]

    def latency(self, kind: str) -> int:
        return self._entry(kind)[1]

    def _entry(self, kind: str) -> tuple[str, int]:
        if kind not in self.ops:
            raise ValueError(f"kind: {kind!r} is not an op of machine {self.name!r} (ops: {sorted(self.ops)})")
        return self.ops[kind]


ZEN4 = Machine(
    "zen4",
    6,
    {"fp01": 2, "fp23": 2, "alu": 4, "load": 2, "store": 1},
    {"fma": ("fp01", 4), "mul": ("fp01", 3), "add": ("fp23", 3), "iadd": ("alu", 1), "load": ("load", 7),
     "store": ("store", 1)},
)  # fmt: skip
TOY = Machine(  # the shape of Q281's machine: ALU / FMA / MEM, 2 FMA ports and 1 load/store port
    "toy",
    4,
    {"alu": 2, "fma": 2, "mem": 1},
    {"iadd": ("alu", 1), "fma": ("fma", 4), "mul": ("fma", 4), "add": ("fma", 4), "load": ("mem", 4),
     "store": ("mem", 1)},
)  # fmt: skip


def ample(machine: Machine) -> Machine:
    """The same latencies with unlimited issue width and units (then list scheduling = ASAP = optimal)."""
    big = 1 << 30
    return Machine(machine.name + "-ample", big, dict.fromkeys(machine.units, big), dict(machine.ops))


@dataclass
class Dag:
    ops: list[Op]
    edges: list[tuple[int, int, int, str]]  # (from, to, latency, "RAW" | "WAR" | "WAW")
    latency: list[int]
    unit: list[str]

    def preds(self) -> list[list[tuple[int, int]]]:
        out: list[list[tuple[int, int]]] = [[] for _ in self.ops]
        for u, v, lat, _ in self.edges:
            out[v].append((u, lat))
        return out

    def heights(self) -> list[int]:
        """Longest latency-weighted path from each op to the end of the block (its own latency included)."""
        h = list(self.latency)
        succ: list[list[tuple[int, int]]] = [[] for _ in self.ops]
        for u, v, lat, _ in self.edges:
            succ[u].append((v, lat))
        for u in reversed(range(len(self.ops))):  # edges go forward in program order
            for v, lat in succ[u]:
                h[u] = max(h[u], lat + h[v])
        return h


def build_dag(block: Sequence[Op], machine: Machine) -> Dag:
    """RAW/WAR/WAW edges between registers and between equal memory locations (to the nearest conflicting ops)."""
    if not isinstance(machine, Machine):
        raise TypeError(f"machine: expected a Machine, got {type(machine).__name__}")
    ops = list(block)
    for n, op in enumerate(ops):
        if not isinstance(op, Op):
            raise TypeError(f"block[{n}]: expected an Op, got {type(op).__name__}")
        if op.kind in ("load", "store") and op.mem is None:
            raise ValueError(f"block[{n}]: {op.kind} needs a memory location mem=..., got {op}")
    latency = [machine.latency(op.kind) for op in ops]
    edges: dict[tuple[int, int], tuple[int, str]] = {}

    def edge(u: int, v: int, kind: str) -> None:
        lat = {"RAW": latency[u], "WAR": 0, "WAW": max(1, latency[u] - latency[v] + 1)}[kind]
        if (u, v) not in edges or edges[(u, v)][0] < lat:
            edges[(u, v)] = (lat, kind)

    writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for v, op in enumerate(ops):
        reads = [("r", s) for s in op.srcs] + ([("m", op.mem)] if op.kind == "load" else [])
        writes = ([("r", op.dst)] if op.dst is not None else []) + ([("m", op.mem)] if op.kind == "store" else [])
        for name in map(str, reads):
            if name in writer:
                edge(writer[name], v, "RAW")
        for name in map(str, writes):
            if name in writer:
                edge(writer[name], v, "WAW")
            for u in readers.get(name, []):
                if u != v:
                    edge(u, v, "WAR")
        for name in map(str, reads):
            readers.setdefault(name, []).append(v)
        for name in map(str, writes):
            writer[name], readers[name] = v, []
    flat = [(u, v, lat, kind) for (u, v), (lat, kind) in sorted(edges.items())]
    return Dag(ops, flat, latency, [machine.unit(op.kind) for op in ops])


@dataclass
class Schedule:
    dag: Dag
    machine: Machine
    start: list[int]  # issue cycle of each op

    @property
    def makespan(self) -> int:
        return max((s + lat for s, lat in zip(self.start, self.dag.latency)), default=0)

    def by_cycle(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, s in sorted(enumerate(self.start), key=lambda t: (t[1], t[0])):
            out.setdefault(s, []).append(i)
        return out

    def table(self, limit: int = 40) -> str:
        rows = [f"{c:>4}: " + " | ".join(str(self.dag.ops[i]) for i in ops) for c, ops in self.by_cycle().items()]
        more = [f"  ... {len(rows) - limit} more issue cycles"] if len(rows) > limit else []
        return "\n".join(rows[:limit] + more + [f"makespan {self.makespan} cycles"])


def lower_bounds(dag: Dag, machine: Machine) -> dict[str, int]:
    """Critical path, resource (per unit) and issue-width lower bounds on the makespan."""
    if not dag.ops:
        return {"critical_path": 0, "resource": 0, "issue": 0}
    resource = 0
    for u, count in machine.units.items():
        lats = [lat for lat, unit in zip(dag.latency, dag.unit) if unit == u]
        if lats:
            resource = max(resource, math.ceil(len(lats) / count) - 1 + min(lats))
    issue = math.ceil(len(dag.ops) / machine.issue_width) - 1 + min(dag.latency)
    return {"critical_path": max(dag.heights()), "resource": resource, "issue": issue}


def list_schedule(block: Sequence[Op] | Dag, machine: Machine) -> Schedule:
    """Cycle-by-cycle list scheduling, highest ``Dag.heights`` first (ties: program order).

    An op is a candidate once all its predecessors issued; it is ready at cycle max(issue(u) + latency(u -> v)).
    A latency-0 edge (WAR) lets an op issue in the same cycle as its predecessor, so a cycle is filled in rounds."""
    dag = block if isinstance(block, Dag) else build_dag(block, machine)
    height = dag.heights()
    succ: list[list[tuple[int, int]]] = [[] for _ in dag.ops]
    remaining = [0] * len(dag.ops)
    for u, v, lat, _ in dag.edges:
        succ[u].append((v, lat))
        remaining[v] += 1
    earliest = [0] * len(dag.ops)
    start = [-1] * len(dag.ops)
    candidates = {v for v in range(len(dag.ops)) if remaining[v] == 0}
    cycle = 0
    while candidates:
        cycle = max(cycle, min(earliest[v] for v in candidates))  # skip cycles where nothing can issue
        slots, free = machine.issue_width, dict(machine.units)
        issued = True
        while issued and slots:
            issued = False
            for v in sorted((v for v in candidates if earliest[v] <= cycle), key=lambda v: (-height[v], v)):
                if slots and free[dag.unit[v]]:
                    start[v], slots, issued = cycle, slots - 1, True
                    free[dag.unit[v]] -= 1
                    candidates.discard(v)
                    for w, lat in succ[v]:
                        earliest[w] = max(earliest[w], cycle + lat)
                        remaining[w] -= 1
                        if remaining[w] == 0:
                            candidates.add(w)
        cycle += 1
    return Schedule(dag, machine, start)


def in_order_schedule(block: Sequence[Op] | Dag, machine: Machine) -> Schedule:
    """The source order issued in order (never before the op above it), stalling for latencies and units."""
    dag = block if isinstance(block, Dag) else build_dag(block, machine)
    preds = dag.preds()
    start: list[int] = []
    used: dict[int, dict[str, int]] = {}
    t = 0
    for v in range(len(dag.ops)):
        t = max([t] + [start[u] + lat for u, lat in preds[v]])
        while True:
            busy = used.setdefault(t, {})
            if busy.get("issue", 0) < machine.issue_width and busy.get(dag.unit[v], 0) < machine.units[dag.unit[v]]:
                break
            t += 1
        busy["issue"] = busy.get("issue", 0) + 1
        busy[dag.unit[v]] = busy.get(dag.unit[v], 0) + 1
        start.append(t)
    return Schedule(dag, machine, start)


def check_schedule(schedule: Schedule) -> list[str]:
    """Every violated dependence latency, issue width or unit count (an empty list: the schedule is valid)."""
    dag, m, start = schedule.dag, schedule.machine, schedule.start
    bad = []
    if len(start) != len(dag.ops) or any(not isinstance(s, int) or s < 0 for s in start):
        return [f"start: expected one cycle >= 0 per op ({len(dag.ops)}), got {start}"]
    for u, v, lat, kind in dag.edges:
        if start[v] < start[u] + lat:
            bad.append(f"{kind} {dag.ops[u]} -> {dag.ops[v]}: issued at {start[u]} and {start[v]}, latency {lat}")
    for c, ops in schedule.by_cycle().items():
        if len(ops) > m.issue_width:
            bad.append(f"cycle {c}: {len(ops)} ops issued, issue width {m.issue_width}")
        for unit, count in m.units.items():
            n = sum(dag.unit[i] == unit for i in ops)
            if n > count:
                bad.append(f"cycle {c}: {n} ops on unit {unit!r}, which has {count}")
    return bad


def dot_product(n: int, accumulators: int = 1, loads: bool = True, interleaved: bool = True) -> list[Op]:
    """sum(x[i] * y[i]) with ``accumulators`` partial sums (acc_j takes i = j mod a), then a tree of adds.

    ``loads=False``: x_i, y_i are already in registers (as in a GEMM micro-kernel); ``interleaved=False`` writes
    the chains one after the other (what an in-order core would run badly)."""
    if not is_int(n) or n < 1:
        raise ValueError(f"n: expected a positive int, got {n!r}")
    if not is_int(accumulators) or not 1 <= accumulators <= n:
        raise ValueError(f"accumulators: expected an int in [1, n={n}], got {accumulators!r}")
    n, accumulators = int(n), int(accumulators)
    order = range(n) if interleaved else sorted(range(n), key=lambda i: (i % accumulators, i))
    ops: list[Op] = []
    for i in order:
        j = i % accumulators
        if loads:
            ops += [Op(f"x{i}", "load", mem=f"x[{i}]"), Op(f"y{i}", "load", mem=f"y[{i}]")]
        first = i < accumulators
        ops.append(Op(f"acc{j}", "mul" if first else "fma", (f"x{i}", f"y{i}") + (() if first else (f"acc{j}",))))
    live = [f"acc{j}" for j in range(accumulators)]
    while len(live) > 1:
        nxt = []
        for a, b in zip(live[::2], live[1::2]):
            ops.append(Op(a, "add", (a, b)))
            nxt.append(a)
        live = nxt + live[-1:] if len(live) % 2 else nxt
    return ops


def random_block(seed: int, n_ops: int = 30, n_names: int = 8, machine: Machine = ZEN4) -> list[Op]:
    """Random code reusing ``n_names`` register names and 4 memory locations (RAW, WAR and WAW all occur)."""
    if n_ops < 0 or n_names < 1:
        raise ValueError(f"n_ops, n_names: expected n_ops >= 0 and n_names >= 1, got {n_ops}, {n_names}")
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(n_names)]
    kinds = sorted(machine.ops)
    ops = []
    for _ in range(n_ops):
        kind = rng.choice(kinds)
        if kind == "load":
            ops.append(Op(rng.choice(names), "load", mem=f"m{rng.randrange(4)}"))
        elif kind == "store":
            ops.append(Op(None, "store", (rng.choice(names),), mem=f"m{rng.randrange(4)}"))
        else:
            ops.append(Op(rng.choice(names), kind, tuple(rng.choice(names) for _ in range(2))))
    return ops
