"""Predict the compression ratio of a sparsity pattern under a storage format from cheap statistics of its mask.

A pruning search (per-layer sparsities, pattern types) wants the bytes of each candidate *without* packing it.
Every format's size is close to linear in a few statistics of the mask, so a linear regression on those statistics
predicts it; the target is the encoded size relative to dense (``nbytes / dense_nbytes``, the reciprocal of the
compression ratio), which is what is linear:

    CSR      (4 + 4) nnz + 8 (M + 1)               -> density, 1/K
    ELL      (4 + 4) M * max_row_nnz               -> max row fill
    BSR R*C  4 R C nblocks + 4 nblocks + 8 (M/R+1) -> block occupancy (fraction of R x C blocks with a nonzero)

The features (``pattern_features``): density (= the mean row fill), std and max of the per-row fill, the block
occupancy at the format's block size, 1/K and R/K (per-row overheads). ``measured_nbytes`` packs the mask with
``tinylearn.sparse`` and sums the encoded arrays' ``nbytes`` -- the ground truth the model is fitted to and checked
against.
``random_pattern`` generates training patterns of five kinds (uniform, row-skewed, blocks, N:M, channel-pruned).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import sparse
from .._inputs import is_int
from .masks import n_m_mask

FORMATS = ("csr", "ell", "bsr")
KINDS = ("uniform", "row_skew", "block", "n_m", "channel")
FEATURES = ("density", "row_fill_std", "row_fill_max", "block_occupancy", "inv_k", "r_over_k")


def _mask(mask: Any) -> np.ndarray:
    m = np.asarray(mask)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ValueError(f"mask: expected a non-empty 2-D array, got shape {m.shape}")
    return m != 0


def _check_block(block_size: int) -> int:
    if not is_int(block_size) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    return int(block_size)


def _check_fraction(name: str, v: float, what: str) -> float:
    """``v`` in (0, 1] as a float (Python or numpy int/float; bool refused), else ValueError naming ``name``."""
    if not (is_int(v) or isinstance(v, float | np.floating)) or not 0 < v <= 1:
        raise ValueError(f"{name}: expected {what}, got {v!r}")
    return float(v)


def _block(block_size: int, shape: tuple[int, int]) -> int:
    block_size = _check_block(block_size)
    if shape[0] % block_size or shape[1] % block_size:
        raise ValueError(f"block_size: {block_size} must divide the mask shape {shape}")
    return int(block_size)


def pattern_features(mask: Any, block_size: int = 4, sample: float | None = None, seed: int = 0) -> np.ndarray:
    """The statistics in ``FEATURES`` order (float64 vector) of a 2-D mask (nonzero = kept).

    ``sample`` (a fraction in (0, 1]) computes them on that share of the block rows (``block_size`` rows each, drawn
    without replacement with ``seed``): a cost of ``sample`` times the full scan, at the price of estimated
    statistics (a sampled maximum row fill is biased low)."""
    m = _mask(mask)
    b = _block(block_size, m.shape)
    M, K = m.shape
    if sample is not None:
        sample = _check_fraction("sample", sample, "None or a fraction in (0, 1]")
        nb = M // b
        take = np.sort(np.random.default_rng(seed).choice(nb, size=max(1, int(np.ceil(sample * nb))), replace=False))
        m = m.reshape(nb, b, K)[take].reshape(-1, K)
        M = m.shape[0]
    fill = m.sum(axis=1) / K
    blocks = m.reshape(M // b, b, K // b, b).any(axis=(1, 3))
    return np.array([m.mean(), fill.std(), fill.max(), blocks.mean(), 1.0 / K, b / K], dtype=np.float64)


def measured_nbytes(mask: Any, fmt: str, block_size: int = 4, dtype: Any = np.float32) -> int:
    """Bytes of the mask's pattern (values of ``dtype``) packed in ``fmt`` by ``tinylearn.sparse``: the sum of the
    encoded arrays' ``nbytes`` (CSR: indptr + indices + data; ELL: indices + data; BSR: indptr + indices + blocks)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: expected one of {FORMATS}, got {fmt!r}")
    m = _mask(mask)
    b = _block(block_size, m.shape)
    a = m.astype(dtype)
    if fmt == "csr":
        f = sparse.CSR.from_dense(a)
        return int(f.indptr.nbytes + f.indices.nbytes + f.data.nbytes)
    if fmt == "ell":
        f = sparse.ELL.from_dense(a)
        return int(f.indices.nbytes + f.data.nbytes)
    f = sparse.BSR.from_dense(a, b)
    return int(f.indptr.nbytes + f.indices.nbytes + f.data.nbytes)


def random_pattern(kind: str, shape: tuple[int, int], density: float, rng: np.random.Generator) -> np.ndarray:
    """A boolean mask of roughly ``density`` kept entries, of one of ``KINDS``:

    uniform (i.i.d.), row_skew (per-row densities from a Beta law: a few dense rows), block (4x4 blocks kept, dense
    inside), n_m (N:4 along rows, N = round(4 * density), at least 1), channel (whole rows and columns pruned, the rest
    uniform)."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    density = _check_fraction("density", density, "a number in (0, 1]")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy Generator, got {type(rng).__name__}")
    if len(shape) != 2 or any(not is_int(s) or s < 4 or s % 4 for s in shape):
        raise ValueError(f"shape: expected (M, K) with M, K positive multiples of 4, got {shape!r}")
    M, K = shape = (int(shape[0]), int(shape[1]))
    if kind == "uniform":
        return rng.random(shape) < density
    if kind == "row_skew":
        a = 0.5
        row_d = rng.beta(a, a * (1 - density) / density, size=M) if density < 1 else np.ones(M)
        return rng.random(shape) < row_d[:, None]
    if kind == "block":
        return np.kron(rng.random((M // 4, K // 4)) < density, np.ones((4, 4), dtype=bool))
    if kind == "n_m":
        n = min(4, max(1, round(4 * density)))
        return n_m_mask(rng.random(shape) + 0.01, n, 4).astype(bool)
    keep_r, keep_c = rng.random(M) < np.sqrt(density) * 1.2, rng.random(K) < np.sqrt(density) * 1.2
    return (rng.random(shape) < 0.7) & keep_r[:, None] & keep_c[None, :]


class CompressionRatioModel:
    """Linear regression from ``pattern_features`` to ``measured_nbytes / dense_nbytes`` for one format.

    ``fit(masks)`` packs each training mask once (the measurement), ``predict_nbytes(mask)`` /
    ``predict_ratio(mask)`` need only the features. ``features`` selects a subset of ``FEATURES`` (by name);
    ``sample`` computes them on that fraction of the block rows (see ``pattern_features``)."""

    def __init__(
        self,
        fmt: str,
        block_size: int = 4,
        dtype: Any = np.float32,
        features: Sequence[str] | None = None,
        sample: float | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"fmt: expected one of {FORMATS}, got {fmt!r}")
        block_size = _check_block(block_size)
        names = FEATURES if features is None else tuple(features)
        if not names or any(f not in FEATURES for f in names) or len(set(names)) != len(names):
            raise ValueError(f"features: expected distinct names from {FEATURES}, got {features!r}")
        self.fmt, self.block_size, self.dtype = fmt, int(block_size), np.dtype(dtype)
        self.features = names
        if sample is not None:
            sample = _check_fraction("sample", sample, "None or a fraction in (0, 1]")
        self.sample = sample
        self._cols = [FEATURES.index(f) for f in names]
        self.coef_: np.ndarray | None = None
        self.intercept_: float | None = None

    def _x(self, masks: Sequence[Any]) -> np.ndarray:
        return np.array([pattern_features(m, self.block_size, self.sample)[self._cols] for m in masks])

    def _dense_nbytes(self, mask: Any) -> int:
        m = np.asarray(mask)
        return int(m.shape[0] * m.shape[1] * self.dtype.itemsize)

    def fit(self, masks: Sequence[Any], nbytes: Sequence[int] | None = None) -> CompressionRatioModel:
        """Least squares on the training masks (more masks than features). ``nbytes``: their measured sizes in this
        format if already known (else ``measured_nbytes`` packs each)."""
        if isinstance(masks, np.ndarray) and masks.ndim == 2:
            raise ValueError("masks: expected a list of 2-D masks, got a single 2-D array")
        if len(masks) <= len(self.features) + 1:
            raise ValueError(f"masks: need more than {len(self.features) + 1} training masks, got {len(masks)}")
        if nbytes is None:
            nbytes = [measured_nbytes(m, self.fmt, self.block_size, self.dtype) for m in masks]
        elif len(nbytes) != len(masks):
            raise ValueError(f"nbytes: expected {len(masks)} sizes (one per mask), got {len(nbytes)}")
        X = self._x(masks)
        y = np.array([nb / self._dense_nbytes(m) for nb, m in zip(nbytes, masks, strict=True)], dtype=np.float64)
        A = np.hstack([X, np.ones((len(X), 1))])
        sol = np.linalg.lstsq(A, y, rcond=None)[0]
        self.coef_, self.intercept_ = sol[:-1], float(sol[-1])
        return self

    def coefficients(self) -> dict[str, float]:
        """Fitted coefficient per feature name, plus ``intercept``."""
        if self.coef_ is None:
            raise RuntimeError("CompressionRatioModel: call fit() before reading coefficients")
        return {**dict(zip(self.features, map(float, self.coef_), strict=True)), "intercept": float(self.intercept_)}

    def predict_relative(self, mask: Any) -> float:
        """Predicted ``nbytes / dense_nbytes`` (floored at a tiny positive value)."""
        if self.coef_ is None:
            raise RuntimeError("CompressionRatioModel: call fit() before predicting")
        x = self._x([mask])[0]
        return max(float(x @ self.coef_ + self.intercept_), 1e-9)

    def predict_nbytes(self, mask: Any) -> float:
        return self.predict_relative(mask) * self._dense_nbytes(mask)

    def predict_ratio(self, mask: Any) -> float:
        """Predicted compression ratio ``dense_nbytes / nbytes`` (> 1: the format is smaller than dense)."""
        return 1.0 / self.predict_relative(mask)


__all__ = [
    "FEATURES",
    "FORMATS",
    "KINDS",
    "CompressionRatioModel",
    "measured_nbytes",
    "pattern_features",
    "random_pattern",
]
