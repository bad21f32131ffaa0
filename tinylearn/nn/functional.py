"""``tinylearn.nn.functional`` (import as F): stateless ops used by the layers.

Activations and softmax are Tensor methods (VJPs in tinylearn/autograd/ops_*.py); linear, losses, norms,
dropout and embedding are fused Functions here and in functional_loss.py / functional_norm.py.
conv2d / max_pool2d / avg_pool2d are the im2col autograd Functions of tinylearn.conv (tinylearn/conv/functional.py);
nn.MaxPool2d runs max pooling through a direct C++ kernel in the common case (functional_pool.py).

    dropout (training)   y = x * m / (1 - p),  m ~ Bernoulli(1 - p)       dx = g * m / (1 - p)
    embedding            y = W[idx]                                       dW = scatter-add of g into rows idx
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import factory as _factory
from ..autograd.function import Function
from ..autograd.linalg import Linear as _LinearFn
from ..autograd.tensor import Tensor
from ..conv.functional import avg_pool2d, conv2d, max_pool2d  # noqa: F401  (im2col implementation)
from .functional_act import *  # noqa: F403  (activations, one_hot)
from .functional_extra import *  # noqa: F403  (more losses, sdpa, group_norm, pad, torch's cross_entropy)
from .functional_extra import cross_entropy
from .functional_loss import mse_loss
from .functional_norm import batch_norm, layer_norm
from .functional_spatial import *  # noqa: F403  (conv1d/3d, conv_transpose, 1d/3d/adaptive pools, interpolate)


def relu(x: Tensor) -> Tensor:
    return x.relu()


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return x.gelu(approximate=approximate)


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.softmax(dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.log_softmax(dim)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x @ weight.T + bias (weight [out, in], like torch)."""
    return _LinearFn.apply(x, weight, bias)


class DropoutFn(Function):
    @staticmethod
    def forward(ctx, x, mask=None, scale=1.0):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask * x.dtype.type(scale)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask * g.dtype.type(ctx.scale)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p and scale the rest by 1/(1-p); identity in eval."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p: dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    mask = _factory.get_rng().random(x.shape) >= p
    return DropoutFn.apply(x, mask=mask, scale=1.0 / (1.0 - p))


class EmbeddingFn(Function):
    @staticmethod
    def forward(ctx, weight, idx):
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
        n = weight.shape[0]
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise ValueError(
                f"embedding: index {int(idx[bad][0])} is out of range [0, {n}) (weight shape {weight.shape})"
            )
        ctx.save_for_backward(idx)
        ctx.wshape = weight.shape
        return weight[idx]

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        gw = np.zeros(ctx.wshape, dtype=g.dtype)
        np.add.at(gw, idx.reshape(-1), g.reshape(-1, ctx.wshape[1]))
        return gw, None


def embedding(idx: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` [num_embeddings, dim] selected by integer ``idx`` (any shape)."""
    if isinstance(idx, Tensor):
        idx = idx.data
    return EmbeddingFn.apply(weight, idx)


__all__ = [
    "relu",
    "gelu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "linear",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "batch_norm",
    "layer_norm",
    "dropout",
    "embedding",
    "cross_entropy",
    "mse_loss",
]
