"""GPTConfig: the TinyGPT constructor arguments in one small dataclass (shared by tinylearn, torch and tinygrad)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GPTConfig:
    """Decoder-only transformer shape. ``n_kv_heads`` None = n_heads (MHA); 1 = multi-query; else grouped-query."""

    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    max_seq_len: int
    n_kv_heads: int | None = None
    rope: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len", "n_kv_heads"):
            v = getattr(self, name)
            if isinstance(v, np.integer) and not isinstance(v, bool):  # np.int64(256) is a valid size
                object.__setattr__(self, name, int(v))
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: must be a positive int, got {v!r}")
        if not isinstance(self.rope, (bool, np.bool_)):
            raise TypeError(f"rope: expected a bool, got {type(self.rope).__name__} {self.rope!r}")
        object.__setattr__(self, "rope", bool(self.rope))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        kv = self.kv_heads
        if not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_heads % kv:
            raise ValueError(f"n_kv_heads: must divide n_heads={self.n_heads}, got {self.n_kv_heads!r}")
        if self.rope and self.head_dim % 2:
            raise ValueError(f"rope: head_dim={self.head_dim} must be even (rotate-half pairs i and i + head_dim/2)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def group(self) -> int:
        """Query heads per KV head (1 = MHA, n_heads = MQA)."""
        return self.n_heads // self.kv_heads

    def kv_bytes_per_token(self, bytes_per_elem: int = 4) -> int:
        """K and V of one token over all layers: 2 * n_layers * n_kv_heads * head_dim * bytes."""
        return 2 * self.n_layers * self.kv_heads * self.head_dim * bytes_per_elem

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def coerce(config: Any) -> GPTConfig:
        """A GPTConfig from a GPTConfig, a dict of its fields, or any object with those attributes."""
        if isinstance(config, GPTConfig):
            return config
        if isinstance(config, dict):
            try:
                return GPTConfig(**config)
            except TypeError as e:
                raise TypeError(f"config: {e}") from e
        fields = ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len", "n_kv_heads", "rope")
        if all(hasattr(config, f) for f in fields[:5]):
            return GPTConfig(**{f: getattr(config, f) for f in fields if hasattr(config, f)})
        got = type(config).__name__
        raise TypeError(f"config: expected a GPTConfig, a dict or an object with {fields[:5]}, got {got}")
