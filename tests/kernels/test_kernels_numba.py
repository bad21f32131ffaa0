"""numba.cuda lessons under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), run in a subprocess because numba may
already be imported in this process without the simulator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinylearn.testing import assert_close, make_array, numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba not installed")


def test_block_reduce_sum_simulated() -> None:
    from tinylearn.kernels.numba_sim import run_in_subprocess

    x = make_array((1000,), seed=0)
    got = float(run_in_subprocess("block_reduce_sum", x))
    assert abs(got - float(x.astype(np.float64).sum())) < 1e-3


def test_softmax_rows_simulated() -> None:
    from tinylearn.kernels.numba_sim import run_in_subprocess

    x = make_array((3, 45), seed=1, low=-20, high=20)
    x[1, :10] = -np.inf
    assert_close(run_in_subprocess("softmax_rows", x), torch.softmax(torch.from_numpy(x), -1), "float32")


def test_unknown_function() -> None:
    from tinylearn.kernels.numba_sim import run_in_subprocess

    with pytest.raises(ValueError, match="func"):
        run_in_subprocess("matmul", np.zeros(3, np.float32))
