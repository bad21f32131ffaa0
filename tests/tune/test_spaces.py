"""The search spaces declared next to the kernels (gemm, kernels, conv, quant, compiler): the default configuration
and 20 random valid ones compute the reference (the op's numpy backend, or the space's own reference) within the
DESIGN.md tolerance table; invalid configurations are rejected by ``check`` / ``is_valid``."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn import backends, tunable
from tinylearn.tolerance import assert_close

SHAPES = {
    "gemm.matmul": {"M": 37, "K": 70, "N": 45},
    "kernels.softmax": {"R": 9, "C": 77},
    "kernels.layer_norm": {"R": 9, "C": 77},
    "kernels.attention": {"BH": 2, "N": 40, "D": 32},
    "conv.conv2d": {"N": 2, "C": 16, "H": 9, "W": 8, "OC": 16, "KH": 3, "S": 1, "G": 1},
    "quant.int8_gemm": {"M": 5, "K": 70, "N": 33},
    "compiler.schedule": {"R": 7, "C": 300},
}
OPS = sorted(SHAPES)


def _parts(op: str, out):
    out = backends.compared(op, out) if op in backends.ops() else out
    return [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]


def _reference(space: tunable.Space, args: tuple, kwargs: dict):
    if space.reference is not None:
        return space.reference(*args, **kwargs)
    return backends.resolve(space.op, "numpy")[2](*args, **kwargs)


def _check_same(op: str, out, ref, size: int) -> None:
    got, exp = _parts(op, out), _parts(op, ref)
    assert len(got) == len(exp), f"{op}: {len(got)} outputs vs reference {len(exp)}"
    for g, e in zip(got, exp):
        assert_close(g, e, reduction_size=size, msg=op)


def test_every_space_is_declared_and_its_module_is_a_registering_module():
    assert set(OPS) <= set(tunable.ops())
    for op in OPS:
        space = tunable.get(op)
        assert space.op == op and space.size() >= 2
        cfg = space.default(SHAPES[op])
        assert space.check(cfg) == cfg and space.is_valid(cfg, SHAPES[op]), (op, cfg)


@pytest.mark.parametrize("op", OPS)
def test_default_and_20_random_valid_configs_match_the_reference(op):
    space = tunable.get(op)
    shape = SHAPES[op]
    rng = np.random.default_rng(0)
    args, kwargs = space.make_args(shape, rng)
    assert space.shape_of(*args, **kwargs) == shape
    ref = _reference(space, args, kwargs)
    size = max(shape.values())
    _check_same(op, space.build(space.default(shape))(*args, **kwargs), ref, size)
    valid = list(space.configs(shape))
    pick = rng.choice(len(valid), size=min(20, len(valid)), replace=False)
    for i in pick:
        cfg = valid[int(i)]
        try:
            _check_same(op, space.build(cfg)(*args, **kwargs), ref, size)
        except AssertionError as e:
            raise AssertionError(f"{op} config {cfg}: {e}") from None


def test_unknown_values_and_parameters_are_rejected_naming_them():
    space = tunable.get("gemm.matmul")
    cfg = space.default(SHAPES["gemm.matmul"])
    with pytest.raises(ValueError, match="mc=7"):
        space.check(dict(cfg, mc=7))
    with pytest.raises(ValueError, match="'tile'"):
        space.check(dict(cfg, tile=4))
    with pytest.raises(ValueError, match="missing parameter 'version'"):
        space.check({k: v for k, v in cfg.items() if k != "version"})


def test_constraints_reject_invalid_configs():
    g = tunable.get("gemm.matmul")
    shape = {"M": 128, "K": 128, "N": 128}
    base = {"version": "parallel", "isa": "scalar", "mc": 48, "kc": 64, "nc": 256, "threads": 1}
    assert g.is_valid(base, shape)
    if g.param("threads").values[-1] > 1:
        assert not g.is_valid(dict(base, version="simd", threads=2), shape)  # threads only with parallel
    assert not g.is_valid(dict(base, kc=1024), shape)  # a K block 8x the problem's K
    assert not g.is_valid(dict(base, mc=384), shape)
    have = set(backends.load_C("gemm").isa_paths())
    for isa in g.param("isa").values:
        assert g.is_valid(dict(base, isa=isa), shape) == (isa in have)
    # every valid GEMM config at 128^3 uses blocks no larger than the first value covering 128
    assert all(c["kc"] <= 128 and c["nc"] <= 256 and c["mc"] <= 144 for c in g.configs(shape))

    a = tunable.get("kernels.attention")
    assert not a.is_valid({"version": "tiled", "block_size": 256}, {"BH": 1, "N": 40, "D": 16})
    assert a.is_valid({"version": "tiled", "block_size": 64}, {"BH": 1, "N": 40, "D": 16})

    s = tunable.get("compiler.schedule")
    cfg = {"tile": 1, "order": "rows", "parallel": 0, "vectorize": 1, "unroll": 4}
    assert not s.is_valid(cfg, {"R": 4, "C": 64})  # vectorize and unroll on one loop: refused by loops too
    assert not s.is_valid(dict(cfg, unroll=1, tile=256), {"R": 4, "C": 64})  # a tile covering the row

    q = tunable.get("quant.int8_gemm")
    from tinylearn.quant.gemm import int8_gemm_versions

    for v in q.param("version").values:
        assert q.is_valid({"version": v}, SHAPES["quant.int8_gemm"]) == (v == "auto" or v in int8_gemm_versions())


def test_gemm_features_include_intensity_and_block_bytes():
    g = tunable.get("gemm.matmul")
    shape = {"M": 128, "K": 128, "N": 128}
    names = g.feature_names(shape)
    cfg = {"version": "parallel", "isa": "scalar", "mc": 48, "kc": 64, "nc": 256, "threads": 1}
    f = dict(zip(names, g.features(cfg, shape)))
    assert f["intensity"] == pytest.approx(2 * 128**3 / (4 * 3 * 128 * 128))
    assert f["log2_a_block_bytes"] == pytest.approx(np.log2(48 * 64 * 4))
    assert f["log2_b_panel_bytes"] == pytest.approx(np.log2(64 * 128 * 4))  # nc clamped to N
    assert f["blocks_per_thread"] == pytest.approx(3 * 1)  # ceil(128/48) row blocks x 1 column panel


def test_schedule_space_applies_every_knob_to_the_loop_nest():
    from tinylearn.compiler.tuning import scheduled

    nest = scheduled({"R": 4, "C": 300}, {"tile": 64, "order": "cols", "parallel": 1, "vectorize": 0, "unroll": 4})
    loops = {lp.var: lp for lp in nest.loops()}
    assert nest.body[0].var == "i1_o" and nest.body[0].parallel and nest.body[0].step == 64
    assert loops["i1"].unroll == 4 and not loops["i1"].simd
    text = str(nest)
    assert "unroll 4" in text and "parallel" in text
