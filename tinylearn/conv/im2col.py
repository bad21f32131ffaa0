"""im2col / col2im: the layout transform that turns a convolution into one GEMM.

Layout (identical to torch.nn.functional.unfold / fold):

    cols[n, (c*kh + i)*kw + j, oh*OW + ow] = xpad[n, c, oh*sh + i*dh, ow*sw + j*dw]

where ``xpad`` is ``x`` zero-padded by (ph, pw). col2im is the adjoint (transpose) of im2col: every column entry
is *added* back to the pixel it was read from, so overlapping windows accumulate. Additions happen in ascending
(i, j) order for each pixel, the same order as torch's CPU fold, so results are bit-identical in fp32.

Backends: ``numpy`` (a strided 6-D view [N, C, kh, kw, OH, OW] of the padded input copied once; col2im loops
over the kh*kw kernel offsets only, never over pixels), ``numba`` (parallel over N*C, lazily imported) and
``cpp`` (tinylearn._C.conv, a versions ladder: ``v0`` OpenMP over the N*C planes, ``v1`` (default) streaming
rows with threads over channels, see cpp_src/conv_im2col.cpp). All three register as the ops ``conv.im2col`` /
``conv.col2im`` in ``tinylearn.backends`` (the cpp versions as versions of backend ``cpp``). ``backend`` and
``version`` are keyword-only; the public ``im2col`` / ``col2im`` default to ``"numpy"`` (DESIGN.md's contract),
``backend=None`` picks cpp when built (float32/64), else numpy, or what ``backends.use("conv.im2col", ...)`` pins.
Every backend gives bit-identical results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import backends
from .._inputs import as_array
from ._params import check_backend, pair, window_params

_NATIVE = (np.float32, np.float64)
_NUMERIC = ("f", "i", "u", "b")


def window_view(xp: np.ndarray, k: tuple[int, int], s: tuple[int, int], d: tuple[int, int], out: tuple[int, int]):
    """Read-only strided view [N, C, kh, kw, OH, OW] of an (already padded) NCHW array: no copy."""
    sN, sC, sH, sW = xp.strides
    N, C = xp.shape[:2]
    shape = (N, C, k[0], k[1], out[0], out[1])
    strides = (sN, sC, sH * d[0], sW * d[1], sH * s[0], sW * s[1])
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def pad_nchw(x: np.ndarray, p: tuple[int, int], value: float = 0.0) -> np.ndarray:
    if p == (0, 0):
        return x
    return np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=value)


def _native_dtype(a: np.ndarray, *_: Any, **__: Any) -> bool:
    """``when=`` predicate: the compiled kernels handle float32/float64 only (float16 stays on numpy)."""
    return a.dtype in _NATIVE


def _native(a: np.ndarray, backend: str, name: str) -> np.ndarray:
    if a.dtype not in _NATIVE:
        raise TypeError(f"{name}: backend {backend!r} supports float32/float64, got dtype {a.dtype}")
    return np.ascontiguousarray(a)


_EXAMPLE_GEOMETRY = ((3, 2), (2, 1), (1, 0), (1, 2))  # kernel, stride, padding, dilation: every axis differs


def _im2col_example(rng: np.random.Generator) -> tuple[tuple, dict]:
    """A small strided, padded, dilated unfold (the conformance test's input for ``conv.im2col``)."""
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    return (x, *window_params(x.shape, *_EXAMPLE_GEOMETRY, "x"), "KNL"), {}


def _col2im_example(rng: np.random.Generator) -> tuple[tuple, dict]:
    """The adjoint of ``_im2col_example``'s unfold (overlapping windows summed)."""
    N, C, H, W = 2, 3, 7, 6
    k, s, p, d, out = window_params((N, C, H, W), *_EXAMPLE_GEOMETRY, "output_size")
    cols = rng.standard_normal((C * k[0] * k[1], N * out[0] * out[1])).astype(np.float32)
    return (cols, N, C, H, W, k, s, p, d, out, "KNL"), {}


@backends.register("conv.im2col", "numpy", example=_im2col_example)
def _im2col_numpy(x: np.ndarray, k, s, p, d, out, layout: str = "NKL") -> np.ndarray:
    N, C = x.shape[:2]
    K, L = C * k[0] * k[1], out[0] * out[1]
    v = window_view(pad_nchw(x, p), k, s, d, out)  # [N, C, kh, kw, OH, OW], no copy yet
    if layout == "KNL":
        return v.transpose(1, 2, 3, 0, 4, 5).reshape(K, N * L)  # the one copy
    return v.reshape(N, K, L)  # the one copy


# numba ranks below numpy for backend=None: its first call pays the JIT compile; name it to use it
@backends.register("conv.im2col", "numba", priority=5, when=_native_dtype)
def _im2col_numba(x: np.ndarray, k, s, p, d, out, layout: str = "NKL") -> np.ndarray:
    from ._numba import im2col_numba

    return im2col_numba(_native(x, "numba", "x"), k, s, p, d, out, layout)


CPP_VERSIONS: tuple[str, ...] = ("v0", "v1")  # the C++ ladder; v1 is the default


def _cpp_im2col(version: str) -> Any:
    def fn(x: np.ndarray, k, s, p, d, out, layout: str = "NKL") -> np.ndarray:
        return backends.load_C("conv").im2col(_native(x, "cpp", "x"), k, s, p, d, layout, version)

    fn.__name__ = f"im2col_cpp_{version}"
    return fn


def _cpp_col2im(version: str) -> Any:
    def fn(cols: np.ndarray, N: int, C: int, H: int, W: int, k, s, p, d, out, layout: str = "NKL") -> np.ndarray:
        cols = _native(cols, "cpp", "cols")
        if N == 0:  # the C++ kernel rejects an empty batch; numpy/numba (and cpp im2col) give an empty result
            return np.zeros((0, C, H, W), cols.dtype)
        return backends.load_C("conv").col2im(cols, (H, W), k, s, p, d, layout, N, version)

    fn.__name__ = f"col2im_cpp_{version}"
    return fn


for _v in CPP_VERSIONS:
    _avail = lambda: backends.C_available("conv")  # noqa: E731
    backends.register(
        "conv.im2col", "cpp", _cpp_im2col(_v), version=_v, default=_v == "v1", when=_native_dtype, available=_avail
    )
    backends.register(
        "conv.col2im", "cpp", _cpp_col2im(_v), version=_v, default=_v == "v1", when=_native_dtype, available=_avail
    )


@backends.register("conv.col2im", "numpy", example=_col2im_example)
def _col2im_numpy(cols: np.ndarray, N: int, C: int, H: int, W: int, k, s, p, d, out, layout: str = "NKL"):
    OH, OW = out
    if layout == "KNL":
        c6 = cols.reshape(C, k[0], k[1], N, OH, OW).transpose(3, 0, 1, 2, 4, 5)
    else:
        c6 = cols.reshape(N, C, k[0], k[1], OH, OW)
    xp = np.zeros((N, C, H + 2 * p[0], W + 2 * p[1]), dtype=cols.dtype)
    for i in range(k[0]):  # loop over kernel offsets only; each adds a whole strided plane
        for j in range(k[1]):
            hi, wj = i * d[0], j * d[1]
            xp[:, :, hi : hi + s[0] * (OH - 1) + 1 : s[0], wj : wj + s[1] * (OW - 1) + 1 : s[1]] += c6[:, :, i, j]
    return xp[:, :, p[0] : p[0] + H, p[1] : p[1] + W]


@backends.register("conv.col2im", "numba", priority=5, when=_native_dtype)
def _col2im_numba(cols: np.ndarray, N: int, C: int, H: int, W: int, k, s, p, d, out, layout: str = "NKL"):
    from ._numba import col2im_numba

    return col2im_numba(_native(cols, "numba", "cols"), N, C, H, W, k, s, p, d, out, layout)


def im2col_raw(
    x: np.ndarray, k, s, p, d, out, backend: str | None, layout: str = "NKL", version: str | None = None
) -> np.ndarray:
    """im2col on validated arguments. layout "NKL" = unfold's [N, K, L]; "KNL" = [K, N*L] (batch as one GEMM).
    ``version`` names a rung of the cpp ladder ("v0", "v1"); None = the backend's default."""
    return backends.dispatch("conv.im2col", x, k, s, p, d, out, layout, backend=backend, version=version)


def col2im_raw(
    cols: np.ndarray,
    N: int,
    C: int,
    H: int,
    W: int,
    k,
    s,
    p,
    d,
    out,
    backend: str | None,
    layout: str = "NKL",
    version: str | None = None,
) -> np.ndarray:
    """col2im on validated arguments (see im2col_raw for the layouts and versions)."""
    return backends.dispatch("conv.col2im", cols, N, C, H, W, k, s, p, d, out, layout, backend=backend, version=version)


def im2col(
    x: Any,
    kernel_size: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    *,
    backend: str | None = "numpy",
    version: str | None = None,
) -> np.ndarray:
    """Unfold NCHW ``x`` into columns [N, C*kh*kw, L] (L = OH*OW), exactly like ``torch.nn.functional.unfold``.
    ``version``: a rung of the cpp ladder (``CPP_VERSIONS``), None = the default."""
    check_backend(backend)
    x = as_array(x, "x", dtypes=_NUMERIC)
    if x.ndim == 3:  # torch accepts an unbatched [C, H, W]
        return im2col(x[None], kernel_size, stride, padding, dilation, backend=backend, version=version)[0]
    k, s, p, d, out = window_params(x.shape, kernel_size, stride, padding, dilation, "x")
    return im2col_raw(x, k, s, p, d, out, backend, version=version)


def col2im(
    cols: Any,
    output_size: Any,
    kernel_size: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    *,
    backend: str | None = "numpy",
    version: str | None = None,
) -> np.ndarray:
    """Fold columns [N, C*kh*kw, L] back into an image [N, C, H, W], summing overlaps (``F.fold`` layout)."""
    check_backend(backend)
    cols = as_array(cols, "cols", dtypes=_NUMERIC)
    if cols.ndim == 2:  # unbatched
        return col2im(
            cols[None], output_size, kernel_size, stride, padding, dilation, backend=backend, version=version
        )[0]
    if cols.ndim != 3:
        raise ValueError(f"cols: expected a 3-D [N, C*kh*kw, L] array, got shape {cols.shape}")
    H, W = pair(output_size, "output_size")
    if H < 1 or W < 1:
        raise ValueError(f"output_size: must be positive, got {(H, W)}")
    kk = pair(kernel_size, "kernel_size")
    if min(kk) < 1:
        raise ValueError(f"kernel_size: must be positive, got {kk}")
    N, CK, L = cols.shape
    if CK % (kk[0] * kk[1]) != 0:
        raise ValueError(
            f"cols: dim 1 ({CK}) of shape {cols.shape} is not divisible by kh*kw = {kk[0] * kk[1]} (kernel_size={kk})"
        )
    C = CK // (kk[0] * kk[1])
    k, s, p, d, out = window_params((N, C, H, W), kk, stride, padding, dilation, "output_size")
    if out[0] * out[1] != L:
        raise ValueError(
            f"cols: dim 2 ({L}) of shape {cols.shape} does not match the {out[0]}x{out[1]} = {out[0] * out[1]} "
            f"windows of output_size={(H, W)} with kernel_size={k}, stride={s}, padding={p}, dilation={d}"
        )
    return col2im_raw(cols, N, C, H, W, k, s, p, d, out, backend, version=version)
