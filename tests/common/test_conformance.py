"""One conformance test over the backend registry: every op x backend x version against the op's reference.

For each op in ``tinylearn.backends.ops()`` (every topic package of ``tinylearn.topics`` is imported first, so
every op is registered) the reference is the ``python`` backend if the op has one, else ``numpy`` (its default
version). Every other registered (backend, version) that can run here is called on the op's registered example
input (``backends.register(..., example=rng -> (args, kwargs))``) and compared with the reference at the DESIGN.md
tolerance of the reference output's dtype (``tinylearn.tolerance``). An op that returns None updates its arguments
in place (e.g. the optimizer steps): then the arguments after the call are compared.

An op joins by registering an example on any of its registrations; ops without one (or without a python/numpy
reference) show up here as skips saying so. Hand-written per-op parametrisations elsewhere test what this cannot
(torch oracles, odd layouts, bad input).
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import numpy as np
import pytest

from tinylearn import backends, topics
from tinylearn.tolerance import assert_close

for _t in topics.TOPICS:
    for _p in _t.packages:
        importlib.import_module(f"tinylearn.{_p}")

REFERENCES = ("python", "numpy")  # the first one an op registers is its reference


def reference(op: str) -> tuple[str, str] | None:
    """(backend, default version) of the op's reference, or None when it has no python/numpy backend."""
    for b in REFERENCES:
        if b in backends.registered(op):
            return b, backends.resolve(op, b)[1]
    return None


def cases() -> list[Any]:
    out = []
    for op in backends.ops():
        ref = reference(op)
        for b, vs in backends.versions(op).items():
            for v in vs:
                if (b, v) != ref:
                    out.append(pytest.param(op, b, v, id=f"{op}-{b}-{v}"))
    return out


def _arrays(value: Any) -> list[Any]:
    """The comparable leaves of an op's output (or of its arguments, for an in-place op)."""
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in _arrays(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value, key=str) for leaf in _arrays(value[k])]
    if isinstance(value, np.ndarray | np.generic | float | int | bool):
        return [np.asarray(value)]
    return []  # objects (an optimizer, a module): compared through the arrays they own elsewhere


def _run(op: str, backend: str, version: str, args: tuple, kwargs: dict) -> list[Any]:
    args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
    out = backends.dispatch(op, *args, backend=backend, version=version, **kwargs)
    return _arrays(backends.compared(op, out) if out is not None else (args, kwargs))


@pytest.mark.parametrize(("op", "backend", "version"), cases())
def test_backend_version_matches_reference(op: str, backend: str, version: str) -> None:
    ref = reference(op)
    if ref is None:
        pytest.skip(f"{op} has no python/numpy reference backend")
    if not backends.runs_here(op, backend, version):
        why = backends.why_unavailable(backend)
        why = "this version does not run on this CPU/build" if why == "available" else why
        pytest.skip(f"{op} on {backend}/{version} cannot run here ({why})")
    example = backends.example(op, np.random.default_rng(0))
    if example is None:
        pytest.skip(f"{op} registers no example input (backends.register(..., example=rng -> (args, kwargs)))")
    args, kwargs = example
    want = _run(op, *ref, args, kwargs)
    try:
        got = _run(op, backend, version, args, kwargs)
    except RuntimeError as e:  # a backend that is installed but cannot run in this process (e.g. Triton's mode)
        if "cannot run" in str(e):
            pytest.skip(str(e))
        raise
    assert want, f"{op}: the example's output holds no array to compare (register compared=output -> arrays)"
    assert len(got) == len(want), f"{op} {backend}/{version}: {len(got)} outputs, reference {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        dtype = w.dtype if w.dtype.kind == "f" else "int64"
        assert_close(g, w, dtype, msg=f"{op} {backend}/{version} output {i} vs {ref[0]}/{ref[1]}")


def test_use_pins_what_dispatch_picks() -> None:
    """backends.use pins the backend/version a backend=None call gets, nests, and restores on exit."""
    op = "kernels.softmax"
    auto = backends.resolve(op)[:2]
    with backends.use(op, backend="numpy", version="online"):
        assert backends.resolve(op)[:2] == ("numpy", "online")
        assert backends.resolve(op, version="three_pass")[:2] == ("numpy", "three_pass")  # a named version wins
        with backends.use(op):  # neither: the automatic choice again
            assert backends.resolve(op)[:2] == auto
        assert backends.pinned(op) == ("numpy", "online")
    assert backends.resolve(op)[:2] == auto and backends.pinned(op) is None
    for bad, arg in ((dict(backend="nope"), "backend"), (dict(backend="numpy", version="simd"), "version")):
        with pytest.raises(ValueError, match=arg), backends.use(op, **bad):
            pass
    with pytest.raises(ValueError, match="op"), backends.use("kernels.no_such_op"):
        pass


def test_versions_without_a_backend_lists_every_backend() -> None:
    vs = backends.versions("kernels.layer_norm")
    assert isinstance(vs, dict) and vs["numpy"] == ["default"]
    assert vs["cpp"] == backends.versions("kernels.layer_norm", "cpu")
