"""Reference answers for exercises/16_long_context_moe, bound to tinylearn: the online-softmax merge that
tinylearn.parallel.ring_attention runs inline per ring step (restated here as a function of two (o, lse) pairs,
autograd-safe for rows with no keys), tinylearn.nn.moe.route (top-k experts and GShard slot priority) with moe_ffn's
gates, and tinylearn.nn.sparse_attention's local | global_tokens | causal patterns resolved to a token-level mask.
Thin adapters validate the exercise's arguments (ValueError naming them) before calling the library."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tinylearn._inputs import is_int
from tinylearn.nn import moe as _moe
from tinylearn.nn import sparse_attention as _sa


# ------------------------------------------------------------------------------------ (a) online-softmax merge
def _check_float_tensor(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        what = f"{type(t).__name__} of dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a floating-point torch.Tensor, got {what}")
    return t


def _check_lse(name: str, lse: torch.Tensor, shape: torch.Size, device: torch.device) -> None:
    if lse.shape != shape:
        raise ValueError(f"{name}: expected shape {tuple(shape)} (o1.shape[:-1]), got {tuple(lse.shape)}")
    if lse.device != device:
        raise ValueError(f"{name}: on {lse.device}, o1 is on {device}")
    bad = torch.isnan(lse) | torch.isposinf(lse)
    if bool(bad.any()):
        first = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"{name}: holds NaN or +inf (first at index {first}: {float(lse[first])}); -inf = no key")


def merge_partial_attention(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    for name, t in (("o1", o1), ("lse1", lse1), ("o2", o2), ("lse2", lse2)):
        _check_float_tensor(name, t)
    if o1.dim() < 1:
        raise ValueError(f"o1: expected [..., N, Dv] (at least one dimension), got shape {tuple(o1.shape)}")
    if o2.shape != o1.shape or o2.dtype != o1.dtype or o2.device != o1.device:
        raise ValueError(
            f"o2: expected shape {tuple(o1.shape)}, {o1.dtype} on {o1.device} (as o1), "
            f"got {tuple(o2.shape)}, {o2.dtype} on {o2.device}"
        )
    _check_lse("lse1", lse1, o1.shape[:-1], o1.device)
    _check_lse("lse2", lse2, o1.shape[:-1], o1.device)
    if lse2.dtype != lse1.dtype:
        raise ValueError(f"lse2: dtype {lse2.dtype} differs from lse1's {lse1.dtype}")
    # ring_attention's update m' = max(m, m_b), l' = l e^(m - m') + l_b e^(m_b - m'), with (m, l) -> lse = m + log l.
    # The shift m is detached (the result does not depend on it) and set to 0 where both parts are empty, so no
    # -inf - -inf appears; empty parts get weight exp(-inf) = 0 and their o rows are replaced by 0 before the
    # product, so a NaN there reaches neither the forward nor the backward.
    m = torch.maximum(lse1, lse2).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    total = w1 + w2
    empty = total == 0
    safe = torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(total, float("-inf")), m + torch.log(safe))
    zero = torch.zeros((), dtype=o1.dtype, device=o1.device)
    c1 = torch.where(torch.isneginf(lse1).unsqueeze(-1), zero, o1)
    c2 = torch.where(torch.isneginf(lse2).unsqueeze(-1), zero, o2)
    a1, a2 = (w1 / safe).to(o1.dtype).unsqueeze(-1), (w2 / safe).to(o1.dtype).unsqueeze(-1)
    return a1 * c1 + a2 * c2, lse


# --------------------------------------------------------------------------------------- (b) top-k MoE routing
def topk_route(logits: np.ndarray, top_k: int, capacity: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(logits, torch.Tensor):
        raise ValueError("logits: expected a numpy array, got a torch.Tensor (pass .numpy())")
    a = np.asarray(logits)
    if a.ndim != 2 or a.dtype.kind != "f" or a.shape[1] < 1:
        raise ValueError(f"logits: expected a 2-D floating-point array [tokens, experts >= 1], got {a.dtype} {a.shape}")
    if not np.isfinite(a).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"logits: holds NaN or inf (first at {bad}: {a[bad]})")
    e = a.shape[1]
    if not is_int(top_k) or not 1 <= int(top_k) <= e:
        raise ValueError(f"top_k: expected an int in 1..{e} (the number of experts), got {top_k!r}")
    if capacity is not None and (not is_int(capacity) or int(capacity) < 1):
        raise ValueError(f"capacity: expected None (dropless) or an int >= 1, got {capacity!r}")
    k, cap = int(top_k), None if capacity is None else int(capacity)
    x = a.astype(np.float64)
    z = np.exp(x - x.max(axis=1, keepdims=True))  # T = 0 flows through: [0, E] arrays everywhere
    probs = z / z.sum(axis=1, keepdims=True)
    r = _moe.route(probs, k, cap)  # stable argsort of -probs: ties to the lower expert; choice-major slot priority
    gate = np.take_along_axis(probs, r.expert, axis=1)
    if k >= 2:
        gate = gate / gate.sum(axis=1, keepdims=True)  # moe_ffn renormalises the top-2; the same for any k >= 2
    return r.expert.astype(np.int64), gate.astype(a.dtype), r.keep.astype(bool)


# ------------------------------------------------------------------------------------ (c) block-sparse mask
def _int(name: str, v: Any, lo: int) -> int:
    if not is_int(v) or int(v) < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
    return int(v)


def block_sparse_mask(n: int, block: int, window: int, n_global: int, causal: bool = False) -> np.ndarray:
    n, block = _int("n", n, 1), _int("block", block, 1)
    window, n_global = _int("window", window, 0), _int("n_global", n_global, 0)
    if not isinstance(causal, bool | np.bool_):
        raise ValueError(f"causal: expected a bool, got {type(causal).__name__} {causal!r}")
    pattern = _sa.local(window) | _sa.global_tokens(n_global)
    if causal:
        pattern = pattern | _sa.causal()
    return pattern.layout(n, n, block).dense_mask()
