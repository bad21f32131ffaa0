"""Choosing the pipeline microbatch size online with a bandit (the simplest reinforcement learner).

Global batch G split into microbatches of b samples: m = G/b microbatches through p stages (1F1B). A microbatch
costs t_fixed + b·t_sample per stage (the fixed part — kernel launches, messages, Python — is why tiny microbatches
are inefficient), so a step takes (m + p − 1)(t_fixed + b·t_sample): small b pays the fixed cost m times, large b
pays the bubble (p − 1 slots of a large microbatch). 1F1B holds min(p, m) microbatches of activations, so memory
grows with b; sizes over ``memory_budget`` are excluded (a constraint, not a reward).

``tune_microbatch`` runs an ε-greedy bandit over the feasible sizes: each training step it plays one size, observes
a noisy step time (the environment: multiplicative noise, seeded) and the reward
``throughput − latency_weight · latency`` (samples/s minus weighted seconds; latency = the time one microbatch
takes through all p stages, p·(t_fixed + b·t_sample), what a streaming consumer waits), and keeps the running
mean per size.
With ε decaying as 1/√step it converges on the best expected reward, which the function also returns from the
noise-free model so the caller can check the choice.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any


def microbatch_step_time(global_batch: int, b: int, n_stages: int, t_fixed: float, t_sample: float) -> float:
    """(m + p − 1)·(t_fixed + b·t_sample) seconds with m = global_batch / b (1F1B/GPipe step incl. the bubble)."""
    for name, v in (("global_batch", global_batch), ("b", b), ("n_stages", n_stages)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    if global_batch % b:
        raise ValueError(f"b: {b} does not divide global_batch={global_batch}")
    if not (t_fixed >= 0 and t_sample > 0):
        raise ValueError(f"t_fixed/t_sample: expected t_fixed >= 0 and t_sample > 0, got {t_fixed!r}, {t_sample!r}")
    m = global_batch // b
    return (m + n_stages - 1) * (t_fixed + b * t_sample)


def tune_microbatch(
    global_batch: int,
    candidates: Sequence[int],
    n_stages: int,
    t_fixed: float,
    t_sample: float,
    *,
    act_bytes_per_sample: float = 0.0,
    memory_budget: float = math.inf,
    latency_weight: float = 0.0,
    steps: int = 300,
    noise: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """ε-greedy over the feasible microbatch sizes; returns ``choice`` (the size with the best running mean),
    ``counts`` and ``mean_reward`` per size, ``expected`` (the noise-free reward per size) and ``best`` (its argmax)."""
    if not candidates:
        raise ValueError(f"candidates: expected at least one microbatch size, got {candidates!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
    if not 0 <= noise < 1:
        raise ValueError(f"noise: expected 0 <= noise < 1, got {noise!r}")
    feasible = []
    for b in candidates:
        microbatch_step_time(global_batch, b, n_stages, t_fixed, t_sample)  # validates b
        if min(n_stages, global_batch // b) * b * act_bytes_per_sample <= memory_budget:
            feasible.append(b)
    if not feasible:
        raise ValueError(f"memory_budget: no candidate in {list(candidates)} fits {memory_budget!r} bytes")

    def reward(b: int, scale: float) -> float:
        step_s = microbatch_step_time(global_batch, b, n_stages, t_fixed, t_sample) * scale
        return global_batch / step_s - latency_weight * n_stages * (t_fixed + b * t_sample) * scale

    expected = {b: reward(b, 1.0) for b in feasible}
    rng = random.Random(seed)
    counts = dict.fromkeys(feasible, 0)
    means = dict.fromkeys(feasible, 0.0)
    for step in range(steps):
        untried = [b for b in feasible if counts[b] == 0]
        if untried:
            b = untried[0]
        elif rng.random() < 1 / math.sqrt(step + 1):
            b = rng.choice(feasible)
        else:
            b = max(feasible, key=lambda x: means[x])
        r = reward(b, 1 + noise * (2 * rng.random() - 1))  # the measured step: noisy
        counts[b] += 1
        means[b] += (r - means[b]) / counts[b]
    return {
        "choice": max(feasible, key=lambda x: means[x]),
        "counts": counts,
        "mean_reward": means,
        "expected": expected,
        "best": max(feasible, key=lambda x: expected[x]),
        "infeasible": [b for b in candidates if b not in feasible],
    }
