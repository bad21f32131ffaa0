"""Expert heat: when to replicate or migrate hot experts of an expert-parallel MoE (Q142b).

The router's load moves: a topic shift in the data stream makes some experts hot for a while, and in expert
parallelism the rank that owns a hot expert sets the step time (every rank waits for the slowest one at the combine
all-to-all). Reacting to every step's counts flaps (a replica copied in, dropped the next step, copied again); never
reacting leaves a rank overloaded for the whole shift. ``ExpertHeat`` is the controller in between:

    heat        h_e <- (1 - alpha) h_e + alpha * hits_e     per LOGICAL expert e, hits = rows it processed this step
                (EMA of token hits; a one-step spike moves it by alpha only)
    rank load   L_r = sum of h_e over the experts placed on rank r; a replicated expert's heat is split half/half
                between its owner and the host (``ExpertParallelMoE`` sends the first half of every source's tokens
                for e to the owner, the rest to the replica)
    imbalance   I = max_r L_r / mean_r L_r                  (1.0 = balanced)

``decide()`` (same answer on every rank: the hits come from the gathered ``last_stats``):

    * I > ``high`` and at least ``cooldown`` steps since the last change: evaluate the candidates on the heat
      (a MODEL of the next steps' load) and take the one with the lowest predicted I, if it beats the current I by
      ``min_gain``:
        - replicate: ``plan_replication`` on the heat (busiest rank's hottest expert, to the least loaded other rank),
          replacing any older replica; moves one expert's weights once, then costs a gradient sync per training step;
        - migrate: swap one expert of the busiest rank with one of another rank (the best swap, replica dropped);
          moves two experts' weights once and nothing per step.
    * else a replica exists and I without it would be <= ``low``: release it (frees the host's memory and the
      per-step gradient sync).
    * else nothing. ``low < high`` is the hysteresis band: a load that wanders inside it changes nothing.

``apply(ep, decision)`` (collective) performs it on an ``ExpertParallelMoE``: ``replicate_expert``, ``release_replica``
or ``swap_experts``. A swap exchanges the two experts' weights (and gradients) between their owners and swaps the two
router rows on every rank, so physical slot a now computes the logical expert that was in slot b: the layer's
function is unchanged (routing picks the same logical experts; capacity positions are in token order), only where the
rows are computed moves. Optimizer state of the swapped slots is the caller's to permute (``placement`` says where
every logical expert lives). ``ExpertParallelMoE.last_stats["processed_per_expert"]`` is per physical slot;
``update`` maps it back to logical experts through ``placement``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..dist.group import check_same_across_ranks
from ..nn.moe import capacity, route
from .moe_parallel import ExpertParallelMoE, plan_replication

__all__ = [
    "ExpertHeat",
    "HeatDecision",
    "swap_experts",
    "release_replica",
    "expert_bytes",
    "dispatch_rows",
    "ep_forward_bytes",
    "stream_imbalance",
]

ACTIONS = ("none", "replicate", "migrate", "release")
_TAG_SWAP = 4120


@dataclass
class HeatDecision:
    """One controller decision. ``expert``/``other`` are LOGICAL experts; ``slots`` the physical slots involved
    (replicate: (slot of expert,), migrate: (slot a, slot b)); ``host`` the replica's rank."""

    step: int
    action: str
    imbalance: float  # predicted max/mean rank load before the action (on the heat)
    predicted: float  # predicted max/mean rank load after it
    expert: int = -1
    other: int = -1
    host: int = -1
    slots: tuple[int, ...] = ()
    moved_experts: int = 0  # expert weight sets copied between ranks by the action
    reason: str = ""


def expert_bytes(d_model: int, d_ff: int, element_size: int = 4) -> int:
    """Bytes of one expert's weights (w1 [d, f], b1 [f], w2 [f, d], b2 [d])."""
    return (2 * d_model * d_ff + d_ff + d_model) * element_size


@dataclass
class ExpertHeat:
    """EMA heat per logical expert + threshold/hysteresis decisions (see the module docstring)."""

    num_experts: int
    world_size: int
    alpha: float = 0.3
    high: float = 1.3
    low: float = 1.1
    cooldown: int = 3
    min_gain: float = 0.05
    actions: tuple[str, ...] = ("replicate", "migrate")
    heat: np.ndarray = field(init=False)
    placement: np.ndarray = field(init=False)  # logical expert -> physical slot
    replica: tuple[int, int] | None = field(init=False, default=None)  # (logical expert, host rank)
    steps: int = field(init=False, default=0)
    last_change: int = field(init=False, default=-(10**9))
    history: list[HeatDecision] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        e, p = self.num_experts, self.world_size
        if not isinstance(e, int) or e < 2:
            raise ValueError(f"num_experts: expected an int >= 2, got {e!r}")
        if not isinstance(p, int) or p < 2 or e % p:
            raise ValueError(f"world_size: expected an int >= 2 dividing num_experts={e}, got {p!r}")
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha: expected 0 < alpha <= 1, got {self.alpha!r}")
        if not (isinstance(self.low, (int, float)) and isinstance(self.high, (int, float)) and 1 <= self.low):
            raise ValueError(f"low: expected a number >= 1, got {self.low!r}")
        if not self.high > self.low:
            raise ValueError(f"high: expected high > low={self.low} (the hysteresis band), got {self.high!r}")
        if not isinstance(self.cooldown, int) or self.cooldown < 0:
            raise ValueError(f"cooldown: expected an int >= 0, got {self.cooldown!r}")
        bad = [a for a in self.actions if a not in ("replicate", "migrate")]
        if bad or not self.actions:
            raise ValueError(f"actions: expected a non-empty subset of ('replicate', 'migrate'), got {self.actions!r}")
        self.heat = np.zeros(e)
        self.placement = np.arange(e)

    # -- the model --------------------------------------------------------------------------------------------
    @property
    def per_rank(self) -> int:
        return self.num_experts // self.world_size

    def slot_expert(self) -> np.ndarray:
        """Physical slot -> logical expert (the inverse of ``placement``)."""
        inv = np.empty_like(self.placement)
        inv[self.placement] = np.arange(self.num_experts)
        return inv

    def rank_load(
        self,
        heat: np.ndarray | None = None,
        placement: np.ndarray | None = None,
        replica: tuple[int, int] | None | str = "current",
    ) -> np.ndarray:
        """Predicted rows per rank: heat summed over each rank's experts, a replica taking half its expert's heat."""
        h = self.heat if heat is None else np.asarray(heat, dtype=float)
        pl = self.placement if placement is None else placement
        rep = self.replica if replica == "current" else replica
        load = np.zeros(self.world_size)
        np.add.at(load, pl // self.per_rank, h)
        if rep is not None:
            e, host = rep
            load[pl[e] // self.per_rank] -= h[e] / 2
            load[host] += h[e] / 2
        return load

    def imbalance(self, **kw: Any) -> float:
        load = self.rank_load(**kw)
        m = load.mean()
        return float(load.max() / m) if m > 0 else 1.0

    # -- updates and decisions ----------------------------------------------------------------------------------
    def update(self, hits_per_slot: Any) -> np.ndarray:
        """Fold one step's rows per PHYSICAL slot (``last_stats["processed_per_expert"]``) into the heat."""
        hits = np.asarray(hits_per_slot, dtype=float)
        if hits.shape != (self.num_experts,) or not np.all(np.isfinite(hits)) or np.any(hits < 0):
            raise ValueError(f"hits_per_slot: expected {self.num_experts} finite counts >= 0, got {hits_per_slot!r}")
        logical = hits[self.placement]
        self.heat = logical.copy() if self.steps == 0 else (1 - self.alpha) * self.heat + self.alpha * logical
        self.steps += 1
        return self.heat

    def _best_swap(self) -> tuple[float, int, int]:
        """(predicted I, logical a, logical b): the best swap of a busiest-rank expert with another rank's expert."""
        per, load = self.per_rank, self.rank_load(replica=None)
        busiest = int(np.argmax(load))
        inv = self.slot_expert()
        best = (self.imbalance(replica=None), -1, -1)
        for sa in range(busiest * per, (busiest + 1) * per):
            for sb in range(self.num_experts):
                if sb // per == busiest:
                    continue
                pl = self.placement.copy()
                a, b = int(inv[sa]), int(inv[sb])
                pl[a], pl[b] = sb, sa
                imb = self.imbalance(placement=pl, replica=None)
                if imb < best[0] - 1e-12:
                    best = (imb, a, b)
        return best

    def decide(self) -> HeatDecision:
        """The next decision on the current heat; the controller's placement/replica are updated to match (call
        ``apply`` with it on every rank to make the EP layer follow)."""
        now = self.imbalance()
        d = HeatDecision(self.steps, "none", now, now)
        if self.steps == 0:
            d.reason = "no heat yet"
        elif now > self.high and self.steps - self.last_change >= self.cooldown:
            cands: list[HeatDecision] = []
            if "replicate" in self.actions:
                scaled = np.rint(self.heat[self.slot_expert()] * 1000).astype(np.int64)  # per physical slot
                hot_slot, host = plan_replication(scaled, self.world_size)
                e = int(self.slot_expert()[hot_slot])
                if self.replica != (e, host):
                    pred = self.imbalance(replica=(e, host))
                    cands.append(HeatDecision(self.steps, "replicate", now, pred, e, -1, host, (hot_slot,), 1))
            if "migrate" in self.actions:
                pred, a, b = self._best_swap()
                if a >= 0:
                    slots = (int(self.placement[a]), int(self.placement[b]))
                    cands.append(HeatDecision(self.steps, "migrate", now, pred, a, b, -1, slots, 2))
            best = min(cands, key=lambda c: (c.predicted, c.moved_experts), default=None)
            if best is not None and best.predicted <= now - self.min_gain:
                d = best
                d.reason = f"imbalance {now:.3f} > high {self.high}: predicted {best.predicted:.3f}"
            else:
                d.reason = f"imbalance {now:.3f} > high {self.high} but no action gains {self.min_gain}"
        elif self.replica is not None and self.imbalance(replica=None) <= self.low:
            e, host = self.replica
            d = HeatDecision(self.steps, "release", now, self.imbalance(replica=None), e, -1, host)
            d.reason = f"without the replica the imbalance is {d.predicted:.3f} <= low {self.low}"
        elif now > self.high:
            d.reason = f"cooldown: last change at step {self.last_change}"
        else:
            d.reason = f"imbalance {now:.3f} <= high {self.high}"
        self._commit(d)
        return d

    def _commit(self, d: HeatDecision) -> None:
        if d.action == "none":
            return
        self.last_change = self.steps
        self.history.append(d)
        if d.action == "replicate":
            self.replica = (d.expert, d.host)
        elif d.action == "release":
            self.replica = None
        else:  # migrate: the replica is dropped first
            self.replica = None
            a, b = d.expert, d.other
            self.placement[a], self.placement[b] = self.placement[b], self.placement[a]

    def apply(self, ep: ExpertParallelMoE, d: HeatDecision) -> None:
        """Collective: make ``ep`` follow decision ``d`` (same ``d`` on every rank)."""
        if d.action not in ACTIONS:
            raise ValueError(f"d: unknown action {d.action!r}")
        if d.action == "replicate":
            ep.replicate_expert(d.slots[0], d.host)
        elif d.action == "release":
            release_replica(ep)
        elif d.action == "migrate":
            release_replica(ep)
            swap_experts(ep, *d.slots)


# ------------------------------------------------------------------------------------------- EP layer operations
def release_replica(ep: ExpertParallelMoE) -> None:
    """Drop ``ep``'s hot-expert replica (local on every rank; the owner never stopped holding the expert)."""
    ep.replica, ep.replica_params = None, None


def swap_experts(ep: ExpertParallelMoE, slot_a: int, slot_b: int) -> None:
    """Collective: physical expert slots ``slot_a`` and ``slot_b`` (on different ranks) exchange their weights and
    gradients, and every rank swaps router rows a and b; the layer computes the same function afterwards."""
    e, per = ep.num_experts, ep.per_rank
    for name, s in (("slot_a", slot_a), ("slot_b", slot_b)):
        if not isinstance(s, (int, np.integer)) or not 0 <= s < e:
            raise ValueError(f"{name}: expected a slot in [0, {e}), got {s!r}")
    ra, rb = slot_a // per, slot_b // per
    if ra == rb:
        raise ValueError(f"slot_b: slots {slot_a} and {slot_b} are both on rank {ra}; a swap moves between ranks")
    if ep.replica is not None:
        raise ValueError(f"ep: has a replica of expert {ep.replica[0]}; release_replica(ep) before a swap")
    params = [ep.w1, ep.b1, ep.w2, ep.b2]
    has_grads = all(p.grad is not None for p in params)
    fields = [("slot_a", int(slot_a)), ("slot_b", int(slot_b)), ("expert gradients present", int(has_grads))]
    check_same_across_ranks("swap_experts", fields, ep.g.group)
    me = ep.g.me
    with torch.no_grad():
        if me in (ra, rb):
            mine, peer = (slot_a, rb) if me == ra else (slot_b, ra)
            i = mine - ep.expert_ids[0]
            tensors = [p.detach()[i] for p in params]
            if has_grads:
                tensors += [p.grad[i] for p in params]
            flat = torch.cat([t.reshape(-1) for t in tensors]).contiguous()
            other = torch.empty_like(flat)
            works = [ep.g.isend(flat, peer, _TAG_SWAP), ep.g.irecv(other, peer, _TAG_SWAP)]
            for w in works:
                w.wait()
            parts = torch.split(other, [t.numel() for t in tensors])
            for j, p in enumerate(params):
                p[i] = parts[j].reshape(p[i].shape)
                if has_grads:
                    p.grad[i] = parts[len(params) + j].reshape(p.grad[i].shape)
        rw = ep.router_weight
        rw[[slot_a, slot_b]] = rw[[slot_b, slot_a]].clone()
        if rw.grad is not None:
            rw.grad[[slot_a, slot_b]] = rw.grad[[slot_b, slot_a]].clone()


def dispatch_rows(ep: ExpertParallelMoE, x: torch.Tensor) -> list[int]:
    """Rows this rank's tokens ``x`` send to each rank in ``ep``'s next forward (its routing, capacity and replica
    split, recomputed here without communicating): the input of ``ep_forward_bytes``."""
    d, e, k, per = ep.d_model, ep.num_experts, ep.top_k, ep.per_rank
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != d:
        raise ValueError(f"x: expected a torch.Tensor with last dimension d_model={d}, got {getattr(x, 'shape', x)}")
    with torch.no_grad():
        probs = torch.softmax(x.reshape(-1, d) @ ep.router_weight.T, -1).numpy()
    cap = None if ep.dropless else capacity(probs.shape[0], e, k, ep.capacity_factor)
    r = route(probs, k, cap)
    tok, ch = np.nonzero(r.keep)
    dest = r.expert[tok, ch] // per
    if ep.replica is not None:
        hot, _, host = ep.replica
        idx = np.flatnonzero(r.expert[tok, ch] == hot)
        dest[idx[(idx.size + 1) // 2 :]] = host
    return np.bincount(dest, minlength=ep.g.size).tolist()


def ep_forward_bytes(
    rows: Any, d_model: int, num_experts: int, element_size: int = 4, backward: bool = False
) -> np.ndarray:
    """Bytes each rank sends in one ``ExpertParallelMoE`` forward (method "p2p"), from ``rows[i][j]`` = rows rank i
    dispatches to rank j (``dispatch_rows`` on every rank):

        8 (P-1)                      the send counts (int64)
        8 * out_i                    the rows' local slots (int64), out_i = sum_{j != i} rows[i][j]
        d * s * out_i                dispatch all-to-all (s = element size)
        d * s * in_i                 combine all-to-all: the outputs go back, in_i = sum_{j != i} rows[j][i]
        8 (E + 3 + E/P) (P-1)        the gathered statistics

    ``backward=True`` adds the backward all-to-alls: d * s * (in_i + out_i) (gradients travel the reverse way)."""
    m = np.asarray(rows, dtype=np.int64)
    p = m.shape[0] if m.ndim == 2 else 0
    if m.ndim != 2 or m.shape != (p, p) or p < 2 or np.any(m < 0):
        raise ValueError(f"rows: expected a [P, P] matrix of counts >= 0 with P >= 2, got {rows!r}")
    if not isinstance(num_experts, int) or num_experts % p:
        raise ValueError(f"num_experts: expected an int divisible by P={p}, got {num_experts!r}")
    off = m - np.diag(np.diag(m))
    out, inn = off.sum(1), off.sum(0)
    stats = 8 * (num_experts + 3 + num_experts // p) * (p - 1)
    fwd = 8 * (p - 1) + 8 * out + d_model * element_size * (out + inn) + stats
    return fwd + (d_model * element_size * (out + inn) if backward else 0)


def stream_imbalance(loads: list[list[float]]) -> list[float]:
    """max/mean of every step's rank loads (helper for plots and tests)."""
    out = []
    for row in loads:
        m = float(np.mean(row))
        out.append(float(np.max(row)) / m if m > 0 and math.isfinite(m) else 1.0)
    return out
