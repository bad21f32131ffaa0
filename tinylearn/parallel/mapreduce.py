"""MapReduce on tl.dist ranks: the map / shuffle / reduce skeleton of Hadoop MapReduce and Spark's shuffle, built on
torch.distributed object collectives (the process group ``tl.dist.launch`` or ``torchrun`` sets up).

Every rank maps its own shard of records to (key, value) pairs, optionally pre-aggregates them with a
``combiner`` (Hadoop's map-side combine, Spark's ``reduceByKey``), routes each pair to the rank that owns its key
(``partition``: a stable CRC32 of ``repr(key)`` modulo the world size — Python's ``hash`` of a str differs between
processes), exchanges them all-to-all (the shuffle: one ``scatter_object_list`` per source rank), reduces every
key it owns, and finally all ranks all-gather the reduced keys::

    counts = map_reduce(my_lines, lambda line: [(w, 1) for w in line.split()], lambda k, vs: sum(vs),
                        combiner=lambda k, vs: [sum(vs)])

Outside a process group (or with one rank) the same function runs the three phases in-process. What it leaves
out of a real framework: fault tolerance (MapReduce re-runs a failed task from its materialised input; Spark
recomputes a lost partition from its lineage), spilling to disk, and a scheduler that places tasks near the data.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import torch.distributed as dist


def partition(key: Hashable, n_parts: int) -> int:
    """The rank that owns ``key`` among ``n_parts``: CRC32 of ``repr(key)`` (stable across processes) mod n."""
    if isinstance(n_parts, bool) or not isinstance(n_parts, int) or n_parts < 1:
        raise ValueError(f"n_parts: expected an int >= 1, got {n_parts!r}")
    return zlib.crc32(repr(key).encode()) % n_parts


def _group_by_key(pairs: Iterable[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for kv in pairs:
        if not isinstance(kv, tuple) or len(kv) != 2:
            raise TypeError(f"mapper: must yield (key, value) pairs, got {kv!r}")
        out.setdefault(kv[0], []).append(kv[1])
    return out


def map_reduce(
    records: Sequence[Any],
    mapper: Callable[[Any], Iterable[tuple[Any, Any]]],
    reducer: Callable[[Any, list[Any]], Any],
    *,
    combiner: Callable[[Any, list[Any]], Iterable[Any]] | None = None,
    group: Any = None,
    stats: dict[str, int] | None = None,
) -> dict[Any, Any]:
    """Run map -> (combine) -> shuffle -> reduce over this rank's ``records``; every rank gets the full result.

    ``mapper(record)`` yields (key, value) pairs; ``combiner(key, values)`` (optional) returns the values to ship
    for that key from this rank (it must not change the reducer's result, e.g. partial sums for a sum);
    ``reducer(key, values)`` returns the key's result. ``stats`` (a dict, optional) receives this rank's
    ``pairs_mapped`` and ``pairs_shuffled`` (pairs sent to other ranks) and ``keys_reduced``.
    """
    if not isinstance(records, Sequence) or isinstance(records, str | bytes):
        raise TypeError(f"records: expected a sequence of records (this rank's shard), got {type(records).__name__}")
    for name, fn in (("mapper", mapper), ("reducer", reducer)):
        if not callable(fn):
            raise TypeError(f"{name}: expected a callable, got {fn!r}")
    if combiner is not None and not callable(combiner):
        raise TypeError(f"combiner: expected a callable or None, got {combiner!r}")
    distributed = dist.is_available() and dist.is_initialized()
    n = dist.get_world_size(group) if distributed else 1
    me = dist.get_rank(group) if distributed else 0
    # map (+ combine): this rank's pairs, grouped by key
    mapped = [kv for rec in records for kv in mapper(rec)]
    local = _group_by_key(mapped)
    if combiner is not None:
        local = {k: list(combiner(k, vs)) for k, vs in local.items()}
    # shuffle: bucket b holds the pairs of the keys rank b owns
    buckets: list[list[tuple[Any, Any]]] = [[] for _ in range(n)]
    for k, vs in local.items():
        buckets[partition(k, n)].extend((k, v) for v in vs)
    if stats is not None:
        stats["pairs_mapped"] = len(mapped)
        stats["pairs_shuffled"] = sum(len(b) for i, b in enumerate(buckets) if i != me)
    received: list[tuple[Any, Any]] = []
    if distributed and n > 1:
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
        for src in range(n):  # all-to-all as n scatters: rank src sends bucket b to rank b
            box: list[Any] = [None]
            dist.scatter_object_list(box, buckets if src == me else None, src=ranks[src], group=group)
            received.extend(box[0])
    else:
        received = buckets[0]
    # reduce the keys this rank owns, then share the results
    mine = {k: reducer(k, vs) for k, vs in sorted(_group_by_key(received).items(), key=lambda kv: repr(kv[0]))}
    if stats is not None:
        stats["keys_reduced"] = len(mine)
    if not (distributed and n > 1):
        return mine
    parts: list[Any] = [None] * n
    dist.all_gather_object(parts, mine, group=group)
    return {k: v for part in parts for k, v in part.items()}
