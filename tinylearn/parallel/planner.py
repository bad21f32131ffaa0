"""plan_3d: enumerate (dp, tp, pp) with dp·tp·pp = world_size, estimate memory and step time, keep what fits.

Model (a transformer with Ψ = n_params parameters, L layers, hidden h, sequence s, microbatch size b, elements of
``dtype_bytes`` bytes (2: bf16/fp16 mixed precision, 4: an fp32 job), 1F1B, ZeRO-``zero_stage`` over the dp ranks):

    memory/rank  = zero_memory_per_rank(Ψ/(tp·pp), zero_stage, dp, dtype_bytes)              model states
                 + 17·dtype_bytes·b·s·h/tp bytes per layer per microbatch (Korthikanti et al. 2022: 34·b·s·h in
                   fp16, no recompute, attention-score term dropped) × L/pp layers × min(pp, m) in flight (1F1B)
    step time    = (m + pp - 1) · T_mb                                                      pipeline incl. bubble
                   T_mb = 6·Ψ·b·s/(tp·pp) / flops_per_s          compute of one stage, forward AND backward
                        + k·(L/pp) · ring(b·s·h·dtype_bytes, tp) TP: k all-reduces per layer (Megatron attention +
                                                                 MLP layer: 2 fwd + 2 bwd = 4; an MLP-only block 2)
                        + 2·(alpha + beta·b·s·h·dtype_bytes)      if pp > 1: activation + gradient p2p
                 + ring(Ψ/(tp·pp)·dtype_bytes bytes, dp)         DP gradient all-reduce (a ring moves 2·(dp-1)/dp
                                                                 times the buffer per rank)
                 + optimizer_s_per_param · Ψ/(tp·pp) (/dp with ZeRO >= 1)            the optimizer step
    with ring(n, p) = tl.dist.cost_model.predict("ring", n, p, alpha, beta) and m = global_batch / (dp·b).

6·Ψ·b·s already counts forward (2·Ψ per token) and backward (4·Ψ per token): ``flops_per_s`` is the achieved
rate of the matmuls, not divided by anything. Calibrate it from a measured forward+backward of one layer, and
alpha/beta from the collective the job really uses (a measured all-reduce), as notebook 10 does.

(tp, pp) run over the divisors of world_size (from its prime factorisation, ``divisors.py``: 100 for 10**9, two
for a prime), never over every integer. Configurations are skipped when tp does not divide h, pp exceeds L, or dp·b
does not divide global_batch. The result is sorted by estimated step time (fastest first); configurations over
``memory_per_rank_bytes`` are dropped (an empty list means nothing fits: raise ZeRO's stage, lower b, or add ranks).
"""

from __future__ import annotations

from typing import NamedTuple

from ..dist import cost_model
from .divisors import divisors
from .zero import zero_memory_per_rank

_MAX_WORLD = 2**63 - 1  # int64: factorised in milliseconds; larger counts are not a world size


class Plan(NamedTuple):
    dp: int
    tp: int
    pp: int
    est_step_s: float
    est_bytes: float


def _check_model_args(tp_allreduces_per_layer: int, dtype_bytes: int, optimizer_s_per_param: float) -> None:
    k = tp_allreduces_per_layer
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"tp_allreduces_per_layer: expected an int >= 0, got {k!r}")
    if dtype_bytes not in (2, 4):
        raise ValueError(f"dtype_bytes: expected 2 (bf16/fp16) or 4 (fp32), got {dtype_bytes!r}")
    if not optimizer_s_per_param >= 0:
        raise ValueError(f"optimizer_s_per_param: expected >= 0, got {optimizer_s_per_param!r}")


def estimate_3d(
    dp: int,
    tp: int,
    pp: int,
    n_params: int,
    n_layers: int,
    hidden: int,
    seq_len: int,
    global_batch: int,
    link: dict[str, float],
    flops_per_s: float = 100e12,
    microbatch_size: int = 1,
    zero_stage: int = 1,
    *,
    tp_allreduces_per_layer: int = 4,
    dtype_bytes: int = 2,
    optimizer_s_per_param: float = 0.0,
) -> tuple[float, float]:
    """(est_step_s, est_bytes) for one configuration (formulas in the module docstring).

    ``tp_allreduces_per_layer``: 4 for a Megatron transformer layer (attention + MLP, one all-reduce each way per
    block), 2 for an MLP-only block (``ParallelMLP``). ``dtype_bytes``: bytes per element of the activations and
    gradients that travel (2 mixed precision, 4 fp32). ``optimizer_s_per_param``: measured seconds per parameter of
    one optimizer step (0: ignored, as on a GPU where it is small next to the matmuls).
    """
    _check_model_args(tp_allreduces_per_layer, dtype_bytes, optimizer_s_per_param)
    a, beta = float(link["alpha_s"]), float(link["beta_s_per_byte"])
    b = microbatch_size
    m = global_batch // (dp * b)
    psi_rank = n_params / (tp * pp)
    states = zero_memory_per_rank(int(round(psi_rank)), zero_stage, dp, dtype_bytes=dtype_bytes)["total"]
    act = 17 * dtype_bytes * b * seq_len * hidden / tp * (n_layers / pp) * min(pp, m)
    act_bytes = b * seq_len * hidden * dtype_bytes
    t_mb = 6 * psi_rank * b * seq_len / flops_per_s
    t_mb += tp_allreduces_per_layer * (n_layers / pp) * cost_model.predict("ring", act_bytes, tp, a, beta)
    if pp > 1:
        t_mb += 2 * (a + beta * act_bytes)
    t = (m + pp - 1) * t_mb + cost_model.predict("ring", psi_rank * dtype_bytes, dp, a, beta)
    t += optimizer_s_per_param * psi_rank / (dp if zero_stage >= 1 else 1)
    return t, states + act


def check_resources(
    memory_per_rank_bytes: float, link: dict[str, float] | None, flops_per_s: float
) -> dict[str, float]:
    """The resources every planner takes (memory per rank, the α-β link, the FLOP rate), checked; returns the link
    (the default one — 5 µs, 100 GB/s — when ``link`` is None)."""
    if not memory_per_rank_bytes > 0:
        raise ValueError(f"memory_per_rank_bytes: expected > 0, got {memory_per_rank_bytes!r}")
    if not flops_per_s > 0:
        raise ValueError(f"flops_per_s: expected > 0, got {flops_per_s!r}")
    link = link or {"alpha_s": 5e-6, "beta_s_per_byte": 1 / 100e9}
    if not isinstance(link, dict) or not {"alpha_s", "beta_s_per_byte"} <= set(link):
        raise ValueError(f"link: expected dict(alpha_s=..., beta_s_per_byte=...), got {link!r}")
    return link


def plan_3d(
    world_size: int,
    n_params: int,
    n_layers: int,
    hidden: int,
    seq_len: int,
    global_batch: int,
    memory_per_rank_bytes: float,
    link: dict[str, float] | None = None,
    *,
    flops_per_s: float = 100e12,
    microbatch_size: int = 1,
    zero_stage: int = 1,
    tp_allreduces_per_layer: int = 4,
    dtype_bytes: int = 2,
    optimizer_s_per_param: float = 0.0,
) -> list[Plan]:
    """Every (dp, tp, pp) that fits in memory, fastest estimated step first (see the module docstring and
    ``estimate_3d`` for the model parameters; the defaults describe a mixed-precision Megatron transformer)."""
    ints = {
        "world_size": world_size,
        "n_params": n_params,
        "n_layers": n_layers,
        "hidden": hidden,
        "seq_len": seq_len,
        "global_batch": global_batch,
        "microbatch_size": microbatch_size,
    }
    for name, v in ints.items():
        if isinstance(v, bool) or not hasattr(v, "__index__"):  # numpy integers are fine, floats and bools not
            raise TypeError(f"{name}: expected an int >= 1, got {type(v).__name__} {v!r}")
        if v.__index__() < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    world_size, n_params, n_layers, hidden, seq_len, global_batch, microbatch_size = (
        v.__index__() for v in ints.values()
    )
    if world_size > _MAX_WORLD:
        raise ValueError(f"world_size: expected an int in [1, 2**63), got {world_size}")
    link = check_resources(memory_per_rank_bytes, link, flops_per_s)
    _check_model_args(tp_allreduces_per_layer, dtype_bytes, optimizer_s_per_param)
    out: list[Plan] = []
    divs = divisors(world_size)  # via the prime factorisation: 100 for 10**9, 2 for a prime
    pps = [d for d in divs if d <= n_layers]
    for tp in (d for d in divs if hidden % d == 0):
        for pp in pps:
            if (world_size // tp) % pp:
                continue
            dp = world_size // (tp * pp)
            if global_batch % (dp * microbatch_size):
                continue
            t, mem = estimate_3d(
                dp,
                tp,
                pp,
                n_params,
                n_layers,
                hidden,
                seq_len,
                global_batch,
                link,
                flops_per_s,
                microbatch_size,
                zero_stage,
                tp_allreduces_per_layer=tp_allreduces_per_layer,
                dtype_bytes=dtype_bytes,
                optimizer_s_per_param=optimizer_s_per_param,
            )
            if mem <= memory_per_rank_bytes:
                out.append(Plan(dp, tp, pp, t, mem))
    return sorted(out, key=lambda x: (x.est_step_s, x.est_bytes))
