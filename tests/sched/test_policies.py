"""Policy orders on hand-made JobStates, preemption decisions, EASY backfill's reservation guarantee (seeded
property loop), weighted fair sharing's convergence to the weight ratio, and no over-commitment by any policy."""

from __future__ import annotations

import random

import pytest

from tinylearn.sched.jobs import Job, JobState, fits, take
from tinylearn.sched.policies import (
    EDF,
    FIFO,
    POLICIES,
    SJF,
    SRPT,
    Backfill,
    PriorityAging,
    WeightedFair,
    WeightedUrgency,
    make_policy,
    shadow_time,
)

FREE4 = {"cpu": 4.0, "mem_gb": 8.0}


def mk(name: str, steps: int = 10, est: float = 0.1, cpu: float = 1, submit: float = 0.0, **kw) -> JobState:
    return JobState(Job(name, steps, demand={"cpu": cpu}, est_step_s=est, **kw), submit_t=submit)


def names(jobs: list[JobState]) -> list[str]:
    return [j.name for j in jobs]


def test_fifo_sjf_edf_orders() -> None:
    jobs = [mk("a", 30, submit=0), mk("b", 5, submit=1, deadline_s=9), mk("c", 10, submit=2, deadline_s=3)]
    assert names(FIFO().select(jobs, [], FREE4, 3.0)[0]) == ["a", "b", "c"]
    assert names(SJF().select(jobs, [], FREE4, 3.0)[0]) == ["b", "c", "a"]
    assert names(EDF().select(jobs, [], FREE4, 3.0)[0]) == ["c", "b", "a"]  # c: 2+3=5 < b: 1+9=10 < a: none


def test_head_of_line_blocking_without_backfill() -> None:
    jobs = [mk("big", cpu=2, submit=0), mk("small", submit=1)]
    assert FIFO().select(jobs, [], {"cpu": 1.0}, 1.0) == ([], [])


def test_priority_aging_overtakes() -> None:
    old, new = mk("old", submit=0, priority=0), mk("new", submit=10, priority=5)
    assert names(PriorityAging(rate=0.1).select([old, new], [], FREE4, 10.0)[0]) == ["new", "old"]  # 1 < 5
    assert names(PriorityAging(rate=1.0).select([old, new], [], FREE4, 10.0)[0]) == ["old", "new"]  # 10 > 5
    with pytest.raises(ValueError, match="rate"):
        PriorityAging(rate=-1)


def test_weighted_urgency_heap_order() -> None:
    # urgency w / slack at now=0: a 1/10, b 5/10, c 1/1.5; d overdue first; e (no deadline) last
    jobs = [
        mk("a", deadline_s=10, weight=1.0),
        mk("b", deadline_s=10, weight=5.0),
        mk("c", deadline_s=1.5, weight=1.0),
        mk("e"),
        mk("d", submit=-5, deadline_s=1, weight=0.5),
    ]
    assert names(WeightedUrgency().select(jobs, [], {"cpu": 8.0}, 0.0)[0]) == ["d", "c", "b", "a", "e"]


def test_srpt_preempts_and_does_not_thrash() -> None:
    long = mk("long", steps=100, est=0.1)
    long.state = "running"
    short = mk("short", steps=2, est=0.1, submit=1)
    start, pre = SRPT().select([short], [long], {"cpu": 0.0}, 1.0)
    assert names(start) == ["short"] and names(pre) == ["long"]
    longer = mk("longer", steps=200, est=0.1)
    assert SRPT().select([longer], [long], {"cpu": 0.0}, 1.0) == ([], [])
    twin = mk("twin", steps=100, est=0.1, submit=-1)  # equal remaining work: the running job keeps its core
    assert SRPT().select([twin], [long], {"cpu": 0.0}, 1.0) == ([], [])


def test_backfill_starts_short_job_not_long_one() -> None:
    run = mk("run", steps=10, est=0.1)  # ends at now + 1 s
    head = mk("head", cpu=2, submit=0)
    short = mk("short", steps=5, est=0.1, submit=1)  # 0.5 s < 1 s: fits before the reservation
    long = mk("long", steps=50, est=0.1, submit=2)  # 5 s: would delay the head
    start, _ = Backfill().select([head, short, long], [run], {"cpu": 1.0}, 0.0)
    assert names(start) == ["short"]
    assert names(FIFO().select([head, short, long], [run], {"cpu": 1.0}, 0.0)[0]) == []


def _random_state(rng: random.Random) -> tuple[list[JobState], list[JobState], dict[str, float]]:
    cap = {"cpu": float(rng.randint(2, 6))}
    running, free = [], dict(cap)
    for i in range(rng.randint(0, 4)):
        js = mk(f"r{i}", steps=rng.randint(1, 20), est=rng.uniform(0.05, 1.0), cpu=rng.randint(1, 2))
        if fits(js.job.demand, free):
            js.state, js.start_t = "running", 0.0
            js.done_steps = rng.randint(0, js.job.steps - 1)
            js.attained_s = rng.uniform(0, 5)
            running.append(js)
            free = take(free, js.job.demand)
    waiting = [
        mk(
            f"w{i}",
            steps=rng.randint(1, 30),
            est=rng.uniform(0.05, 1.0),
            cpu=rng.randint(1, int(cap["cpu"])),
            submit=rng.uniform(0, 3),
            deadline_s=rng.choice([None, rng.uniform(0.5, 20)]),
            tenant=rng.choice(["x", "y"]),
            priority=rng.randint(0, 3),
        )
        for i in range(rng.randint(1, 7))
    ]
    return waiting, running, free


def test_backfill_never_delays_the_head_reservation() -> None:
    rng = random.Random(0)
    checked = 0
    for _ in range(400):
        waiting, running, free = _random_state(rng)
        now = 3.0
        order = sorted(waiting, key=lambda j: FIFO().key(j, now))
        start, _ = Backfill().select(waiting, running, free, now)
        # the head: the first job of the base order that the plain policy would not start
        plain = FIFO().select(waiting, running, free, now)[0]
        blocked = [j for j in order if j not in plain]
        if not blocked:
            continue
        head = blocked[0]
        assert head not in start
        before, _ = shadow_time(
            head, [*running, *plain], take(free, {"cpu": sum(j.job.demand["cpu"] for j in plain)}), now
        )
        after_free = take(free, {"cpu": sum(j.job.demand["cpu"] for j in start)})
        after, _ = shadow_time(head, [*running, *start], after_free, now)
        assert after <= before + 1e-9, (head.name, before, after)
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_policy_over_commits(name: str) -> None:
    rng = random.Random(1)
    for _ in range(200):
        waiting, running, free = _random_state(rng)
        pol = make_policy(name)
        start, pre = pol.select(waiting, running, free, 3.0)
        assert all(j in running for j in pre) and all(j in waiting for j in start)
        avail = dict(free)
        for j in pre:
            avail = take(avail, j.job.demand, sign=-1)
        for j in start:
            assert fits(j.job.demand, avail), (name, j.name, avail)
            avail = take(avail, j.job.demand)
    if name == "weighted_fair":
        pol = WeightedFair(preemptive=True)
        for _ in range(200):
            waiting, running, free = _random_state(rng)
            start, pre = pol.select(waiting, running, free, 3.0)
            avail = dict(free)
            for j in pre:
                avail = take(avail, j.job.demand, sign=-1)
            for j in start:
                assert fits(j.job.demand, avail)
                avail = take(avail, j.job.demand)


def test_weighted_fair_converges_to_weight_ratio() -> None:
    # two tenants with weights 2:1, unit 1-core jobs of 1 s on 2 cores, always backlogged; a tick loop
    pol, cap = WeightedFair(), {"cpu": 2.0}
    queue = [
        mk(f"{t}{i}", steps=1, est=1.0, tenant=t, weight=w, submit=i)
        for i in range(400)
        for t, w in (("a", 2.0), ("b", 1.0))
    ]
    running: list[JobState] = []
    service = {"a": 0.0, "b": 0.0}
    for now in range(300):
        for js in running:
            js.attained_s, js.state = 1.0, "done"
            service[js.job.tenant] += 1.0
        running = []
        free = dict(cap)
        start, _ = pol.select(queue, running, free, float(now))
        for js in start:
            queue.remove(js)
            js.state = "running"
            running.append(js)
    ratio = service["a"] / service["b"]
    assert abs(ratio - 2.0) < 0.1, ratio


def test_weighted_fair_quota_caps_a_tenant() -> None:
    jobs = [mk(f"a{i}", tenant="a", submit=i) for i in range(3)]
    start, _ = WeightedFair(quota={"a": {"cpu": 1}}).select(jobs, [], {"cpu": 4.0}, 0.0)
    assert names(start) == ["a0"]
    with pytest.raises(ValueError, match="quota"):
        WeightedFair(quota={"a": {"cpu": -1}})


def test_weighted_fair_preempts_over_share_tenant_once() -> None:
    a0, a1 = mk("a0", tenant="a", weight=2.0), mk("a1", tenant="a", weight=2.0)
    a0.state, a0.start_t, a1.state, a1.start_t = "running", 0.0, "running", 1.0
    b0 = mk("b0", tenant="b", weight=1.0, submit=2)
    pol = WeightedFair(preemptive=True)
    start, pre = pol.select([b0], [a0, a1], {"cpu": 0.0}, 2.0)
    assert names(start) == ["b0"] and names(pre) == ["a1"]  # the youngest job of the over-share tenant
    # now a waits with one core, b holds one: evicting b would not improve the weighted max-min: stable
    b0.state = "running"
    a1.state = "paused"
    assert pol.select([a1], [a0, b0], {"cpu": 0.0}, 3.0) == ([], [])
    assert WeightedFair().select([b0], [a0, a1], {"cpu": 0.0}, 2.0) == ([], [])  # non-preemptive variant


def test_make_policy_rejects_unknown() -> None:
    assert isinstance(make_policy("sjf"), SJF)
    with pytest.raises(ValueError, match="policy: .*'nope'"):
        make_policy("nope")
    with pytest.raises(ValueError, match="base"):
        Backfill(base=SRPT())
