"""tinylearn.nn.multiscale_attention [Q168]: local-exact + block-summary attention with a precision per scale,
checked against one torch SDPA call (masked keys [K | summaries]) forward and backward, the exact case (constant
blocks == dense), rounding per precision, byte counts, and the precision choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinylearn.nn import multiscale_attention as ms


def _qkv(b=2, h=2, n=32, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("precision", [("fp32", "fp32"), ("bf16", "fp16"), ("fp8", "bf16"), ("fp16", "fp8")])
def test_matches_torch_sdpa_forward_backward(causal, precision):
    q, k, v = _qkv()
    out = ms.multiscale_attention(q, k, v, 8, precision, causal)
    ref = ms.multiscale_reference(q, k, v, 8, precision, causal)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-7)
    g = torch.randn_like(out)
    ga = torch.autograd.grad(out, (q, k, v), g)
    gb = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-7)


def test_fp32_gradcheck():
    q, k, v = _qkv(1, 1, 8, 4)
    assert torch.autograd.gradcheck(lambda a, b, c: ms.multiscale_attention(a, b, c, 4, causal=True), (q, k, v))


def test_constant_blocks_equal_dense_attention():
    # keys and values constant inside each block: a summary with the log(block) bias is exactly the block
    b, h, nb, bs, d = 1, 2, 6, 4, 8
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, nb * bs, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, nb, 1, d, generator=g, dtype=torch.float64).expand(b, h, nb, bs, d).reshape(b, h, -1, d)
    v = torch.randn(b, h, nb, 1, d, generator=g, dtype=torch.float64).expand(b, h, nb, bs, d).reshape(b, h, -1, d)
    out = ms.multiscale_attention(q, k, v, bs)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-10, rtol=1e-7)


def test_block_equal_n_is_dense():
    q, k, v = _qkv(1, 2, 16, 8)
    for causal in (False, True):
        out = ms.multiscale_attention(q, k, v, 16, causal=causal)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))


@pytest.mark.parametrize("p, tol", [("bf16", 2**-8), ("fp16", 2**-11), ("fp8", 2**-3)])
def test_round_to_relative_error_and_ste(p, tol):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 3
    x.requires_grad_()
    r = ms.round_to(x, p)
    big = x.detach().abs() > 0.5  # fp8 loses relative precision on the subnormals under the per-tensor scale
    rel = ((r - x).abs() / x.abs())[big]
    assert rel.max() <= tol * 1.0001
    assert rel.max() > 0  # it did round
    assert not torch.equal(r, x)
    r.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_kv_bytes_counts():
    nb = ms.kv_bytes((2, 4, 64, 16), 8, ("bf16", "fp32"))
    assert nb["local"] == 2 * 2 * 4 * 64 * 16 * 2
    assert nb["global"] == 2 * 2 * 4 * 8 * 16 * 4
    assert nb["dense_fp32"] == 2 * 2 * 4 * 64 * 16 * 4
    f8 = ms.kv_bytes((2, 4, 64, 16), 8, "fp8")
    assert f8["local"] == 2 * 2 * 4 * 64 * 16 + 8
    assert ms.score_elements(1024, 32) == {"multiscale": 1024 * 64, "dense": 1024 * 1024}


def test_sweep_and_choice_keep_summaries_precise():
    q, k, v = (t.detach().float() for t in _qkv(1, 4, 256, 32, seed=3))
    res = ms.precision_sweep(q, k, v, 16)
    assert len(res) == 16
    by = {(r.local, r.global_): r for r in res}
    assert by[("fp32", "fp32")].err_vs_fp32 == 0.0
    # error per byte saved: lowering the summaries to fp8 costs far more error per byte than lowering the tokens
    full = by[("fp32", "fp32")].kv_bytes
    loc, glb = by[("fp8", "fp32")], by[("fp32", "fp8")]
    per_byte_loc = loc.err_vs_fp32 / (full - loc.kv_bytes)
    per_byte_glb = glb.err_vs_fp32 / (full - glb.kv_bytes)
    assert per_byte_glb > 5 * per_byte_loc
    pick = ms.choose_precision(res, 5e-3)
    assert pick.err_vs_fp32 <= 5e-3
    assert pick.global_ in ("fp32", "fp16", "bf16")
    assert all(r.kv_bytes >= pick.kv_bytes for r in res if r.err_vs_fp32 <= 5e-3)
    with pytest.raises(ValueError, match="tol"):
        ms.choose_precision(res, 1e-12 if min(r.err_vs_fp32 for r in res) > 0 else -1)


def test_bad_inputs():
    q, k, v = _qkv(1, 1, 12, 4)
    with pytest.raises(ValueError, match="block"):
        ms.multiscale_attention(q, k, v, 5)
    with pytest.raises(ValueError, match="precision"):
        ms.multiscale_attention(q, k, v, 4, ("fp32", "int4"))
    with pytest.raises(ValueError, match="q"):
        ms.multiscale_attention(q[0], k, v, 4)
    with pytest.raises(ValueError, match="k, v"):
        ms.multiscale_attention(q, k[:, :, :8], v, 4)
    with pytest.raises(TypeError, match="block"):
        ms.multiscale_attention(q, k, v, 4.0)
