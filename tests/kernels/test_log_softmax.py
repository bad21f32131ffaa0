"""log_softmax: the fused C++ kernel (cpp_src/kernels_softmax.cpp), its numpy reference, the checked entry points
(tinylearn/kernels/ops_log_softmax.py) and tl.nn.functional.log_softmax / cross_entropy (LogSoftmax in
tinylearn/autograd/ops_reduce.py), all against torch.log_softmax and torch autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

import tinylearn as tl
from tinylearn import backends
from tinylearn.autograd import gradcheck
from tinylearn.kernels import cpu as cpu_k
from tinylearn.kernels import ops_log_softmax as lsm
from tinylearn.kernels import reference
from tinylearn.testing import assert_close

HAVE_C = backends.C_available("kernels")
BACKENDS = ["numpy"] + (["cpp"] if HAVE_C else [])
needs_c = pytest.mark.skipif(not HAVE_C, reason="tinylearn._C.kernels not built")


def _torch(x: np.ndarray, dy: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    tx = torch.tensor(x, requires_grad=True)
    y = torch.log_softmax(tx, dim)
    y.backward(torch.from_numpy(dy))
    return y.detach().numpy(), tx.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_kernel_matches_torch_on_3d_input(backend: str, dtype: str, dim: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 37, 19)) * 3).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    ty, tdx = _torch(x, dy, dim)
    y = lsm.log_softmax(x, dim, backend=backend)
    dx = lsm.log_softmax_backward(y, dy, dim, backend=backend)
    assert y.dtype == x.dtype and dx.dtype == x.dtype
    assert_close(y, ty, dtype, reduction_size=x.shape[dim])
    assert_close(dx, tdx, dtype, reduction_size=x.shape[dim])


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_input(backend: str) -> None:
    rng = np.random.default_rng(2)
    base = rng.standard_normal((40, 64)).astype(np.float32)
    for x in (base.T, base[::2, ::3], np.broadcast_to(base[0], (6, 64))):
        dy = rng.standard_normal(x.shape).astype(np.float32)
        ty, tdx = _torch(np.ascontiguousarray(x), dy, -1)
        y = lsm.log_softmax(x, backend=backend)
        assert_close(y, ty, "float32")
        assert_close(lsm.log_softmax_backward(y, dy.T.copy().T, backend=backend), tdx, "float32")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inf_rows_nan_and_large_magnitudes_like_torch(backend: str, dtype: str) -> None:
    """-inf entries give -inf; a fully -inf row, a +inf or a NaN entry give a NaN row (torch's results); entries of
    magnitude 1e4 stay exact to rounding (the max is subtracted first, y = (x - m) - log s)."""
    inf, nan = np.inf, np.nan
    x = np.array(
        [
            [-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
            [0.0, -inf, 1.0, 2.0, -inf, 3.0, -inf, -1.0, 0.5],
            [inf, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
            [nan, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
            [1e4, -1e4, 1e4 - 1, 3e3, 1e4 - 2, -5e3, 1e4, 0.0, 1e4 - 0.5],
            [-1e4, -1e4 + 1, -1e4 + 2, -1e4 + 3, -1e4, -1e4, -1e4, -1e4, -1e4],
        ],
        dtype,
    )
    ty = torch.log_softmax(torch.from_numpy(x), -1).numpy()
    y = lsm.log_softmax(x, backend=backend)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ty))
    np.testing.assert_array_equal(np.isneginf(y), np.isneginf(ty))
    fin = np.isfinite(ty)
    assert_close(y[fin], ty[fin], dtype)
    dy = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
    tx = torch.tensor(x[1:2], requires_grad=True)
    torch.log_softmax(tx, -1).backward(torch.from_numpy(dy[1:2]))
    assert_close(lsm.log_softmax_backward(y[1:2], dy[1:2], backend=backend), tx.grad.numpy(), dtype)
    big = np.random.default_rng(4).standard_normal((8, 300)).astype(dtype) * 1e4
    assert_close(lsm.log_softmax(big, backend=backend), torch.log_softmax(torch.from_numpy(big), -1).numpy(), dtype)


@needs_c
@pytest.mark.parametrize("shape", [(256, 1000), (3, 7), (5, 17), (4, 33), (2, 1)])
def test_forced_cpu_feature_paths(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int]) -> None:
    """TINYLEARN_CPU_FEATURES picks the float32 row copy; each matches torch, scalar and AVX2 agree bit for bit (the
    scalar copy emulates AVX2's 8 lanes), AVX-512 to rounding (it folds 16 lanes into 8)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    ty, tdx = _torch(x, dy, -1)
    results = {}
    for level in ("scalar", "avx2", "avx512"):
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        path = cpu_k.log_softmax_path()
        if level == "scalar":
            assert path == "scalar"
        y = cpu_k.log_softmax(x)
        dx = cpu_k.log_softmax_backward(y, dy)
        assert_close(y, ty, "float32", reduction_size=shape[1], msg=path)
        assert_close(dx, tdx, "float32", reduction_size=shape[1], msg=path)
        results[path] = (y, dx)
    if "avx2" in results:
        np.testing.assert_array_equal(results["avx2"][0], results["scalar"][0])
        np.testing.assert_array_equal(results["avx2"][1], results["scalar"][1])
    for y, dx in results.values():
        assert_close(y, results["scalar"][0], "float32", reduction_size=shape[1])
        assert_close(dx, results["scalar"][1], "float32", reduction_size=shape[1])


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_threads_give_the_same_bits(dtype: str) -> None:
    """Above 2 x 32 Ki elements the rows are split over OpenMP threads; a row is one thread's, so the bits agree."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((512, 1000)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    out = {}
    for n in (1, 2):
        with threadpool_limits(n):
            y = cpu_k.log_softmax(x)
            out[n] = (y, cpu_k.log_softmax_backward(y, dy))
    np.testing.assert_array_equal(out[1][0], out[2][0])
    np.testing.assert_array_equal(out[1][1], out[2][1])
    ty, tdx = _torch(x, dy, -1)
    assert_close(out[2][0], ty, dtype, reduction_size=1000)
    assert_close(out[2][1], tdx, dtype, reduction_size=1000)


@needs_c
def test_cpp_matches_the_numpy_reference_float64() -> None:
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((9, 41)) * 5, rng.standard_normal((9, 41))
    y = cpu_k.log_softmax(x)
    assert_close(y, reference.log_softmax(x), "float64")
    assert_close(cpu_k.log_softmax_backward(y, dy), reference.log_softmax_backward(y, dy), "float64")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_tensor_log_softmax_matches_torch(dtype: str, dim: int) -> None:
    """tl.nn.functional.log_softmax (the C++ kernel for float32/float64 when built) forward and backward, on a
    non-contiguous (transposed) input too."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((4, 6, 7)) * 3).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    ty, tdx = _torch(x, dy, dim)
    for xa in (x, x.transpose(2, 1, 0).copy().transpose(2, 1, 0)):
        xt = tl.Tensor(xa, requires_grad=True)
        y = tl.nn.functional.log_softmax(xt, dim=dim)
        (y * tl.Tensor(dy)).sum().backward()
        assert y.shape == x.shape and y.data.dtype == x.dtype
        assert_close(y.data, ty, dtype)
        assert_close(xt.grad.data, tdx, dtype)


def test_tensor_log_softmax_numpy_pin_other_dtypes_and_empty() -> None:
    """A ``backends.use`` numpy pin, float16 and empty input take LogSoftmax's numpy code; results still match."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 11)).astype(np.float32)
    ty = torch.log_softmax(torch.from_numpy(x), -1).numpy()
    with backends.use("kernels.log_softmax", backend="numpy"):
        assert_close(tl.nn.functional.log_softmax(tl.Tensor(x), dim=-1).data, ty, "float32")
    y16 = tl.nn.functional.log_softmax(tl.Tensor(x.astype(np.float16)), dim=-1)
    assert y16.data.dtype == np.float16
    assert_close(y16.data, torch.log_softmax(torch.from_numpy(x.astype(np.float16)).float(), -1).numpy(), "float16")
    e = tl.Tensor(np.zeros((0, 5), np.float32), requires_grad=True)
    ye = tl.nn.functional.log_softmax(e, dim=-1)
    ye.sum().backward()
    assert ye.shape == (0, 5) and e.grad.shape == (0, 5)


def test_gradcheck_fp64_through_log_softmax() -> None:
    rng = np.random.default_rng(10)
    for dim in (0, 1, -1):
        assert gradcheck(lambda x, d=dim: tl.nn.functional.log_softmax(x, dim=d), (rng.standard_normal((3, 4, 5)),))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cross_entropy_still_matches_torch(dtype: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 100)).astype(dtype)
    t = rng.integers(0, 100, 64)
    xt = tl.Tensor(x, requires_grad=True)
    loss = tl.nn.functional.cross_entropy(xt, tl.Tensor(t))
    loss.backward()
    tx = torch.tensor(x, requires_grad=True)
    tloss = F.cross_entropy(tx, torch.from_numpy(t))
    tloss.backward()
    assert_close(loss.data, tloss.detach().numpy(), dtype, reduction_size=100 * 64)
    assert_close(xt.grad.data, tx.grad.numpy(), dtype, reduction_size=100)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="dim: 2 out of range"):
        lsm.log_softmax(np.zeros((2, 3), np.float32), 2)
    with pytest.raises(ValueError, match="x: log_softmax needs at least one dimension"):
        lsm.log_softmax(np.float32(1.0))
    with pytest.raises(ValueError, match=r"dy: shape \(2, 4\) does not match y shape \(2, 3\)"):
        lsm.log_softmax_backward(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(TypeError, match="x"):
        lsm.log_softmax(np.zeros((2, 3), np.int32))


@needs_c
def test_cpp_kernel_checks_its_arguments() -> None:
    C = backends.load_C("kernels")
    with pytest.raises(ValueError, match="log_softmax_forward: x must be 2-D"):
        C.log_softmax_forward(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="log_softmax_backward"):
        C.log_softmax_backward(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
