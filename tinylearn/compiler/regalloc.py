"""Register allocation on a tiny three-address IR: liveness, interference, Chaitin-Briggs colouring, linear scan.

The IR (``Instr(dst, op, srcs)``; variables are strings, immediates ints) runs in ``Block``s of a ``Program``:

    x = arg i        the i-th argument          x = const v     an immediate
    x = add a b      also sub, mul, lt (1/0)    x = copy a      a move
    x = load s       x = stack slot s           store a s       stack slot s = a   (spill code)
    bnz c            last in a block: go to succs[0] if c != 0 else succs[1]; a block without bnz falls to succs[0]
    ret a b ...      end the program, returning the values of a, b, ...

Liveness (backward dataflow):  live_out(B) = U live_in(S) over successors S,  live_in(B) = use(B) U (live_out(B) -
def(B)), iterated over the blocks in reverse until nothing changes (a loop needs a second pass: the back edge
carries the header's live-in into the loop body, visited before the header; a third pass confirms).
Per instruction: live_in(i) = uses(i) U (live_out(i) - defs(i)).

Interference: the variable an instruction defines interferes with every other variable live out of it (Chaitin's
rule; for ``d = copy s`` not with s: both hold the same value and may share a register). Two interfering values
need different registers, so allocating k registers = k-colouring this graph.

    bounds        m values live at one point need m registers (unless some are copies of one value), so
                  registers >= max-live (a value counted at its definition even when dead); also >= the max
                  clique. On straight-line SSA code without copies the graph is an interval graph: clique =
                  max-live, and it is chordal (every induced subgraph has a node whose neighbours form a clique,
                  so of degree < max-live), so simplify never gets stuck and Chaitin colours it with exactly
                  max-live registers (true of SSA code in general: Hack, Grund & Goos 2006). Reused names can
                  need more: live ranges a-b, b-c, c-a overlapping pairwise at different points are a triangle
                  (3 registers) with max-live 2; renaming the second a (SSA) brings it back to 2.

Chaitin-Briggs: *simplify* removes a node with degree < k (it can always be coloured later) and pushes it; when
none is left, *optimistically* push the spill candidate with the lowest cost = (uses + defs) / degree (cheap to
reload, frees many neighbours); *select* pops and gives each node the lowest colour its coloured neighbours leave.
A candidate that finds no colour is spilled for real: every def of it becomes ``t = ...; store t slot`` and every
use ``t = load slot; ... t ...`` with fresh short-lived temporaries (never spilled again), then everything reruns.

Linear scan (Poletto & Sarkar 1999): number the points (use of instruction i = 2i, def = 2i + 1), give each
variable the interval [first, last] point it is live; walk the intervals by start, free the ones that ended, and
when all k registers are busy spill the interval that ends last. Faster (no graph) but it treats a live range with
holes as one interval, so it may need more spills than colouring.

``run(program, args, registers=k)`` interprets the code; with ``registers`` every variable must be one of
r0..r{k-1}, so the allocated program provably fits in k registers and must return what the original returns.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._inputs import is_int

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "lt": lambda a, b: int(a < b),
}
OPS = ("arg", "const", "copy", "load", "store", "bnz", "ret", *BINARY)
_SPILL = "%"  # spill temporaries are named "%<var>.<n>"; they are never spilled again


@dataclass(frozen=True)
class Instr:
    dst: str | None
    op: str
    srcs: tuple[str | int, ...] = ()

    def uses(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for s in self.srcs if isinstance(s, str)))

    def __str__(self) -> str:
        rhs = " ".join([self.op, *map(str, self.srcs)])
        return f"{self.dst} = {rhs}" if self.dst is not None else rhs


@dataclass(frozen=True)
class Block:
    label: str
    instrs: tuple[Instr, ...]
    succs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Program:
    blocks: tuple[Block, ...]

    def instrs(self) -> list[Instr]:
        """All instructions, block after block (the numbering ``liveness`` and linear scan use)."""
        return [ins for b in self.blocks for ins in b.instrs]

    def variables(self) -> list[str]:
        seen: dict[str, None] = {}
        for ins in self.instrs():
            for v in ((ins.dst,) if ins.dst is not None else ()) + ins.uses():
                seen.setdefault(v)
        return list(seen)

    def __str__(self) -> str:
        lines = []
        for b in self.blocks:
            lines.append(f"{b.label}:" + (f"  -> {', '.join(b.succs)}" if b.succs else ""))
            lines += [f"    {ins}" for ins in b.instrs]
        return "\n".join(lines)


def _check_program(program: Program) -> Program:
    if isinstance(program, (list, tuple)):
        program = straight_line(program)
    if not isinstance(program, Program):
        raise TypeError(f"program: expected a Program or a list of Instr, got {type(program).__name__}")
    labels = [b.label for b in program.blocks]
    if not labels or len(set(labels)) != len(labels):
        raise ValueError(f"program: blocks need distinct labels and at least one block, got {labels}")
    for b in program.blocks:
        for s in b.succs:
            if s not in labels:
                raise ValueError(f"program: block {b.label!r} jumps to unknown label {s!r}")
        for n, ins in enumerate(b.instrs):
            if not isinstance(ins, Instr) or ins.op not in OPS:
                raise ValueError(f"program: block {b.label!r} instruction {n}: unknown {ins!r} (ops: {OPS})")
            if ins.op == "bnz" and (n != len(b.instrs) - 1 or len(b.succs) != 2):
                raise ValueError(f"program: bnz must end block {b.label!r} and that block needs 2 successors")
            if (ins.dst is None) != (ins.op in ("store", "bnz", "ret")):
                raise ValueError(f"program: {ins} needs {'no' if ins.dst is None else 'a'} destination")
    return program


def straight_line(instrs: Sequence[Instr]) -> Program:
    """A one-block program (straight-line code)."""
    return Program((Block("entry", tuple(instrs)),))


@dataclass
class Liveness:
    live_in: list[frozenset[str]]  # per instruction, numbered as Program.instrs()
    live_out: list[frozenset[str]]
    defs: list[frozenset[str]]
    rounds: int  # passes over the blocks until the fixed point (the last one changes nothing)

    def max_live(self) -> int:
        """The most values live at one point, a value counted at its definition even when it is dead."""
        sizes = [len(a) for a in self.live_in] + [len(a | d) for a, d in zip(self.live_out, self.defs)]
        return max(sizes + [0])


def liveness(program: Program | Sequence[Instr]) -> Liveness:
    """Live-in / live-out sets of every instruction, by backward dataflow iterated to a fixed point."""
    program = _check_program(program)
    index = {b.label: n for n, b in enumerate(program.blocks)}
    block_in: list[frozenset[str]] = [frozenset()] * len(program.blocks)
    rounds, changed = 0, True
    while changed:
        changed, rounds = False, rounds + 1
        for n in reversed(range(len(program.blocks))):
            b = program.blocks[n]
            if b.instrs and b.instrs[-1].op == "ret":
                live: set[str] = set()
            else:
                live = set().union(*(block_in[index[s]] for s in b.succs))
            for ins in reversed(b.instrs):
                live = (live - {ins.dst}) | set(ins.uses())
            if frozenset(live) != block_in[n]:
                block_in[n], changed = frozenset(live), True
    live_in: list[frozenset[str]] = []
    live_out: list[frozenset[str]] = []
    for b in program.blocks:
        live = set() if b.instrs and b.instrs[-1].op == "ret" else set().union(*(block_in[index[s]] for s in b.succs))
        outs, ins_ = [], []
        for ins in reversed(b.instrs):
            outs.append(frozenset(live))
            live = (live - {ins.dst}) | set(ins.uses())
            ins_.append(frozenset(live))
        live_in += ins_[::-1]
        live_out += outs[::-1]
    defs = [frozenset({ins.dst} - {None}) for ins in program.instrs()]
    return Liveness(live_in, live_out, defs, rounds)


def interference_graph(program: Program | Sequence[Instr]) -> dict[str, set[str]]:
    """Adjacency sets: a defined variable interferes with everything else live out of its definition."""
    program = _check_program(program)
    lv = liveness(program)
    graph: dict[str, set[str]] = {v: set() for v in program.variables()}
    for ins, out in zip(program.instrs(), lv.live_out):
        if ins.dst is None:
            continue
        for v in out - {ins.dst} - (set(ins.uses()) if ins.op == "copy" else set()):
            graph[ins.dst].add(v)
            graph[v].add(ins.dst)
    return graph


def color_graph(graph: dict[str, set[str]], k: int, cost: dict[str, float]) -> tuple[dict[str, int], list[str]]:
    """Chaitin-Briggs simplify/select with optimistic colouring: (colour of each node, nodes spilled for real)."""
    k = _check_k(k)
    degree = {v: len(n) for v, n in graph.items()}
    left, stack = set(graph), []
    while left:
        easy = [v for v in left if degree[v] < k]
        if easy:
            v = min(easy)
        else:  # optimistic: push the cheapest spill candidate, it may still find a colour in select
            spillable = [v for v in left if cost.get(v, 1.0) != float("inf")]
            if not spillable:
                raise RuntimeError(f"k={k}: only unspillable spill temporaries are left, {sorted(left)}")
            v = min(spillable, key=lambda u: (cost.get(u, 1.0) / max(degree[u], 1), u))
        stack.append(v)
        left.remove(v)
        for u in graph[v]:
            degree[u] -= 1
    colour: dict[str, int] = {}
    spilled = []
    for v in reversed(stack):
        taken = {colour[u] for u in graph[v] if u in colour}
        free = [c for c in range(k) if c not in taken]
        if free:
            colour[v] = free[0]
        else:
            spilled.append(v)
    return colour, spilled


def spill_costs(program: Program) -> dict[str, float]:
    """uses + defs of each variable; spill temporaries cost infinity (spilling them cannot help)."""
    cost: dict[str, float] = {}
    for ins in program.instrs():
        for v in ((ins.dst,) if ins.dst is not None else ()) + ins.uses():
            cost[v] = float("inf") if v.startswith(_SPILL) else cost.get(v, 0.0) + 1.0
    return cost


def spill(program: Program, victims: Sequence[str], slots: dict[str, int]) -> Program:
    """Rewrite ``program`` so each victim lives in a stack slot: store after every def, load before every use."""
    counter = [0]

    def fresh(v: str) -> str:
        counter[0] += 1
        return f"{_SPILL}{v}.{counter[0]}"

    for v in victims:
        slots.setdefault(v, len(slots))
    blocks = []
    for b in program.blocks:
        out: list[Instr] = []
        for ins in b.instrs:
            rename = {v: fresh(v) for v in ins.uses() if v in slots}
            out += [Instr(t, "load", (slots[v],)) for v, t in rename.items()]
            srcs = tuple(rename.get(s, s) if isinstance(s, str) else s for s in ins.srcs)
            if ins.dst in slots:
                t = fresh(ins.dst)
                out += [Instr(t, ins.op, srcs), Instr(None, "store", (t, slots[ins.dst]))]
            else:
                out.append(Instr(ins.dst, ins.op, srcs))
        blocks.append(Block(b.label, tuple(out), b.succs))
    return Program(tuple(blocks))


@dataclass
class Allocation:
    method: str
    k: int
    program: Program  # the code on physical registers r0..r{k-1}
    assignment: dict[str, int]  # variable of the (spill-rewritten) virtual program -> register number
    spilled: list[str] = field(default_factory=list)
    loads: int = 0
    stores: int = 0
    rounds: int = 1

    @property
    def registers_used(self) -> int:
        return len(set(self.assignment.values()))

    def summary(self) -> str:
        return (
            f"{self.method}: k={self.k}, registers used {self.registers_used}, spilled {len(self.spilled)} "
            f"{self.spilled}, loads {self.loads}, stores {self.stores}, rounds {self.rounds}"
        )


def _check_k(k: int, name: str = "k") -> int:
    if not is_int(k) or k < 1:
        raise ValueError(f"{name}: expected a positive int number of registers, got {k!r}")
    k = int(k)
    return k


def _check_fits(program: Program, k: int) -> None:
    need = max([len(ins.uses()) for ins in program.instrs()] + [1])
    if k < need:
        raise ValueError(f"k={k}: an instruction reads {need} registers at once, so k must be at least {need}")


def _finish(
    method: str, k: int, virtual: Program, colour: dict[str, int], slots: dict[str, int], rounds: int
) -> Allocation:
    def reg(v: str | int) -> str | int:
        return f"r{colour[v]}" if isinstance(v, str) else v

    blocks = []
    for b in virtual.blocks:
        code = []
        for ins in b.instrs:
            new = Instr(None if ins.dst is None else reg(ins.dst), ins.op, tuple(reg(s) for s in ins.srcs))
            if not (new.op == "copy" and new.dst == new.srcs[0]):  # a move onto itself disappears (coalesced)
                code.append(new)
        blocks.append(Block(b.label, tuple(code), b.succs))
    ops = [ins.op for ins in virtual.instrs()]
    return Allocation(
        method, k, Program(tuple(blocks)), colour, list(slots), ops.count("load"), ops.count("store"), rounds
    )


def chaitin_briggs(program: Program | Sequence[Instr], k: int, max_rounds: int = 20) -> Allocation:
    """Colour with k registers; spill, rewrite and retry until the graph colours."""
    program, k = _check_program(program), _check_k(k)
    _check_fits(program, k)
    slots: dict[str, int] = {}
    for rounds in range(1, max_rounds + 1):
        colour, spilled = color_graph(interference_graph(program), k, spill_costs(program))
        if not spilled:
            return _finish("chaitin-briggs", k, program, colour, slots, rounds)
        program = spill(program, spilled, slots)
    raise RuntimeError(f"chaitin_briggs: still spilling after max_rounds={max_rounds}")


def live_intervals(program: Program | Sequence[Instr]) -> dict[str, tuple[int, int]]:
    """[first, last] point each variable is live at (use of instruction i = 2i, its def = 2i + 1)."""
    program = _check_program(program)
    lv = liveness(program)
    points: dict[str, list[int]] = {}
    for i, ins in enumerate(program.instrs()):
        for v in lv.live_in[i]:
            points.setdefault(v, []).append(2 * i)
        for v in lv.live_out[i] | ({ins.dst} if ins.dst is not None else set()):
            points.setdefault(v, []).append(2 * i + 1)
    return {v: (min(p), max(p)) for v, p in points.items()}


def linear_scan(program: Program | Sequence[Instr], k: int, max_rounds: int = 20) -> Allocation:
    """Poletto-Sarkar linear scan: spill the interval that ends last when all k registers are busy."""
    program, k = _check_program(program), _check_k(k)
    _check_fits(program, k)
    slots: dict[str, int] = {}
    for rounds in range(1, max_rounds + 1):
        intervals = live_intervals(program)
        colour: dict[str, int] = {}
        active: list[str] = []
        spilled: list[str] = []
        for v in sorted(intervals, key=lambda u: (intervals[u][0], u)):
            start, end = intervals[v]
            active = [u for u in active if intervals[u][1] >= start]
            if len(active) < k:
                colour[v] = min(set(range(k)) - {colour[u] for u in active})
                active.append(v)
                continue
            candidates = [u for u in [*active, v] if not u.startswith(_SPILL)]
            if not candidates:
                raise RuntimeError(f"k={k}: only spill temporaries are live at point {start}")
            victim = max(candidates, key=lambda u: (intervals[u][1], u))
            spilled.append(victim)
            if victim != v:
                colour[v] = colour.pop(victim)
                active = [u for u in active if u != victim] + [v]
        if not spilled:
            return _finish("linear-scan", k, program, colour, slots, rounds)
        program = spill(program, spilled, slots)
    raise RuntimeError(f"linear_scan: still spilling after max_rounds={max_rounds}")


def run(program: Program | Sequence[Instr], args: Sequence[int] = (), registers: int | None = None,
        max_steps: int = 100_000) -> tuple[int, ...]:  # fmt: skip
    """Interpret; with ``registers`` only r0..r{registers-1} exist. Returns the values ``ret`` returns."""
    program = _check_program(program)
    if registers is not None:
        _check_k(registers, "registers")
    env: dict[str, int] = {}
    memory: dict[int, int] = {}
    index = {b.label: b for b in program.blocks}
    block, steps = program.blocks[0], 0

    def read(v: str) -> int:
        if v not in env:
            raise ValueError(f"program: reads {v!r} before any definition")
        return env[v]

    def write(v: str, value: int) -> None:
        if registers is not None and not (v[:1] == "r" and v[1:].isdigit() and int(v[1:]) < registers):
            raise ValueError(f"program: writes {v!r}, not one of the {registers} registers r0..r{registers - 1}")
        env[v] = value

    while True:
        for ins in block.instrs:
            steps += 1
            if steps > max_steps:
                raise RuntimeError(f"run: more than max_steps={max_steps} instructions")
            op, s = ins.op, ins.srcs
            if op == "ret":
                return tuple(read(v) for v in s)
            if op == "bnz":
                block = index[block.succs[0] if read(s[0]) != 0 else block.succs[1]]
                break
            if op == "store":
                memory[s[1]] = read(s[0])
                continue
            if op == "arg":
                if not 0 <= s[0] < len(args):
                    raise ValueError(f"args: the program reads argument {s[0]}, got {len(args)} arguments")
                value = int(args[s[0]])
            elif op == "const":
                value = int(s[0])
            elif op == "load":
                value = memory[s[0]]
            elif op == "copy":
                value = read(s[0])
            else:
                value = BINARY[op](read(s[0]), read(s[1]))
            write(ins.dst, value)
        else:
            if not block.succs:
                raise ValueError(f"program: block {block.label!r} ends without ret or successor")
            block = index[block.succs[0]]


def sum_of_squares_loop() -> Program:
    """s = sum(i * i for i < n) as a while loop; the back edge body -> head makes liveness take a second pass."""
    entry = (Instr("n", "arg", (0,)), Instr("i", "const", (0,)), Instr("s", "const", (0,)), Instr("one", "const", (1,)))
    head = (Instr("c", "lt", ("i", "n")), Instr(None, "bnz", ("c",)))
    body = (Instr("t", "mul", ("i", "i")), Instr("s", "add", ("s", "t")), Instr("i", "add", ("i", "one")))
    return Program(
        (
            Block("entry", entry, ("head",)),
            Block("head", head, ("body", "exit")),
            Block("body", body, ("head",)),
            Block("exit", (Instr(None, "ret", ("s",)),)),
        )
    )


def random_program(seed: int, length: int = 20, n_args: int = 3, ssa: bool = True, n_ret: int = 2) -> Program:
    """Random straight-line code over add/sub/mul (SSA: each name defined once; else names are reused)."""
    if length < 1 or n_args < 1 or n_ret < 1:
        raise ValueError(f"length, n_args, n_ret: expected positive ints, got {length}, {n_args}, {n_ret}")
    rng = random.Random(seed)
    names = [f"a{i}" for i in range(n_args)]
    code = [Instr(v, "arg", (i,)) for i, v in enumerate(names)]
    for n in range(length):
        dst = f"v{n}" if ssa else f"v{rng.randrange(max(2, length // 3))}"
        # mostly recent operands: short live ranges, like real code
        a, b = (names[max(0, len(names) - 1 - int(rng.expovariate(0.3)))] for _ in range(2))
        code.append(Instr(dst, rng.choice(("add", "sub", "mul")), (a, b)))
        if dst not in names:
            names.append(dst)
    code.append(Instr(None, "ret", tuple(dict.fromkeys(rng.sample(names, min(n_ret, len(names)))))))
    return straight_line(code)
