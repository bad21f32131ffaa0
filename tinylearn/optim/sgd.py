"""SGD with momentum, dampening, Nesterov and L2 weight decay — torch's update rule:

g <- g + wd * w
b <- g                          (first step)      b <- mu * b + (1 - dampening) * g     (later steps)
g <- g + mu * b  (nesterov)     g <- b  (plain momentum)
w <- w - lr * g
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from .optimizer import Optimizer, check_hyper, register_step


class SGD(Optimizer):
    op = "optim.sgd_step"

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
        *,
        backend: str | None = None,
    ) -> None:
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay), ("dampening", dampening)):
            check_hyper(name, v)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov: Nesterov momentum requires momentum > 0 and dampening = 0")
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                dampening=dampening,
                nesterov=nesterov,
                maximize=maximize,
            ),
            backend=backend,
        )


def _step_numpy(opt: Optimizer, w: np.ndarray, g: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
    lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
    dt = w.dtype.type
    if group["maximize"]:
        g = -g
    if wd:
        g = g + dt(wd) * w
    if mu:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = np.array(g, dtype=w.dtype, copy=True)
        else:
            buf *= dt(mu)
            damp = 1 - group["dampening"]
            if damp == 1:
                buf += g
            else:
                buf += dt(damp) * g
        if group["nesterov"]:
            g = g + dt(mu) * buf
        else:
            g = buf
    tmp = np.multiply(g, dt(lr), out=opt.scratch(w))
    w -= tmp


def _step_cpp(opt: Optimizer, w: np.ndarray, g: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
    """One fused pass (tinylearn._C.optim.sgd_step) when the arrays allow it, else the numpy passes."""
    lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
    if opt.fused_ok(w, g):
        buf = state.get("momentum_buffer")
        first = buf is None
        if mu and first:
            buf = state["momentum_buffer"] = np.empty_like(w)
        if buf is None or opt.fused_ok(w, buf):
            opt._fused.sgd_step(
                w,
                g,
                buf if buf is not None else w,
                lr,
                mu,
                group["dampening"],
                wd,
                group["nesterov"],
                group["maximize"],
                first,
                **opt._omp_kw,
            )
            return
    _step_numpy(opt, w, g, state, group)


def _example(rng: np.random.Generator) -> tuple[tuple, dict]:
    """One Nesterov step with weight decay on a [5, 37] float32 parameter that already has a momentum buffer."""
    w, g, buf = (rng.standard_normal((5, 37)).astype(np.float32) for _ in range(3))
    opt = SGD([Tensor(w.copy(), requires_grad=True)], lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    return (opt, w, g, {"momentum_buffer": buf}, opt.param_groups[0]), {}


register_step(SGD.op, _step_numpy, _step_cpp, example=_example)
