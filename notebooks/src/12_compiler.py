# %% [markdown]
# # 12 · A small deep-learning compiler: capture, IR, passes, fusion, loops, codegen — vs torch.compile and tinygrad
#
# **Interview questions this notebook answers** (seed 003: 19, 29, 36, 47, 54, 68, 72, 82, 83, 93, 108, 206, 215,
# 237, 275, 281):
#
# 1. [Q275] [Q19] What are the stages of a deep-learning compiler, from a Python function to machine code, and what
#    does each one buy? (§1–§5, every stage printed on one example)
# 2. [Q36] Which graph optimizations does a framework run before executing — and how is each one checked? (§2)
# 3. [Q47] [Q72] How does an MLIR-style pattern rewriter fuse Linear/Conv2d + bias + ReLU? (§3)
# 4. [Q54] Automatic fusion: element-wise chains, reductions, epilogues — and the cost rule that decides. (§4)
# 5. [Q19] Schedules: tile, reorder, vectorize, parallelize — the Halide/TVM split of algorithm and schedule; [Q29]
#    memory planning, in-place reuse and layout selection in an inference engine. (§5)
# 6. [Q93] Compiling the backward pass: from the forward graph to backward code. (§6)
# 7. [Q206] [Q237] Guards, recompilation, dynamic shapes and a pattern-hash cache of compiled kernels; [Q108] merging
#    shape guards by bucketing; [Q215] predicting the next shape to compile ahead. (§7)
# 8. [Q68] Register allocation; [Q281] list scheduling; [Q82] [Q83] the polyhedral model. (§8–§10)
# 9. How fast is it against eager, torch eager, torch.compile (Inductor) and tinygrad? (§11)
#
# Everything is `tinylearn.compiler` (`tl.compile`, `tl.compiler.trace`, `show_code`): a real compiler whose
# kernels are C++ generated here, compiled by the system compiler at first call and cached on disk.

# %%
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton source runs in its interpreter on a CPU

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import tinylearn as tl  # noqa: E402
from tinylearn import compiler  # noqa: E402
from tinylearn._threads import limited_threads  # noqa: E402
from tinylearn.bench import measure  # noqa: E402
from tinylearn.compiler import (  # noqa: E402  # noqa: E402
    codegen_cpp,
    codegen_cuda,
    codegen_triton,
    fusion,
    listsched,
    loops,
    passes,
    polyhedral,
    regalloc,
)

F = tl.nn.functional
tl.manual_seed(0)


def rand(*shape: int, seed: int = 0) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def run_graph(graph: compiler.Graph, *inputs: tl.Tensor) -> np.ndarray:
    """Execute a graph node by node (every node as an extern call): the interpreter the passes are checked with."""
    return compiler.runtime.run_graph(graph, [t.data for t in inputs])[0]


def close(a: np.ndarray, b: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5) -> bool:
    return bool(np.allclose(a, b, rtol=rtol, atol=atol))


# %% [markdown]
# ## 1. Capture: a Python function becomes a graph [Q275]
#
# `tl.compiler.trace(fn, *example_inputs)` runs `fn` once on real Tensors with a hook in `Function.apply` — the one
# place every tinylearn op passes through — and records each op as a node: op, inputs, literal arguments, output
# shape and dtype (torch.fx's flat node list; Dynamo gets the same list by interpreting Python bytecode instead).
# Module parameters become `param` nodes read at every call, so an optimizer step is seen and never baked in.


# %%
def block(x, r, w, b):
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    y = F.gelu(h) * 1.0 + r  # "* 1.0": the kind of no-op that generated and refactored code is full of
    z = (x * 2).exp() + (x * 2).exp()  # the same subexpression twice
    unused = z.tanh()  # noqa: F841  (dead code)
    return y + z.permute(1, 0).permute(1, 0)  # a transpose of a transpose


x, r, w, b = rand(64, 32), rand(64, 32, seed=1), tl.ones(32), tl.zeros(32)
g = compiler.trace(block, x, r, w, b)
print(g)
ops = [n.op for n in g.calls()]
assert ops.count("Exp") == 2 and ops.count("Permute") == 2 and "Tanh" in ops

# %% [markdown]
# ## 2. Graph passes, each checked [Q36]
#
# Each pass is one small file in `tinylearn/compiler/passes/` with a test, and returns what it changed:
#
# | pass | what it does |
# |---|---|
# | `shape_infer` | re-derives every node's shape and dtype from op rules and checks them against the trace |
# | `simplify` | x·1, x+0, x/1, permute∘permute, reshape∘reshape, no-op expand → the operand (algebraic identities) |
# | `fold` | nodes whose inputs are all constants are evaluated once, at compile time |
# | `cse` | two nodes with the same op, inputs and literals → one |
# | `dce` | nodes no output depends on are removed (ops with side effects are kept) |

# %%
before = len(g.calls())
reports = passes.run_pipeline(g)
for rep in reports:
    print(rep)
print(g)
changed = {rep.name: rep.changed for rep in reports}
assert changed["cse"] == 2 and changed["simplify"] >= 3  # two duplicates; *1.0 and the double permute
assert len(g.calls()) == before - 6 and "Tanh" not in [n.op for n in g.calls()]  # 13 calls -> 7, tanh dead
assert close(run_graph(g, x, r, w, b), block(x, r, w, b).numpy())  # the optimized graph computes the same

# %% [markdown]
# The graph shrank from 13 calls to 7 and computes the same array. These are the graph-level half of what TensorRT,
# ONNX Runtime and XLA run before fusion ("graph optimization" in an interview answer); the other half — fusion,
# memory planning and kernel selection — follows.

# %% [markdown]
# ## 3. Pattern rewriting: Linear/Conv2d + bias + activation as one op [Q47] [Q72]
#
# An MLIR `RewritePattern` is a *match* (does the DAG rooted here have this shape, with these constraints — e.g.
# the intermediate value has no other user?) and a *rewrite* (build the replacement, redirect the uses, let DCE
# remove the rest), applied by a driver until nothing matches. `passes.patterns.Pattern(name, match, rewrite)` is
# exactly that; the built-in patterns fuse Linear/MatMul + bias + ReLU/GELU into one `LinearAct` call, and Conv2d
# (+ its bias) + ReLU into one `ConvAct` call, each with its own backward.

# %%
conv = tl.nn.Conv2d(3, 8, 3, padding=1)
xc = rand(2, 3, 10, 10, seed=2)
gc = compiler.trace(lambda t: F.relu(conv(t)), xc)
print("before:", [n.op for n in gc.calls()])
rep = passes.patterns.run(gc)
print(rep)
passes.dce.run(gc)  # the matched producers have no users left
print("after: ", [n.op for n in gc.calls()])
assert [n.op for n in gc.calls()] == ["conv_act"]
assert close(run_graph(gc, xc), F.relu(conv(xc)).numpy())
lin1 = tl.nn.Linear(16, 32)
xl = rand(4, 16, seed=3)
gl = compiler.trace(lambda t: F.gelu(lin1(t)), xl)
passes.patterns.run(gl)
passes.dce.run(gl)
print("Linear + GELU ->", [n.op for n in gl.calls()])
assert [n.op for n in gl.calls()] == ["linear_act"] and close(run_graph(gl, xl), F.gelu(lin1(xl)).numpy())

# %% [markdown]
# In MLIR the same pass is: declare the pattern (`OpRewritePattern<ReluOp>` matching `relu(add(conv2d(x, w), b))`
# with one-use constraints), register it in a `RewritePatternSet`, run `applyPatternsAndFoldGreedily`, and lower the
# fused op to a library call or generated loops; the legality conditions are the ones `match` checks here.
# (`conv_act` / `linear_act` are the rewritten nodes; each is one call of a fused `ConvAct` / `LinearAct` op.)
#
# That is *vertical* fusion (a GEMM with what follows it). The *horizontal* kind joins independent ops that read the
# same input: attention's q, k and v projections are three GEMMs on one activation, and `passes.horizontal` makes
# them one GEMM against the stacked weights (a multi-output `linear_group` node whose `getitem` outputs are column
# slices of the product). The input is read once, one call is paid instead of three, and the thin GQA k/v products
# ride on the wide one. Its cost rule: the weights are stacked at every call (a parameter can change between
# calls), so the pass fuses only when the input has at least `MIN_ROWS` rows; a decode step's one row stays as three
# GEMVs, and the report says why. Inductor's pre-grad "group/batch fusion" passes do this to linears on a shared input.

# %%
q_p, k_p, v_p = tl.nn.Linear(32, 32), tl.nn.Linear(32, 8), tl.nn.Linear(32, 8)
qkv = lambda t: (q_p(t), k_p(t), v_p(t))  # noqa: E731
for rows in (64, 1):
    xh = rand(rows, 32, seed=4)
    gh = compiler.trace(qkv, xh)
    print(f"{rows} rows:", passes.horizontal.run(gh))
    assert all(close(a, b.numpy()) for a, b in zip(compiler.runtime.run_graph(gh, [xh.data]), qkv(xh), strict=True))
    assert [n.op for n in gh.calls()] == (["linear_group"] if rows >= passes.horizontal.MIN_ROWS else ["Linear"] * 3)

# %% [markdown]
# ## 4. Fusion: what goes into one kernel, and the cost rule [Q54]
#
# A point-wise chain run op by op reads and writes every intermediate: for n ops on N floats that is about
# 2·n·4N bytes; one fused kernel reads the inputs and writes the output once. The fusion pass walks the graph in
# order and puts a fusible node into the group of one of its inputs when that creates no cycle (another input must
# not depend on the group through a node outside it, e.g. a MatMul); a reduction over the trailing dims (softmax,
# LayerNorm, sum/mean) fuses with its point-wise producers and consumers into one row kernel (XLA's "reduce with
# its producers and consumers", Inductor's reduction template). MatMul/conv stay extern library calls, and the
# point-wise ops after them (bias, activation, residual) become an epilogue kernel on their output.
#
# The cost rule: a producer read by several kernels is either stored once (1 write + 1 read per reader) or
# recomputed inside each reader (reread its inputs, redo its ops); the cheaper one wins, and `max-fusion` mode
# always recomputes (what tinygrad's aggressive fusion and Inductor's "recompute cheap point-wise" do).

# %%
fn_chain = lambda x, r: F.gelu(x) * 1.5 + r  # noqa: E731
fn_softmax = lambda x: F.softmax(x * 0.5, -1)  # noqa: E731
fn_mlp = lambda x, w1, w2: x + F.relu(x @ w1) @ w2  # noqa: E731
N = 1 << 22  # 16 MiB per array: past the caches, where the bytes decide
xs, rs = rand(N), rand(N, seed=1)
mlp_args = (rand(64, 128), rand(128, 256, seed=1) * 0.1, rand(256, 128, seed=2) * 0.1)
rows = [
    ("gelu * 1.5 + residual", fn_chain, (xs, rs)),
    ("softmax(x * 0.5)", fn_softmax, (rand(256, 1024),)),
    ("x + relu(x @ w1) @ w2", fn_mlp, mlp_args),
]
fused = {}
for name, fn, args in rows:
    c = tl.compile(fn)
    c(*args)  # the first call traces: it runs fn once, eagerly, while recording the graph, then compiles
    out = c(*args)  # the compiled program
    assert close(out.numpy(), fn(*args).numpy())
    fused[name] = c
    print(f"--- {name}\n{c.explain().split('fusion')[-1]}")
kern = {name: len(c.graphs()[-1].kernels()) for name, c in fused.items()}
print("kernels:", kern)
assert kern["gelu * 1.5 + residual"] == 1 and kern["softmax(x * 0.5)"] == 1 and kern["x + relu(x @ w1) @ w2"] == 2

# %% [markdown]
# What the plans say: the GELU chain is one kernel; `softmax(x * 0.5)` — a scale, a max, an exp, a sum and a divide —
# is one row kernel; the MLP keeps both matmuls as extern calls with the ReLU and the residual add as their
# epilogue kernels. The traffic model of notebook 05 prices it: the chain run op by op writes and rereads its 2
# intermediates (gelu(x) and its product with 1.5): 7 array passes instead of 3, the printed bytes ratio.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
with limited_threads(1, torch=True):
    eager_t = measure(lambda: fn_chain(xs, rs), repeat=7)
    fused_t = measure(lambda: fused["gelu * 1.5 + residual"](xs, rs), repeat=7)
eager_ms, fused_ms = eager_t.median_ms, fused_t.median_ms
eager_bytes, fused_bytes = 4 * N * (2 + 2 + 3), 4 * N * 3  # eager: gelu r+w, mul r+w, add 2r+w; fused: 2r + w
print(f"gelu*1.5+res on {N} floats: eager {eager_ms:.3f} ms, fused C++ {fused_ms:.3f} ms ({eager_ms / fused_ms:.1f}x)")
print(f"bytes {eager_bytes / 2**20:.1f} MiB -> {fused_bytes / 2**20:.1f} MiB ({eager_bytes / fused_bytes:.1f}x)")
# one pass instead of three, no temporaries (best runs: a loaded box spikes medians). Measured on the forced AVX2
# path of this Zen 5 EPYC (TINYLEARN_CPU_FEATURES=avx2, as on an AVX2-only CPU): the generated kernel's GELU is compute
# bound there and the fused chain came out ~10% slower than eager, so the claim is asserted where AVX-512 is used
# and only bounded (within 1.5x of eager) elsewhere
from tinylearn import cpu  # noqa: E402

avx512 = "avx512f" in cpu.cpu_features()
assert fused_t.min < eager_t.min if avx512 else fused_t.min < 1.5 * eager_t.min, (fused_t.min, eager_t.min)

# %% [markdown]
# ## 5. Loops, schedules and generated code [Q19]
#
# Each fused kernel is lowered to a loop nest (`loops.lower`): coalesced dims, one loop per reduction (the point-wise
# values a reduction needs are recomputed in its loop, as Inductor does) and a final loop for the stores. The
# *algorithm* (the kernel IR) is separate from the *schedule* (Halide/TVM): `tile`, `reorder`, `vectorize`,
# `parallelize`, `unroll` rewrite the nest, and the default schedule vectorizes the innermost loop and adds an
# OpenMP `parallel for` on the outer loop when the work is large enough. Codegen then prints C++ (compiled by the
# system compiler at first call, cached on disk by hash, loaded with ctypes), Triton (run here by its interpreter)
# or CUDA (compiled to PTX in the tests; no GPU here).

# %%
k_soft = fused["softmax(x * 0.5)"].graphs()[-1].kernels()[0]
nest = loops.default_schedule(loops.lower(k_soft))
print(nest)
src = compiler.show_code(fused["gelu * 1.5 + residual"], file=open(os.devnull, "w"))
print(src[src.index('extern "C"') :][:1200])  # the kernel (the math helpers before it are elided)
tiled = loops.lower(fused["gelu * 1.5 + residual"].graphs()[-1].kernels()[0])
var = tiled.loops()[0].var
tiled.tile(var, 4096).parallelize(f"{var}_o").vectorize(var)
print(tiled)
k_chain = fused["gelu * 1.5 + residual"].graphs()[-1].kernels()[0]
ck = codegen_cpp.build(k_chain, schedule=tiled)
assert close(ck(xs.numpy(), rs.numpy())[0], fn_chain(xs, rs).numpy())  # another schedule, the same algorithm
print(codegen_triton.emit_triton(k_soft)[:700])
print(codegen_cuda.emit_cuda(k_soft)[:500])
tk = codegen_triton.build_triton(k_soft)
xsm = np.random.default_rng(0).standard_normal((8, 1024)).astype(np.float32)
k_small = fusion.build_kernels(fusion.plan(compiler.trace(fn_softmax, tl.Tensor(xsm))))[0][0]
assert close(codegen_triton.build_triton(k_small)(xsm)[0], fn_softmax(tl.Tensor(xsm)).numpy())  # Triton interpreter

# %% [markdown]
# ### Memory planning, in-place reuse and layout selection [Q29]
#
# An inference engine's remaining graph-level jobs, done as two more passes on the compiled program. **Memory
# planning** (`passes/memory_plan.py`): every fused kernel's output buffer gets a lifetime (the step that writes it,
# the last step that reads it — extended through extern ops that may return a view of it) and an offset in one arena
# planned with `tl.memory.plan` (notebook 07's planner); a point-wise kernel whose input dies at that step writes its
# output over it, in place. Graph outputs never live in the arena (the next call overwrites it). **Layout
# selection** (`passes/layout.py`): a transpose read only by fused kernels is folded into their load strides and
# never materialised; one read by several extern ops (matmuls) is made contiguous once. Kernel selection is the
# third job: each op runs on the registered fastest backend (`tinylearn.backends`), or a generated kernel.


# %%
def three_layers(x, w1, w2, w3):
    h = x
    for w in (w1, w2, w3):
        h = F.gelu(h @ w) * 0.5 + h
    return F.softmax(h, -1)


args3 = (rand(128, 256), *(rand(256, 256, seed=s) * 0.05 for s in (1, 2, 3)))
c3 = tl.compile(three_layers)
c3(*args3)
assert close(c3(*args3).numpy(), three_layers(*args3).numpy())
mp = c3.graphs()[0].program.memory
print(mp.report())
assert mp.lower_bound <= mp.arena_bytes < mp.buffer_bytes and mp.inplace()  # reuse, and an in-place write


def transposed(x, y):
    xt = x.permute(0, 2, 1)
    return (xt * 2.0).exp() + y, F.softmax(xt, -1)  # two kernels read the transpose


argsT = (rand(3, 5, 7), rand(3, 7, 5, seed=1))
cT = tl.compile(transposed)
cT(*argsT)
assert all(close(a.numpy(), b.numpy()) for a, b in zip(cT(*argsT), transposed(*argsT)))
lay = cT.graphs()[0].program.layout
print(lay)
assert [d.action for d in lay.decisions] == ["fold"] and lay.removed  # no copy of the transpose is ever made

# %% [markdown]
# ## 6. Compiling the backward pass [Q93]
#
# Autodiff code generation, AOTAutograd style (`compiler/joint.py`): reverse mode runs over the *forward graph*
# instead of over the values of one run. Every node that depends on an input requiring grad gets dL/dnode, the sum
# (Add nodes) of its readers' contributions; each contribution is the node's VJP from a derivative table
# (`compiler/derivatives.py`, torch's `derivatives.yaml` idea) written as *new graph nodes* in the same op
# vocabulary — so the backward is a graph, and the same passes, fusion and codegen compile it. Ops without a rule
# (MatMul, Linear, conv, embedding) become one extern node that calls the op's own `backward`. Then the joint graph is
# partitioned: the backward's reads of forward values become the *saved* set (extra forward outputs), and a cheap
# point-wise value is recomputed in the backward instead of saved when that does not grow the saved bytes (the
# min-cut rule of AOTAutograd's partitioner, in its simplest form).


# %%
def gelu_silu_res(x, r):
    return F.gelu(x) * x.sigmoid() + r


xg = tl.Tensor(np.random.default_rng(4).standard_normal((256, 1024)).astype(np.float32), requires_grad=True)
rg = tl.Tensor(np.random.default_rng(5).standard_normal((256, 1024)).astype(np.float32), requires_grad=True)
cg_fn = tl.compile(gelu_silu_res)
cg_fn(xg, rg)  # the first call traces (eagerly); the joint program is built at the first compiled call
xg.grad = rg.grad = None
cg_fn(xg, rg).sum().backward()
g_comp = (xg.grad.numpy().copy(), rg.grad.numpy().copy())
xg.grad = rg.grad = None
gelu_silu_res(xg, rg).sum().backward()
assert close(g_comp[0], xg.grad.numpy()) and close(g_comp[1], rg.grad.numpy())  # compiled gradients == eager
joint_text = compiler.autograd.explain_joint(cg_fn)
print(joint_text[:2500])
jp = next(iter(cg_fn.graphs()[-1].joint.values()))
print(f"forward kernels {jp.forward.n_kernels()}, backward kernels {jp.backward.n_kernels()}, "
      f"saved {[n.name for n in jp.saved]}, recomputed {list(jp.recomputed)}")  # fmt: skip
assert jp.forward.n_kernels() == 1 and jp.backward.n_kernels() == 1  # one fused kernel each way

# %% [markdown]
# The backward of the whole chain — GELU's derivative (with erf and exp), sigmoid's, the product rule and the
# residual — is one generated kernel, and instead of saving the GELU and sigmoid outputs the forward saves only its
# input and the backward recomputes them (cheaper than storing and reloading two 1 MiB intermediates). A training
# step compiles the same way: the MLP below is trained for three SGD steps compiled and eager, and the parameters
# agree.


# %%
def mlp_step(model_fn, params, xb, yb, lr=0.1):
    loss = F.cross_entropy(model_fn(xb), yb)
    loss.backward()
    with tl.no_grad():
        for p in params:
            p.data -= lr * p.grad.data
            p.grad = None
    return float(loss.item())


def make_mlp():
    tl.manual_seed(1)
    return tl.nn.Sequential(tl.nn.Linear(64, 128), tl.nn.GELU(), tl.nn.Linear(128, 10))


Xd, yd = tl.data.load_digits()
xb, yb = tl.Tensor(Xd[:256].reshape(256, -1)), tl.Tensor(yd[:256])
m_eager, m_comp = make_mlp(), make_mlp()
m_comp_fn = tl.compile(m_comp)
p_eager, p_comp = list(m_eager.parameters()), list(m_comp.parameters())
losses = [(mlp_step(m_eager, p_eager, xb, yb), mlp_step(m_comp_fn, p_comp, xb, yb)) for _ in range(3)]
print("losses (eager, compiled):", [(round(a, 5), round(b, 5)) for a, b in losses])
assert all(close(pe.data, pc.data) for pe, pc in zip(m_eager.parameters(), m_comp.parameters()))


# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
def fwd_bwd(fn):
    def run():
        xg.grad = rg.grad = None
        fn(xg, rg).sum().backward()

    return run


with limited_threads(1, torch=True):
    t_eager = measure(fwd_bwd(gelu_silu_res), repeat=7).median_ms
    t_comp = measure(fwd_bwd(cg_fn), repeat=7).median_ms
print(
    f"GELU*sigmoid+res fwd+bwd on 256x1024: eager {t_eager:.2f} ms, compiled {t_comp:.2f} ms ({t_eager / t_comp:.1f}x)"
)
# 2 fused kernels instead of ~12 numpy passes and their temporaries: faster where AVX-512 is used (measured ~1.7x on
# this Zen 5 EPYC). The generated code is compiled for the CPU path TINYLEARN_CPU_FEATURES names, and the element-wise
# numpy passes it replaces are not slow (sigmoid is one exp and a division): on the forced AVX2 path the fused pair
# measured about eager's time (0.97 vs 1.05 ms), on the forced scalar path (no SIMD in the generated loops) 1.2x
# slower, so there the claim is only bounded (within 1.5x of eager)
assert t_comp < t_eager if avx512 else t_comp < 1.5 * t_eager, (t_comp, t_eager)

# %% [markdown]
# ## 7. Guards, recompilation, dynamic shapes, and a pattern-hash kernel cache [Q206] [Q237] [Q108] [Q215]
#
# A compiled graph is valid only for what the trace assumed. Every call checks **guards** — each input's shape,
# dtype and requires_grad, the non-Tensor arguments, grad mode, the module's training flag — and a miss
# recompiles (Dynamo's guards, in miniature). Data-dependent Python control flow cannot be captured by a tracer:
# `bool()`/`item()` on a traced value is a **graph break**, reported with a warning naming the op; that call (and
# later calls of that shape class) run eagerly, so the result is never wrong and the function runs exactly once.

# %%
import warnings  # noqa: E402

f_guard = tl.compile(lambda t: F.gelu(t) * 2.0)
for shape in [(4, 8), (4, 8), (16, 8), (4, 8)]:
    f_guard(rand(*shape))
f_guard(tl.Tensor(np.ones((4, 8))))  # float64: another guard
print("stats:", {k: f_guard.stats[k] for k in ("calls", "hits", "misses", "recompiles")})
assert f_guard.stats["misses"] == 3 and f_guard.stats["hits"] == 2  # (4,8) f32, (16,8) f32, (4,8) f64

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
tiny = rand(4, 8)
kern = f_guard.graphs()[0].kernels()[0]
raw = codegen_cpp.build(kern)
hit_ms = measure(lambda: f_guard(tiny), repeat=20).median_ms
raw_ms = measure(lambda: raw(tiny.data), repeat=20).median_ms
print(f"a guard hit on a [4, 8] input: {hit_ms * 1e3:.0f} us per call, of which the kernel call {raw_ms * 1e3:.0f} us")
assert hit_ms < 1.0  # the goal for a cache hit: guard check + dispatch well under a millisecond


def data_dependent(t):
    return t * 2 if t.sum() > 0 else t - 1  # the branch depends on the values


f_break = tl.compile(data_dependent)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = f_break(rand(3, 3))
print(caught[0].message)
assert "graph break" in str(caught[0].message) and close(got.numpy(), data_dependent(rand(3, 3)).numpy())

# %% [markdown]
# **Dynamic shapes** (`mark_dynamic`). A dim marked dynamic is one guard entry for every size. The second size is
# traced once more to check that the graph is the same up to sizes (no size baked into a reshape target or a
# literal); after that a new size re-derives every node's shape with the shape-inference pass, without tracing. A
# policy can also **merge guards** [Q108]: round a dynamic dim up to a power-of-two bucket, or to buckets learned
# from the observed size distribution (an exact search trading padded elements against a compile cost), *when an
# analysis of the graph proves padded rows never mix with real ones* (it refuses any reduction over that dim), and
# slice the padding off. And it **predicts the next shape** [Q215]: a linear fit over the recent sizes when it
# fits well, else the most frequent next size, so `prefetch()` compiles before the call that needs it.
# **Kernels are cached by pattern** [Q206] [Q237]: the key of a fused kernel is its IR with registers renumbered and
# sizes replaced by symbols (loop extents are run-time arguments of the generated C++), so the same
# LayerNorm/GELU/residual pattern in every layer of a model compiles once.

# %%
from tinylearn.compiler.kernel_cache import CACHE  # noqa: E402
from tinylearn.inference.model import TinyGPT  # noqa: E402

tl.manual_seed(0)
gpt = TinyGPT(50, 32, 4, 4, 16).eval()


def four_blocks(h):
    for blk in gpt.blocks:
        h = blk(h, gpt._rope, 0, None, 0)
    return h


CACHE.clear()
c_gpt = tl.compile(four_blocks)
with tl.no_grad():
    hx = rand(2, 8, 32)
    c_gpt(hx)
    out_gpt = c_gpt(hx)
    assert close(out_gpt.numpy(), four_blocks(hx).numpy())
print(c_gpt.kernel_summary())
print("kernel cache:", CACHE.stats)
assert CACHE.stats["builds"] < CACHE.stats["requests"] / 2  # 4 identical blocks: most kernels are cache hits

soft = compiler.compile(lambda t: F.softmax(F.gelu(t * 1.5), -1), dynamic="pow2")
sizes = [3, 5, 6, 7, 9, 12, 13, 5]
for n in sizes:
    xin = compiler.mark_dynamic(rand(n, 16, seed=n), 0)
    assert close(soft(xin).numpy(), F.softmax(F.gelu(xin * 1.5), -1).numpy())
print({k: soft.stats[k] for k in ("traces", "reuses", "padded_calls", "pad_elements", "real_elements")})
print(soft.policy.report())
assert soft.stats["traces"] <= 2 and soft.stats["padded_calls"] >= 4  # 7 sizes, 3 buckets, 2 traces

pred = compiler.compile(lambda t: t.exp() + 1.0)
for n in range(8, 72, 8):  # a growing batch: 8, 16, ..., 64
    pred(compiler.mark_dynamic(rand(n, 4), 0))
    pred.prefetch()  # compile the predicted next size now
print({k: pred.stats[k] for k in ("predictions", "prediction_hits", "prefetched")})
assert pred.stats["prediction_hits"] >= pred.stats["predictions"] - 2  # the linear trend is learned after 2 sizes
# %% [markdown]
# ## 8. Below the kernel: register allocation on a three-address IR [Q68]
#
# The C++ that codegen writes goes to gcc, which does what is left: assign the virtual values of each loop body to
# the 16 (AVX2) or 32 (AVX-512) vector registers, and order the instructions. `tl.compiler.regalloc` does the
# first on a tiny three-address IR with a CFG (a loop computing Σ i² below), the way Chaitin and Briggs taught it:
#
# 1. **liveness** — backward dataflow: live_in(b) = use(b) ∪ (live_out(b) − def(b)), live_out(b) = ∪ live_in(succ),
#    iterated to a fixed point (a loop needs more than one round);
# 2. **interference graph** — an edge between two values live at the same point (at a definition, the defined value
#    interferes with everything live after it);
# 3. **colouring with k registers** — simplify (remove a node of degree < k, push it), spill candidates chosen by
#    cost = uses / degree when none is left, optimistic select (Briggs: a "spilled" node may still find a colour);
# 4. **spilling** — rewrite the code with a store after each definition and a load before each use of a spilled
#    value, and start again.
#
# Linear scan (Poletto & Sarkar; what JITs use) sorts live intervals and spills the one ending last when more than
# k overlap: O(n log n) instead of a graph, at the price of coarser decisions. Both allocations are executed by an
# interpreter with exactly k physical registers and must return what the original program returns.

# %%
p = regalloc.sum_of_squares_loop()
print(p)
live = regalloc.liveness(p)
print(f"liveness: fixed point after {live.rounds} rounds; max values live at one point = {live.max_live()}")
assert live.rounds > 1 and live.max_live() == 5  # the loop's back edge needs a second round
alloc_rows = []
for k in (5, 4, 3, 2):
    for method in (regalloc.chaitin_briggs, regalloc.linear_scan):
        a = method(p, k)
        assert regalloc.run(a.program, (7,), registers=k) == regalloc.run(p, (7,)) == (sum(i * i for i in range(7)),)
        alloc_rows.append((k, a.method, len(a.spilled), a.loads + a.stores))
        print(a.summary())
ra = {(k, m): (s, mem) for k, m, s, mem in alloc_rows}
assert ra[(5, "chaitin-briggs")] == (0, 0)  # k = max live: no spill
assert all(ra[(k, "chaitin-briggs")][1] < ra[(k, "linear-scan")][1] for k in (4, 3))  # fewer loads+stores

# %% [markdown]
# Reading it: with k = 5 registers (the maximum number of values live at once) nothing spills; below that both
# allocators insert loads and stores, and every allocated program still computes Σ i² = 91 with only k registers.
# At k = 4 and 3 the graph colourer moves less memory than linear scan (it spills the loop-invariant `n`, used once
# per iteration, where linear scan spills the accumulator); at k = 2 nothing fits and the heuristics differ the other
# way. Interview answer: liveness → interference → colour with k → spill the cheapest (uses per degree) → repeat;
# linear scan when compile time matters more than code quality (JITs, the first tier of V8/HotSpot).

# %% [markdown]
# ## 9. Instruction scheduling: a list scheduler with latencies and ports [Q281]
#
# A dependence DAG (true dependences weighted by the producer's latency; anti and output dependences when a name is
# reused), a machine model — here Zen 4's FP pipes: FMA latency 4 cycles on 2 ports, add 3 cycles on 2 other ports,
# 2 loads per cycle (Agner Fog's instruction tables; the load latency is an approximation, marked so in
# `listsched.ZEN4`) — and the classic list scheduler: each cycle, of the ready ops, issue those with the longest
# latency-weighted path to the exit first, while issue slots and units last.
#
# The example is the inner loop of every dot product, GEMM and softmax sum: one accumulator makes a chain of
# dependent FMAs (latency-bound); k accumulators give k independent chains. The schedule says how many a core needs:
# latency × ports = 4 × 2 = 8.

# %%
acc_counts = [1, 2, 4, 8, 16]
makespan = {}
for k in acc_counts:
    s = listsched.list_schedule(listsched.dot_product(256, k, loads=False), listsched.ZEN4)
    assert not listsched.check_schedule(s)  # every dependence and latency respected, no port over-subscribed
    lb = listsched.lower_bounds(s.dag, listsched.ZEN4)
    assert s.makespan >= max(lb.values())
    makespan[k] = s.makespan
    print(f"{k:2d} accumulators: {s.makespan:5d} cycles  (critical path {lb['critical_path']}, ports {lb['resource']})")
gain = {k: makespan[1] / makespan[k] for k in acc_counts}
assert 7 < gain[8] <= 8.0 and gain[16] <= gain[8] * 1.05  # 8 = latency x ports; more accumulators buy nothing
chain = listsched.dot_product(64, 4, loads=False, interleaved=False)  # the 4 chains written one after another
in_order = listsched.in_order_schedule(chain, listsched.ZEN4).makespan
listed = listsched.list_schedule(chain, listsched.ZEN4).makespan
print(f"4 chains written back to back: in-order issue {in_order} cycles, list-scheduled {listed} cycles")
assert in_order > 3 * listed
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(acc_counts, [makespan[k] for k in acc_counts], "o-")
ax.set(xscale="log", yscale="log", xlabel="accumulators", ylabel="cycles (256 FMAs, model)", title="list schedule")
plt.show()

# %% [markdown]
# The gain stops at 8 accumulators, 4 cycles × 2 FMA ports, exactly the latency × throughput product; with 16 the
# FMA ports are the bound. This is a **model** (the scheduler's machine description), not a measurement: notebook 08
# measured the same effect on the real core (the GEMM micro-kernel's 12 accumulators hide the FMA latency). An
# out-of-order core re-schedules at run time inside its window; a compiler's list scheduler matters most for the
# in-order parts (GPUs, DSPs) and for code whose dependent chains are longer than the window.

# %% [markdown]
# ## 10. The polyhedral view of a loop nest [Q82] [Q83]
#
# A perfect loop nest runs one statement at every integer point of its iteration domain {x : A x + b ≥ 0}; array
# references are affine maps x → F x + f; two instances depend when they touch the same element and one writes it,
# and the dependence distance d = t − s is lexicographically positive. A loop transformation is a unimodular matrix
# T (interchange = permutation, reversal, skew): **legal iff every T d stays lexicographically positive**; a band
# may be **tiled iff every component of every T d is ≥ 0** (fully permutable); a loop is **parallel iff it carries
# no dependence**. `tl.compiler.polyhedral` computes the dependences of small instances exactly and executes the
# transformed orders, so every legality verdict is checked against a real run.

# %%
conv = polyhedral.conv2d_nest()
print(polyhedral.describe(conv).split("dependences")[0])
deps = polyhedral.dependences(conv)
assert {d.array for d in deps} == {"out"}  # only the reduction on out: inp and wt are read-only
loops = ["n", "k", "c", "oh", "ow", "r", "s"]
swap_spatial = polyhedral.permutation(loops, ["n", "oh", "ow", "k", "c", "r", "s"])  # NHWC-style: pixels outside
swap_reduction = polyhedral.permutation(loops, ["n", "k", "r", "s", "c", "oh", "ow"])  # r, s before c
print("output pixels outside the channel loops:", polyhedral.is_legal(deps, swap_spatial))
print("r, s before c (reorders the float additions):", polyhedral.is_legal(deps, swap_reduction))
relaxed = polyhedral.dependences(conv, relax_reductions=True)
assert polyhedral.is_legal(deps, swap_spatial) and not polyhedral.is_legal(deps, swap_reduction)
assert polyhedral.is_legal(relaxed, swap_reduction)  # += treated as associative: every conv library does this

rec, sten = polyhedral.recurrence_nest(), polyhedral.stencil_nest()
d_rec, d_st = polyhedral.dependences(rec), polyhedral.dependences(sten)
interchange, sk = polyhedral.permutation(["i", "j"], ["j", "i"]), polyhedral.skew(2, 1, 0)
print("recurrence A[i][j] = A[i-1][j] + A[i][j-1]: distances", sorted({d.distance for d in d_rec}))
print("stencil    A[i][j] = A[i-1][j+1] + A[i][j-1]: distances", sorted({d.distance for d in d_st}))
legal_swap, tilable = polyhedral.is_legal(d_st, interchange), polyhedral.fully_permutable(d_st)
print(f"stencil: interchange legal? {legal_swap} | tilable? {tilable}", end=" ")
print("| after skew [[1,0],[1,1]]:", polyhedral.fully_permutable(d_st, sk))
rng = np.random.default_rng(0)
A0 = {"A": rng.integers(0, 9, (6, 7)).astype(np.int64)}
ref = polyhedral.execute(sten, {k: v.copy() for k, v in A0.items()})["A"]
swapped = polyhedral.execute(sten, {k: v.copy() for k, v in A0.items()}, transform=interchange)["A"]
tiled_skewed = polyhedral.execute(sten, {k: v.copy() for k, v in A0.items()}, transform=sk, tile=2)["A"]
tiled_plain = polyhedral.execute(sten, {k: v.copy() for k, v in A0.items()}, tile=2)["A"]
assert not polyhedral.is_legal(d_st, interchange) and not np.array_equal(swapped, ref)  # illegal -> wrong answer
assert not polyhedral.fully_permutable(d_st) and not np.array_equal(tiled_plain, ref)  # tiling without the skew
assert polyhedral.fully_permutable(d_st, sk) and np.array_equal(tiled_skewed, ref)  # skew, then tile: same answer
mm = polyhedral.matmul_nest()
d_mm = polyhedral.dependences(mm)
print("matmul C[i,j] += A[i,p] B[p,j]: distances", sorted({d.distance for d in d_mm}), end=" ")
print("| fully permutable:", polyhedral.fully_permutable(d_mm), "| parallel loops:", polyhedral.parallel_loops(d_mm))
M0 = {"C": np.zeros((4, 4), np.int64), "A": rng.integers(0, 9, (4, 4)), "B": rng.integers(0, 9, (4, 4))}
mm_ref = polyhedral.execute(mm, {k: v.copy() for k, v in M0.items()})["C"]
mm_tiled = polyhedral.execute(mm, {k: v.copy() for k, v in M0.items()}, tile=2)["C"]
assert polyhedral.fully_permutable(d_mm) and polyhedral.parallel_loops(d_mm)[:2] == [True, True]
assert np.array_equal(mm_tiled, mm_ref) and np.array_equal(mm_ref, M0["A"] @ M0["B"])

# %% [markdown]
# What the checks show: in the conv nest only the reduction into `out` carries dependences, so moving the output
# pixels outside the channel loops (an NHWC-style order) is legal, while putting r, s before c is legal only once the
# compiler may re-associate the float sum (the verdict flips with `relax_reductions`). The stencil's distances
# (1, −1) and (0, 1) forbid interchange and plain tiling — and executing those orders really gives a different
# array — until the skew j' = i + j makes them (1, 0) and (0, 1). [Q83] The matmul band (i, j, p) has only the
# distances (0, 0, +): fully permutable, so an affine tiling pass may tile all three loops (checked by running
# the 2×2×2-tiled order), and i, j are parallel. (One level of tiling is executed here; a second level is the same
# legality test applied to the tile loops. Loop *fusion* of two statements is outside this single-statement model.)

# %% [markdown]
# ## 11. Benchmark: eager, tl.compile, torch, torch.compile, tinygrad
#
# `tinylearn bench compiler` runs five rows in one process on the same fp32 inputs (the notebook runs three of them
# to stay within its time budget, on one thread): a GELU·1.5 + residual chain (4M floats, 16 MiB per array),
# softmax over 256-wide rows and an MLP
# block forward. Run time is the median per call after warm-up (every compiler compiles in its warm-up); the
# second table is the first call of a freshly compiled function — tl.compile with an empty kernel cache, tl.compile
# again (trace + passes + kernel cache hit), torch.compile (Inductor, CPU) after a dynamo reset with its FX-graph
# cache off and an empty Inductor cache dir (cold too: otherwise the C++ it compiled in an earlier run is found on
# disk and only its codegen is timed), and tinygrad's three capture calls.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
from tinylearn.compiler import bench as cbench  # noqa: E402

with limited_threads(1, torch=True):  # one thread for everyone: the comparison is per core, and stable under load
    run_t, compile_t = cbench.run(cases=("gelu*1.5+res", "softmax", "mlp block fwd"))
print(run_t)
print(compile_t)
ms = {(r.case, r.impl): r.median_ms for r in run_t.rows if r.median_ms is not None}
cms = {(r.case, r.impl): r.median_ms for r in compile_t.rows if r.median_ms is not None}
cases = run_t.cases()
impls = ["tinylearn eager", "tl.compile", "torch", "torch.compile", "tinygrad"]
fig, ax = plt.subplots(figsize=(8, 3.2))
for i, impl in enumerate(impls):
    vals = [ms.get((c, impl), np.nan) / ms[(c, "torch")] for c in cases]
    ax.bar(np.arange(len(cases)) + (i - 2) * 0.16, vals, 0.16, label=impl)
ax.axhline(1, color="k", lw=0.5)
ax.set(xticks=range(len(cases)), xticklabels=cases, yscale="log", ylabel="time / torch eager", title="run time")
ax.legend(fontsize=7, ncol=5)
plt.show()
speedup = ms[("gelu*1.5+res", "tinylearn eager")] / ms[("gelu*1.5+res", "tl.compile")]
vs_tc = {c: ms[(c, "tl.compile")] / ms[(c, "torch.compile")] for c in cases if (c, "torch.compile") in ms}
print(f"tl.compile vs eager on the chain: {speedup:.1f}x; vs torch.compile per row: "
      + ", ".join(f"{c} {v:.2f}x" for c, v in vs_tc.items()))  # fmt: skip
assert speedup > (1 if avx512 else 0.67)  # the fused chain beats op-by-op eager (AVX2 path: see section 4)
assert all(cms[(c, "tl.compile (cold cache)")] < 5000 for c in cases)  # a cold compile: well under 5 s per row
tcc = {c: cms[(c, "torch.compile")] for c in cases if (c, "torch.compile") in cms}
cold = {c: cms[(c, "tl.compile (cold cache)")] / t for c, t in tcc.items()}
print("cold compile, tl.compile / torch.compile:", {c: round(v, 2) for c, v in cold.items()})
assert all(v < 1 for v in cold.values())  # both cold: our one small C++ file per kernel vs Inductor's codegen + C++
for c in ("softmax", "mlp block fwd"):
    assert (c, "tinygrad") not in ms or ms[(c, "tinygrad")] > ms[(c, "tl.compile")]

# %% [markdown]
# Reading it (the ratios are in the printed tables): on the element-wise chain the fused C++ kernel beats eager
# tinylearn — one pass instead of three — where AVX-512 is used (on the AVX2 path it is within 1.5× of eager, see
# section 4) and is in the range of torch eager and torch.compile; on softmax and the
# MLP block forward, where eager already calls hand-written C++ kernels and BLAS, compiling buys little and the
# generated row kernel is in the range of torch's. Goals of the issue that this table checks, not asserts: ≥ 3×
# eager on fused chains (met only where eager runs several numpy passes), ≤ 1.2× torch.compile per row. A cold
# tl.compile costs a few hundred ms per row (trace, passes, one small C++ file per kernel through gcc), asserted
# under 5 s and below a cold torch.compile's on every row (printed): Inductor's first compile in a process also pays
# for Dynamo and Inductor's start-up (seconds), and each later graph for its codegen and a C++ compile of its
# kernels with their larger headers (about a second each here). With Inductor's caches left on, a rerun finds its
# compiled kernels on disk and its first call drops to tens of milliseconds; ours does the same from
# `TINYLEARN_CACHE_DIR` (the "again" row). tinygrad's TinyJit captures in about the same time as a cold
# tl.compile, and its CPU kernels run the softmax and MLP rows slower than tl.compile here (the printed ratios).

# %% [markdown]
# ## Recap (interview answers)
#
# - **Stages of a DL compiler [Q275] [Q19]**: capture (trace / bytecode) → graph IR → graph passes (shape
#   inference, simplification, folding, CSE, DCE, pattern rewrites) → fusion (point-wise chains, reductions with
#   producers/consumers, epilogues; cost rule) → loop IR + schedule (tile, reorder, vectorize, parallelize, unroll)
#   → codegen (C++/OpenMP, Triton, CUDA) → a compiled artefact cached by hash and guarded by shapes/dtypes.
# - **Graph optimizations [Q36]**: each is a small pass with a test; the executor is then a list of extern calls
#   and fused kernels in dependency order.
# - **Pattern rewriting [Q47] [Q72]**: match a DAG shape with one-use constraints, rewrite to a fused op,
#   let DCE clean up; in MLIR: a `RewritePattern` registered in a pattern set, applied greedily.
# - **Automatic fusion [Q54]**: fuse while no cycle forms through an unfused op; reductions fuse with their
#   producers and consumers; store or recompute a shared producer by bytes moved; matmuls/convs stay library
#   calls with point-wise epilogues.
# - **Schedules [Q19]**: the algorithm says what, the schedule says in which order and on which lanes/cores;
#   every schedule computes the same values (checked here by running two of them).
# - **An inference engine's memory and layout [Q29]**: plan kernel buffers by lifetime into one arena (a planner
#   from notebook 07; in place when an input dies), never alias graph outputs; fold transposes into load strides;
#   dispatch each extern op to the registered fastest kernel.
# - **Autodiff codegen [Q93]**: reverse mode over the forward *graph* with a derivative table that emits graph nodes;
#   extern VJPs for library ops; partition into forward/backward with a saved set; recompute cheap point-wise
#   values instead of saving them; then the same fusion and codegen on the backward (one kernel for a whole
#   point-wise chain's backward here).
# - **Dynamic shapes [Q108] [Q215] [Q206] [Q237]**: guards per shape class; a dynamic dim reuses the graph once a
#   second size shows nothing size-dependent was baked in; buckets (pow2 or learned from the size histogram) merge
#   guards where padding provably cannot leak; a linear/frequency predictor compiles the next size ahead; kernels
#   are keyed by a size-free pattern hash, so identical layers share one compiled kernel.
# - **Register allocation [Q68]**: liveness → interference → colour with k → spill by cost/degree → repeat;
#   linear scan for JITs.
# - **List scheduling [Q281]**: priority = latency-weighted height; issue while ports last; the gain of k
#   accumulators stops at latency × ports.
# - **Polyhedral [Q82] [Q83]**: domains as A x + b ≥ 0, accesses as affine maps, dependence distances; a unimodular
#   T is legal iff every T d stays lexicographically positive, a band tiles iff all T d ≥ 0, skewing makes it so.

# %% [markdown]
# ## Exercises (`exercises/12_compiler/`)
#
# 1. `cse(graph)` — common-subexpression elimination on a traced graph.
# 2. `fusion_groups(graph)` and `recompute_cheaper(...)` — the element-wise fusion pass and its cost rule.
# 3. `row_reduce(x, op)` — generate, compile and call the C++ of a row reduction (NaN-propagating max).
# 4. `list_schedule(block, machine)` — the list scheduler of §9.
#
# Check them with `pytest exercises/12_compiler` (or `tl.check("12_compiler")` in a notebook).
