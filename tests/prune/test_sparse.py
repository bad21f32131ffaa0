"""tinylearn.sparse: CSR / ELL / BSR round trips and SpMV / SpMM kernels (C++, numba, numpy) against dense numpy and
torch.sparse, including empty rows, all-zero and degenerate shapes, non-contiguous inputs and bad input; the CUDA
kernel file compiles with nvcc and its numba.cuda twin runs under the CUDA simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.backends import load_C
from tinylearn.sparse import BSR, CSR, ELL
from tinylearn.testing import assert_close, cuda_available, make_layouts, nvcc_available, nvcc_compile_ptx

ROOT = Path(__file__).resolve().parents[2]


def sparse_matrix(shape, density, seed=0, dtype="float32", empty_rows=(), empty_cols=()):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(dtype)
    a[rng.random(shape) >= density] = 0
    for r in empty_rows:
        a[r] = 0
    for c in empty_cols:
        a[:, c] = 0
    return a


CASES = [
    ((40, 30), 0.2, (0, 7, 39)),
    ((64, 64), 0.05, (1, 2, 3)),
    ((17, 50), 0.9, ()),
    ((33, 8), 0.0, ()),  # all zero
    ((1, 1), 1.0, ()),
    ((5, 12), 0.5, (0, 1, 2, 3, 4)),  # every row empty
]


@pytest.mark.parametrize("fmt", [CSR, ELL])
@pytest.mark.parametrize("shape,density,empty", CASES)
def test_round_trip(fmt, shape, density, empty):
    a = sparse_matrix(shape, density, empty_rows=empty)
    s = fmt.from_dense(a)
    assert s.nnz == np.count_nonzero(a)
    np.testing.assert_array_equal(s.to_dense(), a)
    assert s.to_dense().dtype == a.dtype


def test_csr_invariants_match_torch():
    a = sparse_matrix((30, 25), 0.3, seed=3, empty_rows=(4, 5))
    s = CSR.from_dense(a)
    t = torch.from_numpy(a).to_sparse_csr()
    np.testing.assert_array_equal(s.indptr, t.crow_indices().numpy())
    np.testing.assert_array_equal(s.indices, t.col_indices().numpy())
    np.testing.assert_array_equal(s.data, t.values().numpy())
    assert s.indptr.dtype == np.int64 and s.indices.dtype == np.int32


def test_ell_layout_is_column_major_padded():
    a = np.array([[1, 0, 2, 0], [0, 0, 0, 0], [0, 3, 0, 0]], dtype=np.float32)
    e = ELL.from_dense(a)
    assert e.width == 2 and e.indices.shape == (2, 3)
    np.testing.assert_array_equal(e.indices, [[0, -1, 1], [2, -1, -1]])
    np.testing.assert_array_equal(e.data, [[1, 0, 3], [2, 0, 0]])
    assert e.padding_fraction == pytest.approx(0.5)


@pytest.mark.parametrize("shape,block", [((8, 12), 4), ((8, 12), (2, 3)), ((6, 6), (6, 6)), ((4, 4), 1)])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.6])
def test_bsr_round_trip(shape, block, density):
    a = sparse_matrix(shape, density, seed=5)
    b = BSR.from_dense(a, block)
    np.testing.assert_array_equal(b.to_dense(), a)
    R, C = (block, block) if isinstance(block, int) else block
    blocks = a.reshape(shape[0] // R, R, shape[1] // C, C).transpose(0, 2, 1, 3)
    assert b.nblocks == int(np.any(blocks != 0, axis=(2, 3)).sum())


def test_bsr_matches_torch_blocks():
    a = sparse_matrix((8, 12), 0.15, seed=11)
    b = BSR.from_dense(a, (2, 3))
    t = torch.from_numpy(a).to_sparse_bsr((2, 3))
    np.testing.assert_array_equal(b.indptr, t.crow_indices().numpy())
    np.testing.assert_array_equal(b.indices, t.col_indices().numpy())
    np.testing.assert_array_equal(b.data, t.values().numpy())


BACKENDS = ["cpp", "numba", "numpy"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,density,empty", CASES)
def test_csr_kernels_vs_dense_and_torch(backend, dtype, shape, density, empty):
    a = sparse_matrix(shape, density, seed=1, dtype=dtype, empty_rows=empty)
    s = CSR.from_dense(a)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape[1]).astype(dtype)
    B = rng.standard_normal((shape[1], 19)).astype(dtype)
    y, Y = s.matmul(x, backend=backend), s.matmul(B, backend=backend)
    assert y.dtype == np.dtype(dtype) and Y.shape == (shape[0], 19)
    assert_close(y, a @ x, dtype)
    assert_close(Y, a @ B, dtype)
    tA = torch.from_numpy(a).to_sparse_csr()
    assert_close(Y, (tA @ torch.from_numpy(B)).numpy(), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,density,empty", CASES)
def test_ell_kernels_vs_dense(backend, shape, density, empty):
    a = sparse_matrix(shape, density, seed=4, empty_rows=empty)
    e = ELL.from_dense(a)
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape[1]).astype(np.float32)
    B = rng.standard_normal((shape[1], 5)).astype(np.float32)
    assert_close(e.matmul(x, backend=backend), a @ x, "float32")
    assert_close(e.matmul(B, backend=backend), a @ B, "float32")


@pytest.mark.parametrize("backend", ["cpp", "numpy"])
@pytest.mark.parametrize("density", [0.0, 0.05, 0.5])
def test_bsr_kernels_vs_dense(backend, density):
    a = sparse_matrix((16, 24), density, seed=8)
    b = BSR.from_dense(a, (4, 4))
    rng = np.random.default_rng(9)
    B = rng.standard_normal((24, 7)).astype(np.float32)
    x = rng.standard_normal(24).astype(np.float32)
    assert_close(b.matmul(B, backend=backend), a @ B, "float32")
    assert_close(b.matmul(x, backend=backend), a @ x, "float32")


@pytest.mark.parametrize("fmt", [CSR, ELL])
def test_non_contiguous_inputs(fmt):
    for layout, a in make_layouts((12, 10), seed=3):
        a = np.where(np.abs(a) < 0.5, 0, a)
        s = fmt.from_dense(a)
        np.testing.assert_array_equal(s.to_dense(), np.ascontiguousarray(a), err_msg=layout)
        for _, B in make_layouts((10, 6), seed=7):
            assert_close(s.matmul(B), np.ascontiguousarray(a) @ np.ascontiguousarray(B), "float32")


def test_mixed_dtypes_promote_like_numpy():
    a = sparse_matrix((6, 5), 0.5, dtype="float32")
    x = np.arange(5, dtype=np.float64)
    y = CSR.from_dense(a).matmul(x)
    assert y.dtype == np.float64
    assert_close(y, a.astype(np.float64) @ x, "float64")


def test_accepts_torch_and_tinylearn_tensors():
    a = sparse_matrix((6, 5), 0.5)
    np.testing.assert_array_equal(CSR.from_dense(torch.from_numpy(a)).to_dense(), a)
    np.testing.assert_array_equal(CSR.from_dense(tl.Tensor(a)).to_dense(), a)


def test_large_random_spmm_cpp_vs_torch():
    a = sparse_matrix((300, 500), 0.05, seed=12)
    B = np.random.default_rng(13).standard_normal((500, 130)).astype(np.float32)
    out = CSR.from_dense(a).matmul(B)
    expect = (torch.from_numpy(a).to_sparse_csr() @ torch.from_numpy(B)).numpy()
    assert_close(out, expect, "float32")


def test_bad_input():
    a = sparse_matrix((6, 5), 0.5)
    s = CSR.from_dense(a)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        CSR.from_dense(np.zeros(3))
    with pytest.raises(ValueError, match="5 columns"):
        s.matmul(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
        s.matmul(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="backend"):
        s.matmul(np.zeros(5), backend="gpu")
    with pytest.raises(ValueError, match=r"\(4, 4\).*\(6, 5\)"):
        BSR.from_dense(a, 4)
    with pytest.raises(ValueError, match="block_size"):
        BSR.from_dense(a, 0)
    with pytest.raises(TypeError, match="int64"):
        CSR.from_dense(np.eye(3, dtype=np.int64)).matmul(np.ones(3, dtype=np.int64), backend="cpp")
    np.testing.assert_array_equal(
        CSR.from_dense(np.eye(3, dtype=np.int64)).matmul(np.ones(3, dtype=np.int64), backend="numpy"), [1, 1, 1]
    )
    with pytest.raises(ValueError, match="column 7 out of range"):
        CSR([0, 1], [7], [1.0], (1, 5))
    with pytest.raises(ValueError, match="indptr"):
        CSR([0, 2, 1], [0, 1], [1.0, 2.0], (2, 5))


def test_cpp_kernel_validates_raw_arrays():
    _C = load_C()

    with pytest.raises(ValueError, match="column index 9 out of range"):
        _C.sparse.csr_spmv(
            np.array([0, 1], np.int64), np.array([9], np.int32), np.ones(1, np.float32), np.ones(3, np.float32), 1
        )
    with pytest.raises(ValueError, match="indptr decreases"):
        _C.sparse.csr_spmm(
            np.array([0, 2, 1, 2], np.int64),
            np.array([0, 1], np.int32),
            np.ones(2, np.float32),
            np.ones((3, 2), np.float32),
            3,
        )


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not on PATH")
def test_cuda_kernel_compiles(tmp_path):
    ptx = nvcc_compile_ptx(ROOT / "cuda_src" / "sparse_csr_spmv.cu", tmp_path).read_text()
    assert ".entry csr_spmv_scalar" in ptx and ".entry csr_spmv_vector" in ptx


def test_numba_cuda_simulator_spmv():
    code = (
        "import numpy as np, tinylearn as tl\n"
        "from tinylearn.sparse import cuda_sim\n"
        "rng = np.random.default_rng(0)\n"
        "a = rng.standard_normal((37, 20)).astype(np.float32); a[rng.random(a.shape) < 0.7] = 0; a[5] = 0\n"
        "x = rng.standard_normal(20).astype(np.float32)\n"
        "y = cuda_sim.csr_spmv(tl.sparse.CSR.from_dense(a), x)\n"
        "assert np.abs(y - a @ x).max() < 1e-5, np.abs(y - a @ x).max()\n"
        "print('ok')\n"
    )
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_cuda_kernels_are_the_cuda_backend_of_csr_matmul():
    """cuda_src/sparse_csr_spmv.cu is registered; without a GPU, naming it is the registry's RuntimeError."""
    from tinylearn import backends

    assert backends.versions("sparse.csr_matmul", "cuda") == ["scalar", "vector"]
    s = CSR.from_dense(sparse_matrix((6, 4), 0.5))
    x = np.ones(4, np.float32)
    assert backends.resolve(s.op, None, None, (s, x, np.dtype(np.float32)))[0] != "cuda"  # only when named
    if not cuda_available():
        with pytest.raises(RuntimeError, match="not available on this machine.*no CUDA device"):
            s.matmul(x, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["scalar", "vector"])
def test_cuda_kernels_on_gpu(version):  # pragma: no cover - needs a CUDA device
    assert cuda_available()
    a = sparse_matrix((300, 200), 0.1, seed=1, empty_rows=(0, 299))
    s = CSR.from_dense(a)
    x = np.random.default_rng(0).standard_normal((200, 3)).astype(np.float32)
    assert_close(s.matmul(x[:, 0], backend="cuda", version=version), a @ x[:, 0], "float32")
    assert_close(s.matmul(x, backend="cuda", version=version), a @ x, "float32")  # SpMM: column by column
    with pytest.raises(TypeError, match="float32 only"):
        s.matmul(x.astype(np.float64), backend="cuda", version=version)


def test_matmul_dispatches_through_the_backend_registry():
    from tinylearn import backends

    assert set(backends.registered("sparse.csr_matmul")) == {"numpy", "numba", "cpp", "cuda"}
    assert set(backends.registered("sparse.bsr_matmul")) == {"numpy", "cpp"}
    a = sparse_matrix((8, 6), 0.5)
    x = np.random.default_rng(1).standard_normal(6).astype(np.float32)
    for cls in (CSR, ELL):
        s = cls.from_dense(a)
        assert backends.resolve(s.op, None, None, (s, x, np.dtype(np.float32)))[0] == backends.available(s.op)[0]
        assert_close(s.matmul(x, backend="cpu"), a @ x, "float32")  # "cpu" is the alias of "cpp"
    # backend=None with an integer input goes to the numpy reference (the compiled kernels are float-only)
    ai = np.eye(3, dtype=np.int64)
    np.testing.assert_array_equal(CSR.from_dense(ai).matmul(np.arange(3)), [0, 1, 2])
    with pytest.raises(ValueError, match="numba"):
        BSR.from_dense(a[:6], 2).matmul(x, backend="numba")
    with pytest.raises(ValueError, match="version"):
        CSR.from_dense(a).matmul(x, backend="numpy", version="nope")


_RAW_NUMBA = r"""
import numpy as np
from tinylearn.sparse import numba_kernels as nk
f32 = np.float32
cases = [
    ("indptr past nnz", nk.csr_spmv, (np.array([0, 1, 9**9], np.int64), np.zeros(1, np.int32), np.ones(1, f32),
                                      np.ones(3, f32), 2)),
    ("indptr decreasing", nk.csr_spmm, (np.array([0, 2, 1, 2], np.int64), np.zeros(2, np.int32), np.ones(2, f32),
                                        np.ones((3, 2), f32), 3)),
    ("column", nk.csr_spmv, (np.array([0, 1], np.int64), np.array([10**6], np.int32), np.ones(1, f32),
                             np.ones(3, f32), 1)),
    ("column", nk.csr_spmm, (np.array([0, 1], np.int64), np.array([-7], np.int32), np.ones(1, f32),
                             np.ones((3, 2), f32), 1)),
    ("column", nk.ell_spmv, (np.array([[10**6]], np.int32), np.ones((1, 1), f32), np.ones(3, f32))),
    ("shapes", nk.ell_spmv, (np.array([[0, 1]], np.int32), np.ones((1, 1), f32), np.ones(3, f32))),
]
for what, fn, args in cases:
    try:
        fn(*args)
    except ValueError as e:
        print("OK", what, "|", e)
    else:
        print("ACCEPTED", what)
"""


def test_numba_kernels_validate_raw_arrays():
    """The numba wrappers check indptr (O(M)) and every column inside the loop: ValueError, not a segfault (run in a
    subprocess so that a regression fails this test instead of killing pytest)."""
    p = subprocess.run([sys.executable, "-c", _RAW_NUMBA], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 6 and all(ln.startswith("OK") for ln in lines), p.stdout
    assert "indptr" in lines[0] and "indptr" in lines[1] and "out of range" in lines[2] and "out of range" in lines[4]


@pytest.mark.parametrize("backend", ["numpy", "numba", "cpp"])
def test_unchecked_csr_matmul_still_refuses_a_bad_indptr(backend):
    """check=False skips only the construction-time validate; every backend still refuses a corrupt indptr."""
    code = (
        "import numpy as np, tinylearn as tl\n"
        "A = tl.sparse.CSR([0, 5, 2, 1000], [0, 1, 2], np.ones(3, np.float32), (3, 3), check=False)\n"
        "for x in (np.ones(3, np.float32), np.ones((3, 4), np.float32)):\n"
        "    try:\n"
        f"        A.matmul(x, backend={backend!r})\n"
        "    except ValueError as e:\n"
        "        print('ValueError', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith("ValueError") and "indptr" in ln for ln in lines), p.stdout
    good = CSR.from_dense(sparse_matrix((5, 4), 0.5))  # and a valid unchecked matrix still multiplies
    unchecked = CSR(good.indptr, good.indices, good.data, good.shape, check=False)
    x = np.ones((4, 2), np.float32)
    assert_close(unchecked.matmul(x, backend=backend), good.to_dense() @ x, "float32")
