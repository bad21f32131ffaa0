"""Length-bucketed batching, shared-device scheduling, delta-compressed K/V and the adaptive temperature."""

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.inference import (
    GPTConfig,
    TableLM,
    TemperatureController,
    TinyGPT,
    delta_compress,
    delta_decompress,
    delta_stats,
    estimate_footprint,
    form_batches,
    generate_adaptive,
    padding_stats,
    repetition_rate,
    simulate_shared_device,
    weighted_tail_latency,
)
from tinylearn.inference.adaptive_temperature import semantic_consistency

# --- form_batches / padding_stats ---


def test_fifo_vs_bucket_hand_example():
    arrivals = [0.0, 0.01, 0.02, 0.03, 0.15]
    lengths = [10, 100, 12, 90, 5]
    fifo = form_batches(arrivals, lengths, max_batch=2, window=0.1, policy="fifo")
    assert fifo == [[0, 1], [2, 3], [4]]
    bucket = form_batches(arrivals, lengths, max_batch=2, window=0.1, policy="bucket", bucket_width=64)
    assert bucket == [[0, 2], [3, 1], [4]]
    f, b = padding_stats(lengths, fifo), padding_stats(lengths, bucket)
    assert f["slots"] == 2 * 100 + 2 * 90 + 5 and f["real_tokens"] == 217
    assert b["slots"] == 2 * 12 + 2 * 100 + 5 and b["padding"] == 229 - 217 < f["padding"]


def test_every_request_batched_once_and_windows_respected():
    rng = np.random.default_rng(0)
    arr = np.sort(rng.uniform(0, 1, 200)).tolist()
    lens = rng.integers(1, 300, 200).tolist()
    for pol in ("fifo", "bucket"):
        bs = form_batches(arr, lens, 8, 0.25, pol)
        assert sorted(i for b in bs for i in b) == list(range(200))
        assert all(len(b) <= 8 and len({int(arr[i] // 0.25) for i in b}) == 1 for b in bs)
    assert (
        padding_stats(lens, form_batches(arr, lens, 8, 0.25, "bucket"))["padding"]
        < padding_stats(lens, form_batches(arr, lens, 8, 0.25, "fifo"))["padding"]
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(policy="lifo"), "policy"),
        (dict(max_batch=0), "max_batch"),
        (dict(window=0.0), "window"),
        (dict(window=float("nan")), "window"),
        (dict(bucket_width=0), "bucket_width"),
        (dict(lengths=[1]), "lengths"),
        (dict(lengths=[1, 0]), "lengths"),
        (dict(arrivals=[-1.0, 0.0]), "arrivals"),
    ],
)
def test_form_batches_bad_input(kwargs, name):
    args = dict(arrivals=[0.0, 0.1], lengths=[3, 4], max_batch=2, window=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        form_batches(**args)


def test_padding_stats_bad_input():
    with pytest.raises(ValueError, match="batches"):
        padding_stats([1, 2], [])
    with pytest.raises(ValueError, match="batches"):
        padding_stats([1, 2], [[0, 0]])
    with pytest.raises(ValueError, match="batches"):
        padding_stats([1, 2], [[5]])


# --- simulate_shared_device / weighted_tail_latency / estimate_footprint ---


def test_shared_device_hand_trace():
    jobs = [
        dict(arrival=0.0, duration=1.0, slo=10.0, weight=1.0),
        dict(arrival=0.1, duration=1.0, slo=10.0, weight=1.0),
        dict(arrival=0.2, duration=0.5, slo=1.5, weight=5.0),
    ]
    fifo = simulate_shared_device(jobs, "fifo")
    assert fifo["starts"] == [0.0, 1.0, 2.0] and fifo["slo_attainment"] == pytest.approx(2 / 3)
    urg = simulate_shared_device(jobs, "urgency")
    assert urg["starts"] == [0.0, 1.5, 1.0] and urg["slo_attainment"] == 1.0
    assert urg["latencies"][2] == pytest.approx(1.3)
    edf = simulate_shared_device(jobs, "edf")
    assert edf["starts"] == urg["starts"]


def test_urgency_prefers_weight_when_deadlines_tie():
    jobs = [
        dict(arrival=0.0, duration=1.0),
        dict(arrival=0.5, duration=1.0, slo=2.0, weight=1.0),
        dict(arrival=0.5, duration=1.0, slo=2.0, weight=3.0),
    ]
    assert simulate_shared_device(jobs, "urgency")["starts"] == [0.0, 2.0, 1.0]
    assert simulate_shared_device(jobs, "edf")["starts"] == [0.0, 1.0, 2.0]


def test_packing_and_head_of_line_blocking():
    jobs = [
        dict(arrival=0.0, duration=1.0, sm=0.6, bw=0.2),
        dict(arrival=0.0, duration=1.0, sm=0.6, bw=0.2, slo=5.0),
        dict(arrival=0.0, duration=1.0, sm=0.3, bw=0.3, slo=1.0),
    ]
    # fifo: job 1 does not fit next to job 0 and blocks job 2 behind it
    assert simulate_shared_device(jobs, "fifo")["starts"] == [0.0, 1.0, 1.0]
    # edf: the two deadline jobs (2 first, then 1) fit side by side (SM 0.9) and run at once; job 0 waits
    assert simulate_shared_device(jobs, "edf")["starts"] == [1.0, 0.0, 0.0]


def test_shared_device_bad_input():
    with pytest.raises(ValueError, match="policy"):
        simulate_shared_device([dict(arrival=0, duration=1)], "sjf")
    with pytest.raises(ValueError, match="jobs"):
        simulate_shared_device([])
    with pytest.raises(ValueError, match=r"jobs\[0\]"):
        simulate_shared_device([dict(arrival=0)])
    with pytest.raises(ValueError, match=r"jobs\[0\]"):
        simulate_shared_device([dict(arrival=0, duration=0.0)])
    with pytest.raises(ValueError, match=r"jobs\[0\]"):
        simulate_shared_device([dict(arrival=0, duration=1, sm=1.5)])
    with pytest.raises(ValueError, match=r"jobs\[0\]"):
        simulate_shared_device([dict(arrival=0, duration=1, weight=0)])


def test_weighted_tail_latency():
    lat = [1.0, 2.0, 10.0, 20.0]
    w = [2.0, 2.0, 1.0, 1.0]
    assert weighted_tail_latency(lat, w, q=100) == pytest.approx((2 * 2.0 + 1 * 20.0) / 3)
    assert weighted_tail_latency(lat, w, q=0) == pytest.approx((2 * 1.0 + 10.0) / 3)
    with pytest.raises(ValueError, match="weights"):
        weighted_tail_latency(lat, w[:3])
    with pytest.raises(ValueError, match="weights"):
        weighted_tail_latency(lat, [1.0, 1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="q"):
        weighted_tail_latency(lat, w, q=101)


def test_estimate_footprint():
    dec = estimate_footprint(8, 7e9, 4096)
    assert dec["sm"] == pytest.approx(32 / 132) and not dec["compute_bound"]
    assert dec["duration"] == pytest.approx(2 * 7e9 / (4.8e12 * (32 / 132) / 0.5))
    pre = estimate_footprint(2048, 7e9, 4096)
    assert pre["sm"] == 1.0 and pre["compute_bound"] and pre["bw"] < 0.2
    assert pre["duration"] == pytest.approx(2 * 7e9 * 2048 / (132 * 7.5e12))
    assert 0 < dec["bw"] <= 1
    for kwargs, name in [
        (dict(tokens=0), "tokens"),
        (dict(n_params=-1.0), "n_params"),
        (dict(d_model=0), "d_model"),
        (dict(bw_saturation_sm=0.0), "bw_saturation_sm"),
    ]:
        args = dict(tokens=8, n_params=7e9, d_model=4096)
        args.update(kwargs)
        with pytest.raises(ValueError, match=name):
            estimate_footprint(**args)


# --- delta_compress ---


def test_delta_roundtrip_bound_and_keyframes():
    rng = np.random.default_rng(0)
    x = np.cumsum(rng.normal(0, 0.02, (64, 32)), axis=0).astype(np.float32)  # slowly drifting rows
    for thr in (0.0, 0.01, 0.05):
        c = delta_compress(x, thr, keyframe_every=8)
        r = delta_decompress(c)
        assert np.abs(r - x).max() <= thr
        assert all(c["rows"][t][0] == "key" for t in range(0, 64, 8))
        assert np.array_equal(delta_decompress(c, upto=10), r[:10])
    assert delta_stats(delta_compress(x, 0.05, 8))["ratio"] > 2
    # identical rows: only keyframes are stored
    same = np.tile(rng.normal(size=(1, 16)).astype(np.float32), (32, 1))
    s = delta_stats(delta_compress(same, 0.0, 16))
    assert s["stored_bytes"] == 2 * 16 * 4 + 30 * 2 and s["kept_fraction"] == 0.0


def test_delta_never_expands_beyond_counts():
    x = np.random.default_rng(1).normal(size=(40, 16)).astype(np.float32)  # unrelated rows
    c = delta_compress(x, 0.01, 16)
    assert np.array_equal(delta_decompress(c), x)  # every row fell back to a keyframe
    st = delta_stats(c)
    assert st["stored_bytes"] == x.nbytes and st["fallback_rows"] == 40 - 3 and st["kept_fraction"] == 1.0


def test_delta_bad_input():
    with pytest.raises(ValueError, match="x"):
        delta_compress(np.zeros(4, np.float32), 0.1)
    with pytest.raises(ValueError, match="x"):
        delta_compress(np.zeros((4, 4), np.int32), 0.1)
    with pytest.raises(ValueError, match="threshold"):
        delta_compress(np.zeros((4, 4), np.float32), -0.1)
    with pytest.raises(ValueError, match="keyframe_every"):
        delta_compress(np.zeros((4, 4), np.float32), 0.1, keyframe_every=0)
    c = delta_compress(np.zeros((4, 4), np.float32), 0.1)
    with pytest.raises(ValueError, match="upto"):
        delta_decompress(c, upto=5)
    with pytest.raises(ValueError, match="c"):
        delta_decompress({})
    with pytest.raises(ValueError, match="c"):
        delta_stats({})


# --- adaptive temperature ---


def test_repetition_rate():
    assert repetition_rate([1, 2, 3, 4]) == 0.0
    assert repetition_rate([5, 5, 5, 5]) == 0.75
    with pytest.raises(ValueError, match="tokens"):
        repetition_rate([])


def test_controller_rules():
    flat = np.zeros(8)  # perplexity 8 under T=1
    c = TemperatureController(t0=0.5, target_repetition=0.2, max_perplexity=4.0, window=4, step=0.1)
    for _ in range(4):
        t = c.update(1, flat)  # repetitive AND too surprising: the perplexity rule wins
    assert t == pytest.approx(0.5 / 1.1)
    c = TemperatureController(t0=0.5, target_repetition=0.2, max_perplexity=100.0, window=4, step=0.1)
    temps = [c.update(1, flat) for _ in range(6)]
    assert temps[:3] == [0.5] * 3 and temps[3] == pytest.approx(0.55) and temps[5] == pytest.approx(0.5 * 1.1**3)
    c = TemperatureController(t0=0.5, target_repetition=0.9, max_perplexity=100.0, window=4, t_max=0.6)
    assert [c.update(i, flat) for i in range(6)][-1] == 0.5  # distinct tokens, low perplexity: unchanged


def test_controller_bad_input():
    for kwargs, name in [
        (dict(t0=0.0), "t0"),
        (dict(t0=3.0), "t0"),
        (dict(target_repetition=1.0), "target_repetition"),
        (dict(max_perplexity=1.0), "max_perplexity"),
        (dict(window=1), "window"),
        (dict(step=0.0), "step"),
    ]:
        with pytest.raises(ValueError, match=name):
            TemperatureController(**kwargs)


def test_generate_adaptive_table_lm_escapes_a_loop():
    # a table LM that strongly prefers repeating token 0: a fixed low temperature loops, the controller escapes
    table = np.full((8, 8), 0.0)
    table[:, 0] = 3.0
    lm = TableLM(table)
    fixed = generate_adaptive(lm, [0], 64, temperature=0.1, seed=0)
    assert fixed["tokens"] == [0] * 64 and fixed["repetition"] == pytest.approx(15 / 16)
    ctl = TemperatureController(t0=0.1, target_repetition=0.3, max_perplexity=7.9, window=8)
    adapt = generate_adaptive(lm, [0], 64, controller=ctl, seed=0)
    assert adapt["repetition"] < fixed["repetition"] and max(adapt["temperatures"]) > 0.1
    assert len(adapt["tokens"]) == len(adapt["temperatures"]) == 64
    again = generate_adaptive(lm, [0], 64, controller=TemperatureController(0.1, 0.3, 7.9, 8), seed=0)
    assert again["tokens"] == adapt["tokens"]


def test_generate_adaptive_tinygpt_and_bad_input():
    tl.manual_seed(0)
    model = TinyGPT.from_config(GPTConfig(16, 16, 2, 1, 64))
    out = generate_adaptive(model, [1, 2], 20, temperature=0.5, seed=1)
    assert len(out["tokens"]) == 20 and out["perplexity"] > 1
    with pytest.raises(ValueError, match="controller, temperature"):
        generate_adaptive(model, [1], 20)
    with pytest.raises(ValueError, match="controller, temperature"):
        generate_adaptive(model, [1], 20, controller=TemperatureController(), temperature=1.0)
    with pytest.raises(ValueError, match="temperature"):
        generate_adaptive(model, [1], 20, temperature=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_adaptive(model, [1], 8, temperature=1.0)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate_adaptive(model, [], 20, temperature=1.0)


# --- adaptive temperature: the semantic-consistency signal ---


def test_semantic_consistency():
    e = np.eye(4)
    assert semantic_consistency(e, [0, 0], [0]) == pytest.approx(1.0)
    assert semantic_consistency(e, [0], [1, 2]) == 0.0  # orthogonal means
    assert semantic_consistency(np.vstack([e, -e]), [0], [4]) == pytest.approx(-1.0)
    assert semantic_consistency(e, [0, 1], [0]) == pytest.approx(1 / np.sqrt(2))
    assert semantic_consistency(np.zeros((4, 2)), [0], [1]) == 0.0  # zero mean: no direction
    with pytest.raises(ValueError, match="window"):
        semantic_consistency(e, [0], [4])
    with pytest.raises(ValueError, match="context"):
        semantic_consistency(e, [], [1])
    with pytest.raises(ValueError, match="embeddings"):
        semantic_consistency(np.ones(4), [0], [1])
    with pytest.raises(ValueError, match="embeddings"):
        semantic_consistency(np.full((2, 2), np.nan), [0], [1])


def test_controller_consistency_rule_fires():
    # the window drifts away from the context ([0, 0, 0]): consistency falls from 1 to 0 and the temperature drops
    flat = np.zeros(8)  # perplexity 8, under the bound of 100: only the consistency rule can lower the temperature
    kw = dict(t0=0.5, target_repetition=0.9, max_perplexity=100.0, window=4, step=0.1)
    c = TemperatureController(**kw, min_consistency=0.3, embeddings=np.eye(8))
    c.set_context([0, 0, 0])
    temps = [c.update(tok, flat) for tok in [0, 0, 0, 0, 1, 2, 3, 4, 5]]
    assert np.isnan(c.consistency[:3]).all() and c.consistency[3] == pytest.approx(1.0)
    assert c.consistency[-2:] == [0.0, 0.0] and c.consistency[5] > 0.3  # windows [1,2,3,4], [2,3,4,5]
    assert temps[:7] == [0.5] * 7 and temps[7] == pytest.approx(0.5 / 1.1) and temps[8] == pytest.approx(0.5 / 1.1**2)
    # off (the default) or measured only: the same temperatures as the controller without the signal
    plain = TemperatureController(**kw)
    measured = TemperatureController(**kw, embeddings=np.eye(8))
    measured.set_context([0, 0, 0])
    toks = [0, 0, 0, 0, 1, 2, 3, 4, 5]
    assert [plain.update(t, flat) for t in toks] == [measured.update(t, flat) for t in toks] == [0.5] * 9
    assert measured.consistency == c.consistency and plain.consistency[-1] != plain.consistency[-1]  # NaN


def test_controller_consistency_precedence():
    flat = np.zeros(8)
    # repetitive (raise) AND drifting (lower): lowering wins
    c = TemperatureController(0.5, 0.2, 100.0, 4, min_consistency=0.5, embeddings=np.eye(8))
    c.set_context([1])
    assert [c.update(0, flat) for _ in range(4)][-1] == pytest.approx(0.5 / 1.1)
    # too surprising AND drifting: one step down, not two
    c = TemperatureController(0.5, 0.9, 4.0, 4, min_consistency=0.5, embeddings=np.eye(8))
    c.set_context([1])
    assert [c.update(0, flat) for _ in range(4)][-1] == pytest.approx(0.5 / 1.1)


def test_controller_consistency_bad_input():
    e = np.eye(8)
    for kwargs, err, name in [
        (dict(min_consistency=1.0, embeddings=e), ValueError, "min_consistency"),
        (dict(min_consistency=-1.5, embeddings=e), ValueError, "min_consistency"),
        (dict(min_consistency=float("nan"), embeddings=e), ValueError, "min_consistency"),
        (dict(min_consistency="0.5", embeddings=e), TypeError, "min_consistency"),
        (dict(min_consistency=0.5), ValueError, "embeddings"),
        (dict(min_consistency=0.5, embeddings=np.ones(8)), ValueError, "embeddings"),
        (dict(embeddings=np.full((2, 2), np.inf)), ValueError, "embeddings"),
    ]:
        with pytest.raises(err, match=name):
            TemperatureController(**kwargs)
    c = TemperatureController(min_consistency=0.0, embeddings=e)
    with pytest.raises(ValueError, match="tokens"):
        c.set_context([8])
    with pytest.raises(ValueError, match="token"):
        c.update(9, np.zeros(10))


def test_generate_adaptive_reports_consistency():
    tl.manual_seed(0)
    model = TinyGPT.from_config(GPTConfig(16, 16, 2, 1, 64))
    out = generate_adaptive(model, [1, 2], 24, temperature=1.0, seed=0)
    cons = out["consistency"]
    assert len(cons) == 24 and np.isnan(cons[:15]).all() and all(-1 <= v <= 1 for v in cons[15:])
    text = [1, 2] + out["tokens"]
    e = model.tok_emb.weight.data
    assert cons[20] == pytest.approx(semantic_consistency(e, text[: 2 + 5], out["tokens"][5:21]))
    # a controller with the rule on steers with the same table; the off controller samples like a fixed run
    ctl = TemperatureController(t0=1.0, min_consistency=0.99, embeddings=e)
    on = generate_adaptive(model, [1, 2], 24, controller=ctl, seed=0)
    assert on["temperatures"][-1] < 1.0 and ctl.context == [1, 2] and len(ctl.consistency) == 24
    off = generate_adaptive(model, [1, 2], 24, controller=TemperatureController(1.0, 0.99, 1e9), seed=0)
    assert off["tokens"] == out["tokens"] and off["consistency"] == pytest.approx(cons, nan_ok=True)
    lm = TableLM(np.zeros((4, 4)))
    assert generate_adaptive(lm, [0], 16, temperature=1.0)["consistency"] is None
    assert len(generate_adaptive(lm, [0], 16, temperature=1.0, embeddings=np.eye(4))["consistency"]) == 16


# --- tinygrad prefill and decode on the same weights ---


@pytest.mark.slow  # tinygrad compiles its kernels with clang (NOOPT=1 here: a few seconds)
@pytest.mark.parametrize("cfg", [GPTConfig(37, 32, 4, 2, 32, n_kv_heads=2), GPTConfig(29, 16, 2, 1, 32, rope=False)])
def test_tinygrad_prefill_then_decode_match_torch(cfg) -> None:
    torch = pytest.importorskip("torch")
    from tinylearn.bench.comparators import import_tinygrad, tinygrad_status
    from tinylearn.inference import torch_reference
    from tinylearn.inference.tinygrad_ref import build_decode_step, build_prefill, jit_compiled
    from tinylearn.testing import assert_close

    ok, reason = tinygrad_status()
    if not ok:
        pytest.skip(reason)
    tg = import_tinygrad()
    torch.manual_seed(0)
    ref = torch_reference(cfg).eval()
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 7)
    with torch.no_grad():
        exp_pre, past = ref(torch.from_numpy(ids[None, :6]), use_cache=True)
        exp_dec = ref(torch.from_numpy(ids[None, 6:]), past_key_values=past, use_cache=True)[0]
    prefill, make = build_prefill(tg, cfg, sd, 6, 8)
    run, seconds = jit_compiled(tg, prefill, make(ids[:6]), noopt=True)
    outs = run()  # a replay of the captured kernels
    assert seconds > 0 and len(outs) == 1 + 2 * cfg.n_layers
    assert_close(outs[0].numpy(), exp_pre.numpy()[0], np.float32)
    assert outs[1].shape == (cfg.kv_heads, 8, cfg.head_dim) and not outs[1].numpy()[:, 6:].any()  # zeros after P
    step, make_step = build_decode_step(tg, cfg, sd, 8)
    caches = [tg.Tensor(c.numpy()) for c in outs[1:]]
    dec = jit_compiled(tg, step, make_step(int(ids[6]), 6, caches), noopt=True)[0]()
    assert_close(dec[0].numpy(), exp_dec.numpy()[0], np.float32)
    with pytest.raises(ValueError, match="tokens"):
        make(ids[:5])
    with pytest.raises(ValueError, match="prompt_len"):
        build_prefill(tg, cfg, sd, 9, 8)
    with pytest.raises(TypeError, match="noopt"):
        jit_compiled(tg, prefill, make(ids[:6]), noopt=1)
