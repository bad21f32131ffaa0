"""Activation checkpointing: drop a segment's activations in the forward, recompute them in the backward.

    y = checkpoint(fn, x)      forward:  y = fn(x) under no_grad (nothing inside fn is saved), keep only x
                               backward: restore the RNG state of the forward, recompute fn(x) with grad on,
                                         backpropagate dL/dy through it (parameter gradients accumulate as usual),
                                         hand dL/dx on

Same values and gradients as without checkpointing, bit for bit, in fp32 and under autocast: the recomputation
repeats the same numpy calls; dropout draws the same mask because the global generator's state is saved and
restored (torch's preserve_rng_state); the recomputation runs under the autocast state of the forward, not of
the backward (torch saves and restores it too); and the gradient entering a segment is handed to its
recomputed graph unrounded (a bf16 segment output does not round an fp32 gradient, as in the plain graph).
Cost: one extra forward of every checkpointed segment.

checkpoint_sequential(modules, segments, x): split n layers into ``segments`` chunks and checkpoint all but the
last (as torch does). Activation memory ~ k boundary tensors + one segment's internals in the backward, i.e.
k + n/k layers' worth (minimal at k = sqrt(n), O(sqrt(n)) instead of O(n): Chen et al. 2016). Here the last,
uncheckpointed segment stays alive while the others are recomputed, so the measured peak is ~ k + 2n/k + 1 layer
outputs, minimal at k = sqrt(2n) (notebook 11 §6 measures and asserts it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .autocast_state import autocast_dtype, get_autocast_dtype
from .dtypes import is_floating
from .function import Function
from .grad_mode import enable_grad, is_grad_enabled, no_grad
from .tensor import Tensor

_STATS = {"recomputed": 0}


def recompute_count() -> int:
    """How many checkpointed segments have been recomputed in backward passes (since the last reset)."""
    return _STATS["recomputed"]


def reset_recompute_count() -> None:
    _STATS["recomputed"] = 0


def _rng() -> np.random.Generator:
    from .factory import get_rng  # the generator behind randn/rand/dropout (replaced by manual_seed)

    return get_rng()


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx, _anchor, *args, fn, is_tensor, preserve_rng_state):
        ctx.fn, ctx.is_tensor = fn, is_tensor
        ctx.rng_state = _rng().bit_generator.state if preserve_rng_state else None
        ctx.autocast_dtype = get_autocast_dtype()  # the recomputation must run under the same autocast state
        with no_grad():
            out = fn(*[Tensor(a) if t else a for a, t in zip(args, is_tensor)])
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return a single Tensor, got {type(out).__name__}")
        ctx.save_for_backward(*args)
        return out.data

    @staticmethod
    def backward(ctx, g):
        args = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        inputs = [
            Tensor(a, requires_grad=bool(n) and is_floating(a.dtype)) if t else a
            for a, t, n in zip(args, ctx.is_tensor, needs)
        ]
        gen = _rng()
        current = gen.bit_generator.state
        if ctx.rng_state is not None:
            gen.bit_generator.state = ctx.rng_state
        try:
            with enable_grad(), autocast_dtype(ctx.autocast_dtype):
                out = ctx.fn(*inputs)
        finally:
            gen.bit_generator.state = current
        _STATS["recomputed"] += 1
        # capture input gradients in a hook, before the engine casts a leaf's gradient to the leaf's dtype
        # (a bf16 segment input would otherwise hand back a bf16-rounded gradient)
        captured: dict[int, np.ndarray] = {}
        for i, x in enumerate(inputs):
            if isinstance(x, Tensor) and x.requires_grad:
                x.register_hook(lambda gr, i=i: captured.__setitem__(i, getattr(gr, "data", gr)))
        if out.requires_grad:
            # hand the incoming gradient on as it is (Tensor.backward would cast it to out's dtype: a bf16 segment
            # output would round an fp32 gradient that the un-checkpointed graph passes through unrounded)
            from .engine import run_backward

            run_backward(out, np.asarray(g), False)
        grads = [
            captured.get(i, np.zeros(x.shape, np.float32) if t else None) if t and n else None
            for i, (x, t, n) in enumerate(zip(inputs, ctx.is_tensor, needs))
        ]
        return (None, *grads)


def checkpoint(fn: Callable[..., Tensor], *args: Any, preserve_rng_state: bool = True) -> Tensor:
    """``fn(*args)`` without keeping its intermediate activations; recomputed during backward."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if not is_grad_enabled():
        return fn(*args)
    # the anchor makes the node part of the graph even when no input requires grad (parameters inside fn do)
    anchor = Tensor(np.zeros((), np.float32), requires_grad=True)
    is_tensor = tuple(isinstance(a, Tensor) for a in args)
    return _Checkpoint.apply(anchor, *args, fn=fn, is_tensor=is_tensor, preserve_rng_state=preserve_rng_state)


def checkpoint_sequential(
    modules: Sequence[Callable[[Tensor], Tensor]] | Any, segments: int, x: Tensor, preserve_rng_state: bool = True
) -> Tensor:
    """Run ``modules`` (a Sequential or a list of layers) on x in ``segments`` chunks, all but the last
    checkpointed (torch.utils.checkpoint.checkpoint_sequential)."""
    layers = list(modules.children()) if hasattr(modules, "children") else list(modules)
    if not layers:
        raise ValueError("modules: expected at least one layer")
    if not isinstance(segments, int) or not 1 <= segments <= len(layers):
        raise ValueError(f"segments: expected an int in [1, {len(layers)}] (number of layers), got {segments!r}")
    size = len(layers) // segments
    bounds = [i * size for i in range(segments)] + [len(layers)]

    def run(chunk: list) -> Callable[[Tensor], Tensor]:
        def f(h: Tensor) -> Tensor:
            for m in chunk:
                h = m(h)
            return h

        return f

    for s in range(segments - 1):
        x = checkpoint(run(layers[bounds[s] : bounds[s + 1]]), x, preserve_rng_state=preserve_rng_state)
    return run(layers[bounds[-2] :])(x)
