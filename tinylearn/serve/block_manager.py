"""BlockManager: the serving engine's KV memory -- one ``PagedKVCache`` arena, prefix caching, swap, invariants.

vLLM's block manager on top of ``tinylearn.inference.PagedKVCache(keep_cached=True)``:

    allocation       a running sequence owns a cache sequence (block table); ``reserve(seq, end)`` makes the table
                     cover positions < end before the runner writes K/V straight into the arena
    prefix caching   a new sequence starts with ``match_prefix``: the longest run of indexed full blocks whose
                     chained hash (h_i = hash(h_{i-1}, tokens of block i)) matches its tokens, refcount + 1, no
                     recompute; after each step the newly filled full blocks are indexed (``register_prefix``).
                     A block whose refcount falls to 0 stays indexed as a *free cached* block (LRU) and is reused
                     by a later match or evicted when the allocator runs dry -- ``stats()`` reads the hit counters
    swap             preemption by swap copies each block to a host store under "<request id>/<logical block>"
                     (fp32: its [L, 2, block_size, Hkv, hd] K/V; int8: its raw arena bytes, codes + scales; see
                     ``host_block_shape``/``host_block_dtype``; exact) and frees the device blocks; swap-in
                     allocates fresh blocks and copies the bytes back
    token eviction   a sequence whose tokens were dropped by the engine's token-priority eviction holds
                     ``num_computed - kv_evicted`` tokens: positions (``reserve``/``truncate`` take them) are
                     converted to cache lengths here; its blocks are never indexed for prefix reuse again
    invariants       ``check(owners)``: every block is exactly one of free / used / cached; refcount == number of
                     owning block tables; cached blocks are indexed with refcount 0; the allocator agrees
The host store is any object with put/get/pop/discard/prefetch/__contains__/stats (``tl.serve.tiering``'s
TieredKVStore); ``HostStore`` is the plain in-RAM dict one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..inference.paged_cache import PagedKVCache
from ..inference.paged_math import blocks_needed


def _evicted(seq: Any) -> int:
    """Tokens the engine's token-priority eviction dropped from ``seq``'s cache (0 for a plain sequence)."""
    return int(getattr(seq, "kv_evicted", 0))


class HostStore:
    """A dict-backed host-memory tier with the TieredKVStore interface (put returns the tier name "host")."""

    def __init__(self) -> None:
        self._d: dict[Any, np.ndarray] = {}
        self.puts = self.gets = 0

    def put(self, key: Any, value: np.ndarray) -> str:
        self._d[key] = np.array(value, copy=True)
        self.puts += 1
        return "host"

    def get(self, key: Any) -> np.ndarray:
        if key not in self._d:
            raise KeyError(f"key: {key!r} is not in the host store")
        self.gets += 1
        return self._d[key]

    def pop(self, key: Any) -> np.ndarray:
        v = self.get(key)
        del self._d[key]
        return v

    def discard(self, key: Any) -> None:
        self._d.pop(key, None)

    def prefetch(self, keys: Any) -> None:
        """Nothing to prefetch: every block is already in RAM."""

    def __contains__(self, key: Any) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def stats(self) -> dict[str, Any]:
        return dict(blocks=len(self._d), bytes=sum(v.nbytes for v in self._d.values()), puts=self.puts, gets=self.gets)


class BlockManager:
    """KV blocks for the engine's sequences; see the module docstring. Sequences are the engine's ``Sequence``
    objects (attributes ``request_id``, ``cache_id``, ``num_computed``, ``tokens``, ``swapped_blocks``)."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        kv_dtype: str = "float32",
        enable_prefix_caching: bool = True,
        host_store: Any = None,
    ) -> None:
        self.cache = PagedKVCache(n_layers, n_kv_heads, head_dim, num_blocks, block_size, kv_dtype, keep_cached=True)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.prefix_caching = enable_prefix_caching
        self.host = host_store if host_store is not None else HostStore()
        self.swapped_blocks_out = self.swapped_blocks_in = 0
        c = self.cache
        self._raw = c.allocator.arena[: c.num_blocks * c.slot_bytes].reshape(c.num_blocks, c.slot_bytes)
        # what one swapped block looks like in the host store: the fp32 K/V block itself, or (int8) its raw slot bytes
        self.host_block_shape = c._data.shape[1:] if kv_dtype == "float32" else (c.slot_bytes,)
        self.host_block_dtype = np.dtype(np.float32 if kv_dtype == "float32" else np.uint8)

    # -- counting -------------------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks an allocation may take: truly free + free cached (evictable)."""
        return self.cache.blocks_free

    @property
    def used_blocks(self) -> int:
        """Blocks not on the allocator's free list: owned by a sequence or free-but-cached."""
        return self.num_blocks - self.cache.blocks_free + self.cache.num_cached_blocks

    def probe(self, seq: Any) -> tuple[int, int, int]:
        """(cached tokens, matched blocks, matched blocks that are free-cached) for admitting ``seq``, no side
        effect: admitting takes the revived free-cached blocks out of the free pool."""
        table = self.cache.lookup_prefix(seq.tokens) if self.prefix_caching else []
        revived = sum(1 for b in table if self.cache.refcount[b] == 0)
        return len(table) * self.block_size, len(table), revived

    def blocks_to_grow(self, seq: Any, end: int) -> int:
        """Blocks ``seq`` needs to cover positions < ``end`` (minus the tokens token-priority eviction dropped)."""
        table = self.cache.seqs[seq.cache_id].table
        return max(0, blocks_needed(end - _evicted(seq), self.block_size) - len(table))

    # -- lifecycle ------------------------------------------------------------------------------------------
    def admit(self, seq: Any) -> int:
        """Give ``seq`` a cache sequence starting at its longest cached prefix; returns the hit tokens."""
        if self.prefix_caching:
            seq.cache_id, hit = self.cache.match_prefix(seq.tokens)
        else:
            seq.cache_id, hit = self.cache.new_sequence(), 0
        seq.num_computed = hit
        seq.registered_blocks = hit // self.block_size
        return hit

    def reserve(self, seq: Any, end: int) -> None:
        self.cache.reserve(seq.cache_id, end - _evicted(seq))

    def free(self, seq: Any) -> None:
        if seq.cache_id is not None:
            self.cache.free(seq.cache_id)
            seq.cache_id = None
        for key in seq.swapped_blocks:
            self.host.discard(key)
        seq.swapped_blocks = []

    def register(self, seq: Any) -> None:
        """Index the full blocks filled since the last call (their tokens' KV is computed)."""
        if not self.prefix_caching or seq.cache_id is None or _evicted(seq):
            return
        full = seq.num_computed // self.block_size
        if full > seq.registered_blocks:
            self.cache.register_prefix(seq.cache_id, seq.tokens[: full * self.block_size])
            seq.registered_blocks = full

    def truncate(self, seq: Any, n: int) -> None:
        self.cache.truncate(seq.cache_id, n - _evicted(seq))
        seq.num_computed = n

    # -- swap -----------------------------------------------------------------------------------------------
    def swap_out(self, seq: Any) -> int:
        """Copy the sequence's blocks (raw bytes) to the host store and free them on the device."""
        table = self.cache.seqs[seq.cache_id].table
        keys = []
        for i, b in enumerate(table):
            key = f"{seq.request_id}/{i}"
            self.host.put(key, (self.cache._data if self.host_block_dtype == np.float32 else self._raw)[b].copy())
            keys.append(key)
        self.cache.free(seq.cache_id)
        seq.cache_id, seq.swapped_blocks = None, keys
        self.swapped_blocks_out += len(keys)
        return len(keys)

    def swap_in(self, seq: Any) -> int:
        """Fresh device blocks for a swapped sequence, filled with its bytes from the host store."""
        keys = seq.swapped_blocks
        self.host.prefetch(keys)
        sid = self.cache.new_sequence()
        self.cache.reserve(sid, len(keys) * self.block_size)
        s = self.cache.seqs[sid]
        for b, key in zip(s.table, keys):
            block = np.asarray(self.host.pop(key))
            if self.host_block_dtype == np.float32:
                self.cache._data[b] = block
            else:
                self._raw[b] = block.view(np.uint8).reshape(-1)
        s.lens = [seq.num_computed - _evicted(seq)] * self.cache.n_layers
        seq.cache_id, seq.swapped_blocks = sid, []
        self.swapped_blocks_in += len(keys)
        return len(keys)

    # -- invariants -----------------------------------------------------------------------------------------
    def check(self, owners: list[Any], swapped: list[Any]) -> None:
        """RuntimeError naming the first broken invariant. ``owners``: sequences holding device blocks."""
        c = self.cache
        ids = [s.cache_id for s in owners]
        if len(set(ids)) != len(ids) or set(ids) != set(c.seqs):
            raise RuntimeError(
                f"invariant 'one cache sequence per running request' broken: engine holds {sorted(ids)}, "
                f"cache holds {sorted(c.seqs)} (a leaked or double-owned block table)"
            )
        counts: Counter[int] = Counter()
        for s in owners:
            cs = c.seqs[s.cache_id]
            if any(n != s.num_computed - _evicted(s) for n in cs.lens):
                raise RuntimeError(
                    f"invariant 'cache length == computed tokens' broken for {s.request_id}: {cs.lens} "
                    f"(computed {s.num_computed}, evicted {_evicted(s)})"
                )
            if len(cs.table) < blocks_needed(s.num_computed - _evicted(s), self.block_size):
                raise RuntimeError(f"invariant 'table covers the computed tokens' broken for {s.request_id}")
            counts.update(cs.table)
        for b in range(self.num_blocks):
            if c.refcount[b] != counts.get(b, 0):
                raise RuntimeError(
                    f"invariant 'refcount == owning sequences' broken: block {b} has refcount {c.refcount[b]} "
                    f"but {counts.get(b, 0)} owning block tables"
                )
        for b in c._evictable:
            if c.refcount[b] != 0 or b not in c._block_hash:
                raise RuntimeError(f"invariant 'cached blocks are free and indexed' broken: block {b}")
        for h, (b, _) in c._prefix_index.items():
            if c._block_hash.get(b) != h or (c.refcount[b] == 0 and b not in c._evictable):
                raise RuntimeError(f"invariant 'index points at used or cached blocks' broken: block {b}")
        live = {off // c.slot_bytes for off, *_ in c.allocator.live_blocks()}
        held = {b for b in range(self.num_blocks) if c.refcount[b] > 0} | set(c._evictable)
        if live != held:
            raise RuntimeError(
                f"invariant 'free + used + cached == total' broken: allocator holds {len(live)} blocks, "
                f"sequences and the cache {len(held)} (differ at {sorted(live ^ held)[:8]})"
            )
        for s in swapped:
            if s.cache_id is not None or not all(k in self.host for k in s.swapped_blocks):
                raise RuntimeError(f"invariant 'swapped blocks live in the host store' broken for {s.request_id}")
