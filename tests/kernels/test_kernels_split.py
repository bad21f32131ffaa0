"""tinylearn.kernels.fusion_split: the register-pressure split model, the linear scan, the DP optimum."""

import pytest

import tinylearn as tl
from tinylearn.gemm.occupancy import occupancy
from tinylearn.kernels.fusion_split import (
    MAX_REGS,
    Machine,
    Stage,
    choose_split,
    exhaustive_split,
    linear_scan,
    optimal_split,
    register_caps,
    segment_regs,
    segment_time,
    split_time,
)

CHAIN = [
    Stage("bias+GELU", 24, 20, 4),
    Stage("dropout", 40, 30, 4),
    Stage("residual", 16, 1, 4),
    Stage("layernorm", 48, 10, 4),
    Stage("scale", 32, 8, 4),
    Stage("exp", 40, 24, 4),
    Stage("quant", 40, 12, 1),
]
N = 1 << 24


def test_exported_from_kernels():
    assert tl.kernels.fusion_split.choose_split is choose_split


def test_segment_regs_and_time_follow_the_model():
    assert segment_regs(CHAIN[:2], base_regs=16) == 16 + 24 + 40
    m = Machine()
    seg = segment_time(CHAIN[:2], N, 4.0, m, base_regs=16)
    occ = occupancy(256, 80, 0, arch="sm_80")["occupancy"]
    assert seg["regs"] == 80 and seg["occupancy"] == occ and seg["efficiency"] == min(1.0, occ / 0.5)
    assert seg["bytes"] == N * (4 + 4) and seg["flops"] == N * 50 and seg["spill_bytes"] == 0
    expected = max(N * 50 / m.peak_flops, N * 8 / m.bandwidth) / seg["efficiency"] + m.launch_s
    assert seg["time_s"] == pytest.approx(expected, rel=1e-12)


def test_spills_above_255_registers():
    seg = segment_time(CHAIN, N, 4.0)
    assert seg["regs"] == 16 + 240 and seg["spill_bytes"] == N * 2 * 4 * (256 - MAX_REGS)


def test_split_time_sums_segments_and_passes_intermediates():
    r = split_time(CHAIN, [2, 5], N, 4.0)
    assert r["kernels"] == 3 and r["cuts"] == [2, 5]
    assert r["time_s"] == pytest.approx(sum(s["time_s"] for s in r["segments"]))
    assert r["segments"][1]["bytes"] == N * (CHAIN[1].out_bytes + CHAIN[4].out_bytes)
    assert r["segments"][2]["bytes"] == N * (CHAIN[4].out_bytes + CHAIN[6].out_bytes)


def test_register_caps_are_the_occupancy_cliffs():
    caps = register_caps()
    assert caps == [32, 40, 48, 64, 80, 128, 255]
    for c in caps[:-1]:
        assert occupancy(256, c + 1, 0)["occupancy"] < occupancy(256, c, 0)["occupancy"]


def test_linear_scan_cuts_at_the_cap():
    assert linear_scan(CHAIN, 255) == [6]  # 16 + 216 = 232 fits, + quant's 40 does not
    assert linear_scan(CHAIN, 1) == [1, 2, 3, 4, 5, 6]  # every stage alone
    assert linear_scan(CHAIN, 80) == [2, 4, 5, 6]
    for cap in (64, 80, 128, 255):
        cuts = linear_scan(CHAIN, cap)
        bounds = [0, *cuts, len(CHAIN)]
        assert all(segment_regs(CHAIN[a:b]) <= cap for a, b in zip(bounds[:-1], bounds[1:]))


def test_choose_split_beats_no_split_and_all_split_and_dp_is_optimal():
    r = choose_split(CHAIN, N, 4.0)
    none = split_time(CHAIN, [], N, 4.0)["time_s"]
    every = split_time(CHAIN, list(range(1, len(CHAIN))), N, 4.0)["time_s"]
    assert r["time_s"] < none and r["time_s"] < every
    assert r["time_s"] == min(t for _, t in r["candidates"].values())
    opt, ex = optimal_split(CHAIN, N, 4.0), exhaustive_split(CHAIN, N, 4.0)
    assert opt["cuts"] == ex["cuts"] and opt["time_s"] == pytest.approx(ex["time_s"])
    assert opt["time_s"] <= r["time_s"]


def test_small_chain_needs_no_split():
    light = [Stage("a", 8, 4, 4), Stage("b", 8, 4, 4)]
    r = choose_split(light, N, 4.0)
    assert r["cuts"] == [] and optimal_split(light, N, 4.0)["cuts"] == []


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"name": "x", "regs": -1, "flops": 1, "out_bytes": 4}, "regs"),
        ({"name": "x", "regs": 1.5, "flops": 1, "out_bytes": 4}, "regs"),
        ({"name": "x", "regs": 1, "flops": -1, "out_bytes": 4}, "flops"),
        ({"name": "x", "regs": 1, "flops": 1, "out_bytes": float("nan")}, "out_bytes"),
    ],
)
def test_stage_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Stage(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"arch": "sm_00"}, "arch"),
        ({"bandwidth": 0}, "bandwidth"),
        ({"launch_s": -1}, "launch_s"),
        ({"saturation": 0}, "saturation"),
        ({"peak_flops": "x"}, "peak_flops"),
    ],
)
def test_machine_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Machine(**kwargs)


def test_function_bad_input():
    with pytest.raises(ValueError, match="stages"):
        choose_split([], N, 4.0)
    with pytest.raises(ValueError, match=r"stages\[0\]"):
        choose_split(["x"], N, 4.0)
    with pytest.raises(ValueError, match="n"):
        segment_time(CHAIN, 0, 4.0)
    with pytest.raises(ValueError, match="in_bytes"):
        split_time(CHAIN, [], N, -1)
    with pytest.raises(ValueError, match="base_regs"):
        segment_time(CHAIN, N, 4.0, base_regs=0)
    with pytest.raises(ValueError, match="cuts"):
        split_time(CHAIN, [3, 2], N, 4.0)
    with pytest.raises(ValueError, match="cuts"):
        split_time(CHAIN, [0], N, 4.0)
    with pytest.raises(ValueError, match="cuts"):
        split_time(CHAIN, [7], N, 4.0)
    with pytest.raises(ValueError, match="cap"):
        linear_scan(CHAIN, 0)
    with pytest.raises(ValueError, match="max_stages"):
        exhaustive_split(CHAIN, N, 4.0, max_stages=3)
    with pytest.raises(ValueError, match="cannot launch"):
        segment_time([Stage("a", 100, 1, 4)], N, 4.0, Machine(threads=1024))
