"""``tinylearn bench compiler``: eager tinylearn, ``tl.compile``, torch eager, ``torch.compile`` and tinygrad TinyJit.

One process, the same inputs for everyone (fp32). Two tables:

    run time        median per call after warm-up (compilation happens in warm-up for every compiler)
    compile time    the first call of a freshly compiled function, once: tl.compile cold (no kernel in memory, an
                    empty TINYLEARN_CACHE_DIR), tl.compile again (trace + passes + kernel cache hit: what a new
                    process with a warm disk cache pays too), torch.compile after ``torch._dynamo.reset()`` with
                    Inductor's FX-graph cache off and a fresh, empty Inductor cache dir (cold as well: its generated
                    C++ compiled again, not found on disk from an earlier run of this bench), and tinygrad's first
                    three calls (TinyJit captures on the second and replays from the third)

Rows (``full=True`` doubles the sizes): a GELU + scale + residual chain, SiLU + residual, LayerNorm + GELU +
residual, softmax over the last dim, GroupNorm (8 groups) + SiLU, an MLP block (Linear-GELU-Linear + residual)
forward, and forward + backward w.r.t. its weights (a training step without the optimizer); then a transformer
forward (TinyGPT's blocks and head) and a whole training step of the digits CNN.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench import Comparison, Table, tinygrad_jit
from ..bench.table import Row


def _cases(full: bool) -> list[tuple[str, tuple[tuple[int, ...], ...], str]]:
    s = 2 if full else 1
    n, rows, d = (1 << 22) * s, 2048 * s, 256  # 16 MiB per chain array: past the L2/L3, where fusion's bytes count
    return [
        ("gelu*1.5+res", ((n,), (n,)), "chain"),
        ("silu+res", ((n,), (n,)), "silu"),
        ("layernorm+gelu+res", ((rows, d), (rows, d), (d,), (d,)), "ln_gelu"),
        ("softmax", ((rows, d),), "softmax"),
        ("groupnorm+silu", ((8 * s, 64, 32, 32), (64,), (64,)), "groupnorm"),
        ("mlp block fwd", ((512 * s, d), (4 * d, d), (4 * d,), (d, 4 * d), (d,)), "mlp"),
        ("mlp block fwd+bwd", ((512 * s, d), (4 * d, d), (4 * d,), (d, 4 * d), (d,)), "mlp_train"),
    ]


def _fn(kind: str, lib: Any, F: Any) -> Callable[..., Any]:
    """The same program written once for a torch-like namespace (tinylearn, torch) or tinygrad."""
    if kind == "chain":
        return lambda x, r: F.gelu(x) * 1.5 + r
    if kind == "silu":
        return lambda x, r: x * F.sigmoid(x) + r
    if kind == "ln_gelu":
        return lambda x, r, w, b: F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + r
    if kind == "softmax":
        return lambda x: F.softmax(x, -1)
    if kind == "groupnorm":
        return lambda x, w, b: F.silu(F.group_norm(x, 8, w, b))
    return lambda x, w1, b1, w2, b2: x + F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _train(fwd: Callable[..., Any], args: list[Any]) -> Callable[[], Any]:
    """One forward + backward of sum(fwd(*args)) w.r.t. the weights (args[1:]), the gradients reset first: what a
    training step costs without the optimizer (the same for tinylearn and torch)."""

    def step() -> Any:
        for a in args[1:]:
            a.grad = None
        out = fwd(*args).sum()
        out.backward()
        return out

    return step


def _tinygrad_fn(kind: str) -> Callable[..., Any]:
    if kind == "chain":
        return lambda x, r: x.gelu() * 1.5 + r  # tinygrad's gelu is the tanh form
    if kind == "silu":
        return lambda x, r: x.silu() + r
    if kind == "ln_gelu":
        return lambda x, r, w, b: (x.layernorm() * w + b).gelu() + r
    if kind == "softmax":
        return lambda x: x.softmax(-1)
    if kind == "groupnorm":

        def gn(x: Any, w: Any, b: Any) -> Any:
            n, c = x.shape[0], x.shape[1]
            y = x.reshape(n, 8, -1).layernorm(axis=-1).reshape(x.shape)
            return (y * w.reshape(1, c, 1, 1) + b.reshape(1, c, 1, 1)).silu()

        return gn
    mlp = lambda x, w1, b1, w2, b2: x + (x.linear(w1.T, b1).gelu()).linear(w2.T, b2)  # noqa: E731
    if kind == "mlp":
        return mlp

    def train(x: Any, *ws: Any) -> Any:
        for w in ws:
            w.grad = None
        mlp(x, *ws).sum().backward()
        return tuple(w.grad for w in ws)

    return train


def _arrays(shapes: tuple[tuple[int, ...], ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s, dtype=np.float32) * (0.05 if len(s) == 2 and s[0] != s[1] and i else 1.0)
            for i, s in enumerate(shapes)]  # fmt: skip


def _torch_compile_row(c: Any, fn: Callable[..., Any], call: Callable[..., Callable[[], Any]]) -> float | None:
    """Compile ``fn`` with torch.compile (Inductor, CPU) from a reset dynamo; time the first ``call(compiled)()``
    (a forward, or a forward + backward) in an empty Inductor cache dir; add the run-time row from a second compile
    with Inductor's own caches (the one a user gets): a graph compiled in a temporary cache dir after an earlier one
    in the process ran up to 3x slower (GroupNorm + SiLU 0.43 vs 0.17 ms; torch 2.x's ``clear_caches`` on entering
    the dir), which would have flattered tl.compile."""
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    inductor_config.compile_threads = 1  # as Comparison.add_torch_compile: no background compile-worker pool
    torch._dynamo.reset()
    try:
        # a cold compile, as tl.compile's: Inductor's on-disk FX-graph cache would make a rerun of this bench skip
        # its codegen, and its kernel cache (the compiled C++ of earlier runs, under one cache dir for all runs)
        # the C++ compile -- measured: softmax 76 ms, SiLU 60 ms with the kernels found on disk
        with tempfile.TemporaryDirectory(prefix="tl-inductor-") as tmp, temporary_cache_dir(tmp):
            with inductor_config.patch(fx_graph_cache=False):
                t0 = time.perf_counter()
                run = call(torch.compile(fn))
                run()
                first = time.perf_counter() - t0
        torch._dynamo.reset()
        run = call(torch.compile(fn))
        run()
    except Exception as e:  # no C++ compiler, an Inductor limitation: an n/a row naming it
        c.unavailable("torch.compile", f"n/a: torch.compile failed ({type(e).__name__})")
        return None
    c.add("torch.compile", run, note="Inductor CPU")
    return first


CNN_CASE = "digits-CNN train step (b32, 28x28)"


def _cnn_train_case(cmp: Comparison, compile_t: Table) -> None:
    """A whole training step (forward, cross-entropy, backward, SGD with momentum) of notebook 01's CNN: the
    tl.compile row compiles the model's forward and backward (convs and pools stay extern calls, their ReLUs and the
    loss's point-wise work fused); the other rows reuse ``tinylearn bench autograd``'s builders (same weights)."""
    import torch

    from .. import autograd, nn, optim
    from ..autograd import bench as ab
    from . import api

    step_eager, model_eager = ab.tinylearn_cnn_step()
    autograd.manual_seed(0)
    model = ab._cnn_tl()
    X, y = ab._batch((32, 1, 28, 28))
    xt = autograd.Tensor(X)
    compiled = api.compile(model, backend="cpp")
    opt = optim.SGD(list(model.parameters()), lr=0.01, momentum=0.9)

    def step() -> Any:
        loss = nn.functional.cross_entropy(compiled(xt), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    with cmp.case(CNN_CASE) as c:
        c.add("tinylearn eager", step_eager)
        t0 = time.perf_counter()
        step()
        step()  # the first call traces; the second builds the joint forward/backward program
        compile_t.add(Row(CNN_CASE, "tl.compile (2 first steps)", (time.perf_counter() - t0) * 1e3))
        c.add("tl.compile", step)
        c.add("torch", ab.torch_step(ab.torch_cnn_model(model_eager), X, y))
        th = ab.torch_cnn_model(model_eager)
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
        torch._dynamo.reset()
        tstep = ab.torch_step(th, X, y, compile=True)
        t0 = time.perf_counter()
        try:
            tstep()
            compile_t.add(Row(CNN_CASE, "torch.compile", (time.perf_counter() - t0) * 1e3))
            c.add("torch.compile", tstep, note="Inductor CPU")
        except Exception as e:
            c.unavailable("torch.compile", f"n/a: torch.compile failed ({type(e).__name__})")
        state = {k: v.detach().numpy().copy() for k, v in th.state_dict().items()}
        c.add_tinygrad("tinygrad", ab.tinygrad_step_builder("cnn", X, y, state))


GPT_CASE = "TinyGPT blocks+head fwd (S=128)"


def _gpt_case(cmp: Comparison, compile_t: Table, seq: int = 128) -> None:
    """A transformer forward: TinyGPT's 4 blocks (LayerNorm, GQA attention with RoPE, GELU MLP, residuals) and the
    head, on the embedded prompt [1, S, d] (``tinylearn bench inference``'s config and weights from its torch
    reference). tl.compile fuses the LayerNorms, GELUs, residual adds and the attention's softmax/scale; matmuls
    stay extern. tinygrad runs its TinyGPT prefill graph (tinylearn.inference.tinygrad_ref: the same blocks and head,
    with the embedding as a one-hot matmul in front) under TinyJit."""
    import torch

    from .. import autograd
    from ..autograd import no_grad
    from ..inference.bench import BENCH_CONFIG as cfg
    from ..inference.model import TinyGPT
    from ..inference.tinygrad_ref import build_prefill, jit_compiled
    from ..inference.torch_ref import torch_reference
    from . import api

    torch.manual_seed(0)
    ref = torch_reference(cfg).eval()
    model = TinyGPT.from_config(cfg).load_torch_state_dict(ref.state_dict())
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, seq))
    with torch.no_grad():
        emb = ref.tok_emb(torch.from_numpy(ids))
    h = autograd.Tensor(emb.numpy())

    def tl_fwd(x: Any) -> Any:
        for i, blk in enumerate(model.blocks):
            x = blk(x, model._rope, 0, None, i)
        return model.lm_head(model.ln_f(x))

    def th_fwd(x: Any) -> Any:
        rope = (ref.rope_cos, ref.rope_sin)
        for blk in ref.blocks:
            x, _ = blk(x, rope, 0, None)
        return ref.lm_head(ref.ln_f(x))

    compiled = api.compile(tl_fwd, backend="cpp")
    with cmp.case(GPT_CASE) as c, no_grad(), torch.no_grad():
        c.add("tinylearn eager", lambda: tl_fwd(h))
        t0 = time.perf_counter()
        compiled(h)
        compiled(h)
        compile_t.add(Row(GPT_CASE, "tl.compile (cold cache)", (time.perf_counter() - t0) * 1e3))
        ok = np.allclose(compiled(h).numpy(), th_fwd(emb).numpy(), rtol=1e-4, atol=1e-4)
        c.add("tl.compile", lambda: compiled(h), note="" if ok else "MISMATCH vs torch")
        c.add("torch", lambda: th_fwd(emb))
        tc = _torch_compile_row(c, th_fwd, lambda f: lambda: f(emb))
        compile_t.add(Row(GPT_CASE, "torch.compile", tc * 1e3 if tc is not None else None))
        sd = {k: v.numpy() for k, v in ref.state_dict().items()}

        def build(tg: Any) -> Callable[[], Any]:
            step, make_inputs = build_prefill(tg, cfg, sd, seq, seq)
            replay, secs = jit_compiled(tg, step, make_inputs(ids[0]))
            compile_t.add(Row(GPT_CASE, "tinygrad TinyJit", secs * 1e3, note="2 calls"))
            return replay

        c.add_tinygrad("tinygrad", build, note="TinyJit, prefill incl. one-hot embedding")


def run(
    full: bool = False, progress: Callable[[str], None] | None = None, cases: tuple[str, ...] | None = None
) -> list[Table]:
    """The two tables (run time, compile time); ``cases`` picks rows by name (default: all)."""
    import torch

    from .. import autograd, nn
    from . import api, cc, kernel_cache

    F = nn.functional
    cmp = Comparison("compiler: run time per call (fp32, 1 process)", baseline="torch", progress=progress)
    compile_t = Table("compiler: first-call (compile) time", baseline="torch.compile")
    cache_dir = tempfile.mkdtemp(prefix="tl-compiler-bench-")
    old = os.environ.get("TINYLEARN_CACHE_DIR")
    os.environ["TINYLEARN_CACHE_DIR"] = cache_dir
    try:
        chosen = _cases(full)
        if cases is not None:
            extra = [GPT_CASE, CNN_CASE]
            unknown = set(cases) - {c[0] for c in chosen} - set(extra)
            if unknown:
                raise ValueError(f"cases: unknown {sorted(unknown)}; choose from {[c[0] for c in chosen] + extra}")
            chosen = [c for c in chosen if c[0] in cases]
        for name, shapes, kind in chosen:
            train = kind == "mlp_train"  # forward + backward of the MLP block w.r.t. its weights
            fwd_kind = "mlp" if train else kind
            arrs = _arrays(shapes)
            tl_in = [autograd.Tensor(a, requires_grad=train and i > 0) for i, a in enumerate(arrs)]
            th_in = [torch.from_numpy(a).requires_grad_(train and i > 0) for i, a in enumerate(arrs)]

            def tl_call(f: Callable[..., Any], t: list[Any] = tl_in, tr: bool = train) -> Callable[[], Any]:
                return _train(f, t) if tr else lambda: f(*t)

            def th_call(f: Callable[..., Any], t: list[Any] = th_in, tr: bool = train) -> Callable[[], Any]:
                return _train(f, t) if tr else lambda: f(*t)

            eager = _fn(fwd_kind, autograd, F)
            with cmp.case(name, nbytes=sum(a.nbytes for a in arrs) + arrs[0].nbytes) as c:
                c.add("tinylearn eager", tl_call(eager))
                cc.clear_memory_cache()  # a cold compile: no kernel in memory, an empty on-disk cache dir
                kernel_cache.CACHE.clear()
                t0 = time.perf_counter()
                compiled = api.compile(eager, backend="cpp")
                tl_call(compiled)()  # traces (runs eagerly once)
                tl_call(compiled)()  # the first compiled call (builds the joint forward/backward when training)
                cold = time.perf_counter() - t0
                t0 = time.perf_counter()
                again = api.compile(eager, backend="cpp")
                tl_call(again)()
                tl_call(again)()
                warm = time.perf_counter() - t0
                c.add("tl.compile", tl_call(compiled))
                torch_fn = _fn(fwd_kind, torch, torch.nn.functional)
                c.add("torch", th_call(torch_fn))
                tc = _torch_compile_row(c, torch_fn, th_call)
                tg_fn = _tinygrad_fn(kind)

                def build(
                    tg: Any,
                    f: Callable[..., Any] = tg_fn,
                    a: list[np.ndarray] = arrs,
                    case: str = name,
                    tr: bool = train,
                ) -> Callable[[], Any]:
                    xs = [tg.Tensor(x) for x in a]
                    for w in xs[1:] if tr else ():
                        w.requires_grad = True
                    j = tinygrad_jit(f)
                    t0 = time.perf_counter()
                    for _ in range(3):
                        j(*xs)
                    compile_t.add(Row(case, "tinygrad TinyJit", (time.perf_counter() - t0) * 1e3, note="3 calls"))
                    return lambda: j(*xs)

                c.add_tinygrad("tinygrad", build)
            compile_t.add(Row(name, "tl.compile (cold cache)", cold * 1e3))
            compile_t.add(Row(name, "tl.compile again (kernel cache hit)", warm * 1e3))
            compile_t.add(Row(name, "torch.compile", tc * 1e3 if tc is not None else None))
        if cases is None or GPT_CASE in cases:
            kernel_cache.CACHE.clear()
            cc.clear_memory_cache()
            _gpt_case(cmp, compile_t)
        if cases is None or CNN_CASE in cases:
            _cnn_train_case(cmp, compile_t)
    finally:
        if old is None:
            os.environ.pop("TINYLEARN_CACHE_DIR", None)
        else:
            os.environ["TINYLEARN_CACHE_DIR"] = old
    cmp.note("tl.compile: backend='cpp' (generated C++ with OpenMP, compiled by the system compiler at first call)")
    cmp.note("tinygrad: its gelu is the tanh approximation; the others compute the exact erf form")
    compile_t.compute_ratios()
    return [cmp.table, compile_t]
