"""List scheduling: chains, issue width, dependence checking, lower bounds and the ILP gain of interleaving."""

from __future__ import annotations

import math

import pytest

from tinylearn.compiler.listsched import (
    TOY,
    ZEN4,
    Machine,
    Op,
    Schedule,
    ample,
    build_dag,
    check_schedule,
    dot_product,
    in_order_schedule,
    list_schedule,
    lower_bounds,
    random_block,
)


def test_chain_schedules_to_its_critical_path():
    chain = [
        Op("a", "load", mem="x"),
        Op("b", "fma", ("a", "a", "a")),
        Op("c", "add", ("b", "a")),
        Op("d", "mul", ("c",)),
    ]
    s = list_schedule(chain, ZEN4)
    assert s.start == [0, 7, 11, 14]  # load 7, fma 4, add 3, mul 3
    assert s.makespan == 17 == lower_bounds(s.dag, ZEN4)["critical_path"]
    assert check_schedule(s) == []


def test_independent_ops_fill_the_issue_width():
    m = Machine("wide", 4, {"alu": 8}, {"iadd": ("alu", 1)})
    ops = [Op(f"v{i}", "iadd", ("x", "y")) for i in range(10)]
    s = list_schedule(ops, m)
    assert {c: len(v) for c, v in s.by_cycle().items()} == {0: 4, 1: 4, 2: 2}
    assert s.makespan == 3 == lower_bounds(s.dag, m)["issue"]
    # and the unit count binds when it is the scarcer resource: 2 FMA ports
    s = list_schedule([Op(f"v{i}", "fma", ("x", "y", "z")) for i in range(10)], ZEN4)
    assert max(len(v) for v in s.by_cycle().values()) == 2 and s.makespan == 5 - 1 + 4
    assert s.makespan == lower_bounds(s.dag, ZEN4)["resource"]


def test_dependence_kinds_and_latencies():
    ops = [
        Op("a", "fma", ("x", "y", "z")),  # 0
        Op("b", "add", ("a", "a")),  # 1: RAW on a, latency 4
        Op("x", "iadd", ("q", "q")),  # 2: WAR on x (0 read it), latency 0
        Op("a", "iadd", ("q", "q")),  # 3: WAW on a after a 4-cycle fma: 4 - 1 + 1 = 4; WAR after 1's read of a
        Op(None, "store", ("b",), mem="m"),  # 4: RAW on b
        Op("c", "load", mem="m"),  # 5: RAW through memory m
    ]
    edges = {(u, v): (lat, kind) for u, v, lat, kind in build_dag(ops, ZEN4).edges}
    assert edges[(0, 1)] == (4, "RAW")
    assert edges[(0, 2)] == (0, "WAR")
    assert edges[(0, 3)] == (4, "WAW")
    assert edges[(1, 3)] == (0, "WAR")
    assert edges[(1, 4)] == (3, "RAW")
    assert edges[(4, 5)] == (1, "RAW")
    s = list_schedule(ops, ZEN4)
    assert s.start[2] == 0  # the WAR successor may issue in the same cycle as the reader
    assert check_schedule(s) == []


@pytest.mark.parametrize("machine", [ZEN4, TOY], ids=lambda m: m.name)
@pytest.mark.parametrize("seed", range(25))
def test_random_blocks_respect_dependences_and_bounds(machine, seed):
    block = random_block(seed, n_ops=40, n_names=6, machine=machine)
    dag = build_dag(block, machine)
    bounds = lower_bounds(dag, machine)
    for sched in (list_schedule(dag, machine), in_order_schedule(dag, machine)):
        assert check_schedule(sched) == [], sched.table()
        assert sched.makespan >= max(bounds.values())
    assert list_schedule(dag, machine).makespan <= in_order_schedule(dag, machine).makespan + 3  # heuristic, close
    roomy = ample(machine)
    assert list_schedule(dag, roomy).makespan == bounds["critical_path"]  # unlimited resources: ASAP is optimal


def test_checker_rejects_broken_schedules():
    ops = [Op("a", "fma", ("x", "y", "z")), Op("b", "add", ("a", "a")), Op("c", "fma", ("x", "y", "z"))]
    good = list_schedule(ops, ZEN4)
    assert check_schedule(good) == []
    early = Schedule(good.dag, ZEN4, [0, 3, 0])
    assert any("RAW" in e for e in check_schedule(early))
    narrow = Machine("one-fma", 6, {"f": 1, "a": 1}, {"fma": ("f", 4), "add": ("a", 3)})
    crowded = Schedule(build_dag(ops, narrow), narrow, [0, 4, 0])
    assert any("unit 'f'" in e for e in check_schedule(crowded))
    assert check_schedule(Schedule(good.dag, ZEN4, [0, 4])) != []


@pytest.mark.parametrize("accumulators", [1, 2, 4, 8, 16])
def test_interleaved_accumulators_gain_latency_times_ports(accumulators):
    """Register operands: gain = min(a, FMA latency x FMA ports) = min(a, 4 x 2); the FMA chain is the bound."""
    n = 256
    one = list_schedule(dot_product(n, 1, loads=False), ZEN4).makespan
    assert one == 3 + 4 * (n - 1)  # a mul then a chain of n - 1 FMAs, 4 cycles each
    s = list_schedule(dot_product(n, accumulators, loads=False), ZEN4)
    assert check_schedule(s) == []
    ceiling = min(accumulators, ZEN4.latency("fma") * ZEN4.units["fp01"])
    assert 0.85 * ceiling <= one / s.makespan <= ceiling


def test_with_loads_the_load_ports_cap_the_gain():
    """2 loads per FMA on 2 load ports: one FMA per cycle, so the gain stops at latency x 1 = 4."""
    n = 256
    one = list_schedule(dot_product(n, 1), ZEN4).makespan
    for a in (4, 8, 16):
        s = list_schedule(dot_product(n, a), ZEN4)
        b = lower_bounds(s.dag, ZEN4)
        assert b["resource"] == math.ceil(2 * n / 2) - 1 + 7 and s.makespan >= b["resource"]
        assert 3.5 <= one / s.makespan <= 4.0


def test_list_scheduling_beats_the_source_order():
    """Chains written one after another: in order they run back to back; list scheduling interleaves them."""
    block = dot_product(64, 4, loads=False, interleaved=False)
    ls, io = list_schedule(block, ZEN4), in_order_schedule(block, ZEN4)
    assert check_schedule(ls) == [] and check_schedule(io) == []
    assert io.makespan >= 3 * ls.makespan
    assert ls.makespan <= lower_bounds(ls.dag, ZEN4)["critical_path"] + 4


def test_bad_input():
    with pytest.raises(ValueError, match="kind"):
        build_dag([Op("a", "div", ("b", "c"))], ZEN4)
    with pytest.raises(ValueError, match="mem"):
        build_dag([Op("a", "load")], ZEN4)
    with pytest.raises(TypeError, match=r"block\[0\]"):
        build_dag(["a = add b c"], ZEN4)
    with pytest.raises(TypeError, match="machine"):
        list_schedule([Op("a", "add", ("b", "c"))], "zen4")
    with pytest.raises(ValueError, match="issue_width"):
        Machine("m", 0, {"a": 1}, {})
    with pytest.raises(ValueError, match="units"):
        Machine("m", 1, {"a": 0}, {})
    with pytest.raises(ValueError, match="ops"):
        Machine("m", 1, {"a": 1}, {"add": ("b", 1)})
    with pytest.raises(ValueError, match="accumulators"):
        dot_product(4, 5)
    with pytest.raises(ValueError, match="n"):
        dot_product(0)
