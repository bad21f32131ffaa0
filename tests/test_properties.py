"""Property tests (hypothesis): random shapes (incl. empty dims) and strides, every backend against torch, and
random garbage that must raise the documented exception type. Small ``max_examples``: the run stays well under 60 s.

First slice of issue 14's property suite: conv im2col, kernels softmax, sparse CSR/ELL matmul, allocator argument
types. (quant, gemm, col2im, layer_norm still to add.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinylearn as tl
from tinylearn import backends

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONV_BACKENDS = [b for b in ("numpy", "numba", "cpp") if b != "cpp" or backends.C_available("conv")]


@FAST
@given(
    n=st.integers(0, 2),
    c=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 3),
    p=st.integers(0, 2),
    d=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("backend", CONV_BACKENDS)
def test_im2col_matches_torch_unfold(backend, n, c, h, w, k, s, p, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    if d * (k - 1) + 1 > min(h, w) + 2 * p:
        with pytest.raises(ValueError):
            tl.conv.im2col(x, k, stride=s, padding=p, dilation=d, backend=backend)
        return
    got = tl.conv.im2col(x, k, stride=s, padding=p, dilation=d, backend=backend)
    ref = torch.nn.functional.unfold(torch.from_numpy(x), k, dilation=d, padding=p, stride=s).numpy()
    np.testing.assert_array_equal(got, ref)


@FAST
@given(rows=st.integers(0, 5), cols=st.integers(1, 40), transpose=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("backend", [b for b in tl.kernels.available_backends() if b != "triton"])
def test_softmax_matches_torch(backend, rows, cols, transpose, seed):
    x = np.random.default_rng(seed).standard_normal((cols, rows) if transpose else (rows, cols)).astype(np.float32)
    x = x.T if transpose else x  # non-contiguous input
    got = tl.kernels.softmax(x, dim=-1, backend=backend)
    ref = torch.softmax(torch.from_numpy(np.ascontiguousarray(x)), dim=-1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@FAST
@given(garbage=st.one_of(st.floats(), st.text(max_size=3), st.none(), st.booleans()))
def test_softmax_dim_garbage_is_typeerror(garbage):
    with pytest.raises(TypeError, match="dim"):
        tl.kernels.softmax(np.ones((2, 3), np.float32), dim=garbage)


@FAST
@given(m=st.integers(0, 6), k=st.integers(0, 6), n=st.integers(1, 4), density=st.floats(0, 1), seed=st.integers(0, 99))
@pytest.mark.parametrize("fmt", ["CSR", "ELL"])
@pytest.mark.parametrize("backend", ["numpy", "numba", "cpp"])
def test_sparse_matmul_matches_dense(fmt, backend, m, k, n, density, seed):
    r = np.random.default_rng(seed)
    a = (r.standard_normal((m, k)) * (r.random((m, k)) < density)).astype(np.float32)
    b = r.standard_normal((k, n)).astype(np.float32)
    s = getattr(tl.sparse, fmt).from_dense(a)
    assert not s.indices.flags.writeable  # validated index arrays are frozen
    np.testing.assert_allclose(s.matmul(b, backend=backend), a @ b, rtol=1e-5, atol=1e-5)


@FAST
@given(bad=st.one_of(st.floats(), st.none(), st.booleans(), st.text(max_size=3)))
@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_allocator_garbage_sizes_are_typeerror_and_leave_state(backend, bad):
    a = tl.memory.FirstFitAllocator(1 << 16, backend=backend)
    with pytest.raises(TypeError, match="nbytes"):
        a.malloc(bad)
    assert a.stats()["n_alloc"] == 0
