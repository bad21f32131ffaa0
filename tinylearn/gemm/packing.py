"""numpy reference versions of the two ideas in the C++ ladder: cache blocking and panel packing.

``pack_a(a, mr)`` -> (ceil(M/mr), K, mr): micro-panel p holds rows p*mr .. p*mr+mr-1 of A column by column
(zero-padded), the order the micro-kernel reads them. ``pack_b(b, nr)`` -> (ceil(N/nr), K, nr) likewise for column
panels of B. ``blocked_matmul(a, b, mc, kc, nc)`` is the BLIS loop nest (jc, pc, ic) with each block product done by
numpy: the same arithmetic in a different order. ``packed_matmul`` runs the micro-kernel loops on packed panels.
Matching C++: tinylearn._C.gemm.pack_a / pack_b (tests/gemm/test_gemm.py checks they agree).
"""

from __future__ import annotations

import numpy as np

from .._inputs import as_int


def _check2d(name: str, x: object) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: must be a numpy array, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name}: must be 2-D, got shape {x.shape}")
    return x


MAX_PANEL = 1 << 16  # a micro-panel width (mr, nr) past this is no register tile: it only pads (and exhausts memory)


def _check_tile(name: str, v: object, max_: int | None = None) -> int:
    return as_int(v, name, min=1, max=max_)


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
    """A (M, K) -> (ceil(M/mr), K, mr) row micro-panels, zero-padded past M."""
    a = _check2d("a", a)
    mr = _check_tile("mr", mr, MAX_PANEL)
    m, k = a.shape
    p = -(-m // mr)
    padded = np.zeros((p * mr, k), dtype=a.dtype)
    padded[:m] = a
    return np.ascontiguousarray(padded.reshape(p, mr, k).transpose(0, 2, 1))


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """B (K, N) -> (ceil(N/nr), K, nr) column micro-panels, zero-padded past N."""
    b = _check2d("b", b)
    nr = _check_tile("nr", nr, MAX_PANEL)
    k, n = b.shape
    p = -(-n // nr)
    padded = np.zeros((k, p * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, p, nr).transpose(1, 0, 2))


def _check_pair(a: object, b: object) -> tuple[np.ndarray, np.ndarray]:
    a = _check2d("a", a)
    b = _check2d("b", b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b: inner dimensions differ: a is {a.shape}, b is {b.shape}")
    return a, b


def blocked_matmul(a: np.ndarray, b: np.ndarray, mc: int = 64, kc: int = 256, nc: int = 512) -> np.ndarray:
    """C = A @ B by (nc x kc) blocks of B and (mc x kc) blocks of A, accumulated over the K blocks."""
    a, b = _check_pair(a, b)
    mc, kc, nc = _check_tile("mc", mc), _check_tile("kc", kc), _check_tile("nc", nc)
    m, k = a.shape
    n = b.shape[1]
    c = np.zeros((m, n), dtype=np.result_type(a, b))
    for jc in range(0, n, nc):
        for pc in range(0, k, kc):
            bblk = b[pc : pc + kc, jc : jc + nc]
            for ic in range(0, m, mc):
                c[ic : ic + mc, jc : jc + nc] += a[ic : ic + mc, pc : pc + kc] @ bblk
    return c


def packed_matmul(a: np.ndarray, b: np.ndarray, mr: int = 6, nr: int = 16) -> np.ndarray:
    """C = A @ B from packed panels: tile (i, j) = sum_k outer(ap[i, k], bp[j, k]) (rank-1 updates, as the kernel)."""
    a, b = _check_pair(a, b)
    m, n = a.shape[0], b.shape[1]
    ap, bp = pack_a(a, mr), pack_b(b, nr)
    tiles = np.einsum("ikr,jks->ijrs", ap, bp)  # (panels_a, panels_b, mr, nr)
    c = tiles.transpose(0, 2, 1, 3).reshape(ap.shape[0] * mr, bp.shape[0] * nr)
    return np.ascontiguousarray(c[:m, :n])
