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
