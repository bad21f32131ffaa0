"""Tests for exercises/14_compression (run on stubs by default, on tinylearn with --impl=reference).

(a) LoRALinear against a torch oracle and against tinylearn.compress.LoRALinear; (b) distill_loss against torch's
kl_div + cross_entropy, values and gradients; (c) rank by energy against numpy's SVD."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as tF

import tinylearn as tl
from tinylearn.compress.lora import LoRALinear as LibLoRALinear

RTOL, ATOL = 1e-5, 1e-5


def _base(seed: int = 0, n_in: int = 12, n_out: int = 7) -> tl.nn.Linear:
    tl.manual_seed(seed)
    return tl.nn.Linear(n_in, n_out)


def _randomise_B(layer: tl.nn.Module, seed: int = 1) -> None:
    layer.lora_B.data = (0.3 * np.random.default_rng(seed).standard_normal(layer.lora_B.shape)).astype(np.float32)


# ------------------------------------------------------------------------------------------------ (a) LoRALinear
def test_lora_init_shapes_and_trainable(impl: ModuleType) -> None:
    base = _base()
    w0 = base.weight.data.copy()
    layer = impl.LoRALinear(base, r=3, alpha=6.0)
    assert layer.lora_A.shape == (3, 12) and layer.lora_B.shape == (7, 3)
    assert layer.scaling == pytest.approx(2.0) and layer.merged is False
    assert np.all(layer.lora_B.data == 0)
    bound = 1 / np.sqrt(12)
    assert np.all(np.abs(layer.lora_A.data) <= bound) and layer.lora_A.data.std() > 0.2 * bound
    trainable = sorted(n for n, p in layer.named_parameters() if p.requires_grad)
    assert trainable == ["lora_A", "lora_B"]
    x = np.random.default_rng(0).standard_normal((4, 12)).astype(np.float32)
    np.testing.assert_allclose(layer(tl.Tensor(x)).numpy(), x @ w0.T + base.bias.data, rtol=RTOL, atol=ATOL)


def test_lora_forward_and_grads_match_torch(impl: ModuleType) -> None:
    base = _base(2)
    W, b = base.weight.data.copy(), base.bias.data.copy()
    layer = impl.LoRALinear(base, r=4, alpha=8.0)
    _randomise_B(layer)
    x = np.random.default_rng(3).standard_normal((12, 5)).astype(np.float32).T  # non-contiguous input
    g = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)
    y = layer(tl.Tensor(x))
    (y * tl.Tensor(g)).sum().backward()
    tA = torch.tensor(layer.lora_A.data, requires_grad=True)
    tB = torch.tensor(layer.lora_B.data, requires_grad=True)
    tx = torch.from_numpy(x)
    ty = tF.linear(tx, torch.from_numpy(W), torch.from_numpy(b)) + (tx @ tA.T) @ tB.T * 2.0
    (ty * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(layer.lora_A.grad.numpy(), tA.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(layer.lora_B.grad.numpy(), tB.grad.numpy(), rtol=RTOL, atol=ATOL)
    assert layer.base_layer.weight.grad is None  # frozen: no gradient reaches the base


def test_lora_matches_tinylearn_layer(impl: ModuleType) -> None:
    ours, lib = impl.LoRALinear(_base(5), r=2, alpha=3.0), LibLoRALinear(_base(5), r=2, alpha=3.0)
    for name in ("lora_A", "lora_B"):
        getattr(lib, name).data = getattr(ours, name).data.copy()
    _randomise_B(ours, 7)
    _randomise_B(lib, 7)
    x = tl.Tensor(np.random.default_rng(8).standard_normal((3, 6, 12)).astype(np.float32))  # batched leading dims
    np.testing.assert_allclose(ours(x).numpy(), lib(x).numpy(), rtol=RTOL, atol=ATOL)


def test_lora_merge_unmerge(impl: ModuleType) -> None:
    base = _base(9)
    w0 = base.weight.data.copy()
    layer = impl.LoRALinear(base, r=3, alpha=5.0)
    _randomise_B(layer, 10)
    x = tl.Tensor(np.random.default_rng(11).standard_normal((6, 12)).astype(np.float32))
    y = layer(x).numpy()
    layer.merge()
    assert layer.merged is True
    expect_w = w0 + (5.0 / 3) * layer.lora_B.data @ layer.lora_A.data
    np.testing.assert_allclose(layer.base_layer.weight.data, expect_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(layer(x).numpy(), y, rtol=RTOL, atol=ATOL)
    layer.unmerge()
    np.testing.assert_allclose(layer.base_layer.weight.data, w0, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(layer(x).numpy(), y, rtol=RTOL, atol=ATOL)


def test_lora_bad_input(impl: ModuleType) -> None:
    layer = impl.LoRALinear(_base(), r=2, alpha=2.0)
    with pytest.raises(RuntimeError, match="unmerge"):
        layer.unmerge()
    layer.merge()
    with pytest.raises(RuntimeError, match="merge"):
        layer.merge()
    for r in (0, 8):
        with pytest.raises(ValueError, match="r"):
            impl.LoRALinear(_base(), r=r, alpha=2.0)
    with pytest.raises(ValueError, match="alpha"):
        impl.LoRALinear(_base(), r=2, alpha=0.0)


# -------------------------------------------------------------------------------------------- (b) distill_loss
def _torch_distill(s: np.ndarray, t: np.ndarray, y: np.ndarray | None, T: float, alpha: float):
    ts = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    tt = torch.tensor(t, dtype=torch.float64, requires_grad=True)
    log_pt = tF.log_softmax(tt.detach() / T, -1)
    kl = tF.kl_div(tF.log_softmax(ts / T, -1), log_pt, reduction="batchmean", log_target=True)
    loss = alpha * T * T * kl
    if alpha < 1:
        loss = loss + (1 - alpha) * tF.cross_entropy(ts, torch.from_numpy(y))
    loss.backward()
    return loss.item(), ts.grad.numpy()


@pytest.mark.parametrize("T,alpha", [(1.0, 0.5), (4.0, 0.9), (2.5, 1.0), (8.0, 0.0)])
def test_distill_loss_matches_torch(impl: ModuleType, T: float, alpha: float) -> None:
    rng = np.random.default_rng(int(T * 10 + alpha * 100))
    s = (2 * rng.standard_normal((9, 10))).astype(np.float32)
    t = (3 * rng.standard_normal((9, 10))).astype(np.float32)
    y = rng.integers(0, 10, 9).astype(np.int64)
    st, tt = tl.Tensor(s, requires_grad=True), tl.Tensor(t, requires_grad=True)
    loss = impl.distill_loss(st, tt, T, alpha, targets=tl.Tensor(y) if alpha < 1 else None)
    loss.backward()
    ref, gref = _torch_distill(s, t, y, T, alpha)
    assert loss.item() == pytest.approx(ref, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(st.grad.numpy(), gref, rtol=1e-4, atol=1e-6)
    assert tt.grad is None or np.all(tt.grad.numpy() == 0)  # the teacher is detached


def test_distill_t_squared_keeps_gradient_scale(impl: ModuleType) -> None:
    rng = np.random.default_rng(0)
    s, t = rng.standard_normal((16, 10)).astype(np.float32), rng.standard_normal((16, 10)).astype(np.float32)
    norms = []
    for T in (4.0, 8.0, 16.0, 32.0):
        st = tl.Tensor(s, requires_grad=True)
        impl.distill_loss(st, tl.Tensor(t), T, 1.0).backward()
        norms.append(float(np.linalg.norm(st.grad.numpy())))
    # without T^2 the norm would fall 64x from T=4 to T=32; with it, it converges to a constant
    assert max(norms) / min(norms) < 1.3, norms


def test_distill_bad_input(impl: ModuleType) -> None:
    s, t = tl.Tensor(np.zeros((2, 3), np.float32)), tl.Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="T"):
        impl.distill_loss(s, t, 0.0, 0.5, targets=tl.Tensor(np.array([0, 1])))
    with pytest.raises(ValueError, match="alpha"):
        impl.distill_loss(s, t, 2.0, 1.5)
    with pytest.raises(ValueError, match="targets"):
        impl.distill_loss(s, t, 2.0, 0.5)
    with pytest.raises(ValueError, match="teacher_logits"):
        impl.distill_loss(s, tl.Tensor(np.zeros((2, 4), np.float32)), 2.0, 1.0)


# ---------------------------------------------------------------------------------------- (c) rank by energy
def _with_spectrum(s: np.ndarray, m: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((m, len(s))))
    V, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    return (U * s) @ V.T


def test_rank_for_energy_hand_cases(impl: ModuleType) -> None:
    W = _with_spectrum(np.array([3.0, 2.0, 1.0, 1.0, 0.5]), 9, 7)  # s^2 = 9, 4, 1, 1, 0.25 -> total 15.25
    assert impl.rank_for_energy(W, 0.5) == 1  # 9 / 15.25 = 0.59
    assert impl.rank_for_energy(W, 0.6) == 2  # 13 / 15.25 = 0.852
    assert impl.rank_for_energy(W, 0.9) == 3  # 14 / 15.25 = 0.918
    assert impl.rank_for_energy(W, 0.95) == 4  # 15 / 15.25 = 0.984
    assert impl.rank_for_energy(W, 1.0) == 5  # a rank-5 matrix keeps everything at 5 (not 7)
    assert impl.rank_for_energy(np.zeros((4, 3)), 0.9) == 1


@pytest.mark.parametrize("seed", range(4))
def test_rank_for_energy_against_numpy_svd(impl: ModuleType, seed: int) -> None:
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((30, 20)) * np.exp(-0.2 * np.arange(20))  # a decaying spectrum, like a trained weight
    W = W.astype(np.float32)[:, ::-1]  # non-contiguous view
    s = np.linalg.svd(W.astype(np.float64), compute_uv=False)
    frac = np.cumsum(s**2) / np.sum(s**2)
    for energy in rng.uniform(0.3, 0.999, 6):
        r = impl.rank_for_energy(W, float(energy))
        assert frac[r - 1] >= energy - 1e-6 and (r == 1 or frac[r - 2] < energy + 1e-6), (energy, r, frac)
        A, B = impl.svd_factors(W, r)
        assert A.shape == (r, 20) and B.shape == (30, r)
        err = np.sum((W.astype(np.float64) - B @ A) ** 2)  # Eckart-Young: the dropped energy exactly
        assert err == pytest.approx(np.sum(s[r:] ** 2), rel=1e-4, abs=1e-6)
        assert err <= (1 - energy) * np.sum(s**2) + 1e-6


def test_rank_for_energy_bad_input(impl: ModuleType) -> None:
    W = np.ones((3, 4), np.float32)
    for e in (0.0, 1.2, -0.1):
        with pytest.raises(ValueError, match="energy"):
            impl.rank_for_energy(W, e)
    with pytest.raises(ValueError, match="W"):
        impl.rank_for_energy(np.ones(5), 0.9)
    with pytest.raises(ValueError, match="r"):
        impl.svd_factors(W, 4)
