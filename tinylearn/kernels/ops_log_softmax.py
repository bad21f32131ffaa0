"""The log-softmax entry points of the kernels dispatcher (``kernels.log_softmax`` / ``log_softmax_backward``,
registered in ops.py): validate, move ``dim`` last, reshape to the kernels' canonical rows [R, C], call one backend
(numpy reference or the C++ kernel of cpp_src/kernels_softmax.cpp). ``tl.nn.functional.log_softmax`` (and so
``cross_entropy``; ``LogSoftmax`` in tinylearn/autograd/ops_reduce.py) calls the same registered kernels directly on
its rows (its arguments are checked by then)."""

from __future__ import annotations

import numpy as np

from .ops import along_rows


def log_softmax(x: np.ndarray, dim: int = -1, *, backend: str | None = None) -> np.ndarray:
    """torch.log_softmax along ``dim``: (x - max) - log sum exp(x - max); a fully -inf slice gives NaN (as torch)."""
    return along_rows("log_softmax", (("x", x),), dim, backend)


def log_softmax_backward(y: np.ndarray, dy: np.ndarray, dim: int = -1, *, backend: str | None = None) -> np.ndarray:
    """dx = dy - exp(y) * sum(dy, dim) from the forward output ``y``."""
    return along_rows("log_softmax_backward", (("y", y), ("dy", dy)), dim, backend)
