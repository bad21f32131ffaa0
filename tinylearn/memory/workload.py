"""A real tinylearn workload for the memory topic: a few SGD steps of an MLP / CNN on the digits data.

``train(steps, alloc=None)`` runs the steps (under ``pooled(alloc)`` when an allocator is given) and returns
the losses and final parameters, so pooled and unpooled runs can be compared bit for bit;
``training_trace(steps)`` records the storage allocation trace of those steps (``TraceRecorder``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from .pooled import TraceRecorder, count_numpy_allocations, pooled


def _setup(model: str, batch: int, seed: int) -> tuple[Any, Any, Any, np.ndarray, np.ndarray]:
    import tinylearn as tl
    from tinylearn.nn.models import DigitsCNN, DigitsMLP

    tl.manual_seed(seed)
    net = DigitsMLP(hidden=(256, 128)) if model == "mlp" else DigitsCNN(c1=8, c2=16)
    X, y = tl.data.load_digits()
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(X))
    opt = tl.optim.SGD(list(net.parameters()), lr=0.05, momentum=0.9)
    return tl, net, opt, X[idx], y[idx]


def _steps(tl: Any, net: Any, opt: Any, X: np.ndarray, y: np.ndarray, steps: int, batch: int) -> list[float]:
    from tinylearn.nn.training import train_step

    losses = []
    for s in range(steps):
        lo = (s * batch) % (len(X) - batch)
        losses.append(train_step(net, opt, tl.Tensor(X[lo : lo + batch]), tl.Tensor(y[lo : lo + batch]))[1])
    return losses


def train(
    steps: int = 5,
    alloc: Any = None,
    model: str = "mlp",
    batch: int = 64,
    seed: int = 0,
    numpy: bool = False,
    count: bool = False,
) -> tuple[list[float], list[np.ndarray], Any]:
    """(losses, final parameters as numpy copies, pool counters or None). With ``alloc`` the model is built inside
    ``pooled(alloc, numpy)`` too, so parameters, activations and gradients all live in the arena. ``count=True``
    (no alloc): count numpy's data allocations (``count_numpy_allocations``), returned as the third item."""
    if alloc is not None:
        ctx: Any = pooled(alloc, numpy=numpy)
    elif count:
        ctx = count_numpy_allocations()
    else:
        ctx = contextlib.nullcontext()
    with ctx as hook:
        tl, net, opt, X, y = _setup(model, batch, seed)
        losses = _steps(tl, net, opt, X, y, steps, batch)
    return losses, [np.array(p.data) for p in net.parameters()], hook


def training_trace(
    steps: int = 2, model: str = "mlp", batch: int = 64, seed: int = 0, level: str = "tensor"
) -> np.ndarray:
    """Allocation trace (ops, see tinylearn.memory.trace) of ``steps`` training steps, model built outside.
    level="tensor": tensor storage (storage hook); "numpy": every numpy data allocation (memory handler)."""
    tl, net, opt, X, y = _setup(model, batch, seed)
    _steps(tl, net, opt, X, y, 1, batch)  # warm-up: optimizer state exists before recording
    import gc

    gc.collect()
    with TraceRecorder(level) as rec:
        _steps(tl, net, opt, X, y, steps, batch)
        gc.collect()
    return rec.ops
