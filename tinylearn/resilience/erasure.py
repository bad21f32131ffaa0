"""Reed–Solomon erasure coding over GF(2^8): k data shards + r parity shards, any r lost shards rebuilt bit-exactly.

Arithmetic. Bytes are elements of GF(2^8) = GF(2)[x] / (x^8 + x^4 + x^3 + x^2 + 1) (polynomial 0x11d, generator
g = 2): addition is XOR, multiplication goes through log/exp tables (a*b = exp[log a + log b]); the tables are
tinylearn.dist.parity's (notebook 06's RAID-6 code), not duplicated. Every non-zero byte has an inverse, so linear
algebra works exactly as over the reals, with no rounding: Gauss–Jordan elimination inverts a matrix.

Code (systematic, MDS). The k data shards d_0..d_{k-1} (equal-length byte strings; shorter ones are zero-padded and
their lengths recorded) are stored as they are; parity shard i is p_i = sum_j P[i, j] * d_j, byte-wise. The r x k
matrix P is a Cauchy matrix C[i, j] = 1 / (x_i + y_j) with x_i = i, y_j = r + j (all distinct, so k + r <= 256),
with each column scaled by 1 / C[0, j] so that row 0 is all ones: p_0 is the XOR of the data, i.e. r = 1 IS plain
RAID-5 XOR parity. Every square sub-matrix of a Cauchy matrix is invertible (scaling rows or columns keeps that),
so the generator G = [I_k; P] has every k x k row subset invertible: the code is MDS (maximum distance separable),
any k of the k + r shards determine the data.

Decoding. Take the first k surviving shards, their rows S of G (a k x k matrix), invert S by Gauss–Jordan; lost
data shard a is row a of S^-1 applied to the k survivors, lost parity is re-encoded from the (now complete) data.
More than r losses: ValueError naming how many were lost and r.

Kernel. Both directions are one product "out[i] = XOR_j c[i, j] * src_j" over byte regions (op
``resilience.gf256_matmul``): numpy reference (a 256 x 256 product table gathered per coefficient) and C++
(cpp_src/resilience_gf256.cpp: split-nibble shuffle: c*x = c*(x & 15) ^ c*(x & 0xf0), two 16-entry tables per
coefficient looked up 32 / 64 bytes at a time by vpshufb, AVX2 / AVX-512BW, plus a scalar path).

    parity = encode([b"abc", b"defg", b"hi"], r=2)      # 2 parity shards of 4 bytes
    shards = [None, b"defg", b"hi", None, parity[1]]     # any 2 of 5 lost
    data = decode(shards, k=3, r=2, lengths=[3, 4, 2])   # [b"abc", b"defg", b"hi"] as uint8 arrays
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import backends
from .._inputs import is_int
from ..dist.parity import _GF_EXP, _GF_LOG

__all__ = [
    "OP",
    "cauchy_parity_matrix",
    "decode",
    "encode",
    "gf256_matmul",
    "gf256_path",
    "gf_inv",
    "gf_mat_inv",
    "gf_mat_mul",
    "gf_mul",
    "rebuild",
]

OP = "resilience.gf256_matmul"


@functools.cache
def _mul_table() -> np.ndarray:
    """The 256 x 256 product table T[a, b] = a * b in GF(2^8) (64 KiB), from the log/exp tables."""
    a = np.arange(256)
    t = _GF_EXP[(_GF_LOG[a][:, None] + _GF_LOG[a][None, :])].astype(np.uint8)
    t[0, :] = 0
    t[:, 0] = 0
    return t


def gf_mul(a: int | np.ndarray, b: int | np.ndarray) -> Any:
    """Product in GF(2^8) of bytes (ints 0..255 or uint8 arrays, broadcast)."""
    return _mul_table()[np.asarray(a, np.uint8), np.asarray(b, np.uint8)]


def gf_inv(a: int) -> int:
    """Multiplicative inverse of a non-zero byte: g^(255 - log a)."""
    if not is_int(a) or not 1 <= int(a) <= 255:
        raise ValueError(f"a: expected an int in 1..255 (0 has no inverse), got {a!r}")
    return int(_GF_EXP[255 - _GF_LOG[int(a)]])


def gf_mat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Matrix product over GF(2^8) of small uint8 matrices (sum = XOR)."""
    a, b = np.asarray(a, np.uint8), np.asarray(b, np.uint8)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a, b: shapes {a.shape} and {b.shape} do not multiply")
    prods = _mul_table()[a[:, :, None], b[None, :, :]]  # [n, k, m]
    return np.bitwise_xor.reduce(prods, axis=1) if a.shape[1] else np.zeros((a.shape[0], b.shape[1]), np.uint8)


def gf_mat_inv(m: np.ndarray) -> np.ndarray:
    """Inverse of a square uint8 matrix over GF(2^8) by Gauss–Jordan elimination on [M | I]. ValueError if
    singular."""
    a = np.array(m, dtype=np.uint8)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"m: expected a square matrix, got shape {a.shape}")
    n = a.shape[0]
    aug = np.concatenate([a, np.eye(n, dtype=np.uint8)], axis=1)
    t = _mul_table()
    for col in range(n):
        nz = np.flatnonzero(aug[col:, col])
        if nz.size == 0:
            raise ValueError(f"m: singular over GF(2^8) (no pivot in column {col})")
        p = col + int(nz[0])
        if p != col:
            aug[[col, p]] = aug[[p, col]]
        aug[col] = t[gf_inv(int(aug[col, col])), aug[col]]  # pivot row scaled to a leading 1
        f = aug[:, col].copy()
        f[col] = 0
        aug ^= t[f[:, None], aug[col][None, :]]  # eliminate the column everywhere else (subtract = XOR)
    return aug[:, n:].copy()


@functools.cache
def _cauchy(k: int, r: int) -> np.ndarray:
    x = np.arange(r)[:, None]
    y = r + np.arange(k)[None, :]
    c = np.array([[gf_inv(int(v)) for v in row] for row in (x ^ y)], dtype=np.uint8)  # 1 / (x_i + y_j)
    scale = np.array([gf_inv(int(v)) for v in c[0]], dtype=np.uint8)  # column j times 1 / C[0, j]
    p = gf_mul(c, scale[None, :])
    p.flags.writeable = False
    return p


def cauchy_parity_matrix(k: int, r: int) -> np.ndarray:
    """The r x k parity matrix P (read-only uint8): Cauchy 1/(x_i + y_j), x_i = i, y_j = r + j, columns scaled so
    that row 0 is all ones (parity 0 = XOR of the data)."""
    k, r = _check_kr(k, r)
    return _cauchy(k, r)


def _check_kr(k: Any, r: Any) -> tuple[int, int]:
    if not is_int(k) or int(k) < 1:
        raise ValueError(f"k: expected an int >= 1 data shards, got {k!r}")
    if not is_int(r) or int(r) < 0:
        raise ValueError(f"r: expected an int >= 0 parity shards, got {r!r}")
    if int(k) + int(r) > 256:
        raise ValueError(f"k, r: k + r must be <= 256 (distinct GF(2^8) points), got k={k}, r={r}")
    return int(k), int(r)


def _as_bytes(x: Any, name: str) -> np.ndarray:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return np.frombuffer(x, dtype=np.uint8)
    a = np.asarray(x)
    if a.dtype != np.uint8:
        raise ValueError(f"{name}: expected bytes or a uint8 array, got dtype {a.dtype}")
    return a.reshape(-1)


# ------------------------------------------------------------------------------------------ the region kernel (op)
@backends.register(OP, "numpy")
def _gf256_matmul_numpy(coeffs: np.ndarray, sources: Sequence[np.ndarray]) -> np.ndarray:
    c, srcs = _check_mm(coeffs, sources)
    length = srcs[0].size if srcs else 0
    out = np.zeros((c.shape[0], length), np.uint8)
    t = _mul_table()
    for i in range(c.shape[0]):
        for j, s in enumerate(srcs):
            cij = int(c[i, j])
            if cij == 1:
                out[i] ^= s
            elif cij:
                out[i] ^= t[cij][s]
    return out


def _check_mm(coeffs: Any, sources: Sequence[Any]) -> tuple[np.ndarray, list[np.ndarray]]:
    c = np.asarray(coeffs)
    if c.dtype != np.uint8 or c.ndim != 2:
        raise ValueError(f"coeffs: expected a 2-D uint8 matrix, got dtype {c.dtype} shape {c.shape}")
    srcs = [_as_bytes(s, f"sources[{j}]") for j, s in enumerate(sources)]
    if len(srcs) != c.shape[1]:
        raise ValueError(f"sources: coeffs has {c.shape[1]} columns but {len(srcs)} sources were given")
    if srcs and any(s.size != srcs[0].size for s in srcs):
        raise ValueError(f"sources: expected equal lengths, got {[s.size for s in srcs]}")
    return c, srcs


def _cpp(version: str) -> Any:
    def run(coeffs: np.ndarray, sources: Sequence[np.ndarray]) -> np.ndarray:
        c, srcs = _check_mm(coeffs, sources)
        if not srcs:
            return np.zeros((c.shape[0], 0), np.uint8)
        return backends.load_C("resilience").gf256_matmul(c, srcs, version)

    run.__name__ = f"_gf256_matmul_cpp_{version}"
    return run


def _example(rng: Any) -> tuple[tuple, dict]:
    c = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    return (c, [rng.integers(0, 256, 201, dtype=np.uint8) for _ in range(5)]), {}


def _c_ok() -> bool:
    return backends.C_available("resilience")


backends.register(OP, "cpp", _cpp("simd"), version="simd", default=True, available=_c_ok, example=_example)
backends.register(OP, "cpp", _cpp("scalar"), version="scalar", available=_c_ok)


def gf256_matmul(
    coeffs: np.ndarray, sources: Sequence[Any], backend: str | None = None, version: str | None = None
) -> np.ndarray:
    """out[i] = XOR_j coeffs[i, j] * sources[j] in GF(2^8): coeffs uint8 [m, k], k equal-length byte regions
    (bytes or uint8 arrays, any view); uint8 [m, L]. backend numpy (reference) or cpp (versions simd, scalar)."""
    return backends.dispatch(OP, coeffs, sources, backend=backend, version=version)


def gf256_path(version: str = "simd") -> str:
    """The C++ code path (avx512 / avx2 / scalar) a cpp ``version`` runs on this CPU (TINYLEARN_CPU_FEATURES)."""
    return str(backends.load_C("resilience").gf256_path(version))


# ------------------------------------------------------------------------------------------ encode / decode
def _pad(shards: Sequence[np.ndarray], length: int) -> list[np.ndarray]:
    out = []
    for s in shards:
        if s.size == length:
            out.append(s)
        else:
            p = np.zeros(length, np.uint8)
            p[: s.size] = s
            out.append(p)
    return out


def encode(data: Sequence[Any], r: int, backend: str | None = None) -> list[np.ndarray]:
    """The ``r`` parity shards (uint8 arrays) of the data shards ``data`` (k bytes / uint8 arrays; shorter ones
    are zero-padded to the longest, whose length every parity shard has: record the lengths to trim on decode)."""
    if isinstance(data, (bytes, bytearray, np.ndarray)):
        raise ValueError(f"data: expected a list of k shards, got one {type(data).__name__}")
    k, r = _check_kr(len(data), r)
    shards = [_as_bytes(d, f"data[{j}]") for j, d in enumerate(data)]
    length = max(s.size for s in shards)
    if r == 0:
        return []
    out = gf256_matmul(cauchy_parity_matrix(k, r), _pad(shards, length), backend=backend)
    return list(out)


def _lost(shards: Sequence[Any], k: int, r: int) -> tuple[list[np.ndarray | None], list[int], int]:
    if len(shards) != k + r:
        raise ValueError(f"shards: expected k + r = {k + r} entries (None for a lost one), got {len(shards)}")
    arr = [None if s is None else _as_bytes(s, f"shards[{i}]") for i, s in enumerate(shards)]
    lost = [i for i, s in enumerate(arr) if s is None]
    if len(lost) > r:
        raise ValueError(f"shards: {len(lost)} shards lost {lost}, but r = {r} parity shards rebuild at most {r}")
    present = [s for s in arr if s is not None]
    par = [s.size for s in arr[k:] if s is not None]
    length = par[0] if par else max(s.size for s in present)
    if any(n != length for n in par) or any(s.size > length for s in present):
        raise ValueError(
            f"shards: parity shards must share one length >= every data shard's, got {[len(s) for s in present]}"
        )
    return arr, lost, length


def rebuild(
    shards: Sequence[Any], k: int, r: int, lengths: Sequence[int] | None = None, backend: str | None = None
) -> list[np.ndarray]:
    """All k + r shards (uint8 arrays), the lost ones (None) rebuilt bit-exactly from any k survivors; data shards
    trimmed to ``lengths`` when given (else padded to the parity length). ValueError if more than r are lost."""
    return _rebuild(shards, k, r, lengths, backend, parity=True)


def _rebuild(
    shards: Sequence[Any], k: int, r: int, lengths: Sequence[int] | None, backend: str | None, parity: bool
) -> list[np.ndarray]:
    k, r = _check_kr(k, r)
    arr, lost, length = _lost(shards, k, r)
    full = [None if s is None else (s if i >= k else _pad([s], length)[0]) for i, s in enumerate(arr)]
    lost_data = [i for i in lost if i < k]
    if lost_data:
        rows = [i for i in range(k + r) if full[i] is not None][:k]
        p = cauchy_parity_matrix(k, r)
        gen = np.concatenate([np.eye(k, dtype=np.uint8), p]) if r else np.eye(k, dtype=np.uint8)
        inv = gf_mat_inv(gen[rows])
        got = gf256_matmul(np.ascontiguousarray(inv[lost_data]), [full[i] for i in rows], backend=backend)
        for a, d in zip(lost_data, got, strict=True):
            full[a] = d
    lost_par = [i - k for i in lost if i >= k]
    if lost_par and parity:
        p = np.ascontiguousarray(cauchy_parity_matrix(k, r)[lost_par])
        for i, q in zip(lost_par, gf256_matmul(p, full[:k], backend=backend), strict=True):
            full[k + i] = q
    if lengths is not None:
        if len(lengths) != k or any(not is_int(n) or not 0 <= int(n) <= length for n in lengths):
            raise ValueError(f"lengths: expected {k} ints in 0..{length}, got {list(lengths)!r}")
        full[:k] = [d[: int(n)] for d, n in zip(full[:k], lengths, strict=True)]
    return full  # type: ignore[return-value]


def decode(
    shards: Sequence[Any], k: int, r: int, lengths: Sequence[int] | None = None, backend: str | None = None
) -> list[np.ndarray]:
    """The k data shards (uint8 arrays), bit-exact, from k + r shards with up to r of them None (lost); trimmed
    to ``lengths`` when given. ValueError naming the number lost when more than r are lost."""
    return _rebuild(shards, k, r, lengths, backend, parity=False)[: _check_kr(k, r)[0]]
