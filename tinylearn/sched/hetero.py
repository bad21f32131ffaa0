"""Heterogeneous placement of a computation graph on CPU + GPU + NPU models: HEFT, baselines, balancing -- a MODEL.

[Q71, Q115, Q263] The pieces of a heterogeneous graph scheduler, each small enough to read:

    performance model   an op has a kind ("gemm", "attention", "conv", "elementwise", "control"), FLOPs and bytes
                        moved; a device is a ``DeviceSpec`` (roofline peak and bandwidth) plus a per-kind efficiency
                        table and a per-kind fixed overhead (launch/sync). time(op, d) = overhead[kind] +
                        max(flops / (peak * eff[kind]), bytes / bw). Links between devices: latency + bytes / GB/s.
    graph analysis      a DAG of ops (``gpt_graph`` builds one from a TinyGPT ``GPTConfig``'s real layer shapes:
                        per layer LN, QKV GEMM, attention, output GEMM, residual, LN, MLP GEMMs, GELU; plus embedding
                        lookup, LM head and a sampling "control" op); topological order and upward ranks.
    placement           HEFT (Topcuoglu, Hariri & Wu, IEEE TPDS 2002): rank_u(op) = mean time + max over successors
                        (mean comm + rank_u); ops in decreasing rank, each on the device giving its earliest finish
                        time including the transfers of its inputs (no insertion into idle gaps). Baselines: one
                        device for everything, and greedy-by-op (each op on its fastest device, transfers ignored
                        when choosing, paid when run), and ``dp_partition``: the exact minimum-latency placement when
                        ops run one at a time (DP over the topological order, state = devices of the live tensors).
    load balancing      ``heft(..., ready_s=...)`` starts each device at its measured backlog (queue length x mean
                        service time), so re-running placement as queues change moves work off busy devices.

The default platform (``default_platform()``) is stated, not measured: CPU = a 32-core server part (2 TFLOPS FP32
with AVX-512, 200 GB/s DDR5, 250 W), GPU = the A100 model of ``device_model.py`` (FP16 tensor peak), NPU = an
inference ASIC (200 TFLOPS FP16, 800 GB/s, 150 W) that is good at attention/conv and poor at control flow; PCIe Gen4
x16 links (~25 GB/s, 10 us). The efficiency tables are assumptions in the spirit of published per-op utilisation
(GEMMs near peak, attention and small ops far below). Everything here is a MODEL.

Energy of an op = time x active power ``spec.power_w(f_max, 1)`` (device_model's P = idle + (tdp - idle) u (f/f_max)^3).
The composite cost and annealing [Q140] and the latency-bounded energy DP [Q234] are in ``hetero_cost.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..inference.config import GPTConfig
from .device_model import A100, DeviceSpec

KINDS = ("gemm", "attention", "conv", "elementwise", "control")


@dataclass(frozen=True)
class Op:
    """One node of the computation graph: FLOPs, bytes moved (reads + writes), output bytes (what a consumer on
    another device must receive) and the names of the ops it depends on."""

    name: str
    kind: str
    flops: float
    nbytes: float
    out_bytes: float
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Device:
    """A device model: its roofline spec, per-kind efficiency (fraction of peak FLOPs) and per-kind fixed overhead."""

    name: str
    spec: DeviceSpec
    eff: Mapping[str, float]
    overhead_s: Mapping[str, float]
    fail_per_hour: float = 1e-4  # MODEL: failure rate, the reliability term of hetero_cost's composite cost

    def compute_s(self, op: Op) -> float:
        return op.flops / (self.spec.peak_tflops * 1e12 * self.eff[op.kind])

    def memory_s(self, op: Op) -> float:
        return op.nbytes / (self.spec.mem_bw_gbs * 1e9)

    def time_s(self, op: Op) -> float:
        """MODEL: overhead + roofline time of ``op`` on this device."""
        return self.overhead_s[op.kind] + max(self.compute_s(op), self.memory_s(op))

    def active_w(self) -> float:
        return self.spec.power_w(self.spec.f_max_mhz, 1.0)


@dataclass(frozen=True)
class Platform:
    """Devices and the links between them (a pair not listed uses ``default_link``: (latency_s, GB/s))."""

    devices: tuple[Device, ...]
    links: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    default_link: tuple[float, float] = (10e-6, 25.0)

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise ValueError(f"device: {name!r} is not one of {[d.name for d in self.devices]}")

    def comm_s(self, nbytes: float, a: str, b: str) -> float:
        """MODEL: seconds to move ``nbytes`` from device ``a`` to ``b`` (0 on the same device)."""
        if a == b or nbytes <= 0:
            return 0.0
        lat, gbs = self.links.get((a, b), self.links.get((b, a), self.default_link))
        return lat + nbytes / (gbs * 1e9)


def default_platform() -> Platform:
    """The stated CPU + GPU + NPU platform of the module docstring (MODEL)."""
    cpu = DeviceSpec("CPU-32c", peak_tflops=2.0, mem_bw_gbs=200.0, mem_gb=256.0, tdp_w=250.0, idle_w=60.0,
                     f_max_mhz=3000.0, f_min_mhz=1200.0, source="assumed server CPU (AVX-512 FP32, DDR5)")  # fmt: skip
    npu = DeviceSpec("NPU", peak_tflops=200.0, mem_bw_gbs=800.0, mem_gb=32.0, tdp_w=150.0, idle_w=20.0,
                     f_max_mhz=1000.0, f_min_mhz=400.0, source="assumed inference ASIC")  # fmt: skip
    us = 1e-6
    return Platform((
        Device("cpu", cpu, {"gemm": 0.6, "attention": 0.3, "conv": 0.4, "elementwise": 0.5, "control": 1.0},
               {"gemm": 2 * us, "attention": 2 * us, "conv": 2 * us, "elementwise": 1 * us, "control": 1 * us}),
        Device("gpu", A100, {"gemm": 0.7, "attention": 0.35, "conv": 0.5, "elementwise": 0.5, "control": 0.01},
               {"gemm": 8 * us, "attention": 10 * us, "conv": 8 * us, "elementwise": 5 * us, "control": 40 * us}),
        Device("npu", npu, {"gemm": 0.5, "attention": 0.8, "conv": 0.85, "elementwise": 0.4, "control": 0.01},
               {"gemm": 10 * us, "attention": 10 * us, "conv": 10 * us, "elementwise": 8 * us, "control": 80 * us}),
    ), links={("cpu", "gpu"): (10 * us, 25.0), ("cpu", "npu"): (10 * us, 25.0),
              ("gpu", "npu"): (10 * us, 25.0)})  # fmt: skip


def gpt_graph(cfg: GPTConfig, batch: int = 8, seq: int = 256, bytes_per: int = 2, streams: int = 1) -> list[Op]:
    """The op DAG of a forward pass of a TinyGPT of shape ``cfg`` on ``batch x seq`` tokens (FLOPs from the layer
    shapes: a (m x k) @ (k x n) GEMM is 2mkn; attention 4 B T^2 d; bytes = inputs + weights + output). ``streams``
    independent requests (micro-batches) give ``streams`` parallel chains, ops prefixed "s0.", "s1.", ..."""
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg: expected a tinylearn.inference GPTConfig, got {type(cfg).__name__}")
    for nm, v in (("batch", batch), ("seq", seq), ("bytes_per", bytes_per), ("streams", streams)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{nm}: expected an int >= 1, got {v!r}")
    if streams > 1:
        out: list[Op] = []
        for j in range(streams):
            for o in gpt_graph(cfg, batch, seq, bytes_per):
                out.append(Op(f"s{j}.{o.name}", o.kind, o.flops, o.nbytes, o.out_bytes,
                              tuple(f"s{j}.{dn}" for dn in o.deps)))  # fmt: skip
        return check_graph(out)
    m, d, b = batch * seq, cfg.d_model, bytes_per
    act = m * d * b

    def gemm(name: str, k: int, n: int, dep: str) -> Op:
        return Op(name, "gemm", 2.0 * m * k * n, b * (m * k + k * n + m * n), m * n * b, (dep,))

    def ew(name: str, deps: tuple[str, ...], width: int = d, kind: str = "elementwise") -> Op:
        return Op(name, kind, 5.0 * m * width, b * m * width * (len(deps) + 1), m * width * b, deps)

    ops = [Op("embed", "elementwise", m * d, act + m * 4, act, ())]
    x = "embed"
    for i in range(cfg.n_layers):
        p = f"L{i}."
        kv = cfg.kv_heads * cfg.head_dim
        ops += [ew(p + "ln1", (x,)), gemm(p + "qkv", d, d + 2 * kv, p + "ln1")]
        ops.append(Op(p + "attn", "attention", 4.0 * batch * seq * seq * d,
                      b * (m * (d + 2 * kv) + m * d), act, (p + "qkv",)))  # fmt: skip
        ops += [gemm(p + "proj", d, d, p + "attn"), ew(p + "res1", (x, p + "proj"))]
        ops += [ew(p + "ln2", (p + "res1",)), gemm(p + "fc1", d, 4 * d, p + "ln2")]
        ops += [ew(p + "gelu", (p + "fc1",), 4 * d), gemm(p + "fc2", 4 * d, d, p + "gelu")]
        ops.append(ew(p + "res2", (p + "res1", p + "fc2")))
        x = p + "res2"
    ops += [ew("lnf", (x,)), gemm("head", d, cfg.vocab_size, "lnf")]
    ops.append(Op("sample", "control", float(batch * cfg.vocab_size * 8), batch * cfg.vocab_size * b, batch * 8,
                  ("head",)))  # fmt: skip
    return check_graph(ops)


def check_graph(ops: Sequence[Op]) -> list[Op]:
    """``ops`` validated (unique names, known kinds, deps present, acyclic) and returned in topological order."""
    by = {}
    for o in ops:
        if not isinstance(o, Op):
            raise TypeError(f"ops: expected Op items, got {type(o).__name__}")
        if o.name in by:
            raise ValueError(f"ops: duplicate op name {o.name!r}")
        if o.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {o.kind!r} (op {o.name!r})")
        if min(o.flops, o.nbytes, o.out_bytes) < 0:
            raise ValueError(f"flops: op {o.name!r} has a negative size ({o.flops}, {o.nbytes}, {o.out_bytes})")
        by[o.name] = o
    for o in ops:
        for dname in o.deps:
            if dname not in by:
                raise ValueError(f"deps: op {o.name!r} depends on unknown op {dname!r}")
    order, state = [], {}

    def visit(n: str) -> None:
        if state.get(n) == 1:
            raise ValueError(f"ops: the graph has a cycle through {n!r}")
        if state.get(n) == 2:
            return
        state[n] = 1
        for dname in by[n].deps:
            visit(dname)
        state[n] = 2
        order.append(by[n])

    for o in ops:
        visit(o.name)
    return order


def upward_ranks(ops: Sequence[Op], platform: Platform) -> dict[str, float]:
    """HEFT's rank_u: mean execution time + max over successors of (mean transfer time + their rank)."""
    succ: dict[str, list[str]] = {o.name: [] for o in ops}
    for o in ops:
        for dname in o.deps:
            succ[dname].append(o.name)
    names = [d.name for d in platform.devices]
    pairs = [(a, b) for a in names for b in names]
    rank: dict[str, float] = {}
    for o in reversed(check_graph(ops)):
        w = sum(dv.time_s(o) for dv in platform.devices) / len(platform.devices)
        c = sum(platform.comm_s(o.out_bytes, a, b) for a, b in pairs) / len(pairs)
        rank[o.name] = w + max((c + rank[s] for s in succ[o.name]), default=0.0)
    return rank


@dataclass
class Schedule:
    """A placed and timed graph (MODEL): device, start and finish of every op, makespan, energy, busy time."""

    placement: dict[str, str]
    start: dict[str, float]
    finish: dict[str, float]
    makespan_s: float
    energy_j: float
    comm_s: float
    busy_s: dict[str, float]

    def gantt(self) -> list[tuple[str, str, float, float]]:
        """(device, op, start, finish) rows sorted by start."""
        return sorted(((self.placement[n], n, self.start[n], self.finish[n]) for n in self.start),
                      key=lambda r: (r[2], r[0]))  # fmt: skip


def _ready(platform: Platform, ready_s: Mapping[str, float] | None) -> dict[str, float]:
    out = {d.name: 0.0 for d in platform.devices}
    for k, v in (ready_s or {}).items():
        if k not in out or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"ready_s: expected device -> seconds >= 0 for {sorted(out)}, got {k!r}: {v!r}")
        out[k] = float(v)
    return out


def evaluate(ops: Sequence[Op], platform: Platform, placement: Mapping[str, str], *,
             ready_s: Mapping[str, float] | None = None, order: Sequence[str] | None = None) -> Schedule:  # fmt: skip
    """Time a fixed ``placement`` (op -> device): ops in ``order`` (default: decreasing upward rank, a valid
    topological order) each start when its device is free and its inputs have arrived."""
    ops = check_graph(ops)
    by = {o.name: o for o in ops}
    if order is None:
        rank = upward_ranks(ops, platform)
        order = sorted(by, key=lambda n: -rank[n])
    avail = _ready(platform, ready_s)
    start, finish, busy = {}, {}, dict.fromkeys(avail, 0.0)
    energy = comm = 0.0
    for n in order:
        o, dn = by[n], placement.get(n)
        if dn not in avail:
            raise ValueError(f"placement: op {n!r} is on {dn!r}, not one of {sorted(avail)}")
        dev = platform.device(dn)
        arrive = 0.0
        for p in o.deps:
            c = platform.comm_s(by[p].out_bytes, placement[p], dn)
            comm += c
            arrive = max(arrive, finish[p] + c)
        t = dev.time_s(o)
        start[n] = max(avail[dn], arrive)
        finish[n] = start[n] + t
        avail[dn] = finish[n]
        busy[dn] += t
        energy += t * dev.active_w()
    return Schedule(dict(placement), start, finish, max(finish.values()), energy, comm, busy)


def heft(ops: Sequence[Op], platform: Platform, *, ready_s: Mapping[str, float] | None = None) -> Schedule:
    """HEFT list scheduling (see the module docstring); ``ready_s``: each device's backlog in seconds."""
    ops = check_graph(ops)
    by = {o.name: o for o in ops}
    rank = upward_ranks(ops, platform)
    order = sorted(by, key=lambda n: -rank[n])
    avail = _ready(platform, ready_s)
    placement: dict[str, str] = {}
    finish: dict[str, float] = {}
    for n in order:
        o, best = by[n], None
        for dev in platform.devices:
            arrive = max((finish[p] + platform.comm_s(by[p].out_bytes, placement[p], dev.name) for p in o.deps),
                         default=0.0)  # fmt: skip
            eft = max(avail[dev.name], arrive) + dev.time_s(o)
            if best is None or eft < best[0] - 1e-15:
                best = (eft, dev.name)
        placement[n] = best[1]  # type: ignore[index]
        finish[n] = best[0]  # type: ignore[index]
        avail[best[1]] = best[0]  # type: ignore[index]
    return evaluate(ops, platform, placement, ready_s=ready_s, order=order)


def all_on(ops: Sequence[Op], platform: Platform, device: str) -> Schedule:
    """Baseline: every op on ``device``."""
    platform.device(device)
    return evaluate(ops, platform, {o.name: device for o in ops})


def greedy(ops: Sequence[Op], platform: Platform) -> Schedule:
    """Baseline: each op on the device that runs it fastest alone (transfers ignored when choosing)."""
    return evaluate(ops, platform, {o.name: min(platform.devices, key=lambda d: d.time_s(o)).name for o in ops})


def sequential_cost(ops: Sequence[Op], platform: Platform, placement: Mapping[str, str]) -> float:
    """Latency of running the ops one at a time: sum of op times + every cross-device transfer."""
    by = {o.name: o for o in ops}
    return sum(platform.device(placement[o.name]).time_s(o) for o in ops) + sum(
        platform.comm_s(by[p].out_bytes, placement[p], placement[o.name]) for o in ops for p in o.deps
    )


def dp_partition(ops: Sequence[Op], platform: Platform, *, max_frontier: int = 6) -> tuple[dict[str, str], float]:
    """Exact minimum of ``sequential_cost`` by dynamic programming over the topological order. The state is the
    device of every op on the *frontier* (done, with a consumer still to come): a transfer cost depends only on
    those, so states with equal frontier placements keep only the cheaper (|devices|^frontier states; a transformer
    chain with residuals has a frontier of 2). A graph whose frontier exceeds ``max_frontier`` -> ValueError."""
    ops = check_graph(ops)
    pos = {o.name: i for i, o in enumerate(ops)}
    last_use = {o.name: max((pos[c.name] for c in ops if o.name in c.deps), default=-1) for o in ops}
    devs = [d.name for d in platform.devices]
    by = {o.name: o for o in ops}
    states: dict[tuple[tuple[str, str], ...], tuple[float, tuple[str, ...]]] = {(): (0.0, ())}
    for i, o in enumerate(ops):
        nxt: dict[tuple[tuple[str, str], ...], tuple[float, tuple[str, ...]]] = {}
        for front, (cost, placed) in states.items():
            where = dict(front)
            for d in devs:
                c = cost + platform.device(d).time_s(o)
                c += sum(platform.comm_s(by[p].out_bytes, where[p], d) for p in o.deps)
                new = tuple((n, v) for n, v in (*front, (o.name, d)) if last_use[n] > i)
                if new not in nxt or c < nxt[new][0]:
                    nxt[new] = (c, (*placed, d))
        states = nxt
        if states and len(next(iter(states))) > max_frontier:
            raise ValueError(f"max_frontier: the graph's frontier exceeds {max_frontier} at op {o.name!r}")
    cost, placed = min(states.values(), key=lambda v: v[0])
    return {o.name: d for o, d in zip(ops, placed, strict=True)}, cost


def backlog_s(queue_len: Mapping[str, int], mean_service_s: Mapping[str, float]) -> dict[str, float]:
    """Dynamic load balancing's input: each device's measured queue length x its mean service time (seconds)."""
    return {k: float(queue_len[k]) * float(mean_service_s.get(k, 0.0)) for k in queue_len}
