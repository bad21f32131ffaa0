"""Deformable conv (bilinear-sampled im2col + GEMM) against a direct loop and, with zero offsets, plain conv."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tinylearn as tl
from tinylearn.conv import deformable as dc


def _case(seed=0, N=2, C=3, H=7, W=6, OC=4, k=3, s=1, p=1, d=1, scale=1.5, masked=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W))
    w = rng.standard_normal((OC, C, k, k))
    b = rng.standard_normal(OC)
    oh = (H + 2 * p - d * (k - 1) - 1) // s + 1
    ow = (W + 2 * p - d * (k - 1) - 1) // s + 1
    off = scale * rng.standard_normal((N, 2 * k * k, oh, ow))
    mask = rng.random((N, k * k, oh, ow)) if masked else None
    return x, w, b, off, mask


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(s=2, p=0), dict(d=2, p=2), dict(scale=4.0), dict(masked=True), dict(k=1, p=0), dict(scale=0.3)],
)
def test_matches_direct_loop(kw):
    s, p, d = kw.get("s", 1), kw.get("p", 1), kw.get("d", 1)
    x, w, b, off, mask = _case(**kw)
    ours = dc.deform_conv2d(x, off, w, b, s, p, d, mask=mask)
    ref = dc.deform_conv2d_direct(x, off, w, b, s, p, d, mask=mask)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


def test_zero_offsets_equal_conv2d():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    off = np.zeros((2, 18, 5, 4), np.float32)  # stride 2, padding 1
    cols = dc.deform_im2col(x, off, 3, 2, 1)
    assert np.array_equal(cols, tl.conv.im2col(x, 3, 2, 1))  # bit-exact: bilinear weights are (1, 0, 0, 0)
    tl.testing.assert_close(dc.deform_conv2d(x, off, w, b, 2, 1), F.conv2d(*map(torch.from_numpy, (x, w, b)), 2, 1))


def test_integer_offsets_shift_the_window():
    # an offset of (+1, 0) on every tap reads the image one row lower: conv2d of the up-shifted input
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 8, 8))
    w = rng.standard_normal((3, 2, 3, 3))
    off = np.zeros((1, 18, 6, 6))
    off[:, 0::2] = 1.0
    shifted = np.zeros_like(x)
    shifted[:, :, :-1] = x[:, :, 1:]
    ref = F.conv2d(torch.from_numpy(shifted), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(dc.deform_conv2d(x, off, w), ref, atol=1e-12)


def test_noncontiguous_inputs():
    x, w, b, off, _ = _case(seed=5)
    xt = np.asfortranarray(x)
    offt = np.ascontiguousarray(off.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    np.testing.assert_allclose(
        dc.deform_conv2d(xt, offt, w[:, ::1], b, 1, 1), dc.deform_conv2d(x, off, w, b, 1, 1), atol=1e-12
    )


def test_far_offsets_read_zero():
    x, w, _, off, _ = _case(seed=6)
    assert np.all(dc.deform_conv2d(x, np.full_like(off, 100.0), w, None, 1, 1) == 0)


def test_bad_inputs():
    x, w, b, off, _ = _case()
    with pytest.raises(ValueError, match="offset"):
        dc.deform_conv2d(x, off[:, :10], w, b, 1, 1)
    with pytest.raises(ValueError, match="offset"):
        bad = off.copy()
        bad[0, 0, 0, 0] = np.nan
        dc.deform_conv2d(x, bad, w, b, 1, 1)
    with pytest.raises(ValueError, match="mask"):
        dc.deform_conv2d(x, off, w, b, 1, 1, mask=np.ones((2, 8, 7, 6)))
    with pytest.raises(ValueError, match="weight"):
        dc.deform_conv2d(x, off, w[:, :2], b, 1, 1)
    with pytest.raises(ValueError, match="bias"):
        dc.deform_conv2d(x, off, w, b[:2], 1, 1)
    with pytest.raises(ValueError, match="x"):
        dc.deform_conv2d(x[0], off, w, b, 1, 1)
    with pytest.raises(TypeError, match="x"):
        dc.deform_im2col(x.astype(np.int64), off, 3, 1, 1)


def test_footprint_zero_offsets_and_spread():
    off0 = np.zeros((1, 18, 16, 16))
    f0 = dc.sampling_footprint(off0, (16, 16), 3, 1, 1, tile=(4, 4))
    # interior 4x4 tile of a 3x3 conv reads a 6x6 patch; border tiles fewer (padding is not read)
    assert f0["samples"] == 144 and f0["distinct"] <= 36
    off = 3.0 * np.random.default_rng(0).standard_normal(off0.shape)
    f1 = dc.sampling_footprint(off, (16, 16), 3, 1, 1, tile=(4, 4))
    assert f1["distinct"] > f0["distinct"] and f1["reuse"] < f0["reuse"]
