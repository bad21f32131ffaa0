"""Event-driven replay of each all-reduce algorithm's message schedule on a network of links.

State: T[r] = the time rank r is free. A schedule is a sequence of steps; a step is a set of messages
(src, dst, bytes, reduce?). A message starts when both ends are free (rendezvous), arrives after
alpha + bytes * beta of its link, and the receiver then spends bytes * gamma reducing it:

    start = max(T[src], T[dst]);  arrive = start + alpha_link + bytes * beta_link
    T'[src] = max(T'[src], arrive);  T'[dst] = max(T'[dst], arrive + reduce * bytes * gamma)

Within a step messages of distinct ranks proceed in parallel (full-duplex ports: a rank may send one and receive
one message at a time); when a rank appears twice in one step its messages go in successive port rounds.
The answer is max_r T[r] after the last step. On uniform links (topology=None) this reproduces
``cost_model.predict`` exactly (same schedules the closed forms were derived from); ``TwoLevel`` links make
intra-node messages cheap and inter-node ones expensive, which is where ``hierarchical`` wins. Steps are numpy-
vectorised over ranks, so a 1024-rank ring (2046 steps) replays in well under a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .collectives import bounds, default_node_size, hierarchical_layout
from .cost_model import ALGORITHMS, check_nonneg, core_share

Step = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # src, dst, bytes, reduce (0/1)


@dataclass(frozen=True)
class TwoLevel:
    """Two-level network: ``node_size`` consecutive ranks share fast intra-node links (NVLink-like), nodes talk
    over slow inter-node links (InfiniBand-like). Defaults: 150 GB/s, 2 us inside; 25 GB/s, 5 us between."""

    node_size: int = 8
    intra_alpha_s: float = 2e-6
    intra_beta_s_per_byte: float = 1 / 150e9
    inter_alpha_s: float = 5e-6
    inter_beta_s_per_byte: float = 1 / 25e9

    def __post_init__(self) -> None:
        if self.node_size < 1:
            raise ValueError(f"node_size: expected >= 1, got {self.node_size}")


_ALIASES = {
    "ranks_per_node": "node_size",
    "gpus_per_node": "node_size",
    "intra_alpha": "intra_alpha_s",
    "intra_beta": "intra_beta_s_per_byte",
    "inter_alpha": "inter_alpha_s",
    "inter_beta": "inter_beta_s_per_byte",
}


def two_level_from_dict(d: dict) -> TwoLevel:
    """TwoLevel from a dict: field names, short aliases (intra_alpha, inter_beta, gpus_per_node ...) or bandwidths
    in bytes/s (intra_bandwidth / inter_bandwidth, converted to beta = 1 / bandwidth)."""
    kw = {}
    for k, v in d.items():
        if k in ("intra_bandwidth", "inter_bandwidth"):
            kw[k.split("_")[0] + "_beta_s_per_byte"] = 1.0 / float(v)
        elif k in _ALIASES or k in TwoLevel.__dataclass_fields__:
            kw[_ALIASES.get(k, k)] = v
        else:
            raise TypeError(f"topology: unknown key {k!r}; expected {sorted(TwoLevel.__dataclass_fields__)}")
    return TwoLevel(**kw)


def _steps_ring(members: np.ndarray, seg_bytes: np.ndarray, mode: str, off: int = 0) -> list[Step]:
    k = len(members)
    if k == 1:
        return []
    pos = np.arange(k)
    n_rs = k - 1 if mode in ("rs", "rsag") else 0
    n_ag = k - 1 if mode in ("ag", "rsag") else 0
    out = []
    for t in range(n_rs + n_ag):
        send_seg = (pos - t + off) % k if t < n_rs else (pos + 1 + off - (t - n_rs)) % k
        red = np.full(k, 1.0 if t < n_rs else 0.0)
        out.append((members, np.roll(members, -1), seg_bytes[send_seg], red))
    return out


def _merge(parallel: list[list[Step]]) -> list[Step]:
    """Run several schedules side by side: step t of the result is step t of each of them."""
    out = []
    for t in range(max((len(s) for s in parallel), default=0)):
        parts = [s[t] for s in parallel if t < len(s)]
        out.append(tuple(np.concatenate([p[i] for p in parts]) for i in range(4)))
    return out


def schedule(algorithm: str, world_size: int, nbytes: float, node_size: int | None = None) -> Iterator[Step]:
    """The message schedule of ``algorithm`` (bytes as floats: n/p exactly, like the closed forms)."""
    p, n = world_size, float(nbytes)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    ranks = np.arange(p)
    if p == 1 or n == 0:
        return
    if algorithm == "ring":
        yield from _steps_ring(ranks, np.full(p, n / p), "rsag")
    elif algorithm == "tree":
        L = int(np.ceil(np.log2(p)))
        for k in range(L):  # reduce: ranks whose lowest set bit is k send to r - 2^k
            src = ranks[(ranks & ((2 << k) - 1)) == (1 << k)]
            yield src, src - (1 << k), np.full(len(src), n), np.ones(len(src))
        for k in range(L - 1, -1, -1):  # broadcast: ranks with low k+1 bits zero send to r + 2^k
            src = ranks[((ranks & ((2 << k) - 1)) == 0) & (ranks + (1 << k) < p)]
            yield src, src + (1 << k), np.full(len(src), n), np.zeros(len(src))
    elif algorithm in ("recursive_doubling", "halving_doubling"):
        p2 = 1 << (p.bit_length() - 1)
        extra = np.arange(p2, p)
        if len(extra):
            yield extra, extra - p2, np.full(len(extra), n), np.ones(len(extra))
        core = np.arange(p2)
        rounds = p2.bit_length() - 1
        if algorithm == "recursive_doubling":
            for k in range(rounds):
                yield core, core ^ (1 << k), np.full(p2, n), np.ones(p2)
        else:
            for i, k in enumerate(range(rounds - 1, -1, -1)):
                yield core, core ^ (1 << k), np.full(p2, n / 2 ** (i + 1)), np.ones(p2)
            for i, k in enumerate(range(rounds)):
                yield core, core ^ (1 << k), np.full(p2, n / 2 ** (rounds - i)), np.zeros(p2)
        if len(extra):
            yield extra - p2, extra, np.full(len(extra), n), np.zeros(len(extra))
    else:
        nodes, k, owner_of = hierarchical_layout(p, node_size or default_node_size(p))
        shard = n / k

        def node_segs(nd: list[int]) -> np.ndarray:  # member i owns a block of shards (several in small nodes)
            return np.array([(b - a) * shard for a, b in bounds(k, len(nd))])

        intra_rs = [_steps_ring(np.array(nd), node_segs(nd), "rs", off=-1) for nd in nodes]
        yield from _merge(intra_rs)
        m = len(nodes)
        inter = [
            _steps_ring(np.array([owner_of[j][c] for j in range(m)]), np.full(m, shard / m), "rsag") for c in range(k)
        ]
        yield from _merge(inter)
        yield from _merge([_steps_ring(np.array(nd), node_segs(nd), "ag", off=-1) for nd in nodes])


def _port_rounds(src: np.ndarray, dst: np.ndarray) -> list[np.ndarray]:
    """Split one step into rounds in which every rank sends at most once and receives at most once."""
    if len(np.unique(src)) == len(src) and len(np.unique(dst)) == len(dst):
        return [np.arange(len(src))]
    next_send: dict[int, int] = {}
    next_recv: dict[int, int] = {}
    rnd = np.empty(len(src), dtype=np.int64)
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        r = max(next_send.get(s, 0), next_recv.get(d, 0))
        rnd[i] = r
        next_send[s], next_recv[d] = r + 1, r + 1
    return [np.flatnonzero(rnd == r) for r in range(int(rnd.max()) + 1)]


def simulate(
    algorithm: str,
    world_size: int,
    nbytes: float,
    alpha_s: float = 1e-5,
    beta_s_per_byte: float = 1e-10,
    topology: TwoLevel | dict | None = None,
    *,
    gamma_s_per_byte: float = 0.0,
    node_size: int | None = None,
    cores: int | None = None,
    sched_s: float = 0.0,
    background: float = 0.0,
) -> float:
    """Replay ``algorithm``'s schedule for ``world_size`` ranks and ``nbytes`` per rank; returns seconds.

    topology None: every link has (alpha_s, beta_s_per_byte) — matches ``cost_model.predict``. A ``TwoLevel`` (or
    a dict of its fields) overrides the link constants per message (intra/inter node) and sets the hierarchical
    node size. ``node_size`` (hierarchical on uniform links) defaults to ``default_node_size(p)``.

    ``cores``: the ranks share this many cores (``cost_model.predict_contended``'s model): in each step the a
    ranks that send or receive share them (blocked ranks sleep), so the step's byte costs (beta, gamma) are
    multiplied by s = max(1, a / cores) and its messages wait o * ``sched_s`` more for the scheduler,
    o = max(0, a / cores - 1); ``background`` runnable threads of other jobs add to a in every step.
    None: a core (or GPU) per rank.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int | np.integer) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    for name, v in (("nbytes", nbytes), ("alpha_s", alpha_s), ("beta_s_per_byte", beta_s_per_byte)):
        check_nonneg(name, v)
    check_nonneg("gamma_s_per_byte", gamma_s_per_byte)
    check_nonneg("sched_s", sched_s)
    bg = check_nonneg("background", background)
    if isinstance(topology, dict):
        topology = two_level_from_dict(topology)
    if topology is not None and not isinstance(topology, TwoLevel):
        raise TypeError(f"topology: expected None, a TwoLevel or a dict, got {type(topology).__name__}")
    p = int(world_size)
    if topology is not None:
        node_size = topology.node_size
    if cores is not None:
        core_share(p, cores)  # validates cores
    T = np.zeros(p)
    for src, dst, nb, red in schedule(algorithm, p, nbytes, node_size):
        share, extra = 1.0, 0.0
        if cores is not None:  # the ranks active in this step share the cores; blocked ranks sleep
            active = len(np.unique(np.concatenate([src, dst]))) + bg
            share, extra = max(1.0, active / cores), max(0.0, active / cores - 1.0) * sched_s
        g = float(gamma_s_per_byte) * share
        if topology is None:
            a = np.full(len(src), float(alpha_s))
            b = np.full(len(src), float(beta_s_per_byte))
        else:
            same = (src // topology.node_size) == (dst // topology.node_size)
            a = np.where(same, topology.intra_alpha_s, topology.inter_alpha_s)
            b = np.where(same, topology.intra_beta_s_per_byte, topology.inter_beta_s_per_byte)
        a, b = a + extra, b * share
        for sel in _port_rounds(src, dst):
            arrive = np.maximum(T[src[sel]], T[dst[sel]]) + a[sel] + nb[sel] * b[sel]
            new = T.copy()
            new[src[sel]] = np.maximum(new[src[sel]], arrive)
            new[dst[sel]] = np.maximum(new[dst[sel]], arrive + red[sel] * nb[sel] * g)
            T = new
    return float(T.max())
