"""Finite-difference gradient check (the test every hand-written VJP must pass).

For f: R^n -> R^m and every input element j, the central difference

    J[:, j] ~= (f(x + eps e_j) - f(x - eps e_j)) / (2 eps)          (error O(eps^2), computed in float64)

is compared with the Jacobian rows autograd gives (one backward per output element, grad = one-hot):
|analytic - numeric| <= atol + rtol * |numeric| elementwise, else AssertionError naming input and element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .grad_mode import no_grad
from .tensor import Tensor


def _as_tuple(out: Any) -> tuple[Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def gradcheck(
    fn: Callable[..., Any],
    inputs: Tensor | Sequence[Any],
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
) -> bool:
    """Compare autograd's Jacobian of ``fn(*inputs)`` with central differences in float64; True or AssertionError.

    Tensor inputs with requires_grad=True are checked (all floating Tensors if none requires grad; floating numpy
    arrays count as Tensors requiring grad); other inputs are passed through unchanged. ``fn`` may return a Tensor
    or a tuple of Tensors.
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__} {fn!r}")
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    inputs = tuple(
        Tensor(x, requires_grad=True) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x for x in inputs
    )
    if not inputs:
        raise ValueError("inputs: gradcheck needs at least one input")
    tensor_pos = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.dtype.kind == "f"]
    check = [i for i in tensor_pos if inputs[i].requires_grad] or tensor_pos
    if not check:
        raise ValueError("inputs: no floating-point Tensor among the inputs to check")
    args: list[Any] = list(inputs)
    for i in tensor_pos:
        args[i] = Tensor(np.array(inputs[i].data, dtype=np.float64), requires_grad=i in check)

    outs = _as_tuple(fn(*args))
    for k, o in enumerate(outs):
        if not isinstance(o, Tensor):
            raise TypeError(f"fn: output {k} is {type(o).__name__}, expected Tensor")
    # analytic Jacobian: one backward per output element
    analytic = {i: [] for i in check}
    for o in outs:
        flat_n = o.data.size
        for e in range(flat_n):
            for i in check:
                args[i].grad = None
            if not o.requires_grad:
                for i in check:
                    analytic[i].append(np.zeros(args[i].data.size))
                continue
            seed = np.zeros(o.data.size, dtype=o.data.dtype)
            seed[e] = 1.0
            o.backward(seed.reshape(o.shape), retain_graph=True)
            for i in check:
                gr = args[i].grad
                analytic[i].append(np.zeros(args[i].data.size) if gr is None else gr.data.reshape(-1).copy())
    for i in check:
        numeric = numerical_jacobian(fn, args, i, eps)
        ana = np.stack(analytic[i], axis=0) if analytic[i] else np.zeros_like(numeric)
        bad = np.abs(ana - numeric) > atol + rtol * np.abs(numeric)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise AssertionError(
                f"gradcheck: Jacobian mismatch for input {i} (shape {args[i].shape}) at output element {r}, input "
                f"element {c}: analytic {ana[r, c]:.8g} vs numeric {numeric[r, c]:.8g} "
                f"({int(bad.sum())} of {bad.size} entries differ)"
            )
    return True


def numerical_jacobian(fn: Callable[..., Any], args: Sequence[Any], i: int, eps: float = 1e-6) -> np.ndarray:
    """Central-difference Jacobian [n_outputs, n_inputs] of ``fn(*args)`` w.r.t. the float64 Tensor ``args[i]``
    (outputs flattened and concatenated). ``args[i].data`` is perturbed in place and restored."""
    x = args[i].data
    if x.dtype != np.float64 or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(f"args[{i}]: needs a writable C-contiguous float64 array, got {x.dtype} {x.shape}")
    flat = x.reshape(-1)
    cols = []

    def evaluate() -> np.ndarray:
        return np.concatenate([np.asarray(o.data, np.float64).reshape(-1) for o in _as_tuple(fn(*args))])

    with no_grad():
        for j in range(flat.size):
            orig = flat[j]
            flat[j] = orig + eps
            fp = evaluate()
            flat[j] = orig - eps
            fm = evaluate()
            flat[j] = orig
            cols.append((fp - fm) / (2 * eps))
    return np.stack(cols, axis=1) if cols else np.zeros((0, 0))
