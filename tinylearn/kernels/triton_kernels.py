"""The ``triton`` backend: ``@triton.jit`` kernels — the form torch.compile (Inductor) itself generates.

On a GPU they compile natively. On a CPU-only machine this module sets ``TRITON_INTERPRET=1`` *before importing
triton* (and before the kernels are decorated, which is when triton reads the knob), so the same kernels run in
Triton's numpy interpreter: correct results, interpreter speed — use them to check and to learn, never to time.
Set ``TRITON_INTERPRET=0`` yourself to force native compilation on a GPU box.

Kernel versions (each checked against the numpy reference in tests/test_kernels_triton.py):
  softmax_kernel          v1 one program per row, the whole row in one block (BLOCK = next power of two >= C)
  softmax_online_kernel   v2 one program per row, loops over BLOCK-wide chunks with a running max / sum (long rows)
  layer_norm_kernel       one program per row: mean, centred variance, normalise, scale+shift; stores mean/rstd
  bias_gelu_kernel        1-D grid over elements, bias indexed by column (offs % C); erf or tanh form
  flash_attention_kernel  grid (query blocks, batch*heads): Q tile in registers, loop over K/V tiles with the
                          online softmax (running max m, sum l, accumulator acc), causal tiles skipped
Loads are upcast to float32; stores cast to the output's dtype (float32 or float16).
"""

from __future__ import annotations

import math
import os

import numpy as np

if os.environ.get("TRITON_INTERPRET") is None:
    from ..backends import cuda_available

    if not cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

NATIVE_DTYPES = (np.float32, np.float16)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _stdlib_mode_matches() -> bool:
    """triton.language's own @jit helpers (tl.max's combine function ...) are decorated when triton is first
    imported; if that happened before TRITON_INTERPRET=1 was set (torch imports triton, e.g. in an optimizer step
    or torch.compile), interpreted kernels fail on them with "Cannot call @triton.jit'd outside of the scope of a
    kernel"."""
    import triton.language.standard as std
    from triton.runtime.jit import JITFunction

    helper = getattr(std, "max", None)
    return not (INTERPRETED and isinstance(helper, JITFunction) and type(helper) is JITFunction)


def available() -> tuple[bool, str]:
    if not _stdlib_mode_matches():
        return False, (
            "triton was imported before TRITON_INTERPRET=1 was set (torch imports it lazily); "
            "import tinylearn first or export TRITON_INTERPRET=1 before starting Python"
        )
    return True, ""


def _t(a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if INTERPRETED else t.cuda()


def _n(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy()


# ------------------------------------------------------------------------------------------------ softmax
@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    e = tl.where(mask, e, 0.0)
    s = tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride + offs, e / s, mask=mask)


@triton.jit
def softmax_online_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * stride
    m = tl.full((BLOCK,), -float("inf"), tl.float32)  # per-lane running max
    d = tl.zeros((BLOCK,), tl.float32)  # per-lane running sum of exp(x - m)
    for c0 in range(0, n_cols, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        d = d * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
    mx = tl.max(m, axis=0)
    den = tl.sum(d * tl.exp(m - mx), axis=0)
    for c0 in range(0, n_cols, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * stride + offs, tl.exp(x - mx) / den, mask=offs < n_cols)


def softmax(x: np.ndarray, version: str = "one_block", block: int = 1024) -> np.ndarray:
    """``version``: 'one_block' (row in one block) or 'online' (chunks of ``block`` with running max/sum)."""
    rows, cols = x.shape
    tx = _t(x)
    ty = torch.empty_like(tx)
    if version == "one_block":
        softmax_kernel[(rows,)](tx, ty, cols, cols, BLOCK=triton.next_power_of_2(cols))
    elif version == "online":
        blk = min(triton.next_power_of_2(cols), triton.next_power_of_2(max(1, int(block))))
        softmax_online_kernel[(rows,)](tx, ty, cols, cols, BLOCK=blk)
    else:
        raise ValueError(f"version: must be 'one_block' or 'online', got {version!r}")
    return _n(ty)


# ------------------------------------------------------------------------------------------------ LayerNorm
@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + offs, xc * rstd * w + b, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, cols = x.shape
    tx, tw, tb = _t(x), _t(w), _t(b)
    ty = torch.empty_like(tx)
    tm = torch.empty(rows, dtype=torch.float32, device=tx.device)
    tr = torch.empty(rows, dtype=torch.float32, device=tx.device)
    layer_norm_kernel[(rows,)](tx, tw, tb, ty, tm, tr, cols, float(eps), BLOCK=triton.next_power_of_2(cols))
    return _n(ty), _n(tm), _n(tr)


# ------------------------------------------------------------------------------------------------ bias + GELU
@triton.jit
def bias_gelu_kernel(x_ptr, b_ptr, y_ptr, n, n_cols, TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = u + tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0).to(tl.float32)
    if TANH:
        z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
        t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)  # tanh(z); saturates correctly at +-1
        y = 0.5 * u * (1.0 + t)
    else:
        y = 0.5 * u * (1.0 + tl.math.erf(u * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


def bias_gelu(x: np.ndarray, b: np.ndarray, approximate: str = "none", block: int = 1024) -> np.ndarray:
    tx, tb = _t(x), _t(b)
    ty = torch.empty_like(tx)
    n = tx.numel()
    bias_gelu_kernel[(triton.cdiv(n, block),)](tx, tb, ty, n, x.shape[1], TANH=approximate == "tanh", BLOCK=block)
    return _n(ty)


# ------------------------------------------------------------------------------------------------ attention
@triton.jit
def flash_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    n_q,
    n_k,
    d,
    dv,
    scale,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    ddv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        q_ptr + bh * n_q * d + rows[:, None] * d + dd[None, :],
        mask=(rows[:, None] < n_q) & (dd[None, :] < d),
        other=0.0,
    ).to(tl.float32)
    m = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, (qb + 1) * BLOCK_M)  # keys beyond the block's last query are all masked
    for j0 in range(0, hi, BLOCK_N):
        cols = j0 + tl.arange(0, BLOCK_N)
        k = tl.load(
            k_ptr + bh * n_k * d + cols[:, None] * d + dd[None, :],
            mask=(cols[:, None] < n_k) & (dd[None, :] < d),
            other=0.0,
        ).to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale
        valid = cols[None, :] < n_k
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m - safe)
        p = tl.exp(s - safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_ptr + bh * n_k * dv + cols[:, None] * dv + ddv[None, :],
            mask=(cols[:, None] < n_k) & (ddv[None, :] < dv),
            other=0.0,
        ).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    out = acc / l_sum[:, None]
    tl.store(
        o_ptr + bh * n_q * dv + rows[:, None] * dv + ddv[None, :],
        out,
        mask=(rows[:, None] < n_q) & (ddv[None, :] < dv),
    )
    tl.store(lse_ptr + bh * n_q + rows, m + tl.log(l_sum), mask=rows < n_q)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, block_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """block_size must be a power of two >= 16 (tl.dot's minimum tile on GPUs)."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size: the triton backend needs a power of two >= 16, got {block_size}")
    bh, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    tq, tk, tv = _t(q), _t(k), _t(v)
    to = torch.empty((bh, nq, dv), dtype=tq.dtype, device=tq.device)
    tlse = torch.empty((bh, nq), dtype=torch.float32, device=tq.device)
    grid = (triton.cdiv(nq, block_size), bh)
    flash_attention_kernel[grid](
        tq,
        tk,
        tv,
        to,
        tlse,
        nq,
        nk,
        d,
        dv,
        1.0 / math.sqrt(d),
        CAUSAL=bool(causal),
        BLOCK_M=block_size,
        BLOCK_N=block_size,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_DV=max(16, triton.next_power_of_2(dv)),
    )
    return _n(to), _n(tlse)
