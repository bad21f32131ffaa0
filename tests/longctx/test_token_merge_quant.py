"""tinylearn.longctx.token_merge_quant [Q233]: the int8 round trip against torch.quantize_per_channel, ToMe recovered
with no bound, the quantization-error bound holding for every merged token (batches, sizes, lam), the merged
attention error against a torch transcription, gradients through the merge against torch autograd, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.longctx import token_merge_quant as tq
from tinylearn.nn import token_merge as tm

# torch's quantized tensors (the oracle) warn that they are deprecated
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per:UserWarning")


def _tokens(seed, b=1, n=64, c=16, clusters=8, spread=0.6):
    """Clusters of near-parallel tokens with log-normal magnitudes: cosine-similar, magnitude-different."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((clusters, c))
    lab = rng.integers(0, clusters, (b, n))
    mag = np.exp(rng.normal(0, spread, (b, n, 1)))
    return ((centers[lab] + 0.05 * rng.standard_normal((b, n, c))) * mag).astype(np.float32)


def test_int8_roundtrip_matches_torch_per_channel():
    x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
    x[1, 2] = 0.0
    flat = torch.from_numpy(x.reshape(-1, 16))
    scale = flat.abs().amax(1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).double()
    ref = torch.quantize_per_channel(flat, scale, torch.zeros(15, dtype=torch.long), 0, torch.qint8).dequantize()
    np.testing.assert_array_equal(tq.int8_roundtrip(x), ref.numpy().reshape(x.shape))
    assert (tq.int8_roundtrip(x)[1, 2] == 0).all()
    with pytest.raises(ValueError, match="x"):
        tq.int8_roundtrip(np.array([1.0, np.nan]))


@pytest.mark.parametrize("protected", [0, 1])
def test_no_bound_is_tome(protected):
    x = _tokens(1, b=2)
    for r in (0, 5, 20):
        got = tq.quant_aware_matching(x, x, r, math.inf, protected=protected)
        ref = tm.bipartite_soft_matching(x, r, protected)
        assert got.r == ref.r
        np.testing.assert_array_equal(got.src_idx, ref.src_idx)
        np.testing.assert_array_equal(got.dst_idx, ref.dst_idx)
        np.testing.assert_array_equal(np.sort(got.unm_idx, -1), np.sort(ref.unm_idx, -1))


def _merged_tokens(mt):
    out = np.zeros((mt.batch, mt.n), bool)
    for b in range(mt.batch):
        out[b, 2 * mt.src_idx[b]] = True
        out[b, 2 * np.unique(mt.dst_idx[b]) + 1] = True
    return out


@pytest.mark.parametrize("bound", [0.05, 0.1, 0.3])
@pytest.mark.parametrize("lam", [0.0, 2.0])
def test_bound_holds_for_every_merged_token(bound, lam):
    x = _tokens(2, b=3)
    mt = tq.quant_aware_matching(x, x, 30, bound, lam=lam)
    err = tq.merge_quant_errors(x, mt)
    merged = _merged_tokens(mt)
    assert mt.r > 0 and merged.any()
    assert err[merged].max() <= bound + 1e-9
    assert err[~merged].max() < 0.02  # unmerged tokens: their own int8 rounding only
    tome = tm.bipartite_soft_matching(x, mt.r)
    assert tq.merge_quant_errors(x, tome).max() > bound  # cosine alone merges magnitude-different tokens


def test_bound_with_sizes_and_similarity_floor():
    x = _tokens(3)
    size = np.random.default_rng(3).integers(1, 4, (1, 64, 1)).astype(np.float64)
    mt = tq.quant_aware_matching(x, x, 30, 0.15, size=size, min_similarity=0.99)
    err = tq.merge_quant_errors(x, mt, size)
    assert mt.r > 0 and err[_merged_tokens(mt)].max() <= 0.15 + 1e-9
    u = x[0] / np.linalg.norm(x[0], axis=-1, keepdims=True)
    cos = (u[2 * mt.src_idx[0]] * u[2 * mt.dst_idx[0] + 1]).sum(-1)
    assert (cos >= 0.99).all()


def test_tighter_bound_merges_fewer_tokens():
    x = _tokens(4)
    rs = [tq.quant_aware_matching(x, x, 32, b).r for b in (0.02, 0.1, 0.3, 1.0, math.inf)]
    assert rs == sorted(rs) and rs[0] < rs[-1] == 32


def _torch_merged_attention(q, k, v, mt, quantize):
    """Size-weighted merge via explicit groups, per-row int8 round trip, proportional attention, in torch fp64."""
    t = [torch.from_numpy(np.asarray(a, np.float64)) for a in (q, k, v)]
    groups = [[2 * int(a)] for a in mt.unm_idx[0]] + [[2 * j + 1] for j in range(mt.n // 2)]
    u = mt.unm_idx.shape[1]
    for s, d in zip(mt.src_idx[0], mt.dst_idx[0]):
        groups[u + int(d)].append(2 * int(s))
    km = torch.stack([t[1][0, g].mean(0) for g in groups])[None]
    vm = torch.stack([t[2][0, g].mean(0) for g in groups])[None]
    size = torch.tensor([float(len(g)) for g in groups], dtype=torch.float64)
    if quantize:

        def rt(z):
            sc = z[0].abs().amax(1) / 127
            sc = torch.where(sc > 0, sc, torch.ones_like(sc))
            zz = torch.quantize_per_channel(z[0].float(), sc, torch.zeros(len(sc), dtype=torch.long), 0, torch.qint8)
            return zz.dequantize().double()[None]

        km, vm = rt(km), rt(vm)
    ref = torch.softmax(t[0] @ t[1].transpose(1, 2) / math.sqrt(q.shape[-1]), -1) @ t[2]
    out = torch.softmax(t[0] @ km.transpose(1, 2) / math.sqrt(q.shape[-1]) + size.log(), -1) @ vm
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("quantize", [False, True])
def test_merged_attention_error_matches_torch(quantize):
    x = _tokens(5)
    q = np.random.default_rng(5).standard_normal((1, 32, 16))
    mt = tq.quant_aware_matching(x, x, 16, 0.2)
    got = tq.merged_attention_error(q, x, x, mt, quantize=quantize)
    assert got == pytest.approx(_torch_merged_attention(q, x, x, mt, quantize), rel=1e-4, abs=1e-7)
    assert tq.merged_attention_error(q, x, x, tm.bipartite_soft_matching(x, 0), quantize=False) < 1e-12


def test_merge_wavg_gradient_through_quant_matching():
    x = _tokens(6)[0].astype(np.float64)
    mt = tq.quant_aware_matching(x, x, 12, 0.2)
    w = np.random.default_rng(6).standard_normal((1, 64 - mt.r, 16))
    xt = tl.Tensor(x[None].copy(), requires_grad=True)
    out, _ = tm.merge_wavg(xt, mt)
    (out * tl.Tensor(w)).sum().backward()
    xr = torch.tensor(x, requires_grad=True)
    groups = [[2 * int(a)] for a in mt.unm_idx[0]] + [[2 * j + 1] for j in range(32)]
    for s, d in zip(mt.src_idx[0], mt.dst_idx[0]):
        groups[mt.unm_idx.shape[1] + int(d)].append(2 * int(s))
    ref = torch.stack([xr[g].mean(0) for g in groups])
    (ref * torch.from_numpy(w[0])).sum().backward()
    np.testing.assert_allclose(out.data[0], ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xt.grad.data[0], xr.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_bad_inputs():
    x = _tokens(7)
    with pytest.raises(ValueError, match="bound"):
        tq.quant_aware_matching(x, x, 4, -0.1)
    with pytest.raises(ValueError, match="bound"):
        tq.quant_aware_matching(x, x, 4, float("nan"))
    with pytest.raises(ValueError, match="x"):
        tq.quant_aware_matching(x, x[:, :10], 4, 0.1)
    with pytest.raises(ValueError, match="min_similarity"):
        tq.quant_aware_matching(x, x, 4, 0.1, min_similarity=2.0)
    with pytest.raises(ValueError, match="lam"):
        tq.quant_aware_matching(x, x, 4, 0.1, lam=-1.0)
    with pytest.raises(ValueError, match="size"):
        tq.quant_aware_matching(x, x, 4, 0.1, size=np.ones((1, 64)))
    with pytest.raises(ValueError, match="size"):
        tq.quant_aware_matching(x, x, 4, 0.1, size=np.zeros((1, 64, 1)))
    with pytest.raises(ValueError, match="r"):
        tq.quant_aware_matching(x, x, -1, 0.1)
    with pytest.raises(TypeError, match="matching"):
        tq.merge_quant_errors(x, None)
    with pytest.raises(TypeError, match="matching"):
        tq.merged_attention_error(x, x, x, "m")
