"""Codec selection, parity repair, importance-ordered sends, recovering top-k, 2-bit + adaptive error feedback
(tinylearn.dist.codec_select / parity / importance / topk_recovery / feedback, compression.TwoBit)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tinylearn.dist.codec_select import CodecCost, CodecSelector, codec_rel_error, default_codecs, simulate_selection
from tinylearn.dist.compression import ClippedLowBit, TwoBit, compressed_all_reduce, error_feedback_step
from tinylearn.dist.feedback import AdaptiveGamma, ef_quadratic
from tinylearn.dist.importance import budgeted_sgd, importance, send_order, within_budget
from tinylearn.dist.parity import check_parity, encode_parity, recover_parity, to_bytes
from tinylearn.dist.topk_recovery import RecoveringTopK, topk_staleness

# ---------------------------------------------------------------- codec selection


def test_codec_cost_wire_bytes_and_prediction_by_hand() -> None:
    ring = CodecCost("fp16", 2.0, True, 1e-9, 2e-9)
    gather = CodecCost("int8", 1.0, False, 1e-9, 2e-9)
    assert ring.wire_bytes(1000, 4) == 2 * 3 / 4 * 2000
    assert gather.wire_bytes(1000, 4) == 3 * 1000
    assert ring.wire_bytes(1000, 1) == 0 and gather.wire_bytes(1000, 1) == 0
    # encode + decode (x p when gathered) + exposed part of alpha + bytes / bw
    assert ring.predict(1000, 4, 1e6, alpha_s=1e-3) == pytest.approx(1e-6 + 2e-6 + 1e-3 + 3000 / 1e6)
    assert gather.predict(1000, 4, 1e6, alpha_s=1e-3) == pytest.approx(1e-6 + 4 * 2e-6 + 1e-3 + 3000 / 1e6)
    assert ring.predict(1000, 4, 1e6, overlap_s=10.0) == pytest.approx(3e-6)  # communication fully hidden
    assert ring.predict(1000, 4, 1e6, overlap_s=1e-3) == pytest.approx(3e-6 + 2e-3)


def test_selector_picks_argmin_and_hysteresis_holds_then_switches() -> None:
    a = CodecCost("a", 4.0, True)  # fast link: no encode cost
    b = CodecCost("b", 1.0, True, encode_s_per_elem=1e-3)
    sel = CodecSelector([a, b], numel=100, world_size=2, hysteresis=0.2, smoothing=1.0, initial_bandwidth=1e6)
    pred = sel.predict()
    assert pred == {"a": pytest.approx(400 / 1e6), "b": pytest.approx(0.1 + 100 / 1e6)}
    assert sel.choose() == "a" and sel.switches == 0
    # at 2500 B/s: a = 0.16 s, b = 0.14 s: b faster by 12.5% < 20%: stay on a
    assert sel.observe(1000, 0.4) == pytest.approx(2500)
    assert sel.choose() == "a" and sel.switches == 0
    # at 1000 B/s: a = 0.4, b = 0.2: switch
    sel.observe(1000, 1.0)
    assert sel.choose() == "b" and sel.switches == 1
    sel2 = CodecSelector([a, b], 100, 2, smoothing=0.25, initial_bandwidth=1000.0)
    assert sel2.observe(300, 0.1) == pytest.approx(0.75 * 1000 + 0.25 * 3000)


def test_selector_error_constraint_and_simulation() -> None:
    codecs = default_codecs(topk_ratio=0.01)
    assert [c.name for c in codecs] == ["none", "fp16", "int8", "topk"]
    sel = CodecSelector(codecs, 10**6, 2, max_error=0.05)
    assert [c.name for c in sel.allowed] == ["none", "fp16", "int8"]
    with pytest.raises(ValueError, match="name"):
        sel.wire_bytes("topk")
    # constant bandwidth: always the true best, no switches after the first choice
    sel = CodecSelector(codecs, 10**6, 2, overlap_s=1e-4, initial_bandwidth=5e8)
    r = simulate_selection(sel, [5e8] * 10)
    assert r["codec"] == r["best"] and sel.switches == 0
    assert r["time"] == r["best_time"]
    # a drop in bandwidth: the selector follows after the estimate has moved
    sel = CodecSelector(codecs, 10**6, 2, overlap_s=1e-4, initial_bandwidth=1e11, hysteresis=0.1)
    r = simulate_selection(sel, [1e11] * 5 + [1e8] * 10)
    assert r["codec"][0] == "none" and r["codec"][-1] == "topk" and sel.switches >= 1


def test_codec_rel_error_oracles() -> None:
    g = torch.tensor([3.0, 4.0])
    assert codec_rel_error("none", g) == 0.0
    assert codec_rel_error("fp16", g) == 0.0  # exactly representable
    assert codec_rel_error("topk", g, topk_ratio=0.5) == pytest.approx(0.6)  # keeps 4, drops 3: 3/5
    assert codec_rel_error("int8", torch.tensor([127.0, -1.0, 0.0])) == 0.0  # scale 1: exact codes
    with pytest.raises(ValueError, match="name"):
        codec_rel_error("int4", g)
    with pytest.raises(ValueError, match="grad"):
        codec_rel_error("fp16", torch.zeros(3))


def test_codec_select_bad_input() -> None:
    with pytest.raises(ValueError, match="bytes_per_elem"):
        CodecCost("x", 0.0, True)
    with pytest.raises(ValueError, match="rel_error"):
        CodecCost("x", 1.0, True, rel_error=-1.0)
    with pytest.raises(ValueError, match="name"):
        CodecCost("", 1.0, True)
    c = CodecCost("x", 1.0, True)
    with pytest.raises(ValueError, match="bandwidth"):
        c.predict(10, 2, 0.0)
    with pytest.raises(ValueError, match="overlap_s"):
        c.predict(10, 2, 1.0, overlap_s=-1.0)
    with pytest.raises(ValueError, match="codecs"):
        CodecSelector([], 10, 2)
    with pytest.raises(ValueError, match="codecs"):
        CodecSelector([c, c], 10, 2)
    with pytest.raises(ValueError, match="numel"):
        CodecSelector([c], 0, 2)
    with pytest.raises(ValueError, match="world_size"):
        CodecSelector([c], 10, 0)
    with pytest.raises(ValueError, match="hysteresis"):
        CodecSelector([c], 10, 2, hysteresis=1.0)
    with pytest.raises(ValueError, match="smoothing"):
        CodecSelector([c], 10, 2, smoothing=0.0)
    with pytest.raises(ValueError, match="max_error"):
        CodecSelector([CodecCost("x", 1.0, True, rel_error=0.5)], 10, 2, max_error=0.1)
    sel = CodecSelector([c], 10, 2)
    with pytest.raises(ValueError, match="seconds"):
        sel.observe(10, 0.0)
    with pytest.raises(ValueError, match="nbytes"):
        sel.observe(0, 1.0)
    with pytest.raises(ValueError, match="bandwidth_trace"):
        simulate_selection(sel, [])
    with pytest.raises(ValueError, match="bandwidth_trace"):
        simulate_selection(sel, [1.0, -1.0])
    with pytest.raises(ValueError, match="topk_ratio"):
        default_codecs(topk_ratio=0.0)
    with pytest.raises(ValueError, match="errors"):
        default_codecs(errors={"int4": 0.1})


# ---------------------------------------------------------------- parity


def test_parity_recovers_any_single_lost_or_corrupted_block_bit_exact() -> None:
    rng = np.random.default_rng(0)
    idx = rng.choice(10_000, 300, replace=False).astype(np.int32)
    vals = rng.standard_normal(300).astype(np.float32)
    data = to_bytes(idx, vals)
    assert data.size == 300 * 8 and np.array_equal(data[:1200].view(np.int32), idx)
    for nb in (1, 3, 8):
        frame = encode_parity(data, nb)
        assert check_parity(frame) == [] and np.array_equal(recover_parity(frame), data)
        assert frame.overhead_bytes == frame.parity.nbytes + 4 * nb
        for i in range(nb):
            lost = encode_parity(data, nb)
            lost.blocks[i] = None
            assert check_parity(lost) == [i]
            assert np.array_equal(recover_parity(lost), data)
            bad = encode_parity(data, nb)
            blk = bad.blocks[i]
            assert blk is not None
            blk[rng.integers(blk.size)] ^= np.uint8(1 << int(rng.integers(8)))  # one flipped bit
            assert check_parity(bad) == [i]
            out = recover_parity(bad)
            assert np.array_equal(out, data)
            assert np.array_equal(out[1200:].view(np.float32), vals)  # bit-exact floats


def test_parity_two_bad_blocks_and_bad_input() -> None:
    frame = encode_parity(np.arange(100, dtype=np.float32), 4)
    frame.blocks[0] = None
    frame.blocks[2] = None
    assert check_parity(frame) == [0, 2]
    with pytest.raises(ValueError, match="2 bad blocks"):
        recover_parity(frame)
    frame = encode_parity(np.arange(100, dtype=np.float32), 4)
    frame.blocks[1] = None
    frame.parity[0] ^= 1  # a corrupted parity block cannot rebuild a good block: caught by the CRC
    with pytest.raises(ValueError, match="CRC"):
        recover_parity(frame)
    with pytest.raises(ValueError, match="n_blocks"):
        encode_parity(np.arange(4), 0)
    with pytest.raises(ValueError, match="data"):
        encode_parity(np.zeros(0, dtype=np.uint8), 2)
    with pytest.raises(ValueError, match="arrays"):
        to_bytes()


# ---------------------------------------------------------------- importance order


def test_importance_formulas_and_orders() -> None:
    v, m, h = np.array([1.0, -2.0]), np.array([0.5, 1.0]), np.array([1.0, 0.5])
    assert np.allclose(importance(v), [1.0, 4.0])
    assert np.allclose(importance(v, "momentum", momentum=m, beta=0.5), [1.25, 2 * 1.5])
    assert np.allclose(importance(v, "second_order", curvature=h, lr=0.5), [0.5 - 0.125, 2.0 - 0.25])
    assert np.allclose(importance(v, "second_order", curvature=np.array([10.0, 0.0]), lr=1.0), [0.0, 4.0])
    assert send_order([1.0, 10.0, 3.0], [1, 10, 1], "importance") == [2, 0, 1]  # per byte: 1, 1, 3
    assert send_order([1.0, 10.0, 3.0], [1, 10, 1], "default") == [0, 1, 2]
    assert within_budget([2, 0, 1], [1.0, 10.0, 3.0], [1, 10, 1], 5) == ([2, 0], 4.0)  # bucket 1 no longer fits
    assert within_budget([1, 0, 2], [1.0, 10.0, 3.0], [1, 10, 1], 5) == ([], 0.0)


def test_budgeted_sgd_full_budget_is_momentum_sgd_and_importance_captures_more() -> None:
    h = np.array([1.0, 0.5, 0.1, 0.1])
    w0 = np.array([1.0, -2.0, 3.0, 0.5])
    r = budgeted_sgd(h, w0, np.zeros(4), [1, 1, 2], 1.0, 3, "default", lr=0.5, beta=0.5)
    w, m, losses = w0.copy(), np.zeros(4), []
    for _ in range(3):  # the oracle: plain heavy-ball
        losses.append(0.5 * np.sum(h * w * w))
        m = 0.5 * m + h * w
        w = w - 0.5 * m
    assert np.allclose(r["loss"], losses) and r["captured"] == [1.0, 1.0, 1.0]
    rng = np.random.default_rng(1)
    sizes = [int(s) for s in rng.integers(20, 200, 12)]
    hh = np.repeat(10 ** rng.uniform(-2, 0, 12), sizes)
    ww = np.repeat(10 ** rng.uniform(-1, 1, 12), sizes)
    base = budgeted_sgd(hh, ww, np.zeros(hh.size), sizes, 0.25, 20, "default", lr=0.3)
    for kind in ("second_order", "momentum", "magnitude"):
        imp = budgeted_sgd(hh, ww, np.zeros(hh.size), sizes, 0.25, 20, "importance", kind, lr=0.3)
        assert np.mean(imp["captured"]) > 1.2 * np.mean(base["captured"])
        assert imp["loss"][5] < base["loss"][5]


def test_importance_bad_input() -> None:
    v = np.ones(3)
    with pytest.raises(ValueError, match="kind"):
        importance(v, "fisher")
    with pytest.raises(ValueError, match="momentum"):
        importance(v, "momentum")
    with pytest.raises(ValueError, match="curvature"):
        importance(v, "second_order", curvature=np.ones(2))
    with pytest.raises(ValueError, match="lr"):
        importance(v, lr=0.0)
    with pytest.raises(ValueError, match="scores / nbytes"):
        send_order([1.0], [1, 2])
    with pytest.raises(ValueError, match="nbytes"):
        send_order([1.0], [0])
    with pytest.raises(ValueError, match="policy"):
        send_order([1.0], [1], "random")
    with pytest.raises(ValueError, match="budget"):
        within_budget([0], [1.0], [1], -1)
    with pytest.raises(ValueError, match="budget"):
        within_budget([0], [1.0], [1], float("nan"))
    with pytest.raises(ValueError, match="lr"):
        budgeted_sgd(v, v, v, [3], 0.5, 2, lr=float("inf"))
    with pytest.raises(ValueError, match="order"):
        within_budget([0, 0], [1.0, 2.0], [1, 1], 5)
    with pytest.raises(ValueError, match="bucket_sizes"):
        budgeted_sgd(v, v, v, [1, 1], 0.5, 2)
    with pytest.raises(ValueError, match="budget_frac"):
        budgeted_sgd(v, v, v, [3], 0.0, 2)
    with pytest.raises(ValueError, match="steps"):
        budgeted_sgd(v, v, v, [3], 0.5, 0)
    with pytest.raises(ValueError, match="policy"):
        budgeted_sgd(v, v, v, [3], 0.5, 2, "lifo")
    with pytest.raises(ValueError, match="h / w0 / w_star"):
        budgeted_sgd(v, np.ones(2), v, [3], 0.5, 2)


# ---------------------------------------------------------------- recovering top-k


def test_recovering_topk_conserves_mass_and_bounds_staleness() -> None:
    n = 200
    rt = RecoveringTopK(n, ratio=0.05, extra_ratio=0.02, max_staleness=10, sample=16, seed=3)
    assert (rt.k, rt.m, rt.bound) == (10, 4, 10 + 50)
    # adversarial stream: 20 coordinates always dominate, the rest are tiny
    g = torch.full((n,), 1e-3)
    g[:20] = 100.0 + torch.arange(20.0)
    total_sent = torch.zeros(n, dtype=torch.float64)
    for _ in range(100):
        idx, vals = rt.step(g)
        assert idx.numel() == rt.k + rt.m and torch.equal(idx, torch.sort(idx).values)
        total_sent.index_add_(0, idx, vals.double())
    # error feedback: what was sent plus what is still owed = everything the gradients asked for
    assert torch.allclose(total_sent + torch.from_numpy(rt.residual).double(), 100 * g.double(), rtol=1e-5, atol=1e-6)
    assert rt.max_age <= rt.bound
    # plain top-k with the same payload: the tiny coordinates are never sent
    worst, never = topk_staleness(g.repeat(100, 1), rt.k + rt.m, error_feedback=False)
    assert worst == 100 and never == n - (rt.k + rt.m)  # always the same 14 largest
    worst_ef, _ = topk_staleness(g.repeat(100, 1), rt.k + rt.m, error_feedback=True)
    assert worst_ef > rt.bound  # error feedback alone: 1e-3 per step needs ~1e5 steps to reach 100


def test_recovering_topk_bad_input() -> None:
    with pytest.raises(ValueError, match="numel"):
        RecoveringTopK(0)
    with pytest.raises(ValueError, match="ratio"):
        RecoveringTopK(10, ratio=0.0)
    with pytest.raises(ValueError, match="extra_ratio"):
        RecoveringTopK(10, extra_ratio=2.0)
    with pytest.raises(ValueError, match="max_staleness"):
        RecoveringTopK(10, max_staleness=0)
    with pytest.raises(ValueError, match="max_staleness"):
        RecoveringTopK(10, max_staleness=float("nan"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample"):
        RecoveringTopK(10, sample=0)
    with pytest.raises(ValueError, match="grad"):
        RecoveringTopK(10).step(torch.zeros(11))
    with pytest.raises(ValueError, match="grads"):
        topk_staleness(torch.zeros(5), 1)
    with pytest.raises(ValueError, match="k"):
        topk_staleness(torch.zeros(2, 5), 6)


# ---------------------------------------------------------------- 2-bit + adaptive error feedback


def test_two_bit_codes_pack_and_round_trip() -> None:
    t = TwoBit()
    v = torch.tensor([2.0, -1.2, 0.4, -0.2, 0.98, 1.0, -2.0])
    packed, scale = t.compress(v)
    assert packed.dtype == torch.uint8 and packed.numel() == 2 and float(scale) == 2.0
    # codes + 1: [2, 0, 1, 1 | 1, 1(half to even), 0, pad 1]
    assert packed.tolist() == [2 | 0 << 2 | 1 << 4 | 1 << 6, 1 | 1 << 2 | 0 << 4 | 1 << 6]
    assert t.decompress((packed, scale), 7, torch.float32).tolist() == [2.0, -2.0, 0, 0, 0, 0, -2.0]
    assert t.payload_bytes(7) == 2 + 4 and t.payload_bytes(8) == 2 + 4
    _, local, res = error_feedback_step(t, v, torch.zeros(7))
    assert torch.equal(local + res, v)
    x = v.clone()
    assert compressed_all_reduce(x, t) == 0 and torch.equal(x, local)  # one process: sum = own decompression
    assert t.decompress(t.compress(torch.zeros(5)), 5, torch.float32).tolist() == [0.0] * 5


def test_adaptive_gamma_formula_and_effect() -> None:
    ag = AdaptiveGamma(target=1.0, smoothing=0.5, gamma_min=0.1)
    assert ag.update(torch.ones(4), torch.zeros(4)) == 1.0  # no residual yet: full feedback
    # EMA var_g = 1, var_e = 0.5 * 0 + 0.5 * 16 = 8 -> gamma = sqrt(1 / 8)
    assert ag.update(torch.ones(4), torch.full((4,), 4.0)) == pytest.approx(math.sqrt(1 / 8))
    assert ag.update(torch.ones(4), torch.full((4,), 1e3)) == 0.1  # clipped at gamma_min
    fixed = ef_quadratic(TwoBit(), 200, 1.0, noise=0.1)
    adapt = ef_quadratic(TwoBit(), 200, "adaptive", noise=0.1)
    assert np.var(adapt["resid"][100:]) < 0.5 * np.var(fixed["resid"][100:])
    assert min(adapt["gamma"]) < 1.0 <= max(adapt["gamma"])

    class Identity:
        def compress(self, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (v,)

        def decompress(self, p: tuple[torch.Tensor, ...], n: int, dtype: torch.dtype) -> torch.Tensor:
            return p[0]

    exact = ef_quadratic(Identity(), 20, "adaptive", noise=0.0)
    assert max(exact["resid"]) == 0.0 and exact["loss"][-1] < 0.5 * exact["loss"][0]


def test_feedback_bad_input() -> None:
    with pytest.raises(ValueError, match="target"):
        AdaptiveGamma(target=0.0)
    with pytest.raises(ValueError, match="smoothing"):
        AdaptiveGamma(smoothing=1.0)
    with pytest.raises(ValueError, match="gamma_min"):
        AdaptiveGamma(gamma_min=0.0)
    with pytest.raises(ValueError, match="residual"):
        AdaptiveGamma().update(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="gamma"):
        ef_quadratic(TwoBit(), 10, 1.5)
    with pytest.raises(ValueError, match="gamma"):
        ef_quadratic(TwoBit(), 10, "auto")
    with pytest.raises(ValueError, match="steps"):
        ef_quadratic(TwoBit(), 0)
    with pytest.raises(ValueError, match="lr"):
        ef_quadratic(TwoBit(), 10, lr=float("nan"))
    with pytest.raises(ValueError, match="noise"):
        ef_quadratic(TwoBit(), 10, noise=-1.0)


def test_clipped_low_bit_codes_by_hand_and_error_feedback_keeps_the_excess() -> None:
    v = torch.tensor([3.0, -1.0, 0.5, 0.2, -0.3])
    rms = float(v.pow(2).mean().sqrt())
    c2, c3 = ClippedLowBit(2, 1.0), ClippedLowBit(3, 1.0)
    p2 = c2.compress(v)
    assert float(p2[1]) == pytest.approx(rms) and p2[0].numel() == 2  # 5 codes x 2 bits -> 2 bytes
    # 2 bits: round(v / rms) clamped to [-1, 1]: 3 -> +1 (clipped), -1 -> -1 (|-1| / 1.44 > 0.5), rest 0
    assert torch.allclose(c2.decompress(p2, 5, torch.float32), torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0]) * rms)
    # 3 bits: L = 3, round(v / rms * 3) clamped to [-3, 3], value q * rms / 3
    q = torch.clamp(torch.round(v / rms * 3), -3, 3)
    assert torch.allclose(c3.decompress(c3.compress(v), 5, torch.float32), q * rms / 3)
    assert c3.payload_bytes(5) == 2 + 4 and c2.payload_bytes(8) == 2 + 4 and c3.payload_bytes(8) == 3 + 4
    # error feedback over many steps: what was sent + what is still owed == sum of the gradients
    rng = np.random.default_rng(0)
    e, sent, total = torch.zeros(64), torch.zeros(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    for _ in range(30):
        g = torch.from_numpy(rng.standard_t(2, 64).astype(np.float32))
        _, local, e = error_feedback_step(c2, g, e)
        sent += local.double()
        total += g.double()
    assert torch.allclose(sent + e.double(), total, atol=1e-4)
    assert c2.decompress(c2.compress(torch.zeros(3)), 3, torch.float32).tolist() == [0.0, 0.0, 0.0]
    dense = ef_quadratic(None, 30, 1.0, noise=0.0)
    assert max(dense["resid"]) == 0.0
    with pytest.raises(ValueError, match="bits"):
        ClippedLowBit(4)
    with pytest.raises(ValueError, match="k"):
        ClippedLowBit(2, 0.0)
