"""Reference answers: thin adapters over tinylearn.inference."""

from __future__ import annotations

from tinylearn.inference import model as _model
from tinylearn.inference import paged as _paged
from tinylearn.inference import sampling as _sampling
from tinylearn.inference import speculative as _spec

kv_append = _model.kv_append
kv_gather = _model.kv_gather
top_p_filter = _sampling.top_p_filter
accept_draft = _spec.accept_draft
residual_distribution = _spec.residual_distribution
blocks_needed = _paged.blocks_needed
locate = _paged.locate
kv_bytes_per_token = _paged.kv_bytes_per_token
