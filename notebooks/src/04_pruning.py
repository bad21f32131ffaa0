# %% [markdown]
# # 04 · Pruning and sparsity: masks, structured / N:M, schedules, channel surgery, sparse kernels
#
# **Interview questions this notebook answers** (seed 003, questions 26, 46, 95, 97, 128, 152, 167, 173, 175,
# 184, 187):
#
# 1. What is magnitude pruning, how is a mask applied so that fine-tuning does not regrow pruned weights, and how
#    does `torch.nn.utils.prune` implement it (`weight_orig`, `weight_mask`, forward pre-hook)?
# 2. Unstructured vs structured (channels / filters) vs N:M (2:4) sparsity: which one gives real speed, where?
# 3. Which importance score: magnitude, gradient, Taylor |w·g|, SNIP, OBD / Fisher? What does each approximate?
# 4. Write the AGP (gradual pruning) schedule of Zhu & Gupta. Why cubic? Which way does it go?
# 5. How do you choose per-layer pruning ratios (sensitivity analysis)? Why is global pruning risky?
# 6. One-shot vs iterative pruning; what is the lottery-ticket procedure (rewinding)?
# 7. How do you physically remove channels from Conv → BN → Conv / Linear, and is the result exact?
# 8. CSR vs ELL vs BSR: layouts, SpMV / SpMM kernels; at what sparsity does sparse beat dense, and when does
#    sparsity give *no* speedup at all?
#
# The seed's reference answers invert the AGP schedule, drop the masks before fine-tuning (so pruned weights grow
# back), call |θ·g| "GraSP" and quote speedups without measuring. Here everything is measured and checked
# (masks against torch, surgery against the masked model, kernels against dense). `TINYLEARN_FULL=1` = full sizes.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.utils.prune as tprune
from threadpoolctl import threadpool_limits

import tinylearn as tl
from tinylearn.data import load_digits, train_test_split
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.nn.training import evaluate, fit
from tinylearn.prune import finetune, lottery, scores, sensitivity, surgery

FULL = os.environ.get("TINYLEARN_FULL") == "1"
# The digits models do tiny GEMMs: BLAS threads only add wake-up cost (and make float sums order-dependent).
threadpool_limits(1, "blas")
np.set_printoptions(precision=3, suppress=True, linewidth=120)
X, y = load_digits()
Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, seed=0)
EPOCHS = 30 if FULL else 15
print("train", Xtr.shape, "test", Xte.shape)

# %% [markdown]
# ## 1. A mask and a reparameterisation (the part that makes fine-tuning work)
#
# `tl.prune.l1_unstructured(m, "weight", amount)` moves the Parameter to `weight_orig`, stores a buffer
# `weight_mask` and registers a forward pre-hook that sets `m.weight = weight_orig * weight_mask` before every
# forward. Because the product is in the graph, `∂L/∂weight_orig = mask ⊙ ∂L/∂weight`: pruned entries get zero
# gradient and stay zero however long we fine-tune. (Dropping the mask and training the zeroed weight would let the
# optimizer regrow them.) The masks are compared with torch's for the same weights.

# %%
tl.manual_seed(0)
lin = tl.nn.Linear(8, 4)
tlin = torch.nn.Linear(8, 4)
with torch.no_grad():
    tlin.weight.copy_(torch.from_numpy(lin.weight.data))
tl.prune.l1_unstructured(lin, "weight", amount=0.5)
tprune.l1_unstructured(tlin, "weight", amount=0.5)
assert np.array_equal(lin.weight_mask.data, tlin.weight_mask.numpy())
print("parameters:", [n for n, _ in lin.named_parameters()], "| buffers:", [n for n, _ in lin.named_buffers()])
out = lin(tl.Tensor(np.ones((2, 8), np.float32)))
out.sum().backward()
assert np.all(lin.weight_orig.grad.data[lin.weight_mask.data == 0] == 0)
print("mask:\n", lin.weight_mask.data.astype(int))
print("sparsity:", tl.prune.sparsity(lin.weight), "| grad of pruned entries is 0")
tl.prune.remove(lin, "weight")  # bake it in: weight is a plain Parameter again
print("after remove:", [n for n, _ in lin.named_parameters()], "| pruned?", tl.prune.is_pruned(lin))

# %% [markdown]
# **Ties and `amount`.** A float amount is a fraction rounded with Python's `round` (half to even), an int is a
# count. torch selects with `topk`, whose order among equal values is unspecified; tinylearn uses a stable sort
# (among equal magnitudes the lower flat index is pruned first), so masks are identical whenever there are no ties.
# Pruning again composes like torch's `PruningContainer`: the new amount applies to the *remaining* weights.

# %%
w = tl.nn.Linear(10, 1)
tl.prune.l1_unstructured(w, "weight", 0.5)  # 5 of 10 pruned
tl.prune.l1_unstructured(w, "weight", 0.5)  # half of the remaining 5 -> round(2.5) = 2 more
print("zeros after 0.5 then 0.5:", int((w.weight_mask.data == 0).sum()), "of 10")

# %% [markdown]
# ## 2. Unstructured vs structured vs N:M
#
# Same 16×32 weight, 50 % sparsity three ways. Unstructured keeps the most important weights but leaves an
# irregular pattern; structured (`ln_structured(dim=0)`) removes whole output rows (filters / neurons) — a smaller
# dense matrix; 2:4 keeps 2 of every 4 consecutive weights along the input dimension — the regular pattern NVIDIA's
# sparse tensor cores (Ampere+) execute at up to 2× the dense math rate.

# %%
tl.manual_seed(1)
layers = [tl.nn.Linear(32, 16) for _ in range(3)]
for lyr in layers[1:]:
    lyr.weight.data[:] = layers[0].weight.data
tl.prune.l1_unstructured(layers[0], "weight", 0.5)
tl.prune.ln_structured(layers[1], "weight", 0.5, n=2, dim=0)
tl.prune.n_m_sparsity(layers[2], "weight", n=2, m=4)
groups = layers[2].weight_mask.data.reshape(16, 8, 4).sum(-1)
assert np.all(groups == 2)
fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))
for ax, lyr, title in zip(axes, layers, ["unstructured (L1)", "structured (L2 rows)", "2:4 (N:M)"]):
    ax.imshow(np.abs(lyr.weight.data), cmap="viridis")
    ax.set_title(f"{title}: {tl.prune.sparsity(lyr.weight):.0%} zeros")
    ax.set_xlabel("input")
axes[0].set_ylabel("output")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. A dense baseline, and importance scores
#
# Removing weight wᵢ changes the loss by ΔL ≈ −gᵢwᵢ + ½Hᵢᵢwᵢ². **Magnitude** |w| ignores the loss; **gradient** |g|
# ignores the weight; **Taylor** |w·g| is the first-order term (Molchanov et al.); **SNIP** is the same |w·g|,
# normalised, computed *at initialisation* as the sensitivity of a gate c (w → c·w); **OBD** uses the second-order
# term ½Hᵢᵢwᵢ² with the Hessian diagonal approximated by the empirical Fisher (mean of squared per-sample
# gradients) — at a trained minimum g ≈ 0, so the first-order scores are noisy. (|w·g| is *not* GraSP, which scores
# −w·(Hg).) Below: one-shot global pruning of the trained MLP at 80 % by each score, no fine-tuning.
#
# Accuracies after training depend on float summation order (BLAS kernels, SIMD width), so every training cell
# below is run but not compared by nbval; its claims are asserts.

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(0)
mlp = DigitsMLP([256, 256])
hist_dense = fit(mlp, Xtr, ytr, epochs=EPOCHS, lr=3e-3, X_val=Xte, y_val=yte)
dense_acc = evaluate(mlp, Xte, yte)
dense_state = lottery.snapshot(mlp)
print(f"dense MLP 64-256-256-10: test accuracy {dense_acc:.2%}")


def fresh_mlp():
    m = DigitsMLP([256, 256])
    lottery.rewind(m, dense_state)
    return m


results = {}
for method in ["magnitude", "gradient", "taylor", "snip", "fisher"]:
    m = fresh_mlp()
    params = finetune.prunable_weights(m)
    sc = scores.compute_scores(m, params, Xtr[:256], ytr[:256], method, n_fisher_samples=64)
    tl.prune.global_unstructured(params, amount=0.8, importance_scores=sc)
    results[method] = evaluate(m, Xte, yte)
for k, v in results.items():
    print(f"{k:>9}: {v:.1%} at 80% sparsity (one-shot, no fine-tuning)")
assert dense_acc >= 0.95
assert results["magnitude"] > results["gradient"]  # at a trained minimum g ~ 0: |g| alone is a poor score

# %% [markdown]
# ## 4. The AGP schedule
#
# Zhu & Gupta (2017): from step t₀, every Δt steps for n updates,
# **sₜ = s_f + (s_i − s_f)·(1 − (t − t₀)/(nΔt))³** — it *rises* from s_i to s_f, quickly at first (many redundant
# weights) and slowly at the end (each survivor matters). Before t₀ it is s_i, after t₀ + nΔt it is s_f, and between
# updates it holds (a staircase).

# %%
agp = tl.prune.AGPSchedule(initial_sparsity=0.0, final_sparsity=0.9, start_step=20, end_step=220, frequency=20)
steps = np.arange(0, 260)
vals = np.array([agp(int(t)) for t in steps])
assert vals[0] == 0.0 and abs(vals[-1] - 0.9) < 1e-12 and np.all(np.diff(vals) >= 0)
assert abs(agp(120) - (0.9 - 0.9 * (1 - 100 / 200) ** 3)) < 1e-12
smooth = 0.9 - 0.9 * np.clip(1 - (steps - 20) / 200, 0, 1) ** 3
wrong = 0.9 * np.clip(1 - (steps - 20) / 200, 0, 1) ** 3  # the inverted form
plt.figure(figsize=(6, 3))
plt.step(steps, vals, where="post", label="AGPSchedule (updates every 20 steps)")
plt.plot(steps, smooth, "--", label="continuous formula")
plt.plot(steps, wrong, ":", label="inverted (wrong): starts at s_f")
plt.xlabel("step")
plt.ylabel("target sparsity")
plt.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Sensitivity analysis: which layer tolerates how much?
#
# Prune one layer at a time (L1, no fine-tuning), measure accuracy, restore. A per-layer ratio is the largest
# swept sparsity within 2 points of the dense accuracy. Which layer tolerates most is an empirical, per-model
# answer (and training-dependent, so the printed ratios are not compared); asserted: every layer of this
# over-parameterised MLP tolerates at least 50 %, and no layer survives 98 % without a larger drop.

# %%
# NBVAL_IGNORE_OUTPUT
m = fresh_mlp()
lin_layers = [mod for mod in m.modules() if isinstance(mod, tl.nn.Linear)]
named = {f"fc{i + 1} {tuple(lyr.weight.shape)}": (lyr, "weight") for i, lyr in enumerate(lin_layers)}
sweep = [0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98]
scan = sensitivity.sensitivity_scan(m, named, sweep, lambda mod: evaluate(mod, Xte, yte))
ratios = sensitivity.choose_ratios(scan, sweep, baseline=dense_acc, max_drop=0.02)
assert not tl.prune.is_pruned(m)
plt.figure(figsize=(6, 3))
for label, accs in scan.items():
    plt.plot(sweep, accs, "o-", label=label)
plt.xlabel("sparsity of this layer only")
plt.ylabel("test accuracy")
plt.legend(fontsize=8)
plt.tight_layout()
plt.show()
print("chosen per-layer ratios:", ratios)
assert all(r >= 0.5 for r in ratios.values()) and all(r < 0.98 for r in ratios.values())

# %% [markdown]
# ## 6. Fine-tuning: 90 % unstructured, AGP and 2:4
#
# One-shot global magnitude pruning to 90 % and fine-tuning with the masks in place; gradual AGP pruning from the
# dense model to 90 % during training; 2:4 on every layer + fine-tuning. Masks persist through all of it.

# %%
# NBVAL_IGNORE_OUTPUT
FT = 10 if not FULL else 20
curves, table = {}, {}

m = fresh_mlp()
params = finetune.prunable_weights(m)
tl.prune.global_unstructured(params, amount=0.9)
before = evaluate(m, Xte, yte)
h = fit(m, Xtr, ytr, epochs=FT, lr=1e-3, X_val=Xte, y_val=yte)
curves["90% one-shot + fine-tune"] = [before] + h["val_acc"]
table["90% unstructured, one-shot + FT"] = (finetune.global_sparsity(params), before, h["val_acc"][-1])
assert abs(finetune.global_sparsity(params) - 0.9) < 1e-3
assert all(np.all(mod.weight.data[mod.weight_mask.data == 0] == 0) for mod, _ in params)

m = fresh_mlp()
params = finetune.prunable_weights(m)
steps_per_epoch = -(-len(Xtr) // 64)
sched = tl.prune.AGPSchedule(0.0, 0.9, 0, 6 * steps_per_epoch, steps_per_epoch // 2)
h = finetune.train_with_schedule(m, params, Xtr, ytr, sched, epochs=FT, lr=1e-3, X_val=Xte, y_val=yte)
curves["AGP 0 -> 90% while training"] = [dense_acc] + h["val_acc"]
table["90% unstructured, AGP"] = (h["sparsity"][-1], None, h["val_acc"][-1])

m = fresh_mlp()
params = finetune.prunable_weights(m)
for mod, name in params:
    tl.prune.n_m_sparsity(mod, name, n=2, m=4)
before = evaluate(m, Xte, yte)
h = fit(m, Xtr, ytr, epochs=FT, lr=1e-3, X_val=Xte, y_val=yte)
curves["2:4 + fine-tune"] = [before] + h["val_acc"]
table["2:4 (50%), one-shot + FT"] = (finetune.global_sparsity(params), before, h["val_acc"][-1])

plt.figure(figsize=(6, 3))
for label, c in curves.items():
    plt.plot(range(len(c)), c, "o-", ms=3, label=label)
plt.axhline(dense_acc, color="k", lw=0.8, ls="--", label="dense")
plt.xlabel("fine-tuning epoch (0 = right after pruning)")
plt.ylabel("test accuracy")
plt.ylim(0.5, 1.0)
plt.legend(fontsize=8)
plt.tight_layout()
plt.show()
print(f"{'MLP 64-256-256-10':34s} sparsity  after prune  after FT   vs dense ({dense_acc:.1%})")
for k, (s, b, a) in table.items():
    b = f"{b:10.1%}" if b is not None else f"{'(gradual)':>10s}"
    print(f"{k:34s} {s:7.1%}  {b}  {a:8.1%}  {100 * (a - dense_acc):+6.1f} pt")
assert table["90% unstructured, one-shot + FT"][2] >= dense_acc - 0.01
assert table["2:4 (50%), one-shot + FT"][2] >= dense_acc - 0.005

# %% [markdown]
# ## 7. Iterative pruning with rewinding (lottery tickets)
#
# Train → prune 1−(1−s)^(1/R) of the survivors → rewind survivors to their initial values → repeat; then train the
# sparse "ticket". The control keeps the same final mask but re-initialises the weights randomly.

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(5)
ticket = DigitsMLP(128)
init_state = lottery.snapshot(ticket)
params = finetune.prunable_weights(ticket)
hist = lottery.iterative_magnitude_pruning(
    ticket,
    params,
    lambda mod: fit(mod, Xtr, ytr, epochs=5, lr=3e-3),
    rounds=3,
    final_sparsity=0.9,
    evaluate=lambda mod: evaluate(mod, Xte, yte),
)
fit(ticket, Xtr, ytr, epochs=8, lr=3e-3)
tl.manual_seed(6)
control = DigitsMLP(128)
for (mod, _), (cmod, _) in zip(params, finetune.prunable_weights(control)):
    tl.prune.custom_from_mask(cmod, "weight", mod.weight_mask.data)
fit(control, Xtr, ytr, epochs=8, lr=3e-3)
for r in hist:
    print(f"round {r['round']}: accuracy before pruning {r['metric']:.1%}, sparsity after {r['sparsity']:.1%}")
acc_ticket, acc_control = evaluate(ticket, Xte, yte), evaluate(control, Xte, yte)
print(f"ticket (rewound): {acc_ticket:.1%} | same mask, random re-init: {acc_control:.1%}")
assert abs(hist[-1]["sparsity"] - 0.9) < 0.01 and acc_ticket >= 0.85

# %% [markdown]
# ## 8. Structured surgery: a smaller dense model, exactly
#
# Masking a filter does not make anything faster. To get speed, remove it: slice the conv's output channels, the
# BatchNorm's parameters and statistics, and the next layer's input channels (after `Flatten`, the
# `spatial` columns of each channel). Exactness needs the dropped channels to contribute *nothing* downstream — a
# zeroed filter still emits its bias and BN's β — so `mask_channels` also masks the consumer's input slice; then
# `shrink(model)` computes the same function as the masked model.

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(0)
cnn = DigitsCNN(16, 32)
fit(cnn, Xtr, ytr, epochs=8 if not FULL else 15, lr=3e-3)
cnn_dense_acc = evaluate(cnn, Xte, yte)
surgery.mask_channels(cnn, 0.5)
masked_acc = evaluate(cnn, Xte, yte)
fit(cnn, Xtr, ytr, epochs=5 if not FULL else 8, lr=2e-3)
small = surgery.shrink(cnn)
small_acc = evaluate(small, Xte, yte)
print(
    f"DigitsCNN(16, 32): dense {cnn_dense_acc:.1%} | 50% channels masked {masked_acc:.1%} | fine-tuned + shrunk "
    f"{small_acc:.1%} ({100 * (small_acc - cnn_dense_acc):+.1f} pt)"
)
assert masked_acc < cnn_dense_acc and small_acc >= cnn_dense_acc - 0.03  # masking hurts, fine-tuning recovers

# %%
xb = tl.Tensor(Xte[:128])
with tl.no_grad():
    diff = np.abs(small(xb).data - cnn(xb).data).max()
assert diff < 1e-4
print(small)
print(f"shrunk model == masked model (max |diff| < 1e-4): {diff < 1e-4}")
print(f"params {surgery.count_parameters(DigitsCNN(16, 32))} -> {surgery.count_parameters(small)}")

# %% [markdown]
# The speedup, measured on the same surgery applied to a wider DigitsCNN(32, 64) (random weights: time does not
# depend on the values) with a batch of 512, tinylearn's numpy/im2col forward:

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.bench import measure  # noqa: E402

xt = tl.Tensor(np.ascontiguousarray(np.repeat(Xte, 2, axis=0)[:512]))
tl.manual_seed(1)
dense_cnn = DigitsCNN(32, 64).eval()
masked_cnn = DigitsCNN(32, 64).eval()
masked_cnn.load_state_dict(dense_cnn.state_dict())
surgery.mask_channels(masked_cnn, 0.5)
small_cnn = surgery.shrink(masked_cnn)


def fwd(model):
    def run():
        with tl.no_grad():
            return model(xt)

    return run


t_dense, t_masked, t_small = (measure(fwd(mm), repeat=5).median for mm in (dense_cnn, masked_cnn, small_cnn))
print(
    f"forward, batch 512: dense {t_dense * 1e3:.1f} ms | masked {t_masked * 1e3:.1f} ms | shrunk "
    f"{t_small * 1e3:.1f} ms  -> speedup {t_dense / t_small:.2f}x (masking alone: {t_dense / t_masked:.2f}x)"
)
# (timings vary with load: asserted is the work removed, not the time)
assert surgery.count_parameters(small_cnn) < 0.3 * surgery.count_parameters(dense_cnn)

# %% [markdown]
# ## 9. Sparse formats
#
# **CSR** (`indptr`, `indices`, `data`): row i is `data[indptr[i]:indptr[i+1]]`; 4+4 bytes per fp32 nonzero
# (int32 column) + 8 per row. **ELL** pads every row to the longest, stored column-major (`[slot, row]`) so that
# GPU threads owning consecutive rows load consecutive addresses. **BSR** stores dense R×C blocks: fewer indices and
# small dense GEMMs — the format block-structured pruning feeds.

# %%
a = np.array([[1, 0, 0, 2], [0, 0, 0, 0], [0, 3, 4, 0], [5, 0, 0, 6]], dtype=np.float32)
csr, ell, bsr = tl.sparse.CSR.from_dense(a), tl.sparse.ELL.from_dense(a), tl.sparse.BSR.from_dense(a, 2)
print("CSR indptr", csr.indptr, "indices", csr.indices, "data", csr.data)
print("ELL indices (slot x row)\n", ell.indices, "\nELL data\n", ell.data)
print("BSR indptr", bsr.indptr, "block cols", bsr.indices, "blocks", bsr.data.shape)
x = np.arange(4, dtype=np.float32)
for fmt in (csr, ell, bsr):
    assert np.array_equal(fmt.to_dense(), a) and np.allclose(fmt.matmul(x), a @ x)
assert np.allclose(csr.matmul(x, backend="numba"), a @ x)

# %% [markdown]
# ## 10. SpMM: where is the crossover?
#
# `A (sparse, M×K) @ B (dense, K×N)`: dense GEMM does 2MKN flops near peak; CSR does 2·nnz·N flops, but every one
# reads an index and gathers a row of B, so it runs far below peak. It wins only above a crossover sparsity. The
# timings (one thread each, so the comparison is per core) are machine-dependent and not checked by nbval.

# %%
# NBVAL_IGNORE_OUTPUT
M = K = 1024 if FULL else 512
N = 256 if FULL else 128
B = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
tB = torch.from_numpy(B)
sps = [0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99]
times = {"tinylearn CSR (C++)": [], "numpy dense": [], "torch dense": [], "torch.sparse CSR": []}
torch_threads = torch.get_num_threads()
torch.set_num_threads(1)
with threadpool_limits(1):
    for i, s in enumerate(sps):
        rng = np.random.default_rng(i)
        A = rng.standard_normal((M, K)).astype(np.float32)
        A[rng.random((M, K)) < s] = 0
        S = tl.sparse.CSR.from_dense(A)
        tA, tS = torch.from_numpy(A), S.to_torch()
        assert np.allclose(S.matmul(B), A @ B, atol=1e-3)
        times["tinylearn CSR (C++)"].append(measure(lambda S=S: S.matmul(B)).median)
        times["numpy dense"].append(measure(lambda A=A: A @ B).median)
        times["torch dense"].append(measure(lambda tA=tA: tA @ tB).median)
        times["torch.sparse CSR"].append(measure(lambda tS=tS: tS @ tB).median)
torch.set_num_threads(torch_threads)
plt.figure(figsize=(6, 3.2))
for label, ts in times.items():
    plt.plot([100 * s for s in sps], np.array(ts) * 1e3, "o-", label=label)
plt.yscale("log")
plt.xlabel("sparsity of A (%)")
plt.ylabel("ms (log)")
plt.title(f"SpMM ({M}x{K}) @ ({K}x{N}), fp32, 1 thread")
plt.legend(fontsize=8)
plt.tight_layout()
plt.show()
for i, s in enumerate(sps):
    print(
        f"{s:.0%}: CSR is {times['numpy dense'][i] / times['tinylearn CSR (C++)'][i]:.1f}x numpy dense, "
        f"{times['torch.sparse CSR'][i] / times['tinylearn CSR (C++)'][i]:.1f}x torch.sparse"
    )
assert all(t > 0 for ts in times.values() for t in ts)  # every point measured (timings are not asserted)

# %% [markdown]
# ## 11. When sparsity does *not* give speed
#
# - **Masks alone**: `weight_orig * weight_mask` is a dense multiply by zeros (section 8: masked ≈ dense time).
# - **Below the crossover**: at moderate unstructured sparsity (50 %) CSR is *slower* than dense BLAS on a CPU;
#   the index gather and irregular access cost more than the skipped flops. Where the crossover lies depends on the
#   BLAS and the CPU (section 10 measures it on this machine). On GPUs the crossover is even higher.
# - **Small layers**: a digits-sized GEMM is dominated by call overhead; nothing to win.
# - **N:M** needs hardware that executes it (sparse tensor cores, A100+, with cuSPARSELt / `to_sparse_semi_structured`);
#   on a CPU 2:4 is just 50 % unstructured.
# - **Memory-bound vs compute-bound**: SpMV/SpMM save bytes only if the index overhead (4 bytes per nonzero for
#   int32 columns) stays below the dense bytes saved: break-even ≈ 50 % for fp32 values + int32 indices on bytes
#   alone, far higher on time.
# - What reliably pays: **structured** pruning (a smaller dense model, section 8), block sparsity (BSR) at high
#   sparsity, and unstructured sparsity for *storage / bandwidth* (compressed weights) rather than flops.
#
# The full benchmark (`python -m tinylearn bench prune`) adds numba, tinygrad, SpMV/ELL and torch.compile columns.
#
# ## Exercises (`exercises/04_pruning/`, run `pytest exercises/04_pruning`)
#
# 1. `l1_mask(w, amount)` — the unstructured magnitude mask, equal to torch's.
# 2. `global_l1_masks(weights, amount)` — one threshold across layers; see which layer loses most.
# 3. `n_m_mask(w, n, m)` — keep n of every m along the last dim; errors for n > m and m ∤ dim.
# 4. `agp_sparsity(step, ...)` — the Zhu & Gupta schedule with clamping and update frequency.
# 5. `csr_from_dense(a)` — indptr / indices / data, identical to `torch.Tensor.to_sparse_csr`.
# 6. `csr_spmv(indptr, indices, data, x)` — the row loop; handle empty rows.
