"""Training-memory estimate (``tl.memory.estimate``) and measurement (``tl.memory.measure_peak``).

One training step holds, at its peak:

    params            sum numel * bytes(dtype)
    grads             same size as the params (fp32 master gradients under autocast)
    optimizer_state   Adam: exp_avg + exp_avg_sq = 2 x params; SGD: 0 (1 x params with momentum)
    activations       what the autograd graph keeps for backward: layer outputs + saved inputs/masks/im2col
                      buffers; counted from one forward on a zeros batch by walking the graph (no training)
    workspace         transient buffers: the largest backward temporary (about the largest saved activation);
                      the optimizer updates in place (fused step), so it adds none

    peak = max(end of backward: params + activations + grads + workspace_bwd,
               optimizer step:  params + grads + optimizer_state + retained outputs + workspace_step)

With ``checkpoint_segments=k`` (Sequential models) only the k segment inputs are kept, and one segment's
activations are rebuilt at a time in the backward: activations = boundaries + max segment.

``measure_peak(fn)`` runs ``fn`` with every numpy allocation served by a C++ CachingAllocator arena
(``tl.memory.pooled(alloc, numpy=True)``) and returns the allocator's peak of allocated bytes: what the step
really used, temporaries included (sizes rounded up to 64 bytes).

Large models (``transformer_memory``): mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et al.,
ZeRO, 2020): fp16/bf16 params (2) + grads (2) + fp32 master params (4) + Adam m and v (4 + 4); activations per
transformer layer ~ s*b*h*(34 + 5*a*s/h) bytes with 16-bit activations, no recomputation, no sequence/tensor
parallelism (Korthikanti et al., 2022), where s = sequence, b = micro-batch, h = hidden, a = heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

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
    if not isinstance(input_shape, tuple | list) or not all(isinstance(s, int) and s > 0 for s in input_shape):
        raise ValueError(f"input_shape: expected a tuple of positive ints, got {input_shape!r}")
    if checkpoint_segments is not None and (not isinstance(checkpoint_segments, int) or checkpoint_segments < 1):
        raise ValueError(f"checkpoint_segments: expected a positive int or None, got {checkpoint_segments!r}")
    params = list(model.parameters())
    scale = _ITEMSIZE[dtype] / 4
    n_param_bytes = int(sum(p.data.size for p in params) * _ITEMSIZE[dtype])
    exclude = {id(_base(p.data)) for p in params}
    x = autograd.zeros(*input_shape)
    loss_fn = loss or (lambda out: F.cross_entropy(out, autograd.Tensor(np.zeros(out.shape[0], np.int64))))

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
        h, seg_max = x, 0
        with autograd.no_grad():
            bounds = [i * size for i in range(checkpoint_segments)] + [len(layers)]
        for s in range(checkpoint_segments - 1):
            hin = autograd.Tensor(h.data, requires_grad=True)
            out = hin
            for m in layers[bounds[s] : bounds[s + 1]]:
                out = m(out)
            seg, _, big = _graph_bytes(out.sum(), exclude)
            seg_max, largest = max(seg_max, seg), max(largest, big)
            h = out.detach()
        activations = kept + seg_max
        retained = kept  # after the backward only the segment boundaries are still referenced
    else:
        root = forward(model)
        activations, retained, largest = _graph_bytes(root, exclude)
        retained = max(retained, activations - largest)  # the live loss keeps the graph's tensors until the step
    activations, retained, largest = int(activations * scale), int(retained * scale), int(largest * scale)
    grads = n_param_bytes
    opt_state = _OPT_STATES[opt] * n_param_bytes
    ws_bwd = largest
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
) -> dict[str, float]:
    """Bytes for mixed-precision Adam training of a dense transformer on one device (no sharding).

    model_states = 16 * n_params (2 fp16 params + 2 fp16 grads + 4 fp32 master + 4 + 4 Adam m, v);
    activations = n_layers * s*b*h*(34 + 5*a*s/h) (or 2*s*b*h per layer, the layer inputs, with full
    recomputation)."""
    if min(n_params, n_layers, hidden, heads, seq, micro_batch) <= 0:
        raise ValueError("transformer_memory: every size must be > 0")
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
