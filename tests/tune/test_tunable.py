"""tinylearn.tunable: the search-space declaration every kernel package uses (Param, Space, class_of, registry)."""

import numpy as np
import pytest

from tinylearn import tunable
from tinylearn.tunable import Param, Space


def _space(valid=None) -> Space:
    return Space(
        op="test.scale",
        params=(Param("block", (16, 32, 64, 128)), Param("order", ("ij", "ji"))),
        build=lambda cfg: lambda x: x * 2.0,
        shape_of=lambda x: {"N": x.shape[0]},
        make_args=lambda shape, rng: ((rng.standard_normal(shape["N"]),), {}),
        default=lambda shape: {"block": 32, "order": "ij"},
        valid=valid,
    )


def test_param_checks_its_values() -> None:
    with pytest.raises(ValueError, match="values"):
        Param("x", ())
    with pytest.raises(ValueError, match="repeats"):
        Param("x", (1, 1))
    with pytest.raises(ValueError, match="name"):
        Param("not a name", (1,))
    assert Param("x", (1, 2)).numeric and not Param("x", ("a", 2)).numeric and not Param("b", (True, False)).numeric


def test_space_grid_validity_sampling_and_neighbours() -> None:
    sp = _space(valid=lambda cfg, shape: cfg["block"] <= shape["N"])
    assert sp.size() == 8 and len(list(sp.configs())) == 8
    small = list(sp.configs({"N": 32}))
    assert len(small) == 4 and all(c["block"] <= 32 for c in small)
    rng = np.random.default_rng(0)
    draws = [sp.sample(rng, {"N": 32}) for _ in range(50)]
    assert all(d["block"] <= 32 for d in draws) and len({tuple(d.values()) for d in draws}) == 4
    nb = sp.neighbours({"block": 32, "order": "ij"}, {"N": 32})
    assert {"block": 16, "order": "ij"} in nb and {"block": 32, "order": "ji"} in nb
    assert {"block": 64, "order": "ij"} not in nb  # adjacent but invalid for N = 32
    with pytest.raises(ValueError, match="no valid configuration"):
        sp.sample(rng, {"N": 8}, tries=20)


def test_space_check_names_the_bad_parameter() -> None:
    sp = _space()
    assert sp.check({"order": "ji", "block": 16}) == {"block": 16, "order": "ji"}
    with pytest.raises(ValueError, match="missing parameter 'order'"):
        sp.check({"block": 16})
    with pytest.raises(ValueError, match="no parameter 'tile'"):
        sp.check({"block": 16, "order": "ij", "tile": 4})
    with pytest.raises(ValueError, match="block=24"):
        sp.check({"block": 24, "order": "ij"})
    with pytest.raises(TypeError, match="config"):
        sp.check([("block", 16)])
    with pytest.raises(ValueError, match="empty"):
        Space("x", (), sp.build, sp.shape_of, sp.make_args, sp.default)
    with pytest.raises(ValueError, match="twice"):
        Space("x", (Param("a", (1,)), Param("a", (2,))), sp.build, sp.shape_of, sp.make_args, sp.default)


def test_features_encode_log_sizes_and_one_hot() -> None:
    sp = _space()
    f = sp.features({"block": 64, "order": "ji"}, {"N": 1024})
    assert f == [10.0, 6.0, 0.0, 1.0]
    assert sp.feature_names({"N": 1024}) == ["shape.N", "block", "order=ij", "order=ji"]


def test_class_of_rounds_up_to_powers_of_two() -> None:
    assert tunable.class_of({"M": 100, "N": 256, "K": 257}) == "K512_M128_N256"
    assert tunable.class_of({"N": 1}) == "N1" and tunable.class_of({"N": 0}) == "N0"


def test_registry_declare_and_get() -> None:
    sp = tunable.declare(_space())
    try:
        assert tunable.get("test.scale") is sp and "test.scale" in tunable.ops()
    finally:
        tunable._SPACES.pop("test.scale")  # other tests iterate over every declared space
    with pytest.raises(ValueError, match="no search space"):
        tunable.get("test.nothing_here")
    with pytest.raises(TypeError, match="space"):
        tunable.declare("gemm")
    with pytest.raises(TypeError, match="op"):
        tunable.get(3)
