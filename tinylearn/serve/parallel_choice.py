"""Choosing a decode strategy -- tensor parallelism, KV-sharded attention, speculative decoding, or a mix -- from the
sequence length and batch size [Q183]. A cost MODEL per strategy, calibrated on this CPU where possible, a rule
table derived from it, and a check of its speculative term against a real speculative run.

One decode forward of ``q`` query tokens per sequence, batch B, context S, on tp x kv devices (MODEL):

    memory  = weight_s / tp + B * S * kv_read_s / (tp * kv)          weights read once; KV split by heads and by shards
    compute = B * q * token_s / tp + B * q * S * attn_s / (tp * kv)  matmul FLOPs; score/value FLOPs
    comm    = 2 L * allreduce(tp, B q a) + L * allreduce(kv, B q a)  two all-reduces per layer (Megatron TP); one
                                                                      combine of partial softmax outputs (split-K)
    allreduce(p, n bytes) = 2 (p - 1) alpha + 2 (p - 1) / p * n * beta   (ring, alpha-beta)
    step    = overhead + max(memory, compute) + comm    (combine="max": roofline, for an accelerator model)
            = overhead + memory + compute + comm        (combine="sum": what the CPU fit measures)

Speculative decoding with draft length k and per-token acceptance probability alpha (Leviathan et al. 2023): a round
costs k draft forwards and one target forward over k + 1 tokens, and emits E = (1 - alpha^(k+1)) / (1 - alpha)
tokens in expectation (k + 1 when alpha = 1), so latency per token = (k * draft_ratio * step(q=1) + step(q=k+1)) / E.
Tensor parallelism divides every term but adds 2L all-reduces per forward: worth it while the per-device work
saved exceeds alpha-beta costs (small batches, latency-bound). KV sharding divides only the KV terms: worth it at
long context. Speculation trades idle compute for fewer memory-bound forwards: worth it while the forward is
memory-bound (small B) -- at large B the k+1 verify tokens cost k+1 times the compute and the gain vanishes.

Calibration (``calibrate_cpu``): a real TinyGPT forward is timed (tinylearn.bench.measure, median after warm-up) at
several (B, S, q); overhead + weight, token_s, kv_read_s and attn_s come from a non-negative least-squares fit,
weight_s from the weight bytes over the measured STREAM bandwidth; draft_ratio from timing a smaller draft; alpha
from a real ``speculative_generate`` run. The link (alpha, beta) cannot be measured on one CPU: it is an assumed
parameter, stated where it is used.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


def _real(name: str, v: Any, lo: float = 0.0, lo_open: bool = False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__} {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < lo or (lo_open and v == lo):
        raise ValueError(f"{name}: must be a finite number {'>' if lo_open else '>='} {lo}, got {v!r}")
    return v


def _int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name}: must be an int >= {lo}, got {v!r}")
    return int(v)


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target call] = (1 - alpha^(k+1)) / (1 - alpha): accepted drafts + the corrected/bonus token."""
    a = _real("alpha", alpha)
    if a > 1:
        raise ValueError(f"alpha: acceptance probability must be in [0, 1], got {alpha!r}")
    k = _int("k", k, 0)
    return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def simulate_acceptance(alpha: float, k: int, rounds: int = 100_000, seed: int = 0) -> tuple[float, float]:
    """Monte-Carlo of the i.i.d. acceptance model: (mean, standard error) of tokens emitted per round."""
    expected_tokens(alpha, k)
    rounds = _int("rounds", rounds, 1)
    u = np.random.default_rng(_int("seed", seed, 0)).random((rounds, max(k, 1)))[:, :k]
    acc = u < alpha
    first_reject = np.where(acc.all(1), k, np.argmin(acc, axis=1))  # accepted drafts before the first rejection
    tok = first_reject + 1
    return float(tok.mean()), float(tok.std() / np.sqrt(rounds))


def allreduce_s(nbytes: float, p: int, alpha_s: float, beta_s: float) -> float:
    """Ring all-reduce time (alpha-beta): 2 (p - 1) alpha + 2 (p - 1) / p * n * beta; 0 on one device."""
    p = _int("p", p, 1)
    n = _real("nbytes", nbytes)
    return 0.0 if p == 1 else 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n * beta_s


@dataclass(frozen=True, order=True)
class Strategy:
    tp: int = 1  # tensor-parallel degree
    kv: int = 1  # KV shards (sequence-split attention)
    k: int = 0  # speculative draft length (0 = off)

    @property
    def devices(self) -> int:
        return self.tp * self.kv

    def __str__(self) -> str:
        parts = [
            f"TP{self.tp}" if self.tp > 1 else "",
            f"KV{self.kv}" if self.kv > 1 else "",
            f"spec{self.k}" * (self.k > 0),
        ]
        return "+".join(p for p in parts if p) or "single"


@dataclass(frozen=True)
class DecodeCostModel:
    """A cost MODEL of one decode forward (see the module docstring); seconds per unit."""

    overhead_s: float
    weight_s: float
    token_s: float
    kv_read_s: float
    attn_s: float
    comm_bytes_per_token: float
    n_layers: int
    link_alpha_s: float = 5e-6  # ASSUMED link latency (no interconnect to measure on one CPU)
    link_beta_s: float = 1.0 / 100e9  # ASSUMED seconds per byte (100 GB/s)
    draft_ratio: float = 0.1
    accept_alpha: float = 0.7
    max_devices: int = 8
    max_k: int = 8
    combine: str = "max"

    def __post_init__(self) -> None:
        for f in ("overhead_s", "weight_s", "token_s", "kv_read_s", "attn_s", "comm_bytes_per_token", "link_alpha_s"):
            _real(f, getattr(self, f))
        _real("link_beta_s", self.link_beta_s)
        _real("draft_ratio", self.draft_ratio)
        if not 0 <= _real("accept_alpha", self.accept_alpha) <= 1:
            raise ValueError(f"accept_alpha: must be in [0, 1], got {self.accept_alpha!r}")
        _int("n_layers", self.n_layers, 1)
        _int("max_devices", self.max_devices, 1)
        _int("max_k", self.max_k, 0)
        if self.combine not in ("max", "sum"):
            raise ValueError(f"combine: expected 'max' or 'sum', got {self.combine!r}")

    @classmethod
    def from_hardware(
        cls,
        n_params: float,
        n_layers: int,
        d_model: int,
        kv_bytes_per_token: float,
        peak_flops: float,
        mem_bw: float,
        bytes_per_param: float = 2.0,
        overhead_s: float = 20e-6,
        **kw: Any,
    ) -> DecodeCostModel:
        """The MODEL from hardware numbers: weight_s = params * bytes / bw, token_s = 2 params / peak,
        kv_read_s = kv bytes / bw, attn_s = 4 d_model L / peak; all-reduce payload d_model * 2 bytes per token."""
        for name, v in (("n_params", n_params), ("peak_flops", peak_flops), ("mem_bw", mem_bw)):
            _real(name, v, lo_open=True)
        L, d = _int("n_layers", n_layers, 1), _int("d_model", d_model, 1)  # noqa: N806
        return cls(
            overhead_s=overhead_s,
            weight_s=n_params * bytes_per_param / mem_bw,
            token_s=2 * n_params / peak_flops,
            kv_read_s=_real("kv_bytes_per_token", kv_bytes_per_token) / mem_bw,
            attn_s=4 * d * L / peak_flops,
            comm_bytes_per_token=2.0 * d,
            n_layers=L,
            **kw,
        )

    def step_s(self, batch: int, seq_len: int, tp: int = 1, kv: int = 1, q: int = 1) -> float:
        """MODEL seconds of one forward of q tokens per sequence over a context of seq_len."""
        b, s = _int("batch", batch, 1), _int("seq_len", seq_len, 1)
        tp, kv, q = _int("tp", tp, 1), _int("kv", kv, 1), _int("q", q, 1)
        mem = self.weight_s / tp + b * s * self.kv_read_s / (tp * kv)
        comp = b * q * self.token_s / tp + b * q * s * self.attn_s / (tp * kv)
        n = b * q * self.comm_bytes_per_token
        a, be, L = self.link_alpha_s, self.link_beta_s, self.n_layers  # noqa: N806
        comm = 2 * L * allreduce_s(n, tp, a, be) + L * allreduce_s(n, kv, a, be)
        return self.overhead_s + (max(mem, comp) if self.combine == "max" else mem + comp) + comm

    def latency_per_token(self, batch: int, seq_len: int, strategy: Strategy) -> float:
        """MODEL seconds per generated token (per sequence) under ``strategy``."""
        st = strategy
        one = self.step_s(batch, seq_len, st.tp, st.kv, 1)
        if st.k == 0:
            return one
        verify = self.step_s(batch, seq_len, st.tp, st.kv, st.k + 1)
        return (st.k * self.draft_ratio * one + verify) / expected_tokens(self.accept_alpha, st.k)

    def strategies(self) -> list[Strategy]:
        pw = [2**i for i in range(int(math.log2(self.max_devices)) + 1)]
        return [
            Strategy(t, v, k)
            for t, v, k in itertools.product(pw, pw, range(self.max_k + 1))
            if t * v <= self.max_devices
        ]

    def choose(self, seq_len: int, batch: int) -> Strategy:
        """The strategy of least MODEL latency per token (ties: fewer devices, then smaller k)."""
        return min(self.strategies(), key=lambda st: (self.latency_per_token(batch, seq_len, st), st.devices, st.k))

    def rule_table(self, seq_lens: Sequence[int], batches: Sequence[int]) -> list[dict[str, Any]]:
        """One row per (seq_len, batch): the chosen strategy, its MODEL latency and the single-device latency."""
        rows = []
        for s in seq_lens:
            for b in batches:
                st = self.choose(s, b)
                base = self.latency_per_token(b, s, Strategy())
                lat = self.latency_per_token(b, s, st)
                rows.append(dict(seq_len=s, batch=b, strategy=st, latency_s=lat, speedup=base / lat))
        return rows

    def __repr__(self) -> str:
        return (
            f"DecodeCostModel(MODEL, combine={self.combine}, overhead {self.overhead_s:.3g} s, weights "
            f"{self.weight_s:.3g} s, token {self.token_s:.3g} s, kv {self.kv_read_s:.3g} s, attn {self.attn_s:.3g} s, "
            f"alpha={self.accept_alpha:.3g}, draft_ratio={self.draft_ratio:.3g}, link ASSUMED "
            f"{self.link_alpha_s:.3g} s + {self.link_beta_s:.3g} s/B)"
        )


# -- calibration on this CPU (MEASURED inputs) ----------------------------------------------------------------------
def time_forward(model: Any, batch: int, seq_len: int, q: int = 1, repeat: int = 5) -> float:
    """MEASURED median seconds of one TinyGPT forward of q tokens per sequence after seq_len cached ones."""
    from ..autograd import no_grad
    from ..bench import measure

    cache = model.new_cache(batch)
    rng = np.random.default_rng(0)
    v = model.config.vocab_size
    with no_grad():
        model(rng.integers(0, v, (batch, seq_len)), cache=cache)
        ids = rng.integers(0, v, (batch, q))

        def fwd() -> None:
            cache.length = seq_len
            model(ids, cache=cache)

        return measure(fwd, warmup=1, repeat=repeat, min_call_s=0.0, warmup_s=0.0).median


def calibrate_cpu(
    model: Any,
    batches: Sequence[int] = (1, 4, 8),
    seq_lens: Sequence[int] = (16, 48, 96),
    qs: Sequence[int] = (1, 4),
    repeat: int = 5,
    bandwidth_gbs: float | None = None,
    draft: Any = None,
    k: int = 4,
) -> tuple[DecodeCostModel, dict[str, Any]]:
    """(combine="sum" DecodeCostModel, report) fitted to MEASURED TinyGPT forwards on this CPU (see the module
    docstring). report: points [(B, S, q, seconds)], fit R^2, bandwidth used. With a ``draft`` model, draft_ratio
    (draft / target forward at B=1) and accept_alpha (``check_speculative`` with draft length k) are measured too;
    otherwise they keep the class defaults."""
    from scipy.optimize import nnls

    from ..bench.roofline import stream_bandwidth

    pts = [(b, s, q, time_forward(model, b, s, q, repeat)) for b in batches for s in seq_lens for q in qs]
    a = np.array([[1.0, b * q, b * s, b * q * s] for b, s, q, _ in pts])
    y = np.array([t for *_, t in pts])
    coef, _ = nnls(a, y)
    r2 = 1 - np.sum((a @ coef - y) ** 2) / np.sum((y - y.mean()) ** 2)
    bw = (
        stream_bandwidth(2_000_000, 3) if bandwidth_gbs is None else _real("bandwidth_gbs", bandwidth_gbs, lo_open=True)
    )
    wbytes = sum(p.data.nbytes for p in model.parameters())
    weight_s = min(coef[0], wbytes / (bw * 1e9))
    c = model.config
    m = DecodeCostModel(
        overhead_s=coef[0] - weight_s,
        weight_s=weight_s,
        token_s=coef[1],
        kv_read_s=coef[2],
        attn_s=coef[3],
        comm_bytes_per_token=4.0 * c.d_model,
        n_layers=c.n_layers,
        combine="sum",
    )
    rep: dict[str, Any] = dict(points=pts, r2=float(r2), bandwidth_gbs=bw, weight_bytes=wbytes)
    if draft is not None:
        s_mid = int(np.median(seq_lens))
        ratio = time_forward(draft, 1, s_mid, 1, repeat) / time_forward(model, 1, s_mid, 1, repeat)
        spec = check_speculative(model, draft, k)
        m = replace(m, draft_ratio=ratio, accept_alpha=spec["alpha"])
        rep.update(draft_ratio=ratio, speculative=spec)
    return m, rep


def perturbed_draft(model: Any, noise: float, seed: int = 0) -> Any:
    """A draft model for acceptance experiments: the target's weights plus Gaussian noise (relative std ``noise``)."""
    from ..inference import TinyGPT

    _real("noise", noise)
    rng = np.random.default_rng(_int("seed", seed, 0))
    d = TinyGPT.from_config(model.config)
    sd = {}
    for name, t in model.state_dict().items():
        v = np.asarray(t.data)
        sd[name] = v + (noise * (np.std(v) + 1e-8) * rng.standard_normal(v.shape)).astype(v.dtype)
    d.load_state_dict(sd)
    return d


def check_speculative(
    target: Any, draft: Any, k: int, n_tokens: int = 96, temperature: float = 1.0, seed: int = 0
) -> dict[str, float]:
    """MEASURED: run ``speculative_generate`` and compare tokens per target call (rounds that drafted k tokens)
    with the formula at the measured alpha. Returns alpha, measured, formula and ratio = measured / formula."""
    from ..inference import speculative_generate

    prompt = [1, 2, 3, 4]
    _, st = speculative_generate(target, draft, prompt, n_tokens, k=k, temperature=temperature, seed=seed)
    full = [emit for prop, emit in st["round_log"] if prop == k]
    meas = float(np.mean(full))
    f = expected_tokens(st["alpha"], k)
    return dict(alpha=st["alpha"], measured=meas, formula=f, ratio=meas / f, rounds=len(full))
