"""Tests for exercises/11_mixed_precision_memory (run with --impl=reference to check tinylearn's answers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl


def test_bf16_bits(impl) -> None:
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 0.0, np.inf], np.float32)
    np.testing.assert_array_equal(impl.bf16_bits(x), [0x3F80, 0x3F80, 0x3F82, 0xC020, 0, 0x7F80])
    assert impl.bf16_bits(np.array([np.nan], np.float32))[0] == 0x7FC0
    r = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e4
    ref = torch.from_numpy(r).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(impl.bf16_bits(r), ref)


def test_update_scale(impl) -> None:
    s, t = 65536.0, 0
    seq = []
    for bad in [False, False, True, False, False, False]:
        s, t = impl.update_scale(s, t, bad, 2.0, 0.5, 2)
        seq.append((float(s), t))
    assert seq == [(65536.0, 1), (131072.0, 0), (65536.0, 0), (65536.0, 1), (131072.0, 0), (131072.0, 1)]
    big = float(np.finfo(np.float32).max)
    assert impl.update_scale(big, 0, False, 2.0, 0.5, 1) == (big, 0)  # growth to Inf is refused


def test_checkpoint_sequential(impl) -> None:
    nn = tl.nn
    tl.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.Tanh() if hasattr(nn, "Tanh") else nn.GELU(), nn.Linear(16, 16), nn.ReLU()]
    layers += [nn.Linear(16, 2)]
    x = tl.randn(4, 8, requires_grad=True)
    h = x
    for m in layers:
        h = m(h)
    h.sum().backward()
    ref = [p.grad.data.copy() for m in layers for p in m.parameters()] + [x.grad.data.copy()]
    for m in layers:
        m.zero_grad()
    x.grad = None
    tl.autograd.reset_recompute_count()
    y = impl.checkpoint_sequential(layers, 3, x)
    y.sum().backward()
    np.testing.assert_array_equal(y.data, h.data)
    got = [p.grad.data for m in layers for p in m.parameters()] + [x.grad.data]
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    assert tl.autograd.recompute_count() == 2  # two checkpointed segments, each recomputed once


def test_model_state_bytes(impl) -> None:
    assert impl.model_state_bytes(7e9, "adam", True) == 16 * 7e9  # ZeRO paper's 16 bytes per parameter
    assert impl.model_state_bytes(1e9, "adam", False) == 16e9
    assert impl.model_state_bytes(1e9, "sgd", False) == 8e9
    assert impl.model_state_bytes(1e9, "sgd_momentum", True) == 12e9


def test_activation_bytes(impl) -> None:
    s, b, h, a, layers = 2048, 1, 4096, 32, 32
    assert impl.activation_bytes(s, b, h, a, layers) == pytest.approx(layers * s * b * h * (34 + 5 * a * s / h))
    assert impl.activation_bytes(1024, 2, 512, 8, 4) == pytest.approx(4 * 1024 * 2 * 512 * (34 + 5 * 8 * 1024 / 512))
