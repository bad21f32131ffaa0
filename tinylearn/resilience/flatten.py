"""Flattening a training state for a checkpoint: nested dicts become one level of ``"a.b"`` keys (as DCP does), and
every value is classified -- a tensor (numpy / torch / tl.Tensor), a ``Shard`` (handled by the caller), or a JSON
object (int, float, str, bool, None, lists of them). Anything else is a TypeError naming its key.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

_OBJ_TYPES = (bool, int, float, str, type(None))


def _is_object(v: Any) -> bool:
    if isinstance(v, _OBJ_TYPES) or isinstance(v, (np.integer, np.floating, np.bool_)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_is_object(x) for x in v)
    return False


def _to_json(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    return v.item() if isinstance(v, np.generic) else v


def _is_tensor(v: Any) -> bool:
    if isinstance(v, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        return True
    tl_tensor = getattr(sys.modules.get("tinylearn"), "Tensor", None)
    return tl_tensor is not None and isinstance(v, tl_tensor)


def flatten_state(state: Mapping[str, Any], prefix: str = "", leaf: tuple[type, ...] = ()) -> dict[str, Any]:
    """Nested dicts -> one level with ``"a.b"`` keys; a key's type is checked (TypeError naming the key)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state: expected a mapping of str keys, got {type(state).__name__}")
    out: dict[str, Any] = {}
    for k, v in state.items():
        if not isinstance(k, str):
            raise TypeError(f"state: keys must be str, got {k!r} under {prefix or 'the top level'!r}")
        key = prefix + k
        if isinstance(v, Mapping):
            out.update(flatten_state(v, key + ".", leaf))
        elif isinstance(v, leaf) or _is_tensor(v) or _is_object(v):
            if key in out:
                raise ValueError(f"state: key {key!r} appears twice after flattening")
            out[key] = v
        else:
            raise TypeError(
                f"state[{key!r}]: unsupported type {type(v).__name__} (expected a Shard, np.ndarray, torch.Tensor, "
                "tl.Tensor, dict, or an int/float/str/bool/None/list of them)"
            )
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of the ``"a.b"`` flattening: nested dicts again."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        cur = out
        parts = k.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
    return out
