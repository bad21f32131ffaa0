"""F.pad / autograd's Pad (slice-based forward, one-pass slice-add backward) against torch and against the index-map
reference ``pad_maps``: every mode, asymmetric / zero / negative (crop) pads on 1, 2 and 3 trailing dims, float32 and
float64, a non-contiguous input and fp64 gradcheck. Tolerances: /work/shared/DESIGN.md (fp32 1e-5/1e-4, fp64
1e-10/1e-7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.autograd import gradcheck
from tinylearn.autograd.ops_movement import Pad, pad_maps

MODES = ["constant", "reflect", "replicate", "circular"]
TOL = {np.float32: {"atol": 1e-5, "rtol": 1e-4}, np.float64: {"atol": 1e-10, "rtol": 1e-7}}
# (input shape, pads): torch's order (last dim first); 1-D pads on 2-D/3-D inputs, 2-D pads on 4-D, 3-D pads on 4-D
CASES = [
    ((3, 7), (2, 3)),
    ((2, 3, 7), (0, 3)),
    ((2, 3, 7), (-2, 4)),
    ((2, 3, 5, 6), (1, 1, 1, 1)),
    ((2, 3, 5, 6), (2, 0, 0, 3)),
    ((2, 3, 5, 6), (0, 0, 0, 0)),
    ((2, 3, 5, 6), (-1, 2, 1, -2)),
    ((2, 3, 5, 6), (3, 4, 4, 2)),
    ((3, 4, 5, 6), (1, 1, 1, 1, 1, 1)),
    ((3, 4, 5, 6), (2, -1, 0, 1, 1, 0)),
]


def _ids(case):
    return f"{case[0]}-{case[1]}"


def _torch_pad_and_grad(x: np.ndarray, pads, mode: str, w: np.ndarray, value: float = 0.0):
    xt = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.pad(xt, pads, mode=mode, **({"value": value} if mode == "constant" else {}))
    (want * torch.tensor(w)).sum().backward()
    return want.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("mode", MODES)
def test_pad_matches_torch_forward_and_backward(mode, case, dtype):
    shape, pads = case
    rng = np.random.default_rng(len(shape) + sum(pads))
    x = rng.standard_normal(shape).astype(dtype)
    value = 1.5 if mode == "constant" else 0.0
    want_shape = torch.nn.functional.pad(torch.zeros(shape), pads, mode=mode).shape
    w = rng.standard_normal(want_shape).astype(dtype)
    want, want_grad = _torch_pad_and_grad(x, pads, mode, w, value)
    t = tl.Tensor(x, requires_grad=True)
    got = tl.nn.functional.pad(t, pads, mode=mode, value=value)
    assert got.shape == tuple(want.shape) and got.data.dtype == dtype
    np.testing.assert_allclose(got.data, want, **TOL[dtype])
    (got * tl.Tensor(w)).sum().backward()
    assert t.grad.data.dtype == dtype and t.grad.data.flags.c_contiguous
    np.testing.assert_allclose(t.grad.data, want_grad, **TOL[dtype])


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("mode", MODES)
def test_pad_matches_the_index_map_reference(mode, case):
    """Forward = gather through ``pad_maps``; backward = scatter-add (np.add.at) through the same maps."""
    shape, pads = case
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    maps = pad_maps(shape, pads, mode)
    ref = x
    for ax, idx in maps:
        ref = np.take(ref, np.maximum(idx, 0), axis=ax)
        if mode == "constant":
            sl = [slice(None)] * ref.ndim
            sl[ax] = idx < 0
            ref[tuple(sl)] = 0.0
    g = rng.standard_normal(ref.shape)
    g_before = g.copy()
    ref_grad = g
    for ax, idx in reversed(maps):
        keep = idx >= 0
        moved = np.moveaxis(np.compress(keep, ref_grad, axis=ax), ax, 0)
        acc = np.zeros((shape[ax],) + moved.shape[1:])
        np.add.at(acc, idx[keep], moved)
        ref_grad = np.moveaxis(acc, 0, ax)
    t = tl.Tensor(x, requires_grad=True)
    y = Pad.apply(t, pads, mode=mode)
    np.testing.assert_allclose(y.data, ref, **TOL[np.float64])
    y.backward(tl.Tensor(g))
    np.testing.assert_allclose(t.grad.data, ref_grad, **TOL[np.float64])
    np.testing.assert_array_equal(g, g_before)  # the incoming gradient is not written to


@pytest.mark.parametrize("mode", MODES)
def test_pad_non_contiguous_input(mode):
    base = np.random.default_rng(3).standard_normal((2, 6, 3, 5)).astype(np.float32)
    x = base.transpose(0, 2, 3, 1)[:, :, ::-1, ::2]  # (2, 3, 5, 3), neither C nor F contiguous
    assert not x.flags.c_contiguous and not x.flags.f_contiguous
    pads = (2, 1, -1, 3)
    want_shape = torch.nn.functional.pad(torch.zeros(x.shape), pads, mode=mode).shape
    w = np.random.default_rng(4).standard_normal(want_shape).astype(np.float32)
    want, want_grad = _torch_pad_and_grad(np.ascontiguousarray(x), pads, mode, w)
    t = tl.Tensor(x, requires_grad=True)
    got = tl.nn.functional.pad(t, pads, mode=mode)
    np.testing.assert_allclose(got.data, want, **TOL[np.float32])
    (got * tl.Tensor(w)).sum().backward()
    np.testing.assert_allclose(t.grad.data, want_grad, **TOL[np.float32])


@pytest.mark.parametrize("pads", [(1, 2, 2, 1), (-1, 2, 1, -1), (1, 0, 0, 1, 1, 1)])
@pytest.mark.parametrize("mode", MODES)
def test_pad_gradcheck_fp64(mode, pads):
    x = tl.Tensor(np.random.default_rng(5).standard_normal((2, 3, 4, 5)), requires_grad=True)
    assert gradcheck(lambda a: tl.nn.functional.pad(a, pads, mode=mode), (x,))


@pytest.mark.parametrize("mode", MODES)
def test_pad_output_owns_fresh_memory(mode):
    """The output never aliases the input (writing it leaves x alone), whatever the mode or pads."""
    x = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    keep = x.copy()
    for pads in [(0, 0), (1, 1), (-1, 0, 1, 0)]:
        y = Pad.apply(tl.Tensor(x), pads, mode=mode)
        y.data[...] = -1.0
        np.testing.assert_array_equal(x, keep)
