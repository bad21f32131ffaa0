"""Exercises for notebook 04 (pruning and sparsity). Fill in each function; run
``pytest exercises/04_pruning`` until it passes. All inputs and outputs are numpy arrays.
Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

import numpy as np


def l1_mask(w: np.ndarray, amount: float) -> np.ndarray:
    """Unstructured magnitude mask: 0 for the round(amount * w.size) entries with the smallest |w|, 1 elsewhere.

    Same shape and dtype as ``w``. Ties: prune the lower flat index first (use a stable sort).
    Must equal torch.nn.utils.prune.l1_unstructured's weight_mask for tie-free inputs.
    """
    raise NotImplementedError("reference solution: tinylearn/prune/masks.py:l1_unstructured_mask")


def global_l1_masks(weights: list[np.ndarray], amount: float) -> list[np.ndarray]:
    """One global magnitude ranking over all ``weights``: prune round(amount * total) smallest |w| overall.

    Returns one mask per array (same shapes). A layer with small weights loses more than its share — that is
    the point (and the danger) of a global threshold.
    """
    raise NotImplementedError("reference solution: tinylearn/prune/functional.py:global_unstructured")


def n_m_mask(w: np.ndarray, n: int = 2, m: int = 4) -> np.ndarray:
    """N:M mask along the last dim: in every group of m consecutive entries keep the n largest |w|.

    Raise ValueError if n > m or m does not divide w.shape[-1] (mention the offending values).
    """
    raise NotImplementedError("reference solution: tinylearn/prune/masks.py:n_m_mask")


def agp_sparsity(step: int, initial: float, final: float, start: int, end: int, frequency: int) -> float:
    """Zhu & Gupta AGP: s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (end - t0))**3, increasing from s_i to s_f.

    Clamp: step < start -> initial; step >= end -> final. Between updates (every ``frequency`` steps from
    ``start``) hold the value of the last update step.
    """
    raise NotImplementedError("reference solution: tinylearn/prune/schedules.py:AGPSchedule")


def csr_from_dense(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of a 2-D array: (indptr int64 [M+1], indices [nnz] column ids in increasing order per row, data [nnz])."""
    raise NotImplementedError("reference solution: tinylearn/sparse/csr.py:CSR.from_dense")


def csr_spmv(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y = A @ x for A in CSR form (rows with no entries give 0)."""
    raise NotImplementedError("reference solution: tinylearn/sparse/base.py:SparseMatrix.matmul")
