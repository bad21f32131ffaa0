"""Paged KV cache (vLLM's PagedAttention memory manager) and attention that reads it block by block.

Physical memory: one arena of ``num_blocks`` equal blocks handed out by ``tl.memory.SlabAllocator`` (a single
size class = one block, so its LIFO per-slab free stacks are the free list). A block holds ``block_size`` token
slots for every layer: data [n_layers, 2 (K, V), block_size, n_kv_heads, head_dim]. A sequence owns a *block
table* (logical block i -> physical block id), so its KV needs no contiguous memory and wastes at most one
partially filled block.

    append(seq, layer, k, v)   write T tokens at positions [len, len + T) of that layer, allocating blocks on demand
    fork(seq)                  new sequence sharing every block (refcount + 1): prefix sharing / parallel sampling
    copy-on-write              a write into a block with refcount > 1 first copies it to a fresh block
    free(seq)                  refcount - 1 for each block; blocks reaching 0 go back to the allocator
    register_prefix(seq, ids)  index the sequence's FULL blocks by a chained hash of their token ids
    evict_tokens(seq, keep)    token-priority eviction: keep only the tokens in ``keep`` (e.g. the heaviest attention
                               receivers + a recent window, see ``priority_keep``), re-pack them into fewer blocks
                               and return the evicted K/V (an offload store); ``restore_tokens`` re-expands them
    match_prefix(ids)          automatic prefix caching (vLLM): a new sequence sharing the longest run of indexed
                               full blocks that equals a prefix of ``ids``; counts lookups and hit tokens
    keep_cached=True           (opt-in) an indexed block whose refcount falls to 0 is not freed: it stays indexed as a
                               *free cached* block in an LRU list, reusable by ``match_prefix`` until the allocator
                               needs it (then the least recently freed one is evicted and unindexed); a sequence's
                               blocks are released tail first, so a chain's last blocks are evicted before its head
    reserve(seq, end) / truncate(seq, n)   the serving engine's hooks: allocate the blocks for positions < end
                               (copy-on-write of shared ones) before writing K/V itself; drop positions >= n
    out of blocks              MemoryError naming num_blocks, raised before anything is modified

INT8 mode stores each token's K and V per head as int8 codes with one float32 scale per (token, head):
scale = max|x| / 127 over head_dim, code = round(x / scale). Bytes per token: fp32 2*L*H*D*4;
int8 2*L*H*(D + 4) (codes + scales) -- ``stats()['bytes_per_token']`` reports exactly this.
FP8 ("fp8_e4m3"): the same layout, E4M3 codes (tinylearn.quant.fp8), scale = max|x| / 448, relative error <= 2^-4;
the C++ paged-decode kernel refuses fp8 blocks (use ``paged_attention_batch(..., backend="numpy")`` or ``gather``).
The pure arithmetic (block count, token -> (block, slot), int8 codec, eviction policy) is in
``tinylearn.inference.paged_math``; the attention that reads the block tables in ``tinylearn.inference.paged``.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from typing import Any

import numpy as np

from ..memory import SlabAllocator, align_up
from .checks import token_list
from .paged_math import blocks_needed, dequantize_int8, locate, quantize_int8

_DTYPES = {"float32": np.float32, "int8": np.int8, "fp8_e4m3": np.uint8}


def _pos_int(name: str, v: Any) -> int:
    if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name}: must be a positive int, got {v!r}")
    return int(v)


class _Seq:
    __slots__ = ("table", "lens")

    def __init__(self, table: list[int], lens: list[int]) -> None:
        self.table, self.lens = table, lens


class PagedKVCache:
    """Block-table KV cache; see the module docstring. ``dtype``: "float32", "int8" or "fp8_e4m3"."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        dtype: str = "float32",
        keep_cached: bool = False,
    ) -> None:
        self.n_layers = _pos_int("n_layers", n_layers)
        self.n_kv_heads = _pos_int("n_kv_heads", n_kv_heads)
        self.head_dim = _pos_int("head_dim", head_dim)
        self.num_blocks = _pos_int("num_blocks", num_blocks)
        self.block_size = _pos_int("block_size", block_size)
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise ValueError(f"dtype: expected 'float32' or 'int8' (or 'fp8_e4m3'), got {dtype!r}")
        self.dtype = dtype
        L, bs, H, D = self.n_layers, self.block_size, self.n_kv_heads, self.head_dim  # noqa: N806
        elem = np.dtype(_DTYPES[dtype]).itemsize
        self.data_bytes = 2 * L * bs * H * D * elem
        self.scale_bytes = 2 * L * bs * H * 4 if dtype != "float32" else 0
        self.bytes_per_block = self.data_bytes + self.scale_bytes
        scale_off = align_up(self.data_bytes, 16)
        self.slot_bytes = align_up(scale_off + self.scale_bytes, 64)  # arena stride of one block (alignment pad)
        cap = self.num_blocks * self.slot_bytes
        try:
            self.allocator = SlabAllocator([self.slot_bytes], capacity=cap, slab_size=self.slot_bytes, alignment=64)
        except MemoryError as e:
            raise MemoryError(
                f"num_blocks: {self.num_blocks} blocks of {self.slot_bytes} bytes ({cap} bytes) cannot be allocated"
            ) from e
        raw = self.allocator.arena[:cap].reshape(self.num_blocks, self.slot_bytes)
        self._data = raw[:, : self.data_bytes].view(_DTYPES[dtype]).reshape(self.num_blocks, L, 2, bs, H, D)
        self._scale = None
        if dtype != "float32":  # int8 / fp8 codes + one scale per (token, head)
            self._scale = raw[:, scale_off : scale_off + self.scale_bytes].view(np.float32)
            self._scale = self._scale.reshape(self.num_blocks, L, 2, bs, H)
            assert np.shares_memory(self._scale, self.allocator.arena)
        assert np.shares_memory(self._data, self.allocator.arena)  # views, never copies
        self.refcount = np.zeros(self.num_blocks, dtype=np.int64)
        self.seqs: dict[int, _Seq] = {}
        self._ids = itertools.count()
        self.cow_copies = 0
        self.peak_blocks_used = 0
        # prefix index: chained block hash -> (physical block, its token ids); block -> hash, to unindex on free
        self._prefix_index: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._block_hash: dict[int, int] = {}
        self.prefix_queries = 0
        self.prefix_lookup_tokens = 0
        self.prefix_hit_tokens = 0
        if not isinstance(keep_cached, bool | np.bool_):
            raise TypeError(f"keep_cached: expected a bool, got {keep_cached!r}")
        self.keep_cached = bool(keep_cached)
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently freed first
        self.prefix_evictions = 0

    # -- sequences ----------------------------------------------------------------------------------------------
    def new_sequence(self) -> int:
        sid = next(self._ids)
        self.seqs[sid] = _Seq([], [0] * self.n_layers)
        return sid

    def _seq(self, seq_id: Any) -> _Seq:
        if isinstance(seq_id, (bool, np.bool_)) or seq_id not in self.seqs:  # True == 1 would name sequence 1
            raise ValueError(f"seq_id: {seq_id!r} is not a live sequence (live: {sorted(self.seqs)[:8]})")
        return self.seqs[seq_id]

    def _layer(self, layer: Any) -> int:
        is_int = isinstance(layer, int | np.integer) and not isinstance(layer, (bool, np.bool_))
        if not is_int or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer: must be in [0, {self.n_layers}), got {layer!r}")
        return int(layer)

    def length(self, seq_id: int, layer: int = 0) -> int:
        return self._seq(seq_id).lens[self._layer(layer)]

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).table)

    def fork(self, seq_id: int) -> int:
        """A new sequence sharing all of ``seq_id``'s blocks (copy-on-write); returns its id."""
        s = self._seq(seq_id)
        sid = next(self._ids)
        self.seqs[sid] = _Seq(list(s.table), list(s.lens))
        for b in s.table:
            self.refcount[b] += 1
        return sid

    def free(self, seq_id: int) -> None:
        s = self._seq(seq_id)
        for b in reversed(s.table) if self.keep_cached else s.table:
            self._release(b)
        del self.seqs[seq_id]

    # -- blocks -------------------------------------------------------------------------------------------------
    @property
    def blocks_free(self) -> int:
        return int(np.count_nonzero(self.refcount == 0))

    @property
    def num_cached_blocks(self) -> int:
        """Free cached blocks (keep_cached mode): refcount 0, still indexed, counted in ``blocks_free``."""
        return len(self._evictable)

    def _alloc(self) -> int:
        if self._evictable and self.blocks_free == len(self._evictable):  # allocator empty: evict the LRU cached
            b, _ = self._evictable.popitem(last=False)
            del self._prefix_index[self._block_hash.pop(b)]
            self.prefix_evictions += 1
            self.refcount[b] = 1
            return b
        b = self.allocator.malloc(self.slot_bytes) // self.slot_bytes
        assert self.refcount[b] == 0
        self.refcount[b] = 1
        self.peak_blocks_used = max(self.peak_blocks_used, self.num_blocks - self.blocks_free)
        return b

    def _release(self, b: int) -> None:
        self.refcount[b] -= 1
        if self.refcount[b] == 0:
            if self.keep_cached and b in self._block_hash:
                self._evictable[b] = None  # most recently freed: evicted last
                return
            h = self._block_hash.pop(b, None)
            if h is not None:
                del self._prefix_index[h]
            self.allocator.free(b * self.slot_bytes)

    # -- prefix index (hash of token ids -> block) ------------------------------------------------------------
    def _token_ids(self, ids: Any) -> list[int]:
        return token_list(ids, "ids", allow_empty=True)

    def _block_hashes(self, ids: list[int], n_blocks: int) -> list[tuple[int, tuple[int, ...]]]:
        """(chained hash, tokens) of the first n_blocks full blocks: h_i = hash((h_{i-1}, tokens of block i)), so
        a block's hash identifies the whole prefix up to and including it, not just its own tokens."""
        out, h, bs = [], 0, self.block_size
        for i in range(n_blocks):
            toks = tuple(ids[i * bs : (i + 1) * bs])
            h = hash((h, toks))
            out.append((h, toks))
        return out

    def register_prefix(self, seq_id: int, ids: Any) -> int:
        """Index the full blocks of ``seq_id`` whose tokens are ``ids`` (its token ids from position 0) so that later
        ``match_prefix`` calls can share them. Blocks already indexed (same hash) keep their first owner.
        Returns the number of blocks newly indexed."""
        s = self._seq(seq_id)
        ids = self._token_ids(ids)
        if len(ids) > min(s.lens):
            raise ValueError(f"ids: {len(ids)} token ids but sequence {seq_id} holds only {min(s.lens)} tokens")
        new = 0
        for i, (h, toks) in enumerate(self._block_hashes(ids, len(ids) // self.block_size)):
            b = s.table[i]
            if h in self._prefix_index or b in self._block_hash:
                continue
            self._prefix_index[h] = (b, toks)
            self._block_hash[b] = h
            new += 1
        return new

    def match_prefix(self, ids: Any) -> tuple[int, int]:
        """A new sequence for a request with token ids ``ids`` that shares every indexed full block matching a
        prefix of ``ids`` (refcount + 1, no copy, no recompute). Returns (seq_id, n_cached_tokens): the caller
        computes ``ids[n_cached_tokens:]`` only. At least one token is left uncached (its logits are needed).
        A hash hit is confirmed by comparing the block's stored token ids (collisions cannot share wrong KV).
        Counters: prefix_queries, prefix_lookup_tokens (len(ids)) and prefix_hit_tokens, in ``stats()``."""
        table = self.lookup_prefix(ids)
        n = len(table) * self.block_size
        sid = next(self._ids)
        self.seqs[sid] = _Seq(table, [n] * self.n_layers)
        for b in table:
            if self.refcount[b] == 0:  # a free cached block comes back into use
                del self._evictable[b]
            self.refcount[b] += 1
        ids = self._token_ids(ids)
        self.prefix_queries += 1
        self.prefix_lookup_tokens += len(ids)
        self.prefix_hit_tokens += n
        return sid, n

    def lookup_prefix(self, ids: Any) -> list[int]:
        """The physical blocks ``match_prefix(ids)`` would share (no side effect, no counters)."""
        ids = self._token_ids(ids)
        if not ids:
            raise ValueError("ids: need at least one token id")
        table: list[int] = []
        for h, toks in self._block_hashes(ids, (len(ids) - 1) // self.block_size):
            hit = self._prefix_index.get(h)
            if hit is None or hit[1] != toks:
                break
            table.append(hit[0])
        return table

    def reserve(self, seq_id: int, end: int) -> None:
        """Make the block table cover positions < ``end``: allocate missing blocks and copy-on-write the shared
        ones that positions [min length, end) fall in. MemoryError (nothing modified) when too few blocks are free."""
        s = self._seq(seq_id)
        bs = self.block_size
        need = blocks_needed(int(end), bs)
        shared = [i for i in range(min(s.lens) // bs, min(need, len(s.table))) if self.refcount[s.table[i]] > 1]
        extra = max(0, need - len(s.table))
        if extra + len(shared) > self.blocks_free:
            raise MemoryError(
                f"PagedKVCache out of blocks: sequence {seq_id} needs {extra + len(shared)} more block(s) but only "
                f"{self.blocks_free} of num_blocks={self.num_blocks} are free"
            )
        for i in shared:
            old, new = s.table[i], self._alloc()
            self._data[new] = self._data[old]
            if self._scale is not None:
                self._scale[new] = self._scale[old]
            self.refcount[old] -= 1
            s.table[i] = new
            self.cow_copies += 1
        for _ in range(extra):
            s.table.append(self._alloc())

    def truncate(self, seq_id: int, n: int) -> None:
        """Keep the first ``n`` cached positions of every layer; release the blocks past them (rejected drafts)."""
        s = self._seq(seq_id)
        if not 0 <= n <= min(s.lens):
            raise ValueError(f"n: must be in [0, {min(s.lens)}], got {n!r}")
        keep = blocks_needed(n, self.block_size)
        for b in reversed(s.table[keep:]):
            self._release(b)
        del s.table[keep:]
        s.lens = [n] * self.n_layers

    # -- data ---------------------------------------------------------------------------------------------------
    def _check_kv(self, name: str, x: Any, t: int | None) -> np.ndarray:
        a = np.asarray(x.data if hasattr(x, "data") and not isinstance(x, np.ndarray) else x)
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"{name}: expected a floating array, got dtype {a.dtype}")
        if a.ndim != 3 or a.shape[1:] != (self.n_kv_heads, self.head_dim) or a.shape[0] < 1:
            raise ValueError(
                f"{name}: expected shape [T, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}] with T >= 1, "
                f"got {a.shape}"
            )
        if t is not None and a.shape[0] != t:
            raise ValueError(f"{name}: has {a.shape[0]} tokens but k has {t}")
        a = a.astype(np.float32, copy=False)
        if self._scale is not None and not np.isfinite(a).all():
            # one Inf would make its (token, head) scale Inf and dequantize every element of that head to NaN
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
            raise ValueError(
                f"{name}: {self.dtype} KV quantisation needs finite values, got {a[bad]} at [token, head, dim] = "
                f"{list(bad)}"
            )
        return a

    def append(self, seq_id: int, layer: int, k: Any, v: Any) -> None:
        """Write k, v [T, n_kv_heads, head_dim] after the ``layer``'s current length."""
        s = self._seq(seq_id)
        layer = self._layer(layer)
        k = self._check_kv("k", k, None)
        v = self._check_kv("v", v, k.shape[0])
        bs = self.block_size
        start = s.lens[layer]
        end = start + k.shape[0]
        need = blocks_needed(end, bs)
        first = start // bs
        shared = [i for i in range(first, min(need, len(s.table))) if self.refcount[s.table[i]] > 1]
        extra = max(0, need - len(s.table))
        if extra + len(shared) > self.blocks_free:
            raise MemoryError(
                f"PagedKVCache out of blocks: sequence {seq_id} needs {extra + len(shared)} more block(s) of "
                f"{bs} tokens but only {self.blocks_free} of num_blocks={self.num_blocks} are free "
                f"({len(self.seqs)} live sequences); free or preempt a sequence, or raise num_blocks"
            )
        for i in shared:  # copy-on-write
            old, new = s.table[i], self._alloc()
            self._data[new] = self._data[old]
            if self._scale is not None:
                self._scale[new] = self._scale[old]
            self.refcount[old] -= 1  # still > 0: another sequence holds it
            s.table[i] = new
            self.cow_copies += 1
        for _ in range(extra):
            s.table.append(self._alloc())
        blk, slot = locate(s.table, bs, np.arange(start, end))
        for j, x in ((0, k), (1, v)):
            if self._scale is None:
                self._data[blk, layer, j, slot] = x
            else:
                q, sc = self.encode_kv(x)
                self._data[blk, layer, j, slot] = q
                self._scale[blk, layer, j, slot] = sc
        s.lens[layer] = end

    def _read(self, blk: np.ndarray, layer: int, j: int, slot: np.ndarray) -> np.ndarray:
        x = self._data[blk, layer, j, slot]
        if self._scale is None:
            return x.astype(np.float32, copy=True)
        if self.dtype == "fp8_e4m3":
            from ..quant.fp8 import fp8_decode  # lazily: only fp8 caches need tinylearn.quant

            return fp8_decode(x, "e4m3") * self._scale[blk, layer, j, slot][..., None]
        return dequantize_int8(x, self._scale[blk, layer, j, slot])

    def encode_kv(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(codes, scales [T, H]) of K or V rows [T, H, D] in this quantized cache's dtype: what ``append`` stores."""
        if self.dtype != "fp8_e4m3":
            return quantize_int8(x)
        from ..quant.fp8 import fp8_encode

        amax = np.abs(np.asarray(x, dtype=np.float32)).max(axis=-1)
        scale = np.where(amax > 0, amax / np.float32(448.0), 1.0).astype(np.float32)
        return fp8_encode(x / scale[..., None], "e4m3", saturate=True), scale

    def gather(self, seq_id: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) float32 [S, n_kv_heads, head_dim]: the layer's S cached tokens in order (dequantized)."""
        s = self._seq(seq_id)
        layer = self._layer(layer)
        blk, slot = locate(s.table, self.block_size, np.arange(s.lens[layer]))
        return self._read(blk, layer, 0, slot), self._read(blk, layer, 1, slot)

    def iter_blocks(self, seq_id: int, layer: int) -> Any:
        """Yield (k, v) [n, H, D] per physical block of the sequence, in order (what a paged kernel reads)."""
        s = self._seq(seq_id)
        layer = self._layer(layer)
        n_tok = s.lens[layer]
        for i in range(math.ceil(n_tok / self.block_size)):
            n = min(self.block_size, n_tok - i * self.block_size)
            b = np.full(n, s.table[i])
            slot = np.arange(n)
            yield self._read(b, layer, 0, slot), self._read(b, layer, 1, slot)

    # -- token-priority eviction and re-expansion -----------------------------------------------------------------
    def evict_tokens(self, seq_id: int, keep: Any) -> dict[str, Any]:
        """Keep only the cached tokens where ``keep`` (bool [S], same for every layer) is True; the kept tokens are
        re-packed in order into freshly allocated blocks and the old blocks released, so the memory of the evicted
        ones comes back to the free list. Returns the evicted tokens -- {"pos": original positions, "kv": [(k, v)]
        per layer, float32} -- to offload (host memory) for ``restore_tokens``.

        Decode attention is a sum over cached keys, so dropping and re-ordering tokens is valid for it (RoPE was
        applied before caching); the positions of new tokens must still count the evicted ones (the caller's)."""
        s = self._seq(seq_id)
        n = s.lens[0]
        if any(x != n for x in s.lens):
            raise ValueError(f"seq_id: sequence {seq_id} holds {s.lens} tokens per layer; evict needs equal lengths")
        keep = np.asarray(keep)
        if keep.dtype != bool or keep.shape != (n,):
            raise ValueError(f"keep: expected a bool mask of shape ({n},), got {keep.dtype} {keep.shape}")
        kv = [self.gather(seq_id, layer) for layer in range(self.n_layers)]
        for b in s.table:
            self._release(b)
        s.table, s.lens = [], [0] * self.n_layers
        if keep.any():
            for layer, (k, v) in enumerate(kv):
                self.append(seq_id, layer, k[keep], v[keep])
        drop = ~keep
        return dict(pos=np.flatnonzero(drop), kv=[(k[drop], v[drop]) for k, v in kv])

    def restore_tokens(self, seq_id: int, evicted: dict[str, Any]) -> None:
        """Re-expand: append previously evicted tokens (from ``evict_tokens``) back to the sequence's blocks."""
        if len(evicted["pos"]) == 0:
            return
        for layer, (k, v) in enumerate(evicted["kv"]):
            self.append(seq_id, layer, k, v)

    def model_cache(self, seq_id: int) -> PagedSequenceCache:
        """An adapter so ``TinyGPT.forward(ids, cache=...)`` reads and writes this sequence's paged blocks."""
        self._seq(seq_id)
        return PagedSequenceCache(self, seq_id)

    def stats(self) -> dict[str, Any]:
        used = self.num_blocks - self.blocks_free
        tokens = sum(max(s.lens) for s in self.seqs.values())
        logical = sum(len(s.table) for s in self.seqs.values())
        return dict(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            dtype=self.dtype,
            blocks_used=used,
            blocks_free=self.num_blocks - used,
            peak_blocks_used=self.peak_blocks_used,
            bytes_per_block=self.bytes_per_block,
            bytes_per_token=self.bytes_per_block / self.block_size,
            bytes_used=used * self.bytes_per_block,
            bytes_total=self.num_blocks * self.bytes_per_block,
            arena_bytes=self.num_blocks * self.slot_bytes,
            sequences=len(self.seqs),
            tokens=tokens,
            logical_blocks=logical,
            shared_blocks=int(np.count_nonzero(self.refcount > 1)),
            blocks_saved_by_sharing=logical - used,
            cow_copies=self.cow_copies,
            indexed_blocks=len(self._prefix_index),
            cached_blocks=len(self._evictable),
            prefix_evictions=self.prefix_evictions,
            prefix_queries=self.prefix_queries,
            prefix_lookup_tokens=self.prefix_lookup_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            prefix_hit_rate=self.prefix_hit_tokens / self.prefix_lookup_tokens if self.prefix_lookup_tokens else 0.0,
            slot_utilization=tokens / (logical * self.block_size) if logical else 0.0,
        )

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"PagedKVCache(blocks {s['blocks_used']}/{self.num_blocks} used, block_size={self.block_size}, "
            f"dtype={self.dtype}, {len(self.seqs)} sequences)"
        )


class PagedSequenceCache:
    """One sequence of a PagedKVCache seen through the dense-cache interface TinyGPT uses (batch 1):
    ``write(layer, k [1, Hkv, T, D], v)`` appends the tokens to the paged blocks and returns the gathered
    [1, Hkv, S, D] K/V; ``length`` is the number of cached positions."""

    batch_size = 1

    def __init__(self, cache: PagedKVCache, seq_id: int) -> None:
        self.cache, self.seq_id = cache, seq_id
        self.max_seq_len = cache.num_blocks * cache.block_size

    @property
    def length(self) -> int:
        return self.cache.length(self.seq_id, 0)

    @length.setter
    def length(self, value: int) -> None:
        lens = self.cache._seq(self.seq_id).lens
        if any(n != value for n in lens):
            raise ValueError(f"length: paged sequence {self.seq_id} holds {lens} tokens per layer, not {value}")

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if k.shape[0] != 1:
            raise ValueError(f"k: a paged sequence cache holds batch 1, got shape {k.shape}")
        self.cache.append(self.seq_id, layer, k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2))
        kg, vg = self.cache.gather(self.seq_id, layer)
        return kg.transpose(1, 0, 2)[None], vg.transpose(1, 0, 2)[None]
