"""conv2d as im2col + GEMM, and its backward through col2im (NCHW, groups, depthwise).

With K = (C/g)*kh*kw, L = OH*OW and weights viewed per group as Wg [g, OC/g, K]:

    forward   cols = im2col(x)                       [g, K, N*L]   (the whole batch side by side, "KNL")
              Y    = Wg @ cols                       [g, OC/g, N*L]            one GEMM per group
              y    = transpose01(Y) + b              [N, OC, OH, OW]           N*OC contiguous row copies
    backward  dYᵀ  = transpose01(dy)                 [OC, N*L]                 the same row copies
              dW   = dYᵀ @ colsᵀ                     [g, OC/g, K]   one GEMM (the batch sum is inside it)
              dX   = col2im(Wgᵀ @ dYᵀ)               [N, C, H, W]   one GEMM + col2im (the adjoint of im2col)
              db   = sum over (N, OH, OW) of dy

The batch is folded into the GEMM's N dimension ("KNL" column layout): one [OC, K] x [K, N*L] GEMM per group
instead of N small ones; the price is the transpose of Y (and of dy), done as contiguous row copies in C++
(``_C.conv.transpose01``) when the cpp backend is in use. The backward reuses the forward's cols.

A pointwise conv (1x1, stride 1, no padding) needs no im2col and no transpose at all ("direct path"): image n's
[C, H*W] block already *is* its column matrix, so y[n] = W @ x[n] is a batched matmul straight into y's memory, and
dX[n] = Wᵀ @ dy[n] likewise; only dW (one GEMM over the whole batch) transposes x and dy to the KNL layout.

Every path is a registered implementation of the ops ``conv.conv2d`` / ``conv.conv2d_backward`` in
``tinylearn.backends`` (``backends.versions("conv.conv2d", "cpp")``): backends ``numpy`` (the reference: numpy
im2col + OpenBLAS), ``numba`` (numba im2col + OpenBLAS) and ``cpp``, whose versions are the ladder below plus
``auto`` (the default: v3 where its direct kernel applies, else v2 from ``_V2_MIN_ROWS`` output channels per group,
else v1). ``backend=None`` is the registry's choice (cpp for float32/64 when built, else numpy); a version the
backend lacks (``backend="numpy", version="v3"``) is a ValueError naming ``version``; ``backends.use("conv.conv2d",
backend=..., version=...)`` pins one for every call that names none (the autograd Functions included).

The cpp forward ladder (``FWD_VERSIONS``, ``version=``):

    v1   im2col (C++ v1, or v0 with version="v0") + one OpenBLAS GEMM (np.matmul) + the transpose01 row copies
    v2   implicit GEMM in C++ (``_C.conv.conv2d_forward``; auto picks it from 32 output channels per group): no
         column matrix; packed micro-kernels (8x32 AVX-512 in cpp_src/conv_implicit.cpp, the project GEMM's from
         cpp_src/gemm.cpp at the AVX2 / scalar levels) with B packed straight from the image, a KC x NC block per
         thread, accumulated into y's NCHW memory (no transpose), all in one OpenMP team (no OpenBLAS threads
         spinning against ours between stages). Returns cols=None.
    v3   direct convolution over a channel-blocked layout (cpp_src/conv_direct.cpp, oneDNN's scheme; auto picks it)
         for the convs it covers: fp32, stride 1, no dilation, groups 1, kernel larger than 1x1, C and OC multiples
         of the block B (16 with AVX-512 selected, 8 with AVX2; none at the scalar level). x is reordered once to
         [N][C/B][H+2p][W+2p][B] (zero border), W to [OC/B][C/B][kh][kw][B][B]; a register tile of 14 (AVX2: 7)
         output columns x 2B output channels reads the input in place (no B packing: v2 packs 9x the input per call
         for 3x3). Everything else runs v2. Returns cols=None. Its dW reads the same blocked input and dY reordered
         to [N][OC/B][OH][OW][B]: per (OC/B, C/B) pair a B x B x kh x kw block of dW, the positions in chunks of
         output rows (no reduction between threads).
         Small C (no block divides C, one divides OC: the stem's 3 -> 64, the digits CNN's 1 -> 8): the forward
         reads a zero-padded planar copy of x instead, W as [OC/B][C][kh][kw][B], any row stride and column stride
         1 or 2 (the broadcasts of x[c][oh*sh + i][ow*sw + j] are spaced by the stride); dW stays on v2.

Backward with v2 and stride 1: dX is itself a convolution, dX = conv2d(dY, W~, padding = d*(k-1) - p) with
W~[c, o, i, j] = W[o, c, kh-1-i, kw-1-j] (per group), so it runs on the same implicit-GEMM kernel: no col2im, no
dcols GEMM, and no flipped copy of W (``conv2d_forward(..., flip_weight=True)``: the kernel's A packing reads W~
from W). Other strides take col2im(Wᵀ @ dYᵀ). dW (groups=1) also runs on the micro-kernels without a column
matrix (``_C.conv.conv2d_backward_weight``: the N*L reduction split over the threads, cols blocks generated in
cache); with groups > 1, and on the v1 path, dW = dYᵀ @ colsᵀ is one OpenBLAS GEMM per group.

GEMMs of the v1 path and of dW: numpy's matmul (OpenBLAS sgemm/dgemm).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from ._params import as_float_array, check_backend, window_params
from .im2col import _native_dtype, col2im_raw, im2col_raw


def _check_conv_args(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, groups: int) -> tuple[int, int]:
    """Validate shapes of x [N,C,H,W], w [OC, C/g, kh, kw], bias [OC] and groups; returns (OC, groups)."""
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D [N, C, H, W] array, got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"weight: expected a 4-D [OC, C/groups, kh, kw] array, got shape {w.shape}")
    if isinstance(groups, bool) or not isinstance(groups, int | np.integer) or groups < 1:
        raise ValueError(f"groups: must be a positive int, got {groups!r}")
    groups = int(groups)
    C, OC = x.shape[1], w.shape[0]
    if C % groups != 0:
        raise ValueError(f"groups: input channels {C} (x shape {x.shape}) are not divisible by groups={groups}")
    if OC % groups != 0:
        raise ValueError(f"groups: output channels {OC} (weight shape {w.shape}) are not divisible by groups={groups}")
    if w.shape[1] * groups != C:
        raise ValueError(
            f"weight: shape {w.shape} expects {w.shape[1]}*groups={w.shape[1] * groups} input channels, "
            f"but x shape {x.shape} has {C} (groups={groups})"
        )
    if bias is not None and bias.shape != (OC,):
        raise ValueError(f"bias: expected shape ({OC},) for weight shape {w.shape}, got {bias.shape}")
    return OC, groups


def _is_pointwise(k, s, p, d) -> bool:
    return k == (1, 1) and s == (1, 1) and p == (0, 0)


# cpp forward ladder: v0/v1 = im2col rung + OpenBLAS, v2 = implicit GEMM, v3 = direct where it applies; the cpp
# default "auto" chooses among them per layer (registered as versions of conv.conv2d / conv.conv2d_backward)
FWD_VERSIONS: tuple[str, ...] = ("v0", "v1", "v2", "v3")
CPP_VERSIONS: tuple[str, ...] = ("auto", *FWD_VERSIONS)


# version=None picks v2 only where it measured faster than v1: at least this many GEMM rows (output
# channels per group; the 6-row micro-panels of a smaller OC are part edge tiles) and, for dW, this many columns
# (C/g*kh*kw; the 16-32 wide panels). Smaller layers (the digits CNN: 8 and 16 channels) keep v1 (im2col +
# OpenBLAS) unless v3's direct kernel covers them (_direct: fp32, channel counts multiples of 8, stride 1, ...).
_V2_MIN_ROWS, _V2_MIN_COLS = 32, 32


def _implicit(backend: str | None, version: str | None, a: np.ndarray, rows: int = _V2_MIN_ROWS) -> bool:
    """Whether the C++ kernels (v3 direct / v2 implicit GEMM) serve this call: cpp backend or None, float32/64, and
    version "v2"/"v3", or version None ("auto") with a GEMM of at least ``_V2_MIN_ROWS`` rows (``rows``)."""
    if version not in (None, "v2", "v3") or not _fast_cpp(backend, a):
        return False
    return version is not None or rows >= _V2_MIN_ROWS


def _direct(
    backend: str | None,
    version: str | None,
    a: np.ndarray,
    C: int,
    OC: int,
    k: tuple,
    s: tuple,
    d: tuple,
    g: int,
    forward: bool = True,
) -> bool:
    """Whether v3's direct kernels take this fp32 conv (C -> OC channels) here, at any layer size: they have no GEMM
    packing to amortise, so small layers (8 -> 16 channels) gain from them too where v2 does not. ``forward``: the
    forward (and dX) kernels, which include the small-C one (the 3- or 1-channel first layer, strided too); else dW's,
    the channel-blocked one only."""
    if version not in (None, "v3") or a.dtype != np.float32 or not _fast_cpp(backend, a):
        return False
    lib = backends.load_C("conv")
    return bool((lib.direct_forward_eligible if forward else lib.direct_eligible)(C, OC, k, s, d, g))


def _kernel_version(version: str | None) -> str:
    """The C++ conv2d_forward's version: "v2" only when asked for; else "v3" (direct where it applies, else v2)."""
    return "v2" if version == "v2" else "v3"


def _fast_cpp(backend: str | None, a: np.ndarray) -> bool:
    """Whether the C++ helpers (transpose01) serve this call: backend None/"cpp", float32/64, _C.conv built."""
    return backend in (None, "cpp") and a.dtype in (np.float32, np.float64) and backends.C_available("conv")


def transpose01(a: np.ndarray, bias: np.ndarray | None = None, backend: str | None = None) -> np.ndarray:
    """[A, B, L] -> [B, A, L] (+ bias[A]) as a new C-contiguous array: C++ row copies, or numpy for other backends."""
    if _fast_cpp(backend, a):
        bias = None if bias is None else np.ascontiguousarray(bias, dtype=a.dtype)
        return backends.load_C("conv").transpose01(np.ascontiguousarray(a), bias)
    out = np.empty((a.shape[1], a.shape[0], a.shape[2]), dtype=a.dtype)
    if bias is None:
        np.copyto(out, a.transpose(1, 0, 2))
    else:
        np.add(a.transpose(1, 0, 2), bias[None, :, None], out=out)
    return out


def _prepare(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int, backend: str | None):
    check_backend(backend)
    x = as_float_array(x, "x")
    w = as_float_array(w, "weight")
    b = None if bias is None else as_float_array(bias, "bias")
    dt = np.result_type(x.dtype, w.dtype) if b is None else np.result_type(x.dtype, w.dtype, b.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    b = None if b is None else b.astype(dt, copy=False)
    OC, groups = _check_conv_args(x, w, b, groups)
    k, s, p, d, out = window_params(x.shape, (w.shape[2], w.shape[3]), stride, padding, dilation, "x")
    return x, w, b, groups, k, s, p, d, out


def conv_cols(x: np.ndarray, k, s, p, d, out, backend: str | None, version: str | None = None) -> np.ndarray:
    """Column matrix [C*kh*kw, N*L] of x ("KNL"); a pointwise conv (1x1, stride 1, no padding) only transposes."""
    if _is_pointwise(k, s, p, d):
        N, C, H, W = x.shape
        return transpose01(x.reshape(N, C, H * W), None, backend).reshape(C, N * H * W)
    return im2col_raw(x, k, s, p, d, out, backend, layout="KNL", version=version)


def conv2d(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> np.ndarray:
    """2-D cross-correlation like ``torch.nn.functional.conv2d`` (NCHW), computed as im2col + GEMM (or, for the
    cpp backend, the implicit GEMM / direct kernels; ``version`` picks a rung, see ``backends.versions``)."""
    y, _ = conv2d_forward(x, w, bias, stride, padding, dilation, groups, backend=backend, version=version)
    return y


def conv2d_forward(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Forward pass returning (y, cols); ``cols`` [C*kh*kw, N*OH*OW] can be reused for dW in the backward pass.
    A pointwise conv (1x1, stride 1, no padding) takes the direct path and returns cols=None (x is the columns);
    so do the cpp v2/v3 kernels (version "v2"/"v3", or "auto" for layers with at least ``_V2_MIN_ROWS`` output
    channels per group or that v3 covers), which build no columns. "v0"/"v1" pin the cpp im2col rung of the
    im2col + OpenBLAS path. Dispatched through ``backends`` (op ``conv.conv2d``)."""
    x, w, b, g, k, s, p, d, out = _prepare(x, w, bias, stride, padding, dilation, groups, backend)
    return backends.dispatch("conv.conv2d", x, w, b, g, k, s, p, d, out, backend=backend, version=version)


def _forward(
    backend: str, version: str | None, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, g: int, k, s, p, d, out
) -> tuple[np.ndarray, np.ndarray | None]:
    """The forward on validated arrays for one (backend, version) of the registry (version None = cpp "auto")."""
    N, C = x.shape[:2]
    OC = w.shape[0]
    OH, OW = out
    L = OH * OW
    if _implicit(backend, version, x, OC // g) or _direct(backend, version, x, C, OC, k, s, d, g):
        y = backends.load_C("conv").conv2d_forward(
            np.ascontiguousarray(x),
            np.ascontiguousarray(w),
            None if b is None else np.ascontiguousarray(b),
            s,
            p,
            d,
            g,
            version=_kernel_version(version),
        )
        return y, None
    if _is_pointwise(k, s, p, d):  # direct: y[n] = W @ x[n], batched matmul written straight into y
        y = np.empty((N, g, OC // g, L), dtype=x.dtype)
        np.matmul(w.reshape(g, OC // g, C // g), np.ascontiguousarray(x).reshape(N, g, C // g, L), out=y)
        y = y.reshape(N, OC, OH, OW)
        if b is not None:
            y += b[None, :, None, None]
        return y, None
    cols = conv_cols(x, k, s, p, d, (OH, OW), backend, _im2col_version(backend, version))
    if g == 1:
        y2 = w.reshape(OC, -1) @ cols  # [OC, N*L]: one GEMM for the whole batch (OpenBLAS)
    else:
        y2 = np.matmul(w.reshape(g, OC // g, -1), cols.reshape(g, cols.shape[0] // g, cols.shape[1]))
    y = transpose01(y2.reshape(OC, N, L), b, backend).reshape(N, OC, OH, OW)
    return y, cols


def _im2col_version(backend: str, version: str | None) -> str | None:
    """The cpp im2col rung of the im2col + OpenBLAS path: v0 / v1 when named, else the im2col default."""
    return version if backend == "cpp" and version in ("v0", "v1") else None


def conv2d_backward(
    grad_out: Any,
    x: Any,
    w: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    *,
    backend: str | None = None,
    cols: np.ndarray | None = None,
    needs: tuple[bool, bool, bool] = (True, True, True),
    version: str | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients (dx, dw, db) of ``y = conv2d(x, w, b, ...)`` given dL/dy; entries not in ``needs`` are None.

    dw = dYᵀ·colsᵀ (one GEMM per group over the whole batch), dx = col2im(Wᵀ·dYᵀ), db = dY summed over batch and
    space. ``cols`` (from conv2d_forward) avoids recomputing im2col. With the cpp v2/v3 kernels (``version``
    "auto"/"v2"/"v3") and stride 1, dx is the convolution of dy with the flipped, transposed weights (no col2im).
    Dispatched through ``backends`` (op ``conv.conv2d_backward``, the same backends and versions as the forward).
    """
    x, w, _, g, k, s, p, d, out = _prepare(x, w, None, stride, padding, dilation, groups, backend)
    N, OC = x.shape[0], w.shape[0]
    dy = as_float_array(grad_out, "grad_out")
    if dy.shape != (N, OC) + out:
        raise ValueError(f"grad_out: expected shape {(N, OC) + out} (the conv output), got {dy.shape}")
    dy = np.ascontiguousarray(dy, dtype=x.dtype)
    return backends.dispatch(
        "conv.conv2d_backward", x, w, dy, g, k, s, p, d, out, cols, needs, backend=backend, version=version
    )


def _backward(
    backend: str,
    version: str | None,
    x: np.ndarray,
    w: np.ndarray,
    dy: np.ndarray,
    g: int,
    k,
    s,
    p,
    d,
    out,
    cols,
    needs,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The backward on validated arrays for one (backend, version) of the registry (version None = cpp "auto")."""
    N, C, H, W = x.shape
    OC = w.shape[0]
    OH, OW = out
    L = OH * OW
    dy3 = dy.reshape(N, OC, L)
    pointwise = _is_pointwise(k, s, p, d)
    dx = dw = db = None
    dyT = None
    Kg = (C // g) * k[0] * k[1]
    # dX = conv(dY, W~) on the v2 kernel (its GEMM rows: C/g); dW on the v2 kernel, no column matrix (rows OC)
    # (or v3's direct kernels, which take fp32 layers of any size they cover: dX is the conv OC -> C)
    dx_conv = (
        needs[0]
        and s == (1, 1)
        and (_implicit(backend, version, x, C // g) or _direct(backend, version, x, OC, C, k, s, d, g))
    )
    dw_impl = (
        needs[1]
        and g == 1
        and (
            _implicit(backend, version, x, OC if Kg >= _V2_MIN_COLS else 0)
            or _direct(backend, version, x, C, OC, k, s, d, g, forward=False)
        )
    )
    if (needs[1] and not dw_impl) or (needs[0] and not pointwise and not dx_conv):
        dyT = transpose01(dy3, None, backend).reshape(g, OC // g, N * L)  # [g, OC/g, N*L]
    if dw_impl:
        dw = backends.load_C("conv").conv2d_backward_weight(
            np.ascontiguousarray(x), dy3.reshape(N, OC, OH, OW), k, s, p, d, version=_kernel_version(version)
        )
    elif needs[1]:
        if cols is None:
            cols = conv_cols(x, k, s, p, d, (OH, OW), backend, _im2col_version(backend, version))
        # dWᵀ = cols @ dYᵀᵀ: OpenBLAS runs this orientation faster than dY @ colsᵀ (long K = N*L reduction)
        dw = np.matmul(cols.reshape(g, Kg, N * L), dyT.transpose(0, 2, 1)).transpose(0, 2, 1).reshape(w.shape)
    if needs[0]:
        wg = w.reshape(g, OC // g, -1)
        if dx_conv:
            # W~[g*Cg + c, o, i, j] = W[g*OCg + o, c, kh-1-i, kw-1-j]; padding d*(k-1) - p restores H x W.
            # flip_weight: the kernel's A packing reads W that way (no flipped copy of W is made)
            wc = np.ascontiguousarray(w)
            pt = (d[0] * (k[0] - 1) - p[0], d[1] * (k[1] - 1) - p[1])
            dy4 = dy3.reshape(N, OC, OH, OW)
            if min(pt) >= 0:
                dx = backends.load_C("conv").conv2d_forward(
                    dy4, wc, None, (1, 1), pt, d, g, flip_weight=True, version=_kernel_version(version)
                )
            else:  # padding larger than the dilated kernel: the full correlation, then crop
                p0 = (max(pt[0], 0), max(pt[1], 0))
                big = backends.load_C("conv").conv2d_forward(
                    dy4, wc, None, (1, 1), p0, d, g, flip_weight=True, version=_kernel_version(version)
                )
                ch, cw = max(-pt[0], 0), max(-pt[1], 0)
                dx = np.ascontiguousarray(big[:, :, ch : ch + H, cw : cw + W])
        elif pointwise:  # direct: dx[n] = Wᵀ @ dy[n], no col2im, no transpose
            dx = np.empty((N, g, C // g, L), dtype=x.dtype)
            np.matmul(wg.transpose(0, 2, 1), dy3.reshape(N, g, OC // g, L), out=dx)
            dx = dx.reshape(N, C, H, W)
        else:
            dcols = np.matmul(wg.transpose(0, 2, 1), dyT).reshape(C * k[0] * k[1], N * L)  # [C*kh*kw, N*L]
            dx = col2im_raw(dcols, N, C, H, W, k, s, p, d, (OH, OW), backend, layout="KNL")
    if needs[2]:  # einsum: one pass; numpy's sum over axes (0, 2) of [N, OC, L] took 5x longer (46 vs 10 us)
        db = np.einsum("ncl->c", dy3)
    return dx, dw, db


def conv2d_flops(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> int:
    """Forward multiply-add count x2: 2 * N * OC * OH * OW * (C/g) * kh * kw."""
    k = (w_shape[2], w_shape[3])
    _, _, _, _, (OH, OW) = window_params(tuple(x_shape), k, stride, padding, dilation, "x")
    N = x_shape[0]
    return 2 * N * w_shape[0] * OH * OW * w_shape[1] * k[0] * k[1]


def _example_forward(rng: np.random.Generator) -> tuple[tuple, dict]:
    """A grouped, strided, padded conv (the conformance test's input): validated args of ``conv.conv2d``."""
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    return _prepare(x, w, b, (2, 1), 1, 1, 2, None), {}


def _example_backward(rng: np.random.Generator) -> tuple[tuple, dict]:
    """The same conv's backward (stride 1, so the v2/v3 kernels take their own dX path): all three gradients."""
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    x, w, _, g, k, s, p, d, out = _prepare(x, w, None, 1, 1, 1, 2, None)
    dy = rng.standard_normal((2, 6, *out)).astype(np.float32)
    return (x, w, dy, g, k, s, p, d, out, None, (True, True, True)), {}


def _register() -> None:
    """Every forward/backward path as an implementation of ``conv.conv2d`` / ``conv.conv2d_backward``."""
    import functools

    avail = lambda: backends.C_available("conv")  # noqa: E731
    # compared: the forward's second output is the column matrix kept for backward (None on the direct kernels)
    extra = {
        "conv.conv2d": {"example": _example_forward, "compared": lambda out: out[0]},
        "conv.conv2d_backward": {"example": _example_backward},
    }
    for op, fn in (("conv.conv2d", _forward), ("conv.conv2d_backward", _backward)):
        backends.register(op, "numpy", functools.partial(fn, "numpy", None), **extra[op])
        # numba ranks below numpy for backend=None (its first call pays the JIT compile); name it to use it
        backends.register(op, "numba", functools.partial(fn, "numba", None), priority=5, when=_native_dtype)
        for v in CPP_VERSIONS:
            impl = functools.partial(fn, "cpp", None if v == "auto" else v)
            backends.register(op, "cpp", impl, version=v, default=v == "auto", when=_native_dtype, available=avail)


_register()

__all__ = ["CPP_VERSIONS", "FWD_VERSIONS", "conv2d", "conv2d_forward", "conv2d_backward", "conv2d_flops", "conv_cols"]
