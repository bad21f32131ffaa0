"""One input policy for every public function that takes numpy arrays (tinylearn._inputs.as_array):

- a torch CPU tensor and a tl.Tensor are accepted wherever a numpy array is, with the same result;
- a wrong dtype is a TypeError naming the argument; a wrong shape is a ValueError naming the argument: the rows
  ``policy-*`` of the bad-input table (tests/common/test_bad_input.py, ``_POLICY``) check this for the same functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import tinylearn as tl

R = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def i8(*shape: int) -> np.ndarray:
    return R.integers(-8, 8, shape, dtype=np.int8)


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]  # positional arguments; args[0] is the array under test


CASES = [
    Case("conv.im2col", tl.conv.im2col, (f32(1, 2, 5, 5), 3)),
    Case("conv.col2im", tl.conv.col2im, (f32(1, 18, 9), (5, 5), 3)),
    Case("conv.conv2d", tl.conv.conv2d, (f32(1, 2, 5, 5), f32(3, 2, 3, 3))),
    Case("conv.winograd_conv2d", tl.conv.winograd_conv2d, (f32(1, 2, 6, 6), f32(3, 2, 3, 3))),
    Case("conv.max_pool2d", tl.conv.max_pool2d, (f32(1, 2, 6, 6), 2)),
    Case("conv.avg_pool2d", tl.conv.avg_pool2d, (f32(1, 2, 6, 6), 2)),
    Case("quant.quantize", tl.quant.quantize, (f32(4, 5), 0.1, 0)),
    Case("quant.dequantize", tl.quant.dequantize, (i8(4, 5), 0.1, 0)),
    Case("quant.fp8_encode", tl.quant.fp8_encode, (f32(4, 5),)),
    Case("quant.fp8_decode", tl.quant.fp8_decode, (R.integers(0, 255, 6, dtype=np.uint8), "e4m3")),
    Case("quant.pack_int4", tl.quant.pack_int4, (i8(7),)),
    Case("quant.quantize_groupwise", tl.quant.quantize_groupwise, (f32(4, 8), 4)),
    Case("quant.int8_gemm", tl.quant.int8_gemm, (i8(3, 4), i8(4, 2))),
    Case("kernels.softmax", tl.kernels.softmax, (f32(3, 7),)),
    Case("kernels.layer_norm", tl.kernels.layer_norm, (f32(3, 7), f32(7), f32(7))),
    Case("kernels.bias_gelu", tl.kernels.bias_gelu, (f32(3, 7), f32(7))),
    Case("kernels.flash_attention", tl.kernels.flash_attention, (f32(2, 5, 4), f32(2, 5, 4), f32(2, 5, 4))),
    Case("prune.sparsity", tl.prune.sparsity, (f32(4, 5),)),
    Case("sparse.CSR.from_dense", tl.sparse.CSR.from_dense, (f32(4, 5),)),
]
IDS = [c.name for c in CASES]


def _same(a: Any, b: Any) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif hasattr(a, "to_dense"):
        np.testing.assert_array_equal(a.to_dense(), b.to_dense())
    else:
        assert a == b


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_torch_and_tl_tensors_are_accepted(case: Case) -> None:
    x, rest = case.args[0], case.args[1:]
    want = case.fn(x, *rest)
    _same(case.fn(torch.from_numpy(x.copy()), *rest), want)
    _same(case.fn(tl.Tensor(x.copy(), dtype=str(x.dtype)), *rest), want)


def test_non_cpu_or_non_numeric_inputs() -> None:
    from tinylearn._inputs import as_array

    with pytest.raises(TypeError, match="x"):
        as_array(object(), "x")
    with pytest.raises(TypeError, match="bfloat16"):
        as_array(torch.zeros(2, dtype=torch.bfloat16), "x")
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        as_array(np.zeros(3), "x", ndim=2)
    assert as_array([1.0, 2.0], "x", dtypes=("f",)).dtype == np.float64
