"""Hessian-trace sensitivity (Hutchinson's estimator) and a mixed-precision bit allocation (HAWQ-V2 style).

Hutchinson: for v with i.i.d. Rademacher (+-1) entries, E[v^T H v] = Tr(H). With v spanning all parameters,
v_l^T (H v)_l estimates Tr(H_ll), the trace of layer l's diagonal block (cross terms have zero mean). H v comes
from a central difference of gradients, H v ~ (g(w + eps v) - g(w - eps v)) / (2 eps) -- exact for a quadratic,
O(eps^2) error otherwise -- so only first-order backward passes are needed.

Allocation: quantizing layer l to b bits perturbs the loss by about 1/2 dW^T H dW ~ (Tr(H_l) / n_l) ||Q_b(W_l) -
W_l||^2 / 2 (HAWQ-V2, Dong et al. 2020). Pick b_l from the candidates minimising sum_l Omega_l(b_l) subject to
sum_l n_l b_l <= avg_bits * sum_l n_l (exhaustive search for a few layers, greedy otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._inputs import as_array
from ..autograd import Tensor
from .args import as_int, is_int, real_arg


def _grads(loss_fn: Callable[[], Tensor], params: Sequence[Tensor]) -> list[np.ndarray]:
    for p in params:
        p.grad = None
    loss = loss_fn()
    loss.backward()
    return [np.zeros(p.shape) if p.grad is None else p.grad.data.astype(np.float64) for p in params]


def hutchinson_trace(
    loss_fn: Callable[[], Tensor],
    params: Sequence[Tensor],
    n_samples: int = 16,
    eps: float = 1e-3,
    seed: int = 0,
) -> np.ndarray:
    """Per-parameter estimates of Tr(H_ll) (float64 array, one entry per tensor in ``params``).

    ``loss_fn()`` must rebuild the loss from the current parameter values each call."""
    if not callable(loss_fn):
        raise TypeError(f"loss_fn: expected a callable returning the loss, got {type(loss_fn).__name__}")
    params = list(params)
    if not params:
        raise ValueError("params: expected at least one parameter tensor")
    if not is_int(n_samples) or n_samples < 1:
        raise ValueError(f"n_samples: expected a positive int, got {n_samples!r}")
    n_samples = int(n_samples)
    if not (real_arg(eps, "eps") > 0 and np.isfinite(eps)):
        raise ValueError(f"eps: must be > 0, got {eps}")
    rng = np.random.default_rng(seed)
    saved = [p.data.copy() for p in params]
    est = np.zeros(len(params))
    try:
        for _ in range(n_samples):
            vs = [rng.choice(np.array([-1.0, 1.0]), size=p.shape) for p in params]
            for p, w, v in zip(params, saved, vs):
                p.data = (w + eps * v).astype(w.dtype)
            gp = _grads(loss_fn, params)
            for p, w, v in zip(params, saved, vs):
                p.data = (w - eps * v).astype(w.dtype)
            gm = _grads(loss_fn, params)
            for i, v in enumerate(vs):
                est[i] += float(np.sum(v * (gp[i] - gm[i]))) / (2 * eps)
    finally:
        for p, w in zip(params, saved):
            p.data = w
            p.grad = None
    return est / n_samples


def quantize_symmetric(w: Any, bits: int) -> np.ndarray:
    """Per-tensor symmetric uniform fake-quant to ``bits`` (codes in [-2^(b-1), 2^(b-1)-1]), scale chosen by MSE
    over a grid of clipping ratios (what an MSE observer does)."""
    if not is_int(bits) or not 2 <= bits <= 16:
        raise ValueError(f"bits: expected an int in [2, 16], got {bits!r}")
    bits = int(bits)
    w = np.asarray(as_array(w, "w", dtypes=("f", "i", "u")), dtype=np.float64)
    if not np.isfinite(w).all():  # a NaN amax would make every clipping error NaN and return w unquantized
        raise ValueError("w: quantize_symmetric needs finite values, got NaN or Inf")
    amax = float(np.abs(w).max(initial=0.0))
    if amax == 0:
        return w.copy()
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    best, best_err = w, np.inf
    for r in np.linspace(0.3, 1.0, 15):
        s = r * amax / max(qmax, 1)
        q = np.clip(np.rint(w / s), qmin, qmax) * s
        err = float(np.sum((q - w) ** 2))
        if err < best_err:
            best, best_err = q, err
    return best


def allocate_bits(
    traces: Sequence[float],
    weights: Sequence[Any],
    avg_bits: float = 4.0,
    candidates: Sequence[int] = (2, 4, 8),
) -> tuple[list[int], dict[str, Any]]:
    """Bits per layer minimising sum_l Tr(H_l)/n_l * ||Q_b(W_l) - W_l||^2 under an average-bit budget.

    Returns (bits, info) with info: omega (table [layer][candidate]), objective, avg_bits (achieved)."""
    if len(traces) != len(weights) or len(traces) == 0:
        raise ValueError(f"traces/weights: expected equal non-zero lengths, got {len(traces)} and {len(weights)}")
    tr = as_array(traces, "traces", dtypes=("f", "i", "u"), ndim=1)
    if not np.isfinite(tr).all():
        bad = [i for i, t in enumerate(tr) if not np.isfinite(t)]
        raise ValueError(f"traces: Hessian traces must be finite, got {tr[bad[0]]} at layer {bad[0]} (layers {bad})")
    if isinstance(candidates, (str, bytes)) or not hasattr(candidates, "__iter__"):
        raise TypeError(f"candidates: expected a sequence of bit widths, got {type(candidates).__name__}")
    cands = sorted(as_int(b, "candidates", min=1) for b in candidates)
    if not cands:
        raise ValueError("candidates: expected at least one bit width")
    if not np.isfinite(real_arg(avg_bits, "avg_bits")):
        raise ValueError(f"avg_bits: must be finite, got {avg_bits!r}")
    if avg_bits < cands[0]:
        raise ValueError(f"avg_bits: budget {avg_bits} is below the smallest candidate {cands[0]}")
    n = np.array([np.asarray(w).size for w in weights], dtype=np.float64)
    omega = np.array(
        [
            [
                max(float(t), 0.0) / ni * float(np.sum((quantize_symmetric(w, b) - np.asarray(w, np.float64)) ** 2))
                for b in cands
            ]
            for t, w, ni in zip(traces, weights, n)
        ]
    )
    budget = avg_bits * n.sum() + 1e-9
    best: tuple[float, tuple[int, ...]] | None = None
    if len(cands) ** len(n) <= 200_000:
        for combo in itertools.product(range(len(cands)), repeat=len(n)):
            bits = np.array([cands[c] for c in combo])
            if float((bits * n).sum()) <= budget:
                obj = float(sum(omega[i, c] for i, c in enumerate(combo)))
                if best is None or obj < best[0]:
                    best = (obj, combo)
        choice = list(best[1]) if best else [0] * len(n)
    else:  # greedy: start at the top, lower the layer with the smallest damage per saved bit until in budget
        choice = [len(cands) - 1] * len(n)
        while float(sum(cands[c] * ni for c, ni in zip(choice, n))) > budget:
            opts = [
                ((omega[i, c - 1] - omega[i, c]) / ((cands[c] - cands[c - 1]) * n[i]), i)
                for i, c in enumerate(choice)
                if c > 0
            ]
            _, i = min(opts)
            choice[i] -= 1
    bits = [cands[c] for c in choice]
    info = {
        "omega": omega,
        "candidates": cands,
        "objective": float(sum(omega[i, c] for i, c in enumerate(choice))),
        "avg_bits": float(sum(b * ni for b, ni in zip(bits, n)) / n.sum()),
    }
    return bits, info


def _run_layers(layers: Sequence[Callable[[Any], Any]], x: Any, points: Sequence[int], hook: Callable) -> Any:
    h = x
    for i, m in enumerate(layers):
        if i in points:
            h = hook(points.index(i), h)
        h = m(h)
    if len(layers) in points:
        h = hook(points.index(len(layers)), h)
    return h


def activation_traces(
    layers: Sequence[Callable[[Any], Any]],
    x: Any,
    loss_of_output: Callable[[Any], Tensor],
    points: Sequence[int],
    n_samples: int = 8,
    eps: float = 1e-2,
    seed: int = 0,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Hutchinson Tr(H) of the loss w.r.t. the **activations** entering ``layers[p]`` for p in ``points``.

    A zero "probe" parameter d_p is added to each of those activations (h_p + d_p): the Hessian w.r.t. d_p at 0 is
    the Hessian w.r.t. h_p, so ``hutchinson_trace`` over the probes estimates Tr(H_hh) per point. Returns
    (traces, the activation arrays at the points) -- the inputs ``allocate_bits`` needs to give activations bits."""
    from ..autograd import no_grad
    from ..nn import Parameter

    pts = list(points)
    if not pts or any(not 0 <= p <= len(layers) for p in pts) or len(set(pts)) != len(pts):
        raise ValueError(f"points: expected distinct layer indices in [0, {len(layers)}], got {points!r}")
    acts: list[np.ndarray | None] = [None] * len(pts)

    def record(j: int, h: Any) -> Any:
        acts[j] = np.array(h.data)
        return h

    with no_grad():
        _run_layers(layers, x, pts, record)
    probes = [Parameter(np.zeros(a.shape, np.float32)) for a in acts]

    def loss_fn() -> Tensor:
        return loss_of_output(_run_layers(layers, x, pts, lambda j, h: h + probes[j]))

    return hutchinson_trace(loss_fn, probes, n_samples=n_samples, eps=eps, seed=seed), [a for a in acts]


def forward_quantized_activations(
    layers: Sequence[Callable[[Any], Any]], x: Any, points: Sequence[int], bits: Sequence[Any]
) -> Any:
    """Run ``layers`` on x with the activation entering ``layers[p]`` fake-quantized to ``bits[j]`` (per-tensor
    symmetric, ``quantize_symmetric``); an entry may be an array of per-element widths (contiguous runs along the
    flattened per-sample features, each run with its own scale), 32 leaves it in fp32."""
    pts = list(points)

    def q(j: int, h: Any) -> Any:
        b = np.asarray(bits[j])
        a = np.asarray(h.data, np.float32)
        if b.ndim == 0:
            return Tensor(a if int(b) >= 32 else quantize_symmetric(a, int(b)).astype(np.float32))
        flat, out = a.reshape(a.shape[0], -1), np.empty((a.shape[0], b.size), np.float32)
        for w in np.unique(b):
            idx = np.flatnonzero(b == w)
            out[:, idx] = flat[:, idx] if w >= 32 else quantize_symmetric(flat[:, idx], int(w))
        return Tensor(out.reshape(a.shape))

    return _run_layers(layers, x, pts, q)
