"""tl.gemm: every rung of the C++ ladder (and the numpy/numba backends) vs an fp64 oracle and torch, over odd sizes
and strided layouts; ISA paths; packing; roofline; machine_peak; validation errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import backends
from tinylearn.testing import assert_close, make_layouts

needs_C = pytest.mark.skipif(not backends.C_available("gemm"), reason="tinylearn._C.gemm not built")

SHAPES = [(1, 1, 1), (7, 7, 7), (33, 33, 33), (13, 300, 37), (1, 70, 5), (50, 1, 19), (6, 256, 16), (257, 257, 257)]


def _pair(m: int, k: int, n: int, dtype: str = "float32", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.uniform(-1, 1, (m, k)).astype(dtype),
        rng.uniform(-1, 1, (k, n)).astype(dtype),
    )


def _expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype)


@needs_C
def test_cpp_versions_match_library_table() -> None:
    assert tl.gemm.versions("cpp") == list(tl.gemm.CPP_VERSIONS) == list(backends.load_C("gemm").versions())
    assert tl.gemm.versions() == tl.gemm.versions("cpu")
    assert tl.gemm.versions("numpy") == ["default"]


@needs_C
@pytest.mark.parametrize("version", tl.gemm.CPP_VERSIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cpp_version_odd_sizes(version: str, shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    a, b = _pair(m, k, n)
    c = tl.gemm.matmul(a, b, backend="cpp", version=version)
    assert c.dtype == np.float32 and c.shape == (m, n) and c.flags.c_contiguous
    assert_close(c, _expected(a, b), reduction_size=k)
    assert_close(c, torch.from_numpy(a) @ torch.from_numpy(b), reduction_size=k)


@needs_C
@pytest.mark.parametrize("version", tl.gemm.CPP_VERSIONS)
def test_cpp_version_fp64(version: str) -> None:
    a, b = _pair(37, 129, 23, "float64")
    c = tl.gemm.matmul(a, b, backend="cpp", version=version)
    assert c.dtype == np.float64
    assert_close(c, torch.from_numpy(a) @ torch.from_numpy(b))


@needs_C
@pytest.mark.parametrize("version", tl.gemm.CPP_VERSIONS)
def test_cpp_version_layouts(version: str) -> None:
    """Transposed (Fortran), strided, reversed and broadcast (stride 0) views of A and B, used in place."""
    for (la, a), (lb, b) in zip(make_layouts((19, 45)), make_layouts((45, 23), seed=7), strict=True):
        c = tl.gemm.matmul(a, b, backend="cpp", version=version)
        assert_close(c, _expected(np.ascontiguousarray(a), np.ascontiguousarray(b)), msg=f"{la} @ {lb}")
    a, b = _pair(40, 30, 20)
    c = tl.gemm.matmul(b.T, a.T, backend="cpp", version=version)  # both transposed
    assert_close(c, _expected(b.T.copy(), a.T.copy()))


@needs_C
@pytest.mark.parametrize("isa", backends.load_C("gemm").isa_paths() if backends.C_available("gemm") else [])
@pytest.mark.parametrize("version", ["simd", "parallel"])
def test_every_isa_path(isa: str, version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TINYLEARN_CPU_FEATURES forces each micro-kernel this CPU can run (edge tiles included)."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", isa)
    g = backends.load_C("gemm")
    assert g.isa() == isa
    for dtype in ("float32", "float64"):
        a, b = _pair(101, 77, 67, dtype, seed=3)
        assert_close(tl.gemm.matmul(a, b, backend="cpp", version=version), _expected(a, b), reduction_size=77)


@needs_C
def test_forced_isa_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    g = backends.load_C("gemm")
    a, b = _pair(4, 4, 4)
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "sse9")
    with pytest.raises(ValueError, match="TINYLEARN_CPU_FEATURES='sse9'"):
        g.matmul(a, b, "simd")
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx512")  # a level: the best path at or below it
    assert g.isa() == g.isa_paths()[0]
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    assert g.isa() == "scalar"
    monkeypatch.delenv("TINYLEARN_CPU_FEATURES")
    if "avx512" not in g.isa_paths():
        with pytest.raises(ValueError, match="does not support avx512"):
            g.matmul(a, b, "simd", "avx512")


@needs_C
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_thread_counts(threads: int) -> None:
    """Threads split the row blocks; any count (more threads than blocks included) gives the same answer."""
    g = backends.load_C("gemm")
    for m in (5, 150, 301):
        a, b = _pair(m, 260, 41, seed=m)
        assert_close(g.matmul(a, b, "parallel", "auto", threads), _expected(a, b))


@needs_C
def test_empty_dims() -> None:
    for m, k, n in [(0, 3, 4), (3, 0, 4), (3, 4, 0)]:
        a, b = _pair(m, k, n)
        for v in tl.gemm.CPP_VERSIONS:
            c = tl.gemm.matmul(a, b, backend="cpp", version=v)
            assert c.shape == (m, n) and not c.any()


def test_numpy_and_numba_backends() -> None:
    a, b = _pair(33, 65, 17)
    assert_close(tl.gemm.matmul(a, b, backend="numpy"), _expected(a, b))
    if backends.numba_available():
        for dtype in ("float32", "float64"):
            a, b = _pair(70, 300, 33, dtype)
            c = tl.gemm.matmul(a.T.copy().T, b, backend="numba")
            assert c.dtype == a.dtype
            assert_close(c, _expected(a, b), reduction_size=300)


@needs_C
def test_default_backend_is_cpp_parallel() -> None:
    b, v, _ = backends.resolve("gemm.matmul", None, None, (np.zeros((2, 2), np.float32),) * 2)
    assert (b, v) == ("cpp", "parallel")


@needs_C
@pytest.mark.parametrize("m,k,mr", [(1, 1, 6), (7, 5, 6), (12, 3, 6), (33, 17, 4)])
def test_pack_a_matches_reference(m: int, k: int, mr: int) -> None:
    a, _ = _pair(m, k, 1)
    ref = tl.gemm.pack_a(a, mr)
    assert ref.shape == (-(-m // mr), k, mr)
    np.testing.assert_array_equal(backends.load_C("gemm").pack_a(a, mr), ref)
    np.testing.assert_array_equal(backends.load_C("gemm").pack_a(np.asfortranarray(a), mr), ref)
    assert ref[0, :, 0].tolist() == a[0].tolist()  # panel 0 column 0 = row 0 of A
    if m % mr:
        assert not ref[-1, :, m % mr :].any()  # zero padding


@needs_C
@pytest.mark.parametrize("k,n,nr", [(1, 1, 16), (5, 17, 16), (9, 32, 8), (4, 3, 16)])
def test_pack_b_matches_reference(k: int, n: int, nr: int) -> None:
    _, b = _pair(1, k, n)
    ref = tl.gemm.pack_b(b, nr)
    assert ref.shape == (-(-n // nr), k, nr)
    np.testing.assert_array_equal(backends.load_C("gemm").pack_b(b, nr), ref)
    np.testing.assert_array_equal(backends.load_C("gemm").pack_b(b[::-1][::-1], nr), ref)
    assert ref[0, 0, : min(nr, n)].tolist() == b[0, : min(nr, n)].tolist()


PACK_CASES = [(6, 8, 6), (12, 16, 6), (13, 21, 6), (6, 7, 6), (25, 67, 6), (8, 40, 8), (40, 9, 16), (37, 24, 32),
              (19, 33, 8), (5, 12, 4)]  # fmt: skip


@needs_C
@pytest.mark.parametrize("rows,k,w", PACK_CASES)
def test_transposing_packs_equal_the_scalar_ones(rows: int, k: int, w: int) -> None:
    """The AVX2 transposing packs (row-major A, column-major B such as W.T: 8x8 register transposes, partial panels
    and the last k % 8 by the scalar code) lay out exactly what the scalar packs do."""
    from tinylearn.cpu import cpu_features

    g = backends.load_C("gemm")
    a, _ = _pair(rows, k, 1)  # row-major [rows, k]
    bt = np.ascontiguousarray(_pair(rows, k, 1)[0]).T  # column-major [k, rows]
    if "avx2" not in cpu_features():
        with pytest.raises(ValueError, match="simd=True needs AVX2"):
            g.pack_a(a, w, simd=True)
        return
    np.testing.assert_array_equal(g.pack_a(a, w, simd=True), g.pack_a(a, w))
    np.testing.assert_array_equal(g.pack_b(bt, w, simd=True), g.pack_b(bt, w))
    np.testing.assert_array_equal(g.pack_b(bt, w, simd=True), tl.gemm.pack_b(bt, w))


@needs_C
@pytest.mark.parametrize("isa", ["avx2", "avx512", "scalar"])
def test_linear_layouts_through_the_packed_kernels(isa: str) -> None:
    """x @ W.T and g @ W as a Linear runs them (fp32 and bf16 widen), odd sizes and N < NR, against fp64."""
    import ml_dtypes

    from tinylearn.cpu import cpu_features

    if isa != "scalar" and {"avx2": "avx2", "avx512": "avx512f"}[isa] not in cpu_features():
        pytest.skip(f"{isa} not available on this CPU / TINYLEARN_CPU_FEATURES")
    g = backends.load_C("gemm")
    rng = np.random.default_rng(0)
    for m, k, n in [(256, 512, 10), (37, 29, 53), (64, 8, 16), (7, 300, 33), (300, 17, 100)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        ref = (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)
        assert_close(g.matmul(x, w.T, "parallel", isa), ref, reduction_size=k)
        xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
        got = g.bf16_matmul(xb.view(np.uint16), wb.view(np.uint16).T, out="float32", isa=isa, dot="widen")
        assert_close(got, (xb.astype(np.float64) @ wb.T.astype(np.float64)).astype(np.float32), reduction_size=k)


def test_numpy_blocked_and_packed_references() -> None:
    for m, k, n in [(1, 1, 1), (7, 33, 5), (65, 300, 130)]:
        a, b = _pair(m, k, n, "float64")
        assert_close(tl.gemm.blocked_matmul(a, b, mc=16, kc=32, nc=24), a @ b)
        assert_close(tl.gemm.packed_matmul(a, b, mr=6, nr=16), a @ b)


@needs_C
def test_kernel_shape() -> None:
    g = backends.load_C("gemm")
    s = g.kernel_shape("simd", "auto", "float32")
    assert s["MR"] == 6 and s["NR"] in (16, 32) and s["MC"] % s["MR"] == 0 and s["NC"] % s["NR"] == 0


# ---------------------------------------------------------------------------------------------------- roofline
def test_roofline_values() -> None:
    r = tl.gemm.roofline(flops=1e9, nbytes=1e9, peak_gflops=100.0, bandwidth_gbs=10.0)
    assert r == pytest.approx(
        {
            "intensity": 1.0,
            "attainable_gflops": 10.0,
            "bound": "memory",
            "ridge": 10.0,
            "time_s": 0.1,
            "advice": "raise arithmetic intensity (cache blocking / fusion)",
        }
    )
    r = tl.gemm.roofline(2 * 1024**3, 3 * 4 * 1024**2, peak_gflops=100.0, bandwidth_gbs=10.0)
    assert r["intensity"] == pytest.approx(2 * 1024 / 12) and r["bound"] == "compute"
    assert r["attainable_gflops"] == 100.0
    # exactly at the ridge point the two roofs meet: compute-bound by definition (not below the roof)
    assert tl.gemm.roofline(10.0, 1.0, 100.0, 10.0)["bound"] == "compute"
    flops, nbytes = tl.gemm.matmul_traffic(1024, 1024, 1024)
    assert flops == 2 * 1024**3 and nbytes == 4 * 4 * 1024**2  # A, B read; C read (write-allocate) and written
    assert tl.gemm.matmul_traffic(1024, 1024, 1024, write_allocate=False)[1] == 4 * 3 * 1024**2
    assert tl.gemm.matmul_traffic(2, 3, 5, itemsize=8) == (60.0, 8.0 * (10 + 15 + 12))


def test_roofline_advice_each_branch() -> None:
    """memory-bound -> raise intensity; compute-bound below NEAR_PEAK of the roof -> vectorise / ILP; else roof."""
    from tinylearn.bench.roofline import roofline as base_roofline
    from tinylearn.gemm.roofline import ADVICE, NEAR_PEAK, roofline_advice

    mem = tl.gemm.roofline(1e9, 1e9, 100.0, 10.0, achieved_gflops=9.0)  # intensity 1 < ridge 10
    assert mem["bound"] == "memory" and mem["advice"] == ADVICE["memory"] == (
        "raise arithmetic intensity (cache blocking / fusion)"
    )
    low = tl.gemm.roofline(1e9, 1e6, 100.0, 10.0, achieved_gflops=NEAR_PEAK * 100.0 - 1.0)  # 49 of 100 GFLOP/s
    assert low["bound"] == "compute" and low["advice"] == ADVICE["compute"] == "vectorise / add ILP (register blocking)"
    at = tl.gemm.roofline(1e9, 1e6, 100.0, 10.0, achieved_gflops=NEAR_PEAK * 100.0)  # the threshold counts as near
    assert at["advice"] == ADVICE["roof"] == "at the roof"
    assert tl.gemm.roofline(1e9, 1e6, 100.0, 10.0)["advice"] == "at the roof"  # no measurement: runs at its roof
    keys = {"intensity", "attainable_gflops", "bound", "ridge", "time_s"}
    assert set(low) == keys | {"advice"} and {k: low[k] for k in keys} == base_roofline(1e9, 1e6, 100.0, 10.0)
    with pytest.raises(ValueError, match="achieved_gflops"):
        tl.gemm.roofline(1e9, 1e6, 100.0, 10.0, achieved_gflops=-1.0)
    with pytest.raises(ValueError, match="bound"):
        roofline_advice("latency", 1.0, 1.0)


def test_tile_intensity() -> None:
    assert tl.gemm.tile_intensity(1, 1) == 0.25  # naive: one A and one B load per FMA
    assert tl.gemm.tile_intensity(6, 16) == pytest.approx(192 / 88)
    assert tl.gemm.tile_intensity(6, 16, itemsize=8) == pytest.approx(192 / 176)
    assert tl.gemm.tile_intensity(4, 4, c_in_registers=False) == pytest.approx(1 / 6)  # load B, load + store C
    # a bigger register tile never lowers the intensity
    assert tl.gemm.tile_intensity(8, 16) > tl.gemm.tile_intensity(6, 16) > tl.gemm.tile_intensity(4, 4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="mr"):
            tl.gemm.tile_intensity(bad, 4)  # type: ignore[arg-type]


def test_roofline_errors() -> None:
    with pytest.raises(ValueError, match="nbytes"):
        tl.gemm.roofline(1.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="flops"):
        tl.gemm.roofline(-1.0, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="peak_gflops"):
        tl.gemm.roofline(1.0, 1.0, "fast", 1.0)
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        tl.gemm.roofline(1.0, 1.0, 1.0, float("nan"))


@needs_C
def test_machine_peak_measured_and_cached() -> None:
    p = tl.gemm.machine_peak()
    assert set(p) >= {"gflops_fp32", "bandwidth_gbs", "cores", "isa"}
    assert p["gflops_fp32"] > 0 and p["bandwidth_gbs"] > 0 and p["cores"] >= 1
    assert p["isa"] in ("avx512", "avx2", "scalar")
    assert tl.gemm.machine_peak() is p  # cached: measured once per process
    r = tl.gemm.roofline(1.0, 1e6)
    assert r["ridge"] == pytest.approx(p["gflops_fp32"] / p["bandwidth_gbs"])


@needs_C
def test_fma_peak_counts_flops() -> None:
    """One thread's scalar FMA loop is slower than its vector loop (4-16x fewer FLOPs per instruction)."""
    g = backends.load_C("gemm")
    best = g.isa_paths()[0]
    vec = g.fma_peak(iters=2_000_000, threads=1, repeat=3, isa=best)
    sca = g.fma_peak(iters=2_000_000, threads=1, repeat=3, isa="scalar")
    assert vec["isa"] == best and sca["isa"] == "scalar"
    if best != "scalar":
        assert vec["gflops"] > 2 * sca["gflops"]
    with pytest.raises(ValueError, match="iters"):
        g.fma_peak(iters=0)


# -------------------------------------------------------------------------------------------------- bad input
def test_bad_input_messages() -> None:
    a, b = _pair(3, 4, 5)
    with pytest.raises(TypeError, match="a: must be a numpy.ndarray"):
        tl.gemm.matmul([[1.0]], b)
    with pytest.raises(TypeError, match="b: dtype must be float32 or float64, got int64"):
        tl.gemm.matmul(a, np.ones((4, 5), dtype=np.int64))
    with pytest.raises(TypeError, match="b: dtype float64 differs"):
        tl.gemm.matmul(a, b.astype(np.float64))
    with pytest.raises(ValueError, match=r"a: must be 2-D, got shape \(3,\)"):
        tl.gemm.matmul(np.ones(3, np.float32), b)
    with pytest.raises(ValueError, match=r"inner dimensions differ: a is \(3, 4\), b is \(5, 5\)"):
        tl.gemm.matmul(a, np.ones((5, 5), np.float32))
    with pytest.raises(ValueError, match="version"):
        tl.gemm.matmul(a, b, backend="cpp", version="turbo")
    with pytest.raises(ValueError, match="backend"):
        tl.gemm.matmul(a, b, backend="fortran")
    with pytest.raises(ValueError, match="mr"):
        tl.gemm.pack_a(a, 0)


@needs_C
def test_bad_input_in_cpp() -> None:
    g = backends.load_C("gemm")
    a, b = _pair(3, 4, 5)
    with pytest.raises(ValueError, match=r"inner dimensions differ: a is \(3, 4\), b is \(3, 4\)"):
        g.matmul(a, a, "simd")
    with pytest.raises(TypeError, match="b has dtype float64"):
        g.matmul(a, b.astype(np.float64), "simd")
    with pytest.raises(ValueError, match="version='fast'"):
        g.matmul(a, b, "fast")


@needs_C
def test_bench_table_has_every_rung() -> None:
    from tinylearn.gemm import bench

    (t,) = bench.run(sizes=[32])
    impls = {r.impl for r in t.rows}
    assert {f"cpp {v}" for v in tl.gemm.CPP_VERSIONS} | {"numpy", "numpy 1 thread", "torch", "tinygrad"} <= impls
    row = next(r for r in t.rows if r.impl == "cpp simd")
    assert row.gflops and row.gflops > 0 and row.ratio is not None and "% peak" in row.extra


def test_public_api_signatures() -> None:
    """The API as written in the issue / DESIGN.md (names, parameters, defaults)."""
    import inspect

    def params(f: object) -> dict:
        return {k: v.default for k, v in inspect.signature(f).parameters.items()}

    e = inspect._empty
    assert params(tl.gemm.matmul) == {"a": e, "b": e, "backend": None, "version": None}
    assert params(tl.gemm.versions) == {"backend": "cpp"}
    assert params(tl.gemm.machine_peak) == {}
    assert params(tl.gemm.roofline) == {
        "flops": e,
        "nbytes": e,
        "peak_gflops": None,
        "bandwidth_gbs": None,
        "achieved_gflops": None,
    }
    assert params(tl.gemm.occupancy) == {
        "threads_per_block": e,
        "registers_per_thread": e,
        "shared_bytes_per_block": e,
        "arch": "sm_80",
    }


# ---------------------------------------------------------------------------------------------- CUDA ladder replay
def test_wavefronts() -> None:
    from tinylearn.gemm import gpu_model

    assert gpu_model.wavefronts(np.arange(32)) == {"degree": 1, "wavefronts": 1, "ideal": 1}
    assert gpu_model.wavefronts(np.arange(32) * 32)["degree"] == 32
    # float4 per thread, consecutive: 4 phases of 8 threads, each covering 32 banks once
    assert gpu_model.wavefronts(np.arange(32) * 4, width=4) == {"degree": 1, "wavefronts": 4, "ideal": 4}
    # float4 with a 64-word stride: the 8 threads of a phase share 4 banks -> 8-way per phase
    assert gpu_model.wavefronts(np.arange(32) * 64, width=4)["degree"] == 8
    with pytest.raises(ValueError, match="width"):
        gpu_model.wavefronts(np.arange(32), width=3)


@pytest.mark.parametrize("kernel", ["naive", "smem", "regtile", "vec4"])
def test_trace_mirrors_current_sources(kernel: str) -> None:
    from tinylearn.gemm import cuda_trace

    present = cuda_trace.source_lines_present(kernel, Path(__file__).resolve().parents[2] / "cuda_src")
    assert present and all(present.values()), present


def test_trace_counts_before_and_after_the_fix() -> None:
    from tinylearn.gemm import cuda_trace

    before = {k: cuda_trace.trace(k, fixed=False) for k in cuda_trace.KERNELS}
    after = {k: cuda_trace.trace(k, fixed=True) for k in cuda_trace.KERNELS}
    assert before["regtile"]["As store"]["degree"] == 16  # m in {0,1} x k in 0..15, 64-word rows: banks 0 and 1
    assert before["regtile"]["Bs read"]["degree"] == 2  # columns 4*tx + j: tx and tx + 8 share a bank
    assert before["vec4"]["As store"]["degree"] == 4
    assert before["regtile"]["C store"]["efficiency"] == 0.25
    for k in cuda_trace.KERNELS:
        assert all(r["degree"] == 1 for r in after[k].values() if r["space"] == "shared"), k
        assert all(r["efficiency"] == 1.0 for n_, r in after[k].items() if n_ in ("B load", "C store")), k
    assert after["smem"] == before["smem"] and after["naive"] == before["naive"]  # untouched kernels
    with pytest.raises(ValueError, match="kernel"):
        cuda_trace.trace("tensorcore")


@pytest.mark.parametrize("kernel", ["regtile", "vec4"])
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("shape", [(1, 4, 4), (70, 36, 68), (64, 16, 64), (5, 20, 132)])
def test_emulated_kernels_match_numpy(kernel: str, fixed: bool, shape: tuple[int, int, int]) -> None:
    from tinylearn.gemm import cuda_trace

    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    assert_close(cuda_trace.emulate(kernel, a, b, fixed), a.astype(np.float64) @ b, dtype="float32", reduction_size=k)


def test_emulate_rejects_bad_input() -> None:
    from tinylearn.gemm import cuda_trace

    with pytest.raises(ValueError, match="K % 4"):
        cuda_trace.emulate("vec4", np.ones((4, 3), np.float32), np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match="kernel"):
        cuda_trace.emulate("naive", np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))


def test_regtile_emulation_would_catch_a_wrong_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading B with the old column mapping while storing C with the new one gives a wrong product."""
    from tinylearn.gemm import cuda_trace

    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (64, 16)).astype(np.float32)
    b = rng.uniform(-1, 1, (16, 64)).astype(np.float32)
    orig = cuda_trace.accesses

    def swapped(kernel: str, fixed: bool = True, *args: int) -> list:
        old = {x.name: x for x in orig(kernel, not fixed, *args)}
        return [old["Bs read"] if x.name == "Bs read" else x for x in orig(kernel, fixed, *args)]

    assert np.allclose(cuda_trace.emulate("regtile", a, b), a @ b, atol=1e-4)
    monkeypatch.setattr(cuda_trace, "accesses", swapped)
    assert not np.allclose(cuda_trace.emulate("regtile", a, b), a @ b, atol=1e-2)


# ---------------------------------------------------------------- the cache simulator of notebook 08 §1b (Q11)
def test_cache_sim_lru_set_associative() -> None:
    from tinylearn.gemm.cache_sim import CacheSim

    c = CacheSim(256, line_bytes=64, ways=2)  # 2 sets of 2 lines
    assert c.n_sets == 2
    assert [c.access(a) for a in (0, 8, 64)] == [False, True, False]  # 0 and 8 share a line; 64 is set 1
    assert [c.access(a) for a in (128, 256, 0)] == [False, False, False]  # set 0 holds 2 lines: 0 was evicted (LRU)
    assert c.access(256) and c.misses == 5 and c.accesses == 7
    for bad in ({"size_bytes": 0}, {"size_bytes": 256, "line_bytes": 48}, {"size_bytes": 200}):
        with pytest.raises(ValueError):
            CacheSim(**bad)


def test_cache_sim_matmul_orders() -> None:
    from tinylearn.gemm import cache_sim

    n = 16
    for o in cache_sim.ORDERS:
        trace = list(cache_sim.matmul_trace(n, o, tile=4))
        assert len(trace) == 3 * n**3 and len(set(trace)) == 3 * n * n  # every element of A, B, C, each order
    big = cache_sim.simulate_matmul(n, "ijk", 1 << 16)  # everything fits: only compulsory misses
    assert big["misses"] == cache_sim.compulsory_misses(n) == 3 * n * n * 4 // 64
    small = {o: cache_sim.simulate_matmul(32, o, 2048, tile=8)["misses"] for o in cache_sim.ORDERS}
    assert small["ijk"] > small["ikj"] > small["tiled"]
    with pytest.raises(ValueError, match="order"):
        list(cache_sim.matmul_trace(4, "kji"))
