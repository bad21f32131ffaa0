"""Hugging Face transformers <-> TinyGPT: serve a real model format (GPT-2 architecture), no download.

    from_hf(GPT2LMHeadModel | GPT2Config)  -> TinyGPT(rope=False) with the same weights (a config is randomly
                                              initialised by transformers first, seeded by torch.manual_seed)
    to_hf_gpt2(TinyGPT)                    -> GPT2LMHeadModel with the same weights (rope=False, MHA only)

GPT-2 maps one-to-one onto TinyGPT with learned positions:
    wte -> tok_emb, wpe -> pos_emb, h.i.ln_1/ln_2 -> blocks.i.ln1/ln2, ln_f -> ln_f
    attn.c_attn  Conv1D weight [d, 3d] (y = x @ W + b)  -> split on the output axis into q/k/v, each transposed to
                 Linear's [out, in] layout (y = x @ W.T + b);  attn.c_proj -> o_proj (transposed)
    mlp.c_fc / mlp.c_proj (Conv1D) -> mlp.fc / mlp.proj (transposed)
    lm_head (tied to wte by default) -> lm_head (copied: TinyGPT's head is untied)
Exactness needs the same functions, so the config is checked field by field and anything TinyGPT cannot compute
exactly is refused with a ValueError naming the field: activation_function must be "gelu" (erf GELU; GPT-2's
default "gelu_new" is the tanh approximation), layer_norm_epsilon 1e-5, scale_attn_weights True,
scale_attn_by_inverse_layer_idx False, n_inner None or 4 * n_embd, no cross-attention. reorder_and_upcast_attn only
changes fp32 rounding and is accepted. Llama-style models (RMSNorm, SwiGLU MLP, no biases) are refused: TinyGPT has
LayerNorm and a GELU MLP with biases, so a conversion could only approximate them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inference.model import TinyGPT

TINYGPT_LN_EPS = 1e-5


def _config_of(obj: Any) -> tuple[Any, Any]:
    """(config, model or None) from a transformers model or config."""
    if hasattr(obj, "config") and hasattr(obj, "state_dict"):
        return obj.config, obj
    if hasattr(obj, "model_type") and hasattr(obj, "to_dict"):
        return obj, None
    raise TypeError(f"hf_model_or_config: expected a transformers PreTrainedModel or PretrainedConfig, got {type(obj)}")


def check_gpt2_config(config: Any) -> None:
    """ValueError naming the first field of a GPT-2 config that TinyGPT cannot reproduce exactly."""
    mt = getattr(config, "model_type", None)
    if mt in ("llama", "mistral", "qwen2", "gemma"):
        act = getattr(config, "hidden_act", None)
        raise ValueError(
            f"model_type: {mt!r} uses RMSNorm (rms_norm_eps) and a SwiGLU MLP (hidden_act={act!r})"
            " without biases; TinyGPT has LayerNorm and a GELU MLP, so it cannot express this model exactly"
        )
    if mt != "gpt2":
        raise ValueError(f"model_type: only 'gpt2' converts to TinyGPT exactly, got {mt!r}")
    act = config.activation_function
    if act != "gelu":
        raise ValueError(
            f"activation_function: TinyGPT's MLP uses the exact erf GELU ('gelu'), got {act!r}"
            " (gelu_new/gelu_pytorch_tanh is the tanh approximation; set activation_function='gelu')"
        )
    if abs(float(config.layer_norm_epsilon) - TINYGPT_LN_EPS) > 1e-12:
        raise ValueError(f"layer_norm_epsilon: TinyGPT's LayerNorm uses eps=1e-5, got {config.layer_norm_epsilon!r}")
    if not getattr(config, "scale_attn_weights", True):
        raise ValueError("scale_attn_weights: TinyGPT always scales attention scores by 1/sqrt(head_dim), got False")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("scale_attn_by_inverse_layer_idx: TinyGPT has no per-layer 1/(layer+1) score scale, got True")
    if getattr(config, "add_cross_attention", False):
        raise ValueError("add_cross_attention: TinyGPT is decoder-only (no cross-attention), got True")
    n_inner = getattr(config, "n_inner", None)
    if n_inner is not None and n_inner != 4 * config.n_embd:
        raise ValueError(f"n_inner: TinyGPT's MLP width is 4 * n_embd = {4 * config.n_embd}, got {n_inner}")
    if config.n_embd % config.n_head:
        raise ValueError(f"n_head: n_embd={config.n_embd} is not divisible by n_head={config.n_head}")


def from_hf(hf_model_or_config: Any) -> TinyGPT:
    """A TinyGPT computing the same logits as a transformers GPT-2 causal LM (or a fresh one from a GPT2Config)."""
    config, model = _config_of(hf_model_or_config)
    check_gpt2_config(config)
    if model is None:
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel(config)
    sd = {k: v.detach().to("cpu").float().numpy() for k, v in model.state_dict().items()}
    d, n_layer = int(config.n_embd), int(config.n_layer)
    out = TinyGPT(int(config.vocab_size), d, int(config.n_head), n_layer, int(config.n_positions), rope=False)
    new: dict[str, np.ndarray] = {
        "tok_emb.weight": sd["transformer.wte.weight"],
        "pos_emb.weight": sd["transformer.wpe.weight"],
        "ln_f.weight": sd["transformer.ln_f.weight"],
        "ln_f.bias": sd["transformer.ln_f.bias"],
        "lm_head.weight": sd.get("lm_head.weight", sd["transformer.wte.weight"]),
    }
    for i in range(n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        w_qkv, b_qkv = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]  # [d, 3d]: x @ W
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            new[b + f"attn.{name}.weight"] = w_qkv[:, j * d : (j + 1) * d].T
            new[b + f"attn.{name}.bias"] = b_qkv[j * d : (j + 1) * d]
        pairs = (("attn.c_proj", "attn.o_proj"), ("mlp.c_fc", "mlp.fc"), ("mlp.c_proj", "mlp.proj"))
        for src, dst in pairs:
            new[b + dst + ".weight"] = sd[h + src + ".weight"].T
            new[b + dst + ".bias"] = sd[h + src + ".bias"]
        for src, dst in (("ln_1", "ln1"), ("ln_2", "ln2")):
            new[b + dst + ".weight"] = sd[h + src + ".weight"]
            new[b + dst + ".bias"] = sd[h + src + ".bias"]
    out.load_state_dict({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in new.items()})
    out.eval()
    return out


def to_hf_gpt2(model: TinyGPT) -> Any:
    """The transformers GPT2LMHeadModel with ``model``'s weights (needs rope=False and MHA; lm_head kept untied)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if not isinstance(model, TinyGPT):
        raise TypeError(f"model: expected a TinyGPT, got {type(model).__name__}")
    c = model.config
    if c.rope:
        raise ValueError("model: rope=True has no GPT-2 equivalent (GPT-2 uses learned positions); need rope=False")
    if c.kv_heads != c.n_heads:
        raise ValueError(f"model: n_kv_heads={c.n_kv_heads} (grouped-query) has no GPT-2 equivalent")
    cfg = GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_seq_len, n_embd=c.d_model, n_layer=c.n_layers, n_head=c.n_heads,
        activation_function="gelu", tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    hf = GPT2LMHeadModel(cfg)
    sd = {k: np.asarray(v, dtype=np.float32) for k, v in model.state_dict().items()}
    new = {
        "transformer.wte.weight": sd["tok_emb.weight"],
        "transformer.wpe.weight": sd["pos_emb.weight"],
        "transformer.ln_f.weight": sd["ln_f.weight"],
        "transformer.ln_f.bias": sd["ln_f.bias"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(c.n_layers):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        new[h + "attn.c_attn.weight"] = np.concatenate(
            [sd[b + f"attn.{n}.weight"].T for n in ("q_proj", "k_proj", "v_proj")], 1
        )
        new[h + "attn.c_attn.bias"] = np.concatenate([sd[b + f"attn.{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")])
        for dst, src in (("attn.c_proj", "attn.o_proj"), ("mlp.c_fc", "mlp.fc"), ("mlp.c_proj", "mlp.proj")):
            new[h + dst + ".weight"] = sd[b + src + ".weight"].T
            new[h + dst + ".bias"] = sd[b + src + ".bias"]
        for dst, src in (("ln_1", "ln1"), ("ln_2", "ln2")):
            new[h + dst + ".weight"] = sd[b + src + ".weight"]
            new[h + dst + ".bias"] = sd[b + src + ".bias"]
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in new.items()}
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.endswith(".attn.bias") and not k.endswith(".attn.masked_bias")]
    if missing or unexpected:
        raise RuntimeError(f"to_hf_gpt2: state_dict mismatch, missing {missing}, unexpected {unexpected}")
    return hf.eval()
