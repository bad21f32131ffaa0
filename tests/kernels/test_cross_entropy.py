"""cross_entropy: the fused C++ kernel (cpp_src/kernels_cross_entropy.cpp), its numpy reference
(tinylearn/kernels/reference.py) and tl.nn.functional.cross_entropy (CrossEntropyFn in
tinylearn/nn/functional_loss.py) against torch.nn.functional.cross_entropy, forward and backward."""

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
from tinylearn.kernels import reference
from tinylearn.testing import assert_close

HAVE_C = backends.C_available("kernels")
BACKENDS = ["numpy"] + (["cpp"] if HAVE_C else [])
needs_c = pytest.mark.skipif(not HAVE_C, reason="tinylearn._C.kernels not built")
KERNELS = {"numpy": reference, "cpp": cpu_k}


def _inputs(rng, n: int, c: int, dtype: str, ignore: bool = True) -> tuple[np.ndarray, np.ndarray]:
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    t = rng.integers(0, c, n)
    if ignore and n > 3:
        t[1] = t[n - 2] = -100
        t[0] = c - 1
    return x, t


def _torch(x, t, reduction="mean", ls=0.0, ignore_index=-100, g=None):
    tx = torch.tensor(x, requires_grad=True)
    loss = F.cross_entropy(tx, torch.from_numpy(t), reduction=reduction, label_smoothing=ls, ignore_index=ignore_index)
    loss.backward(torch.ones_like(loss) if g is None else torch.from_numpy(g))
    return loss.detach().numpy(), tx.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_kernels_match_torch_per_row(backend: str, dtype: str, ls: float) -> None:
    """Per-row losses (ignored rows 0) and the gradient for an upstream gradient per row, against torch
    reduction='none'; the valid-row count."""
    rng = np.random.default_rng(0)
    x, t = _inputs(rng, 37, 53, dtype)
    g = rng.standard_normal(37).astype(dtype)
    tl_loss, tg = _torch(x, t, "none", ls, g=g)
    k = KERNELS[backend]
    loss, stats, nvalid = k.cross_entropy(x, t, -100, ls)
    assert nvalid == 35 and loss.dtype == x.dtype and stats.shape == (37, 2)
    assert_close(loss, tl_loss, dtype, reduction_size=53)
    dx = k.cross_entropy_backward(x, stats, t, g, -100, ls)
    assert dx.dtype == x.dtype
    assert_close(dx, tg, dtype, reduction_size=53)
    assert not dx[1].any() and not dx[35].any()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_tensor_cross_entropy_matches_torch(reduction: str, dtype: str, ls: float) -> None:
    rng = np.random.default_rng(1)
    x, t = _inputs(rng, 64, 100, dtype)
    for backend in BACKENDS:
        with backends.use("kernels.cross_entropy", backend=backend):
            xt = tl.Tensor(x, requires_grad=True)
            loss = tl.nn.functional.cross_entropy(xt, tl.Tensor(t), reduction=reduction, label_smoothing=ls)
            loss.sum().backward() if reduction == "none" else loss.backward()
        tloss, tg = _torch(x, t, reduction, ls)
        assert loss.data.dtype == x.dtype
        assert_close(loss.data, tloss, dtype, reduction_size=6400, msg=backend)
        assert_close(xt.grad.data, tg, dtype, reduction_size=100, msg=backend)


def test_non_contiguous_and_broadcast_logits() -> None:
    rng = np.random.default_rng(2)
    base = rng.standard_normal((40, 30)).astype(np.float32)
    t = rng.integers(0, 40, 30)
    for x in (base.T, np.broadcast_to(base[0], (40, 30)).T):
        xt = tl.Tensor(x, requires_grad=True)
        tl.nn.functional.cross_entropy(xt, t).backward()
        tloss, tg = _torch(np.ascontiguousarray(x), t)
        assert_close(xt.grad.data, tg, "float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_magnitudes_and_nan_like_torch(backend: str) -> None:
    """Logits of 1e4 keep the answer (x - max first); a NaN logit gives a NaN loss, as in torch."""
    x = np.array([[1e4, -1e4, 1e4 - 1, 3e3], [1e4, 0.0, 1e4 - 0.5, -5.0], [np.nan, 0.0, 1.0, 2.0]], np.float32)
    t = np.array([2, 1, 3])
    tl_loss, _ = _torch(x, t, "none")
    loss, stats, _ = KERNELS[backend].cross_entropy(x, t, -100, 0.0)
    np.testing.assert_array_equal(np.isnan(loss), np.isnan(tl_loss))
    assert_close(loss[:2], tl_loss[:2], "float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_targets_name_the_label(backend: str) -> None:
    x = np.zeros((4, 5), np.float32)
    k = KERNELS[backend]
    with pytest.raises(ValueError, match=r"target label 5 is out of range \[0, 5\) \(row 2"):
        k.cross_entropy(x, np.array([0, 1, 5, 2]), -100, 0.0)
    with pytest.raises(ValueError, match=r"target label -3 is out of range \[0, 5\) \(row 0"):
        k.cross_entropy(x, np.array([-3, 1, 1, 2]), -100, 0.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        k.cross_entropy(x, np.array([0, 1, 1, 2]), -100, 1.5)
    with pytest.raises(ValueError, match="target"):
        k.cross_entropy(x, np.array([0, 1, 1]), -100, 0.0)
    with pytest.raises(ValueError, match="out of range"):
        tl.nn.functional.cross_entropy(tl.Tensor(x), np.array([0, 1, 7, 2]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_rows_ignored_gives_nan_mean_and_zero_grad(backend: str) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    t = np.full(3, -100)
    with backends.use("kernels.cross_entropy", backend=backend):
        xt = tl.Tensor(x, requires_grad=True)
        loss = tl.nn.functional.cross_entropy(xt, t)
        loss.backward()
    tloss, tg = _torch(x, t)
    assert np.isnan(loss.data) and np.isnan(tloss)
    assert not xt.grad.data.any()


@needs_c
@pytest.mark.parametrize("shape", [(256, 100), (3, 7), (5, 17), (4, 33), (2, 1)])
def test_forced_cpu_feature_paths(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int]) -> None:
    """TINYLEARN_CPU_FEATURES picks the float32 row copy; each matches torch, scalar and AVX2 agree bit for bit."""
    rng = np.random.default_rng(4)
    x, t = _inputs(rng, *shape, "float32", ignore=shape[0] > 3)
    g = rng.standard_normal(shape[0]).astype(np.float32)
    tloss, tg = _torch(x, t, "none", 0.1, g=g)
    results = {}
    for level in ("scalar", "avx2", "avx512"):
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        path = cpu_k.vector_math_path()
        loss, stats, _ = cpu_k.cross_entropy(x, t, -100, 0.1)
        dx = cpu_k.cross_entropy_backward(x, stats, t, g, -100, 0.1)
        assert_close(loss, tloss, "float32", reduction_size=shape[1], msg=path)
        assert_close(dx, tg, "float32", reduction_size=shape[1], msg=path)
        results[path] = (loss, dx)
    assert "scalar" in results
    if "avx2" in results:
        np.testing.assert_array_equal(results["avx2"][0], results["scalar"][0])
        np.testing.assert_array_equal(results["avx2"][1], results["scalar"][1])


@needs_c
def test_threads_give_the_same_bits() -> None:
    rng = np.random.default_rng(5)
    x, t = _inputs(rng, 512, 1000, "float32")
    out = {}
    for n in (1, 2):
        with threadpool_limits(n):
            loss, stats, _ = cpu_k.cross_entropy(x, t, -100, 0.0)
            out[n] = (loss, cpu_k.cross_entropy_backward(x, stats, t, np.ones(1, np.float32), -100, 0.0))
    np.testing.assert_array_equal(out[1][0], out[2][0])
    np.testing.assert_array_equal(out[1][1], out[2][1])


def test_gradcheck_fp64_and_float16() -> None:
    rng = np.random.default_rng(6)
    t = np.array([0, 3, 1, -100, 2])
    for ls in (0.0, 0.3):
        assert gradcheck(
            lambda x, ls=ls: tl.nn.functional.cross_entropy(x, t, label_smoothing=ls), (rng.standard_normal((5, 4)),)
        )
    x16 = rng.standard_normal((6, 9)).astype(np.float16)
    t16 = rng.integers(0, 9, 6)
    loss = tl.nn.functional.cross_entropy(tl.Tensor(x16), t16)
    assert loss.data.dtype == np.float16
    assert_close(loss.data, _torch(x16.astype(np.float32), t16)[0], "float16")
