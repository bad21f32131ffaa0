"""Tests for exercises/05_fused_kernels (run on stubs by default, on tinylearn with --impl=reference)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
from types import ModuleType  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tinylearn.testing import assert_close  # noqa: E402


def _x(shape: tuple[int, ...], seed: int, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def test_online_softmax_update(impl: ModuleType) -> None:
    m = np.array([-np.inf, 0.0, 5.0])
    d = np.array([0.0, 1.0, 2.0])
    x = np.array([1.0, 3.0, -np.inf])
    m2, d2 = impl.online_softmax_update(m, d, x)
    assert_close(m2, np.array([1.0, 3.0, 5.0]), "float64")
    assert_close(d2, np.array([1.0, np.exp(-3.0) + 1.0, 2.0]), "float64")


def test_online_softmax(impl: ModuleType) -> None:
    x = _x((4, 37), 0, 10.0)
    x[1, :20] = -np.inf
    assert_close(impl.online_softmax(x), torch.softmax(torch.from_numpy(x), -1), "float32")


def test_layer_norm_backward(impl: ModuleType) -> None:
    x, w, b, dy = _x((5, 33), 1), _x((33,), 2), _x((33,), 3), _x((5, 33), 4)
    tx, tw, tb = (torch.from_numpy(a).double().requires_grad_() for a in (x, w, b))
    F.layer_norm(tx, (33,), tw, tb).backward(torch.from_numpy(dy).double())
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1)
    rstd = 1 / np.sqrt(x64.var(axis=1) + 1e-5)
    dx, dw, db = impl.layer_norm_backward(dy.astype(np.float64), x64, w.astype(np.float64), mean, rstd)
    assert_close(dx, tx.grad, "float64")
    assert_close(dw, tw.grad, "float64")
    assert_close(db, tb.grad, "float64")


def test_gelu_grad(impl: ModuleType) -> None:
    u = np.linspace(-6, 6, 101)
    for ap in ("none", "tanh"):
        t = torch.from_numpy(u).requires_grad_()
        F.gelu(t, approximate=ap).sum().backward()
        assert_close(impl.gelu_grad(u, ap), t.grad, "float64")


def test_triton_softmax(impl: ModuleType) -> None:
    x = _x((3, 50), 5, 5.0)
    assert_close(impl.triton_softmax(x), torch.softmax(torch.from_numpy(x), -1), "float32")


def test_block_reduce_sum_in_simulator(impl: ModuleType) -> None:
    """Runs your block_reduce_sum in a fresh interpreter with NUMBA_ENABLE_CUDASIM=1."""
    x = _x((777,), 6)
    code = textwrap.dedent(
        f"""
        import os, importlib.util, numpy as np
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        spec = importlib.util.spec_from_file_location("impl_under_test", {impl.__file__!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        x = np.random.default_rng(6).standard_normal(777).astype(np.float32) * 3.0
        print(repr(float(mod.block_reduce_sum(x))))
        """
    )
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]
    got = float(proc.stdout.strip().splitlines()[-1])
    assert abs(got - float(x.astype(np.float64).sum())) < 1e-3


def test_flash_tile_update(impl: ModuleType) -> None:
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 20, 8)) for _ in range(3))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(8)
    s = np.where(np.triu(np.ones((20, 20), bool), 1), -np.inf, s)  # causal
    m = np.full((2, 20), -np.inf)
    lsum = np.zeros((2, 20))
    acc = np.zeros((2, 20, 8))
    for j0 in range(0, 20, 6):
        m, lsum, acc = impl.flash_tile_update(m, lsum, acc, s[:, :, j0 : j0 + 6], v[:, j0 : j0 + 6])
    expected = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True)
    assert_close(acc / lsum[..., None], expected, "float64")
