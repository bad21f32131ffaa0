"""Polyhedral model: domains, accesses, dependence distances, and legality checked by running the transformed order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tinylearn.compiler.polyhedral import (
    constraints,
    conv2d_nest,
    dependences,
    describe,
    execute,
    execution_order,
    fully_permutable,
    is_legal,
    lex_positive,
    loop_nest,
    matmul_nest,
    parallel_loops,
    parse_affine,
    permutation,
    recurrence_nest,
    reversal,
    skew,
    stencil_nest,
    uniform_distance,
    violations,
)

INTERCHANGE = [[0, 1], [1, 0]]
SKEW = [[1, 0], [1, 1]]


def test_parse_affine():
    loops = ("i", "j", "oh", "r")
    assert parse_affine("oh+r", loops).coeffs == (0, 0, 1, 1)
    e = parse_affine("2*i - j + 3", loops)
    assert (e.coeffs, e.const) == ((2, -1, 0, 0), 3) and e.at((1, 4, 0, 0)) == 1
    assert parse_affine("-1", loops).const == -1
    assert e.show(loops) == "2*i - j + 3"
    for bad in ("i*j", "x + 1", "", "i +"):
        with pytest.raises(ValueError, match="text"):
            parse_affine(bad, loops)


def test_domain_constraints_describe_exactly_the_points():
    nest = conv2d_nest(n=1, k=2, c=2, h=4, w=4, r=2, s=2)
    A, b, text = constraints(nest)
    assert A.shape == (14, 7) and "-oh + 2 >= 0" in text
    pts = np.array(nest.points())
    assert len(pts) == 1 * 2 * 2 * 3 * 3 * 2 * 2 and (pts @ A.T + b >= 0).all()
    lo, hi = pts.min(0), pts.max(0)
    box = np.array(list(itertools.product(*(range(a - 1, z + 2) for a, z in zip(lo, hi)))))
    assert ((box @ A.T + b >= 0).all(1)).sum() == len(pts)  # nothing outside the domain satisfies them
    # the skewed domain of the stencil: y = T x satisfies A T^-1 y + b >= 0, and only those y
    st = stencil_nest()
    A2, b2, text2 = constraints(st, SKEW)
    ys = np.array(st.points()) @ np.array(SKEW).T
    assert (ys @ A2.T + b2 >= 0).all() and "-i' + j' - 1 >= 0" in text2
    grid = np.array(list(itertools.product(range(-1, 12), repeat=2)))
    assert ((grid @ A2.T + b2 >= 0).all(1)).sum() == len(ys)
    assert "domain:  0 <= n <= 0" in describe(nest) and "legal True" in describe(st, SKEW)


def test_conv_access_functions():
    nest = conv2d_nest()
    F, f = nest.reads[1].matrix()  # inp[n, c, oh + r, ow + s]
    assert F.tolist() == [[1, 0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 1, 0, 1]]
    assert f.tolist() == [0, 0, 0, 0] and nest.reads[1].at((0, 1, 1, 2, 0, 1, 1)) == (0, 1, 3, 1)
    assert uniform_distance(nest.write, nest.reads[0]) is None  # F of out has rank 4 < 7: c, r, s are free


def test_conv_dependences_are_the_reduction_on_out():
    nest = conv2d_nest()
    deps = dependences(nest)
    assert {d.array for d in deps} == {"out"} and {d.kind for d in deps} == {"flow", "anti", "output"}
    loops = nest.loops
    for d in deps:
        assert lex_positive(d.distance)
        assert all(d.distance[loops.index(x)] == 0 for x in ("n", "k", "oh", "ow"))
    assert len({d.distance for d in deps}) == 3 * 3 * 3 // 2  # (dc, dr, ds) in {-1,0,1}^3, lexicographically > 0
    assert parallel_loops(deps) == [True, True, False, True, True, False, False]
    d = next(d for d in deps if d.distance == (0, 0, 1, 0, 0, -1, 0))
    assert d.direction() == ("=", "=", "<", "=", "=", ">", "=")
    assert dependences(nest, relax_reductions=True) == []


def test_conv_interchange_is_legal_iff_c_r_s_keep_their_order():
    nest = conv2d_nest()
    deps = dependences(nest)
    for order in itertools.permutations(nest.loops):
        keeps = [x for x in order if x in "crs" and len(x) == 1] == ["c", "r", "s"]
        assert is_legal(deps, permutation(nest.loops, order)) == keeps, order


def _conv_arrays(dtype, seed=0):
    rng = np.random.default_rng(seed)
    draw = (lambda *s: rng.integers(-5, 6, s)) if dtype == np.int64 else (lambda *s: rng.standard_normal(s))
    return {
        "inp": draw(1, 2, 4, 4).astype(dtype),
        "wt": draw(2, 2, 2, 2).astype(dtype),
        "out": np.zeros((1, 2, 3, 3), dtype),
    }


def test_conv_executes_the_same_in_every_legal_order():
    nest = conv2d_nest()
    ints = _conv_arrays(np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(ints["inp"], (2, 2), axis=(2, 3))  # n c oh ow r s
    want = np.einsum("nchwrs,kcrs->nkhw", windows, ints["wt"])
    assert np.array_equal(execute(nest, ints)["out"], want)
    floats = _conv_arrays(np.float32)
    base = execute(nest, floats)["out"]
    deps = dependences(nest)
    for order in [("n", "k", "c", "r", "s", "oh", "ow"), ("oh", "ow", "c", "n", "r", "k", "s")]:
        T = permutation(nest.loops, order)
        assert is_legal(deps, T)
        # same sequence of additions into every out element: bitwise equal even in float32
        assert np.array_equal(execute(nest, floats, T)["out"], base)
    T = permutation(nest.loops, ("s", "r", "c", "n", "k", "oh", "ow"))
    assert not is_legal(deps, T) and is_legal(dependences(nest, relax_reductions=True), T)
    assert np.array_equal(execute(nest, ints, T)["out"], want)  # integer + is associative: the reorder is exact
    np.testing.assert_allclose(execute(nest, floats, T)["out"], base, rtol=1e-5, atol=1e-5)  # floats: rounding


def test_matmul_band_is_fully_permutable_so_any_order_and_tiling_is_legal():
    nest = matmul_nest(4, 5, 6)
    deps = dependences(nest)
    assert {d.distance[:2] for d in deps} == {(0, 0)} and all(d.distance[2] > 0 for d in deps)
    assert fully_permutable(deps) and parallel_loops(deps) == [True, True, False]
    rng = np.random.default_rng(2)
    arrays = {"A": rng.standard_normal((4, 6)), "B": rng.standard_normal((6, 5)), "C": np.zeros((4, 5))}
    base = execute(nest, arrays)["C"]
    np.testing.assert_allclose(base, arrays["A"] @ arrays["B"], rtol=1e-12, atol=1e-12)
    for order in itertools.permutations(nest.loops):
        T = permutation(nest.loops, order)
        assert is_legal(deps, T) and fully_permutable(deps, T)
        for tile in (None, 2, 3):  # p keeps its order for every (i, j): bitwise equal
            assert np.array_equal(execute(nest, arrays, T, tile)["C"], base), (order, tile)


def _grid(seed=1, shape=(6, 7)):
    return {"A": np.random.default_rng(seed).integers(-3, 4, shape)}


def test_recurrence_interchange_and_tiling_are_legal_skew_gives_a_wavefront():
    nest = recurrence_nest()
    deps = dependences(nest)
    assert [(d.kind, d.distance) for d in deps] == [("flow", (0, 1)), ("flow", (1, 0))]
    assert uniform_distance(nest.write, nest.reads[0]) == (1, 0)
    assert uniform_distance(nest.write, nest.reads[1]) == (0, 1)
    data = _grid(shape=(6, 6))
    base = execute(nest, data)["A"]
    assert is_legal(deps, INTERCHANGE) and np.array_equal(execute(nest, data, INTERCHANGE)["A"], base)
    assert fully_permutable(deps)  # distances >= 0 already: tiles need no skew
    for tile in (2, 3):
        assert np.array_equal(execute(nest, data, tile=tile)["A"], base)
    assert parallel_loops(deps) == [False, False]  # both loops carry a dependence
    wavefront = np.array(INTERCHANGE) @ np.array(SKEW)  # t = i + j outside, i inside
    assert is_legal(deps, wavefront) and parallel_loops(deps, wavefront) == [False, True]
    assert np.array_equal(execute(nest, data, wavefront)["A"], base)
    for level in (0, 1):  # reversing either loop reads values before they are computed
        T = reversal(2, level)
        assert violations(deps, T) and not np.array_equal(execute(nest, data, T)["A"], base)


def test_stencil_needs_a_skew_before_interchange_or_tiling():
    nest = stencil_nest()
    deps = dependences(nest)
    assert [d.distance for d in deps] == [(0, 1), (1, -1)]
    assert uniform_distance(nest.write, nest.reads[0]) == (1, -1)
    data = _grid()
    base = execute(nest, data)["A"]
    assert not is_legal(deps, INTERCHANGE)
    assert not np.array_equal(execute(nest, data, INTERCHANGE)["A"], base)
    assert not fully_permutable(deps)
    assert not np.array_equal(execute(nest, data, tile=2)["A"], base)  # tiling the unskewed nest breaks it
    assert is_legal(deps, SKEW) and fully_permutable(deps, SKEW)
    assert sorted(tuple(np.array(SKEW) @ d.distance) for d in deps) == [(0, 1), (1, 0)]
    for tile in (2, 3):
        assert np.array_equal(execute(nest, data, SKEW, tile=tile)["A"], base)
    both = np.array(INTERCHANGE) @ np.array(SKEW)
    assert is_legal(deps, both) and np.array_equal(execute(nest, data, both)["A"], base)


def _unimodular_2x2():
    for a, b, c, d in itertools.product(range(-2, 3), repeat=4):
        if abs(a * d - b * c) == 1:
            yield [[a, b], [c, d]]


@pytest.mark.parametrize("make", [recurrence_nest, stencil_nest])
def test_legality_predicts_execution_for_all_small_unimodular_transforms(make):
    nest = make()
    deps = dependences(nest)
    data = _grid(shape=(6, 7))
    base = execute(nest, data)["A"]
    seen = {True: 0, False: 0}
    for T in _unimodular_2x2():
        legal = is_legal(deps, T)
        seen[legal] += 1
        assert np.array_equal(execute(nest, data, T)["A"], base) == legal, T
    assert seen[True] and seen[False]


def test_execution_order_is_a_permutation_of_the_domain():
    nest = stencil_nest()
    for T, tile in [(None, None), (SKEW, 2), (INTERCHANGE, None)]:
        order = execution_order(nest, T, tile)
        assert sorted(order) == nest.points() and len(set(order)) == len(order)
    assert execution_order(nest, INTERCHANGE)[:2] == [(1, 1), (2, 1)]


def test_bad_input():
    deps = dependences(stencil_nest())
    for bad in ([[2, 0], [0, 1]], [[1, 0, 0], [0, 1, 0]], [[1.0, 0.0], [0.0, 1.0]]):
        with pytest.raises(ValueError, match="transform"):
            is_legal(deps, bad)
    with pytest.raises(ValueError, match="statement"):
        loop_nest([("i", 0, 3)], "A[i] -= B[i]")
    with pytest.raises(ValueError, match="loops"):
        loop_nest([("i", 3, 0)], "A[i] = B[i]")
    with pytest.raises(ValueError, match="order"):
        permutation(("i", "j"), ("i", "k"))
    with pytest.raises(ValueError, match="source"):
        skew(2, 1, 1)
    with pytest.raises(ValueError, match="level"):
        reversal(2, 2)
    with pytest.raises(ValueError, match="tile"):
        execution_order(stencil_nest(), tile=0)
    with pytest.raises(ValueError, match="arrays"):
        execute(stencil_nest(), {})
    with pytest.raises(ValueError, match="max_points"):
        dependences(conv2d_nest(n=2, k=8, c=8, h=10, w=10, r=3, s=3))
