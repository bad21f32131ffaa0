"""tinylearn.dist.xor_coding (pairwise XOR at a relay, Q209) and tinylearn.dist.multihop_chunks (per-level chunk
sizes on NVLink / PCIe / Ethernet paths, Q192)."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.dist.multihop_chunks import Hop, adaptive_chunks, pipeline_time
from tinylearn.dist.xor_coding import (
    plan_xor_pairs,
    recursive_doubling_demands,
    relay_exchange,
    xor_bytes,
)

# ------------------------------------------------------------------------------------------------ xor_coding


def test_xor_bytes_pads_and_is_its_own_inverse() -> None:
    a, b = b"\x01\x02\x03", b"\xff"
    assert xor_bytes(a, b) == b"\xfe\x02\x03"
    assert xor_bytes(xor_bytes(a, b), b)[: len(a)] == a
    assert xor_bytes(b"", b"") == b""


def test_xor_bytes_rejects_non_bytes() -> None:
    with pytest.raises(ValueError, match="a: expected bytes"):
        xor_bytes("abc", b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="b: expected bytes"):
        xor_bytes(b"x", [1])  # type: ignore[arg-type]


def test_two_way_relay_needs_one_broadcast() -> None:
    wants, has = [(0, 1), (1, 0)], {0: {0}, 1: {1}}
    assert plan_xor_pairs(wants, has) == [(1, 0)]
    payloads = {0: b"gradient block a", 1: b"b, a bit longer than a"}
    res = relay_exchange(payloads, wants, has)
    assert res.decoded == {(0, 1): payloads[1], (1, 0): payloads[0]}
    assert res.broadcasts == 1 and res.bytes_down == len(payloads[1]) and res.unicasts_needed == 2
    plain = relay_exchange(payloads, wants, has, coded=False)
    assert plain.decoded == res.decoded and plain.broadcasts == 2


def test_no_pairing_without_side_information() -> None:
    # receiver 2 wants 0 but does not hold 1: 0 and 1 cannot share a broadcast
    wants, has = [(0, 1), (1, 0), (2, 0)], {0: {0}, 1: {1}, 2: set()}
    assert plan_xor_pairs(wants, has) == [(1,), (0,)]


def test_recursive_doubling_rounds_halve_the_downlink() -> None:
    rng = np.random.default_rng(0)
    p = 8
    for k in range(3):
        wants, has = recursive_doubling_demands(p, k)
        payloads = {r: rng.integers(0, 256, 100 + 7 * r, dtype=np.uint8).tobytes() for r in range(p)}
        res = relay_exchange(payloads, wants, has)
        assert res.broadcasts == p // 2
        assert all(res.decoded[r, x] == payloads[x] for r, x in wants)


def test_relay_bad_input() -> None:
    with pytest.raises(ValueError, match="already holds"):
        plan_xor_pairs([(0, 0)], {0: {0}})
    with pytest.raises(ValueError, match="receiver 5"):
        plan_xor_pairs([(5, 0)], {0: {0}})
    with pytest.raises(ValueError, match="wants: expected"):
        plan_xor_pairs([(0, 1, 2)], {0: set()})  # type: ignore[list-item]
    with pytest.raises(ValueError, match="payloads: no payload for wanted message 1"):
        relay_exchange({0: b"a"}, [(0, 1)], {0: {0}})
    with pytest.raises(ValueError, match="payloads: message 1 is str"):
        relay_exchange({1: "text"}, [(0, 1)], {0: {0}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="world_size"):
        recursive_doubling_demands(6, 0)
    with pytest.raises(ValueError, match="round_"):
        recursive_doubling_demands(8, 3)


# ------------------------------------------------------------------------------------------------ multihop_chunks

PATH = [
    Hop("NVLink", 2e-6, 1 / 150e9),
    Hop("PCIe", 5e-6, 1 / 25e9),
    Hop("Ethernet", 25e-6, 1 / 12.5e9),
    Hop("PCIe", 5e-6, 1 / 25e9),
    Hop("NVLink", 2e-6, 1 / 150e9),
]


def test_pipeline_time_closed_forms() -> None:
    h = [Hop("a", 1.0, 0.5), Hop("b", 2.0, 0.25)]
    # one chunk: store and forward, alphas and all bytes of every hop add up
    assert pipeline_time(8, h, 8) == pytest.approx(1 + 4 + 2 + 2)
    # equal chunks of 4: hop a 3, 6; hop b starts at 3 -> 6, then max(6, 6) -> 9
    assert pipeline_time(8, h, [4, 4]) == pytest.approx(9.0)
    # one hop: m chunks cost m (alpha + c beta)
    assert pipeline_time(10, [Hop("x", 1.0, 0.1)], 3) == pytest.approx(4 * 1.0 + 10 * 0.1)


def test_pipeline_time_fan_in_multiplies_the_bytes() -> None:
    one = pipeline_time(100, [Hop("x", 0.0, 1.0), Hop("y", 0.0, 1.0)], 100)
    four = pipeline_time(100, [Hop("x", 0.0, 1.0), Hop("y", 0.0, 1.0, fan_in=4)], 400)
    assert one == pytest.approx(200.0) and four == pytest.approx(100 + 400)


def test_adaptive_chunks_near_or_better_than_every_fixed_size() -> None:
    for n in (1 << 20, 1 << 24):
        ad = pipeline_time(n, PATH, adaptive_chunks(n, PATH))
        fixed = [pipeline_time(n, PATH, 1 << k) for k in range(12, 27)]
        assert ad <= 1.02 * min(fixed) and max(fixed) > 20 * ad
    assert adaptive_chunks(1000, [Hop("x", 1e-6, 1e-9)]) == [1000]  # one hop: no pipelining, one message


def test_adaptive_chunks_divide_the_bottleneck_chunk() -> None:
    cs = adaptive_chunks(1 << 26, PATH)
    assert cs[2] == max(cs) and all(-(-cs[2] // c) * c - cs[2] < -(-cs[2] // c) for c in cs)


def test_multihop_bad_input() -> None:
    with pytest.raises(ValueError, match="alpha_s"):
        Hop("x", -1.0, 1e-9)
    with pytest.raises(ValueError, match="beta_s_per_byte"):
        Hop("x", 1e-6, 0.0)
    with pytest.raises(ValueError, match="fan_in"):
        Hop("x", 1e-6, 1e-9, fan_in=0)
    with pytest.raises(ValueError, match="nbytes"):
        pipeline_time(0, PATH, 4096)
    with pytest.raises(ValueError, match="hops"):
        pipeline_time(10, [], 4096)
    with pytest.raises(ValueError, match="chunks: expected 5"):
        pipeline_time(10, PATH, [4096, 4096])
    with pytest.raises(ValueError, match="chunks: expected ints >= 1"):
        pipeline_time(10, PATH, 0)
    with pytest.raises(ValueError, match="overhead"):
        adaptive_chunks(10, PATH, overhead=1.5)
