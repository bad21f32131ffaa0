# %% [markdown]
# # 01 · Automatic differentiation: building (and using) a reverse-mode engine
#
# **Interview questions this notebook answers** (seed 003, questions 4, 18, 24, 34, 93 and the autodiff parts
# of 64 and 76):
#
# 1. What does `loss.backward()` actually compute, and why is it a sequence of vector-Jacobian products
#    rather than a Jacobian?
# 2. What is the gradient of a broadcast operation (e.g. adding a bias of shape `[C]` to `[N, C]`)?
# 3. Why must backprop visit nodes in reverse *topological* order? What goes wrong with naive recursion
#    when a tensor is used twice, and with very deep graphs?
# 4. Your loss became NaN. How do you find the op that produced the first NaN/Inf? (Q4)
# 5. How do you test a hand-written backward? (gradient checking with central differences, in float64)
# 6. Forward mode vs reverse mode: when is each cheaper? What are dual numbers?
# 7. Why is `.grad` accumulated, and what does "Trying to backward through the graph a second time" mean?
# 8. Where does the time go in a training step of a small framework, and how close to torch can numpy get?
#
# Everything uses `tinylearn` (`tl.Tensor`, `tl.nn`, `tl.optim`, `tl.data`) with torch as the oracle.
# Set `TINYLEARN_FULL=1` for the full benchmark.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

import tinylearn as tl
from tinylearn.autograd import Function, gradcheck, jvp
from tinylearn.autograd import dual as D
from tinylearn.autograd.bench import profile_mlp_step, run
from tinylearn.bench import plot_table
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.nn.training import evaluate, fit

FULL = os.environ.get("TINYLEARN_FULL") == "1"
np.set_printoptions(precision=4, suppress=True, linewidth=110)
tl.manual_seed(0)
torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Computational graphs and the chain rule
#
# Every op records the node (`grad_fn`) that made it. For a scalar loss `L = f_k(… f_1(x))` the chain rule gives
# `dL/dx = J_1ᵀ (J_2ᵀ ( … J_kᵀ · 1))`: reverse mode multiplies from the *left*, so each op only needs its
# **vector-Jacobian product** `v ↦ Jᵀv` (`Function.backward`) — the Jacobian itself is never formed.

# %%
x = tl.Tensor([1.5, -0.5, 2.0], requires_grad=True)
w = tl.Tensor([0.3, 0.8, -1.2], requires_grad=True)
h = (x * w).tanh()
L = (h * h).sum()

node, chain = L.grad_fn, []
while node is not None:
    chain.append(node.name)
    parents = [t for t in node.inputs if isinstance(t, tl.Tensor) and t.grad_fn is not None]
    node = parents[0].grad_fn if parents else None
print("graph, from the loss back:", " <- ".join(chain))

L.backward()
# by hand: dL/dx = 2 h (1 - h^2) w
manual = 2 * h.data * (1 - h.data**2) * w.data
print("autograd dL/dx:", x.grad.numpy())
print("chain rule    :", manual)
assert np.allclose(x.grad.numpy(), manual, atol=1e-6)

# %% [markdown]
# ## 2. VJPs of the core ops and the broadcasting rule
#
# | op | forward | VJP (`g = dL/dz`) |
# |---|---|---|
# | add | z = a + b | da = g, db = g |
# | mul | z = a·b | da = g·b, db = g·a |
# | matmul | Z = A @ B | dA = G @ Bᵀ, dB = Aᵀ @ G |
# | exp | z = eᵃ | da = g·z |
# | sum | z = Σ a | da = g broadcast back |
# | softmax | y = eˣ/Σeˣ | dx = y ⊙ (g − Σ g⊙y) |
#
# **Broadcasting rule**: broadcasting *copies* an input along new or size-1 axes, so its gradient is the
# *sum* over exactly those axes (`tl.autograd.unbroadcast`). A bias `[C]` added to `[N, C]` gets `Σ_n g`.

# %%
a = tl.Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
bias = tl.Tensor(rng.standard_normal((3,)).astype(np.float32), requires_grad=True)
col = tl.Tensor(rng.standard_normal((4, 1)).astype(np.float32), requires_grad=True)
z = (a + bias) * col
g = rng.standard_normal((4, 3)).astype(np.float32)
z.backward(g)
print("shapes of grads:", a.grad.shape, bias.grad.shape, col.grad.shape)

ta, tb, tc = (torch.tensor(t.numpy(), requires_grad=True) for t in (a, bias, col))
((ta + tb) * tc).backward(torch.from_numpy(g))
for mine, ref in ((a, ta), (bias, tb), (col, tc)):
    assert np.allclose(mine.grad.numpy(), ref.grad.numpy(), atol=1e-6)
assert np.allclose(bias.grad.numpy(), (g * col.numpy()).sum(0), atol=1e-6)
print("bias grad == sum over the broadcast axis of g * col:", bias.grad.numpy())

# %% [markdown]
# ## 3. Building the engine: a new op is a `Function` with forward and backward side by side
#
# This is the same mechanism every built-in op uses (`tinylearn/autograd/ops_*.py`). Tensor arguments reach
# `forward` as numpy arrays; `backward` gets `dL/d(output)` and returns one gradient per input.


# %%
class Softplus(Function):
    """y = log(1 + e^x) (stable form), dy/dx = sigmoid(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.logaddexp(0, x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (1 + np.exp(-x))


xs = tl.Tensor(np.linspace(-3, 3, 7), requires_grad=True)
Softplus.apply(xs).sum().backward()
tx = torch.tensor(np.linspace(-3, 3, 7), requires_grad=True)
torch.nn.functional.softplus(tx).sum().backward()
print("softplus grad:", xs.grad.numpy())
assert np.allclose(xs.grad.numpy(), tx.grad.numpy())
assert gradcheck(lambda t: Softplus.apply(t), (tl.Tensor(rng.standard_normal(5), requires_grad=True),))

# %% [markdown]
# The engine (`Tensor.backward`) does three things:
#
# 1. **topological sort** of the graph nodes reachable from the loss (iterative DFS: `tl.autograd.topo_sort`);
# 2. walks them in **reverse** order, so a node runs only after *all* consumers have added their gradient;
# 3. **accumulates** `dL/d(input)` per node (`+=`) and finally into each leaf's `.grad`.

# %%
xx = tl.Tensor([2.0], requires_grad=True)
u = xx * 3.0  # used twice below
v = u * u + u.exp()
order = tl.autograd.topo_sort(
    v.grad_fn, lambda n: [t.grad_fn for t in n.inputs if isinstance(t, tl.Tensor) and t.grad_fn]
)
print("topological order:", [n.name for n in order])

# %% [markdown]
# ## 4. The classic pitfalls
#
# **Reused nodes.** A naive recursive backprop that pushes each incoming gradient straight through a node
# visits `u` once per use and, in `v = u·u + eᵘ`, runs `u`'s backward three times with partial gradients.
# For linear nodes that happens to sum correctly, but it costs one traversal per *path* (exponential in
# depth for diamond-shaped graphs) and breaks hooks and any non-linear bookkeeping. The topological engine
# runs every node exactly once with the complete gradient.


# %%
def naive_backward(t, g, visits):
    """Recursive backprop without a topological order (the pitfall)."""
    if t.grad_fn is None:
        t.naive_grad = getattr(t, "naive_grad", 0) + g
        return
    visits[t.grad_fn.name] = visits.get(t.grad_fn.name, 0) + 1
    grads = type(t.grad_fn).backward(t.grad_fn, g)
    grads = grads if isinstance(grads, tuple) else (grads,)
    for inp, gi in zip(t.grad_fn.inputs, grads):
        if isinstance(inp, tl.Tensor) and inp.requires_grad and gi is not None:
            naive_backward(inp, gi, visits)


def diamond_chain(x, depth):
    for _ in range(depth):
        x = x * 0.5 + x * 0.5  # two paths per level
    return x


for depth in (4, 8, 12):
    xd = tl.Tensor([1.0], requires_grad=True)
    out = diamond_chain(xd, depth)
    visits = {}
    naive_backward(out, np.ones(1), visits)
    out2 = diamond_chain(xd, depth)
    out2.backward(np.ones(1, np.float32))
    print(
        f"depth {depth:2d}: naive recursion ran {sum(visits.values()):6d} node backwards, topo engine ran {3 * depth}"
    )

# %% [markdown]
# **Deep graphs.** Recursion also hits Python's recursion limit (1000 frames by default): a 5000-op chain
# kills the naive version, while the iterative topological sort handles it.

# %%
xd = tl.Tensor([1.0], requires_grad=True)
y = xd
for _ in range(5000):
    y = y * 1.0001
try:
    naive_backward(y, np.ones(1), {})
    print("naive: ok")
except RecursionError:
    print("naive recursion: RecursionError")
y.backward(np.ones(1, np.float32))
print(f"topological engine: dL/dx = {xd.grad.item():.4f} (expected {1.0001**5000:.4f})")
assert abs(xd.grad.item() - 1.0001**5000) < 1e-2

# %% [markdown]
# **Backward twice / accumulation.** Saved activations are freed after backward (memory!), so a second
# backward through the same graph is an error unless `retain_graph=True`; and `.grad` **accumulates** across
# calls (that is what makes gradient accumulation over micro-batches work) — hence `zero_grad()`.

# %%
p = tl.Tensor([1.0, 2.0], requires_grad=True)
loss = (p * p).sum()
loss.backward(retain_graph=True)
loss.backward()
print("grad after two backwards (accumulated):", p.grad.numpy())
try:
    loss.backward()
except RuntimeError as e:
    print("third backward:", str(e).split(".")[0])

# %% [markdown]
# ## 5. Gradient checking
#
# `tl.autograd.gradcheck(fn, inputs)` compares autograd's Jacobian with central differences
# `(f(x+ε) − f(x−ε)) / 2ε` (error O(ε²)) in **float64** — in float32 the rounding error `~1e-7/ε` would
# swamp the truncation error. A wrong backward is caught and located.

# %%
xg = tl.Tensor(rng.standard_normal((3, 4)), requires_grad=True)
wg = tl.Tensor(rng.standard_normal((4, 2)), requires_grad=True)
assert gradcheck(lambda a, b: (a @ b).softmax(1).log().var(0), (xg, wg))


class BadSoftplus(Softplus):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (1 + np.exp(x))  # sign error


try:
    gradcheck(lambda t: BadSoftplus.apply(t), (xg,))
except AssertionError as e:
    print(str(e)[:110], "...")

# %% [markdown]
# ## 6. Which op produced the NaN? (Q4)
#
# `tl.autograd.detect_anomaly()` checks every forward output and every backward gradient and raises naming
# the op. Here the forward is finite but `sqrt` at 0 has an infinite derivative.

# %%
xa = tl.Tensor([0.0, 4.0], requires_grad=True)
out = (xa.sqrt() * 2).sum()
with tl.autograd.detect_anomaly():
    try:
        out.backward()
    except RuntimeError as e:
        print(e)

# %% [markdown]
# ## 7. Forward mode (dual numbers) vs reverse mode
#
# A dual number `a + a'ε` with `ε² = 0` carries a tangent: `f(a + a'ε) = f(a) + f'(a)a'ε`. One forward pass
# gives a **JVP** `J·v` (one input direction); one reverse pass gives a **VJP** `vᵀJ` (one output). For a loss
# `f: Rⁿ → R` the full gradient costs **n** forward-mode passes but **one** reverse pass — which is why
# training uses reverse mode. For `f: R → Rᵐ` it is the other way round.


# %%
def f_dual(x, y):
    return D.exp(x * y) + D.tanh(x - y) ** 2


x0, y0 = 0.3, -0.7
val, dfdx = jvp(f_dual, (x0, y0), (1.0, 0.0))
_, dfdy = jvp(f_dual, (x0, y0), (0.0, 1.0))
xt, yt = tl.Tensor(np.array(x0), requires_grad=True), tl.Tensor(np.array(y0), requires_grad=True)
((xt * yt).exp() + (xt - yt).tanh() ** 2).backward()
print(f"forward mode (2 passes): df/dx={dfdx:.6f}, df/dy={dfdy:.6f}")
print(f"reverse mode (1 pass)  : df/dx={xt.grad.item():.6f}, df/dy={yt.grad.item():.6f}")
assert abs(dfdx - xt.grad.item()) < 1e-9 and abs(dfdy - yt.grad.item()) < 1e-9

# %%
ns = np.array([1, 4, 16, 64, 256, 1024])
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.loglog(ns, ns, "o-", label="forward mode: n JVP passes")
ax.loglog(ns, np.ones_like(ns), "s-", label="reverse mode: 1 VJP pass")
ax.set_xlabel("number of inputs n (f: Rⁿ → R)")
ax.set_ylabel("passes for the full gradient")
ax.legend()
ax.set_title("cost of a gradient")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 8. Training an MLP on digits (≥ 97 % test accuracy)
#
# `tl.data.load_digits()` gives the 1797 8×8 scikit-learn digits as `[N, 1, 8, 8]` float32 in [0, 1];
# `tl.nn.training.fit` is a plain loop (seeded `DataLoader`, `cross_entropy`, `zero_grad`, `backward`, `step`)
# with a tqdm progress bar.
#
# Trained accuracies depend on float summation order (BLAS kernels, SIMD width, threads), so the training cells
# are not compared by nbval: their claims are the asserts.

# %%
X, yl = tl.data.load_digits()
Xtr, Xte, ytr, yte = tl.data.train_test_split(X, yl, test_size=0.25, seed=0)
print("train", Xtr.shape, "test", Xte.shape)

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(0)
mlp = DigitsMLP(hidden=128)
hist_mlp = fit(mlp, Xtr, ytr, epochs=20, lr=3e-3, batch_size=64, seed=0, progress=True, X_val=Xte, y_val=yte)
acc_mlp = evaluate(mlp, Xte, yte)
print(f"MLP test accuracy: {acc_mlp:.3f}")
assert acc_mlp >= 0.97

# %% [markdown]
# ## 9. …and a small CNN (Conv-BN-ReLU-Pool ×2 → Linear)

# %%
tl.manual_seed(0)
cnn = DigitsCNN(c1=8, c2=16)
print(cnn)

# %%
# NBVAL_IGNORE_OUTPUT
hist_cnn = fit(cnn, Xtr, ytr, epochs=8, lr=3e-3, batch_size=64, seed=0, progress=True, X_val=Xte, y_val=yte)
acc_cnn = evaluate(cnn, Xte, yte)
print(f"CNN test accuracy: {acc_cnn:.3f}")
assert acc_cnn >= 0.95

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for name, hist in (("MLP", hist_mlp), ("CNN", hist_cnn)):
    axes[0].plot(hist["loss"], label=name)
    axes[1].plot(hist["val_acc"], label=f"{name} test")
axes[0].set_yscale("log")
axes[0].set_title("training loss")
axes[1].set_title("test accuracy")
for a_ in axes:
    a_.set_xlabel("epoch")
    a_.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 10. Speed: one training step vs torch and tinygrad
#
# The framework overhead per op is a few microseconds of Python; for the MLP 784-512-512-10 step the time
# is dominated by the six GEMMs (forward + two per layer backward), so numpy's BLAS decides the race.
# Measured side by side in this process (median of 10 after warm-up, threads capped equally).

# %%
# NBVAL_IGNORE_OUTPUT
cases = ("mlp", "cnn", "overhead") if FULL else ("mlp", "overhead")
table = run(full=FULL, cases=cases)[0]
print(table.to_text())
plot_table(table)
plt.show()
assert {"tinylearn", "torch"} <= {r.impl for r in table.rows}

# %% [markdown]
# Where does the tinylearn step spend its time? cProfile over 20 steps: the GEMMs inside `Linear.forward` /
# `Linear.backward` dominate; graph bookkeeping (`apply`, `run_backward`, `_make`) is a few percent. The
# optimizer update is memory-bound: numpy needs 3-8 passes over every parameter, so `tl.optim` uses a fused
# one-pass C++ kernel (`tinylearn._C.optim.sgd_step` / `adam_step`, one read and one write per element) when
# the extension is built — `backend="numpy"` keeps the readable version.

# %%
# NBVAL_IGNORE_OUTPUT
prof = profile_mlp_step(steps=20, top=10)
print(prof)
assert "function calls" in prof

# %% [markdown]
# ## Exercises (`exercises/01_autodiff/`)
#
# Run `pytest exercises/01_autodiff` (your `stubs.py`) — compare with `--impl=reference`.
#
# 1. `unbroadcast` — the VJP of broadcasting.
# 2. `matmul_backward` — dA and dB of `A @ B`.
# 3. `softmax_backward` — without forming the Jacobian.
# 4. `topo_sort` — iterative, each node after its parents, 20 000 deep.
# 5. `numerical_grad` — central differences.
# 6. `sgd_momentum_step` — torch's SGD with momentum / Nesterov / weight decay.
# 7. `linear_backward` — dX, dW, db for `y = x Wᵀ + b`.
# 8. `cross_entropy_backward` — fused and stable for logits of 1e4.
