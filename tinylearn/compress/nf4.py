"""NF4 (4-bit NormalFloat, QLoRA: Dettmers et al. 2023): the codebook derived, block-wise quantization with double
quantization of the scales, and the dequantize-on-the-fly matmul (op ``compress.nf4_matmul``).

Codebook (``nf4_codebook``), derived, not copied. Pretrained weights are close to N(0, sigma); after absmax scaling
to [-1, 1] an information-theoretically optimal 4-bit type puts equal probability mass in each bin, i.e. its levels
are quantiles of N(0, 1). To keep an exact zero (padding, zero weights) the construction is asymmetric:

    delta  = 1/2 * ((1 - 1/(2*15)) + (1 - 1/(2*16)))  = 0.9677083...   (the outermost quantile used)
    pos_i  = Phi^-1(p_i),  p = linspace(delta, 1/2, 9)[:-1]    (8 positive levels)
    neg_j  = -Phi^-1(p_j), p = linspace(delta, 1/2, 8)[:-1]    (7 negative levels)
    levels = sort(pos + [0] + neg) / max(pos)                 (16 levels in [-1, 1], level 7 = 0 exactly)

(Phi^-1 = scipy.stats.norm.ppf.) The test compares these with bitsandbytes' published table (within 1e-4).

Quantization (``nf4_quantize``): the tensor is flattened (row major) into blocks of ``block_size`` elements;
each block is divided by its absmax c (fp32) and each value replaced by the index of the nearest level (4 bits);
two codes per byte, the element with the even flat index in the high nibble. Double quantization: the fp32
absmax scales (one per block) have their mean m subtracted and are quantized to int8 symmetric absmax in blocks
of 256 scales, each with an fp32 step: c ~= q * step + m. (bitsandbytes quantizes them with its dynamic 8-bit
float map; a linear int8 code is used here: the error it adds is measured in the tests.)
Storage per parameter: 4 + 32/64 = 4.5 bits without, 4 + 8/64 + 32/(64*256) = 4.127 bits with double quant.

Matmul (``nf4_matmul(x, q)``: y = x @ dequant(W).T for W [N, K]): backends numpy (the reference: dequantize, then
matmul) and cpp (cpp_src/compress_nf4.cpp: versions "simd", the best of AVX-512 / AVX2 this CPU runs with the
codebook looked up by permute instructions, and "scalar"); the C++ path resolves double-quantized scales once per
call and decodes each weight row into a small fp32 buffer just before its dot products (the fp32 W never exists).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backends

OP = "compress.nf4_matmul"
NF4_OFFSET = 0.5 * ((1 - 1 / (2 * 15)) + (1 - 1 / (2 * 16)))  # 0.9677083...
DQ_BLOCK = 256  # scales per second-level block (double quantization)


@functools.cache
def _codebook64() -> np.ndarray:
    from scipy.stats import norm

    pos = norm.ppf(np.linspace(NF4_OFFSET, 0.5, 9)[:-1])
    neg = -norm.ppf(np.linspace(NF4_OFFSET, 0.5, 8)[:-1])
    v = np.sort(np.concatenate([pos, [0.0], neg]))
    return v / v.max()


def nf4_codebook(dtype: Any = np.float32) -> np.ndarray:
    """The 16 NF4 levels in [-1, 1], ascending, level 7 exactly 0 (derivation in the module docstring)."""
    return _codebook64().astype(dtype)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Pack a flat array of 4-bit codes (0..15) two per byte, the even index in the high nibble (odd count: the
    last low nibble is 0)."""
    c = np.asarray(codes, np.uint8).ravel()
    if c.size and int(c.max()) > 15:
        raise ValueError(f"codes: 4-bit codes must be in 0..15, got max {int(c.max())}")
    if c.size % 2:
        c = np.append(c, np.uint8(0))
    return ((c[0::2] << 4) | c[1::2]).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of ``pack_nibbles``: the first ``n`` 4-bit codes (uint8)."""
    p = np.asarray(packed, np.uint8).ravel()
    if not 0 <= n <= 2 * p.size:
        raise ValueError(f"n: must be in 0..{2 * p.size} for {p.size} packed bytes, got {n}")
    out = np.empty(2 * p.size, np.uint8)
    out[0::2] = p >> 4
    out[1::2] = p & 15
    return out[:n]


@dataclass
class NF4Tensor:
    """An NF4-quantized tensor: packed codes + per-block scales (fp32, or int8 + fp32 steps + mean)."""

    codes: np.ndarray  # uint8 [ceil(numel / 2)]
    shape: tuple[int, ...]
    block_size: int
    absmax: np.ndarray  # float32 [nblocks] (no double quant) or int8 [nblocks] (double quant)
    dq_step: np.ndarray | None = None  # float32 [ceil(nblocks / DQ_BLOCK)]
    dq_mean: float = 0.0
    dq_block: int = DQ_BLOCK

    @property
    def double_quant(self) -> bool:
        return self.dq_step is not None

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes actually held: codes + scales (+ second-level steps and the fp32 mean)."""
        n = self.codes.nbytes + self.absmax.nbytes
        if self.dq_step is not None:
            n += self.dq_step.nbytes + 4
        return n

    @property
    def bits_per_param(self) -> float:
        return 8.0 * self.nbytes / max(self.numel, 1)

    def scales(self) -> np.ndarray:
        """The fp32 absmax per block (resolved from the double-quantized form)."""
        if self.dq_step is None:
            return self.absmax
        idx = np.arange(self.absmax.size) // self.dq_block
        return self.absmax.astype(np.float32) * self.dq_step[idx] + np.float32(self.dq_mean)

    def dequantize(self) -> np.ndarray:
        return nf4_dequantize(self)


def _check_block(block_size: Any, numel: int, arg: str = "block_size") -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"{arg}: must be an int, got {type(block_size).__name__} {block_size!r}")
    bs = int(block_size)
    if bs < 2:
        raise ValueError(f"{arg}: must be >= 2, got {bs}")
    if numel % bs:
        raise ValueError(f"{arg}: {bs} does not divide the number of elements {numel}")
    return bs


def nf4_quantize(w: Any, block_size: int = 64, double_quant: bool = True) -> NF4Tensor:
    """Quantize a floating array (or tl.Tensor) to NF4: block-wise absmax, nearest level, packed codes; with
    ``double_quant`` the fp32 scales are themselves quantized (int8, blocks of 256, mean subtracted)."""
    data = getattr(w, "data", w) if not isinstance(w, np.ndarray) else w
    a = np.asarray(data)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"w: NF4 quantizes floating tensors, got dtype {a.dtype}")
    if a.size == 0:
        raise ValueError(f"w: cannot quantize an empty tensor (shape {a.shape})")
    if not np.isfinite(a).all():
        raise ValueError("w: contains NaN or Inf")
    bs = _check_block(block_size, a.size)
    blocks = np.ascontiguousarray(a, np.float32).reshape(-1, bs)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    safe = np.where(absmax > 0, absmax, np.float32(1.0))
    normed = blocks / safe[:, None]
    cb = nf4_codebook()
    mids = (cb[1:] + cb[:-1]) / 2
    codes = np.searchsorted(mids, normed.ravel()).astype(np.uint8)  # nearest level (ties to the upper one)
    packed = pack_nibbles(codes)
    if not double_quant:
        return NF4Tensor(packed, tuple(a.shape), bs, absmax)
    mean = float(absmax.mean(dtype=np.float64))
    centred = absmax.astype(np.float64) - mean
    nb = absmax.size
    pad = (-nb) % DQ_BLOCK
    cblocks = np.concatenate([centred, np.zeros(pad)]).reshape(-1, DQ_BLOCK)
    amax = np.abs(cblocks).max(axis=1)
    step = (np.where(amax > 0, amax, 1.0) / 127.0).astype(np.float32)
    q = np.clip(np.rint(cblocks / step[:, None]), -127, 127).astype(np.int8).ravel()[:nb]
    return NF4Tensor(packed, tuple(a.shape), bs, q, step, np.float32(mean).item(), DQ_BLOCK)


def nf4_dequantize(q: NF4Tensor) -> np.ndarray:
    """The fp32 array NF4 codes stand for: codebook[code] * block scale, in the original shape."""
    if not isinstance(q, NF4Tensor):
        raise TypeError(f"q: must be an NF4Tensor, got {type(q).__name__}")
    codes = unpack_nibbles(q.codes, q.numel)
    vals = nf4_codebook()[codes].reshape(-1, q.block_size) * q.scales()[:, None]
    return vals.reshape(q.shape)


def int4_absmax_quantize(w: Any, block_size: int = 64) -> np.ndarray:
    """The uniform baseline: symmetric int4 (levels -7..7) with the same block-wise absmax; returns the
    dequantized fp32 array (for comparing quantization error with NF4)."""
    a = np.asarray(getattr(w, "data", w), np.float32)
    bs = _check_block(block_size, a.size)
    blocks = a.reshape(-1, bs)
    s = np.abs(blocks).max(axis=1, keepdims=True) / 7
    s = np.where(s > 0, s, 1.0)
    return (np.clip(np.rint(blocks / s), -7, 7) * s).reshape(a.shape).astype(np.float32)


# ----------------------------------------------------------------------------------------------- the matmul op
def _check_mm(x: Any, q: Any) -> tuple[np.ndarray, NF4Tensor]:
    if not isinstance(q, NF4Tensor):
        raise TypeError(f"q: must be an NF4Tensor, got {type(q).__name__}")
    if len(q.shape) != 2:
        raise ValueError(f"q: the weight must be 2-D [N, K], got shape {q.shape}")
    xa = np.asarray(getattr(x, "data", x))
    if not np.issubdtype(xa.dtype, np.floating):
        raise TypeError(f"x: must be floating, got dtype {xa.dtype}")
    if xa.ndim != 2 or xa.shape[1] != q.shape[1]:
        raise ValueError(f"x: must be [M, K={q.shape[1]}] for W {q.shape}, got shape {xa.shape}")
    return xa, q


@backends.register(OP, "numpy")
def _nf4_matmul_numpy(x: Any, q: NF4Tensor) -> np.ndarray:
    xa, q = _check_mm(x, q)
    return np.asarray(xa, np.float32) @ nf4_dequantize(q).T


def _cpp(version: str) -> Any:
    def run(x: Any, q: NF4Tensor) -> np.ndarray:
        xa, q = _check_mm(x, q)
        c = backends.load_C("compress")
        return c.nf4_matmul(
            np.ascontiguousarray(xa, np.float32),
            q.codes,
            q.shape[0],
            q.block_size,
            nf4_codebook(),
            q.absmax,
            q.dq_step,
            q.dq_mean,
            q.dq_block,
            version,
        )

    run.__name__ = f"_nf4_matmul_cpp_{version}"
    return run


def _example(rng: Any) -> tuple[tuple, dict]:
    w = rng.standard_normal((19, 72)).astype(np.float32)
    x = rng.standard_normal((5, 72)).astype(np.float32)
    return (x, nf4_quantize(w, block_size=24)), {}


def _c_ok() -> bool:
    return backends.C_available("compress")


backends.register(OP, "cpp", _cpp("simd"), version="simd", default=True, available=_c_ok, example=_example)
backends.register(OP, "cpp", _cpp("scalar"), version="scalar", available=_c_ok)


def nf4_matmul(x: Any, q: NF4Tensor, backend: str | None = None, version: str | None = None) -> np.ndarray:
    """y = x @ dequant(W).T, x [M, K] floating (any strides), W an NF4Tensor of shape [N, K]; fp32 [M, N]."""
    return backends.dispatch(OP, x, q, backend=backend, version=version)


def nf4_matmul_path(version: str = "simd") -> str:
    """The C++ code path (avx512 / avx2 / scalar) a cpp ``version`` runs on this CPU (TINYLEARN_CPU_FEATURES)."""
    return str(backends.load_C("compress").nf4_matmul_path(version))
