"""tinylearn.autograd vs torch: every op forward + backward (contiguous, strided, transposed, broadcast inputs),
fp64 gradcheck, hypothesis broadcasting, and the engine's semantics (accumulation, retain_graph, hooks, ...)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tinylearn as tl
from tinylearn.autograd import Function, gradcheck, jvp
from tinylearn.autograd import dual as D
from tinylearn.testing import assert_close, broadcast_shape_pairs, make_array, make_layouts


def check_op(tl_fn, torch_fn, arrays, dtype="float32", seed=0, **tol):
    """Forward and backward (random upstream grad) of tl_fn vs torch_fn on the same input arrays."""
    tl_in = [tl.Tensor(a, requires_grad=True) for a in arrays]
    th_in = [torch.tensor(np.array(a, order="C", copy=True), requires_grad=True) for a in arrays]
    out = tl_fn(*tl_in)
    ref = torch_fn(*th_in)
    assert out.shape == tuple(ref.shape), (out.shape, ref.shape)
    assert_close(out.data, ref, dtype, **tol)
    g = np.random.default_rng(seed).standard_normal(ref.shape).astype(dtype)
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    for i, (a, b) in enumerate(zip(tl_in, th_in)):
        assert a.grad is not None, f"input {i} got no grad"
        assert a.grad.dtype == np.dtype(dtype)
        assert_close(a.grad.data, b.grad, dtype, msg=f"grad of input {i}", **tol)


UNARY = [
    ("neg", lambda x: -x, lambda x: -x, (-1, 1)),
    ("exp", lambda x: x.exp(), torch.exp, (-2, 2)),
    ("log", lambda x: x.log(), torch.log, (0.1, 3)),
    ("sqrt", lambda x: x.sqrt(), torch.sqrt, (0.1, 3)),
    ("tanh", lambda x: x.tanh(), torch.tanh, (-3, 3)),
    ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, (-6, 6)),
    ("relu", lambda x: x.relu(), torch.relu, (-1, 1)),
    ("gelu", lambda x: x.gelu(), torch.nn.functional.gelu, (-3, 3)),
    ("gelu_tanh", lambda x: x.gelu("tanh"), lambda x: torch.nn.functional.gelu(x, approximate="tanh"), (-3, 3)),
    ("abs", lambda x: x.abs(), torch.abs, (-1, 1)),
    ("clip", lambda x: x.clip(-0.3, 0.4), lambda x: x.clamp(-0.3, 0.4), (-1, 1)),
    ("pow2", lambda x: x**2, lambda x: x**2, (-2, 2)),
    ("pow_frac", lambda x: x**1.5, lambda x: x**1.5, (0.1, 2)),
    ("rpow", lambda x: 2.0**x, lambda x: 2.0**x, (-2, 2)),
    ("rsub", lambda x: 1.0 - x, lambda x: 1.0 - x, (-2, 2)),
    ("rdiv", lambda x: 1.0 / x, lambda x: 1.0 / x, (0.5, 2)),
    ("scalar_mul_add", lambda x: 3.0 * x + 2, lambda x: 3.0 * x + 2, (-2, 2)),
    ("softmax", lambda x: x.softmax(-1), lambda x: torch.softmax(x, -1), (-3, 3)),
    ("softmax0", lambda x: x.softmax(0), lambda x: torch.softmax(x, 0), (-3, 3)),
    ("log_softmax", lambda x: x.log_softmax(1), lambda x: torch.log_softmax(x, 1), (-3, 3)),
]


@pytest.mark.parametrize("name,f,tf,dom", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_all_layouts(name, f, tf, dom):
    for _layout, a in make_layouts((4, 5), low=dom[0], high=dom[1]):
        check_op(f, tf, [a])


BINARY = [
    ("add", lambda a, b: a + b, lambda a, b: a + b, (-1, 1)),
    ("sub", lambda a, b: a - b, lambda a, b: a - b, (-1, 1)),
    ("mul", lambda a, b: a * b, lambda a, b: a * b, (-1, 1)),
    ("div", lambda a, b: a / b, lambda a, b: a / b, (0.5, 2)),
    ("pow", lambda a, b: a**b, lambda a, b: a**b, (0.5, 2)),
    ("maximum", lambda a, b: a.maximum(b), torch.maximum, (-1, 1)),
    ("minimum", lambda a, b: a.minimum(b), torch.minimum, (-1, 1)),
]


@pytest.mark.parametrize("name,f,tf,dom", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_broadcasting(name, f, tf, dom):
    for i, (sa, sb) in enumerate(broadcast_shape_pairs(seed=1, n=12)):
        a = make_array(sa, seed=i, low=dom[0], high=dom[1], layout="strided")
        b = make_array(sb, seed=100 + i, low=dom[0], high=dom[1], layout="reversed")
        check_op(f, tf, [a, b])


def test_maximum_ties_split_like_torch():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([1.0, 5.0, 3.0], np.float32)
    check_op(lambda x, y: x.maximum(y), torch.maximum, [a, b])
    check_op(lambda x, y: x.minimum(y), torch.minimum, [a, b])


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((5, 4), (2, 4, 3)),
    ],
)
def test_matmul_shapes(sa, sb):
    for (_la, a), (_lb, b) in zip(make_layouts(sa, seed=1), make_layouts(sb, seed=7)):
        check_op(lambda x, y: x @ y, lambda x, y: x @ y, [a, b], reduction_size=8)


def test_matmul_transposed_operands():
    a = make_array((6, 3), seed=0).T  # non-contiguous [3, 6]
    b = make_array((5, 6), seed=1).T  # [6, 5]
    check_op(lambda x, y: x @ y, lambda x, y: x @ y, [a, b])
    check_op(lambda x, y: x.T @ y.T.T, lambda x, y: x.T @ y.T.T, [a.T.copy(), b])


REDUCE_ARGS = [None, 0, 1, -1, (0, 2)]


@pytest.mark.parametrize("op", ["sum", "mean", "var"])
@pytest.mark.parametrize("dim", REDUCE_ARGS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(op, dim, keepdim):
    for _, a in make_layouts((3, 4, 5)):
        if dim is None and keepdim and op == "var":
            check_op(lambda x: getattr(x, op)(None, True), lambda x: x.var(dim=None, keepdim=True), [a])
            continue
        check_op(
            lambda x: getattr(x, op)(dim=dim, keepdim=keepdim),
            lambda x: getattr(x, op)(dim=dim, keepdim=keepdim) if (dim is not None or keepdim) else getattr(x, op)(),
            [a],
        )


def test_var_correction():
    a = make_array((4, 6), seed=3)
    check_op(lambda x: x.var(1, correction=0), lambda x: x.var(1, correction=0), [a])
    check_op(lambda x: x.std(0), lambda x: x.std(0), [a])


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_dim_and_full(op):
    for _, a in make_layouts((3, 4, 5), seed=2):
        for dim in (0, 1, -1):
            for keepdim in (False, True):
                check_op(
                    lambda x, d=dim, k=keepdim: getattr(x, op)(d, k),
                    lambda x, d=dim, k=keepdim: getattr(x, op)(d, k).values,
                    [a],
                )
        check_op(lambda x: getattr(x, op)(), lambda x: getattr(x, op)(), [a])


def test_max_ties_full_split_evenly_and_dim_routes_to_first():
    a = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], np.float32)
    check_op(lambda x: x.max(), lambda x: x.max(), [a])  # torch: evenly split among the two 3s
    x = tl.Tensor(a, requires_grad=True)
    x.max(1).sum().backward()
    assert x.grad.data.tolist() == [[0, 1, 0], [1, 0, 0]]


SHAPE_OPS = [
    ("reshape", lambda x: x.reshape(6, 10), lambda x: x.reshape(6, 10)),
    ("view_neg1", lambda x: x.view(-1, 5), lambda x: x.reshape(-1, 5)),
    ("transpose", lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2)),
    ("permute", lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1)),
    ("T", lambda x: x.T, lambda x: x.permute(2, 1, 0)),
    ("flatten", lambda x: x.flatten(), lambda x: x.flatten()),
    ("flatten1", lambda x: x.flatten(1), lambda x: x.flatten(1)),
    ("unsqueeze", lambda x: x.unsqueeze(1), lambda x: x.unsqueeze(1)),
    ("squeeze", lambda x: x.unsqueeze(0).squeeze(), lambda x: x.unsqueeze(0).squeeze()),
    ("squeeze_dim", lambda x: x.unsqueeze(2).squeeze(2), lambda x: x.unsqueeze(2).squeeze(2)),
    ("expand", lambda x: x[:, :1].expand(3, 4, 5), lambda x: x[:, :1].expand(3, 4, 5)),
    ("expand_new", lambda x: x.expand(2, 3, 4, 5), lambda x: x.expand(2, 3, 4, 5)),
    ("slice", lambda x: x[1:, ::2, -1], lambda x: x[1:, ::2, -1]),
    ("int_index", lambda x: x[1], lambda x: x[1]),
    ("ellipsis_none", lambda x: x[..., None, 1:3], lambda x: x[..., None, 1:3]),
    ("int_array_dups", lambda x: x[np.array([0, 2, 0, 0])], lambda x: x[torch.tensor([0, 2, 0, 0])]),
    ("int_array_2d", lambda x: x[np.array([[0, 1], [1, 1]]), 2], lambda x: x[torch.tensor([[0, 1], [1, 1]]), 2]),
    ("two_arrays_dups", lambda x: x[[0, 0, 2], [1, 1, 3]], lambda x: x[[0, 0, 2], [1, 1, 3]]),
    ("bool_mask", lambda x: x[x.data > 0], lambda x: x[x > 0]),
    ("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3)),
]


@pytest.mark.parametrize("name,f,tf", SHAPE_OPS, ids=[s[0] for s in SHAPE_OPS])
def test_shape_ops(name, f, tf):
    for _, a in make_layouts((3, 4, 5), seed=5):
        check_op(f, tf, [a])


def test_tensor_index_duplicates_accumulate():
    x = tl.Tensor(np.arange(5, dtype=np.float32), requires_grad=True)
    idx = tl.Tensor(np.array([1, 1, 1, 4]))
    x[idx].sum().backward()
    assert x.grad.data.tolist() == [0, 3, 0, 0, 1]


def test_cat_stack_where():
    a, b, c = make_array((2, 3), seed=0), make_array((2, 5), seed=1, layout="fortran"), make_array((2, 1), seed=2)
    check_op(lambda x, y, z: tl.cat([x, y, z], 1), lambda x, y, z: torch.cat([x, y, z], 1), [a, b, c])
    d, e = make_array((2, 3), seed=3, layout="strided"), make_array((2, 3), seed=4)
    for dim in (0, 1, 2, -1):
        check_op(lambda x, y, k=dim: tl.stack([x, y], k), lambda x, y, k=dim: torch.stack([x, y], k), [d, e])
    cond = make_array((4, 1, 3), seed=9) > 0
    f, g = make_array((4, 2, 3), seed=5), make_array((2, 1), seed=6)
    check_op(lambda x, y: tl.where(cond, x, y), lambda x, y: torch.where(torch.from_numpy(cond), x, y), [f, g])
    check_op(lambda x: tl.where(cond, x, 0.0), lambda x: torch.where(torch.from_numpy(cond), x, 0.0), [f])


def test_composite_expression_vs_torch():
    def f(lib, x, w, b):
        h = (x @ w + b).tanh()
        return (h * h.sigmoid() - h.mean(0, keepdim=True)).exp().sum(1).log().mean()

    arrs = [make_array((8, 6), seed=0), make_array((6, 4), seed=1), make_array((4,), seed=2)]
    check_op(lambda *t: f(tl, *t), lambda *t: f(torch, *t), arrs)


# -- fp64 gradcheck -----------------------------------------------------------------------------------------------
GRADCHECK_FNS = [
    lambda x, y: (x * y + x / (y.abs() + 1)).sum(),
    lambda x, y: (x @ y.T).tanh(),
    lambda x, y: (x.exp() - y.sigmoid()).var(1),
    lambda x, y: tl.cat([x, y], 0).softmax(1),
    lambda x, y: tl.stack([x, y], 2).log_softmax(0).max(1),
    lambda x, y: tl.where(x.data > 0, x, y).gelu() + x.gelu("tanh"),
    lambda x, y: x[np.array([0, 0, 2])] * y[1],
    lambda x, y: (x.maximum(y) + x.clip(-0.5, 0.5)).permute(1, 0).reshape(-1),
    lambda x, y: ((x * x + 1).sqrt() ** 1.5).mean(0),
    lambda x, y: (x + 3).log() * (y.unsqueeze(0).expand(2, 3, 4).sum(0)),
]


@pytest.mark.parametrize("i", range(len(GRADCHECK_FNS)))
def test_gradcheck_fp64(i):
    rng = np.random.default_rng(i)
    x = tl.Tensor(rng.uniform(-1, 1, (3, 4)), requires_grad=True)
    y = tl.Tensor(rng.uniform(-1, 1, (3, 4)), requires_grad=True)
    assert x.dtype == np.float64
    assert gradcheck(GRADCHECK_FNS[i], (x, y))


def test_gradcheck_detects_wrong_backward():
    class BadSquare(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x  # wrong: should be 2 x g

    x = tl.Tensor(np.array([0.5, -1.5]), requires_grad=True)
    with pytest.raises(AssertionError, match="input 0"):
        gradcheck(lambda t: BadSquare.apply(t), (x,))


# -- hypothesis: broadcasting property -----------------------------------------------------------------------------
@st.composite
def broadcast_pair(draw):
    nd = draw(st.integers(1, 4))
    full = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    a = [d if draw(st.booleans()) else 1 for d in full]
    b = [d if draw(st.booleans()) else 1 for d in full]
    a = a[draw(st.integers(0, nd - 1)) :]
    return tuple(a), tuple(b)


@settings(max_examples=60, deadline=None)
@given(broadcast_pair(), st.sampled_from(["add", "mul", "sub", "div"]))
def test_hypothesis_broadcast_grad_shapes_and_values(shapes, op):
    sa, sb = shapes
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 2, sa).astype(np.float32), rng.uniform(0.5, 2, sb).astype(np.float32)
    fn = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "sub": lambda x, y: x - y, "div": lambda x, y: x / y}[
        op
    ]
    check_op(fn, fn, [a, b])


# -- engine semantics ------------------------------------------------------------------------------------------------
def test_reused_node_and_accumulation_across_backward():
    x = tl.Tensor(np.array([2.0, 3.0], np.float32), requires_grad=True)
    y = x * x  # reused twice below
    z = (y + y * 3).sum()
    z.backward()
    np.testing.assert_allclose(x.grad.data, 8 * x.data)
    (x * 2).sum().backward()  # accumulates like torch
    np.testing.assert_allclose(x.grad.data, 8 * x.data + 2)


def test_shared_grad_arrays_are_not_aliased():
    x = tl.Tensor(np.ones(3, np.float32), requires_grad=True)
    y = tl.Tensor(np.ones(3, np.float32), requires_grad=True)
    (x + y).sum().backward()
    x.grad.data *= 5  # user edits one leaf's grad in place
    assert y.grad.data.tolist() == [1, 1, 1]
    a = x * 1
    s = (x + a) + (x * 2)
    x.grad = None
    s.sum().backward()
    assert x.grad.data.tolist() == [4, 4, 4]


def test_leaf_grads_from_views_never_alias_anything_else():
    """The engine hands a leaf a view of a backward's array without copying only when nothing else references its
    base (engine._sole_view): views of one shared gradient, or of the caller's gradient array, are copied."""
    x = tl.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    y = tl.Tensor(np.ones((3, 2), np.float32), requires_grad=True)
    (x.reshape(6) + y.reshape(6)).sum().backward()  # both reshape VJPs view the same upstream array
    x.grad.data *= 5
    assert y.grad.data.tolist() == [[1, 1]] * 3 and x.grad.data.tolist() == [[5, 5, 5]] * 2
    g = np.arange(6, dtype=np.float32)
    z = tl.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    z.reshape(6).backward(tl.Tensor(g))  # the VJP is a view of the caller's array
    z.grad.data += 100
    assert g.tolist() == [0, 1, 2, 3, 4, 5]
    w = tl.Tensor(np.ones(32, np.float32), requires_grad=True)
    v = tl.Tensor(np.random.default_rng(0).standard_normal((2, 32, 4)).astype(np.float32), requires_grad=True)
    tl.nn.functional.group_norm(v, 4, w).sum().backward()  # dx: a reshape of the kernel's fresh array, handed over
    assert v.grad.data.flags.writeable and v.grad.shape == (2, 32, 4)
    assert not np.shares_memory(v.grad.data, v.data) and not np.shares_memory(v.grad.data, w.grad.data)


def test_backward_twice_raises_and_retain_graph_works():
    x = tl.Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.data, 4 * x.data)
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_backward_errors():
    x = tl.Tensor(np.ones((2, 2), np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        tl.Tensor([1.0]).backward()
    with pytest.raises(TypeError, match="int64"):
        tl.Tensor(np.arange(3), requires_grad=True)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        tl.Tensor(np.ones((2, 3))) @ tl.Tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
        tl.Tensor(np.ones((2, 3))) + tl.Tensor(np.ones(4))
    with pytest.raises(ValueError, match="shape"):
        x.reshape(3, 3)
    with pytest.raises(ValueError, match="dim"):
        x.sum(dim=3)


def test_no_grad_and_detach():
    x = tl.Tensor(np.ones(3, np.float32), requires_grad=True)
    with tl.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    assert (x * 2).requires_grad
    assert not (x * 2).detach().requires_grad

    @tl.no_grad()
    def f(t):
        return t + 1

    assert not f(x).requires_grad


def test_tensor_hooks():
    x = tl.Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    seen = []
    y = x * 3
    h = y.register_hook(lambda g: seen.append(g.data.copy()) or g * 2)
    x.register_hook(lambda g: g + 1)
    y.sum().backward()
    assert seen[0].tolist() == [1, 1]
    assert x.grad.data.tolist() == [7, 7]  # (1 * 2) * 3 + 1
    h.remove()
    x.grad = None
    y2 = x * 3
    y2.retain_grad()
    y2.sum().backward()
    assert y2.grad.data.tolist() == [1, 1]


def test_detect_anomaly_names_the_op():
    x = tl.Tensor(np.array([-1.0, 1.0], np.float32), requires_grad=True)
    with tl.autograd.detect_anomaly():
        with pytest.raises(RuntimeError, match="'Log'.*NaN"):
            x.log()
    y = tl.Tensor(np.array([0.0, 1.0], np.float32), requires_grad=True)
    z = y.sqrt().sum()  # forward is finite; backward divides by 0
    with tl.autograd.detect_anomaly():
        with pytest.raises(RuntimeError, match="'Sqrt'.*backward"):
            z.backward()


def test_custom_function_api_non_tensor_args_and_tuple_outputs():
    class ScaleSplit(Function):
        @staticmethod
        def forward(ctx, x, s, offset=0.0):
            ctx.save_for_backward(x)
            ctx.s = s
            return x * s + offset, x * x

        @staticmethod
        def backward(ctx, g1, g2):
            (x,) = ctx.saved_tensors
            assert ctx.needs_input_grad == (True, False)
            return g1 * ctx.s + 2 * x * g2, None

    x = tl.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    a, b = ScaleSplit.apply(x, 3.0, offset=1.0)
    assert a.data.tolist() == [4.0, 7.0]
    (a.sum() + b.sum()).backward()
    assert x.grad.data.tolist() == [5.0, 7.0]
    x.grad = None
    a, b = ScaleSplit.apply(x, 3.0)
    a.sum().backward()  # b got no gradient: zeros are materialized
    assert x.grad.data.tolist() == [3.0, 3.0]


def test_custom_function_wrong_grad_shape_is_reported():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x.sum(0)

        @staticmethod
        def backward(ctx, g):
            return g

    x = tl.Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="'Bad'.*shape"):
        Bad.apply(x).sum().backward()


def test_deep_graph_no_recursion_limit():
    x = tl.Tensor(np.array([1.0], np.float32), requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, [1.0001**5000], rtol=1e-3)


def test_storage_hook_sees_new_arrays():
    from tinylearn.autograd.tensor import get_storage_hook, set_storage_hook

    seen = []

    def hook(arr):
        seen.append(arr.shape)
        return arr.copy()

    prev = set_storage_hook(hook)
    try:
        a = tl.ones(2, 3)
        b = (a * 2).sum()
    finally:
        set_storage_hook(prev)
    assert get_storage_hook() is prev
    assert (2, 3) in seen and () in seen and b.item() == 12
    with pytest.raises(TypeError):
        set_storage_hook(42)


def test_dtypes_and_factories():
    assert tl.Tensor([1.0, 2.0]).dtype == np.float32
    assert tl.Tensor(np.zeros(2)).dtype == np.float64
    assert tl.Tensor([1, 2]).dtype == np.int64
    assert tl.arange(5).dtype == np.int64 and tl.arange(0, 1, 0.5).dtype == np.float32
    tl.manual_seed(3)
    a = tl.randn(2, 3).numpy().copy()
    tl.manual_seed(3)
    assert np.array_equal(a, tl.randn(2, 3).numpy()) and a.dtype == np.float32
    assert tl.zeros(2, 2).numpy().sum() == 0 and tl.ones((2, 2)).numpy().sum() == 4
    r = tl.rand(100).numpy()
    assert 0 <= r.min() and r.max() < 1
    with pytest.raises(ValueError):
        tl.zeros(-1)


def test_jvp_dual_numbers_match_reverse_mode():
    def f_dual(x, y):
        return D.exp(x * y) + D.sin(x) / (y * y + 1) + D.tanh(x - y) ** 2

    def f_tl(x, y):
        return (x * y).exp() + tl.Tensor(np.sin(x.data)) * 0 + _sin(x) / (y * y + 1) + (x - y).tanh() ** 2

    def _sin(x):  # sin via autograd ops is not in the API; use the identity sin = Im(e^{ix}) -> compute directly
        class Sin(Function):
            @staticmethod
            def forward(ctx, a):
                ctx.save_for_backward(a)
                return np.sin(a)

            @staticmethod
            def backward(ctx, g):
                return g * np.cos(ctx.saved_tensors[0])

        return Sin.apply(x)

    x0, y0 = 0.3, -0.7
    val, dx = jvp(f_dual, (x0, y0), (1.0, 0.0))
    _, dy = jvp(f_dual, (x0, y0), (0.0, 1.0))
    xt, yt = tl.Tensor(np.array(x0), requires_grad=True), tl.Tensor(np.array(y0), requires_grad=True)
    out = f_tl(xt, yt)
    out.backward()
    assert abs(val - out.item()) < 1e-12
    assert abs(dx - xt.grad.item()) < 1e-10 and abs(dy - yt.grad.item()) < 1e-10
    with pytest.raises(ValueError, match="tangent"):
        jvp(f_dual, (1.0, 2.0), (1.0,))


def test_item_numpy_repr_and_errors():
    t = tl.Tensor([[1.0, 2.0]], requires_grad=True)
    assert "requires_grad=True" in repr(t)
    with pytest.raises(ValueError, match="one-element"):
        t.item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(t)
    assert isinstance(t.numpy(), np.ndarray)


def test_numpy_interop_iteration_and_no_silent_ufuncs():
    t = tl.Tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert [x.item() for x in t] == [1.0, 2.0, 3.0]
    assert np.asarray(t) is t.data
    y = np.ones(3, np.float32) * t  # ndarray <op> Tensor defers to the Tensor (graph kept)
    assert isinstance(y, tl.Tensor) and y.requires_grad
    with pytest.raises(TypeError):
        np.exp(t)


def test_leaf_hook_runs_once_with_the_total_gradient_like_torch():
    x = tl.Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    seen, tseen = [], []
    x.register_hook(lambda g: seen.append(g.data.copy()))
    tx.register_hook(lambda g: tseen.append(g.clone()))
    (x * x + x * 3).sum().backward()
    (tx * tx + tx * 3).sum().backward()
    assert len(seen) == len(tseen) == 1
    np.testing.assert_allclose(seen[0], tseen[0].numpy())


def test_zero_dim_reused_nodes_accumulate():
    x = tl.Tensor(np.array(0.5), requires_grad=True)
    u = x * 2.0  # 0-d intermediate used three times
    (u * u + u.exp() + u).backward()
    tx = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    tu = tx * 2.0
    (tu * tu + tu.exp() + tu).backward()
    assert abs(x.grad.item() - tx.grad.item()) < 1e-12


def test_pow_edge_cases_match_torch():
    a = np.array([-2.0, 0.0, 0.0, 3.0])
    b = np.array([2.0, 1.0, -1.0, 0.5])
    x, y = tl.Tensor(a, requires_grad=True), tl.Tensor(b, requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (x**y).sum().backward()
    (tx**ty).sum().backward()
    assert_close(x.grad.data, tx.grad)
    assert_close(y.grad.data, ty.grad)
    z = tl.Tensor(np.array([0.0, 2.0]), requires_grad=True)
    (z**0).sum().backward()
    assert z.grad.data.tolist() == [0.0, 0.0]


def test_inplace_updates_under_no_grad_modify_the_parameter():
    p = tl.Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    (p * p).sum().backward()
    alias = p
    with tl.no_grad():
        p -= 0.5 * p.grad
    assert alias is p and p.data.tolist() == [0.0, 0.0] and p.requires_grad
    with pytest.raises(RuntimeError, match="in-place"):
        p += 1.0
    p.grad.zero_()
    assert p.grad.data.tolist() == [0.0, 0.0]
    q = tl.Tensor(np.zeros((2, 2), np.float32))
    q.copy_(np.array([1.0, 2.0]))
    q *= 2
    q /= 4
    assert q.data.tolist() == [[0.5, 1.0], [0.5, 1.0]]
    with pytest.raises(ValueError, match=r"\(3,\)"):
        q += np.ones(3)


def test_gradcheck_accepts_numpy_inputs():
    assert gradcheck(lambda a, b: (a * b).sum(), [np.array([1.0, 2.0]), np.array([3.0, -1.0])])


def test_bench_step_phases_and_thread_arguments():
    from tinylearn.autograd import bench as B

    for kind in ("mlp", "cnn"):
        r = B.step_phases(kind, threads=1, steps=1, warmup=0, legacy=kind == "cnn")
        assert set(r) == {"tinylearn", "torch"} and all(set(v) == set(B.PHASES) for v in r.values())
        assert all(ms > 0 for v in r.values() for ms in v.values())
    with pytest.raises(ValueError, match="threads"):
        B.run(cases=("mlp",), threads=0)
    with pytest.raises(ValueError, match="kind"):
        B.step_phases("rnn")
    with pytest.raises(ValueError, match="steps"):
        B.step_phases("mlp", steps=0)


# -- Linear: BLAS orientation, column-major activations, side-by-side backward GEMMs (issue 18) ----------------------
def _mlp_pair(n: int, sizes: tuple[int, ...], seed: int = 0) -> tuple[list, list, np.ndarray]:
    rng = np.random.default_rng(seed)
    ws = [
        ((rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32), rng.standard_normal(o).astype(np.float32))
        for i, o in zip(sizes[:-1], sizes[1:])
    ]
    return (
        ws,
        [tuple(torch.from_numpy(a.copy()).requires_grad_() for a in wb) for wb in ws],
        rng.standard_normal((n, sizes[0])).astype(np.float32),
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,sizes", [(128, (300, 256, 256, 10)), (8, (40, 64, 3)), (300, (20, 50, 7))])
def test_linear_relu_chain_vs_torch(threads, n, sizes, monkeypatch):
    """Linear -> ReLU chains: N <= out takes the transposed forward (column-major output) and the column-major
    backward; with 2 BLAS threads the backward GEMMs run side by side (blas_pair). Values and grads vs torch."""
    from threadpoolctl import threadpool_limits

    from tinylearn.autograd import blas_pair, linalg
    from tinylearn.nn import functional as F

    calls = []
    monkeypatch.setattr(linalg, "run_pair", lambda *f: calls.append("pair") or blas_pair.run_pair(*f))
    monkeypatch.setattr(
        linalg, "matmul_rows_split", lambda *a: calls.append("split") or blas_pair.matmul_rows_split(*a)
    )
    ws, th_ws, x = _mlp_pair(n, sizes)
    tl_ws = [tuple(tl.Tensor(a, requires_grad=True) for a in wb) for wb in ws]
    x_grad = n != 128  # the MLP-benchmark-like case: the input needs no grad (layer 1 computes dW only)
    xt, xth = tl.Tensor(x, requires_grad=x_grad), torch.from_numpy(x.copy()).requires_grad_(x_grad)
    # the OpenBLAS orientation and pair paths (on an AVX-512 CPU gemm_route would take the C++ GEMM for 128 rows)
    with threadpool_limits(threads), tl.backends.use("gemm.matmul", backend="numpy"):
        h, hth = xt, xth
        for k, ((w, b), (tw, tb)) in enumerate(zip(tl_ws, th_ws)):
            h, hth = F.linear(h, w, b), torch.nn.functional.linear(hth, tw, tb)
            if k == 0 and n <= sizes[1]:
                assert h.data.flags.f_contiguous and not h.data.flags.c_contiguous  # transposed orientation taken
            if k < len(ws) - 1:
                h, hth = h.relu(), hth.relu()
        g = np.random.default_rng(1).standard_normal(h.shape).astype(np.float32)
        h.backward(g)
        hth.backward(torch.from_numpy(g))
    if threads == 2 and n == 128 and blas_pair._openblas() is not None and blas_pair._CORES >= 2:
        # layer 1 (input without grad): dW as two row halves; layer 2: dX and dW side by side
        assert sorted(calls) == ["pair", "split"]
    elif threads == 1 or n != 128:
        assert calls == []
    assert_close(h.data, hth, "float32")
    if x_grad:
        assert_close(xt.grad.data, xth.grad, "float32", msg="dx")
    for (w, b), (tw, tb) in zip(tl_ws, th_ws):
        assert w.grad.data.flags.c_contiguous  # the fused optimizer kernels need C-contiguous weight grads
        assert_close(w.grad.data, tw.grad, "float32", msg="dW")
        assert_close(b.grad.data, tb.grad, "float32", msg="db")


def test_linear_gradcheck_fp64_column_major():
    """fp64 gradcheck through linear -> relu -> linear with N <= out (transposed forward, column-major backward)."""
    from tinylearn.nn import functional as F

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    w1, b1 = rng.standard_normal((6, 4)), rng.standard_normal(6)
    w2, b2 = rng.standard_normal((5, 6)), rng.standard_normal(5)
    assert gradcheck(lambda *a: F.linear(F.linear(a[0], a[1], a[2]).relu(), a[3], a[4]), (x, w1, b1, w2, b2))


def test_blas_pair_results_and_errors():
    """run_pair / matmul_rows_split give exactly the sequential results; an error on the helper thread reaches the
    caller and the helper keeps working; OpenBLAS's thread count is restored."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from tinylearn.autograd import blas_pair

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((257, 64)).astype(np.float32), rng.standard_normal((64, 33)).astype(np.float32)
    with threadpool_limits(1):  # each product of a pair runs on one OpenBLAS thread: compare with one-thread GEMMs
        ref_ab, ref_ba = a @ b, b.T @ a.T  # (a 2-thread GEMM may split K differently: OPENBLAS_CORETYPE=Haswell does)
    with threadpool_limits(2):
        before = [i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"]
        r1, r2 = blas_pair.run_pair(lambda: a @ b, lambda: b.T @ a.T)
        np.testing.assert_array_equal(r1, ref_ab)
        np.testing.assert_array_equal(r2, ref_ba)
        assert_close(r1, a @ b, "float32")  # and within the tolerance table of the threaded product
        out = blas_pair.matmul_rows_split(a, b)
        assert out.flags.c_contiguous and out.shape == (257, 33)
        with threadpool_limits(1):  # each half is a one-thread GEMM of its rows (the full product may tile the rows
            halves = np.concatenate([a[:128] @ b, a[128:] @ b])  # differently: bitwise only per half)
        np.testing.assert_array_equal(out, halves)
        assert_close(out, ref_ab, "float32")

        def boom() -> None:
            raise FloatingPointError("from the helper")

        with pytest.raises(FloatingPointError, match="from the helper"):
            blas_pair.run_pair(boom, lambda: a @ b)
        r1, _ = blas_pair.run_pair(lambda: 7, lambda: 8)
        assert r1 == 7
        assert [i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"] == before
    assert not blas_pair.parallel_ok(float(blas_pair.MIN_FLOPS - 1))  # too small to pay the hand-off


@pytest.mark.parametrize("ignore_index", [-100, 2, 10])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_fast_path_vs_torch(ignore_index, reduction):
    """The fused cross-entropy skips its validity mask when every label is in range and ignore_index is not a class
    (-100, 10 with 10 classes); with ignore_index = 2 it masks. Loss and grad vs torch either way."""
    from tinylearn.nn import functional as F

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 10)).astype(np.float32) * 3
    y = rng.integers(0, 10, 64)
    xt, xth = tl.Tensor(x, requires_grad=True), torch.from_numpy(x.copy()).requires_grad_()
    out = F.cross_entropy(xt, y, ignore_index=ignore_index, reduction=reduction)
    ref = torch.nn.functional.cross_entropy(xth, torch.from_numpy(y), ignore_index=ignore_index, reduction=reduction)
    assert_close(out.data, ref, "float32")
    g = np.random.default_rng(1).standard_normal(ref.shape).astype(np.float32)
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    assert_close(xt.grad.data, xth.grad, "float32")
    with pytest.raises(ValueError, match="target label 11 is out of range"):
        F.cross_entropy(xt, np.where(np.arange(64) == 5, 11, y), ignore_index=ignore_index)
