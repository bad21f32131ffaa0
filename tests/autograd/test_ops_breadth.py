# ruff: noqa: E501, B023  (one op per table line; the row factories bind n as a parameter)
"""The broad torch op surface (issue 16) vs torch: one op table, forward over fp32/fp64, backward vs torch autograd
and by fp64 gradcheck, non-contiguous layouts and broadcast shapes; plus the non-differentiable ops (int/bool).

Each table row's ``fn(m, *xs)`` is called with m = tinylearn and with m = torch, so both sides run the same code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.autograd import gradcheck
from tinylearn.testing import assert_close, make_array, make_layouts

F = "nn.functional"


def _f(m):
    return m.nn.functional


A34, V4 = (3, 4), (4,)
# (name, fn(m, *xs), input shapes, (low, high))
DIFF = [
    *[(n, (lambda n: lambda m, x: getattr(x, n)())(n), [A34], (-0.9, 0.9)) for n in (
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh", "erf", "erfc", "exp2",
        "expm1", "reciprocal", "square", "floor", "ceil", "round", "trunc", "frac", "sign", "neg")],
    *[(n, (lambda n: lambda m, x: getattr(m, n)(x))(n), [A34], (0.2, 3.0)) for n in ("log2", "log10", "log1p", "rsqrt")],
    ("acosh", lambda m, x: x.acosh(), [A34], (1.2, 3.0)),
    ("round_decimals", lambda m, x: x.round(decimals=1) * 1.0, [A34], (-3, 3)),
    ("atan2", lambda m, a, b: m.atan2(a, b), [A34, V4], (-1, 1)),
    ("copysign", lambda m, a, b: a.copysign(b), [A34, (3, 1)], (-1, 1)),
    ("logaddexp", lambda m, a, b: m.logaddexp(a, b), [(3, 1), V4], (-3, 3)),
    ("remainder", lambda m, a, b: m.remainder(a, b), [A34, V4], (0.3, 2)),
    ("remainder_neg", lambda m, a, b: a.remainder(b - 3), [A34, V4], (0.3, 2)),
    ("fmod", lambda m, a, b: m.fmod(a - 1, b), [A34, V4], (0.3, 2)),
    ("lerp", lambda m, a, b, w: m.lerp(a, b, w), [A34, V4, (3, 1)], (-1, 1)),
    ("lerp_scalar", lambda m, a, b: a.lerp(b, 0.3), [A34, A34], (-1, 1)),
    ("add_alpha", lambda m, a, b: a.add(b, alpha=2.5), [A34, V4], (-1, 1)),
    ("sub_alpha", lambda m, a, b: m.sub(a, b, alpha=0.5), [A34, V4], (-1, 1)),
    ("mul_div", lambda m, a, b: a.mul(b).div(b + 2), [A34, V4], (-1, 1)),
    ("pow_matmul", lambda m, a, b: a.pow(2).matmul(b), [A34, (4, 2)], (-1, 1)),
    ("prod_all", lambda m, x: x.prod(), [A34], (-1.5, 1.5)),
    ("prod_dim", lambda m, x: x.prod(1, keepdim=True), [A34], (-1.5, 1.5)),
    ("prod_zero", lambda m, x: (x * (x > 0)).prod(0), [A34], (-1.5, 1.5)),
    ("logsumexp", lambda m, x: m.logsumexp(x, 1), [A34], (-3, 3)),
    ("logsumexp_dims", lambda m, x: x.logsumexp((0, 1), keepdim=True), [A34], (-3, 3)),
    ("std_corr0", lambda m, x: x.std(1, correction=0), [A34], (-1, 1)),
    ("std_mean", lambda m, x: m.std_mean(x, 0)[0] + m.std_mean(x, 0)[1], [A34], (-1, 1)),
    ("var_mean", lambda m, x: m.var_mean(x, 1, correction=0)[0] * m.var_mean(x, 1)[1], [A34], (-1, 1)),
    ("cumsum", lambda m, x: x.cumsum(1), [A34], (-1, 1)),
    ("cumprod", lambda m, x: m.cumprod(x, 0), [A34], (-1.5, 1.5)),
    ("cumprod_zero", lambda m, x: (x * (x > 0)).cumprod(1), [A34], (-1.5, 1.5)),
    ("cummax", lambda m, x: x.cummax(1).values, [A34], (-1, 1)),
    ("cummin", lambda m, x: m.cummin(x, 0)[0], [A34], (-1, 1)),
    ("logcumsumexp", lambda m, x: x.logcumsumexp(1), [A34], (-2, 2)),
    ("sort", lambda m, x: x.sort(1).values, [A34], (-1, 1)),
    ("sort_desc", lambda m, x: m.sort(x, 0, descending=True)[0], [A34], (-1, 1)),
    ("topk", lambda m, x: x.topk(2, 1).values, [A34], (-1, 1)),
    ("topk_small", lambda m, x: x.topk(2, 0, largest=False)[0], [A34], (-1, 1)),
    ("chunk", lambda m, x: x.chunk(3, 1)[1] * 2 + x.chunk(3, 1)[0], [(3, 6)], (-1, 1)),
    ("split_sizes", lambda m, x: m.cat([p * (i + 1) for i, p in enumerate(x.split([1, 3], 1))], 1), [A34], (-1, 1)),
    ("split_int", lambda m, x: x.split(2, 0)[1], [(5, 2)], (-1, 1)),
    ("flip", lambda m, x: x.flip(0, 1), [A34], (-1, 1)),
    ("roll", lambda m, x: x.roll(1, 1), [A34], (-1, 1)),
    ("roll_multi", lambda m, x: m.roll(x, (1, -2), (0, 1)), [A34], (-1, 1)),
    ("roll_flat", lambda m, x: x.roll(5), [A34], (-1, 1)),
    ("tril", lambda m, x: x.tril(), [A34], (-1, 1)),
    ("triu", lambda m, x: m.triu(x, 1), [A34], (-1, 1)),
    ("repeat", lambda m, x: x.repeat(2, 1, 2), [A34], (-1, 1)),
    ("repeat_interleave", lambda m, x: x.repeat_interleave(2, dim=1), [A34], (-1, 1)),
    ("repeat_interleave_flat", lambda m, x: x.repeat_interleave(3), [A34], (-1, 1)),
    ("narrow", lambda m, x: x.narrow(1, 1, 2), [A34], (-1, 1)),
    ("movedim", lambda m, x: x.movedim(0, 2), [(2, 3, 4)], (-1, 1)),
    ("tile", lambda m, x: x.tile((2, 1)), [A34], (-1, 1)),
    ("unflatten", lambda m, x: x.unflatten(1, (2, 2)), [A34], (-1, 1)),
    ("diagonal", lambda m, x: x.diagonal(1), [A34], (-1, 1)),
    ("diag_vec", lambda m, x: m.diag(x, -1), [V4], (-1, 1)),
    ("pad_constant", lambda m, x: _f(m).pad(x, (1, 2, 0, 1), value=0.5), [(2, 3, 4)], (-1, 1)),
    ("pad_reflect", lambda m, x: _f(m).pad(x, (2, 1, 1, 2), mode="reflect"), [(1, 2, 3, 4)], (-1, 1)),
    ("pad_replicate", lambda m, x: _f(m).pad(x, (3, 1), mode="replicate"), [(2, 3, 4)], (-1, 1)),
    ("pad_circular", lambda m, x: _f(m).pad(x, (1, 2, 2, 1), mode="circular"), [(1, 2, 3, 4)], (-1, 1)),
    ("gather", lambda m, x: x.gather(1, m.tensor([[0, 0], [3, 1], [2, 2]])), [A34], (-1, 1)),
    ("scatter", lambda m, x, s: x.scatter(1, m.tensor([[0, 1], [3, 1], [2, 0]]), s), [A34, (3, 2)], (-1, 1)),
    ("scatter_value", lambda m, x: x.scatter(0, m.tensor([[0, 1, 2, 0]]), value=2.0), [A34], (-1, 1)),
    ("scatter_add", lambda m, x, s: x.scatter_add(0, m.tensor([[0, 1, 0, 0], [0, 2, 2, 0]]), s), [A34, (2, 4)], (-1, 1)),
    ("index_select", lambda m, x: x.index_select(1, m.tensor([3, 0, 3])), [A34], (-1, 1)),
    ("masked_fill", lambda m, x: x.masked_fill(x > 0.2, -1.0), [A34], (-1, 1)),
    ("masked_select", lambda m, x: x.masked_select(m.tensor([True, False, True, True])), [A34], (-1, 1)),
    *[(n, (lambda n: lambda m, x: getattr(_f(m), n)(x))(n), [A34], (-4, 4)) for n in (
        "leaky_relu", "elu", "selu", "celu", "silu", "mish", "softplus", "softsign", "hardtanh", "hardswish",
        "hardsigmoid", "relu6", "logsigmoid")],
    ("glu", lambda m, x: _f(m).glu(x, 1), [A34], (-2, 2)),
    ("softplus_beta", lambda m, x: _f(m).softplus(x, beta=2.0, threshold=3.0), [A34], (-4, 4)),
    ("bce", lambda m, p, y: _f(m).binary_cross_entropy(p, y), [A34, A34], (0.05, 0.95)),
    ("bce_logits", lambda m, x, y: _f(m).binary_cross_entropy_with_logits(x, y, pos_weight=m.tensor([1.0, 2.0, 3.0, 0.5], dtype=x.dtype)), [A34, A34], (0.05, 0.95)),
    ("bce_logits_sum", lambda m, x, y: _f(m).binary_cross_entropy_with_logits(x * 9, y, reduction="sum"), [A34, A34], (0, 1)),
    ("nll_loss", lambda m, x: _f(m).nll_loss(x, m.tensor([1, 3, -100]), weight=m.tensor([1.0, 2, 3, 4], dtype=x.dtype)), [A34], (-2, 0)),
    ("nll_loss_nd", lambda m, x: _f(m).nll_loss(x, m.tensor([[1, 0], [2, 1]]), reduction="none"), [(2, 3, 2)], (-2, 0)),
    ("kl_div", lambda m, x, y: _f(m).kl_div(x.log_softmax(1), y.softmax(1), reduction="batchmean"), [A34, A34], (-1, 1)),
    ("kl_div_log", lambda m, x, y: _f(m).kl_div(x, y, reduction="sum", log_target=True), [A34, A34], (-1, 1)),
    ("huber", lambda m, x, y: _f(m).huber_loss(x * 3, y, delta=0.7), [A34, A34], (-1, 1)),
    ("smooth_l1", lambda m, x, y: _f(m).smooth_l1_loss(x * 3, y, beta=0.5, reduction="none"), [A34, A34], (-1, 1)),
    ("normalize", lambda m, x: _f(m).normalize(x, dim=1), [A34], (-1, 1)),
    ("normalize_p1", lambda m, x: _f(m).normalize(x, p=1.0, dim=0), [A34], (-1, 1)),
    ("cosine_similarity", lambda m, a, b: _f(m).cosine_similarity(a, b), [A34, V4], (-1, 1)),
    ("sdpa", lambda m, q, k, v: _f(m).scaled_dot_product_attention(q, k, v), [(2, 3, 4), (2, 5, 4), (2, 5, 2)], (-1, 1)),
    ("sdpa_causal", lambda m, q, k, v: _f(m).scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 4, 3)] * 3, (-1, 1)),
    ("sdpa_mask", lambda m, q, k, v, b: _f(m).scaled_dot_product_attention(q, k, v, attn_mask=b), [(4, 3)] * 3 + [(4, 4)], (-1, 1)),
    ("sdpa_boolmask", lambda m, q, k, v: _f(m).scaled_dot_product_attention(q, k, v, attn_mask=m.tensor([[True, False, True]] * 2)), [(2, 3), (3, 3), (3, 2)], (-1, 1)),
    ("group_norm", lambda m, x, w, b: _f(m).group_norm(x, 2, w, b), [(2, 4, 3), V4, V4], (-1, 1)),
    ("group_norm_4d", lambda m, x, w, b: _f(m).group_norm(x, 3, w, b), [(2, 6, 3, 2), (6,), (6,)], (-1, 1)),
    ("group_norm_no_affine_5d", lambda m, x: _f(m).group_norm(x, 1), [(2, 4, 2, 2, 2)], (-1, 1)),
    ("group_norm_per_channel_w", lambda m, x, w: _f(m).group_norm(x, 4, w), [(2, 4, 5), V4], (-1, 1)),
    ("cross_entropy_ls", lambda m, x: _f(m).cross_entropy(x, m.tensor([1, 3, -100]), label_smoothing=0.1), [A34], (-2, 2)),
    ("cross_entropy_none", lambda m, x: _f(m).cross_entropy(x, m.tensor([1, 3, 0]), reduction="none"), [A34], (-2, 2)),
    ("einsum_mm", lambda m, a, b: m.einsum("ij,jk->ik", a, b), [A34, (4, 2)], (-1, 1)),
    ("einsum_batch", lambda m, a, b: m.einsum("bij,bkj->bik", a, b), [(2, 3, 4), (2, 5, 4)], (-1, 1)),
    ("einsum_sum", lambda m, a, b: m.einsum("ij,k->j", a, b), [A34, (2,)], (-1, 1)),
    ("einsum_implicit", lambda m, a, b: m.einsum("ij,jk", a, b), [A34, (4, 2)], (-1, 1)),
    ("outer", lambda m, a, b: m.outer(a, b), [V4, (3,)], (-1, 1)),
    ("bmm", lambda m, a, b: m.bmm(a, b), [(2, 3, 4), (2, 4, 2)], (-1, 1)),
    ("addmm", lambda m, c, a, b: m.addmm(c, a, b, beta=0.5, alpha=2.0), [(2,), A34, (4, 2)], (-1, 1)),
    ("baddbmm", lambda m, c, a, b: m.baddbmm(c, a, b, alpha=0.5), [(3, 2), (2, 3, 4), (2, 4, 2)], (-1, 1)),
    ("norm", lambda m, x: x.norm(), [A34], (-1, 1)),
    ("norm_dim", lambda m, x: m.norm(x, 3, 1), [A34], (-1, 1)),
    ("vector_norm_inf", lambda m, x: m.linalg.vector_norm(x, float("inf"), dim=1), [A34], (-1, 1)),
    ("vector_norm_1", lambda m, x: m.linalg.vector_norm(x, 1, dim=(0, 1), keepdim=True), [A34], (-1, 1)),
]  # fmt: skip


def _inputs(shapes, lo, hi, dtype, seed=0):
    return [make_array(s, "float64", seed=seed + i, low=lo, high=hi).astype(dtype) for i, s in enumerate(shapes)]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _run(fn, arrays, rg=True):
    tl_in = [tl.Tensor(a, requires_grad=rg) for a in arrays]
    th_in = [torch.tensor(np.array(a, order="C", copy=True), requires_grad=rg) for a in arrays]
    return tl_in, th_in, fn(tl, *tl_in), fn(torch, *th_in)


def _ids(table):
    return [row[0] for row in table]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("row", DIFF, ids=_ids(DIFF))
def test_forward_backward_vs_torch(row, dtype):
    name, fn, shapes, (lo, hi) = row
    arrays = _inputs(shapes, lo, hi, dtype)
    tl_in, th_in, out, ref = _run(fn, arrays)
    out, ref = _first(out), _first(ref)
    assert out.shape == tuple(ref.shape), (name, out.shape, ref.shape)
    assert out.dtype == np.dtype(dtype), (name, out.dtype)
    assert_close(out.data, ref.detach(), dtype, msg=name)
    g = np.random.default_rng(1).standard_normal(ref.shape).astype(dtype)
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    for i, (a, b) in enumerate(zip(tl_in, th_in)):
        tg = np.zeros(a.shape, dtype) if b.grad is None else b.grad.numpy()
        ag = np.zeros(a.shape, dtype) if a.grad is None else a.grad.data
        assert_close(ag, tg, dtype, msg=f"{name}: grad of input {i}")


@pytest.mark.parametrize("row", DIFF, ids=_ids(DIFF))
def test_gradcheck_fp64(row):
    name, fn, shapes, (lo, hi) = row
    if name in ("floor", "ceil", "round", "trunc", "sign", "round_decimals"):  # piecewise constant: grad 0
        return
    arrays = _inputs(shapes, lo, hi, "float64", seed=7)
    ts = [tl.Tensor(a, requires_grad=True) for a in arrays]
    assert gradcheck(lambda *xs: _first(fn(tl, *xs)), ts)


LAYOUT_ROWS = [r for r in DIFF if len(r[2]) == 1 and len(r[2][0]) >= 2]


@pytest.mark.parametrize("row", LAYOUT_ROWS[::3], ids=_ids(LAYOUT_ROWS[::3]))
def test_non_contiguous_layouts(row):
    name, fn, shapes, (lo, hi) = row
    for layout, arr in make_layouts(shapes[0], "float32", seed=3, low=lo, high=hi):
        tl_in, th_in, out, ref = _run(fn, [arr])
        out, ref = _first(out), _first(ref)
        assert_close(out.data, ref.detach(), "float32", msg=f"{name} [{layout}]")
        out.sum().backward()
        ref.sum().backward()
        assert_close(tl_in[0].grad.data, th_in[0].grad, "float32", msg=f"{name} [{layout}] grad")


def test_transposed_binary_inputs():
    a = make_array((4, 3), "float32", seed=1, low=0.3, high=2).T
    b = make_array((4, 3), "float32", seed=2, low=0.3, high=2).T
    for fn in (lambda m, x, y: m.atan2(x, y), lambda m, x, y: m.remainder(x, y), lambda m, x, y: m.lerp(x, y, 0.3)):
        _, _, out, ref = _run(fn, [a, b])
        assert_close(out.data, ref.detach(), "float32")


# -- not differentiable: forward only, integer / bool inputs where torch accepts them ------------------------
I34 = make_array(A34, "int64", seed=5, low=-5, high=5)
B34 = I34 > 0
NONDIFF = [
    ("floor_divide", lambda m, a: m.floor_divide(a, 3), [I34]),
    ("floor_divide_f", lambda m, a: a // 0.7, [I34 * 0.5]),
    ("div_trunc", lambda m, a: a.div(3, rounding_mode="trunc"), [I34]),
    ("div_floor", lambda m, a: m.div(a, 2, rounding_mode="floor"), [I34 * 1.5]),
    ("remainder_int", lambda m, a: a % 3, [I34]),
    ("fmod_int", lambda m, a: m.fmod(a, 3), [I34]),
    ("sign_int", lambda m, a: a.sign(), [I34]),
    ("square_int", lambda m, a: a.square(), [I34]),
    ("floor_int", lambda m, a: a.floor(), [I34]),
    ("sin_int", lambda m, a: a.sin(), [I34]),
    ("isnan", lambda m, a: m.isnan(a / (a * 0)), [I34 * 1.0]),
    ("isinf", lambda m, a: (a / 0.0).isinf(), [I34 * 1.0]),
    ("isfinite", lambda m, a: (a / 0.0).isfinite(), [I34 * 1.0]),
    ("isclose", lambda m, a: m.isclose(a, a + 1e-6), [I34 * 1.0]),
    ("logical_not", lambda m, a: m.logical_not(a), [B34]),
    ("logical_and", lambda m, a: a.logical_and(a.flip(0)), [B34]),
    ("logical_or", lambda m, a: m.logical_or(a, a.flip(1)), [I34]),
    ("logical_xor", lambda m, a: a.logical_xor(a.flip(0)), [B34]),
    ("bitwise_and", lambda m, a: a & 6, [I34]),
    ("bitwise_or", lambda m, a: m.bitwise_or(a, a.flip(0)), [I34]),
    ("bitwise_xor", lambda m, a: a ^ a.flip(1), [B34]),
    ("bitwise_not", lambda m, a: ~a, [I34]),
    ("bitwise_not_bool", lambda m, a: m.bitwise_not(a), [B34]),
    ("shifts", lambda m, a: (a.abs() << 2) >> 1, [I34]),
    ("all", lambda m, a: a.all(), [B34]),
    ("any_dim", lambda m, a: m.any(a, 1, keepdim=True), [B34]),
    ("all_dim", lambda m, a: a.all(0), [I34]),
    ("argmax_keepdim", lambda m, a: a.argmax(1, keepdim=True), [I34 * 1.7 + 0.1 * np.arange(4)]),
    ("argmin", lambda m, a: m.argmin(a, 0), [I34 * 1.7 + 0.1 * np.arange(3)[:, None]]),
    ("argsort", lambda m, a: a.argsort(1), [I34 * 1.7 + 0.1 * np.arange(4)]),
    ("argsort_desc", lambda m, a: m.argsort(a, 0, descending=True), [I34 * 1.7 + 0.1 * np.arange(3)[:, None]]),
    ("sort_idx", lambda m, a: a.sort(1)[1], [I34 * 1.7 + 0.1 * np.arange(4)]),
    ("topk_idx", lambda m, a: a.topk(3, 1).indices, [I34 * 1.7 + 0.1 * np.arange(4)]),
    ("cumsum_int", lambda m, a: a.cumsum(0), [I34]),
    ("cumsum_bool", lambda m, a: m.cumsum(a, 1), [B34]),
    ("cumprod_int", lambda m, a: a.cumprod(1), [I34]),
    ("prod_int", lambda m, a: a.prod(1), [I34]),
    ("nonzero", lambda m, a: a.nonzero(), [I34]),
    ("where1", lambda m, a: m.where(a > 0)[1], [I34]),
    ("nonzero_tuple", lambda m, a: a.nonzero(as_tuple=True)[0], [I34]),
    ("one_hot", lambda m, a: m.nn.functional.one_hot(a.abs(), 6), [I34]),
    ("int", lambda m, a: a.int(), [I34 * 1.5]),
    ("long", lambda m, a: a.long(), [I34 * 1.5]),
    ("bool", lambda m, a: a.bool(), [I34 * 1.0]),
    ("half", lambda m, a: a.half(), [I34 * 1.5]),
    ("to_float64", lambda m, a: a.to(m.float64), [I34]),
    ("eye", lambda m, a: m.eye(3, 4), [I34]),
    ("full_int", lambda m, a: m.full((2, 2), 4), [I34]),
    ("full_float", lambda m, a: m.full((2, 2), 4.0), [I34]),
    ("full_like", lambda m, a: m.full_like(a, 7), [I34]),
    ("zeros_like_dtype", lambda m, a: m.zeros_like(a, dtype=m.float32), [I34]),
    ("ones_like", lambda m, a: m.ones_like(a), [B34]),
    ("linspace", lambda m, a: m.linspace(-1, 2, 7), [I34]),
    ("tril_int", lambda m, a: a.tril(-1), [I34]),
    ("flip_int", lambda m, a: a.flip(1), [I34]),
    ("repeat_interleave_t", lambda m, a: a.repeat_interleave(m.tensor([1, 0, 2]), dim=0), [I34]),
]


@pytest.mark.parametrize("row", NONDIFF, ids=_ids(NONDIFF))
def test_nondiff_vs_torch(row):
    name, fn, arrays = row
    _, _, out, ref = _run(fn, [np.asarray(a) for a in arrays], rg=False)
    ref_np = ref.numpy() if ref.dtype != torch.bfloat16 else ref.float().numpy()
    assert out.shape == ref_np.shape, (name, out.shape, ref_np.shape)
    assert out.dtype == ref_np.dtype, (name, out.dtype, ref_np.dtype)
    np.testing.assert_allclose(out.data, ref_np, rtol=1e-6, err_msg=name)


def test_allclose_equal_and_namedtuples():
    x = tl.Tensor(np.arange(6.0).reshape(2, 3))
    assert x.allclose(x + 1e-9) and not tl.allclose(x, x + 1)
    v, i = x.sort(1, descending=True)
    assert v.shape == i.shape == (2, 3) and x.topk(2).indices.dtype == np.int64
    v, i = x.max(1)
    assert v.shape == (2,) and i.dtype == np.int64 and v.tolist() == [2.0, 5.0] and i.tolist() == [2, 2]


def test_random_creation_shapes_and_ranges():
    tl.manual_seed(0)
    r = tl.randint(2, 9, (100,))
    assert r.dtype == np.int64 and r.data.min() >= 2 and r.data.max() < 9
    p = tl.randperm(10)
    assert sorted(p.tolist()) == list(range(10))
    assert tl.randn_like(tl.zeros(3, 2)).shape == (3, 2) and tl.empty(2, 3).shape == (2, 3)


def test_modules_and_clip_grad_norm():
    nn = tl.nn
    x = tl.Tensor(make_array((2, 4, 3), "float32", seed=4), requires_grad=True)
    gn, tgn = nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)
    assert_close(gn(x).data, tgn(torch.from_numpy(x.data)).detach(), "float32")
    for mod, tmod in (
        (nn.SiLU(), torch.nn.SiLU()),
        (nn.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)),
        (nn.Softmax(1), torch.nn.Softmax(1)),
    ):
        assert_close(mod(x).data, tmod(torch.from_numpy(x.data)), "float32")
    md = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Identity()})
    assert "a" in md and len(list(md.parameters())) == 2 and isinstance(md["b"], nn.Identity)
    ml = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])
    assert len(list(ml.parameters())) == 4
    lin, tlin = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        tlin.weight.copy_(torch.from_numpy(lin.weight.data))
        tlin.bias.copy_(torch.from_numpy(lin.bias.data))
    (lin(x) ** 2).sum().backward()
    (tlin(torch.from_numpy(x.data)) ** 2).sum().backward()
    n = nn.utils.clip_grad_norm_(lin.parameters(), 0.5)
    tn = torch.nn.utils.clip_grad_norm_(tlin.parameters(), 0.5)
    assert_close(n.data, tn, "float32")
    assert_close(lin.weight.grad.data, tlin.weight.grad, "float32")


def test_shape_error_is_runtime_and_value_error():
    assert issubclass(tl.ShapeError, RuntimeError) and issubclass(tl.ShapeError, ValueError)


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda x: x.gather(1, tl.Tensor(np.array([[5]]))), IndexError),
        (lambda x: x.gather(1, tl.Tensor(np.array([[0.5]]))), TypeError),
        (lambda x: x.split([1, 1], 1), ValueError),
        (lambda x: x.narrow(1, 3, 2), ValueError),
        (lambda x: tl.nn.functional.pad(x, (4, 0), mode="reflect"), ValueError),
        (lambda x: tl.nn.functional.pad(x, (1,)), ValueError),
        (lambda x: x.topk(9), ValueError),
        (lambda x: x.bitwise_and(1), TypeError),
        (lambda x: tl.einsum("ij,jk->ik", x, x), ValueError),
        (lambda x: tl.nn.functional.group_norm(x.reshape(1, 12), 5), ValueError),
        (lambda x: tl.nn.functional.group_norm(x.reshape(1, 12), 0), ValueError),
        (lambda x: tl.nn.functional.group_norm(x.reshape(12), 1), ValueError),
        (lambda x: tl.nn.functional.group_norm(x.reshape(1, 12), 3, tl.ones(4)), ValueError),
    ],
)
def test_bad_input(call, exc):
    x = tl.Tensor(make_array(A34, "float32", seed=0))
    with pytest.raises(exc):
        call(x)


_P = np.exp(make_array(A34, "float64", seed=9)) / np.exp(make_array(A34, "float64", seed=9)).sum(1, keepdims=True)
CE_ROWS = [
    ("ce_weight", lambda m, x: _f(m).cross_entropy(x, m.tensor([1, 3, 0]), weight=m.tensor([1.0, 2, 3, 4], dtype=x.dtype)), [A34]),
    ("ce_weight_ls_ignore", lambda m, x: _f(m).cross_entropy(x, m.tensor([1, -100, 0]), weight=m.tensor([1.0, 2, 3, 4], dtype=x.dtype), label_smoothing=0.2), [A34]),
    ("ce_probs", lambda m, x: _f(m).cross_entropy(x, m.tensor(_P, dtype=x.dtype), label_smoothing=0.1), [A34]),
    ("ce_probs_none", lambda m, x: _f(m).cross_entropy(x, m.tensor(_P, dtype=x.dtype), reduction="none"), [A34]),
    ("ce_nd", lambda m, x: _f(m).cross_entropy(x, m.tensor([[1, 0], [2, 1]]), reduction="none"), [(2, 3, 2)]),
    ("ce_nd_mean", lambda m, x: _f(m).cross_entropy(x, m.tensor([[1, 0], [2, -100]])), [(2, 3, 2)]),
    ("ce_1d", lambda m, x: _f(m).cross_entropy(x, m.tensor(2)), [V4]),
    ("prelu", lambda m, x, w: _f(m).prelu(x, w), [(2, 3, 4), (3,)]),
    ("instance_norm", lambda m, x: _f(m).instance_norm(x), [(2, 3, 4)]),
    ("meshgrid", lambda m, a, b: sum(g * (i + 1) for i, g in enumerate(m.meshgrid(a, b, indexing="xy"))), [(3,), V4]),
    ("unfold", lambda m, x: x.unfold(1, 2, 1) * 1.0, [(3, 5)]),
    ("unfold_step", lambda m, x: x.unfold(0, 2, 2), [(5, 3)]),
    ("einsum_trace", lambda m, x: m.einsum("ii->", x), [(3, 3)]),
    ("einsum_diag", lambda m, x, v: m.einsum("iij,j->ji", x, v), [(3, 3, 2), (2,)]),
    ("einsum_dot", lambda m, a, b: m.einsum("ij,ij->", a, b), [A34, A34]),
    # two-operand contractions run as one batched matmul (linalg_breadth._contract2): batch, M, N, K letters in
    # any order, letters only one operand has (summed first), outer products, a size-1 letter (numpy's fallback)
    ("einsum_bmm_out_order", lambda m, a, b: m.einsum("bhqd,bhkd->hkbq", a, b), [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("einsum_own_letters", lambda m, a, b: m.einsum("aib,cjb->ji", a, b), [(2, 3, 4), (5, 2, 4)]),
    ("einsum_outer", lambda m, a, b: m.einsum("i,jk->kij", a, b), [(3,), (2, 4)]),
    ("einsum_size1_letter", lambda m, a, b: m.einsum("bij,bjk->bik", a, b), [(1, 2, 3), (4, 3, 2)]),
    ("einsum_ellipsis_bcast", lambda m, a, b: m.einsum("...ij,...jk->...ik", a, b), [(2, 1, 3, 4), (5, 4, 2)]),
    *[(f"scatter_reduce_{r}_{inc}", (lambda r, inc: lambda m, x, s: x.scatter_reduce(0, m.tensor([[0, 1, 0, 0], [0, 2, 0, 1]]), s, r, include_self=inc))(r, inc), [A34, (2, 4)]) for r in ("sum", "mean", "amax", "amin", "prod") for inc in (True, False)],
    ("pow_zero_zero", lambda m, x: (x * 0) ** (x * 0), [A34]),
]  # fmt: skip


@pytest.mark.parametrize("row", CE_ROWS, ids=_ids(CE_ROWS))
def test_more_ops_vs_torch_and_gradcheck(row):
    name, fn, shapes = row
    test_forward_backward_vs_torch((name, fn, shapes, (-1, 1)), "float64")
    arrays = _inputs(shapes, -1, 1, "float64", seed=11)
    ts = [tl.Tensor(a, requires_grad=True) for a in arrays]
    assert gradcheck(lambda *xs: _first(fn(tl, *xs)), ts)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a + tl.ones(4),
        lambda a: a @ a,
        lambda a: a.reshape(5),
        lambda a: a.expand(4, 4),
        lambda a: tl.stack([a, tl.ones(3)]),
    ],
)
def test_shape_errors_raise_shape_error(call):
    with pytest.raises(tl.ShapeError) as e:
        call(tl.ones(2, 3))
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, ValueError) and "shape" in str(e.value)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "logsumexp", "cumsum", "softmax"])
@pytest.mark.parametrize("dim", [0, -1])
def test_zero_dim_reductions_accept_dim_0(name, dim):
    x = tl.Tensor(np.float64(1.5), requires_grad=True)
    tx = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    out, ref = _first(getattr(x, name)(dim)), _first(getattr(tx, name)(dim))
    assert out.shape == tuple(ref.shape)
    assert_close(out.data, ref.detach(), "float64")
    out.backward()
    ref.backward()
    assert_close(x.grad.data, tx.grad, "float64")


@pytest.mark.parametrize(
    "idx",
    [
        lambda m: (1, slice(None), slice(3, 11, 2), m.tensor([0, 2, 1]), slice(0, 2)),
        lambda m: (slice(None), 1, m.tensor([0, 2, 1])),
        lambda m: (m.tensor([1, 0]), slice(None), 2),
        lambda m: (0, m.tensor([[0, 1], [2, 2]]), slice(1, 3), 1),
    ],
)
def test_mixed_int_and_array_indexing_uses_torch_dim_order(idx):
    arr = make_array((2, 3, 12, 4, 3), "float64", seed=2)
    x, tx = tl.Tensor(arr, requires_grad=True), torch.tensor(arr, requires_grad=True)
    out, ref = x[idx(tl)], tx[idx(torch)]
    assert out.shape == tuple(ref.shape)
    assert_close(out.data, ref.detach(), "float64")
    g = np.random.default_rng(0).standard_normal(ref.shape)
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    assert_close(x.grad.data, tx.grad, "float64")


def test_sum_dtype_and_int_sum_like_torch():
    b = tl.Tensor(np.array([[True, False], [True, True]]))
    assert b.sum().dtype == np.int64 and b.sum().item() == 3
    x = tl.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    s = x.sum(1, dtype=tl.float64)
    assert s.dtype == np.float64
    s.sum().backward()
    assert x.grad.dtype == np.float32 and (x.grad.data == 1).all()


@pytest.mark.parametrize(
    "fn",
    [
        lambda m, i, f: i * 1.5,
        lambda m, i, f: i**0.5,
        lambda m, i, f: m.maximum(i, f),
        lambda m, i, f: i / i,
        lambda m, i, f: 2 / i,
        lambda m, i, f: i.exp(),
        lambda m, i, f: i.sqrt(),
        lambda m, i, f: i * f,
        lambda m, i, f: f * 2.5,
        lambda m, i, f: i + 1,
        lambda m, i, f: m.full((2, 2), 4),
        lambda m, i, f: m.tensor(2).exp(),
    ],
)
def test_dtype_promotion_like_torch(fn):
    ia, fa = np.array([1, 2, 3]), np.array([0.5, 2.0, 3.0], np.float32)
    out = fn(tl, tl.Tensor(ia), tl.Tensor(fa))
    ref = fn(torch, torch.tensor(ia), torch.tensor(fa))
    assert out.dtype == ref.numpy().dtype
    np.testing.assert_allclose(out.data, ref.numpy(), rtol=1e-6)


def test_view_dtype_reinterprets_bits_like_torch():
    a = np.array([1.0, -2.5, 3.0], np.float32)
    out, ref = tl.Tensor(a).view(tl.int32), torch.tensor(a).view(torch.int32)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.data, ref.numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_index_add_rows_equals_np_add_at(dtype):
    """The embedding / integer-indexing VJP's scatter-add (a CSR product; np.add.at for float16) equals np.add.at,
    repeats and untouched rows included."""
    from tinylearn.autograd.ops_index import index_add_rows

    rng = np.random.default_rng(3)
    idx = rng.integers(0, 7, 40)
    rows = rng.standard_normal((40, 5)).astype(dtype)
    base = rng.standard_normal((9, 5)).astype(dtype)
    got, want = base.copy(), base.copy()
    index_add_rows(got, idx, rows)
    np.add.at(want, idx, rows)
    np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == "float16" else 1e-6, atol=1e-3)
    assert np.array_equal(got[7:], base[7:])  # rows no index names stay as they were
    index_add_rows(got, idx[:0], rows[:0])  # nothing to add
    np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == "float16" else 1e-6, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_index_add_rows_cpp_is_bitwise_np_add_at_and_checks_indices(dtype):
    """The C++ scatter (op autograd.index_add_rows) adds in index order: bitwise np.add.at; a bad index raises
    naming it and leaves out untouched; a layout the kernel does not take (a strided out) runs the numpy path."""
    from tinylearn import backends
    from tinylearn.autograd.ops_index import INDEX_ADD, index_add_rows

    if not backends.C_available("autograd"):
        pytest.skip("tinylearn._C.autograd is not built")
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 50, 2048)
    rows = rng.standard_normal((2048, 64)).astype(dtype)
    base = rng.standard_normal((60, 64)).astype(dtype)
    got, want = base.copy(), base.copy()
    with backends.use(INDEX_ADD, backend="cpp"):
        index_add_rows(got, idx, rows)
    np.add.at(want, idx, rows)
    assert np.array_equal(got, want)
    bad = idx.copy()
    bad[7] = 60
    before = got.copy()
    with pytest.raises(ValueError, match="idx: index 60 at position 7 is out of range"):
        backends.load_C("autograd").index_add_rows(got, bad, rows)
    assert np.array_equal(got, before)
    strided = np.zeros((60, 128), dtype)[:, ::2]  # not C-contiguous: the numpy path, same sums
    index_add_rows(strided, idx, rows)
    np.testing.assert_allclose(strided, want - base, rtol=1e-5, atol=1e-5)
