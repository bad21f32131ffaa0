"""``tinylearn bench tune``: what autotuning buys, how fast each searcher finds it, how well a cost model ranks.

Five tables, every timing through the shared harness (``tinylearn.bench.measure``: warm-up, median of repeats):

    default vs tuned   for every op with a declared search space (``tinylearn.tunable.ops()``) at one shape: the
                       configuration an untuned ``backend=None`` call runs, the best that ``tune`` finds with a small
                       budget (random search), the same op in torch and in tinygrad (or a note saying why not).
    tl.compile         three fused functions (bias+GELU+residual, LayerNorm+GELU+residual, softmax) compiled with
                       the default loop schedules and with tuned ones (``tune_compiled``), beside eager tinylearn,
                       torch and tinygrad. Goal: tuned compiled kernels faster than the default ones on every row.
    gemm vs OpenBLAS   the C++ GEMM, default and tuned blocking, vs OpenBLAS and torch at 1 and 2 threads.
    searchers          on ``gemm.matmul`` at a small shape: the best time each searcher finds within the budget
                       (grid, random, anneal, evolution, tpe, model), against the exhaustive optimum when the valid
                       space is small enough to measure all of it.
    cost model         Kendall tau between ``CostModel``'s predicted ranking and measured times on held-out
                       configurations (fit on one random sample, scored on another), and the MODEL proxy's tau
                       (``proxy_model.validate_on_cpu``).

Budgets are tiny unless ``full=True``; nothing is written to the tuning database (``store=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ..bench import Table
from ..bench.table import Row

SHAPES: dict[str, dict[str, int]] = {
    "gemm.matmul": {"M": 256, "N": 256, "K": 256},
    "kernels.softmax": {"R": 512, "C": 1024},
    "kernels.layer_norm": {"R": 512, "C": 1024},
    "kernels.attention": {"BH": 4, "N": 256, "D": 64},
    "conv.conv2d": {"N": 2, "C": 16, "H": 32, "W": 32, "OC": 32, "KH": 3, "S": 1, "G": 1},
    "quant.int8_gemm": {"M": 256, "N": 256, "K": 256},
    "compiler.schedule": {"R": 512, "C": 1024},
}


def sizes(full: bool = False) -> dict[str, Any]:
    if full:
        return dict(budget=32, repeat=7, warmup=2, search_shape={"M": 256, "N": 256, "K": 256}, search_budget=24,
                    exhaustive_max=400, cm_train=48, cm_test=24)  # fmt: skip
    return dict(budget=4, repeat=3, warmup=1, search_shape={"M": 128, "N": 128, "K": 128}, search_budget=8,
                exhaustive_max=80, cm_train=16, cm_test=12)  # fmt: skip


def _say(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


# ------------------------------------------------------------------------------------------ torch / tinygrad
def _torch_fn(op: str, shape: dict[str, int], rng: np.random.Generator) -> Callable[[], Any] | None:
    import torch
    import torch.nn.functional as F

    def t(*s: int) -> Any:
        return torch.from_numpy(rng.standard_normal(s).astype(np.float32))

    if op == "gemm.matmul":
        a, b = t(shape["M"], shape["K"]), t(shape["K"], shape["N"])
        return lambda: a @ b
    if op == "kernels.softmax":
        x = t(shape["R"], shape["C"])
        return lambda: torch.softmax(x, -1)
    if op == "kernels.layer_norm":
        x, w, b = t(shape["R"], shape["C"]), t(shape["C"]), t(shape["C"])
        return lambda: F.layer_norm(x, (shape["C"],), w, b)
    if op == "kernels.attention":
        q, k, v = (t(1, shape["BH"], shape["N"], shape["D"]) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v)
    if op == "conv.conv2d":
        x, w = t(shape["N"], shape["C"], shape["H"], shape["W"]), t(shape["OC"], shape["C"], shape["KH"], shape["KH"])
        return lambda: F.conv2d(x, w, stride=shape["S"], padding=shape["KH"] // 2)
    if op == "quant.int8_gemm":
        a = torch.randint(-128, 128, (shape["M"], shape["K"]), dtype=torch.int32)
        b = torch.randint(-128, 128, (shape["K"], shape["N"]), dtype=torch.int32)
        return lambda: a @ b
    if op == "compiler.schedule":
        x, b = t(shape["R"], shape["C"]), t(shape["C"])
        return lambda: F.gelu(x + b, approximate="tanh")
    return None


def _tinygrad_fn(op: str, shape: dict[str, int], rng: np.random.Generator) -> tuple[Callable[[], Any] | None, str]:
    from ..bench.comparators import import_tinygrad, tinygrad_jit, tinygrad_status

    ok, reason = tinygrad_status()
    if not ok:
        return None, reason
    tg = import_tinygrad()

    def t(*s: int) -> Any:
        return tg.Tensor(rng.standard_normal(s).astype(np.float32)).realize()

    if op == "gemm.matmul":
        args, fn = (t(shape["M"], shape["K"]), t(shape["K"], shape["N"])), lambda a, b: a @ b
    elif op == "kernels.softmax":
        args, fn = (t(shape["R"], shape["C"]),), lambda x: x.softmax(-1)
    elif op == "kernels.layer_norm":
        args, fn = (t(shape["R"], shape["C"]), t(shape["C"]), t(shape["C"])), lambda x, w, b: x.layernorm() * w + b
    elif op == "kernels.attention":
        args = tuple(t(1, shape["BH"], shape["N"], shape["D"]) for _ in range(3))
        fn = lambda q, k, v: q.scaled_dot_product_attention(k, v)  # noqa: E731
    elif op == "conv.conv2d":
        args = (t(shape["N"], shape["C"], shape["H"], shape["W"]), t(shape["OC"], shape["C"], shape["KH"], shape["KH"]))
        fn = lambda x, w: x.conv2d(w, stride=shape["S"], padding=shape["KH"] // 2)  # noqa: E731
    elif op == "compiler.schedule":
        args, fn = (t(shape["R"], shape["C"]), t(shape["C"])), lambda x, b: (x + b).gelu()
    elif op == "quant.int8_gemm":
        return None, "tinygrad: n/a (no exact int8 x int8 -> int32 GEMM path on its CPU device)"
    else:
        return None, f"tinygrad: n/a (no counterpart of {op} here)"
    return partial(tinygrad_jit(fn), *args), "TinyJit"


# ------------------------------------------------------------------------------------------------------ tables
def tuned_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Default vs tuned for every tunable op (see the module docstring)."""
    from .. import tunable
    from ..bench.timing import measure
    from .tuner import tune

    s = {**sizes(full), **kw}
    t = Table(f"default vs tuned (random search, budget {s['budget']}) vs torch vs tinygrad", baseline="torch")
    ops = [o for o in tunable.ops() if not o.startswith("compiler.schedule.")]  # per-pattern: compiled_table
    for op in s.get("ops", ops):
        shape = SHAPES.get(op)
        case = f"{op} {shape}"
        if shape is None:
            t.notes.append(f"{op}: no benchmark shape in tinylearn.tune.bench.SHAPES; skipped")
            continue
        _say(progress, f"tune: {op}")
        try:
            res = tune(op, shape, searcher="random", budget=s["budget"], store=False, warmup=s["warmup"],
                       repeat=s["repeat"])  # fmt: skip
        except (ValueError, RuntimeError) as e:
            t.add(Row(case, "tl default", None, note=f"not run: {e}"))
            continue
        t.add(Row(case, "tl default", None if res.default_s is None else res.default_s * 1e3,
                  note=", ".join(f"{k}={v}" for k, v in res.default.items())))  # fmt: skip
        why = f"all {len(res.rejected)} rejected, e.g. {(res.rejected[0].error or '')[:100]}" if res.rejected else ""
        t.add(Row(case, "tl tuned", None if res.best_s is None else res.best_s * 1e3,
                  note=why if res.best_s is None else ", ".join(f"{k}={v}" for k, v in res.best.items()),
                  extra={"measured": len(res.history), "rejected": len(res.rejected)}))  # fmt: skip
        rng = np.random.default_rng(0)
        fn = _torch_fn(op, shape, rng)
        if fn is None:
            t.add(Row(case, "torch", None, note="n/a: no torch counterpart wired"))
        else:
            m = measure(fn, warmup=s["warmup"], repeat=s["repeat"])
            t.add(Row(case, "torch", m.median * 1e3, m.min * 1e3))
        tg, why = _tinygrad_fn(op, shape, rng)
        if tg is None:
            t.add(Row(case, "tinygrad", None, note=why))
        else:
            m = measure(tg, warmup=max(2, s["warmup"]), repeat=s["repeat"])
            t.add(Row(case, "tinygrad", m.median * 1e3, m.min * 1e3, note=why))
    t.compute_ratios()
    t.notes.append("tuned: the fastest correct configuration among the default and the sampled ones (medians of "
                   "separate measurements: a tuned time above the default is timing noise)")  # fmt: skip
    return t


def _searcher_names() -> list[str]:
    from .searchers import SEARCHERS

    names = list(SEARCHERS)
    for extra in ("tpe", "model"):
        if extra not in names:
            names.append(extra)
    return names


def searcher_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Best time found within the budget by each searcher on gemm.matmul (and the exhaustive optimum if affordable)."""
    from .. import tunable
    from .tuner import tune

    s = {**sizes(full), **kw}
    shape, budget = dict(s["search_shape"]), s["search_budget"]
    space = tunable.get("gemm.matmul")
    n_valid = sum(1 for _ in space.configs(shape))
    t = Table(f"searchers on gemm.matmul {shape}: best found in {budget} trials ({n_valid} valid configs)",
              baseline="exhaustive" if n_valid <= s["exhaustive_max"] else "random")  # fmt: skip
    case = f"budget {budget}"
    names = _searcher_names()
    if n_valid <= s["exhaustive_max"]:
        names = ["grid-exhaustive", *names]
    for name in names:
        _say(progress, f"tune: searcher {name}")
        exhaustive = name == "grid-exhaustive"
        try:
            res = tune("gemm.matmul", shape, searcher="grid" if exhaustive else name, budget=n_valid + 1 if exhaustive
                       else budget, store=False, warmup=s["warmup"], repeat=s["repeat"])  # fmt: skip
        except (ValueError, ImportError, RuntimeError) as e:
            t.add(Row(case, name, None, note=f"not run: {e}"))
            continue
        ok = [m.seconds for m in res.history if m.seconds is not None]
        # trials to reach within 5% of this run's best: how early the searcher found its answer
        reach = next(i + 1 for i, v in enumerate(np.minimum.accumulate(ok)) if v <= 1.05 * min(ok)) if ok else None
        t.add(Row(case, "exhaustive" if exhaustive else name, None if res.best_s is None else res.best_s * 1e3,
                  extra={"trials": len(res.history), "trials_to_5pct": reach}))  # fmt: skip
    t.compute_ratios()
    t.notes.append("trial 1 of every searcher is the default configuration (tune measures it first): "
                   "trials_to_5pct = 1 means nothing sampled beat the default by more than 5%")  # fmt: skip
    if n_valid > s["exhaustive_max"]:
        t.notes.append(f"exhaustive search skipped ({n_valid} valid configurations > {s['exhaustive_max']}; "
                       "full=True measures it when affordable)")  # fmt: skip
    return t


def cost_model_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Kendall tau of the learned cost model (held-out configurations) and of the MODEL proxy."""
    from .. import tunable
    from ..bench.timing import measure
    from .proxy_model import validate_on_cpu

    s = {**sizes(full), **kw}
    t = Table("cost models: ranking agreement with measured time (Kendall tau, higher is better)", baseline="")
    shape = dict(s["search_shape"])
    space = tunable.get("gemm.matmul")
    rng = np.random.default_rng(1)
    cands = list(space.configs(shape))
    pick = rng.choice(len(cands), size=min(len(cands), s["cm_train"] + s["cm_test"]), replace=False)
    configs = [cands[int(i)] for i in pick]
    args, kwargs = space.make_args(shape, rng)
    _say(progress, f"tune: cost model on {len(configs)} gemm configurations")
    secs = []
    for c in configs:
        fn = space.build(c)
        secs.append(measure(lambda fn=fn: fn(*args, **kwargs), warmup=s["warmup"], repeat=s["repeat"]).median)
    tr = min(s["cm_train"], len(configs) - 2)
    try:
        from .cost_model import CostModel

        cm = CostModel(space).fit(configs[:tr], shape, secs[:tr])
        tau = cm.kendall_tau(configs[tr:], shape, secs[tr:])
        t.add(Row(f"gemm.matmul {shape}", "CostModel (held out)", None,
                  extra={"tau": round(float(tau), 3), "train": tr, "test": len(configs) - tr}))  # fmt: skip
    except (ImportError, ValueError) as e:
        t.add(Row(f"gemm.matmul {shape}", "CostModel (held out)", None, note=f"not run: {e}"))
    _say(progress, "tune: MODEL proxy validation")
    v = validate_on_cpu({"M": 128, "N": 128, "K": 128}, n=s.get("proxy_n", 18 if full else 9), repeat=s["repeat"])
    t.add(Row("gemm.matmul 128^3 (simd, 1 thread)", "MODEL proxy (this CPU's parameters)", None,
              extra={"tau": round(v["tau"], 3), "configs": len(v["rows"])}))  # fmt: skip
    t.notes.append("MODEL: the proxy's ranking comes from an analytic cost with sampled memory latency "
                   "(tinylearn.tune.proxy_model), not from running the kernels")  # fmt: skip
    return t


def gemm_blas_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """The C++ GEMM at a fixed thread count, default blocking and tuned (the best of a random sample of the space's
    configurations with that thread count, each checked against numpy first), vs OpenBLAS (numpy) and torch at the
    same thread count: square fp32, 256 and 512 (and 1024, 2048 with ``full``), 1 thread and every core."""
    import dataclasses

    import torch

    from .. import _threads, tunable
    from ..bench.timing import measure
    from .measure import measure_config

    s = {**sizes(full), **kw}
    ns = s.get("gemm_sizes", (256, 512, 1024, 2048) if full else (256, 512))
    budget = s.get("gemm_budget", 12 if full else 6)
    space = tunable.get("gemm.matmul")
    t = Table(f"gemm.matmul fp32 vs OpenBLAS at a fixed thread count (tuned: best of {budget} sampled)",
              baseline="OpenBLAS (numpy)")  # fmt: skip
    torch_threads = torch.get_num_threads()
    rng = np.random.default_rng(0)
    try:
        for nt in sorted({1, max(_threads.cores(), 1)}):
            sub = dataclasses.replace(space, valid=lambda c, sh, nt=nt: space.is_valid(c, sh) and c["threads"] == nt)
            for n in ns:
                case = f"{n}^3, {nt} thread{'s' if nt > 1 else ''}"
                _say(progress, f"gemm vs OpenBLAS: {case}")
                shape = {"M": n, "N": n, "K": n}
                args, kwargs = space.make_args(shape, rng)
                expected = (args[0].astype(np.float64) @ args[1].astype(np.float64)).astype(np.float32)
                default = dict(space.default(shape), threads=nt, version="parallel" if nt > 1 else "simd")
                pool = [c for c in sub.configs(shape) if c != default]  # every valid one at this thread count
                cands = [default] + [pool[i] for i in rng.permutation(len(pool))[:budget]]
                ms = [measure_config(sub, c, args, kwargs, expected=expected, warmup=s["warmup"], repeat=s["repeat"])
                      for c in cands]  # fmt: skip
                ok = [m for m in ms if m.ok]
                best = min(ok, key=lambda m: m.seconds) if ok else None
                flops = 2.0 * n**3
                for name, m in (("tl default", ms[0]), ("tl tuned", best)):
                    sec = None if m is None or not m.ok else m.seconds
                    note = "" if m is None else ", ".join(f"{k}={v}" for k, v in m.config.items() if k != "threads")
                    row = Row(case, name, None if sec is None else sec * 1e3, note=note)
                    if sec is not None:
                        row.gflops = flops / sec / 1e9
                    t.add(row)
                a, b = args
                with _threads.limited_threads(nt):
                    mb = measure(lambda a=a, b=b: a @ b, warmup=s["warmup"], repeat=s["repeat"])
                torch.set_num_threads(nt)
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                mt = measure(lambda ta=ta, tb=tb: ta @ tb, warmup=s["warmup"], repeat=s["repeat"])
                for name, m in (("OpenBLAS (numpy)", mb), ("torch", mt)):
                    row = Row(case, name, m.median * 1e3, m.min * 1e3)
                    row.gflops = flops / m.median / 1e9
                    t.add(row)
    finally:
        torch.set_num_threads(torch_threads)
    t.compute_ratios()
    t.notes.append("goal: tuned >= 0.95x OpenBLAS's speed (x OpenBLAS <= 1.05) at 1 and 2 threads; tuned and default "
                   "are medians of separate measurements")  # fmt: skip
    return t


def _compiled_cases(rows: int, cols: int, rng: np.random.Generator) -> dict[str, tuple[Callable[..., Any], tuple]]:
    from ..autograd import Tensor
    from ..nn import functional as F

    x, r = (Tensor(rng.standard_normal((rows, cols)).astype(np.float32)) for _ in range(2))
    w, b = (Tensor(rng.standard_normal(cols).astype(np.float32)) for _ in range(2))
    return {
        f"gelu(x + b) + r [{rows}, {cols}]": (lambda x, b, r: F.gelu(x + b) + r, (x, b, r)),
        f"gelu(layer_norm(x)) + r [{rows}, {cols}]": (
            lambda x, w, b, r: F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + r,
            (x, w, b, r),
        ),
        f"softmax(x) [{rows}, {cols}]": (lambda x: F.softmax(x, -1), (x,)),
    }


def compiled_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """``tl.compile``'s kernels with the default schedule vs tuned schedules (``tune_compiled``: a search over each
    kernel pattern's schedule space, every candidate checked against the IR first), beside eager tinylearn, torch
    eager and tinygrad (TinyJit), in one process."""
    import torch

    from ..bench.comparators import Comparison, tinygrad_jit
    from ..compiler.api import compile as tl_compile
    from .compiled import tune_compiled
    from .dispatch import tuned
    from .records import RecordDB

    s = {**sizes(full), **kw}
    rows, cols = s.get("compiled_shape", (1024, 1024) if full else (256, 1024))
    budget = s.get("compiled_budget", 24 if full else 8)
    cmp = Comparison(f"tl.compile: default vs tuned schedules (grid/random, {budget} per kernel pattern)",
                     baseline="torch", warmup=max(2, s["warmup"]), repeat=max(3, s["repeat"]))  # fmt: skip
    for case, (fn, args) in _compiled_cases(rows, cols, np.random.default_rng(0)).items():
        _say(progress, f"compiled: {case}")
        plain = tl_compile(fn)
        plain(*args)
        db = RecordDB(":memory:")
        res = tune_compiled(plain, searcher="random", budget=budget, db=db, repeat=s["repeat"])
        with tuned("cached", db=db):
            fast = tl_compile(fn)
            fast(*args)  # built here, with the stored schedules; later calls run the built kernels
        picked = "; ".join(", ".join(f"{k}={v}" for k, v in r.best.items() if v != r.default[k]) or "default"
                           for r in res)  # fmt: skip
        targs = [torch.from_numpy(a.numpy()) for a in args]
        with cmp.case(case, nbytes=sum(a.numpy().nbytes for a in args) + rows * cols * 4) as c:
            c.add("tl eager", lambda fn=fn, args=args: fn(*args))
            c.add("tl.compile default", lambda f=plain, args=args: f(*args))
            c.add("tl.compile tuned", lambda f=fast, args=args: f(*args), note=f"changed: {picked}")
            c.add("torch", lambda fn=fn, targs=targs: _torch_twin(fn, targs))
            c.add_tinygrad("tinygrad", lambda tg, fn=fn, args=args: _tinygrad_twin(tg, fn, args, tinygrad_jit))
    cmp.table.notes.append(
        "tuned: each kernel's schedule is the fastest of the sampled configurations measured alone (the default "
        "included); 'changed' lists the knobs that differ from the default"
    )
    return cmp.table


def _torch_twin(fn: Callable[..., Any], targs: list) -> Any:
    import torch.nn.functional as TF

    if len(targs) == 3:
        x, b, r = targs
        return TF.gelu(x + b) + r
    if len(targs) == 4:
        x, w, b, r = targs
        return TF.gelu(TF.layer_norm(x, (x.shape[-1],), w, b)) + r
    return TF.softmax(targs[0], -1)


def _tinygrad_twin(tg: Any, fn: Callable[..., Any], args: tuple, jit: Callable[..., Any]) -> Callable[[], Any]:
    ts = [tg.Tensor(a.numpy()).realize() for a in args]
    if len(ts) == 3:
        f = jit(lambda x, b, r: (x + b).gelu() + r)
    elif len(ts) == 4:
        f = jit(lambda x, w, b, r: (x.layernorm() * w + b).gelu() + r)
    else:
        f = jit(lambda x: x.softmax(-1))
    return lambda: f(*ts)


def run(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> list[Table]:
    """The five tables; ``kw`` overrides ``sizes(full)`` (the tests pass a minimal configuration)."""
    return [
        tuned_table(full, progress, **kw),
        compiled_table(full, progress, **kw),
        gemm_blas_table(full, progress, **kw),
        searcher_table(full, progress, **kw),
        cost_model_table(full, progress, **kw),
    ]
