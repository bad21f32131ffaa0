"""tl.autograd.checkpoint / checkpoint_sequential: exact outputs and gradients, recomputation counted, dropout RNG
restored, memory drops with segments (measured)."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.autograd import checkpoint, checkpoint_sequential, recompute_count, reset_recompute_count

nn = tl.nn


def _net(depth: int = 6, width: int = 32, p_drop: float = 0.3) -> nn.Sequential:
    tl.manual_seed(0)
    layers: list = [nn.Linear(16, width)]
    for _ in range(depth - 1):
        layers += [nn.GELU(), nn.Dropout(p_drop), nn.Linear(width, width)]
    layers += [nn.ReLU(), nn.Linear(width, 4)]
    return nn.Sequential(*layers)


def _grads(net, x, run):
    net.zero_grad()
    x.grad = None
    tl.manual_seed(123)  # dropout masks come from the global generator
    y = run(net, x)
    (y * y).sum().backward()
    after = tl.autograd.get_rng().random()  # what the generator yields next: the recomputation must not shift it
    return y.data.copy(), [p.grad.data.copy() for p in net.parameters()], x.grad.data.copy(), after


@pytest.mark.parametrize("segments", [1, 2, 3, 5])
def test_checkpoint_sequential_is_exact(segments):
    net = _net()
    x = tl.randn(8, 16, requires_grad=True)
    y0, g0, gx0, r0 = _grads(net, x, lambda n, h: n(h))
    reset_recompute_count()
    y1, g1, gx1, r1 = _grads(net, x, lambda n, h: checkpoint_sequential(n, segments, h))
    np.testing.assert_array_equal(y1, y0)
    for a, b in zip(g1, g0):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(gx1, gx0)
    assert r1 == r0  # RNG stream after the step is the same as without checkpointing
    assert recompute_count() == segments - 1  # every checkpointed segment ran its forward once more


def test_checkpoint_without_rng_restore_changes_dropout_masks():
    net = _net(depth=2, p_drop=0.5)
    x = tl.randn(8, 16, requires_grad=True)
    _, g0, _, _ = _grads(net, x, lambda n, h: n(h))
    _, g1, _, _ = _grads(net, x, lambda n, h: checkpoint_sequential(n, 2, h, preserve_rng_state=False))
    assert any(not np.array_equal(a, b) for a, b in zip(g0, g1))  # the recomputation drew new masks


def test_checkpoint_function_and_inputs_without_grad():
    lin = nn.Linear(5, 3)
    x = tl.randn(4, 5)  # no grad on the input: the parameters inside fn still get theirs
    y = checkpoint(lambda h: lin(h).tanh(), x)
    y.sum().backward()
    ref = nn.Linear(5, 3)
    ref.load_state_dict(lin.state_dict())
    ref(x).tanh().sum().backward()
    np.testing.assert_array_equal(lin.weight.grad.data, ref.weight.grad.data)
    with tl.no_grad():  # no graph: plain call, nothing recomputed
        reset_recompute_count()
        checkpoint(lin, x)
        assert recompute_count() == 0
    with pytest.raises(TypeError, match="fn"):
        checkpoint(3, x)
    with pytest.raises(ValueError, match="segments"):
        checkpoint_sequential(_net(), 0, x)


def test_checkpoint_reduces_measured_peak():
    from tinylearn.memory import measure_peak

    def step(segments):
        def f():
            tl.manual_seed(0)
            net = nn.Sequential(*[m for _ in range(16) for m in (nn.Linear(128, 128), nn.ReLU())])
            x = tl.randn(1024, 128)
            out = checkpoint_sequential(net, segments, x) if segments else net(x)
            out.sum().backward()

        return f

    base = measure_peak(step(None))
    peaks = {k: measure_peak(step(k)) for k in (4, 8)}
    # 32 layers: ~sqrt(32) segments keep ~1/3 of the activations; peak also holds params, grads, one segment
    assert peaks[8] < 0.75 * base and peaks[4] < 0.85 * base


def _conv_net() -> nn.Sequential:
    tl.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 4),
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["mlp", "conv"])
@pytest.mark.parametrize("segments", [2, 3])
def test_checkpoint_under_autocast_is_bit_identical(dtype, kind, segments):
    net = _net(depth=3, p_drop=0.3) if kind == "mlp" else _conv_net()
    x = tl.randn(8, 16, requires_grad=True) if kind == "mlp" else tl.randn(8, 1, 8, 8, requires_grad=True)

    def run(n, h):
        with tl.autocast(dtype):
            return n(h)

    def run_ck(n, h):
        with tl.autocast(dtype):
            return checkpoint_sequential(n, segments, h)

    y0, g0, gx0, r0 = _grads(net, x, run)
    reset_recompute_count()
    y1, g1, gx1, r1 = _grads(net, x, run_ck)  # the backward (and the recomputation) runs outside the autocast block
    assert recompute_count() == segments - 1
    assert y0.dtype == y1.dtype == np.dtype(dtype)  # the low-precision forward really ran
    np.testing.assert_array_equal(y1, y0)
    for a, b in zip([*g1, gx1], [*g0, gx0]):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)  # the recomputation ran under the forward's autocast state
    assert r1 == r0


def test_checkpoint_recompute_ignores_the_autocast_state_of_the_backward():
    net = _net(depth=3, p_drop=0.0)
    x = tl.randn(8, 16, requires_grad=True)
    y0, g0, gx0, _ = _grads(net, x, lambda n, h: n(h))  # fp32 forward, fp32 backward
    net.zero_grad()
    x.grad = None
    tl.manual_seed(123)
    y = checkpoint_sequential(net, 3, x)  # fp32 forward ...
    with tl.autocast("bfloat16"):  # ... backward called inside an autocast block: the recomputation stays fp32
        (y * y).sum().backward()
    for a, b in zip([*[p.grad.data for p in net.parameters()], x.grad.data], [*g0, gx0]):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_table_against_torch_rows():
    from tinylearn.amp.bench import checkpoint_table

    t = checkpoint_table(n_layers=16, width=16, batch=64, segments=4, repeat=1)
    rows = {r.impl: r for r in t.rows}
    assert set(rows) == {"tinylearn k=1", "tinylearn k=4", "torch k=1", "torch k=4", "tinygrad"}
    saved = {k: r.extra.get("saved_mb") for k, r in rows.items()}
    assert saved["tinylearn k=4"] < saved["tinylearn k=1"] and saved["torch k=4"] < saved["torch k=1"]
    assert rows["tinylearn k=4"].peak_mb < rows["tinylearn k=1"].peak_mb
    assert rows["tinygrad"].median_ms is None and rows["tinygrad"].note.startswith("n/a")


# -- stateful functions: torch.utils.checkpoint's determinism check (issue 38) ---------------------------------------
def _counting_square():
    calls = [0]

    def f(x):
        calls[0] += 1
        return x * x * calls[0]  # a different function on every call: the recomputation is not the forward

    return f


def test_checkpoint_of_a_stateful_fn_is_refused_not_differentiated_wrongly():
    import torch
    import torch.utils.checkpoint as tc

    from tinylearn.autograd.checkpoint import CheckpointError

    xt = torch.tensor(2.0, requires_grad=True)
    tc.checkpoint(_counting_square(), xt, use_reentrant=False).backward()
    assert xt.grad.item() == 4.0  # torch keeps the forward's graph: d/dx x*x*1 at 2
    xt = torch.tensor(2.0, requires_grad=True)
    tc.checkpoint(_counting_square(), xt, use_reentrant=True).backward()
    assert xt.grad.item() == 8.0  # torch's reentrant variant differentiates the recomputed call (x*x*2)

    x = tl.tensor(2.0, requires_grad=True)
    y = checkpoint(_counting_square(), x)
    assert y.item() == 4.0
    with pytest.raises(CheckpointError, match="differs from the forward") as e:
        y.backward()  # the old behaviour silently returned 8 (12 with a third call)
    assert isinstance(e.value, RuntimeError)  # torch's CheckpointError is a RuntimeError too
    assert x.grad is None
    x = tl.tensor(2.0, requires_grad=True)
    checkpoint(_counting_square(), x, determinism_check="none", use_reentrant=True).backward()
    assert x.grad.item() == 8.0  # opting out gives torch's reentrant result


def test_checkpoint_metadata_change_raises_like_torch():
    import torch
    import torch.utils.checkpoint as tc

    from tinylearn.autograd.checkpoint import CheckpointError

    class Growing:  # a module attribute changed by every call: the recomputed output has another shape
        def __init__(self, lib):
            self.k, self.lib = 1, lib

        def __call__(self, x):
            self.k += 1
            return x.reshape(1, 3).expand(self.k, 3) * x

    xt = torch.randn(3, requires_grad=True)
    with pytest.raises(tc.CheckpointError, match="metadata"):
        tc.checkpoint(Growing(torch), xt, use_reentrant=False).sum().backward()
    x = tl.randn(3, requires_grad=True)
    y = checkpoint(Growing(tl), x, preserve_rng_state=False)  # metadata is checked even without the RNG restore
    with pytest.raises(CheckpointError, match=r"metadata.*shape \(2, 3\).*shape \(3, 3\)"):
        y.sum().backward()


def test_checkpoint_restores_numpy_and_torch_global_rng():
    import torch

    def noisy(h):  # draws from numpy's and torch's global generators (not tinylearn's)
        a = np.random.rand(3).astype(np.float32)
        b = torch.rand(3).numpy()
        return h * tl.tensor(a) + h * tl.tensor(b)

    def grads_and_next_draws(run):
        np.random.seed(0)
        torch.manual_seed(0)
        x = tl.ones(3, requires_grad=True)
        run(x).sum().backward()
        return x.grad.data.copy(), (np.random.rand(), torch.rand(1).item())

    g0, after0 = grads_and_next_draws(noisy)
    g1, after1 = grads_and_next_draws(lambda x: checkpoint(noisy, x))  # no CheckpointError: same draws recomputed
    np.testing.assert_array_equal(g1, g0)
    assert after1 == after0  # both generators continue as if nothing had been recomputed


def test_checkpoint_arguments_are_checked():
    x = tl.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(lambda h: h * 2, x, determinism_check="strict")
    with pytest.raises(TypeError, match="use_reentrant"):
        checkpoint(lambda h: h * 2, x, use_reentrant="no")
    with pytest.raises(TypeError, match="preserve_rng_state"):
        checkpoint(lambda h: h * 2, x, preserve_rng_state=None)
    y = checkpoint(lambda h: h * 2, x, use_reentrant=False)  # torch scripts pass use_reentrant: accepted
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, np.full(3, 2, np.float32))
    with pytest.raises(TypeError, match="modules"):
        checkpoint_sequential(3, 1, x)
    with pytest.raises(ValueError, match="segments"):
        checkpoint_sequential(_net(), True, x)
