"""Reference answers: the exercise names bound to tinylearn's implementations (thin adapters only)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import tinylearn as tl
from tinylearn.autograd import numerical_jacobian
from tinylearn.autograd import topo_sort as _topo_sort
from tinylearn.autograd import unbroadcast as _unbroadcast
from tinylearn.nn import functional as F


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return _unbroadcast(grad, tuple(shape))


def _grads(fn: Callable[..., tl.Tensor], arrays: list[np.ndarray], grad: np.ndarray | None) -> list[np.ndarray]:
    ts = [tl.Tensor(a, requires_grad=True) for a in arrays]
    fn(*ts).backward(grad)
    return [t.grad.data for t in ts]


def matmul_backward(a: np.ndarray, b: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ga, gb = _grads(lambda x, y: x @ y, [a, b], grad)
    return ga, gb


def softmax_backward(y: np.ndarray, grad: np.ndarray, dim: int = -1) -> np.ndarray:
    return tl.kernels.softmax_backward(y, grad, dim, backend="numpy")


def topo_sort(root: Any, parents: Callable[[Any], Iterable[Any]]) -> list[Any]:
    return _topo_sort(root, parents)


def numerical_grad(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    t = tl.Tensor(np.array(x, dtype=np.float64, order="C", copy=True))
    jac = numerical_jacobian(lambda u: tl.Tensor(np.asarray(f(u.data.copy()), dtype=np.float64)), [t], 0, eps)
    return jac.reshape(np.shape(x))


def sgd_momentum_step(
    w: np.ndarray,
    g: np.ndarray,
    buf: np.ndarray | None,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    p = tl.Tensor(np.array(w, copy=True), requires_grad=True)
    opt = tl.optim.SGD([p], lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if buf is not None:  # resume from a momentum buffer the way torch does: through the optimizer's state_dict
        sd = opt.state_dict()
        opt.load_state_dict({**sd, "state": {0: {"momentum_buffer": np.array(buf, copy=True)}}})
    p.grad = tl.Tensor(np.array(g, copy=True))  # what backward() would have left there
    opt.step()
    return p.data, opt.state_dict()["state"][0]["momentum_buffer"]


def linear_backward(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, grad: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    gx, gw, gb = _grads(F.linear, [x, w, b], grad)
    return gx, gw, gb


def cross_entropy_backward(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    (g,) = _grads(lambda z: F.cross_entropy(z, np.asarray(target)), [logits], None)
    return g
