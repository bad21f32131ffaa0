"""tinylearn.bench.roofline: the measured clock and the theoretical-peak bound built from it."""

from __future__ import annotations

import pytest

from tinylearn import backends
from tinylearn.bench import roofline

needs_C = pytest.mark.skipif(not backends.C_available("machine"), reason="tinylearn._C machine kernels not built")


@needs_C
def test_measured_ghz_is_a_plausible_clock() -> None:
    ghz = roofline.measured_ghz()
    # A folded chain (compiler turned n adds into one) would read as thousands of GHz; a broken timer as ~0.
    assert ghz is not None and 0.5 < ghz < 7.0, ghz


@needs_C
def test_add_chain_rejects_bad_input() -> None:
    machine = backends.load_C("machine")
    assert machine.add_chain(8000) > 0
    with pytest.raises(ValueError, match="n must be >= 8"):
        machine.add_chain(4)
    with pytest.raises(ValueError, match="runs"):
        roofline.measured_ghz(runs=0)
    with pytest.raises(ValueError, match="n: chain length"):
        roofline.measured_ghz(n=10)
    with pytest.raises(ValueError, match="ghz"):
        roofline.theoretical_peak_gflops(ghz=-1.0)


def _peak_with(monkeypatch: pytest.MonkeyPatch, nominal: float | None, measured: float | None) -> roofline.Peak:
    monkeypatch.setattr(roofline, "cpu_ghz", lambda: nominal)
    monkeypatch.setattr(roofline, "measured_ghz", lambda: measured)
    return roofline.theoretical_peak_gflops(cores=4)


def test_turbo_raises_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _peak_with(monkeypatch, 2.0, None)
    turbo = _peak_with(monkeypatch, 2.0, 3.5)
    assert turbo.details["ghz"] == 3.5 and turbo.details["nominal_ghz"] == 2.0
    assert turbo.gflops == pytest.approx(base.gflops * 3.5 / 2.0)


def test_slow_measurement_never_lowers_the_bound_below_nominal(monkeypatch: pytest.MonkeyPatch) -> None:
    preempted = _peak_with(monkeypatch, 2.6, 0.9)  # a run that shared its core reads as a slow clock
    assert preempted.details["ghz"] == 2.6 and preempted.details["measured_ghz"] == 0.9
    assert preempted.gflops == pytest.approx(_peak_with(monkeypatch, 2.6, None).gflops)


def test_clock_fallbacks_and_explicit_ghz(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _peak_with(monkeypatch, None, 3.1).details["ghz"] == 3.1  # no /proc/cpuinfo clock (e.g. some VMs)
    assert _peak_with(monkeypatch, None, None).details["ghz"] == 2.0  # nothing known: documented default
    monkeypatch.setattr(roofline, "measured_ghz", lambda: 9.0)
    assert roofline.theoretical_peak_gflops(cores=1, ghz=1.5).details["ghz"] == 1.5  # explicit wins


def test_bound_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _peak_with(monkeypatch, 3.0, None)
    d = p.details
    assert p.gflops == pytest.approx(4 * 3.0 * d["fma_units"] * d["lanes"] * 2)
    assert d["lanes"] in (4, 8, 16)


@needs_C
def test_measured_sgemm_stays_below_the_bound() -> None:
    # The claim notebooks/00_tour asserts: a real measurement is under cores x clock x FMA x lanes x 2.
    peak = roofline.peak_gflops(n=256, repeat=2)
    assert peak.gflops <= roofline.theoretical_peak_gflops().gflops * 1.05


def test_roofline_plot_labels() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [("a n=64", 5.0, 10.0), ("b n=64", 5.0, 2.0)]
    fig, ax = plt.subplots()
    roofline.roofline_plot(ax, 100.0, 10.0, pts)
    assert [t.get_text() for t in ax.texts if t.get_text().startswith(("a", "b"))] == ["a n=64", "b n=64"]
    fig2, ax2 = plt.subplots()
    roofline.roofline_plot(ax2, 100.0, 10.0, pts, labels="legend")
    assert [t.get_text() for t in ax2.get_legend().get_texts()] == ["roofline", "a n=64", "b n=64"]
    with pytest.raises(ValueError, match="labels"):
        roofline.roofline_plot(ax2, 100.0, 10.0, pts, labels="both")
    plt.close(fig)
    plt.close(fig2)


# MACs one instruction of each kind performs (vfmadd231ps ymm 8, zmm 16; vpmaddwd 16; vpmaddubsw 32; vpdpbusd 64);
# the mixed kinds: (6 x 16 + 4 x 8) MACs per 16 instructions and (8 x 16 + 4 x 8) per 20 = 8 per instruction
_MACS_PER_INSTR = {
    "fp32_fma_ymm": 8,
    "int8_madd16_ymm": 8,  # vpmaddwd + vpaddd: 16 per 2 instructions
    "int8_u7_ymm": 32 / 3,  # vpmaddubsw + vpmaddwd + vpaddd
    "int8_wino_ymm": 8,  # 2 vpaddw + vpmaddwd + vpaddd: 32 per 4 instructions
    "int8_madd16+fp32_fma_ymm": 8,
    "int8_madd16x2+fp32_fma_ymm": 8,  # (8 x 16 + 4 x 8) MACs per 20 instructions
    "fp32_fma_zmm": 16,
    "int8_vnni_zmm": 64,
}
_NEEDS = {
    "fp32_fma_ymm": {"avx2", "fma"},
    "int8_madd16_ymm": {"avx2"},
    "int8_u7_ymm": {"avx2"},
    "int8_wino_ymm": {"avx2"},
    "int8_madd16+fp32_fma_ymm": {"avx2", "fma"},
    "int8_madd16x2+fp32_fma_ymm": {"avx2", "fma"},
    "fp32_fma_zmm": {"avx512f"},
    "int8_vnni_zmm": {"avx512f", "avx512_vnni"},
}


@needs_C
def test_mac_rate_runs_every_instruction_it_counts() -> None:
    """Each kind's rate is positive and below what a core could issue: at most 4 vector instructions per cycle at the
    measured clock (+30% for turbo drift). A loop that skipped instructions would read faster than that."""
    machine = backends.load_C("machine")
    assert sorted(machine.mac_kinds()) == sorted(_MACS_PER_INSTR)
    ghz = roofline.measured_ghz(runs=5) or 5.0
    flags = roofline.cpu_flags()
    for kind, per_instr in _MACS_PER_INSTR.items():
        if _NEEDS[kind] <= flags:
            rate = machine.mac_rate(kind, 2000) / 1e9
            assert 0.05 < rate < per_instr * 4 * ghz * 1.3, (kind, rate, ghz)
        else:
            with pytest.raises(ValueError, match=f"'{kind}' needs"):
                machine.mac_rate(kind, 10)
    with pytest.raises(ValueError, match="kind must be one of"):
        machine.mac_rate("fp64", 10)
    with pytest.raises(ValueError, match="trips must be >= 1"):
        machine.mac_rate("fp32_fma_ymm", 0)


@needs_C
def test_mac_ceilings_and_the_int8_ratio() -> None:
    ceil = roofline.mac_ceilings(trips=2000, runs=2)
    assert ceil is not None
    flags = roofline.cpu_flags()
    assert set(ceil) == {k for k, need in _NEEDS.items() if need <= flags}
    if {"avx2", "fma"} <= flags:
        ratio, ki, kf = roofline.int8_ceiling_ratio(ceil)
        assert ki.startswith("int8_") and "fp32" not in ki and kf.startswith("fp32_")
        assert ratio == pytest.approx(ceil[ki] / ceil[kf])
        mix, km, kf2 = roofline.mix_ceiling_ratio(ceil)
        assert "fp32" in km and kf2 == kf and mix == pytest.approx(ceil[km] / ceil[kf])
    with pytest.raises(ValueError, match="trips/runs"):
        roofline.mac_ceilings(trips=0)


def test_int8_ceiling_ratio_arithmetic() -> None:
    got = roofline.int8_ceiling_ratio(
        {"fp32_fma_ymm": 50.0, "int8_madd16_ymm": 52.0, "int8_u7_ymm": 51.0, "int8_madd16+fp32_fma_ymm": 65.0}
    )
    assert got == (pytest.approx(52.0 / 50.0), "int8_madd16_ymm", "fp32_fma_ymm")  # the mix is not a kernel here
    with pytest.raises(ValueError, match="need an fp32_"):
        roofline.int8_ceiling_ratio({"int8_u7_ymm": 1.0})
    mixes = {"fp32_fma_ymm": 50.0, "int8_madd16_ymm": 52.0, "int8_madd16+fp32_fma_ymm": 55.0}
    got = roofline.mix_ceiling_ratio({**mixes, "int8_madd16x2+fp32_fma_ymm": 60.0, "fp32_fma_zmm": 40.0})
    assert got == (pytest.approx(60.0 / 50.0), "int8_madd16x2+fp32_fma_ymm", "fp32_fma_ymm")
    with pytest.raises(ValueError, match="mixed"):
        roofline.mix_ceiling_ratio({"fp32_fma_ymm": 50.0, "int8_madd16_ymm": 52.0})
