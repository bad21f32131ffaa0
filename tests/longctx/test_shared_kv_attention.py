"""tinylearn.nn.shared_kv_attention [Q211]: attention with a shared K/V prefix computed once for all requests,
equal to per-request torch SDPA forward and backward, and the counted K/V bytes equal to the formulas."""

from __future__ import annotations

import pytest
import torch

from tinylearn.nn import shared_kv_attention as skv


def _inputs(s=3, h=2, p=37, ls=9, lq=4, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    return r(s, h, lq, d), r(h, p, d), r(h, p, d), r(s, h, ls, d), r(s, h, ls, d)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [1, 10, 37, 512])
@pytest.mark.parametrize("shape", [(3, 2, 37, 9, 4), (4, 1, 16, 1, 1), (2, 3, 0, 5, 5), (2, 2, 20, 0, 1)])
def test_equal_to_per_sequence_sdpa(causal, block, shape):
    s, h, p, ls, lq = shape
    if causal and ls < lq:
        pytest.skip("causal needs Ls >= Lq")
    ins = _inputs(s, h, p, ls, lq)
    reads = skv.KVReads()
    out = skv.shared_prefix_attention(*ins, block=block, causal=causal, reads=reads)
    k, v = skv.materialize_kv(*ins[1:])
    ref = skv.per_sequence_attention(ins[0], k, v, causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-7)
    g = torch.randn_like(out)
    ga = torch.autograd.grad(out, ins, g, materialize_grads=True)  # P = 0 or Ls = 0: an unused input
    gb = torch.autograd.grad(ref, ins, g, materialize_grads=True)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-7)
    assert reads.total == skv.shared_kv_bytes(s, h, p, ls, 8, elem=8)
    assert reads.prefix == 2 * h * p * 8 * 8


def test_fp32_and_noncontiguous():
    q, kp, vp, ks, vs = (t.detach().float() for t in _inputs(4, 2, 64, 8, 2, 16))
    kp_t = kp.transpose(1, 2).contiguous().transpose(1, 2)  # same values, transposed strides
    out = skv.shared_prefix_attention(q, kp_t, vp, ks, vs, block=16)
    k, v = skv.materialize_kv(kp, vp, ks, vs)
    torch.testing.assert_close(out, skv.per_sequence_attention(q, k, v), atol=1e-5, rtol=1e-4)


def test_fp64_gradcheck():
    ins = _inputs(2, 1, 5, 3, 2, 3)
    assert torch.autograd.gradcheck(lambda *a: skv.shared_prefix_attention(*a, block=2), ins)


def test_bytes_formulas():
    assert skv.shared_kv_bytes(8, 4, 1000, 10, 64) == 2 * 4 * 64 * (1000 + 80) * 4
    assert skv.per_sequence_kv_bytes(8, 4, 1000, 10, 64) == 2 * 4 * 64 * 8 * 1010 * 4
    assert skv.per_sequence_kv_bytes(8, 4, 1000, 10, 64) > 7 * skv.shared_kv_bytes(8, 4, 1000, 10, 64)


def test_bad_inputs():
    q, kp, vp, ks, vs = _inputs()
    with pytest.raises(ValueError, match="k_prefix"):
        skv.shared_prefix_attention(q, kp[:, :, :4], vp, ks, vs)
    with pytest.raises(ValueError, match="k_suffix"):
        skv.shared_prefix_attention(q, kp, vp, ks[:2], vs)
    with pytest.raises(ValueError, match="k_suffix"):
        skv.shared_prefix_attention(q, kp, vp, ks[:, :, :2], vs[:, :, :2], causal=True)
    with pytest.raises(ValueError, match="block"):
        skv.shared_prefix_attention(q, kp, vp, ks, vs, block=0)
    with pytest.raises(ValueError, match="q"):
        skv.shared_prefix_attention(q[0], kp, vp, ks, vs)
    with pytest.raises(TypeError, match="v_prefix"):
        skv.shared_prefix_attention(q, kp, vp.numpy(force=True), ks, vs)
