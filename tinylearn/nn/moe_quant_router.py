"""Routing under quantization error: a learned policy that steers tokens away from experts whose int4/int8 copies
are inaccurate for them. [Q242] (MODEL: a small simulated MoE, trained with REINFORCE in torch.)

Serving a MoE with its experts quantized to different precisions (a memory budget: some experts int4, some int8)
changes every expert's output by a different amount: an expert whose weights have outlier channels loses far more
to a 4-bit per-channel grid than a smooth one. The plain top-1 router is blind to that. Here:

    quantization   symmetric per-output-channel fake quantization: s_c = max|W[:, c]| / (2^(b-1) - 1),
                   W^ = clip(round(W / s), -2^(b-1), 2^(b-1) - 1) * s   (the same grid as
                   ``tinylearn.quant.int4.quantize_groupwise(W.T, group_size=in, bits=b)``; checked in the tests)
    error stats    err_e = mean over calibration tokens routed to e of ||E^_e(x) - E_e(x)||^2 / ||E_e(x)||^2
                   (measured once with an fp32 shadow copy; ``expert_error_stats``)
    state          the token's features x, its router logits, and log(err_e) for every expert
    action         the expert a that runs the token, among the router's top-m candidates (m = ``candidates``)
    output         y = p_top1(x) * E^_a(x): the token keeps its gate value, only the expert changes
    reward         -||y - y_fp32||^2 / ||y_fp32||^2 where y_fp32 = p_top1 E_top1(x) is the fp32 MoE's output;
                   minus ``load_penalty`` * max(0, load_a / mean_load - 1) to keep the load from collapsing
    policy         logits over the candidates = router logits + MLP([x, log err]) (starts as the plain router);
                   REINFORCE with a moving-average baseline (``train_policy``)

``evaluate`` reports the mean relative output error and the expert load (max/mean) of the plain top-1 router,
the greedy learned policy and the per-token oracle (the best candidate, computed with the fp32 shadow: the bound
the policy can approach). ``make_moe`` builds the simulated layer: experts share a base FFN plus a per-expert
deviation (as after upcycling, so a second-choice expert is a reasonable substitute) and ``outliers`` experts get a
few large input channels (what makes 4-bit per-channel quantization lose accuracy).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "QuantAwareRouter",
    "QuantizedExperts",
    "evaluate",
    "expert_error_stats",
    "fake_quant_per_channel",
    "make_moe",
    "train_policy",
]


def fake_quant_per_channel(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric per-output-channel quantize -> dequantize of ``w`` [in, out] (used as x @ w) at ``bits`` bits."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ValueError(f"bits: expected an int in [2, 16], got {bits!r}")
    if w.dim() != 2 or not w.dtype.is_floating_point:
        raise ValueError(f"w: expected a 2-D float tensor [in, out], got shape {tuple(w.shape)} dtype {w.dtype}")
    qmax, qmin = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    eps = torch.finfo(torch.float32).eps
    scale = (w.abs().amax(dim=0) / qmax).clamp_min(eps)  # [out]
    return torch.clamp(torch.round(w / scale), qmin, qmax) * scale


def make_moe(
    d_model: int = 16,
    d_ff: int = 32,
    num_experts: int = 8,
    spread: float = 0.05,
    outlier_scale: float = 10.0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """MODEL weights {router [E, d], w1 [E, d, f], b1 [E, f], w2 [E, f, d], b2 [E, d]}: every tensor = a shared base
    + ``spread`` * a per-expert deviation (as after upcycling a dense FFN into experts, so a second-choice expert is
    a reasonable substitute). One input channel of the base w1 is an outlier (x ``outlier_scale``, the input is
    scaled down by the same factor in the experts' first matmul so the function is unchanged in fp32): it sets every
    output channel's quantization scale, and on a 4-bit grid the remaining weights round coarsely."""
    if not (math.isfinite(outlier_scale) and outlier_scale >= 1):
        raise ValueError(f"outlier_scale: expected a finite number >= 1, got {outlier_scale!r}")
    g = torch.Generator().manual_seed(seed)

    def rnd(*s: int, fan: int) -> torch.Tensor:
        return torch.randn(*s, generator=g) / math.sqrt(fan)

    def shared(*s: int, fan: int) -> torch.Tensor:
        return rnd(1, *s, fan=fan) + spread * rnd(num_experts, *s, fan=fan)

    w1 = shared(d_model, d_ff, fan=d_model)
    row = int(torch.randint(d_model, (1,), generator=g))
    w1[:, row] *= outlier_scale * (1 + spread * torch.randn(num_experts, 1, generator=g))
    in_scale = torch.ones(d_model)
    in_scale[row] = 1 / outlier_scale
    return {
        "router": rnd(num_experts, d_model, fan=1) * 0.5,
        "in_scale": in_scale,
        "w1": w1,
        "b1": 0.1 * shared(d_ff, fan=1),
        "w2": shared(d_ff, d_model, fan=d_ff),
        "b2": 0.1 * shared(d_model, fan=1),
    }


class QuantizedExperts:
    """fp32 experts and their fake-quantized copies at ``bits[e]`` bits (e.g. [4, 8, 4, 8, ...])."""

    def __init__(self, weights: dict[str, torch.Tensor], bits: list[int]) -> None:
        e = weights["w1"].shape[0]
        if len(bits) != e:
            raise ValueError(f"bits: expected {e} entries (one per expert), got {len(bits)}")
        self.w = weights
        self.bits = list(bits)
        self.q1 = torch.stack([fake_quant_per_channel(weights["w1"][i], bits[i]) for i in range(e)])
        self.q2 = torch.stack([fake_quant_per_channel(weights["w2"][i], bits[i]) for i in range(e)])
        self.num_experts = e

    def all_outputs(self, x: torch.Tensor, quant: bool) -> torch.Tensor:
        """[T, E, d]: every expert applied to every token (small E: the simulation runs them all)."""
        w1, w2 = (self.q1, self.q2) if quant else (self.w["w1"], self.w["w2"])
        xs = x * self.w["in_scale"] if "in_scale" in self.w else x
        h = F.gelu(torch.einsum("td,edf->tef", xs, w1) + self.w["b1"])
        return torch.einsum("tef,efd->ted", h, w2) + self.w["b2"]

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w["router"].T


def expert_error_stats(qe: QuantizedExperts, x_calib: torch.Tensor) -> torch.Tensor:
    """err [E]: mean relative squared output error of expert e's quantized copy over the calibration tokens the
    plain router sends to e (all tokens if none is routed there)."""
    with torch.no_grad():
        yf, yq = qe.all_outputs(x_calib, False), qe.all_outputs(x_calib, True)
        rel = ((yq - yf) ** 2).sum(-1) / (yf**2).sum(-1).clamp_min(1e-12)  # [T, E]
        top = qe.router_logits(x_calib).argmax(-1)
        err = torch.empty(qe.num_experts)
        for e in range(qe.num_experts):
            m = top == e
            err[e] = rel[m, e].mean() if m.any() else rel[:, e].mean()
    return err


class QuantAwareRouter(nn.Module):
    """Policy over the router's top-m candidates: logits = router logits + MLP([x, log err]) (zero-initialised last
    layer, so it starts as the plain router)."""

    def __init__(self, d_model: int, num_experts: int, hidden: int = 32, candidates: int = 3) -> None:
        super().__init__()
        if isinstance(candidates, bool) or not isinstance(candidates, int) or not 1 <= candidates <= num_experts:
            raise ValueError(f"candidates: expected an int in [1, {num_experts}], got {candidates!r}")
        self.m = candidates
        self.net = nn.Sequential(nn.Linear(d_model + num_experts, hidden), nn.Tanh(), nn.Linear(hidden, num_experts))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(
        self, x: torch.Tensor, router_logits: torch.Tensor, err: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate experts [T, m], policy logits over them [T, m])."""
        cand = router_logits.topk(self.m, dim=-1).indices
        feats = torch.cat([x, torch.log(err.clamp_min(1e-12)).expand(x.shape[0], -1)], dim=-1)
        logits = router_logits + self.net(feats)
        return cand, logits.gather(1, cand)


def _outputs(qe: QuantizedExperts, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(router logits, gate of the top-1, fp32 MoE output [T, d], gate * quantized outputs of all experts)."""
    with torch.no_grad():
        logits = qe.router_logits(x)
        probs = logits.softmax(-1)
        p1, top = probs.max(-1)
        yf = qe.all_outputs(x, False)
        ref = p1[:, None] * yf[torch.arange(x.shape[0]), top]
        yq = p1[:, None, None] * qe.all_outputs(x, True)
    return logits, p1, ref, yq


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return ((y - ref) ** 2).sum(-1) / (ref**2).sum(-1).clamp_min(1e-12)


def train_policy(
    qe: QuantizedExperts,
    err: torch.Tensor,
    steps: int = 300,
    batch: int = 256,
    lr: float = 3e-2,
    candidates: int = 3,
    load_penalty: float = 0.05,
    seed: int = 0,
) -> tuple[QuantAwareRouter, list[float]]:
    """REINFORCE on fresh Gaussian token batches; returns the policy and the mean reward per step."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    torch.manual_seed(seed)
    d, e = qe.w["w1"].shape[1], qe.num_experts
    pol = QuantAwareRouter(d, e, candidates=candidates)
    opt = torch.optim.Adam(pol.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    baseline, curve = None, []
    for _ in range(steps):
        x = torch.randn(batch, d, generator=gen)
        logits, _, ref, yq = _outputs(qe, x)
        cand, pl = pol(x, logits, err)
        dist = torch.distributions.Categorical(logits=pl)
        a = dist.sample()
        chosen = cand[torch.arange(batch), a]
        y = yq[torch.arange(batch), chosen]
        load = torch.bincount(chosen, minlength=e).float()
        over = (load / load.mean() - 1).clamp_min(0)[chosen]
        reward = -_rel_err(y, ref) - load_penalty * over
        b = reward.mean() if baseline is None else baseline
        loss = -((reward - b).detach() * dist.log_prob(a)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        baseline = reward.mean().detach() if baseline is None else 0.9 * baseline + 0.1 * reward.mean().detach()
        curve.append(float(reward.mean()))
    return pol, curve


def evaluate(qe: QuantizedExperts, err: torch.Tensor, policy: QuantAwareRouter, x: torch.Tensor) -> dict[str, Any]:
    """Mean relative output error vs the fp32 MoE and load max/mean for: fp32-expert top-1 (0 by definition),
    plain top-1 on quantized experts, the greedy policy, the per-token oracle among the policy's candidates."""
    t, e = x.shape[0], qe.num_experts
    logits, _, ref, yq = _outputs(qe, x)
    ar = torch.arange(t)
    with torch.no_grad():
        cand, pl = policy(x, logits, err)
        choice = {
            "plain": logits.argmax(-1),
            "policy": cand[ar, pl.argmax(-1)],
            "oracle": cand[ar, _rel_err(yq[ar[:, None], cand], ref[:, None]).argmin(-1)],
        }
    out: dict[str, Any] = {}
    for name, ch in choice.items():
        load = np.bincount(ch.numpy(), minlength=e)
        out[name] = {
            "rel_err": float(_rel_err(yq[ar, ch], ref).mean()),
            "load": load.tolist(),
            "load_imbalance": float(load.max() / load.mean()),
            "switched": float((ch != choice["plain"]).float().mean()),
        }
    return out
