"""The ``numpy`` backend: every fused op written *unfused*, one numpy call per step, plus the algorithmic
variants the lessons build on (online softmax, Welford, tiled flash attention).

Shapes here are canonical: 2-D ``[rows, cols]`` for softmax / LayerNorm / bias+GELU (the op runs along the last
axis) and 3-D ``[batch*heads, seq, dim]`` for attention. ``tinylearn.kernels.ops`` reshapes and validates.

Formulas (forward and backward side by side):

- softmax: y = exp(x - max x) / sum exp(x - max x);             dx = y * (dy - sum(dy * y))
- log_softmax: y = (x - max x) - log sum exp(x - max x);        dx = dy - exp(y) * sum(dy)
- cross_entropy (class indices t, label smoothing eps): loss = -(1 - eps) y_t - eps mean(y) with y = log_softmax(x);
  dx = softmax(x) - (1 - eps) onehot(t) - eps / C, times the row's upstream gradient
- LayerNorm: xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps) (biased var); y = xhat * w + b;
  with g = dy * w:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,  db = sum_rows dy
- BatchNorm on [N, C, L]: per channel over N * L (training: the batch's statistics, biased var; eval: the running
  ones); training dx = (dy - xhat mean(dy xhat) - mean(dy)) invstd w, eval dx = dy invstd w
- GroupNorm on [N, C, HW], G groups: LayerNorm's statistics over each group's C/G * HW values, w/b per channel:
  the same dx with the means over the group; dw = sum_{n, hw} dy * xhat, db = sum_{n, hw} dy
- GELU (erf):  gelu(u) = u Phi(u) = u/2 (1 + erf(u/sqrt 2));
               gelu'(u) = Phi(u) + u phi(u),  phi(u) = e^(-u^2/2)/sqrt(2 pi)
- GELU (tanh): gelu(u) = u/2 (1 + t), t = tanh(k (u + c u^3)), k = sqrt(2/pi), c = 0.044715;
               gelu'(u) = (1 + t)/2 + u/2 (1 - t^2) k (1 + 3 c u^2)
- attention: S = scale q k^T (scale = 1/sqrt(D)), causal: S_ij = -inf for j > i (top-left aligned, like torch's
  ``is_causal``); P = softmax(S); O = P v; lse_i = log sum_j exp(S_ij).
  Backward: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf as _erf

NATIVE_DTYPES = (np.float32, np.float64)


def available() -> tuple[bool, str]:
    return True, ""


_K_TANH = math.sqrt(2.0 / math.pi)
_C_TANH = 0.044715


# ---------------------------------------------------------------------------------------------------- softmax
def softmax(x: np.ndarray) -> np.ndarray:
    """Three passes, each a separate numpy op and a separate trip through memory: max, exp-and-sum, divide."""
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # a fully masked row (-inf - -inf) is NaN, as in torch
        e = np.exp(x - m)
    s = np.sum(e, axis=-1, keepdims=True)
    return e / s


def softmax_online(x: np.ndarray, chunk: int = 1) -> np.ndarray:
    """Two passes: the online normaliser (Milakov & Gimelshein 2018) then the write.

    Pass 1 keeps a running max m and a running sum d of exp(x - m) over column chunks:
    m' = max(m, max(chunk)), d' = d * exp(m - m') + sum exp(chunk - m'). Pass 2: y = exp(x - m) / d.
    ``chunk=1`` is the element-by-element recurrence; a GPU thread block uses chunk = its width.
    """
    if chunk < 1:
        raise ValueError(f"chunk: must be >= 1, got {chunk}")
    rows, cols = x.shape
    m = np.full((rows, 1), -np.inf, dtype=x.dtype)
    d = np.zeros((rows, 1), dtype=x.dtype)
    for c0 in range(0, cols, chunk):
        m, d = online_softmax_update(m, d, x[:, c0 : c0 + chunk])
    with np.errstate(invalid="ignore"):  # a fully masked row (-inf - -inf) is NaN, as in torch
        return np.exp(x - m) / d


def online_softmax_update(m: np.ndarray, d: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step of the online normaliser: fold new values ``x`` into the running max ``m`` and the running sum
    ``d`` of exp(seen - m). ``x`` has m's shape (one value per row) or a chunk of values along the last axis
    (m: [..., 1]). m = -inf means nothing (finite) seen yet; -inf - -inf never happens (``safe`` below)."""
    chunked = x.shape != m.shape
    with np.errstate(invalid="ignore"):
        m_new = np.maximum(m, x.max(axis=-1, keepdims=True) if chunked else x)
        safe = np.where(m_new == -np.inf, 0.0, m_new)  # rows that have seen only -inf so far
        alpha = np.where(m == -np.inf, 0.0, np.exp(m - safe))
        e = np.exp(x - safe)
    return m_new, d * alpha + (e.sum(axis=-1, keepdims=True) if chunked else e)


def softmax_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return y * (dy - np.sum(dy * y, axis=-1, keepdims=True))


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax on [R, C]: (x - max) - log sum exp(x - max); a fully -inf row gives NaN (as torch)."""
    with np.errstate(invalid="ignore"):  # -inf - -inf: the NaN row torch gives
        xm = x - np.max(x, axis=-1, keepdims=True)
        return xm - np.log(np.sum(np.exp(xm), axis=-1, keepdims=True))


def log_softmax_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx = dy - exp(y) * sum(dy) from the forward output y [R, C]."""
    return dy - np.exp(y) * np.sum(dy, axis=-1, keepdims=True)


def cross_entropy(
    x: np.ndarray, target: np.ndarray, ignore_index: int, label_smoothing: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-row cross-entropy of logits x [R, C] against class indices ``target`` [R] (rows whose target is
    ``ignore_index`` give 0) -> (loss [R], stats [R, 2] = (max, log sum exp(x - max)), number of valid rows).
    loss = -(1 - eps) logp_t - eps mean_c logp_c with logp = (x - max) - log sum exp(x - max)."""
    valid, ts = _ce_targets(x, target, ignore_index, label_smoothing)
    with np.errstate(invalid="ignore"):  # -inf - -inf: the NaN row torch gives
        m = np.max(x, axis=-1)
        z = x - m[:, None]
        ls = np.log(np.sum(np.exp(z), axis=-1))
        loss = -(z[np.arange(x.shape[0]), ts] - ls)
        if label_smoothing:
            loss = (1 - label_smoothing) * loss - label_smoothing * (z.mean(axis=-1) - ls)
    stats = np.stack([m, ls], axis=1)
    loss, stats = np.where(valid, loss, 0), np.where(valid[:, None], stats, 0)
    return loss.astype(x.dtype, copy=False), stats.astype(x.dtype, copy=False), int(valid.sum())


def cross_entropy_backward(
    x: np.ndarray, stats: np.ndarray, target: np.ndarray, scale: np.ndarray, ignore_index: int, label_smoothing: float
) -> np.ndarray:
    """dx = scale * (softmax(x) - (1 - eps) onehot(target) - eps / C) per row, 0 where target == ignore_index; the
    softmax from the forward's stats, exp((x - max) - log sum exp); ``scale`` [R] or [1]."""
    valid, ts = _ce_targets(x, target, ignore_index, label_smoothing)
    r, c = x.shape
    s = np.broadcast_to(np.asarray(scale, x.dtype).reshape(-1), (r,))[:, None]
    with np.errstate(invalid="ignore"):
        dx = np.exp((x - stats[:, :1]) - stats[:, 1:])
    if label_smoothing:
        dx -= x.dtype.type(label_smoothing / c)
    dx[np.arange(r), ts] -= x.dtype.type(1 - label_smoothing)
    dx *= s
    dx[~valid] = 0
    return dx


def _ce_targets(x: np.ndarray, target: np.ndarray, ignore_index: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(valid rows, targets with ignored rows set to 0), after the kernel's checks (ValueError naming the label)."""
    r, c = x.shape
    target = np.asarray(target)
    if target.shape != (r,):
        raise ValueError(f"cross_entropy: target must be 1-D with one class index per row of x ({r}), got shape "
                         f"{target.shape}")  # fmt: skip
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {eps}")
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= c))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"cross_entropy: target label {int(target[row])} is out of range [0, {c}) (row {row}, "
                         f"ignore_index {ignore_index})")  # fmt: skip
    return valid, np.where(valid, target, 0)


# ---------------------------------------------------------------------------------------------------- LayerNorm
def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unfused: mean, centre, variance, rsqrt, normalise, scale, shift — each a full array op.

    Returns (y, mean, rstd)."""
    mean = np.mean(x, axis=-1)
    xc = x - mean[:, None]
    var = np.mean(xc * xc, axis=-1)
    rstd = 1.0 / np.sqrt(var + x.dtype.type(eps))
    xhat = xc * rstd[:, None]
    y = xhat * w + b
    return y.astype(x.dtype, copy=False), mean, rstd.astype(x.dtype, copy=False)


def welford_stats(x: np.ndarray, chunk: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Row mean and biased variance in one pass over column chunks (Welford / Chan et al. merge).

    State (n, mean, M2); merging a chunk with (n_b, mean_b, M2_b): delta = mean_b - mean,
    mean += delta * n_b / (n + n_b), M2 += M2_b + delta^2 n n_b / (n + n_b). var = M2 / n.
    """
    rows, cols = x.shape
    n = 0
    mean = np.zeros(rows, dtype=x.dtype)
    m2 = np.zeros(rows, dtype=x.dtype)
    for c0 in range(0, cols, chunk):
        blk = x[:, c0 : c0 + chunk]
        nb = blk.shape[1]
        mb = blk.mean(axis=1)
        m2b = ((blk - mb[:, None]) ** 2).sum(axis=1)
        tot = n + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + m2b + delta * delta * (n * nb / tot)
        n = tot
    return mean, m2 / max(n, 1)


def layer_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * w
    a = g.mean(axis=-1, keepdims=True)
    bb = (g * xhat).mean(axis=-1, keepdims=True)
    dx = rstd[:, None] * (g - a - xhat * bb)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


# ---------------------------------------------------------------------------------------------------- GroupNorm
def batch_norm(
    x: np.ndarray,
    w: np.ndarray | None,
    b: np.ndarray | None,
    mean: np.ndarray | None,
    var: np.ndarray | None,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unfused BatchNorm of x [N, C, L] per channel (w/b [C] or None); ``mean``/``var`` None: the batch's statistics
    (training, var biased), else those given (eval). Returns (y, mean [C], invstd [C], var [C])."""
    if mean is None:
        mean = x.mean(axis=(0, 2))
        xc = x - mean[:, None]
        var = (xc * xc).mean(axis=(0, 2))
    else:
        xc = x - mean[:, None]
    invstd = 1.0 / np.sqrt(var + x.dtype.type(eps))
    y = xc * invstd[:, None]
    if w is not None:
        y = y * w[:, None]
    if b is not None:
        y = y + b[:, None]
    dt = x.dtype
    return y.astype(dt, copy=False), mean.astype(dt), invstd.astype(dt, copy=False), var.astype(dt)


def batch_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    w: np.ndarray | None,
    mean: np.ndarray,
    invstd: np.ndarray,
    training: bool,
    need_dx: bool = True,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(dx [N, C, L] or None, dw [C], db [C]) from the forward's (mean, invstd); training adds the statistics' VJP:
    dx = (dy - xhat sum(dy xhat) / m - sum(dy) / m) invstd w, eval dx = dy invstd w."""
    xhat = (x - mean[:, None]) * invstd[:, None]
    sg = np.einsum("ncl->c", dy)
    sgx = np.einsum("ncl,ncl->c", dy, xhat)
    dx = None
    if need_dx:
        scale = (invstd if w is None else invstd * w)[:, None]
        if training:
            m = x.shape[0] * x.shape[2]
            dx = (dy - xhat * (sgx / m)[:, None] - (sg / m)[:, None]) * scale
        else:
            dx = dy * scale
        dx = dx.astype(x.dtype, copy=False)
    return dx, sgx.astype(x.dtype, copy=False), sg.astype(x.dtype, copy=False)


def group_norm(
    x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, num_groups: int, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unfused GroupNorm of x [N, C, HW] (w/b [C] or None): the group's mean, centred variance (biased), rsqrt,
    normalise, scale, shift. Returns (y, mean [N, G], rstd [N, G])."""
    n, c, hw = x.shape
    xg = x.reshape(n, num_groups, -1)
    mean = xg.mean(axis=-1)
    xc = xg - mean[..., None]
    var = (xc * xc).mean(axis=-1)
    rstd = (1.0 / np.sqrt(var + x.dtype.type(eps))).astype(x.dtype, copy=False)
    y = (xc * rstd[..., None]).reshape(n, c, hw)
    if w is not None:
        y = y * w[:, None]
    if b is not None:
        y = y + b[:, None]
    return y.astype(x.dtype, copy=False), mean.astype(x.dtype, copy=False), rstd


def group_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray | None, mean: np.ndarray, rstd: np.ndarray, num_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx [N, C, HW], dw [C], db [C]) from the forward's (mean, rstd) [N, G]; w None means ones."""
    n, c, hw = x.shape
    xhat = ((x.reshape(n, num_groups, -1) - mean[..., None]) * rstd[..., None]).reshape(n, c, hw)
    g = dy * w[:, None] if w is not None else dy
    gg, xg = g.reshape(n, num_groups, -1), xhat.reshape(n, num_groups, -1)
    a = gg.mean(axis=-1, keepdims=True)
    bb = (gg * xg).mean(axis=-1, keepdims=True)
    dx = (rstd[..., None] * (gg - a - xg * bb)).reshape(x.shape)
    return dx.astype(x.dtype, copy=False), (dy * xhat).sum(axis=(0, 2)), dy.sum(axis=(0, 2))


# ---------------------------------------------------------------------------------------------------- GELU
def gelu(u: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * u * (1.0 + np.tanh(_K_TANH * (u + _C_TANH * u**3)))
    return 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))


def gelu_grad(u: np.ndarray, approximate: str = "none") -> np.ndarray:
    """d gelu / du (see the module docstring). The erf form's phi term carries 1/sqrt(2 pi), not 2/sqrt(pi)."""
    if approximate == "tanh":
        t = np.tanh(_K_TANH * (u + _C_TANH * u**3))
        return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _K_TANH * (1.0 + 3.0 * _C_TANH * u * u)
    cdf = 0.5 * (1.0 + _erf(u / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    return cdf + u * pdf


def bias_gelu(x: np.ndarray, b: np.ndarray, approximate: str = "none") -> np.ndarray:
    """Unfused: u = x + b materialised, then GELU reads it back."""
    u = x + b
    return gelu(u, approximate).astype(x.dtype, copy=False)


def bias_gelu_backward(
    dy: np.ndarray, x: np.ndarray, b: np.ndarray, approximate: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    u = x + b
    dx = (dy * gelu_grad(u, approximate)).astype(x.dtype, copy=False)
    return dx, dx.sum(axis=0)


# ---------------------------------------------------------------------------------------------------- attention
def _scores(q: np.ndarray, k: np.ndarray, causal: bool) -> np.ndarray:
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    if causal:
        nq, nk = s.shape[-2:]
        s = np.where(np.triu(np.ones((nq, nk), dtype=bool), k=1), -np.inf, s)
    return s


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, block_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Naive attention: materialises the full [N, N] score and probability matrices. Returns (O, lse).

    ``block_size`` is accepted for a uniform backend signature and unused: this is the untiled reference."""
    s = _scores(q, k, causal)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    o = (e / denom) @ v
    return o.astype(q.dtype, copy=False), (m + np.log(denom))[..., 0]


def attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    causal: bool,
    block_size: int = 64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale = q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    p = np.exp(_scores(q, k, causal) - lse[..., None])
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    dsum = np.sum(do * o, axis=-1, keepdims=True)
    ds = p * (dp - dsum)
    return (ds @ k) * scale, (np.swapaxes(ds, -1, -2) @ q) * scale, dv


def flash_tile_update(
    m: np.ndarray, lse_sum: np.ndarray, acc: np.ndarray, s_tile: np.ndarray, v_tile: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key/value tile of flash attention for a block of query rows.

    State per row: running max m, running sum l of exp(S - m), unnormalised output acc = sum exp(S - m) v.
    With m' = max(m, rowmax S_tile), alpha = exp(m - m'), P = exp(S_tile - m'):
    l' = alpha l + rowsum P,  acc' = alpha acc + P v_tile. After the last tile O = acc / l, lse = m + log l.
    """
    m_new = np.maximum(m, s_tile.max(axis=-1))
    safe = np.where(m_new == -np.inf, 0.0, m_new)
    alpha = np.where(m == -np.inf, 0.0, np.exp(m - safe))
    p = np.exp(s_tile - safe[..., None])
    return m_new, alpha * lse_sum + p.sum(axis=-1), alpha[..., None] * acc + p @ v_tile


def flash_attention_tiled(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False, block_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Flash attention's algorithm in numpy: loop over query and key blocks, O(block^2) scores at a time."""
    bh, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    scale = q.dtype.type(1.0 / math.sqrt(d))
    out = np.empty((bh, nq, dv), dtype=q.dtype)
    lse = np.empty((bh, nq), dtype=q.dtype)
    for i0 in range(0, nq, block_size):
        qi = q[:, i0 : i0 + block_size]
        br = qi.shape[1]
        m = np.full((bh, br), -np.inf, dtype=q.dtype)
        lsum = np.zeros((bh, br), dtype=q.dtype)
        acc = np.zeros((bh, br, dv), dtype=q.dtype)
        for j0 in range(0, nk, block_size):
            if causal and j0 > i0 + br - 1:
                break
            s = (qi @ np.swapaxes(k[:, j0 : j0 + block_size], 1, 2)) * scale
            if causal:
                rows = np.arange(i0, i0 + br)[:, None]
                cols = np.arange(j0, j0 + s.shape[2])[None, :]
                s = np.where(cols > rows, -np.inf, s)
            m, lsum, acc = flash_tile_update(m, lsum, acc, s, v[:, j0 : j0 + block_size])
        out[:, i0 : i0 + br] = acc / lsum[..., None]
        lse[:, i0 : i0 + br] = m + np.log(lsum)
    return out, lse
