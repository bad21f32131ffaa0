"""Tests for exercises/17_autotuning_profiling (run on stubs by default, on tinylearn with --impl=reference).

(a) random search without replacement: distinct configurations, the best of the history, reproducible by seed,
stops when the grid is exhausted, skips failed configurations, covers the grid uniformly over many seeds; (b) GEMM
schedule features: each key against its definition, blocks clamped to the matrix, and a least-squares model on the
features ranks a measured table of C++ GEMM times (this repository's simd kernel, one thread) better than chance
(Kendall tau > 0 on held-out rows); (c) the top-k ops of a profile table by self time with their share, duplicate
names summed, ties by name, on a real ``tl.profile`` run when the profiler is present. Bad input raises ValueError
naming the argument."""

from __future__ import annotations

import itertools
import math
from types import ModuleType

import numpy as np
import pytest
from scipy.stats import kendalltau

GRID = {"mc": (24, 48, 96), "kc": (64, 128, 256), "isa": ("avx2", "avx512")}


def _cost(cfg: dict) -> float:
    """A deterministic 'time' with a unique minimum at mc=48, kc=256, isa=avx512."""
    return 1.0 + abs(math.log2(cfg["mc"] / 48)) + abs(math.log2(cfg["kc"] / 256)) + (cfg["isa"] == "avx2") * 0.5


# ------------------------------------------------------------------------------------------ (a) random search
def test_random_search_distinct_and_best(impl: ModuleType) -> None:
    best, best_t, hist = impl.random_search(GRID, _cost, budget=10, seed=1)
    assert len(hist) == 10
    keys = [tuple(sorted(c.items())) for c, _ in hist]
    assert len(set(keys)) == 10  # without replacement
    for c, t in hist:
        assert set(c) == set(GRID) and all(c[k] in GRID[k] for k in GRID)
        assert t == pytest.approx(_cost(c))
    t_min = min(t for _, t in hist)
    assert best_t == pytest.approx(t_min) and _cost(best) == pytest.approx(t_min)


def test_random_search_reproducible_and_seed_dependent(impl: ModuleType) -> None:
    h1 = impl.random_search(GRID, _cost, budget=8, seed=3)[2]
    h2 = impl.random_search(GRID, _cost, budget=8, seed=3)[2]
    assert h1 == h2
    others = [impl.random_search(GRID, _cost, budget=8, seed=s)[2] for s in range(4, 8)]
    assert any(h != h1 for h in others)


def test_random_search_exhausts_the_grid(impl: ModuleType) -> None:
    best, best_t, hist = impl.random_search(GRID, _cost, budget=100, seed=0)
    size = math.prod(len(v) for v in GRID.values())
    assert len(hist) == size
    assert {tuple(sorted(c.items())) for c, _ in hist} == {
        tuple(sorted(zip(GRID, combo))) for combo in itertools.product(*GRID.values())
    }
    assert best == {"mc": 48, "kc": 256, "isa": "avx512"} and best_t == pytest.approx(1.0)


def test_random_search_skips_failures(impl: ModuleType) -> None:
    def measure(cfg: dict) -> float | None:
        return None if cfg["isa"] == "avx512" else _cost(cfg)

    best, best_t, hist = impl.random_search(GRID, measure, budget=18, seed=2)
    assert len(hist) == 18 and sum(t is None for _, t in hist) == 9
    assert best == {"mc": 48, "kc": 256, "isa": "avx2"} and best_t == pytest.approx(1.5)
    assert impl.random_search({"a": (1, 2)}, lambda c: None, budget=2)[:2] == (None, None)


def test_random_search_is_uniform_over_seeds(impl: ModuleType) -> None:
    first = [impl.random_search(GRID, _cost, budget=1, seed=s)[2][0][0]["mc"] for s in range(300)]
    counts = np.array([first.count(v) for v in GRID["mc"]])
    assert counts.min() > 60, counts  # expected 100 each; a fixed or biased first draw fails


def test_random_search_bad_input(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="^space_values: "):
        impl.random_search({}, _cost, budget=3)
    with pytest.raises(ValueError, match="^space_values: "):
        impl.random_search({"mc": ()}, _cost, budget=3)
    with pytest.raises(ValueError, match="^space_values: "):
        impl.random_search({"mc": (1, 1)}, _cost, budget=3)
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="^budget: "):
            impl.random_search(GRID, _cost, budget=bad)
    with pytest.raises(ValueError, match="^measure: "):
        impl.random_search(GRID, 42, budget=3)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="^measure: "):
            impl.random_search(GRID, lambda c, bad=bad: bad, budget=3)


# ------------------------------------------------------------------------------------------ (b) GEMM features
KEYS = {"log2_M", "log2_N", "log2_K", "log2_mc", "log2_kc", "log2_nc", "intensity", "a_block_bytes", "b_panel_bytes",
        "blocks"}  # fmt: skip


def test_gemm_features_definitions(impl: ModuleType) -> None:
    f = impl.gemm_features(256, 128, 512, 96, 256, 4096)
    assert set(f) == KEYS
    assert f["log2_M"] == pytest.approx(8) and f["log2_N"] == pytest.approx(7) and f["log2_K"] == pytest.approx(9)
    assert f["log2_mc"] == pytest.approx(math.log2(96)) and f["log2_kc"] == pytest.approx(8)
    assert f["log2_nc"] == pytest.approx(7)  # nc clamped to N = 128
    assert f["intensity"] == pytest.approx(2 * 256 * 128 * 512 / (4 * (256 * 512 + 512 * 128 + 256 * 128)))
    assert f["a_block_bytes"] == pytest.approx(4 * 96 * 256)
    assert f["b_panel_bytes"] == pytest.approx(4 * 256 * 128)
    assert f["blocks"] == pytest.approx(3 * 2 * 1)  # ceil(256/96) ceil(512/256) ceil(128/128)


def test_gemm_features_clamp_small_matrix(impl: ModuleType) -> None:
    f = impl.gemm_features(10, 20, 30, 96, 256, 4096)
    assert f["blocks"] == 1 and f["a_block_bytes"] == 4 * 10 * 30 and f["b_panel_bytes"] == 4 * 30 * 20
    assert f["log2_mc"] == pytest.approx(math.log2(10))
    g = impl.gemm_features(1, 1, 1, 1, 1, 1)
    assert g["intensity"] == pytest.approx(2 / 12) and g["log2_M"] == 0


# measured here: C++ simd GEMM, avx512 micro-kernel, one thread, min of 5 (M, N, K, mc, kc, nc, microseconds)
MEASURED = [
    (64, 64, 64, 24, 64, 256, 10.0), (64, 64, 64, 96, 256, 4096, 10.0), (64, 64, 64, 192, 128, 512, 9.9),
    (128, 256, 64, 24, 64, 256, 47.4), (128, 256, 64, 96, 256, 4096, 47.6), (128, 256, 64, 192, 128, 512, 47.4),
    (256, 256, 256, 24, 64, 256, 345.6), (256, 256, 256, 96, 256, 4096, 335.5),
    (256, 256, 256, 192, 128, 512, 338.9), (512, 128, 256, 24, 64, 256, 370.0),
    (512, 128, 256, 96, 256, 4096, 363.1), (512, 128, 256, 192, 128, 512, 361.7),
    (384, 384, 384, 24, 64, 256, 1180.1), (384, 384, 384, 96, 256, 4096, 1079.8),
    (384, 384, 384, 192, 128, 512, 1086.7), (96, 512, 512, 24, 64, 256, 533.8),
    (96, 512, 512, 96, 256, 4096, 500.8), (96, 512, 512, 192, 128, 512, 503.0),
]  # fmt: skip


def test_linear_model_on_features_ranks_better_than_chance(impl: ModuleType) -> None:
    names = sorted(KEYS)
    x = np.array([[impl.gemm_features(*r[:6])[k] for k in names] for r in MEASURED])
    x = np.concatenate([np.ones((len(x), 1)), x[:, [names.index(k) for k in ("log2_M", "log2_N", "log2_K")]],
                        np.log2(x[:, [names.index("blocks")]])], 1)  # fmt: skip
    y = np.log([r[6] for r in MEASURED])
    pred = np.empty_like(y)
    shapes = [r[:3] for r in MEASURED]
    for s in set(shapes):  # leave one shape out: predict its three rows from the other shapes
        held = np.array([sh == s for sh in shapes])
        coef = np.linalg.lstsq(x[~held], y[~held], rcond=None)[0]
        pred[held] = x[held] @ coef
    tau = kendalltau(pred, y).statistic
    assert tau > 0.5, tau


def test_gemm_features_bad_input(impl: ModuleType) -> None:
    args = dict(M=8, N=8, K=8, mc=4, kc=4, nc=4)
    for name in args:
        for bad in (0, -3, 2.0, True, "8"):
            with pytest.raises(ValueError, match=f"^{name}: "):
                impl.gemm_features(**{**args, name: bad})


# ------------------------------------------------------------------------------------------ (c) top ops
ROWS = [
    {"name": "MatMul", "self_ns": 600, "count": 3},
    {"name": "ReLU", "self_ns": 100},
    {"name": "gemm.matmul", "self_ns": 200},
    {"name": "MatMul", "self_ns": 300},  # the same op with other input shapes
    {"name": "Add", "self_ns": 100},
    {"name": "Sum", "self_ns": 0},
]


def test_top_ops_sums_sorts_and_shares(impl: ModuleType) -> None:
    top = impl.top_ops(ROWS, 3)
    assert [t[0] for t in top] == ["MatMul", "gemm.matmul", "Add"]  # Add before ReLU: tie broken by name
    assert top[0][1] == pytest.approx(900) and top[0][2] == pytest.approx(900 / 1300)
    assert top[1][2] == pytest.approx(200 / 1300) and top[2][2] == pytest.approx(100 / 1300)
    everything = impl.top_ops(ROWS, 50)
    assert len(everything) == 5 and sum(t[2] for t in everything) == pytest.approx(1.0)
    assert impl.top_ops([{"name": "x", "self_ns": 0}], 1) == [("x", 0.0, 0.0)]


def test_top_ops_on_a_real_profile(impl: ModuleType) -> None:
    profiler = pytest.importorskip("tinylearn.profiler")
    import tinylearn as tl

    x = tl.Tensor(np.random.default_rng(0).standard_normal((64, 64)), requires_grad=True)
    with profiler.profile() as prof:
        for _ in range(3):
            ((x @ x).relu() + 1.0).sum().backward()
    rows = [{"name": r.key, "self_ns": r.self_ns} for r in prof.key_averages()]
    top = impl.top_ops(rows, 2)
    ranked = sorted(rows, key=lambda r: -r["self_ns"])
    assert top[0][1] == pytest.approx(ranked[0]["self_ns"]) and top[0][1] >= top[1][1]
    assert 0 < top[0][2] <= 1


def test_top_ops_bad_input(impl: ModuleType) -> None:
    for bad in ("rows", {"name": "x", "self_ns": 1}, [{"name": "x"}], [{"self_ns": 1}], [3],
                [{"name": "x", "self_ns": -1}], [{"name": "x", "self_ns": float("nan")}]):  # fmt: skip
        with pytest.raises(ValueError, match="^profile_rows: "):
            impl.top_ops(bad, 2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="^k: "):
            impl.top_ops(ROWS, bad)
