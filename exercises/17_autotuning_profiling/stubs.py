"""Exercises for notebook 17 (autotuning and profiling). Replace each ``raise NotImplementedError`` with your code,
then run

    pytest exercises/17_autotuning_profiling                  # your answers
    pytest exercises/17_autotuning_profiling --impl=reference

Each stub's NotImplementedError names the library code its reference answer (reference.py) uses. Bad input raises
ValueError whose message starts with the argument's name (``"budget: ..."``) and shows the offending value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def random_search(
    space_values: Mapping[str, Sequence[Any]], measure: Callable[[dict[str, Any]], float | None], budget: int,
    seed: int = 0,
) -> tuple[dict[str, Any] | None, float | None, list[tuple[dict[str, Any], float | None]]]:  # fmt: skip
    """Random search WITHOUT replacement over the grid ``space_values`` ({knob: allowed values}).

    Draw up to ``budget`` distinct configurations ({knob: value}, uniformly among those not yet drawn, with
    ``numpy.random.default_rng(seed)``), call ``measure(config)`` on each (seconds, or None for a configuration
    that failed), and return ``(best_config, best_time, history)``: the fastest measured configuration and its time
    (``(None, None, history)`` if every one failed) and ``history`` = [(config, time), ...] in the order measured.
    Stop early when the grid is exhausted (budget larger than the grid). The same seed gives the same history.

    Bad input: ``space_values`` empty, a knob with no values or repeated values -> ValueError("space_values: ...");
    ``budget`` not an int >= 1 (a bool is not an int here) -> ValueError("budget: ..."); ``measure`` not callable
    -> ValueError("measure: ..."); ``measure`` returning a time that is not a positive finite number (and not None)
    -> ValueError("measure: ...").
    """
    raise NotImplementedError("reference solution: tinylearn.tune.searchers.RandomSearch (ask / tell)")


def gemm_features(M: int, N: int, K: int, mc: int, kc: int, nc: int) -> dict[str, float]:
    """Cost-model features of C[M,N] = A[M,K] B[K,N] blocked by (mc, kc, nc) (fp32). First clamp each block to its
    dimension (mc' = min(mc, M), kc' = min(kc, K), nc' = min(nc, N)): a block larger than the matrix is one block.
    Return exactly these keys:

        log2_M, log2_N, log2_K        log2 of the sizes
        log2_mc, log2_kc, log2_nc     log2 of the clamped blocks
        intensity                     2 M N K / (4 (M K + K N + M N))  flop per byte, each matrix moved once
        a_block_bytes                 4 mc' kc'   (the packed A block)
        b_panel_bytes                 4 kc' nc'   (the packed B panel)
        blocks                        ceil(M / mc') ceil(K / kc') ceil(N / nc')

    Bad input: any argument not an int >= 1 (bools rejected) -> ValueError naming it ("kc: ...").
    """
    raise NotImplementedError("reference solution: tinylearn.tune.proxy_model.schedule_features")


def top_ops(profile_rows: Sequence[Mapping[str, Any]], k: int) -> list[tuple[str, float, float]]:
    """The ``k`` ops with the most self time in a profile table.

    ``profile_rows`` is a list of dicts like ``tl.profile``'s key_averages rows: {"name": str, "self_ns": number
    >= 0, ...} (other keys ignored). A name may appear in several rows (e.g. grouped by input shape): sum them.
    Return [(name, self_ns, share)] for the top ``k`` names by summed self time, descending (ties: by name,
    ascending), share = that name's self time / the total self time of ALL rows (0.0 when the total is 0). Fewer
    than ``k`` names: all of them.

    Bad input: ``profile_rows`` not a list of dicts, a row without "name" or "self_ns", a negative or NaN self time
    -> ValueError("profile_rows: ..."); ``k`` not an int >= 1 -> ValueError("k: ...").
    """
    raise NotImplementedError("reference solution: tinylearn.profiler's key_averages sorted by self_cpu_time_total")
