"""Activation checkpointing: drop a segment's activations in the forward, recompute them in the backward.

    y = checkpoint(fn, x)      forward:  y = fn(x) under no_grad (nothing inside fn is saved), keep only x
                               backward: restore the RNG state of the forward, recompute fn(x) with grad on,
                                         backpropagate dL/dy through it (parameter gradients accumulate as usual),
                                         hand dL/dx on

Same values and gradients as without checkpointing, bit for bit, in fp32 and under autocast: the recomputation
repeats the same numpy calls; dropout draws the same mask because the random state is saved and restored
(torch's preserve_rng_state: tinylearn's generator, numpy's global ``np.random`` state and, when torch is loaded,
torch's CPU generator); the recomputation runs under the autocast state of the forward, not of
the backward (torch saves and restores it too); and the gradient entering a segment is handed to its
recomputed graph unrounded (a bf16 segment output does not round an fp32 gradient, as in the plain graph).
Cost: one extra forward of every checkpointed segment.

State that changes between the forward and the recomputation (a closure counter, a module attribute, a random
state that is not restored) would make the backward differentiate a different call than the forward ran: for
``f(x) = x * x * calls`` torch's ``use_reentrant=False`` keeps the forward's graph and gives d/dx = 2x * 1 while a
plain recomputation gives 2x * 2. tinylearn always differentiates the recomputed call, so it checks that the call
is the same one (``determinism_check="default"``, torch's name): the recomputed output must have the forward's
shape and dtype (torch raises ``CheckpointError`` for a metadata mismatch too) and, while the random state is
restored, the same bytes (tinylearn's recomputation is bit-exact, so any difference means fn depends on changed
state). A mismatch raises ``CheckpointError`` (a RuntimeError, as torch's) instead of returning a gradient of the
wrong call; ``determinism_check="none"`` turns the check off (torch's ``use_reentrant=True`` result).

checkpoint_sequential(modules, segments, x): split n layers into ``segments`` chunks and checkpoint all but the
last (as torch does). Activation memory ~ k boundary tensors + one segment's internals in the backward, i.e.
k + n/k layers' worth (minimal at k = sqrt(n), O(sqrt(n)) instead of O(n): Chen et al. 2016). Here the last,
uncheckpointed segment stays alive while the others are recomputed, so the measured peak is ~ k + 2n/k + 1 layer
outputs, minimal at k = sqrt(2n) (notebook 11 §6 measures and asserts it).
"""

from __future__ import annotations

import sys
import zlib
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


class CheckpointError(RuntimeError):
    """The recomputation of a checkpointed segment differs from its forward (torch.utils.checkpoint's name)."""


def _rng_states() -> tuple[Any, Any, Any]:
    """(tinylearn's generator state, numpy's global state, torch's CPU generator state or None)."""
    torch = sys.modules.get("torch")  # never import torch here: a script that does not use it has no torch RNG
    torch_state = torch.get_rng_state() if torch is not None and hasattr(torch, "get_rng_state") else None
    return _rng().bit_generator.state, np.random.get_state(), torch_state


def _set_rng_states(states: tuple[Any, Any, Any]) -> None:
    ours, numpys, torchs = states
    _rng().bit_generator.state = ours
    np.random.set_state(numpys)
    if torchs is not None:
        sys.modules["torch"].set_rng_state(torchs)


def _fingerprint(a: np.ndarray, with_values: bool) -> tuple[Any, ...]:
    """(shape, dtype[, crc32 of the bytes]): what the recomputed output must repeat."""
    if not with_values:
        return (a.shape, a.dtype)
    return (a.shape, a.dtype, zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx, _anchor, *args, fn, is_tensor, preserve_rng_state, check):
        ctx.fn, ctx.is_tensor = fn, is_tensor
        ctx.rng_state = _rng_states() if preserve_rng_state else None
        ctx.autocast_dtype = get_autocast_dtype()  # the recomputation must run under the same autocast state
        with no_grad():
            out = fn(*[Tensor(a) if t else a for a, t in zip(args, is_tensor)])
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return a single Tensor, got {type(out).__name__}")
        # values are compared only while the random state is restored (without it, dropout legitimately differs)
        ctx.fingerprint = _fingerprint(out.data, preserve_rng_state) if check else None
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
        current = _rng_states()
        if ctx.rng_state is not None:
            _set_rng_states(ctx.rng_state)
        try:
            with enable_grad(), autocast_dtype(ctx.autocast_dtype):
                out = ctx.fn(*inputs)
        finally:
            _set_rng_states(current)
        _STATS["recomputed"] += 1
        if not isinstance(out, Tensor):
            raise CheckpointError(f"checkpoint: fn returned a {type(out).__name__} when recomputed, not a Tensor")
        if ctx.fingerprint is not None:
            _check_same_call(ctx.fingerprint, _fingerprint(out.data, len(ctx.fingerprint) == 3))
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


def _check_same_call(saved: tuple[Any, ...], now: tuple[Any, ...]) -> None:
    if saved[:2] != now[:2]:
        raise CheckpointError(
            "checkpoint: the recomputed output of fn has different metadata than during the forward pass "
            f"(forward: shape {saved[0]} dtype {saved[1]}; recomputed: shape {now[0]} dtype {now[1]}): fn depends "
            "on state that changed between the forward and the backward (a counter, a module attribute)"
        )
    if saved != now:
        raise CheckpointError(
            "checkpoint: the recomputed output of fn differs from the forward's (same shape and dtype, other "
            "values): fn depends on state that changed between the forward and the backward (a counter, a module "
            "attribute, a random source other than tinylearn's, numpy's and torch's generators), so its gradient "
            "would be that of a different call; make fn a function of its inputs, or pass determinism_check='none' "
            "to differentiate the recomputed call anyway"
        )


def checkpoint(
    fn: Callable[..., Tensor],
    *args: Any,
    use_reentrant: bool | None = None,
    preserve_rng_state: bool = True,
    determinism_check: str = "default",
) -> Tensor:
    """``fn(*args)`` without keeping its intermediate activations; recomputed during backward.

    ``use_reentrant`` is accepted for torch scripts (both of torch's variants give the same result here whenever
    the determinism check passes); ``determinism_check``: "default" (refuse a recomputation that differs from the
    forward, see the module docstring) or "none"."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if use_reentrant is not None and not isinstance(use_reentrant, (bool, np.bool_)):
        raise TypeError(f"use_reentrant: expected a bool or None, got {type(use_reentrant).__name__}")
    if not isinstance(preserve_rng_state, (bool, np.bool_)):
        raise TypeError(f"preserve_rng_state: expected a bool, got {type(preserve_rng_state).__name__}")
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check: expected 'default' or 'none', got {determinism_check!r}")
    if not is_grad_enabled():
        return fn(*args)
    # the anchor makes the node part of the graph even when no input requires grad (parameters inside fn do)
    anchor = Tensor(np.zeros((), np.float32), requires_grad=True)
    is_tensor = tuple(isinstance(a, Tensor) for a in args)
    return _Checkpoint.apply(
        anchor,
        *args,
        fn=fn,
        is_tensor=is_tensor,
        preserve_rng_state=bool(preserve_rng_state),
        check=determinism_check == "default",
    )


def checkpoint_sequential(
    modules: Sequence[Callable[[Tensor], Tensor]] | Any,
    segments: int,
    x: Tensor,
    preserve_rng_state: bool = True,
    use_reentrant: bool | None = None,
) -> Tensor:
    """Run ``modules`` (a Sequential or a list of layers) on x in ``segments`` chunks, all but the last
    checkpointed (torch.utils.checkpoint.checkpoint_sequential)."""
    if hasattr(modules, "children"):
        layers = list(modules.children())
    elif isinstance(modules, (list, tuple)):
        layers = list(modules)
    else:
        raise TypeError(f"modules: expected a Sequential or a list of layers, got {type(modules).__name__}")
    if not all(callable(m) for m in layers):
        raise TypeError("modules: every layer must be callable")
    if not layers:
        raise ValueError("modules: expected at least one layer")
    if not isinstance(segments, (int, np.integer)) or isinstance(segments, bool) or not 1 <= segments <= len(layers):
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
        x = checkpoint(
            run(layers[bounds[s] : bounds[s + 1]]),
            x,
            use_reentrant=use_reentrant,
            preserve_rng_state=preserve_rng_state,
        )
    return run(layers[bounds[-2] :])(x)
