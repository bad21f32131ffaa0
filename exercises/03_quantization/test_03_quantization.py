"""Tests for exercises/03_quantization (run on stubs.py by default, on tinylearn with --impl=reference)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated.*")


@pytest.mark.parametrize("qrange, tdt", [((-128, 127), torch.qint8), ((0, 255), torch.quint8), ((-8, 7), torch.qint8)])
@pytest.mark.parametrize("symmetric", [False, True])
def test_calculate_qparams(impl, qrange, tdt, symmetric):
    rng = np.random.default_rng(0)
    kw = {} if qrange in ((-128, 127), (0, 255)) else {"quant_min": qrange[0], "quant_max": qrange[1]}
    qs = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    for _ in range(20):
        x = (rng.standard_normal(50) * rng.uniform(0.01, 4) + rng.uniform(-2, 2)).astype(np.float32)
        obs = torch.ao.quantization.MinMaxObserver(dtype=tdt, qscheme=qs, **kw)
        obs(torch.from_numpy(x))
        ts, tz = obs.calculate_qparams()
        s, z = impl.calculate_qparams(float(x.min()), float(x.max()), *qrange, symmetric=symmetric)
        assert np.float32(s) == ts.item() and int(z) == tz.item()


def test_quantize_dequantize(impl):
    rng = np.random.default_rng(1)
    for _ in range(20):
        s = np.float32(rng.uniform(0.01, 0.5))
        z = int(rng.integers(-10, 10))
        k = rng.integers(-200, 200, 400).astype(np.float32) + np.float32(0.5) * rng.integers(0, 2, 400)
        x = (k * s).astype(np.float32)  # many exact ties
        ref = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, torch.qint8)
        q = impl.quantize(x, float(s), z, -128, 127)
        np.testing.assert_array_equal(np.asarray(q), ref.int_repr().numpy().astype(np.int64))
        np.testing.assert_array_equal(impl.dequantize(np.asarray(q), float(s), z), ref.dequantize().numpy())


def test_ste_backward(impl):
    rng = np.random.default_rng(2)
    x = rng.uniform(-3, 3, (8, 16)).astype(np.float32)
    g = rng.standard_normal((8, 16)).astype(np.float32)
    for s, z, lo, hi in ((0.02, 0, -128, 127), (0.1, 3, -8, 7), (0.01, 128, 0, 255)):
        tx = torch.from_numpy(x.copy()).requires_grad_()
        torch.fake_quantize_per_tensor_affine(tx, s, z, lo, hi).backward(torch.from_numpy(g))
        np.testing.assert_array_equal(impl.fake_quantize_backward(x, s, z, lo, hi, g), tx.grad.numpy())


def test_kl_threshold(impl):
    rng = np.random.default_rng(3)
    x = np.abs(rng.standard_normal(50_000))
    x[:20] *= 30  # a few outliers stretch amax
    hist, edges = np.histogram(x, bins=512, range=(0, x.max()))
    t = impl.kl_threshold(hist.astype(np.float64), edges, 128)
    assert t in edges and t < x.max() / 2  # clips the outliers, lands on a bin edge
    # uniform mass in the first 200 bins: keeping all of them costs nothing, so the threshold is edges[200]
    h = np.zeros(512)
    h[:200] = 5.0
    e = np.arange(513, dtype=np.float64)
    assert impl.kl_threshold(h, e, 128) == 200.0


def test_fp8_e4m3_encode(impl):
    rng = np.random.default_rng(4)
    high = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)
    rand = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array(
        [
            0.0,
            -0.0,
            448,
            464,
            464.1,
            500,
            np.inf,
            -np.inf,
            np.nan,
            1.9375,
            2.0**-9,
            2.0**-10,
            3 * 2.0**-11,
            2.0**-6 - 2.0**-10,
        ],
        np.float32,
    )
    for x in (edges, high, rand):
        ref = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        np.testing.assert_array_equal(np.asarray(impl.fp8_e4m3_encode(x), np.uint8), ref)


def test_int4_packing(impl):
    p = impl.pack_int4(np.array([1, -1, -8, 7, 3], np.int8))
    np.testing.assert_array_equal(p, np.array([0xF1, 0x78, 0x03], np.uint8))
    rng = np.random.default_rng(5)
    for n in (1, 2, 9, 100):
        q = rng.integers(-8, 8, n).astype(np.int8)
        np.testing.assert_array_equal(impl.unpack_int4(impl.pack_int4(q), n), q)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (4, 7, 3), (16, 64, 10)])
def test_winograd_matmul(impl, m, k, n):
    rng = np.random.default_rng(m + k + n)
    a = rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, n))
    a[0] = -128  # a + b reaches -256
    b[:, 0] = -128
    got = np.asarray(impl.winograd_matmul(a, b))
    assert got.shape == (m, n)
    np.testing.assert_array_equal(got, (torch.from_numpy(a) @ torch.from_numpy(b)).numpy())


@pytest.mark.parametrize("m, k, n", [(2, 2, 2), (4, 8, 6), (16, 64, 10)])
def test_strassen_matmul(impl, m, k, n):
    rng = np.random.default_rng(m * k + n)
    a = rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, n))
    a[: m // 2, : k // 2] = -128  # every block differs: a wrong sign or block cannot cancel out
    b[k // 2 :, n // 2 :] = 127
    got = np.asarray(impl.strassen_matmul(a, b))
    assert got.shape == (m, n)
    np.testing.assert_array_equal(got, (torch.from_numpy(a) @ torch.from_numpy(b)).numpy())
