"""Multi-scale (hierarchical) attention with a precision per scale [Q168].

Two scales of keys/values for a sequence of N tokens cut into nb = N / block blocks:

* **local**: every query attends *exactly* to the keys of its own block (block x block scores per block; causal
  inside the block when ``causal``);
* **global**: every block is summarised by one token, the mean of its keys and the mean of its values
  (``block_summaries``); every query also attends to the summaries of the *other* blocks (only earlier blocks when
  ``causal``). A summary stands for ``block`` tokens, so its score gets the proportional-attention bias
  log(block): if all keys (and values) of a block were equal, attending to the summary would give exactly what
  attending to the block's tokens does.

One softmax runs over the concatenated [local keys | summaries] row, so scores are N x (block + nb) instead of
N x N (``score_elements``).

Precision per scale: the local K/V and the summary K/V are *stored* at their own precision, one of ``fp32``,
``bf16``, ``fp16`` or ``fp8`` (e4m3, emulated: per-tensor scale amax / 448, then a round trip through
``torch.float8_e4m3fn``), and the attention is computed in fp32 on the rounded values (``round_to``; straight-through
gradient, so the function stays differentiable). ``kv_bytes`` counts the stored bytes per scale.
``precision_sweep`` measures, for each (local, global) assignment, the stored bytes and the output error vs the
fp32 multi-scale result and vs fp32 dense attention; ``choose_precision`` picks the cheapest assignment under an
error bound. The summaries are nb tokens against N local ones, so lowering their precision saves only nb / N of the
bytes while each summary's rounding error reaches every query of every other block: their error per byte saved is
the largest, and the choice keeps them at high precision.

``multiscale_reference`` is the same computation as one ``torch.nn.functional.scaled_dot_product_attention`` call on
the keys [K | summaries] with an additive mask (0 / log(block) / -inf): the oracle for forward and backward.

Tensors are torch tensors [B, H, N, D] (torch autograd).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._inputs import as_int

__all__ = [
    "PRECISIONS",
    "PrecisionResult",
    "block_summaries",
    "choose_precision",
    "kv_bytes",
    "multiscale_attention",
    "multiscale_reference",
    "precision_sweep",
    "round_to",
    "score_elements",
]

# name -> (torch dtype, bytes per element)
PRECISIONS: dict[str, tuple[torch.dtype, int]] = {
    "fp32": (torch.float32, 4),
    "bf16": (torch.bfloat16, 2),
    "fp16": (torch.float16, 2),
    "fp8": (torch.float8_e4m3fn, 1),
}
_FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448


def _check_precision(p: str, name: str) -> str:
    if not isinstance(p, str) or p not in PRECISIONS:
        raise ValueError(f"{name}: unknown precision {p!r}, expected one of {sorted(PRECISIONS)}")
    return p


def round_to(x: torch.Tensor, precision: str) -> torch.Tensor:
    """``x`` rounded to ``precision`` and returned as fp32 (values as stored; gradient passes straight through).

    fp8 is e4m3 with a per-tensor scale amax / 448 (the scale itself kept in fp32, as real fp8 caches do).
    """
    _check_precision(precision, "precision")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if precision == "fp32":
        return x
    dt = PRECISIONS[precision][0]
    xd = x.detach()
    if precision == "fp8":
        amax = float(xd.abs().max()) if xd.numel() else 0.0
        s = amax / _FP8_MAX if amax > 0 else 1.0
        r = (xd / s).to(dt).float() * s
    else:
        r = xd.to(dt).float()
    return x + (r - xd)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> tuple[int, int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, H, N, D], got shape {tuple(t.shape)}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"k, v: shapes must equal q's {tuple(q.shape)}, got {tuple(k.shape)} and {tuple(v.shape)}")
    block = as_int(block, "block")
    b, h, n, d = q.shape
    if block < 1 or n % block:
        raise ValueError(f"block: must be >= 1 and divide the sequence length {n}, got {block}")
    return b, h, n, d, block


def _parse(precision: tuple[str, str] | str) -> tuple[str, str]:
    if isinstance(precision, str):
        precision = (precision, precision)
    if not isinstance(precision, tuple | list) or len(precision) != 2:
        raise ValueError(f"precision: expected (local, global) names or one name, got {precision!r}")
    return _check_precision(precision[0], "precision[0] (local)"), _check_precision(
        precision[1], "precision[1] (global)"
    )


def block_summaries(k: torch.Tensor, v: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-pooled keys and values per block: two [B, H, N / block, D] tensors."""
    b, h, n, d, block = _check_qkv(k, k, v, block)
    nb = n // block
    return k.reshape(b, h, nb, block, d).mean(3), v.reshape(b, h, nb, block, d).mean(3)


def _stored(
    k: torch.Tensor, v: torch.Tensor, block: int, pl: str, pg: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ks, vs = block_summaries(k, v, block)  # pooled from the fp32 keys, then stored at the global precision
    return round_to(k, pl), round_to(v, pl), round_to(ks, pg), round_to(vs, pg)


def multiscale_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: int,
    precision: tuple[str, str] | str = ("fp32", "fp32"),
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Local-exact + global-summary attention, [B, H, N, D] -> [B, H, N, D]; ``precision`` = (local, global)."""
    b, h, n, d, block = _check_qkv(q, k, v, block)
    pl, pg = _parse(precision)
    nb = n // block
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kl, vl, ks, vs = _stored(k, v, block, pl, pg)
    qb = q.reshape(b, h, nb, block, d)
    s_loc = qb @ kl.reshape(b, h, nb, block, d).transpose(-1, -2) * sc  # [B, H, nb, block, block]
    s_glb = qb @ ks.transpose(-1, -2).unsqueeze(2) * sc + math.log(block)  # [B, H, nb, block, nb]
    ib = torch.arange(nb, device=q.device)
    glb_bad = (ib[None, :] >= ib[:, None]) if causal else (ib[None, :] == ib[:, None])  # [nb (query block), nb]
    s_glb = s_glb.masked_fill(glb_bad[None, None, :, None, :], float("-inf"))
    if causal:
        it = torch.arange(block, device=q.device)
        s_loc = s_loc.masked_fill(it[None, :] > it[:, None], float("-inf"))
    p = torch.softmax(torch.cat([s_loc, s_glb], dim=-1), dim=-1)
    out = p[..., :block] @ vl.reshape(b, h, nb, block, d) + p[..., block:] @ vs.unsqueeze(2)
    return out.reshape(b, h, n, d)


def multiscale_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: int,
    precision: tuple[str, str] | str = ("fp32", "fp32"),
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """The same attention as one torch SDPA call on keys [K | summaries], additive mask 0 / log(block) / -inf."""
    b, h, n, d, block = _check_qkv(q, k, v, block)
    pl, pg = _parse(precision)
    nb = n // block
    kl, vl, ks, vs = _stored(k, v, block, pl, pg)
    qblk = torch.arange(n, device=q.device) // block
    ib = torch.arange(nb, device=q.device)
    loc_ok = qblk[:, None] == qblk[None, :]
    if causal:
        pos = torch.arange(n, device=q.device)
        loc_ok &= pos[None, :] <= pos[:, None]
    glb_ok = (ib[None, :] < qblk[:, None]) if causal else (ib[None, :] != qblk[:, None])
    neg = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
    mask = torch.cat(
        [
            torch.where(loc_ok, torch.zeros((), dtype=q.dtype), neg),
            torch.where(glb_ok, torch.full((), math.log(block), dtype=q.dtype), neg),
        ],
        dim=1,
    )
    return F.scaled_dot_product_attention(
        q, torch.cat([kl, ks], dim=2), torch.cat([vl, vs], dim=2), attn_mask=mask, scale=scale
    )


def kv_bytes(shape: tuple[int, int, int, int], block: int, precision: tuple[str, str] | str) -> dict[str, int]:
    """Stored K/V bytes per scale for q/k/v of ``shape`` [B, H, N, D]: {'local', 'global', 'total', 'dense_fp32'}."""
    if len(shape) != 4:
        raise ValueError(f"shape: expected [B, H, N, D], got {shape!r}")
    b, h, n, d = (as_int(s, "shape") for s in shape)
    block = as_int(block, "block")
    if block < 1 or n % block:
        raise ValueError(f"block: must be >= 1 and divide the sequence length {n}, got {block}")
    pl, pg = _parse(precision)
    loc = 2 * b * h * n * d * PRECISIONS[pl][1]
    glb = 2 * b * h * (n // block) * d * PRECISIONS[pg][1] + (8 if pg == "fp8" else 0)  # + two fp32 fp8 scales
    loc += 8 if pl == "fp8" else 0
    return {"local": loc, "global": glb, "total": loc + glb, "dense_fp32": 2 * b * h * n * d * 4}


def score_elements(n: int, block: int) -> dict[str, int]:
    """Attention scores per (batch, head): multi-scale N * (block + N / block) vs dense N * N."""
    n, block = as_int(n, "n"), as_int(block, "block")
    if block < 1 or n % block:
        raise ValueError(f"block: must be >= 1 and divide n={n}, got {block}")
    return {"multiscale": n * (block + n // block), "dense": n * n}


@dataclass(frozen=True)
class PrecisionResult:
    """One (local, global) precision assignment: stored bytes and relative output errors (Frobenius)."""

    local: str
    global_: str
    kv_bytes: int
    err_vs_fp32: float  # vs the fp32 multi-scale output: the error the precisions add
    err_vs_dense: float  # vs fp32 dense SDPA: approximation + precision


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def precision_sweep(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: int,
    causal: bool = False,
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8"),
) -> list[PrecisionResult]:
    """Measure every (local, global) assignment from ``precisions``: bytes and error, sorted by bytes."""
    _check_qkv(q, k, v, block)
    for i, p in enumerate(precisions):
        _check_precision(p, f"precisions[{i}]")
    with torch.no_grad():
        ref = multiscale_attention(q, k, v, block, ("fp32", "fp32"), causal)
        dense = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        res = []
        for pl, pg in itertools.product(precisions, precisions):
            out = multiscale_attention(q, k, v, block, (pl, pg), causal)
            nbytes = kv_bytes(tuple(q.shape), block, (pl, pg))["total"]
            res.append(PrecisionResult(pl, pg, nbytes, _rel(out, ref), _rel(out, dense)))
    return sorted(res, key=lambda r: (r.kv_bytes, r.err_vs_fp32))


def choose_precision(results: list[PrecisionResult], tol: float) -> PrecisionResult:
    """The assignment with the fewest stored bytes whose error vs fp32 multi-scale is <= ``tol`` (ties: lower error)."""
    if not results:
        raise ValueError("results: empty sweep")
    if not tol >= 0:
        raise ValueError(f"tol: must be >= 0, got {tol}")
    ok = [r for r in results if r.err_vs_fp32 <= tol]
    if not ok:
        raise ValueError(f"tol: no assignment has error <= {tol} (best {min(r.err_vs_fp32 for r in results):.3g})")
    return min(ok, key=lambda r: (r.kv_bytes, r.err_vs_fp32))
