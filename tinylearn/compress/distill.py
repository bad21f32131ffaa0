"""Knowledge distillation (Hinton et al. 2015): soft targets, hint losses, a training loop, progressive chains,
and a (temperature, pruning ratio) schedule search.  [Q28, Q40, Q204]

    distill_loss(s, t, T, alpha, targets)   alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * CE(s, y)
                                            KL is averaged over the batch ("batchmean", like torch's F.kl_div);
                                            the teacher is detached (it is frozen during distillation)
    FeatureDistill(student_dim, teacher_dim)  FitNets hint loss: || P h_s - h_t ||^2 with a learned projection P
    Distiller(teacher, student, opt, T, alpha, feature_pairs)  .step(x, y) -> dict of loss terms
    progressive_distill(teacher, chain, ...)  teacher -> teaching assistant(s) -> student (Mirzadeh et al. 2020):
                                            each model is distilled from the previous one, not from the big teacher
    search_schedule(...)                     grid over (T schedule, pruning-ratio schedule) with early stopping on
                                            validation loss; returns the best schedule and every curve

Why T^2: with z_s = s / T, d KL / d s = (softmax(s/T) - softmax(t/T)) / T. For logits small against T,
softmax(z) ~ 1/C + (z - mean z) / C, so the difference is itself O(1/T) and the gradient is O(1/T^2). Multiplying
the soft term by T^2 keeps its gradient magnitude independent of T, so changing T does not silently re-weight the
soft term against the hard CE term (tests/compress/test_distill.py measures |grad| * T^2 ~ constant).

Everything runs on tinylearn autograd Tensors; the torch oracle (F.kl_div(..., reduction="batchmean") * T^2 +
F.cross_entropy) is in the tests.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import nn, optim
from .. import prune as _prune
from ..autograd import Tensor, no_grad
from ..nn import functional as F


def _check_T_alpha(T: Any, alpha: Any) -> tuple[float, float]:
    if isinstance(T, bool) or not isinstance(T, int | float | np.integer | np.floating) or not 0 < T < np.inf:
        raise ValueError(f"T: temperature must be a finite number > 0, got {T!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.integer | np.floating) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha: weight of the soft term must be in [0, 1], got {alpha!r}")
    return float(T), float(alpha)


def _as_tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def soft_kl(student_logits: Tensor, teacher_logits: Any, T: float) -> Tensor:
    """KL(softmax(t/T) || softmax(s/T)) averaged over the batch (no T^2 factor); the teacher is detached."""
    s = _as_tensor(student_logits)
    t = _as_tensor(teacher_logits).detach()
    if s.shape != t.shape or len(s.shape) != 2:
        raise ValueError(f"teacher_logits: expected shape {s.shape} [N, C] like student_logits, got {t.shape}")
    log_ps = F.log_softmax(s / T, dim=-1)
    log_pt = F.log_softmax(t / T, dim=-1)
    pt = log_pt.exp()
    return (pt * (log_pt - log_ps)).sum() / s.shape[0]


def distill_loss(student_logits: Tensor, teacher_logits: Any, T: float, alpha: float, targets: Any = None) -> Tensor:
    """alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * CE(s, targets) (targets needed if alpha < 1)."""
    T, alpha = _check_T_alpha(T, alpha)
    loss = soft_kl(student_logits, teacher_logits, T) * (alpha * T * T)
    if alpha < 1:
        if targets is None:
            raise ValueError(f"targets: required when alpha < 1 (the hard CE term has weight {1 - alpha})")
        loss = loss + F.cross_entropy(student_logits, targets) * (1 - alpha)
    return loss


class FeatureDistill(nn.Module):
    """Hint loss mean((h_s P^T + b - h_t)^2) with a learned projection P [teacher_dim, student_dim] (FitNets)."""

    def __init__(self, student_dim: int, teacher_dim: int) -> None:
        super().__init__()
        for name, v in (("student_dim", student_dim), ("teacher_dim", teacher_dim)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        self.proj = nn.Linear(int(student_dim), int(teacher_dim))

    def forward(self, h_student: Tensor, h_teacher: Any) -> Tensor:
        h_s = h_student.reshape(h_student.shape[0], -1)
        h_t = _as_tensor(h_teacher).detach()
        h_t = h_t.reshape(h_t.shape[0], -1)
        if h_s.shape[1] != self.proj.in_features or h_t.shape[1] != self.proj.out_features:
            raise ValueError(
                f"h_student/h_teacher: expected feature dims ({self.proj.in_features}, {self.proj.out_features}), "
                f"got {h_s.shape[1]} and {h_t.shape[1]}"
            )
        d = self.proj(h_s) - h_t
        return (d * d).mean()


class Distiller:
    """One optimisation step = teacher forward (no grad) + student forward + distill_loss (+ hint losses).

    ``feature_pairs``: list of (student_module, teacher_module, FeatureDistill[, weight]); the modules' outputs are
    captured with forward hooks. The projections' parameters must be in ``optimizer`` (``hint_parameters()``).
    """

    def __init__(
        self,
        teacher: nn.Module,
        student: nn.Module,
        optimizer: Any,
        T: float = 4.0,
        alpha: float = 0.9,
        feature_pairs: Sequence[tuple] | None = None,
    ) -> None:
        self.T, self.alpha = _check_T_alpha(T, alpha)
        self.teacher, self.student, self.optimizer = teacher, student, optimizer
        self.pairs: list[tuple[Any, Any, FeatureDistill, float]] = []
        for i, p in enumerate(feature_pairs or []):
            if len(p) not in (3, 4) or not isinstance(p[2], FeatureDistill):
                raise ValueError(f"feature_pairs[{i}]: expected (student_module, teacher_module, FeatureDistill[, w])")
            self.pairs.append((p[0], p[1], p[2], float(p[3]) if len(p) == 4 else 1.0))
        self._feats: dict[tuple[int, str], Any] = {}

    def hint_parameters(self) -> list:
        return [q for _, _, fd, _ in self.pairs for q in fd.parameters()]

    def _hooks(self) -> list:
        hs = []
        for i, (sm, tm, _, _) in enumerate(self.pairs):
            hs.append(sm.register_forward_hook(lambda m, a, o, i=i: self._feats.__setitem__((i, "s"), o)))
            hs.append(tm.register_forward_hook(lambda m, a, o, i=i: self._feats.__setitem__((i, "t"), o)))
        return hs

    def step(self, x: Any, y: Any) -> dict[str, float]:
        handles = self._hooks()
        try:
            self.teacher.eval()
            with no_grad():
                t_logits = self.teacher(_as_tensor(x))
            self.student.train()
            s_logits = self.student(_as_tensor(x))
            loss = distill_loss(s_logits, t_logits, self.T, self.alpha, y)
            out = {"distill": float(loss.item())}
            for i, (_, _, fd, w) in enumerate(self.pairs):
                h = fd(self._feats[(i, "s")], self._feats[(i, "t")]) * w
                out[f"hint{i}"] = float(h.item())
                loss = loss + h
        finally:
            for h in handles:
                h.remove()
            self._feats.clear()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        out["loss"] = float(loss.item())
        return out


# ---- small training utilities used by the experiments ---------------------------------------------------------


def _batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    idx = rng.permutation(n)
    return [idx[i : i + batch_size] for i in range(0, n, batch_size)]


def train_supervised(
    model: nn.Module, X: np.ndarray, y: np.ndarray, epochs: int, lr: float = 1e-2, batch_size: int = 64, seed: int = 0
) -> nn.Module:
    """Plain CE training with Adam (the 'student alone' baseline and the teacher's training)."""
    opt = optim.Adam(list(model.parameters()), lr=lr)
    rng = np.random.default_rng(seed)
    model.train()
    for _ in range(epochs):
        for b in _batches(len(X), batch_size, rng):
            loss = F.cross_entropy(model(Tensor(X[b])), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def train_distilled(
    teacher: nn.Module,
    student: nn.Module,
    X: np.ndarray,
    y: np.ndarray,
    epochs: int,
    T: float = 4.0,
    alpha: float = 0.9,
    lr: float = 1e-2,
    batch_size: int = 64,
    seed: int = 0,
) -> nn.Module:
    """Distil ``teacher`` into ``student`` with the same optimiser/batches as ``train_supervised``."""
    d = Distiller(teacher, student, optim.Adam(list(student.parameters()), lr=lr), T, alpha)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for b in _batches(len(X), batch_size, rng):
            d.step(X[b], y[b])
    return student


def evaluate(model: nn.Module, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(accuracy, mean NLL) of ``model`` on (X, y)."""
    model.eval()
    with no_grad():
        logits = model(Tensor(X))
        nll = float(F.cross_entropy(logits, y).item())
    return float((logits.numpy().argmax(1) == y).mean()), nll


def progressive_distill(
    teacher: nn.Module,
    chain: Sequence[nn.Module],
    X: np.ndarray,
    y: np.ndarray,
    epochs: int,
    T: float = 4.0,
    alpha: float = 0.9,
    lr: float = 1e-2,
    seed: int = 0,
) -> list[nn.Module]:
    """Teacher -> chain[0] (assistant) -> ... -> chain[-1] (student): each stage distils from the previous stage."""
    if len(chain) == 0:
        raise ValueError("chain: expected at least one student model, got an empty sequence")
    prev = teacher
    for k, m in enumerate(chain):
        train_distilled(prev, m, X, y, epochs, T, alpha, lr, seed=seed + k)
        prev = m
    return list(chain)


# ---- (T, pruning ratio) schedule search [Q204] -------------------------------------------------------------------


def _prune_to(model: nn.Module, target: float, current: float) -> float:
    """Raise every Linear/Conv weight's sparsity from ``current`` to ``target`` (L1, pruning the remaining weights)."""
    if target <= current + 1e-12:
        return current
    amount = (target - current) / (1.0 - current)
    for m in model.modules():
        if isinstance(m, nn.Linear | nn.Conv2d):
            _prune.l1_unstructured(m, "weight", amount=float(amount))
    return target


def search_schedule(
    teacher: nn.Module,
    make_student: Callable[[], nn.Module],
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    T_schedules: dict[str, Sequence[float]],
    prune_schedules: dict[str, Sequence[float]],
    epochs: int,
    alpha: float = 0.9,
    lr: float = 1e-2,
    patience: int = 2,
    seed: int = 0,
) -> dict[str, Any]:
    """Grid over (T schedule, pruning-ratio schedule): per-epoch T and target sparsity lists of length ``epochs``.

    Each config trains a fresh ``make_student()``: at epoch e it prunes (L1, all Linear/Conv weights) up to
    ``prune_schedule[e]`` and distils one epoch at ``T_schedule[e]``, then records the validation loss. A config
    stops early when the validation loss has not improved for ``patience`` epochs *after* the final sparsity was
    reached (stopping earlier would compare a half-pruned model). The score is the validation loss of the last
    epoch at the final sparsity. Returns {"best": (T_name, p_name), "best_val": float, "curves": {(T, p): [...]},
    "stopped_at": {...}}.
    """
    if len(data) != 4:
        raise ValueError(f"data: expected (X_train, y_train, X_val, y_val), got {len(data)} items")
    Xtr, ytr, Xva, yva = data
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs: expected a positive int, got {epochs!r}")
    for label, scheds in (("T_schedules", T_schedules), ("prune_schedules", prune_schedules)):
        if not scheds:
            raise ValueError(f"{label}: expected a non-empty dict name -> per-epoch list")
        for k, s in scheds.items():
            if len(s) != epochs:
                raise ValueError(f"{label}[{k!r}]: expected {epochs} per-epoch values, got {len(s)}")
    for k, s in prune_schedules.items():
        if any(not 0 <= p < 1 for p in s) or any(b < a for a, b in zip(s, s[1:], strict=False)):
            raise ValueError(f"prune_schedules[{k!r}]: sparsities must be non-decreasing in [0, 1), got {list(s)}")
    for s in T_schedules.values():
        for t in s:
            _check_T_alpha(t, alpha)
    curves: dict[tuple[str, str], list[float]] = {}
    stopped: dict[tuple[str, str], int] = {}
    scores: dict[tuple[str, str], float] = {}
    for tn, pn in itertools.product(T_schedules, prune_schedules):
        Ts, ps = T_schedules[tn], prune_schedules[pn]
        student = make_student()
        opt = optim.Adam(list(student.parameters()), lr=lr)
        rng = np.random.default_rng(seed)
        cur, best, bad, curve = 0.0, math.inf, 0, []
        for e in range(epochs):
            cur = _prune_to(student, float(ps[e]), cur)
            d = Distiller(teacher, student, opt, float(Ts[e]), alpha)
            for b in _batches(len(Xtr), 64, rng):
                d.step(Xtr[b], ytr[b])
            curve.append(evaluate(student, Xva, yva)[1])
            stopped[(tn, pn)] = e
            if cur >= ps[-1] - 1e-12:
                if curve[-1] < best - 1e-4:
                    best, bad = curve[-1], 0
                else:
                    bad += 1
                    if bad >= patience:
                        break
        curves[(tn, pn)] = curve
        scores[(tn, pn)] = curve[-1]
    key = min(scores, key=scores.__getitem__)
    return {"best": key, "best_val": scores[key], "curves": curves, "stopped_at": stopped, "scores": scores}


def clone(model: nn.Module) -> nn.Module:
    """Deep copy (fresh parameters) of a tinylearn module."""
    return copy.deepcopy(model)
