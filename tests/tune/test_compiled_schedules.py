"""tl.compile's fused kernels get tuned loop schedules: the per-pattern spaces (compiler.tuning.kernel_space), the
generic apply_schedule, tune_compiled, and the code generator reading the records under tuned("cached")."""

import shutil

import numpy as np
import pytest

import tinylearn as tl
from tinylearn import tunable
from tinylearn.compiler import cc, codegen_cpp
from tinylearn.compiler.api import show_code
from tinylearn.compiler.kernel_cache import pattern_hash
from tinylearn.compiler.loops import default_schedule, lower
from tinylearn.compiler.tuning import apply_schedule, kernel_shape, kernel_space, tuned_schedule
from tinylearn.testing import assert_close
from tinylearn.tune import dispatch
from tinylearn.tune.compiled import compiled_kernels, tune_compiled
from tinylearn.tune.measure import Measurement
from tinylearn.tune.records import RecordDB

pytestmark = pytest.mark.skipif(shutil.which(cc.compiler()) is None, reason="no C++ compiler (cpp backend)")
F = tl.nn.functional


def _chain(x, b, r):
    return F.gelu(x + b) + r


def _norm(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def _inputs(rows=48, cols=80, seed=0):
    rng = np.random.default_rng(seed)
    x = tl.Tensor(rng.standard_normal((rows, cols)).astype(np.float32))
    v1 = tl.Tensor(rng.standard_normal(cols).astype(np.float32))
    v2 = tl.Tensor(rng.standard_normal(cols).astype(np.float32))
    r = tl.Tensor(rng.standard_normal((rows, cols)).astype(np.float32))
    return x, v1, v2, r


@pytest.fixture(autouse=True)
def _tuning_off(monkeypatch):
    monkeypatch.delenv("TINYLEARN_TUNE", raising=False)
    yield
    dispatch.set_mode(None)


def _kernels(fn, *args):
    cf = tl.compile(fn)
    cf(*args)
    return cf, compiled_kernels(cf)


@pytest.mark.parametrize("which", ["chain", "norm"])
def test_every_valid_schedule_of_a_compiled_kernel_matches_the_ir(which):
    x, v1, v2, r = _inputs()
    fn, args = (_chain, (x, v1, r)) if which == "chain" else (_norm, (x, v1, v2))
    _, kernels = _kernels(fn, *args)
    assert kernels
    rng = np.random.default_rng(1)
    for k in kernels:
        space = kernel_space(k, pattern_hash(k))
        assert space is not None and space.op.startswith("compiler.schedule.") and tunable.get(space.op) is space
        shape = kernel_shape(k)
        cargs, _ = space.make_args(shape, rng)
        assert space.shape_of(*cargs) == shape
        want = space.reference(*cargs)
        valid = list(space.configs(shape))
        default = space.default(shape)
        assert default in valid and len(valid) < space.size()  # vectorize + unroll together is never valid
        for cfg in valid:
            got = space.build(cfg)(*cargs)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert_close(g, w, "float32", reduction_size=int(shape["d1"]), msg=f"{k.name} {cfg}")


def test_default_configuration_is_the_default_schedule():
    x, v1, _, r = _inputs(256, 512)
    _, (k,) = _kernels(_chain, x, v1, r)
    space = kernel_space(k, pattern_hash(k))
    cfg = space.default(kernel_shape(k))
    assert cfg == {"tile": 1, "parallel": 1, "vectorize": 1, "unroll": 1}  # 128 K elements x body >= the threshold
    assert codegen_cpp.emit(apply_schedule(lower(k), cfg)) == codegen_cpp.emit(default_schedule(lower(k)))


def test_a_stored_schedule_is_what_tl_compile_generates_under_tuning():
    x, v1, _, r = _inputs()
    cf0, (k,) = _kernels(_chain, x, v1, r)
    eager = _chain(x, v1, r).numpy()
    space = kernel_space(k, pattern_hash(k))
    shape = kernel_shape(k)
    cfg = {"tile": 16, "parallel": 0, "vectorize": 0, "unroll": 4}
    assert cfg != space.default(shape) and space.is_valid(cfg, shape)
    db = RecordDB(":memory:")
    db.add(space.op, shape, cfg, Measurement(cfg, 1e-9, 0.0, [1e-9], True, None))
    assert tuned_schedule(k, pattern_hash(k)) is None  # tuning off: the default schedule
    with dispatch.tuned("cached", db=db):
        cf1 = tl.compile(_chain)
        y = cf1(x, v1, r).numpy()
        src = show_code(cf1, file=open("/dev/null", "w"))  # noqa: SIM115
    assert "#pragma GCC unroll 4" in src and "omp parallel" not in src and "omp simd" not in src
    assert src.count("#pragma GCC unroll 4") == 1 and "i1_o" in src  # the tiled column loop, unrolled inside
    assert "GCC unroll" not in show_code(cf0, file=open("/dev/null", "w"))  # noqa: SIM115
    assert_close(y, eager, "float32")


def test_tune_compiled_searches_each_pattern_once_and_checks_candidates():
    x, v1, v2, _ = _inputs(64, 96)
    cf, kernels = _kernels(_norm, x, v1, v2)
    db = RecordDB(":memory:")
    res = tune_compiled(cf, budget=4, db=db, repeat=2)
    assert len(res) == len(kernels) >= 1
    for rr in res:
        assert rr.op.startswith("compiler.schedule.") and not rr.rejected and len(rr.history) <= 4
        assert rr.best_s is not None and db.best(rr.op, rr.shape_class) is not None
    with dispatch.tuned("cached", db=db):
        y = tl.compile(_norm)(x, v1, v2).numpy()
    assert_close(y, _norm(x, v1, v2).numpy(), "float32", reduction_size=96)


def test_tune_compiled_bad_input():
    with pytest.raises(TypeError, match="compiled"):
        tune_compiled(_chain)
    with pytest.raises(ValueError, match="call the compiled function once"):
        tune_compiled(tl.compile(_chain))
    with pytest.raises(ValueError, match="numpy"):
        tune_compiled(tl.compile(_chain, backend="numpy"))


def test_every_valid_bias_gelu_schedule_applies_and_vectorises_the_innermost_loop():
    from tinylearn.compiler.tuning import SPACE, scheduled

    shape = {"R": 33, "C": 300}
    for cfg in SPACE.configs(shape):
        nest = scheduled(shape, cfg)
        inner = [lp for lp in nest.loops() if not any(hasattr(n, "var") for n in lp.body)]
        assert len(inner) == 1 and inner[0].simd == bool(cfg["vectorize"]), cfg
        assert inner[0].var == ("i0" if cfg["order"] == "cols" and cfg["tile"] == 1 else "i1"), cfg  # i1_o, i0, i1
