"""Register allocation: hand-checked liveness, the max-live bound, spilling, and allocated code computing the same."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinylearn.compiler.regalloc import (
    Block,
    Instr,
    Program,
    chaitin_briggs,
    color_graph,
    interference_graph,
    linear_scan,
    live_intervals,
    liveness,
    random_program,
    run,
    spill_costs,
    straight_line,
    sum_of_squares_loop,
)

ALLOCATORS = [chaitin_briggs, linear_scan]


def small():
    return straight_line(
        [
            Instr("a", "arg", (0,)),
            Instr("b", "arg", (1,)),
            Instr("c", "add", ("a", "b")),
            Instr("d", "mul", ("c", "c")),
            Instr("e", "sub", ("d", "a")),
            Instr(None, "ret", ("e",)),
        ]
    )


def test_liveness_of_straight_line_code_by_hand():
    lv = liveness(small())
    assert [set(s) for s in lv.live_in] == [set(), {"a"}, {"a", "b"}, {"a", "c"}, {"a", "d"}, {"e"}]
    assert [set(s) for s in lv.live_out] == [{"a"}, {"a", "b"}, {"a", "c"}, {"a", "d"}, {"e"}, set()]
    assert lv.rounds == 1 and lv.max_live() == 2  # one block whose live-in is empty: the first pass is final
    g = interference_graph(small())
    assert g == {"a": {"b", "c", "d"}, "b": {"a"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert live_intervals(small()) == {"a": (1, 8), "b": (3, 4), "c": (5, 6), "d": (7, 8), "e": (9, 10)}


def test_liveness_of_a_loop_needs_the_fixed_point():
    p = sum_of_squares_loop()
    lv = liveness(p)
    assert lv.rounds == 3  # pass 2 propagates the back edge body -> head, pass 3 confirms
    head, body_first = 4, 6  # c = lt i n ; t = mul i i
    assert lv.live_in[head] == {"i", "n", "one", "s"}
    assert lv.live_out[head] == {"c", "i", "n", "one", "s"}
    assert lv.live_in[body_first] == {"i", "n", "one", "s"}  # n and one are live around the back edge
    assert lv.live_out[8] == {"i", "n", "one", "s"}  # i = add i one: the end of the body, head's live-in
    assert lv.live_in[9] == {"s"}
    assert run(p, [5]) == (0 + 1 + 4 + 9 + 16,)


def test_copy_does_not_interfere_with_its_source():
    p = straight_line(
        [Instr("a", "arg", (0,)), Instr("b", "copy", ("a",)), Instr("c", "add", ("a", "b")), Instr(None, "ret", ("c",))]
    )
    assert "b" not in interference_graph(p)["a"]
    alloc = chaitin_briggs(p, 1 + 1)
    assert alloc.assignment["a"] == alloc.assignment["b"]
    assert all(ins.op != "copy" for ins in alloc.program.instrs())  # the move onto itself is gone
    assert run(alloc.program, [7], registers=2) == run(p, [7]) == (14,)


def _is_clique(g, nodes):
    return all(b in g[a] for a, b in itertools.combinations(nodes, 2))


@pytest.mark.parametrize("seed", range(12))
def test_chaitin_needs_exactly_max_live_on_straight_line_ssa(seed):
    p = random_program(seed, length=25, n_args=3, ssa=True)
    lv = liveness(p)
    m = lv.max_live()
    g = interference_graph(p)
    # the point with m live values is a clique: no allocation can use fewer than m registers
    at = max(range(len(lv.live_out)), key=lambda i: max(len(lv.live_in[i]), len(lv.live_out[i] | lv.defs[i])))
    clique = max([lv.live_in[at], lv.live_out[at] | lv.defs[at]], key=len)
    assert len(clique) == m and _is_clique(g, clique)
    alloc = chaitin_briggs(p, m)
    assert alloc.spilled == [] and alloc.registers_used == m and alloc.rounds == 1
    colour, spilled = color_graph(g, m - 1, spill_costs(p))
    assert spilled, "m - 1 colours cannot colour an m-clique"
    assert all(colour[a] != colour[b] for a in colour for b in g[a] if b in colour)


@pytest.mark.parametrize("alloc_fn", ALLOCATORS)
@pytest.mark.parametrize("seed", range(6))
def test_spilling_below_max_live_keeps_the_results(alloc_fn, seed):
    p = random_program(seed, length=30, n_args=3, ssa=seed % 2 == 0)
    m = liveness(p).max_live()
    args = [3, -5, 7]
    for k in range(2, m):
        alloc = alloc_fn(p, k)
        assert alloc.spilled and alloc.loads > 0 and alloc.stores > 0, alloc.summary()
        assert alloc.registers_used <= k
        assert run(alloc.program, args, registers=k) == run(p, args)


@pytest.mark.parametrize("alloc_fn", ALLOCATORS)
def test_loop_program_allocates_at_every_k(alloc_fn):
    p = sum_of_squares_loop()
    for k in range(1 + 1, 7):
        alloc = alloc_fn(p, k)
        assert (alloc.spilled == []) == (k >= 5), alloc.summary()  # 5 values live at `c = lt i n`
        for n in range(7):
            assert run(alloc.program, [n], registers=k) == run(p, [n]) == (sum(i * i for i in range(n)),)


def test_colouring_spills_less_than_linear_scan_on_the_loop():
    p = sum_of_squares_loop()
    cb, ls = chaitin_briggs(p, 3), linear_scan(p, 3)
    assert cb.loads + cb.stores < ls.loads + ls.stores, (cb.summary(), ls.summary())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    length=st.integers(1, 30),
    ssa=st.booleans(),
    extra=st.integers(0, 3),
    args=st.lists(st.integers(-50, 50), min_size=3, max_size=3),
)
def test_random_programs_compute_the_same_after_allocation(seed, length, ssa, extra, args):
    p = random_program(seed, length=length, n_args=3, ssa=ssa)
    want = run(p, args)
    m = liveness(p).max_live()
    for k in {2, max(2, m - extra), m + extra}:
        for fn in ALLOCATORS:
            alloc = fn(p, k)
            assert run(alloc.program, args, registers=k) == want, alloc.summary()


def test_interpreter_catches_wrong_allocations():
    p = small()
    with pytest.raises(ValueError, match="not one of the 2 registers"):
        run(p, [1, 2], registers=2)
    alloc = chaitin_briggs(p, 2)
    bad = dict(alloc.assignment)
    bad["b"] = bad["a"]  # a and b interfere: sharing a register clobbers a
    from tinylearn.compiler.regalloc import _finish

    wrong = _finish("bad", 2, p, bad, {}, 1)
    assert run(wrong.program, [1, 2], registers=2) != run(p, [1, 2])
    with pytest.raises(ValueError, match="before any definition"):
        run(straight_line([Instr(None, "ret", ("x",))]))


def test_bad_input():
    p = small()
    for k in (0, -1, "3", 2.0, True):
        with pytest.raises(ValueError, match="k"):
            chaitin_briggs(p, k)
    with pytest.raises(ValueError, match="k=1"):
        linear_scan(p, 1)  # add a b reads two registers at once
    with pytest.raises(ValueError, match="unknown"):
        liveness([Instr("a", "div", ("b", "c"))])
    with pytest.raises(ValueError, match="bnz"):
        liveness(Program((Block("x", (Instr(None, "bnz", ("c",)), Instr(None, "ret", ()))),)))
    with pytest.raises(ValueError, match="unknown label"):
        liveness(Program((Block("x", (), ("nowhere",)),)))
    with pytest.raises(ValueError, match="registers"):
        run(p, [1, 2], registers=0)
    with pytest.raises(ValueError, match="args"):
        run(p, [1])
    with pytest.raises(TypeError, match="program"):
        liveness("a = add b c")


def test_reused_names_can_need_more_than_max_live():
    """a-b, b-c, c-a overlap pairwise at different points: a triangle with max-live 2; SSA renaming fixes it."""

    def prog(second_a):
        return straight_line(
            [
                Instr("a", "arg", (0,)),
                Instr("b", "add", ("a", "a")),
                Instr("c", "add", ("a", "b")),
                Instr(second_a, "add", ("b", "c")),
                Instr(None, "ret", (second_a, "c")),
            ]
        )

    reused, ssa = prog("a"), prog("a2")
    assert liveness(reused).max_live() == liveness(ssa).max_live() == 2
    g = interference_graph(reused)
    assert _is_clique(g, ["a", "b", "c"])
    assert chaitin_briggs(reused, 2).spilled and not chaitin_briggs(reused, 3).spilled
    ok = chaitin_briggs(ssa, 2)
    assert not ok.spilled and ok.registers_used == 2
    assert run(ok.program, [3], registers=2) == run(reused, [3]) == (6 + 9, 9)  # a = 3, b = 6, c = 9, a2 = 15
