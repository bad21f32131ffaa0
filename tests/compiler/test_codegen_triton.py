"""codegen_triton: the generated @triton.jit programs (run under Triton's CPU interpreter here) match
kernel_ir.evaluate (fp32 rtol 1e-5 / atol 1e-5, fp64 1e-12) on small shapes; the interpreter is slow."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_cases import (
    all_ops,
    gelu_residual,
    group_norm,
    inputs_for,
    layer_norm,
    row_max,
    softmax,
    transposed_add,
)

from tinylearn.compiler import codegen_triton
from tinylearn.compiler.kernel_ir import evaluate

TOL = {"float32": {"rtol": 1e-5, "atol": 1e-5}, "float64": {"rtol": 1e-12, "atol": 1e-12}}


def usable() -> tuple[bool, str]:
    try:
        codegen_triton._import_triton()
    except RuntimeError as e:
        return False, str(e)
    return True, ""


OK, WHY = usable()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)


def check(kernel, xs=None, tol=None):
    xs = inputs_for(kernel) if xs is None else xs
    got = codegen_triton.build_triton(kernel)(*xs)
    for g, r, b in zip(got, evaluate(kernel, xs), kernel.outputs):
        assert g.shape == b.shape and g.dtype == np.dtype(kernel.dtype)
        np.testing.assert_allclose(g, r, **(tol or TOL[kernel.dtype]), err_msg=f"{kernel.name}: {b.name}")
    return got


@pytest.mark.parametrize(
    "kernel",
    [
        gelu_residual(5, 7),
        gelu_residual(1, 1),
        softmax(3, 10),
        softmax(1, 1),
        layer_norm(4, 33),
        layer_norm(3, 20, "float64"),
        group_norm(2, 2, 3, 5),
        transposed_add(5, 6),
    ],
    ids=lambda k: f"{k.name}-{k.dtype}-{'x'.join(map(str, k.shape))}",
)
def test_matches_evaluate(kernel):
    check(kernel)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: log(-1), 1/0
def test_every_op_matches_evaluate():
    k = all_ops(37)
    a, p = inputs_for(k)
    a[:4] = [np.nan, np.inf, -np.inf, 0.0]
    p[:4] = [1.0, np.nan, 2.0, -3.0]
    # tanh is 1 - 2 / (exp(2x) + 1) here (no libdevice in the interpreter): absolute error ~ float eps near 0
    check(k, [a, p], tol={"rtol": 1e-5, "atol": 2e-5})


def test_max_reduce_propagates_nan():
    k = row_max(4, 9)
    (x,) = inputs_for(k)
    x[0, 0], x[1, 8], x[2, :] = np.nan, np.nan, -np.inf
    m, _ = check(k, [x])
    assert np.isnan(m[:2, 0]).all() and m[2, 0] == -np.inf


def test_source_uses_masked_loads_and_block_reductions():
    src = codegen_triton.emit_triton(layer_norm(4, 33))
    assert "@triton.jit\ndef tl_layer_norm(in0, in1, in2, out0, out1, out2, BR: tl.constexpr, BC: tl.constexpr):" in src
    assert "tl.load(in0 + (i0 * 33 + j0), mask=mask, other=0.0)" in src
    assert "tl.sum(tl.where(mask, r0, 0.0), axis=1, keep_dims=True)" in src
    assert "mask=rmask)" in src  # mean/rstd: one value per row
    assert codegen_triton.block_sizes(layer_norm(4, 33)) == {"BR": 4, "BC": 64}
    assert "tl.max(" in codegen_triton.emit_triton(softmax(2, 3))


def test_rows_longer_than_one_block_are_refused():
    with pytest.raises(ValueError, match="rows of 20000 elements; this backend keeps a row in one block"):
        codegen_triton.build_triton(softmax(2, 20000))
