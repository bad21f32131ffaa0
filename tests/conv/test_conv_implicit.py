"""The cpp conv2d forward ladder (v0/v1 = im2col rung + OpenBLAS, v2 = implicit GEMM on the project's packed
micro-kernels) and the v2 backward (dX as a convolution for stride 1) vs torch, at every CPU level."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _conv_cases import conv_case, pinned

import tinylearn as tl
from tinylearn.conv import cpp_available
from tinylearn.conv.conv2d import FWD_VERSIONS, _direct
from tinylearn.cpu import LEVELS, detected_features
from tinylearn.testing import assert_close, make_layouts

pytestmark = pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")


def _supported_levels() -> list[str]:
    have = set(detected_features()) if cpp_available() else set()
    ok = {"scalar": True, "avx2": {"avx2", "fma"} <= have, "avx512": "avx512f" in have}
    return [lv for lv in LEVELS if ok[lv]]


@pytest.fixture(params=_supported_levels())
def level(request, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", request.param)
    return request.param


# (N, C, H, W, OC, kernel, stride, padding, dilation, groups)
CASES = [
    (2, 4, 9, 7, 6, 3, 1, 1, 1, 1),
    (3, 5, 14, 14, 13, 3, 1, 1, 1, 1),  # 14x14 = 196 columns: panels span two images; OC not a multiple of MR
    (2, 4, 9, 7, 6, (2, 3), (2, 1), (1, 0), (1, 2), 2),
    (3, 6, 8, 8, 6, 3, 1, 1, 1, 6),  # depthwise
    (2, 4, 8, 8, 8, 3, 2, 1, 1, 4),  # channel multiplier 2, stride 2
    (2, 4, 5, 6, 8, 1, 1, 0, 1, 1),  # pointwise
    (1, 3, 15, 15, 4, 7, 2, 3, 1, 1),  # 7x7/2 stem
    (2, 3, 9, 8, 4, 3, 3, 2, 2, 1),  # stride 3 with dilation: the generic-stride gather
    (2, 3, 6, 7, 4, 3, 1, 3, 1, 1),  # padding 3 > k-1: the dX convolution crops
    (2, 3, 7, 6, 5, 3, 1, 2, 2, 1),  # dilation 2, stride 1: dX conv with dilated flipped kernel
    (2, 300, 5, 4, 7, 1, 1, 0, 1, 1),  # K = 300 > 256: two balanced K blocks
    (1, 2, 2, 3, 3, 2, 1, 0, 1, 1),  # tiny output (2x2 map): one panel spans both images... and more
    (2, 5, 11, 45, 7, 3, 1, 2, 2, 1),  # 45-wide rows: segments cross panels (the AVX-512 packer's masks)
    (2, 4, 7, 9, 6, (2, 3), 1, (1, 2), (2, 1), 2),  # stride 1, 2x3 kernel, groups: dX reads W flipped per group
    # v3 direct (C, OC multiples of 16, stride 1): 48 = a pair of 16-channel blocks + a single one; OW 13 (one
    # 13-wide tile) and, in dX, 16-wide rows cut 8 + 8; 5x3 kernel with padding 2 / 1
    (2, 32, 10, 13, 48, 3, 1, 1, 1, 1),
    (1, 16, 7, 30, 32, (5, 3), 1, (2, 1), 1, 1),
    (2, 16, 60, 9, 16, 3, 1, 1, 1, 1),  # OW 9: dW chunks of 28 output rows, the last one 4 (dW sums 1080 > 1k terms)
    (2, 8, 9, 11, 24, 3, 1, 1, 1, 1),  # AVX2 v3 only (8-channel blocks): 24 = a pair + a single block, OW 11 = 6 + 5
    (1, 24, 6, 13, 8, 3, 1, 1, 1, 1),
    # v3 small-C forward (no channel block divides C, one divides OC; column stride 1 or 2): the stem at 32 output
    # channels (a pair of 16-blocks on AVX-512, 4 blocks of 8 on AVX2), OW 12 = one tile / 6 + 6
    (2, 3, 23, 24, 32, 7, 2, 3, 1, 1),
    (1, 1, 8, 9, 8, 3, 1, 1, 1, 1),  # the digits CNN's first layer: 8 output channels (the AVX2 build on AVX-512)
    (2, 5, 11, 10, 24, (3, 5), (2, 1), (2, 1), 1, 1),  # row stride 2: a pair of 8-blocks + a single one
    (1, 3, 9, 40, 16, 3, (1, 2), (0, 1), 1, 1),  # column stride 2 only, OW 20 = 10 + 10 / 4 x 5
    (1, 3, 6, 7, 16, 2, 3, 0, 1, 1),  # column stride 3: v2
    (1, 16, 7, 8, 3, 3, 1, 1, 1, 1),  # forward on v2; dX = the flipped conv 3 -> 16: the small-C kernel, flip_weight
]
# the cases v3's direct kernels may cover (fp32; C and OC multiples of 16 on AVX-512, of 8 on AVX2)
DIRECT = [c for c in CASES if c[1] % 8 == 0 and c[4] % 8 == 0 and c[6] == 1 and c[8] == 1 and c[9] == 1]


def _direct_here(level: str, C: int, OC: int) -> bool:
    # on avx512, channel counts that 16 does not divide but 8 does take the AVX2 build (8-channel blocks)
    return level in ("avx2", "avx512") and C % 8 == 0 and OC % 8 == 0


def _torch(x, w, b, s, p, d, g, gy):
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.conv2d(tx, tw, tb, s, p, d, g)
    y.backward(torch.from_numpy(gy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()


@pytest.mark.parametrize("version", FWD_VERSIONS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ladder_vs_torch(level, version, case, dtype):
    x, w, b, s, p, d, g = conv_case(case, dtype)
    y, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp", version=version)
    assert y.shape[:2] == (x.shape[0], w.shape[0]) and y.dtype == np.dtype(dtype) and y.flags.c_contiguous
    gy = np.random.default_rng(3).standard_normal(y.shape).astype(dtype)
    ey, edx, edw, edb = _torch(x, w, b, s, p, d, g, gy)
    K = w.shape[1] * w.shape[2] * w.shape[3]
    assert_close(y, ey, dtype, reduction_size=K, msg=f"{level} {version}")
    if version in ("v2", "v3"):
        assert cols is None  # the implicit GEMM / direct kernel builds no column matrix
    dx, dw, db = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, backend="cpp", cols=cols, version=version)
    red = gy.size // gy.shape[1]
    assert_close(dx, edx, dtype, reduction_size=w.shape[0] // g * w.shape[2] * w.shape[3], msg=f"{level} dx")
    assert_close(dw, edw, dtype, reduction_size=red, msg=f"{level} dw")
    assert_close(db, edb, dtype, reduction_size=red, msg=f"{level} db")


@pytest.mark.parametrize("case", DIRECT)
def test_v3_direct_runs_where_it_applies_and_matches_v2(level, case):
    """v3 takes the direct kernels exactly where its channel block (16 on avx512, 8 on avx2) divides C and OC
    (forward, the flipped dX conv, dW),
    and agrees with v2 and torch (a different summation order: close, not bitwise)."""
    x, w, b, s, p, d, g = conv_case(case, "float32")
    C = tl.backends.load_C("conv")
    k = (w.shape[2], w.shape[3])
    assert C.direct_block() == {"avx512": 16, "avx2": 8, "scalar": 0}[level]
    assert C.direct_eligible(x.shape[1], w.shape[0], k, (1, 1), (1, 1), 1) == _direct_here(
        level, x.shape[1], w.shape[0]
    )
    assert C.direct_eligible(w.shape[0], x.shape[1], k, (1, 1), (1, 1), 1) == _direct_here(
        level, w.shape[0], x.shape[1]
    )
    assert not C.direct_eligible(x.shape[1], w.shape[0], (1, 1), (1, 1), (1, 1), 1)  # 1x1 stays on v2
    # version None routes fp32 layers v3 covers to it at any size (small layers otherwise take v1: im2col + BLAS)
    assert _direct(None, None, x, x.shape[1], w.shape[0], k, (1, 1), (1, 1), 1) == _direct_here(
        level, x.shape[1], w.shape[0]
    )
    assert not _direct(None, None, x.astype(np.float64), x.shape[1], w.shape[0], k, (1, 1), (1, 1), 1)
    assert not C.direct_eligible(x.shape[1], w.shape[0], k, (2, 2), (1, 1), 1)
    y3, _ = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp", version="v3")
    y2, _ = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp", version="v2")
    K = w.shape[1] * k[0] * k[1]
    assert_close(y3, y2, reduction_size=K)
    gy = np.random.default_rng(4).standard_normal(y3.shape).astype(np.float32)
    dx3, dw3, _ = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, backend="cpp", version="v3", needs=(True, True, False))
    dx2, dw2, _ = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, backend="cpp", version="v2", needs=(True, True, False))
    assert_close(dx3, dx2, reduction_size=w.shape[0] * k[0] * k[1])
    assert_close(dw3, dw2, reduction_size=gy.size // gy.shape[1])
    ew = torch.nn.grad.conv2d_weight(torch.from_numpy(x), w.shape, torch.from_numpy(gy), s, p, d, g).numpy()
    assert_close(dw3, ew, reduction_size=gy.size // gy.shape[1])


def _small_c_here(level: str, C: int, OC: int, k: tuple, s: tuple, d: tuple, g: int) -> bool:
    return (
        level in ("avx2", "avx512")
        and C % 8 != 0
        and OC % 8 == 0
        and k[0] * k[1] > 1
        and s[1] <= 2
        and d == (1, 1)
        and g == 1
    )


SMALL_C = [
    c for c in CASES if c[9] == 1 and c[8] == 1 and ((c[1] % 8 and c[4] % 8 == 0) or (c[4] % 8 and c[1] % 8 == 0))
]


@pytest.mark.parametrize("case", SMALL_C)
def test_v3_small_c_forward_where_it_applies(level, case):
    """The small-C forward (a planar input: the 3-channel stem, strided) serves the forward where no channel block
    divides C and one divides OC (column stride <= 2), and the flipped dX conv of a stride-1 layer whose OC is
    such a count; it agrees with torch in fp64 to the fp32 tolerance."""
    x, w, b, s, p, d, g = conv_case(case, "float32")
    C = tl.backends.load_C("conv")
    k = (w.shape[2], w.shape[3])
    s2 = (s, s) if isinstance(s, int) else s
    Ci, OC = x.shape[1], w.shape[0]
    assert C.direct_forward_eligible(Ci, OC, k, s2, (1, 1), 1) == _small_c_here(level, Ci, OC, k, s2, (1, 1), 1)
    assert not C.direct_eligible(Ci, OC, k, s2, (1, 1), 1)  # dW keeps the channel-blocked rule
    assert _direct(None, None, x, Ci, OC, k, s2, (1, 1), 1) == _small_c_here(level, Ci, OC, k, s2, (1, 1), 1)
    assert not _direct(None, None, x, Ci, OC, k, s2, (1, 1), 1, forward=False)
    assert not C.direct_forward_eligible(Ci, OC, (1, 1), s2, (1, 1), 1)  # 1x1 stays on v2
    assert not C.direct_forward_eligible(Ci, OC, k, s2, (2, 2), 1)  # dilation: v2
    y3 = C.conv2d_forward(x, w, b, s2, p if isinstance(p, tuple) else (p, p), (1, 1), 1, version="v3")
    ey = F.conv2d(*(torch.from_numpy(a).double() for a in (x, w, b)), s, p).numpy()
    assert_close(y3, ey, np.float32, reduction_size=Ci * k[0] * k[1])
    assert_close(
        C.conv2d_forward(x, w, None, s2, p if isinstance(p, tuple) else (p, p), (1, 1), 1),
        ey - b[:, None, None],
        np.float32,
        reduction_size=Ci * k[0] * k[1],
    )
    if s2 == (1, 1):  # dX = conv(dY, W~): the flipped conv OC -> C
        gy = np.random.default_rng(4).standard_normal(y3.shape).astype(np.float32)
        assert C.direct_forward_eligible(OC, Ci, k, (1, 1), (1, 1), 1) == _small_c_here(level, OC, Ci, k, s2, (1, 1), 1)
        dx3, _, _ = tl.conv.conv2d_backward(
            gy, x, w, s, p, d, g, backend="cpp", version="v3", needs=(True, False, False)
        )
        edx = torch.nn.grad.conv2d_input(x.shape, torch.from_numpy(w).double(), torch.from_numpy(gy).double(), s, p)
        assert_close(dx3, edx.numpy(), np.float32, reduction_size=OC * k[0] * k[1])


def test_v3_raw_kernel_validates_version():
    C = tl.backends.load_C("conv")
    x = np.zeros((1, 16, 5, 5), np.float32)
    with pytest.raises(ValueError, match="version"):
        C.conv2d_forward(x, np.zeros((16, 16, 3, 3), np.float32), None, (1, 1), (1, 1), (1, 1), 1, version="v9")


def test_v2_noncontiguous_and_broadcast_inputs(level):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    for name, x in make_layouts((2, 3, 7, 8), "float32"):
        got = tl.conv.conv2d(x, w[:, :, ::-1], None, 1, (1, 0), 1, backend="cpp", version="v2")
        exp = F.conv2d(
            torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(w[:, :, ::-1].copy()), None, 1, (1, 0)
        )
        assert_close(got, exp, reduction_size=18, msg=name)
    xb = np.broadcast_to(rng.standard_normal((1, 3, 1, 8)).astype(np.float32), (2, 3, 7, 8))  # stride-0 axes
    got = tl.conv.conv2d(xb, w, None, 1, 1, backend="cpp", version="v2")
    exp = F.conv2d(torch.from_numpy(np.ascontiguousarray(xb)), torch.from_numpy(w), None, 1, 1)
    assert_close(got, exp, reduction_size=18)


def test_v2_matches_v1_large_layer():
    """A ResNet-like layer with several K blocks, column tiles and both threads busy: v2 == im2col + OpenBLAS."""
    x, w, b, s, p, d, g = conv_case((2, 96, 20, 20, 70, 3, 1, 1, 1, 1), "float32", seed=4)
    y2, _ = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp", version="v2")
    y1, _ = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp", version="v1")
    ey = F.conv2d(*(torch.from_numpy(a) for a in (x, w, b)), s, p, d, g).numpy()
    assert_close(y2, ey, reduction_size=96 * 9)
    assert_close(y2, y1, reduction_size=96 * 9)


def test_v2_raw_kernel_validates():
    C = tl.backends.load_C("conv")
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(ValueError, match="groups"):
        C.conv2d_forward(x, np.zeros((6, 3, 3, 3), np.float32), None, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="bias"):
        C.conv2d_forward(x, np.zeros((6, 4, 3, 3), np.float32), np.zeros(5, np.float32), (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="kernel_size"):
        C.conv2d_forward(x, np.zeros((6, 4, 7, 7), np.float32), None, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(TypeError, match="weight"):
        C.conv2d_forward(x, np.zeros((6, 4, 3, 3), np.float64), None, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="version"):
        tl.conv.conv2d(x, np.zeros((6, 4, 3, 3), np.float32), backend="cpp", version="v9")


def test_v2_micro_kernel_follows_level(level):
    isa = tl.backends.load_C("conv").micro_kernel_isa()
    assert isa == level  # the best path at the forced level (levels the CPU lacks are not parametrized)


def test_gradcheck_fp64_v2():
    with pinned("cpp", "v2"):
        rng = np.random.default_rng(1)
        x, w, b = (tl.Tensor(rng.standard_normal(sh), requires_grad=True) for sh in ((2, 4, 6, 5), (4, 2, 3, 2), (4,)))
        fn = tl.nn.functional.conv2d
        assert tl.autograd.gradcheck(lambda a, ww, bb: fn(a, ww, bb, 1, 1, (1, 2), 2), [x, w, b])  # dX as a conv
        assert tl.autograd.gradcheck(lambda a, ww, bb: fn(a, ww, bb, (2, 1), 1, 1, 2), [x, w, b])  # col2im path


def test_v2_dweight_kernel_vs_torch_and_validates(level):
    """_C.conv.conv2d_backward_weight alone (the reduction over N*OH*OW split across threads) vs torch's dW."""
    C = tl.backends.load_C("conv")
    for case in [(4, 70, 20, 20, 40, 3, 1, 1, 1, 1), (2, 3, 30, 30, 8, 7, 2, 3, 1, 1), (2, 5, 9, 8, 6, 3, 3, 2, 2, 1)]:
        for dtype in ("float32", "float64"):
            x, w, b, s, p, d, g = conv_case(case, dtype, seed=2)
            tx, tw = torch.tensor(x), torch.tensor(w, requires_grad=True)
            y = F.conv2d(tx, tw, None, s, p, d)
            gy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(0))
            y.backward(gy)
            pair = lambda v: (v, v) if isinstance(v, int) else v
            dw = C.conv2d_backward_weight(x, gy.numpy(), w.shape[2:], pair(s), pair(p), pair(d))
            assert dw.shape == w.shape and dw.dtype == np.dtype(dtype)
            assert_close(dw, tw.grad, dtype, reduction_size=y.numel() // y.shape[1], msg=f"{level} {case}")
    x = np.zeros((2, 3, 6, 6), np.float32)
    with pytest.raises(ValueError, match="grad_out"):
        C.conv2d_backward_weight(x, np.zeros((2, 4, 5, 5), np.float32), (3, 3), (1, 1), (1, 1), (1, 1))
    with pytest.raises(TypeError, match="grad_out"):
        C.conv2d_backward_weight(x, np.zeros((2, 4, 6, 6), np.float64), (3, 3), (1, 1), (1, 1), (1, 1))


def test_default_version_picks_v2_from_32_channels():
    x, w, b, s, p, d, g = conv_case((2, 3, 8, 8, 6, 3, 1, 1, 1, 1), "float32")
    _, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp")
    assert cols is not None  # 6 output channels: v1 (im2col + OpenBLAS), its columns kept for dW
    # (8 output channels on AVX2/AVX-512: v3's small-C forward, test_v3_small_c_forward_where_it_applies)
    x, w, b, s, p, d, g = conv_case((2, 3, 8, 8, 32, 3, 1, 1, 1, 1), "float32")
    y, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp")
    assert cols is None  # 32 output channels: v2
    ey = F.conv2d(*(torch.from_numpy(a) for a in (x, w, b)), s, p, d, g)
    assert_close(y, ey, reduction_size=27)


def test_flip_weight_is_the_transposed_flipped_kernel(level):
    """conv2d_forward(flip_weight=True) on W [C, OC/g, kh, kw] == the plain kernel on the explicit W~."""
    rng = np.random.default_rng(11)
    g, C, OCg = 2, 6, 5
    w = rng.standard_normal((C, OCg, 2, 3)).astype(np.float32)
    x = rng.standard_normal((2, C, 6, 7)).astype(np.float32)
    wt = w.reshape(g, C // g, OCg, 2, 3)[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4)
    wt = np.ascontiguousarray(wt).reshape(g * OCg, C // g, 2, 3)
    k = tl.backends.load_C("conv")
    got = k.conv2d_forward(x, w, None, (1, 1), (1, 2), (1, 1), g, flip_weight=True)
    exp = k.conv2d_forward(x, wt, None, (1, 1), (1, 2), (1, 1), g)
    np.testing.assert_array_equal(got, exp)  # same products, same order: bit-identical
    with pytest.raises(ValueError, match="flip_weight"):
        k.conv2d_forward(np.ascontiguousarray(x[:, :5]), w, None, (1, 1), (1, 2), (1, 1), 1, flip_weight=True)
