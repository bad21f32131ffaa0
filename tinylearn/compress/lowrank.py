"""Low-rank factorisation of Linear / Conv2d layers by (randomized) SVD, and low-rank reparameterised students.
[Q28, Q116]

    Linear W [out, in] ~ U_r S_r V_r^T  ->  Linear(in, r, bias=False) with A = S_r^{1/2} V_r^T  [r, in]
                                            then Linear(r, out) with B = U_r S_r^{1/2}            [out, r] (+ bias)
    Conv2d W [out, in, kh, kw]: the im2col view M = W.reshape(out, in*kh*kw) (the GEMM a conv really is) is
                                factorised the same way -> Conv2d(in, r, (kh, kw), same stride/padding/dilation)
                                with filters A.reshape(r, in, kh, kw), then a 1x1 Conv2d(r, out) with B (+ bias)
    params  in*out -> r*(in + out)   (conv: in*kh*kw*out -> r*(in*kh*kw + out)); FLOPs scale the same way
    rank    ``rank_for_energy(s, energy)``: smallest r with sum_{i<r} s_i^2 >= energy * sum s_i^2 (the kept
            fraction of ||W||_F^2); ``rank_for_budget(m, n, budget)``: largest r with r*(m+n) <= budget*m*n
    error   Eckart-Young: ||W - W_r||_F^2 = sum_{i>=r} s_i^2 and ||W - W_r||_2 = s_r (optimal among rank-r)

``randomized_svd`` (Halko, Martinsson, Tropp 2011): sample Y = M Omega (Omega Gaussian [n, r + oversample]),
``power_iters`` rounds of Y = M (M^T Y) with QR re-orthonormalisation (sharpens a slowly decaying spectrum),
Q = qr(Y), SVD of the small B = Q^T M. Cost O(mn(r+p)) instead of O(mn min(m, n)).

``factorize(model, energy=..., budget=...)`` replaces every eligible Linear/Conv2d (groups=1) in place when the
factorisation actually saves parameters, and returns a per-layer report (params and MACs before/after).

[Q116] ``LowRankLinear(in, out, r)`` is a reparameterised layer W = B A trained directly (e.g. by distillation
from a full teacher); ``lowrank_penalty(model)`` = sum ||A||_F^2 + ||B||_F^2, whose minimum over factorisations
of a fixed W equals 2 ||W||_* (nuclear norm), so it pushes the product towards low rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import nn
from ..autograd import Tensor
from ..nn import functional as F


def _check_rank(rank: Any, m: int, n: int, name: str = "rank") -> int:
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 1 <= rank <= min(m, n):
        raise ValueError(
            f"{name}: expected an int in [1, min(out, in) = {min(m, n)}] for a [{m}, {n}] matrix, got {rank!r}"
        )
    return int(rank)


def _check_energy(energy: Any) -> float:
    if isinstance(energy, bool) or not isinstance(energy, int | float | np.floating) or not 0 < energy <= 1:
        raise ValueError(f"energy: expected a fraction in (0, 1], got {energy!r}")
    return float(energy)


def rank_for_energy(s: np.ndarray, energy: float) -> int:
    """Smallest r such that the top-r singular values keep >= ``energy`` of sum(s^2) (= ||W||_F^2)."""
    energy = _check_energy(energy)
    s = np.sort(np.abs(np.asarray(s, np.float64)))[::-1]
    if s.size == 0 or s[0] == 0:
        return 1
    frac = np.cumsum(s**2) / np.sum(s**2)
    return int(min(np.searchsorted(frac, energy - 1e-12) + 1, s.size))


def rank_for_budget(m: int, n: int, budget: float) -> int:
    """Largest r >= 1 with r * (m + n) <= budget * m * n (``budget`` = kept fraction of the dense parameters)."""
    if isinstance(budget, bool) or not isinstance(budget, int | float | np.floating) or not 0 < budget <= 1:
        raise ValueError(f"budget: expected a fraction of the dense parameter count in (0, 1], got {budget!r}")
    return int(max(1, min(min(m, n), np.floor(budget * m * n / (m + n)))))


def randomized_svd(
    M: np.ndarray, r: int, oversample: int = 10, power_iters: int = 2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank-r (U [m, r], s [r], Vt [r, n]) of ``M`` by Halko-Martinsson-Tropp randomized range finding."""
    M = np.asarray(M)
    if M.ndim != 2:
        raise ValueError(f"M: expected a 2-D matrix, got shape {M.shape}")
    m, n = M.shape
    r = _check_rank(r, m, n, "r")
    if isinstance(oversample, bool) or not isinstance(oversample, int) or oversample < 0:
        raise ValueError(f"oversample: expected an int >= 0, got {oversample!r}")
    if isinstance(power_iters, bool) or not isinstance(power_iters, int) or power_iters < 0:
        raise ValueError(f"power_iters: expected an int >= 0, got {power_iters!r}")
    k = min(r + oversample, min(m, n))
    omega = np.random.default_rng(seed).standard_normal((n, k)).astype(M.dtype if M.dtype.kind == "f" else np.float64)
    Q, _ = np.linalg.qr(M @ omega)
    for _ in range(power_iters):
        Z, _ = np.linalg.qr(M.T @ Q)
        Q, _ = np.linalg.qr(M @ Z)
    Ub, s, Vt = np.linalg.svd(Q.T @ M, full_matrices=False)
    return (Q @ Ub)[:, :r], s[:r], Vt[:r]


def svd_factors(W: np.ndarray, rank: int, randomized: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(A [r, n], B [m, r]) with B @ A the best rank-r approximation of W [m, n]; A = S^1/2 V^T, B = U S^1/2."""
    W = np.asarray(W, np.float64)
    if W.ndim != 2:
        raise ValueError(f"W: expected a 2-D matrix, got shape {W.shape}")
    r = _check_rank(rank, *W.shape)
    if randomized:
        U, s, Vt = randomized_svd(W, r)
    else:
        U, s, Vt = np.linalg.svd(W, full_matrices=False)
    sq = np.sqrt(s[:r])
    return sq[:, None] * Vt[:r], U[:, :r] * sq[None, :]


def _pick_rank(W2d: np.ndarray, rank: int | None, energy: float | None, budget: float | None) -> int:
    m, n = W2d.shape
    given = [k for k, v in (("rank", rank), ("energy", energy), ("budget", budget)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"rank/energy/budget: give exactly one of them, got {given or 'none'}")
    if rank is not None:
        return _check_rank(rank, m, n)
    if energy is not None:
        return rank_for_energy(np.linalg.svd(W2d, compute_uv=False), energy)
    return rank_for_budget(m, n, budget)  # type: ignore[arg-type]


def _set(p: Any, a: np.ndarray) -> None:
    p.data = np.ascontiguousarray(a, dtype=p.data.dtype)


def factorize_linear(
    layer: nn.Linear, rank: int | None = None, energy: float | None = None, budget: float | None = None
) -> nn.Sequential:
    """Sequential(Linear(in, r, bias=False), Linear(r, out)) whose product is the rank-r SVD truncation of W."""
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"layer: expected tl.nn.Linear, got {type(layer).__name__}")
    W = layer.weight.numpy().astype(np.float64)
    r = _pick_rank(W, rank, energy, budget)
    A, B = svd_factors(W, r)
    first, second = (
        nn.Linear(layer.in_features, r, bias=False),
        nn.Linear(r, layer.out_features, bias=layer.bias is not None),
    )
    _set(first.weight, A)
    _set(second.weight, B)
    if layer.bias is not None:
        _set(second.bias, layer.bias.numpy())
    return nn.Sequential(first, second)


def factorize_conv2d(
    layer: nn.Conv2d, rank: int | None = None, energy: float | None = None, budget: float | None = None
) -> nn.Sequential:
    """Conv2d(in, r, k, stride, padding, dilation, bias=False) then 1x1 Conv2d(r, out): the im2col GEMM factorised."""
    if not isinstance(layer, nn.Conv2d):
        raise TypeError(f"layer: expected tl.nn.Conv2d, got {type(layer).__name__}")
    if layer.groups != 1:
        raise ValueError(f"layer: only groups=1 convolutions can be factorised this way, got groups={layer.groups}")
    w = layer.weight.numpy().astype(np.float64)
    out_c, in_c, kh, kw = w.shape
    r = _pick_rank(w.reshape(out_c, -1), rank, energy, budget)
    A, B = svd_factors(w.reshape(out_c, -1), r)
    first = nn.Conv2d(
        in_c, r, (kh, kw), stride=layer.stride, padding=layer.padding, dilation=layer.dilation, bias=False,
        padding_mode=layer.padding_mode,
    )  # fmt: skip
    second = nn.Conv2d(r, out_c, 1, bias=layer.bias is not None)
    _set(first.weight, A.reshape(r, in_c, kh, kw))
    _set(second.weight, B.reshape(out_c, r, 1, 1))
    if layer.bias is not None:
        _set(second.bias, layer.bias.numpy())
    return nn.Sequential(first, second)


def _params_macs(layer: Any) -> tuple[int, int]:
    """(parameters, multiply-adds per sample for Linear / per output position for Conv2d)."""
    w = layer.weight.shape
    macs = int(np.prod(w))
    return macs + (0 if layer.bias is None else int(layer.bias.shape[0])), macs


def factorize(
    model: nn.Module, energy: float | None = None, budget: float | None = None, rank: int | None = None
) -> list[dict[str, Any]]:
    """Replace every Linear / groups=1 Conv2d of ``model`` (in place) by its factorisation when that saves
    parameters. Returns one row per considered layer: name, kind, shape, rank, params/MACs before and after
    (MACs per sample for Linear, per output position for Conv2d), replaced (bool)."""
    if sum(v is not None for v in (energy, budget, rank)) != 1:
        raise ValueError("energy/budget/rank: give exactly one of them")
    if energy is not None:
        _check_energy(energy)
    report = []
    targets = [
        (name, parent, key, child)
        for name, parent in model.named_modules()
        for key, child in list(parent._modules.items())
        if isinstance(child, nn.Linear) or (isinstance(child, nn.Conv2d) and child.groups == 1)
    ]
    for pname, parent, key, child in targets:
        full = f"{pname}.{key}" if pname else key
        W = child.weight.numpy()
        m, n = W.shape[0], int(np.prod(W.shape[1:]))
        r = min(rank, min(m, n)) if rank is not None else None
        fac = (factorize_linear if isinstance(child, nn.Linear) else factorize_conv2d)(child, r, energy, budget)
        p0, f0 = _params_macs(child)
        p1, f1 = (a + b for a, b in zip(_params_macs(fac[0]), _params_macs(fac[1]), strict=True))
        replaced = p1 < p0
        if replaced:
            parent.add_module(key, fac)
        report.append(
            {"name": full, "kind": type(child).__name__, "shape": tuple(W.shape), "rank": fac[0].weight.shape[0],
             "params_before": p0, "params_after": p1 if replaced else p0, "macs_before": f0,
             "macs_after": f1 if replaced else f0, "replaced": replaced}
        )  # fmt: skip
    return report


class LowRankLinear(nn.Module):
    """y = x A^T B^T + b with A [r, in], B [out, r] trained directly (W = B A never materialised). [Q116]"""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        r = _check_rank(rank, out_features, in_features)
        self.in_features, self.out_features, self.rank = in_features, out_features, r
        # torch.nn.Linear's default init for both factors (tl.manual_seed controls it)
        self.A = nn.Linear(in_features, r, bias=False).weight
        second = nn.Linear(r, out_features, bias=bias)
        self.B, self.bias = second.weight, second.bias

    @classmethod
    def from_linear(cls, layer: nn.Linear, rank: int) -> LowRankLinear:
        """Initialise the factors from the SVD truncation of a trained Linear."""
        out = cls(layer.in_features, layer.out_features, rank, bias=layer.bias is not None)
        A, B = svd_factors(layer.weight.numpy(), out.rank)
        _set(out.A, A)
        _set(out.B, B)
        if layer.bias is not None:
            _set(out.bias, layer.bias.numpy())
        return out

    def weight(self) -> np.ndarray:
        return self.B.numpy() @ self.A.numpy()

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(F.linear(x, self.A), self.B, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


def lowrank_penalty(model: nn.Module) -> Tensor:
    """sum over LowRankLinear layers of ||A||_F^2 + ||B||_F^2 (a variational form of 2 * nuclear norm of B A)."""
    terms = [(m.A * m.A).sum() + (m.B * m.B).sum() for m in model.modules() if isinstance(m, LowRankLinear)]
    if not terms:
        raise ValueError("model: contains no LowRankLinear layer to penalise")
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def count_params(model: nn.Module) -> int:
    return int(sum(int(np.prod(p.shape)) for p in model.parameters()))


def speedup_report(
    kind: str = "linear", size: int = 512, rank: int = 64, batch: int = 256, repeat: int = 10
) -> dict[str, float]:
    """Median forward time (tinylearn.bench.measure) of a dense layer vs its rank-``rank`` factorisation.

    kind="linear": Linear(size, size) on [batch, size]; kind="conv": Conv2d(size, size, 3, padding=1) on
    [batch, size, 8, 8]. Returns dense_ms, factored_ms, speedup, params ratio. No claim is asserted on the timing.
    """
    from ..autograd import no_grad
    from ..bench.timing import measure

    if kind == "linear":
        dense: Any = nn.Linear(size, size)
        x = Tensor(np.random.default_rng(0).standard_normal((batch, size)).astype(np.float32))
        fac = factorize_linear(dense, rank=rank)
    elif kind == "conv":
        dense = nn.Conv2d(size, size, 3, padding=1)
        x = Tensor(np.random.default_rng(0).standard_normal((batch, size, 8, 8)).astype(np.float32))
        fac = factorize_conv2d(dense, rank=rank)
    else:
        raise ValueError(f"kind: expected 'linear' or 'conv', got {kind!r}")
    with no_grad():
        td = measure(lambda: dense(x), repeat=repeat)
        tf = measure(lambda: fac(x), repeat=repeat)
    return {
        "dense_ms": td.median_ms,
        "factored_ms": tf.median_ms,
        "speedup": td.median / tf.median,
        "params_ratio": count_params(fac) / count_params(dense),
    }
