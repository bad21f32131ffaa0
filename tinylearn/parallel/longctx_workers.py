"""Rank functions for ``tl.dist.launch`` behind tests/longctx/ and ``bench_ring`` (top level, importable by the
spawned children). Each returns plain data (numbers, booleans, strings) for the parent to assert on.

Every rank builds the same full-sequence inputs from a seed, runs the single-process oracle (torch SDPA, and the
explicit softmax) on them, and compares its shard of the distributed result and gradients. ``_ratio`` is the
worst |a - e| / (atol + rtol·|e|) with the DESIGN.md tolerance of the dtype: <= 1 passes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..bench import measure
from ..tolerance import tolerance
from .bench_longctx import TensorMeter, traffic_meter
from .ring_attention import (
    attention_reference,
    reset_ring_counts,
    ring_attention,
    ring_bytes,
    ring_counts,
    ring_work,
    shard_sequence,
    zigzag_shard,
)
from .seq_parallel import SequenceParallelMLP, reset_sp_counts, sp_bytes, sp_counts
from .tensor_parallel import DenseMLP, ParallelMLP
from .ulysses import reset_ulysses_counts, ulysses_attention, ulysses_bytes, ulysses_counts


def _ratio(a: torch.Tensor, e: torch.Tensor, reduction_size: int | None = None) -> float:
    atol, rtol = tolerance(e.dtype, reduction_size)
    return float(((a.detach() - e.detach()).abs() / (atol + rtol * e.detach().abs())).max())


def _inputs(seed: int, b: int, h: int, n: int, d: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=gen, dtype=dtype) for _ in range(4)]  # q, k, v, dout


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, causal: bool) -> dict[str, Any]:
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    out.backward(dout)
    explicit = attention_reference(q, k, v, causal)
    return {"out": out.detach(), "dq": qs.grad, "dk": ks.grad, "dv": vs.grad, "explicit": explicit}


# ------------------------------------------------------------------------------------------------ ring attention
def ring_checks(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case: b, h, n (global), d, causal, zigzag, dtype (str). Ring fwd+bwd vs the oracle, bytes, memory."""
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for i, c in enumerate(cases):
        dtype = getattr(torch, c.get("dtype", "float32"))
        b, h, n, d, causal, zz = c["b"], c["h"], c["n"], c["d"], c["causal"], c["zigzag"]
        q, k, v, dout = _inputs(100 + i, b, h, n, d, dtype)
        ref = _oracle(q, k, v, dout, causal)

        def shard(x: torch.Tensor, zz: bool = zz) -> torch.Tensor:
            return zigzag_shard(x, rank, world) if zz else shard_sequence(x, rank, world)

        ql, kl, vl = (shard(t).requires_grad_() for t in (q, k, v))
        reset_ring_counts()
        meter = TensorMeter()
        with traffic_meter() as traffic, meter:
            out = ring_attention(ql, kl, vl, causal=causal, zigzag=zz, block_size=c.get("block", 256))
            fwd_traffic = dict(traffic)
            out.backward(shard(dout))
        counts = ring_counts()
        nl = n // world
        red = n if n > 1000 else None
        results.append(
            {
                "case": dict(c, world=world),
                "out": _ratio(out, shard(ref["out"]), red),
                "out_explicit": _ratio(out, shard(ref["explicit"]), red),
                "dq": _ratio(ql.grad, shard(ref["dq"]), red),
                "dk": _ratio(kl.grad, shard(ref["dk"]), red),
                "dv": _ratio(vl.grad, shard(ref["dv"]), red),
                "counts": counts,
                "formula": ring_bytes(b, h, nl, d, world, q.element_size()),
                "meter_fwd_bytes": fwd_traffic["p2p_bytes"],
                "meter_total_bytes": traffic["p2p_bytes"],
                "work_formula": b * h * 2 * ring_work(rank, world, nl, causal, zz, c.get("block", 256)),  # fwd + bwd
                "largest_bytes": meter.largest_bytes,
                "largest_shape": meter.largest_shape,
                "peak_bytes": meter.peak_bytes,
                "full_scores_bytes": b * h * n * n * q.element_size(),
                "local_bytes": b * h * nl * d * q.element_size(),
            }
        )
    return results


def ring_bad_inputs() -> dict[str, str]:
    """Errors that need a process group: odd seq_local with zig-zag, ranks with different shapes."""
    rank = dist.get_rank()
    msgs: dict[str, str] = {}
    x = torch.randn(1, 2, 3, 4)
    try:
        ring_attention(x, x, x, causal=True, zigzag=True)
    except ValueError as e:
        msgs["odd_zigzag"] = str(e)
    y = torch.randn(1, 2, 4 + 2 * rank, 4)  # rank 1 has a longer shard
    try:
        ring_attention(y, y, y)
    except ValueError as e:
        msgs["rank_mismatch"] = str(e)
    return msgs


def ring_dead_rank(out_dir: str, victim: int) -> str:
    """Forward on every rank; then ``victim`` exits (no traceback, no goodbye) and the others run the backward
    ring. Survivors write their error to out_dir/rank<r>.txt (the launch re-raises the victim's death)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, dout = _inputs(7, 1, 2, 8 * world, 4, torch.float32)
    ql, kl, vl = (zigzag_shard(t, rank, world).requires_grad_() for t in (q, k, v))
    out = ring_attention(ql, kl, vl, causal=True)
    if rank == victim:
        time.sleep(0.5)  # the survivors are already blocked in the backward ring
        os._exit(3)
    t0 = time.monotonic()
    try:
        out.backward(zigzag_shard(dout, rank, world))
        msg = "no error"
    except Exception as e:  # noqa: BLE001 - recorded for the parent
        msg = f"{type(e).__name__}: {e}"
    Path(out_dir, f"rank{rank}.txt").write_text(f"{time.monotonic() - t0:.3f}\n{msg}")
    return msg


# ------------------------------------------------------------------------------------------------ Ulysses
def ulysses_checks(cases: list[dict[str, Any]]) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for i, c in enumerate(cases):
        dtype = getattr(torch, c.get("dtype", "float32"))
        b, h, n, d, causal, impl = c["b"], c["h"], c["n"], c["d"], c["causal"], c.get("impl", "p2p")
        q, k, v, dout = _inputs(200 + i, b, h, n, d, dtype)
        ref = _oracle(q, k, v, dout, causal)
        ql, kl, vl = (shard_sequence(t, rank, world).requires_grad_() for t in (q, k, v))
        reset_ulysses_counts()
        with traffic_meter() as traffic:
            out = ulysses_attention(ql, kl, vl, causal=causal, impl=impl)
            fwd_traffic = dict(traffic)
            out.backward(shard_sequence(dout, rank, world))
        nl = n // world
        red = n if n > 1000 else None
        results.append(
            {
                "case": dict(c, world=world),
                "out": _ratio(out, shard_sequence(ref["out"], rank, world), red),
                "dq": _ratio(ql.grad, shard_sequence(ref["dq"], rank, world), red),
                "dk": _ratio(kl.grad, shard_sequence(ref["dk"], rank, world), red),
                "dv": _ratio(vl.grad, shard_sequence(ref["dv"], rank, world), red),
                "counts": ulysses_counts(),
                "formula": ulysses_bytes(b, h, nl, d, world, q.element_size()),
                "meter_fwd_bytes": fwd_traffic["p2p_bytes"] + fwd_traffic["a2a_bytes"],
                "meter_total_bytes": traffic["p2p_bytes"] + traffic["a2a_bytes"],
            }
        )
    errors: dict[str, str] = {}
    x = torch.randn(1, world + 1, 4, 4)  # heads not divisible by the world size
    try:
        ulysses_attention(x, x, x)
    except ValueError as e:
        errors["heads"] = str(e)
    gloo_a2a = "ok"
    try:  # does gloo implement all_to_all_single on CPU tensors?
        t_in = torch.arange(world, dtype=torch.float32) + 10 * rank
        t_out = torch.empty(world)
        dist.all_to_all_single(t_out, t_in)
        if t_out.tolist() != [float(rank + 10 * j) for j in range(world)]:
            gloo_a2a = f"wrong result {t_out.tolist()}"
    except Exception as e:  # noqa: BLE001 - reported, not raised
        gloo_a2a = f"{type(e).__name__}: {e}"
    return {"cases": results, "errors": errors, "gloo_all_to_all_single": gloo_a2a}


# ------------------------------------------------------------------------------------------------ sequence parallel
def _saved_bytes(fn: Any, *args: Any) -> tuple[Any, int]:
    """Run fn(*args) and add up the bytes of the activations autograd saved for backward (distinct storages,
    parameters left out)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter):  # activations only: parameters are the same size either way
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(seen.values())


def sp_checks(b: int = 2, s: int = 8, hidden: int = 16, ffn: int = 32) -> dict[str, Any]:
    """SequenceParallelMLP vs dense LN + MLP (fwd, input grad, parameter grads); bytes vs TP; LN memory."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    norm, dense = nn.LayerNorm(hidden), DenseMLP(hidden, ffn)
    with torch.no_grad():  # non-trivial LN parameters
        norm.weight.add_(0.1 * torch.randn(hidden))
        norm.bias.add_(0.1 * torch.randn(hidden))
    x = torch.randn(b, s, hidden)
    dy = torch.randn(b, s, hidden)
    xr = x.clone().requires_grad_()
    ref = dense(norm(xr))
    ref.backward(dy)

    model = SequenceParallelMLP(norm, dense)
    xs = shard_sequence(x, rank, world, dim=1).requires_grad_()
    reset_sp_counts()
    with traffic_meter() as sp_traffic:
        out = model(xs)
        sp_fwd = sp_traffic["p2p_bytes"]
        out.backward(shard_sequence(dy, rank, world, dim=1))
        sp_total_act = sp_traffic["p2p_bytes"]
        model.allreduce_sp_grads()
    sp_grad_bytes = sp_traffic["p2p_bytes"] - sp_total_act
    k1, k2 = ffn // world, ffn // world
    res: dict[str, Any] = {
        "out": _ratio(out, shard_sequence(ref, rank, world, dim=1)),
        "dx": _ratio(xs.grad, shard_sequence(xr.grad, rank, world, dim=1)),
        "ln_weight": _ratio(model.norm.weight.grad, norm.weight.grad),
        "ln_bias": _ratio(model.norm.bias.grad, norm.bias.grad),
        "fc1_weight": _ratio(model.fc1.weight.grad, dense.fc1.weight.grad[rank * k1 : (rank + 1) * k1]),
        "fc1_bias": _ratio(model.fc1.bias.grad, dense.fc1.bias.grad[rank * k1 : (rank + 1) * k1]),
        "fc2_weight": _ratio(model.fc2.weight.grad, dense.fc2.weight.grad[:, rank * k2 : (rank + 1) * k2]),
        "fc2_bias": _ratio(model.fc2.bias.grad, dense.fc2.bias.grad),
        "sp_counts": sp_counts(),
        "sp_fwd_bytes": sp_fwd,
        "sp_bwd_bytes": sp_total_act - sp_fwd,
        "sp_param_grad_bytes": sp_grad_bytes,
        "formula": sp_bytes(b, s, hidden, world, 4),
    }
    # the TP version (replicated LN on the full sequence, then ParallelMLP): same activation traffic
    tp = ParallelMLP(dense)
    tp_norm = nn.LayerNorm(hidden)
    tp_norm.load_state_dict(norm.state_dict())
    xt = x.clone().requires_grad_()
    with traffic_meter() as tp_traffic:
        yt = tp(tp_norm(xt))
        tp_fwd = tp_traffic["p2p_bytes"]
        yt.backward(dy)
    res["tp_out"] = _ratio(yt, ref)
    res["tp_fwd_bytes"], res["tp_bwd_bytes"] = tp_fwd, tp_traffic["p2p_bytes"] - tp_fwd
    # activation memory of the LayerNorm region: what autograd saves there, full sequence vs shard
    _, res["ln_saved_bytes_tp"] = _saved_bytes(tp_norm, x.clone().requires_grad_())
    _, res["ln_saved_bytes_sp"] = _saved_bytes(model.norm, shard_sequence(x, rank, world, dim=1).requires_grad_())
    # bad input: a sequence that does not split evenly
    try:
        shard_sequence(torch.randn(b, s + 1, hidden), rank, world, dim=1)
    except ValueError as e:
        res["seq_error"] = str(e)
    return res


# ------------------------------------------------------------------------------------------------ benchmark
def bench_rank(cfg: dict[str, Any]) -> dict[str, Any]:
    """Timings (tinylearn.bench.measure, fixed counts: every rank runs the same collectives), bytes, memory."""
    rank, world = dist.get_rank(), dist.get_world_size()
    b, h, n, d, causal = cfg["batch"], cfg["heads"], cfg["seq"], cfg["head_dim"], cfg["causal"]
    q, k, v, dout = _inputs(0, b, h, n, d, torch.float32)
    timing = dict(warmup=cfg["warmup"], repeat=cfg["repeat"], min_call_s=0.0, warmup_s=0.0)
    out: dict[str, Any] = {}

    def run(fn: Any, qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, g: torch.Tensor) -> Any:
        def step() -> None:
            ql, kl, vl = (t.clone().requires_grad_() for t in (qs, ks, vs))
            fn(ql, kl, vl).backward(g)

        t = measure(step, **timing)
        meter = TensorMeter()
        with traffic_meter() as traffic, meter:
            step()
        return {
            "median_ms": t.median_ms,
            "bytes_sent": traffic["p2p_bytes"] + traffic["a2a_bytes"],
            "peak_bytes": meter.peak_bytes,
            "largest_bytes": meter.largest_bytes,
        }

    zz = causal
    sh = (lambda x: zigzag_shard(x, rank, world)) if zz else (lambda x: shard_sequence(x, rank, world))
    out["ring"] = run(
        lambda a, bb, c: ring_attention(a, bb, c, causal=causal, zigzag=zz), sh(q), sh(k), sh(v), sh(dout)
    )
    cs = [shard_sequence(t, rank, world) for t in (q, k, v, dout)]
    out["ulysses"] = run(lambda a, bb, c: ulysses_attention(a, bb, c, causal=causal), *cs)
    if rank == 0:
        out["single"] = run(lambda a, bb, c: F.scaled_dot_product_attention(a, bb, c, is_causal=causal), q, k, v, dout)
    dist.barrier()
    return out
