"""Rank functions for ``tl.dist.launch`` (top level, so spawned children can import them): the equivalence checks
behind tests/test_parallel*.py and the notebook, and the timing jobs behind the benchmark.

Each ``*_check`` runs on every rank and returns plain data (numbers, booleans, lists) that the parent asserts on.

Why one file (> 500 lines): spawned children import rank functions by module path, so every launched check and
timing job lives in one importable top-level module; each function is short and independent.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..dist import all_reduce
from .mapreduce import map_reduce
from .pipeline import PipelineParallel
from .tensor_parallel import (
    ColumnParallelLinear,
    DenseMLP,
    DenseSelfAttention,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    allreduces_per_layer,
    collective_counts,
    reset_counts,
)
from .zero import ZeroOptimizer, zero_memory_per_rank


def tiny_mlp(seed: int = 0, dims: tuple[int, ...] = (8, 16, 16, 4), dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(dtype)


def _rank_batch(step: int, rank: int, dims: tuple[int, ...], n: int = 8, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, dims[0], generator=g).to(dtype), torch.randn(n, dims[-1], generator=g).to(dtype)


def ddp_average(params: list[torch.Tensor], group: Any = None) -> None:
    """Plain DDP's gradient averaging, the reference: one ring all-reduce (avg) of the flat gradients."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    all_reduce(flat, op="avg", algorithm="ring", group=group, check=False)
    off = 0
    for p in params:
        p.grad.copy_(flat[off : off + p.numel()].view_as(p))
        off += p.numel()


def _maxdiff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in zip(a, b, strict=True))


def zero_check(steps: int = 3, dims: tuple[int, ...] = (8, 16, 16, 4), lr: float = 1e-2) -> dict[str, Any]:
    """ZeRO 1/2/3 vs plain DDP + Adam for ``steps`` steps; memory vs formula; consolidated state_dict."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"world_size": n, "steps": steps}
    ref = tiny_mlp(0, dims)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=lr)
    for step in range(steps):
        x, y = _rank_batch(step, rank, dims)
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ddp_average(list(ref.parameters()))
        ref_opt.step()
    ref_params = [p.detach().clone() for p in ref.parameters()]
    psi = sum(p.numel() for p in ref.parameters())
    for stage in (1, 2, 3):
        model = tiny_mlp(0, dims)
        opt = ZeroOptimizer(model, torch.optim.Adam, stage=stage, lr=lr)
        mem = None
        for step in range(steps):
            x, y = _rank_batch(step, rank, dims)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            mem = opt.memory_bytes()
        with opt.gather_parameters():
            got = [p.detach().clone() for p in model.parameters()]
        out[f"stage{stage}_bitwise"] = all(torch.equal(a, b) for a, b in zip(got, ref_params, strict=True))
        out[f"stage{stage}_maxdiff"] = _maxdiff(got, ref_params)
        out[f"stage{stage}_memory"] = mem
        out[f"stage{stage}_formula"] = zero_memory_per_rank(psi, stage, n, dtype_bytes=4, optimizer="adam")
        sd = opt.state_dict()
        plain = torch.optim.Adam(ref.parameters(), lr=lr)
        plain.load_state_dict(sd)  # loadable into the plain optimizer
        ref_sd = ref_opt.state_dict()
        out[f"stage{stage}_state_maxdiff"] = max(
            _maxdiff([sd["state"][i][k] for i in ref_sd["state"]], [ref_sd["state"][i][k] for i in ref_sd["state"]])
            for k in ("exp_avg", "exp_avg_sq")
        )
        out[f"stage{stage}_state_steps_equal"] = all(
            float(sd["state"][i]["step"]) == float(ref_sd["state"][i]["step"]) for i in ref_sd["state"]
        )
        out[f"stage{stage}_plain_loaded_step"] = float(plain.state_dict()["state"][0]["step"])
        opt.remove_hooks()
    # resume: a ZeroOptimizer loaded from the plain optimizer's state continues like the plain one (one more step)
    model = tiny_mlp(0, dims)
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref_params, strict=True):
            p.copy_(q)
    zopt = ZeroOptimizer(model, torch.optim.Adam, stage=1, lr=lr)
    zopt.load_state_dict(ref_opt.state_dict())
    x, y = _rank_batch(steps, rank, dims)
    for mdl, step_fn in ((model, zopt), (ref, ref_opt)):
        step_fn.zero_grad()
        nn.functional.mse_loss(mdl(x), y).backward()
        if mdl is ref:
            ddp_average(list(ref.parameters()))
        step_fn.step()
    out["resume_bitwise"] = all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    # stage 3 on a plain parameter list (no module hooks): gather around forward+backward by hand
    model = tiny_mlp(0, dims)
    opt = ZeroOptimizer(list(model.parameters()), torch.optim.Adam, stage=3, lr=lr)
    for step in range(steps):
        x, y = _rank_batch(step, rank, dims)
        opt.zero_grad()
        with opt.gather_parameters():
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    with opt.gather_parameters():
        got = [p.detach().clone() for p in model.parameters()]
    out["stage3_list_maxdiff"] = _maxdiff(got, ref_params)
    out["stage3_list_freed"] = all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    # mixed precision (bf16 params/grads, fp32 master + Adam state): K = 12
    for stage in (1, 2, 3):
        model = tiny_mlp(0, dims, torch.bfloat16)
        opt = ZeroOptimizer(model, torch.optim.Adam, stage=stage, lr=lr)
        x, y = _rank_batch(0, rank, dims, dtype=torch.bfloat16)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out[f"bf16_stage{stage}_memory"] = opt.memory_bytes()
        out[f"bf16_stage{stage}_formula"] = zero_memory_per_rank(psi, stage, n, dtype_bytes=2, optimizer="adam")
        opt.remove_hooks()
    return out


def tp_check(batch: int = 3, seq: int = 5, hidden: int = 8, heads: int = 4, ffn: int = 16) -> dict[str, Any]:
    """Megatron MLP + attention vs their dense versions: outputs, input grads, weight grads; all-reduce counts."""
    t, r = dist.get_world_size(), dist.get_rank()
    out: dict[str, Any] = {"world_size": t}
    torch.manual_seed(0)
    dense_mlp, dense_att = DenseMLP(hidden, ffn), DenseSelfAttention(hidden, heads)
    par_mlp, par_att = ParallelMLP(dense_mlp), ParallelSelfAttention(dense_att)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    xd, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
    yd = dense_mlp(dense_att(xd) + xd)  # a transformer-like layer: attention block then MLP block
    reset_counts()
    yp = par_mlp(par_att(xp) + xp)
    fwd = collective_counts()
    w = torch.randn(yd.shape, generator=torch.Generator().manual_seed(2))
    (yd * w).sum().backward()
    (yp * w).sum().backward()
    allc = collective_counts()
    out["out_maxdiff"] = float((yd - yp).detach().abs().max())
    out["xgrad_maxdiff"] = float((xd.grad - xp.grad).abs().max())
    k_ffn, k_h = ffn // t, hidden // t
    pairs = [
        (par_mlp.fc1.weight.grad, dense_mlp.fc1.weight.grad[r * k_ffn : (r + 1) * k_ffn]),
        (par_mlp.fc1.bias.grad, dense_mlp.fc1.bias.grad[r * k_ffn : (r + 1) * k_ffn]),
        (par_mlp.fc2.weight.grad, dense_mlp.fc2.weight.grad[:, r * k_ffn : (r + 1) * k_ffn]),
        (par_mlp.fc2.bias.grad, dense_mlp.fc2.bias.grad),
        (par_att.q.weight.grad, dense_att.q.weight.grad[r * k_h : (r + 1) * k_h]),
        (par_att.v.bias.grad, dense_att.v.bias.grad[r * k_h : (r + 1) * k_h]),
        (par_att.o.weight.grad, dense_att.o.weight.grad[:, r * k_h : (r + 1) * k_h]),
    ]
    out["wgrad_maxdiff"] = _maxdiff([a for a, _ in pairs], [b for _, b in pairs])
    out["fwd_allreduces"] = fwd["all_reduce"]
    out["step_allreduces"] = allc["all_reduce"]
    out["formula_allreduces"] = allreduces_per_layer()
    # standalone layers with the other flags: Column(gather_output=True), Row(input_is_parallel=False)
    torch.manual_seed(3)
    lin1, lin2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
    col = ColumnParallelLinear.from_linear(lin1, gather_output=True)
    row = RowParallelLinear.from_linear(lin2, input_is_parallel=False)
    x2 = torch.randn(4, hidden, generator=torch.Generator().manual_seed(4))
    a, b = x2.clone().requires_grad_(), x2.clone().requires_grad_()
    reset_counts()
    yd2, yp2 = lin2(torch.tanh(lin1(a))), row(torch.tanh(col(b)))
    yd2.square().sum().backward()
    yp2.square().sum().backward()
    out["standalone_out_maxdiff"] = float((yd2 - yp2).detach().abs().max())
    out["standalone_xgrad_maxdiff"] = float((a.grad - b.grad).abs().max())
    out["standalone_counts"] = collective_counts()
    torch.manual_seed(5)  # same seed -> same init as nn.Linear
    col_seed, lin_seed = None, None
    col_seed = ColumnParallelLinear(hidden, ffn)
    torch.manual_seed(5)
    lin_seed = nn.Linear(hidden, ffn)
    out["seeded_init_equal"] = torch.equal(col_seed.weight, lin_seed.weight[r * k_ffn : (r + 1) * k_ffn])
    out["bad_inputs"] = _bad_input_messages(t)
    return out


def _bad_input_messages(t: int) -> dict[str, str]:
    """Each bad input must raise a built-in exception naming the argument (collected, asserted by the tests)."""
    solo = [dist.new_group([i]) for i in range(t)][dist.get_rank()]  # a 1-stage pipeline: no peer left waiting
    cases = {
        "column_out_features": lambda: ColumnParallelLinear(8, 2 * t + 1),
        "row_in_features": lambda: RowParallelLinear(2 * t + 1, 8),
        "column_input_shape": lambda: ColumnParallelLinear(8, 2 * t)(torch.zeros(2, 5)),
        "row_parallel_input_shape": lambda: RowParallelLinear(2 * t, 8, input_is_parallel=True)(torch.zeros(2, 5)),
        "zero_int_param": lambda: ZeroOptimizer([torch.zeros(3, dtype=torch.int64)]),
        "zero_empty": lambda: ZeroOptimizer([]),
        "pipeline_batch": lambda: PipelineParallel(nn.Linear(2, 2), n_microbatches=3, group=solo).train_step(
            torch.zeros(4, 2), torch.zeros(4, 2), nn.functional.mse_loss
        ),
    }
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            out[name] = "no error"
        except (TypeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
    return out


def pp_model(seed: int = 0, width: int = 8, n_blocks: int = 4) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n_blocks)])


def pp_check(m: int = 4, batch: int = 8, width: int = 8, n_blocks: int = 4) -> dict[str, Any]:
    """PipelineParallel (gpipe and 1f1b) vs the single-process model: loss, gradients; measured events."""
    p, r = dist.get_world_size(), dist.get_rank()
    out: dict[str, Any] = {"world_size": p}
    full = pp_model(0, width, n_blocks)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(7))
    y = torch.randn(batch, width, generator=torch.Generator().manual_seed(8))
    loss_ref = nn.functional.mse_loss(full(x), y)
    loss_ref.backward()
    per = n_blocks // p
    for sched in ("gpipe", "1f1b"):
        stage = pp_model(0, width, n_blocks)[r * per : (r + 1) * per]
        pipe = PipelineParallel(stage, schedule=sched, n_microbatches=m)
        loss = pipe.train_step(x if r == 0 else None, y if r == p - 1 else None, nn.functional.mse_loss)
        ref_grads = [q.grad for q in full[r * per : (r + 1) * per].parameters()]
        out[f"{sched}_loss_diff"] = abs(float(loss) - float(loss_ref.detach()))
        out[f"{sched}_grad_maxdiff"] = _maxdiff([q.grad for q in stage.parameters()], ref_grads)
        out[f"{sched}_events"] = pipe.events
        out[f"{sched}_peak_held"] = pipe.peak_held
    return out


CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps and the fox runs",
    "a pipeline of stages passes activations",
    "data parallel ranks all reduce the gradients",
    "the map phase emits pairs and the reduce phase sums them",
    "tensor parallel ranks split the matrices",
    "the shuffle sends every key to the rank that owns it",
    "ray actors keep state and ray tasks do not",
]


def mapreduce_check() -> dict[str, Any]:
    """Word count with tl.parallel.map_reduce over this world (rank r maps lines r, r + n, ...), with and without
    a combiner, against collections.Counter of the whole corpus in one process."""
    from collections import Counter

    n, r = dist.get_world_size(), dist.get_rank()
    shard = CORPUS[r::n]
    out: dict[str, Any] = {"world_size": n}
    expected = dict(Counter(w for line in CORPUS for w in line.split()))
    for name, comb in (("plain", None), ("combined", lambda k, vs: [sum(vs)])):
        stats: dict[str, int] = {}
        got = map_reduce(
            shard, lambda line: [(w, 1) for w in line.split()], lambda k, vs: sum(vs), combiner=comb, stats=stats
        )
        out[f"{name}_equal"] = got == expected
        out[f"{name}_stats"] = stats
    out["distinct_words_here"] = len({w for line in shard for w in line.split()})
    out["n_keys"] = len(expected)
    return out


def dp_tp_check(width: int = 8, n_blocks: int = 2, batch: int = 8) -> dict[str, Any]:
    """2-D parallelism on a real process grid: dp = 2 replicas × tp = world/2 Megatron shards (tp innermost,
    ``_groups``). Each replica runs half the batch, the TP layers all-reduce inside their tp group, the gradients
    are averaged over the dp group; every rank's gradient shard must equal the slice of the single-process
    gradient of the whole batch."""
    p, r = dist.get_world_size(), dist.get_rank()
    dp, tp = 2, p // 2
    tp_group, dp_group = _groups(dp, tp)
    torch.manual_seed(0)
    dense = nn.Sequential(*[DenseMLP(width, 4 * width) for _ in range(n_blocks)])
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    y = torch.randn(batch, width, generator=torch.Generator().manual_seed(2))
    nn.functional.mse_loss(dense(x), y).backward()
    model = nn.Sequential(*[ParallelMLP(b, group=tp_group) if tp > 1 else copy.deepcopy(b) for b in dense])
    model.zero_grad()
    d, t = r // tp, r % tp
    rows = slice(d * batch // dp, (d + 1) * batch // dp)
    nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
    ddp_average(list(model.parameters()), group=dp_group)
    k = 4 * width // tp
    pairs = []
    for mine, ref in zip(model, dense, strict=True):
        pairs += [
            (mine.fc1.weight.grad, ref.fc1.weight.grad[t * k : (t + 1) * k]),
            (mine.fc1.bias.grad, ref.fc1.bias.grad[t * k : (t + 1) * k]),
            (mine.fc2.weight.grad, ref.fc2.weight.grad[:, t * k : (t + 1) * k]),
            (mine.fc2.bias.grad, ref.fc2.bias.grad),
        ]
    return {"dp": dp, "tp": tp, "grad_maxdiff": _maxdiff([a for a, _ in pairs], [b for _, b in pairs])}


def all_checks() -> dict[str, Any]:
    """Everything the tests need from one launch (process start-up costs seconds: launch once per world size)."""
    out, t0 = {}, time.perf_counter()
    checks = (("zero", lambda: zero_check(steps=2)), ("tp", tp_check), ("pp", pp_check), ("mr", mapreduce_check))
    checks += (("dp_tp", dp_tp_check),)
    for name, fn in checks:
        out[name] = fn()
        out[f"{name}_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------------------------------------- timing jobs
def _median_time(fn: Any, repeats: int, stat: str = "median") -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank defines the step
        times.append(float(dt))
    times.sort()
    return times[0] if stat == "min" else times[len(times) // 2]


def _train_step_fn(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, ddp_sync: bool = False) -> Any:
    def fn() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if ddp_sync:
            ddp_average([p for p in model.parameters()])
        opt.step()

    return fn


def bench_zero(width: int = 256, depth: int = 4, batch: int = 32, repeats: int = 5) -> dict[str, float]:
    """Step time (ms, slowest rank, median) of Adam training steps: tl ZeRO 1/2/3, torch ZeroRedundancyOptimizer
    (stage 1) over DDP, torch DDP + Adam, and plain DDP built on tl.dist (the reference of the equivalence tests)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    dims = (width,) * (depth + 1)
    x, y = _rank_batch(0, rank, dims, n=batch)
    res: dict[str, float] = {}
    for name in (
        "torch DDP + Adam",
        "torch ZeroRedundancyOptimizer",
        "tl DDP (ring)",
        "tl ZeRO-1",
        "tl ZeRO-2",
        "tl ZeRO-3",
    ):
        model = tiny_mlp(0, dims)
        sync = False
        if name == "torch DDP + Adam":
            model = DDP(model)
            opt: Any = torch.optim.Adam(model.parameters(), lr=1e-3)
        elif name == "torch ZeroRedundancyOptimizer":
            model = DDP(model)
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        elif name == "tl DDP (ring)":
            opt, sync = torch.optim.Adam(model.parameters(), lr=1e-3), True
        else:
            opt = ZeroOptimizer(model, torch.optim.Adam, stage=int(name[-1]), lr=1e-3)
        fn = _train_step_fn(model, opt, x, y, sync)
        fn()  # warm-up (allocates optimizer state)
        res[name] = _median_time(fn, repeats) * 1e3
        if isinstance(opt, ZeroOptimizer):
            opt.remove_hooks()
    res["n_params"] = float(sum(p.numel() for p in tiny_mlp(0, dims).parameters()))
    return res


def bench_tp(hidden: int = 256, ffn: int = 1024, tokens: int = 256, repeats: int = 5) -> dict[str, Any]:
    """Forward+backward time (ms) of a Megatron MLP: tl Column/Row layers vs torch.distributed.tensor.parallel
    (ColwiseParallel/RowwiseParallel on a CPU device mesh over gloo), and the dense MLP on one rank."""
    t = dist.get_world_size()
    torch.manual_seed(0)
    dense = DenseMLP(hidden, ffn)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1))
    res: dict[str, Any] = {}

    def fwd_bwd(mod: nn.Module) -> Any:
        def fn() -> None:
            xi = x.clone().requires_grad_()
            mod(xi).sum().backward()

        return fn

    res["dense (every rank, no split)"] = _median_time(fwd_bwd(dense), repeats) * 1e3
    par = ParallelMLP(dense)
    res["tl ColumnParallel/RowParallel"] = _median_time(fwd_bwd(par), repeats) * 1e3
    try:
        import copy

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (t,))
        tmod = parallelize_module(copy.deepcopy(dense), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        xi = x.clone().requires_grad_()
        y_t, y_d = tmod(xi), dense(x)
        res["torch_tp_maxdiff"] = float((y_t - y_d).detach().abs().max())
        res["torch.distributed.tensor.parallel"] = _median_time(fwd_bwd(tmod), repeats) * 1e3
    except Exception as e:  # noqa: BLE001 - reported in the table notes
        res["torch_tp_error"] = f"{type(e).__name__}: {e}"[:200]
    return res


def bench_job(repeats: int = 5) -> dict[str, Any]:
    return {"zero": bench_zero(repeats=repeats), "tp": bench_tp(repeats=repeats)}


def _groups(dp: int, tp: int) -> tuple[Any, Any]:
    """(tp_group, dp_group) of this rank for world = dp·tp, tp innermost (rank = d·tp + t). Every rank creates
    every group in the same order, as torch.distributed requires."""
    r = dist.get_rank()
    tp_group = dp_group = None
    for d in range(dp):
        g = dist.new_group(list(range(d * tp, (d + 1) * tp))) if tp > 1 else None
        if r // tp == d:
            tp_group = g
    for t in range(tp):
        g = dist.new_group(list(range(t, dp * tp, tp))) if dp > 1 else None
        if r % tp == t:
            dp_group = g
    return tp_group, dp_group


def _dp_tp_step(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, dp_group: Any, m: int) -> Any:
    """One Adam step: forward/backward of this replica's rows in ``m`` microbatches (gradient accumulation, as
    Megatron does without pipelining), then the DDP average over ``dp_group`` (None: no DP)."""
    xs, ys = x.chunk(m), y.chunk(m)

    def fn() -> None:
        opt.zero_grad()
        for xi, yi in zip(xs, ys, strict=True):
            (nn.functional.mse_loss(model(xi), yi) / m).backward()
        if dp_group is not None:
            ddp_average(list(model.parameters()), group=dp_group)
        opt.step()

    return fn


def _pp_step(pipe: PipelineParallel, opt: Any, x: torch.Tensor | None, y: torch.Tensor | None) -> Any:
    def fn() -> None:
        opt.zero_grad()
        pipe.train_step(x, y, nn.functional.mse_loss)
        opt.step()

    fn.pipe = pipe  # type: ignore[attr-defined]
    return fn


def _fwd_bwd(module: nn.Module, x: torch.Tensor) -> Any:
    def fn() -> None:
        module(x.clone().requires_grad_()).sum().backward()

    return fn


def three_d_timing(
    configs: tuple[tuple[int, int, int], ...] | None = None,
    width: int = 256,
    depth: int = 4,
    seq: int = 32,
    n_seqs: int = 4,
    repeats: int = 5,
) -> dict[str, Any]:
    """Measured Adam step time of the same MLP stack (``depth`` blocks of Linear(width, 4 width) -> GeLU ->
    Linear(4 width, width), fp32, a global batch of ``n_seqs`` sequences of ``seq`` tokens) for each (dp, tp, pp)
    in ``configs`` (default: pure DP, pure TP and pure PP on this world; dp·tp with pp = 1, or pure pp).

    Every configuration runs one sequence per microbatch: PP with 1F1B, DP/TP accumulate gradients over the
    n_seqs/dp microbatches of their replica (the planner's m). Times in ms are the median of ``repeats`` steps of
    the slowest rank; the repeats are interleaved, one step of each configuration and one of each calibration
    probe in turn, so that load drift hits all of them alike. Probes of short operations time several
    back-to-back calls: a step pays the typical (mean) wait for the other rank at every message, not the best.

    Per configuration, next to each of its steps and with every rank busy at once, the calibration plan_3d needs:
    ``layer_ms``, the forward+backward of one block's local shard (1/tp of the block) on one microbatch, and
    ``adam_ms``, this rank's Adam step. Once per job, alpha/beta fitted to the tl.dist ring all-reduce (the
    collective DP and TP use here) over message sizes between a TP activation and the DP gradients, each call
    timed right after a block of compute as in a step (minus that compute), so the wake-up of a waiting peer is
    part of the fitted alpha.
    """
    from ..dist import cost_model

    p, r = dist.get_world_size(), dist.get_rank()
    if configs is None:
        configs = ((p, 1, 1), (1, p, 1), (1, 1, p))
    tokens = seq * n_seqs
    xg = torch.randn(tokens, width, generator=torch.Generator().manual_seed(0))
    yg = torch.randn(tokens, width, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    blocks = [DenseMLP(width, 4 * width) for _ in range(depth)]
    psi_block = sum(q.numel() for q in blocks[0].parameters())
    res: dict[str, Any] = {"n_params": depth * psi_block, "world_size": p, "times": {}, "layer_ms": {}, "adam_ms": {}}
    steps: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}  # config -> (train step, layer probe, optimizer)
    for dp, tp, pp in configs:
        if dp * tp * pp != p or (pp > 1 and dp * tp > 1) or n_seqs % dp or depth % pp:
            raise ValueError(f"configs: ({dp}, {tp}, {pp}) is not dp·tp = {p} with pp = 1, nor pure pp = {p}")
        if pp > 1:
            per = depth // pp
            stage = nn.Sequential(*[copy.deepcopy(b) for b in blocks[r * per : (r + 1) * per]])
            pipe = PipelineParallel(stage, "1f1b", n_seqs)
            opt: Any = torch.optim.Adam(stage.parameters(), lr=1e-3)
            fn = _pp_step(pipe, opt, xg if r == 0 else None, yg if r == p - 1 else None)
        else:
            tp_group, dp_group = _groups(dp, tp)
            d = r // tp
            rows = slice(d * tokens // dp, (d + 1) * tokens // dp)
            model = nn.Sequential(*[ParallelMLP(b, group=tp_group) if tp > 1 else copy.deepcopy(b) for b in blocks])
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            fn = _dp_tp_step(model, opt, xg[rows], yg[rows], dp_group if dp > 1 else None, n_seqs // dp)
        probe = DenseMLP(width, 4 * width // tp)  # one block's local shard on one microbatch, no communication
        steps[(dp, tp, pp)] = (fn, _fwd_bwd(probe, xg[:seq]), opt)
        fn()  # warm-up: allocates Adam state
        steps[(dp, tp, pp)][1]()
    # interleaved repeats (config after config, calibration next to each): load drift hits all of them alike
    samples: dict[str, dict[Any, list[float]]] = {"times": {}, "layer_ms": {}, "adam_ms": {}, "ar": {}}
    # the link as the ring all-reduce sees it: t = L·alpha + B·n·beta, (L, B) = coefficients("ring", p)
    sizes = [seq * width * 4, 1 << 20, res["n_params"] * 4]
    bufs = [torch.ones(nb // 4) for nb in sizes]
    # Each probe all-reduce follows a block of compute, as in a step: the peer's wake-up from its wait is part of
    # what a step pays per message (on this VM ~2 ms at 32 KB, against ~0.4 ms for back-to-back calls).
    work = _fwd_bwd(DenseMLP(width, 4 * width // p), xg[:seq])
    for _ in range(repeats):
        t_work = _median_time(lambda: [work() for _ in range(4)], 1) / 4
        for nb, buf, k in zip(sizes, bufs, (4, 2, 1), strict=True):  # small ones: the mean of k calls

            def calls(buf: torch.Tensor = buf, k: int = k) -> None:
                for _ in range(k):
                    work()
                    all_reduce(buf, op="sum", algorithm="ring", check=False)

            t = _median_time(calls, 1)
            samples["ar"].setdefault(nb, []).append(max(t / k - t_work, 0.0))
        for key, (fn, probe_fn, opt) in steps.items():
            t = _median_time(lambda probe_fn=probe_fn: [probe_fn() for _ in range(4)], 1) / 4
            samples["layer_ms"].setdefault(key, []).append(t * 1e3)
            samples["adam_ms"].setdefault(key, []).append(_median_time(opt.step, 1) * 1e3)
            samples["times"].setdefault(key, []).append(_median_time(fn, 1) * 1e3)
            if key[2] > 1:
                res["pp_events"] = fn.pipe.events
    for name in ("times", "layer_ms", "adam_ms"):
        res[name] = {key: sorted(v)[len(v) // 2] for key, v in samples[name].items()}
    times = [sorted(samples["ar"][nb])[repeats // 2] for nb in sizes]
    lat, bcoef, _ = cost_model.coefficients("ring", p)
    a_fit, res["beta_s_per_byte"] = cost_model.fit_alpha_beta([bcoef * n for n in sizes], times)
    res["alpha_s"] = a_fit / lat
    res["allreduce_ms"] = {nb: t * 1e3 for nb, t in zip(sizes, times, strict=True)}
    return res


def notebook_job() -> dict[str, Any]:
    """Everything notebook 10 measures, in one launch of 2 ranks."""
    return {
        "zero": zero_check(steps=2),
        "tp": tp_check(),
        "pp": pp_check(m=4, n_blocks=2),
        "mr": mapreduce_check(),
        "3d": three_d_timing(),
        "bench": bench_job(repeats=3),
    }


def three_d_job() -> dict[str, Any]:
    """Notebook 10's 4-rank run: pure DP, TP, PP and the 2-D mix dp=2 x tp=2 of the same MLP stack."""
    return three_d_timing(((4, 1, 1), (1, 4, 1), (1, 1, 4), (2, 2, 1)))
