"""batch_norm: the fused C++ kernel (cpp_src/kernels_batchnorm.cpp), its numpy reference
(tinylearn/kernels/reference.py) and tl.nn.functional.batch_norm (BatchNormFn in tinylearn/nn/functional_norm.py)
against torch.nn.functional.batch_norm, training and eval, forward, backward and the running statistics."""

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


def _torch(x, w, b, rm, rv, training, g):
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    trm = None if rm is None else torch.tensor(rm)
    trv = None if rv is None else torch.tensor(rv)
    y = F.batch_norm(tx, trm, trv, tw, tb, training=training, momentum=0.1, eps=1e-5)
    y.backward(torch.from_numpy(g))
    grads = [t.grad.numpy() if t is not None else None for t in (tx, tw, tb)]
    return y.detach().numpy(), grads, (None if trm is None else trm.numpy(), None if trv is None else trv.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(16, 5), (8, 6, 7), (4, 3, 5, 6)])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_tensor_batch_norm_matches_torch(backend, dtype, shape, training, affine) -> None:
    rng = np.random.default_rng(0)
    c = shape[1]
    x = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(c).astype(dtype) if affine else None
    b = rng.standard_normal(c).astype(dtype) if affine else None
    rm, rv = rng.standard_normal(c).astype(dtype), (rng.random(c) + 0.5).astype(dtype)
    ty, (tgx, tgw, tgb), (trm, trv) = _torch(x, w, b, rm.copy(), rv.copy(), training, g)
    with backends.use("kernels.batch_norm", backend=backend):
        xt = tl.Tensor(x, requires_grad=True)
        wt = None if w is None else tl.Tensor(w, requires_grad=True)
        bt = None if b is None else tl.Tensor(b, requires_grad=True)
        rm_tl, rv_tl = rm.copy(), rv.copy()
        y = tl.nn.functional.batch_norm(xt, rm_tl, rv_tl, wt, bt, training=training)
        (y * tl.Tensor(g)).sum().backward()
    m = x.size // c
    assert y.data.dtype == x.dtype and y.shape == shape
    assert_close(y.data, ty, dtype, reduction_size=m)
    assert_close(xt.grad.data, tgx, dtype, reduction_size=m)
    if affine:
        assert_close(wt.grad.data, tgw, dtype, reduction_size=m)
        assert_close(bt.grad.data, tgb, dtype, reduction_size=m)
    assert_close(rm_tl, trm, dtype, reduction_size=m)
    assert_close(rv_tl, trv, dtype, reduction_size=m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_input_and_no_running_stats(backend) -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 10, 4, 5)).astype(np.float32)
    x = base.transpose(0, 1, 3, 2)[:, ::2]  # [6, 5, 5, 4], strided
    g = rng.standard_normal(x.shape).astype(np.float32)
    ty, (tgx, _, _), _ = _torch(np.ascontiguousarray(x), None, None, None, None, True, g)
    with backends.use("kernels.batch_norm", backend=backend):
        xt = tl.Tensor(x, requires_grad=True)
        y = tl.nn.functional.batch_norm(xt, None, None, training=True)
        (y * tl.Tensor(g)).sum().backward()
    assert_close(y.data, ty, "float32", reduction_size=120)
    assert_close(xt.grad.data, tgx, "float32", reduction_size=120)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_errors_name_the_argument(backend) -> None:
    k = KERNELS[backend]
    x = np.ones((2, 3, 4), np.float32)
    if backend == "cpp":
        with pytest.raises(ValueError, match="weight shape"):
            k.batch_norm(x, np.ones(4, np.float32), None, None, None, 1e-5)
        with pytest.raises(ValueError, match="both mean and var"):
            k.batch_norm(x, None, None, np.zeros(3, np.float32), None, 1e-5)
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            k.batch_norm(np.ones((1, 3, 1), np.float32), None, None, None, None, 1e-5)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        tl.nn.functional.batch_norm(tl.Tensor(np.ones((1, 3), np.float32)), None, None, training=True)
    with pytest.raises(ValueError, match="running_mean and running_var"):
        tl.nn.functional.batch_norm(tl.Tensor(x), None, None, training=False)


@needs_c
def test_forced_cpu_feature_paths_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each compiled copy (TINYLEARN_CPU_FEATURES) matches the numpy reference; one and two threads give the same
    bits (a channel is one thread's)."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 8, 600)) * 2 + 1).astype(np.float32)  # 307 Ki elements: 2 threads when allowed
    w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    ref_y, ref_m, ref_i, _ = reference.batch_norm(x, w, b, None, None, 1e-5)
    ref_dx, ref_dw, ref_db = reference.batch_norm_backward(dy, x, w, ref_m, ref_i, True)
    for level in ("scalar", "avx2", "avx512"):
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        out = {}
        for n in (1, 2):
            with threadpool_limits(n):
                y, m, i, _ = cpu_k.batch_norm(x, w, b, None, None, 1e-5)
                out[n] = (y, *cpu_k.batch_norm_backward(dy, x, w, m, i, True))
        for a, c in zip(out[1], out[2]):
            np.testing.assert_array_equal(a, c)
        for got, ref in zip(out[1], (ref_y, ref_dx, ref_dw, ref_db)):
            assert_close(got, ref, "float32", reduction_size=64 * 600, msg=level)


def test_gradcheck_fp64_training_and_eval() -> None:
    rng = np.random.default_rng(3)
    rm, rv = np.zeros(3), np.ones(3)
    for training in (True, False):
        assert gradcheck(
            lambda x, w, b, tr=training: tl.nn.functional.batch_norm(x, rm.copy(), rv.copy(), w, b, training=tr),
            (rng.standard_normal((4, 3, 5)), rng.standard_normal(3), rng.standard_normal(3)),
        )


def test_need_dx_false_skips_the_input_gradient() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    w = tl.Tensor(np.ones(3, np.float32), requires_grad=True)
    y = tl.nn.functional.batch_norm(tl.Tensor(x), None, None, w, None, training=True)
    y.sum().backward()
    assert w.grad is not None and w.grad.shape == (3,)
    for k in KERNELS.values() if HAVE_C else (reference,):
        _, m, i, _ = k.batch_norm(x, None, None, None, None, 1e-5)
        dx, dw, db = k.batch_norm_backward(x, x, None, m, i, True, need_dx=False)
        assert dx is None and dw.shape == (3,) and db.shape == (3,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_parameters_and_buffers(backend) -> None:
    """Read-only weight, input and (eval) running statistics are only read: no 'array is not writeable'."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    w, rm, rv = np.full(3, 2.0, np.float32), np.zeros(3, np.float32), np.ones(3, np.float32)
    for a in (x, w, rm, rv):
        a.flags.writeable = False
    with backends.use("kernels.batch_norm", backend=backend):
        xt, wt = tl.Tensor(x, requires_grad=True), tl.Tensor(w, requires_grad=True)
        y = tl.nn.functional.batch_norm(xt, rm, rv, wt, None, training=False)
        y.sum().backward()
        yt = tl.nn.functional.batch_norm(tl.Tensor(x), None, None, tl.Tensor(w), None, training=True)
    assert_close(y.data, x * 2 / np.sqrt(1 + 1e-5), "float32")
    assert_close(xt.grad.data, np.full(x.shape, 2 / np.sqrt(1 + 1e-5), np.float32), "float32")
    assert_close(yt.data, F.batch_norm(torch.from_numpy(x.copy()), None, None, torch.from_numpy(w.copy()),
                                       training=True).numpy(), "float32")  # fmt: skip


@pytest.mark.parametrize("training", [True, False])
def test_float16_and_empty_input_run_the_reference(training) -> None:
    """float16 (no registered kernel dtype) goes through kernels.reference with numpy's promotion: y and dx in
    float16 like torch's; an empty batch in eval gives an empty result, not an error."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 4, 5)) * 2 + 1).astype(np.float16)
    g = rng.standard_normal(x.shape).astype(np.float16)
    w, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)  # torch's mix
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    ty, (tgx, tgw, tgb), (trm, trv) = _torch(x, w, b, rm.copy(), rv.copy(), training, g)
    xt, wt, bt = (tl.Tensor(a, requires_grad=True) for a in (x, w, b))
    rm_tl, rv_tl = rm.copy(), rv.copy()
    y = tl.nn.functional.batch_norm(xt, rm_tl, rv_tl, wt, bt, training=training)
    (y * tl.Tensor(g)).sum().backward()
    assert y.data.dtype == np.float16 and xt.grad.data.dtype == np.float16 and wt.grad.data.dtype == np.float32
    for ours, theirs in ((y.data, ty), (xt.grad.data, tgx), (wt.grad.data, tgw), (bt.grad.data, tgb)):
        np.testing.assert_allclose(ours.astype(np.float32), theirs.astype(np.float32), rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(rm_tl, trm, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(rv_tl, trv, rtol=1e-2, atol=1e-2)
    if not training:
        empty = tl.nn.functional.batch_norm(tl.Tensor(np.zeros((0, 4, 5), np.float32)), rm, rv, training=False)
        assert empty.shape == (0, 4, 5)
