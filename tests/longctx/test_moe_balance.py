"""The Switch load-balancing loss actually balances a router (issue 44): a top-1 tl.nn.MoE trained with Adam on
skewed tokens (most of them pick expert 0 at step 0) reaches max/mean expert load <= 1.2 on a held-out batch within
STEPS steps with aux_loss="switch"; the same run without the aux loss is reported (and stays more imbalanced)."""

from __future__ import annotations

import pytest

from tinylearn.longctx.moe_bench import train_balance

STEPS = 150


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {kind: train_balance(aux_loss=kind, steps=STEPS, seed=0) for kind in ("switch", "none")}


def test_skewed_tokens_start_imbalanced(runs: dict[str, dict]) -> None:
    for kind, r in runs.items():
        assert r["initial_imbalance"] > 2.0, (kind, r["imbalance"][:3])  # one expert takes over half the tokens


def test_switch_aux_loss_balances_the_router(runs: dict[str, dict]) -> None:
    sw, no = runs["switch"], runs["none"]
    print(f"max/mean expert load, step -> value: switch {sw['imbalance']}; none {no['imbalance']}")
    assert sw["final_imbalance"] <= 1.2, sw["imbalance"]
    assert all(v <= 1.2 for _, v in sw["imbalance"][-4:]), sw["imbalance"]  # settled, not a lucky last step
    first = next(step for step, v in sw["imbalance"] if v <= 1.2)
    print(
        f"switch aux loss reached <= 1.2 at step {first}; without it the final max/mean is {no['final_imbalance']:.3f}"
    )
    assert no["final_imbalance"] > 2.0, no["imbalance"]  # the task gradient alone leaves expert 0 overloaded
    # the task is still learnt with the aux loss on
    assert sw["loss"][-1] < sw["loss"][0]
