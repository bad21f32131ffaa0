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


# ---- the adapter API on QLoRA models: state dicts, peft format, merge, parameter report ----------------------------


def _qmodel(seed: int = 0, lora_dtype: str = "float32") -> _MLP:
    tl.manual_seed(seed)
    model = apply_qlora(_MLP(), ["fc1", "fc2"], r=8, alpha=16, lora_dtype=lora_dtype)
    rng = np.random.default_rng(seed + 10)
    for _, m in qlora_layers(model):  # a trained-looking adapter (B = 0 would hide any mistake)
        m.lora_B.data[:] = rng.standard_normal(m.lora_B.shape).astype(np.float32) * 0.05
    return model


def _x(n: int = 6, seed: int = 5) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal((n, 256)).astype(np.float32))


def test_lora_api_finds_qlora_layers() -> None:
    from tinylearn.compress.lora import apply_lora, lora_layers, lora_state_dict

    model = _qmodel()
    assert [n for n, _ in lora_layers(model)] == ["fc1", "fc2"]
    sd = lora_state_dict(model)
    tl.manual_seed(0)
    twin = apply_lora(_MLP(), ["fc1", "fc2"], r=8, alpha=16)  # the same adapter names on an fp32 base
    assert list(sd) == list(lora_state_dict(twin)) == ["fc1.lora_A", "fc1.lora_B", "fc2.lora_A", "fc2.lora_B"]
    assert np.shares_memory(sd["fc1.lora_B"].data, model.fc1.lora_B.data)
    with pytest.raises(ValueError, match="no LoRALinear / QLoRALinear"):
        lora_state_dict(_MLP())  # never a silent empty dict


def test_qlora_state_dict_round_trip() -> None:
    from tinylearn.compress.lora import load_lora_state_dict, lora_state_dict

    src, dst = _qmodel(0), _qmodel(1)
    x = _x()
    assert np.abs(src(x).data - dst(x).data).max() > 1e-3  # different adapters before loading
    load_lora_state_dict(dst, lora_state_dict(src))
    tl.manual_seed(0)
    same_base = _qmodel(0)
    for (_, a), (_, b) in zip(qlora_layers(dst), qlora_layers(same_base), strict=True):
        b.lora_A.data[:], b.lora_B.data[:] = a.lora_A.data, a.lora_B.data
    np.testing.assert_array_equal(lora_state_dict(dst)["fc2.lora_B"].data, src.fc2.lora_B.data)
    np.testing.assert_allclose(same_base(x).data, src(x).data, rtol=1e-6, atol=1e-6)


def test_qlora_peft_round_trip_and_parity() -> None:
    """The QLoRA adapter exported in peft's format, loaded into peft on a torch model holding the dequantized NF4
    weights, gives the QLoRA model's outputs (fp32 tolerance); importing it back restores the adapter exactly."""
    peft = pytest.importorskip("peft")
    from tinylearn.compress.peft_compat import from_peft_state_dict, to_peft_state_dict

    model = _qmodel()
    sd = to_peft_state_dict(model)
    assert sorted(sd) == sorted(
        f"base_model.model.{n}.lora_{ab}.default.weight" for n in ("fc1", "fc2") for ab in ("A", "B")
    )
    with pytest.raises(ValueError, match="with_base.*NF4"):
        to_peft_state_dict(model, with_base=True)

    class TorchMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.head = (
                torch.nn.Linear(256, 512),
                torch.nn.Linear(512, 128),
                torch.nn.Linear(128, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.fc2(torch.relu(self.fc1(x))))

    tm = TorchMLP()
    with torch.no_grad():
        for n in ("fc1", "fc2"):
            getattr(tm, n).weight.copy_(torch.from_numpy(getattr(model, n).dequantized_weight()))
            getattr(tm, n).bias.copy_(torch.from_numpy(getattr(model, n).bias.data))
        tm.head.weight.copy_(torch.from_numpy(model.head.weight.data))
        tm.head.bias.copy_(torch.from_numpy(model.head.bias.data))
    pm = peft.get_peft_model(tm, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["fc1", "fc2"]))
    missing = pm.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not missing.unexpected_keys
    x = _x()
    np.testing.assert_allclose(model(x).data, pm(torch.from_numpy(x.data)).detach().numpy(), rtol=1e-4, atol=1e-5)
    back = _qmodel(3)
    from_peft_state_dict(back, pm.state_dict())
    for (_, a), (_, b) in zip(qlora_layers(back), qlora_layers(model), strict=True):
        np.testing.assert_array_equal(a.lora_A.data, b.lora_A.data)
        np.testing.assert_array_equal(a.lora_B.data, b.lora_B.data)


def test_qlora_trainable_parameter_report() -> None:
    from tinylearn.compress.lora import trainable_parameters

    tl.manual_seed(0)
    fp32_total = sum(p.data.size for p in _MLP().parameters())
    rep = trainable_parameters(_qmodel())
    n_adapter = 8 * (256 + 512) + 8 * (512 + 128)
    assert rep["trainable"] == n_adapter
    assert rep["nf4_frozen"] == 256 * 512 + 512 * 128
    assert rep["total"] == fp32_total + n_adapter  # the NF4 weights are still the model's parameters
    assert rep["fraction"] == pytest.approx(n_adapter / (fp32_total + n_adapter))


def test_qlora_merge_refused_then_dequantized() -> None:
    from tinylearn.compress.lora import LoRALinear, lora_layers, merge_lora, unmerge_lora

    model = _qmodel()
    x = _x()
    y0 = model(x).data.copy()
    with pytest.raises(RuntimeError, match="dequantize=True"):
        merge_lora(model)
    with pytest.raises(RuntimeError, match="NF4"):
        model.fc1.merge()
    assert [n for n, _ in qlora_layers(model)] == ["fc1", "fc2"]  # nothing changed by the refused merge
    a_param = model.fc1.lora_A
    merge_lora(model, dequantize=True)
    layers = lora_layers(model)
    assert all(isinstance(m, LoRALinear) and m.merged for _, m in layers) and len(layers) == 2
    assert model.fc1.lora_A is a_param  # the adapter Parameters are shared, not copied
    np.testing.assert_allclose(model(x).data, y0, rtol=1e-4, atol=1e-5)
    w_merged = _qmodel().fc1.dequantized_weight() + model.fc1.delta_weight()
    np.testing.assert_allclose(model.fc1.base_layer.weight.data, w_merged, rtol=1e-6, atol=1e-7)
    unmerge_lora(model)
    np.testing.assert_allclose(model(x).data, y0, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="not merged|no adapter layer"):
        unmerge_lora(model)


# ---- LoRA branch in bf16 on an NF4 base ----------------------------------------------------------------------------


def _fwd_bwd(model: tl.nn.Module, x: tl.Tensor, g: np.ndarray, autocast: bool = False) -> tuple[np.ndarray, dict]:
    for p in model.parameters():
        p.grad = None
    if autocast:
        with tl.autocast("bfloat16"):
            y = model(x)
    else:
        y = model(x)
    y.backward(tl.Tensor(g.astype(y.data.dtype)))
    grads = {n: p.grad.data for n, p in model.named_parameters() if p.requires_grad}
    return np.asarray(y.data, np.float32), grads


@pytest.mark.parametrize("how", ["lora_dtype", "autocast"])
def test_bf16_lora_branch_matches_fp32(how: str) -> None:
    """LoRA in bf16 on top of NF4: outputs and adapter gradients within the bf16 tolerance of the fp32 path, the
    gradients arrive in fp32 (master weights), and the branch really ran in bf16 (results differ from fp32)."""
    from tinylearn.amp import bfloat16
    from tinylearn.testing import assert_close

    ref = _qmodel()
    low = _qmodel(lora_dtype="bfloat16" if how == "lora_dtype" else "float32")
    x = _x(16)
    g = np.random.default_rng(7).standard_normal((16, 10)).astype(np.float32)
    y32, g32 = _fwd_bwd(ref, x, g)
    if how == "lora_dtype":  # the branch's matmuls in bf16, the rest of the model in fp32
        ylo, glo = _fwd_bwd(low, x, g)
        assert low.fc1.lora_dtype == "bfloat16"
    else:  # the whole forward under autocast: head Linear in bf16 too, the NF4 kernel takes its bf16 input
        ylo, glo = _fwd_bwd(low, x, g, autocast=True)
    assert_close(ylo, y32, "bfloat16")
    assert sorted(glo) == sorted(g32) == ["fc1.lora_A", "fc1.lora_B", "fc2.lora_A", "fc2.lora_B"]
    for n in g32:  # each gradient is a 16-row reduction through up to two bf16 branches: compared as a whole
        assert glo[n].dtype == np.float32 and glo[n].dtype != bfloat16
        rel = np.linalg.norm(glo[n] - g32[n]) / np.linalg.norm(g32[n])
        assert rel <= 1e-2, (n, rel)  # DESIGN.md's bf16 rtol, on the relative L2 error
    assert np.abs(ylo - y32).max() > 0  # the low-precision path was taken


def test_bf16_lora_trains() -> None:
    model = _qmodel(lora_dtype="bf16")
    x = _x(32)
    y = np.random.default_rng(8).integers(0, 10, 32)
    opt = tl.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(15):
        loss = tl.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert model.fc1.lora_A.data.dtype == np.float32


def test_lora_dtype_bad_input() -> None:
    with pytest.raises(ValueError, match="lora_dtype"):
        QLoRALinear(tl.nn.Linear(64, 16), r=4, alpha=8, lora_dtype="float16")
    with pytest.raises(ValueError, match="lora_dtype"):
        apply_qlora(_MLP(), ["fc1"], r=4, alpha=8, lora_dtype="int8")
