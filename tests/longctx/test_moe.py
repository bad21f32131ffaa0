"""tl.nn.MoE (issue 44): forward and gradients against a straightforward per-token torch implementation written
here (same weights, same routing rule), fp64 gradcheck, the aux losses, last_stats, dropless vs capacity, the
grouped GEMM, the torch twin ``TorchMoE`` used by the expert-parallel layer, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.nn.moe import MoE, capacity, grouped_linear, moe_ffn
from tinylearn.parallel.moe_parallel import TorchMoE

RTOL, ATOL = 1e-5, 1e-5  # fp32 (DESIGN.md), sums over a few hundred terms
NAMES = ("router_weight", "w1", "b1", "w2", "b2")


def oracle(x: torch.Tensor, p: dict[str, torch.Tensor], top_k: int, cf: float, dropless: bool):
    """Per-token loops: softmax router, torch.topk, GShard gate renormalisation for top-2, capacity slots handed
    out first choices (token order) before second choices, dropped assignments contribute nothing."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    t, e = x2.shape[0], p["router_weight"].shape[0]
    logits = x2 @ p["router_weight"].T
    probs = torch.softmax(logits, -1)
    top_p, top_i = torch.topk(probs, top_k, dim=-1)
    gates = top_p / top_p.sum(-1, keepdim=True) if top_k == 2 else top_p
    cap = math.ceil(cf * t * top_k / e) if not dropless else None
    used = [0] * e
    keep = [[False] * top_k for _ in range(t)]
    for j in range(top_k):
        for i in range(t):
            ex = int(top_i[i, j])
            if cap is None or used[ex] < cap:
                keep[i][j] = True
            used[ex] += 1
    rows = []
    for i in range(t):
        acc = torch.zeros(d, dtype=x.dtype)
        for j in range(top_k):
            if keep[i][j]:
                ex = int(top_i[i, j])
                h = torch.nn.functional.gelu(x2[i] @ p["w1"][ex] + p["b1"][ex])
                acc = acc + gates[i, j] * (h @ p["w2"][ex] + p["b2"][ex])
        rows.append(acc)
    y = torch.stack(rows).reshape(x.shape)
    first = torch.bincount(top_i[:, 0], minlength=e).to(x.dtype) / t
    balance = e * (first * probs.mean(0)).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()
    dropped = sum(not keep[i][j] for i in range(t) for j in range(top_k))
    return y, balance, z, dropped, [int(c) for c in torch.bincount(top_i.reshape(-1), minlength=e)]


def _torch_params(m: MoE) -> dict[str, torch.Tensor]:
    return {n: torch.tensor(np.array(getattr(m, n).data), requires_grad=True) for n in NAMES}


def _close(a: np.ndarray, b: torch.Tensor, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    np.testing.assert_allclose(a, b.detach().numpy(), rtol=rtol, atol=atol, err_msg=what)


CASES = [
    (1, 1.25, False),
    (1, 0.5, False),  # drops
    (2, 1.0, False),  # top-2 with drops of second choices
    (2, 2.0, False),
    (1, 1.0, True),
    (2, 1.0, True),
]


@pytest.mark.parametrize("top_k,cf,dropless", CASES)
def test_forward_and_gradients_match_per_token_torch(top_k: int, cf: float, dropless: bool) -> None:
    tl.manual_seed(3)
    m = MoE(12, 20, 4, top_k=top_k, capacity_factor=cf, dropless=dropless, z_loss_coef=1e-2, aux_loss_coef=0.1)
    rng = np.random.default_rng(top_k * 10 + int(cf * 4) + dropless)
    xa = rng.standard_normal((3, 11, 12)).astype(np.float32)
    ra = rng.standard_normal((3, 11, 12)).astype(np.float32)
    x = tl.Tensor(xa, requires_grad=True)
    y = m(x)
    ((y * tl.Tensor(ra)).sum() + m.l_aux).backward()

    p = _torch_params(m)
    xt = torch.tensor(xa, requires_grad=True)
    yt, bal, z, dropped, counts = oracle(xt, p, top_k, cf, dropless)
    ((yt * torch.tensor(ra)).sum() + 0.1 * bal + 1e-2 * z).backward()
    assert y.shape == (3, 11, 12)
    _close(y.data, yt, "y")
    _close(m.balance_loss.data, bal, "balance loss")
    _close(m.z_loss.data, z, "z loss")
    _close(x.grad.data, xt.grad, "x.grad")
    for n in NAMES:
        _close(getattr(m, n).grad.data, p[n].grad, f"{n}.grad")
    s = m.last_stats
    assert s["dropped"] == dropped and s["tokens_per_expert"] == counts
    assert s["dropped_fraction"] == pytest.approx(dropped / (33 * top_k))
    assert s["capacity"] == (None if dropless else math.ceil(cf * 33 * top_k / 4))
    assert s["max_load"] == max(counts) and s["load_imbalance"] == pytest.approx(max(counts) / (33 * top_k / 4))
    if cf < 1 and not dropless:
        assert dropped > 0  # the case exercises dropping
    # the router weights get a gradient through the gates even without the aux losses
    m.zero_grad()
    (m(x) * tl.Tensor(ra)).sum().backward()
    assert np.abs(m.router_weight.grad.data).max() > 1e-4


@pytest.mark.parametrize("top_k,cf,dropless", CASES)
def test_torch_twin_matches_oracle(top_k: int, cf: float, dropless: bool) -> None:
    tl.manual_seed(5)
    m = MoE(8, 16, 4, top_k=top_k, capacity_factor=cf, dropless=dropless)
    tm = TorchMoE.from_tl(m)
    p = _torch_params(m)
    x = torch.randn(2, 13, 8, generator=torch.Generator().manual_seed(1))
    y = tm(x)
    y.square().sum().backward()
    yo, bal, z, dropped, _ = oracle(x, p, top_k, cf, dropless)
    yo.square().sum().backward()
    torch.testing.assert_close(y, yo, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(tm.balance_loss, bal, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(tm.z_loss, z, rtol=RTOL, atol=ATOL)
    for n in NAMES:
        torch.testing.assert_close(getattr(tm, n).grad, p[n].grad, rtol=RTOL, atol=ATOL)
    assert tm.last_stats["dropped"] == dropped
    np.testing.assert_allclose(m(tl.Tensor(x.numpy())).data, y.detach().numpy(), rtol=RTOL, atol=ATOL)


def test_non_contiguous_input() -> None:
    tl.manual_seed(1)
    m = MoE(6, 10, 3, top_k=2)
    base = np.random.default_rng(0).standard_normal((6, 9)).astype(np.float32)
    xt = base.T  # [9, 6], a transposed (non-contiguous) view
    assert not xt.flags.c_contiguous
    y = m(tl.Tensor(xt))
    y2 = m(tl.Tensor(np.ascontiguousarray(xt)))
    np.testing.assert_array_equal(y.data, y2.data)
    yo = oracle(torch.tensor(xt), _torch_params(m), 2, 1.25, False)[0]
    _close(y.data, yo, "y (transposed input)")


@pytest.mark.parametrize("top_k,cf,dropless", [(1, 0.75, False), (2, 1.0, False), (1, 1.0, True), (2, 1.0, True)])
def test_gradcheck_fp64(top_k: int, cf: float, dropless: bool) -> None:
    rng = np.random.default_rng(7 + top_k)
    e, d, f, t = 3, 4, 5, 7
    ws = [
        rng.standard_normal((e, d)),
        rng.standard_normal((e, d, f)) * 0.5,
        rng.standard_normal((e, f)) * 0.1,
        rng.standard_normal((e, f, d)) * 0.5,
        rng.standard_normal((e, d)) * 0.1,
    ]
    x = rng.standard_normal((t, d))
    ins = [tl.Tensor(a, dtype=np.float64, requires_grad=True) for a in (x, *ws)]

    def fn(x, wr, w1, b1, w2, b2):
        y, bal, z, _ = moe_ffn(x, wr, w1, b1, w2, b2, top_k=top_k, capacity_factor=cf, dropless=dropless)
        return y, bal, z

    assert tl.autograd.gradcheck(fn, ins, eps=1e-6, atol=1e-6, rtol=1e-4)
    stats = moe_ffn(*ins, top_k=top_k, capacity_factor=cf, dropless=dropless)[3]
    if not dropless and cf < 1:
        assert stats["dropped"] > 0


def test_dropless_equals_capacity_mode_when_nothing_is_dropped() -> None:
    tl.manual_seed(2)
    for k in (1, 2):
        a = MoE(8, 12, 4, top_k=k, capacity_factor=4.0)  # C = T * k: nothing can be dropped
        b = MoE(8, 12, 4, top_k=k, dropless=True)
        b.load_state_dict(a.state_dict())
        x = tl.Tensor(np.random.default_rng(k).standard_normal((25, 8)).astype(np.float32))
        ya, yb = a(x), b(x)
        assert a.last_stats["dropped"] == 0 and a.last_stats["capacity"] == 25 * k
        np.testing.assert_allclose(ya.data, yb.data, rtol=RTOL, atol=1e-6)
        assert a.last_stats["tokens_per_expert"] == b.last_stats["tokens_per_expert"]


def test_capacity_formula_and_drop_rate_falls_with_capacity() -> None:
    assert capacity(100, 8, 1, 1.25) == 16 and capacity(100, 8, 2, 1.0) == 25 and capacity(1, 64, 1, 1.0) == 1
    tl.manual_seed(0)
    m = MoE(8, 8, 4)
    x = tl.Tensor(np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32))
    rates = []
    for cf in (0.25, 0.5, 1.0, 2.0, 4.0):
        m.capacity_factor = cf
        m(x)
        rates.append(m.last_stats["dropped_fraction"])
    assert rates == sorted(rates, reverse=True) and rates[0] > 0.5 and rates[-1] == 0.0


def test_aux_loss_none_and_z_loss_coef() -> None:
    tl.manual_seed(4)
    x = tl.Tensor(np.random.default_rng(1).standard_normal((10, 6)).astype(np.float32))
    m = MoE(6, 6, 3, aux_loss="none")
    m(x)
    assert float(m.l_aux.data) == 0.0 and float(m.balance_loss.data) > 0
    m = MoE(6, 6, 3, aux_loss="switch", z_loss_coef=0.5, aux_loss_coef=0.25)
    m(x)
    want = 0.25 * float(m.balance_loss.data) + 0.5 * float(m.z_loss.data)
    assert float(m.l_aux.data) == pytest.approx(want, rel=1e-6)
    # uniform router (zero weights): P_e = 1/E, so the balance loss is sum_e f_e = 1 whatever the routing
    m.router_weight.data[...] = 0
    m(x)
    assert float(m.balance_loss.data) == pytest.approx(1.0, rel=1e-6)
    assert float(m.z_loss.data) == pytest.approx(math.log(3) ** 2, rel=1e-6)


def test_grouped_linear_matches_per_group_torch_with_empty_groups() -> None:
    rng = np.random.default_rng(0)
    offsets = np.array([0, 3, 3, 10, 10, 12])  # groups of 3, 0, 7, 0, 2 rows
    x, w, b = rng.standard_normal((12, 5)), rng.standard_normal((5, 5, 4)), rng.standard_normal((5, 4))
    ins = [tl.Tensor(a, dtype=np.float64, requires_grad=True) for a in (x, w, b)]
    y = grouped_linear(*ins, offsets)
    g = rng.standard_normal(y.shape)
    y.backward(tl.Tensor(g, dtype=np.float64))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yt = torch.cat([tx[offsets[e] : offsets[e + 1]] @ tw[e] + tb[e] for e in range(5)])
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(y.data, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    for a, t in zip(ins, (tx, tw, tb)):
        np.testing.assert_allclose(a.grad.data, t.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert np.all(ins[1].grad.data[[1, 3]] == 0)  # empty groups get no weight gradient
    assert tl.autograd.gradcheck(lambda a, c, d: grouped_linear(a, c, d, offsets), ins)
    with pytest.raises(ValueError, match="offsets"):
        grouped_linear(*ins, np.array([0, 3, 2, 10, 10, 12]))
    with pytest.raises(ValueError, match="offsets"):
        grouped_linear(*ins, np.array([0, 3, 3, 10, 12]))


def test_module_registration_and_state_dict() -> None:
    tl.manual_seed(0)
    m = MoE(4, 6, 2, top_k=2)
    assert [n for n, _ in m.named_parameters()] == list(NAMES)
    assert m.w1.shape == (2, 4, 6) and m.router_weight.shape == (2, 4) and m.b2.shape == (2, 4)
    assert "num_experts=2" in repr(m) and "top_k=2" in repr(m)
    m64 = MoE(4, 6, 2, dtype=np.float64)
    assert m64.w1.dtype == np.float64


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_experts": 2, "top_k": 3}, "top_k: expected 1 or 2"),
        ({"num_experts": 1, "top_k": 2}, "top_k: 2 is more than num_experts=1"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 1.0}, "top_k"),
        ({"capacity_factor": 0}, "capacity_factor: .* got 0"),
        ({"capacity_factor": -1.5}, "capacity_factor: .* got -1.5"),
        ({"capacity_factor": float("nan")}, "capacity_factor: .* got nan"),
        ({"num_experts": 0}, "num_experts: .* got 0"),
        ({"aux_loss": "gshard"}, "aux_loss: .* got 'gshard'"),
        ({"z_loss_coef": -1.0}, "z_loss_coef: .* got -1.0"),
        ({"d_model": 0}, "d_model: .* got 0"),
    ],
)
def test_bad_config_raises_naming_the_argument(kwargs: dict, match: str) -> None:
    args = {"d_model": 4, "d_ff": 4, "num_experts": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        MoE(**args)


def test_bad_input_raises() -> None:
    m = MoE(4, 4, 2)
    with pytest.raises(ValueError, match=r"input: last dimension must be d_model=4, got shape \(3, 5\)"):
        m(tl.Tensor(np.zeros((3, 5), np.float32)))
    with pytest.raises(TypeError, match="input"):
        m(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="top_k"):
        TorchMoE(4, 4, 2, top_k=3)
    with pytest.raises(ValueError, match="d_model=4"):
        TorchMoE(4, 4, 2)(torch.zeros(3, 5))


def test_empty_batch() -> None:
    tl.manual_seed(0)
    for dropless in (False, True):
        m = MoE(4, 4, 2, top_k=2, dropless=dropless)
        y = m(tl.Tensor(np.zeros((0, 4), np.float32)))
        assert y.shape == (0, 4) and m.last_stats["dropped"] == 0 and m.last_stats["tokens_per_expert"] == [0, 0]


def test_bench_moe_rows() -> None:
    from tinylearn.longctx.moe_bench import bench_moe

    rows = bench_moe(tokens=64, d_model=8, d_ff=8, num_experts=4, capacity_factors=(0.5, None), repeat=1)
    assert [(r["impl"], r["top_k"], r["capacity_factor"]) for r in rows] == [
        (impl, k, cf) for k in (1, 2) for cf in (0.5, None) for impl in ("tl", "torch")
    ]
    for tl_row, torch_row in zip(rows[::2], rows[1::2]):
        assert tl_row["dropped_fraction"] == torch_row["dropped_fraction"]  # same routing in both
        assert tl_row["tokens_per_s"] > 0 and tl_row["vs_torch"] > 0 and "vs_torch" not in torch_row
        assert (tl_row["dropped_fraction"] > 0) == (tl_row["capacity_factor"] == 0.5)
