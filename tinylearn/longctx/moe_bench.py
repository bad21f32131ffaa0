"""MoE measurements: ``bench_moe`` (throughput and dropped-token rate vs capacity factor and top-k, tl vs torch) and
``train_balance`` (does the Switch load-balancing loss actually balance a router trained on skewed tokens?).

bench_moe rows: one per (impl, top_k, capacity_factor or "dropless"), timed with ``tinylearn.bench.measure``
(median of ``repeat`` samples after warm-up) for forward + backward of sum(y * r); ``tokens_per_s`` = tokens /
median seconds; ``vs_torch`` = tl median / torch median for the same setting (the torch twin ``TorchMoE`` holds
the same weights and routes identically, so the dropped fractions agree).

train_balance: tokens x = noise + skew * u, u the unit vector of the initial router's row 0, so at step 0 most
tokens pick expert 0. The model (a top-1 MoE) regresses a fixed random teacher tanh(x A) with Adam; the loss is the
MSE plus ``moe.l_aux``. With aux_loss="switch" the balance loss pushes the router's probability mass off the
overloaded expert; with "none" only the task gradient (through the gates) moves the router. Returns the load
imbalance (max/mean tokens per expert, on a fixed evaluation batch) every ``eval_every`` steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.factory import manual_seed
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..nn.moe import MoE


def bench_moe(
    tokens: int = 2048,
    d_model: int = 64,
    d_ff: int = 128,
    num_experts: int = 8,
    top_ks: tuple[int, ...] = (1, 2),
    capacity_factors: tuple[float | None, ...] = (0.5, 1.0, 1.25, 2.0, None),
    repeat: int = 5,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rows {impl, top_k, capacity_factor (None = dropless), tokens, median_ms, tokens_per_s, dropped_fraction,
    load_imbalance, vs_torch (tl rows)} for forward + backward; see the module docstring."""
    import torch

    from ..bench import measure
    from ..parallel.moe_parallel import TorchMoE

    rng = np.random.default_rng(seed)
    xa = rng.standard_normal((tokens, d_model)).astype(np.float32)
    ra = rng.standard_normal((tokens, d_model)).astype(np.float32)
    rows: list[dict[str, Any]] = []
    for k in top_ks:
        for cf in capacity_factors:
            manual_seed(seed)
            m = MoE(d_model, d_ff, num_experts, top_k=k, capacity_factor=cf or 1.0, dropless=cf is None)
            tm = TorchMoE.from_tl(m)
            x, r = Tensor(xa), Tensor(ra)
            xt, rt = torch.from_numpy(xa), torch.from_numpy(ra)

            def run_tl(m: MoE = m, x: Tensor = x, r: Tensor = r) -> None:
                m.zero_grad()
                (m(x) * r).sum().backward()

            def run_torch(tm: Any = tm, xt: Any = xt, rt: Any = rt) -> None:
                tm.zero_grad()
                (tm(xt) * rt).sum().backward()

            got = {}
            for impl, fn, mod in (("tl", run_tl, m), ("torch", run_torch, tm)):
                t = measure(fn, warmup=2, repeat=repeat)
                got[impl] = t.median
                rows.append(
                    {
                        "impl": impl,
                        "top_k": k,
                        "capacity_factor": cf,
                        "tokens": tokens,
                        "median_ms": t.median * 1e3,
                        "tokens_per_s": tokens / t.median,
                        "dropped_fraction": mod.last_stats["dropped_fraction"],
                        "load_imbalance": mod.last_stats["load_imbalance"],
                    }
                )
            rows[-2]["vs_torch"] = got["tl"] / got["torch"]
    return rows


def train_balance(
    aux_loss: str = "switch",
    steps: int = 150,
    aux_loss_coef: float = 0.3,
    lr: float = 3e-3,
    tokens: int = 256,
    d_model: int = 16,
    d_ff: int = 32,
    num_experts: int = 4,
    skew: float = 3.0,
    eval_tokens: int = 4096,
    eval_every: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """Train a top-1 MoE on skewed tokens (see the module docstring). Returns {"imbalance": [(step, max/mean load on
    the evaluation batch)], "loss": [task loss per step], "final_imbalance", "initial_imbalance"}."""
    from ..optim import Adam

    manual_seed(seed)
    m = MoE(d_model, d_ff, num_experts, top_k=1, capacity_factor=2.0, aux_loss=aux_loss, aux_loss_coef=aux_loss_coef)
    rng = np.random.default_rng(seed)
    u = m.router_weight.data[0] / np.linalg.norm(m.router_weight.data[0])
    teacher = rng.standard_normal((d_model, d_model)).astype(np.float32) / np.sqrt(d_model)

    def batch(n: int) -> tuple[Tensor, Tensor]:
        x = (rng.standard_normal((n, d_model)) + skew * u).astype(np.float32)
        return Tensor(x), Tensor(np.tanh(x @ teacher).astype(np.float32))

    x_eval, _ = batch(eval_tokens)

    def imbalance() -> float:
        with no_grad():
            m(x_eval)
        return float(m.last_stats["load_imbalance"])

    opt = Adam(m.parameters(), lr=lr)
    hist, losses = [(0, imbalance())], []
    for step in range(1, steps + 1):
        x, y = batch(tokens)
        opt.zero_grad()
        task = ((m(x) - y) ** 2).mean()
        (task + m.l_aux).backward()
        opt.step()
        losses.append(float(task.data))
        if step % eval_every == 0 or step == steps:
            hist.append((step, imbalance()))
    return {"imbalance": hist, "loss": losses, "initial_imbalance": hist[0][1], "final_imbalance": hist[-1][1]}
