"""Reference answers: thin adapters over tinylearn.amp, tinylearn.autograd and tinylearn.memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tinylearn.amp import bf16_bits as _bf16_bits
from tinylearn.amp import update_scale as _update_scale
from tinylearn.autograd import checkpoint_sequential as _checkpoint_sequential
from tinylearn.memory import model_state_bytes as _model_state_bytes
from tinylearn.memory import transformer_memory


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return _bf16_bits(x)


def update_scale(
    scale: float, tracker: int, found_inf: bool, growth_factor: float, backoff_factor: float, growth_interval: int
) -> tuple[float, int]:
    s, t = _update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    return float(s), t


def checkpoint_sequential(layers: Sequence[Callable], segments: int, x):
    return _checkpoint_sequential(layers, segments, x)


def model_state_bytes(n_params: float, optimizer: str = "adam", mixed_precision: bool = True) -> float:
    return _model_state_bytes(n_params, optimizer, mixed_precision)


def activation_bytes(seq: int, batch: int, hidden: int, heads: int, layers: int) -> float:
    return transformer_memory(1, layers, hidden, heads, seq, batch)["activations"]
