"""Issue 38 for amp: autocast is thread-local (like torch's) and takes torch/numpy dtypes, GradScaler refuses a second
step() before update() (torch's RuntimeError), and the format helpers refuse NaN/Inf instead of returning a scale."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.amp import GradScaler, absmax_scale, mx_quantize, quantize_symmetric, update_scale
from tinylearn.autograd import function


def _in_other_thread(fn):
    """fn() run in a fresh thread (bounded wait); its result or exception comes back."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed back to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the worker thread hung"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- autocast is thread-local ------------------------------------------------------------------------------------
def test_autocast_does_not_leak_into_another_thread_like_torch():
    x = tl.randn(4, 4)
    xt = torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(xt, xt).dtype == torch.bfloat16
        assert _in_other_thread(lambda: torch.mm(xt, xt).dtype) == torch.float32  # torch: thread-local
    with tl.autocast(dtype="bfloat16"):
        assert (x @ x).dtype == tl.amp.bfloat16
        assert _in_other_thread(lambda: (x @ x).dtype) == np.float32
        assert _in_other_thread(tl.amp.is_autocast_enabled) is False
        assert tl.amp.is_autocast_enabled()
    assert function._autocast_hook is None  # no thread has autocast on: Function.apply runs without the hook


def test_autocast_in_a_worker_thread_leaves_the_main_thread_alone():
    x = tl.randn(4, 4)
    started, release = threading.Event(), threading.Event()
    seen: dict = {}

    def worker():
        with tl.autocast(dtype="float16"):
            seen["worker"] = (x @ x).dtype
            started.set()
            release.wait(30)
        seen["worker_after"] = (x @ x).dtype

    t = threading.Thread(target=worker)
    t.start()
    assert started.wait(30)
    assert (x @ x).dtype == np.float32  # main thread, while the worker is inside its autocast block
    release.set()
    t.join(30)
    assert seen == {"worker": np.float16, "worker_after": np.float32}
    assert function._autocast_hook is None


def test_one_autocast_object_entered_by_two_threads():
    ctx = tl.autocast(dtype="bfloat16")
    x = tl.randn(2, 2)

    def use():
        with ctx:
            return (x @ x).dtype

    with ctx:
        assert _in_other_thread(use) == tl.amp.bfloat16
        assert (x @ x).dtype == tl.amp.bfloat16  # the other thread's exit did not end this thread's block
    assert (x @ x).dtype == np.float32


@pytest.mark.parametrize(
    "dtype, want",
    [
        (torch.bfloat16, "bfloat16"),
        (torch.float16, "float16"),
        (np.float16, "float16"),
        (ml_dtypes.bfloat16, "bfloat16"),
        ("torch.bfloat16", "bfloat16"),
        ("half", "float16"),
    ],
)
def test_autocast_accepts_torch_and_numpy_dtypes(dtype, want):
    with tl.autocast(dtype=dtype):
        assert tl.amp.get_autocast_dtype() == np.dtype(getattr(tl.amp, want))


@pytest.mark.parametrize(
    "dtype, exc",
    [
        ("garbage", ValueError),
        (torch.float32, ValueError),
        (np.float64, ValueError),
        (3, TypeError),
        (None, TypeError),
        (object(), TypeError),
    ],
)
def test_autocast_refuses_garbage_dtypes(dtype, exc):
    with pytest.raises(exc, match="dtype"):
        tl.autocast(dtype=dtype)
    assert not tl.amp.is_autocast_enabled()


def test_autocast_enabled_and_decorator():
    with pytest.raises(TypeError, match="enabled"):
        tl.autocast(enabled=1)
    with pytest.raises(TypeError, match="fn"):
        tl.autocast()(3)

    @tl.autocast(dtype="bfloat16")
    def mm(a):
        """docstring kept"""
        return a @ a

    assert mm(tl.randn(2, 2)).dtype == tl.amp.bfloat16 and mm.__doc__ == "docstring kept"


# -- GradScaler: step() once per update(), as torch ---------------------------------------------------------------
def _torch_scaler_step_twice() -> str:
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    s = torch.amp.GradScaler("cpu", init_scale=2.0)
    s.scale(p.sum()).backward()
    s.step(opt)
    with pytest.raises(RuntimeError) as e:
        s.step(opt)
    with pytest.raises(RuntimeError, match="unscale_"):
        s.unscale_(opt)
    return str(e.value)


def test_grad_scaler_second_step_before_update_raises_like_torch():
    torch_msg = _torch_scaler_step_twice()
    p = tl.nn.Parameter(tl.ones(2))
    opt = tl.optim.SGD([p], lr=1.0)
    s = GradScaler(init_scale=2.0)
    s.scale(p.sum()).backward()
    s.step(opt)
    np.testing.assert_array_equal(p.data, [0.0, 0.0])  # one step of lr 1 with the unscaled gradient 1
    with pytest.raises(RuntimeError) as e:
        s.step(opt)
    assert str(e.value) == torch_msg  # "step() has already been called since the last update()."
    np.testing.assert_array_equal(p.data, [0.0, 0.0])  # the second call did not step again
    with pytest.raises(RuntimeError, match="unscale_"):
        s.unscale_(opt)
    s.update()
    opt.zero_grad()
    s.scale(p.sum()).backward()
    s.step(opt)  # a new iteration after update() steps again
    np.testing.assert_array_equal(p.data, [-1.0, -1.0])
    with pytest.raises(RuntimeError, match="Closure"):
        s.step(opt, closure=lambda: None)


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(init_scale="a"), TypeError, "init_scale"),
        (dict(init_scale=float("inf")), ValueError, "init_scale"),
        (dict(growth_interval=2.5), TypeError, "growth_interval"),
        (dict(growth_interval=True), TypeError, "growth_interval"),
        (dict(enabled=1), TypeError, "enabled"),
        (dict(fallback_after=True), ValueError, "fallback_after"),
    ],
)
def test_grad_scaler_refuses_garbage_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        GradScaler(**kwargs)


def test_grad_scaler_numpy_ints_and_bad_state():
    s = GradScaler(growth_interval=np.int64(3), fallback_after=np.int32(2))
    assert s.growth_interval == 3 and s.fallback_after == 2
    with pytest.raises(ValueError, match="new_scale"):
        s.update(new_scale=float("nan"))
    with pytest.raises(ValueError, match="state"):
        s.load_state_dict({"scale": 1.0})
    with pytest.raises(ValueError, match="found_inf|scale"):
        update_scale(float("nan"), 0, False, 2.0, 0.5, 10)
    with pytest.raises(TypeError, match="found_inf"):
        update_scale(1.0, 0, "no", 2.0, 0.5, 10)


# -- low-bit helpers refuse non-finite input ----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_absmax_scale_refuses_non_finite(bad):
    assert absmax_scale(np.array([0.5, -3.0]), "fp4") == 0.5  # max|x| / 6
    with pytest.raises(ValueError, match="x"):
        absmax_scale(np.array([1.0, bad]), "fp4")  # returned 1.0 (NaN) or inf before


def test_quantizers_refuse_nan_instead_of_passing_it_through():
    with pytest.raises(ValueError, match="w"):
        quantize_symmetric(np.array([np.nan, 1.0]), 4)  # returned w unquantized before
    with pytest.raises(ValueError, match="x"):
        tl.amp.int2_quantize(np.array([np.nan]), 1.0)  # cast NaN to an int8 code before
    with pytest.raises(ValueError, match="x"):
        tl.amp.quantize_saved(np.array([np.nan, 1.0]), "int8")
    with pytest.raises(ValueError, match="axis|x"):
        mx_quantize(np.ones(0, np.float32))
    with pytest.raises(IndexError, match="axis"):
        mx_quantize(np.ones(32, np.float32), axis=5)
    with pytest.raises(ValueError, match="fmt"):
        tl.amp.mx_bits_per_element("fp3")
