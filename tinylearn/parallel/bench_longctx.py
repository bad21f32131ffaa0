"""Measuring long-context attention on real processes: the traffic and memory meters.

* ``traffic_meter()`` (context manager, inside a rank): counts the bytes this process hands to torch.distributed
  point-to-point sends (``isend``/``send``: every tl.dist collective and the ring / Ulysses transfers go through
  them) and to ``all_to_all_single`` ((P-1)/P of the input leaves the rank). Independent of the modules' own
  counters, so the tests can check the counters against real traffic.
* ``TensorMeter`` (a ``TorchDispatchMode``): sees every aten op run inside it (forward and, on CPU, backward) and
  records the largest tensor an op allocated and the peak of the bytes held by storages allocated inside (freed
  storages are subtracted when their storage object dies). Views and in-place results are not new allocations.

The benchmark that uses them across ranks, ``bench_ring``, is in ``tinylearn/longctx/bench.py``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["TensorMeter", "traffic_meter"]


@contextlib.contextmanager
def traffic_meter() -> Iterator[dict[str, int]]:
    """Count bytes sent by this process inside the block: {"p2p_bytes", "p2p_messages", "a2a_bytes"}."""
    stats = {"p2p_bytes": 0, "p2p_messages": 0, "a2a_bytes": 0}
    orig_isend, orig_send, orig_a2a = dist.isend, dist.send, dist.all_to_all_single

    def isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        stats["p2p_bytes"] += tensor.numel() * tensor.element_size()
        stats["p2p_messages"] += 1
        return orig_isend(tensor, *args, **kwargs)

    def send(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        stats["p2p_bytes"] += tensor.numel() * tensor.element_size()
        stats["p2p_messages"] += 1
        return orig_send(tensor, *args, **kwargs)

    def a2a(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        p = dist.get_world_size(kwargs.get("group"))
        stats["a2a_bytes"] += input.numel() * input.element_size() * (p - 1) // p
        return orig_a2a(output, input, *args, **kwargs)

    dist.isend, dist.send, dist.all_to_all_single = isend, send, a2a
    try:
        yield stats
    finally:
        dist.isend, dist.send, dist.all_to_all_single = orig_isend, orig_send, orig_a2a


class TensorMeter(TorchDispatchMode):
    """Largest tensor allocated by an op inside the mode, and peak live bytes of storages allocated inside."""

    def __init__(self) -> None:
        super().__init__()
        self.largest_bytes = 0
        self.largest_shape: tuple[int, ...] = ()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in seen or key in self._live or st.nbytes() == 0:
                continue  # a view, an in-place result, or already counted
            nbytes = st.nbytes()
            if nbytes > self.largest_bytes:
                self.largest_bytes, self.largest_shape = nbytes, tuple(t.shape)
            self._live[key] = nbytes
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(st, self._free, key)
        return out
