"""Per-layer precision planner (FP32 / BF16 / FP16 / INT8): stability gates, a performance model, memory pressure.

    stats = layer_stats(model, loss_fn, batches)             # per layer: grad/activation ranges, sizes
    plan = plan_precision(stats, speed={"bf16": 0.9}, mem_budget=..., loss_scale=2.0**16)

1. **Stability** (which formats a layer may use), from measured statistics:
   - fp16: the largest activation and scaled gradient fit below 65504 / ``margin`` and the small gradients
     (the ``underflow_quantile`` of the nonzero |g|, times the loss scale) stay above fp16's smallest subnormal
     2^-24 -- otherwise they round to zero;
   - bf16 / fp16: fp32's range (bf16), 8 / 11 significant bits: allowed while the gradient's batch-to-batch
     spread is larger than the rounding, i.e. grad_snr (|mean| / std across batches) < 2^8 (bf16) / 2^11 (fp16);
     a layer in ``fp32_layers`` (pinned by the user, e.g. the loss head) stays fp32;
   - int8 (weights, dequantized for compute): the relative error ||Q8(W) - W|| / ||W|| times the layer's
     sensitivity (a Hessian-trace estimate, or 1) is below ``int8_tol``.
2. **Performance model**: ``speed[fmt]`` = step-time ratio of the format to fp32 on the target (measure it, as
   the benchmark in notebook 11 does: bf16 is slower than fp32 on CPUs without bf16 units), time_l = ratio * the
   layer's share of the fp32 time (its FLOPs).
3. **Memory pressure**: every layer starts at its fastest allowed format; while the total bytes (weights at the
   format's width + activations at the compute width) exceed ``mem_budget``, take the move to a narrower allowed
   format with the smallest time increase per byte saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .args import as_int, bool_arg, positive_real, real_arg

_STAT_KEYS = ("grad_snr", "act_absmax", "grad_absmax", "grad_small", "int8_err")  # what allowed_formats reads


def _check_layer_stats(s: Any, keys: Sequence[str] = _STAT_KEYS) -> None:
    """A ``layer_stats`` entry: a dict with the numeric ``keys``, none of them NaN."""
    if not isinstance(s, dict):
        raise TypeError(f"s: expected a layer_stats dict, got {type(s).__name__}")
    missing = [k for k in keys if k not in s]
    if missing:
        raise ValueError(f"s: a layer_stats dict needs {list(keys)}, missing {missing}")
    for k in keys:
        if k != "name" and np.isnan(real_arg(s[k], f"s[{k!r}]")):
            raise ValueError(f"s[{k!r}]: NaN statistic (the measurement failed); re-run layer_stats")


FORMATS = ("fp32", "bf16", "fp16", "int8")
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 4}  # int8 weights are dequantized: fp32 compute
FP16_MAX, FP16_TINY = 65504.0, 2.0**-24


def layer_stats(
    layers: Sequence[tuple[str, Any]],
    run: Callable[[], Any],
    batches: int = 4,
    underflow_quantile: float = 0.01,
) -> list[dict[str, Any]]:
    """Statistics of ``layers`` ((name, module with .weight) pairs) over ``batches`` calls of ``run()``, which
    must run a forward + backward and return a dict {name: activation array of that layer's output}.

    Per layer: n_params, act_elems, act_absmax, grad_absmax, grad_small (the ``underflow_quantile`` of the nonzero
    |grad|), grad_snr (|mean| / std of the weight gradient across batches, averaged over elements), int8_err."""
    from .sensitivity import quantize_symmetric

    if as_int(batches, "batches") < 2:
        raise ValueError(f"batches: expected >= 2 (the gradient spread needs two), got {batches}")
    if not 0.0 <= real_arg(underflow_quantile, "underflow_quantile") < 1.0:  # also rejects NaN
        raise ValueError(f"underflow_quantile: must be in [0, 1), got {underflow_quantile!r}")
    if not callable(run):
        raise TypeError(f"run: expected a callable (one forward + backward), got {type(run).__name__}")
    grads: dict[str, list[np.ndarray]] = {n: [] for n, _ in layers}
    amax: dict[str, float] = {n: 0.0 for n, _ in layers}
    elems: dict[str, int] = {}
    for _ in range(batches):
        for _, m in layers:
            m.weight.grad = None
        acts = run()
        for n, m in layers:
            if m.weight.grad is None:
                raise ValueError(f"layer {n!r}: no gradient after run()")
            grads[n].append(np.asarray(m.weight.grad.data, np.float64))
            a = np.asarray(acts[n], np.float64)
            amax[n], elems[n] = max(amax[n], float(np.abs(a).max(initial=0.0))), int(a.size)
    out = []
    for n, m in layers:
        g = np.stack(grads[n])
        nz = np.abs(g[g != 0])
        w = np.asarray(m.weight.data, np.float64)
        snr = float(np.mean(np.abs(g.mean(0)) / (g.std(0) + 1e-30)))
        err = float(np.linalg.norm(quantize_symmetric(w, 8) - w) / max(np.linalg.norm(w), 1e-30))
        out.append(
            {
                "name": n,
                "n_params": int(w.size),
                "act_elems": elems[n],
                "act_absmax": amax[n],
                "grad_absmax": float(np.abs(g).max(initial=0.0)),
                "grad_small": float(np.quantile(nz, underflow_quantile)) if nz.size else 0.0,
                "grad_snr": snr,
                "int8_err": err,
            }
        )
    return out


def allowed_formats(
    s: dict[str, Any],
    loss_scale: float = 1.0,
    margin: float = 8.0,
    int8_tol: float = 0.02,
    sensitivity: float = 1.0,
    fp32_pinned: bool = False,
) -> list[str]:
    """The formats layer ``s`` may use (see the module docstring), fp32 always."""
    _check_layer_stats(s)
    for name, v in (("loss_scale", loss_scale), ("margin", margin), ("sensitivity", sensitivity)):
        positive_real(v, name)
    if not (np.isfinite(real_arg(int8_tol, "int8_tol")) and int8_tol >= 0):
        raise ValueError(f"int8_tol: must be a finite number >= 0, got {int8_tol!r}")
    ok = ["fp32"]
    if bool_arg(fp32_pinned, "fp32_pinned"):
        return ok
    if s["grad_snr"] < 2.0**8:
        ok.append("bf16")
    scaled_max = max(s["act_absmax"], s["grad_absmax"] * loss_scale)
    if scaled_max * margin < FP16_MAX and s["grad_small"] * loss_scale >= FP16_TINY and s["grad_snr"] < 2.0**11:
        ok.append("fp16")
    if s["int8_err"] * sensitivity < int8_tol:
        ok.append("int8")
    return ok


def plan_precision(
    stats: Iterable[dict[str, Any]],
    speed: dict[str, float] | None = None,
    mem_budget: float | None = None,
    loss_scale: float = 1.0,
    margin: float = 8.0,
    int8_tol: float = 0.02,
    sensitivity: dict[str, float] | None = None,
    fp32_layers: Iterable[str] = (),
) -> dict[str, Any]:
    """Choose a format per layer: the fastest allowed one, then narrower ones under memory pressure.

    ``speed``: step-time ratio to fp32 per format (missing formats: 1.0). Returns dict(formats {name: fmt},
    allowed {name: [fmts]}, bytes, time (relative to all-fp32 = 1), fits)."""
    st = list(stats)
    if not st:
        raise ValueError("stats: expected at least one layer")
    for s in st:
        _check_layer_stats(s, ("name", "n_params", "act_elems", *_STAT_KEYS))
    if mem_budget is not None and not (real_arg(mem_budget, "mem_budget") >= 0):  # also rejects NaN
        raise ValueError(f"mem_budget: must be None or a number >= 0, got {mem_budget!r}")
    sp = {f: 1.0 for f in FORMATS} | dict(speed or {})
    if any(f not in FORMATS or not v > 0 for f, v in sp.items()):
        raise ValueError(f"speed: expected positive ratios for formats {FORMATS}, got {speed!r}")
    pinned, sens = set(fp32_layers), dict(sensitivity or {})
    allowed = {
        s["name"]: allowed_formats(s, loss_scale, margin, int8_tol, sens.get(s["name"], 1.0), s["name"] in pinned)
        for s in st
    }
    flops = np.array([float(s["n_params"]) for s in st])  # a GEMM layer's FLOPs scale with its weight count
    share = flops / flops.sum()

    def nbytes(s: dict[str, Any], f: str) -> float:
        return s["n_params"] * WEIGHT_BYTES[f] + s["act_elems"] * ACT_BYTES[f]

    choice = {s["name"]: min(allowed[s["name"]], key=lambda f: (sp[f], FORMATS.index(f))) for s in st}  # ties: wider

    def total() -> float:
        return sum(nbytes(s, choice[s["name"]]) for s in st)

    while mem_budget is not None and total() > mem_budget:
        moves = []
        for s, w in zip(st, share):
            cur = choice[s["name"]]
            for f in allowed[s["name"]]:
                saved = nbytes(s, cur) - nbytes(s, f)
                if saved > 0:
                    moves.append(((sp[f] - sp[cur]) * w / saved, s["name"], f))
        if not moves:
            break
        _, name, f = min(moves)
        choice[name] = f
    t = float(sum(sp[choice[s["name"]]] * w for s, w in zip(st, share)))
    return {
        "formats": choice,
        "allowed": allowed,
        "bytes": total(),
        "time": t,
        "fits": mem_budget is None or total() <= mem_budget,
    }
