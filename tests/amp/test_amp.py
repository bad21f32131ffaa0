"""tl.autocast vs torch.autocast("cpu", bfloat16), bf16 rounding bit-exact vs torch, dtypes, GradScaler vs torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.amp import GradScaler, bf16_bits, round_to_bf16, to_bfloat16
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.testing import assert_close

F = tl.nn.functional


# -- bf16 rounding --------------------------------------------------------------------------------------------
def _torch_bf16_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_bf16_bits_exact_vs_torch_random_patterns():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(bf16_bits(x), _torch_bf16_bits(x))


def test_bf16_ties_to_even_and_specials():
    # 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0)
    half = np.float32(1 + 2**-8)
    assert round_to_bf16(half) == 1.0
    # 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up
    assert round_to_bf16(np.float32(1 + 3 * 2**-8)) == np.float32(1 + 2**-6)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-40, np.finfo(np.float32).max], np.float32)
    np.testing.assert_array_equal(bf16_bits(specials), _torch_bf16_bits(specials))
    assert bf16_bits(np.float32(np.nan)) == 0x7FC0
    assert np.isinf(round_to_bf16(np.float32(3.4e38)))  # > bf16 max + half an ulp (3.396e38): carries into Inf
    assert round_to_bf16(np.float32(2.5)).shape == ()


def test_bf16_matches_ml_dtypes_cast():
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32) * 1e3
    np.testing.assert_array_equal(to_bfloat16(x).view(np.uint16), x.astype(tl.amp.bfloat16).view(np.uint16))


# -- dtypes on Tensor -----------------------------------------------------------------------------------------
def test_tensor_low_dtypes_and_to():
    t = tl.Tensor(np.array([1.0, 2.5, 1 + 2**-9], np.float32), requires_grad=True)
    b = t.to("bfloat16")
    h = t.half()
    assert b.dtype == tl.amp.bfloat16 and h.dtype == np.float16 and t.bfloat16().dtype == tl.amp.bfloat16
    assert b.requires_grad and t.to("float32") is t
    (b.to("float32") * 3).sum().backward()
    assert t.grad.dtype == np.float32
    np.testing.assert_array_equal(t.grad.data, [3, 3, 3])
    np.testing.assert_array_equal(b.data.astype(np.float32), [1.0, 2.5, 1.0])
    with pytest.raises(ValueError, match="dtype"):
        tl.autocast(dtype="float64")


def test_fp16_overflow_and_underflow():
    x = tl.Tensor(np.array([70000.0, 1e-8, 6e-8, 1e-4], np.float32))
    with np.errstate(over="ignore"):
        h = x.half().data
    assert np.isinf(h[0]) and h[1] == 0 and h[2] > 0 and h[3] > 0  # max 65504; smallest subnormal 5.96e-8
    b = x.to("bfloat16").data.astype(np.float32)
    assert np.isfinite(b).all() and (b > 0).all()  # bf16 keeps fp32's range


# -- autocast vs torch ----------------------------------------------------------------------------------------
def _torch_mlp(m: DigitsMLP) -> torch.nn.Module:
    layers = [torch.nn.Flatten()]
    for mod in m.net:
        if isinstance(mod, tl.nn.Linear):
            lin = torch.nn.Linear(mod.weight.shape[1], mod.weight.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(mod.weight.data))
                lin.bias.copy_(torch.from_numpy(mod.bias.data))
            layers.append(lin)
        elif isinstance(mod, tl.nn.ReLU):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class _TorchCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        c = torch.nn
        self.features = c.Sequential(
            c.Conv2d(1, 16, 3, padding=1), c.BatchNorm2d(16), c.ReLU(), c.MaxPool2d(2),
            c.Conv2d(16, 32, 3, padding=1), c.BatchNorm2d(32), c.ReLU(), c.MaxPool2d(2),
        )  # fmt: skip
        self.fc = c.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


def _digits(n: int) -> tuple[tl.Tensor, tl.Tensor]:
    X, y = tl.data.load_digits()
    return tl.Tensor(X[:n]), tl.Tensor(y[:n])


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_autocast_matches_torch_bf16(kind):
    tl.manual_seed(0)
    x, y = _digits(64)
    if kind == "mlp":
        m = DigitsMLP((64, 32))
        tm = _torch_mlp(m)
    else:
        m = DigitsCNN()
        tm = _TorchCNN()
        tm.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in m.state_dict().items()})
    with tl.autocast(dtype="bfloat16"):
        out = m(x)
        loss = F.cross_entropy(out, y)
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tout = tm(torch.from_numpy(x.data))
        tloss = torch.nn.functional.cross_entropy(tout, torch.from_numpy(y.data))
    tloss.backward()
    assert out.dtype == tl.amp.bfloat16 and tout.dtype == torch.bfloat16  # last op is linear: low precision
    assert loss.dtype == np.float32 and tloss.dtype == torch.float32  # losses: fp32 list
    assert_close(out.data.astype(np.float32), tout.float().detach().numpy(), "bfloat16")
    assert_close(loss.item(), tloss.item(), "bfloat16")
    for (name, p), tp in zip(m.named_parameters(), tm.parameters()):
        assert p.grad.dtype == np.float32  # fp32 master gradients
        if kind == "cnn" and name in ("features.0.bias", "features.4.bias"):
            continue  # a conv bias followed by BatchNorm has zero gradient: only rounding noise is left to compare
        # torch's backward runs its GEMMs in bf16 too; errors compound over layers, so compare in norm:
        # a few bf16 epsilons (2^-8 = 0.4%) relative to the gradient
        rel = np.linalg.norm(p.grad.data - tp.grad.numpy()) / (np.linalg.norm(tp.grad.numpy()) + 1e-12)
        assert rel < 2e-2, (p.shape, rel)


def test_autocast_op_categories_and_nesting():
    a = tl.randn(4, 8)
    w = tl.randn(8, 3)
    assert tl.amp.op_category("MatMul") == "lower" and tl.amp.op_category("Softmax") == "fp32"
    assert tl.amp.op_category("Add") is None
    with tl.autocast("bfloat16"):
        z = a @ w
        assert z.dtype == tl.amp.bfloat16
        assert F.softmax(z, dim=-1).dtype == np.float32  # fp32 list casts bf16 inputs up
        assert (z + z).dtype == tl.amp.bfloat16  # not listed: runs in the input dtype
        with tl.autocast("bfloat16", enabled=False):
            assert (a @ w).dtype == np.float32
        assert tl.amp.get_autocast_dtype() == tl.amp.bfloat16
        with tl.autocast("float16"):
            assert (a @ w).dtype == np.float16
    assert tl.amp.get_autocast_dtype() is None and (a @ w).dtype == np.float32
    # the bf16 matmul equals rounding the inputs, multiplying in fp32 and rounding once
    ref = round_to_bf16(round_to_bf16(a.data) @ round_to_bf16(w.data))
    np.testing.assert_array_equal(z.data.astype(np.float32), ref)


# -- GradScaler vs torch --------------------------------------------------------------------------------------
def _scale_sequence_torch(pattern, **kw):
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    sc = torch.amp.GradScaler("cpu", **kw)
    out, params = [], []
    for bad in pattern:
        opt.zero_grad()
        sc.scale((p * 0).sum())  # initialises the scale lazily, as a real loss would
        p.grad = torch.full((3,), float("inf") if bad == "inf" else (float("nan") if bad == "nan" else 1.0))
        sc.step(opt)
        sc.update()
        out.append(sc.get_scale())
        params.append(p.detach().numpy().copy())
    return out, params


def _scale_sequence_tl(pattern, **kw):
    p = tl.nn.Parameter(tl.ones(3))
    opt = tl.optim.SGD([p], lr=0.1)
    sc = GradScaler(**kw)
    out, params = [], []
    for bad in pattern:
        opt.zero_grad()
        sc.scale((p * 0).sum())
        val = {"inf": np.inf, "nan": np.nan}.get(bad, 1.0)
        p.grad = tl.Tensor(np.full(3, val, np.float32))
        sc.step(opt)
        sc.update()
        out.append(sc.get_scale())
        params.append(p.data.copy())
    return out, params


@pytest.mark.parametrize(
    "kw",
    [
        dict(init_scale=2.0**16, growth_interval=3),
        dict(init_scale=1e4, growth_factor=3.0, backoff_factor=0.25, growth_interval=2),
        dict(init_scale=3e38, growth_interval=1),  # growth to Inf is refused
    ],
)
def test_grad_scaler_sequence_equals_torch(kw):
    rng = np.random.default_rng(0)
    pattern = [["ok", "inf", "nan"][i] for i in rng.choice(3, size=40, p=[0.7, 0.2, 0.1])]
    t_scales, t_params = _scale_sequence_torch(pattern, **kw)
    scales, params = _scale_sequence_tl(pattern, **kw)
    assert scales == t_scales
    for a, b in zip(params, t_params):
        assert_close(a, b, "float32")
    if kw["init_scale"] > 1e6:
        return  # the unscaled gradients are ~1e-38 there: steps do not move the parameter visibly
    # skipped steps leave the parameter unchanged
    moved = [not np.array_equal(params[i], params[i - 1]) for i in range(1, len(params))]
    assert moved == [bad == "ok" for bad in pattern[1:]]


def test_grad_scaler_unscale_and_errors():
    p = tl.nn.Parameter(tl.ones(2))
    opt = tl.optim.SGD([p], lr=1.0)
    sc = GradScaler(init_scale=8.0)
    loss = sc.scale((p * 3).sum())
    assert loss.item() == 48.0
    loss.backward()
    sc.unscale_(opt)
    np.testing.assert_array_equal(p.grad.data, [3, 3])
    with pytest.raises(RuntimeError, match="unscale_"):
        sc.unscale_(opt)
    sc.step(opt)
    sc.update()
    np.testing.assert_array_equal(p.data, [-2, -2])
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=0.5)
    with pytest.raises(TypeError, match="loss"):
        sc.scale(3.0)


@pytest.mark.parametrize(
    "name, xs, ws",
    [
        ("conv1d", (2, 3, 17), (4, 3, 3)),
        ("conv3d", (1, 2, 5, 6, 7), (3, 2, 3, 3, 3)),
        ("conv_transpose1d", (2, 3, 9), (3, 4, 3)),
        ("conv_transpose2d", (2, 3, 6, 5), (3, 4, 3, 3)),
    ],
)
def test_autocast_nd_convs_lower_precision_like_torch(name, xs, ws):
    # torch's CPU autocast list has conv1d/3d and conv_transpose*: bf16 outputs equal to torch's
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    with tl.autocast(dtype="bfloat16"):
        y = getattr(tl.nn.functional, name)(tl.Tensor(x), tl.Tensor(w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt = getattr(torch.nn.functional, name)(torch.tensor(x), torch.tensor(w))
    assert yt.dtype == torch.bfloat16 and "bfloat16" in str(y.dtype)
    ref = yt.float().numpy()
    assert np.abs(y.data.astype(np.float32) - ref).max() <= 1e-2 * np.abs(ref).max()


def test_fp16_rounds_to_zero_at_half_the_smallest_subnormal_like_torch():
    tiny = np.float32(2.0**-25)  # half of fp16's smallest subnormal 2^-24: a tie, rounds to even (0)
    above = np.nextafter(tiny, np.float32(1))
    xs = np.array([tiny, above, 4e-8, 2.0**-24], np.float32)
    ours = tl.Tensor(xs).half().data.astype(np.float32)
    ref = torch.from_numpy(xs).half().float().numpy()
    np.testing.assert_array_equal(ours, ref)
    assert ours[0] == 0 and (ours[1:] == np.float32(2.0**-24)).all()


def test_autocast_fp32_lists_match_torch_cuda_list_plus_tinylearn_extras():
    from tinylearn.amp import FP32_OPS, TINYLEARN_FP32_OPS, op_category

    # torch's CUDA "autocast to float32" list has these; batch_norm / mean / var are on no torch autocast list
    assert {"softmax", "log_softmax", "layer_norm", "sum", "exp", "log", "pow"} <= set(FP32_OPS)
    assert not {"batch_norm", "mean", "var"} & set(FP32_OPS)
    assert all(op_category(v) == "fp32" for v in TINYLEARN_FP32_OPS.values())


def test_grad_scaler_falls_back_after_consecutive_overflows():
    scaler = tl.amp.GradScaler(init_scale=1024.0, growth_interval=2, fallback_after=3)
    p = tl.nn.Parameter(tl.ones(2))
    opt = tl.optim.SGD([p], lr=0.1)
    seen = []
    for bad in [1, 1, 0, 1, 1, 1, 0]:
        scaler.scale((p * 0).sum())
        p.grad = tl.Tensor(np.array([np.inf if bad else 1.0, 1.0], np.float32))
        scaler.step(opt)
        scaler.update()
        seen.append((scaler.consecutive_skips, scaler.fell_back))
    assert seen == [(1, False), (2, False), (0, False), (1, False), (2, False), (3, True), (0, True)]
    assert scaler.autocast_dtype("float16") is None
    assert tl.amp.GradScaler().autocast_dtype("float16") == "float16"
    with pytest.raises(ValueError, match="fallback_after"):
        tl.amp.GradScaler(fallback_after=0)
