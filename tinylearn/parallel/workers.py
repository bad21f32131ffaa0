"""Rank functions for ``tl.dist.launch`` (top level, so spawned children can import them): the equivalence checks
behind tests/test_parallel*.py and the notebook, and the timing jobs behind the benchmark.

Each ``*_check`` runs on every rank and returns plain data (numbers, booleans, lists) that the parent asserts on.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..dist import all_reduce
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


def all_checks() -> dict[str, Any]:
    """Everything the tests need from one launch (process start-up costs seconds: launch once per world size)."""
    out, t0 = {}, time.perf_counter()
    for name, fn in (("zero", lambda: zero_check(steps=2)), ("tp", tp_check), ("pp", pp_check)):
        out[name] = fn()
        out[f"{name}_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------------------------------------- timing jobs
def _median_time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank defines the step
        times.append(float(dt))
    times.sort()
    return times[len(times) // 2]


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


def three_d_timing(width: int = 256, depth: int = 4, tokens: int = 64, m: int = 4, repeats: int = 5) -> dict[str, Any]:
    """Measured Adam step time (ms) of the same MLP stack (depth blocks of Linear(width, 4 width) -> GeLU ->
    Linear(4 width, width)) on this world as pure DP (dp=p), pure TP (tp=p) and pure PP (pp=p, 1F1B, m
    microbatches); plus the alpha/beta of a ping-pong and this rank's matmul FLOP/s for plan_3d."""
    from ..dist import cost_model
    from ..dist.workers import ping_pong

    p, r = dist.get_world_size(), dist.get_rank()
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(r))
    y = torch.randn(tokens, width, generator=torch.Generator().manual_seed(100 + r))
    torch.manual_seed(0)
    blocks = [DenseMLP(width, 4 * width) for _ in range(depth)]
    res: dict[str, Any] = {"n_params": sum(q.numel() for b in blocks for q in b.parameters())}
    # data parallel: every rank the whole model, its own tokens, DDP gradient average
    dp_model = nn.Sequential(*blocks)
    dp_opt = torch.optim.Adam(dp_model.parameters(), lr=1e-3)
    fn = _train_step_fn(dp_model, dp_opt, x, y, ddp_sync=True)
    fn()
    res["dp"] = _median_time(fn, repeats) * 1e3
    # tensor parallel: every rank 1/p of every block, all ranks see the same p*tokens (the same global batch)
    xs, ys = [torch.empty_like(x) for _ in range(p)], [torch.empty_like(y) for _ in range(p)]
    dist.all_gather(xs, x)
    dist.all_gather(ys, y)
    xg, yg = torch.cat(xs), torch.cat(ys)
    tp_model = nn.Sequential(*[ParallelMLP(b) for b in blocks])
    tp_opt = torch.optim.Adam(tp_model.parameters(), lr=1e-3)
    fn = _train_step_fn(tp_model, tp_opt, xg, yg)
    fn()
    res["tp"] = _median_time(fn, repeats) * 1e3
    # pipeline parallel: rank r holds blocks [r*depth/p, (r+1)*depth/p), global batch through m microbatches
    per = depth // p
    stage = nn.Sequential(*blocks[r * per : (r + 1) * per])
    pipe = PipelineParallel(stage, "1f1b", m)
    pp_opt = torch.optim.Adam(stage.parameters(), lr=1e-3)

    def pp_step() -> None:
        pp_opt.zero_grad()
        pipe.train_step(xg if r == 0 else None, yg if r == p - 1 else None, nn.functional.mse_loss)
        pp_opt.step()

    pp_step()
    res["pp"] = _median_time(pp_step, repeats) * 1e3
    res["pp_events"] = pipe.events
    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 22]
    pp_times = ping_pong(sizes, repeats=10)
    if pp_times is not None:
        res["alpha_s"], res["beta_s_per_byte"] = cost_model.fit_alpha_beta(sizes, pp_times)
    a = torch.randn(tokens * p, width)
    b = torch.randn(width, 4 * width)
    fl = 2 * a.shape[0] * width * 4 * width
    t = _median_time(lambda: a @ b, repeats)
    res["flops_per_s"] = fl / t
    return res


def notebook_job() -> dict[str, Any]:
    """Everything notebook 10 measures, in one launch of 2 ranks."""
    return {
        "zero": zero_check(steps=2),
        "tp": tp_check(),
        "pp": pp_check(m=4, n_blocks=2),
        "3d": three_d_timing(),
    }
