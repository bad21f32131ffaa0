"""Training-memory estimate (``tl.memory.estimate``) and measurement (``tl.memory.measure_peak``).

One training step holds, at its peak:

    params            sum numel * bytes(dtype) (fp32 master weights under autocast)
    grads             same size as the params (fp32 master gradients under autocast)
    optimizer_state   Adam: exp_avg + exp_avg_sq = 2 x params; SGD: 0 (1 x params with momentum)
    activations       what the autograd graph keeps for backward: layer outputs + saved inputs/masks/im2col
                      buffers, and under autocast the bf16 copies of the weights the GEMMs consumed; counted from
                      one forward on a zeros batch by walking the graph (no training). For a transformer this is
                      dominated by the attention scores/probabilities, B*H*T*T per layer, several times (scores,
                      scaled+masked scores, softmax output), plus the LayerNorm/GELU inputs and the embeddings
    workspace         what the backward holds beyond activations + grads, found by walking the graph in the
                      engine's order (``_backward_peak``): output gradients waiting for their node, the input
                      gradients a node is producing (in the input's dtype: bf16 GEMMs return bf16),
                      the fp32 copy a cast's backward makes of a weight gradient, a dcol-sized temporary next to
                      an im2col buffer, both addends of a gradient sum. The optimizer updates in place (fused
                      step), so the step adds none

    peak = max(backward:       params + activations + grads + workspace,
               optimizer step: params + grads + optimizer_state + activations still held by the live loss)

Why bf16 + SGD was underestimated (by 8-17% on the digits MLPs) by a "largest activation" workspace: with SGD
the peak is in the backward, at the cast node of the largest weight, where the weight's bf16 gradient from the GEMM
(the cast's incoming gradient) and the fp32 copy the cast makes of it are alive together -- a parameter-sized
array and a half, not one activation. Adam hides it: its step (2 x params of state) is the larger peak.

With ``checkpoint_segments=k`` (Sequential models) the k segment inputs and the last (un-checkpointed) segment's
graph are kept -- the engine frees node inputs only when the backward returns, so the last segment is still alive
while the others are rebuilt one at a time: activations = boundaries + last segment + max rebuilt segment, and the
workspace is the backward walk of a rebuilt segment plus the gradient handed into it. For n equal layers that is
about k + 2n/k + 1 layer outputs, minimal at k = sqrt(2n) (not Chen et al.'s sqrt(n), which assumes every segment
is checkpointed and freed after its backward); 2 segments cost more than none (n + 3 vs n + 1).

Recompute planning (``greedy_recompute``, ``plan_recompute``): which layers to drop and rebuild under a budget.

``measure_peak(fn)`` runs ``fn`` with every numpy allocation served by a C++ CachingAllocator arena
(``tl.memory.pooled(alloc, numpy=True)``) and returns the allocator's peak of allocated bytes: what the step
really used, temporaries included (sizes rounded up to 64 bytes).

Large models (``transformer_memory``): mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et al.,
ZeRO, 2020): fp16/bf16 params (2) + grads (2) + fp32 master params (4) + Adam m and v (4 + 4); activations per
transformer layer ~ s*b*h*(34 + 5*a*s/h) bytes with 16-bit activations, no recomputation, no sequence/tensor
parallelism (Korthikanti et al., 2022), where s = sequence, b = micro-batch, h = hidden, a = heads; with
FlashAttention the 5*a*s/h term (the attention matrices) vanishes: s*b*h*34 + the fp32 log-sum-exp 4*a*s*b.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._inputs import is_int

_OPT_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd_momentum": 1}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _base(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _graph_bytes(root: Any, exclude: set[int]) -> tuple[int, int, int]:
    """(all unique arrays kept by the graph, those that are tensors (outputs/inputs), largest array) in bytes."""
    from ..autograd import Tensor

    seen: set[int] = set()
    total = tensors = largest = 0
    stack, visited = [root._ctx], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        items = [(a, False) for a in node.saved_tensors if isinstance(a, np.ndarray)]
        for t in getattr(node, "inputs", ()):
            if isinstance(t, Tensor):
                items.append((t.data, True))
                stack.append(t._ctx)
        for a, is_tensor in items:
            b = _base(a)
            key = id(b)
            if key in seen or key in exclude:
                continue
            seen.add(key)
            n = int(b.nbytes)
            total += n
            largest = max(largest, n)
            if is_tensor:
                tensors += n
    return total + int(root.data.nbytes), tensors + int(root.data.nbytes), largest


def _grad_bytes(node: Any, t: Any) -> int:
    """Bytes of the gradient ``node`` hands to its input ``t``: the input's own dtype. Under autocast bf16 the GEMMs'
    backward products are bf16 (the C++ bf16 GEMM rounds its fp32 sums once, ``amp.bf16_matmul``), ReLU's backward
    selects on bf16 bits, an fp32 op's cast hands back bf16; fp16 ops run in fp32 between cast nodes, whose backward
    casts to the source dtype."""
    del node
    return int(t.data.nbytes)


def _backward_peak(root: Any, exclude: set[int]) -> tuple[int, int]:
    """Walk the graph in the engine's order and track what is alive during ``root.backward()``.

    Returns (peak bytes above the parameters, parameter-gradient bytes at the end). Alive at each node:
    every array the graph holds (the engine's node list keeps every input tensor until the backward returns; an
    array saved only for backward is dropped once the last node holding it has run, as the engine frees a node's
    saved values after its backward), the output gradients
    waiting for their node, the leaf gradients summed so far, the input gradients the node is producing
    (``_grad_bytes``; a cast's backward casts back to the source dtype, so fp32 master weights get an fp32 copy
    next to the fp32 GEMM gradient being cast), a temporary the size of each buffer the node saved for itself
    (dcol next to im2col), and both addends of a gradient summed into a new array."""
    from ..autograd import Tensor
    from ..autograd.engine import _topo_order

    order = _topo_order(root._ctx)
    tensor_bases: set[int] = set()
    act_bytes: dict[int, int] = {}
    node_saved: dict[int, list[int]] = {}
    for node in order:
        for t in node.inputs:
            if isinstance(t, Tensor):
                b = _base(t.data)
                if id(b) not in exclude:
                    tensor_bases.add(id(b))
                    act_bytes[id(b)] = int(b.nbytes)
    rb = _base(root.data)
    tensor_bases.add(id(rb))
    act_bytes[id(rb)] = int(rb.nbytes)
    users: dict[int, int] = {}  # saved-only buffer -> number of nodes holding it
    for node in order:
        ids = []
        for a in node.saved_tensors or ():
            if isinstance(a, np.ndarray):
                b = _base(a)
                if id(b) in exclude or id(b) in tensor_bases or id(b) in ids:
                    continue
                act_bytes[id(b)] = int(b.nbytes)
                ids.append(id(b))
                users[id(b)] = users.get(id(b), 0) + 1
        node_saved[id(node)] = ids
    live = sum(act_bytes.values())
    pending: dict[tuple[int, int], int] = {(id(root._ctx), root._idx): int(root.data.nbytes)}
    leaves: dict[int, int] = {}
    n_pending, n_leaves, peak = int(root.data.nbytes), 0, 0
    for node in reversed(order):
        mine = [k for k in pending if k[0] == id(node)]
        if not mine:
            continue
        now = live + n_pending + n_leaves
        made = sum(_grad_bytes(node, t) for t in node.inputs if isinstance(t, Tensor) and t._rg)
        # a buffer saved only for backward (im2col columns, masks) gets a same-sized gradient temporary (dcol),
        # unless the op says its backward makes nothing beyond the input gradients (batch_norm's)
        temp = max((act_bytes[b] for b in node_saved[id(node)]), default=0) if node.backward_temporary else 0
        peak = max(peak, now + made + temp)
        g_out = 0
        for k in mine:
            g = pending.pop(k)
            n_pending -= g
            g_out += g
        summed = biggest = 0
        for t in node.inputs:
            if not (isinstance(t, Tensor) and t._rg):
                continue
            n = _grad_bytes(node, t)
            key = id(t) if t._ctx is None else (id(t._ctx), t._idx)
            slot, total = (leaves, "leaf") if t._ctx is None else (pending, "pending")
            if key in slot:
                summed, biggest = summed + n, max(biggest, n)  # the addend lives next to the old and the new sum
            else:
                slot[key] = n
                if total == "leaf":
                    n_leaves += n
                else:
                    n_pending += n
        # the node's output gradients are released only when the engine moves on
        peak = max(peak, live + n_pending + n_leaves + g_out + summed + biggest)
        for b in node_saved[id(node)]:  # the engine drops a node's saved values after its backward
            users[b] -= 1
            if users[b] == 0:
                live -= act_bytes[b]
    return peak, n_leaves


def _layers(model: Any) -> list[Any]:
    kids = list(model.children())
    if len(kids) == 1 and hasattr(kids[0], "children") and list(kids[0].children()):
        return _layers(kids[0])
    return kids


def estimate(
    model: Any,
    input_shape: tuple[int, ...],
    optimizer: str = "adam",
    dtype: str = "float32",
    amp: str | None = None,
    checkpoint_segments: int | None = None,
    loss: Callable[[Any], Any] | None = None,
    input_dtype: str = "float32",
) -> dict[str, int]:
    """Bytes of one training step of ``model`` on a batch of ``input_shape`` (batch dim included).

    Returns dict(params, grads, optimizer_state, activations, workspace, peak). ``amp``: None or the autocast
    dtype ('bfloat16'/'float16') the forward runs under. ``loss``: maps the model output to a scalar (default:
    cross entropy against class 0, like a classifier step)."""
    from .. import autograd
    from ..nn import functional as F

    opt = optimizer.lower() if isinstance(optimizer, str) else optimizer
    if opt not in _OPT_STATES:
        raise ValueError(f"optimizer: expected one of {sorted(_OPT_STATES)}, got {optimizer!r}")
    if dtype not in _ITEMSIZE:
        raise ValueError(f"dtype: expected one of {sorted(_ITEMSIZE)}, got {dtype!r}")
    if not isinstance(input_shape, tuple | list) or not all(is_int(s) and s > 0 for s in input_shape):
        raise ValueError(f"input_shape: expected a tuple of positive ints, got {input_shape!r}")
    input_shape = tuple(int(s) for s in input_shape)
    if checkpoint_segments is not None and (not is_int(checkpoint_segments) or checkpoint_segments < 1):
        raise ValueError(f"checkpoint_segments: expected a positive int or None, got {checkpoint_segments!r}")
    checkpoint_segments = None if checkpoint_segments is None else int(checkpoint_segments)
    params = list(model.parameters())
    scale = _ITEMSIZE[dtype] / 4
    n_param_bytes = int(sum(p.data.size for p in params) * _ITEMSIZE[dtype])
    exclude = {id(_base(p.data)) for p in params}
    if input_dtype in ("int64", "int32"):
        x = np.zeros(tuple(input_shape), input_dtype)  # token ids (an Embedding-first model such as TinyGPT)
    elif input_dtype == "float32":
        x = autograd.zeros(*input_shape)
    else:
        raise ValueError(f"input_dtype: expected 'float32', 'int64' or 'int32', got {input_dtype!r}")

    def default_loss(out: Any) -> Any:  # cross entropy against class 0; [B, T, V] logits are flattened to [B*T, V]
        if out.ndim > 2:
            out = out.reshape(-1, out.shape[-1])
        return F.cross_entropy(out, autograd.Tensor(np.zeros(out.shape[0], np.int64)))

    loss_fn = loss or default_loss

    def forward(run: Callable[[Any], Any]) -> Any:
        if amp is not None:
            from ..amp import autocast

            with autocast(amp):
                return loss_fn(run(x))
        return loss_fn(run(x))

    layers = _layers(model) if checkpoint_segments else []
    if checkpoint_segments:
        from ..autograd.checkpoint import checkpoint_sequential

        if checkpoint_segments > len(layers):
            raise ValueError(f"checkpoint_segments: {checkpoint_segments} > number of layers {len(layers)}")
        root = forward(lambda h: checkpoint_sequential(layers, checkpoint_segments, h))
        kept, retained, largest = _graph_bytes(root, exclude)
        # the backward rebuilds one segment at a time: add the largest segment's own graph
        size = len(layers) // checkpoint_segments
        h, seg_max, ws_ck = x, 0, 0
        with autograd.no_grad():
            bounds = [i * size for i in range(checkpoint_segments)] + [len(layers)]
        for s in range(checkpoint_segments - 1):
            hin = autograd.Tensor(h.data, requires_grad=True)
            out = hin
            for m in layers[bounds[s] : bounds[s + 1]]:
                out = m(out)
            seg, _, big = _graph_bytes(out.sum(), exclude)
            seg_max, largest = max(seg_max, seg), max(largest, big)
            # the rebuilt segment's own backward walk: gradients in flight beyond its graph and its leaf gradients
            seg_peak, seg_leaves = _backward_peak(out.sum(), exclude)
            ws_ck = max(ws_ck, seg_peak - seg - seg_leaves)
            h = out.detach()
        activations = kept + seg_max
        retained = kept  # after the backward only the segment boundaries are still referenced
    else:
        root = forward(model)
        activations, retained, largest = _graph_bytes(root, exclude)
        bwd_peak, _ = _backward_peak(root, exclude)
        retained = activations  # the live loss keeps the graph (and what its nodes hold) until the step
    activations, retained, largest = int(activations * scale), int(retained * scale), int(largest * scale)
    grads = n_param_bytes
    opt_state = _OPT_STATES[opt] * n_param_bytes
    # backward workspace: what the walk of the backward holds beyond the activations and the parameter gradients
    # (output gradients in flight, the gradients a node is producing, casts back to fp32); with checkpointing the
    # same walk over a rebuilt segment, plus the gradient handed into that segment (at most its largest array)
    if checkpoint_segments:
        ws_bwd = int(ws_ck * scale) + largest
    else:
        ws_bwd = max(0, int(bwd_peak * scale) - activations - grads)
    ws_step = 0  # tinylearn's Adam/SGD update in place (fused C++ step): no parameter-sized temporaries
    peak_bwd = n_param_bytes + activations + grads + ws_bwd
    peak_step = n_param_bytes + grads + opt_state + retained + ws_step
    return {
        "params": n_param_bytes,
        "grads": grads,
        "optimizer_state": opt_state,
        "activations": activations,
        "workspace": max(ws_bwd, ws_step),
        "peak": max(peak_bwd, peak_step),
    }


def measure_peak(fn: Callable[[], Any], capacity: int = 1 << 30) -> int:
    """Peak bytes allocated while ``fn()`` runs, every numpy allocation going through a pooled C++
    CachingAllocator (arena of ``capacity`` bytes; allocations made before ``fn`` are not counted)."""
    from .caching import CachingAllocator
    from .pooled import pooled

    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    alloc = CachingAllocator(capacity, round_to=64, backend="cpp")
    with pooled(alloc, numpy=True) as counters:
        fn()
    if counters.n_fallback:
        raise MemoryError(f"measure_peak: {counters.n_fallback} allocations did not fit capacity={capacity} bytes")
    return int(alloc.stats()["peak"])


def transformer_memory(
    n_params: float,
    n_layers: int,
    hidden: int,
    heads: int,
    seq: int,
    micro_batch: int,
    checkpoint: bool = False,
    flash_attention: bool = False,
) -> dict[str, float]:
    """Bytes for mixed-precision Adam training of a dense transformer on one device (no sharding).

    model_states = 16 * n_params (2 fp16 params + 2 fp16 grads + 4 fp32 master + 4 + 4 Adam m, v);
    activations = n_layers * s*b*h*(34 + 5*a*s/h) (or 2*s*b*h per layer, the layer inputs, with full
    recomputation). The 5*a*s/h term is the attention matrices (softmax output 2*a*s^2*b, dropout mask a*s^2*b,
    dropout output 2*a*s^2*b bytes); ``flash_attention=True`` never materialises them (the kernel recomputes the
    scores block by block in the backward) and keeps only the fp32 log-sum-exp per row, 4*a*s*b bytes:
    s*b*h*34 + 4*a*s*b per layer."""
    if min(n_params, n_layers, hidden, heads, seq, micro_batch) <= 0:
        raise ValueError("transformer_memory: every size must be > 0")
    if flash_attention:
        per_layer = seq * micro_batch * hidden * 34 + 4 * heads * seq * micro_batch
    else:
        per_layer = seq * micro_batch * hidden * (34 + 5 * heads * seq / hidden)
    act = n_layers * (2 * seq * micro_batch * hidden if checkpoint else per_layer)
    return {
        "params_16bit": 2 * n_params,
        "grads_16bit": 2 * n_params,
        "master_params_fp32": 4 * n_params,
        "adam_states_fp32": 8 * n_params,
        "model_states": 16 * n_params,
        "activations": act,
        "total": 16 * n_params + act,
    }


def model_state_bytes(n_params: float, optimizer: str = "adam", mixed_precision: bool = True) -> float:
    """Bytes of params + grads + optimizer states per ``n_params`` (no activations, no sharding).

    fp32:            params 4 + grads 4 + states (Adam 8, SGD+momentum 4, SGD 0)
    mixed precision: 16-bit params 2 + 16-bit grads 2 + fp32 master params 4 + fp32 states (Adam 8, ...)
    Adam: 16 bytes/param either way (mixed precision saves activation memory and bandwidth, not model states)."""
    states = {"adam": 8, "adamw": 8, "sgd_momentum": 4, "sgd": 0}
    if optimizer not in states:
        raise ValueError(f"optimizer: expected one of {sorted(states)}, got {optimizer!r}")
    if n_params < 0:
        raise ValueError(f"n_params: must be >= 0, got {n_params}")
    per = (2 + 2 + 4 if mixed_precision else 4 + 4) + states[optimizer]
    return per * n_params


def greedy_recompute(
    act_bytes: list[int] | list[float], fwd_cost: list[float], budget: float, working_set: bool = False
) -> dict[str, Any]:
    """Greedy recompute plan: drop layers in decreasing act_bytes / fwd_cost (memory saved per unit of recompute)
    until the kept activations fit ``budget`` (with ``working_set``: kept + the largest dropped activation, which
    must be rebuilt in the backward, fit). Returns dict(drop, keep, recompute, peak) or raises if it cannot fit.

    The ratio rule is the classic knapsack heuristic: not optimal in general (``plan_recompute`` is)."""
    a, f = _check_layers(act_bytes, fwd_cost, budget)
    keep = set(range(len(a)))

    def peak(k: set[int]) -> float:
        dropped = [a[i] for i in range(len(a)) if i not in k]
        return sum(a[i] for i in k) + (max(dropped, default=0) if working_set else 0)

    for i in sorted(range(len(a)), key=lambda i: (-a[i] / f[i] if f[i] > 0 else -np.inf, i)):
        if peak(keep) <= budget:
            break
        keep.discard(i)
    if peak(keep) > budget:
        raise ValueError(f"greedy_recompute: no plan fits budget {budget} (best peak {peak(keep)})")
    drop = sorted(set(range(len(a))) - keep)
    return {"drop": drop, "keep": sorted(keep), "recompute": float(sum(f[i] for i in drop)), "peak": peak(keep)}


def _check_layers(act_bytes: Any, fwd_cost: Any, budget: float) -> tuple[list, list]:
    a, f = list(act_bytes), [float(x) for x in fwd_cost]
    if len(a) != len(f) or not a:
        raise ValueError(f"act_bytes/fwd_cost: expected equal non-zero lengths, got {len(a)} and {len(f)}")
    if min(a) < 0 or min(f) < 0 or budget < 0:
        raise ValueError("act_bytes, fwd_cost and budget must be >= 0")
    return a, f


def plan_recompute(
    act_bytes: list[int], fwd_cost: list[float], budget: int, working_set: bool = True, backward_factor: float = 2.0
) -> dict[str, Any]:
    """Optimal set of layers to recompute (Q119): minimise the step time forward + backward + recompute, i.e. the
    recompute cost sum_{i dropped} F_i (recomputing layer i costs its forward F_i again), subject to the memory
    peak fitting ``budget``. With ``working_set`` the peak is sum_{kept} A_i + max_{dropped} A_i (a dropped
    activation is rebuilt in the backward and lives next to the kept ones), else sum_{kept} A_i.

    Exact dynamic programme (a 0/1 knapsack) over integer sizes (bytes, or KiB, ...): for every threshold t (the
    largest dropped A_i), a min-cost cover dp[c] = least recompute cost of dropping layers with A_i <= t whose
    sizes sum to >= c, for c up to the amount that must go, total - (budget - t). O(n^2 * total) time.
    Returns dict(drop, keep, recompute, peak, step_time) with step_time = (1 + backward_factor) sum F + recompute.
    """
    a, f = _check_layers(act_bytes, fwd_cost, budget)
    if not all(is_int(x) for x in a):
        raise TypeError("act_bytes: plan_recompute needs integer sizes (bytes, KiB, ...)")
    a = [int(x) for x in a]
    total, n = sum(a), len(a)
    best: tuple[float, list[int]] | None = (0.0, []) if total <= budget else None
    thresholds = sorted(set(a)) if working_set else [0]
    for t in thresholds:
        cap = budget - t if working_set else budget
        need = total - cap
        if need <= 0 or cap < 0:
            continue
        items = [i for i in range(n) if not working_set or a[i] <= t]
        inf = float("inf")
        dp = [0.0] + [inf] * need  # dp[c]: least cost to drop >= c units (c capped at need)
        choice: list[list[int] | None] = [[]] + [None] * need
        for i in items:
            for c in range(need, -1, -1):
                src = max(0, c - a[i])
                if dp[src] + f[i] < dp[c]:
                    dp[c], choice[c] = dp[src] + f[i], [*choice[src], i]
            # (iterating c downwards keeps it 0/1: dp[src] with src < c is still the previous row's value)
        if dp[need] < inf and (best is None or dp[need] < best[0]):
            best = (dp[need], sorted(choice[need]))
    if best is None:
        raise ValueError(f"plan_recompute: no set of layers fits budget {budget}")
    drop = best[1]
    keep = [i for i in range(n) if i not in drop]
    peak = sum(a[i] for i in keep) + (max((a[i] for i in drop), default=0) if working_set else 0)
    rc = float(sum(f[i] for i in drop))
    return {"drop": drop, "keep": keep, "recompute": rc, "peak": peak, "step_time": (1 + backward_factor) * sum(f) + rc}
