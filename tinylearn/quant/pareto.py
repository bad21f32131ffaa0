"""Multi-objective search over per-layer bit widths: enumerate every configuration, score it on several objectives
(latency, memory, energy, accuracy), keep the Pareto front.

Dominance. Point a dominates b when a is at least as good as b in every objective and strictly better in at least
one (better = smaller for a minimised objective, larger for a maximised one). The Pareto front is the set of points
no other point dominates. Ties: two points equal in every objective do not dominate each other, so both stay on the
front (or both off it, when a third point dominates them). ``pareto_front`` is the plain O(n^2 k) filter, fine for
the few thousand configurations an enumeration of 3-4 layers x 4 widths produces.

Cost model (``BitCostModel``, a *model*, not a measurement; batch 1, weights read once per inference from on-chip
SRAM, activations kept in buffers and not counted, A8 activations throughout). A layer with n weights and M MACs
stored at b bits runs on a datapath of d(b) bits (default: 2-bit codes are unpacked onto the 4-bit datapath; 4, 8
and 16 run natively):

    memory  = n * b                                          bits
    latency = max(M / (lanes / d(b)),  n * b / 8 / bytes_per_cycle)     cycles (roofline: compute or weight reads)
    energy  = M * (pj_mac_fixed + pj_mac_per_bit * d(b)) + n * b / 8 * pj_per_byte      pJ

summed over layers. Compute-heavy layers (a conv: many MACs per weight) gain latency from narrower datapaths only
down to 4 bits; weight-read-bound layers (a Linear at batch 1: one MAC per weight) gain from every bit removed. So
the four objectives really conflict, and the front is more than the memory/accuracy curve.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._inputs import as_array, is_int, is_real

OBJECTIVES = ("latency_cycles", "memory_bits", "energy_pj", "accuracy")


def _minimize_flags(minimize: bool | Sequence[bool], k: int) -> np.ndarray:
    if isinstance(minimize, bool | np.bool_):
        return np.full(k, bool(minimize))
    if isinstance(minimize, str) or not isinstance(minimize, Sequence) or len(minimize) != k:
        raise ValueError(f"minimize: need a bool or one bool per objective ({k}), got {minimize!r}")
    if not all(isinstance(m, bool | np.bool_) for m in minimize):
        raise ValueError(f"minimize: every entry must be a bool, got {minimize!r}")
    return np.array([bool(m) for m in minimize])


def _as_costs(points: Any, minimize: bool | Sequence[bool], name: str = "points") -> np.ndarray:
    """``points`` [n, k] as float64 costs to minimise (maximised columns negated)."""
    p = as_array(points, name, dtypes=("f", "i", "u", "b"), ndim=2).astype(np.float64)
    if p.shape[1] == 0:
        raise ValueError(f"{name}: need at least one objective (column), got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name}: every value must be finite (no NaN/inf), got {p[~np.isfinite(p)][:3]}")
    return np.where(_minimize_flags(minimize, p.shape[1]), p, -p)


def dominates(a: Any, b: Any, minimize: bool | Sequence[bool] = True) -> bool:
    """True when point ``a`` dominates point ``b``: no worse in every objective, strictly better in at least one."""
    ca = _as_costs(np.atleast_2d(as_array(a, "a", dtypes=("f", "i", "u", "b"), ndim=1)), minimize, "a")[0]
    cb = _as_costs(np.atleast_2d(as_array(b, "b", dtypes=("f", "i", "u", "b"), ndim=1)), minimize, "b")[0]
    if ca.shape != cb.shape:
        raise ValueError(f"b: need as many objectives as a ({ca.size}), got {cb.size}")
    return bool(np.all(ca <= cb) and np.any(ca < cb))


def pareto_front(points: Any, minimize: bool | Sequence[bool] = True) -> np.ndarray:
    """Indices (ascending) of the non-dominated rows of ``points`` [n, k] (n points, k objectives).

    ``minimize``: True (all objectives minimised), False (all maximised) or one bool per column. Points equal in
    every objective do not dominate each other: duplicates of a front point are all on the front. O(n^2 k).
    """
    c = _as_costs(points, minimize)
    n = c.shape[0]
    keep = np.ones(n, bool)
    for i in range(n):
        # rows that dominate row i: <= everywhere and < somewhere
        le = np.all(c <= c[i], axis=1)
        lt = np.any(c < c[i], axis=1)
        keep[i] = not np.any(le & lt)
    return np.flatnonzero(keep)


def enumerate_bit_configs(n_layers: int, widths: Sequence[int] = (2, 4, 8, 16)) -> np.ndarray:
    """Every per-layer width assignment: [len(widths) ** n_layers, n_layers] int64, in itertools.product order."""
    if not (is_int(n_layers) and 1 <= n_layers <= 8):
        raise ValueError(f"n_layers: must be an int in [1, 8], got {n_layers!r}")
    w = _widths(widths)
    return np.array(list(itertools.product(w, repeat=int(n_layers))), np.int64).reshape(-1, int(n_layers))


def _widths(widths: Any) -> list[int]:
    if isinstance(widths, str) or not isinstance(widths, Sequence) or len(widths) == 0:
        raise ValueError(f"widths: need a non-empty sequence of bit widths, got {widths!r}")
    if not all(is_int(b) and 2 <= b <= 16 for b in widths):
        raise ValueError(f"widths: every width must be an int in [2, 16], got {widths!r}")
    if len(set(int(b) for b in widths)) != len(widths):
        raise ValueError(f"widths: duplicate widths in {widths!r}")
    return [int(b) for b in widths]


@dataclass(frozen=True)
class BitCostModel:
    """Latency / memory / energy of a per-layer width assignment (module docstring; a stated model, not measured).

    ``datapath_bits``: the MAC datapath each storage width runs on; ``lanes_bits``: datapath width in bits, so a
    d-bit datapath does lanes_bits / d MACs per cycle; ``bytes_per_cycle``: weight-read bandwidth; energies in pJ
    (order of magnitude of Horowitz's 45 nm figures: 0.2 pJ for an 8-bit multiply, ~1 pJ per byte of small SRAM).
    """

    datapath_bits: Mapping[int, int] = field(default_factory=lambda: {2: 4, 4: 4, 8: 8, 16: 16})
    lanes_bits: int = 1024
    bytes_per_cycle: float = 8.0
    pj_mac_fixed: float = 0.03
    pj_mac_per_bit: float = 0.025
    pj_per_byte: float = 1.25

    def __post_init__(self) -> None:
        if not isinstance(self.datapath_bits, Mapping) or not self.datapath_bits:
            raise ValueError(
                f"datapath_bits: need a non-empty mapping width -> datapath bits, got {self.datapath_bits!r}"
            )
        for b, d in self.datapath_bits.items():
            if not (is_int(b) and is_int(d) and 2 <= b <= 16 and b <= d <= 64):
                raise ValueError(
                    f"datapath_bits: need int widths 2..16 mapped to ints in [width, 64], got {b!r}: {d!r}"
                )
        for name in ("lanes_bits", "bytes_per_cycle", "pj_mac_fixed", "pj_mac_per_bit", "pj_per_byte"):
            v = getattr(self, name)
            real = is_real(v)
            if not (real and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if self.lanes_bits <= 0 or self.bytes_per_cycle <= 0:
            raise ValueError(
                f"lanes_bits/bytes_per_cycle: must be > 0, got {self.lanes_bits!r}/{self.bytes_per_cycle!r}"
            )

    def costs(self, params: Any, macs: Any, bits: Any) -> tuple[float, int, float]:
        """(latency in cycles, memory in bits, energy in pJ) of layers with ``params`` weights and ``macs`` MACs
        (per inference) stored at ``bits`` (one width per layer)."""
        n = as_array(params, "params", dtypes=("i", "u", "f"), ndim=1).astype(np.float64)
        m = as_array(macs, "macs", dtypes=("i", "u", "f"), ndim=1).astype(np.float64)
        b = as_array(bits, "bits", dtypes=("i", "u"), ndim=1).astype(np.int64)
        if not (n.shape == m.shape == b.shape) or n.size == 0:
            raise ValueError(f"bits: need one width per layer ({n.size} params, {m.size} macs), got {b.size}")
        if np.any(n < 0) or np.any(m < 0) or not (np.all(np.isfinite(n)) and np.all(np.isfinite(m))):
            raise ValueError(f"params/macs: must be finite and >= 0, got {n.tolist()} / {m.tolist()}")
        bad = [int(x) for x in b if int(x) not in self.datapath_bits]
        if bad:
            raise ValueError(
                f"bits: widths {bad} are not in the cost model's datapath_bits {sorted(self.datapath_bits)}"
            )
        d = np.array([self.datapath_bits[int(x)] for x in b], np.float64)
        wbytes = n * b / 8.0
        latency = float(np.sum(np.maximum(m * d / self.lanes_bits, wbytes / self.bytes_per_cycle)))
        energy = float(np.sum(m * (self.pj_mac_fixed + self.pj_mac_per_bit * d) + wbytes * self.pj_per_byte))
        return latency, int(np.sum(n.astype(np.int64) * b)), energy


def layer_profile(model: Any, layers: Sequence[str], x: Any) -> tuple[np.ndarray, np.ndarray]:
    """(weights, MACs per sample) of each named Linear / Conv2d layer, from one forward pass of ``x[:1]`` with hooks:
    MACs = weights x output positions (Linear: 1, Conv2d: H_out * W_out)."""
    from ..nn.training import predict

    if isinstance(layers, str) or not isinstance(layers, Sequence) or len(layers) == 0:
        raise ValueError(f"layers: need a non-empty list of layer names, got {layers!r}")
    xa = as_array(x, "x", dtypes=("f",), min_ndim=2)
    if xa.shape[0] == 0:
        raise ValueError(f"x: need at least one sample, got shape {xa.shape}")
    mods = []
    for name in layers:
        if not isinstance(name, str):
            raise ValueError(f"layers: every name must be a str, got {name!r}")
        try:
            mod = model.get_submodule(name)
        except (AttributeError, KeyError) as e:
            raise ValueError(f"layers: no layer {name!r} in the model") from e
        if getattr(mod, "weight", None) is None:
            raise ValueError(f"layers: layer {name!r} ({type(mod).__name__}) has no weight")
        mods.append(mod)
    shapes: dict[int, tuple[int, ...]] = {}
    handles = [
        mod.register_forward_hook(lambda mdl, args, out, i=i: shapes.__setitem__(i, tuple(out.shape)))
        for i, mod in enumerate(mods)
    ]
    try:
        predict(model, xa[:1])
    finally:
        for h in handles:
            h.remove()
    params = np.array([mod.weight.data.size for mod in mods], np.int64)
    positions = np.array([int(np.prod(shapes[i][2:])) if len(shapes[i]) > 2 else 1 for i in range(len(mods))])
    return params, params * positions


def bit_width_search(
    model: Any,
    layers: Sequence[str],
    X: Any,
    y: Any,
    widths: Sequence[int] = (2, 4, 8, 16),
    cost_model: BitCostModel | None = None,
) -> dict[str, np.ndarray]:
    """Enumerate every per-layer width in ``widths`` for the named layers (weights fake-quantized symmetric per output
    channel, ``error_budget.quantize_segments``), score each configuration on (latency, memory, energy) from
    ``cost_model`` and top-1 accuracy on (X, y), and keep the Pareto front (accuracy maximised, the rest minimised).

    Returns {"configs": [C, L] widths, "objectives": [C, 4] in ``OBJECTIVES`` order, "minimize": [4] bools,
    "front": indices of the non-dominated configurations, "params": [L], "macs": [L]}.
    """
    from ..nn.training import predict
    from .error_budget import quantize_segments

    cm = BitCostModel() if cost_model is None else cost_model
    if not isinstance(cm, BitCostModel):
        raise ValueError(f"cost_model: need a BitCostModel or None, got {type(cost_model).__name__}")
    Xa = as_array(X, "X", dtypes=("f",), min_ndim=2)
    ya = as_array(y, "y", dtypes=("i", "u"), ndim=1)
    if len(Xa) != len(ya) or len(ya) == 0:
        raise ValueError(f"y: need one label per sample of X ({len(Xa)}), got {len(ya)}")
    w = _widths(widths)
    missing = [b for b in w if b not in cm.datapath_bits]
    if missing:
        raise ValueError(f"widths: {missing} not in the cost model's datapath_bits {sorted(cm.datapath_bits)}")
    params, macs = layer_profile(model, layers, Xa)
    configs = enumerate_bit_configs(len(layers), w)
    obj = np.zeros((len(configs), len(OBJECTIVES)))
    for i, cfg in enumerate(configs):
        lat, mem, en = cm.costs(params, macs, cfg)
        qm = quantize_segments(model, list(layers), [int(b) for b in cfg])
        acc = float(np.mean(np.argmax(predict(qm, Xa), axis=1) == ya))
        obj[i] = (lat, mem, en, acc)
    minimize = np.array([True, True, True, False])
    return {
        "configs": configs,
        "objectives": obj,
        "minimize": minimize,
        "front": pareto_front(obj, minimize.tolist()),
        "params": params,
        "macs": macs,
    }
