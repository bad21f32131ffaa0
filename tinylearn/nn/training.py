"""A plain supervised training loop and accuracy evaluation (used by notebooks and other topics).

fit: for each epoch, for each shuffled mini-batch: loss = cross_entropy(model(x), y); zero_grad; backward; step.
``train_step`` / ``train_epoch`` are that loop body and epoch, shared with prune.finetune and memory.workload.

Threads: the digits models multiply matrices of a few dozen rows/columns, where a multi-threaded BLAS or OpenMP
kernel spends more time waking and synchronising threads than computing (5-15x slower on a busy 2-core box).
``fit``/``predict`` therefore cap BLAS and OpenMP thread pools at ``threads`` (default 1, via threadpoolctl;
None leaves them alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import limited_threads
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..data.loader import DataLoader
from ..optim import SGD, Adam, AdamW
from .functional_loss import cross_entropy
from .module import Module


def _make_optimizer(model: Module, optimizer: Any, lr: float, weight_decay: float) -> Any:
    if not isinstance(optimizer, str):
        return optimizer
    params = list(model.parameters())
    if optimizer == "adam":
        return Adam(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "adamw":
        return AdamW(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    raise ValueError(f"optimizer: expected 'adam', 'adamw', 'sgd' or an Optimizer, got {optimizer!r}")


def fit(
    model: Module,
    X: np.ndarray,
    y: np.ndarray,
    epochs: int = 10,
    lr: float = 1e-2,
    batch_size: int = 64,
    optimizer: Any = "adam",
    seed: int = 0,
    progress: bool = False,
    weight_decay: float = 0.0,
    X_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
    threads: int | None = 1,
) -> dict[str, list[float]]:
    """Train ``model`` with softmax cross-entropy; returns {"loss": [...], "acc": [...]} per epoch (train set;
    plus "val_acc" when X_val/y_val are given). ``optimizer``: "adam" | "adamw" | "sgd" (momentum 0.9) or an
    Optimizer instance. ``progress=True`` shows a tqdm bar over epochs."""
    with limited_threads(threads):
        return _fit(model, X, y, epochs, lr, batch_size, optimizer, seed, progress, weight_decay, X_val, y_val)


def _fit(
    model: Module,
    X: np.ndarray,
    y: np.ndarray,
    epochs: int,
    lr: float,
    batch_size: int,
    optimizer: Any,
    seed: int,
    progress: bool,
    weight_decay: float,
    X_val: np.ndarray | None,
    y_val: np.ndarray | None,
) -> dict[str, list[float]]:
    if epochs < 1:
        raise ValueError(f"epochs: must be >= 1, got {epochs}")
    opt = _make_optimizer(model, optimizer, lr, weight_decay)
    loader = DataLoader(X, y, batch_size=batch_size, shuffle=True, seed=seed)
    hist: dict[str, list[float]] = {"loss": [], "acc": []}
    if X_val is not None:
        hist["val_acc"] = []
    it = range(epochs)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(it, desc="epochs", leave=False)
        it = bar
    model.train()
    for _ in it:
        loss, acc = train_epoch(model, opt, loader)
        hist["loss"].append(loss)
        hist["acc"].append(acc)
        if X_val is not None:
            hist["val_acc"].append(evaluate(model, X_val, y_val))
            model.train()
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.3f}")
    model.eval()
    return hist


def train_step(
    model: Module, opt: Any, xb: Tensor, yb: Tensor, loss_fn: Callable[..., Tensor] = cross_entropy
) -> tuple[Tensor, float]:
    """One optimisation step -- forward, loss, zero_grad, backward, step -- the loop body every topic shares.
    Returns (model output, loss as a float)."""
    out = model(xb)
    loss = loss_fn(out, yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return out, float(loss.data)


def train_epoch(
    model: Module, opt: Any, loader: Any, before_step: Callable[[], None] | None = None
) -> tuple[float, float]:
    """One pass of ``train_step`` over ``loader``; returns (mean loss, top-1 accuracy) over the epoch's samples.
    ``before_step`` runs before each step (e.g. prune.finetune raises the sparsity on its schedule there)."""
    tot, correct, n = 0.0, 0, 0
    for xb, yb in loader:
        if before_step is not None:
            before_step()
        out, loss = train_step(model, opt, xb, yb)
        b = len(yb.data)
        tot += loss * b
        correct += int((out.data.argmax(axis=1) == yb.data).sum())
        n += b
    return tot / n, correct / n


def predict(model: Module, X: np.ndarray, batch_size: int = 512, threads: int | None = 1) -> np.ndarray:
    """Logits as a numpy array (eval mode, no graph)."""
    was = model.training
    model.eval()
    outs = []
    with no_grad(), limited_threads(threads):
        for i in range(0, len(X), batch_size):
            outs.append(model(Tensor(np.ascontiguousarray(X[i : i + batch_size]))).data)
    model.train(was)
    return np.concatenate(outs)


def evaluate(model: Module, X: np.ndarray, y: np.ndarray, batch_size: int = 512) -> float:
    """Top-1 accuracy in [0, 1] (model is put in eval mode for the pass and restored)."""
    y = y.data if isinstance(y, Tensor) else np.asarray(y)
    if len(X) != len(y):
        raise ValueError(f"y: length {len(y)} does not match X length {len(X)}")
    return float((predict(model, X, batch_size).argmax(axis=1) == y).mean())
