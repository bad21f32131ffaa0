"""Divisors of an integer through its prime factorisation: the 3D planner enumerates (dp, tp, pp) over the divisors
of the world size, which must stay fast for 10**9 ranks (100 divisors) or a large prime (2 divisors), where a loop
over every integer up to the world size would run for minutes.

Factorisation: trial division by small primes, then a deterministic Miller-Rabin test (exact below 3.3e24 with the
first 13 primes as bases; probabilistic with a vanishing error above) and Brent's variant of Pollard's rho for
what is left — milliseconds for any 64-bit number.
"""

from __future__ import annotations

import math
import random

_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _SMALL_PRIMES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int, rng: random.Random) -> int:
    """A non-trivial factor of the odd composite ``n`` (Brent's cycle detection, batched gcds)."""
    while True:
        y, c, m = rng.randrange(1, n), rng.randrange(1, n), 128
        g = r = q = 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g


def factorize(n: int) -> dict[int, int]:
    """Prime factorisation {prime: exponent} of the integer ``n`` >= 1."""
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError(f"n: expected an int, got {type(n).__name__} {n!r}")
    n = n.__index__()
    if n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n}")
    out: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    stack, rng = [n] if n > 1 else [], random.Random(0)
    while stack:
        m = stack.pop()
        if _is_prime(m):
            out[m] = out.get(m, 0) + 1
            continue
        r = math.isqrt(m)
        if r * r == m:
            stack += [r, r]
            continue
        d = _rho(m, rng)
        stack += [d, m // d]
    return dict(sorted(out.items()))


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n`` >= 1, ascending (built from ``factorize``)."""
    divs = [1]
    for p, e in factorize(n).items():
        divs = [d * p**k for d in divs for k in range(e + 1)]
    return sorted(divs)
