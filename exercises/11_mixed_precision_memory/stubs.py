"""Exercises for notebooks/11_mixed_precision_memory: bf16 rounding, the loss-scale update rule,
checkpoint_sequential and the training-memory formula.

Run ``pytest exercises/11_mixed_precision_memory`` (your code) or ``--impl=reference`` (tinylearn's answers).
Reference solutions: tinylearn/amp/bf16.py:bf16_bits, tinylearn/amp/grad_scaler.py:update_scale,
tinylearn/autograd/checkpoint.py:checkpoint_sequential, tinylearn/memory/estimate.py:model_state_bytes and
transformer_memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns of the float32 array ``x``, rounded to nearest, ties to even.

    Hint: view the float32 as uint32, add 0x7FFF + (bit 16 of it), shift right by 16. NaN -> 0x7FC0.
    Example: bf16_bits(np.float32([1.0, 1 + 2**-8, 1 + 3 * 2**-8])) == [0x3F80, 0x3F80, 0x3F82].
    (reference: tinylearn/amp/bf16.py:bf16_bits)"""
    raise NotImplementedError


def update_scale(
    scale: float, tracker: int, found_inf: bool, growth_factor: float, backoff_factor: float, growth_interval: int
) -> tuple[float, int]:
    """One GradScaler.update(): returns (new_scale, new_tracker).

    Inf/NaN found: scale * backoff_factor, tracker 0. Otherwise tracker + 1; when it reaches growth_interval
    the scale grows by growth_factor (only if the result is finite) and the tracker resets to 0. Keep the scale
    a float32, as torch does. (reference: tinylearn/amp/grad_scaler.py:update_scale)"""
    raise NotImplementedError


def checkpoint_sequential(layers: Sequence[Callable], segments: int, x):
    """Run ``layers`` on x in ``segments`` chunks of len(layers) // segments layers (the last takes the rest);
    wrap every chunk but the last in ``tinylearn.autograd.checkpoint(fn, h)``. Same result and gradients as
    running the layers in order. (reference: tinylearn/autograd/checkpoint.py:checkpoint_sequential)"""
    raise NotImplementedError


def model_state_bytes(n_params: float, optimizer: str = "adam", mixed_precision: bool = True) -> float:
    """Bytes of params + grads + optimizer states: fp32 = 4 + 4 + states; mixed precision = 2 + 2 (16-bit
    params/grads) + 4 (fp32 master) + states; states: adam 8, sgd_momentum 4, sgd 0 bytes per parameter.
    (reference: tinylearn/memory/estimate.py:model_state_bytes)"""
    raise NotImplementedError


def activation_bytes(seq: int, batch: int, hidden: int, heads: int, layers: int) -> float:
    """Activation bytes of a transformer without recomputation (16-bit activations, Korthikanti et al. 2022):
    layers * s * b * h * (34 + 5 * a * s / h). (reference: tinylearn/memory/estimate.py:transformer_memory)"""
    raise NotImplementedError
