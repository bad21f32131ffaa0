"""Matrix multiply with numpy's broadcasting/1-D rules, and the fused affine map used by ``nn.Linear``.

matmul  Z = A @ B           dA = G @ B^T          dB = A^T @ G      (summed over broadcast batch dims)
linear  Y = X @ W^T + b     dX = G @ W            dW = G^T X        db = sum over rows of G

BLAS orientation of the linear forward (issue 18). For a 2-D X [N, in] with N <= out, ``Y`` is computed as the
transpose of ``W @ X^T`` (one sgemm writing a C-contiguous [out, N] array, returned as its [N, out] view) rather than
``X @ W^T``: same products and sums, but OpenBLAS handles the [out, N] problem better, on one thread (-10% at
784->512 and 512->512 with N = 128, -30..50% at N = 8..32) and more so on two (its threading splits the long
dimension; measured -25% at N = 128). The output is then column-major (non-contiguous as torch would say); every
op here accepts any strides. With N > out (e.g. the 10-class head) the row-major form is faster and is kept.
"""

from __future__ import annotations

import numpy as np

from .. import backends
from . import gemm_route
from .blas_pair import matmul_rows_split, parallel_ok, run_pair
from .errors import ShapeError
from .function import Function, unbroadcast

BF16_MATMUL = "amp.bf16_matmul"  # registered by tinylearn.amp.bf16_ops (found through the topic table)
BF16_SUM_ROWS = "amp.bf16_sum_rows"  # the same module


def _bf16_2d(*arrays: np.ndarray) -> bool:
    return all(a.ndim == 2 and a.dtype.kind == "V" and a.dtype.name == "bfloat16" for a in arrays)  # .name: ~2 µs


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b; two 2-D bfloat16 operands (autocast) go to the registered bf16 GEMM: products accumulated in fp32 by the
    C++ packed kernel, one rounding (numpy's bfloat16 matmul is slower, e.g. on transposed views and at M = 1)."""
    if _bf16_2d(a, b):
        return backends.dispatch(BF16_MATMUL, a, b)
    return a @ b


def _shaped(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` itself when it already has ``shape`` (a reshape view would not own its data, and the element-wise ops
    downstream reuse only buffers they own), else the reshaped view."""
    return a if a.shape == shape else a.reshape(shape)


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"matmul: both operands need >= 1 dim, got shapes {a.shape} and {b.shape}")
        ka = a.shape[-1]
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if ka != kb:
            raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} are not aligned (inner dims {ka} != {kb})")
        try:
            out = _mm(a, b)
        except ValueError:
            raise ShapeError(f"matmul: batch dims of shapes {a.shape} and {b.shape} cannot be broadcast") from None
        ctx.save_for_backward(a, b)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        if a.ndim == 2 and b.ndim == 2:
            return (_mm(g, b.T) if na else None, _mm(a.T, g) if nb else None)
        if a.ndim == 1 and b.ndim == 1:  # dot product: g is a scalar
            return (g * b if na else None, g * a if nb else None)
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g2 = g
        if a.ndim == 1:
            g2 = np.expand_dims(g2, -2)
        if b.ndim == 1:
            g2 = np.expand_dims(g2, -1)
        ga = gb = None
        if na:
            ga = unbroadcast(g2 @ np.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
        if nb:
            gb = unbroadcast(np.swapaxes(a2, -1, -2) @ g2, b2.shape).reshape(b.shape)
        return ga, gb


def linear_arrays(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """``Linear.forward``'s arithmetic on checked arrays, without the checks and the ctx (the decode fast path of
    tinylearn/inference/decode_fast.py calls it per layer): the bf16 GEMM under autocast, the C++ GEMM where
    gemm_route picks it, the transposed orientation for short 2-D inputs, else numpy's matmul; then the bias."""
    if _bf16_2d(w) and x.dtype == w.dtype:  # autocast bf16: the C++ GEMM reads the transposed view as is and
        # adds the bias to its fp32 sums before the one rounding (torch's addmm)
        bias = b if b is not None and b.dtype == w.dtype else None
        out = backends.dispatch(BF16_MATMUL, x.reshape(-1, x.shape[-1]), w.T, bias)
        out = out.reshape(x.shape[:-1] + (w.shape[0],))
        if b is not None and bias is None:
            out += b
        return out
    x2 = x.reshape(-1, x.shape[-1])
    if gemm_route.use_cpp(x2, w.T):  # the C++ AVX-512 GEMM (gemm_route.py): C-contiguous [N, out]
        out = _shaped(gemm_route.cpp_mm(x2, w.T), x.shape[:-1] + (w.shape[0],))
    elif x.ndim == 2 and x.shape[0] <= w.shape[0]:
        out = (w @ x.T).T  # [N, out] view of a C-contiguous [out, N] result; see the module docstring
    else:
        out = x @ w.T
    if b is not None:
        out += b
    return out


class Linear(Function):
    """y = x @ w.T + b with x of shape [..., in], w [out, in], b [out] or None."""

    @staticmethod
    def forward(ctx, x, w, b=None):
        if w.ndim != 2:
            raise ShapeError(f"linear: weight must be 2-D [out, in], got shape {w.shape}")
        if x.ndim == 0 or x.shape[-1] != w.shape[1]:
            raise ShapeError(
                f"linear: input shape {x.shape} does not match weight shape {w.shape} (expected [..., {w.shape[1]}])"
            )
        if b is not None and b.shape != (w.shape[0],):
            raise ShapeError(f"linear: bias shape {b.shape} does not match weight shape {w.shape}")
        ctx.save_for_backward(x, w)
        ctx.has_b = b is not None
        return linear_arrays(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        nx, nw = ctx.needs_input_grad[:2]
        nb = ctx.has_b and ctx.needs_input_grad[2]
        g2 = g.reshape(-1, g.shape[-1]) if g.ndim != 2 else g
        x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
        gx = gw = None
        n, o, i = x2.shape[0], w.shape[0], w.shape[1]
        # x column-major (the output of a transposed-orientation forward): dX takes the same layout, so the
        # elementwise backward that consumes it (ReLU's g * (out > 0)) does not mix layouts (2.5x slower)
        colmajor = x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous
        if _bf16_2d(g2, x2, w):  # autocast bf16: the C++ GEMM on every core for each product (run side by side on
            # one thread each, as the fp32 path does, it measured slower: OpenMP's idle workers spin beside them)
            gx = _mm(g2, w).reshape(x.shape) if nx else None
            gw = _mm(g2.T, x2) if nw else None
            # bias gradient: fp32 sums of the bf16 rows, rounded once (ml_dtypes' own bf16 sum is ~30x slower;
            # the registered kernel: C++ for a contiguous g, numpy's reduce with dtype=float32 otherwise)
            gb = backends.dispatch(BF16_SUM_ROWS, g2) if nb else None
            return gx, gw, gb
        cpp_x, cpp_w = nx and gemm_route.use_cpp(g2, w), nw and gemm_route.use_cpp(g2.T, x2)
        if cpp_x or cpp_w:  # the C++ GEMM on every core for the products it is faster on (gemm_route.py)
            gx = (_shaped(gemm_route.cpp_mm(g2, w), x.shape[:-1] + (i,)) if cpp_x else g @ w) if nx else None
            gw = (gemm_route.cpp_mm(g2.T, x2) if cpp_w else g2.T @ x2) if nw else None
        elif nx and nw and parallel_ok(2.0 * n * o * i):  # dX and dW side by side, one thread each
            # dX's array is allocated here, on the calling thread (allocation tracking such as
            # tinylearn.memory.measure_peak follows this thread); the helper thread only fills it
            dt = np.result_type(g, w)
            if colmajor:
                buf = np.empty((i, g.shape[0]), dt)
                gx = buf.T
                _, gw = run_pair(lambda: np.matmul(w.T, g.T, out=buf), lambda: g2.T @ x2)
            else:
                gx = np.empty(g.shape[:-1] + (i,), dt)
                _, gw = run_pair(lambda: np.matmul(g, w, out=gx), lambda: g2.T @ x2)
        elif nw and not nx and parallel_ok(n * o * i):  # dW alone: two row halves side by side
            gw = matmul_rows_split(g2.T, x2)
        else:
            gx = ((w.T @ g.T).T if colmajor else g @ w) if nx else None
            gw = (g2.T @ x2) if nw else None
        gb = g2.sum(axis=0) if nb else None
        return gx, gw, gb
