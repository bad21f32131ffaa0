"""Per-layer (low-rank rank, quant bits) assignment under a byte budget [Q136]: distillation KL + reconstruction.

Variant of a Linear weight W [out, in] (numpy, float64 arithmetic):

    rank r < min(out, in):  W ~ A B,  A = U_r S_r [out, r], B = V_r^T [r, in]   (truncated SVD, Eckart-Young optimal)
    rank None:              W itself
    bits 4 / 8:             every factor quantized uniform symmetric per output row: s = max|row| / (2^(b-1) - 1),
                            q = clip(round(x / s), -(2^(b-1) - 1), 2^(b-1) - 1), one fp32 scale per row
    bits 32:                fp32 factors

Bytes (exact, ``variant_bytes``): elements * bits / 8 (4-bit codes packed two per byte, rounded up per factor)
+ 4 bytes per row scale when bits < 32 + the fp32 bias (4 * out, the same for every variant).

Loss of a configuration, measured on calibration inputs against the uncompressed model (the teacher):

    loss = KL(softmax(teacher logits) || softmax(student logits))  +  beta * sum_l ||W_l - W~_l||_F^2 / ||W_l||_F^2

Sensitivity: the loss with ONLY layer l compressed by variant v (every other layer exact), measured. Assuming the
per-layer losses add (first-order; checked by measuring the joint loss afterwards), the assignment is a multiple-
choice knapsack: one variant per layer, sum of bytes <= budget, minimise the sum of sensitivities.

    greedy (Lagrangian-style): start every layer at its cheapest variant, repeatedly take the upgrade with the largest
        loss decrease per extra byte that still fits (an approximation; can be suboptimal)
    dp: exact over a budget discretised into ``unit``-byte cells (item costs rounded UP, so the answer always fits
        the real budget; unit=1 is exact), O(layers * variants * cells)

``uniform`` gives every layer the same (rank fraction, bits) and is the baseline at equal bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

BITS = (4, 8, 32)
Variant = tuple[int | None, int]  # (rank or None for full, bits)


def _check_bits(bits: Any) -> int:
    if bits not in BITS:
        raise ValueError(f"bits: expected one of {BITS}, got {bits!r}")
    return int(bits)


def quantize_sym(x: np.ndarray, bits: int) -> np.ndarray:
    """Uniform symmetric per-row quantize -> dequantize (bits 4/8); bits 32 returns x unchanged."""
    bits = _check_bits(bits)
    x = np.asarray(x, np.float64)
    if bits == 32:
        return x.copy()
    qmax = 2 ** (bits - 1) - 1
    s = np.abs(x).max(axis=1, keepdims=True) / qmax
    s[s == 0] = 1.0
    return np.clip(np.rint(x / s), -qmax, qmax) * s


def compress_weight(w: np.ndarray, rank: int | None, bits: int) -> np.ndarray:
    """The reconstructed weight of variant (rank, bits)."""
    w = np.asarray(w, np.float64)
    if w.ndim != 2:
        raise ValueError(f"w: expected a 2-D weight, got shape {w.shape}")
    if rank is None:
        return quantize_sym(w, bits)
    if not 1 <= int(rank) <= min(w.shape):
        raise ValueError(f"rank: expected 1 <= rank <= {min(w.shape)} for weight {w.shape}, got {rank!r}")
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    r = int(rank)
    return quantize_sym(u[:, :r] * s[:r], bits) @ quantize_sym(vt[:r], bits)


def variant_bytes(shape: Sequence[int], rank: int | None, bits: int) -> int:
    """Exact storage bytes of a variant of a [out, in] Linear (with its fp32 bias)."""
    out, inp = int(shape[0]), int(shape[1])
    bits = _check_bits(bits)
    factors = [(out, inp)] if rank is None else [(out, int(rank)), (int(rank), inp)]
    total = 4 * out
    for rows, cols in factors:
        total += (rows * cols * bits + 7) // 8
        if bits < 32:
            total += 4 * rows
    return total


def kl_div(teacher_logits: np.ndarray, student_logits: np.ndarray) -> float:
    """Mean over rows of KL(softmax(teacher) || softmax(student))."""

    def logsm(z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, np.float64)
        z = z - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    lt, ls = logsm(teacher_logits), logsm(student_logits)
    return float((np.exp(lt) * (lt - ls)).sum(1).mean())


def mlp_forward(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """Logits of a ReLU MLP (ReLU between layers, none after the last)."""
    h = np.asarray(x, np.float64)
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        h = h @ np.asarray(w, np.float64).T + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0.0)
    return h


def default_variants(shape: Sequence[int], fractions: Sequence[float] = (0.125, 0.25, 0.5)) -> list[Variant]:
    """(rank, bits) candidates of a layer: ranks at ``fractions`` of min(out, in) plus full, x bits 4/8/32."""
    m = min(int(shape[0]), int(shape[1]))
    ranks = sorted({max(1, round(f * m)) for f in fractions} - {m})
    return [(r, b) for r in [*ranks, None] for b in BITS]


class MixedConfig:
    """Sensitivities and assignments for a ReLU MLP given as numpy weights [out, in] and biases."""

    def __init__(
        self,
        weights: Sequence[np.ndarray],
        biases: Sequence[np.ndarray],
        x_calib: np.ndarray,
        beta: float = 0.1,
        variants: Sequence[Sequence[Variant]] | None = None,
    ) -> None:
        if len(weights) != len(biases) or not weights:
            raise ValueError(f"weights: need one bias per weight, got {len(weights)} weights, {len(biases)} biases")
        if beta < 0:
            raise ValueError(f"beta: expected >= 0, got {beta!r}")
        self.w = [np.asarray(w, np.float64) for w in weights]
        self.b = [np.asarray(b, np.float64) for b in biases]
        self.x, self.beta = np.asarray(x_calib, np.float64), float(beta)
        self.teacher = mlp_forward(self.w, self.b, self.x)
        self.variants = [list(v) for v in variants] if variants is not None else [
            default_variants(w.shape) for w in self.w]  # fmt: skip
        self.cost = [[variant_bytes(w.shape, r, b) for r, b in vs] for w, vs in zip(self.w, self.variants, strict=True)]
        self._rec = [[compress_weight(w, r, b) for r, b in vs] for w, vs in zip(self.w, self.variants, strict=True)]
        self.sens = [[self.loss_of({i: j}) for j in range(len(vs))] for i, vs in enumerate(self.variants)]

    def loss_of(self, choice: dict[int, int]) -> float:
        """MEASURED loss with layer i at variant choice[i] (layers not in ``choice`` exact)."""
        ws = [self._rec[i][choice[i]] if i in choice else w for i, w in enumerate(self.w)]
        kl = kl_div(self.teacher, mlp_forward(ws, self.b, self.x))
        rec = sum(np.sum((ws[i] - self.w[i]) ** 2) / np.sum(self.w[i] ** 2) for i in choice)
        return kl + self.beta * float(rec)

    def kl_of(self, assign: Sequence[int]) -> float:
        """Measured output KL with every layer compressed as ``assign``."""
        ws = [self._rec[i][j] for i, j in enumerate(assign)]
        return kl_div(self.teacher, mlp_forward(ws, self.b, self.x))

    def bytes_of(self, assign: Sequence[int]) -> int:
        return int(sum(self.cost[i][j] for i, j in enumerate(assign)))

    def uniform(self, fraction: float | None, bits: int) -> list[int]:
        """Same rank fraction (None: full) and bits for every layer; the variant index per layer."""
        bits, out = _check_bits(bits), []
        for w, vs in zip(self.w, self.variants, strict=True):
            r = None if fraction is None else max(1, round(fraction * min(w.shape)))
            r = None if r is not None and r >= min(w.shape) else r
            if (r, bits) not in vs:
                raise ValueError(f"fraction: rank {r} at bits {bits} is not a variant of layer shape {w.shape}")
            out.append(vs.index((r, bits)))
        return out

    def greedy(self, budget: int) -> list[int]:
        return greedy_assign(self.sens, self.cost, budget)

    def dp(self, budget: int, unit: int = 1) -> list[int]:
        return dp_assign(self.sens, self.cost, budget, unit)


def _check_problem(loss: Sequence[Sequence[float]], cost: Sequence[Sequence[int]], budget: Any) -> None:
    if len(loss) != len(cost) or any(len(a) != len(b) or not a for a, b in zip(loss, cost, strict=True)):
        raise ValueError("loss/cost: need the same non-empty variant lists per layer")
    if not isinstance(budget, int | np.integer) or budget < 0:
        raise ValueError(f"budget: expected an int >= 0 bytes, got {budget!r}")
    if sum(min(c) for c in cost) > budget:
        raise ValueError(f"budget: {budget} bytes is below the cheapest assignment ({sum(min(c) for c in cost)})")


def total(loss: Sequence[Sequence[float]], assign: Sequence[int]) -> float:
    """Additive (predicted) loss of an assignment."""
    return float(sum(loss[i][j] for i, j in enumerate(assign)))


def greedy_assign(loss: Sequence[Sequence[float]], cost: Sequence[Sequence[int]], budget: int) -> list[int]:
    """Greedy by marginal loss decrease per extra byte, from the cheapest variant of every layer."""
    _check_problem(loss, cost, budget)
    assign = [
        min(range(len(cs)), key=lambda j, cs=cs, ls=ls: (cs[j], ls[j])) for cs, ls in zip(cost, loss, strict=True)
    ]
    used = sum(cost[i][j] for i, j in enumerate(assign))
    while True:
        best, best_rate = None, 0.0
        for i, (cs, ls) in enumerate(zip(cost, loss, strict=True)):
            for j in range(len(cs)):
                gain, extra = ls[assign[i]] - ls[j], cs[j] - cs[assign[i]]
                if gain <= 0 or used + extra > budget:
                    continue
                rate = np.inf if extra <= 0 else gain / extra
                if best is None or rate > best_rate:
                    best, best_rate = (i, j), rate
        if best is None:
            return assign
        used += cost[best[0]][best[1]] - cost[best[0]][assign[best[0]]]
        assign[best[0]] = best[1]


def dp_assign(loss: Sequence[Sequence[float]], cost: Sequence[Sequence[int]], budget: int, unit: int = 1) -> list[int]:
    """Exact multiple-choice knapsack over ceil(cost / unit) cells (exact for unit=1; always within budget)."""
    _check_problem(loss, cost, budget)
    if not isinstance(unit, int | np.integer) or unit < 1:
        raise ValueError(f"unit: expected an int >= 1, got {unit!r}")
    cells = int(budget) // int(unit)
    best = np.zeros(cells + 1)  # best[c]: min loss of layers so far using <= c cells
    choices = []
    for ls, cs in zip(loss, cost, strict=True):
        new, arg = np.full(cells + 1, np.inf), np.full(cells + 1, -1)
        for j, (lo, co) in enumerate(zip(ls, cs, strict=True)):
            k = -(-int(co) // int(unit))
            if k > cells:
                continue
            cand = np.full(cells + 1, np.inf)
            cand[k:] = best[: cells + 1 - k] + lo
            better = cand < new
            new[better], arg[better] = cand[better], j
        if not np.isfinite(new[cells]):
            raise ValueError(f"budget: {budget} bytes cannot fit one variant per layer at unit={unit}")
        choices.append((arg, cs, unit))
        best = new
    assign, c = [], cells
    for arg, cs, u in reversed(choices):
        j = int(arg[c])
        assign.append(j)
        c -= -(-int(cs[j]) // int(u))
    return assign[::-1]


def brute_force(loss: Sequence[Sequence[float]], cost: Sequence[Sequence[int]], budget: int) -> list[int]:
    """Exhaustive optimum (test oracle for small problems)."""
    _check_problem(loss, cost, budget)
    feas = [a for a in itertools.product(*[range(len(c)) for c in cost])
            if sum(cost[i][j] for i, j in enumerate(a)) <= budget]  # fmt: skip
    return list(min(feas, key=lambda a: total(loss, a)))


def train_digits_mlp(hidden: Sequence[int] = (64, 32), epochs: int = 15, seed: int = 0) -> dict[str, Any]:
    """A digits MLP trained with tinylearn autograd (Adam); numpy weights/biases and the train/test split."""
    from .. import nn, optim
    from ..autograd import Tensor, manual_seed
    from ..data import load_digits
    from ..nn import functional as F

    x, y = load_digits()
    x = x.reshape(len(y), -1)
    perm = np.random.default_rng(seed).permutation(len(y))
    xtr, ytr, xte, yte = x[perm[:1300]], y[perm[:1300]], x[perm[1300:]], y[perm[1300:]]
    manual_seed(seed)
    dims = [64, *hidden, 10]
    layers: list[Any] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = optim.Adam(model.parameters(), lr=5e-3)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(ytr))
        for i in range(0, len(order), 64):
            idx = order[i : i + 64]
            opt.zero_grad()
            F.cross_entropy(model(Tensor(xtr[idx])), Tensor(ytr[idx])).backward()
            opt.step()
    lin = [m for m in layers if isinstance(m, nn.Linear)]
    return {"weights": [m.weight.data.copy() for m in lin], "biases": [m.bias.data.copy() for m in lin],
            "xtr": xtr, "ytr": ytr, "xte": xte, "yte": yte}  # fmt: skip
