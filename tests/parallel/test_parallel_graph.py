"""tinylearn.parallel.graph_plan: the operator-DAG (dp, tp, pp) planner [Q147] — equal to plan_3d on a chain of
identical layers, legal cuts around residual branches, optimal min-max cuts (brute force), bad inputs."""

from __future__ import annotations

import itertools
import math
import random

import pytest

import tinylearn.parallel as par
from tinylearn.parallel.graph_plan import OpNode, check_graph, layer_chain, min_max_partition, plan_graph, to_chain

LINK = {"alpha_s": 5e-6, "beta_s_per_byte": 1 / 50e9}


@pytest.mark.parametrize(
    "job",
    [
        dict(world=64, psi=7_000_000_000, L=32, h=4096, s=2048, gb=256, mem=32e9, kw={}),
        dict(world=16, psi=1_000_000_000, L=16, h=2048, s=1024, gb=64, mem=80e9, kw={"zero_stage": 0}),
        dict(world=8, psi=2_000_000_000, L=8, h=1024, s=1024, gb=32, mem=40e9, kw={"dtype_bytes": 4, "k": 2}),
        dict(world=4, psi=1_000_000, L=4, h=256, s=32, gb=4, mem=1e12, kw={"k": 2, "opt": 1e-8, "zero_stage": 0}),
    ],
)
def test_chain_of_layers_equals_plan_3d(job: dict) -> None:
    kw = dict(job["kw"])
    k, opt = kw.pop("k", 4), kw.pop("opt", 0.0)
    dtype = kw.get("dtype_bytes", 2)
    ref = par.plan_3d(
        job["world"], job["psi"], job["L"], job["h"], job["s"], job["gb"], job["mem"], LINK,
        tp_allreduces_per_layer=k, optimizer_s_per_param=opt, flops_per_s=150e12, **kw,
    )  # fmt: skip
    graph = layer_chain(job["psi"], job["L"], job["h"], job["s"], dtype_bytes=dtype, tp_allreduces_per_layer=k)
    got = plan_graph(
        graph, job["world"], job["gb"], job["mem"], LINK, optimizer_s_per_param=opt, flops_per_s=150e12, **kw
    )
    assert len(ref) >= 3 and [p[:3] for p in got] == [p[:3] for p in ref]  # same configurations, same ranking
    for g, r in zip(got, ref):
        assert g.est_step_s == pytest.approx(r.est_step_s, rel=1e-9)
        assert g.est_bytes == pytest.approx(r.est_bytes, rel=1e-12)
        assert [len(st) for st in g.stages] == [job["L"] // g.pp] * g.pp  # equal layers: equal stages


def test_chain_charges_the_real_bottleneck_when_pp_does_not_divide_layers() -> None:
    free = {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
    graph = layer_chain(6_000_000, 6, 256, 32)
    (pl,) = [p for p in plan_graph(graph, 4, 4, 1e12, free, flops_per_s=1e9) if p.pp == 4]
    t3d, _ = par.estimate_3d(1, 1, 4, 6_000_000, 6, 256, 32, 4, free, 1e9)
    layer_s = 6 * 1_000_000 * 32 / 1e9
    assert t3d == pytest.approx((4 + 3) * 1.5 * layer_s)  # plan_3d: L/pp = 1.5 layers per stage
    assert pl.est_step_s == pytest.approx((4 + 3) * 2 * layer_s)  # a stage holds whole layers: 2
    assert sorted(len(st) for st in pl.stages) == [1, 1, 2, 2]


def transformer(n_layers: int, out: float = 1000.0) -> list[OpNode]:
    ops = [OpNode("embed", 0.0, 50.0, out)]
    x = "embed"
    for i in range(n_layers):
        ops += [
            OpNode(f"attn{i}", 400.0, 40.0, out, 8 * out, (x,), 64, 2),
            OpNode(f"res{i}a", 1.0, 0.0, out, 0.0, (x, f"attn{i}")),
            OpNode(f"mlp{i}", 800.0, 80.0, out, 8 * out, (f"res{i}a",), 64, 2),
            OpNode(f"res{i}b", 1.0, 0.0, out, 0.0, (f"res{i}a", f"mlp{i}")),
        ]
        x = f"res{i}b"
    return [*ops, OpNode("head", 300.0, 50.0, 10.0, out, (x,), 64, 0)]


def test_residual_branches_are_never_cut() -> None:
    graph = transformer(3)
    chain = to_chain(graph)
    names = [[op.name for op in blk] for blk in chain.blocks]
    assert names[0] == ["embed"] and names[-1] == ["head"]
    assert names[1:-1] == [
        [f"attn{i}", f"res{i}a"] if j == 0 else [f"mlp{i}", f"res{i}b"] for i in range(3) for j in (0, 1)
    ]
    assert all(len(c) == 1 for c in chain.crossing) and chain.cut_bytes == (1000.0,) * 7
    # every cut allowed: inside a branch the skip tensor and the branch output both cross (summed)
    every = to_chain(graph, max_cut_tensors=None)
    assert len(every.blocks) == len(graph)
    inside = every.crossing[1]  # after attn0
    assert inside == ("embed", "attn0") and every.cut_bytes[1] == 2000.0
    plans = plan_graph(graph, 8, 8, 1e12, LINK, flops_per_s=1e6)
    assert plans and {p.pp for p in plans} >= {1, 2, 4, 8}
    for pl in plans:  # no stage boundary falls between a branch and its residual add
        assert [op for st in pl.stages for op in st] == [op.name for op in graph]
        assert all(st[-1] == "embed" or st[-1] == "head" or st[-1].startswith("res") for st in pl.stages)
    # two branches from one tensor: it is sent once, and no cut falls between the branches and their join
    fork = [
        OpNode("x", 1.0, out_bytes=7.0),
        OpNode("a", 1.0, out_bytes=3.0, inputs=("x",)),
        OpNode("b", 1.0, out_bytes=5.0, inputs=("x",)),
        OpNode("c", 1.0, inputs=("a", "b")),
    ]
    ch = to_chain(fork)
    assert [[op.name for op in blk] for blk in ch.blocks] == [["x"], ["a", "b", "c"]] and ch.cut_bytes == (7.0,)
    assert to_chain(fork, max_cut_tensors=2).cut_bytes == (7.0, 10.0, 8.0)  # x+a, then a+b


def test_tp_only_on_shardable_ops_and_dims() -> None:
    graph = transformer(2)
    tps = {p.tp for p in plan_graph(graph, 12, 12, 1e12, LINK)}
    assert tps == {1, 2, 4}  # tp must divide tp_dim = 64: not 3, 6 or 12
    free = {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
    (one,) = [p for p in plan_graph(graph, 2, 2, 1e12, free, flops_per_s=1.0) if p.tp == 2]
    # tp = 2 halves attention / MLP / head, not the embedding or the adds: per microbatch 0 + 2 (400 + 800)/2 + 4 + 150
    assert one.est_step_s == pytest.approx(2 * (1200 + 4 + 150))


def brute_force(n: int, pp: int, cost) -> float:
    best = math.inf
    for cuts in itertools.combinations(range(1, n), pp - 1):
        b = [0, *cuts, n]
        best = min(best, max(cost(s, b[s], b[s + 1]) for s in range(pp)))
    return best


def test_min_max_partition_is_optimal() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 7)
        pp = rng.randint(1, n)
        w = [rng.choice([0.0, 1.0, rng.uniform(0, 5)]) for _ in range(n)]
        edge = [rng.uniform(0, 2) for _ in range(n + 1)]
        cap = rng.uniform(2, 12)

        def cost(s: int, i: int, j: int, w: list = w, edge: list = edge, cap: float = cap) -> float:
            t = sum(w[i:j]) + edge[i] + edge[j]
            return math.inf if t * (1 + 0.1 * s) > cap else t  # stage-dependent limit, like 1F1B memory

        val, bounds = min_max_partition(n, pp, cost)
        ref = brute_force(n, pp, cost)
        assert val == pytest.approx(ref, rel=1e-9) if ref < math.inf else (val, bounds) == (math.inf, [])
        if bounds:
            assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == pp + 1 and bounds == sorted(set(bounds))
            assert max(cost(s, bounds[s], bounds[s + 1]) for s in range(pp)) == val


def random_dag(rng: random.Random, n: int) -> list[OpNode]:
    ops = []
    for i in range(n):
        inputs = sorted({f"o{i - 1}", *rng.sample([f"o{j}" for j in range(i)], min(i, rng.randint(0, 2)))}) if i else []
        ops.append(OpNode(f"o{i}", float(rng.randint(1, 9)), float(rng.randint(0, 9)), float(rng.randint(1, 9)),
                          float(rng.randint(0, 9)), tuple(inputs)))  # fmt: skip
    return ops


def test_random_dags_cut_bytes_and_optimal_stages() -> None:
    rng = random.Random(1)
    link = {"alpha_s": 0.5, "beta_s_per_byte": 0.25}
    for _ in range(60):
        graph = random_dag(rng, rng.randint(1, 9))
        every = to_chain(graph, max_cut_tensors=None)
        order = [blk[0] for blk in every.blocks]
        pos = {op.name: k for k, op in enumerate(order)}
        for k, nbytes in enumerate(every.cut_bytes):  # tensors made at or before k and read after k, each once
            live = {x for op in order[k + 1 :] for x in op.inputs if pos[x] <= k}
            assert nbytes == sum(order[pos[x]].out_bytes for x in live)
        limit = rng.choice([1, 2, None])
        chain = to_chain(graph, max_cut_tensors=limit)
        assert all(limit is None or len(c) <= limit for c in chain.crossing)
        n = len(chain.blocks)
        blk_t = [sum(op.flops for op in blk) for blk in chain.blocks]
        cut = [0.0, *chain.cut_bytes, 0.0]
        for pp in range(1, n + 1):
            (pl,) = [
                p
                for p in plan_graph(graph, pp, 1, 1e12, link, flops_per_s=1.0, max_cut_tensors=limit)
                if (p.dp, p.tp) == (1, 1)
            ]

            def cost(s: int, i: int, j: int, pp: int = pp, blk_t: list = blk_t, cut: list = cut) -> float:
                return sum(blk_t[i:j]) + (2 * (0.5 + 0.25 * max(cut[i], cut[j])) if pp > 1 else 0.0)

            assert pl.est_step_s == pytest.approx(pp * brute_force(n, pp, cost), rel=1e-9)  # m + pp - 1 = pp
            assert [op for st in pl.stages for op in st] == [op.name for op in order]


def test_memory_prunes_and_shapes_the_cuts() -> None:
    graph = transformer(4)
    plans = plan_graph(graph, 8, 8, 1e12, LINK, flops_per_s=1e6)
    tight = sorted(p.est_bytes for p in plans)[len(plans) // 2]
    fits = plan_graph(graph, 8, 8, tight, LINK, flops_per_s=1e6)
    assert 0 < len(fits) < len(plans) and all(p.est_bytes <= tight for p in fits)
    assert plan_graph(graph, 8, 8, 1.0, LINK) == []  # nothing fits in one byte
    # 1F1B: stage 0 keeps 2 microbatches in flight, stage 1 one. Four equal ops of 100 saved bytes: the fastest
    # split 2 | 2 needs 2·200 = 400 bytes on stage 0; under 350 the search moves a cut (1 | 3: 200 and 300 bytes)
    chain = [
        OpNode(f"a{i}", 1.0, out_bytes=1.0, saved_bytes=100.0, inputs=(f"a{i - 1}",) if i else ()) for i in range(4)
    ]
    (free,) = [p for p in plan_graph(chain, 2, 2, 1e12, LINK, flops_per_s=1.0) if p.pp == 2]
    assert free.stages == (("a0", "a1"), ("a2", "a3")) and free.est_bytes == 400.0
    (tight_pl,) = plan_graph(chain, 2, 2, 350.0, LINK, flops_per_s=1.0)  # pp = 1 (400 bytes on every rank) is pruned
    assert tight_pl.pp == 2 and tight_pl.stages == (("a0",), ("a1", "a2", "a3")) and tight_pl.est_bytes == 300.0
    assert tight_pl.est_step_s > free.est_step_s


def test_bad_inputs() -> None:
    ok = OpNode("a", 1.0)
    for graph, match in (
        ([], "graph"),
        ([("a", 1.0)], "graph"),
        ([ok, OpNode("a", 2.0)], "unique"),
        ([ok, OpNode("b", -1.0, inputs=("a",))], r"b\.flops"),
        ([ok, OpNode("b", 1.0, out_bytes=math.nan)], r"b\.out_bytes"),
        ([ok, OpNode("b", 1.0, inputs=("zz",))], r"b\.inputs.*zz"),
        ([ok, OpNode("b", 1.0, inputs="a")], r"b\.inputs"),
        ([OpNode("a", 1.0, inputs=("b",)), OpNode("b", 1.0, inputs=("a",)), OpNode("c", 1.0)], r"cycle.*\['a', 'b'\]"),
        ([OpNode("a", 1.0, tp_dim=-1)], r"a\.tp_dim"),
    ):
        with pytest.raises(ValueError, match=match):
            check_graph(graph)
    with pytest.raises(TypeError, match=r"a\.params"):
        check_graph([OpNode("a", 1.0, params="3")])
    with pytest.raises(ValueError, match="max_cut_tensors"):
        to_chain([ok], max_cut_tensors=0)
    with pytest.raises(ValueError, match="n_stages"):
        min_max_partition(2, 3, lambda s, i, j: 0.0)
    for args, kw, match in (
        ((0, 1, 1e9), {}, "world_size"),
        ((2, 0, 1e9), {}, "global_batch"),
        ((2, 2, 0.0), {}, "memory_per_rank_bytes"),
        ((2, 2, 1e9, {"alpha": 1}), {}, "link"),
        ((2, 2, 1e9), {"flops_per_s": 0.0}, "flops_per_s"),
        ((2, 2, 1e9), {"dtype_bytes": 3}, "dtype_bytes"),
        ((2, 2, 1e9), {"zero_stage": 4}, "zero_stage"),
    ):
        with pytest.raises(ValueError, match=match):
            plan_graph([ok], *args, **kw)
