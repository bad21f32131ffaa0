"""Heterogeneous placement (MODEL devices): HEFT vs baselines and hand-checked cases, balancing, the composite cost
with annealing [Q140], latency-bounded energy DP vs brute force [Q234]."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinylearn.inference.config import GPTConfig
from tinylearn.sched import hetero as he
from tinylearn.sched import hetero_cost as hc

CFG = GPTConfig(vocab_size=512, d_model=128, n_heads=4, n_layers=2, max_seq_len=128)


def _tiny_platform():
    pf = he.default_platform()
    return pf, {d.name: d for d in pf.devices}


def test_gpt_graph_shapes_and_order():
    g = he.gpt_graph(CFG, batch=2, seq=64)
    names = [o.name for o in g]
    assert len(g) == 2 + 10 * CFG.n_layers + 2 and names[0] == "embed" and names[-1] == "sample"
    pos = {n: i for i, n in enumerate(names)}
    assert all(pos[d] < pos[o.name] for o in g for d in o.deps)  # topological
    qkv = next(o for o in g if o.name == "L0.qkv")
    assert qkv.flops == 2.0 * 2 * 64 * 128 * (3 * 128)
    g3 = he.gpt_graph(CFG, batch=2, seq=64, streams=3)
    assert len(g3) == 3 * len(g) and all(o.name.startswith("s") for o in g3)


def test_heft_hand_checked_two_independent_ops():
    pf, dev = _tiny_platform()
    a = he.Op("a", "gemm", 2e9, 1e6, 1e6)
    b = he.Op("b", "gemm", 2e9, 1e6, 1e6)
    s = he.heft([a, b], pf)
    # both fastest on the GPU; the second one finishes earlier on the NPU than queued behind the first on the GPU
    tg, tn = dev["gpu"].time_s(a), dev["npu"].time_s(a)
    assert tn < 2 * tg
    assert sorted(s.placement.values()) == ["gpu", "npu"]
    assert s.makespan_s == pytest.approx(max(tg, tn))
    assert s.energy_j == pytest.approx(tg * dev["gpu"].active_w() + tn * dev["npu"].active_w())


def test_heft_pays_transfers_and_beats_baselines_on_parallel_requests():
    pf, _ = _tiny_platform()
    big = GPTConfig(vocab_size=32000, d_model=1024, n_heads=16, n_layers=2, max_seq_len=1024)
    g1 = he.gpt_graph(big, 4, 512)
    assert he.heft(g1, pf).makespan_s <= he.all_on(g1, pf, "gpu").makespan_s * (1 + 1e-9)
    g = he.gpt_graph(big, 4, 512, streams=4)
    h = he.heft(g, pf)
    for base in (he.all_on(g, pf, "gpu"), he.all_on(g, pf, "npu"), he.greedy(g, pf)):
        assert h.makespan_s < base.makespan_s
    # every op starts after its inputs have arrived, and a device runs one op at a time
    by = {o.name: o for o in g}
    for o in g:
        for d in o.deps:
            c = pf.comm_s(by[d].out_bytes, h.placement[d], h.placement[o.name])
            assert h.start[o.name] >= h.finish[d] + c - 1e-12
    rows = h.gantt()
    for dv in ("cpu", "gpu", "npu"):
        iv = [(s, f) for d, _, s, f in rows if d == dv]
        assert all(f0 <= s1 + 1e-12 for (_, f0), (s1, _) in zip(iv, iv[1:], strict=False))


def test_rebalancing_moves_work_off_a_busy_device():
    pf, _ = _tiny_platform()
    big = GPTConfig(vocab_size=32000, d_model=1024, n_heads=16, n_layers=2, max_seq_len=1024)
    g = he.gpt_graph(big, 4, 512, streams=2)
    h = he.heft(g, pf)
    back = he.backlog_s({"gpu": 10, "npu": 0}, {"gpu": 1e-3})
    assert back == {"gpu": 0.01, "npu": 0.0}
    stale = he.evaluate(g, pf, h.placement, ready_s=back)
    new = he.heft(g, pf, ready_s=back)
    assert new.makespan_s < stale.makespan_s
    assert sum(v == "gpu" for v in new.placement.values()) < sum(v == "gpu" for v in h.placement.values())


def test_anneal_improves_composite_and_is_seeded():
    pf, _ = _tiny_platform()
    big = GPTConfig(vocab_size=32000, d_model=1024, n_heads=16, n_layers=2, max_seq_len=1024)
    g = he.gpt_graph(big, 4, 512, streams=2)
    ref = hc.cost_terms(g, pf, he.heft(g, pf))
    w = {"T_c": 0.3, "E": 0.7}
    r1 = hc.anneal(g, pf, w, ref, iters=400, seed=1)
    r2 = hc.anneal(g, pf, w, ref, iters=400, seed=1)
    assert r1.placement == r2.placement and r1.cost == r2.cost
    assert r1.trace[0] > r1.trace[-1] and all(a >= b for a, b in zip(r1.trace, r1.trace[1:], strict=False))
    again = hc.cost_terms(g, pf, he.evaluate(g, pf, r1.placement))
    assert hc.composite(again, ref, w) == pytest.approx(r1.cost)
    assert 0 < ref["Risk"] < 1e-6


def test_min_energy_dp_equals_brute_force_and_greedy_never_better():
    rng = np.random.default_rng(0)
    worse = 0
    for _ in range(150):
        n, k = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        blocks = [[hc.PathOption(f"p{j}", *rng.uniform(0.1, 1.0, 2)) for j in range(k)] for _ in range(n)]
        lmax = float(rng.uniform(0.2, 0.7 * n + 0.2))
        dp, gr, bf = (
            hc.min_energy_dp(blocks, lmax),
            hc.min_energy_greedy(blocks, lmax),
            hc.min_energy_brute(blocks, lmax),
        )
        assert (dp is None) == (bf is None) == (gr is None)
        if bf is None:
            continue
        assert math.isclose(dp[2], bf[2], rel_tol=1e-9) and dp[1] <= lmax + 1e-12 and gr[1] <= lmax + 1e-12
        assert gr[2] >= dp[2] - 1e-12
        worse += gr[2] > dp[2] + 1e-9
    assert worse > 0  # greedy is a heuristic: some instance shows it


def test_block_options_dvfs_and_split():
    pf, _ = _tiny_platform()
    ops = [o for o in he.gpt_graph(CFG, 2, 64) if o.name.startswith("L0.")]
    opts = hc.block_options(ops, pf, n_freqs=3, split=("gpu", "npu"))
    assert len(opts) == 3 * 3 + 1
    gpu = [o for o in opts if o.name.startswith("gpu@")]
    assert gpu[0].latency_s >= gpu[-1].latency_s  # lower clock: slower


def test_bad_input():
    pf, _ = _tiny_platform()
    with pytest.raises(ValueError, match="^deps"):
        he.check_graph([he.Op("a", "gemm", 1, 1, 1, ("zz",))])
    with pytest.raises(ValueError, match="^ops"):
        he.check_graph([he.Op("a", "gemm", 1, 1, 1, ("b",)), he.Op("b", "gemm", 1, 1, 1, ("a",))])
    with pytest.raises(ValueError, match="^kind"):
        he.check_graph([he.Op("a", "matmul", 1, 1, 1)])
    with pytest.raises(ValueError, match="^placement"):
        he.evaluate([he.Op("a", "gemm", 1, 1, 1)], pf, {"a": "tpu"})
    with pytest.raises(ValueError, match="^ready_s"):
        he.heft([he.Op("a", "gemm", 1, 1, 1)], pf, ready_s={"gpu": -1.0})
    with pytest.raises(TypeError, match="^cfg"):
        he.gpt_graph({"d_model": 8})
    with pytest.raises(ValueError, match="^l_max"):
        hc.min_energy_dp([[hc.PathOption("a", 1.0, 1.0)]], -1.0)
    with pytest.raises(ValueError, match="^weights"):
        hc.composite({"E": 1.0}, {"E": 1.0}, {"speed": 1.0})
    with pytest.raises(ValueError, match="^iters"):
        hc.anneal([he.Op("a", "gemm", 1, 1, 1)], pf, {"E": 1.0}, {k: 1.0 for k in hc.TERMS}, iters=0)


def test_dp_partition_exact_against_brute_force():
    import itertools

    pf, _ = _tiny_platform()
    rng = np.random.default_rng(3)
    for _ in range(8):
        n = int(rng.integers(3, 7))
        ops = []
        for i in range(n):
            deps = tuple(f"o{j}" for j in range(max(0, i - 2), i) if rng.random() < 0.7)
            kind = he.KINDS[int(rng.integers(len(he.KINDS)))]
            ops.append(he.Op(f"o{i}", kind, float(rng.uniform(1e6, 1e11)), float(rng.uniform(1e4, 1e8)),
                             float(rng.uniform(1e3, 1e8)), deps))  # fmt: skip
        place, cost = he.dp_partition(ops, pf)
        assert cost == pytest.approx(he.sequential_cost(ops, pf, place))
        best = min(
            he.sequential_cost(ops, pf, dict(zip([o.name for o in ops], ch, strict=True)))
            for ch in itertools.product(["cpu", "gpu", "npu"], repeat=n)
        )
        assert cost == pytest.approx(best)
    fan = [he.Op(f"r{i}", "gemm", 1e9, 1e6, 1e6) for i in range(4)]
    fan.append(he.Op("sink", "elementwise", 1e6, 1e6, 1e6, tuple(o.name for o in fan)))
    with pytest.raises(ValueError, match="^max_frontier"):
        he.dp_partition(fan, pf, max_frontier=2)
    chain = he.gpt_graph(CFG, 2, 64)
    place, cost = he.dp_partition(chain, pf)
    assert cost <= he.sequential_cost(chain, pf, he.heft(chain, pf).placement) + 1e-12
