"""Exercises for notebook 01 (autodiff). Fill in each function; run ``pytest exercises/01_autodiff``.

Work on plain numpy arrays: you are writing the backward formulas (VJPs) an autodiff engine is made of.
Check your answers against ``pytest exercises/01_autodiff --impl=reference`` (tinylearn's implementations).

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """VJP of broadcasting: z = a + b where a of ``shape`` was broadcast to grad.shape. Return dL/da (``shape``).

    Hint: sum over the leading dims broadcasting added, then over dims where ``shape`` has size 1 (keepdims).
    """
    raise NotImplementedError("reference solution: tinylearn/autograd/function.py:unbroadcast")


def matmul_backward(a: np.ndarray, b: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Z = A @ B with A [m, k], B [k, n] and grad = dL/dZ [m, n]. Return (dL/dA, dL/dB)."""
    raise NotImplementedError("reference solution: tinylearn/autograd/linalg.py:MatMul.backward")


def softmax_backward(y: np.ndarray, grad: np.ndarray, dim: int = -1) -> np.ndarray:
    """y = softmax(x, dim) (given), grad = dL/dy. Return dL/dx without forming the Jacobian."""
    raise NotImplementedError("reference solution: tinylearn/kernels/reference.py:softmax_backward")


def topo_sort(root: Any, parents: Callable[[Any], Iterable[Any]]) -> list[Any]:
    """All nodes reachable from ``root`` via ``parents(node)``, each listed AFTER all of its parents, root last.

    Nodes may be reached along several paths (list each once). Graphs can be 10_000 nodes deep: no recursion.
    """
    raise NotImplementedError("reference solution: tinylearn/autograd/engine.py:topo_sort")


def numerical_grad(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of the scalar function f at x (float64): (f(x + eps e_i) - f(x - eps e_i)) / 2eps.

    Do not modify the caller's x.
    """
    raise NotImplementedError("reference solution: tinylearn/autograd/gradcheck.py:numerical_jacobian")


def sgd_momentum_step(
    w: np.ndarray,
    g: np.ndarray,
    buf: np.ndarray | None,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """One torch.optim.SGD step for one parameter. ``buf`` is the momentum buffer (None on the first step).

    Return (new_w, new_buf). Do not modify the inputs in place.
    """
    raise NotImplementedError("reference solution: tinylearn/optim/sgd.py:_step_numpy")


def linear_backward(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, grad: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = x @ w.T + b with x [N, in], w [out, in] (torch layout), b [out]; grad = dL/dy [N, out].

    Return (dL/dx, dL/dw, dL/db).
    """
    raise NotImplementedError("reference solution: tinylearn/autograd/linalg.py:Linear.backward")


def cross_entropy_backward(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    """d/dlogits of mean_i( logsumexp(logits_i) - logits_i[target_i] ) for logits [N, C], integer target [N].

    Must stay finite for logits like 1e4.
    """
    raise NotImplementedError("reference solution: tinylearn/nn/functional_loss.py:CrossEntropyFn.backward")
