"""tinylearn.parallel on real processes (tl.dist.launch, gloo): one launch per world size runs every check
(tinylearn.parallel.workers.all_checks) and the tests assert on what the ranks measured.

Equality claims (why bitwise or not):
* ZeRO-1 all-reduces the flat gradients exactly like the reference DDP (tl.dist ring, avg): parameters and Adam
  state are bitwise equal to DDP + torch.optim.Adam at any world size.
* ZeRO-2/3 reduce-scatter each gradient (ring, a different summation order): bitwise for 2 ranks (a+b = b+a),
  within fp32 rounding (1e-6) for 4.
* Tensor and pipeline parallel results differ from the dense / single-process model only by fp32 summation order.
"""

from __future__ import annotations

import pytest

import tinylearn as tl
from tinylearn.parallel import workers

FP32_TOL = 1e-6  # absolute, values O(1): a few ulps of accumulated rounding


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def ranks(request: pytest.FixtureRequest) -> list[dict]:
    return tl.dist.launch(workers.all_checks, request.param, timeout_s=180)


def test_zero_matches_ddp(ranks: list[dict]) -> None:
    for r in ranks:
        z = r["zero"]
        n = z["world_size"]
        assert z["stage1_bitwise"], z["stage1_maxdiff"]
        for stage in (2, 3):
            if n == 2:
                assert z[f"stage{stage}_bitwise"], z[f"stage{stage}_maxdiff"]
            else:
                assert z[f"stage{stage}_maxdiff"] < FP32_TOL
        assert z["resume_bitwise"]  # plain Adam state -> ZeroOptimizer.load_state_dict -> same next step
        assert z["stage3_list_maxdiff"] == (0.0 if n == 2 else pytest.approx(0.0, abs=FP32_TOL))
        assert z["stage3_list_freed"]  # outside gather_parameters() a stage-3 rank holds no full parameter


def test_zero_memory_matches_formula(ranks: list[dict]) -> None:
    for r in ranks:
        z = r["zero"]
        for stage in (1, 2, 3):
            assert z[f"stage{stage}_memory"] == z[f"stage{stage}_formula"]  # fp32 params: K = 8
            assert z[f"bf16_stage{stage}_memory"] == z[f"bf16_stage{stage}_formula"]  # bf16 + fp32 master: K = 12
        n = z["world_size"]
        m1, m3 = z["stage1_memory"], z["stage3_memory"]
        assert m3["params"] * n == m1["params"] and m3["optimizer_state"] == m1["optimizer_state"]


def test_zero_state_dict_is_consolidated(ranks: list[dict]) -> None:
    for r in ranks:
        z = r["zero"]
        for stage in (1, 2, 3):
            assert z[f"stage{stage}_state_steps_equal"] and z[f"stage{stage}_plain_loaded_step"] == z["steps"]
            limit = 0.0 if stage == 1 or z["world_size"] == 2 else FP32_TOL
            assert z[f"stage{stage}_state_maxdiff"] <= limit


def test_tensor_parallel_equals_dense(ranks: list[dict]) -> None:
    for r in ranks:
        t = r["tp"]
        keys = ("out_maxdiff", "xgrad_maxdiff", "wgrad_maxdiff", "standalone_out_maxdiff", "standalone_xgrad_maxdiff")
        for key in keys:
            assert t[key] < FP32_TOL * 5, (key, t[key])
        assert t["seeded_init_equal"]
        msgs = t["bad_inputs"]
        assert msgs["column_out_features"].startswith("ValueError: out_features")
        assert msgs["row_in_features"].startswith("ValueError: in_features")
        assert msgs["column_input_shape"].startswith("ValueError: input") and "(2, 5)" in msgs["column_input_shape"]
        assert msgs["row_parallel_input_shape"].startswith("ValueError: input")
        assert msgs["zero_int_param"].startswith("TypeError: params[0]")
        assert msgs["zero_empty"].startswith("ValueError: params")
        assert msgs["pipeline_batch"].startswith("ValueError: inputs") and "m=3" in msgs["pipeline_batch"]


def test_tensor_parallel_allreduce_count(ranks: list[dict]) -> None:
    for r in ranks:
        t = r["tp"]
        assert t["fwd_allreduces"] == 2  # g after attention, g after the MLP
        assert t["step_allreduces"] == t["formula_allreduces"] == tl.parallel.allreduces_per_layer() == 4
        # Column(gather_output) + Row(scatter input): f bwd + g fwd = 2 all-reduces, gather fwd + gather bwd
        assert t["standalone_counts"] == {"all_reduce": 2, "all_gather": 2}


def test_pipeline_equals_single_process(ranks: list[dict]) -> None:
    for r in ranks:
        p = r["pp"]
        n = p["world_size"]
        for sched in ("gpipe", "1f1b"):
            assert p[f"{sched}_loss_diff"] < FP32_TOL
            assert p[f"{sched}_grad_maxdiff"] < FP32_TOL
            ev = p[f"{sched}_events"]
            ops = tl.parallel.pipeline_schedule(sched, n, 4)[ranks.index(r)]
            assert [(k, mb) for k, mb, _, _ in ev] == [tuple(op) for op in ops]  # ran in schedule order
            assert all(e >= s for _, _, s, e in ev)
        stage = ranks.index(r)
        assert p["gpipe_peak_held"] == 4 and p["1f1b_peak_held"] == min(n - stage, 4)


def test_map_reduce_word_count(ranks: list[dict]) -> None:
    for r in ranks:
        m = r["mr"]
        assert m["plain_equal"] and m["combined_equal"]  # == collections.Counter of the whole corpus
        plain, comb = m["plain_stats"], m["combined_stats"]
        assert comb["pairs_shuffled"] <= plain["pairs_shuffled"] < plain["pairs_mapped"] + 1
        assert comb["pairs_shuffled"] <= m["distinct_words_here"]  # after combining: at most one pair per word
    assert sum(r["mr"]["plain_stats"]["keys_reduced"] for r in ranks) == ranks[0]["mr"]["n_keys"]  # each key once


def test_dp_times_tp_equals_single_process(ranks: list[dict]) -> None:
    for r in ranks:  # world 2: dp=2 x tp=1; world 4: dp=2 x tp=2 (two process groups per rank)
        c = r["dp_tp"]
        assert c["dp"] * c["tp"] == len(ranks)
        assert c["grad_maxdiff"] < FP32_TOL, c
