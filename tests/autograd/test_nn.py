"""tinylearn.nn vs torch.nn: functional ops and layers forward + backward, Module internals (registration,
state_dict round trip, hooks, prune-style re-parametrisation), BatchNorm running statistics, losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import nn
from tinylearn.autograd import gradcheck
from tinylearn.nn import functional as F
from tinylearn.testing import assert_close, make_array


def _pair(a, grad=True):
    return tl.Tensor(a, requires_grad=grad), torch.tensor(np.array(a, order="C", copy=True), requires_grad=grad)


def _copy_params(tl_mod, th_mod):
    th_sd = th_mod.state_dict()
    tl_mod.load_state_dict({k: v.detach().numpy() for k, v in th_sd.items()})


def _check_grads(tl_mod, th_mod, **tol):
    th_named = dict(th_mod.named_parameters())
    for name, p in tl_mod.named_parameters():
        assert_close(p.grad.data, th_named[name].grad, msg=name, **tol)


def test_linear_matches_torch_and_default_init_bounds():
    tl.manual_seed(0)
    lin = nn.Linear(20, 7)
    bound = 1 / np.sqrt(20)
    assert lin.weight.shape == (7, 20) and np.abs(lin.weight.data).max() <= bound
    assert np.abs(lin.bias.data).max() <= bound and lin.weight.data.std() > bound / 3
    ref = torch.nn.Linear(20, 7)
    _copy_params(lin, ref)
    x, tx = _pair(make_array((5, 3, 20), layout="strided"))
    out, tout = lin(x), ref(tx)
    assert_close(out.data, tout)
    g = np.random.default_rng(0).standard_normal(out.shape).astype(np.float32)
    out.backward(g)
    tout.backward(torch.from_numpy(g))
    assert_close(x.grad.data, tx.grad)
    _check_grads(lin, ref)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(stride=1, padding=0),
        dict(stride=2, padding=1),
        dict(stride=1, padding=2, dilation=2),
        dict(groups=2, padding=1),
    ],
)
def test_conv2d_module_matches_torch(cfg):
    tl.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, **cfg)
    ref = torch.nn.Conv2d(4, 6, 3, **cfg)
    _copy_params(conv, ref)
    x, tx = _pair(make_array((2, 4, 9, 8), layout="fortran"))
    out, tout = conv(x), ref(tx)
    assert_close(out.data, tout)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    out.backward(g)
    tout.backward(torch.from_numpy(g))
    assert_close(x.grad.data, tx.grad)
    _check_grads(conv, ref)


def test_pooling_modules_match_torch():
    a = make_array((2, 3, 7, 6), seed=3)
    for mod, ref in [
        (nn.MaxPool2d(2), torch.nn.MaxPool2d(2)),
        (nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(3, 2, 1)),
        (nn.AvgPool2d(2), torch.nn.AvgPool2d(2)),
        (nn.AvgPool2d(3, 1, 1, count_include_pad=False), torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)),
    ]:
        x, tx = _pair(a)
        out, tout = mod(x), ref(tx)
        assert_close(out.data, tout)
        out.sum().backward()
        tout.sum().backward()
        assert_close(x.grad.data, tx.grad)


def test_batchnorm2d_train_eval_running_stats_like_torch():
    bn, ref = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    _copy_params(bn, ref)
    for step in range(3):
        x, tx = _pair(make_array((4, 3, 5, 5), seed=step, low=-2, high=3))
        out, tout = bn(x), ref(tx)
        assert_close(out.data, tout)
        g = np.random.default_rng(step).standard_normal(out.shape).astype(np.float32)
        out.backward(g)
        tout.backward(torch.from_numpy(g))
        assert_close(x.grad.data, tx.grad)
    _check_grads(bn, ref, atol=1e-4, rtol=1e-4)
    assert_close(bn.running_mean.data, ref.running_mean)
    assert_close(bn.running_var.data, ref.running_var)
    assert int(bn.num_batches_tracked.data) == int(ref.num_batches_tracked) == 3
    bn.eval()
    ref.eval()
    x, tx = _pair(make_array((2, 3, 4, 4), seed=9))
    out, tout = bn(x), ref(tx)
    assert_close(out.data, tout)
    out.sum().backward()
    tout.sum().backward()
    assert_close(x.grad.data, tx.grad)
    with pytest.raises(ValueError, match="channels"):
        bn(tl.Tensor(np.zeros((2, 4, 3, 3), np.float32)))
    bn.train()
    with pytest.raises(ValueError, match="more than 1 value"):
        bn(tl.Tensor(np.zeros((1, 3, 1, 1), np.float32)))


def test_layernorm_matches_torch():
    ln, ref = nn.LayerNorm((4, 5)), torch.nn.LayerNorm((4, 5))
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    _copy_params(ln, ref)
    x, tx = _pair(make_array((3, 4, 5), layout="reversed"))
    out, tout = ln(x), ref(tx)
    assert_close(out.data, tout)
    g = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
    out.backward(g)
    tout.backward(torch.from_numpy(g))
    assert_close(x.grad.data, tx.grad, atol=1e-4)
    _check_grads(ln, ref)


def test_norm_functions_gradcheck_fp64():
    rng = np.random.default_rng(0)
    x = tl.Tensor(rng.standard_normal((3, 2, 2, 2)), requires_grad=True)
    w = tl.Tensor(rng.uniform(0.5, 1.5, 2), requires_grad=True)
    b = tl.Tensor(rng.standard_normal(2), requires_grad=True)
    assert gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (x, w, b))
    assert gradcheck(lambda x, w, b: F.layer_norm(x, (2,), w, b), (x, w, b))
    assert gradcheck(lambda x: F.cross_entropy(x.reshape(3, 8), np.array([0, 7, 3])), (x,))
    assert gradcheck(lambda x: F.log_softmax(x, 1), (x,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_torch(reduction):
    x, tx = _pair(make_array((6, 5), low=-3, high=3, layout="fortran"))
    y = np.array([0, 4, 2, 2, 1, 3])
    out = F.cross_entropy(x, tl.Tensor(y), reduction=reduction)
    tout = torch.nn.functional.cross_entropy(tx, torch.from_numpy(y), reduction=reduction)
    assert_close(out.data, tout)
    out.sum().backward()
    tout.sum().backward()
    assert_close(x.grad.data, tx.grad)


def test_cross_entropy_stable_ignore_index_label_smoothing():
    big = np.array([[1e4, 0.0, -1e4], [5e3, 5e3, 0.0]], np.float32)
    out = F.cross_entropy(tl.Tensor(big), np.array([0, 1]))
    ref = torch.nn.functional.cross_entropy(torch.from_numpy(big), torch.tensor([0, 1]))
    assert np.isfinite(out.item())
    assert_close(out.data, ref)
    x, tx = _pair(make_array((4, 3), seed=2))
    y = np.array([0, -100, 2, 1])
    out = F.cross_entropy(x, y, ignore_index=-100, label_smoothing=0.1)
    tout = torch.nn.functional.cross_entropy(tx, torch.from_numpy(y), ignore_index=-100, label_smoothing=0.1)
    assert_close(out.data, tout)
    out.backward()
    tout.backward()
    assert_close(x.grad.data, tx.grad)


def test_cross_entropy_bad_labels():
    x = tl.Tensor(np.zeros((2, 3), np.float32), requires_grad=True)
    with pytest.raises(ValueError, match="label 3"):
        F.cross_entropy(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="label -2"):
        F.cross_entropy(x, np.array([-2, 0]))
    with pytest.raises(ValueError, match="shape"):
        F.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integer"):
        F.cross_entropy(x, np.array([0.0, 1.0]))


def test_mse_dropout_embedding_activations():
    x, tx = _pair(make_array((4, 3)))
    t = make_array((4, 3), seed=1)
    out = F.mse_loss(x, tl.Tensor(t))
    tout = torch.nn.functional.mse_loss(tx, torch.from_numpy(t))
    assert_close(out.data, tout)
    out.backward()
    tout.backward()
    assert_close(x.grad.data, tx.grad)
    with pytest.raises(ValueError, match="shape"):
        F.mse_loss(x, tl.Tensor(np.zeros(3, np.float32)))
    # dropout: zeros a fraction ~p, scales survivors, identity in eval
    tl.manual_seed(0)
    d = nn.Dropout(0.25)
    z = tl.Tensor(np.ones((200, 100), np.float32), requires_grad=True)
    y = d(z)
    frac = (y.data == 0).mean()
    assert 0.22 < frac < 0.28 and np.allclose(y.data[y.data != 0], 1 / 0.75)
    y.sum().backward()
    assert np.array_equal(z.grad.data != 0, y.data != 0)
    d.eval()
    assert d(z) is z
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(1.5)
    # embedding with duplicate indices
    emb = nn.Embedding(5, 3)
    ref = torch.nn.Embedding(5, 3)
    _copy_params(emb, ref)
    idx = np.array([[0, 2, 2], [4, 2, 0]])
    out, tout = emb(tl.Tensor(idx)), ref(torch.from_numpy(idx))
    assert_close(out.data, tout)
    out.sum().backward()
    tout.sum().backward()
    assert_close(emb.weight.grad.data, ref.weight.grad)
    with pytest.raises(ValueError, match="index 5"):
        emb(np.array([5]))
    for mod, tmod in [
        (nn.ReLU(), torch.nn.ReLU()),
        (nn.GELU(), torch.nn.GELU()),
        (nn.GELU("tanh"), torch.nn.GELU("tanh")),
    ]:
        a, ta = _pair(make_array((3, 4), low=-3, high=3))
        assert_close(mod(a).data, tmod(ta))
    fl = nn.Flatten()(tl.Tensor(np.zeros((2, 3, 4))))
    assert fl.shape == (2, 12)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 4 * 4, 10)
        self.scale = 2.0

    def forward(self, x):
        return self.head(self.body(x).flatten(1)) * self.scale


def test_module_registration_and_traversal():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias", "head.weight", "head.bias"]
    assert [n for n, _ in net.named_buffers()] == [
        "body.1.running_mean",
        "body.1.running_var",
        "body.1.num_batches_tracked",
    ]
    assert [n for n, _ in net.named_modules()] == ["", "body", "body.0", "body.1", "body.2", "body.3", "head"]
    assert [n for n, _ in net.named_children()] == ["body", "head"]
    assert len(list(net.parameters())) == 6 and len(net.body) == 4 and isinstance(net.body[-1], nn.MaxPool2d)
    assert isinstance(net.body[1:3], nn.Sequential) and len(net.body[1:3]) == 2
    assert list(iter(net.body))[0] is net.body[0]
    ref_names = [
        n for n, _ in torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4)).state_dict().items()
    ]
    assert [n for n in nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)).state_dict()] == ref_names
    net.eval()
    assert not net.training and not net.body[1].training
    net.train()
    assert net.body[1].training
    x = tl.Tensor(np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32))
    net(x).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    with pytest.raises(AttributeError, match="nope"):
        _ = net.nope


def test_state_dict_round_trip_and_strict_errors():
    tl.manual_seed(0)
    a = Net()
    x = tl.Tensor(np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32))
    a(x)  # update BN running stats
    tl.manual_seed(1)
    b = Net()
    sd = a.state_dict()
    b.load_state_dict(sd)
    a.eval()
    b.eval()
    assert np.array_equal(a(x).data, b(x).data)
    sd2 = dict(sd)
    sd2.pop("head.bias")
    with pytest.raises(RuntimeError, match="head.bias"):
        b.load_state_dict(sd2)
    sd3 = dict(sd)
    sd3["extra"] = np.zeros(1)
    with pytest.raises(RuntimeError, match="extra"):
        b.load_state_dict(sd3)
    missing, unexpected = b.load_state_dict(sd3, strict=False)
    assert unexpected == ["extra"] and missing == []
    sd4 = dict(sd)
    sd4["head.weight"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match=r"head.weight.*\(3, 3\)"):
        b.load_state_dict(sd4)
    # torch can load our state dict (names and shapes are torch's)
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    ours = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    tnet.load_state_dict({k: torch.from_numpy(np.array(v.data)) for k, v in ours.state_dict().items()})


def test_forward_hooks_and_prune_style_reparametrisation():
    lin = nn.Linear(4, 3)
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    h2 = lin.register_forward_hook(lambda m, args, out: out * 0)
    x = tl.Tensor(np.ones((2, 4), np.float32))
    assert np.all(lin(x).data == 0) and calls == ["pre"]
    h1.remove()
    h2.remove()
    assert np.any(lin(x).data != 0) and calls == ["pre"]
    # torch.nn.utils.prune's mechanism
    w = lin.weight
    del lin._parameters["weight"]
    lin.register_parameter("weight_orig", nn.Parameter(w.data))
    mask = (np.arange(12).reshape(3, 4) % 2).astype(np.float32)
    lin.register_buffer("weight_mask", tl.Tensor(mask))

    def recompute(module, args):
        module.weight = module.weight_orig * module.weight_mask

    lin.register_forward_pre_hook(recompute)
    out = lin(x)
    out.sum().backward()
    assert [n for n, _ in lin.named_parameters()] == ["bias", "weight_orig"]
    assert "weight_mask" in lin.state_dict() and "weight" not in lin.state_dict()
    assert np.array_equal(lin.weight_orig.grad.data, np.broadcast_to(2 * mask, (3, 4)))
    assert np.array_equal(lin.weight.data, w.data * mask)


def test_module_errors():
    class NoInit(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.zeros(2))

    with pytest.raises(RuntimeError, match="super"):
        NoInit()
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError):
        m.weight = tl.Tensor(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(0, 2)
    with pytest.raises(ValueError, match=r"input shape \(3, 5\)"):
        m(tl.Tensor(np.zeros((3, 5), np.float32)))


def test_deepcopy_pickle_and_batchnorm_cumulative_momentum():
    import copy
    import pickle

    from tinylearn.nn.models import DigitsCNN

    m = DigitsCNN(c1=4, c2=8).eval()
    x = tl.Tensor(np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32))
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert clone.fc.weight is not m.fc.weight
        assert np.array_equal(clone(x).data, m(x).data)
    bn, ref = nn.BatchNorm2d(3, momentum=None), torch.nn.BatchNorm2d(3, momentum=None)
    for s in range(3):
        a = make_array((4, 3, 2, 2), seed=s)
        bn(tl.Tensor(a))
        ref(torch.from_numpy(a))
    assert_close(bn.running_mean.data, ref.running_mean)
    assert_close(bn.running_var.data, ref.running_var)


def test_bias_free_and_affine_free_layers_match_torch_state_dict_keys():
    for mod, ref in [
        (nn.Linear(3, 2, bias=False), torch.nn.Linear(3, 2, bias=False)),
        (nn.Conv2d(2, 4, 3, bias=False), torch.nn.Conv2d(2, 4, 3, bias=False)),
        (nn.LayerNorm(4, bias=False), torch.nn.LayerNorm(4, bias=False)),
        (nn.LayerNorm(4, elementwise_affine=False), torch.nn.LayerNorm(4, elementwise_affine=False)),
        (nn.BatchNorm2d(3, affine=False), torch.nn.BatchNorm2d(3, affine=False)),
    ]:
        assert list(mod.state_dict()) == list(ref.state_dict()), type(mod).__name__
        _copy_params(mod, ref)
    lin, tlin = nn.Linear(3, 2, bias=False), torch.nn.Linear(3, 2, bias=False)
    _copy_params(lin, tlin)
    x, tx = _pair(make_array((4, 3)))
    assert lin.bias is None
    assert_close(lin(x).data, tlin(tx))


def test_load_torch_state_dict_directly_and_tensor_from_torch():
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    ours = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    ours.load_state_dict(ref.state_dict())
    x = make_array((5, 4))
    assert_close(ours(tl.Tensor(x)).data, ref(torch.from_numpy(x)))
    t = tl.Tensor(torch.ones(2, 3, requires_grad=True))
    assert t.shape == (2, 3) and t.dtype == np.float32 and not t.requires_grad


# -- nn.MaxPool2d's direct C++ path (issue 18) ------------------------------------------------------------------
from tinylearn.nn import functional_pool as FP  # noqa: E402

_DIRECT_POOL = FP._fast_kernels() is not None


def _pool_pair(x, args):
    t, tt = _pair(x)
    y, ty = FP.max_pool2d(t, *args), torch.nn.functional.max_pool2d(tt, *args)
    return t, tt, y, ty


@pytest.mark.skipif(not _DIRECT_POOL, reason="tinylearn._C.kernels.maxpool2d_* not built")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize(
    "args",
    [(2,), (3, 2, 1), (3, 1, 1, 2), ((2, 3), (1, 2), (1, 1)), (2, 3), ((3, 2), None, (1, 0), (1, 2))],
    ids=["k2", "k3s2p1", "k3s1p1d2", "rect", "s>k", "rect_dil"],
)
def test_max_pool2d_direct_matches_torch_and_im2col(args, layout, dtype):
    from tinylearn.conv.functional import max_pool2d_im2col as im2col_pool
    from tinylearn.nn.functional_pool import MaxPool2dDirect

    x = make_array((2, 3, 9, 11), dtype=dtype, layout=layout)
    t, tt, y, ty = _pool_pair(x, args)
    assert isinstance(y.grad_fn, MaxPool2dDirect) and y.dtype == x.dtype
    g = make_array(ty.shape, dtype=dtype, seed=1)
    y.backward(tl.Tensor(g))
    ty.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(y.data, ty.detach().numpy())  # a max picks an input value: exact
    assert_close(t.grad.data, tt.grad)
    t2 = tl.Tensor(x, requires_grad=True)
    y2 = im2col_pool(t2, *args)
    y2.backward(tl.Tensor(g))
    np.testing.assert_array_equal(y.data, y2.data)
    assert_close(t.grad.data, t2.grad.data)  # overlapping windows: the two paths add in different orders


@pytest.mark.skipif(not _DIRECT_POOL, reason="tinylearn._C.kernels.maxpool2d_* not built")
def test_max_pool2d_direct_ties_nan_and_inf_route_like_torch():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, (2, 2, 8, 8)).astype(np.float32)  # many tied maxima: the first one gets the gradient
    x[0, 0, :2, :2] = -np.inf  # an all -inf window: its first tap
    x[1, 1, 4, 5] = np.nan
    for args in [(2,), (3, 1, 1)]:
        t, tt, y, ty = _pool_pair(x, args)
        y.sum().backward()
        ty.sum().backward()
        np.testing.assert_array_equal(y.data, ty.detach().numpy())  # NaN where a window holds one, like torch
        finite = ~np.isnan(x).any(axis=(2, 3), keepdims=True) & np.ones_like(x, bool)
        np.testing.assert_array_equal(t.grad.data[finite], tt.grad.numpy()[finite])
        assert t.grad.data.sum() == y.data.size  # every output routed exactly one gradient of 1
    assert t.grad.data[0, 0, 0, 0] > 0 and t.grad.data[1, 1, 4, 5] > 0


@pytest.mark.skipif(not _DIRECT_POOL, reason="tinylearn._C.kernels.maxpool2d_* not built")
def test_max_pool2d_direct_gradcheck_and_errors():
    x = tl.Tensor(np.random.default_rng(0).permutation(2 * 2 * 7 * 7).reshape(2, 2, 7, 7) / 10.0, requires_grad=True)
    assert gradcheck(lambda a: FP.max_pool2d(a, 3, 2, 1), [x])
    assert type(nn.MaxPool2d(3, 2, 1)(x).grad_fn).__name__ == "MaxPool2dDirect"  # the layer takes this path
    with pytest.raises(ValueError, match="padding"):
        FP.max_pool2d(tl.Tensor(np.zeros((1, 1, 6, 6), np.float32)), 2, 2, 2)
    with pytest.raises(ValueError, match="idx"):
        FP._fast_kernels().maxpool2d_backward(
            np.ones((1, 1, 2, 2), np.float32), np.full((1, 1, 2, 2), 99, np.int64), 3, 3
        )
    # the fallbacks (ceil_mode, return_indices, int input) still answer through the im2col path
    y, idx = FP.max_pool2d(tl.Tensor(np.arange(16.0, dtype=np.float32).reshape(1, 1, 4, 4)), 2, return_indices=True)
    assert idx.data.tolist() == [[[[5, 7], [13, 15]]]] and y.data.max() == 15


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("legacy", [False, True], ids=["current", "legacy"])
def test_bench_training_step_loss_trajectory_matches_torch(kind, legacy):
    # issue 18: the benchmarked step (same init, same batch, SGD momentum) follows torch's loss for a few steps, on
    # the current path and on the pre-issue-18 rung (im2col pooling, OpenMP optimizer from 256k elements)
    from tinylearn.autograd import bench as B

    tl_fns, th_fns = B._step_pair(kind, legacy=legacy)
    losses = [(float(tl_fns[3]()), th_fns[3]().item()) for _ in range(4)]
    ours, ref = np.array(losses).T
    assert_close(ours.astype(np.float32), ref.astype(np.float32))  # the float32 row of the tolerance table
    assert ref[-1] < ref[0]  # the steps do train


# -- issue 38: torch behaviours a ported script relies on -------------------------------------------------------------
from tinylearn.nn import functional_attention, functional_extra, functional_loss  # noqa: E402


def _sdpa_vs_torch(q, k, v, **kw):
    """Output and q/k/v gradients of tinylearn's and torch's sdpa for the same upstream gradient."""
    tq, tk, tv = (tl.Tensor(a, requires_grad=True) for a in (q, k, v))
    pq, pk, pv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    m = kw.pop("attn_mask", None)
    o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=m, **kw)
    po = torch.nn.functional.scaled_dot_product_attention(
        pq, pk, pv, attn_mask=None if m is None else torch.from_numpy(m), **kw
    )
    assert_close(o.data, po, msg="sdpa output")
    g = make_array(o.shape, seed=9, dtype=str(q.dtype))
    o.backward(g)
    (po * torch.from_numpy(g)).sum().backward()
    for a, b, name in ((tq, pq, "q"), (tk, pk, "k"), (tv, pv, "v")):
        assert np.isfinite(a.grad.data).all(), name
        assert_close(a.grad.data, b.grad, msg=f"grad of {name}")
    return o


@pytest.mark.parametrize("kind", ["bool", "float", "bool_batched"])
def test_sdpa_fully_masked_row_gives_zero_like_torch(kind):
    q, k, v = make_array((2, 3, 4, 8), seed=1), make_array((2, 3, 5, 8), seed=2), make_array((2, 3, 5, 6), seed=3)
    keep = np.random.default_rng(0).random((4, 5)) > 0.4
    keep[:, 0] = True
    keep[1] = False  # query row 1 sees no key at all
    if kind == "float":
        mask = np.where(keep, 0.0, -np.inf).astype(np.float32)
    elif kind == "bool_batched":
        mask = np.broadcast_to(keep, (2, 3, 4, 5)).copy()
        mask[0, 2, 3] = False
    else:
        mask = keep
    o = _sdpa_vs_torch(q, k, v, attn_mask=mask)
    assert not np.isnan(o.data).any()
    assert (o.data[:, :, 1] == 0).all()
    s = tl.Tensor(np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32), requires_grad=True)
    p = functional_attention.masked_softmax(s)
    np.testing.assert_array_equal(p.data, [[0.0, 0.0], [1.0, 0.0]])
    p.sum().backward()
    np.testing.assert_array_equal(s.grad.data, np.zeros((2, 2)))


@pytest.mark.parametrize(
    "kw", [{}, {"is_causal": True}, {"attn_mask": "bool"}, {"scale": 0.3}], ids=["plain", "causal", "mask", "scale"]
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sdpa_enable_gqa_vs_torch(kw, dtype):
    q = make_array((2, 6, 4, 8), seed=1, dtype=dtype)
    k, v = make_array((2, 2, 5, 8), seed=2, dtype=dtype), make_array((2, 3, 5, 6), seed=3, dtype=dtype)
    kw = dict(kw)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = np.random.default_rng(1).random((4, 5)) > 0.3
    _sdpa_vs_torch(q, k, v, enable_gqa=True, **kw)
    _sdpa_vs_torch(q[0], k[0], v[0], enable_gqa=True, **kw)  # [H, L, E]: heads on dim -3
    _sdpa_vs_torch(q, q.copy(), v[:, :1].repeat(6, 1)[:, :, :4], enable_gqa=True)  # equal heads: no repetition


def test_sdpa_enable_gqa_errors():
    q = tl.Tensor(make_array((2, 6, 4, 8)))
    with pytest.raises(RuntimeError, match="key: its 4 heads"):
        k4, v2 = tl.Tensor(make_array((2, 4, 5, 8))), tl.Tensor(make_array((2, 2, 5, 8)))
        F.scaled_dot_product_attention(q, k4, v2, enable_gqa=True)
    with pytest.raises(IndexError, match="head dim"):
        F.scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0], enable_gqa=True)
    with pytest.raises(RuntimeError):  # without enable_gqa the head counts must broadcast, as torch
        kv = torch.zeros(2, 2, 5, 8)
        torch.nn.functional.scaled_dot_product_attention(torch.zeros(2, 6, 4, 8), kv, kv)
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(q, tl.Tensor(make_array((2, 2, 5, 8))), tl.Tensor(make_array((2, 2, 5, 8))))


@pytest.mark.parametrize("shape", [(4, 5), (5,), (3, 5, 2, 2)], ids=["2d", "1d", "spatial"])
@pytest.mark.parametrize(
    "kw",
    [{}, {"label_smoothing": 0.2}, {"weight": True}, {"weight": True, "label_smoothing": 0.3}, {"reduction": "sum"},
     {"reduction": "none", "weight": True}],
    ids=["plain", "ls", "weight", "weight_ls", "sum", "none_weight"],
)  # fmt: skip
def test_cross_entropy_probability_targets_grad_vs_torch(shape, kw):
    """Soft labels: the loss and the gradients w.r.t. BOTH the logits and the probability target match torch."""
    x = make_array(shape, seed=1, low=-2, high=2)
    t = np.random.default_rng(2).random(shape).astype(np.float32)
    t /= t.sum(axis=0 if len(shape) == 1 else 1, keepdims=True)
    w = np.random.default_rng(3).random(5).astype(np.float32) + 0.5
    tx, px = _pair(x)
    tt, pt = _pair(t)
    kw_tl = dict(kw, weight=tl.Tensor(w)) if kw.get("weight") else kw
    kw_th = dict(kw, weight=torch.from_numpy(w)) if kw.get("weight") else kw
    out = F.cross_entropy(tx, tt, **kw_tl)
    ref = torch.nn.functional.cross_entropy(px, pt, **kw_th)
    assert_close(out.data, ref, msg="loss")
    (out * out).sum().backward()  # a non-constant upstream gradient
    (ref * ref).sum().backward()
    assert_close(tx.grad.data, px.grad, msg="grad of input")
    assert_close(tt.grad.data, pt.grad, msg="grad of target")


def test_cross_entropy_one_implementation_and_legacy_flags():
    assert F.cross_entropy is functional_loss.cross_entropy is functional_extra.cross_entropy
    x, y = make_array((4, 3), seed=4), np.array([0, 2, 1, 1])
    for kw, red in (({"reduce": False}, "none"), ({"size_average": False}, "sum"), ({"size_average": True}, "mean")):
        with pytest.warns(UserWarning):  # torch warns that the flags are deprecated
            ref = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(y), **kw)
        assert_close(F.cross_entropy(tl.Tensor(x), y, **kw).data, ref, msg=red)
    old_positional = functional_loss.cross_entropy(tl.Tensor(x), y, "sum")  # tinylearn's older (logits, target, red.)
    assert_close(old_positional.data, F.cross_entropy(tl.Tensor(x), y, reduction="sum").data)
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(tl.Tensor(x), y, label_smoothing=1.5)
    with pytest.raises(ValueError, match="weight"):
        F.cross_entropy(tl.Tensor(x), y, weight=np.ones(4, np.float32))


PADS = [(-1, 2), (2, -1), (-1, -1), (1, -2, 0, 1), (-2, 1, 1, -2), (0, -3, -1, 2), (2, 2, -1, -1), (-1, 0, 0, 0, 1, -1)]


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", PADS, ids=str)
def test_pad_negative_crops_like_torch(mode, pad):
    x = make_array((2, 3) + (3, 5, 4)[-len(pad) // 2 :], seed=6, dtype="float64")  # torch: 1-3 padded dims, N, C
    kw = {"value": 1.5} if mode == "constant" else {}
    tx, px = _pair(x)
    out = F.pad(tx, pad, mode=mode, **kw)
    ref = torch.nn.functional.pad(px, pad, mode=mode, **kw)
    assert out.shape == tuple(ref.shape)
    assert_close(out.data, ref, msg="pad")
    g = make_array(out.shape, seed=7, dtype="float64")
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    assert_close(tx.grad.data, px.grad, msg="grad")


def test_pad_negative_errors():
    x = tl.Tensor(make_array((1, 1, 3, 4)))
    with pytest.raises(ValueError, match=r"dim 3 \(size 4\) -1 long"):
        F.pad(x, (-3, -2))
    with pytest.raises(ValueError, match="circular"):  # torch wraps into uninitialised memory here
        F.pad(x, (3, -2), mode="circular")
    with pytest.raises(ValueError, match="reflect"):
        F.pad(x, (4, -1), mode="reflect")
    with pytest.raises(TypeError, match="tuple of ints"):
        F.pad(x, (1.5, 1))
