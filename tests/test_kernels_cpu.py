"""Kernel versions (llm.c style): every version in cpp_src/kernels_*.cpp and every algorithmic variant in the numpy
reference is validated against torch; plus the accuracy of the vectorisable exp/erf the float32 kernels use."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tinylearn as tl
from tinylearn.kernels import reference
from tinylearn.testing import assert_close, make_array

C = pytest.importorskip("tinylearn._C").kernels


@pytest.mark.parametrize("version", ["three_pass", "online"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (4, 16), (5, 17), (2, 4099)])
def test_softmax_versions(version: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=1, low=-30, high=30)
    x[0, 0] = -np.inf
    assert_close(
        tl.kernels.softmax(x, backend="cpu", version=version), torch.softmax(torch.from_numpy(x), -1), "float32"
    )


@pytest.mark.parametrize("version", ["three_pass", "online"])
def test_softmax_versions_masked_and_nan(version: str) -> None:
    x = np.full((3, 40), -np.inf, np.float32)
    x[1, 5] = 2.0
    x[2, :] = 1.0
    x[2, 3] = np.nan
    y = C.softmax_forward(x, version)
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all()
    assert y[1, 5] == 1.0 and (np.delete(y[1], 5) == 0).all()


@pytest.mark.parametrize("version", ["two_pass", "welford"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (4, 16), (5, 17), (2, 4099)])
def test_layer_norm_versions(version: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=2, low=-2, high=6)
    w, b = make_array(shape[-1:], seed=3), make_array(shape[-1:], seed=4)
    y = tl.kernels.layer_norm(x, w, b, backend="cpu", version=version)
    expected = F.layer_norm(torch.from_numpy(x), w.shape, torch.from_numpy(w), torch.from_numpy(b))
    assert_close(y, expected, "float32", reduction_size=shape[-1])


def test_unknown_version_is_an_error() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="version"):
        C.softmax_forward(x, "four_pass")
    with pytest.raises(ValueError, match="version"):
        C.layer_norm_forward(x, np.ones(3, np.float32), np.zeros(3, np.float32), 1e-5, "sloppy")
    with pytest.raises(ValueError, match="weight/bias"):
        C.layer_norm_forward(x, np.ones(4, np.float32), np.zeros(4, np.float32), 1e-5, "two_pass")
    with pytest.raises(ValueError, match="incompatible shapes"):
        C.flash_attention_forward(
            np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 4), np.float32), np.zeros((1, 2, 4), np.float32), False, 16
        )


def test_exp_erf_approximations() -> None:
    x = np.linspace(-87, 88, 200_001, dtype=np.float32)
    e = np.exp(x.astype(np.float64))
    rel = np.abs(C.exp_approx(x).astype(np.float64) - e) / e
    assert rel.max() < 4e-7  # ~3 ulp
    special = np.array([-np.inf, -1e4, -100.0, 0.0, 100.0, np.inf, np.nan], np.float32)
    got = C.exp_approx(special)
    assert got[0] == 0 and got[1] == 0 and got[2] == 0 and got[3] == 1 and np.isinf(got[4]) and np.isinf(got[5])
    assert np.isnan(got[6])
    u = np.linspace(-6, 6, 10_001, dtype=np.float32)
    assert (
        np.abs(C.erf_approx(u) - np.array([math.erf(float(t)) for t in u])).max() < 5e-7
    )  # A&S 7.1.26: 1.5e-7 + fp32 rounding


def test_reference_online_softmax_and_welford() -> None:
    x = make_array((4, 37), seed=5, low=-10, high=10).astype(np.float64)
    for chunk in (1, 4, 37, 100):
        assert_close(reference.softmax_online(x, chunk), reference.softmax(x), "float64")
    mean, var = reference.welford_stats(x + 1e6, chunk=5)
    assert_close(mean, (x + 1e6).mean(axis=1), "float64")
    assert_close(var, x.var(axis=1), "float64", atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 7, 16, 64])
def test_reference_tiled_flash_matches_naive(causal: bool, block: int) -> None:
    q, k, v = (make_array((3, 23, 8), "float64", seed=6 + i) for i in range(3))
    o_ref, lse_ref = reference.attention(q, k, v, causal)
    o, lse = reference.flash_attention_tiled(q, k, v, causal, block)
    assert_close(o, o_ref, "float64")
    assert_close(lse, lse_ref, "float64")


@pytest.mark.parametrize("block", [1, 5, 16, 128])
def test_cpu_flash_block_sizes(block: int) -> None:
    q, k, v = (make_array((2, 3, 41, 16), seed=10 + i) for i in range(3))
    for causal in (False, True):
        o = tl.kernels.flash_attention(q, k, v, causal, block_size=block, backend="cpu")
        expected = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=causal)
        assert_close(o, expected, "float32")
