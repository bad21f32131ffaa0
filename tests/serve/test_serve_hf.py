"""Model formats: safetensors checkpoints round-trip, and Hugging Face GPT-2 converts to TinyGPT exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

from tinylearn.inference import TinyGPT, generate
from tinylearn.serve.checkpoint import TINY_CONFIG, load_model, read_config, save_model, tiny_model
from tinylearn.serve.hf import from_hf, to_hf_gpt2


def _gpt2(seed: int = 0, **kw) -> GPT2LMHeadModel:
    base = dict(vocab_size=97, n_positions=64, n_embd=32, n_head=4, n_layer=2, activation_function="gelu")
    base.update(bos_token_id=None, eos_token_id=None)
    base.update(kw)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**base)).eval()


def _logits(model: TinyGPT, ids: np.ndarray) -> np.ndarray:
    return model(ids).data


@pytest.mark.parametrize(
    "kw",
    [dict(n_head=4, n_layer=2), dict(n_head=1, n_layer=1), dict(n_head=8, n_layer=3, n_embd=64), dict(n_head=2)],
)
def test_gpt2_logits_match_transformers(kw):
    hf = _gpt2(seed=1, **kw)
    tg = from_hf(hf)
    assert isinstance(tg, TinyGPT) and tg.config.rope is False
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 40))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(_logits(tg, ids), ref, rtol=1e-4, atol=1e-5)


def test_gpt2_untied_head_and_config_input():
    hf = _gpt2(seed=2, tie_word_embeddings=False)
    assert not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
    tg = from_hf(hf)
    ids = np.random.default_rng(1).integers(0, 97, size=(1, 17))
    with torch.no_grad():
        np.testing.assert_allclose(_logits(tg, ids), hf(torch.from_numpy(ids)).logits.numpy(), rtol=1e-4, atol=1e-5)
    # a config alone: transformers initialises it (seeded), the result is a TinyGPT of that shape
    torch.manual_seed(0)
    tg2 = from_hf(GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_head=2, n_layer=1, activation_function="gelu"))
    assert (tg2.config.vocab_size, tg2.config.d_model, tg2.config.max_seq_len) == (50, 16, 32)


def test_gpt2_greedy_generate_matches_transformers():
    hf = _gpt2(seed=3)
    tg = from_hf(hf)
    prompt = [5, 17, 42, 8, 1]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert generate(tg, prompt, 20) == ref[0, len(prompt) :].tolist()


def test_to_hf_roundtrip():
    hf = _gpt2(seed=4)
    tg = from_hf(hf)
    back = to_hf_gpt2(tg)
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 97, size=(1, 23)))
    with torch.no_grad():
        np.testing.assert_allclose(back(ids).logits.numpy(), hf(ids).logits.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="rope"):
        to_hf_gpt2(TinyGPT(50, 16, 2, 1, 32))


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(activation_function="gelu_new"), "activation_function"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (dict(layer_norm_epsilon=1e-6), "layer_norm_epsilon"),
        (dict(scale_attn_weights=False), "scale_attn_weights"),
        (dict(n_inner=48), "n_inner"),
    ],
)
def test_gpt2_unsupported_config_names_field(kw, field):
    base = dict(vocab_size=50, n_positions=32, n_embd=16, n_head=2, n_layer=1, activation_function="gelu")
    base.update(kw)
    with pytest.raises(ValueError, match=field):
        from_hf(GPT2Config(**base))


def test_llama_refused_naming_the_feature():
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match="RMSNorm.*SwiGLU"):
        from_hf(cfg)
    with pytest.raises(TypeError, match="hf_model_or_config"):
        from_hf("gpt2")


def test_checkpoint_roundtrip(tmp_path):
    m = tiny_model(seed=7)
    assert m.config == TINY_CONFIG
    p = save_model(m, tmp_path / "m.safetensors")
    assert read_config(p) == m.config
    m2 = load_model(p)
    ids = np.arange(30)[None] % 258
    np.testing.assert_array_equal(_logits(m2, ids), _logits(m, ids))
    assert not np.array_equal(tiny_model(seed=8).lm_head.weight.data, m.lm_head.weight.data)
    # a converted HF model serves from a checkpoint too (rope=False survives)
    tg = from_hf(_gpt2(seed=5))
    m3 = load_model(save_model(tg, tmp_path / "gpt2.safetensors"))
    assert m3.config.rope is False
    np.testing.assert_array_equal(_logits(m3, ids % 97), _logits(tg, ids % 97))


def test_checkpoint_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        load_model(missing)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="bad.safetensors"):
        load_model(bad)
    from safetensors.numpy import save_file

    nometa = tmp_path / "nometa.safetensors"
    save_file({"x": np.zeros(3, np.float32)}, str(nometa))
    with pytest.raises(ValueError, match="nometa.safetensors.*tinylearn.config"):
        load_model(nometa)
    with pytest.raises(TypeError, match="model"):
        save_model("m", tmp_path / "x.safetensors")


def test_converted_gpt2_checkpoint_served_over_http_matches_transformers(tmp_path):
    """HF GPT-2 (byte vocab) -> TinyGPT -> safetensors -> `build_engine(path)` -> HTTP: same greedy tokens as HF."""
    import httpx

    from tinylearn.serve.server import build_engine, create_app, serve_in_thread
    from tinylearn.serve.tokenizer import EOS, ByteTokenizer

    hf = _gpt2(seed=6, vocab_size=258, n_positions=128, n_embd=48, n_head=3, n_layer=2)
    path = save_model(from_hf(hf), tmp_path / "gpt2-bytes.safetensors")
    prompt = ByteTokenizer().encode("served from a checkpoint")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=0)
    ref_ids = ref[0, len(prompt) :].tolist()
    if EOS in ref_ids:
        ref_ids = ref_ids[: ref_ids.index(EOS) + 1]
    app = create_app(build_engine(str(path)), model_name="gpt2-bytes")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
        body = {"model": "gpt2-bytes", "prompt": prompt, "max_tokens": 24, "temperature": 0}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == ByteTokenizer().decode(ref_ids)
        assert r.json()["usage"]["completion_tokens"] == len(ref_ids)
        assert c.get("/v1/models").json()["data"][0]["max_model_len"] == 128
