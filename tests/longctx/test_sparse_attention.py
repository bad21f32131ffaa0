"""tinylearn.nn.sparse_attention: the block-pattern DSL, block-sparse attention (numpy reference and every C++ path)
against torch SDPA with the equivalent dense boolean mask, the block-sparse backward against torch autograd and
fp64 gradcheck, and the per-layer pattern choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import backends
from tinylearn.nn import sparse_attention as sa
from tinylearn.nn.sparse_attention import causal, dense, global_tokens, local, random_blocks, strided

HAS_C = sa._c_ok()
needs_c = pytest.mark.skipif(not HAS_C, reason="tinylearn._C.longctx (block_sparse_attention) not built")

FP32 = dict(rtol=1e-4, atol=1e-5)
FP64 = dict(rtol=1e-7, atol=1e-10)


def _torch_ref(q, k, v, mask, scale=None, dtype=torch.float64):
    t = [torch.from_numpy(np.ascontiguousarray(a)).to(dtype) for a in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(mask), scale=scale)
    return o.numpy()


def _qkv(rng, lead, nq, nk, d, dv, dtype=np.float32):
    return (
        rng.standard_normal(lead + (nq, d)).astype(dtype),
        rng.standard_normal(lead + (nk, d)).astype(dtype),
        rng.standard_normal(lead + (nk, dv)).astype(dtype),
    )


def _cpp_versions() -> list[str]:
    if not HAS_C:
        return []
    out = ["simd", "scalar"]
    c = backends.load_C("longctx")
    for v in ("avx2", "avx512"):
        try:
            c.block_sparse_attention_path(v)
            out.append(v)
        except ValueError:
            pass
    return out


# ---------------------------------------------------------------------------------------------------- the DSL
def test_block_masks_of_each_primitive() -> None:
    n = 8 * 16
    loc = local(1).layout(n, n, 16).mask
    assert loc.sum() == 8 * 3 - 2 and loc[3, 2] and loc[3, 4] and not loc[3, 5]
    g = global_tokens(20).layout(n, n, 16).mask  # 20 tokens -> 2 blocks
    assert g[:2].all() and g[:, :2].all() and not g[2:, 2:].any()
    s = strided(3).layout(n, n, 16).mask
    assert s[6, 0] and s[6, 3] and s[0, 6] and not s[6, 1]
    r1, r2 = random_blocks(3, seed=7).layout(n, n, 16).mask, random_blocks(3, seed=7).layout(n, n, 16).mask
    assert (r1 == r2).all() and (r1.sum(axis=1) == 3).all()
    assert not (r1 == random_blocks(3, seed=8).layout(n, n, 16).mask).all()
    assert dense().layout(n, n, 16).density == 1.0


def test_composition_and_causal_modifier() -> None:
    n, bs = 10 * 8, 8
    p = local(1) | global_tokens(8) | strided(4)
    m = p.layout(n, n, bs).mask
    want = local(1).layout(n, n, bs).mask | global_tokens(8).layout(n, n, bs).mask | strided(4).layout(n, n, bs).mask
    assert (m == want).all()
    both = (local(2) & strided(2)).layout(n, n, bs).mask
    assert (both == (local(2).layout(n, n, bs).mask & strided(2).layout(n, n, bs).mask)).all()
    lc = (local(2) | causal()).layout(n, n, bs)
    assert lc.causal and (lc.mask == (local(2).layout(n, n, bs).mask & np.tril(np.ones((10, 10), bool)))).all()
    assert ((local(2) & causal()).layout(n, n, bs).mask == lc.mask).all()
    assert ((causal() | local(2)).layout(n, n, bs).mask == lc.mask).all()
    c = causal().layout(n, n, bs)
    assert c.causal and (c.dense_mask() == np.tril(np.ones((n, n), bool))).all()
    # the token mask is the block mask repeated, cut to (nq, nk), and causal on top
    lay = (local(1) | causal()).layout(37, 37, 8)
    tm = lay.dense_mask()
    assert tm.shape == (37, 37) and tm[36, 36] and not tm[20, 21] and tm[20, 8] and not tm[20, 7]
    assert lay.row_ptr[-1] == lay.nnz == len(lay.cols)


def test_layout_density_and_csr() -> None:
    lay = (local(0) | global_tokens(16)).layout(256, 256, 16)
    nb = 16
    assert lay.nnz == nb + 2 * (nb - 1)  # the diagonal + first row + first column (minus shared corner)
    assert lay.density == pytest.approx(lay.nnz / nb**2)
    for b in range(nb):
        cols = lay.cols[lay.row_ptr[b] : lay.row_ptr[b + 1]]
        assert (np.diff(cols) > 0).all() and set(cols) == set(np.nonzero(lay.mask[b])[0])


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="window_blocks"):
        local(-1)
    with pytest.raises(ValueError, match="stride"):
        strided(0)
    with pytest.raises(TypeError, match="window_blocks"):
        local(1.5)
    with pytest.raises(ValueError, match="block_size"):
        local(1).layout(64, 64, 0)
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, (2,), 32, 32, 8, 8)
    with pytest.raises(TypeError, match="pattern"):
        sa.block_sparse_attention(q, k, v, "local")
    with pytest.raises(ValueError, match="layout"):
        sa.block_sparse_attention(q, k, v, local(1).layout(48, 48, 16))
    with pytest.raises(ValueError, match="k: last dim"):
        sa.block_sparse_attention(q, k[..., :4], v, local(1), 16)
    with pytest.raises(ValueError, match="v: must have"):
        sa.block_sparse_attention(q, k, v[:, :20], local(1), 16)
    with pytest.raises(TypeError, match="q: must be a floating"):
        sa.block_sparse_attention(q.astype(np.int32), k, v, local(1), 16)
    with pytest.raises(ValueError, match="backend"):
        sa.block_sparse_attention(q, k, v, local(1), 16, backend="nope")


# ------------------------------------------------------------------------------------------------ the forward
PATTERNS = [
    ("local", local(1), 16),
    ("longformer", local(1) | global_tokens(16), 16),
    ("bigbird", local(1) | global_tokens(8) | random_blocks(2, seed=3), 16),
    ("strided", local(0) | strided(3), 16),
    ("causal_window", local(2) | causal(), 16),
    ("causal_dense", causal(), 32),
    ("dense", dense(), 32),
    ("odd_block", local(1) | global_tokens(5) | causal(), 24),
]


@pytest.mark.parametrize("name,pattern,bs", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_numpy_reference_matches_torch(name: str, pattern, bs: int) -> None:
    rng = np.random.default_rng(len(name))
    q, k, v = _qkv(rng, (2, 3), 150, 150, 24, 20)
    mask = pattern.layout(150, 150, bs).dense_mask()
    ref = _torch_ref(q, k, v, mask)
    o = sa.block_sparse_attention(q, k, v, pattern, bs, backend="numpy")
    assert o.shape == (2, 3, 150, 20) and o.dtype == np.float32
    np.testing.assert_allclose(o, ref, **FP32, err_msg=name)
    o64 = sa.block_sparse_attention(*(a.astype(np.float64) for a in (q, k, v)), pattern, bs, backend="numpy")
    np.testing.assert_allclose(o64, ref, **FP64, err_msg=name)


@needs_c
@pytest.mark.parametrize("name,pattern,bs", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_cpp_versions_match_torch(name: str, pattern, bs: int) -> None:
    rng = np.random.default_rng(100 + len(name))
    for nq, d, dv in ((150, 24, 20), (130, 64, 64), (70, 17, 40)):
        q, k, v = _qkv(rng, (2, 2), nq, nq, d, dv)
        lay = pattern.layout(nq, nq, bs)
        ref = _torch_ref(q, k, v, lay.dense_mask())
        _, lse_np = sa.block_sparse_attention(q, k, v, lay, backend="numpy", return_lse=True)
        for ver in _cpp_versions():
            o, lse = sa.block_sparse_attention(q, k, v, lay, backend="cpp", version=ver, return_lse=True)
            np.testing.assert_allclose(o, ref, **FP32, err_msg=f"{name} {ver} {(nq, d, dv)}")
            np.testing.assert_allclose(lse, lse_np, rtol=1e-5, atol=1e-5, err_msg=f"lse {name} {ver}")


@needs_c
@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512"])
def test_forced_cpu_features_paths(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    path = sa.block_sparse_attention_path("simd")
    want = {"scalar": ("scalar",), "avx2": ("avx2", "scalar"), "avx512": ("avx512", "avx2", "scalar")}[level]
    assert path in want
    if level == "scalar":
        with pytest.raises(ValueError, match="avx2"):
            sa.block_sparse_attention_path("avx2")
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, (3,), 100, 100, 40, 36)
    lay = (local(1) | global_tokens(16) | causal()).layout(100, 100, 16)
    ref = _torch_ref(q, k, v, lay.dense_mask())
    np.testing.assert_allclose(sa.block_sparse_attention(q, k, v, lay, backend="cpp"), ref, **FP32, err_msg=path)


@needs_c
def test_default_dispatch_and_registration() -> None:
    assert backends.versions(sa.OP, "cpp") == ["simd", "scalar", "avx2", "avx512"]
    assert set(backends.registered(sa.OP)) == {"numpy", "cpp"}
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, (2,), 64, 64, 16, 16)
    assert backends.resolve(sa.OP, args=(q, k, v, None, 1.0))[0] == "cpp"
    q64 = q.astype(np.float64)
    assert backends.resolve(sa.OP, args=(q64, k, v, None, 1.0))[0] == "numpy"  # the C++ kernel is fp32 only
    args, kw = backends.example(sa.OP, rng)
    o_np, lse_np = backends.dispatch(sa.OP, *args, backend="numpy", **kw)
    for ver in _cpp_versions():
        o, lse = backends.dispatch(sa.OP, *args, backend="cpp", version=ver, **kw)
        np.testing.assert_allclose(o, o_np, **FP32)
        np.testing.assert_allclose(lse, lse_np, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["numpy", "cpp"])
def test_non_contiguous_broadcast_and_cross_attention(backend: str) -> None:
    if backend == "cpp" and not HAS_C:
        pytest.skip("tinylearn._C.longctx not built")
    rng = np.random.default_rng(11)
    qt = rng.standard_normal((2, 24, 90)).astype(np.float32).transpose(0, 2, 1)  # [2, 90, 24] transposed view
    kbig = rng.standard_normal((1, 200, 48)).astype(np.float32)[:, ::2, ::2]  # [1, 100, 24] strided, broadcast
    v = np.asfortranarray(rng.standard_normal((2, 100, 12)).astype(np.float32))
    assert not qt.flags.c_contiguous and not kbig.flags.c_contiguous
    pattern = local(1) | global_tokens(16)
    lay = pattern.layout(90, 100, 16)  # cross attention: nq != nk
    ref = _torch_ref(qt, np.broadcast_to(kbig, (2, 100, 24)), v, lay.dense_mask(), scale=0.3)
    o = sa.block_sparse_attention(qt, kbig, v, pattern, 16, scale=0.3, backend=backend)
    np.testing.assert_allclose(o, ref, **FP32)


@pytest.mark.parametrize("backend", ["numpy", "cpp"])
def test_rows_without_any_key_give_zero(backend: str) -> None:
    if backend == "cpp" and not HAS_C:
        pytest.skip("tinylearn._C.longctx not built")
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (2,), 64, 64, 8, 8)
    pattern = random_blocks(1, seed=0) & strided(2)  # some query blocks keep no key block
    lay = pattern.layout(64, 64, 16)
    dead = ~lay.mask.any(axis=1)
    assert dead.any() and not dead.all()
    o, lse = sa.block_sparse_attention(q, k, v, lay, backend=backend, return_lse=True)
    rows = np.repeat(dead, 16)
    assert (o[:, rows] == 0).all() and np.isneginf(lse[:, rows]).all()
    mask = lay.dense_mask()
    live = ~rows
    ref = _torch_ref(q[:, live], k, v, mask[live])
    np.testing.assert_allclose(o[:, live], ref, **FP32)


# ------------------------------------------------------------------------------------------------ the backward
@pytest.mark.parametrize("backend", ["numpy", "cpp"])
@pytest.mark.parametrize("pattern", [local(1) | global_tokens(8), local(1) | strided(3) | causal()], ids=["lf", "c"])
def test_backward_matches_torch_autograd(backend: str, pattern) -> None:
    if backend == "cpp" and not HAS_C:
        pytest.skip("tinylearn._C.longctx not built")
    rng = np.random.default_rng(21)
    q, k, v = _qkv(rng, (2, 2), 72, 72, 16, 12)
    g = rng.standard_normal((2, 2, 72, 12)).astype(np.float32)
    lay = pattern.layout(72, 72, 16)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(lay.dense_mask()))
    to.backward(torch.from_numpy(g).double())
    xq, xk, xv = (tl.Tensor(a, requires_grad=True) for a in (q, k, v))
    o = sa.block_sparse_attention(xq, xk, xv, lay, backend=backend)
    assert isinstance(o, tl.Tensor)
    o.backward(tl.Tensor(g))
    np.testing.assert_allclose(o.data, to.detach().numpy(), **FP32)
    for x, t in ((xq, tq), (xk, tk), (xv, tv)):
        np.testing.assert_allclose(
            x.grad.data if isinstance(x.grad, tl.Tensor) else x.grad, t.grad.numpy(), rtol=1e-4, atol=2e-5
        )


def test_backward_broadcast_leading_dims() -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 40, 8))
    k = rng.standard_normal((1, 3, 40, 8))
    v = rng.standard_normal((3, 40, 8))
    lay = (local(1) | causal()).layout(40, 40, 8)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    m = torch.from_numpy(lay.dense_mask())
    torch.nn.functional.scaled_dot_product_attention(
        tq, tk.expand(2, 3, 40, 8), tv.expand(2, 3, 40, 8), attn_mask=m
    ).sum().backward()
    xq, xk, xv = (tl.Tensor(a, requires_grad=True) for a in (q, k, v))
    sa.block_sparse_attention(xq, xk, xv, lay).sum().backward()
    for x, t in ((xq, tq), (xk, tk), (xv, tv)):
        gx = x.grad.data if isinstance(x.grad, tl.Tensor) else x.grad
        assert gx.shape == t.shape
        np.testing.assert_allclose(gx, t.grad.numpy(), **FP64)


def test_gradcheck_fp64_tiny() -> None:
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 10, 3)) for _ in range(3))
    lay = (local(0) | global_tokens(2) | causal()).layout(10, 10, 4)

    def f(a, b, c):
        return sa.block_sparse_attention(a, b, c, lay, scale=0.7)

    assert tl.autograd.gradcheck(f, [tl.Tensor(x, requires_grad=True) for x in (q, k, v)])
    lay2 = (local(1) | strided(2)).layout(10, 10, 3)  # a partial last block, no causal
    assert tl.autograd.gradcheck(
        lambda a, b, c: sa.block_sparse_attention(a, b, c, lay2), [tl.Tensor(x, requires_grad=True) for x in (q, k, v)]
    )


# ------------------------------------------------------------------------------------------ per-layer choice
def test_choose_layer_patterns_picks_sparsest_within_tolerance() -> None:
    rng = np.random.default_rng(3)
    n, bs, d = 96, 16, 8
    # layer 0: every query attends (almost) only to keys of its own block -> local(0) is accurate
    onehot = np.eye(d)[np.arange(n) // bs % d] * 6.0
    q0 = onehot[None] + 0.01 * rng.standard_normal((2, n, d))
    v0 = rng.standard_normal((2, n, d))
    # layer 1: diffuse attention over every key -> only dense is accurate
    q1, k1, v1 = (rng.standard_normal((2, n, d)) * 0.3 for _ in range(3))
    cands = [local(0), local(1), local(2) | global_tokens(16)]
    out = sa.choose_layer_patterns([(q0, q0.copy(), v0), [(q1, k1, v1)]], cands, bs, tol=1e-3)
    assert [c.layer for c in out] == [0, 1]
    assert repr(out[0].pattern) == "local(0)" and out[0].error <= 1e-3
    assert out[0].density == pytest.approx(local(0).density(n, n, bs))
    assert repr(out[1].pattern) == "dense()" and out[1].density == 1.0
    # causal: the reference and candidates become causal
    outc = sa.choose_layer_patterns([(q0, q0.copy(), v0)], cands, bs, tol=1e-3, is_causal=True)
    assert outc[0].pattern.causal and outc[0].error <= 1e-3
    with pytest.raises(ValueError, match="candidates"):
        sa.choose_layer_patterns([(q0, q0, v0)], [], bs)
    with pytest.raises(ValueError, match="tol"):
        sa.choose_layer_patterns([(q0, q0, v0)], cands, bs, tol=-1.0)
