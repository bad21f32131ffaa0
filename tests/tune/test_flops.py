"""The FLOP/byte model against torch.utils.flop_counter.FlopCounterMode (matmul, bmm, linear, conv, sdpa)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tinylearn as tl
from tinylearn.profiler import op_cost, profile
from tinylearn.profiler.flops import normalize


def _torch_flops(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


@pytest.mark.parametrize(
    ("name", "a", "b"),
    [("matmul", (7, 13), (13, 5)), ("bmm", (3, 7, 13), (3, 13, 5)), ("gemm.matmul", (64, 32), (32, 16))],
)
def test_matmul_flops_match_torch(name: str, a: tuple, b: tuple) -> None:
    ta, tb = torch.randn(a), torch.randn(b)
    f, nbytes = op_cost(name, [a, b], ["float32", "float32"], [ta.matmul(tb).shape], ["float32"])
    assert f == _torch_flops(lambda: ta @ tb)
    assert nbytes == 4 * (np.prod(a) + np.prod(b) + np.prod(ta.matmul(tb).shape))


def test_linear_flops_match_torch_and_backward_is_twice() -> None:
    x, w, b = torch.randn(6, 10), torch.randn(20, 10), torch.randn(20)
    f, _ = op_cost("Linear", [(6, 10), (20, 10), (20,)], out_shapes=[(6, 20)])
    assert f == _torch_flops(lambda: torch.nn.functional.linear(x, w, b))
    fb, _ = op_cost("LinearBackward", [(6, 10), (20, 10), (20,)], out_shapes=[(6, 20)])
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.linear(xg, wg).sum().backward()
    assert f + fb == fc.get_total_flops()  # forward 2MKN + backward 2 x 2MKN


@pytest.mark.parametrize(("stride", "padding", "groups"), [(1, 1, 1), (2, 0, 1), (1, 1, 2)])
def test_conv_flops_match_torch(stride: int, padding: int, groups: int) -> None:
    x, w = torch.randn(2, 4, 9, 9), torch.randn(6, 4 // groups, 3, 3)
    out = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups)
    f, _ = op_cost("ConvNdFunction", [tuple(x.shape), tuple(w.shape)], out_shapes=[tuple(out.shape)])
    assert f == _torch_flops(lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups))


def test_sdpa_flops_match_torch() -> None:
    q, k, v = torch.randn(2, 3, 8, 16), torch.randn(2, 3, 12, 16), torch.randn(2, 3, 12, 16)
    f, _ = op_cost("ScaledDotProductAttention", [q.shape, k.shape, v.shape], out_shapes=[(2, 3, 8, 16)])
    assert f == 4 * 2 * 3 * 8 * 12 * 16
    # torch's CPU SDPA kernel is not counted by FlopCounterMode (it reports 0): count the math path it computes
    assert f == _torch_flops(lambda: torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v)


def test_elementwise_reduction_norm_softmax_unknown() -> None:
    assert op_cost("ReLU", [(4, 5)], out_shapes=[(4, 5)])[0] == 20
    assert op_cost("Sum", [(4, 5)], out_shapes=[()])[0] == 20
    assert op_cost("Softmax", [(4, 5)], out_shapes=[(4, 5)])[0] == 100
    assert op_cost("LayerNormFn", [(4, 5), (5,), (5,)], out_shapes=[(4, 5)])[0] == 160
    f, nbytes = op_cost("SomethingNew", [(4, 5)], ["float64"], [(4, 5)], ["float64"])
    assert f is None and nbytes == 2 * 20 * 8  # unknown op: bytes only
    f, nbytes = op_cost("EmbeddingFn", [(1000, 16), (3,)], ["float32", "int64"], [(3, 16)], ["float32"])
    assert f == 0 and nbytes == 2 * 3 * 16 * 4 + 3 * 8  # gathered rows read + written, indices read
    assert normalize("LinearBackward") == "linear" and normalize("gemm.matmul") == "matmul"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="in_dtypes"):
        op_cost("matmul", [(2, 3), (3, 4)], ["float32"])
    with pytest.raises(TypeError, match="name"):
        op_cost("", [(2, 3)])


def test_profiled_matmul_flops_match_torch() -> None:
    a = np.random.default_rng(0).standard_normal((3, 17, 9)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((9, 11)).astype(np.float32)
    with profile() as prof:
        tl.tensor(a) @ tl.tensor(b)
    mm = next(e for e in prof.events() if e.name == "MatMul")
    assert mm.flops == _torch_flops(lambda: torch.from_numpy(a) @ torch.from_numpy(b))


def test_registered_dispatch_op_names_are_modelled() -> None:
    # names of ops registered with tinylearn.backends: the last segment picks the rule
    assert op_cost("gemm.matmul", [(4, 8), (8, 2)], out_shapes=[(4, 2)])[0] == 2 * 4 * 8 * 2
    assert op_cost("autograd.relu_backward", [(3, 5), (3, 5)], out_shapes=[(3, 5)])[0] == 15
    assert op_cost("conv.im2col", [(1, 3, 8, 8)], out_shapes=[(27, 64)])[0] == 0
    assert op_cost("conv.max_pool2d", [(1, 2, 4, 4)], out_shapes=[(1, 2, 2, 2)])[0] == 32
    assert op_cost("kernels.reduce_sum", [(10, 10)], out_shapes=[(10,)])[0] == 100
    assert op_cost("nn.block_sparse_attention", [(1, 2, 8, 4)] * 3)[0] is None  # dense count would overstate it
