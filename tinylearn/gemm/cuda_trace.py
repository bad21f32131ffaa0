"""Replay the index arithmetic of the CUDA ladder (cuda_src/gemm_*.cu) on the CPU: which shared-memory words and
global bytes every thread of every warp touches, and a numpy emulation of each kernel built from the same index
functions (so a wrong index formula fails the emulation against numpy, and the trace is of the indices that
compute the right answer).

Every access is listed with the exact source line it mirrors (``Access.source``; tests check that each line occurs
verbatim in the current .cu file). ``fixed=False`` replays the layout the kernels had before the bank-conflict fix:

  regtile  As[BK][BM] (no padding), thread (ty, tx) reads B columns tx*TN + j (contiguous 4 per thread)
  vec4     As[k][m] without the XOR swizzle
and ``fixed=True`` (the current sources):
  regtile  As[BK][BM + 2] (2 padding words per row: the transposed store hits 32 banks), B columns tx + j*16
           (16 consecutive threads read 16 consecutive words; the C store becomes 64-byte runs too)
  vec4     As[k][m ^ SWZ(k)] with SWZ(k) = ((k >> 2) & 3) << 3: the four k rows one store instruction writes land
           in four different groups of 8 banks; float4 reads stay 16-byte aligned (padding by 2 would break them)

Bank-conflict degrees come from ``gpu_model.wavefronts`` (32-bit accesses: one phase of 32 threads; 128-bit:
4 phases of 8 threads), global traffic from ``gpu_model.transactions``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._resources import cuda_source
from . import gpu_model

BM = BN = 64
BK = 16
TM = TN = 4
KERNELS = ("naive", "smem", "regtile", "vec4")


@dataclass(frozen=True)
class Access:
    name: str  # short label, e.g. "As store"
    space: str  # "shared" | "global"
    source: str  # the line of cuda_src/gemm_<kernel>.cu this mirrors
    width: int  # 4-byte words per thread (1 or 4 for float4)
    index: Callable[..., np.ndarray]  # (tid, it) -> word index (shared) or element index (global), per thread


def _a_stride(fixed: bool) -> int:
    return BM + 2 if fixed else BM


def _swz(k: np.ndarray | int, fixed: bool) -> np.ndarray | int:
    return ((np.asarray(k) >> 2) & 3) << 3 if fixed else 0


def accesses(kernel: str, fixed: bool = True, m: int = 1024, n: int = 1024, k: int = 1024) -> list[Access]:
    """Every shared / global access of one ladder kernel as index functions of (tid array, iteration).

    ``it`` is the loop index of the access: the k of an inner loop, the j / i of an unrolled store, or the load
    iteration. Block (0, 0) and the first K tile; the patterns repeat for every block and tile."""
    if kernel == "naive":  # block (16, 16): tid = ty * 16 + tx
        return [
            Access("A load", "global", "A[(size_t)row * K + k]", 1, lambda t, it: (t // 16) * k + it),
            Access("B load", "global", "B[(size_t)k * N + col]", 1, lambda t, it: it * n + t % 16),
            Access("C store", "global", "C[(size_t)row * N + col] = acc", 1, lambda t, it: (t // 16) * n + t % 16),
        ]
    if kernel == "smem":  # block (32, 32): tid = ty * 32 + tx
        return [
            Access("A load", "global", "A[(size_t)row * K + t + tx]", 1, lambda t, it: (t // 32) * k + t % 32),
            Access("B load", "global", "B[(size_t)(t + ty) * N + col]", 1, lambda t, it: (t // 32) * n + t % 32),
            Access("As store", "shared", "As[ty][tx] =", 1, lambda t, it: (t // 32) * 32 + t % 32),
            Access("Bs store", "shared", "Bs[ty][tx] =", 1, lambda t, it: 1024 + (t // 32) * 32 + t % 32),
            Access("As read", "shared", "As[ty][k]", 1, lambda t, it: (t // 32) * 32 + it),
            Access("Bs read", "shared", "Bs[k][tx]", 1, lambda t, it: 1024 + it * 32 + t % 32),
        ]
    if kernel == "regtile":  # 256 threads, tx = tid % 16, ty = tid / 16; load loops e = tid + 256 * it
        sa = _a_stride(fixed)
        bs0 = BK * sa  # Bs follows As in shared memory

        def bcol(t: np.ndarray, j: int) -> np.ndarray:
            return (t % 16) + j * (BN // TN) if fixed else (t % 16) * TN + j

        return [
            Access("A load", "global", "A[(size_t)r * K + c]", 1, lambda t, it: ((t + 256 * it) // BK) * k + (t % BK)),
            Access("B load", "global", "B[(size_t)r * N + c]", 1, lambda t, it: ((t + 256 * it) // BN) * n + (t % BN)),
            Access("As store", "shared", "As[k][m] =", 1, lambda t, it: (t % BK) * sa + (t + 256 * it) // BK),
            Access("Bs store", "shared", "Bs[k][n] =", 1, lambda t, it: bs0 + ((t + 256 * it) // BN) * BN + t % BN),
            Access("As read", "shared", "a[i] = As[k][ty * TM + i]", 1, lambda t, it: it * sa + (t // 16) * TM),
            Access(
                "Bs read",
                "shared",
                "b[j] = Bs[k][tx + j * (BN / TN)]" if fixed else "b[j] = Bs[k][tx * TN + j]",
                1,
                lambda t, it: bs0 + (it // TN) * BN + bcol(t, it % TN),
            ),
            Access(
                "C store",
                "global",
                "const int c = col0 + tx + j * (BN / TN)" if fixed else "const int c = col0 + tx * TN + j",
                1,
                lambda t, it: ((t // 16) * TM + it // TN) * n + bcol(t, it % TN),
            ),
        ]
    if kernel == "vec4":  # am = tid / 4, ak = (tid % 4) * 4; bk = tid / 16, bn = (tid % 16) * 4
        bs0 = BK * BM

        def a_word(t: np.ndarray, j: int) -> np.ndarray:
            kk = (t % 4) * 4 + j
            return kk * BM + ((t // 4) ^ _swz(kk, fixed))

        return [
            Access(
                "A load", "global", "A + (size_t)(row0 + am) * K + t + ak", 4, lambda t, it: (t // 4) * k + (t % 4) * 4
            ),
            Access(
                "B load",
                "global",
                "B + (size_t)(t + bk) * N + col0 + bn",
                4,
                lambda t, it: (t // 16) * n + (t % 16) * 4,
            ),
            Access(
                "As store",
                "shared",
                "As[ak + 0][am ^ SWZ(ak + 0)] = va.x" if fixed else "As[ak + 0][am] = va.x",
                1,
                lambda t, it: a_word(t, it % 4),
            ),
            Access("Bs store", "shared", "&Bs[bk][bn]", 4, lambda t, it: bs0 + (t // 16) * BN + (t % 16) * 4),
            Access(
                "As read",
                "shared",
                "&As[k][(ty * TM) ^ SWZ(k)]" if fixed else "&As[k][ty * TM]",
                4,
                lambda t, it: it * BM + (((t // 16) * TM) ^ _swz(it, fixed)),
            ),
            Access("Bs read", "shared", "&Bs[k][tx * TN]", 4, lambda t, it: bs0 + it * BN + (t % 16) * TN),
            Access(
                "C store", "global", "C + (size_t)r * N + c", 4, lambda t, it: ((t // 16) * TM + it) * n + (t % 16) * 4
            ),
        ]
    raise ValueError(f"kernel: unknown CUDA gemm kernel {kernel!r}; known: {', '.join(KERNELS)}")


_ITERS = {"naive": 4, "smem": 32, "regtile": BK * TN, "vec4": BK}  # iterations replayed per access


def _threads(kernel: str) -> int:
    return 1024 if kernel == "smem" else 256


def trace(kernel: str, fixed: bool = True) -> dict[str, dict]:
    """Per access: worst bank-conflict degree (shared) or sectors per warp request (global) over every warp and
    every replayed iteration, with the source line. Global matrices are 1024 x 1024 fp32."""
    out: dict[str, dict] = {}
    tid = np.arange(_threads(kernel))
    for acc in accesses(kernel, fixed):
        worst_deg, sectors, eff = 1, 0, 1.0
        seen: set[bytes] = set()
        for it in range(_ITERS[kernel]):
            idx = np.asarray(acc.index(tid, it), dtype=np.int64)
            # a shift by a multiple of 32 words (128 bytes) changes neither banks nor sector/segment boundaries
            key = (idx - (idx.min() // 32) * 32).tobytes()
            if key in seen:
                continue
            seen.add(key)
            for w in range(0, tid.size, gpu_model.WARP):
                words = idx[w : w + gpu_model.WARP]
                if acc.space == "shared":
                    wf = gpu_model.wavefronts(words, width=acc.width)
                    worst_deg = max(worst_deg, wf["degree"])
                else:
                    tr = gpu_model.transactions(words * 4, itemsize=4 * acc.width)
                    sectors = max(sectors, tr["sectors"])
                    eff = min(eff, tr["efficiency"])
        row = {"source": acc.source, "space": acc.space, "width": acc.width}
        row.update({"degree": worst_deg} if acc.space == "shared" else {"sectors": sectors, "efficiency": eff})
        out[acc.name] = row
    return out


def source_lines_present(kernel: str, src_dir: str | Path | None = None) -> dict[str, bool]:
    """Whether each access's mirrored source line occurs verbatim in cuda_src/gemm_<kernel>.cu (fixed layout).

    ``src_dir``: the folder of the .cu files (default: the CUDA sources tinylearn ships, ``_resources.cuda_source``)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    path = Path(src_dir) / f"gemm_{kernel}.cu" if src_dir is not None else cuda_source(f"gemm_{kernel}")
    text = path.read_text()
    return {a.name: a.source in text for a in accesses(kernel, fixed=True)}


def emulate(kernel: str, a: np.ndarray, b: np.ndarray, fixed: bool = True) -> np.ndarray:
    """C = a @ b computed by replaying the shared-memory kernel's index functions (regtile / vec4; any M, N, K for
    regtile, K % 4 == N % 4 == 0 for vec4), block by block and K tile by K tile, in float32."""
    if kernel not in ("regtile", "vec4"):
        raise ValueError(f"kernel: emulate supports 'regtile' and 'vec4', got {kernel!r}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    m, k = a.shape
    n = b.shape[1]
    if kernel == "vec4" and (k % 4 or n % 4):
        raise ValueError(f"vec4 needs K % 4 == N % 4 == 0, got K={k}, N={n}")
    acc_list = {x.name: x for x in accesses(kernel, fixed, m, n, k)}
    c = np.zeros((m, n), dtype=np.float32)
    tid = np.arange(256)
    tx, ty = tid % 16, tid // 16
    sa = _a_stride(fixed) if kernel == "regtile" else BM
    for row0 in range(0, m, BM):
        for col0 in range(0, n, BN):
            acc = np.zeros((256, TM, TN), dtype=np.float32)
            for t in range(0, k, BK):
                smem = np.zeros(BK * sa + BK * BN, dtype=np.float32)
                ap = np.zeros((BM, BK), dtype=np.float32)  # the A tile (zero outside the matrix)
                bp = np.zeros((BK, BN), dtype=np.float32)
                blk = a[row0 : row0 + BM, t : t + BK]
                ap[: blk.shape[0], : blk.shape[1]] = blk
                blk = b[t : t + BK, col0 : col0 + BN]
                bp[: blk.shape[0], : blk.shape[1]] = blk
                if kernel == "regtile":
                    for it in range(BM * BK // 256):
                        e = tid + 256 * it
                        smem[acc_list["As store"].index(tid, it)] = ap[e // BK, e % BK]
                        smem[acc_list["Bs store"].index(tid, it)] = bp[e // BN, e % BN]
                else:
                    for j in range(4):
                        smem[acc_list["As store"].index(tid, j)] = ap[tid // 4, (tid % 4) * 4 + j]
                    base = acc_list["Bs store"].index(tid, 0)
                    for q in range(4):
                        smem[base + q] = bp[tid // 16, (tid % 16) * 4 + q]
                for kk in range(BK):
                    if kernel == "regtile":
                        av = np.stack([smem[acc_list["As read"].index(tid, kk) + i] for i in range(TM)], 1)
                        bv = np.stack([smem[acc_list["Bs read"].index(tid, kk * TN + j)] for j in range(TN)], 1)
                    else:
                        av = np.stack([smem[acc_list["As read"].index(tid, kk) + i] for i in range(TM)], 1)
                        bv = np.stack([smem[acc_list["Bs read"].index(tid, kk) + j] for j in range(TN)], 1)
                    acc += av[:, :, None] * bv[:, None, :]
            for i in range(TM):
                r = row0 + ty * TM + i
                for j in range(TN):
                    if kernel == "regtile":
                        col = col0 + ((tx + j * (BN // TN)) if fixed else (tx * TN + j))
                    else:
                        col = col0 + tx * TN + j
                    ok = (r < m) & (col < n)
                    c[r[ok], col[ok]] = acc[ok, i, j]
    return c
