"""Bad input: every case of the bad-input sweep, with the exception and the message fragment expected.

Crash-prone cases (C++/numba kernels, process groups) run in a child process, so a regression to a segfault or an
abort fails one test instead of killing the test run. Each row: (snippet, exception class name, message fragment).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import tinylearn as tl


def run_isolated(code: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; the last line it prints is the verdict."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout_s
    )


def expect_isolated(body: str, exc: str, fragment: str, timeout_s: float = 120) -> None:
    code = (
        "import numpy as np, tinylearn as tl\ntry:\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
        + "\nexcept Exception as e:\n    print('RAISED', type(e).__name__, '|', e)\nelse:\n    print('NO ERROR')\n"
    )
    p = run_isolated(code, timeout_s)
    assert p.returncode == 0, f"process died with {p.returncode}: {p.stderr[-2000:]}"
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    assert last.startswith(f"RAISED {exc} |"), last or p.stderr[-2000:]
    assert fragment in last, last


# ----------------------------------------------------------------------------------------------------- crashes
def test_im2col_huge_padding_is_a_clear_error_not_a_segfault():
    expect_isolated(
        'tl.conv.im2col(np.ones((1, 1, 2, 2), np.float32), 1, padding=2**31 - 1, backend="cpp")',
        "ValueError",
        "padding",
    )


def test_conv2d_module_huge_padding():
    expect_isolated(
        "tl.nn.Conv2d(1, 1, 1, padding=2**31 - 1)(tl.Tensor(np.ones((1, 1, 2, 2), np.float32)))",
        "ValueError",
        "padding",
    )


def test_flash_attention_huge_block_size_is_capped():
    p = run_isolated(
        """
        import numpy as np, tinylearn as tl
        r = np.random.default_rng(0)
        q, k, v = (r.standard_normal((2, 9, 8)).astype(np.float32) for _ in range(3))
        a = tl.kernels.flash_attention(q, k, v, block_size=10**6, backend="cpp")
        b = tl.kernels.flash_attention(q, k, v, backend="numpy")
        print("MAXERR", float(np.abs(a - b).max()))
        """
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert float(p.stdout.split("MAXERR")[-1]) < 1e-5


@pytest.mark.parametrize("backend", ["numpy", "numba", "cpp"])
@pytest.mark.parametrize("fmt", ["CSR", "ELL"])
def test_sparse_corrupted_indices_never_read_out_of_bounds(fmt, backend):
    # Either the index arrays are read-only (no corruption possible) or every kernel validates them.
    p = run_isolated(
        f"""
        import numpy as np, tinylearn as tl
        a = np.eye(4, dtype=np.float32)
        s = tl.sparse.{fmt}.from_dense(a)
        try:
            s.indices.flat[0] = -5
        except ValueError as e:
            print("READONLY", e)
        else:
            try:
                s.matmul(np.ones((4, 2), np.float32), backend="{backend}")
            except (ValueError, IndexError) as e:
                print("RAISED", type(e).__name__, e)
            else:
                print("NO ERROR")
        """
    )
    assert p.returncode == 0, f"process died with {p.returncode}: {p.stderr[-2000:]}"
    assert p.stdout.split()[0] in ("READONLY", "RAISED"), p.stdout


def _ar_chunk() -> None:
    import tinylearn.dist as d

    rank = torch.distributed.get_rank()
    d.all_reduce(torch.ones(4096), algorithm="ring", chunk_bytes=1024 * (rank + 1))


def _ar_node_size() -> None:
    import tinylearn.dist as d

    rank = torch.distributed.get_rank()
    d.all_reduce(torch.ones(64), algorithm="hierarchical", node_size=1 + rank % 2)


@pytest.mark.parametrize("fn,fragment", [(_ar_chunk, "chunk_bytes"), (_ar_node_size, "node_size")])
def test_allreduce_schedule_arguments_are_handshaked(fn, fragment):
    # A different chunk_bytes used to abort the rank inside gloo, a different node_size to deadlock until timeout.
    with pytest.raises(Exception, match=rf"{fragment}: mismatch across ranks") as ei:
        tl.dist.launch(fn, 4 if fragment == "node_size" else 2, timeout_s=60)
    assert not isinstance(ei.value, TimeoutError)


# ------------------------------------------------------------------------------------------ silent wrong results
def test_pack_int4_rejects_values_outside_int4_before_casting():
    with pytest.raises(ValueError, match="q"):
        tl.quant.pack_int4(np.array([65539, 65535]))


def test_csr_rejects_indices_beyond_int32():
    with pytest.raises(ValueError, match="indices"):
        tl.sparse.CSR(indptr=[0, 1], indices=[2**32 + 1], data=[1.0], shape=(1, 4))


@pytest.mark.parametrize(
    "obs", ["MinMaxObserver", "PercentileObserver", "MSEObserver", "HistogramObserver", "MovingAverageMinMaxObserver"]
)
def test_observers_ignore_nan_elements_only(obs):
    # Documented choice: NaN elements are ignored (like torch's nan-aware reductions); finite values still count.
    x = np.linspace(-2, 3, 101).astype(np.float32)
    with_nan = x.copy()
    with_nan[[0, 50]] = np.nan
    clean = np.delete(x, [0, 50])
    a, b = getattr(tl.quant, obs)(), getattr(tl.quant, obs)()
    a(with_nan)
    b(clean)
    sa, za = a.calculate_qparams()
    sb, zb = b.calculate_qparams()
    np.testing.assert_allclose(np.asarray(sa, np.float64), np.asarray(sb, np.float64), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(za), np.asarray(zb))


def test_observer_all_nan_batch_is_an_error():
    with pytest.raises(ValueError, match="NaN"):
        tl.quant.MinMaxObserver()(np.full(8, np.nan, np.float32))


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(multiplier=0.5, zero_point=1000, quant_min=-128, quant_max=127), "zero_point"),
        (dict(multiplier=float("nan"), zero_point=0, quant_min=-128, quant_max=127), "multiplier"),
        (dict(multiplier=0.5, zero_point=0, quant_min=10, quant_max=-10), "quant_min"),
        (dict(multiplier=0.5, zero_point=0, quant_min=-1000, quant_max=127), "quant_min"),
    ],
)
def test_requantize_validates(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        tl.quant.requantize(np.array([1, 2000], np.int32), **kwargs)


def test_same_parameter_in_two_param_groups_raises_like_torch():
    p = tl.nn.Parameter(tl.zeros(3))
    with pytest.raises(ValueError, match="more than one parameter group"):
        tl.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


def test_inplace_change_of_saved_tensor_raises_on_backward():
    a = tl.Tensor(np.ones(3), requires_grad=True)
    b = tl.Tensor(np.full(3, 2.0), requires_grad=True)
    y = (a * b).sum()
    with tl.no_grad():
        b += 10
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_max_backward_with_nan_matches_torch():
    x = tl.Tensor(np.array([1.0, np.nan, 3.0]), requires_grad=True)
    x.max().backward()
    t = torch.tensor([1.0, math.nan, 3.0], dtype=torch.float64, requires_grad=True)
    t.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())


# --------------------------------------------------------------------------------- accepted silently (must raise)
@pytest.mark.parametrize(
    "call,exc,fragment",
    [
        (lambda: tl.quant.modules.weight_observer(bits=0), ValueError, "bits"),
        (lambda: tl.quant.modules.weight_observer(bits=1), ValueError, "bits"),
        (lambda: tl.quant.modules.weight_observer(bits=33), ValueError, "bits"),
        (lambda: tl.optim.SGD([tl.nn.Parameter(tl.zeros(2))], lr=0.1, momentum=float("nan")), ValueError, "momentum"),
        (lambda: tl.memory.CachingAllocator(1 << 20, max_split_size=-5), ValueError, "max_split_size"),
        (lambda: tl.Tensor(None), TypeError, "data"),
        (lambda: tl.Tensor(["a", "b"]), TypeError, "data"),
        (lambda: tl.conv.im2col(np.ones((1, 1, 3, 3), np.complex64), 2, backend="numpy"), TypeError, "x"),
        (lambda: tl.conv.im2col(np.full((1, 1, 3, 3), "a"), 2, backend="numpy"), TypeError, "x"),
        (lambda: tl.sparse.CSR(indptr=[0, 1], indices=[0], data=[1.0], shape=(1, 4.7)), TypeError, "shape"),
        (lambda: tl.prune.sparsity("abc"), TypeError, "module_or_array"),
        (lambda: tl.dist.cost_model.predict("ring", float("nan"), 4, 1e-5, 1e-10), ValueError, "nbytes"),
        (lambda: tl.dist.cost_model.predict("ring", 1024, 4, float("nan"), 1e-10), ValueError, "alpha_s"),
        (lambda: tl.dist.simulate("ring", 4, 1024, alpha_s=float("nan")), ValueError, "alpha_s"),
    ],
)
def test_bad_values_raise(call, exc, fragment):
    with pytest.raises(exc, match=fragment):
        call()


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("bad", [True, 1.5, None, "64"])
def test_allocator_malloc_argument_types(backend, bad):
    a = tl.memory.FirstFitAllocator(1 << 16, backend=backend)
    with pytest.raises(TypeError, match="nbytes"):
        a.malloc(bad)
    assert a.stats()["n_alloc"] == 0


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("bad", [1.5, None, "0"])
def test_allocator_free_argument_types(backend, bad):
    a = tl.memory.FirstFitAllocator(1 << 16, backend=backend)
    with pytest.raises(TypeError, match="offset"):
        a.free(bad)


# --------------------------------------------------------------------------------------------- unclear errors
@pytest.mark.parametrize(
    "call,exc,fragment",
    [
        (lambda: tl.nn.Conv2d(3, 4, 0), ValueError, "kernel_size"),
        (lambda: tl.optim.Adam([tl.nn.Parameter(tl.zeros(2))], betas=(0.9,)), ValueError, "betas"),
        (lambda: tl.kernels.softmax(np.ones((2, 3), np.float32), dim=1.0), TypeError, "dim"),
        (lambda: tl.memory.FirstFitAllocator(1 << 16).replay(np.array([[0, 5, 64]])), ValueError, "ops"),
    ],
)
def test_clear_errors(call, exc, fragment):
    with pytest.raises(exc, match=fragment):
        call()


def test_optimizer_load_state_dict_bad_index():
    p = tl.nn.Parameter(tl.zeros(2))
    opt = tl.optim.Adam([p])
    sd = opt.state_dict()
    sd["param_groups"][0]["params"] = [7]
    with pytest.raises(ValueError, match="param"):
        opt.load_state_dict(sd)


@pytest.mark.parametrize("backend", tl.kernels.available_backends())
def test_flash_attention_zero_queries_returns_empty(backend):
    q = np.zeros((2, 0, 8), np.float32)
    k = v = np.ones((2, 5, 8), np.float32)
    out = tl.kernels.flash_attention(q, k, v, backend=backend)
    assert out.shape == (2, 0, 8)


def test_numpy_conv_huge_valid_stride():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 1, 1), np.float32)
    y = tl.conv.conv2d(x, w, stride=2**62, backend="numpy")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2**30).numpy()
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_checks_output_path_before_running(flag, tmp_path):
    target = tmp_path / "missing" / "dir" / ("x.json" if flag == "--json" else "plots")
    if flag == "--plot":
        target.parent.mkdir(parents=True)
        target.parent.chmod(0o500)  # not writable (skip when root can write anyway)
        if __import__("os").access(target.parent, __import__("os").W_OK):
            pytest.skip("running as root: every directory is writable")
    p = subprocess.run(
        [sys.executable, "-m", "tinylearn", "bench", "matmul", flag, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert str(target.parent) in p.stderr or str(target) in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
