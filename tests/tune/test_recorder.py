"""tl.profile's recorder: event names/counts on an MLP step, parent/child self time, hooks restored, nesting."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
from tinylearn import backends
from tinylearn.autograd import function as _function
from tinylearn.profiler import profile, record_function


def _mlp_step(steps: int = 2) -> None:
    tl.manual_seed(0)
    m = tl.nn.Sequential(tl.nn.Linear(8, 16), tl.nn.ReLU(), tl.nn.Linear(16, 4))
    x = tl.tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))
    y = tl.tensor(np.array([0, 1, 2, 3, 0]))
    for _ in range(steps):
        loss = tl.nn.functional.cross_entropy(m(x), y)
        loss.backward()


def _counts(prof) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in prof.events():
        out[e.name] = out.get(e.name, 0) + 1
    return out


def test_mlp_forward_backward_names_and_counts() -> None:
    with profile() as prof:
        _mlp_step(2)
    c = _counts(prof)
    assert c["Linear"] == 4 and c["LinearBackward"] == 4
    assert c["ReLU"] == 2 and c["ReLUBackward"] == 2
    assert c["CrossEntropyFn"] == 2 and c["CrossEntropyFnBackward"] == 2
    assert c["autograd.relu"] == 2 and c["autograd.relu_backward"] == 2  # the dispatches inside ReLU
    kinds = {e.name: e.kind for e in prof.events()}
    assert kinds["Linear"] == "forward" and kinds["LinearBackward"] == "backward"
    assert kinds["autograd.relu"] == "dispatch"
    lin = next(e for e in prof.events() if e.name == "Linear")
    assert lin.shapes == ((5, 8), (16, 8), (16,)) and lin.dtypes == ("float32",) * 3
    assert lin.out_shapes == ((5, 16),)
    assert lin.flops == 2 * 5 * 8 * 16  # bias not counted (torch's convention)
    d = next(e for e in prof.events() if e.name == "autograd.relu")
    assert d.backend is not None and d.version is not None


def test_dispatch_is_child_of_forward_and_self_time() -> None:
    with profile() as prof:
        _mlp_step(1)
    evs = prof.events()
    relu = next(e for e in evs if e.name == "ReLU")
    child = next(e for e in evs if e.name == "autograd.relu")
    assert child.parent == relu.id and child.depth == relu.depth + 1
    assert relu.start_ns <= child.start_ns <= child.end_ns <= relu.end_ns
    assert relu.children_ns == child.duration_ns
    assert relu.self_ns == relu.duration_ns - child.duration_ns
    # backward dispatch sits inside ReLUBackward
    rb = next(e for e in evs if e.name == "ReLUBackward")
    assert next(e for e in evs if e.name == "autograd.relu_backward").parent == rb.id


def test_hooks_restored_after_exception() -> None:
    before_fwd = _function._profile_hook
    with pytest.raises(ZeroDivisionError):
        with profile():
            _mlp_step(1)
            1 / 0  # noqa: B018
    assert _function._profile_hook is before_fwd
    prev = backends.set_dispatch_hook(None)
    assert prev is None  # the profile's dispatch hook was removed
    # an op that raises inside the block still ends its event and restores the hooks
    with pytest.raises(ValueError):
        with profile() as prof:
            tl.tensor(np.ones((2, 3), np.float32)) @ tl.tensor(np.ones((2, 3), np.float32))
    assert _function._profile_hook is before_fwd
    assert all(e.end_ns >= e.start_ns for e in prof.events())


def test_nested_profiles_inner_sees_its_own_events() -> None:
    with profile() as outer:
        _mlp_step(1)
        with profile() as inner:
            with record_function("inner_block"):
                _mlp_step(1)
        assert _function._profile_hook is outer
    assert _function._profile_hook is None
    ci, co = _counts(inner), _counts(outer)
    assert ci["Linear"] == 2 and co["Linear"] == 4  # the outer block saw both steps
    assert ci["inner_block"] == 1 and co["inner_block"] == 1
    blk = next(e for e in inner.events() if e.name == "inner_block")
    assert all(e.parent is not None for e in inner.events() if e is not blk and e.kind == "forward")


def test_record_function_user_range_is_parent() -> None:
    with profile() as prof:
        with record_function("my_range"):
            _mlp_step(1)
    rng = next(e for e in prof.events() if e.name == "my_range")
    assert rng.kind == "user"
    tops = [e for e in prof.events() if e.parent == rng.id]
    assert {e.name for e in tops} >= {"Linear", "ReLU", "CrossEntropyFn"}
    with pytest.raises(ValueError, match="name"):
        with record_function(""):
            pass


def test_profile_bad_arguments_and_reuse() -> None:
    with pytest.raises(TypeError, match="record_shapes"):
        profile(record_shapes="yes")  # type: ignore[arg-type]
    p = profile()
    with p:
        pass
    with pytest.raises(RuntimeError, match="one block"):
        with p:
            pass


def test_record_shapes_false_hides_shapes_keeps_flops() -> None:
    with profile(record_shapes=False) as prof:
        _mlp_step(1)
    lin = next(e for e in prof.events() if e.name == "Linear")
    assert lin.shapes == () and lin.flops == 2 * 5 * 8 * 16
    with pytest.raises(ValueError, match="group_by_input_shape"):
        prof.key_averages(group_by_input_shape=True)


def test_memory_peak_per_op() -> None:
    a = tl.tensor(np.ones((256, 256), np.float32))
    with profile(memory=True) as prof:
        (a @ a).sum()
    mm = next(e for e in prof.events() if e.name == "MatMul")
    assert mm.mem_peak is not None and mm.mem_peak >= 256 * 256 * 4  # it allocated its output


def test_threads_have_their_own_stacks() -> None:
    import threading

    a = tl.tensor(np.ones((64, 64), np.float32), requires_grad=True)

    both_alive = threading.Barrier(2)  # thread ids are reused once a thread ends: keep both alive together

    def work() -> None:
        both_alive.wait(timeout=30)
        with record_function("thread_range"):
            (a @ a).sum()
        both_alive.wait(timeout=30)

    with profile() as prof:
        ts = [threading.Thread(target=work) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    evs = prof.events()
    ranges = [e for e in evs if e.name == "thread_range"]
    assert len(ranges) == 2 and ranges[0].tid != ranges[1].tid
    by_id = {e.id: e for e in evs}
    for e in evs:
        if e.parent is not None:
            assert by_id[e.parent].tid == e.tid  # a parent is always on the child's own thread
    assert sum(e.name == "MatMul" for e in evs) == 2
