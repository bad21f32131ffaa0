"""tinylearn.kernels.traffic: bytes/FLOPs bookkeeping and roofline predictions."""

from __future__ import annotations

import pytest

from tinylearn.kernels import traffic


def test_softmax_counts() -> None:
    t = traffic.softmax_traffic(10, 100, itemsize=4)
    n = 1000
    # max (1 read), sub (r+w), exp (r+w), sum (1 read), div (r+w) + 2 row outputs
    assert t.bytes_unfused == (8 * n + 2 * 10) * 4
    assert t.bytes_fused == 2 * n * 4
    assert t.flops == 5 * n
    assert t.byte_ratio == pytest.approx(4.01)


def test_layer_norm_and_gelu_ratios() -> None:
    ln = traffic.layer_norm_traffic(4096, 768)
    gl = traffic.bias_gelu_traffic(4096, 768)
    assert 5.5 < ln.byte_ratio < 6.1  # 12 full-size passes vs 2
    assert 6.4 < gl.byte_ratio < 6.6  # 13 vs 2
    assert gl.intensity_fused > gl.intensity_unfused


def test_attention_flash_moves_fewer_bytes_and_scales_linearly() -> None:
    a1 = traffic.attention_traffic(8, 1024, 64)
    a2 = traffic.attention_traffic(8, 2048, 64)
    assert a1.bytes_fused < a1.bytes_unfused
    assert a2.bytes_unfused / a1.bytes_unfused == pytest.approx(4, rel=0.1)  # naive ~ N^2
    assert a2.flops / a1.flops == pytest.approx(4, rel=1e-6)
    c = traffic.attention_traffic(8, 1024, 64, causal=True)
    assert c.flops == pytest.approx(a1.flops / 2)


def test_roofline_time() -> None:
    assert traffic.roofline_time(1e9, 1e6, peak_gflops=100, bandwidth_gbs=10) == pytest.approx(0.1)
    assert traffic.roofline_time(1e3, 1e12, peak_gflops=100, bandwidth_gbs=10) == pytest.approx(10)
    p = traffic.predict(traffic.softmax_traffic(4096, 4096), 100, 10)
    assert p["unfused_s"] / p["fused_s"] == pytest.approx(traffic.softmax_traffic(4096, 4096).byte_ratio)
    with pytest.raises(ValueError, match="bandwidth"):
        traffic.roofline_time(1, 1, 1, 0)
    with pytest.raises(ValueError, match="rows"):
        traffic.softmax_traffic(0, 5)
