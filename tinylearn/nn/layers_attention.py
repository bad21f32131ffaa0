"""Attention modules (torch.nn names): MultiheadAttention, TransformerEncoderLayer. Re-exported by ``tinylearn.nn``."""

from __future__ import annotations

__all__: list[str] = []
