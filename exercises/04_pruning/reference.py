"""Reference answers: thin adapters over tinylearn.prune / tinylearn.sparse."""

from __future__ import annotations

import numpy as np

import tinylearn as tl
from tinylearn.prune import masks


def l1_mask(w: np.ndarray, amount: float) -> np.ndarray:
    return masks.l1_unstructured_mask(w, amount)


def global_l1_masks(weights: list[np.ndarray], amount: float) -> list[np.ndarray]:
    flat = np.concatenate([np.asarray(w, dtype=np.float64).reshape(-1) for w in weights])
    mask = masks.l1_unstructured_mask(flat, amount)
    out, start = [], 0
    for w in weights:
        out.append(mask[start : start + w.size].reshape(w.shape).astype(w.dtype))
        start += w.size
    return out


def n_m_mask(w: np.ndarray, n: int = 2, m: int = 4) -> np.ndarray:
    return masks.n_m_mask(w, n, m, dim=-1)


def agp_sparsity(step: int, initial: float, final: float, start: int, end: int, frequency: int) -> float:
    return tl.prune.AGPSchedule(initial, final, start, end, frequency)(step)


def csr_from_dense(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = tl.sparse.CSR.from_dense(a)
    return c.indptr, c.indices, c.data


def csr_spmv(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    n_rows = len(indptr) - 1
    return tl.sparse.CSR(indptr, indices, data, (n_rows, x.shape[0])).matmul(x)
