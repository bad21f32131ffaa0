"""Issue 16, modules and reductions: ``max/min/median(dim)`` as torch's (values, indices), nn.MultiheadAttention,
nn.TransformerEncoderLayer / TransformerEncoder — forward and backward vs torch (weights copied from the torch
module), fp64 gradcheck, non-contiguous inputs, bad input errors naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import nn
from tinylearn.autograd import gradcheck
from tinylearn.testing import assert_close, make_array, make_layouts


def _pair(a: np.ndarray) -> tuple[tl.Tensor, torch.Tensor]:
    return tl.Tensor(a, requires_grad=True), torch.tensor(np.ascontiguousarray(a), requires_grad=True)


# -- max / min / median over a dim ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["max", "min", "median"])
def test_reduce_dim_values_indices_grad_vs_torch(op):
    for layout, a in make_layouts((3, 4, 5), seed=4):
        for dim in (0, 1, -1):
            for keepdim in (False, True):
                x, tx = _pair(a)
                r, tr = getattr(x, op)(dim, keepdim), getattr(tx, op)(dim, keepdim)
                v, i = r  # unpacks like torch.return_types.max
                assert isinstance(r, tuple) and r[0] is r.values and r[1] is r.indices
                assert_close(v.data, tr.values, msg=f"{op} {layout} dim={dim}")
                assert i.dtype == np.int64 and np.array_equal(i.data, tr.indices.numpy()), (op, layout, dim)
                g = make_array(v.shape, seed=dim + 7)
                v.backward(g)
                tr.values.backward(torch.from_numpy(g))
                assert_close(x.grad.data, tx.grad, msg=f"grad {op} {layout} dim={dim} keepdim={keepdim}")


@pytest.mark.parametrize("op", ["max", "min"])
def test_ties_and_nan_pick_torch_index(op):
    a = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 0.0, 0.0], [np.nan, 1.0, np.nan, 0.0], [5, 5, 5, 5]], np.float32)
    x, tx = _pair(a)
    r, tr = getattr(x, op)(1), getattr(tx, op)(1)
    assert np.array_equal(r.indices.data, tr.indices.numpy())  # first extremal index, NaN wins (torch CPU)
    assert_close(r.values.data, tr.values)
    r.values.sum().backward()
    tr.values.sum().backward()
    assert_close(x.grad.data, tx.grad)  # the whole gradient at the chosen index, not split among ties
    assert x.grad.data[3].tolist() == [1, 0, 0, 0]


def test_median_even_length_is_lower_median_like_torch():
    a = np.array([[4.0, 1.0, 3.0, 2.0], [0.5, -1.0, 7.0, 7.5]], np.float32)
    r, tr = tl.Tensor(a).median(1), torch.tensor(a).median(1)
    assert r.values.data.tolist() == tr.values.tolist() == [2.0, 0.5]
    assert r.indices.data.tolist() == tr.indices.tolist()
    assert float(tl.median(tl.Tensor(a)).data) == float(torch.median(torch.tensor(a)))  # no dim: 0-d, flattened
    assert tl.Tensor(a).median().ndim == 0


def test_mode_vs_torch_ties_smallest_value_last_index():
    rng = np.random.default_rng(0)
    for _, a in make_layouts((3, 7, 5), seed=2):
        a = np.floor(a * 2.0)  # values in {-2, -1, 0, 1}: many repeats and ties between counts
        for dim in (0, 1, -1):
            x, tx = _pair(a)
            r, tr = x.mode(dim), tx.mode(dim)
            assert np.array_equal(r.values.data, tr.values.detach().numpy()), dim
            assert np.array_equal(r.indices.data, tr.indices.numpy()), dim
            g = rng.standard_normal(r.values.shape).astype(np.float32)
            r.values.backward(g)
            tr.values.backward(torch.from_numpy(g))
            assert_close(x.grad.data, tx.grad, msg=f"mode grad dim={dim}")
    assert tl.mode(tl.Tensor([3.0, 1.0, 1.0, 3.0])).indices.item() == torch.mode(torch.tensor([3.0, 1, 1, 3]))[1]


def test_full_reduction_stays_0d_and_two_tensor_form_is_elementwise():
    a, b = make_array((3, 4), seed=1), make_array((4,), seed=2)
    for op in ("max", "min"):
        assert getattr(tl.Tensor(a), op)().ndim == 0
        x, tx = _pair(a)
        y, ty = _pair(b)
        out, tout = getattr(tl, op)(x, y), getattr(torch, op)(tx, ty)  # torch.max(input, other) = maximum
        assert_close(out.data, tout)
        out.sum().backward()
        tout.sum().backward()
        assert_close(x.grad.data, tx.grad)
        assert_close(y.grad.data, ty.grad)
        v, i = getattr(tl, op)(tl.Tensor(a), dim=1, keepdim=True)  # the free function with keywords
        tv, ti = getattr(torch, op)(torch.tensor(a), dim=1, keepdim=True)
        assert v.shape == tuple(tv.shape) == (3, 1) and np.array_equal(i.data, ti.numpy())


def test_reduce_dim_0d_input_like_torch():
    v, i = tl.Tensor(np.float32(2.5)).max(0)
    tv, ti = torch.tensor(2.5).max(0)
    assert v.ndim == i.ndim == 0 and float(v.data) == float(tv) and int(i.data) == int(ti) == 0


@pytest.mark.parametrize("op", ["max", "min", "median"])
def test_reduce_dim_gradcheck_fp64(op):
    rng = np.random.default_rng(0)
    x = tl.Tensor(rng.permutation(24).reshape(2, 3, 4) / 7.0, requires_grad=True)  # distinct values: no ties
    assert gradcheck(lambda t: getattr(t, op)(1).values * 2.0, (x,))
    assert gradcheck(lambda t: getattr(t, op)(-1, True).values.exp(), (x,))


def test_reduce_dim_bad_input():
    x = tl.Tensor(make_array((2, 3)))
    with pytest.raises(ValueError, match="dim"):
        x.max(2)
    with pytest.raises(TypeError, match="dim"):
        x.min(1.0)
    with pytest.raises(ValueError, match="dim.*size 0"):
        tl.Tensor(np.zeros((2, 0), np.float32)).max(1)
    with pytest.raises(ValueError, match="dim"):
        x.median(-3)


# -- MultiheadAttention ---------------------------------------------------------------------------------------------
E, H, L, S, N = 8, 2, 5, 6, 3


def _mha_pair(batch_first: bool = False, **kw):
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, **kw)
    m = nn.MultiheadAttention(E, H, batch_first=batch_first, **kw)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    m.load_state_dict(tm.state_dict())
    return m, tm


def _compare_mha(m, tm, arrays, kwargs_tl, kwargs_torch, check_weights=True):
    tl_in = [tl.Tensor(a, requires_grad=True) for a in arrays]
    th_in = [torch.tensor(np.ascontiguousarray(a), requires_grad=True) for a in arrays]
    o, w = m(*tl_in, **kwargs_tl)
    to, tw = tm(*th_in, **kwargs_torch)
    assert_close(o.data, to, msg="attn_output")
    if check_weights:
        assert (w is None) == (tw is None)
        if w is not None:
            assert_close(w.data, tw, msg="attn_weights")
    g = make_array(o.shape, seed=11)
    o.backward(g)
    (to * torch.from_numpy(g)).sum().backward()
    for i, (a, b) in enumerate(zip(tl_in, th_in)):
        if b.grad is not None:
            assert_close(a.grad.data, b.grad, msg=f"grad of input {i}")
    for (n, p), (_, tp) in zip(m.named_parameters(), tm.named_parameters()):
        assert_close(p.grad.data, tp.grad, msg=f"grad of {n}")


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "reversed"])
def test_mha_self_and_cross_attention_vs_torch(batch_first, layout):
    m, tm = _mha_pair(batch_first)
    shp = (lambda n_, l_, e_: (n_, l_, e_)) if batch_first else (lambda n_, l_, e_: (l_, n_, e_))
    q = make_array(shp(N, L, E), seed=1, layout=layout)
    kv = make_array(shp(N, S, E), seed=2, layout=layout)
    _compare_mha(m, tm, [q, kv, kv.copy()], {}, {})  # cross-attention, separate key and value tensors
    m, tm = _mha_pair(batch_first)
    _compare_mha(m, tm, [q, q.copy(), q.copy()], {"average_attn_weights": False}, {"average_attn_weights": False})


@pytest.mark.parametrize("mask_kind", ["bool", "float", "bool3d", "causal"])
def test_mha_masks_vs_torch(mask_kind):
    m, tm = _mha_pair(batch_first=True)
    rng = np.random.default_rng(3)
    q, kv = make_array((N, L, E), seed=1), make_array((N, S, E), seed=2)
    kpm = np.zeros((N, S), bool)
    kpm[0, -2:] = True
    kpm[2, 0] = True
    if mask_kind == "bool":
        am = rng.random((L, S)) < 0.3
        am[:, 1] = False  # every query keeps one key: no fully masked row (NaN in both)
    elif mask_kind == "float":
        am = rng.standard_normal((L, S)).astype(np.float32)
    elif mask_kind == "bool3d":
        am = rng.random((N * H, L, S)) < 0.3
        am[..., 1] = False
    else:
        q = kv = make_array((N, L, E), seed=5)
        am = np.triu(np.ones((L, L), bool), 1)
        kpm = np.zeros((N, L), bool)
    tkpm = torch.tensor(kpm) if mask_kind != "float" else torch.tensor(np.where(kpm, -np.inf, 0).astype(np.float32))
    _compare_mha(
        m, tm, [q, kv, kv.copy()], {"key_padding_mask": kpm, "attn_mask": am},
        {"key_padding_mask": tkpm, "attn_mask": torch.tensor(am)},
    )  # fmt: skip
    if mask_kind == "causal":  # is_causal without a mask builds the same causal mask
        o1, _ = m(tl.Tensor(q), tl.Tensor(q), tl.Tensor(q), attn_mask=am)
        o2, _ = m(tl.Tensor(q), tl.Tensor(q), tl.Tensor(q), is_causal=True)
        assert_close(o1.data, o2.data, "float32")


def test_mha_need_weights_false_unbatched_kdim_vdim_and_no_bias():
    m, tm = _mha_pair(batch_first=False)
    q = make_array((L, E), seed=1)  # unbatched [L, E]
    kpm = np.zeros(L, bool)
    kpm[-1] = True
    _compare_mha(m, tm, [q, q.copy(), q.copy()], {"key_padding_mask": kpm}, {"key_padding_mask": torch.tensor(kpm)})
    m, tm = _mha_pair(batch_first=True)
    _compare_mha(m, tm, [make_array((N, L, E), seed=3)] * 3, {"need_weights": False}, {"need_weights": False})
    m, tm = _mha_pair(batch_first=True, kdim=5, vdim=7)
    assert m.in_proj_weight is None and m.k_proj_weight.shape == (E, 5)
    _compare_mha(m, tm, [make_array((N, L, E), seed=1), make_array((N, S, 5), seed=2), make_array((N, S, 7))], {}, {})
    m, tm = _mha_pair(batch_first=True, bias=False)
    _compare_mha(m, tm, [make_array((N, L, E), seed=4)] * 3, {}, {})


def test_mha_fully_padded_sequence_gives_zero_not_nan():
    """A batch element whose keys are all padding: torch's sdpa path (need_weights=False) gives 0 there; tinylearn does
    too on both paths (torch's need_weights=True path gives NaN; its other batch rows are compared)."""
    kpm = np.zeros((N, S), bool)
    kpm[1] = True  # sequence 1 is all padding
    kpm[0, -2:] = True
    q, kv = make_array((N, L, E), seed=1), make_array((N, S, E), seed=2)
    m, tm = _mha_pair(batch_first=True)
    kw = {"key_padding_mask": kpm, "need_weights": False}
    _compare_mha(m, tm, [q, kv, kv.copy()], kw, dict(kw, key_padding_mask=torch.tensor(kpm)))
    m, tm = _mha_pair(batch_first=True)
    x = tl.Tensor(q, requires_grad=True)
    o, w = m(x, tl.Tensor(kv), tl.Tensor(kv), key_padding_mask=kpm)
    to, tw = tm(torch.from_numpy(q), torch.from_numpy(kv), torch.from_numpy(kv), key_padding_mask=torch.tensor(kpm))
    assert torch.isnan(to[1]).all() and not np.isnan(o.data).any()  # torch's need_weights path: NaN
    assert (w.data[1] == 0).all()
    keep = [0, 2]
    assert_close(o.data[keep], to[keep], msg="attn_output of the unpadded rows")
    assert_close(w.data[keep], tw[keep], msg="attn_weights of the unpadded rows")
    o.sum().backward()
    assert np.isfinite(x.grad.data).all() and np.isfinite(m.in_proj_weight.grad.data).all()


def test_encoder_layer_padded_batch_loss_is_finite_like_torch():
    torch.manual_seed(2)
    tlay = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=True)
    lay = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=True)
    lay.load_state_dict(tlay.state_dict())
    kpm = np.zeros((N, L), bool)
    kpm[2] = True  # a fully padded sequence
    x, tx = _pair(make_array((N, L, E), seed=3))
    out = lay(x, src_key_padding_mask=kpm)
    tout = tlay(tx, src_key_padding_mask=torch.tensor(kpm))  # training mode: torch's sdpa path, finite
    assert_close(out.data, tout, msg="encoder output")
    loss, tloss = (out * out).mean(), (tout * tout).mean()
    assert np.isfinite(loss.item())
    loss.backward()
    tloss.backward()
    assert_close(x.grad.data, tx.grad, msg="grad of src")
    for (n, p), (_, tp) in zip(lay.named_parameters(), tlay.named_parameters()):
        assert_close(p.grad.data, tp.grad, msg=f"grad of {n}")


def test_mha_gradcheck_fp64():
    m = nn.MultiheadAttention(4, 2, batch_first=True, dtype=np.float64)
    tl.manual_seed(0)
    kpm = np.array([[False, False, True], [False, False, False]])
    x = tl.Tensor(np.random.default_rng(0).uniform(-1, 1, (2, 3, 4)), requires_grad=True)
    w = m.in_proj_weight
    assert gradcheck(lambda t, w_: m(t, t, t, key_padding_mask=kpm)[0], (x, w))
    assert gradcheck(lambda t: m(t, t, t, need_weights=True, average_attn_weights=False)[1], (x,))


def test_mha_dropout_only_in_training():
    m = nn.MultiheadAttention(E, H, dropout=0.5, batch_first=True)
    x = tl.Tensor(make_array((N, L, E)))
    tl.manual_seed(1)
    a = m(x, x, x)[1].data
    assert not np.allclose(a.sum(-1), 1.0)  # dropped and rescaled probabilities
    m.eval()
    np.testing.assert_allclose(m(x, x, x)[1].data.sum(-1), 1.0, rtol=1e-5)


def test_mha_bad_input():
    with pytest.raises(ValueError, match="embed_dim"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="add_bias_kv"):
        nn.MultiheadAttention(8, 2, add_bias_kv=True)
    m = nn.MultiheadAttention(E, H, batch_first=True)
    x = tl.Tensor(make_array((N, L, E)))
    with pytest.raises(ValueError, match="query"):
        m(tl.Tensor(make_array((N, L, E + 1))), x, x)
    with pytest.raises(ValueError, match="query/key/value"):
        m(x, x[0], x)
    with pytest.raises(ValueError, match=r"attn_mask: shape \(3, 3\)"):
        m(x, x, x, attn_mask=np.zeros((3, 3), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask: shape \(3, 4\)"):
        m(x, x, x, key_padding_mask=np.zeros((3, 4), bool))
    with pytest.raises(TypeError, match="attn_mask"):
        m(x, x, x, attn_mask=np.zeros((L, L), np.int64))
    with pytest.raises(TypeError, match="key"):
        m(x, make_array((N, L, E)), x)


# -- TransformerEncoderLayer / TransformerEncoder -------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_and_stack_vs_torch(norm_first, activation, batch_first):
    torch.manual_seed(1)
    kw = dict(dim_feedforward=16, dropout=0.0, activation=activation, batch_first=batch_first, norm_first=norm_first)
    tlay = torch.nn.TransformerEncoderLayer(E, H, layer_norm_eps=1e-6, **kw)
    te = torch.nn.TransformerEncoder(tlay, 2, norm=torch.nn.LayerNorm(E), enable_nested_tensor=False)
    e = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, layer_norm_eps=1e-6, **kw), 2, norm=nn.LayerNorm(E))
    assert [n for n, _ in e.named_parameters()] == [n for n, _ in te.named_parameters()]
    e.load_state_dict(te.state_dict())
    a = make_array((N, L, E) if batch_first else (L, N, E), seed=2, layout="strided")
    kpm = np.zeros((N, L), bool)
    kpm[1, -2:] = True
    causal = np.triu(np.ones((L, L), bool), 1)
    x, tx = _pair(a)
    out = e(x, mask=causal, src_key_padding_mask=kpm)
    tout = te(tx, mask=torch.tensor(causal), src_key_padding_mask=torch.tensor(kpm))
    assert_close(out.data, tout, msg="encoder output")
    g = make_array(out.shape, seed=3)
    out.backward(g)
    tout.backward(torch.from_numpy(g))
    assert_close(x.grad.data, tx.grad, msg="grad of src")
    for (n, p), (_, tp) in zip(e.named_parameters(), te.named_parameters()):
        assert_close(p.grad.data, tp.grad, msg=f"grad of {n}")


def test_encoder_layer_gradcheck_fp64():
    lay = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.0, batch_first=True, activation="gelu")
    for p in lay.parameters():
        p.data = p.data.astype(np.float64)
    x = tl.Tensor(np.random.default_rng(1).uniform(-1, 1, (2, 3, 4)), requires_grad=True)
    assert gradcheck(lambda t, w: lay(t), (x, lay.linear1.weight))


def test_encoder_bad_input():
    with pytest.raises(ValueError, match="activation"):
        nn.TransformerEncoderLayer(8, 2, activation="tanhh")
    with pytest.raises(ValueError, match="num_layers"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 0)
    with pytest.raises(ValueError, match="embed_dim"):
        nn.TransformerEncoderLayer(8, 3)


# -- the benchmark rows compute the same thing in every framework -----------------------------------------------------
@pytest.mark.parametrize(
    "name", ["pad", "sdpa", "einsum", "group_norm", "interpolate", "max_pool2d", "embedding", "cross_entropy"]
)
def test_bench_ops_cases_agree_with_torch(name):
    """``tinylearn bench autodiff`` ops rows: the tinylearn callable's input gradient equals torch's."""
    from tinylearn.autograd.bench import ops_case_fns

    fns = ops_case_fns(name)
    assert_close(fns["tinylearn"]().data, fns["torch"](), msg=name)


@pytest.mark.parametrize("name", ["pad", "group_norm", "interpolate", "max_pool2d", "embedding", "cross_entropy"])
def test_bench_ops_tinygrad_formulas_match_torch(name):
    """The hand-written tinygrad side of the ops rows (reflect pad, group_norm via layernorm) matches torch."""
    from tinylearn.bench.comparators import tinygrad_status

    ok, reason = tinygrad_status()
    if not ok:
        pytest.skip(reason)
    from tinygrad import Tensor

    from tinylearn.autograd.bench import _ops_inputs, _ops_tinygrad, _ops_tl_torch

    arrs, g = _ops_inputs(name)
    xs = [Tensor(a) for a in arrs]
    out = _ops_tinygrad(name, xs)
    grad = (out * Tensor(g)).sum().gradient(xs[0])[0]
    ths = [torch.tensor(a, requires_grad=True) for a in arrs]
    tout = _ops_tl_torch(name, torch, ths)
    (tout * torch.from_numpy(g)).sum().backward()
    assert_close(out.numpy(), tout, atol=1e-4, rtol=1e-4, msg=name)
    assert_close(grad.numpy(), ths[0].grad, atol=1e-4, rtol=1e-4, msg=f"grad {name}")
