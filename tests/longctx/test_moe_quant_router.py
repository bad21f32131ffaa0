"""Routing under quantization error (Q242, MODEL): the per-channel fake quantization equals tinylearn.quant's
groupwise grid; the simulated fp32 MoE output equals TorchMoE (top-1, dropless) holding the same weights; the
untrained policy is the plain router; after REINFORCE the greedy policy's output error vs the fp32 MoE is well below
the plain top-1 router's on quantized experts and no better than the per-token oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinylearn.nn import moe_quant_router as QR
from tinylearn.parallel.moe_parallel import TorchMoE
from tinylearn.quant.int4 import dequantize_groupwise, quantize_groupwise

BITS = [4, 8, 4, 8, 4, 8, 4, 8]


@pytest.mark.parametrize("bits", [4, 8])
def test_fake_quant_matches_tinylearn_quant(bits: int) -> None:
    w = torch.randn(16, 24, generator=torch.Generator().manual_seed(bits))
    w[3] *= 10
    got = QR.fake_quant_per_channel(w, bits)
    q, s, z = quantize_groupwise(w.T.numpy(), group_size=16, bits=bits)
    ref = dequantize_groupwise(q, s, z, 16).T
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-6, atol=1e-7)
    assert not torch.equal(got, w)


def test_fp32_moe_output_matches_torch_moe() -> None:
    W = QR.make_moe(seed=3)
    qe = QR.QuantizedExperts(W, BITS)
    moe = TorchMoE(16, 32, 8, top_k=1, dropless=True)
    with torch.no_grad():
        moe.router_weight.copy_(W["router"])
        moe.w1.copy_(W["w1"] * W["in_scale"][None, :, None])
        moe.b1.copy_(W["b1"])
        moe.w2.copy_(W["w2"])
        moe.b2.copy_(W["b2"])
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    _, _, ref, yq = QR._outputs(qe, x)
    torch.testing.assert_close(ref, moe(x).detach(), rtol=1e-4, atol=1e-5)
    top = qe.router_logits(x).argmax(-1)
    assert float(QR._rel_err(yq[torch.arange(64), top], ref).mean()) > 1e-3  # int4 experts really lose accuracy


def test_untrained_policy_is_plain_router_and_trained_policy_helps() -> None:
    W = QR.make_moe(seed=0)
    qe = QR.QuantizedExperts(W, BITS)
    err = QR.expert_error_stats(qe, torch.randn(1024, 16, generator=torch.Generator().manual_seed(5)))
    assert float(err[[0, 2, 4, 6]].min()) > 10 * float(err[[1, 3, 5, 7]].max())  # int4 experts are the bad ones
    x = torch.randn(2048, 16, generator=torch.Generator().manual_seed(9))
    ev0 = QR.evaluate(qe, err, QR.QuantAwareRouter(16, 8), x)
    assert ev0["policy"]["switched"] == 0.0
    assert ev0["policy"]["rel_err"] == pytest.approx(ev0["plain"]["rel_err"])
    pol, curve = QR.train_policy(qe, err, steps=150, lr=1e-2, load_penalty=0.05)
    assert np.mean(curve[-20:]) > np.mean(curve[:20])
    ev = QR.evaluate(qe, err, pol, x)
    assert ev["policy"]["rel_err"] < 0.5 * ev["plain"]["rel_err"]
    assert ev["policy"]["rel_err"] >= ev["oracle"]["rel_err"] - 1e-9
    assert sum(ev["policy"]["load"]) == 2048


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="bits"):
        QR.fake_quant_per_channel(torch.ones(2, 2), 1)
    with pytest.raises(ValueError, match="w: expected"):
        QR.fake_quant_per_channel(torch.ones(2), 4)
    with pytest.raises(ValueError, match="bits"):
        QR.QuantizedExperts(QR.make_moe(), [4, 8])
    with pytest.raises(ValueError, match="candidates"):
        QR.QuantAwareRouter(16, 8, candidates=9)
    with pytest.raises(ValueError, match="outlier_scale"):
        QR.make_moe(outlier_scale=0.5)
    with pytest.raises(ValueError, match="steps"):
        QR.train_policy(QR.QuantizedExperts(QR.make_moe(), BITS), torch.ones(8), steps=0)
