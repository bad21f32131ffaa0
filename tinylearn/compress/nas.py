"""Hardware-aware architecture search [Q117, Q260] for a digits CNN (sklearn 8x8 digits), scored with the measured
latency table of ``latency_table``.

Search space (per stage s = 1, 2: width multiplier, kernel size, bits):

    stage 1   conv(1 -> 8*m1, k1, pad k1//2) @ 8x8, ReLU, maxpool 2      m in WIDTHS = (0.5, 1, 1.5, 2)
    stage 2   conv(c1 -> 16*m2, k2) @ 4x4, ReLU, maxpool 2                k in KERNELS = (3, 5)
    head      Linear(c2 * 4 -> 10) at the bits of stage 2                 bits in BITS = (8, 32)

(4*2*2)^2 = 256 architectures. bits=8 deploys that stage as tl.quant QuantizedConv2d / QuantizedLinear (per-channel
symmetric int8 weights, activation ranges calibrated on training data, exact int8 GEMM), 32 keeps fp32.

Objective (Q117: structure and per-layer bit width in one score):

    score(a) = acc(a) - lam * max(0, lat(a) / budget - 1) - mu * energy_mJ(a)

acc: the float structure (m, k per stage) is TRAINED with tinylearn autograd (Adam, a few epochs, cached per
structure), then each bits choice is deployed with real int8 layers and evaluated on a held-out split (cached per
arch). lat: the latency predictor (table sum + fitted per-layer overhead) for one batch. energy: latency x package
power, a MODEL (``latency_table.energy_joules``; no RAPL on this VM).

Searchers, each given the same number of evaluations (distinct or not, every call counts):
    regularized evolution (Real et al. 2019): population P, tournament of S sampled members, the winner's child
        differs in one gene, the child joins and the OLDEST member dies (aging)
    random search: independent uniform samples
Both return the best-so-far score after each evaluation. ``pareto_front`` keeps the evaluated archs that no other
beats on both accuracy (max) and predicted latency (min). ``choose`` takes the best score among archs predicted
within budget and MEASURES its deployed latency end to end.

Measured on the 2-core EPYC VM (batch 64, one thread): an int8 conv/linear entry timed 2.5-6x its fp32 twin (numpy
quantize / im2col-on-codes / requantize around a tiny int8 GEMM dominate), so bits=8 only adds latency here and the
search keeps fp32; evolution and random search reached the same mean best score within noise at 8-30 evaluations
(6 seeds), so no test claims one beats the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .latency_table import (
    LatencyPredictor,
    LatencyTable,
    Layer,
    build_table,
    energy_joules,
    make_op,
    measure_net,
    run_layers,
)

WIDTHS = (0.5, 1.0, 1.5, 2.0)
KERNELS = (3, 5)
BITS = (8, 32)
BASE = (8, 16)
Stage = tuple[float, int, int]
Arch = tuple[Stage, Stage]


def check_arch(arch: Any) -> Arch:
    """Validate an arch ((m1, k1, b1), (m2, k2, b2)); ValueError naming ``arch`` otherwise."""
    try:
        stages = tuple((float(m), int(k), int(b)) for m, k, b in arch)
    except (TypeError, ValueError):
        raise ValueError(f"arch: expected ((m, k, bits), (m, k, bits)), got {arch!r}") from None
    if len(stages) != 2 or any(m not in WIDTHS or k not in KERNELS or b not in BITS for m, k, b in stages):
        raise ValueError(f"arch: stages must have m in {WIDTHS}, k in {KERNELS}, bits in {BITS}; got {arch!r}")
    return stages  # type: ignore[return-value]


def widths(arch: Arch) -> tuple[int, int]:
    return int(BASE[0] * arch[0][0]), int(BASE[1] * arch[1][0])


def arch_layers(arch: Arch, batch: int = 64) -> list[Layer]:
    """The (op, shape, bits) list of an arch at batch size ``batch`` (input [batch, 1, 8, 8])."""
    (_, k1, b1), (_, k2, b2) = check_arch(arch)
    c1, c2 = widths(arch)
    n = batch
    return [
        ("conv2d", (n, 1, c1, k1, 8, 8), b1), ("relu", (n, c1, 8, 8), 32), ("maxpool2d", (n, c1, 8, 8), 32),
        ("conv2d", (n, c1, c2, k2, 4, 4), b2), ("relu", (n, c2, 4, 4), 32), ("maxpool2d", (n, c2, 4, 4), 32),
        ("linear", (n, c2 * 4, 10), b2),
    ]  # fmt: skip


def all_archs() -> list[Arch]:
    st = [(m, k, b) for m in WIDTHS for k in KERNELS for b in BITS]
    return [(a, b) for a in st for b in st]


def table_grid(batch: int = 64) -> list[Layer]:
    """Per-op grid measured into the table: a subset of widths (the others are interpolated), 1x1/3x3/5x5 convs at
    8x8 and 4x4, Linear widths, ReLU and pooling, at bits 8 and 32."""
    n, grid = batch, []
    for b in BITS:
        for k in (1, 3, 5):
            grid += [("conv2d", (n, 1, c, k, 8, 8), b) for c in (4, 8, 16)]
            grid += [("conv2d", (n, ci, co, k, 4, 4), b) for ci in (4, 8, 16) for co in (8, 16, 32)]
        grid += [("linear", (n, i, 10), b) for i in (32, 64, 128)]
    for c, hw in [(c, 8) for c in (4, 8, 12, 16)] + [(c, 4) for c in (8, 16, 24, 32)]:
        grid += [("relu", (n, c, hw, hw), 32), ("maxpool2d", (n, c, hw, hw), 32)]
    return grid


def fit_predictor(table: LatencyTable, n_fit: int = 12, seed: int = 0, batch: int = 64) -> LatencyPredictor:
    """Fit the predictor's overhead terms on ``n_fit`` random archs measured end to end (random weights)."""
    rng = np.random.default_rng(seed)
    space = all_archs()
    nets = [arch_layers(space[i], batch) for i in rng.choice(len(space), n_fit, replace=False)]
    return LatencyPredictor(table).fit(nets, [measure_net(n) for n in nets])


class Evaluator:
    """Trains structures (cached) and scores archs (cached): accuracy of the deployed (int8/fp32) net, predicted
    latency, energy MODEL, objective."""

    def __init__(
        self,
        predictor: LatencyPredictor,
        budget_s: float,
        lam: float = 1.0,
        mu: float = 0.0,
        epochs: int = 3,
        batch: int = 64,
        seed: int = 0,
    ) -> None:
        if not budget_s > 0:
            raise ValueError(f"budget_s: expected > 0, got {budget_s!r}")
        if lam < 0 or mu < 0:
            raise ValueError(f"lam/mu: expected >= 0, got lam={lam!r}, mu={mu!r}")
        if int(epochs) < 1:
            raise ValueError(f"epochs: expected >= 1, got {epochs!r}")
        from ..data import load_digits

        self.predictor, self.budget_s, self.lam, self.mu = predictor, float(budget_s), float(lam), float(mu)
        self.epochs, self.batch, self.seed = int(epochs), int(batch), int(seed)
        x, y = load_digits()
        perm = np.random.default_rng(1234).permutation(len(y))
        self.xtr, self.ytr = x[perm[:1300]], y[perm[:1300]]
        self.xte, self.yte = x[perm[1300:]], y[perm[1300:]]
        self.models: dict[tuple, Any] = {}
        self.results: dict[Arch, dict[str, float]] = {}
        self.calls = 0

    def train(self, structure: tuple) -> Any:
        """The float model of structure (m1, k1, m2, k2), trained once (Adam lr 1e-2, ``epochs`` epochs)."""
        if structure in self.models:
            return self.models[structure]
        from .. import nn, optim
        from ..autograd import Tensor, manual_seed
        from ..nn import functional as F

        m1, k1, m2, k2 = structure
        c1, c2 = int(BASE[0] * m1), int(BASE[1] * m2)
        manual_seed(self.seed)
        model = nn.Sequential(
            nn.Conv2d(1, c1, k1, padding=k1 // 2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, k2, padding=k2 // 2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(c2 * 4, 10),
        )  # fmt: skip
        opt = optim.Adam(model.parameters(), lr=1e-2)
        rng = np.random.default_rng(self.seed)
        for _ in range(self.epochs):
            order = rng.permutation(len(self.ytr))
            for i in range(0, len(order), 64):
                idx = order[i : i + 64]
                opt.zero_grad()
                F.cross_entropy(model(Tensor(self.xtr[idx])), Tensor(self.ytr[idx])).backward()
                opt.step()
        self.models[structure] = model
        return model

    def deploy(self, arch: Arch) -> list[Any]:
        """Layer callables of the trained arch: bits-8 stages as int8 layers calibrated on 256 training images."""
        from ..autograd import Tensor, no_grad

        arch = check_arch(arch)
        model = self.train((arch[0][0], arch[0][1], arch[1][0], arch[1][1]))
        mods = [model[i] for i in (0, 1, 2, 3, 4, 5, 7)]
        layers = arch_layers(arch, self.batch)
        fns, x = [], Tensor(self.xtr[:256])
        with no_grad():
            for mod, (op, shape, bits) in zip(mods, layers, strict=True):
                if op == "linear":
                    x = Tensor(x.data.reshape(x.shape[0], -1))
                y = mod(x)
                rng_in = (float(x.data.min()), float(x.data.max()))
                rng_out = (float(y.data.min()), float(y.data.max()))
                fns.append(make_op(op, shape, bits, module=mod, in_range=rng_in, out_range=rng_out))
                x = y
        return fns

    def accuracy(self, arch: Arch) -> float:
        from ..autograd import Tensor, no_grad

        fns = self.deploy(arch)  # trains outside no_grad
        with no_grad():
            out = run_layers(fns, arch_layers(arch, self.batch), Tensor(self.xte))
        return float((out.data.argmax(1) == self.yte).mean())

    def __call__(self, arch: Any) -> dict[str, float]:
        """Score one arch (counts as one evaluation even when cached)."""
        arch = check_arch(arch)
        self.calls += 1
        if arch not in self.results:
            lat = float(self.predictor.predict(arch_layers(arch, self.batch)))
            acc = self.accuracy(arch)
            e_mj = energy_joules(lat) * 1e3
            score = float(acc - self.lam * max(0.0, lat / self.budget_s - 1.0) - self.mu * e_mj)
            self.results[arch] = {"acc": acc, "lat_s": lat, "energy_mJ_model": e_mj, "score": score}
        return self.results[arch]


def _random_arch(rng: np.random.Generator) -> Arch:
    return tuple(
        (WIDTHS[rng.integers(len(WIDTHS))], KERNELS[rng.integers(len(KERNELS))], BITS[rng.integers(len(BITS))])
        for _ in range(2)
    )  # type: ignore[return-value]


def mutate(arch: Arch, rng: np.random.Generator) -> Arch:
    """Change one gene (a stage's width, kernel or bits) to a different value."""
    stages = [list(s) for s in check_arch(arch)]
    s, g = int(rng.integers(2)), int(rng.integers(3))
    choices = [v for v in (WIDTHS, KERNELS, BITS)[g] if v != stages[s][g]]
    stages[s][g] = choices[rng.integers(len(choices))]
    return tuple(tuple(st) for st in stages)  # type: ignore[return-value]


@dataclass
class SearchResult:
    best: Arch
    best_score: float
    curve: list[float] = field(default_factory=list)  # best-so-far score after each evaluation
    history: list[Arch] = field(default_factory=list)


def _check_n(n_evals: int, minimum: int) -> int:
    if int(n_evals) < minimum:
        raise ValueError(f"n_evals: expected >= {minimum}, got {n_evals!r}")
    return int(n_evals)


def _record(ev: Evaluator, arch: Arch, res: SearchResult) -> float:
    s = ev(arch)["score"]
    res.history.append(arch)
    if not res.curve or s > res.best_score:
        res.best, res.best_score = arch, s
    res.curve.append(res.best_score)
    return s


def random_search(ev: Evaluator, n_evals: int, seed: int = 0) -> SearchResult:
    rng, res = np.random.default_rng(seed), SearchResult(best=None, best_score=-np.inf)  # type: ignore[arg-type]
    for _ in range(_check_n(n_evals, 1)):
        _record(ev, _random_arch(rng), res)
    return res


def evolution_search(ev: Evaluator, n_evals: int, population: int = 8, sample: int = 3, seed: int = 0) -> SearchResult:
    """Regularized (aging) evolution: tournament of ``sample`` from a ``population`` queue, oldest removed."""
    n_evals = _check_n(n_evals, population)
    if not 1 <= sample <= population:
        raise ValueError(f"sample: expected 1 <= sample <= population={population}, got {sample!r}")
    rng, res = np.random.default_rng(seed), SearchResult(best=None, best_score=-np.inf)  # type: ignore[arg-type]
    pop: list[tuple[Arch, float]] = []
    for _ in range(population):
        a = _random_arch(rng)
        pop.append((a, _record(ev, a, res)))
    while len(res.curve) < n_evals:
        cands = [pop[i] for i in rng.choice(len(pop), sample, replace=False)]
        parent = max(cands, key=lambda p: p[1])[0]
        child = mutate(parent, rng)
        pop.append((child, _record(ev, child, res)))
        pop.pop(0)  # aging: the oldest dies, whatever its score
    return res


def pareto_front(results: dict[Arch, dict[str, float]]) -> list[tuple[Arch, float, float]]:
    """(arch, acc, predicted latency) of the non-dominated archs (higher acc, lower latency), by latency."""
    pts = [(a, r["acc"], r["lat_s"]) for a, r in results.items()]
    front = [
        p for p in pts
        if not any(q[1] >= p[1] and q[2] <= p[2] and (q[1] > p[1] or q[2] < p[2]) for q in pts)
    ]  # fmt: skip
    return sorted(front, key=lambda p: p[2])


def choose(ev: Evaluator, archs: Sequence[Arch] | None = None, repeat: int = 9) -> dict[str, Any]:
    """Best-scoring evaluated arch predicted within budget, with its deployed latency MEASURED end to end."""
    pool = {a: ev.results[a] for a in (archs if archs is not None else ev.results) if a in ev.results}
    ok = {a: r for a, r in pool.items() if r["lat_s"] <= ev.budget_s}
    if not ok:
        raise RuntimeError(f"budget_s: no evaluated arch is predicted within {ev.budget_s:.3g} s")
    best = max(ok, key=lambda a: ok[a]["score"])
    measured = measure_net(arch_layers(best, ev.batch), ev.deploy(best), repeat=repeat)
    return {
        "arch": best, **ok[best], "measured_s": measured, "budget_s": ev.budget_s,
        "pred_rel_err": abs(ok[best]["lat_s"] - measured) / measured,
        "energy_mJ_model_measured": energy_joules(measured) * 1e3,
    }  # fmt: skip


def setup(
    table_path: Any = None, batch: int = 64, n_fit: int = 12, budget_quantile: float = 0.4, seed: int = 0
) -> tuple[LatencyTable, LatencyPredictor, float]:
    """Measure (or load) the table, fit the predictor, and set the budget at a quantile of predicted latencies."""
    if not 0 < budget_quantile < 1:
        raise ValueError(f"budget_quantile: expected in (0, 1), got {budget_quantile!r}")
    table = build_table(table_grid(batch), table_path)
    pred = fit_predictor(table, n_fit, seed, batch)
    lats = [pred.predict(arch_layers(a, batch)) for a in all_archs()]
    return table, pred, float(np.quantile(lats, budget_quantile))
