# %% [markdown]
# # 11 · Mixed precision and training memory: autocast, loss scaling, FP4/INT2/MX, checkpointing, a memory model
#
# **Interview questions this notebook answers** (seed 003: 64, 74, 81, 105, 119, 148, 169, 253):
#
# 1. [Q253] Why does fp16 training need loss scaling, and how does a dynamic loss scaler decide the scale?
#    [Q81] How is a NaN/Inf step detected and rolled back?
# 2. What does `autocast` actually run in low precision, and what stays in fp32? What is bf16 and how do you round
#    to it?
# 3. [Q74] What do FP4 (E2M1) and INT2 look like, how does a straight-through estimator train through them, and
#    why do MX formats share one exponent per 32 elements?
# 4. [Q148] How do you use a Hessian-trace estimate (Hutchinson) to give sensitive layers more bits?
# 5. [Q64] [Q119] Activation checkpointing: what does it cost, what does it save, why sqrt(n) segments, and how do
#    you choose what to recompute under a memory budget?
#    [Q169] Which layers to recompute, by memory saved per unit of recompute.
# 6. [Q64] [Q119] How much memory does training take? Params, grads, Adam states, activations, backward workspace
#    -- for the digits MLP/CNN and TinyGPT here (predicted vs measured, fp32 and bf16, SGD and Adam) and for 7B /
#    70B models.
# 7. [Q105] What does bf16 buy on this hardware (step time, memory), for tinylearn, torch and tinygrad?
#
# Everything is `tinylearn.amp`, `tl.autograd.checkpoint` and `tl.memory.estimate / measure_peak`.

# %%
import contextlib
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

import tinylearn as tl
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
# ## 1. Three float formats [Q253]
#
# | format | bits (sign / exponent / mantissa) | max | smallest normal | smallest subnormal | epsilon |
# |---|---|---|---|---|---|
# | float32 | 1 / 8 / 23 | 3.4e38 | 1.2e-38 | 1.4e-45 | 1.2e-7 |
# | bfloat16 | 1 / 8 / 7 | 3.4e38 | 1.2e-38 | 9.2e-41 | 7.8e-3 |
# | float16 | 1 / 5 / 10 | 65504 | 6.1e-5 | 6.0e-8 | 9.8e-4 |
#
# bf16 is the top half of a float32: same range, 3 significant digits. Rounding float32 -> bf16 to nearest-even
# is integer arithmetic on the bits: add `0x7FFF + lsb` and shift right by 16 (`tl.amp.bf16_bits`); it agrees
# bit for bit with torch. fp16 has 3 more mantissa bits but overflows at 65504 and flushes below 6e-8 to zero.

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

fi = amp.finfo(amp.bfloat16)
assert float(fi.max) > 3.3e38 and float(fi.eps) == 2.0**-7
print("ml_dtypes bfloat16: max", fi.max, "eps", fi.eps)

# %% [markdown]
# ## 2. Autocast: which ops run in low precision, which fall back to fp32 [Q81]
#
# `with tl.autocast(dtype="bfloat16")` routes every op through one hook in `Function.apply` that looks it up in
# torch's lists (`tl.amp.LOWER_PRECISION_OPS`, `tl.amp.FP32_OPS`):
#
# - **lower precision** -- matmul / linear / conv2d: inputs cast to bf16, products accumulated in fp32, output
#   stored in bf16 (torch's CPU list also has bmm, addmm, conv1d/3d, conv_transpose, SDPA, ...);
# - **fp32** -- softmax, log_softmax, layer_norm, batch_norm, sum/mean/var, cross-entropy, exp/log/pow:
#   inputs cast up, output fp32. (This is torch's CUDA list. On CPU torch keeps only the losses in fp32 and
#   runs softmax/norms in the input dtype with fp32 math inside: the results differ by bf16 rounding.)
# - everything else (add, relu, pooling, reshape) runs in whatever dtype arrives.
#
# The casts are differentiable, so the fp32 parameters ("master weights") receive fp32 gradients. The fp32 list is
# the static half of "fall back to a safe precision" (Q81): ops whose bf16 result would overflow or lose the sum
# never run in bf16; the GradScaler below is the dynamic half.

# %%
print("lower precision:", sorted(amp.LOWER_PRECISION_OPS))
print("fp32:          ", sorted(amp.FP32_OPS))

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
# ## 3. fp16 without loss scaling underflows; with a GradScaler it trains like fp32 [Q253] [Q81]
#
# fp16's smallest subnormal is 6e-8. To make the effect visible on a model this small we multiply the loss by
# 2^-20 (gradients of order 1e-9 to 1e-11 -- what long sequences of small per-token losses or very deep nets
# produce). Adam is invariant to the gradient scale (with a tiny eps), so fp32 trains exactly as without the
# factor. Under `autocast("float16")` the gradient that enters the fp16 part of the graph is rounded to fp16:
# without scaling it is 0 everywhere and nothing learns. The GradScaler multiplies the loss by S, checks the
# unscaled gradients for Inf/NaN (skipping that step and halving S), and doubles S after `growth_interval`
# clean steps -- the same state machine as `torch.amp.GradScaler` (tests/test_amp.py compares the sequences).


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
# The update rule on a scripted sequence of clean / overflowing steps (exact, like `tests/test_amp.py`):

# %%
scaler = amp.GradScaler(init_scale=1024.0, growth_interval=2)
p = tl.nn.Parameter(tl.ones(2))
opt = tl.optim.SGD([p], lr=0.1)
seq = []
for bad in [0, 0, 1, 0, 0, 0, 1, 1, 0]:
    scaler.scale((p * 0).sum())
    p.grad = tl.Tensor(np.array([np.inf if bad else 1.0, 1.0], np.float32))
    scaler.step(opt)
    scaler.update()
    seq.append(scaler.get_scale())
print(seq, "skipped steps:", scaler.n_skipped)
assert seq == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0, 1024.0, 512.0, 512.0] and scaler.n_skipped == 3

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
# total under an average-bit budget (exhaustively for 3 layers); here 3 bits on average from {2, 4, 8}.

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


def accuracy_with(bits):
    saved = [p.data.copy() for p in ws]
    for p, b in zip(ws, bits):
        p.data = amp.quantize_symmetric(p.data, b).astype(np.float32)
    with tl.no_grad():
        a = float(np.mean(cnn(tl.Tensor(Xte)).data.argmax(-1) == yte))
    for p, s in zip(ws, saved):
        p.data = s
    return a


bits, info = amp.allocate_bits(traces, [p.data for p in ws], avg_bits=3.0, candidates=(2, 4, 8))
order = np.argsort(traces / np.array([p.data.size for p in ws]))
reversed_bits = [0] * 3
for i, j in zip(order, np.argsort(-traces / np.array([p.data.size for p in ws]))):
    reversed_bits[i] = bits[j]  # the same bit set, given to the least sensitive layers first
for n, t, p in zip(names, traces, ws):
    print(f"{n:18s} n={p.data.size:5d}  Tr(H)~{t:9.3f}  Tr/n {t / p.data.size:.2e}")
rows = {"fp32": [32, 32, 32], "Hessian allocation": bits, "uniform 2 bit": [2, 2, 2], "reversed": reversed_bits}
acc = {k: accuracy_with(v) if k != "fp32" else accuracy_with([16, 16, 16]) for k, v in rows.items()}
for k, v in rows.items():
    print(f"{k:20s} bits {v}  test accuracy {acc[k]:.3f}")
assert info["avg_bits"] <= 3.0 and (traces > 0).all()
assert acc["Hessian allocation"] >= acc["reversed"] - 0.02

# %% [markdown]
# ## 6. Activation checkpointing [Q64] [Q119]
#
# `tl.autograd.checkpoint(fn, x)` runs `fn` without recording its graph and keeps only `x`; in the backward it
# restores the RNG state (dropout draws the same masks), recomputes `fn(x)` with grad on and backpropagates through
# it. Same outputs and gradients bit for bit (tests/test_checkpoint.py), one extra forward per segment -- also under
# autocast: the recomputation runs under the autocast state the forward had (saved with the RNG state, as torch
# does), not the one around the backward, and the incoming gradient is not rounded to the bf16 segment output.
# `checkpoint_sequential(layers, k, x)` keeps the k segment inputs plus one segment's internals during the backward:
# about n/k + k layers' worth of activations, minimal at k = sqrt(n). Measured with `tl.memory.measure_peak`
# (every numpy allocation of the step through a pooled caching allocator):

# %%
nn = tl.nn
n_layers = 32


def ck_step(k):
    def f():
        tl.manual_seed(0)
        net = nn.Sequential(*[m for _ in range(n_layers // 2) for m in (nn.Linear(128, 128), nn.ReLU())])
        x_ = tl.randn(1024, 128)
        out_ = tl.autograd.checkpoint_sequential(net, k, x_) if k > 1 else net(x_)
        out_.sum().backward()

    return f


ks = [1, 2, 4, 6, 8, 16]
tl.autograd.reset_recompute_count()
peaks = {k: measure_peak(ck_step(k)) for k in ks}
act = 1024 * 128 * 4
params_b = (n_layers // 2) * (128 * 128 + 128) * 4
for k in ks:
    print(f"segments {k:2d}: measured peak {peaks[k] / 2**20:6.2f} MiB")
print("segments recomputed in total:", tl.autograd.recompute_count(), "=", sum(k - 1 for k in ks if k > 1))
assert tl.autograd.recompute_count() == sum(k - 1 for k in ks if k > 1)
best = min(peaks, key=peaks.get)
print("best k:", best, " sqrt(n layers) =", round(np.sqrt(n_layers), 1))
assert peaks[best] < 0.7 * peaks[1] and 4 <= best <= 16

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
plt.plot(ks, [peaks[k] / 2**20 for k in ks], "o-", label="measured peak")
kk = np.linspace(1.5, 16, 50)
plt.plot(kk, (params_b * 2 + act * (n_layers / kk + kk)) / 2**20, "--", label="params+grads + act*(n/k + k)")
plt.axvline(np.sqrt(n_layers), color="gray", lw=0.8, label="sqrt(n)")
plt.xlabel("segments k")
plt.ylabel("MiB")
plt.legend()
plt.title("checkpoint_sequential on 32 layers")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Which layers to recompute under a budget [Q64] [Q119] [Q169]
#
# With per-layer activation bytes A_i and forward
# cost F_i (recomputing layer i costs F_i again), dropping the stored activation of layer i saves A_i and costs
# F_i. Minimising recompute subject to sum of kept A_i <= M is a knapsack; the greedy rule drops layers in
# decreasing A_i / F_i (most memory saved per unit of recompute) until the kept set fits: cheap elementwise layers
# (ReLU, dropout, norms: big activations, tiny FLOPs) go first, GEMMs last -- what selective recomputation in
# Megatron does for attention softmax/dropout.


# %%
def greedy_recompute(A, Fc, budget):
    keep = set(range(len(A)))
    for i in sorted(range(len(A)), key=lambda i: -A[i] / Fc[i]):
        if sum(A[j] for j in keep) <= budget:
            break
        keep.discard(i)
    return sorted(set(range(len(A))) - keep), sum(Fc[i] for i in range(len(A)) if i not in keep)


A = [4, 4, 1, 4, 4, 1, 8, 8]  # MB: linear out, gelu out, (small) norm stats, ..., attention scores
Fc = [10, 0.5, 0.2, 10, 0.5, 0.2, 4, 0.5]  # ms forward
drop, cost = greedy_recompute(A, Fc, budget=16)
print("recompute layers", drop, "extra forward ms", cost, "kept MB", sum(A) - sum(A[i] for i in drop))
assert drop == [1, 2, 4, 5, 7] and sum(A) - sum(A[i] for i in drop) <= 16

# %% [markdown]
# ## 7. Where training memory goes: predicted vs measured [Q64] [Q119]
#
# `tl.memory.estimate(model, input_shape, optimizer, amp, checkpoint_segments)` is the estimator a checkpointing
# plan under a budget M needs. It adds params, grads, optimizer states (Adam: 2x params) and the activations the
# graph keeps (counted from one forward on a zeros batch: layer outputs, masks, im2col buffers, the bf16 weight
# copies under autocast; for TinyGPT mostly the [B, H, T, T] attention scores and probabilities). The **backward
# workspace** comes from walking the graph in the engine's order: gradients waiting for their node, the gradients
# a node is producing (fp32 even for bf16 tensors: numpy returns bf16 GEMMs in fp32), the fp32 copy a cast's
# backward makes of each weight gradient, a dcol temporary next to each im2col buffer. The prediction is the
# larger of the backward peak and the optimizer-step peak (params + grads + states + the graph the live loss still
# holds). `measure_peak` runs the real step from scratch (model creation included) with every numpy allocation
# served by a C++ caching allocator.
#
# An earlier version took the workspace to be the largest saved activation and underestimated bf16 + SGD on the
# MLPs beyond the 10% budget: with SGD the peak is in the backward, at the cast of the largest weight, where that
# weight's fp32 GEMM gradient and the fp32 copy the cast makes of it are alive together, so the bf16 + SGD MLP
# row's workspace exceeds one fp32 512x512 weight (1 MiB). With Adam the step (2 x params of states) is the
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
# optimizer changes their measured peak by under 5%. bf16 autocast does not by itself shrink the peak here: the
# CNN's grows (its convs are emulated in fp32 on rounded inputs, so fp32 and bf16 copies are both kept) and
# TinyGPT's drops by under 15% (softmax, LayerNorm and the loss stay fp32; the scores are [B, H, T, T]).


# %%
meas7 = {(r[0].split()[0], r[1], r[2]): r[4] for r in table7}
assert meas7["MLP", None, "adam"] > meas7["MLP", None, "sgd"]
est7 = {(r[0].split()[0], r[1], r[2]): r[3] for r in table7}
assert est7["MLP", "bfloat16", "sgd"]["workspace"] > 512 * 512 * 4  # more than one fp32 weight in flight
assert est7["MLP", "bfloat16", "adam"]["peak"] > est7["MLP", "bfloat16", "sgd"]["peak"]  # Adam's step is the peak
assert all(
    abs(meas7[m, a, "adam"] / meas7[m, a, "sgd"] - 1) < 0.05 for m in ("CNN", "TinyGPT") for a in (None, "bfloat16")
)
assert meas7["CNN", "bfloat16", "adam"] > meas7["CNN", None, "adam"]
assert 0.85 < meas7["TinyGPT", "bfloat16", "adam"] / meas7["TinyGPT", None, "adam"] < 1.0


# %% [markdown]
# ## 8. 7B and 70B [Q64] [Q119]
#
# Mixed-precision Adam keeps **16 bytes per parameter** (ZeRO, Rajbhandari et al. 2020): bf16 params 2 + bf16 grads
# 2 + fp32 master copy 4 + Adam m 4 + v 4. Activations per transformer layer, 16-bit, no recomputation, no
# tensor/sequence parallelism (Korthikanti et al. 2022): s*b*h*(34 + 5*a*s/h) bytes; with full recomputation only
# the layer input, 2*s*b*h, stays.
#
# **Assumptions**: LLaMA-like shapes (7B: 6.7e9 params, 32 layers, h = 4096, 32 heads; 70B: 68.98e9 params,
# 80 layers, h = 8192, 64 heads, counted as full multi-head attention), sequence s = 4096 tokens, micro-batch
# b = 1, one device holding everything (no ZeRO/FSDP sharding, no offload), no fragmentation, no framework or
# communication workspace, no KV cache (training), the logits/loss buffers not counted. GB = 1e9 bytes.

# %%
configs = {"7B": (6.7e9, 32, 4096, 32), "70B": (68.98e9, 80, 8192, 64)}
big = {}
print(f"{'model':5s} {'bf16 W':>7s} {'bf16 g':>7s} {'fp32 W':>7s} {'Adam':>7s} {'states':>7s} {'activ':>7s} "
      f"{'act+rc':>7s} {'total':>7s} {'total+rc':>8s} {'80GB GPUs':>9s}   (GB)")  # fmt: skip
for name, (n, L, h, a) in configs.items():
    r = transformer_memory(n, L, h, a, seq=4096, micro_batch=1)
    rc = transformer_memory(n, L, h, a, seq=4096, micro_batch=1, checkpoint=True)
    big[name] = (r, rc)
    g = {k: v / 1e9 for k, v in r.items()}
    print(f"{name:5s} {g['params_16bit']:7.1f} {g['grads_16bit']:7.1f} {g['master_params_fp32']:7.1f} "
          f"{g['adam_states_fp32']:7.1f} {g['model_states']:7.1f} {g['activations']:7.1f} "
          f"{rc['activations'] / 1e9:7.1f} {g['total']:7.1f} {rc['total'] / 1e9:8.1f} "
          f"{int(np.ceil(rc['total'] / 80e9)):9d}")  # fmt: skip
r7, r70 = big["7B"][0], big["70B"][0]
assert r7["model_states"] == 16 * 6.7e9 and abs(r70["model_states"] - 16 * 68.98e9) < 1
assert 100e9 < r7["activations"] < 110e9 and 500e9 < r70["activations"] < 540e9
assert big["7B"][1]["activations"] < 0.02 * r7["activations"]
assert int(np.ceil(r70["model_states"] / 80e9)) == 14

# %% [markdown]
# Reading the table: a 7B model needs about 107 GB of model states alone -- more than one 80 GB GPU before any
# activation -- and about as much again in activations at s = 4096 without recomputation; full recomputation cuts
# activations by more than 50x (to the layer inputs). A 70B model needs about 1.1 TB of states: 14 80-GB GPUs
# just to hold them, which is why ZeRO/FSDP shard params, grads and optimizer states across data-parallel ranks.
# The last column counts 80-GB GPUs for states + recomputed activations: 2 for 7B, 14 for 70B.

# %%
assert 105e9 < r7["model_states"] < 110e9 and r7["activations"] > 0.9 * r7["model_states"]
assert r7["activations"] / big["7B"][1]["activations"] > 50 and 1.0e12 < r70["model_states"] < 1.2e12
assert [int(np.ceil(big[k][1]["total"] / 80e9)) for k in ("7B", "70B")] == [2, 14]


# %% [markdown]
# ## 9. Benchmark: a training step in fp32 vs bf16 autocast (tinylearn, torch, tinygrad) [Q105]
#
# `tinylearn bench amp` (timings below were taken on a shared, loaded machine). On a CPU without
# AVX512-BF16/AMX, bf16 matmuls are emulated (fp32 accumulation loops), so bf16 is about memory and bandwidth, not
# speed; tinygrad's CPU backend compiles fp16 but its clang target may reject `__bf16` (the row then says so).
# This is the "performance gain" input of a per-layer precision planner (Q105): measure it on the target, do not
# assume it.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.amp.bench import step_table  # noqa: E402

t = step_table("mlp", 256, 128)
print(t.to_text())
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
timed = [r for r in t.rows if r.median_ms is not None]
assert all(0.01 < r.median_ms < 2000 for r in timed) and len(timed) >= 5
assert t.get(case9, "torch autocast bf16").median_ms is not None

# %% [markdown]
# Reading the table: every framework runs this step in well under 2 s (milliseconds when the machine is idle);
# whether bf16 beats fp32 depends on the CPU's bf16 units (AVX512-BF16/AMX) and on the load, so no ordering is
# asserted. What does not depend on the CPU: both tinylearn and torch keep fewer bytes for backward under
# bf16 autocast (the saved-MB column), while tinylearn's measured peak stays about the same, because fp32 master
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
# - **Loss scaling [Q253] [Q81]**: fp16 flushes |g| < 6e-8 to zero; scale the loss by S so gradients live in
#   fp16's range, unscale in fp32 before the step. Dynamic: Inf/NaN in any gradient -> skip the step, S /= 2;
#   after N clean steps S *= 2. bf16 has fp32's range and usually needs no scaling.
# - **Autocast [Q81]**: GEMM-like ops (matmul/linear/conv) in bf16/fp16 with fp32 accumulation; reductions,
#   softmax, norms, losses in fp32 (the static fallback to a safe precision); master weights and optimizer states
#   stay fp32. bf16 = upper 16 bits of fp32, round to nearest even by adding 0x7FFF + lsb.
# - **FP4 / INT2 / MX [Q74]**: 16 or 4 levels; train with STE and fp32 master weights, keep first/last layers
#   high precision, use block scales: MX gives each 32 values a power-of-two scale (4.25 bits/elt for MXFP4).
# - **Bit allocation [Q148]**: Hutchinson Tr(H_l) per layer, Omega = Tr(H)/n * ||Q_b(W) - W||^2, minimise under a
#   bit budget: sensitive layers keep more bits.
# - **Checkpointing [Q64] [Q119] [Q169]**: keep segment inputs, recompute inside in backward (+1 forward); k =
#   sqrt(n) segments -> O(sqrt n) activations; under a budget, recompute layers with the highest memory/compute
#   ratio. Exact only if the recomputation replays the forward's RNG state and autocast state.
# - **Memory [Q64] [Q119]**: params + grads + optimizer (Adam 2x) + activations + backward workspace (gradients in
#   flight, fp32 copies of weight grads under autocast); peak = max(backward, optimizer step). 16 bytes/param for
#   mixed-precision Adam (7B: 107 GB, 70B: 1.1 TB before activations) -> sharding (ZeRO) + recomputation.
# - **Precision as a plan [Q105]**: bf16 saves activation bytes, not model-state bytes, and is a speed win only on
#   hardware with bf16 units -- measure step time and peak before choosing per-layer precisions.
#
# ## Exercises (`exercises/11_mixed_precision_memory/`)
#
# Fill in `stubs.py`, then `pytest exercises/11_mixed_precision_memory` (or `tinylearn check amp`):
#
# 1. `bf16_bits` -- float32 -> bfloat16 rounding by bit manipulation (bit-exact vs torch);
# 2. `update_scale` -- the GradScaler update rule;
# 3. `checkpoint_sequential` -- segments + `tl.autograd.checkpoint`;
# 4. `model_state_bytes` and `activation_bytes` -- the memory formulas.
