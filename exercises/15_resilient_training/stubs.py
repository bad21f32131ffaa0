"""Exercises for notebook 15 (resilient training). Replace each ``raise NotImplementedError`` with your code, then run

    pytest exercises/15_resilient_training                  # your answers
    pytest exercises/15_resilient_training --impl=reference

Each stub's NotImplementedError names the library function its reference answer (reference.py) uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

TMP_PREFIX = ".tmp-"  # a temporary file's name starts with this; readers ignore such files
CKPT_PATTERN = r"step_(\d+)\.bin"  # a checkpoint file's name: step_<N>.bin, N a decimal step (any zero padding)


def atomic_save(path: str | os.PathLike[str], data: bytes | bytearray | Iterable[bytes]) -> int:
    """Write ``data`` (bytes, or an iterable of byte chunks) to ``path`` so that a crash at any moment leaves either
    the old file (if there was one) or the complete new one under ``path``, never a prefix. Return the bytes written.

    1. Open a temporary file in the SAME directory (``os.replace`` is atomic only within one filesystem), named
       ``TMP_PREFIX + <final name> + "." + <pid>`` (readers can tell it from a checkpoint; two processes writing
       the same name do not collide). Write the chunks as they come (a checkpoint may not fit in memory twice).
    2. ``flush`` and ``os.fsync`` the file: its bytes are on disk before its name is.
    3. ``os.replace(tmp, path)``: the atomic step (POSIX rename(2)). A reader that opened the old file keeps
       reading the old bytes; the old inode is not overwritten.
    4. ``os.fsync`` the directory (``os.open(dir, os.O_RDONLY)``): the rename itself is on disk.

    If anything fails before the rename (the data iterable raises, the disk is full, ...), remove the temporary
    file and re-raise the exception: ``path`` is untouched. A process killed mid-write cannot clean up: its
    ``.tmp-*`` file stays behind and ``load_latest`` must ignore it. Bad input: ``path``'s directory missing ->
    FileNotFoundError; a final name starting with ``TMP_PREFIX`` -> ValueError naming ``path``.
    """
    raise NotImplementedError("reference solution: tinylearn/resilience/atomic.py:atomic_write")


def load_latest(dirpath: str | os.PathLike[str]) -> tuple[int, bytes] | None:
    """The newest complete checkpoint in ``dirpath``: ``(step, content)`` of the file named ``step_<N>.bin``
    (``CKPT_PATTERN``, the whole name) with the largest step number N -- compared as ints, not as strings
    (``step_10`` is newer than ``step_9``) and not by modification time. Temporary files (``TMP_PREFIX``), other
    names and directories are ignored: with ``atomic_save`` only complete files carry a final name. None when there
    is no checkpoint. ``dirpath`` missing -> FileNotFoundError naming it."""
    raise NotImplementedError("reference solution: tinylearn/resilience/atomic.py (TMP_PREFIX; readers skip temps)")


def xor_parity(shards: list[bytes]) -> bytes:
    """One XOR parity block for ``k`` shards of possibly unequal lengths (RAID-5: any single lost shard can be
    rebuilt). Layout of the returned bytes::

        struct.pack("<I", k) + struct.pack(f"<{k}Q", *lengths) + body

    ``body`` = shard_0 xor shard_1 xor ... xor shard_{k-1}, each zero-padded to the longest length L (len(body) = L).
    The header records every length, so ``rebuild`` can strip the padding of a rebuilt shard. ``shards`` empty ->
    ValueError naming ``shards``."""
    raise NotImplementedError("reference solution: tinylearn/dist/parity.py:encode_shards (r=1, the P fragment)")


def rebuild(shards: list[bytes | None], parity: bytes) -> list[bytes]:
    """The ``k`` original shards, bit-exact, from ``shards`` with at most one lost shard (None) and the parity of
    ``xor_parity``: the lost shard is body xor (the other shards, zero-padded to L), cut to its recorded length.
    With no shard lost, the shards are returned as they are.

    ValueError (naming the argument) when two or more shards are lost (listing their indices: one XOR parity
    repairs one loss); when ``len(shards)`` differs from the k in the header (``shards``); when a present shard's
    length differs from its recorded length (``shards``, with the index); when the parity is too short for its
    header or its body is not the longest recorded length (``parity``)."""
    raise NotImplementedError("reference solution: tinylearn/dist/parity.py:recover_shards (r=1)")


def young_daly(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """The checkpoint interval (seconds of work between checkpoints) that minimises ``expected_waste``:
    I* = sqrt(2 C M) for a checkpoint costing C = ``checkpoint_cost_s`` seconds and a mean time between failures
    M = ``mtbf_s`` (Young 1974; Daly 2006 adds higher-order terms). Bad input: either argument <= 0, NaN, infinite
    or not a number (a bool is not a number) -> ValueError naming that argument and its value."""
    raise NotImplementedError("reference solution: tinylearn/parallel/checkpoint_interval.py:young_daly_interval")


def expected_waste(interval_s: float, checkpoint_cost_s: float, mtbf_s: float) -> float:
    """The fraction of wall time wasted with a checkpoint every I = ``interval_s`` seconds, to first order in I / M:

        W(I) = C / I + I / (2 M)        checkpoint overhead + work lost per failure (I / 2 on average) / M

    (valid for C << I << M). Bad input as ``young_daly``, for all three arguments."""
    raise NotImplementedError("reference solution: tinylearn/parallel/checkpoint_interval.py:waste_rate")
