"""tl.inference model, sampling and speculative decoding: TinyGPT vs the torch reference (same weights), KV cache
equivalence, RoPE, top-k/top-p vs a torch implementation, the speculative rejection rule (exact + chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sps

import tinylearn as tl
from tinylearn.inference import (
    GPTConfig,
    TableLM,
    TinyGPT,
    accept_draft,
    filter_probs,
    generate,
    residual_distribution,
    rope_tables,
    speculative_generate,
    torch_reference,
)
from tinylearn.testing import assert_close

CONFIGS = [
    dict(vocab_size=37, d_model=32, n_heads=4, n_layers=2, max_seq_len=48),  # MHA
    dict(vocab_size=37, d_model=32, n_heads=4, n_layers=2, max_seq_len=48, n_kv_heads=2),  # GQA
    dict(vocab_size=37, d_model=32, n_heads=4, n_layers=1, max_seq_len=48, n_kv_heads=1),  # MQA
    dict(vocab_size=37, d_model=24, n_heads=2, n_layers=2, max_seq_len=48, rope=False),  # learned positions
]


def pair(cfg: dict, seed: int = 0) -> tuple[TinyGPT, torch.nn.Module]:
    torch.manual_seed(seed)
    ref = torch_reference(cfg)
    with torch.no_grad():  # spread the weights a little so logits are far from ties
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model = TinyGPT.from_config(cfg).load_torch_state_dict(ref.state_dict())
    return model, ref


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha", "gqa", "mqa", "abs_pos"])
def test_logits_match_torch(cfg: dict) -> None:
    model, ref = pair(cfg)
    ids = np.random.default_rng(1).integers(0, cfg["vocab_size"], (3, 20))
    with tl.no_grad():
        out = model(ids).numpy()
    exp = ref(torch.from_numpy(ids)).detach().numpy()
    assert out.shape == (3, 20, cfg["vocab_size"])
    assert_close(out, exp, np.float32)


def test_state_dict_names_match_torch() -> None:
    model, ref = pair(CONFIGS[1])
    assert list(model.state_dict()) == list(ref.state_dict())
    assert model.config == GPTConfig(**CONFIGS[1])


def test_gradients_match_torch() -> None:
    cfg = CONFIGS[1]
    model, ref = pair(cfg)
    ids = np.random.default_rng(2).integers(0, cfg["vocab_size"], (2, 12))
    tgt = np.random.default_rng(3).integers(0, cfg["vocab_size"], (2 * 12,))
    loss = tl.nn.functional.cross_entropy(model(ids).reshape(24, cfg["vocab_size"]), tgt)
    loss.backward()
    tl_loss = ref(torch.from_numpy(ids)).reshape(24, -1)
    torch.nn.functional.cross_entropy(tl_loss, torch.from_numpy(tgt)).backward()
    grads = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        assert_close(grads[name].grad.numpy(), p.grad.numpy(), np.float32, atol=1e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=["mha", "gqa", "mqa"])
def test_kv_cache_incremental_equals_full(cfg: dict) -> None:
    model, ref = pair(cfg)
    ids = np.random.default_rng(4).integers(0, cfg["vocab_size"], (2, 15))
    with tl.no_grad():
        full = model(ids).numpy()
        cache = model.new_cache(2)
        parts = [model(ids[:, a:b], cache).numpy() for a, b in [(0, 7), (7, 8), (8, 9), (9, 15)]]
    assert cache.length == 15
    assert_close(np.concatenate(parts, axis=1), full, np.float32)
    # torch reference with past_key_values gives the same incremental logits
    logits, past = ref(torch.from_numpy(ids[:, :7]), use_cache=True)
    step, past = ref(torch.from_numpy(ids[:, 7:8]), past_key_values=past, use_cache=True)
    assert_close(step.detach().numpy(), full[:, 7:8], np.float32)


def test_rope_relative_position() -> None:
    """RoPE: <rope(q, m), rope(k, n)> depends on m - n only."""
    cos, sin = rope_tables(64, 8)
    rng = np.random.default_rng(5)
    q, k = tl.Tensor(rng.standard_normal(8).astype(np.float32)), tl.Tensor(rng.standard_normal(8).astype(np.float32))
    from tinylearn.inference import apply_rope

    def dot(m: int, n: int) -> float:
        return float((apply_rope(q, cos[m], sin[m]) * apply_rope(k, cos[n], sin[n])).sum().item())

    assert abs(dot(10, 3) - dot(40, 33)) < 1e-4
    assert abs(dot(5, 5) - float((q * k).sum().item())) < 1e-4
    assert abs(dot(10, 3) - dot(10, 4)) > 1e-3


@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (5, 8), (8,)])
def test_rope_op_matches_the_composite_and_torch(shape: tuple[int, ...]) -> None:
    """apply_rope is one op (inference.model.Rope): forward and gradient equal torch's rotate-half formula on a
    non-contiguous input, and fp64 gradcheck passes."""
    from tinylearn.autograd import gradcheck
    from tinylearn.inference import apply_rope

    rng = np.random.default_rng(2)
    cos, sin = rope_tables(16, 8)
    t = shape[-2] if len(shape) > 1 else 1
    c, s = (cos[3 : 3 + t], sin[3 : 3 + t]) if len(shape) > 1 else (cos[3], sin[3])
    base = rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(np.float32)
    xa = base[..., ::2]  # non-contiguous
    g = rng.standard_normal(shape).astype(np.float32)
    x = tl.Tensor(xa, requires_grad=True)
    (apply_rope(x, c, s) * tl.Tensor(g)).sum().backward()
    xt = torch.tensor(xa, requires_grad=True)
    rot = torch.cat([-xt[..., 4:], xt[..., :4]], dim=-1)
    yt = xt * torch.from_numpy(c) + rot * torch.from_numpy(s)
    (yt * torch.from_numpy(g)).sum().backward()
    assert_close(apply_rope(tl.Tensor(xa), c, s).numpy(), yt.detach().numpy(), np.float32)
    assert_close(x.grad.numpy(), xt.grad.numpy(), np.float32)
    x64 = tl.Tensor(xa.astype(np.float64), requires_grad=True)
    assert gradcheck(lambda v: apply_rope(v, c.astype(np.float64), s.astype(np.float64)), (x64,))


def test_rope_bad_tables_name_the_argument() -> None:
    from tinylearn.inference import apply_rope

    cos, sin = rope_tables(8, 8)
    with pytest.raises(ValueError, match="cos, sin"):
        apply_rope(tl.ones(2, 3, 8), cos[:2], sin[:2])  # 2 positions for 3 tokens
    with pytest.raises(ValueError, match="cos, sin"):
        apply_rope(tl.ones(3, 8), cos[:3], sin[:2])
    with pytest.raises(ValueError, match="even"):
        apply_rope(tl.ones(3, 7), np.ones((3, 7), np.float32), np.ones((3, 7), np.float32))


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha", "gqa", "mqa", "abs_pos"])
def test_greedy_cache_equals_no_cache_and_torch(cfg: dict) -> None:
    model, ref = pair(cfg)
    a = generate(model, [1, 2, 3], 15, kv_cache=True)
    b = generate(model, [1, 2, 3], 15, kv_cache=False)
    assert a == b and len(a) == 15
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        for _ in range(15):
            ids = torch.cat([ids, ref(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert a == ids[0, 3:].tolist()


def test_sampling_seeded_and_cache_independent() -> None:
    model, _ = pair(CONFIGS[1])
    kw = dict(temperature=0.9, top_k=10, top_p=0.9, seed=7)
    a = generate(model, [4, 5], 20, **kw)
    assert a == generate(model, [4, 5], 20, **kw)
    assert a == generate(model, [4, 5], 20, kv_cache=False, **kw)
    assert a != generate(model, [4, 5], 20, **{**kw, "seed": 8})


def torch_filter(logits: np.ndarray, t: float, k: int | None, p: float | None) -> np.ndarray:
    x = torch.tensor(logits, dtype=torch.float64) / t
    probs = torch.softmax(x, -1)
    if k is not None:
        kth = torch.topk(probs, min(k, len(probs))).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    if p is not None:
        srt, idx = torch.sort(probs, descending=True, stable=True)
        keep = (torch.cumsum(srt, -1) - srt) < p
        keep[0] = True
        mask = torch.zeros_like(probs, dtype=torch.bool).scatter(0, idx, keep)
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return probs.numpy()


@pytest.mark.parametrize(
    "t,k,p",
    [
        (1.0, None, None),
        (0.7, 5, None),
        (1.3, None, 0.8),
        (0.5, 8, 0.6),
        (1.0, 1, None),
        (2.0, None, 1e-6),
        (1.0, None, 1.0),
        (0.9, 50, 0.95),
    ],
)
def test_filter_probs_match_torch(t: float, k: int | None, p: float | None) -> None:
    logits = np.random.default_rng(11).standard_normal(20) * 3
    got = filter_probs(logits, t, k, p)
    assert_close(got, torch_filter(logits, t, k, p), np.float64)
    assert (got > 0).sum() >= 1 and abs(got.sum() - 1) < 1e-12


def test_top_p_smallest_set() -> None:
    probs = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.count_nonzero(filter_probs(probs, 1.0, top_p=0.5)) == 1  # 0.5 >= 0.5
    assert np.count_nonzero(filter_probs(probs, 1.0, top_p=0.51)) == 2
    assert np.count_nonzero(filter_probs(probs, 1.0, top_p=0.95)) == 3
    assert np.count_nonzero(filter_probs(probs, 1.0, top_p=0.96)) == 4


def test_sampled_frequencies_match_filtered_distribution() -> None:
    from tinylearn.inference import sample_from

    logits = np.random.default_rng(12).standard_normal(8)
    p = filter_probs(logits, 0.8, top_k=6, top_p=0.9)
    rng = np.random.default_rng(0)
    counts = np.bincount([sample_from(p, rng) for _ in range(20000)], minlength=8)
    assert np.all(counts[p == 0] == 0)
    nz = p > 0
    assert sps.chisquare(counts[nz], 20000 * p[nz]).pvalue > 1e-3


def test_acceptance_rule_is_exact() -> None:
    """q(x) min(1, p/q) + P(reject) norm(max(0, p-q))(x) == p(x) for random p, q."""
    rng = np.random.default_rng(13)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(6) * 0.5), rng.dirichlet(np.ones(6) * 0.5)
        acc = q * np.minimum(1, p / q)
        out = acc + (1 - acc.sum()) * residual_distribution(p, q)
        assert_close(out, p, np.float64)
    assert accept_draft(0.2, 0.1, 0.99) and not accept_draft(0.1, 0.2, 0.5) and accept_draft(0.1, 0.2, 0.49)


def test_speculative_greedy_equals_target() -> None:
    cfg = CONFIGS[1]
    target, _ = pair(cfg, seed=0)
    draft, _ = pair({**cfg, "n_layers": 1}, seed=1)
    # a draft that agrees often: the target's first block only (shared embeddings and head)
    same = TinyGPT.from_config({**cfg, "n_layers": 1})
    same.load_state_dict({k: v for k, v in target.state_dict().items() if not k.startswith("blocks.1.")})
    ref = generate(target, [3, 1, 4], 30)
    for d in (draft, same, target):
        for k in (1, 3, 5):
            toks, st = speculative_generate(target, d, [3, 1, 4], 30, k=k)
            assert toks == ref, (k, st)
            assert st["target_calls"] == st["rounds"] <= 30
    toks, st = speculative_generate(target, target, [3, 1, 4], 30, k=4)
    assert st["acceptance_rate"] == 1.0 and st["target_calls"] == 6  # 5 tokens per call: 4 drafts + bonus


def _markov_probs(table: np.ndarray, t: float) -> np.ndarray:
    return np.stack([filter_probs(row, t) for row in table])


def test_speculative_sampling_matches_target_distribution() -> None:
    """Chi-square over 3-token continuations: speculative samples follow the target, not the draft."""
    v, n, t = 3, 3000, 1.0
    rng = np.random.default_rng(14)
    target, draft = TableLM(rng.standard_normal((v, v)) * 1.5), TableLM(rng.standard_normal((v, v)) * 1.5)
    pt, pd = _markov_probs(target.table, t), _markov_probs(draft.table, t)
    seqs = [tuple(speculative_generate(target, draft, [0], 3, k=2, temperature=t, seed=s)[0]) for s in range(n)]
    idx = np.array([a * v * v + b * v + c for a, b, c in seqs])
    counts = np.bincount(idx, minlength=v**3)
    exp_t = np.array([pt[0, a] * pt[a, b] * pt[b, c] for a in range(v) for b in range(v) for c in range(v)])
    exp_d = np.array([pd[0, a] * pd[a, b] * pd[b, c] for a in range(v) for b in range(v) for c in range(v)])
    assert sps.chisquare(counts, n * exp_t).pvalue > 1e-3
    assert sps.chisquare(counts, n * exp_d).pvalue < 1e-6  # the test has power: the draft's law is rejected
    _, st = speculative_generate(target, draft, [0], 50, k=3, temperature=t, seed=0)
    assert 0 < st["acceptance_rate"] < 1


def test_bad_inputs() -> None:
    model = TinyGPT(10, 8, 2, 1, 16)
    with pytest.raises(ValueError, match="ids"):
        model(np.array([[1, 10]]))
    with pytest.raises(TypeError, match="ids"):
        model(np.array([[1.5, 2.0]]))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(np.zeros((1, 17), dtype=np.int64))
    with pytest.raises(ValueError, match="n_kv_heads"):
        TinyGPT(10, 8, 2, 1, 16, n_kv_heads=3)
    with pytest.raises(ValueError, match="d_model"):
        TinyGPT(10, 9, 2, 1, 16)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [1], 3, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, [1], 3, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [1, 2], 16)
    with pytest.raises(ValueError, match="k"):
        speculative_generate(model, model, [1], 3, k=0)
    with pytest.raises(TypeError, match="model"):
        generate(object(), [1], 3)
    with pytest.raises(TypeError, match="config"):
        torch_reference(42)


def test_non_contiguous_ids_and_batch_rows_are_independent() -> None:
    model, ref = pair(CONFIGS[1])
    base = np.random.default_rng(6).integers(0, 37, (4, 30))
    ids = base[::2, ::3]  # strided view [2, 10]
    assert not ids.flags["C_CONTIGUOUS"]
    with tl.no_grad():
        out = model(ids).numpy()
        row = model(np.ascontiguousarray(ids[1:2])).numpy()
    assert_close(out, ref(torch.from_numpy(np.ascontiguousarray(ids))).detach().numpy(), np.float32)
    assert_close(out[1:2], row, np.float32)


@pytest.mark.slow  # tinygrad compiles its kernels with clang on first use (~10-30 s)
def test_tinygrad_decode_step_matches_torch() -> None:
    from tinylearn.bench.comparators import import_tinygrad, tinygrad_jit, tinygrad_status
    from tinylearn.inference.tinygrad_ref import build_decode_step

    ok, reason = tinygrad_status()
    if not ok:
        pytest.skip(reason)
    tg = import_tinygrad()
    cfg = CONFIGS[1]
    _, ref = pair(cfg)
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    ids = [3, 7, 1, 9, 4]
    exp = ref(torch.tensor([ids]))[0].detach().numpy()
    step, make = build_decode_step(tg, cfg, sd, 8)
    f = tinygrad_jit(step)
    caches = None
    for pos, t in enumerate(ids):  # the jit captures on call 2 and replays from call 3
        outs = f(*make(t, pos, caches))
        caches = list(outs[1:])
        assert_close(outs[0].numpy()[0], exp[pos], np.float32)


def test_speculative_alpha_counts_judged_drafts_only() -> None:
    """alpha = accepted / (accepted + rejected): drafts after a rejection are never judged. With context-free
    tables (every row equal) the acceptance is i.i.d. with alpha = sum(min(p, q)), so tokens per target call
    follows (1 - alpha^(k+1)) / (1 - alpha)."""
    v, k = 8, 3
    rng = np.random.default_rng(15)
    lp, lq = rng.standard_normal(v), rng.standard_normal(v)
    target, draft = TableLM(np.tile(lp, (v, 1))), TableLM(np.tile(lq, (v, 1)))
    alpha = float(np.minimum(filter_probs(lp, 1.0), filter_probs(lq, 1.0)).sum())
    _, st = speculative_generate(target, draft, [0], 4001, k=k, temperature=1.0, seed=0)
    assert st["accepted"] + st["rejected"] <= st["proposed"] and st["rejected"] <= st["rounds"]
    n = st["accepted"] + st["rejected"]
    assert abs(st["alpha"] - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / n)
    assert st["acceptance_rate"] < st["alpha"]  # accepted / proposed is biased low
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert abs(st["tokens_per_target_call"] - expected) < 0.05 * expected
