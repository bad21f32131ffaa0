"""Model files for the server: a TinyGPT saved as one safetensors file, and the default served model.

    save_model(model, path)   tensors = model.state_dict() (float32, names as TinyGPT's); the GPTConfig as JSON in
                              the safetensors header metadata under "tinylearn.config" (+ "format": "tinylearn.tinygpt")
    load_model(path)          reads the metadata, builds TinyGPT(**config), loads the tensors strictly
    tiny_model(seed=0)        the default served model: byte-level vocab 258 (ByteTokenizer), d_model 128, 4 heads,
                              2 layers, max_seq_len 512, RoPE, random init seeded -- fast enough on 2 CPU cores

safetensors is a flat header (JSON: name -> dtype, shape, byte offsets; plus a str->str "__metadata__") followed by
raw little-endian bytes: loading is a memory map plus a copy, no pickle (nothing in the file can run code).
Errors name the path: a missing file, a file that is not safetensors, or one without the config metadata.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..inference.config import GPTConfig
from ..inference.model import TinyGPT

CONFIG_KEY = "tinylearn.config"
FORMAT = "tinylearn.tinygpt"

TINY_CONFIG = GPTConfig(vocab_size=258, d_model=128, n_heads=4, n_layers=2, max_seq_len=512)


def tiny_model(seed: int = 0, config: GPTConfig | dict[str, Any] | None = None) -> TinyGPT:
    """The default served model (``TINY_CONFIG`` unless ``config``), randomly initialised from ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    c = GPTConfig.coerce(TINY_CONFIG if config is None else config)
    model = TinyGPT.from_config(c)
    rng = np.random.default_rng(int(seed))
    sd = {}
    for name, arr in model.state_dict().items():
        a = np.asarray(arr)
        if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")):
            sd[name] = np.ones_like(a, dtype=np.float32)
        elif name.endswith("bias"):
            sd[name] = np.zeros_like(a, dtype=np.float32)
        else:  # GPT-2 style init: N(0, 0.02); a larger scale makes the random model's greedy text less repetitive
            sd[name] = (rng.standard_normal(a.shape) * 0.08).astype(np.float32)
    model.load_state_dict(sd)
    model.eval()
    return model


def _path(path: Any) -> str:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__} {path!r}")
    return os.fspath(path)


def save_model(model: TinyGPT, path: str | os.PathLike) -> str:
    """Write ``model`` (a TinyGPT) to ``path`` as safetensors with its config in the metadata; returns the path."""
    from safetensors.numpy import save_file

    p = _path(path)
    if not isinstance(model, TinyGPT):
        raise TypeError(f"model: expected a TinyGPT, got {type(model).__name__}")
    tensors = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, CONFIG_KEY: json.dumps(model.config.to_dict())}
    d = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(d):
        raise FileNotFoundError(f"path: directory {d!r} of {p!r} does not exist")
    save_file(tensors, p, metadata=meta)
    return p


def read_config(path: str | os.PathLike) -> GPTConfig:
    """The GPTConfig stored in a checkpoint's metadata (no tensors read)."""
    from safetensors import safe_open

    p = _path(path)
    if not os.path.isfile(p):
        raise FileNotFoundError(f"path: no checkpoint file at {p!r}")
    try:
        with safe_open(p, framework="np") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own SafetensorError for a bad header
        raise ValueError(f"path: {p!r} is not a safetensors file ({e})") from e
    if CONFIG_KEY not in meta:
        raise ValueError(f"path: {p!r} has no {CONFIG_KEY!r} metadata (not saved by tinylearn.serve.save_model)")
    try:
        return GPTConfig.coerce(json.loads(meta[CONFIG_KEY]))
    except (ValueError, TypeError) as e:
        raise ValueError(f"path: {p!r} has an invalid {CONFIG_KEY!r} metadata: {e}") from e


def load_model(path: str | os.PathLike) -> TinyGPT:
    """The TinyGPT saved at ``path`` by ``save_model`` (strict: every tensor present with its shape)."""
    from safetensors.numpy import load_file

    p = _path(path)
    config = read_config(p)
    model = TinyGPT.from_config(config)
    tensors = load_file(p)
    expected = {k: np.shape(v) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"path: {p!r} does not match its config: missing {missing[:5]}, unexpected {extra[:5]}")
    for k, shape in expected.items():
        if tuple(tensors[k].shape) != tuple(shape):
            raise ValueError(f"path: {p!r} tensor {k!r} has shape {tuple(tensors[k].shape)}, config needs {shape}")
    model.load_state_dict({k: tensors[k].astype(np.float32) for k in expected})
    model.eval()
    return model
