"""Shared by the serve tests: a small TinyGPT with seeded, spread-out weights (logits far from ties, so greedy
outputs do not flip on rounding) and seeded random prompts."""

from __future__ import annotations

import numpy as np

from tinylearn.inference import TinyGPT

BASE = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=96)


def make_model(seed: int = 0, **cfg: object) -> TinyGPT:
    """TinyGPT(**BASE updated by cfg): LayerNorm gains 1 + 0.1 N(0, 1), matrices 0.3 N(0, 1), the rest 0.1 N(0, 1)."""
    m = TinyGPT(**{**BASE, **cfg})
    rng = np.random.default_rng(seed)
    for name, p in m.named_parameters():
        if name.endswith("weight") and p.data.ndim == 1:  # LayerNorm gain
            p.data[...] = 1 + 0.1 * rng.standard_normal(p.shape)
        else:
            p.data[...] = (0.3 if p.data.ndim == 2 else 0.1) * rng.standard_normal(p.shape)
    return m


def prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40, vocab: int = 64) -> list[list[int]]:
    """n prompts of random length in [lo, hi) with tokens in [0, vocab)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, int(k))] for k in rng.integers(lo, hi, n)]
