"""Weight initialisers (in place, drawing from tinylearn's seeded generator, ``tl.manual_seed``).

torch's defaults for Linear/Conv2d: kaiming_uniform_(a=sqrt(5)) gives weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
kaiming (He): std = gain / sqrt(fan), gain = sqrt(2 / (1 + a^2)); uniform bound = sqrt(3) * std.
xavier (Glorot): std = gain * sqrt(2 / (fan_in + fan_out)).
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd.factory import get_rng
from ..autograd.tensor import Tensor


def fan_in_out(t: Tensor) -> tuple[int, int]:
    shp = t.shape
    if len(shp) < 2:
        raise ValueError(f"tensor: fan in/out needs >= 2 dims, got shape {shp}")
    receptive = int(np.prod(shp[2:])) if len(shp) > 2 else 1
    return shp[1] * receptive, shp[0] * receptive


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    t.data[...] = get_rng().uniform(a, b, size=t.shape)
    return t


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    t.data[...] = get_rng().normal(mean, std, size=t.shape)
    return t


def zeros_(t: Tensor) -> Tensor:
    t.data[...] = 0
    return t


def ones_(t: Tensor) -> Tensor:
    t.data[...] = 1
    return t


def constant_(t: Tensor, value: float) -> Tensor:
    t.data[...] = value
    return t


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in") -> Tensor:
    fi, fo = fan_in_out(t)
    fan = fi if mode == "fan_in" else fo
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(fan)
    return uniform_(t, -bound, bound)


def kaiming_normal_(t: Tensor, a: float = 0.0, mode: str = "fan_in") -> Tensor:
    fi, fo = fan_in_out(t)
    fan = fi if mode == "fan_in" else fo
    return normal_(t, 0.0, math.sqrt(2.0 / (1 + a * a)) / math.sqrt(fan))


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    fi, fo = fan_in_out(t)
    bound = gain * math.sqrt(6.0 / (fi + fo))
    return uniform_(t, -bound, bound)


def reset_weight_and_bias_(weight: Tensor, bias: Tensor | None) -> None:
    """torch's default init of Linear and the conv layers: kaiming_uniform_(weight, a=sqrt(5)), then the bias
    uniform in +-1/sqrt(fan_in), fan_in = the product of the weight's dims after the first (0 bound when empty)."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = int(np.prod(weight.shape[1:]))
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        uniform_(bias, -bound, bound)
