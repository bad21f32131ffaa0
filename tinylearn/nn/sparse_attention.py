"""Block-sparse attention (issue 44): a block-pattern DSL, Longformer / BigBird / Sparse-Transformer layouts, and
``block_sparse_attention`` that only visits the non-empty (query block, key block) tiles.

Patterns (sparse_patterns.py, re-exported here): ``local(w)``, ``global_tokens(n)``, ``strided(s)``,
``random_blocks(r, seed)``, ``dense()``, ``causal()``, composed with ``|`` and ``&``; ``pattern.layout(nq, nk,
block_size)`` gives the ``BlockLayout`` (block mask, CSR ``row_ptr``/``cols``, ``density``, ``dense_mask()``).

The op ``nn.block_sparse_attention`` (this module registers it in tinylearn.backends): softmax(scale q k^T + mask) v
for q [..., Nq, D], k [..., Nk, D], v [..., Nk, Dv] (leading dims broadcast), computed per query block as one pass
of the online softmax over its key-block list, returning (o, lse):

    numpy   the reference (any float dtype; float64 for gradcheck): the same tile loop, vectorised over the
            leading dims
    cpp     cpp_src/longctx_sparse_attn.cpp (float32): versions "simd" (the best of AVX-512 / AVX2 by tl::cpu_has,
            TINYLEARN_CPU_FEATURES forces a level), "scalar", and the explicit "avx2" / "avx512" (available where
            the CPU has them); OpenMP over (head, query block)

A query row with no allowed key gets output 0 (torch 2.x's convention for a fully masked row) and lse -inf.
``block_sparse_attention`` on ``tl.Tensor`` inputs is differentiable (``BlockSparseAttention``): the backward is
block-sparse too (numpy, FlashAttention-2 style: P recomputed from the saved lse tile by tile, only the layout's
tiles visited), in the inputs' dtype; on arrays it returns a numpy array.

Per-layer pattern choice (``choose_layer_patterns``): given calibration (q, k, v) per layer and candidate patterns,
pick for each layer the sparsest candidate whose output error vs dense attention, ||o - o_dense|| / ||o_dense||,
stays under ``tol`` (dense when none does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backends
from ..autograd.function import Function, unbroadcast
from ..autograd.tensor import Tensor
from .sparse_patterns import (
    BlockLayout,
    BlockPattern,
    causal,
    dense,
    global_tokens,
    local,
    random_blocks,
    strided,
)

__all__ = [
    "OP",
    "BlockLayout",
    "BlockPattern",
    "BlockSparseAttention",
    "LayerChoice",
    "block_sparse_attention",
    "block_sparse_attention_backward",
    "block_sparse_attention_path",
    "causal",
    "choose_layer_patterns",
    "dense",
    "global_tokens",
    "local",
    "random_blocks",
    "strided",
]

OP = "nn.block_sparse_attention"


# -------------------------------------------------------------------------------------------------- the kernel
def _prep(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    arrs = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        a = np.asarray(x.data if isinstance(x, Tensor) else x)
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"{name}: must be a floating array, got dtype {a.dtype}")
        if a.ndim < 2:
            raise ValueError(f"{name}: must be [..., N, D] (ndim >= 2), got shape {a.shape}")
        arrs.append(a)
    qa, ka, va = arrs
    if ka.shape[-1] != qa.shape[-1]:
        raise ValueError(f"k: last dim {ka.shape[-1]} must equal q's {qa.shape[-1]} (q {qa.shape}, k {ka.shape})")
    if va.shape[-2] != ka.shape[-2]:
        raise ValueError(f"v: must have the {ka.shape[-2]} keys of k on dim -2, got shape {va.shape}")
    try:
        lead = np.broadcast_shapes(qa.shape[:-2], ka.shape[:-2], va.shape[:-2])
    except ValueError as e:
        raise ValueError(
            f"q/k/v: leading dims {qa.shape[:-2]}, {ka.shape[:-2]}, {va.shape[:-2]} do not broadcast"
        ) from e
    dt = np.result_type(qa.dtype, ka.dtype, va.dtype)

    def flat(a: np.ndarray) -> np.ndarray:
        a = np.broadcast_to(a, lead + a.shape[-2:])
        return np.ascontiguousarray(a.reshape((-1,) + a.shape[-2:]), dt)

    return flat(qa), flat(ka), flat(va), tuple(lead)


def _check_layout(layout: Any, nq: int, nk: int) -> BlockLayout:
    if not isinstance(layout, BlockLayout):
        raise TypeError(f"layout: must be a BlockLayout, got {type(layout).__name__}")
    if layout.nq != nq or layout.nk != nk:
        raise ValueError(f"layout: built for nq={layout.nq}, nk={layout.nk}, but q has {nq} queries and k {nk} keys")
    return layout


def _scale(scale: Any, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(max(d, 1))
    s = float(scale)
    if not math.isfinite(s):
        raise ValueError(f"scale: must be finite, got {scale!r}")
    return s


@backends.register(OP, "numpy")
def _bsa_numpy(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, layout: BlockLayout, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Reference: per query block, the online softmax over its key blocks (vectorised over BH)."""
    bh, nq, _ = q.shape
    nk, dv = k.shape[1], v.shape[2]
    bs, dt = layout.block_size, q.dtype
    o = np.zeros((bh, nq, dv), dt)
    lse = np.full((bh, nq), -np.inf, dt)
    rp, cols = layout.row_ptr, layout.cols
    for qb in range(layout.nqb):
        i0, i1 = qb * bs, min(nq, (qb + 1) * bs)
        qs = q[:, i0:i1]
        m = np.full((bh, i1 - i0, 1), -np.inf, dt)
        l_ = np.zeros((bh, i1 - i0, 1), dt)
        acc = np.zeros((bh, i1 - i0, dv), dt)
        for kb in cols[rp[qb] : rp[qb + 1]]:
            j0, j1 = kb * bs, min(nk, (kb + 1) * bs)
            s = (qs @ k[:, j0:j1].transpose(0, 2, 1)) * dt.type(scale)
            if layout.causal:
                s = np.where(np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None], s, -np.inf)
            mn = np.maximum(m, s.max(axis=-1, keepdims=True))
            live = np.isfinite(mn)  # rows with at least one allowed key so far
            mn_safe = np.where(live, mn, 0)
            alpha = np.where(np.isfinite(m), np.exp(np.where(live, m - mn_safe, 0)), 0)
            p = np.exp(s - mn_safe)  # exp(-inf) = 0 for masked entries
            l_ = l_ * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + p @ v[:, j0:j1]
            m = mn
        ok = l_ > 0
        o[:, i0:i1] = np.where(ok, acc / np.where(ok, l_, 1), 0)
        lse[:, i0:i1] = np.where(ok, m + np.log(np.where(ok, l_, 1)), -np.inf)[..., 0]
    return o, lse


def _cpp(version: str) -> Any:
    def run(q: np.ndarray, k: np.ndarray, v: np.ndarray, layout: BlockLayout, scale: float) -> tuple:
        c = backends.load_C("longctx")
        o, lse = c.block_sparse_attention(
            np.ascontiguousarray(q, np.float32),
            np.ascontiguousarray(k, np.float32),
            np.ascontiguousarray(v, np.float32),
            layout.row_ptr,
            layout.cols,
            layout.block_size,
            layout.causal,
            scale,
            version,
        )
        return o, lse

    run.__name__ = f"_bsa_cpp_{version}"
    return run


def _c_ok() -> bool:
    return backends.C_available("longctx") and hasattr(backends.load_C("longctx"), "block_sparse_attention")


def _fp32_only(q: np.ndarray, *args: Any, **kwargs: Any) -> bool:
    return q.dtype == np.float32


def _example(rng: Any) -> tuple[tuple, dict]:
    q = rng.standard_normal((3, 70, 24)).astype(np.float32)
    k = rng.standard_normal((3, 70, 24)).astype(np.float32)
    v = rng.standard_normal((3, 70, 20)).astype(np.float32)
    lay = (local(1) | global_tokens(8) | causal()).layout(70, 70, 16)
    return (q, k, v, lay, 0.2), {}


backends.register(
    OP, "cpp", _cpp("simd"), version="simd", default=True, available=_c_ok, when=_fp32_only, example=_example
)
backends.register(OP, "cpp", _cpp("scalar"), version="scalar", available=_c_ok, when=_fp32_only)


def _path_ok(version: str) -> Any:
    def ok() -> bool:
        if not _c_ok():
            return False
        try:
            backends.load_C("longctx").block_sparse_attention_path(version)
        except ValueError:  # the CPU (or TINYLEARN_CPU_FEATURES) lacks it
            return False
        return True

    return ok


for _v in ("avx2", "avx512"):  # explicit paths (the tests force each); "simd" picks the best of them
    backends.register(OP, "cpp", _cpp(_v), version=_v, available=_path_ok(_v), when=_fp32_only)


def _forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, layout: BlockLayout, scale: float, backend: Any, version: Any
) -> tuple[np.ndarray, np.ndarray]:
    if q.shape[0] == 0:
        return np.zeros(q.shape[:2] + (v.shape[2],), q.dtype), np.zeros(q.shape[:2], q.dtype)
    o, lse = backends.dispatch(OP, q, k, v, layout, scale, backend=backend, version=version)
    return np.asarray(o).astype(q.dtype, copy=False), np.asarray(lse).astype(q.dtype, copy=False)


def block_sparse_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    layout: BlockLayout,
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) for flat [BH, N, *] arrays: per tile P = exp(S - lse) (recomputed), dV += P^T dO,
    dS = P * (dO V^T - rowsum(dO * O)), dQ += scale dS K, dK += scale dS^T Q; only the layout's tiles."""
    bh, nq, _ = q.shape
    nk = k.shape[1]
    bs, dt = layout.block_size, q.dtype
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    delta = (do * o).sum(axis=-1, keepdims=True)  # [BH, Nq, 1]
    lse_safe = np.where(np.isfinite(lse), lse, np.inf)[..., None]  # dead rows: P = exp(-inf) = 0
    rp, cols = layout.row_ptr, layout.cols
    sc = dt.type(scale)
    for qb in range(layout.nqb):
        i0, i1 = qb * bs, min(nq, (qb + 1) * bs)
        qs, dos = q[:, i0:i1], do[:, i0:i1]
        for kb in cols[rp[qb] : rp[qb + 1]]:
            j0, j1 = kb * bs, min(nk, (kb + 1) * bs)
            s = (qs @ k[:, j0:j1].transpose(0, 2, 1)) * sc
            if layout.causal:
                s = np.where(np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None], s, -np.inf)
            p = np.exp(s - lse_safe[:, i0:i1])
            dv[:, j0:j1] += p.transpose(0, 2, 1) @ dos
            dp = dos @ v[:, j0:j1].transpose(0, 2, 1)
            ds = p * (dp - delta[:, i0:i1]) * sc
            dq[:, i0:i1] += ds @ k[:, j0:j1]
            dk[:, j0:j1] += ds.transpose(0, 2, 1) @ qs
    return dq, dk, dv


class BlockSparseAttention(Function):
    """Differentiable block-sparse attention on tl Tensors (forward by the op's backends, backward block-sparse
    in numpy). Positional: q, k, v (Tensors), layout, scale, backend, version."""

    @staticmethod
    def forward(ctx, q, k, v, layout, scale, backend=None, version=None):
        qf, kf, vf, lead = _prep(q, k, v)
        o, lse = _forward(qf, kf, vf, layout, scale, backend, version)
        ctx.save_for_backward(qf, kf, vf, o, lse)
        ctx.meta = (layout, scale, lead, q.shape, k.shape, v.shape)
        return o.reshape(lead + o.shape[1:])

    @staticmethod
    def backward(ctx, g):
        qf, kf, vf, o, lse = ctx.saved_tensors
        layout, scale, lead, qs, ks, vs = ctx.meta
        gf = np.ascontiguousarray(g, qf.dtype).reshape(o.shape)
        dq, dk, dv = block_sparse_attention_backward(qf, kf, vf, o, lse, gf, layout, scale)
        dq = unbroadcast(dq.reshape(lead + dq.shape[1:]), tuple(qs))
        dk = unbroadcast(dk.reshape(lead + dk.shape[1:]), tuple(ks))
        dv = unbroadcast(dv.reshape(lead + dv.shape[1:]), tuple(vs))
        return dq, dk, dv, None, None, None, None


def block_sparse_attention(
    q: Any,
    k: Any,
    v: Any,
    pattern: BlockPattern | BlockLayout,
    block_size: int = 64,
    *,
    scale: float | None = None,
    backend: str | None = None,
    version: str | None = None,
    return_lse: bool = False,
) -> Any:
    """softmax(scale q k^T + mask(pattern)) v over the pattern's non-empty tiles only.

    q [..., Nq, D], k [..., Nk, D], v [..., Nk, Dv] (leading dims broadcast; any strides); ``pattern`` a
    ``BlockPattern`` (resolved with ``block_size``) or a ready ``BlockLayout``; ``scale`` defaults to 1/sqrt(D).
    tl.Tensor inputs give a differentiable tl.Tensor (``return_lse`` not allowed then); arrays give an ndarray
    (with ``return_lse``: (o, lse [..., Nq])). backend None picks cpp for float32 when built, else numpy.
    """
    if isinstance(pattern, BlockPattern):
        qa = q.data if isinstance(q, Tensor) else np.asarray(q)
        ka = k.data if isinstance(k, Tensor) else np.asarray(k)
        if qa.ndim < 2 or ka.ndim < 2:
            raise ValueError(f"q/k: must be [..., N, D], got shapes {qa.shape}, {ka.shape}")
        layout = pattern.layout(qa.shape[-2], ka.shape[-2], block_size)
    elif isinstance(pattern, BlockLayout):
        layout = pattern
    else:
        raise TypeError(f"pattern: must be a BlockPattern or BlockLayout, got {type(pattern).__name__}")
    if any(isinstance(t, Tensor) for t in (q, k, v)):
        if return_lse:
            raise ValueError("return_lse: not supported for tl.Tensor inputs (the lse is not differentiable)")
        q, k, v = (t if isinstance(t, Tensor) else Tensor(np.asarray(t)) for t in (q, k, v))
        _check_layout(layout, q.shape[-2], k.shape[-2])
        return BlockSparseAttention.apply(q, k, v, layout, _scale(scale, q.shape[-1]), backend, version)
    qf, kf, vf, lead = _prep(q, k, v)
    _check_layout(layout, qf.shape[1], kf.shape[1])
    o, lse = _forward(qf, kf, vf, layout, _scale(scale, qf.shape[2]), backend, version)
    o = o.reshape(lead + o.shape[1:])
    return (o, lse.reshape(lead + lse.shape[1:])) if return_lse else o


def block_sparse_attention_path(version: str = "simd") -> str:
    """The C++ code path (avx512 / avx2 / scalar) a cpp ``version`` runs on this CPU (TINYLEARN_CPU_FEATURES)."""
    return str(backends.load_C("longctx").block_sparse_attention_path(version))


# ----------------------------------------------------------------------------------------- per-layer choice
@dataclass(frozen=True)
class LayerChoice:
    layer: int
    pattern: BlockPattern
    density: float
    error: float  # ||o - o_dense|| / ||o_dense|| on the calibration inputs (max over them)


def choose_layer_patterns(
    calibration: Sequence[Sequence[tuple[Any, Any, Any]] | tuple[Any, Any, Any]],
    candidates: Sequence[BlockPattern],
    block_size: int = 64,
    tol: float = 0.05,
    *,
    is_causal: bool = False,
    backend: str | None = None,
) -> list[LayerChoice]:
    """Per layer, the sparsest candidate whose relative output error vs dense attention stays <= ``tol`` on every
    calibration input of that layer; dense (``causal()`` if ``is_causal``) when none does.

    ``calibration[l]``: one (q, k, v) triple or a list of them for layer l. Candidates are tried from the sparsest
    (fewest blocks on the calibration grid); with ``is_causal`` each is made causal first.
    """
    if not candidates:
        raise ValueError("candidates: need at least one pattern")
    for i, c in enumerate(candidates):
        if not isinstance(c, BlockPattern):
            raise TypeError(f"candidates[{i}]: must be a BlockPattern, got {type(c).__name__}")
    if not (isinstance(tol, (int, float)) and tol >= 0 and math.isfinite(tol)):
        raise ValueError(f"tol: must be a finite number >= 0, got {tol!r}")
    ref_pattern = causal() if is_causal else dense()
    cands = [(c | causal()) if is_causal else c for c in candidates]
    out = []
    for li, cal in enumerate(calibration):
        triples = [cal] if isinstance(cal, tuple) and len(cal) == 3 and not isinstance(cal[0], tuple) else list(cal)
        if not triples:
            raise ValueError(f"calibration[{li}]: no (q, k, v) inputs")
        nq, nk = np.shape(triples[0][0])[-2], np.shape(triples[0][1])[-2]
        refs = [block_sparse_attention(q, k, v, ref_pattern, block_size, backend=backend) for q, k, v in triples]
        order = sorted(cands, key=lambda p: p.layout(nq, nk, block_size).nnz)
        choice = LayerChoice(li, ref_pattern, ref_pattern.density(nq, nk, block_size), 0.0)
        for p in order:
            err = 0.0
            for (q, k, v), r in zip(triples, refs):
                o = block_sparse_attention(q, k, v, p, block_size, backend=backend)
                err = max(err, float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30)))
            if err <= tol:
                choice = LayerChoice(li, p, p.density(nq, nk, block_size), err)
                break
        out.append(choice)
    return out
