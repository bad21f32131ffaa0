# %% [markdown]
# # 11 · Mixed precision and training memory: autocast, loss scaling, FP4/INT2/MX, checkpointing, a memory model
#
# **Interview questions this notebook answers** (seed 003: 64, 74, 81, 102b, 105, 119, 148, 169, 219, 239, 250, 253):
#
# 1. Why does fp16 training need loss scaling, and how does a dynamic loss scaler decide the scale?
#    [Q81] How is a NaN/Inf step detected, skipped, and -- after N in a row -- answered by falling back to fp32?
#    [Q253] Why keep one loss scale per layer group, each backing off and growing on its own?
# 2. What does `autocast` actually run in low precision, and what stays in fp32? What is bf16 and how do you round
#    to it?
# 3. [Q74] What do FP4 (E2M1) and INT2 look like, how does a straight-through estimator train through them, and
#    why do MX formats share one exponent per 32 elements?
# 4. [Q148] How do you use a Hessian-trace estimate (Hutchinson) to give sensitive layers -- weights and
#    activations -- more bits?
# 5. [Q64] [Q119] [Q169] Activation checkpointing: what does it cost, what does it save, how many segments (why
#    sqrt(2n) here, not sqrt(n)), and which layers to recompute under a memory budget (greedy by memory saved per
#    unit of recompute; exact knapsack DP with the recompute working set)? [Q239] On several nodes, how does a
#    priority alpha*m - beta*r - gamma*c weigh the communication a recomputation repeats? [Q102b] How much does saving a
#    low-rank factorisation of an activation instead of the activation save, for what gradient error?
#    [Q250] Which saved activations to keep in fp32, bf16 or int8 under a byte budget, by gradient sensitivity?
# 6. [Q64] [Q119] How much memory does training take? Params, grads, Adam states, activations, backward workspace
#    -- for the digits MLP/CNN and TinyGPT here (predicted vs measured, fp32 and bf16, SGD and Adam) and for 7B /
#    70B models (with and without FlashAttention). [Q219] How do you keep sharded Adam states in bf16/fp16/int8
#    without the rounding errors accumulating (error feedback)?
# 7. [Q105] What does bf16 buy on this hardware (step time, memory), for tinylearn, torch and tinygrad, and how
#    does a per-layer precision planner combine stability metrics, measured speed and memory pressure?
#
# Everything is `tinylearn.amp`, `tl.autograd.checkpoint` and `tl.memory.estimate / measure_peak`.

# %%
import tinylearn as tl  # first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import contextlib
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from tinylearn import amp
from tinylearn.inference import TinyGPT
from tinylearn.memory import estimate, measure_peak, transformer_memory
from tinylearn.nn.models import DigitsCNN, DigitsMLP

F = tl.nn.functional
FULL = os.environ.get("TINYLEARN_FULL") == "1"
X_all, y_all = tl.data.load_digits()
n_train = 1400
Xtr, ytr, Xte, yte = X_all[:n_train], y_all[:n_train], X_all[n_train:], y_all[n_train:]
print("digits:", X_all.shape, "train", n_train, "test", len(yte))

# %% [markdown]
# ## 1. Three float formats
#
# | format | bits (sign / exponent / mantissa) | max | smallest normal | smallest subnormal | epsilon |
# |---|---|---|---|---|---|
# | float32 | 1 / 8 / 23 | 3.4e38 | 1.2e-38 | 1.4e-45 | 1.2e-7 |
# | bfloat16 | 1 / 8 / 7 | 3.4e38 | 1.2e-38 | 9.2e-41 | 7.8e-3 |
# | float16 | 1 / 5 / 10 | 65504 | 6.1e-5 | 2^-24 = 5.96e-8 | 9.8e-4 |
#
# bf16 is the top half of a float32: same range, 3 significant digits. Rounding float32 -> bf16 to nearest-even
# is integer arithmetic on the bits: add `0x7FFF + lsb` and shift right by 16 (`tl.amp.bf16_bits`); it agrees
# bit for bit with torch. fp16 has 3 more mantissa bits but overflows above 65504 (values from 65520 up round to
# inf) and rounds to zero at and below 2^-25 = 2.98e-8, half its smallest subnormal 2^-24 (2^-25 itself is a tie
# between 0 and 2^-24 and goes to the even code, 0); between 2.98e-8 and 5.96e-8 it rounds *up* to 2^-24.

# %%
x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 3.14159265, 70000.0, 1e-8], np.float32)
bits = amp.bf16_bits(x)
ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
with np.errstate(over="ignore"):
    half = x.astype(np.float16)
for v, b, h in zip(x, bits, half):
    print(f"{v:>14.8g}  bf16 bits 0x{b:04X} -> {amp.bf16_bits_to_float32(np.uint16(b)):<12.8g} fp16 -> {h:.8g}")
assert np.array_equal(bits, ref)
assert amp.round_to_bf16(np.float32(1 + 2**-8)) == 1.0  # a tie: rounds to the even mantissa
assert np.isinf(half[4]) and half[5] == 0  # fp16 overflow and underflow; bf16 keeps both
# the fp16 underflow threshold, with torch's rounding: 2^-25 -> 0 (tie to even), anything above it -> 2^-24
probe = torch.tensor([2.0**-25, np.nextafter(np.float32(2.0**-25), np.float32(1)), 4e-8, 5.9e-8], dtype=torch.float32)
probe16 = probe.half().float().tolist()
print("fp16(2^-25, next float32 above it, 4e-8, 5.9e-8) =", probe16)
assert probe16 == [0.0, 2.0**-24, 2.0**-24, 2.0**-24] and torch.tensor(2.0**-24).half().item() == 2.0**-24
assert torch.tensor([65519.0, 65520.0]).half().tolist() == [65504.0, float("inf")]

fi = amp.finfo(amp.bfloat16)
assert float(fi.max) > 3.3e38 and float(fi.eps) == 2.0**-7
print("ml_dtypes bfloat16: max", fi.max, "eps", fi.eps)

# %% [markdown]
# ## 2. Autocast: which ops run in low precision, which fall back to fp32 [Q81]
#
# `with tl.autocast(dtype="bfloat16")` routes every op through one hook in `Function.apply` that looks it up in
# its op lists (`tl.amp.LOWER_PRECISION_OPS`, `tl.amp.FP32_OPS`, `tl.amp.TINYLEARN_FP32_OPS`):
#
# - **lower precision** -- matmul / linear / conv2d: inputs cast to bf16, products accumulated in fp32, output
#   stored in bf16 (torch's CPU list also has bmm, addmm, conv1d/3d, conv_transpose, SDPA, ...);
# - **fp32** -- softmax, log_softmax, layer_norm, sum, cross-entropy, exp/log/pow: inputs cast up, output fp32.
#   These are on torch's CUDA "autocast to float32" list (which also has the other losses, cumsum/prod, norms,
#   group_norm, ...). On CPU torch keeps only the losses in fp32 and runs softmax/layer_norm/sum in the input
#   dtype with fp32 math inside: the results differ by bf16 rounding.
# - **tinylearn-only fp32** -- batch_norm, mean, var are on *no* torch autocast list (torch runs them in the input
#   dtype; cuDNN batch norm keeps its statistics in fp32); tinylearn's kernels for them have no bf16 path with fp32
#   accumulation, so it runs them in fp32.
# - everything else (add, relu, pooling, reshape) runs in whatever dtype arrives.
#
# The casts are differentiable, so the fp32 parameters ("master weights") receive fp32 gradients. The fp32 list is
# the static half of "fall back to a safe precision" (Q81): ops whose bf16 result would overflow or lose the sum
# never run in bf16; the GradScaler below is the dynamic half.

# %%
print("lower precision:", sorted(amp.LOWER_PRECISION_OPS))
print("fp32:          ", sorted(amp.FP32_OPS))
print("tinylearn fp32:", sorted(amp.TINYLEARN_FP32_OPS))
# the CPU difference, checked: the same bf16 input under tinylearn's autocast and torch's CPU autocast
xa = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
ta = torch.from_numpy(xa).bfloat16()
with tl.autocast(dtype="bfloat16"):
    ha = tl.Tensor(xa) @ tl.Tensor(np.eye(8, dtype=np.float32))  # a bf16 activation
    tl_dt = {"softmax": F.softmax(ha, -1).dtype, "layer_norm": F.layer_norm(ha, (8,)).dtype,
             "sum": ha.sum().dtype, "mean": ha.mean().dtype, "relu": ha.relu().dtype}  # fmt: skip
with torch.autocast("cpu", dtype=torch.bfloat16):
    tc_dt = {"softmax": torch.softmax(ta, -1).dtype, "layer_norm": torch.nn.functional.layer_norm(ta, (8,)).dtype,
             "sum": ta.sum().dtype, "mean": ta.mean().dtype, "relu": ta.relu().dtype}  # fmt: skip
print("tinylearn autocast:", {k: str(v) for k, v in tl_dt.items()})
print("torch CPU autocast:", {k: str(v).replace("torch.", "") for k, v in tc_dt.items()})
assert all(tl_dt[k] == np.float32 for k in ("softmax", "layer_norm", "sum", "mean")) and tl_dt["relu"] == amp.bfloat16
assert all(v == torch.bfloat16 for v in tc_dt.values())  # torch CPU: input dtype for all of them

# %%
# NBVAL_IGNORE_OUTPUT
# the loss digits depend on the BLAS/oneDNN kernels of this CPU (bf16 GEMMs differ between AVX2 and AVX512-BF16)
tl.manual_seed(0)
mlp = DigitsMLP((64, 32))
tm = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                         torch.nn.ReLU(), torch.nn.Linear(32, 10))  # fmt: skip
with torch.no_grad():
    for tp, p in zip(tm.parameters(), mlp.parameters()):
        tp.copy_(torch.from_numpy(p.data))
xb, yb = tl.Tensor(Xtr[:128]), tl.Tensor(ytr[:128])
with tl.autocast(dtype="bfloat16"):
    out = mlp(xb)
    loss = F.cross_entropy(out, yb)
with torch.autocast("cpu", dtype=torch.bfloat16):
    tout = tm(torch.from_numpy(xb.data))
    tloss = torch.nn.functional.cross_entropy(tout, torch.from_numpy(yb.data))
print("tinylearn:", out.dtype, loss.dtype, f"loss {loss.item():.6f}")
print("torch:    ", tout.dtype, tloss.dtype, f"loss {tloss.item():.6f}")
same = np.mean(out.data.astype(np.float32) == tout.float().detach().numpy())
print(f"logits bit-identical to torch's: {same:.1%}")
assert out.dtype == amp.bfloat16 and loss.dtype == np.float32
tl.testing.assert_close(out.data.astype(np.float32), tout.float().detach().numpy(), "bfloat16")

# %% [markdown]
# ## 3. fp16 without loss scaling underflows; with a GradScaler it trains like fp32 [Q81]
#
# fp16's smallest subnormal is 2^-24 = 5.96e-8 and everything at or below 2^-25 = 2.98e-8 rounds to 0. To make
# the effect visible on a model this small we multiply the loss by 2^-20 (gradients of order 1e-9 to 1e-11 --
# what long sequences of small per-token losses or very deep nets
# produce). Adam is invariant to the gradient scale (with a tiny eps), so fp32 trains exactly as without the
# factor. Under `autocast("float16")` the gradient that enters the fp16 part of the graph is rounded to fp16:
# without scaling it is 0 everywhere and nothing learns. The GradScaler multiplies the loss by S, checks the
# unscaled gradients for Inf/NaN (skipping that step and halving S), and doubles S after `growth_interval`
# clean steps -- the same state machine as `torch.amp.GradScaler` (tests/amp/test_amp.py compares the sequences).


# %%
# NBVAL_IGNORE_OUTPUT
def train_digits(mode: str, epochs: int = 6, tiny: float = 2.0**-20):
    tl.manual_seed(0)
    model = DigitsMLP((128,))
    opt = tl.optim.Adam(model.parameters(), lr=3e-3, eps=1e-30)
    scaler = amp.GradScaler(init_scale=2.0**16, growth_interval=20) if mode == "fp16+scaler" else None
    loader = tl.data.DataLoader(Xtr, ytr, batch_size=64, shuffle=True, seed=0)
    zero_frac, scales = [], []
    for _ in range(epochs):
        for xb_, yb_ in loader:
            opt.zero_grad()
            if mode == "fp32":
                loss = F.cross_entropy(model(xb_), yb_) * tiny
            else:
                with tl.autocast("float16"):
                    loss = F.cross_entropy(model(xb_), yb_) * tiny
            if scaler:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                zero_frac.append(np.mean(model.net[-1].weight.grad.data == 0))
                scaler.step(opt)
                scaler.update()
                scales.append(scaler.get_scale())
            else:
                loss.backward()
                zero_frac.append(np.mean(model.net[-1].weight.grad.data == 0))
                opt.step()
    with tl.no_grad():
        acc = float(np.mean(model(tl.Tensor(Xte)).data.argmax(-1) == yte))
    return acc, float(np.mean(zero_frac)), scales


results = {m: train_digits(m) for m in ("fp32", "fp16", "fp16+scaler")}
for m, (acc, zf, _) in results.items():
    print(f"{m:12s} test accuracy {acc:.3f}   fraction of exactly-zero grads (last layer) {zf:.2f}")
assert results["fp16"][1] > 0.99 and results["fp16"][0] < 0.3  # everything underflowed: nothing learned
assert results["fp16+scaler"][0] > results["fp32"][0] - 0.03 and results["fp32"][0] > 0.85

# %%
# NBVAL_IGNORE_OUTPUT
sc = results["fp16+scaler"][2]
plt.figure(figsize=(6, 2.5))
plt.semilogy(sc)
plt.xlabel("step")
plt.ylabel("loss scale S")
plt.title("dynamic loss scale (x2 every 20 clean steps, /2 on overflow)")
plt.tight_layout()
plt.show()
assert max(sc) > 2.0**16  # the scale grew

# %% [markdown]
# The update rule on a scripted sequence of clean / overflowing steps (exact, like `tests/amp/test_amp.py`), with the
# fallback of Q81: `fallback_after=2` consecutive skipped steps set `fell_back`, and from then on
# `scaler.autocast_dtype("float16")` returns None -- the loop runs the step in fp32 (the safe precision).

# %%
scaler = amp.GradScaler(init_scale=1024.0, growth_interval=2, fallback_after=2)
p = tl.nn.Parameter(tl.ones(2))
opt = tl.optim.SGD([p], lr=0.1)
seq, fell = [], []
for bad in [0, 0, 1, 0, 0, 0, 1, 1, 0]:
    scaler.scale((p * 0).sum())
    p.grad = tl.Tensor(np.array([np.inf if bad else 1.0, 1.0], np.float32))
    scaler.step(opt)
    scaler.update()
    seq.append(scaler.get_scale())
    fell.append(scaler.fell_back)
print(seq, "skipped steps:", scaler.n_skipped, "| fell back to fp32 after step", fell.index(True))
assert seq == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0, 1024.0, 512.0, 512.0] and scaler.n_skipped == 3
assert fell.index(True) == 7 and scaler.autocast_dtype("float16") is None  # the 2nd overflow in a row (steps 6, 7)

# %% [markdown]
# ### One loss scale per layer group [Q253]
#
# One global scale S has to keep the *largest* gradient of every layer below 65504, so a layer with large
# gradients (an embedding, the last layer, a layer during a spike) pins S low, and a layer whose gradients are
# 1e-10 of those then sits below fp16's 2^-25 flush-to-zero threshold even after scaling: its gradient underflows
# and it stops learning, with no Inf to signal it. `tl.amp.PerGroupScaler(n_groups)` keeps one scale S_l per
# parameter group (the gradient entering group l is multiplied by S_l -- a backward hook at the group boundary --
# and unscaled in fp32 before the step) and runs the GradScaler rule on each group's own overflow flag: halve S_l
# and skip that group's step on Inf/NaN in *its* gradient, double S_l after `growth_interval` clean steps of that
# group. Each scale follows its own gradient distribution: the large group's settles where its largest values
# approach 65504 (it overflows and backs off now and then, like the global one), the small group's keeps doubling
# every 10 clean steps without ever overflowing. Below, three groups with gradients of scale
# 1e2, 1e-3 and 1e-10 (200 steps of Gaussian draws, 512 per group) go through fp16 (`amp.fp16_grad_roundtrip`:
# fp32 g -> fp16(g S) -> fp32 / S): under the global scaler the small group is almost entirely zero; with
# per-group scales none of it is.

# %%
rng253 = np.random.default_rng(253)
mags253 = {"large (1e2)": 1e2, "medium (1e-3)": 1e-3, "small (1e-10)": 1e-10}
glob253 = amp.PerGroupScaler(1, init_scale=2.0**16, growth_interval=10)  # the global scaler: one group
per253 = amp.PerGroupScaler(3, init_scale=2.0**16, growth_interval=10)
zeros253 = {"global": np.zeros(3), "per-group": np.zeros(3)}
pairs253 = []  # (true, global roundtrip, per-group roundtrip) of the small group, last 100 steps
for step in range(200):
    g253 = [(m * rng253.standard_normal(512)).astype(np.float32) for m in mags253.values()]
    outs_g = [amp.fp16_grad_roundtrip(g, glob253.get_scales()[0]) for g in g253]
    glob253.update([any(o[1] for o in outs_g)])  # any overflow anywhere backs off the one scale
    outs_p, inf_p = per253.roundtrip(g253)
    per253.update(inf_p)
    if step >= 100:  # after the scales settled
        zeros253["global"] += [np.mean(o[0] == 0) / 100 for o in outs_g]
        zeros253["per-group"] += [np.mean(o == 0) / 100 for o in outs_p]
        pairs253.append((g253[2], outs_g[2][0], outs_p[2]))
print("global scale:", glob253.get_scales(), " skipped steps:", glob253.n_skipped)
print("per-group scales:", per253.get_scales(), " skipped steps per group:", per253.n_skipped)
for k in zeros253:
    print(f"{k:9s} fraction of gradients flushed to 0:",
          ", ".join(f"{n} {z:.3f}" for n, z in zip(mags253, zeros253[k])))  # fmt: skip
assert glob253.get_scales()[0] <= 2.0**8  # pinned low by the large group
assert per253.get_scales()[2] >= 2.0**32 and per253.n_skipped[2] == 0  # the small group's scale grew freely
assert zeros253["global"][2] > 0.9 and zeros253["per-group"][2] == 0.0
assert zeros253["per-group"][0] == zeros253["global"][0]  # the large group is served the same either way

# %%
# NBVAL_IGNORE_OUTPUT
rel253 = {
    k: float(np.mean([np.linalg.norm(p[i] - p[0]) / np.linalg.norm(p[0]) for p in pairs253]))
    for i, k in ((1, "global"), (2, "per-group"))
}
print("small group, relative error of the fp16 gradient:", {k: f"{v:.1e}" for k, v in rel253.items()})
assert rel253["global"] > 0.9 and rel253["per-group"] < 1e-3


# %% [markdown]
# **Monitor the distribution, weigh the layer's sensitivity.** Growing only after `growth_interval` clean steps is
# slow for a group that is underflowing *now*: 10 steps per doubling, whatever the gradients look like. The
# adaptive rule of `PerGroupScaler(..., sensitivity=, underflow_tol=)` reads the gradient distribution each step
# (`roundtrip` records the fraction of a group's nonzero entries that fp16 flushed to zero, `last_underflow`) and
# grows a group at once while that fraction is above its tolerance; the tolerance is `underflow_tol` divided by the
# group's sensitivity relative to the mean (e.g. each layer's Hessian trace per parameter, `amp.hutchinson_trace`
# of section 5): a sensitive layer tolerates less lost gradient. Below, the same three groups from a fresh scale of
# 1 with sensitivities 1, 1, 4 (the small group marked sensitive): steps until the small group's underflow first
# reaches zero, interval rule vs adaptive.


# %%
def clear_steps253(scaler, steps=400):
    r = np.random.default_rng(2530)
    for t in range(steps):
        _, infs = scaler.roundtrip([(m * r.standard_normal(512)).astype(np.float32) for m in mags253.values()])
        if scaler.last_underflow[2] == 0.0:
            return t
        scaler.update(infs)
    return None


plain253 = amp.PerGroupScaler(3, init_scale=1.0, growth_interval=10)
adapt253 = amp.PerGroupScaler(3, init_scale=1.0, growth_interval=10, sensitivity=[1, 1, 4], underflow_tol=1e-3)
t_plain253, t_adapt253 = clear_steps253(plain253), clear_steps253(adapt253)
print(f"small group underflow-free after {t_plain253} steps (interval rule) vs {t_adapt253} (adaptive); "
      f"early growths {adapt253.n_early_growth}, skipped steps {adapt253.n_skipped}")  # fmt: skip
assert t_plain253 is not None and t_adapt253 is not None and 4 * t_adapt253 < t_plain253
assert adapt253.n_early_growth[0] == 0 and adapt253.n_early_growth[2] > 0  # the large group never underflows


# %% [markdown]
# ## 4. Below 8 bits: FP4 E2M1, INT2, MX block scaling [Q74]
#
# FP4 E2M1 has 16 codes: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}. INT2 has {-2, -1, 0, 1}. With so few levels a
# single per-tensor scale wastes most of them on outliers; the OCP MX formats give every 32 consecutive elements
# their own power-of-two scale (an 8-bit exponent, E8M0): 4 + 8/32 = 4.25 bits per element for MXFP4.
# `tl.amp.fp4_encode` is bit-exact with `ml_dtypes.float4_e2m1fn` (round to nearest even, saturating at 6).

# %%
codes = np.arange(8)
print("FP4 E2M1 codes 0..7 ->", amp.fp4_decode(codes))
rng = np.random.default_rng(0)
w = (rng.standard_normal((64, 256)) * np.exp(rng.standard_normal((64, 1)))).astype(
    np.float32
)  # rows of different scale
w[:, ::97] *= 20  # a few outliers
s_tensor = amp.absmax_scale(w, "fp4")
err = {
    "FP4 per-tensor": np.mean((amp.fp4_round(w / s_tensor) * s_tensor - w) ** 2),
    "MXFP4 (32-blocks)": np.mean((amp.mx_round(w, "fp4_e2m1") - w) ** 2),
    "MXFP8 E4M3": np.mean((amp.mx_round(w, "fp8_e4m3") - w) ** 2),
    "INT2 per-tensor": np.mean(
        (np.clip(np.rint(w / amp.absmax_scale(w, "int2")), -2, 1) * amp.absmax_scale(w, "int2") - w) ** 2
    ),
}
for k, v in err.items():
    print(f"{k:18s} MSE {v:.4g}")
assert err["MXFP4 (32-blocks)"] < 0.5 * err["FP4 per-tensor"] and err["MXFP8 E4M3"] < err["MXFP4 (32-blocks)"]

# %% [markdown]
# Training through them: fake-quantize in the forward (`fake_quant_fp4`, `fake_quant_int2`) and pass the
# gradient straight through where the value was representable (zero where it was clipped). Below an MLP with
# **INT2 weights and FP4 activations** (per-tensor scales from the current absmax) trains to a useful accuracy;
# strategies that keep it stable: keep fp32 master weights (the STE updates them, not the 2-bit codes), clip the
# STE gradient outside the range, keep the first/last layer in higher precision, and use a lower learning rate.


# %%
# NBVAL_IGNORE_OUTPUT
class LowBitMLP(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = tl.nn.Linear(64, 128), tl.nn.Linear(128, 128), tl.nn.Linear(128, 10)

    def forward(self, x):
        h = self.fc1(x.flatten(1)).relu()  # first layer kept in fp32
        wq = amp.fake_quant_int2(self.fc2.weight, amp.absmax_scale(self.fc2.weight.data, "int2") * 1.0)
        h = amp.fake_quant_fp4(h, amp.absmax_scale(h.data, "fp4"))  # FP4 activations
        h = F.linear(h, wq, self.fc2.bias).relu()
        return self.fc3(h)  # last layer kept in fp32


tl.manual_seed(0)
lb = LowBitMLP()
opt = tl.optim.Adam(lb.parameters(), lr=2e-3)
for _ in range(8):
    for xb_, yb_ in tl.data.DataLoader(Xtr, ytr, batch_size=64, shuffle=True, seed=1):
        opt.zero_grad()
        F.cross_entropy(lb(xb_), yb_).backward()
        opt.step()
with tl.no_grad():
    acc_lowbit = float(np.mean(lb(tl.Tensor(Xte)).data.argmax(-1) == yte))
print(f"INT2-weight / FP4-activation MLP: test accuracy {acc_lowbit:.3f}")
assert acc_lowbit > 0.8

# %% [markdown]
# ## 5. Hessian-trace sensitivity and bit allocation on the digits CNN [Q148]
#
# Quantizing layer l perturbs the loss by about 1/2 dW^T H dW. With only the trace of each layer's Hessian block
# (Hutchinson: E[v^T H v] = Tr H for random +-1 vectors v; H v from a central difference of two gradients) the
# damage of b bits is Omega_l(b) = Tr(H_l)/n_l * ||Q_b(W_l) - W_l||^2 (HAWQ-V2). `allocate_bits` minimises the
# total under an average-bit budget (exhaustively for 3 layers); here 3 bits on average from {2, 4, 8}. The
# control, "reversed", spends exactly the same bits (the same multiset of per-weight widths) the other way round:
# most bits to the least sensitive layer. The fp32 row is the unquantized model.

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(0)
cnn = DigitsCNN(8, 16)
opt = tl.optim.Adam(cnn.parameters(), lr=1e-2)
for _ in range(3):
    for xb_, yb_ in tl.data.DataLoader(Xtr, ytr, batch_size=64, shuffle=True, seed=2):
        opt.zero_grad()
        F.cross_entropy(cnn(xb_), yb_).backward()
        opt.step()
cnn.eval()
names = ["features.0.weight", "features.4.weight", "fc.weight"]
params = dict(cnn.named_parameters())
ws = [params[n] for n in names]
xs, ys = tl.Tensor(Xtr[:512]), tl.Tensor(ytr[:512])
traces = amp.hutchinson_trace(lambda: F.cross_entropy(cnn(xs), ys), ws, n_samples=8, eps=1e-2)


def quantize_runs(w, elem_bits):  # fake-quant each contiguous run of equal bit width with its own scale
    flat, out = w.reshape(-1), np.empty(w.size, np.float32)
    for b in np.unique(elem_bits):
        idx = np.flatnonzero(elem_bits == b)  # runs are contiguous by construction
        out[idx] = amp.quantize_symmetric(flat[idx], int(b)) if b < 32 else flat[idx]
    return out.reshape(w.shape)


def accuracy_with(elem_bits):  # elem_bits: one bit width per weight element, per layer (32 = leave in fp32)
    saved = [p.data.copy() for p in ws]
    for p, eb in zip(ws, elem_bits):
        p.data = quantize_runs(p.data, eb)
    with tl.no_grad():
        a = float(np.mean(cnn(tl.Tensor(Xte)).data.argmax(-1) == yte))
    for p, s_ in zip(ws, saved):
        p.data = s_
    return a


sizes = np.array([p.data.size for p in ws])
per_elem = traces / sizes  # Tr(H_l) / n_l
bits, info = amp.allocate_bits(traces, [p.data for p in ws], avg_bits=3.0, candidates=(2, 4, 8))
# "reversed", budget-matched: the same multiset of per-element bit widths, the most bits to the least sensitive
# layer first (a layer may get two widths, in contiguous runs) -- exactly the same total bits
pool = np.sort(np.repeat(bits, sizes))[::-1]
rev_elem, at = [None] * 3, 0
for i in np.argsort(per_elem):
    rev_elem[i], at = pool[at : at + sizes[i]], at + sizes[i]
rows = {
    "fp32 (unquantized)": [np.full(n_, 32) for n_ in sizes],
    "Hessian allocation": [np.full(n_, b) for n_, b in zip(sizes, bits)],
    "uniform 2 bit": [np.full(n_, 2) for n_ in sizes],
    "reversed (same bits)": rev_elem,
}
for n, t, p in zip(names, traces, ws):
    print(f"{n:18s} n={p.data.size:5d}  Tr(H)~{t:9.3f}  Tr/n {t / p.data.size:.2e}")
acc = {k: accuracy_with(v) for k, v in rows.items()}
avg = {k: float(np.concatenate(v).mean()) for k, v in rows.items()}
for k, v in rows.items():
    print(f"{k:22s} bits {[sorted(set(e.tolist()), reverse=True) for e in v]}  avg {avg[k]:6.3f}  "
          f"test accuracy {acc[k]:.3f}")  # fmt: skip
assert (traces > 0).all() and np.argmax(per_elem) == 0  # the first conv is the most sensitive per weight
assert info["avg_bits"] <= 3.0 and avg["reversed (same bits)"] == avg["Hessian allocation"] == info["avg_bits"]
assert rows["reversed (same bits)"][0].max() < bits[0]  # the sensitive first conv lost bits in the reversal
assert (
    acc["Hessian allocation"] >= acc["reversed (same bits)"] - 0.02 and acc["uniform 2 bit"] < acc["fp32 (unquantized)"]
)

# %% [markdown]
# ### Bits for activations [Q148]
#
# The same recipe for the **activations**: add a zero "probe" parameter d to the activation h entering a layer
# (h + d); the Hessian of the loss w.r.t. d at 0 is the Hessian w.r.t. h, so Hutchinson over the probes gives
# Tr(H_hh) per activation (`tl.amp.activation_traces`). `allocate_bits` then gives each activation its width from
# s_l = Tr(H_l)/n_l * ||Q_b(h_l) - h_l||^2, and `forward_quantized_activations` runs the CNN with every chosen
# activation fake-quantized (per-tensor scale). Three activations: the input image, the output of the first
# conv block and of the second, 3 bits on average from {2, 4, 8}, against the same bits reversed.

# %%
# NBVAL_IGNORE_OUTPUT
layers5 = list(cnn.features.children()) + [cnn.flatten, cnn.fc]
pts5 = [0, 4, 8]  # activations entering features.0 (the image), features.4 (after pool 1), flatten (after pool 2)
atr, acts5 = amp.activation_traces(layers5, xs, lambda o: F.cross_entropy(o, ys), pts5, n_samples=8, eps=1e-2)
asz = np.array([a_[0].size for a_ in acts5])  # features per sample
aper = atr / np.array([a_.size for a_ in acts5])
abits, ainfo = amp.allocate_bits(atr, acts5, avg_bits=3.0, candidates=(2, 4, 8))
apool = np.sort(np.repeat(abits, asz))[::-1]
arev, at = [None] * 3, 0
for i in np.argsort(aper):
    arev[i], at = apool[at : at + asz[i]], at + asz[i]


def act_accuracy(bb):
    with tl.no_grad():
        return float(
            np.mean(amp.forward_quantized_activations(layers5, tl.Tensor(Xte), pts5, bb).data.argmax(-1) == yte)
        )


arows = {"fp32": [32] * 3, "Hessian allocation": abits, "uniform 2 bit": [2] * 3, "reversed (same bits)": arev}
aacc = {k: act_accuracy(v) for k, v in arows.items()}
aavg = {k: float(np.concatenate([np.broadcast_to(b, (n_,)) for b, n_ in zip(v, asz)]).mean()) for k, v in arows.items()}
for j, p_ in enumerate(pts5):
    print(f"activation into layer {p_} ({type(layers5[p_]).__name__:9s}) {asz[j]:4d} features  Tr/n {aper[j]:.2e}")
for k, v in arows.items():
    print(f"{k:22s} bits {[sorted(set(np.atleast_1d(b).tolist()), reverse=True) for b in v]}  avg {aavg[k]:6.3f}  "
          f"test accuracy {aacc[k]:.3f}")  # fmt: skip
assert (atr > 0).all() and np.argmax(aper) == 0  # the input image is the most sensitive activation per element
assert aavg["Hessian allocation"] == aavg["reversed (same bits)"] == ainfo["avg_bits"] <= 3.0
assert aacc["Hessian allocation"] > aacc["reversed (same bits)"] and aacc["Hessian allocation"] > aacc["uniform 2 bit"]

# %% [markdown]
# ## 6. Activation checkpointing [Q64] [Q119]
#
# `tl.autograd.checkpoint(fn, x)` runs `fn` without recording its graph and keeps only `x`; in the backward it
# restores the RNG state (dropout draws the same masks), recomputes `fn(x)` with grad on and backpropagates through
# it. Same outputs and gradients bit for bit (tests/amp/test_checkpoint.py), one extra forward per segment -- also under
# autocast: the recomputation runs under the autocast state the forward had (saved with the RNG state, as torch
# does), not the one around the backward, and the incoming gradient is not rounded to the bf16 segment output.
# `checkpoint_sequential(layers, k, x)` splits n layers into k segments of s = n // k and checkpoints all but the
# last (as torch does). Chen et al.'s "n/k + k, minimal at k = sqrt(n)" assumes every segment is checkpointed and a
# segment's activations are freed as soon as the backward has passed it. Neither holds here: the last segment
# (n - (k-1)s layers) keeps its activations, and tinylearn's engine (like a retained graph) frees a node's inputs
# only when the whole backward returns, so they are still alive while each checkpointed segment is rebuilt. The
# peak, in units of one layer output (`act` = 1024 x 128 fp32 = 0.5 MiB), is
#
#     k boundaries (the input + k-1 checkpoint outputs) + last segment + one rebuilt segment s + 1 (the gradient
#     entering it)  ~  k + 2n/k + 1,   minimal at k = sqrt(2n) = 8 for n = 32 (16 + 1 units instead of n + 1 = 33)
#
# plus params + grads + the backward workspace W (gradients in flight, from the graph walk of `estimate` at k = 1).
# With k = 2 it is n + 3 > n + 1: two segments cost *more* than none. The earlier curve, params + grads +
# act * (n/k + k), sat under every measurement because it dropped the last segment, the input, the gradient
# into the rebuilt segment and W. Measured with `tl.memory.measure_peak` (every numpy allocation of the step
# through a pooled caching allocator) and predicted by the graph walk `tl.memory.estimate(checkpoint_segments=k)`:

# %%
nn = tl.nn
n_layers = 32


def ck_net_make():
    tl.manual_seed(0)
    return nn.Sequential(*[m for _ in range(n_layers // 2) for m in (nn.Linear(128, 128), nn.ReLU())])


def ck_step(k):
    def f():
        net = ck_net_make()
        x_ = tl.randn(1024, 128)
        out_ = tl.autograd.checkpoint_sequential(net, k, x_) if k > 1 else net(x_)
        out_.sum().backward()

    return f


def ck_units(k, n=n_layers):  # layer outputs alive at the backward peak (see the formula above)
    if k == 1:
        return n + 1  # the input and every layer output
    s_ = n // k
    return k + (n - (k - 1) * s_) + s_ + 1


ks = [1, 2, 4, 6, 8, 12, 16]
tl.autograd.reset_recompute_count()
peaks = {k: measure_peak(ck_step(k)) for k in ks}
est6 = {
    k: estimate(ck_net_make(), (1024, 128), optimizer="sgd", checkpoint_segments=k if k > 1 else None,
                loss=lambda o: o.sum())["peak"]
    for k in ks
}  # fmt: skip
act = 1024 * 128 * 4
params_b = (n_layers // 2) * (128 * 128 + 128) * 4
ws6 = estimate(ck_net_make(), (1024, 128), optimizer="sgd", loss=lambda o: o.sum())["workspace"]
model6 = {k: 2 * params_b + ws6 + act * ck_units(k) for k in ks}
for k in ks:
    print(f"segments {k:2d}: measured peak {peaks[k] / 2**20:6.2f} MiB  estimate {est6[k] / 2**20:6.2f}  "
          f"formula {model6[k] / 2**20:6.2f} ({ck_units(k)} layer outputs)")  # fmt: skip
print("segments recomputed in total:", tl.autograd.recompute_count(), "=", sum(k - 1 for k in ks if k > 1))
assert tl.autograd.recompute_count() == sum(k - 1 for k in ks if k > 1)
best = min(peaks, key=peaks.get)
print("best k:", best, " sqrt(2 n) =", np.sqrt(2 * n_layers), " sqrt(n) =", round(np.sqrt(n_layers), 1))
assert best == np.sqrt(2 * n_layers) == min(ks, key=ck_units) and peaks[2] > peaks[1]
assert all(abs(model6[k] / peaks[k] - 1) < 0.01 and abs(est6[k] / peaks[k] - 1) < 0.01 for k in ks)
assert peaks[8] < 0.6 * peaks[1]
assert all(2 * params_b + act * (n_layers / k + k) < peaks[k] for k in ks if k > 1)  # the old curve: too low

# %%
# bit-identical under bf16 autocast too: forward under autocast, backward (and recomputation) outside it
tl.manual_seed(0)
ck_net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
x_ck = tl.randn(8, 16, requires_grad=True)
grads_ck = {}
for k in (1, 3):
    ck_net.zero_grad()
    x_ck.grad = None
    tl.manual_seed(1)
    with tl.autocast("bfloat16"):
        y_ck = tl.autograd.checkpoint_sequential(ck_net, k, x_ck) if k > 1 else ck_net(x_ck)
    (y_ck.float() ** 2).sum().backward()
    grads_ck[k] = [y_ck.data.copy(), x_ck.grad.data.copy()] + [q.grad.data.copy() for q in ck_net.parameters()]
same_bits = all(np.array_equal(a, b) for a, b in zip(grads_ck[1], grads_ck[3]))
print(
    "bf16 output dtype:", grads_ck[3][0].dtype, "| output and all gradients bit-identical with 3 segments:", same_bits
)
assert same_bits and grads_ck[3][0].dtype == amp.bfloat16

# %%
plt.figure(figsize=(6, 3))
plt.plot(ks, [peaks[k] / 2**20 for k in ks], "o", label="measured peak")
plt.plot(ks, [est6[k] / 2**20 for k in ks], "x", label="tl.memory.estimate")
kk = np.arange(1, 17)
plt.plot(kk, [(2 * params_b + ws6 + act * ck_units(k)) / 2**20 for k in kk], "--", label="P + G + W + act*units(k)")
plt.axvline(np.sqrt(2 * n_layers), color="gray", lw=0.8, label="sqrt(2n)")
plt.xlabel("segments k")
plt.ylabel("MiB")
plt.legend()
plt.title("checkpoint_sequential on 32 layers")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Against torch.utils.checkpoint (and tinygrad)
#
# The same 32-layer step (batch 256 to keep it short) with `tl.autograd.checkpoint_sequential` and
# `torch.utils.checkpoint.checkpoint_sequential` (use_reentrant=True), k = 1 and 8 (`tl.amp.bench.checkpoint_table`):
# step time, tinylearn's measured peak, and the activations each keeps for backward (torch: counted with
# saved_tensors_hooks; torch's CPU allocator keeps no peak statistics). Checkpointing cuts by more than 40% what both
# keep; torch keeps less than tinylearn even without it, because its ReLU saves its *output* -- the storage the
# next Linear saves anyway -- while tinylearn's ReLU keeps its input, the Linear's output: two arrays per pair.
# tinygrad has no activation checkpointing.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.amp.bench import checkpoint_table  # noqa: E402

tck = checkpoint_table(n_layers=32, width=128, batch=256, segments=8, repeat=5)
print(tck.to_text())
rck = {r.impl: r for r in tck.rows}
sv = {k: r.extra.get("saved_mb") for k, r in rck.items()}
fig, axs = plt.subplots(1, 2, figsize=(8, 2.6))
impls = [k for k in rck if rck[k].median_ms is not None]
axs[0].bar(impls, [rck[k].median_ms for k in impls])
axs[0].set_ylabel("step ms (loaded box)")
axs[1].bar(impls, [sv[k] for k in impls])
axs[1].set_ylabel("kept for backward, MiB")
for ax in axs:
    ax.tick_params(axis="x", labelrotation=30)
plt.tight_layout()
plt.show()
assert sv["tinylearn k=8"] < 0.6 * sv["tinylearn k=1"] and sv["torch k=8"] < 0.6 * sv["torch k=1"]
assert sv["torch k=1"] < sv["tinylearn k=1"] and rck["tinylearn k=8"].peak_mb < 0.8 * rck["tinylearn k=1"].peak_mb
assert rck["tinygrad"].median_ms is None and rck["tinygrad"].note.startswith("n/a: tinygrad has no activation")

# %% [markdown]
# ### Which layers to recompute under a budget [Q64] [Q119] [Q169]
#
# With per-layer activation bytes A_i and forward cost F_i (recomputing layer i costs F_i again), dropping the
# stored activation of layer i saves A_i and costs F_i. The step time is forward + backward + recompute, so
# minimising it under a memory budget M means minimising sum_{dropped} F_i subject to the peak fitting M, where the
# peak counts the **recompute working set**: a dropped activation is rebuilt in the backward and lives next to the
# kept ones, so peak = sum_{kept} A_i + max_{dropped} A_i. That is a 0/1 knapsack:
#
# - `greedy_recompute` (Q64, Q169) drops layers in decreasing A_i / F_i (memory saved per unit of recompute) until
#   the peak fits: cheap elementwise layers (GELU, dropout, norms: big activations, tiny FLOPs) go first, GEMMs
#   last -- what selective recomputation in Megatron does for attention softmax/dropout. Fast, not optimal.
# - `plan_recompute` (Q119) is exact: for each threshold t (the largest dropped A_i) a dynamic programme over
#   integer sizes finds the cheapest set of layers with A_i <= t whose sizes cover total - (M - t).
#
# Both live in `tinylearn.memory.estimate`; below they are checked against brute force over all 2^n subsets.

# %%
# stable-output: made-up tensor sizes and recompute costs, exact greedy / DP / brute force
from tinylearn.memory.estimate import greedy_recompute, plan_recompute  # noqa: E402


def brute_recompute(A, Fc, budget, working_set=True):
    best_ = None
    for mask in range(1 << len(A)):
        drop_ = [i for i in range(len(A)) if mask >> i & 1]
        kept_ = sum(A) - sum(A[i] for i in drop_)
        pk = kept_ + (max((A[i] for i in drop_), default=0) if working_set else 0)
        cost_ = sum(Fc[i] for i in drop_)
        if pk <= budget and (best_ is None or cost_ < best_[0] - 1e-12):
            best_ = (cost_, drop_)
    return best_


A = [4, 4, 1, 4, 4, 1, 8, 8]  # MiB: linear out, gelu out, (small) norm stats, ..., attention scores, probs
Fc = [10, 0.5, 0.2, 10, 0.5, 0.2, 4, 0.5]  # ms forward
g0 = greedy_recompute(A, Fc, budget=16)  # kept activations only
print("greedy, kept <= 16 MiB:          drop", g0["drop"], "recompute ms", g0["recompute"], "kept", g0["peak"])
assert g0["drop"] == [1, 2, 4, 5, 7] and g0["peak"] <= 16
for M in (24, 20, 18):
    g, d, bf = greedy_recompute(A, Fc, M, working_set=True), plan_recompute(A, Fc, M), brute_recompute(A, Fc, M)
    print(f"budget {M} MiB, working set: greedy drop {g['drop']} ({g['recompute']:.1f} ms, peak {g['peak']}) "
          f"| DP drop {d['drop']} ({d['recompute']:.1f} ms, peak {d['peak']}) | brute {bf[0]:.1f} ms")  # fmt: skip
    assert d["peak"] <= M and g["peak"] <= M and abs(d["recompute"] - bf[0]) < 1e-9
    assert d["recompute"] <= g["recompute"]
d18, g18 = plan_recompute(A, Fc, 18), greedy_recompute(A, Fc, 18, working_set=True)
assert d18["recompute"] < g18["recompute"]  # the ratio rule is not optimal at this budget
rng6 = np.random.default_rng(6)
for _ in range(30):  # random layer tables: the DP always matches brute force
    A_r, F_r = rng6.integers(1, 20, 10).tolist(), rng6.uniform(0.1, 10, 10).round(2).tolist()
    M_r = int(rng6.integers(max(A_r), sum(A_r)))
    assert abs(plan_recompute(A_r, F_r, M_r)["recompute"] - brute_recompute(A_r, F_r, M_r)[0]) < 1e-9

# %% [markdown]
# ### Store or recompute on several nodes: a priority with communication [Q239]
#
# The knapsack above prices a recomputation by its FLOPs. On a multi-node run a recomputation can also repeat a
# collective: a tensor-parallel / sequence-parallel layer's input is all-gathered in the forward, and recomputing
# from the sharded input repeats the all-gather in the backward. `tl.amp.recompute_priority` scores every saved
# tensor by P = alpha * m - beta * r - gamma * c (m: MiB freed, r: recompute ms, c: extra communication ms;
# alpha = 0.05 ms per MiB is what one MiB is worth here) and `tl.amp.select_by_priority` recomputes in decreasing
# P until the kept bytes fit the budget. Below, one transformer block on a TP = 4 run (made-up but typical sizes)
# under a 120 MiB budget: with gamma = 0 (the single-node rule) the all-gathered input looks nearly free (0.1 ms
# of FLOPs) and is picked, costing a 3 ms all-gather; with gamma = 1 the rule picks the MLP GEMM output instead,
# 0.6 ms less per step, the optimum of a brute force over all 2^7 subsets.

# %%
# stable-output: a made-up table of sizes and costs, exact priority and brute force
t239 = [  # name, MiB, recompute ms, extra communication ms
    ("attention scores QK^T", 64, 0.5, 0.0),
    ("softmax probabilities", 64, 0.3, 0.0),
    ("all-gathered LN output (SP)", 48, 0.1, 3.0),
    ("attention output proj input", 16, 2.0, 0.0),
    ("MLP up-projection output", 64, 2.5, 0.0),
    ("GELU output", 64, 0.2, 0.0),
    ("all-gathered MLP input (SP)", 32, 0.1, 2.0),
]
m239, r239, c239 = ([row[i] for row in t239] for i in (1, 2, 3))
budget239 = 120
overhead239 = {}
for gamma in (0.0, 1.0):
    pr = amp.recompute_priority(m239, r239, c239, alpha=0.05, beta=1.0, gamma=gamma)
    sel = amp.select_by_priority(m239, pr, budget239)
    overhead239[gamma] = sum(r239[i] + c239[i] for i in sel["recompute"])
    print(f"gamma {gamma}: recompute {[t239[i][0] for i in sel['recompute']]}, kept {sel['kept']} MiB, "
          f"extra time {overhead239[gamma]:.1f} ms")  # fmt: skip
    assert sel["kept"] <= budget239
best239 = min(
    sum(r239[i] + c239[i] for i in range(7) if mask >> i & 1)
    for mask in range(1 << 7)
    if sum(m239) - sum(m239[i] for i in range(7) if mask >> i & 1) <= budget239
)
print(f"brute force optimum: {best239:.1f} ms")
assert abs(overhead239[1.0] - best239) < 1e-9 and overhead239[0.0] - overhead239[1.0] > 0.5


# %% [markdown]
# ### Which saved activations stay in high precision under a memory budget [Q250]
#
# Between keeping an activation in fp32 and recomputing it there is a third choice: keep it in fewer bits. A Linear
# layer keeps its input x only for dW = g^T x, so storing x as q(x) adds the error g^T (x - q(x)) to dW: the
# layer's *gradient sensitivity* (how large its g is) times the *quantization error* of the format. Backward
# through the other layers does not read that x (dX = g W), so each layer's error lands in its own dW and the
# errors add up. The policy: measure the error each layer adds in each format (one backward per layer and format,
# which includes whatever accumulates through the graph), then choose one format per layer minimising the summed
# error under the byte budget — a multiple-choice knapsack, exact by enumeration for a few layers
# (`tl.amp.plan_saved_precision`); `tl.amp.quant_saved_linear` stores the saved input in bf16 or int8 (one absmax
# scale). Below: an MLP 64-128-128-64-10 after one epoch on the digits, 512 images, formats fp32 / bf16 / int8.

# %%
# NBVAL_IGNORE_OUTPUT
# (gradient errors come from float32 BLAS products: the values depend on the CPU path; the asserts do not)
tl.manual_seed(0)
mlp_sp = DigitsMLP((128, 128, 64))
opt_sp = tl.optim.Adam(mlp_sp.parameters(), lr=1e-2)
for xb_, yb_ in tl.data.DataLoader(Xtr, ytr, batch_size=128, shuffle=True, seed=3):  # one epoch: real gradients
    opt_sp.zero_grad()
    F.cross_entropy(mlp_sp(tl.Tensor(xb_)), tl.Tensor(yb_)).backward()
    opt_sp.step()
lins_sp = [m for m in mlp_sp.net if isinstance(m, tl.nn.Linear)]
x_sp, y_sp = tl.Tensor(Xtr[:512].reshape(512, 64)), tl.Tensor(ytr[:512])


def grads_sp(fmts):
    """Weight gradients of every Linear when layer i's saved input is stored in fmts[i]; and the bytes kept."""
    mlp_sp.zero_grad()
    h, i, kept = x_sp, 0, 0
    for m in mlp_sp.net:
        if isinstance(m, tl.nn.Linear):
            h = amp.quant_saved_linear(h, m.weight, m.bias, fmt=fmts[i])
            kept, i = kept + h.grad_fn.saved_bytes, i + 1
        elif not isinstance(m, tl.nn.Flatten):
            h = m(h)
    F.cross_entropy(h, y_sp).backward()
    return [lin.weight.grad.data.copy() for lin in lins_sp], kept


ref_sp, bytes32 = grads_sp(["fp32"] * 4)
norm2_sp = sum(float(np.sum(g**2)) for g in ref_sp)


def rel_err_sp(gs):  # squared relative error of all weight gradients together
    return sum(float(np.sum((g - r) ** 2)) for g, r in zip(gs, ref_sp)) / norm2_sp


fmts_sp = ("fp32", "bf16", "int8")
errors_sp = [{f: rel_err_sp(grads_sp(["fp32"] * i + [f] + ["fp32"] * (3 - i))[0]) for f in fmts_sp} for i in range(4)]
sizes_sp = [lin.weight.shape[1] * 512 for lin in lins_sp]
print("layer  saved elems  dW error bf16  dW error int8   (squared, relative to all weight gradients)")
for i, e in enumerate(errors_sp):
    print(f"{i:5d}  {sizes_sp[i]:11d}  {e['bf16']:13.2e}  {e['int8']:13.2e}")
int8_all = rel_err_sp(grads_sp(["int8"] * 4)[0])
for frac in (0.5, 0.35, 0.3):
    plan_sp, pbytes, pred = amp.plan_saved_precision(sizes_sp, errors_sp, frac * bytes32)
    gs_sp, kept_sp = grads_sp(plan_sp)
    meas = rel_err_sp(gs_sp)
    print(f"budget {frac:.2f}: {plan_sp} kept {kept_sp / bytes32:.3f} of fp32, error {meas:.2e} (predicted {pred:.2e})")
    assert kept_sp == pbytes <= frac * bytes32 and abs(meas - pred) <= 1e-3 * pred + 1e-15  # the errors add up
    if frac < 0.5:  # below 2 bytes per element only all-int8 fits uniformly
        print(f"  all int8 ({0.25:.2f} of fp32): error {int8_all:.2e}, {int8_all / meas:.1f}x the plan's")
        assert meas < 0.5 * int8_all and plan_sp[3] != "int8"  # the most sensitive layer (the logits') stays wide
assert errors_sp[0]["bf16"] == 0.0  # the input pixels are integers 0..16: exact in bf16
assert all(e["int8"] > e["bf16"] >= e["fp32"] == 0.0 for e in errors_sp[1:])


# %% [markdown]
# ### Low-rank saved activations [Q102b]
#
# A third way to shrink what backward keeps, next to recomputing and storing in fewer bits: a Linear layer saves
# its input x [N, in] only for dW = g^T x, so it can save a rank-r factorisation instead. `tl.amp.lowrank_linear`
# (a `Function`) takes the truncated SVD x ~ U_r S_r V_r^T with the smallest r whose discarded energy is within a
# relative Frobenius tolerance, sqrt(sum_{i>r} s_i^2) / ||x||_F <= tol, keeps (N + in) r numbers instead of N in,
# and computes dW = (g^T U_r S_r) V_r^T; dX = g W needs no x and stays exact. The weight-gradient error is bounded by
# ||g||_2 tol ||x||_F. It pays when activations have a fast-decaying spectrum and r < N in / (N + in); it costs
# one SVD per layer in the forward, so combine it with recomputation: factor the GEMM inputs that are expensive to
# recompute, recompute the cheap elementwise layers, and keep exact the activations that nonlinear backwards need
# (ReLU masks, softmax). Below:
# the 128 ReLU outputs of 512 digit images entering the MLP's last Linear. At tol = 0.1 the factors hold under
# half the numbers of x and dW is within 10% of the exact gradient; a tighter tol costs more rank, and at full rank
# the factors are *larger* than x.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.amp import lowrank_linear  # noqa: E402

tl.manual_seed(0)
mlp_lr = DigitsMLP((128,))
x_lr = tl.Tensor(Xtr[:512].reshape(512, 64))
with tl.no_grad():
    h_lr = tl.relu(mlp_lr.net[1](x_lr))  # the input the last Linear saves: [512, 128]
lin_lr, y_lr = mlp_lr.net[-1], tl.Tensor(ytr[:512])
gw_lr, saved_lr = {}, {}
for tol in (0.0, 0.01, 0.03, 0.1, 0.3):
    lin_lr.zero_grad()
    out_lr = lowrank_linear(h_lr, lin_lr.weight, lin_lr.bias, tol=tol)
    F.cross_entropy(out_lr, y_lr).backward()
    gw_lr[tol], saved_lr[tol] = lin_lr.weight.grad.data.copy(), out_lr.grad_fn.saved_elems
lin_lr.zero_grad()
F.cross_entropy(F.linear(h_lr, lin_lr.weight, lin_lr.bias), y_lr).backward()
gw_ref = lin_lr.weight.grad.data.copy()
n_lr, d_lr = h_lr.shape
err_lr = {t: float(np.linalg.norm(gw_lr[t] - gw_ref) / np.linalg.norm(gw_ref)) for t in gw_lr}
frac_lr = {t: saved_lr[t] / (n_lr * d_lr) for t in gw_lr}
print(" tol   rank  kept/full  dW rel. error")
for t in gw_lr:
    print(f"{t:5.2f}  {saved_lr[t] // (n_lr + d_lr):4d}  {frac_lr[t]:9.3f}  {err_lr[t]:.2e}")
assert err_lr[0.0] < 1e-5  # tol 0: full rank, the exact gradient (up to float32 rounding)
assert frac_lr[0.1] < 0.5 and err_lr[0.1] < 0.1  # under half the activation memory, dW within 10%
us_lr, vt_lr = amp.lowrank_factors(h_lr.data, 0.1)
assert np.linalg.norm(us_lr @ vt_lr - h_lr.data) <= 0.1 * np.linalg.norm(h_lr.data) * (1 + 1e-5)  # tol honoured
assert frac_lr[0.0] > 1  # full rank: (N + in) r > N in -- factors only pay below r = N in / (N + in)
assert all(err_lr[a] <= err_lr[b] and frac_lr[a] >= frac_lr[b] for a, b in [(0.01, 0.03), (0.03, 0.1), (0.1, 0.3)])


# %% [markdown]
# ## 7. Where training memory goes: predicted vs measured [Q64] [Q119]
#
# `tl.memory.estimate(model, input_shape, optimizer, amp, checkpoint_segments)` is the estimator a checkpointing
# plan under a budget M needs. It adds params, grads, optimizer states (Adam: 2x params) and the activations the
# graph keeps (counted from one forward on a zeros batch: layer outputs, masks, im2col buffers, the bf16 weight
# copies under autocast; for TinyGPT mostly the [B, H, T, T] attention scores and probabilities). The **backward
# workspace** comes from walking the graph in the engine's order: gradients waiting for their node, the gradients
# a node is producing (in the input's dtype: the bf16 GEMM hands back bf16 gradients), the fp32 copy a cast's
# backward makes of each weight gradient, a dcol temporary next to each im2col buffer. The prediction is the
# larger of the backward peak and the optimizer-step peak (params + grads + states + the graph the live loss still
# holds). `measure_peak` runs the real step from scratch (model creation included) with every numpy allocation
# served by a C++ caching allocator.
#
# An earlier version took the workspace to be the largest saved activation and underestimated bf16 + SGD on the
# MLPs beyond the 10% budget: with SGD the peak is in the backward, at the cast of the largest weight, where that
# weight's bf16 GEMM gradient and the fp32 copy the cast makes of it are alive together, so the bf16 + SGD MLP
# row's workspace exceeds one bf16 512x512 weight (0.5 MiB). With Adam the step (2 x params of states) is the
# larger peak and hides it. The table below covers every (fp32 | bf16 autocast) x (SGD | Adam) x
# (MLP | CNN | TinyGPT) step; every row is within 10%.


# %%
# NBVAL_IGNORE_OUTPUT
def make_step(make, shape, optimizer="adam", amp_dtype=None):
    def f():
        tl.manual_seed(0)
        m = make()
        o = tl.optim.Adam(m.parameters()) if optimizer == "adam" else tl.optim.SGD(m.parameters(), lr=0.1)
        xx = np.zeros(shape, np.int64) if len(shape) == 2 else tl.randn(*shape)  # token ids for TinyGPT
        with tl.autocast(amp_dtype) if amp_dtype else contextlib.nullcontext():
            out_ = m(xx)
            out_ = out_.reshape(-1, out_.shape[-1]) if out_.ndim == 3 else out_
            loss_ = F.cross_entropy(out_, tl.Tensor(np.zeros(out_.shape[0], np.int64)))
        loss_.backward()
        o.step()

    return f


models = {
    "MLP 512x512, B=256": (lambda: DigitsMLP((512, 512)), (256, 1, 8, 8)),
    "CNN 32/64, B=256": (lambda: DigitsCNN(32, 64), (256, 1, 8, 8)),
    "TinyGPT 4L d64, B=8 T=128": (lambda: TinyGPT(64, 64, 4, 4, 256, n_kv_heads=2), (8, 128)),
}
errs, table7 = {}, []
hdr = f"{'model':26s} {'amp':5s} {'opt':4s} {'params':>7s} {'grads':>7s} {'optim':>7s} {'activ':>7s} {'wspace':>7s}"
print(hdr + f" {'est':>7s} {'meas':>7s}   err   (MiB)")
for name, (make, shape) in models.items():
    for a in (None, "bfloat16"):
        for o in ("sgd", "adam"):
            kw = {"input_dtype": "int64"} if len(shape) == 2 else {}
            e = estimate(make(), shape, optimizer=o, amp=a, **kw)
            meas = measure_peak(make_step(make, shape, o, a))
            errs[name, a, o] = e["peak"] / meas - 1
            table7.append((name, a, o, e, meas))
            cols = " ".join(f"{e[k] / 2**20:7.2f}" for k in ("params", "grads", "optimizer_state", "activations"))
            print(f"{name:26s} {'bf16' if a else 'fp32':5s} {o:4s} {cols} {e['workspace'] / 2**20:7.2f} "
                  f"{e['peak'] / 2**20:7.2f} {meas / 2**20:7.2f} {errs[name, a, o]:+6.1%}")  # fmt: skip
assert len(errs) == 12 and max(abs(v) for v in errs.values()) < 0.10
gpt_row = next(r for r in table7 if r[0].startswith("TinyGPT") and r[1] is None and r[2] == "adam")
assert gpt_row[3]["activations"] > 0.8 * gpt_row[4]  # TinyGPT: activations are most of the step's memory

# %% [markdown]
# Reading the table: every error is under 10% in magnitude. For the MLP the parameters, gradients and Adam states
# are the bulk, and Adam's step is the peak (Adam's measured peak is above SGD's); for the CNN and TinyGPT the
# activations are (more than 80% of TinyGPT's measured peak: attention is O(T^2) per head and layer), so the
# optimizer changes their measured peak by under 5%. bf16 autocast does not by itself shrink the peak much here:
# the CNN's grows (its convs are emulated in fp32 on rounded inputs, so fp32 and bf16 copies are both kept), the
# MLP's and TinyGPT's drop by under 15% (the MLP keeps fp32 master weights, gradients and states; in TinyGPT softmax,
# LayerNorm and the loss stay fp32, and the scores are [B, H, T, T]).


# %%
meas7 = {(r[0].split()[0], r[1], r[2]): r[4] for r in table7}
assert meas7["MLP", None, "adam"] > meas7["MLP", None, "sgd"]
est7 = {(r[0].split()[0], r[1], r[2]): r[3] for r in table7}
assert est7["MLP", "bfloat16", "sgd"]["workspace"] > 512 * 512 * 2  # more than one bf16 weight in flight
assert est7["MLP", "bfloat16", "adam"]["peak"] > est7["MLP", "bfloat16", "sgd"]["peak"]  # Adam's step is the peak
assert all(
    abs(meas7[m, a, "adam"] / meas7[m, a, "sgd"] - 1) < 0.05 for m in ("CNN", "TinyGPT") for a in (None, "bfloat16")
)
assert meas7["CNN", "bfloat16", "adam"] > meas7["CNN", None, "adam"]
assert all(
    0.85 < meas7[m, "bfloat16", o] / meas7[m, None, o] < 1.0 for m in ("MLP", "TinyGPT") for o in ("sgd", "adam")
)


# %% [markdown]
# ## 8. 7B and 70B
#
# Mixed-precision Adam keeps **16 bytes per parameter** (ZeRO, Rajbhandari et al. 2020): bf16 params 2 + bf16 grads
# 2 + fp32 master copy 4 + Adam m 4 + v 4. Activations per transformer layer, 16-bit, no recomputation, no
# tensor/sequence parallelism (Korthikanti et al. 2022): s*b*h*(34 + 5*a*s/h) bytes; with full recomputation only
# the layer input, 2*s*b*h, stays. The 5*a*s/h term is the attention matrices (softmax output 2as^2b, dropout mask
# as^2b, dropout output 2as^2b bytes). **FlashAttention** never writes them to memory (it recomputes the scores
# tile by tile in the backward) and keeps only an fp32 log-sum-exp per row: s*b*h*34 + 4*a*s*b bytes per layer
# (`transformer_memory(..., flash_attention=True)`, column "act FA").
#
# **Assumptions**: LLaMA-like shapes (7B: 6.7e9 params, 32 layers, h = 4096, 32 heads; 70B: 68.98e9 params,
# 80 layers, h = 8192, 64 heads, counted as full multi-head attention), sequence s = 4096 tokens, micro-batch
# b = 1, one device holding everything (no ZeRO/FSDP sharding, no offload), no fragmentation, no framework or
# communication workspace, no KV cache (training), the logits/loss buffers not counted. GB = 1e9 bytes.

# %%
configs = {"7B": (6.7e9, 32, 4096, 32), "70B": (68.98e9, 80, 8192, 64)}
big = {}
print(f"{'model':5s} {'bf16 W':>7s} {'bf16 g':>7s} {'fp32 W':>7s} {'Adam':>7s} {'states':>7s} {'activ':>7s} "
      f"{'act FA':>7s} {'act+rc':>7s} {'total':>7s} {'total+rc':>8s} {'80GB GPUs':>9s}   (GB)")  # fmt: skip
for name, (n, L, h, a) in configs.items():
    r = transformer_memory(n, L, h, a, seq=4096, micro_batch=1)
    rc = transformer_memory(n, L, h, a, seq=4096, micro_batch=1, checkpoint=True)
    fa = transformer_memory(n, L, h, a, seq=4096, micro_batch=1, flash_attention=True)
    big[name] = (r, rc, fa)
    g = {k: v / 1e9 for k, v in r.items()}
    print(f"{name:5s} {g['params_16bit']:7.1f} {g['grads_16bit']:7.1f} {g['master_params_fp32']:7.1f} "
          f"{g['adam_states_fp32']:7.1f} {g['model_states']:7.1f} {g['activations']:7.1f} "
          f"{fa['activations'] / 1e9:7.1f} {rc['activations'] / 1e9:7.1f} {g['total']:7.1f} {rc['total'] / 1e9:8.1f} "
          f"{int(np.ceil(rc['total'] / 80e9)):9d}")  # fmt: skip
r7, r70 = big["7B"][0], big["70B"][0]
assert r7["model_states"] == 16 * 6.7e9 and abs(r70["model_states"] - 16 * 68.98e9) < 1
assert 100e9 < r7["activations"] < 110e9 and 500e9 < r70["activations"] < 540e9
assert big["7B"][1]["activations"] < 0.02 * r7["activations"]
assert int(np.ceil(r70["model_states"] / 80e9)) == 14
# FlashAttention: the 5as/h term vanishes; per layer s*b*h*34 plus the fp32 log-sum-exp (4 bytes per head and row)
for name, (_, L, h, a) in configs.items():
    assert big[name][2]["activations"] == L * (4096 * h * 34 + 4 * a * 4096)
fa_ratio = {k: big[k][0]["activations"] / big[k][2]["activations"] for k in big}
print("activations without / with FlashAttention:", {k: round(v, 2) for k, v in fa_ratio.items()})
assert all(5.65 < v < 5.75 for v in fa_ratio.values())  # 34 + 5as/h = 34 + 160 = 194 for both, vs 34.03

# %% [markdown]
# Reading the table: a 7B model needs about 107 GB of model states alone -- more than one 80 GB GPU before any
# activation -- and about as much again in activations at s = 4096 without recomputation; full recomputation cuts
# activations by more than 50x (to the layer inputs); FlashAttention alone cuts them 5.7x (both models)
# without any recompute of the GEMMs. A 70B model needs about 1.1 TB of states: 14 80-GB GPUs
# just to hold them, which is why ZeRO/FSDP shard params, grads and optimizer states across data-parallel ranks.
# The last column counts 80-GB GPUs for states + recomputed activations: 2 for 7B, 14 for 70B.

# %%
assert 105e9 < r7["model_states"] < 110e9 and r7["activations"] > 0.9 * r7["model_states"]
assert r7["activations"] / big["7B"][1]["activations"] > 50 and 1.0e12 < r70["model_states"] < 1.2e12
assert [int(np.ceil(big[k][1]["total"] / 80e9)) for k in ("7B", "70B")] == [2, 14]


# %% [markdown]
# ### Optimizer state in bf16 / fp16 / int8, sharded, with error feedback [Q219]
#
# Adam's m and v are 8 of the 16 bytes per parameter above. Sharding them over W ranks (ZeRO-1) divides that by W;
# storing them in 16 or 8 bits halves or quarters it again -- but rounding every step *accumulates*: v is an EMA
# with beta2 = 0.999, each step moves it by 0.1%, less than half a bf16 ulp (2^-9 relative), so round-to-nearest
# returns the old value and v stagnates; m's small increments are lost the same way. Error feedback keeps a
# compensation buffer e per shard (the rounding error of the stored state, itself stored in the same format) and adds
# it back before the next update: s = dequant(s_q) + e; s = beta s + (1 - beta) x; s_q = quant(s); e = s - s_q.
# Rounding errors are carried forward instead of lost, so small increments pile up in e until they flip s_q.
# `tl.amp.ShardedLowPrecisionAdam(numel, state_format, error_feedback, world_size)` does this per rank on its
# contiguous shard (int8: symmetric, one absmax scale per shard). First the mechanism on one element of v, then
# 300 Adam steps on a fixed noisy quadratic (512 parameters, 4 shards, the same gradient noise for every run),
# parameters compared with fp32-state Adam. With error feedback the drift is more than 100x smaller in every format
# (about 700x in bf16, 400x in int8 here); the buffer doubles the state bytes (bf16 + e = fp32's 4 bytes but ~16
# significant bits; int8 + e = 2 bytes + scales, half of fp32).

# %%
# v's EMA with g^2 = 1.5 from v = 1: the exact value climbs towards 1.5; stored in bf16 it never leaves 1.0
v_true, v_q, v_ef, e_ef = 1.0, np.float32(1.0), np.float32(1.0), np.float32(0.0)
for _ in range(200):
    v_true = 0.999 * v_true + 0.001 * 1.5
    v_q = amp.quantize_state(np.array([0.999 * v_q + 0.001 * 1.5], np.float32), "bf16")[0]
    full = np.float32(0.999) * (v_ef + e_ef) + np.float32(0.001 * 1.5)
    v_ef = amp.quantize_state(np.array([full], np.float32), "bf16")[0]
    e_ef = amp.quantize_state(np.array([full - v_ef], np.float32), "bf16")[0]
print(f"after 200 steps: exact v {v_true:.4f} | bf16 without feedback {v_q:.4f} | bf16 with feedback {v_ef + e_ef:.4f}")
assert v_q == 1.0 and abs(v_ef + e_ef - v_true) < 1e-3 < v_true - 1.0

# %%
# NBVAL_IGNORE_OUTPUT
rng219 = np.random.default_rng(219)
n219 = 512
A219 = rng219.standard_normal((n219, n219)).astype(np.float32) / np.sqrt(n219)
H219 = (A219.T @ A219 + 0.1 * np.eye(n219)).astype(np.float32)
b219 = rng219.standard_normal(n219).astype(np.float32)
noise219 = (0.5 * rng219.standard_normal((300, n219))).astype(np.float32)


def run219(fmt, ef):
    th = np.zeros(n219, np.float32)
    opt = amp.ShardedLowPrecisionAdam(n219, lr=1e-2, state_format=fmt, error_feedback=ef, world_size=4)
    for t in range(300):
        opt.step(th, H219 @ th - b219 + noise219[t])
    return th, opt.state_bytes()


ref219, bytes_fp32 = run219("fp32", False)
drift219, bytes219 = {}, {}
for fmt in ("bf16", "fp16", "int8"):
    for ef in (False, True):
        th, bytes219[fmt, ef] = run219(fmt, ef)
        drift219[fmt, ef] = float(np.linalg.norm(th - ref219) / np.linalg.norm(ref219))
        print(f"{fmt} error feedback {ef!s:5s}: state {bytes219[fmt, ef]:5d} B (fp32: {bytes_fp32}), "
              f"drift ||theta - theta_fp32|| / ||theta_fp32|| = {drift219[fmt, ef]:.1e}")  # fmt: skip
assert all(drift219[f, True] < 0.01 * drift219[f, False] for f in ("bf16", "fp16", "int8"))
assert drift219["int8", True] < 1e-3 and drift219["int8", False] > 0.01 and bytes219["int8", True] < bytes_fp32
assert bytes219["bf16", True] == bytes_fp32 and bytes219["bf16", False] == bytes_fp32 // 2


# %% [markdown]
# ## 9. Benchmark: a training step in fp32 vs bf16 autocast (tinylearn, torch, tinygrad), and a precision plan [Q105]
#
# **The bf16 GEMM.** Under `tl.autocast("bfloat16")`, `Linear` and `matmul` with two 2-D bf16 operands run the
# registered op `amp.bf16_matmul` (`tinylearn/amp/bf16_ops.py`): by default the C++ packed GEMM of notebook 08 whose
# packing widens bf16 to fp32 (`bits << 16`, exact), so its fp32 FMA micro-kernel accumulates exact products of the
# bf16 values, adds the bias to the fp32 sums and rounds once to bf16 (torch's addmm numerics on a CPU without
# AVX512_BF16). On a CPU with AVX512_BF16 (AMD Zen 4, Intel Sapphire Rapids) the same loops pack *pairs* of bf16
# values along k into 32-bit lanes and run `vdpbf16ps`, which multiplies both halves of each lane and adds the two
# products to an fp32 lane: two k per instruction and half the packed bytes (row "C++ dpbf16"; the only numeric
# difference is that the instruction treats subnormal bf16 inputs as zero, tested in `tests/amp/test_amp_bf16.py`).
# The casts (`amp.to_bf16`) and ReLU on bf16 bits are C++ too (`cpp_src/amp_bf16.cpp`); convolutions are still
# emulated (fp32 kernels on bf16-rounded inputs). The ladder below, at the MLP's hidden layer (256 x 512 x 512),
# twice: B contiguous, and B the transposed view of a weight as `Linear` multiplies it. GFLOP/s against the one-core
# FMA peak places each rung on the compute roof (the operands, 1.3 MB in bf16, sit in L2/L3: compute-bound).

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
from tinylearn import backends, cpu  # noqa: E402
from tinylearn.amp.bench import gemm_table, step_ratio, step_table  # noqa: E402
from tinylearn.bench import plot_table  # noqa: E402
from tinylearn.bench.roofline import cpu_flags  # noqa: E402

gt = gemm_table()
print(gt.to_text())
plot_table(gt)
plt.show()
peak1 = backends.load_C("gemm").fma_peak(threads=1)["gflops"]  # register-only FMA loop, one core
gm = {(r.case, r.impl): r for r in gt.rows}
for case9 in gt.cases():
    fl = gm[case9, "torch fp32"].gflops * gm[case9, "torch fp32"].median_ms  # 2MNK / 1e6
    best = {k: fl / gm[case9, k].min_ms for k in ("tinylearn C++ scalar", "tinylearn C++ SIMD")}
    print(f"{case9}: one core: C++ scalar {best['tinylearn C++ scalar']:.1f} GFLOP/s, SIMD "
          f"{best['tinylearn C++ SIMD']:.1f} GFLOP/s = {best['tinylearn C++ SIMD'] / peak1:.0%} of the FMA peak "
          f"{peak1:.0f}; parallel {gm[case9, 'tinylearn C++ parallel'].median_ms:.2f} ms vs numpy fp32 sgemm "
          f"{gm[case9, 'numpy fp32 sgemm'].median_ms:.2f} ms")  # fmt: skip
    if "avx2" in cpu.cpu_features():  # TINYLEARN_CPU_FEATURES=scalar makes "SIMD" run the scalar code
        assert best["tinylearn C++ SIMD"] > 4 * best["tinylearn C++ scalar"]
        assert 0.15 * peak1 < best["tinylearn C++ SIMD"] < 1.05 * peak1
        assert gm[case9, "tinylearn C++ parallel"].min_ms < 3 * gm[case9, "numpy fp32 sgemm"].min_ms
    if not {"avx512_bf16", "amx_bf16"} & cpu_flags():  # torch's bf16 GEMM has no fast path here
        assert gm[case9, "torch bf16"].min_ms > 2 * gm[case9, "torch fp32"].min_ms
    if gm[case9, "tinylearn C++ dpbf16"].median_ms is not None:  # AVX512_BF16: two k per instruction
        dp9 = fl / gm[case9, "tinylearn C++ dpbf16"].min_ms
        print(f"  dpbf16 {dp9:.1f} GFLOP/s = {dp9 / best['tinylearn C++ SIMD']:.2f}x the widening SIMD kernel")
        assert dp9 > 1.3 * best["tinylearn C++ SIMD"]
has_dpbf16 = backends.load_C("gemm").bf16_dot_path() == "dpbf16"
assert (gm[gt.cases()[0], "tinylearn C++ dpbf16"].median_ms is not None) == has_dpbf16
assert all((r.median_ms is not None) != r.note.startswith("n/a") for r in gt.rows)

# %% [markdown]
# Reading it: the widening kernel is an fp32 GEMM with half the bytes to read — the C++ SIMD rung runs well above the
# scalar one (asserted: more than 4x; the printed share of the FMA peak is its roofline position), and the parallel
# default stays within 3x of numpy's fp32 sgemm (OpenBLAS) on the fastest runs (asserted; the printed medians move a
# lot between runs on a shared 2-core box). Where the CPU has AVX512_BF16 the dpbf16 row runs and is asserted faster
# than the widening rung by more than 1.3x (two k per `vdpbf16ps`; ~2.2x on this Zen 5, where it matches torch's
# oneDNN bf16 GEMM), and the parallel default uses it; elsewhere the row says n/a. torch's bf16 GEMM without
# AVX512_BF16/AMX is many times slower than its fp32 one (asserted there: more than 2x), and tinygrad's CPU backend
# cannot compile bf16 with this clang (the row says so).
#
# **The training step** (`tinylearn bench amp`, timings from a shared 2-core machine): the same MLP step in fp32 and
# under bf16 autocast. With the GEMMs, casts and ReLU as kernels, tinylearn's bf16 step stays within 1.5x of its fp32
# step (asserted where the SIMD GEMM runs, on the two steps timed interleaved; the ratios are printed). Without
# AVX512_BF16 it gains little either way: the FLOPs are fp32 FLOPs, bf16 only halves the bytes, and every cast is
# one more graph node; torch's bf16 step is slower than its fp32 one there, as the GEMM table predicts. This is the
# "performance gain" input of the per-layer precision planner below: measure it on the target, do not assume it.

# %%
# NBVAL_IGNORE_OUTPUT
t = step_table("mlp", 256, 128)
print(t.to_text())
plot_table(t)
plt.show()
case9 = t.cases()[0]
cols9 = {"fp32": ("tinylearn fp32", "torch fp32", "tinygrad float32"),
         "bf16": ("tinylearn autocast bf16", "torch autocast bf16", "tinygrad bfloat16"),
         "fp16": (None, None, "tinygrad half")}  # fmt: skip


def cell9(impl):
    r = t.get(case9, impl) if impl else None
    return "-" if r is None else ("n/a" if r.median_ms is None else f"{r.median_ms:.2f} ms")


print(f"\n{'step time':10s} {'tinylearn':>12s} {'torch':>12s} {'tinygrad':>12s}")
for prec, impls in cols9.items():
    print(f"{prec:10s} " + " ".join(f"{cell9(k):>12s}" for k in impls))
# the claims of this cell: tinylearn's bf16 step costs about its fp32 step (within a factor 1.5 either way: room
# for the timing noise of a loaded box), measured by `step_ratio`: the two steps timed interleaved and compared on
# their fastest calls, so load hits both alike (the table above times one row after the other); every row is
# either timed or says why not ("n/a: ...")
tl32, tl16 = t.get(case9, "tinylearn fp32").min_ms, t.get(case9, "tinylearn autocast bf16").min_ms
ratio9 = step_ratio("mlp", 256, 128)
print(f"tinylearn bf16 / fp32 step time: table (fastest runs) {tl16 / tl32:.2f}x, interleaved {ratio9:.2f}x")
if "avx2" in cpu.cpu_features():  # the C++ GEMM's SIMD path (with it forced off, numpy's reference GEMM runs)
    assert 1 / 1.5 < ratio9 < 1.5
assert all((r.median_ms is not None) != r.note.startswith("n/a") for r in t.rows)
assert all(t.get(case9, k).median_ms is not None for k in ("tinylearn fp32", "torch fp32", "torch autocast bf16"))

# %% [markdown]
# ### A per-layer precision planner [Q105]
#
# `tl.amp.layer_stats` collects, per layer, the stability metrics over a few batches (largest activation and
# gradient, the 1% quantile of the nonzero |grad|, the gradient's batch-to-batch signal-to-noise, the int8 weight
# error); `tl.amp.plan_precision` turns them into a format per layer: (1) **gates** -- fp16 only if the largest
# value times a margin of 8 fits under 65504 and the small gradients times the loss scale stay above 2^-24;
# bf16/fp16 only while the gradient noise exceeds their rounding; int8 weights only if their relative error is
# under 2%; (2) a **performance model** -- the step-time ratio of each format measured in the table above (bf16
# is chosen for speed only where it measured faster than fp32); (3) **memory pressure** -- from the fastest allowed
# format, narrower formats are taken by least time added per byte saved until the bytes fit. The digits MLP with
# its loss scaled by 2^-20 (the gradients of section 3): without loss scaling fp16 is gated off, with S = 2^16 it
# is allowed; the last layer is pinned to fp32; the memory budget is 55% of the all-fp32 bytes.

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(0)
mlp9 = DigitsMLP((128, 64))
lin9 = [(n, m) for n, m in mlp9.named_modules() if isinstance(m, tl.nn.Linear)]
batches9 = iter(tl.data.DataLoader(Xtr, ytr, batch_size=64, shuffle=True, seed=3))


def run9():  # forward + backward of one batch; returns each Linear's output
    xb_, yb_ = next(batches9)
    h, acts_ = xb_.flatten(1), {}
    for mod in mlp9.net:
        h = mod(h)
        acts_.update({n: h.data for n, m in lin9 if m is mod})
    (F.cross_entropy(h, yb_) * 2.0**-20).backward()
    return acts_


stats9 = amp.layer_stats(lin9, run9, batches=4)
speed9 = {"bf16": tl16 / tl32, "fp16": tl16 / tl32}  # bf16 measured above; fp16 not timed, taken as bf16's; int8 1.0
fp32_bytes = sum(4 * (s_["n_params"] + s_["act_elems"]) for s_ in stats9)
plans9 = {
    "no scaling, no budget": amp.plan_precision(stats9, speed9, fp32_layers=["net.5"]),
    "S=2^16, no budget": amp.plan_precision(stats9, speed9, loss_scale=2.0**16, fp32_layers=["net.5"]),
    "S=2^16, 55% budget": amp.plan_precision(
        stats9, speed9, mem_budget=0.55 * fp32_bytes, loss_scale=2.0**16, fp32_layers=["net.5"]
    ),
}
for k, pl in plans9.items():
    print(f"{k:22s} {pl['formats']}  bytes {pl['bytes'] / fp32_bytes:5.1%} of fp32  time x{pl['time']:.2f}  "
          f"fp16 allowed: {[n for n, fm in pl['allowed'].items() if 'fp16' in fm]}")  # fmt: skip
assert all("fp16" not in v for v in plans9["no scaling, no budget"]["allowed"].values())  # 2^-20 grads underflow
assert all(("fp16" in v) == (n != "net.5") for n, v in plans9["S=2^16, no budget"]["allowed"].items())
for pl in plans9.values():  # every layer gets an allowed format, the pinned head stays fp32
    assert all(fm in pl["allowed"][n] for n, fm in pl["formats"].items()) and pl["formats"]["net.5"] == "fp32"
    if pl is not plans9["S=2^16, 55% budget"]:  # no budget: the fastest allowed format, ties to the wider one
        assert all(fm == min(pl["allowed"][n], key=lambda f: (({"fp32": 1.0, "int8": 1.0} | speed9)[f],
                   amp.planner.FORMATS.index(f))) for n, fm in pl["formats"].items())  # fmt: skip
pb = plans9["S=2^16, 55% budget"]
assert pb["fits"] and pb["bytes"] <= 0.55 * fp32_bytes
assert pb["time"] >= plans9["S=2^16, no budget"]["time"]  # the no-budget plan is the fastest; a budget can only cost

# %% [markdown]
# Reading the table: tinylearn's bf16 step costs about its fp32 step (within 1.5x, asserted above); for torch,
# whether bf16 beats fp32 depends on the CPU's bf16 units (AVX512-BF16/AMX) and on the load, so no ordering is
# asserted. What does not depend on the CPU: both tinylearn and torch keep fewer bytes for backward under
# bf16 autocast (the saved-MB column), while tinylearn's measured peak stays within 15%, because fp32 master
# weights, their fp32 gradients and the bf16 weight copies all live during the step.

# %%
saved9 = {r.impl: r.extra.get("saved_mb") for r in t.rows}
peak9 = {r.impl: r.peak_mb for r in t.rows}
print("saved MB:", {k: v for k, v in saved9.items() if v is not None}, "| tinylearn peak MB:",
      {k: round(v, 3) for k, v in peak9.items() if v is not None})  # fmt: skip
assert (
    saved9["tinylearn autocast bf16"] < saved9["tinylearn fp32"]
    and saved9["torch autocast bf16"] < saved9["torch fp32"]
)
assert abs(peak9["tinylearn autocast bf16"] / peak9["tinylearn fp32"] - 1) < 0.15


# %% [markdown]
# ## Recap (interview answers)
#
# - **Loss scaling [Q81]**: fp16 rounds |g| <= 2^-25 (about 3e-8, half its smallest subnormal 2^-24) to zero; scale
#   the loss by S so gradients live in fp16's range, unscale in fp32 before the step. Dynamic: Inf/NaN in any
#   gradient -> skip the step, S /= 2; after N clean steps S *= 2; after `fallback_after` skips in a row, leave
#   autocast and train in fp32. bf16 has fp32's range and usually needs no scaling.
# - **Per-group scales [Q253]**: one global S is pinned by the layer with the largest gradients and flushes a
#   layer with 1e-10-scale gradients to zero (96% of them here); one S_l per group, each with its own
#   backoff/growth on its own overflow, keeps all of them (0% zeros, 2e-4 relative error). Adaptive: monitor each
#   group's flushed-to-zero fraction and grow at once while it exceeds a tolerance divided by the layer's relative
#   sensitivity (Hessian trace): the sensitive group cleared its underflow in over 4x fewer steps here.
# - **Autocast [Q81]**: GEMM-like ops (matmul/linear/conv) in bf16/fp16 with fp32 accumulation; softmax,
#   layer_norm, sum, losses, exp/log/pow in fp32 (torch's CUDA list; tinylearn adds batch_norm/mean/var); master
#   weights and optimizer states stay fp32. bf16 = upper 16 bits of fp32, round to nearest even by adding
#   0x7FFF + lsb.
# - **FP4 / INT2 / MX [Q74]**: 16 or 4 levels; train with STE and fp32 master weights, keep first/last layers
#   high precision, use block scales: MX gives each 32 values a power-of-two scale (4.25 bits/elt for MXFP4).
# - **Bit allocation [Q148]**: Hutchinson Tr(H_l) per layer -- of the weights, or of an activation through a zero
#   probe added to it -- Omega = Tr(H)/n * ||Q_b(x) - x||^2, minimise under a bit budget: sensitive tensors keep
#   more bits; the same bits spent the other way round lose accuracy.
# - **Checkpointing [Q64] [Q119] [Q169]**: keep segment inputs, recompute inside in backward (+1 forward). Peak
#   ~ k + n/k with every segment checkpointed and freed after its backward (k = sqrt(n)); with torch-style
#   checkpoint_sequential (last segment kept) and a graph that lives until the backward ends, k + 2n/k + 1
#   (k = sqrt(2n)). Under a budget: greedy by memory saved per unit of recompute, or the exact knapsack DP with
#   the recompute working set (kept + largest rebuilt). Exact only if the recomputation replays the forward's
#   RNG and autocast state.
# - **Store vs recompute on several nodes [Q239]**: P = alpha * memory - beta * recompute - gamma * communication;
#   recompute in decreasing P until the budget fits. Without the gamma term a sequence-parallel all-gathered input
#   looks free and costs a repeated all-gather (4.1 vs 3.5 ms extra per block here, 3.5 = brute-force optimum).
# - **Saved activations in mixed precision [Q250]**: storing a Linear's saved input in fewer bits adds
#   g^T (x - q(x)) to its dW only, so per-layer errors add up; measure each (layer, format) once and solve the
#   multiple-choice knapsack under the byte budget. Below 2 bytes per element the plan keeps the logits layer's
#   input wider than int8 and beats all-int8 by more than 2x in gradient error (asserted).
# - **Low-rank saved activations [Q102b]**: a Linear needs x only for dW = g^T x; keep the truncated SVD with the
#   smallest rank meeting a Frobenius tolerance ((N + in) r numbers), dW = (g^T U S) V^T, dX exact. On the digits
#   MLP: tol 0.1 keeps 38% of the numbers for a 4% dW error; pays only when r < N in / (N + in).
# - **Memory [Q64] [Q119]**: params + grads + optimizer (Adam 2x) + activations + backward workspace (gradients in
#   flight, fp32 copies of weight grads under autocast); peak = max(backward, optimizer step). 16 bytes/param for
#   mixed-precision Adam (7B: 107 GB, 70B: 1.1 TB before activations) -> sharding (ZeRO) + recomputation;
#   FlashAttention removes the 5as/h attention-matrix term of the activations.
# - **Low-precision optimizer state [Q219]**: shard m, v (ZeRO-1) and store them in bf16/fp16/int8 with an error-
#   feedback buffer per shard (the stored state's rounding error, added back before the next update): without it
#   v's 0.1% steps round away in bf16 and Adam drifts (int8: 4.6% from fp32-state Adam after 300 steps); with it
#   the drift is more than 100x smaller (bf16 + buffer: fp32's bytes; int8 + buffer: half of them).
# - **Precision as a plan [Q105]**: gate each layer's formats on measured ranges and gradient noise, rank them by
#   measured step time, narrow them under memory pressure. bf16 saves activation bytes, not model-state bytes,
#   and is a speed win only on hardware with bf16 units.
#
# ## Exercises (`exercises/11_mixed_precision_memory/`)
#
# Fill in `stubs.py`, then `pytest exercises/11_mixed_precision_memory` (or `tinylearn check amp`):
#
# 1. `bf16_bits` -- float32 -> bfloat16 rounding by bit manipulation (bit-exact vs torch);
# 2. `update_scale` -- the GradScaler update rule;
# 3. `checkpoint_sequential` -- segments + `tl.autograd.checkpoint`;
# 4. `model_state_bytes` and `activation_bytes` -- the memory formulas.
