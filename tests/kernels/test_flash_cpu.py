"""The C++ flash-attention forward rungs (cpp_src/kernels_flash_attention.cpp: tiled, blocked_simd,
blocked_simd_omp) on every CPU path this machine has (TINYLEARN_CPU_FEATURES = scalar / avx2 / avx512), against
torch's scaled_dot_product_attention: causal and not, sequence lengths that are not a multiple of any tile (and
N = 1), head dims 32/64/80/128 (and odd ones that fall back to a narrower path), Nq != Nk, non-contiguous inputs,
batch and head dims; the log-sum-exp the backward uses; the backward fed by the blocked forward, and fp64 gradcheck;
thread-count independence; O(N) extra memory (peak resident set in a subprocess). The backward rungs (tiled,
blocked_simd, blocked_simd_omp: FlashAttention-2 recomputation) on every path against torch autograd of SDPA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

import tinylearn as tl
from tinylearn.kernels import cpu as cpu_k
from tinylearn.kernels import torch_ops
from tinylearn.testing import assert_close, make_array, make_layouts

if not tl.backends.C_available("kernels"):
    pytest.skip("tinylearn._C.kernels not built", allow_module_level=True)
C = tl.backends.load_C("kernels")
VERSIONS = cpu_k.ATTENTION_VERSIONS
BLOCKED = ("blocked_simd", "blocked_simd_omp")


def available_paths() -> list[str]:
    paths = ["scalar"]
    if C.vec_isa() in ("avx2", "avx512"):
        paths.append("avx2")
    if C.vec_isa() == "avx512":
        paths.append("avx512")
    return paths


PATHS = available_paths()


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force one instruction-set level for the test (read by the kernel on every call)."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", request.param)
    return request.param


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=causal)


def qkv(lead: tuple[int, ...], nq: int, nk: int, d: int, dv: int | None = None, seed: int = 0, scale: float = 2.0):
    dv = d if dv is None else dv
    return (
        make_array(lead + (nq, d), seed=seed, low=-scale, high=scale),
        make_array(lead + (nk, d), seed=seed + 1, low=-scale, high=scale),
        make_array(lead + (nk, dv), seed=seed + 2, low=-scale, high=scale),
    )


def test_path_reported(path: str) -> None:
    assert cpu_k.attention_path(64) == path
    assert cpu_k.attention_path(80) == path  # 80 = 5 x 16 = 10 x 8
    assert cpu_k.attention_path(20) == "scalar"  # 20 is no multiple of 8 lanes
    assert cpu_k.attention_path(8) == ("scalar" if path == "scalar" else "avx2")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("d", [32, 64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_rungs_vs_sdpa(path: str, version: str, d: int, causal: bool) -> None:
    for n in (1, 63, 130):  # 130: past two 64-key tiles, not a multiple of the 6-row register tile either
        q, k, v = qkv((2, 3), n, n, d, seed=n + d)
        o = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", version=version)
        assert o.shape == (2, 3, n, d) and o.dtype == np.float32
        assert_close(o, sdpa(q, k, v, causal), "float32", reduction_size=n)


@pytest.mark.parametrize("version", BLOCKED)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("nq", "nk", "d", "dv"), [(70, 33, 32, 32), (33, 70, 64, 16), (17, 200, 20, 20), (9, 9, 8, 24)]
)
def test_rectangular_and_odd_dims(path: str, version: str, causal: bool, nq: int, nk: int, d: int, dv: int) -> None:
    """Nq != Nk (causal is top-left aligned, like torch), Dv != D, head dims that force the narrower paths."""
    q, k, v = qkv((1, 2), nq, nk, d, dv, seed=nq * nk)
    o = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", version=version)
    assert_close(o, sdpa(q, k, v, causal), "float32", reduction_size=nk)


@pytest.mark.parametrize("version", BLOCKED)
@pytest.mark.parametrize("block", [1, 5, 16, 64, 100, 1000])
def test_block_sizes(path: str, version: str, block: int) -> None:
    q, k, v = qkv((2, 2), 131, 131, 64, seed=block)
    for causal in (False, True):
        o = tl.kernels.flash_attention(q, k, v, causal, block_size=block, backend="cpu", version=version)
        assert_close(o, sdpa(q, k, v, causal), "float32", reduction_size=131)


@pytest.mark.parametrize("version", VERSIONS)
def test_non_contiguous_and_batch_dims(version: str) -> None:
    shape = (2, 3, 37, 32)
    for (lq, q), (_, k), (_, v) in zip(
        make_layouts(shape, seed=1), make_layouts(shape, seed=20), make_layouts(shape, seed=40), strict=True
    ):
        for causal in (False, True):
            o = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", version=version)
            assert_close(o, sdpa(q, k, v, causal), "float32", reduction_size=37, msg=lq)
    # [heads, N, D] (one leading dim) and [b1, b2, heads, N, D] (three)
    for lead in ((4,), (2, 1, 3)):
        q, k, v = qkv(lead, 29, 29, 64, seed=len(lead))
        o = tl.kernels.flash_attention(q, k, v, True, backend="cpu", version=version)
        assert_close(o, sdpa(q, k, v, True), "float32", reduction_size=29)


@pytest.mark.parametrize("version", BLOCKED)
def test_lse_and_large_logits(path: str, version: str) -> None:
    q, k, v = qkv((1, 2), 70, 70, 64, seed=7, scale=6.0)  # |scores| up to ~36 / 8 * 64: exp overflows without m
    for causal in (False, True):
        o, lse = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", version=version, return_lse=True)
        assert np.isfinite(o).all()
        assert_close(o, sdpa(q, k, v, causal), "float32", reduction_size=70)
        s = _t(q).double() @ _t(k).double().transpose(-1, -2) / 8.0
        if causal:
            s = s.masked_fill(torch.ones(70, 70, dtype=torch.bool).triu(1), float("-inf"))
        assert_close(lse, torch.logsumexp(s, -1).float(), "float32", reduction_size=70)


def test_rungs_agree_across_threads() -> None:
    """Each (head, query block) is computed by one thread in a fixed order: blocked_simd_omp at any thread count is
    bit-identical to blocked_simd."""
    q, k, v = qkv((2, 4), 300, 300, 64, seed=3)
    for causal in (False, True):
        one = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", version="blocked_simd")
        for n in (1, 2, 3):
            with threadpool_limits(n):
                omp = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", version="blocked_simd_omp")
            np.testing.assert_array_equal(omp, one)


def test_default_version_and_float64() -> None:
    q, k, v = qkv((1, 2), 50, 50, 32, seed=9)
    default = tl.kernels.flash_attention(q, k, v, True, backend="cpu")
    np.testing.assert_array_equal(
        default, tl.kernels.flash_attention(q, k, v, True, backend="cpu", version="blocked_simd")
    )
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    for version in VERSIONS:  # float64 runs the tiled rung under every name
        o = tl.kernels.flash_attention(q64, k64, v64, True, backend="cpu", version=version)
        assert o.dtype == np.float64
        assert_close(o, sdpa(q64, k64, v64, True), "float64", reduction_size=50)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_from_blocked_forward(causal: bool) -> None:
    """The backward recomputes P from the forward's lse: feed it the default (blocked) rung's (o, lse)."""
    q, k, v = qkv((2, 2), 45, 45, 64, seed=11)
    do = make_array(q.shape, seed=12)
    o, lse = tl.kernels.flash_attention(q, k, v, causal, backend="cpu", return_lse=True)
    grads = tl.kernels.flash_attention_backward(q, k, v, o, lse, do, causal, backend="cpu")
    tq, tk, tv = (_t(a).requires_grad_() for a in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(_t(do))
    for g, tg in zip(grads, (tq.grad, tk.grad, tv.grad), strict=True):
        assert_close(g, tg, "float32", reduction_size=45)
    # through torch autograd (torch_ops): float32 forward on the default rung, float64 gradcheck
    tq32 = _t(q).requires_grad_()
    out = torch_ops.flash_attention(tq32, _t(k), _t(v), causal)
    assert_close(out.detach(), sdpa(q, k, v, causal), "float32", reduction_size=45)
    out.backward(_t(do))
    assert_close(tq32.grad, tq.grad, "float32", reduction_size=45)
    q64 = torch.randn(1, 2, 7, 8, dtype=torch.float64, requires_grad=True)
    k64, v64 = (torch.randn(1, 2, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda a, b, c: torch_ops.flash_attention(a, b, c, causal, 4), (q64, k64, v64))


def test_bad_version_and_block() -> None:
    q = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="version"):
        C.flash_attention_forward(q[0], q[0], q[0], False, 16, "fastest")
    with pytest.raises(ValueError, match="version"):
        tl.kernels.flash_attention(q, q, q, backend="cpu", version="fastest")
    with pytest.raises(ValueError, match="block_size"):
        C.flash_attention_forward(q[0], q[0], q[0], False, 0, "blocked_simd")


_RSS_CODE = """
import json, sys, numpy as np
from tinylearn.kernels import ops
from tinylearn.kernels.bench import peak_rss_growth_mb
n, heads = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, heads, n, 64), dtype=np.float32) for _ in range(3))
out = {}
for version in sys.argv[3].split(","):
    f = lambda: ops.flash_attention(q, k, v, True, backend="cpu", version=version)
    f()
    out[version] = peak_rss_growth_mb(f)
print(json.dumps(out))
"""


def _peak_rss_growth(code: str, n: int, heads: int, **env: str) -> dict[str, float]:
    """Run ``code`` (one of the _RSS_* scripts) in a subprocess for every version: {version: peak RSS growth in MB of
    one call}. glibc's mmap threshold is 64 KiB so big buffers go back to the OS on free."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak RSS")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0", **env)
    r = subprocess.run(
        [sys.executable, "-c", code, str(n), str(heads), ",".join(VERSIONS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_extra_memory_is_linear_in_n() -> None:
    """Peak resident-set growth of one call: the output and lse plus per-thread tiles, far below one [heads, N, N]
    score matrix."""
    n, heads = 2048, 2
    mb = _peak_rss_growth(_RSS_CODE, n, heads)
    scores_mb = heads * n * n * 4 / 2**20  # 32 MB
    out_mb = heads * n * 64 * 4 / 2**20  # 1 MB
    for version, grew in mb.items():
        assert grew < out_mb + 4, (version, grew)  # output + lse + tiles; an N x N buffer would add 32 MB
        assert grew < scores_mb / 8, (version, grew)


# ---- backward rungs ------------------------------------------------------------------------------------------
def torch_grads(q, k, v, do, causal: bool) -> tuple[torch.Tensor, ...]:
    """torch autograd of SDPA in float64 (the reference the float32 rungs are compared with)."""
    tq, tk, tv = (_t(a).double().requires_grad_() for a in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(_t(do).double())
    return tq.grad, tk.grad, tv.grad


def c_backward(q, k, v, do, causal: bool, version: str, block: int = 64) -> tuple[np.ndarray, ...]:
    """The C++ backward on [BH, N, D] arrays, fed by the default forward's (o, lse)."""
    o, lse = C.flash_attention_forward(q, k, v, causal, 64, "blocked_simd_omp")
    return tuple(C.flash_attention_backward(q, k, v, o, lse, do, causal, block, version))


def test_backward_path_reported(path: str) -> None:
    """The backward needs whole vectors in dQ/dK rows (D) and dV rows (Dv): the widest width dividing both."""
    assert C.flash_attention_backward_path(64, 64) == path
    assert C.flash_attention_backward_path(64, 24) == ("scalar" if path == "scalar" else "avx2")
    assert C.flash_attention_backward_path(20, 64) == "scalar"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("bh", "nq", "nk", "d", "dv"),
    [
        (3, 130, 130, 64, 64),
        (2, 1, 1, 32, 32),
        (2, 70, 33, 32, 32),
        (1, 33, 70, 64, 16),
        (2, 17, 200, 20, 20),
        (1, 9, 9, 8, 24),
        (2, 65, 65, 128, 128),
    ],
)
def test_backward_rungs_vs_torch(path: str, version: str, causal: bool, bh: int, nq: int, nk: int, d: int, dv: int):
    """dq, dk, dv of every rung on every path against torch autograd (odd N, N = 1, Nq != Nk, odd / mixed D)."""
    rng = np.random.default_rng(nq * 31 + nk + d)
    q, k = (rng.uniform(-2, 2, (bh, n, d)).astype(np.float32) for n in (nq, nk))
    v, do = rng.uniform(-2, 2, (bh, nk, dv)).astype(np.float32), rng.uniform(-1, 1, (bh, nq, dv)).astype(np.float32)
    grads = c_backward(q, k, v, do, causal, version)
    for name, g, tg in zip("qkv", grads, torch_grads(q, k, v, do, causal), strict=True):
        assert g.dtype == np.float32 and g.shape == tg.shape
        assert_close(g, tg.float(), "float32", reduction_size=max(nq, nk) * max(d, dv), msg=f"d{name}")


@pytest.mark.parametrize("version", BLOCKED)
@pytest.mark.parametrize("block", [1, 5, 16, 100, 1000])
def test_backward_block_sizes(path: str, version: str, block: int) -> None:
    """block_size is the query rows per tile (rounded up to whole vectors by the blocked rungs)."""
    rng = np.random.default_rng(block)
    q, k, v, do = (rng.uniform(-2, 2, (2, 131, 64)).astype(np.float32) for _ in range(4))
    for causal in (False, True):
        grads = c_backward(q, k, v, do, causal, version, block)
        for g, tg in zip(grads, torch_grads(q, k, v, do, causal), strict=True):
            assert_close(g, tg.float(), "float32", reduction_size=131 * 64)


def test_backward_large_logits_and_masked_rows() -> None:
    """Scores far beyond exp's range are handled by the saved lse; a fully masked row (lse = -inf, made by hand:
    causal never masks a whole row) gets P = 0, hence zero gradients, never NaN."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.uniform(-6, 6, (2, 70, 64)).astype(np.float32) for _ in range(3))
    do = rng.uniform(-1, 1, (2, 70, 64)).astype(np.float32)
    for version in BLOCKED:
        for causal in (False, True):
            grads = c_backward(q, k, v, do, causal, version)
            assert all(np.isfinite(g).all() for g in grads)
            for g, tg in zip(grads, torch_grads(q, k, v, do, causal), strict=True):
                assert_close(g, tg.float(), "float32", reduction_size=70 * 64)
        o, lse = C.flash_attention_forward(q, k, v, False, 64, "blocked_simd")
        lse[:, 3] = -np.inf
        dq, dk, dv = C.flash_attention_backward(q, k, v, o, lse, do, False, 64, version)
        assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
        assert not dq[:, 3].any()


def test_backward_threads() -> None:
    """dK and dV rows belong to one (key block, head) item each: identical at any thread count; dQ sums the
    per-thread buffers, so only its last bits depend on the thread count."""
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.uniform(-2, 2, (4, 300, 64)).astype(np.float32) for _ in range(4))
    for causal in (False, True):
        one = c_backward(q, k, v, do, causal, "blocked_simd")
        for n in (1, 2, 3):
            with threadpool_limits(n):
                dq, dk, dv = c_backward(q, k, v, do, causal, "blocked_simd_omp")
            np.testing.assert_array_equal(dk, one[1])
            np.testing.assert_array_equal(dv, one[2])
            assert_close(dq, one[0], "float32", reduction_size=300 * 64)


def test_backward_float64_runs_the_scalar_path() -> None:
    """float64 runs the tiled (scalar) backward under every version name; it is what fp64 gradcheck exercises."""
    rng = np.random.default_rng(8)
    q, k, v, do = (rng.standard_normal((2, 23, 16)) for _ in range(4))
    for causal in (False, True):
        o, lse = C.flash_attention_forward(q, k, v, causal, 8, "tiled")
        ref = torch_grads(q, k, v, do, causal)
        for version in VERSIONS:
            grads = C.flash_attention_backward(q, k, v, o, lse, do, causal, 8, version)
            for g, tg in zip(grads, ref, strict=True):
                assert g.dtype == np.float64
                assert_close(g, tg, "float64", reduction_size=23)
    q64 = torch.randn(1, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    k64, v64 = (torch.randn(1, 3, 11, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: torch_ops.flash_attention(a, b, c, causal, 4), (q64, k64, v64)
        )


def test_backward_bad_version() -> None:
    q = np.zeros((1, 4, 8), np.float32)
    lse = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="version"):
        C.flash_attention_backward(q, q, q, q, lse, q, False, 16, "fastest")
    with pytest.raises(ValueError, match="block_size"):
        C.flash_attention_backward(q, q, q, q, lse, q, False, 0, "blocked_simd")


@pytest.mark.parametrize("version", [None, *cpu_k.ATTENTION_VERSIONS])
def test_backward_versions_through_ops(version: str | None) -> None:
    """tl.kernels.flash_attention_backward(version=...) reaches every C++ rung; the result matches torch autograd
    on a non-contiguous batch of heads."""
    from tinylearn.kernels import ops

    rng = np.random.default_rng(7)
    q, k, v = (np.swapaxes(rng.standard_normal((2, 70, 3, 32)).astype(np.float32), 1, 2) for _ in range(3))
    o, lse = ops.flash_attention(q, k, v, causal=True, return_lse=True)
    do = rng.standard_normal(o.shape).astype(np.float32)
    grads = ops.flash_attention_backward(q, k, v, o, lse, do, causal=True, version=version)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(torch.tensor(do))
    for got, t in zip(grads, (tq, tk, tv)):
        assert_close(got, t.grad.numpy(), reduction_size=70)
    with pytest.raises(ValueError, match="not a version"):
        ops.flash_attention_backward(q, k, v, o, lse, do, version="fastest")


def test_bench_fwd_bwd_rows() -> None:
    """`tinylearn bench kernels`' fwd+bwd attention table: every row runs (no timed assert), and every row's callable
    returns the same gradients as torch SDPA's autograd."""
    from tinylearn.kernels import bench

    t = bench.attention_backward_table([40], heads=2, d=16, causal=True)
    assert t.impls() == list(bench.ATTENTION_BWD_IMPLS)
    assert all(r.median_ms is not None and r.median_ms > 0 for r in t.rows)
    q, k, v = bench._attention_inputs(40, 2, 16)
    do = make_array(q.shape, seed=4)
    fns = bench._attention_bwd_fns(q, k, v, do, True)
    ref = [g.numpy().copy() for g in fns["torch sdpa"]()]
    for name in bench.ATTENTION_BWD_IMPLS:
        for g, r in zip(fns[name](), ref, strict=True):
            assert_close(np.asarray(g).reshape(r.shape), r, "float32", reduction_size=40, msg=name)


_RSS_BWD_CODE = """
import json, sys, numpy as np
from tinylearn.backends import load_C
from tinylearn.kernels.bench import peak_rss_growth_mb
C = load_C("kernels")
n, heads = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((heads, n, 64), dtype=np.float32) for _ in range(4))
out = {}
for version in sys.argv[3].split(","):
    o, lse = C.flash_attention_forward(q, k, v, True, 64, "blocked_simd")
    f = lambda: C.flash_attention_backward(q, k, v, o, lse, do, True, 64, version)
    f()
    out[version] = peak_rss_growth_mb(f)
print(json.dumps(out))
"""


def test_backward_extra_memory_is_linear_in_n() -> None:
    """Peak RSS growth of one backward call: dq, dk, dv (3 x q) plus the packed QT, dO^T (2 x q) and one dQ buffer
    per extra thread — a few times the inputs, far below one [heads, N, N] score matrix."""
    n, heads = 2048, 2
    mb = _peak_rss_growth(_RSS_BWD_CODE, n, heads, OMP_NUM_THREADS="2")  # the dQ buffers scale with the threads
    scores_mb = heads * n * n * 4 / 2**20  # 32 MB
    q_mb = heads * n * 64 * 4 / 2**20  # 1 MB
    for version, grew in mb.items():
        assert grew < (5 + 1) * q_mb + 4, (version, grew)  # 2 threads: one extra dQ buffer
        assert grew < scores_mb / 2, (version, grew)
