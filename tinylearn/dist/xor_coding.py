"""Pairwise XOR network coding at a relay (notebook 06, Q209; a deterministic model on real byte payloads).

A relay with one *broadcast* output (a shared medium, or a switch port that multicasts) forwards messages to
receivers that already hold some messages (side information). If receiver r1 wants x and holds y while receiver
r2 wants y and holds x, one broadcast of x ⊕ y serves both: each XORs out the message it holds. The classic case
is the two-way relay (a -> R <- b, R broadcasts a ⊕ b: 3 transmissions instead of 4), and a round of recursive
doubling routed through a relay is p/2 such exchanges at once.

    plan_xor_pairs(wants, has) -> list of broadcasts, each a tuple of message ids to XOR (1 or 2 of them)
    xor_bytes(a, b) -> a ⊕ b, the shorter one zero-padded (receivers know each message's length)
    relay_exchange(payloads, wants, has, coded=True) -> RelayResult (decoded bytes per (receiver, id), counts)

Choosing the combinations: two messages may share a broadcast only if every receiver of either one holds the
other (otherwise someone cannot decode); the plan pairs such messages greedily in order. Without a broadcast hop
(point-to-point links) coding saves nothing: every receiver still needs one transmission of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._inputs import is_int


def xor_bytes(a: bytes, b: bytes) -> bytes:
    """a ⊕ b byte by byte; the shorter operand is zero-padded to the longer one's length."""
    for name, v in (("a", a), ("b", b)):
        if not isinstance(v, bytes | bytearray):
            raise ValueError(f"{name}: expected bytes, got {type(v).__name__}")
    n = max(len(a), len(b))
    x = np.zeros(n, dtype=np.uint8)
    y = np.zeros(n, dtype=np.uint8)
    x[: len(a)] = np.frombuffer(bytes(a), dtype=np.uint8)
    y[: len(b)] = np.frombuffer(bytes(b), dtype=np.uint8)
    return np.bitwise_xor(x, y).tobytes()


def _check_demands(wants: Sequence[tuple[int, int]], has: Mapping[int, set[int]]) -> dict[int, set[int]]:
    """{message id: set of receivers that want it}; validates that nobody wants what it already holds."""
    receivers: dict[int, set[int]] = {}
    for d in wants:
        if not (isinstance(d, tuple) and len(d) == 2):
            raise ValueError(f"wants: expected (receiver, message id) pairs, got {d!r}")
        r, x = d
        if r not in has:
            raise ValueError(f"wants: receiver {r!r} has no entry in has")
        if x in has[r]:
            raise ValueError(f"wants: receiver {r!r} already holds message {x!r}")
        receivers.setdefault(x, set()).add(r)
    return receivers


def plan_xor_pairs(wants: Sequence[tuple[int, int]], has: Mapping[int, set[int]]) -> list[tuple[int, ...]]:
    """Broadcasts that serve every (receiver, message id) demand in ``wants``; ``has[r]`` = ids receiver r holds.

    Messages x and y share one broadcast x ⊕ y iff every receiver of x holds y and every receiver of y holds x
    (then everyone decodes with one XOR); pairs are matched greedily in order of first demand, the rest are sent
    alone. Returns a list of (x,) or (x, y)."""
    receivers = _check_demands(wants, has)
    order = list(receivers)
    used: set[int] = set()
    plan: list[tuple[int, ...]] = []
    for i, x in enumerate(order):
        if x in used:
            continue
        used.add(x)
        for y in order[i + 1 :]:
            if y not in used and all(y in has[r] for r in receivers[x]) and all(x in has[r] for r in receivers[y]):
                used.add(y)
                plan.append((x, y))
                break
        else:
            plan.append((x,))
    return plan


@dataclass(frozen=True)
class RelayResult:
    decoded: dict[tuple[int, int], bytes]  # (receiver, message id) -> the bytes it recovered
    broadcasts: int  # transmissions on the relay's broadcast output
    bytes_down: int  # bytes the relay sent
    unicasts_needed: int  # transmissions the same demands need on point-to-point links (coded or not)


def relay_exchange(
    payloads: Mapping[int, bytes],
    wants: Sequence[tuple[int, int]],
    has: Mapping[int, set[int]],
    coded: bool = True,
) -> RelayResult:
    """Run the relay's downlink on real bytes: broadcast each planned packet (XOR of its messages, or the plain
    message when ``coded`` is False), let every receiver decode the message it wants by XORing out the ones it holds
    and truncating to the wanted message's length. Raises ValueError if a receiver cannot decode."""
    receivers = _check_demands(wants, has)
    for x in receivers:
        if x not in payloads:
            raise ValueError(f"payloads: no payload for wanted message {x!r}")
        if not isinstance(payloads[x], bytes | bytearray):
            raise ValueError(f"payloads: message {x!r} is {type(payloads[x]).__name__}, expected bytes")
    plan = plan_xor_pairs(wants, has) if coded else [(x,) for x in receivers]
    decoded: dict[tuple[int, int], bytes] = {}
    bytes_down = 0
    for ids in plan:
        packet = b""
        for x in ids:
            packet = xor_bytes(packet, payloads[x])
        bytes_down += len(packet)
        for x in ids:
            for r in receivers[x]:
                got = packet
                for y in ids:
                    if y != x:
                        if y not in has[r]:
                            raise ValueError(f"has: receiver {r!r} cannot decode {x!r} from {ids} (lacks {y!r})")
                        got = xor_bytes(got, payloads[y])
                decoded[r, x] = got[: len(payloads[x])]
    return RelayResult(decoded, len(plan), bytes_down, len(wants))


def recursive_doubling_demands(world_size: int, round_: int) -> tuple[list[tuple[int, int]], dict[int, set[int]]]:
    """Round ``round_`` of a recursive-doubling all-gather routed through a relay: rank r holds the blocks of its
    aligned group of 2^round ranks and wants those of the partner group (r XOR 2^round). Message id = rank whose
    accumulated payload it is; returns (wants, has) for ``relay_exchange``."""
    if not is_int(world_size) or world_size < 2 or int(world_size) & (int(world_size) - 1):
        raise ValueError(f"world_size: expected a power of two >= 2, got {world_size!r}")
    p = int(world_size)
    if not is_int(round_) or not 0 <= round_ < p.bit_length() - 1:
        raise ValueError(f"round_: expected an int in [0, {p.bit_length() - 1}), got {round_!r}")
    round_ = int(round_)
    wants = [(r, r ^ (1 << round_)) for r in range(p)]
    has = {r: {r} for r in range(p)}
    return wants, has
