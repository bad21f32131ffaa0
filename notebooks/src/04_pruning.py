# %% [markdown]
# # 04 · Pruning and sparsity: masks, structured / N:M, schedules, channel surgery, sparse kernels
#
# **Interview questions this notebook answers** (seed 003; the section answering question n carries `[Qn]`):
#
# - **[Q26]** Pruning: unstructured vs structured, importance scores, sensitivity analysis, gradual (AGP) pruning
#   (§1–§6)
# - **[Q95]** A whole pruning/sparsity system: masks that survive fine-tuning, structured surgery, dynamic sparse
#   training, sparse inference and when it is faster (§1, §6–§11)
# - **[Q46]** Block-sparse storage (BSR) and block-structured speed (§9, §11)
# - **[Q97]** ELLPACK: its layout, why it coalesces, COO/dense → ELL and SpMV (§9)
# - **[Q128] [Q167]** Periodic prune-and-regrow by gradient / momentum (RigL, sparse momentum, SET) (§7b)
# - **[Q152]** Per-layer sparsity under a global budget by evolutionary search (§7b)
# - **[Q173] [Q184]** Choosing the sparse format / instruction from the pattern, re-chosen as the pattern evolves
#   (§7b)
# - **[Q197]** Predicting a sparsity pattern's compression ratio under CSR / ELL / BSR from its statistics with a
#   linear regression, checked against the measured bytes (§7b)
# - **[Q187]** How much recovery fine-tuning, at which learning rate, from the loss rebound (§6)
#
# Also: how `torch.nn.utils.prune` implements masks; why SNIP equals Taylor here; the lottery-ticket procedure;
# CSR vs ELL vs BSR; the crossover sparsity at which CSR beats dense; when sparsity gives no speed at all.
#
# The seed's reference answers invert the AGP schedule, drop the masks before fine-tuning (so pruned weights grow
# back), call |θ·g| "GraSP" and quote speedups without measuring. Here everything is measured and checked
# (masks against torch, surgery against the masked model, kernels against dense). `TINYLEARN_FULL=1` = full sizes.

# %%
import tinylearn as tl  # first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.utils.prune as tprune
from threadpoolctl import threadpool_limits

import tinylearn.prune.bench  # noqa: F401
from tinylearn.bench import import_tinygrad, tinygrad_jit, tinygrad_status
from tinylearn.data import load_digits, train_test_split
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.nn.training import evaluate, fit, predict
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
# ## 1. A mask and a reparameterisation (the part that makes fine-tuning work) [Q26] [Q95]
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
# ## 2. Unstructured vs structured vs N:M [Q26]
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
# ## 3. A dense baseline, and importance scores [Q26]
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


results, masks_by = {}, {}
for method in ["magnitude", "gradient", "taylor", "snip", "fisher"]:
    m = fresh_mlp()
    params = finetune.prunable_weights(m)
    sc = scores.compute_scores(m, params, Xtr[:256], ytr[:256], method, n_fisher_samples=64)
    tl.prune.global_unstructured(params, amount=0.8, importance_scores=sc)
    results[method] = evaluate(m, Xte, yte)
    masks_by[method] = [mod.weight_mask.data.copy() for mod, _ in params]
for k, v in results.items():
    print(f"{k:>9}: {v:.1%} at 80% sparsity (one-shot, no fine-tuning)")
assert dense_acc >= 0.95
assert results["magnitude"] > results["gradient"]  # at a trained minimum g ~ 0: |g| alone is a poor score
# SNIP = Taylor / one global constant -> the same global ranking -> the same masks and the same accuracy
assert all(np.array_equal(a, b) for a, b in zip(masks_by["snip"], masks_by["taylor"]))
assert results["snip"] == results["taylor"]
print("snip and taylor masks are identical (same ranking: SNIP is |w*g| divided by its global sum)")

# %% [markdown]
# **SNIP equals Taylor here by construction.** SNIP's score is `|w·g| / Σ|w·g|`: the Taylor score divided by one
# constant shared by every weight. Global pruning only ranks scores, so the masks are identical (asserted) and so
# is the accuracy. SNIP differs from Taylor only in *when* it is applied — at initialisation, on a single batch,
# before any training (Lee et al. 2019) — and in per-layer use of the normalised score; applied to a trained
# network with a global threshold, as here, it *is* the Taylor criterion.

# %% [markdown]
# ## 4. The AGP schedule [Q26]
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
# ## 5. Sensitivity analysis: which layer tolerates how much? [Q26]
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
# ## 6. Fine-tuning: 90 % unstructured, AGP and 2:4 [Q26] [Q95]
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
# ### How much recovery training, at which learning rate? A rebound-driven controller [Q187]
#
# After pruning, the validation loss jumps by a *rebound* `r = L_pruned − L_dense`. A small controller sets the
# fine-tuning from it: learning rate `lr = lr₀·clip(r / 0.5, 0.3, 3)` (bigger damage, bigger steps), decayed by
# 0.8 per epoch, and it stops when the loss slope over the last two epochs is flatter than `−0.01·r − 10⁻³` per
# epoch (recovered relative to the damage) or after 12 epochs. Validation = the last 300 training images (the
# test set stays untouched). Measured on the trained MLP at four one-shot sparsities:

# %%
# NBVAL_IGNORE_OUTPUT
Xf, yf, Xv, yv = Xtr[:-300], ytr[:-300], Xtr[-300:], ytr[-300:]


def val_loss(model):
    z = predict(model, Xv)
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(yv)), yv]))


L_dense = val_loss(fresh_mlp())
recovery = {}
for sp in [0.5, 0.8, 0.9, 0.95]:
    m = fresh_mlp()
    tl.prune.global_unstructured(finetune.prunable_weights(m), amount=sp)
    losses = [val_loss(m)]
    rebound = losses[0] - L_dense
    lr, ep = 1e-3 * float(np.clip(rebound / 0.5, 0.3, 3.0)), 0
    lr_start = lr
    while ep < 12:
        fit(m, Xf, yf, epochs=1, lr=lr, seed=ep)
        ep += 1
        losses.append(val_loss(m))
        if ep >= 2 and (losses[-1] - losses[-3]) / 2 > -0.01 * rebound - 1e-3:
            break
        lr *= 0.8
    recovery[sp] = (rebound, lr_start, ep, losses[-1], evaluate(m, Xte, yte))
print(f"{'sparsity':>8} {'rebound':>8} {'start lr':>9} {'epochs':>6} {'final val loss':>14} {'test acc':>8}")
for sp, (r_, lr_, ep_, lf, acc) in recovery.items():
    print(f"{sp:8.0%} {r_:8.3f} {lr_:9.1e} {ep_:6d} {lf:14.3f} {acc:8.1%}")
rb = [v[0] for v in recovery.values()]
assert all(a < b for a, b in zip(rb, rb[1:]))  # more sparsity, bigger rebound
assert recovery[0.5][2] < recovery[0.95][2]  # light damage stops early, heavy damage trains longer
assert all(v[3] < v[0] + L_dense for v in recovery.values())  # every run ends below its post-pruning loss
print(
    f"Reading: the rebound grows from {rb[0]:.3f} (50%) to {rb[-1]:.2f} (95%) and the controller spends "
    f"{recovery[0.5][2]} vs {recovery[0.95][2]} epochs; at 90% it reaches {recovery[0.9][4]:.1%} in "
    f"{recovery[0.9][2]} epochs (the fixed schedule above: {FT} epochs)."
)

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
# ## 7b. Prune *and regrow*: dynamic sparse training (RigL, sparse momentum, SET) [Q128] [Q167] [Q95]
#
# Magnitude pruning is one-way: a connection pruned early, when its weight happened to be small, never returns,
# even if the loss later wants it. Dynamic sparse training keeps the sparsity fixed and keeps *moving* the mask:
# every Δt steps each layer drops the `k = f(t)·n_active` active weights of smallest |w| and grows `k` inactive
# ones with the largest **|dense gradient|** (RigL, Evci et al. 2020 — the gradient a zero weight would get if it
# existed), the largest **|momentum of that gradient|** (sparse momentum, Dettmers & Zettlemoyer 2019; smoother than
# one batch's gradient), or at **random** (SET). Grown weights start at 0, so the function does not jump; the update
# fraction decays as `f(t) = α/2·(1 + cos(πt/T_end))` so the mask settles before training ends.
# `tinylearn.prune.rigl` implements it; the trainer multiplies the weights by the mask after every optimizer step
# (the dense gradient is needed, so it does not use the `weight_orig * weight_mask` hook, which zeroes it).
# Below: a 64-128-10 MLP trained from scratch at 90 % sparsity with a random initial mask — kept fixed (static
# sparse training) or moved by each grow rule.

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm.auto import tqdm  # noqa: E402

from tinylearn.prune import rigl  # noqa: E402

dst = {}
for grow in tqdm(["static", "gradient", "momentum", "random"], desc="dynamic sparse training", leave=False):
    tl.manual_seed(0)
    m = DigitsMLP(128)
    ws = [mod.weight for mod in m.modules() if isinstance(mod, tl.nn.Linear)]
    ctl = rigl.RigL(
        ws,
        0.9,
        delta_t=10,
        t_end=1 if grow == "static" else 120,
        alpha=0.3,
        grow="gradient" if grow == "static" else grow,
    )
    init_masks = [mk.copy() for mk in ctl.masks]
    rigl.train_rigl(m, ctl, Xtr, ytr, epochs=8, lr=3e-3)
    moved = sum(int((mk & ~im).sum()) for mk, im in zip(ctl.masks, init_masks)) / sum(int(mk.sum()) for mk in ctl.masks)
    dst[grow] = (evaluate(m, Xte, yte), ctl.global_sparsity(), len(ctl.history), moved)
tl.manual_seed(0)
dense128 = DigitsMLP(128)
fit(dense128, Xtr, ytr, epochs=8, lr=3e-3)
acc_dense128 = evaluate(dense128, Xte, yte)
print(
    f"{'64-128-10 MLP, 8 epochs':34s} {'sparsity':>8s} {'mask updates':>12s} {'final mask new':>14s} {'test acc':>8s}"
)
print(f"{'dense':34s} {0:8.0%} {'-':>12s} {'-':>14s} {acc_dense128:8.1%}")
for k, (a, s, n, mv) in dst.items():
    label = "static random mask" if k == "static" else f"prune + regrow by {k}"
    print(f"{label:34s} {s:8.1%} {n:12d} {mv:14.0%} {a:8.1%}")
assert all(abs(v[1] - 0.9) < 1e-3 for v in dst.values())  # sparsity is constant
assert dst["static"][2] == 0 and all(dst[k][3] > 0.2 for k in ("gradient", "momentum", "random"))
assert dst["gradient"][0] > dst["static"][0] + 0.05  # regrowth rescues the bad random mask
print(
    f"Reading: at 90% sparsity, gradient regrowth reaches {dst['gradient'][0]:.1%} vs {dst['static'][0]:.1%} for the "
    f"fixed random mask (+{100 * (dst['gradient'][0] - dst['static'][0]):.0f} pt); "
    f"{dst['gradient'][3]:.0%} of its final connections were not in the initial mask."
)

# %% [markdown]
# The fixed random mask wastes its 10 % budget on connections the task does not need; regrowth moves it (asserted:
# more than 20 % of the final connections are new, and gradient regrowth beats the static mask by more than 5
# points). Gradient and momentum both pick useful connections; momentum averages out one batch's noise.
#
# ### Per-layer sparsities under one budget, by evolution [Q152]
#
# A genome is the vector of per-layer sparsities;
# the budget `Σ rᵢnᵢ = S·Σnᵢ` is enforced by a repair step (shift all ratios by one constant, found by bisection);
# fitness = accuracy after one-shot L1 pruning of the trained MLP with those ratios (no fine-tuning, so each
# evaluation costs one forward pass); mutation adds Gaussian noise to the ratios, crossover picks each layer's ratio
# from one of two parents, the best two survive (elitism). The uniform genome is in the first generation, so the
# result can only be at least as good as uniform pruning (by construction); the printed gain is what search adds.

# %%
# NBVAL_IGNORE_OUTPUT
evo_rng = np.random.default_rng(0)
ref_model = fresh_mlp()
sizes = np.array([mod.weight.data.size for mod, _ in finetune.prunable_weights(ref_model)], float)
S_BUDGET = 0.9


def repair(r):
    lo, hi = -1.0, 1.0
    for _ in range(50):  # bisection on a common shift so that the weighted mean sparsity is the budget
        mid = (lo + hi) / 2
        if (np.clip(r + mid, 0, 0.995) * sizes).sum() / sizes.sum() < S_BUDGET:
            lo = mid
        else:
            hi = mid
    return np.clip(r + hi, 0, 0.995)


def fitness(r):
    m = fresh_mlp()
    for (mod, name), ri in zip(finetune.prunable_weights(m), r):
        tl.prune.l1_unstructured(mod, name, amount=float(ri))
    return evaluate(m, Xte, yte)


pop = [repair(np.full(3, S_BUDGET))] + [repair(evo_rng.uniform(0.6, 0.99, 3)) for _ in range(7)]
fit_vals = [fitness(r) for r in pop]
uniform_acc = fit_vals[0]
for _gen in range(5 if not FULL else 15):
    order = np.argsort(fit_vals)[::-1]
    elite = [pop[i] for i in order[:2]]
    children = []
    while len(children) < 6:
        a, b = (pop[i] for i in evo_rng.choice(order[:4], 2, replace=False))
        child = np.where(evo_rng.random(3) < 0.5, a, b) + evo_rng.normal(0, 0.05, 3)
        children.append(repair(child))
    pop = elite + children
    fit_vals = [fitness(r) for r in elite] + [fitness(r) for r in children]
best = pop[int(np.argmax(fit_vals))]
print(
    f"budget {S_BUDGET:.0%} of {int(sizes.sum())} weights; per-layer sparsities found: "
    + ", ".join(f"fc{i + 1} {r:.2f}" for i, r in enumerate(best))
)
print(f"one-shot accuracy: uniform {uniform_acc:.1%} -> evolved {max(fit_vals):.1%}")
assert abs((best * sizes).sum() / sizes.sum() - S_BUDGET) < 1e-3 and max(fit_vals) >= uniform_acc

# %% [markdown]
# ### Choosing the storage / instruction format from the pattern, as it evolves [Q173] [Q184]
#
# A sparse kernel is only as good as
# the format the pattern is packed into. A rule-plus-cost-model selector: if every group of 4 along K keeps ≤ 2
# (2:4), the hardware's sparse MMA format applies (values + 2-bit indices, 50 % of the MACs); otherwise compare the
# *measured* bytes of each packing — CSR, ELL, BSR 4×4 — with dense and take the smallest (bytes track the time
# of a memory-bound SpMM). As pruning progresses (AGP raises the sparsity), the choice is re-run at each mask
# update and the weights are re-packed: the layout evolves with the pattern.


# %%
def pack_options(w):
    """bytes of each format that can hold w exactly (2:4 only if the pattern conforms)."""
    nz = w != 0
    opts = {"dense": w.nbytes}
    csr, ell, bsr = tl.sparse.CSR.from_dense(w), tl.sparse.ELL.from_dense(w), tl.sparse.BSR.from_dense(w, 4)
    for name, f in (("CSR", csr), ("ELL", ell), ("BSR 4x4", bsr)):
        assert np.array_equal(f.to_dense(), w)
        opts[name] = sum(getattr(f, a).nbytes for a in ("data", "indices", "indptr") if hasattr(f, a))
    if w.shape[1] % 4 == 0 and nz.reshape(w.shape[0], -1, 4).sum(-1).max() <= 2:
        opts["2:4 sparse MMA"] = w.size // 2 * w.itemsize + w.size // 2 * 2 // 8  # kept values + 2-bit positions
    return opts


def choose_format(w):
    opts = pack_options(w)
    return min(opts, key=opts.get), opts


sel_rng = np.random.default_rng(3)
base_w = sel_rng.standard_normal((256, 256)).astype(np.float32)
patterns = {
    "2:4": base_w * tl.prune.n_m_mask(base_w, 2, 4),
    "4x4 blocks, 75% of blocks pruned": base_w * np.kron(sel_rng.random((64, 64)) < 0.25, np.ones((4, 4))),
    "unstructured 90%": base_w * (sel_rng.random(base_w.shape) > 0.9),
}
picks = {}
for name, w_ in patterns.items():
    picks[name], opts = choose_format(w_.astype(np.float32))
    print(f"{name:34s} -> {picks[name]:15s} " + ", ".join(f"{k} {v / 1024:.0f} KB" for k, v in opts.items()))
assert picks == {"2:4": "2:4 sparse MMA", "4x4 blocks, 75% of blocks pruned": "BSR 4x4", "unstructured 90%": "CSR"}
evolving = []
for s in (0.3, 0.5, 0.7, 0.9, 0.97):  # the same layer along an AGP schedule (magnitude masks)
    w_ = base_w * tl.prune.l1_unstructured_mask(base_w, s)
    evolving.append((s, choose_format(w_.astype(np.float32))[0]))
print("unstructured layer along a pruning schedule:", ", ".join(f"{s:.0%} -> {f}" for s, f in evolving))
assert evolving[0][1] == "dense" and evolving[-1][1] == "CSR"

# %% [markdown]
# ### Predicting the compression ratio from pattern statistics [Q197]
#
# The selector above packs every candidate format at every mask update. A pruning search that scores thousands of
# candidate patterns wants the size **without packing**. **The answer:** each format's size is (nearly) linear in
# a few statistics of the mask, so a linear regression on those statistics predicts it; regress the size relative
# to dense, `nbytes / dense_nbytes` (= 1 / compression ratio), which is the linear quantity:
#
# - CSR `8·nnz + 8·(M+1)` bytes → linear in the **density** (and 1/K);
# - ELL `8·M·max_row_nnz` → linear in the **maximum row fill** (one long row pads every row);
# - BSR 4×4 `(64 + 4)·nblocks + 8·(M/4+1)` → linear in the **block occupancy** (share of 4×4 blocks with a nonzero).
#
# `tinylearn.prune.ratio_model` extracts the features (density, std and max of the row fill, block occupancy, 1/K,
# 4/K), generates training patterns of five kinds (uniform, row-skewed, 4×4 blocks, N:4, channel-pruned; densities
# 2–60 %, four shapes), measures the real `nbytes` of each pattern packed by `tl.sparse`, and fits least squares.
# Three feature sets are compared on 50 held-out patterns (other seeds): all features over the full mask; density
# only (what a naive estimate uses); all features estimated from a random quarter of the block rows (4× cheaper).

# %%
from tinylearn.prune import ratio_model as RM  # noqa: E402

rm_shapes = [(64, 128), (128, 128), (128, 256), (256, 64)]


def rm_patterns(n, seed):
    g = np.random.default_rng(seed)
    out = []
    for i in range(n):
        shape = rm_shapes[g.integers(len(rm_shapes))]
        kind = RM.KINDS[i % len(RM.KINDS)]
        out.append((kind, RM.random_pattern(kind, shape, g.uniform(0.02, 0.6), g)))
    return out


rm_train, rm_test = rm_patterns(100, 0), rm_patterns(50, 1)
rm_variants = {"all features": {}, "density only": {"features": ["density", "inv_k"]}, "1/4 sampled": {"sample": 0.25}}
rm_err, rm_models = {}, {}
for rm_fmt in RM.FORMATS:
    rm_y_train = [RM.measured_nbytes(m, rm_fmt) for _, m in rm_train]
    rm_y_test = np.array([RM.measured_nbytes(m, rm_fmt) for _, m in rm_test])
    for rm_name, rm_kw in rm_variants.items():
        rm_model = RM.CompressionRatioModel(rm_fmt, **rm_kw).fit([m for _, m in rm_train], rm_y_train)
        rm_pred = np.array([rm_model.predict_nbytes(m) for _, m in rm_test])
        rm_err[rm_fmt, rm_name] = np.abs(rm_pred - rm_y_test) / rm_y_test
        rm_models[rm_fmt, rm_name] = rm_model
rm_coef = {rm_fmt: rm_models[rm_fmt, "all features"].coefficients() for rm_fmt in RM.FORMATS}
print("recovered per-format laws (coefficient of nbytes/dense_nbytes):")
print(f"  CSR  density {rm_coef['csr']['density']:.2f} (8 B per nonzero / 4 B dense = 2)")
print(f"  ELL  max row fill {rm_coef['ell']['row_fill_max']:.2f} (8 B per padded slot / 4 B = 2)")
print(f"  BSR  block occupancy {rm_coef['bsr']['block_occupancy']:.2f} ((64 + 4) B per block / 64 B = 1.0625)")
assert abs(rm_coef["csr"]["density"] - 2) < 0.01 and abs(rm_coef["ell"]["row_fill_max"] - 2) < 0.01
assert abs(rm_coef["bsr"]["block_occupancy"] - 1.0625) < 0.01

# %%
# NBVAL_IGNORE_OUTPUT
# (least squares goes through LAPACK: the errors' last digits depend on the BLAS; the asserts are the claim)
print(f"held-out relative error of the predicted nbytes (50 patterns): {'':>4}mean / max")
for (rm_fmt, rm_name), rm_e in rm_err.items():
    print(f"  {rm_fmt.upper():4s} {rm_name:14s} {rm_e.mean():7.2%} / {rm_e.max():7.2%}")
for rm_fmt in RM.FORMATS:
    assert rm_err[rm_fmt, "all features"].max() < 0.01  # the formats' sizes are linear in these statistics
    assert rm_err[rm_fmt, "1/4 sampled"].mean() < 0.10  # a quarter of the scan: within 10 % on average
assert rm_err["csr", "density only"].max() < 0.01  # CSR needs only the density ...
assert rm_err["ell", "density only"].mean() > 0.2 and rm_err["bsr", "density only"].mean() > 0.2  # ... ELL, BSR not
fig, ax = plt.subplots(figsize=(6, 3.5))
rm_y_ell = np.array([RM.measured_nbytes(m, "ell") for _, m in rm_test])
for rm_name, rm_mk in (("all features", "o"), ("density only", "x"), ("1/4 sampled", "+")):
    rm_pred = np.array([rm_models["ell", rm_name].predict_nbytes(m) for _, m in rm_test])
    ax.scatter(rm_y_ell / 1024, rm_pred / 1024, marker=rm_mk, label=rm_name)
ax.plot([0, rm_y_ell.max() / 1024], [0, rm_y_ell.max() / 1024], "k--", lw=1)
ax.set_xlabel("measured ELL KiB")
ax.set_ylabel("predicted KiB")
ax.set_title("ELL size: linear model on pattern statistics")
ax.legend()
plt.show()

# %% [markdown]
# With the right statistic each format's size is predicted to < 1 % (asserted; the regression recovers the byte
# laws: 2.0 per unit density for CSR, 2.0 per unit max row fill for ELL, 1.0625 per unit block occupancy for BSR
# 4×4). Density alone is enough for CSR and wrong for the others (asserted > 20 % mean error for ELL and BSR): a
# row-skewed pattern pads ELL to its longest row, a block pattern at the same density fills far fewer blocks than a
# uniform one. Estimating the statistics from a quarter of the rows costs a quarter of the scan and stays within
# 10 % on average (asserted); its worst cases are sampled maxima (ELL: the longest row missed) and clustered
# patterns, which is where a search should fall back to packing.

# %% [markdown]
# ## 8. Structured surgery: a smaller dense model, exactly [Q95]
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


def tg_chain(tg, model):
    """The same chain in tinygrad (eval-mode BN folded into a scale/shift), jitted; None for unknown layers."""
    ops = []
    for mod in surgery._leaves(model):
        if isinstance(mod, tl.nn.Conv2d):
            W_, b_ = tg.Tensor(mod.weight.data), tg.Tensor(mod.bias.data)
            ops.append(lambda h, W_=W_, b_=b_, mod=mod: h.conv2d(W_, b_, stride=mod.stride, padding=mod.padding))
        elif isinstance(mod, tl.nn.BatchNorm2d):
            sc_ = mod.weight.data / np.sqrt(mod.running_var.data + mod.eps)
            sh_ = mod.bias.data - mod.running_mean.data * sc_
            a_, c_ = tg.Tensor(sc_.reshape(1, -1, 1, 1)), tg.Tensor(sh_.reshape(1, -1, 1, 1))
            ops.append(lambda h, a_=a_, c_=c_: h * a_ + c_)
        elif isinstance(mod, tl.nn.ReLU):
            ops.append(lambda h: h.relu())
        elif isinstance(mod, tl.nn.MaxPool2d):
            ops.append(lambda h, mod=mod: h.max_pool2d(kernel_size=mod.kernel_size))
        elif isinstance(mod, tl.nn.Flatten):
            ops.append(lambda h: h.flatten(1))
        elif isinstance(mod, tl.nn.Linear):
            W_, b_ = tg.Tensor(mod.weight.data.T.copy()), tg.Tensor(mod.bias.data)
            ops.append(lambda h, W_=W_, b_=b_: h @ W_ + b_)
        else:
            raise ValueError(f"no tinygrad twin for {type(mod).__name__}")

    def run(h):
        for op in ops:
            h = op(h)
        return h

    f = tinygrad_jit(run)
    X_ = tg.Tensor(xt.data)
    return lambda: f(X_)


cmp_s = tl.bench.Comparison("DigitsCNN(32, 64) forward, batch 512: dense vs 50% channels removed", repeat=5)
tx_ = torch.from_numpy(xt.data)
with cmp_s.case("forward") as c:
    r_d = c.add("tinylearn dense", fwd(dense_cnn))
    r_m = c.add("tinylearn masked 50%", fwd(masked_cnn))
    r_s = c.add("tinylearn shrunk 50%", fwd(small_cnn))
    with torch.no_grad():
        td_, ts_ = tl.prune.bench.torch_chain(dense_cnn), tl.prune.bench.torch_chain(small_cnn)
        assert np.allclose(ts_(tx_).numpy(), fwd(small_cnn)().data, atol=1e-4)
        r_td = c.add("torch", lambda: td_(tx_))
        r_ts = c.add("torch shrunk 50%", lambda: ts_(tx_))
    g_d = c.add_tinygrad("tinygrad dense", lambda tg: tg_chain(tg, dense_cnn))
    g_s = c.add_tinygrad("tinygrad shrunk 50%", lambda tg: tg_chain(tg, small_cnn))
print(cmp_s.table)
t_dense, t_masked, t_small = r_d.median_ms, r_m.median_ms, r_s.median_ms
print(
    f"Reading: removing half the channels speeds tinylearn up {t_dense / t_small:.2f}x (masking alone: "
    f"{t_dense / t_masked:.2f}x), torch {r_td.median_ms / r_ts.median_ms:.2f}x"
    + (f", tinygrad {g_d.median_ms / g_s.median_ms:.2f}x" if g_d.median_ms and g_s.median_ms else "")
    + f"; tinylearn's shrunk model takes {t_small / r_ts.median_ms:.1f}x torch's shrunk time (loaded machine)."
)
# (timings vary with load: asserted is the work removed, not the time)
assert surgery.count_parameters(small_cnn) < 0.3 * surgery.count_parameters(dense_cnn)

# %% [markdown]
# ## 9. Sparse formats: CSR, ELLPACK, BSR [Q97] [Q46]
#
# **CSR** (`indptr`, `indices`, `data`): row i is `data[indptr[i]:indptr[i+1]]`; 4+4 bytes per fp32 nonzero
# (int32 column) + 8 per row. **ELL** pads every row to the longest, stored column-major (`[slot, row]`) so that
# GPU threads owning consecutive rows load consecutive addresses — one coalesced load per slot, no `indptr`
# indirection and no per-row loop bound, which is why it suits *regular* matrices (rows of similar length:
# stencils, N:M-pruned weights); one long row pads every row to its length. COO → ELL: count entries per row
# (the width = max count), then scatter each (row, col, val) into slot `rank within its row`; `ELL.from_dense`
# does that on the nonzeros, and its SpMV `y[r] = Σ_slot data[slot, r]·x[indices[slot, r]]` (padding: column −1,
# value 0) is checked against dense below. **BSR** stores dense R×C blocks: fewer indices and
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
# ## 10. SpMM: where is the crossover? [Q95]
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
times = {"tinylearn CSR (C++)": [], "numpy dense": [], "torch dense": [], "torch.sparse CSR": [], "tinygrad dense": []}
tg_ok, tg_reason = tinygrad_status()
if tg_ok:
    tg = import_tinygrad()
    f_tg, gB = tinygrad_jit(lambda a, b: a @ b), tg.Tensor(B)
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
        times["tinylearn CSR (C++)"].append(measure(lambda S=S: S.matmul(B)).min)
        times["numpy dense"].append(measure(lambda A=A: A @ B).min)
        times["torch dense"].append(measure(lambda tA=tA: tA @ tB).min)
        times["torch.sparse CSR"].append(measure(lambda tS=tS: tS @ tB).min)
        if tg_ok:  # tinygrad has no sparse tensors: its row is the dense product (one jitted function, same shapes)
            gA = tg.Tensor(A)
            times["tinygrad dense"].append(measure(lambda gA=gA: f_tg(gA, gB), warmup=2).min)
torch.set_num_threads(torch_threads)
if not tg_ok:
    del times["tinygrad dense"]
    print("tinygrad:", tg_reason)
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
print(f"{'sparsity':>8} " + " ".join(f"{k:>20}" for k in times) + "   (ms, best run, 1 thread)")
for i, s in enumerate(sps):
    print(f"{s:8.0%} " + " ".join(f"{1e3 * times[k][i]:20.3f}" for k in times))
speed = [times["numpy dense"][i] / times["tinylearn CSR (C++)"][i] for i in range(len(sps))]
tg_vs_torch = np.array(times["tinygrad dense"]) / np.array(times["torch dense"]) if tg_ok else None
cross = next((s for s, v in zip(sps, speed) if v > 1), None)
# per-flop rate of CSR relative to dense BLAS: CSR does (1 - s) of the flops in 1/speed of dense's time
rate = [(1 - s) * v for s, v in zip(sps, speed)]
print(
    f"Reading: CSR vs numpy dense goes from {speed[0]:.2f}x (50%) to {speed[-1]:.1f}x (99%) the speed; it first "
    f"beats dense at {cross:.0%} here; each CSR flop runs at {min(rate):.2f}-{max(rate):.2f}x dense's rate; "
    "vs torch.sparse CSR it ranges "
    f"{min(a / b for a, b in zip(times['torch.sparse CSR'], times['tinylearn CSR (C++)'])):.1f}x-"
    f"{max(a / b for a, b in zip(times['torch.sparse CSR'], times['tinylearn CSR (C++)'])):.1f}x"
    + (f"; tinygrad's dense product takes {np.median(tg_vs_torch):.1f}x torch dense's time (median)" if tg_ok else "")
    + " (loaded machine)."
)
assert all(t > 0 for ts in times.values() for t in ts)
# At 50% CSR does half the flops yet is no faster than dense (0.45-0.95x measured across runs and SIMD paths, so
# the bound has headroom): every flop pays an index read and a gather and runs well below dense's rate. At 99% the
# skipped work wins (~15x measured).
assert speed[0] < 1.3 and max(rate) < 0.75 and speed[-1] > 1

# %% [markdown]
# ## 11. When sparsity does *not* give speed [Q95] [Q46]
#
# - **Masks alone**: `weight_orig * weight_mask` is a dense multiply by zeros (section 8: masked ≈ dense time).
# - **Below the crossover**: at moderate unstructured sparsity (50 %) CSR does half the flops yet is no faster
#   than dense BLAS on a CPU (slower on most runs), and at 99 % it is faster (both asserted in section 10): each CSR
#   flop runs at under ¾ of dense's rate, because the index gather and irregular access cost more than the skipped
#   flops until most of the work is gone. Where the crossover lies depends on the BLAS, the CPU and the
#   load (section 10 prints it for this machine). On GPUs the crossover is even higher.
# - **Small layers**: a digits-sized GEMM is dominated by call overhead; nothing to win.
# - **N:M** needs hardware that executes it (sparse tensor cores, A100+, with cuSPARSELt / `to_sparse_semi_structured`);
#   on a CPU 2:4 is just 50 % unstructured.
# - **Memory-bound vs compute-bound**: SpMV/SpMM save bytes only if the index overhead (4 bytes per nonzero for
#   int32 columns) stays below the dense bytes saved: break-even ≈ 50 % for fp32 values + int32 indices on bytes
#   alone, far higher on time.
# - What reliably pays: **structured** pruning (a smaller dense model, section 8), block sparsity (BSR) at high
#   sparsity, and unstructured sparsity for *storage / bandwidth* (compressed weights) rather than flops.
#
# The bytes break-even, measured on `tl.sparse.CSR` (fp32 values, int32 column indices, int64 row pointers):

# %%
rng11, csr_ratio = np.random.default_rng(11), {}
for sp in (0.4, 0.5, 0.6, 0.9):
    A11 = rng11.standard_normal((512, 512)).astype(np.float32)
    A11[rng11.random(A11.shape) < sp] = 0
    S11 = tl.sparse.CSR.from_dense(A11)
    assert S11.indices.dtype == np.int32 and S11.data.dtype == np.float32
    csr_ratio[sp] = S11.nbytes / A11.nbytes
print("CSR bytes / dense bytes:", ", ".join(f"{sp:.0%} sparse {r:.3f}" for sp, r in csr_ratio.items()))
assert csr_ratio[0.4] > 1.1 and csr_ratio[0.6] < 0.9 and abs(csr_ratio[0.5] - 1) < 0.02  # break-even at ~50 %
assert csr_ratio[0.9] < 0.21  # 10 % of the values, each with its 4-byte index: ~0.2 of the dense bytes

# %% [markdown]
# The full benchmark (`python -m tinylearn bench prune`) adds numba, SpMV/ELL and torch.compile columns.
#
# ## Recap: interview answers
#
# - **[Q26] Pruning.** Mask + reparameterisation `w = w_orig ⊙ mask` so `∂L/∂w_orig = mask ⊙ ∂L/∂w` and pruned
#   weights stay zero (§1, equal to torch's masks). Scores: |w|, |g|, Taylor |w·g|, SNIP (= Taylor / a constant:
#   identical masks, asserted §3), OBD/Fisher ½Hᵢᵢwᵢ². AGP `s_t = s_f + (s_i − s_f)(1 − (t−t₀)/(nΔt))³` rises
#   (§4). One-shot 90 % + fine-tuning ends within 1 pt of dense, 2:4 within 0.5 pt (§6, asserted).
# - **[Q95] A pruning system.** Masks that survive training, schedules, sensitivity per layer, surgery to a
#   smaller dense model (exact: max |diff| < 1e-4; 30 % of the parameters, asserted §8), dynamic sparse training
#   (§7b), and sparse kernels only above the crossover (CSR no faster than dense at 50 %, faster at 99 %, §10).
# - **[Q46] Block sparsity.** BSR stores dense R×C blocks: one index per block, small dense GEMMs; the selector picks
#   BSR 4×4 for a block-pruned matrix by measured bytes (§7b, asserted).
# - **[Q97] ELLPACK.** Pad rows to the longest, store `[slot, row]`: consecutive threads read consecutive addresses,
#   no `indptr`; good for regular rows, wasteful for skewed ones. SpMV checked against dense (§9).
# - **[Q128] [Q167] Prune-and-regrow.** Every Δt: drop the k smallest |w|, grow k inactive with the largest |dense
#   grad| (RigL) or |grad momentum| (sparse momentum), new weights = 0, `k` decaying as a cosine. At 90 % sparsity
#   gradient regrowth beats a fixed random mask by more than 5 pt with constant sparsity (§7b, asserted).
# - **[Q152] Layer-wise budget by evolution.** Genome = per-layer ratios repaired onto `Σrᵢnᵢ = S·N`; mutation,
#   crossover, elitism; starting from uniform it can only improve (§7b).
# - **[Q187] Recovery budget.** Measure the loss rebound `r` after pruning; set `lr ∝ r` (clipped), decay it, and
#   stop when the validation-loss slope is flat relative to `r`: 50 % sparsity stops earlier than 95 % (asserted,
#   §6).
# - **[Q173] [Q184] Format selection.** 2:4-conforming → sparse MMA; else min measured bytes over dense / CSR / ELL
#   / BSR; re-run at every mask update: an unstructured layer goes dense → CSR as AGP raises its sparsity (§7b).
# - **[Q197] Predicting the compression ratio.** Regress `nbytes / dense_nbytes` (linear, unlike the ratio) on cheap
#   mask statistics — density, row-fill std / max, block occupancy, 1/K — trained on generated patterns against the
#   measured packed bytes: < 1 % held-out error for CSR, ELL and BSR 4×4 (the fit recovers the byte laws 2, 2,
#   1.0625); density alone fails for ELL and BSR (> 20 % mean error); statistics from a quarter of the rows stay
#   within 10 % on average (§7b, asserted).
#
# ## Exercises (`exercises/04_pruning/`, run `pytest exercises/04_pruning`)
#
# 1. `l1_mask(w, amount)` — the unstructured magnitude mask, equal to torch's.
# 2. `global_l1_masks(weights, amount)` — one threshold across layers; see which layer loses most.
# 3. `n_m_mask(w, n, m)` — keep n of every m along the last dim; errors for n > m and m ∤ dim.
# 4. `agp_sparsity(step, ...)` — the Zhu & Gupta schedule with clamping and update frequency.
# 5. `csr_from_dense(a)` — indptr / indices / data, identical to `torch.Tensor.to_sparse_csr`.
# 6. `csr_spmv(indptr, indices, data, x)` — the row loop; handle empty rows.
