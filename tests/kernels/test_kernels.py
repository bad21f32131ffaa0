"""tinylearn.kernels public API: every CPU-runnable backend (numpy, cpu, triton under the interpreter) vs torch.

Oracle: torch in float32 (float16 inputs: torch on the upcast input, rounded to float16, compared with the fp16 row
of the tolerance table). Shapes cover odd sizes, one row, long rows, +-1e4 logits, fully masked rows, every
memory layout from make_layouts, causal and non-causal attention; backward vs torch autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tinylearn as tl
from tinylearn import backends
from tinylearn.testing import assert_close, make_array, make_layouts

K = tl.kernels
BACKENDS = [b for b in K.available_backends() if b != "cuda"]  # cuda: tests/kernels/test_kernels_cuda.py (gpu marker)
BACKWARD = [b for b in BACKENDS if b != "triton"]


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32 if a.dtype == np.float16 else a.dtype))


def _expect(t: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    return t.detach().numpy().astype(dtype)


def _shape_small(backend: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape  # shapes below are already small enough for the triton interpreter


def test_available_backends() -> None:
    av = K.available_backends()
    assert av[0] == "numpy" and "cpu" in av and "triton" in av
    assert ("cuda" in av) == tl.testing.cuda_available()
    assert K.default_backend() == "cpu"  # backend=None: the C++ kernels when built


def test_registry_names_and_versions() -> None:
    """The kernels register in tinylearn.backends: "cpp" and its alias "cpu" name the same kernels; versions too."""
    x = make_array((4, 33), seed=5, low=-3, high=3)
    assert_close(K.softmax(x, backend="cpp"), K.softmax(x, backend="cpu"), "float32")
    assert backends.versions("kernels.softmax", "cpu") == ["simd_omp", "three_pass", "online", "simd", "online_simd"]
    assert backends.versions("kernels.layer_norm", "cpp") == ["simd_omp", "two_pass", "welford", "simd"]
    assert backends.available("kernels.softmax")[0] == "cpp"
    assert_close(K.softmax(x, backend="numpy", version="online"), K.softmax(x, backend="numpy"), "float32")
    with pytest.raises(ValueError, match="version"):
        K.softmax(x, backend="cpu", version="four_pass")
    for op in backends.ops():
        if op.startswith("kernels."):
            for b in backends.registered(op):
                if b == "cuda" or (b == "triton" and "triton" not in K.available_backends()):
                    continue  # importing tinylearn.kernels.cuda needs nothing, but keep this test CPU-light
                for v in backends.versions(op, b):
                    kernel = backends.resolve(op, b, v)[2]
                    if op == "kernels.reduce_sum":  # a plain function (tinylearn.kernels.reduce), not a table Kernel
                        assert callable(kernel), (op, b, v)
                        continue
                    assert hasattr(kernel.module, kernel.attr), (op, b, v)


# ------------------------------------------------------------------------------------------------ softmax
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 33), (3, 4, 129), (2, 1000)])
def test_softmax_vs_torch(backend: str, dtype: str, shape: tuple[int, ...]) -> None:
    x = make_array(shape, dtype, seed=1, low=-5, high=5)
    y = K.softmax(x, dim=-1, backend=backend)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close(y, _expect(torch.softmax(_t(x), -1), x.dtype), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", [0, 1, -3])
def test_softmax_dims(backend: str, dim: int) -> None:
    x = make_array((3, 6, 5), seed=2, low=-3, high=3)
    assert_close(K.softmax(x, dim=dim, backend=backend), torch.softmax(_t(x), dim), "float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_layouts(backend: str) -> None:
    for layout, x in make_layouts((6, 10), seed=3):
        assert_close(K.softmax(x, backend=backend), torch.softmax(_t(x), -1), "float32", msg=layout)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # triton's interpreter warns on -inf - -inf (NaN expected)
@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_extreme_and_masked(backend: str) -> None:
    x = make_array((4, 50), seed=4, low=-1e4, high=1e4)
    x[1, :25] = -np.inf  # partly masked row
    x[2, :] = -np.inf  # fully masked row: torch gives NaN, so must we
    x[3, 7] = 1e4  # one dominant logit
    expected = torch.softmax(_t(x), -1)
    y = K.softmax(x, backend=backend)
    assert np.isnan(y[2]).all()
    assert_close(y, expected, "float32")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton"])
def test_softmax_very_long_row(backend: str) -> None:
    x = make_array((2, 200_003), seed=5, low=-20, high=20)
    assert_close(K.softmax(x, backend=backend), torch.softmax(_t(x), -1), "float32")


def test_softmax_long_row_triton_online() -> None:
    x = make_array((1, 5000), seed=6, low=-20, high=20)
    y = K.softmax(x, backend="triton", version="online", block=512)
    assert_close(y, torch.softmax(_t(x), -1), "float32")


@pytest.mark.parametrize("backend", BACKWARD)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_backward(backend: str, dtype: str) -> None:
    x = make_array((4, 3, 17), dtype, seed=7, low=-3, high=3)
    dy = make_array(x.shape, dtype, seed=8)
    for dim in (-1, 1):
        tx = _t(x).requires_grad_()
        torch.softmax(tx, dim).backward(_t(dy))
        y = K.softmax(x, dim=dim, backend=backend)
        assert_close(K.softmax_backward(y, dy, dim=dim, backend=backend), tx.grad, dtype)


# ------------------------------------------------------------------------------------------------ LayerNorm
def _ln_torch(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(_t(x), w.shape, _t(w), _t(b), eps)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 33), (2, 3, 96), (3, 1000)])
def test_layer_norm_vs_torch(backend: str, dtype: str, shape: tuple[int, ...]) -> None:
    x = make_array(shape, dtype, seed=10, low=-3, high=5)
    w = make_array(shape[-1:], dtype, seed=11)
    b = make_array(shape[-1:], dtype, seed=12)
    y = K.layer_norm(x, w, b, eps=1e-5, backend=backend)
    assert y.dtype == x.dtype
    assert_close(y, _expect(_ln_torch(x, w, b), x.dtype), dtype, reduction_size=shape[-1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_layouts_and_offset(backend: str) -> None:
    for layout, x in make_layouts((5, 24), seed=13):
        x = x + 10.0  # mean >> std: a one-pass E[x^2] - E[x]^2 would lose digits here
        w, b = make_array((24,), seed=14), make_array((24,), seed=15)
        assert_close(K.layer_norm(x, w, b, backend=backend), _ln_torch(x, w, b), "float32", msg=layout)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton"])
def test_layer_norm_multi_dim_and_long(backend: str) -> None:
    x = make_array((3, 4, 5), seed=16)
    w, b = make_array((4, 5), seed=17), make_array((4, 5), seed=18)
    assert_close(K.layer_norm(x, w, b, backend=backend), _ln_torch(x, w, b), "float32")
    x = make_array((2, 65_537), seed=19, low=-2, high=3)
    w, b = make_array((65_537,), seed=20), make_array((65_537,), seed=21)
    assert_close(K.layer_norm(x, w, b, backend=backend), _ln_torch(x, w, b), "float32", reduction_size=65_537)


@pytest.mark.parametrize("backend", BACKWARD)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(1, 3), (6, 37), (2, 3, 64)])
def test_layer_norm_backward(backend: str, dtype: str, shape: tuple[int, ...]) -> None:
    x = make_array(shape, dtype, seed=22, low=-2, high=2)
    w, b = make_array(shape[-1:], dtype, seed=23), make_array(shape[-1:], dtype, seed=24)
    dy = make_array(shape, dtype, seed=25)
    tx, tw, tb = (_t(a).requires_grad_() for a in (x, w, b))
    out = F.layer_norm(tx, w.shape, tw, tb, 1e-5)
    out.backward(_t(dy))
    y, mean, rstd = K.layer_norm(x, w, b, backend=backend, return_stats=True)
    assert mean.shape == shape[:-1] and rstd.shape == shape[:-1]
    assert_close(y, out, dtype)
    dx, dw, db = K.layer_norm_backward(dy, x, w, mean, rstd, backend=backend)
    assert_close(dx, tx.grad, dtype)
    assert_close(dw, tw.grad, dtype, reduction_size=x.size // shape[-1])
    assert_close(db, tb.grad, dtype, reduction_size=x.size // shape[-1])


# ------------------------------------------------------------------------------------------------ bias + GELU
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 130)])
def test_bias_gelu_vs_torch(backend: str, approximate: str, dtype: str, shape: tuple[int, ...]) -> None:
    x = make_array(shape, dtype, seed=30, low=-6, high=6)
    b = make_array(shape[-1:], dtype, seed=31)
    y = K.bias_gelu(x, b, backend=backend, approximate=approximate)
    assert y.dtype == x.dtype
    assert_close(y, _expect(F.gelu(_t(x) + _t(b), approximate=approximate), x.dtype), dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # triton's interpreter warns when exp overflows to inf
@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_gelu_extremes_and_layouts(backend: str) -> None:
    x = np.array([[-1e4, -30.0, -5.0, 0.0, 5.0, 30.0, 1e4]], dtype=np.float32)
    b = np.zeros(7, np.float32)
    for ap in ("none", "tanh"):
        assert_close(K.bias_gelu(x, b, backend=backend, approximate=ap), F.gelu(_t(x), approximate=ap), "float32")
    for layout, x in make_layouts((4, 9), seed=32):
        b = make_array((9,), seed=33)
        assert_close(K.bias_gelu(x, b, backend=backend), F.gelu(_t(x) + _t(b)), "float32", msg=layout)


@pytest.mark.parametrize("backend", BACKWARD)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bias_gelu_backward(backend: str, approximate: str, dtype: str) -> None:
    x = make_array((3, 5, 11), dtype, seed=34, low=-4, high=4)
    b = make_array((11,), dtype, seed=35)
    dy = make_array(x.shape, dtype, seed=36)
    tx, tb = _t(x).requires_grad_(), _t(b).requires_grad_()
    F.gelu(tx + tb, approximate=approximate).backward(_t(dy))
    dx, db = K.bias_gelu_backward(dy, x, b, backend=backend, approximate=approximate)
    assert_close(dx, tx.grad, dtype)
    assert_close(db, tb.grad, dtype)


def test_gelu_derivative_is_not_off_by_two() -> None:
    """The seed answer used 2/sqrt(pi) in the erf-form derivative; the right factor is 1/sqrt(2 pi)."""
    u = np.linspace(-3, 3, 13)
    numeric = (tl.kernels.reference.gelu(u + 1e-6) - tl.kernels.reference.gelu(u - 1e-6)) / 2e-6
    assert_close(tl.kernels.reference.gelu_grad(u), numeric, "float64", atol=1e-8, rtol=1e-6)


# ------------------------------------------------------------------------------------------------ attention
def _sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=causal)


ATTN_SHAPES = [
    ((1, 1, 1, 4), (1, 1, 1, 4)),  # one query, one key
    ((2, 3, 37, 16), (2, 3, 37, 16)),  # odd N, multi-head
    ((1, 2, 20, 8), (1, 2, 45, 8)),  # Nq < Nk
    ((1, 1, 70, 24), (1, 1, 33, 24)),  # Nq > Nk
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shapes", ATTN_SHAPES)
def test_flash_attention_vs_sdpa(backend: str, causal: bool, shapes: tuple) -> None:
    qs, ks = shapes
    q, k, v = make_array(qs, seed=40), make_array(ks, seed=41), make_array(ks, seed=42)
    o = K.flash_attention(q, k, v, causal=causal, block_size=16, backend=backend)
    assert o.shape == qs
    assert_close(o, _sdpa(q, k, v, causal), "float32")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_flash_attention_block_sizes_and_fp16(backend: str, block_size: int) -> None:
    q, k, v = (make_array((1, 2, 50, 16), "float16", seed=43 + i) for i in range(3))
    o = K.flash_attention(q, k, v, causal=True, block_size=block_size, backend=backend)
    assert o.dtype == np.float16
    assert_close(o, _expect(_sdpa(q, k, v, True), np.float16), "float16")


@pytest.mark.parametrize("backend", BACKENDS)
def test_flash_attention_large_logits_and_layouts(backend: str) -> None:
    q = make_array((1, 1, 24, 8), seed=46, low=-30, high=30)
    k = make_array((1, 1, 24, 8), seed=47, low=-30, high=30)
    v = make_array((1, 1, 24, 8), seed=48)
    assert_close(K.flash_attention(q, k, v, backend=backend, block_size=16), _sdpa(q, k, v, False), "float32")
    for layout, q2 in make_layouts((2, 2, 19, 8), seed=49):
        o = K.flash_attention(q2, q2, q2, causal=True, block_size=16, backend=backend)
        assert_close(o, _sdpa(q2, q2, q2, True), "float32", msg=layout)


@pytest.mark.parametrize("backend", BACKWARD)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_flash_attention_backward(backend: str, causal: bool, dtype: str) -> None:
    q, k, v = (make_array((2, 2, 29, 8), dtype, seed=50 + i) for i in range(3))
    do = make_array(q.shape, dtype, seed=53)
    tq, tk, tv = (_t(a).requires_grad_() for a in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(_t(do))
    o, lse = K.flash_attention(q, k, v, causal, block_size=8, backend=backend, return_lse=True)
    assert lse.shape == (2, 2, 29)
    grads = K.flash_attention_backward(q, k, v, o, lse, do, causal, block_size=8, backend=backend)
    for got, want in zip(grads, (tq.grad, tk.grad, tv.grad), strict=True):
        assert_close(got, want, dtype)


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_backend_lists_available() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="available: .*numpy"):
        K.softmax(x, backend="metal")
    if "cuda" not in K.available_backends():
        with pytest.raises(RuntimeError, match="not available.*available"):
            K.softmax(x, backend="cuda")
    with pytest.raises(ValueError, match="backends with it"):
        K.softmax_backward(x, x, backend="triton")


def test_bad_shapes_and_dtypes() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="weight"):
        K.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="bias"):
        K.layer_norm(x, np.ones(3, np.float32), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="bias"):
        K.bias_gelu(x, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="approximate"):
        K.bias_gelu(x, np.zeros(3, np.float32), approximate="sigmoid")
    with pytest.raises(TypeError, match="x: .*dtype"):
        K.softmax(np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match="float64"):
        K.softmax(np.zeros((2, 3)), backend="triton")  # triton kernels take float32/float16
    with pytest.raises(ValueError, match="dim"):
        K.softmax(x, dim=2)
    q = np.zeros((1, 2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="head dim"):
        K.flash_attention(q, np.zeros((1, 2, 5, 4), np.float32), q)
    with pytest.raises(ValueError, match="v: sequence length"):
        K.flash_attention(q, q, np.zeros((1, 2, 6, 8), np.float32))
    with pytest.raises(ValueError, match="leading"):
        K.flash_attention(q, np.zeros((1, 3, 5, 8), np.float32), q)
    with pytest.raises(ValueError, match="block_size"):
        K.flash_attention(q, q, q, block_size=0)
    with pytest.raises(ValueError, match="block_size"):
        K.flash_attention(q, q, q, block_size=24, backend="triton")
    # one input policy: a torch CPU tensor is accepted like a numpy array (gradients: tinylearn.kernels.torch_ops)
    assert_close(K.softmax(torch.zeros(2, 3)), np.full((2, 3), 1 / 3, np.float32), "float32")


def test_every_registered_kernels_op_has_a_conformance_example():
    """tinylearn/kernels/conformance_examples.py feeds the conformance test: every ``kernels.*`` op the registry
    holds has an input there (an op without one would be compared on nothing), and each example runs on numpy."""
    import tinylearn.kernels  # noqa: F401  (registers the kernels ops)
    from tinylearn import backends
    from tinylearn.kernels.conformance_examples import conformance_examples

    ex = conformance_examples()
    ops = {op.split(".", 1)[1] for op in backends.ops() if op.startswith("kernels.")}
    missing = {op for op in ops if op not in ex and backends.example(f"kernels.{op}", np.random.default_rng(0)) is None}
    assert not missing, missing
    for op, make in ex.items():
        args, kw = make(np.random.default_rng(1))
        assert backends.dispatch(f"kernels.{op}", *args, backend="numpy", **kw) is not None
