"""Issue 38 for inference: token ids are ints (floats/bools/strings refused, not truncated), probability vectors are
checked like torch.multinomial's, and the int8 paged KV cache refuses Inf/NaN instead of turning a head into NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.inference import (
    InvalidDistributionError,
    PagedKVCache,
    TableLM,
    TinyGPT,
    dense_attention,
    filter_probs,
    generate,
    open_session,
    paged_attention,
    quantize_int8,
    residual_distribution,
    sample_from,
    speculative_generate,
    top_k_filter,
    top_p_filter,
)


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    tl.manual_seed(0)
    return TinyGPT(16, 16, 2, 1, 32)


# -- token ids ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ids, got",
    [([1.7, 2.9], "float"), (["a"], "str"), ([True, False], "bool"), ([1, True], "bool"), (np.array([1.0, 2.0]), "")],
)
def test_generate_refuses_non_integer_token_ids(model, ids, got):
    with pytest.raises(TypeError, match=f"prompt_ids.*{got}"):
        generate(model, ids, 2)  # [1.7, 2.9] was truncated to [1, 2] before


@pytest.mark.parametrize(
    "ids",
    [[1, 2], (1, 2), [np.int64(1), np.int32(2)], np.array([1, 2], np.int32), torch.tensor([1, 2]), tl.tensor([1, 2])],
)
def test_generate_accepts_integer_token_ids(model, ids):
    assert generate(model, ids, 3) == generate(model, [1, 2], 3)


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(prompt_ids=[]), ValueError, "prompt_ids"),
        (dict(prompt_ids=[-1]), ValueError, "prompt_ids"),
        (dict(prompt_ids=[99]), ValueError, "prompt_ids"),
        (dict(prompt_ids=[[1, 2], [3, 4]]), ValueError, "prompt_ids"),
        (dict(prompt_ids=[[1, 2]]), ValueError, "prompt_ids"),  # a batch of one is still a batch: pass ids[0]
        (dict(prompt_ids=np.array([[1, 2]])), ValueError, "prompt_ids"),
        (dict(max_new_tokens=True), TypeError, "max_new_tokens"),
        (dict(max_new_tokens=2.0), TypeError, "max_new_tokens"),
        (dict(temperature=True), TypeError, "temperature"),
        (dict(temperature=1.0, top_k=True), TypeError, "top_k"),
        (dict(temperature=1.0, seed=1.5), TypeError, "seed"),
        (dict(temperature=1.0, seed=-1), ValueError, "seed"),
        (dict(kv_cache="no"), TypeError, "kv_cache"),
    ],
)
def test_generate_refuses_garbage_arguments(model, kwargs, exc, name):
    args = dict(prompt_ids=[1], max_new_tokens=2) | kwargs
    with pytest.raises(exc, match=name):
        generate(model, **args)


def test_generate_numpy_scalars_are_valid(model):
    out = generate(model, [1], np.int64(3), temperature=np.float32(0.7), top_p=np.float32(0.9), seed=np.int64(1))
    assert out == generate(model, [1], 3, temperature=0.7, top_p=float(np.float32(0.9)), seed=1)


def test_sessions_refuse_non_integer_tokens(model):
    for sess in (open_session(model), TableLM(np.zeros((4, 4))).session()):
        with pytest.raises(TypeError, match="tokens"):
            sess.extend([1.5])
        with pytest.raises(TypeError, match="tokens"):
            sess.extend([True])
        with pytest.raises(TypeError, match="length"):
            sess.truncate(0.5)
    with pytest.raises(TypeError, match="prompt_ids"):
        speculative_generate(model, model, [1.5], 2)


# -- probabilities: torch.multinomial's rules ----------------------------------------------------------------------
def _torch_multinomial_error(p) -> str:
    with pytest.raises(RuntimeError) as e:
        torch.multinomial(torch.tensor(p, dtype=torch.float64), 1)
    return str(e.value)


@pytest.mark.parametrize("p", [[np.nan, 0.5], [-1.0, 2.0], [0.0, 0.0], [np.inf, 1.0]])
def test_sample_from_refuses_what_torch_multinomial_refuses(p):
    torch_msg = _torch_multinomial_error(p)
    rng = np.random.default_rng(0)
    with pytest.raises(RuntimeError) as e:  # InvalidDistributionError is a RuntimeError (torch) and a ValueError
        sample_from(np.array(p), rng)
    assert isinstance(e.value, (InvalidDistributionError, ValueError))
    key = "sum of probabilities" if "sum" in torch_msg else "`inf`, `nan` or element < 0"
    assert key in torch_msg and key in str(e.value)
    for filt in (lambda q: top_k_filter(q, 1), lambda q: top_p_filter(q, 0.5)):
        with pytest.raises(InvalidDistributionError, match="probs"):
            filt(np.array(p))


@pytest.mark.parametrize("logits", [[np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf]])
def test_filter_probs_refuses_logits_without_a_distribution(logits):
    with pytest.raises(InvalidDistributionError, match="logits"):
        filter_probs(logits)  # returned [nan, nan] before, which sample_from turned into a token


def test_probability_vectors_that_are_valid():
    rng = np.random.default_rng(0)
    assert sample_from(np.array([0.0, 2.0, 0.0]), rng) == 1  # unnormalised is fine, like torch.multinomial
    np.testing.assert_allclose(filter_probs([0.0, -np.inf]), [1.0, 0.0])  # a masked (-inf) token is fine
    with pytest.raises(TypeError, match="rng"):
        sample_from(np.array([0.5, 0.5]), 0)
    with pytest.raises(ValueError, match="probs"):
        sample_from(np.ones((2, 2)) / 4, rng)
    with pytest.raises(ValueError, match="p, q"):
        residual_distribution(np.ones(2) / 2, np.ones(3) / 3)


def test_generation_refuses_nan_logits_instead_of_picking_a_token():
    lm = TableLM(np.zeros((4, 4)))
    lm.table[:, 2] = -np.inf  # allowed: a masked token
    assert generate(lm, [0], 3) == [0, 0, 0]
    with pytest.raises(ValueError, match="table"):
        TableLM(np.full((2, 2), np.nan))
    tl.manual_seed(0)
    broken = TinyGPT(8, 8, 2, 1, 16)
    broken.lm_head.weight.data[3] = np.nan  # token 3's logit is NaN: argmax would pick it
    with pytest.raises(InvalidDistributionError, match="NaN"):
        generate(broken, [1], 2)
    with pytest.raises(InvalidDistributionError, match="NaN"):
        generate(broken, [1], 2, temperature=1.0)


# -- int8 paged KV cache ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_int8_paged_cache_refuses_non_finite_kv(bad):
    cache = PagedKVCache(1, 2, 4, 4, 2, dtype="int8")
    sid = cache.new_sequence()
    k = np.ones((1, 2, 4), np.float32)
    k[0, 1, 2] = bad
    with pytest.raises(ValueError, match=r"k: int8 KV quantisation needs finite values.*\[0, 1, 2\]"):
        cache.append(sid, 0, k, np.ones((1, 2, 4), np.float32))
    assert cache.length(sid, 0) == 0 and cache.blocks_free == 4  # nothing was written or allocated
    good = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    cache.append(sid, 0, good, good)
    q = np.ones((2, 4), np.float32)
    out = paged_attention(q, cache, sid, 0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, dense_attention(q, good, good), atol=0.05)  # int8 rounding only
    with pytest.raises(ValueError, match="x"):
        quantize_int8(np.array([[[np.inf, 1.0]]]))  # gave an inf scale and NaN on dequantize before


def test_paged_cache_refuses_bool_and_negative_ids():
    cache = PagedKVCache(2, 1, 4, 4, 2)
    sid = cache.new_sequence()
    kv = np.ones((1, 1, 4), np.float32)
    with pytest.raises(ValueError, match="layer"):
        cache.append(sid, True, kv, kv)  # True would have meant layer 1
    with pytest.raises(ValueError, match="ids"):
        cache.register_prefix(sid, [-1])
    with pytest.raises(TypeError, match="ids"):
        cache.match_prefix([1.5])
