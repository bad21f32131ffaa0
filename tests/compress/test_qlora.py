"""QLoRALinear / apply_qlora / memory_report (tinylearn.compress.qlora): forward equals a Linear on the dequantized
weight plus the LoRA branch, gradients w.r.t. A, B and x equal torch's on the same dequantized weight (fp32), an
fp64 gradcheck of the LoRA part, no gradient to the NF4 weight, measured weight memory <= 0.3x fp32, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import backends
from tinylearn.autograd import gradcheck
from tinylearn.compress.nf4 import OP, NF4Tensor
from tinylearn.compress.qlora import NF4LinearFunction, QLoRALinear, apply_qlora, memory_report, qlora_layers

BACKENDS = ["numpy"] + (["cpp"] if backends.C_available("compress") else [])


def _layer(in_f: int = 96, out_f: int = 40, r: int = 4, seed: int = 0, bias: bool = True) -> QLoRALinear:
    tl.manual_seed(seed)
    m = QLoRALinear(tl.nn.Linear(in_f, out_f, bias=bias), r=r, alpha=8.0, block_size=32)
    m.lora_B.data[:] = np.random.default_rng(seed).standard_normal(m.lora_B.shape).astype(np.float32) * 0.1
    return m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_grads_match_torch(backend: str, bias: bool) -> None:
    m = _layer(bias=bias)
    rng = np.random.default_rng(1)
    xa = rng.standard_normal((2, 40, 96)).astype(np.float32)[:, ::2]  # non-contiguous
    w = m.dequantized_weight()
    g = rng.standard_normal((2, 20, 40)).astype(np.float32)
    with backends.use(OP, backend=backend):
        x = tl.Tensor(xa, requires_grad=True)
        y = m(x)
        y.backward(tl.Tensor(g))
    xt = torch.tensor(xa, requires_grad=True)
    at = torch.tensor(m.lora_A.data, requires_grad=True)
    bt = torch.tensor(m.lora_B.data, requires_grad=True)
    bias_t = torch.tensor(m.bias.data) if bias else None
    yt = torch.nn.functional.linear(xt, torch.tensor(w), bias_t) + (xt @ at.T) @ bt.T * m.scaling
    yt.backward(torch.tensor(g))
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.data, yt.detach().numpy(), **tol)
    np.testing.assert_allclose(x.grad.data, xt.grad.numpy(), **tol)
    np.testing.assert_allclose(m.lora_A.grad.data, at.grad.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(m.lora_B.grad.data, bt.grad.numpy(), rtol=1e-5, atol=1e-4)
    assert not isinstance(getattr(m, "weight", None), tl.nn.Parameter)  # the fp32 weight is gone
    assert all(p.requires_grad is False for n, p in m.named_parameters() if n == "bias")


def test_only_adapter_trains() -> None:
    m = _layer()
    trainable = sorted(n for n, p in m.named_parameters() if p.requires_grad)
    assert trainable == ["lora_A", "lora_B"]
    assert isinstance(m.weight_nf4, NF4Tensor)


def test_lora_part_fp64_gradcheck() -> None:
    m = _layer(in_f=16, out_f=6, r=3)
    rng = np.random.default_rng(2)
    x = tl.Tensor(rng.standard_normal((3, 16)), requires_grad=True, dtype=np.float64)
    a = tl.Tensor(m.lora_A.data.astype(np.float64), requires_grad=True, dtype=np.float64)
    b = tl.Tensor(m.lora_B.data.astype(np.float64), requires_grad=True, dtype=np.float64)
    w = tl.Tensor(m.dequantized_weight().astype(np.float64), dtype=np.float64)
    assert gradcheck(lambda x, a, b: x @ w.T + (x @ a.T) @ b.T * m.scaling, (x, a, b))


def test_nf4_function_x_grad_equals_dequantized() -> None:
    m = _layer(in_f=64, out_f=8)
    rng = np.random.default_rng(3)
    x = tl.Tensor(rng.standard_normal((5, 64)).astype(np.float32), requires_grad=True)
    y = NF4LinearFunction.apply(x, m.weight_nf4)
    g = rng.standard_normal((5, 8)).astype(np.float32)
    y.backward(tl.Tensor(g))
    np.testing.assert_allclose(x.grad.data, g @ m.dequantized_weight(), rtol=1e-5, atol=1e-6)


class _MLP(tl.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = tl.nn.Linear(256, 512)
        self.act = tl.nn.ReLU()
        self.fc2 = tl.nn.Linear(512, 128)
        self.head = tl.nn.Linear(128, 10)

    def forward(self, x: tl.Tensor) -> tl.Tensor:
        return self.head(self.fc2(self.act(self.fc1(x))))


def test_apply_qlora_and_memory_report() -> None:
    tl.manual_seed(0)
    model = _MLP()
    x = tl.Tensor(np.random.default_rng(4).standard_normal((4, 256)).astype(np.float32))
    y0 = model(x).data.copy()
    w_fp32 = model.fc1.weight.data.nbytes + model.fc2.weight.data.nbytes
    apply_qlora(model, ["fc1", "fc2"], r=8, alpha=16)
    assert [n for n, _ in qlora_layers(model)] == ["fc1", "fc2"]
    assert sorted(n for n, p in model.named_parameters() if p.requires_grad) == [
        "fc1.lora_A", "fc1.lora_B", "fc2.lora_A", "fc2.lora_B",
    ]  # fmt: skip
    y1 = model(x).data  # B = 0: the fp32 model with the dequantized weights
    w1, w2 = model.fc1.dequantized_weight(), model.fc2.dequantized_weight()
    h = np.maximum(x.data @ w1.T + model.fc1.bias.data, 0) @ w2.T + model.fc2.bias.data
    np.testing.assert_allclose(y1, h @ model.head.weight.data.T + model.head.bias.data, rtol=1e-5, atol=1e-5)
    assert np.abs(y1 - y0).max() < 0.3 * np.abs(y0).max()  # NF4 error of uniform-init weights, two layers deep
    rep = memory_report(model)
    measured = sum(m.weight_nf4.codes.nbytes + m.weight_nf4.absmax.nbytes for _, m in qlora_layers(model))
    assert rep["fp32_weight_bytes"] == w_fp32
    assert measured <= rep["nf4_weight_bytes"] <= measured + 64
    assert rep["weight_ratio"] <= 0.3
    assert rep["weight_bits_per_param"] == pytest.approx(4.127, abs=0.01)
    assert rep["lora_params"] == 8 * (256 + 512) + 8 * (512 + 128)
    assert rep["total_bytes"] < rep["fp32_total_bytes"]
    # one training step moves only the adapter
    opt = tl.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loss = (model(x) ** 2).mean()
    loss.backward()
    head_w = model.head.weight.data.copy()
    opt.step()
    assert np.abs(model.fc1.lora_B.data).max() > 0
    np.testing.assert_array_equal(model.head.weight.data, head_w)


def test_bad_input() -> None:
    lin = tl.nn.Linear(64, 16)
    with pytest.raises(ValueError, match="r"):
        QLoRALinear(lin, r=0, alpha=8)
    with pytest.raises(ValueError, match="r"):
        QLoRALinear(lin, r=17, alpha=8)
    with pytest.raises(ValueError, match="alpha"):
        QLoRALinear(lin, r=4, alpha=0)
    with pytest.raises(ValueError, match="block_size"):
        QLoRALinear(lin, r=4, alpha=8, block_size=1)
    with pytest.raises(TypeError, match="base"):
        QLoRALinear(object(), r=4, alpha=8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fc1"):
        apply_qlora(_MLP(), ["nope"], r=4, alpha=8)
    with pytest.raises(ValueError, match="x"):
        QLoRALinear(lin, r=4, alpha=8)(tl.Tensor(np.zeros((2, 63), np.float32)))
    with pytest.raises(TypeError, match="model"):
        memory_report(object())  # type: ignore[arg-type]
