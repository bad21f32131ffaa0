"""Low-rank gradient compression before communication: PowerSGD (Vogels, Karimireddy, Jaggi 2019). [Q121]

For a gradient matrix G [O, I] (an expert's or a layer's weight gradient; conv kernels are viewed as
[out, in*kh*kw]) and a rank r:

    M  = G + e                  error feedback: e is what earlier steps failed to send
    P  = M Q                    Q [I, r] from the previous step (warm start) -- one power iteration per step
    P  = orthonormalise(P)      (QR); in data parallelism P is all-reduced (mean) BEFORE this step
    Q  = M^T P                  all-reduced (mean) too
    G^ = P Q^T                  what every rank applies; e <- M - G^  (kept locally, added next step)

Bytes on the wire per step: (O + I) * r * itemsize instead of O * I * itemsize (``bytes_sent``). If r >= rank(G)
the P step spans G's column space and G^ = P P^T G = G exactly. Warm-starting Q across steps turns the
single power iteration per step into subspace iteration over the (slowly changing) gradient sequence.
Error feedback makes the cumulative applied update track the cumulative true gradient: sum_t G^_t =
sum_t G_t - e_T, with e_T bounded, so no gradient direction is dropped for good.

The randomized-SVD variant (``rsvd_compress``) sends U_r S_r and V_r from ``lowrank.randomized_svd`` (fresh sketch,
power iterations, no state); it is more accurate per step but costs extra passes over G and, unlike PowerSGD's P/Q,
the factors of different ranks cannot be averaged linearly (each rank has its own basis).

``powersgd_allreduce_worker`` runs the all-reduce of the factors over ``tinylearn.dist`` (gloo, launched by
``tl.dist.launch``); ``train_data_parallel`` simulates W workers in one process with the same arithmetic (the mean
of P's, then of Q's) to compare PowerSGD + error feedback with uncompressed SGD.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import nn
from ..autograd import Tensor
from ..nn import functional as F
from .lowrank import randomized_svd


def _check_r(rank: Any) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or rank < 1:
        raise ValueError(f"rank: expected a positive int, got {rank!r}")
    return int(rank)


def _as_matrix(G: Any, name: str = "G") -> np.ndarray:
    G = np.asarray(G)
    if G.ndim < 2 or G.dtype.kind != "f":
        raise ValueError(f"{name}: expected a floating gradient with ndim >= 2, got shape {G.shape} dtype {G.dtype}")
    return G.reshape(G.shape[0], -1)


def orthonormalise(P: np.ndarray) -> np.ndarray:
    """Orthonormal basis (columns) of P's column space via reduced QR (zero columns stay orthonormal fillers)."""
    Q, _ = np.linalg.qr(P)
    return Q


def bytes_sent(O: int, I: int, rank: int, itemsize: int = 4) -> dict[str, float]:  # noqa: E741
    """Wire bytes of one matrix per step: dense O*I vs PowerSGD (O + I)*r (min(O, I) caps the useful rank)."""
    r = _check_r(rank)
    dense, comp = O * I * itemsize, (O + I) * r * itemsize
    return {"dense": dense, "compressed": comp, "ratio": dense / comp}


def powersgd_round(M: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One single-worker PowerSGD round on M [O, I] with Q [I, r] -> (P, Q_new, G^ = P Q_new^T)."""
    P = orthonormalise(M @ Q)
    Qn = M.T @ P
    return P, Qn, P @ Qn.T


class PowerSGD:
    """Stateful compressor: one (Q, residual) per key. ``compress(key, G)`` -> (P, Q) to send; ``decompress``."""

    def __init__(self, rank: int, error_feedback: bool = True, warm_start: bool = True, seed: int = 0) -> None:
        self.rank = _check_r(rank)
        self.error_feedback, self.warm_start = bool(error_feedback), bool(warm_start)
        self.rng = np.random.default_rng(seed)
        self.Q: dict[Any, np.ndarray] = {}
        self.residual: dict[Any, np.ndarray] = {}

    def _q(self, key: Any, n: int, r: int, dtype: Any) -> np.ndarray:
        if not self.warm_start or key not in self.Q:
            self.Q[key] = self.rng.standard_normal((n, r)).astype(dtype)
        return self.Q[key]

    def step(self, key: Any, G: Any) -> np.ndarray:
        """Compress + decompress one matrix (single worker): returns G^ in G's shape and updates the state."""
        shape = np.shape(G)
        M = _as_matrix(G).astype(np.float64)
        if self.error_feedback and key in self.residual:
            M = M + self.residual[key]
        r = min(self.rank, *M.shape)
        _, Qn, Gh = powersgd_round(M, self._q(key, M.shape[1], r, M.dtype))
        self.Q[key] = Qn
        if self.error_feedback:
            self.residual[key] = M - Gh
        return Gh.reshape(shape)


def rsvd_compress(G: Any, rank: int, power_iters: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Randomized-SVD variant: (U_r S_r [O, r], V_r [I, r]) with G ~ (U_r S_r) V_r^T."""
    M = _as_matrix(G)
    r = min(_check_r(rank), *M.shape)
    U, s, Vt = randomized_svd(M, r, oversample=min(10, max(0, min(M.shape) - r)), power_iters=power_iters, seed=seed)
    return U * s, Vt.T


# ---- data-parallel training (simulated workers) -------------------------------------------------------------------


def _mlp(seed: int, hidden: int = 64) -> nn.Module:
    from ..autograd import manual_seed

    manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train_data_parallel(
    X: np.ndarray,
    y: np.ndarray,
    steps: int,
    rank: int | None = None,
    workers: int = 2,
    lr: float = 0.1,
    batch_per_worker: int = 32,
    error_feedback: bool = True,
    seed: int = 0,
) -> list[float]:
    """SGD on a 64-hidden-10 MLP with ``workers`` simulated data-parallel ranks; ``rank=None`` = dense all-reduce
    (mean of gradients), else PowerSGD on every weight matrix: mean of the P's, orthonormalise, mean of the Q's,
    per-worker error feedback (biases are sent dense, as in the paper). Returns the full-data loss per step."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive int, got {workers!r}")
    r = None if rank is None else _check_r(rank)
    model = _mlp(seed)
    params = list(model.parameters())
    rng = np.random.default_rng(seed)
    qrng = np.random.default_rng(seed + 1)
    Qs: dict[int, np.ndarray] = {}
    res: dict[tuple[int, int], np.ndarray] = {}
    Xt = Tensor(X)
    curve = []
    for _ in range(steps):
        grads = []  # grads[w][k]
        for _w in range(workers):
            b = rng.integers(0, len(X), batch_per_worker)
            model.zero_grad()
            F.cross_entropy(model(Tensor(X[b])), y[b]).backward()
            grads.append([p.grad.numpy().astype(np.float64) for p in params])
        for k, p in enumerate(params):
            if r is None or p.grad.numpy().ndim < 2:
                upd = np.mean([g[k] for g in grads], axis=0)
            else:
                Ms = [g[k] + res.get((w, k), 0.0) for w, g in enumerate(grads)]
                rk = min(r, *Ms[0].shape)
                if k not in Qs:
                    Qs[k] = qrng.standard_normal((Ms[0].shape[1], rk))
                P = orthonormalise(np.mean([M @ Qs[k] for M in Ms], axis=0))  # all-reduce #1
                Qs[k] = np.mean([M.T @ P for M in Ms], axis=0)  # all-reduce #2 (warm start for next step)
                upd = P @ Qs[k].T
                if error_feedback:
                    for w, M in enumerate(Ms):  # each worker keeps what its own share did not convey
                        res[(w, k)] = M - P @ (M.T @ P).T
            p.data = (p.data - lr * upd).astype(p.data.dtype)
        from ..autograd import no_grad

        with no_grad():
            curve.append(float(F.cross_entropy(model(Xt), y).item()))
    return curve


# ---- the real thing over tinylearn.dist (one process per rank) ----------------------------------------------------


def powersgd_allreduce_worker(O: int, I: int, rank: int, steps: int, seed: int) -> dict[str, Any]:  # noqa: E741
    """Run inside ``tl.dist.launch``: each rank draws its own gradients G_t (seeded by rank), does ``steps`` rounds of
    PowerSGD with error feedback whose P and Q are all-reduced (mean) with ``tl.dist.all_reduce`` (ring), and returns
    its inputs and the shared results so the parent can check them against the mean of the per-rank G^."""
    import torch
    import torch.distributed as dist

    from ..dist import all_reduce

    me, world = dist.get_rank(), dist.get_world_size()
    g = np.random.default_rng(seed + 1000 * me)
    Q = np.random.default_rng(seed).standard_normal((I, rank))  # same initial Q on every rank
    e = np.zeros((O, I))
    out: dict[str, Any] = {"M": [], "P": [], "Ghat": [], "bytes": 0}
    for _ in range(steps):
        G = g.standard_normal((O, 3)) @ g.standard_normal((3, I)) + 0.1 * g.standard_normal((O, I))
        M = G + e
        P = torch.from_numpy(M @ Q)
        all_reduce(P, op="sum")
        P = orthonormalise(P.numpy() / world)
        Qt = torch.from_numpy(M.T @ P)
        all_reduce(Qt, op="sum")
        Q = Qt.numpy() / world
        Gh = P @ Q.T
        e = M - P @ (M.T @ P).T
        out["M"].append(M)
        out["P"].append(P)
        out["Ghat"].append(Gh)
        out["bytes"] += (O + I) * rank * 8
    return out
