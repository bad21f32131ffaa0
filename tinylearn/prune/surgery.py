"""Structured surgery: physically remove pruned channels so the model becomes a smaller *dense* model.

Model assumption: the leaf modules run as a chain in registration order (true for Sequential, DigitsMLP and
DigitsCNN). A *pair* is a producer (Conv2d / Linear) and the next consumer (Conv2d / Linear) with only
channel-wise layers in between (BatchNorm, ReLU/GELU/Sigmoid/Tanh, Max/AvgPool, Dropout, Identity, Flatten).

Invariant: dropping producer channel c is exact iff nothing from c reaches the consumer, i.e. the consumer's
input weights for c are zero (a zeroed filter alone is not enough: its bias and BatchNorm's beta still emit a
constant that the next layer sees). ``mask_channels`` therefore masks, per pair, the producer's filters
(``ln_structured(dim=0)``, L``n`` norm) *and* the consumer's input slice (``custom_from_mask``), so the masked
model and ``shrink(model)`` compute the same function (up to float summation order):

    producer.weight[keep], producer.bias[keep], BN.{weight,bias,running_mean,running_var}[keep],
    consumer.weight[:, keep]   (after Flatten: the columns c*S .. c*S+S-1 of each kept channel, S = spatial size)

The speedup is real because every tensor shrinks: conv FLOPs scale with C_out * C_in of each layer.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from ..nn.layers import (
    GELU,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    Identity,
    Linear,
    MaxPool2d,
    ReLU,
    Sigmoid,
    Tanh,
)
from ..nn.parameter import Parameter
from .functional import custom_from_mask, ln_structured, remove
from .methods import pruning_hooks

_PASS = (BatchNorm1d, BatchNorm2d, ReLU, GELU, Sigmoid, Tanh, MaxPool2d, AvgPool2d, Dropout, Identity, Flatten)


def _leaves(model: Any) -> list[Any]:
    return [m for m in model.modules() if not any(True for _ in m.children())]


def channel_pairs(model: Any) -> list[tuple[Any, list[Any], Any]]:
    """[(producer, modules in between, consumer)] for consecutive Conv/Linear layers of a chain model."""
    leaves = _leaves(model)
    pairs = []
    for i, m in enumerate(leaves):
        if not isinstance(m, Conv2d | Linear):
            continue
        between = []
        for nxt in leaves[i + 1 :]:
            if isinstance(nxt, Conv2d | Linear):
                if not any(isinstance(b, Conv2d) and b.groups != 1 for b in (m, nxt)):
                    pairs.append((m, between, nxt))
                break
            if not isinstance(nxt, _PASS):
                break
            between.append(nxt)
    return pairs


def _spatial(producer: Any, between: list[Any], consumer: Any) -> int:
    """Consumer input entries per producer channel (1, or H*W after a Flatten)."""
    c_out = producer.weight.shape[0]
    if isinstance(consumer, Linear) and any(isinstance(b, Flatten) for b in between):
        if consumer.weight.shape[1] % c_out:
            raise ValueError(f"consumer: in_features {consumer.weight.shape[1]} not a multiple of {c_out} channels")
        return consumer.weight.shape[1] // c_out
    if consumer.weight.shape[1] != c_out:
        raise ValueError(f"consumer: expects {consumer.weight.shape[1]} input channels, producer gives {c_out}")
    return 1


def _consumer_cols(keep: np.ndarray, spatial: int) -> np.ndarray:
    return (keep[:, None] * spatial + np.arange(spatial)[None, :]).reshape(-1)


def mask_channels(model: Any, amount: Any, n: Any = 2, pairs: list[tuple[Any, list[Any], Any]] | None = None) -> Any:
    """Prune ``amount`` output channels of every producer (by L``n`` filter norm) and mask the consumer inputs."""
    pairs = channel_pairs(model) if pairs is None else pairs
    if not pairs:
        raise ValueError(f"model: no consecutive Conv/Linear pairs found in {type(model).__name__}")
    for producer, between, consumer in pairs:
        ln_structured(producer, "weight", amount, n=n, dim=0)
        keep = kept_channels(producer)
        if producer.bias is not None:
            bias_mask = np.zeros(producer.bias.shape, dtype=producer.bias.data.dtype)
            bias_mask[keep] = 1
            custom_from_mask(producer, "bias", bias_mask)
        spatial = _spatial(producer, between, consumer)
        cmask = np.zeros(consumer.weight.shape, dtype=consumer.weight.data.dtype)
        cmask[:, _consumer_cols(keep, spatial)] = 1
        custom_from_mask(consumer, "weight", cmask)
    return model


def kept_channels(producer: Any) -> np.ndarray:
    """Output channels whose effective filter is not entirely zero (from the mask if pruned)."""
    w = producer.weight_mask.data if hasattr(producer, "weight_mask") else producer.weight.data
    return np.flatnonzero(np.abs(w.reshape(w.shape[0], -1)).sum(axis=1) != 0)


def _set_param(module: Any, name: str, arr: np.ndarray) -> None:
    p = module._parameters[name]
    module._parameters[name] = Parameter(np.ascontiguousarray(arr), requires_grad=p.requires_grad)


def shrink(model: Any, strict: bool = True) -> Any:
    """A smaller dense copy of ``model`` without the pruned channels; pruning hooks are baked in (removed).

    strict=True raises ValueError if a dropped channel still feeds its consumer (non-zero consumer weights):
    then the result would not compute the same function.
    """
    new = copy.deepcopy(model)
    pairs = channel_pairs(new)
    plans = [(p, b, c, kept_channels(p)) for p, b, c in pairs]
    for m in new.modules():
        for h in list(pruning_hooks(m)):
            remove(m, h._tensor_name)
    for producer, between, consumer, keep in plans:
        c_out = producer.weight.shape[0]
        if len(keep) == c_out:
            continue
        if len(keep) == 0:
            raise ValueError(f"producer: every output channel of {producer!r} is pruned; nothing would remain")
        spatial = _spatial(producer, between, consumer)
        cols = _consumer_cols(keep, spatial)
        dropped = np.setdiff1d(np.arange(consumer.weight.shape[1]), cols)
        if strict and np.any(consumer.weight.data[:, dropped] != 0):
            raise ValueError(
                f"model: {c_out - len(keep)} dropped channels of {type(producer).__name__} still feed "
                f"{type(consumer).__name__} (non-zero input weights); use mask_channels first or strict=False"
            )
        _set_param(producer, "weight", producer.weight.data[keep])
        if producer.bias is not None:
            _set_param(producer, "bias", producer.bias.data[keep])
        if isinstance(producer, Conv2d):
            producer.out_channels = len(keep)
        else:
            producer.out_features = len(keep)
        for b in between:
            if isinstance(b, BatchNorm1d | BatchNorm2d):
                for k in ("weight", "bias"):
                    if b._parameters.get(k) is not None:
                        _set_param(b, k, b._parameters[k].data[keep])
                for k in ("running_mean", "running_var"):
                    if b._buffers.get(k) is not None:
                        b._buffers[k] = Tensor(np.ascontiguousarray(b._buffers[k].data[keep]))
                b.num_features = len(keep)
        _set_param(consumer, "weight", consumer.weight.data[:, cols])
        if isinstance(consumer, Conv2d):
            consumer.in_channels = len(keep)
        else:
            consumer.in_features = len(cols)
    return new


def count_parameters(model: Any) -> int:
    return sum(p.data.size for p in model.parameters())
