# ruff: noqa: E501  (markdown table rows cannot wrap; code lines are kept to 120 by ruff format)
# %% [markdown]
# # 03 — Quantization: INT8 / INT4 / FP8, observers, fake-quant and QAT, an int8 GEMM, PTQ end to end
#
# **Interview questions this notebook answers** (seed 003; the section answering question n carries `[Qn]`):
# - **[Q21]** INT8 quantization: affine/symmetric, per-tensor/per-channel, static/dynamic, the int8 GEMM and
#   requantization, fbgemm's 7-bit activations and VNNI, every GEMM path measured (§1–§3, §7, §7b, §7c, §8, §9)
# - **[Q3] [Q51] [Q84]** Making a GEMM fast by doing less: Winograd's inner product and Strassen's recursive
#   2×2 split, exact for integers (§7)
# - **[Q44]** INT4 weights: packing, group-wise scales, PTQ, QAT with LSQ (§5, §6, §8)
# - **[Q45]** FP8 E4M3/E5M2: every code, saturation, delayed scaling (§4, §8)
# - **[Q65]** Dynamic (run-time) vs static quantization; a dynamic int8 Linear vs torch's `quantize_dynamic` (§7c, §10)
# - **[Q66]** Low-bit training: fake quant, the straight-through estimator, LSQ, QAT at equal epochs (§6, §8)
# - **[Q74] [Q148]** FP4/INT2/MX and Hessian-based bit allocation — notebook 11; a measured FP4-vs-INT4 example (§11)
# - **[Q80]** Run-time feedback choosing the int8 GEMM version: measure per shape, cache, re-measure on drift (§7c)
# - **[Q130]** Per-block bit widths under an error bound (§11)
# - **[Q156]** Choosing the clip threshold from calibration data by minimising MSE (§2, §3)
# - **[Q190]** Error feedback for quantized updates (§11)
# - **[Q196]** A learnable activation shift/scale trained with the model and folded into the neighbouring Linear layers (§9)
# - **[Q208]** Splitting a total quantization-error budget across segments by sensitivity, then bit widths (§11)
# - **[Q180]** Bit widths under four objectives (latency, memory, energy, accuracy): enumeration + Pareto front (§11)
# - **[Q238]** Online re-calibration under drift: saturation and MSE monitors, a hysteresis trigger (§10)
#
# The seed's reference answers contain real errors (E4M3's max 448 derived as 2⁸·(1+7/8), which is 480; the NaN code
# used as the saturation value, no STE,
# rounding without carry, misaligned KL histograms); everything below is derived, measured and checked against
# torch instead — the table at the end lists each correction with the cell that proves it.

# %%
# %matplotlib inline
# first: its short OpenMP and OpenBLAS spin-waits are set before torch loads libgomp and numpy OpenBLAS (notebook 00)
import tinylearn as tl

# isort: split
import copy
import os
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from tinylearn.bench import Comparison, plot_table, tinygrad_jit
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.nn.training import evaluate, fit, predict
from tinylearn.quant.modules import DynamicQuantizedLinear

warnings.filterwarnings("ignore")
Q = tl.quant
rng = np.random.default_rng(0)
torch_threads = torch.get_num_threads()
cpu_vendor = next((ln.split(":")[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("vendor_id")), "?")
np_blas = str(np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name", "?"))
torch_blas = "mkl" if torch.backends.mkl.is_available() else "other"
print("quantized dtypes:", {k: v[:2] for k, v in Q.QRANGES.items()})

# %% [markdown]
# ## 1. The number line and the affine map [Q21]
#
# A b-bit integer grid $q \in [q_{min}, q_{max}]$ represents reals through
# $\hat x = (q - z)\,s$, with $q = \mathrm{clamp}(\mathrm{round}(x/s) + z,\ q_{min}, q_{max})$.
# For an observed range $[m, M]$ torch's observers first stretch it to contain 0 ($m' = \min(m,0)$,
# $M' = \max(M,0)$) and then set
# $s = (M' - m')/(q_{max} - q_{min})$, $z = q_{min} - \mathrm{round}(m'/s)$ (affine) or
# $s = \max(|m'|, M') / ((q_{max}-q_{min})/2)$, $z = 0$ (symmetric). Because $z$ is an integer, $x = 0$ maps to
# exactly $q = z$ and back to exactly 0.0 — zero padding and ReLU zeros carry no error.
# `round` is round-half-to-even, and our integer codes equal `torch.quantize_per_tensor` bit for bit.

# %%
x = np.linspace(-1.2, 2.6, 2001).astype(np.float32)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for dtype, sym, ax in (("uint4", False, axes[0]), ("int4", True, axes[1])):
    s, z = Q.calculate_qparams(-1.0, 2.0, dtype, symmetric=sym)
    xh = Q.quantize_dequantize(x, s, z, dtype)
    ax.plot(x, x, "k:", lw=1, label="identity")
    ax.plot(x, xh, lw=1.5, label=f"{dtype} s={s:.3f} z={z}")
    ax.axvspan(-1.0, 2.0, color="C2", alpha=0.08, label="observed range")
    ax.set_title(f"{'symmetric' if sym else 'affine'} {dtype}: x -> x_hat")
    ax.legend(fontsize=8)
    assert Q.quantize_dequantize(np.float32(0.0), s, z, dtype) == 0.0  # zero is exact
plt.tight_layout()
plt.show()

# %%
# the same qparams and integer codes as torch (ties included: k + 1/2 steps)
s, z = Q.calculate_qparams(-0.7, 1.9, "int8")
obs = torch.ao.quantization.MinMaxObserver(dtype=torch.qint8)
obs(torch.tensor([-0.7, 1.9]))
ts, tz = obs.calculate_qparams()
xt = ((rng.integers(-100, 100, 1000) + 0.5) * s).astype(np.float32)
q_ours = Q.quantize(xt, s, z, "int8")
q_torch = torch.quantize_per_tensor(torch.from_numpy(xt), s, z, torch.qint8).int_repr().numpy()
assert np.float32(s) == ts.item() and z == tz.item() and np.array_equal(q_ours, q_torch)
print(f"scale={s:.6f} zero_point={z}; {len(xt)} tie values quantized identically to torch")

# %% [markdown]
# ## 2. Rounding error vs clipping error [Q21] [Q156]
#
# Inside the range the error is at most $s/2$ (uniform rounding noise, variance $s^2/12$); outside it grows without
# bound (clipping). Shrinking the clip threshold $t$ shrinks $s = t/q_{max}$ and the rounding noise but clips more
# of the tail. The optimum depends on the distribution and the bit width:

# %%
data = {
    "gaussian": rng.standard_normal(200_000).astype(np.float32),
    "laplacian": rng.laplace(size=200_000).astype(np.float32),
    "heavy-tailed (t3 + outliers)": np.concatenate([rng.standard_t(3, 200_000), [40.0, -35.0]]).astype(np.float32),
}
fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
best_clip = {}  # (distribution, bits) -> the MSE-optimal threshold / max|x|
for ax, (name, d) in zip(axes, data.items()):
    amax = float(np.abs(d).max())
    ts_ = np.linspace(0.02, 1, 60) * amax
    for bits, dtype in ((8, "int8"), (4, "int4")):
        qmax = 2 ** (bits - 1) - 1
        mse = [np.mean((Q.quantize_dequantize(d, t / qmax, 0, dtype) - d) ** 2) for t in ts_]
        best_clip[(name, bits)] = float(ts_[int(np.argmin(mse))] / amax)
        ax.semilogy(ts_ / amax, mse, label=f"int{bits}")
    ax.set_title(name)
    ax.set_xlabel("clip threshold / max|x|")
    ax.legend()
axes[0].set_ylabel("MSE")
plt.tight_layout()
plt.show()
print("MSE-optimal threshold / max|x|:", ", ".join(f"{n.split()[0]} int{b} {v:.2f}" for (n, b), v in best_clip.items()))
assert all(v < 0.9 for v in best_clip.values())  # clipping some of the range always pays
assert all(best_clip[(n, 4)] < best_clip[(n, 8)] for n in data)  # fewer bits: coarser steps, clip harder
assert all(best_clip[("heavy-tailed (t3 + outliers)", b)] < best_clip[("gaussian", b)] for b in (4, 8))  # tails
assert round(best_clip[("gaussian", 4)], 2) == 0.50 and round(best_clip[("heavy-tailed (t3 + outliers)", 4)], 2) == 0.14

# %% [markdown]
# Fewer bits move the optimum down (the rounding step grows, so clipping more of the tail pays), and so do heavier
# tails: on this data the best int4 threshold is 0.50 of max|x| for the Gaussian and 0.14 for the heavy tail
# (asserted: int4 below int8 for every distribution, heavy tail below Gaussian at both widths).
#
# ## 3. Observers compared: choosing the clip threshold [Q156] [Q21]
#
# `MinMaxObserver` keeps the full range; `PercentileObserver` clips at the 99.99th percentile of |x|;
# `MSEObserver` scans thresholds and minimises the histogram-weighted squared error; `HistogramObserver`
# (TensorRT entropy calibration) minimises $KL(P\,\|\,Q)$ between the clipped reference histogram $P$ and its
# 128-level quantized version $Q$. The threshold for candidate $i$ is `edges[i]`, the *upper edge* of the last
# kept bin — taking a bin centre (or $i+1$) misaligns threshold and histogram, one of the seed's errors.
# MinMax / MovingAverage / PerChannel observers match torch's qparams exactly (tests/quant/test_quant.py).

# %%
observers = {
    "MinMax": lambda: Q.MinMaxObserver("int8", symmetric=True),
    "Percentile 99.99": lambda: Q.PercentileObserver(99.99),
    "MSE": lambda: Q.MSEObserver(),
    "KL (entropy)": lambda: Q.HistogramObserver(method="kl"),
}
rows, chosen = [], {}
for name, d in data.items():
    for oname, make in observers.items():
        o = make()
        for chunk in np.array_split(d, 4):
            o(chunk)
        s, z = o.calculate_qparams()
        err8 = np.mean((Q.quantize_dequantize(d, s, z, "int8") - d) ** 2)
        chosen[(name, oname)] = s * 127.5
        inside = np.abs(d) <= s * 127.5
        bulk8 = np.mean((Q.quantize_dequantize(d[inside], s, z, "int8") - d[inside]) ** 2)
        rows.append((name, oname, s * 127.5, err8, bulk8))
print(f"{'data':30s} {'observer':17s} {'threshold':>9s} {'int8 MSE':>10s} {'MSE inside':>10s}")
for r in rows:
    print(f"{r[0]:30s} {r[1]:17s} {r[2]:9.3f} {r[3]:10.2e} {r[4]:10.2e}")
amax_of = {name: float(np.abs(d).max()) for name, d in data.items()}
by = {(r[0], r[1]): r for r in rows}
heavy = "heavy-tailed (t3 + outliers)"
assert all(by[("gaussian", o)][2] >= 0.8 * amax_of["gaussian"] for o in observers)  # Gaussian: all near max|x|
assert max(by[(heavy, o)][2] for o in ("Percentile 99.99", "KL (entropy)")) < 0.5 * amax_of[heavy]  # clip hard
assert by[(heavy, "MSE")][2] > 1.3 * max(by[(heavy, o)][2] for o in ("Percentile 99.99", "KL (entropy)"))
assert max(by[(heavy, o)][4] for o in ("Percentile 99.99", "KL (entropy)")) < 0.5 * by[(heavy, "MSE")][4]  # bulk
assert min(by[(heavy, o)][3] for o in ("Percentile 99.99", "KL (entropy)")) > 1.5 * by[(heavy, "MSE")][3]  # total
assert all(min(observers, key=lambda o, n=n: by[(n, o)][3]) == "MSE" for n in data)  # MSE minimises what it scores

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
for ax, (name, d) in zip(axes, data.items()):
    ax.hist(np.abs(d), bins=300, log=True, color="0.7")
    for i, oname in enumerate(observers):
        ax.axvline(chosen[(name, oname)], color=f"C{i}", lw=1.5, label=oname)
    ax.set_title(f"|x|: {name}")
    ax.legend(fontsize=7)
plt.tight_layout()
plt.show()

# %% [markdown]
# The trade-off is visible (each part asserted above): for Gaussian data every threshold is at least 0.8 of
# max|x|, while on heavy tails percentile and KL clip below half of max|x| — less than half the MSE of the MSE
# observer inside the range (the bulk), but 1.5× or more its total MSE, since the few outliers are clipped hard.
# MSE, which counts the outliers' error too, keeps more than 1.3× their range and has the lowest total MSE on all
# three distributions (the quantity it minimises). Which one "wins" on a model depends on what the network is
# sensitive to — the PTQ section below measures it.

# %% [markdown]
# ## 4. FP8: all 256 codes of E4M3 and E5M2 [Q45]
#
# A code is `s | e | m`; value $= (-1)^s 2^{e-bias}(1 + m/2^M)$, subnormals $(-1)^s 2^{1-bias} (m/2^M)$ for $e=0$.
# **E4M3** (bias 7) has *no infinities*: only `s.1111.111` (0x7F, 0xFF) is NaN, so `s.1111.110` = 1.75·2⁸ = **448**
# is the max. The all-ones mantissa at the top exponent would be 2⁸·(1 + 7/8) = 480, but that code is the NaN, so
# the max has mantissa 110 (a derivation "2⁸·(1+7/8) = 448", as the seed gives, gets the right number from wrong
# arithmetic). An IEEE-style E4M3 that reserved the whole top exponent for inf/NaN would stop at 2⁷·1.875 = 240.
# **E5M2** (bias 15) is IEEE-like: max 57344, ±inf at 0x7C/0xFC, 6 NaN codes.

# %%
t4, t5 = Q.fp8_table("e4m3"), Q.fp8_table("e5m2")
assert np.nanmax(t4) == 448.0 and np.isnan(t4[[0x7F, 0xFF]]).all() and np.isnan(t4).sum() == 2
assert 2.0**8 * (1 + 7 / 8) == 480.0 and t4[0x7E] == 2.0**8 * (1 + 6 / 8) == 448.0  # 0x7F (would be 480) is NaN
assert 2.0**7 * (1 + 7 / 8) == 240.0  # IEEE-style E4M3 (top exponent reserved): max at exponent 14 - 7
assert np.nanmax(t5[np.isfinite(t5)]) == 57344.0 and np.isposinf(t5[0x7C]) and np.isnan(t5).sum() == 6
fig, axes = plt.subplots(1, 2, figsize=(13, 3.6))
codes = np.arange(256)
for ax, (fmt, t) in zip(axes, (("E4M3", t4), ("E5M2", t5))):
    fin = np.isfinite(t)
    ax.scatter(
        codes[fin],
        np.sign(t[fin]) * np.log2(np.maximum(np.abs(t[fin]), 2.0**-17)),
        s=6,
        c=[
            "C0" if c & 0x7F and (c >> (3 if fmt == "E4M3" else 2)) & (15 if fmt == "E4M3" else 31) else "C1"
            for c in codes[fin]
        ],
        label="value (orange: subnormal/zero)",
    )
    for c in codes[~fin]:
        ax.axvline(c, color="C3", lw=0.8)
    ax.set_title(f"{fmt}: sign(v)·log2|v| for every code (red lines: NaN/inf codes)")
    ax.set_xlabel("code")
plt.tight_layout()
plt.show()
print("E4M3 top codes:", {hex(c): float(t4[c]) for c in (0x7C, 0x7D, 0x7E, 0x7F)})
print("E5M2 top codes:", {hex(c): float(t5[c]) for c in (0x7A, 0x7B, 0x7C, 0x7D)})

# %% [markdown]
# **Encoding** rounds to nearest-even on the grid of the value's binade and then re-reads the exponent, so a
# mantissa that rounds up from 1.111b carries into the exponent (1.9375 → 2.0, code 0x40 — rounding "without
# carry" would produce the wrong code 0x3F+1 mantissa overflow). Out-of-range handling is taken from torch,
# measured: `.to(torch.float8_e4m3fn)` **saturates** to ±448 (even ±inf!) while E5M2 overflows to ±inf; NaN
# stays NaN (0x7F/0xFF). Our encoder is bit-exact with torch on all 2¹⁶ float32 high halves:

# %%
hi = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)
for fmt, tdt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
    ref = torch.from_numpy(hi).to(tdt).view(torch.uint8).numpy()
    assert np.array_equal(Q.fp8_encode(hi, fmt), ref), fmt
assert Q.fp8_encode(np.float32(1.9375), "e4m3") == 0x40  # carry into the exponent
assert Q.fp8_encode(np.float32(1e5), "e4m3") == 0x7E and Q.fp8_encode(np.float32(np.inf), "e4m3") == 0x7E
assert Q.fp8_encode(np.float32(1e5), "e5m2") == 0x7C
print("fp8_encode == torch for all 65536 high-half patterns, both formats")

# %% [markdown]
# FP8 training keeps tensors inside the format with a per-tensor scale. **Delayed scaling** picks the scale for
# step t from the amax *history* of earlier steps, $s = 448 / \max(\text{amax history})$, so the cast needs no
# extra pass over the current tensor; a sudden spike saturates for one step and then enters the history.

# %%
ds = Q.DelayedScaling("e4m3", history_len=8)
errs = []
for step in range(20):
    xs = (rng.standard_normal(4096) * (1 + 0.2 * step) * (8 if step == 12 else 1)).astype(np.float32)
    y8 = ds.fake_quantize(xs)
    d64, x64 = (y8 - xs).astype(np.float64), xs.astype(np.float64)  # fp64 norms: 3 printed digits are stable
    errs.append(np.linalg.norm(d64) / np.linalg.norm(x64))
print("relative error per step:", " ".join(f"{e:.3f}" for e in errs))

# %% [markdown]
# ## 5. INT4: packing and group-wise scales [Q44]
#
# Two's-complement nibbles, element 2i in the low nibble of byte i; odd counts pad with 0. Weight-only int4
# (GPTQ/AWQ-style) uses a scale per group of consecutive input weights; smaller groups track the local range better
# at the cost of more scales (32 → 1 fp32 scale per 16 bytes of int4):

# %%
q = np.array([1, -1, -8, 7, 3], np.int8)
packed = Q.pack_int4(q)
print("pack", q.tolist(), "->", [hex(b) for b in packed], "-> unpack", Q.unpack_int4(packed, 5).tolist())
assert np.array_equal(Q.unpack_int4(packed, 5), q)
w = (rng.standard_normal((256, 1024)) * np.exp(0.7 * rng.standard_normal((256, 1024)))).astype(np.float32)
gs_list = [16, 32, 64, 128, 256, 1024]
fig, ax = plt.subplots(figsize=(6, 3.2))
for sym in (True, False):
    e = []
    for g in gs_list:
        qq, sc, zp = Q.quantize_groupwise(w, g, 4, sym)
        e.append(np.mean((Q.dequantize_groupwise(qq, sc, zp, g) - w) ** 2) / np.mean(w**2))
    ax.loglog(gs_list, e, "o-", label="symmetric" if sym else "asymmetric")
    print(("sym " if sym else "asym"), " ".join(f"g{g}:{v:.4f}" for g, v in zip(gs_list, e)))
ax.set_xlabel("group size")
ax.set_ylabel("relative MSE")
ax.set_title("int4 group-wise weight error")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 6. The straight-through estimator, and QAT [Q66] [Q44]
#
# round() has zero derivative almost everywhere, so the exact gradient of fake quantization would stop learning.
# The **STE** pretends round is the identity and keeps only the clamp: $\partial \hat x/\partial x = 1$ when
# $q_{min} \le \mathrm{round}(x/s)+z \le q_{max}$, else 0 — exactly torch's `fake_quantize_per_tensor_affine`
# backward. **LSQ** also learns $s$: $\partial \hat x/\partial s = \mathrm{round}(x/s) - x/s$ inside, $q_{min}-z$
# or $q_{max}-z$ outside.

# %%
xs = np.linspace(-1.5, 1.5, 601).astype(np.float32)
X = tl.Tensor(xs, requires_grad=True)
Y = Q.fake_quantize(X, 0.125, 0, -8, 7)
Y.sum().backward()
tx = torch.from_numpy(xs).requires_grad_()
torch.fake_quantize_per_tensor_affine(tx, 0.125, 0, -8, 7).sum().backward()
assert np.array_equal(Y.data, torch.fake_quantize_per_tensor_affine(torch.from_numpy(xs), 0.125, 0, -8, 7).numpy())
assert np.array_equal(X.grad.data, tx.grad.numpy())
S = tl.Tensor(np.array([0.125], np.float32), requires_grad=True)
Z = tl.Tensor(np.zeros(1, np.float32))
X2 = tl.Tensor(xs, requires_grad=True)
(Q.fake_quantize_learnable(X2, S, Z, -8, 7) * 1.0).backward(tl.Tensor(np.ones_like(xs)))
fig, ax = plt.subplots(1, 2, figsize=(11, 3))
ax[0].plot(xs, Y.data, label="fake_quantize(x)")
ax[0].plot(xs, X.grad.data, label="STE gradient")
ax[0].legend()
ax[0].set_title("int4, s = 0.125")
s_el = np.where(np.rint(xs / 0.125) < -8, -8, np.where(np.rint(xs / 0.125) > 7, 7, np.rint(xs / 0.125) - xs / 0.125))
ax[1].plot(xs, s_el)
ax[1].set_title(f"LSQ d x_hat / d s per element (sum = {S.grad.data[0]:.2f})")
plt.tight_layout()
plt.show()
assert abs(S.grad.data[0] - s_el.sum()) < 1e-2

# %% [markdown]
# ## 7. The int8 GEMM and requantization [Q21]
#
# `tl.quant.int8_gemm` is C++ with three paths picked at run time: AVX-512 VNNI (`vpdpbusd`, u8×s8 → exact int32,
# with A offset by +128 and $128\cdot\mathrm{colsum}(B)$ subtracted), AVX2 (sign-extend to int16 +
# `vpmaddwd`; the u8×s8 `vpmaddubsw` is avoided because its int16 pair sums saturate, see §7b), and scalar.
# An int8 layer then requantizes the int32 accumulator:
# $y_q = \mathrm{clamp}(\mathrm{round}(acc \cdot s_x s_w[j] / s_y) + z_y)$ with
# $acc = x_q W_q^T - z_x \mathrm{rowsum}(W_q) + \mathrm{round}(b/(s_x s_w))$.

# %%
# NBVAL_IGNORE_OUTPUT
# which paths exist depends on the CPU (and on TINYLEARN_CPU_FEATURES): printed here, not compared
print("paths on this CPU:", Q.int8_gemm_paths())
assert Q.int8_gemm_paths()[-1] == "scalar"

# %%
a8 = np.full((7, 1031), -128, np.int8)
b8 = np.full((1031, 33), -128, np.int8)
ref = a8.astype(np.int64) @ b8.astype(np.int64)
for p in Q.int8_gemm_paths():
    assert np.array_equal(Q.int8_gemm(a8, b8, version=p), ref), p
print("all paths exact at the -128 x -128 extreme:", int(ref[0, 0]))

# %%
# NBVAL_IGNORE_OUTPUT
cmp = Comparison("int8 GEMM vs fp32 (M=256, K=N=1024)", baseline="numpy fp32 sgemm", repeat=5)
A8 = rng.integers(-128, 128, (256, 1024), dtype=np.int8)
B8 = rng.integers(-128, 128, (1024, 1024), dtype=np.int8)
Af, Bf = A8.astype(np.float32), B8.astype(np.float32)
tAf, tBf = torch.from_numpy(Af), torch.from_numpy(Bf)
B8_packed = Q.PackedInt8Weight(B8)  # weights packed once, as a quantized Linear stores them
with cmp.case("256x1024x1024", flops=2 * 256 * 1024 * 1024) as c:
    c.add("tinylearn int8 GEMM, prepacked B", lambda: B8_packed.matmul(A8))
    for p in Q.int8_gemm_paths():
        c.add(f"tinylearn int8_gemm [{p}]", lambda p=p: Q.int8_gemm(A8, B8, version=p))
    c.add("numpy fp32 sgemm", lambda: Af @ Bf)
    c.add("torch fp32 matmul", lambda: tAf @ tBf)
    with threadpool_limits(1):
        torch.set_num_threads(1)
        c.add("numpy fp32 sgemm, 1 thread", lambda: Af @ Bf)
        c.add("torch fp32 matmul, 1 thread", lambda: tAf @ tBf)
        torch.set_num_threads(torch_threads)

    def tg_build(tg):
        f = tinygrad_jit(lambda x, y: x @ y)
        ta, tb = tg.Tensor(Af), tg.Tensor(Bf)
        return lambda: f(ta, tb)

    c.add_tinygrad("tinygrad fp32 matmul", tg_build, note="TinyJit; tinygrad has no int8 GEMM on CPU")
table = cmp.table
for r in table.rows:  # the best run too: on a shared, loaded machine medians and minima can differ 10x
    r.extra["best ms"] = None if r.min_ms is None else round(r.min_ms, 2)
print(table)
ms = {r.impl: r.min_ms for r in table.rows}  # best of 5 runs: the least load-disturbed statistic
best_int8 = min(v for k, v in ms.items() if "int8" in k)
print(
    f"Reading (best-ms column): the best tinylearn int8 path takes {best_int8 / ms['numpy fp32 sgemm']:.2f}x the time "
    f"of numpy's fp32 sgemm; torch's fp32 matmul takes {ms['torch fp32 matmul'] / ms['numpy fp32 sgemm']:.2f}x "
    f"numpy's ({ms['torch fp32 matmul, 1 thread'] / ms['numpy fp32 sgemm, 1 thread']:.2f}x with one thread each)"
    + (
        f"; tinygrad fp32 {ms['tinygrad fp32 matmul'] / ms['numpy fp32 sgemm']:.2f}x"
        if ms.get("tinygrad fp32 matmul")
        else ""
    )
    + " (loaded machine)."
)
print("CPU vendor:", cpu_vendor, "| numpy BLAS:", np_blas, "| torch BLAS:", torch_blas)
assert all(r.median_ms > 0 for r in table.rows if r.median_ms is not None)
assert "mkl" in torch_blas.lower() and "openblas" in np_blas.lower()  # the two fp32 rows run different BLAS libraries
# the folklore's 4x is an instruction ratio (multiply-adds per 512-bit instruction), not a timing:
MACS_PER_INSTR = {
    "zmm vpdpbusd (VNNI int8)": 64,  # 16 int32 lanes x 4 u8*s8 products
    "zmm vfmadd231ps (fp32)": 16,
    "ymm vpmaddwd + vpaddd (AVX2 int8 via int16), per instruction": 16 // 2,  # 16 products in 2 instructions
    "ymm vfmadd231ps (fp32)": 8,
}
assert MACS_PER_INSTR["zmm vpdpbusd (VNNI int8)"] == 4 * MACS_PER_INSTR["zmm vfmadd231ps (fp32)"]
assert (
    MACS_PER_INSTR["ymm vpmaddwd + vpaddd (AVX2 int8 via int16), per instruction"]
    == MACS_PER_INSTR["ymm vfmadd231ps (fp32)"]
)
print("multiply-adds per instruction:", MACS_PER_INSTR)
plot_table(table, metric="gflops", log=False)
plt.show()

# %% [markdown]
# **Reading the int8 table.** Both ratios are explained by *what runs*, not by int8 vs fp32 as such:
#
# - **torch fp32 vs numpy fp32.** The two rows call different libraries (asserted above): numpy uses OpenBLAS
#   (`DYNAMIC_ARCH`, a Haswell/Zen-tuned sgemm), torch's CPU matmul uses Intel MKL. MKL selects its kernels by CPU
#   vendor (it has historically taken less-tuned paths on AMD), and torch runs its own OpenMP pool next to
#   OpenBLAS's threads, which on a shared, loaded 2-core box can make either one several times slower than the
#   other from run to run. The single-thread pair removes the thread contention; the ratio that remains is the
#   library difference on this CPU (printed). Neither row says anything about fp32 itself.
# - **int8 vs fp32.** "int8 is 2–4× fp32" is a ratio of *instruction* peaks: AVX-512 VNNI `vpdpbusd` does 64 u8×s8
#   multiply-adds per zmm instruction vs 16 fp32 FMAs (4×), AMX more. On AVX2 without `vpmaddubsw` (saturating,
#   §7b) an exact int8 GEMM sign-extends to int16 and uses `vpmaddwd` + `vpaddd`: 16 multiply-adds per *two*
#   instructions, the same 8 per instruction as an fp32 FMA — no math-rate advantage, only 4× fewer bytes. And a
#   hand-written kernel competes with OpenBLAS's packing and register blocking. So a VNNI kernel can at best
#   approach the 4× instruction ratio (asserted as arithmetic above; 8 vs 8 per instruction for the AVX2 path vs
#   an AVX2 FMA), and what a loaded machine measures is printed in the reading — not asserted, because on a
#   shared box the two sides of the ratio see different load (a ratio beyond 4× in the reading is load, not
#   arithmetic: compare the rows' best-ms and median columns). On a CPU the dependable int8 gains are memory (weights 4× smaller)
#   and VNNI/AMX; on GPUs (int8 tensor cores at 2× the fp16 rate) the folklore is closer to true. tinygrad has no
#   int8 GEMM on CPU: its row is fp32.

# %% [markdown]
# ### Measure the ceiling before tuning toward it [Q21] [Q13]
#
# "Multiply-adds per instruction" assumes every instruction issues equally often. It does not: each core has a
# fixed set of execution ports, and which ports take an instruction differs between designs. A core with two FMA
# pipes but one integer-multiply pipe issues two `vfmadd231ps` per cycle (2 × 8 MACs) and one `vpmaddwd` (16 MACs):
# the same rate, so *no* exact AVX2 int8 kernel can beat fp32 by much there, however it is written. The C++ probe
# `_C.machine.mac_rate` (via `bench.roofline.mac_ceilings`) runs a loop of one instruction mix over 10 independent
# accumulators and reports multiply-accumulates per ns on one core: the instruction ceiling of each path on *this*
# CPU. The two `int8_madd16…+fp32_fma_ymm` kinds interleave both units, 6 or 8 `vpmaddwd` per 4 FMAs: the ceiling of
# a *hybrid* int8 kernel that gives part of N to fp32 FMAs on the int8 values (exact while every partial sum stays
# below 2²⁴: |a·b| ≤ 2¹⁴, so for chunks of K ≤ 1024). Where the integer multiplier is one of the two FMA pipes,
# the ideal is 1 `vpmaddwd` + 1 FMA per cycle = 16 + 8 MACs = 1.5× fp32, and the measured mix shows how much of
# that survives the `vpaddd`s and the scheduler. The `tinylearn bench quant` int8 table prints the same probe
# under its GEMM rows.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.bench.roofline import int8_ceiling_ratio, mac_ceilings, measured_ghz, mix_ceiling_ratio  # noqa: E402

ceil = mac_ceilings(trips=20_000, runs=5)
assert ceil is not None and all(v > 0 for v in ceil.values())
ratio_i8, k_i8, k_f32 = int8_ceiling_ratio(ceil)
ghz_now = measured_ghz(runs=5)
PER_INSTR = {  # MACs per issued unit, and the unit
    "fp32_fma_ymm": (8, "vfmadd231ps ymm"),
    "int8_madd16_ymm": (16, "vpmaddwd ymm"),
    "int8_u7_ymm": (32, "vpmaddubsw + vpmaddwd pairs"),
    "int8_wino_ymm": (32, "vpmaddwd ymm (Winograd: 4 products per lane)"),
    "fp32_fma_zmm": (16, "vfmadd231ps zmm"),
    "int8_vnni_zmm": (64, "vpdpbusd zmm"),
}
for k, v in ceil.items():
    per_cycle = f"  = {v / PER_INSTR[k][0] / ghz_now:.2f} {PER_INSTR[k][1]} per cycle" if k in PER_INSTR else ""
    print(f"{k:26s} {v:6.1f} MAC/ns{per_cycle}")
print(f"best exact int8 / fp32 FMA ceiling on this core: {k_i8} / {k_f32} = {ratio_i8:.2f}x (clock {ghz_now:.2f} GHz)")
ratio_mix, k_mix, _ = mix_ceiling_ratio(ceil)
print(f"best int8 + fp32 mix (a hybrid kernel's ceiling): {k_mix} = {ratio_mix:.2f}x fp32")
assert ratio_mix == max(v for k, v in ceil.items() if "+fp32" in k) / ceil[k_f32]
assert ratio_i8 == max(v for k, v in ceil.items() if k.startswith("int8_") and "fp32" not in k) / max(
    v for k, v in ceil.items() if k.startswith("fp32_")
)
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.barh(list(ceil), list(ceil.values()), color=["tab:blue" if k.startswith("fp32") else "tab:orange" for k in ceil])
ax.set_xlabel("multiply-accumulates per ns, one core")
ax.set_title("instruction ceilings on this CPU (fp32 blue, int8 orange)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Read the printed ratio before the GEMM table: it bounds what int8 can buy on this core. On a core whose integer
# multiplies issue at half its FMA rate (one pipe against two: the printed per-cycle rates show it), the direct
# kinds (`madd16`, `u7`) sit at about 1× and an "int8 is 2× fp32" goal is out of reach of every kernel that does
# one multiply per product — only an algorithm with fewer multiplies (`int8_wino_ymm`, next section) moves the
# ceiling; where `vpmaddwd` issues on as many pipes as the FMA, the direct AVX2 paths can approach 2×, and VNNI's
# 64 MACs per instruction 4×. Interview answer: *measure the instruction throughput (a port probe, or uops.info)
# first; the speed-up budget is the ratio of ceilings, then the kernel's fraction of its own ceiling.*

# %% [markdown]
# ### Half the multiplies: Winograd's inner product [Q21] [Q13]
#
# When the multiplier is the bottleneck, change the algorithm so that it multiplies less. Winograd (1968) noticed
# that for two pairs
#
# $$(a_0 + b_1)(a_1 + b_0) = a_0 b_0 + a_1 b_1 + \underbrace{a_0 a_1}_{\text{row of }A} + \underbrace{b_0 b_1}_{\text{column of }B}$$
#
# so $C_{ij} = \sum_p (a_{i,2p} + b_{2p+1,j})(a_{i,2p+1} + b_{2p,j}) - \sum_p a_{i,2p}a_{i,2p+1} - \sum_p b_{2p,j}b_{2p+1,j}$:
# the two correction terms cost $M\cdot K/2$ and $N\cdot K/2$ multiplies once, the main sum $MNK/2$ — half of the
# textbook $MNK$. The price is two additions per multiply. For int8 this is exact and fits the AVX2 instructions:
# $a + b \in [-256, 383]$ fits int16, so `vpaddw` forms $x = (a_0 + b_1, a_2 + b_3)$ and $y = (a_1 + b_0, a_3 + b_2)$
# and one `vpmaddwd` lane computes $x_0y_0 + x_1y_1$ — **four** products of a k-quad where `madd16` gets two.
# Partial sums wrap modulo $2^{32}$ (at $K = 65536$ the main sum reaches $2^{31}$); the final $C$ fits int32, so the
# wrapped arithmetic gives it exactly (tested at that limit).
#
# It halves the multiplies, not the instructions: `madd16` needs `vpmaddwd` + `vpaddd` per 16 products, Winograd
# 2 `vpaddw` + `vpmaddwd` + `vpaddd` per 32 — the same count. So it wins only where the multiplier is the narrow
# pipe: `tinylearn.quant.avx2_choice()` measures once per process whether a `vpmaddwd` stream runs below 1.5× the
# MAC rate of an FMA stream, and `"auto"` then runs `avx2_wino` (on a core with two multiply pipes the direct
# kernels stay). The kernel (`cpp_src/quant_int8_ukr.h`, `mk_wino`): 3 rows × 32 columns per step, 12 ymm
# accumulators, the two broadcasts of a row serve four column groups, B read as memory operands (loads are cheap
# there, broadcasts are not), the whole K loop in one asm block so the compiler cannot rename accumulators.

# %%
rng_w = np.random.default_rng(3)  # its own generator: the notebook's `rng` stream stays as it was
a_w = rng_w.integers(-128, 128, (6, 10))
b_w = rng_w.integers(-128, 128, (10, 5))
a_w[0], b_w[:, 0] = -128, -128  # the extremes: (a + b) reaches -256
c_w, mults_w = Q.winograd_reference(a_w, b_w)
assert np.array_equal(c_w, a_w @ b_w)
print(f"6x10 @ 10x5: Winograd {mults_w} multiplies (main sum 6*5*5 = 150, terms (6 + 5)*5 = 55), textbook {6 * 10 * 5}")
assert mults_w == 6 * 5 * 5 + (6 + 5) * 5 and 6 * 10 * 5 == 300
for m_, k_, n_ in ((512, 1024, 1024), (64, 4096, 4096)):
    ratio_w = ((m_ * n_ + m_ + n_) * (k_ // 2)) / (m_ * n_ * k_)
    print(f"{m_}x{k_}x{n_}: Winograd needs {ratio_w:.4f} of the textbook multiplies")
    assert np.isclose(ratio_w, 0.5 * (1 + 1 / m_ + 1 / n_)) and ratio_w < 0.51  # half, plus the two terms

# %%
# NBVAL_IGNORE_OUTPUT
choice = Q.avx2_choice() if "avx2" in Q.int8_gemm_paths() else None
print("auto on AVX2:", choice)
if choice is not None:
    assert (choice["kernel"] == "avx2_wino") == (choice["madd16_over_fma"] < 1.5)
    print(
        f"ceilings here: Winograd {ceil['int8_wino_ymm'] / ceil['fp32_fma_ymm']:.2f}x fp32, "
        f"direct madd16 {ceil['int8_madd16_ymm'] / ceil['fp32_fma_ymm']:.2f}x"
    )
    # Winograd's step does 32 MACs per 4 instructions like madd16's 16 per 2: same instruction rate, more MACs
    # wherever vpmaddwd (not the adds) limits
    assert ceil["int8_wino_ymm"] > 0.9 * ceil["int8_madd16_ymm"]
    M_w, K_w, N_w = 512, 1024, 1024
    A_w = rng_w.integers(-128, 128, (M_w, K_w), dtype=np.int8)
    B_w = rng_w.integers(-128, 128, (K_w, N_w), dtype=np.int8)
    pk_w = Q.PackedInt8Weight(B_w)
    want_w = A_w.astype(np.int64) @ B_w.astype(np.int64)
    cmp_w = Comparison(f"int8 GEMM {M_w}x{K_w}x{N_w}, direct vs Winograd", baseline="numpy fp32 sgemm", repeat=5)
    Af_w, Bf_w = A_w.astype(np.float32), B_w.astype(np.float32)
    with cmp_w.case("GEMM", flops=2 * M_w * K_w * N_w) as c:
        for v in ("avx2_madd16", "avx2_wino"):
            assert np.array_equal(pk_w.matmul(A_w, version=v), want_w), v
            c.add(f"prepacked B [{v}]", lambda v=v: pk_w.matmul(A_w, version=v))
        c.add("numpy fp32 sgemm", lambda: Af_w @ Bf_w)
    print(cmp_w.table)

# %% [markdown]
# ### Seven products instead of eight: Strassen, exact in integers; cache-oblivious recursion [Q3] [Q51] [Q84]
#
# Winograd's kernel runs at its own instruction ceiling (the adds, not the multiplier, now limit it), so the next
# cut has to come from fewer multiply-accumulates in total. Strassen (1969) splits $A$ and $B$ into $2\times2$ blocks
# and forms $C$ from **seven** block products instead of eight:
#
# $$M_1 = (A_{11} + A_{22})(B_{11} + B_{22}),\; M_2 = (A_{21} + A_{22})B_{11},\; M_3 = A_{11}(B_{12} - B_{22}),\;
# M_4 = A_{22}(B_{21} - B_{11}),$$
# $$M_5 = (A_{11} + A_{12})B_{22},\; M_6 = (A_{21} - A_{11})(B_{11} + B_{12}),\; M_7 = (A_{12} - A_{22})(B_{21} + B_{22}),$$
# $$C_{11} = M_1 + M_4 - M_5 + M_7,\quad C_{12} = M_3 + M_5,\quad C_{21} = M_2 + M_4,\quad C_{22} = M_1 - M_2 + M_3 + M_6.$$
#
# One level does $7/8$ of the multiply-accumulates for 18 block additions ($O(n^2)$); $l$ levels $(7/8)^l$. In
# floating point each operand sum rounds, so the error grows with the levels (measured below) — the reason BLAS
# libraries do not use it. **In integers nothing rounds**: block sums of int8 values stay within $\pm 510$ (uint8
# codes minus their zero point), the Winograd pre-add $a + b$ within $\pm 766$ (int16), and every product and sum is
# arithmetic modulo $2^{32}$, so $C$ (which fits int32) comes out exact. `avx2_strassen` (`cpp_src/quant_int8_strassen.cpp`)
# runs one level on top of the Winograd kernel: its seven B operands are widened once and cached by
# `PackedInt8Weight` (the price: 1.75× the int16 size of $B$ in memory), each row item forms its seven A operands,
# and per output panel the seven products land in one tile each, which is added with its signs into the four
# quadrants of $C$. `"auto"` takes it where it measured faster (`Q.strassen_auto`: $M \ge 64$, $512 \le K, N$,
# $KN \le 2^{21}$ — beyond that its widened operands outgrow the caches).

# %%
a_s = rng_w.integers(-128, 128, (8, 16))
b_s = rng_w.integers(-128, 128, (16, 8))
a_s[:4, :8] = -128  # every block different: a wrong sign cannot cancel
for lv in range(4):
    c_s, mults_s = Q.strassen_reference(a_s, b_s, lv)
    assert np.array_equal(c_s, a_s @ b_s)  # exact at every level in integers
    print(f"{lv} level(s): {mults_s} multiplies = {mults_s / (8 * 16 * 8):.3f} of the textbook {8 * 16 * 8}")
    assert mults_s * 8**lv == 8 * 16 * 8 * 7**lv
print(f"one level: {7 / 8:.3f} of the products to multiply; two levels {(7 / 8) ** 2:.3f}")
SA, SB, SC = Q.gemm.strassen_signs()
adds = int((np.abs(SA).sum(1) - 1).sum() + (np.abs(SB).sum(1) - 1).sum() + (np.abs(SC).sum(0) - 1).sum())
a_max, b_max = int(np.abs(SA).sum(1).max()) * 255, int(np.abs(SB).sum(1).max()) * 128  # uint8 - zero point; int8
print(f"block additions: {adds}; |A operand| <= {a_max}, |B operand| <= {b_max}, pre-add |a + b| <= {a_max + b_max}")
assert adds == 18 and (a_max, b_max) == (510, 256) and a_max + b_max == 766 < 2**15
assert (Q.gemm.STRASSEN_AUTO_MIN_M, Q.gemm.STRASSEN_AUTO_MIN_KN, Q.gemm.STRASSEN_AUTO_MAX_KXN) == (64, 512, 2**21)

# %%
# NBVAL_IGNORE_OUTPUT
if choice is not None and choice["kernel"] == "avx2_wino":
    assert Q.strassen_auto(M_w, K_w, N_w) == (Q.packed_versions()[0] == "avx2_wino")
    wide_s, _ = pk_w.strassen_operands()  # prepared once, like the packing
    assert wide_s.size == 7 * (K_w // 2) * (N_w // 2) == 1.75 * K_w * N_w  # int16: 1.75x B's int16 size
    assert np.array_equal(pk_w.matmul(A_w, version="avx2_strassen"), want_w)
    cmp_s = Comparison(f"int8 GEMM {M_w}x{K_w}x{N_w}: Winograd vs Strassen", baseline="numpy fp32 sgemm", repeat=7)
    with cmp_s.case("GEMM", flops=2 * M_w * K_w * N_w) as c:
        for v in ("avx2_wino", "avx2_strassen"):
            c.add(f"prepacked B [{v}]", lambda v=v: pk_w.matmul(A_w, version=v))
        c.add("numpy fp32 sgemm", lambda: Af_w @ Bf_w)
    print(cmp_s.table)
# float32: the same algebra rounds its operand sums (the leaves are BLAS matmuls: summation order is the CPU's)
a_f = rng_w.standard_normal((256, 256)).astype(np.float32)
b_f = rng_w.standard_normal((256, 256)).astype(np.float32)
exact_f = a_f.astype(np.float64) @ b_f.astype(np.float64)
err_lv = [float(np.abs(Q.strassen_reference(a_f, b_f, lv)[0] - exact_f).max()) for lv in range(4)]
print("float32 max |error| by levels 0-3:", [f"{e:.2e}" for e in err_lv])
assert err_lv[3] > 1.3 * err_lv[0]  # grows with the levels; int64 stays exact (cell above)
fig, ax = plt.subplots(figsize=(5, 2.4))
ax.semilogy(range(4), err_lv, "o-", label="float32 Strassen")
ax.axhline(0.5, color="gray", ls=":", label="int64 / int32: error 0 (exact)")
ax.set_xlabel("Strassen levels")
ax.set_ylabel("max |error|")
ax.set_title("operand sums round in float, not in integers")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# **Reading it.** The integer cell is exact at every level and its multiply counts are $(7/8)^l$ of the textbook
# (asserted). The float error grows with the levels (asserted: level 3 above 1.3× level 0). The timing table is this
# machine's: on a core where Winograd already runs near its ceiling, one level can remove at most the eighth of the
# multiply-accumulates it skips, minus the cost of forming the operand sums and adding the seven tiles into $C$
# (18 block additions, asserted). Interview answer: *Strassen
# trades multiplies for additions and memory; it is unstable in float but exact in integer arithmetic modulo
# $2^{32}$, so an int8 GEMM can take it when the multiplies, not bandwidth, are the bottleneck.*
#
# **Cache-oblivious instead of fixed tiles [Q84].** The kernels above block for *known* cache sizes (the panel
# and K-block constants are tuned per CPU). The cache-oblivious GEMM (Frigo et al., 1999) uses no size at all:
# halve the largest of $M, K, N$ (a $K$ split adds the two halves' products into the same $C$) and recurse until
# a small leaf. Every recursion depth shrinks the block's working set $MK + KN + MN$ by at most 2×, so for *any*
# cache size $Z$ some depth's blocks fit in $Z$ while using at least half of it: each level of the hierarchy
# gets blocks of its own size, which is why the algorithm is asymptotically optimal in cache misses on every
# level at once. A fixed tile is right for one level and one machine; the recursion pays call overhead per leaf
# instead (hence a leaf of 16 below, not 1; the library's default is 32). `Q.cache_oblivious_matmul` implements it
# (exact in int64):

# %%
a_co = rng_w.integers(-128, 128, (96, 200))
b_co = rng_w.integers(-128, 128, (200, 72))
c_co, ws_co = Q.cache_oblivious_matmul(a_co, b_co, leaf=16)
assert np.array_equal(c_co, a_co @ b_co)  # exact, for shapes that are not powers of two
assert all(ws_co[d + 1] >= ws_co[d] / 2 for d in range(len(ws_co) - 1))  # at most 2x smaller per depth
sizes_co = [2**e for e in range(10, 17)]  # caches of 1 Ki .. 64 Ki elements between the leaf and the problem
fit_co = {z: max(w for w in ws_co if w <= z) for z in sizes_co}
print("working set by depth (elements):", ws_co)
print("largest block that fits a cache of Z elements:", {z: fit_co[z] for z in sizes_co})
assert all(z / 2 <= fit_co[z] <= z for z in sizes_co)  # every cache size is used at least half full

# %% [markdown]
# ## 7b. Why fbgemm wants 7-bit activations on AVX2, and what VNNI changes [Q21] [Q13]
#
# x86 int8 GEMMs multiply **unsigned** activations by **signed** weights: the instructions are u8 × s8, so
# activation codes are offset into 0..255 (a u8 operand can never be −128; only the weight side is signed).
# - **AVX2** `vpmaddubsw` multiplies the 32 u8×s8 byte pairs of two ymm registers and adds *adjacent* products
#   into 16 **int16 with signed saturation**; `vpmaddwd` by ones then widens pairs of int16 into int32. One pair can reach
#   2·255·127 = 64770 or 2·255·(−128) = −65280 — far outside int16 [−32768, 32767], and saturation silently clips it.
# - With **7-bit activations** (codes 0..127) the worst pair is 2·127·(−128) = −32512: it fits, the result is exact.
#   That is what `reduce_range=True` does in torch's fbgemm qconfig: activation observers use [0, 127], costing one
#   bit of activation resolution (twice the step) for exactness on every x86 CPU.
# - **AVX-512 VNNI** `vpdpbusd` (and AVX-VNNI) adds the 4 u8×s8 products of each 32-bit lane straight into an
#   **int32** accumulator — no int16 intermediate, so full 8-bit activations are exact there.
# - tinylearn's AVX2 path sign-extends both operands to int16 and uses `vpmaddwd` (int16×int16 pairs → int32):
#   more instructions per product than `vpmaddubsw`, but exact for all int8 inputs, so no reduce_range is needed.
#
# The saturation arithmetic, simulated in numpy exactly as the instruction defines it (deterministic on any CPU):


# %%
def vpmaddubsw(u8, s8):
    """AVX2 vpmaddubsw on [..., 2n] u8 x s8 inputs: adjacent products summed, saturated to int16."""
    pair = u8[..., 0::2].astype(np.int32) * s8[..., 0::2] + u8[..., 1::2].astype(np.int32) * s8[..., 1::2]
    return np.clip(pair, -32768, 32767).astype(np.int16)


def dot_maddubs(u8, s8):
    """u8 x s8 dot products as AVX2 code computes them: vpmaddubsw, then vpmaddwd by ones (exact int32 sums)."""
    return vpmaddubsw(u8, s8).astype(np.int32).sum(-1)


u_pair = np.array([255, 255], np.uint8)
for w_pair in ([127, 127], [-128, -128], [127, -128]):
    w_ = np.array(w_pair, np.int8)
    exact_pair = int(u_pair.astype(np.int64) @ w_.astype(np.int64))
    sat_pair = int(vpmaddubsw(u_pair, w_)[0])
    print(f"u8 {u_pair.tolist()} x s8 {w_pair}: exact {exact_pair:6d}  vpmaddubsw int16 {sat_pair:6d}")
assert vpmaddubsw(np.array([127, 127], np.uint8), np.array([-128, -128], np.int8))[0] == -32512  # 7-bit fits

# a layer's worth of dot products: K = 256, int8 weights (std 40 codes), activations spread over their range
# (pixel-like, uniform): the 8-bit codes of two neighbours are often both large
rs = np.random.default_rng(7)
w_s8 = np.clip(np.rint(rs.standard_normal((64, 256)) * 40), -128, 127).astype(np.int8)
act = rs.uniform(0, 1, (128, 256))
for bits in (8, 7):
    qmax_u = 2**bits - 1
    u = np.clip(np.rint(act / act.max() * qmax_u), 0, qmax_u).astype(np.uint8)
    exact_acc = u.astype(np.int64) @ w_s8.astype(np.int64).T
    sat_acc = dot_maddubs(u[:, None, :], w_s8[None, :, :])
    wrong = sat_acc != exact_acc
    print(
        f"{bits}-bit activations (0..{qmax_u}): {wrong.mean():6.1%} of accumulators wrong, "
        f"max error {np.abs(sat_acc - exact_acc).max()} (pair-sum units)"
    )
    assert wrong.any() if bits == 8 else not wrong.any()

# %% [markdown]
# Now the real thing, measured: the same quantized Linear computed by an exact int64 oracle, by tinylearn, and by
# torch's fbgemm (`torch.ao.nn.quantized.functional.linear`), with 8-bit and with 7-bit (`reduce_range`)
# activations. The error is in output quantization steps. On an AVX2-only CPU fbgemm's 8-bit row is off by several
# steps (its int16 pair sums saturated); with VNNI its kernels accumulate in int32 and the 8-bit row is expected to
# be exact up to requantization ties. So this cell's numbers are machine-specific and not compared by nbval; its
# asserts hold on every CPU: tinylearn equals the oracle bit for bit on every int8 path, and fbgemm is exact with
# 7-bit activations. (tests/quant/test_quant_ptq.py checks the same, also for Conv2d.)

# %%
# NBVAL_IGNORE_OUTPUT
rs = np.random.default_rng(0)
xl = rs.uniform(0, 1, (64, 128)).astype(np.float32)  # non-negative activations (pixels, post-ReLU)
Wl = (rs.standard_normal((32, 128)) * 0.2).astype(np.float32)
Wl[:8] = np.abs(Wl[:8]) + 0.2  # some output channels with same-sign weights: large pair sums
bl = np.zeros(32, np.float32)
ws_l, _ = Q.calculate_qparams(Wl.min(1), Wl.max(1), "int8", symmetric=True)
wq_l = Q.quantize(Wl, ws_l, np.zeros(32, np.int64), "int8", axis=0).astype(np.int64)
yl = xl @ Wl.T
sy_l, zy_l = Q.calculate_qparams(yl.min(), yl.max(), "int8")
qw_t = torch.quantize_per_channel(
    torch.from_numpy(Wl), torch.from_numpy(ws_l.astype(np.float64)), torch.zeros(32, dtype=torch.long), 0, torch.qint8
)
print("int8 GEMM paths on this CPU:", Q.int8_gemm_paths(), "| torch quantized engine:", torch.backends.quantized.engine)
for bits in (8, 7):
    sx_l = float(xl.max()) / (2**bits - 1)  # u8 codes 0..2^bits-1, zero point 0 (x >= 0)
    xq_l = Q.quantize(xl, sx_l, -128, "int8").astype(np.int64)  # tinylearn's int8 code = u8 code - 128
    acc_scale = sx_l * ws_l.astype(np.float64)
    exact_codes = np.clip(np.rint(((xq_l + 128) @ wq_l.T) * (acc_scale / sy_l)) + zy_l, -128, 127)
    ours = Q.QuantizedLinear(Wl, bl, ws_l, (sx_l, -128), (sy_l, zy_l))(tl.Tensor(xl)).data
    ours_codes = np.rint(ours / sy_l) + zy_l
    qx_t = torch.quantize_per_tensor(torch.from_numpy(xl), sx_l, 0, torch.quint8)
    assert int(qx_t.int_repr().max()) == 2**bits - 1
    fb = torch.ao.nn.quantized.functional.linear(qx_t, qw_t, torch.from_numpy(bl), sy_l, zy_l + 128)
    fb_codes = fb.int_repr().numpy().astype(np.int64) - 128
    print(
        f"{bits}-bit activations: tinylearn max |codes - exact| = {np.abs(ours_codes - exact_codes).max():.0f}, "
        f"fbgemm = {np.abs(fb_codes - exact_codes).max():.0f} steps"
    )
    assert np.array_equal(ours_codes, exact_codes)  # exact on every CPU and every int8 path
    if bits == 7:
        assert np.abs(fb_codes - exact_codes).max() <= 1  # fbgemm exact with reduce_range (float requantize ties)

# %% [markdown]
# ## 7c. The saturation trade-off on real data, every GEMM path measured, and a dynamic int8 Linear [Q21] [Q65]
#
# All of tinylearn's packed kernels read **one** prepacked weight layout (`PackedInt8Weight`: 64-column panels of
# 4-deep K quads, the `vpdpbusd` layout, plus column sums for the zero-point correction) and differ only in the
# instruction that multiplies:
#
# | path | instruction(s) per 32-bit lane | products per multiply-unit op | exact for |
# |---|---|---|---|
# | `avx512vnni` | `vpdpbusd` (u8×s8 quads → int32); 6×64 micro-kernel | 64 per zmm op | every u8 × s8 (int8 A offset by +128, minus 128·colsum) |
# | `avx2_madd16` | B sign-extended to int16 per K block, `vpmaddwd` + `vpaddd`; 6×8 micro-kernel | 16 per ymm op | every u8/s8 × s8 (int16 pairs → int32) |
# | `avx2_u7` | `vpmaddubsw` (pairs → **saturating** int16) + `vpmaddwd`·1 + `vpaddd` | 32 per 2 ymm ops = 16 | only activation codes ≤ 127 (checked; else ValueError) |
# | `avx2_wino` | Winograd: 2 `vpaddw` (a + b, int16) + `vpmaddwd` + `vpaddd`; row/column terms once; 3×32 micro-kernel | 32 per ymm op | every u8/s8 × s8 (a + b fits int16; sums wrap mod 2³², the result is exact) |
# | `avx2_strassen` | one level of Strassen (7 block products of 8) on the `avx2_wino` kernel; B operands widened once (`PackedInt8Weight`) | 32 per ymm op, 7/8 of the products | every u8/s8 × s8 (operand sums ≤ 510, a + b ≤ 766; mod 2³², exact); M even, K % 8 = 0, N % 128 = 0 |
# | `scalar` | C++ loops | – | everything |
#
# **Register blocking.** Each K step of a micro-kernel loads the B vectors once and reuses them for 6 rows of A
# (one broadcast per row): `avx512vnni` keeps 6 rows × 4 zmm = 24 accumulators + 4 B + 1 A in the 32 zmm
# registers, `avx2_madd16` 6 rows × 2 ymm = 12 accumulators + 2 B + 1 A + 1 product in the 16 ymm registers
# (asserted below). The earlier 4-row kernels let the compiler fold the B load into every multiply (one load per
# row), and on a CPU with two 256-bit loads per cycle the loads, not the multipliers, set the pace.
#
# So on AVX2 the 7-bit trick buys no multiply-unit rate (both need two multiply ops per 32 products); it saves the
# int16 widening and half the operand bytes, at the price of one bit of activation resolution. Below: which
# inputs saturate on real data — the 8×8 digit images as activations (pixel codes) against a template-matching
# layer's int8 weights (class mean minus overall mean). The 8-bit codes overflow exactly where two neighbouring
# pixels are bright and their weights large with the same sign; the real `vpmaddubsw` kernel reproduces the
# numpy definition of the instruction bit for bit, and a 7-bit copy of the same data is exact.

# %%
Xg, yg = tl.data.load_digits()
pix = Xg.reshape(len(Xg), 64).astype(np.float64)  # pixel intensities in [0, 1]
templ = np.stack([pix[yg == c].mean(0) for c in range(10)]) - pix.mean(0)  # [10, 64] template-matching weights
w_t = np.clip(np.rint(templ / np.abs(templ).max(1, keepdims=True) * 127), -128, 127).astype(np.int8)  # [10, 64]
B_t = np.ascontiguousarray(w_t.T)  # [K=64, N=10]
sat_stats = {}
for bits in (8, 7):
    u = np.rint(pix * (2**bits - 1)).astype(np.uint8)  # activation codes 0..255 or 0..127
    exact = u.astype(np.int64) @ B_t.astype(np.int64)
    sat = Q.gemm.maddubs_reference(u, B_t)  # the instruction's definition, in numpy
    if "avx2" in Q.int8_gemm_paths():  # the real instruction agrees with the definition bit for bit
        assert np.array_equal(Q.gemm.int8_gemm_maddubs_saturating(u, B_t), sat)
    pairs = u[:, 0::2, None].astype(np.int64) * B_t[None, 0::2] + u[:, 1::2, None].astype(np.int64) * B_t[None, 1::2]
    over = (pairs > 32767) | (pairs < -32768)  # [images, 32 pixel pairs, 10 classes]
    wrong = sat != exact
    flips = (sat.argmax(1) != exact.argmax(1)).mean()
    sat_stats[bits] = (over.mean(), wrong.mean(), int(np.abs(sat - exact).max()), flips)
    print(
        f"{bits}-bit codes: {over.mean():6.2%} of pixel pairs saturate, {wrong.mean():6.2%} of logits wrong "
        f"(max error {int(np.abs(sat - exact).max())} = {np.abs(sat - exact).max() / np.abs(exact).max():.1%} of the "
        f"largest logit), argmax changed on {flips:.2%} of images"
    )
    if bits == 8:
        hot = over.any(2).mean(0).reshape(8, 4)  # per pixel pair (row, column pair): how often it saturates
        print("saturation rate per pixel pair (8 rows x 4 column pairs), %:")
        print(np.array2string(np.rint(hot * 100).astype(int), separator=" "))
        assert hot[:, 1:3].mean() > 2 * hot[:, [0, 3]].mean()  # the middle columns (strokes) saturate most
assert sat_stats[8][1] > 0 and sat_stats[7][1] == 0  # 8-bit codes saturate on real data, 7-bit never do
assert sat_stats[7][0] == 0 and sat_stats[8][0] > 0
# every exact path agrees with the int64 oracle on the same data (8-bit codes, zero point 0)
u8_codes = np.rint(pix * 255).astype(np.uint8)
pk_t = Q.PackedInt8Weight(B_t)
for v in Q.gemm.packed_versions():
    if v != "avx2_u7":
        assert np.array_equal(pk_t.matmul(u8_codes, 0, version=v), u8_codes.astype(np.int64) @ B_t.astype(np.int64)), v

# %% [markdown]
# The saturated pairs sit in the bright strokes in the middle of the image (the table above: rows are image rows,
# columns are pixel pairs; the two middle column pairs saturate over twice as often as the border ones, asserted) —
# the informative pixels, so the error is not noise spread thinly but concentrated where the classifier looks. fbgemm avoids it by quantizing activations to 0..127 (`reduce_range`),
# tinylearn by choosing the kernel from the codes: `avx2_u7` only when every code is ≤ 127, otherwise
# `avx2_madd16` (exact for everything) or `vpdpbusd`.
#
# **Measured, every path on this CPU** (one thread, 256×1024×1024; the dynamic Linear at batch 1/32/128/512 ×
# 1024→1024 against torch's `quantize_dynamic` Linear, which also quantizes activations per call to 7-bit codes
# with per-tensor int8 weights). `TINYLEARN_CPU_FEATURES=avx2` is what an AVX2-only CPU would pick. Timings depend
# on the CPU and on load, so the cell asserts only exactness and which kernel ran.

# %%
# NBVAL_IGNORE_OUTPUT
M_, K_, N_ = 256, 1024, 1024
A8g = rng.integers(-128, 128, (M_, K_), dtype=np.int8)
A7g = rng.integers(0, 128, (M_, K_), dtype=np.uint8)
B8g = rng.integers(-128, 128, (K_, N_), dtype=np.int8)
Afg, Bfg = A8g.astype(np.float32), B8g.astype(np.float32)
tAg, tBg = torch.from_numpy(Afg), torch.from_numpy(Bfg)
pkg = Q.PackedInt8Weight(B8g)
ref_g = A8g.astype(np.int64) @ B8g.astype(np.int64)
cmp_g = Comparison(f"int8 GEMM paths, {M_}x{K_}x{N_}, 1 thread", baseline="numpy fp32 sgemm", repeat=5)
with threadpool_limits(1):
    torch.set_num_threads(1)
    with cmp_g.case("GEMM", flops=2 * M_ * K_ * N_) as c:
        for v in Q.gemm.packed_versions():
            a_ = A7g if v == "avx2_u7" else A8g
            assert np.array_equal(pkg.matmul(a_, 0, version=v), a_.astype(np.int64) @ B8g.astype(np.int64)), v
            c.add(
                f"prepacked B [{v}]",
                lambda v=v, a_=a_: pkg.matmul(a_, 0, version=v),
                note="7-bit A" if v == "avx2_u7" else "",
            )
        for v in Q.gemm.int8_gemm_versions():
            assert np.array_equal(Q.int8_gemm(A8g, B8g, version=v), ref_g), v
            c.add(f"int8_gemm [{v}] (packs B per call)", lambda v=v: Q.int8_gemm(A8g, B8g, version=v))
        c.add("numpy fp32 sgemm", lambda: Afg @ Bfg)
        c.add("torch fp32 matmul", lambda: tAg @ tBg)
    torch.set_num_threads(torch_threads)
tab_g = cmp_g.table
print(tab_g)

rs = np.random.default_rng(5)
Wdyn = (rs.standard_normal((1024, 1024)) * 0.05).astype(np.float32)
bdyn = rs.standard_normal(1024).astype(np.float32)
lin_t = torch.nn.Linear(1024, 1024)
with torch.no_grad():
    lin_t.weight.copy_(torch.from_numpy(Wdyn))
    lin_t.bias.copy_(torch.from_numpy(bdyn))
q_t = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin_t), {torch.nn.Linear}, dtype=torch.qint8)
dyn = DynamicQuantizedLinear(Wdyn, bdyn)  # torch's defaults: per-tensor weights, reduce_range (7-bit codes)
cmp_d = Comparison("dynamic int8 Linear 1024->1024, 1 thread", baseline="torch quantize_dynamic", repeat=9)
kernels_run = {}
with threadpool_limits(1), torch.no_grad():
    torch.set_num_threads(1)
    for bm in (1, 32, 128, 512):
        xb = rs.standard_normal((bm, 1024)).astype(np.float32)
        txb = torch.from_numpy(xb)
        y_tl, y_t = dyn(xb).data, q_t(txb).numpy()
        # same activation qparams as torch, and outputs within a small fraction of one activation step's effect
        s_t, z_t = torch._choose_qparams_per_tensor(txb, True)
        assert np.isclose(dyn.last_act_qparams[0][0], s_t, rtol=1e-6) and dyn.last_act_qparams[1][0] == z_t
        step = dyn.last_act_qparams[0][0] * dyn.w_scale[0] * np.abs(dyn.w_q.astype(np.int64)).sum(1).max()
        assert np.abs(y_tl - y_t).max() <= step / 64 + 1e-5
        with cmp_d.case(f"batch {bm}", flops=2 * bm * 1024 * 1024) as c:
            c.add("torch quantize_dynamic", lambda txb=txb: q_t(txb), note="fbgemm")
            c.add("tinylearn DynamicQuantizedLinear", lambda xb=xb: dyn(xb), note=f"kernel {dyn.last_kernel}")
            kernels_run["default"] = dyn.last_kernel
            if "avx2" in Q.int8_gemm_paths():
                os.environ["TINYLEARN_CPU_FEATURES"] = "avx2"
                dyn(xb)
                kernels_run["avx2"] = dyn.last_kernel
                c.add("tinylearn, forced AVX2", lambda xb=xb: dyn(xb), note=f"kernel {dyn.last_kernel}")
                del os.environ["TINYLEARN_CPU_FEATURES"]
            c.add("torch fp32 Linear", lambda txb=txb: lin_t(txb))
    torch.set_num_threads(torch_threads)
tab_d = cmp_d.table
print(tab_d)
best = Q.gemm.packed_versions()[0]
assert kernels_run["default"] == ("avx2_u7" if best == "avx2_madd16" else best)  # 7-bit codes: u7 on AVX2
# forced AVX2: Winograd where this core's multiplier is the bottleneck (avx2_choice), else the 7-bit kernel
avx2_auto = "avx2_wino" if "avx2" in Q.int8_gemm_paths() and Q.avx2_choice()["kernel"] == "avx2_wino" else "avx2_u7"
assert kernels_run.get("avx2", avx2_auto) == avx2_auto
# products per multiply-unit op (the table at the top of §7c): the arithmetic behind the expectations below
PRODUCTS_PER_MUL_OP = {"vpdpbusd zmm": 64, "vpmaddwd ymm (madd16)": 16, "vpmaddubsw + vpmaddwd ymm (u7)": 32 // 2}
PRODUCTS_PER_MUL_OP |= {"vpmaddwd ymm (Winograd)": 32}
PRODUCTS_PER_MUL_OP |= {"vfmadd231ps zmm": 16, "vfmadd231ps ymm": 8}
assert PRODUCTS_PER_MUL_OP["vpdpbusd zmm"] == 4 * PRODUCTS_PER_MUL_OP["vfmadd231ps zmm"]
assert PRODUCTS_PER_MUL_OP["vpmaddwd ymm (madd16)"] == PRODUCTS_PER_MUL_OP["vpmaddubsw + vpmaddwd ymm (u7)"]
assert PRODUCTS_PER_MUL_OP["vpmaddwd ymm (madd16)"] == 2 * PRODUCTS_PER_MUL_OP["vfmadd231ps ymm"]
# register budget of the 6-row micro-kernels: accumulators + B vectors + A broadcast (+ madd product) <= registers
REGS = {"avx512vnni": (6 * 4 + 4 + 1, 32), "avx2_madd16": (6 * 2 + 2 + 1 + 1, 16)}
REGS["avx2_wino"] = (3 * 4 + 2 + 2, 16)  # 12 accumulators + 2 broadcasts + x, y (B from memory)
assert PRODUCTS_PER_MUL_OP["vpmaddwd ymm (Winograd)"] == 2 * PRODUCTS_PER_MUL_OP["vpmaddwd ymm (madd16)"]
assert all(used <= avail for used, avail in REGS.values())
MADD16_K_STEP = {"vpmaddwd": 6 * 2, "vpaddd": 6 * 2, "loads": 2 + 6}  # 2 B vectors + 6 A broadcasts
assert MADD16_K_STEP == {"vpmaddwd": 12, "vpaddd": 12, "loads": 8}
assert all(r.median_ms > 0 for r in tab_g.rows + tab_d.rows)
fig, axs = plt.subplots(1, 2, figsize=(12, 3.6))
rows_g = list(tab_g.rows)
axs[0].barh([r.impl for r in rows_g], [r.gflops for r in rows_g], color="C0")
axs[0].set_xlabel("GOP/s (1 thread)")
axs[0].set_title(f"int8 GEMM {M_}x{K_}x{N_}")
for i, bm in enumerate((1, 32, 128, 512)):
    rr = [r for r in tab_d.rows if r.case == f"batch {bm}"]
    axs[1].bar([i * 5 + j for j in range(len(rr))], [r.median_ms for r in rr], color=[f"C{j}" for j in range(len(rr))])
axs[1].set_yscale("log")
axs[1].set_xticks([1.5, 6.5, 11.5, 16.5], ["batch 1", "batch 32", "batch 128", "batch 512"])
axs[1].legend(
    [plt.Rectangle((0, 0), 1, 1, color=f"C{j}") for j in range(4)], [r.impl for r in tab_d.rows[:4]], fontsize=7
)
axs[1].set_ylabel("ms per call (log)")
axs[1].set_title("dynamic int8 Linear 1024->1024")
plt.tight_layout()
plt.show()

# %% [markdown]
# **Reading it.** Exactness is asserted above for every path on the benchmark inputs (`avx2_u7` on 7-bit codes);
# the timings are this machine's and are not compared by nbval. What the instruction table predicts: `vpdpbusd`
# does 4× the products per op of an fp32 FMA, so VNNI is where int8 clearly beats sgemm; on AVX2 both exact
# (`madd16`) and 7-bit (`u7`) kernels run 16 products per multiply op, i.e. at best 2× an AVX2 fp32 FMA (8 per op),
# minus the extra `vpaddd`s (one per `vpmaddwd`: a K step of the 6×8 kernel is 12 multiplies, 12 adds and 8 loads,
# asserted, close to a 6-wide core's dispatch budget) — so a direct AVX2 int8 GEMM that reaches 1.5× sgemm is near
# its ceiling, and the 7-bit variant's margin over `madd16` comes from fewer bytes and no widening, not from more
# multiplies. Winograd's kernel does 32 products per multiply op (asserted) and pays in adds: it is the one that
# gains where the multiplier, not the instruction count, is the limit (the ceiling section above). The dynamic Linear is one fused C++ call (parallel min/max → 32-wide quantize → packed GEMM →
# dequantize + bias) with the same qparams as torch (asserted), so it is compared like for like with
# `quantize_dynamic`.

# %% [markdown]
# ### Choosing the GEMM version at run time: measure once per shape, cache, re-measure on drift [Q80]
#
# The table above shows no version wins everywhere, and the winner depends on the shape, the CPU and what else
# runs on it. Run-time feedback settles it the way cuDNN's `benchmark=True` and Triton's autotuner do:
# `Q.KernelAutotuner` (over every `int8_gemm` version this machine registers in `tinylearn.backends`, plus numpy's
# exact int32 matmul: `Q.int8_gemm_autotuner()`) times each candidate on the first call with a new shape, checks that
# they agree exactly (a candidate with a different result is dropped, never chosen), caches the fastest, and from then
# on runs only the cached one — timing every call (one clock read pair: the feedback signal). When the statistic of
# its last 8 calls exceeds 1.5× the time it was chosen with (a co-runner, a frequency drop, a cache that no longer
# holds the data) the shape is measured again and may switch. Kernel time is the signal here; hardware counters
# (bandwidth, cache misses) would feed the same decision rule with a reason attached. On this shared box the tuner
# uses one OpenMP thread and CPU time (`time.process_time`), whose minimum over 15 runs is robust to other processes'
# time slices; a dedicated server would pass wall time. The choice is checked against an independent interleaved
# re-measurement, and the drift is provoked by making the chosen kernel repeat its work until it is 3× slower than
# the runner-up.

# %%
# NBVAL_IGNORE_OUTPUT
import time  # noqa: E402

torch.set_num_threads(1)  # the C++ kernels' OpenMP runtime is torch's: one thread, so CPU time is the kernel's work
try:
    rng_t = np.random.default_rng(80)
    tuner = Q.int8_gemm_autotuner(repeat=15, timer=time.process_time, stat="min")
    ratio_t, speedup_t = {}, {}
    for m_t, k_t, n_t in ((8, 512, 512), (128, 256, 256), (256, 512, 256)):
        a_t = rng_t.integers(-128, 128, (m_t, k_t), dtype=np.int8)
        b_t = rng_t.integers(-128, 128, (k_t, n_t), dtype=np.int8)
        assert np.array_equal(tuner(a_t, b_t), a_t.astype(np.int32) @ b_t.astype(np.int32))
        rec_t = tuner.cache[tuner.key(a_t, b_t)]
        fresh_t = {name: [] for name in tuner.candidates}
        for _ in range(15):  # independent re-measurement, candidates interleaved
            for name, fn in tuner.candidates.items():
                t_ = time.process_time()
                fn(a_t, b_t)
                fresh_t[name].append(time.process_time() - t_)
        fresh_t = {name: min(v) for name, v in fresh_t.items()}
        ratio_t[(m_t, k_t, n_t)] = fresh_t[rec_t.choice] / min(fresh_t.values())
        speedup_t[(m_t, k_t, n_t)] = fresh_t["numpy:int32_matmul"] / fresh_t[rec_t.choice]
        print(
            f"{m_t}x{k_t}x{n_t}: chose {rec_t.choice:18s} tuning (us) "
            + ", ".join(f"{k.split(':')[1]} {1e6 * v:.0f}" for k, v in rec_t.times.items())
            + f" | re-measured: chosen / best {ratio_t[(m_t, k_t, n_t)]:.2f}"
        )
    first = rec_t.choice
    ranked = sorted(rec_t.times, key=rec_t.times.__getitem__)
    reps = int(np.ceil(3 * rec_t.times[ranked[1]] / rec_t.times[first]))
    fast_fn = tuner.candidates[first]
    tuner.candidates[first] = lambda a, b, f=fast_fn, r=reps: [f(a, b) for _ in range(r)][-1]  # 3x the runner-up
    for _ in range(tuner.window):
        tuner(a_t, b_t)
    rec_t2 = tuner.cache[tuner.key(a_t, b_t)]
    print(
        f"drift: {first} made {reps}x slower -> re-measured ({rec_t2.measurements} measurements), now {rec_t2.choice}"
    )
finally:
    torch.set_num_threads(torch_threads)
assert not tuner.rejected  # every version agrees exactly
assert all(r <= 2.0 for r in ratio_t.values())  # the cached choice is near the fastest when measured again
assert all(s >= 5 for s in speedup_t.values())  # and far from the slowest (numpy's int32 matmul)
assert rec_t2.measurements == 2 and rec_t2.choice != first  # drift detected, shape re-measured, choice switched

# %% [markdown]
# Every cached choice re-measures within 2× of the fastest version — usually the fastest itself — and 5×+ faster than
# numpy's exact int32 matmul (asserted); on this loaded 2-core box versions within ~15–40 % of each other trade places
# between runs, which is why the tuner keeps watching instead of trusting one measurement. After the provoked slowdown the window statistic crossed 1.5×, the
# shape was measured again and the choice switched (asserted).

# %% [markdown]
# ## 8. PTQ end to end on digits [Q21] [Q44] [Q45]
#
# `prepare` copies the model, folds BatchNorm into the preceding conv, marks Linear/Conv2d+ReLU for fusion and
# wraps each layer with observers; `calibrate` runs data through; `convert` swaps in `QuantizedLinear` /
# `QuantizedConv2d` (int8 GEMM, per-channel symmetric weights, affine int8 activations), or int4 weight-only,
# W4A8 (int4 weight codes on the int8 GEMM) and simulated-FP8 layers.
#
# Accuracies after training depend on float summation order (BLAS kernels, SIMD width), so
# they are printed unchecked by nbval and the claims are asserts; model sizes are exact and compared below.

# %%
# NBVAL_IGNORE_OUTPUT
Xd, yd = tl.data.load_digits()
Xtr, Xte, ytr, yte = tl.data.train_test_split(Xd, yd, 0.25, seed=0)
tl.manual_seed(0)
mlp = DigitsMLP()
fit(mlp, Xtr, ytr, epochs=10, lr=1e-2, seed=0)
tl.manual_seed(0)
cnn = DigitsCNN(c1=8, c2=16)
fit(cnn, Xtr, ytr, epochs=3, lr=1e-2, seed=0)

results = {}
for mname, model in tqdm((("MLP", mlp), ("CNN", cnn)), desc="PTQ models", leave=False):
    results[(mname, "fp32")] = (evaluate(model, Xte, yte), Q.model_size_bytes(model))
    for mode in ("int8", "w4a8", "int4_weight", "fp8"):
        for act in ("minmax", "histogram") if mode == "int8" else ("minmax",):
            p = Q.prepare(model, Q.default_qconfig(mode, act))
            Q.calibrate(p, Xtr[:512])
            qm = Q.convert(p)
            results[(mname, f"{mode} ({act})")] = (evaluate(qm, Xte, yte), Q.model_size_bytes(qm))
print(f"{'model':5s} {'variant':22s} {'acc %':>6s}")
for (mname, v), (acc, _) in results.items():
    print(f"{mname:5s} {v:22s} {100 * acc:6.1f}")
assert results[("MLP", "fp32")][0] >= 0.95 and results[("CNN", "fp32")][0] >= 0.9
for mname in ("MLP", "CNN"):
    assert results[(mname, "int8 (minmax)")][0] >= results[(mname, "fp32")][0] - 0.005
    for v in ("int4_weight (minmax)", "fp8 (minmax)"):
        assert results[(mname, v)][0] >= results[(mname, "fp32")][0] - 0.02, (mname, v)
assert results[("CNN", "int8 (histogram)")][0] < results[("CNN", "int8 (minmax)")][0]  # KL clips the CNN input

# %%
print(f"{'model':5s} {'variant':22s} {'KB':>7s}")
for (mname, v), (_, size) in results.items():
    print(f"{mname:5s} {v:22s} {size / 1024:7.2f}")

# %% [markdown]
# int8 per-channel PTQ is within half a point of fp32, int4 weight-only and FP8 within two (asserted). On the CNN,
# KL-calibrated activations are worse than MinMax (asserted): the inputs are 17 discrete pixel levels and KL's
# threshold clips them — calibration methods must be validated on the model, not chosen by reputation.
#
# **QAT recovering int4 [Q44] [Q66]**: per-*tensor* int4 weights (one scale per layer) hurt the CNN after PTQ.
# Fine-tuning through fake quantization (STE) with LSQ-learned scales for 2 more epochs recovers it. The fair
# baseline is the fp32 CNN trained for the **same** 3 + 2 epochs (same optimizer, lr and seed for the extra two):
# the CNN was trained only 3 epochs, so any 2 extra epochs help, quantized or not.


# %%
# NBVAL_IGNORE_OUTPUT
def pt_int4(learnable):
    return Q.QConfig(weight=lambda: Q.MinMaxObserver("int4", symmetric=True), mode="w4a8", learnable=learnable)


p = Q.prepare(cnn, pt_int4(False))
Q.calibrate(p, Xtr[:512])
ptq_pt = Q.convert(p)
acc_ptq = evaluate(ptq_pt, Xte, yte)
qat = Q.prepare_qat(cnn, pt_int4(True))
fit(qat, Xtr, ytr, epochs=2, lr=2e-3, seed=1)
acc_qat = evaluate(Q.convert(qat), Xte, yte)
acc_fp3 = evaluate(cnn, Xte, yte)
cnn5 = copy.deepcopy(cnn)
fit(cnn5, Xtr, ytr, epochs=2, lr=2e-3, seed=1)  # the equal-epoch fp32 baseline
acc_fp5 = evaluate(cnn5, Xte, yte)
print(f"{'CNN variant':40s} {'epochs':>6s} {'acc %':>6s}")
for name, ep, a in (
    ("fp32", 3, acc_fp3),
    ("W4A8 per-tensor PTQ (of the 3-epoch model)", 3, acc_ptq),
    ("W4A8 per-tensor LSQ QAT", "3+2", acc_qat),
    ("fp32, same 2 extra epochs", "3+2", acc_fp5),
):
    print(f"{name:40s} {ep!s:>6s} {100 * a:6.1f}")
assert acc_ptq < acc_fp3 and acc_qat >= acc_ptq  # PTQ hurts, QAT recovers
# at equal epochs QAT stays below fp32 and within 4 points of it (the exact gap moves by a few images, 0.22 pt each,
# with float summation order: 2.2 points in one build, 3.1 after a conv backward changed its reduction order)
assert acc_fp5 - 0.04 <= acc_qat <= acc_fp5

# %% [markdown]
# At equal epochs QAT lands a few points below fp32 (within 4, asserted; the exact gap depends on float summation
# order in training) — it does not beat fp32; the earlier "QAT > fp32" impression came only from comparing 5 epochs
# against 3.
#
# **Per-channel vs per-tensor W4A8.** Per-channel scales give every output channel its own int4 grid, so the
# *weight* error can only go down — it does, by the factor printed below (asserted). The *accuracy* of the two
# does not have to follow: 449 test images make one image 0.22 points, the CNN's accuracy is limited by its 8-bit
# activations and by which borderline images flip, and the quantization error is not a loss-aware objective (a
# smaller weight MSE can still move a few logits the wrong way). So an accuracy gap of a point or less between
# the two (92.4 vs 92.0 in one earlier run) reads "equal within a few images"; the output-level error (logit MSE
# vs fp32, printed) is the better comparison of the two quantizers.

# %%
# NBVAL_IGNORE_OUTPUT
p_pc = Q.prepare(cnn, Q.default_qconfig("w4a8", "minmax"))  # per-channel symmetric int4 weights
Q.calibrate(p_pc, Xtr[:512])
pc_model = Q.convert(p_pc)
w_pt = w_pc = 0.0
for mod in (m for m in cnn.modules() if isinstance(m, (tl.nn.Conv2d, tl.nn.Linear))):
    wv = mod.weight.data.reshape(mod.weight.data.shape[0], -1)
    s_t, _ = Q.calculate_qparams(wv.min(), wv.max(), "int4", symmetric=True)
    w_pt += float(np.sum((Q.quantize_dequantize(wv, s_t, 0, "int4") - wv) ** 2))
    s_c, _ = Q.calculate_qparams(wv.min(1), wv.max(1), "int4", symmetric=True)
    w_pc += float(np.sum((Q.quantize_dequantize(wv, s_c, np.zeros(len(s_c), np.int64), "int4", axis=0) - wv) ** 2))
ref_lg = predict(cnn, Xte)
lg_pt = float(np.mean((predict(ptq_pt, Xte) - ref_lg) ** 2))
lg_pc = float(np.mean((predict(pc_model, Xte) - ref_lg) ** 2))
acc_pc = evaluate(pc_model, Xte, yte)
print(f"int4 weight squared error: per-tensor {w_pt:.3f}, per-channel {w_pc:.3f} ({w_pt / w_pc:.1f}x lower)")
print(f"logit MSE vs fp32: per-tensor {lg_pt:.4f}, per-channel {lg_pc:.4f}")
print(
    f"accuracy: per-tensor {100 * acc_ptq:.1f}%, per-channel {100 * acc_pc:.1f}% ({len(yte)} images, 1 = "
    f"{100 / len(yte):.2f} pt)"
)
assert w_pc < w_pt  # per-channel can only lower the weight error (each channel's own max)
# %% [markdown]
# ## 9. Cross-layer equalization and bias correction [Q21]
#
# With per-tensor weight scales, one wide channel sets the scale for all. For `Linear → ReLU → Linear`,
# $W_1' = \mathrm{diag}(1/s) W_1$, $b_1' = b_1/s$, $W_2' = W_2 \mathrm{diag}(s)$ leaves the function unchanged
# (ReLU is positively homogeneous); $s_i = \sqrt{r_{1,i}/r_{2,i}}$ equalises the per-channel ranges. We make the
# trained MLP imbalanced with a function-preserving random rescaling (as depthwise convs often are) and quantize
# its weights per-tensor. Bias correction then subtracts the mean output shift $(W_q - W)\,\mathbb{E}[x]$.


# %%
# NBVAL_IGNORE_OUTPUT
def weights_per_tensor(model, dtype, bc=False):
    m = copy.deepcopy(model)
    l1, l2 = m.net[1], m.net[3]
    xin = Xtr[:512].reshape(512, -1)
    means = [xin.mean(0), np.maximum(xin @ l1.weight.data.T + l1.bias.data, 0).mean(0)]
    for lin, mean in zip((l1, l2), means):
        w = lin.weight.data
        s, z = Q.calculate_qparams(w.min(), w.max(), dtype, symmetric=True)
        wq = Q.quantize_dequantize(w, s, z, dtype)
        if bc:
            lin.bias.data = Q.bias_correction(w, wq, lin.bias.data, mean.astype(np.float64))
        lin.weight.data = wq
    return m


imb = copy.deepcopy(mlp)
c = np.exp(np.random.default_rng(1).uniform(-3, 3, 128)).astype(np.float32)
imb.net[1].weight.data = imb.net[1].weight.data * c[:, None]
imb.net[1].bias.data = imb.net[1].bias.data * c
imb.net[3].weight.data = imb.net[3].weight.data / c[None, :]
eq = copy.deepcopy(imb)
Q.cross_layer_equalize(eq.net[1], eq.net[3])
ref_logits = predict(mlp, Xte)
assert np.allclose(predict(imb, Xte), ref_logits, atol=1e-3) and np.allclose(predict(eq, Xte), ref_logits, atol=1e-3)
print(f"{'variant':34s} {'int8 acc':>8s} {'int4 acc':>8s} {'int4 |mean logit shift|':>24s}")
cle = {}
for name, model, bc in (
    ("original", mlp, False),
    ("imbalanced", imb, False),
    ("imbalanced + CLE", eq, False),
    ("imbalanced + CLE + bias corr.", eq, True),
):
    a8 = evaluate(weights_per_tensor(model, "int8", bc), Xte, yte)
    m4 = weights_per_tensor(model, "int4", bc)
    shift = np.abs((predict(m4, Xte) - ref_logits).mean(0)).mean()
    cle[name] = (a8, evaluate(m4, Xte, yte), shift)
    print(f"{name:34s} {100 * a8:8.1f} {100 * cle[name][1]:8.1f} {shift:24.3f}")
acc_float = evaluate(mlp, Xte, yte)
assert cle["imbalanced"][1] < 0.5 and cle["imbalanced + CLE"][1] >= acc_float - 0.02  # CLE rescues int4
assert cle["imbalanced + CLE + bias corr."][2] < 0.5 * cle["imbalanced + CLE"][2]  # bias corr. removes the shift

# %% [markdown]
# CLE turns an unusable per-tensor int4 model back into a near-fp32 one; bias correction removes most of the
# systematic (mean) logit shift that rounding leaves behind, which matters most when errors do not average out.

# %% [markdown]
# ### A learnable activation shift / scale, trained with the model and folded away [Q196]
#
# CLE moves scale between *weights*; the same trick on the *activation* side fixes skewed activations — channels
# with their own offset and spread (LayerNorm outputs of LLMs, linear bottlenecks), where one per-tensor grid's step
# is set by the widest channel and narrow channels land on a few codes. Per-channel activation scales would fix it
# but cannot be factored out of an integer GEMM's K-sum. `tl.quant.LearnableShiftScale` puts a per-channel
# $y = (x - \delta)/s$ before a per-tensor fake quantizer and $\hat x = \hat y\, s + \delta$ after it; $\delta$ and
# $\log s$ are Parameters trained by back-propagation through the STE **together with the model's weights**
# (initialised from each channel's mid-range and half-range). Unlike BatchNorm it normalises nothing per batch: at
# inference it is a fixed affine map and an *equivalence* around the quantizer, so `fold_shift_scale` folds it away
# (exact in real arithmetic):
#
# $$W_p' = \mathrm{diag}(1/s)\,W_p,\quad b_p' = (b_p - \delta)/s \qquad\qquad W_c' = W_c\,\mathrm{diag}(s),\quad
# b_c' = b_c + W_c\,\delta$$
#
# so the deployed block is producer′ → per-tensor quantize → consumer′ with nothing in between (this needs no
# nonlinearity between producer and consumer; a positive $s$ alone also passes through a ReLU). Measured on a skewed
# 32-channel activation (channel offsets up to ±10, spreads over a factor 20) quantized to int4, against the target
# output of the float block:

# %%
# NBVAL_IGNORE_OUTPUT
rng_s = np.random.default_rng(196)
mse_of = lambda a, b: float(np.mean((a.astype(np.float64) - b) ** 2))  # noqa: E731
tl.manual_seed(196)
producer, consumer = tl.nn.Linear(16, 32), tl.nn.Linear(32, 8)
producer.weight.data = producer.weight.data * np.exp(rng_s.uniform(-3, 0, 32)).astype(np.float32)[:, None]
producer.bias.data = rng_s.uniform(-10, 10, 32).astype(np.float32)
X_s, X_s_test = rng_s.standard_normal((2, 1024, 16)).astype(np.float32)
block_ref = lambda X: consumer(producer(tl.Tensor(X))).data  # noqa: E731
Y_s, Y_s_test = block_ref(X_s), block_ref(X_s_test)
act_s = producer(tl.Tensor(X_s)).data
s_pt, z_pt = Q.calculate_qparams(act_s.min(), act_s.max(), "int4")  # plain per-tensor affine int4 of the activation
plain = consumer(tl.Tensor(Q.quantize_dequantize(producer(tl.Tensor(X_s_test)).data, s_pt, z_pt, "int4"))).data
shsc = Q.LearnableShiftScale(32, "int4").init_from(act_s)
cons_t = copy.deepcopy(consumer)


def through_module(cons):
    with tl.no_grad():
        return cons(shsc(producer(tl.Tensor(X_s_test)))).data


e_plain = mse_of(plain, Y_s_test)
e_init = mse_of(through_module(cons_t), Y_s_test)
opt_s = tl.optim.Adam([shsc.shift, shsc.log_scale, *cons_t.parameters()], lr=1e-3)
for _ in range(300):  # QAT of the module and the consumer on the block's output
    idx = rng_s.integers(0, len(X_s), 128)
    loss = ((cons_t(shsc(producer(tl.Tensor(X_s[idx])))) - tl.Tensor(Y_s[idx])) ** 2).mean()
    opt_s.zero_grad()
    loss.backward()
    opt_s.step()
e_trained = mse_of(through_module(cons_t), Y_s_test)
p_f, c_f = Q.fold_shift_scale(producer, shsc, cons_t)
out_f, codes_f = Q.quantized_block(p_f, c_f, X_s_test, shsc.q_scale, shsc.q_zero_point, "int4")
codes_m = Q.quantize(shsc.transform(producer(tl.Tensor(X_s_test)).data), shsc.q_scale, shsc.q_zero_point, "int4")
float_gap = np.abs(c_f(p_f(tl.Tensor(X_s_test))).data - cons_t(producer(tl.Tensor(X_s_test))).data).max()
print(f"int4 output MSE: plain per-tensor {e_plain:.2e} | shift/scale at init {e_init:.2e} | trained {e_trained:.2e}")
print(
    f"folded vs unfolded: float max |diff| {float_gap:.1e}; int4 codes equal {100 * np.mean(codes_f == codes_m):.3f} %"
)
print(f"folded int4 block output MSE {mse_of(out_f, Y_s_test):.2e} (vs the module {e_trained:.2e})")
assert float_gap <= 1e-4 * np.abs(Y_s_test).max()  # the fold is exact up to fp32 rounding
assert np.mean(codes_f == codes_m) > 0.999  # same codes except where fp32 rounding moves a value across a tie
assert abs(mse_of(out_f, Y_s_test) - e_trained) < 0.01 * e_trained
assert e_trained < 0.02 * e_plain and e_trained < e_init  # 50x+ below plain per-tensor; training improves the init

# %% [markdown]
# On this skewed activation the shift/scale cuts the int4 output error by more than 50× against a plain per-tensor
# quantizer, training it with the consumer lowers it further below its statistics-based initialisation, and the
# folded block — two ordinary Linear layers with one per-tensor quantizer between them — reproduces it: equal in
# float up to fp32 rounding, the same int4 codes but for ties, the same error within 1 % (asserted).

# %% [markdown]
# ## 10. Dynamic vs static activation quantization [Q65]
#
# **Static** quantization fixes the activation scale offline from calibration data (observers, §3) — no run-time
# cost, but an input outside the calibrated range is clipped. **Dynamic** quantization (torch's
# `quantize_dynamic`, LLM int8 inference) measures each batch's range at run time, one extra reduction pass per
# call, and always fits; weights stay statically quantized in both. FP8's delayed scaling (§4) sits in between: a
# run-time statistic, but from previous steps. Measured on a calibration set and on a batch whose scale drifted 4×:

# %%
calib = rng.standard_normal((512, 64)).astype(np.float32)
obs_s = Q.MinMaxObserver("int8")
obs_s(calib)
s_static, z_static = obs_s.calculate_qparams()
print(f"{'batch':22s} {'static rel MSE':>15s} {'dynamic rel MSE':>16s}")
dyn_err = {}
for name, xb in (
    ("in-distribution", rng.standard_normal((64, 64))),
    ("scale drifted 4x", 4 * rng.standard_normal((64, 64))),
):
    xb = xb.astype(np.float32)
    s_dyn, z_dyn = Q.calculate_qparams(xb.min(), xb.max(), "int8")  # per call: one pass over the batch
    e_s = np.mean((Q.quantize_dequantize(xb, s_static, z_static, "int8") - xb) ** 2) / np.mean(xb**2)
    e_d = np.mean((Q.quantize_dequantize(xb, s_dyn, z_dyn, "int8") - xb) ** 2) / np.mean(xb**2)
    dyn_err[name] = (e_s, e_d)
    print(f"{name:22s} {e_s:15.2e} {e_d:16.2e}")
assert dyn_err["scale drifted 4x"][0] > 100 * dyn_err["scale drifted 4x"][1]  # static clips, dynamic adapts
assert dyn_err["in-distribution"][0] < 3 * dyn_err["in-distribution"][1]  # in range: static is as good

# %% [markdown]
# In distribution the two are within 3× of each other (asserted); after a 4× drift the static scale clips and its
# error is over 100× the dynamic one (asserted). A dynamic system therefore pairs per-call scales with
# observers that track statistics (moving-average MinMax, percentile) for the layers where the extra pass is too
# costly, and re-calibrates when the monitored clip rate rises.

# %% [markdown]
# ### Online re-calibration under drift: monitor saturation and MSE, refit with hysteresis [Q238]
#
# Between the two lies **online re-calibration**: keep static qparams (no per-call reduction on the inference path),
# but monitor them and refit when they go stale. `tl.quant.OnlineRecalibrator` computes two statistics per batch:
# the **saturation rate** (fraction of elements beyond the grid's end codes by more than half a step: what
# quantization clipped) and the **MSE ratio** (MSE with the qparams in force / MSE with qparams fitted to this batch's
# own min/max: 1 = as good as dynamic; large = stale, in either direction — a range too narrow clips, one too wide
# rounds coarsely). The decision is a **Schmitt trigger**: the alarm turns on when saturation > 1 % or ratio > 4 and
# off only when saturation < 0.1 % and ratio < 2 (hysteresis: noise between the thresholds cannot toggle it); the
# qparams are refitted, to the min/max of the alarmed batches, after **2 consecutive** alarmed batches (one outlier
# batch does not move them) and at most every 4 batches (no oscillation). The refit applies from the next batch.
#
# The stream: 60 batches of ReLU activations (128 × 64, uint8 affine) at scale 1, one outlier batch at 3× (step 8),
# a drift to 2.5× at step 20 and to 0.6× at step 40. Compared: the **stale** qparams (calibrated once), the online
# re-calibrator, and **dynamic** per-batch qparams (the floor, at the price of a reduction per call); and a trigger
# without patience or hysteresis (`patience=1`, low = high thresholds, no cooldown).

# %%
rng_d = np.random.default_rng(238)
gains = np.r_[np.ones(20), 2.5 * np.ones(20), 0.6 * np.ones(20)]
gains[8] = 3.0  # one outlier batch
stream = [(g * np.maximum(rng_d.standard_normal((128, 64)), 0)).astype(np.float32) for g in gains]
calib_act = np.maximum(rng_d.standard_normal((512, 64)), 0).astype(np.float32)
online = Q.OnlineRecalibrator(
    "uint8", sat_high=0.01, sat_low=0.001, ratio_high=4.0, ratio_low=2.0, patience=2, cooldown=4
)
nervous = Q.OnlineRecalibrator(
    "uint8", sat_high=0.01, sat_low=0.01, ratio_high=4.0, ratio_low=4.0, patience=1, cooldown=0
)
s_st, z_st = online.calibrate(calib_act)
nervous.calibrate(calib_act)
err = {"stale": [], "online": [], "dynamic": [], "no hysteresis": []}
for xb in stream:
    err["online"].append(mse_of(online(xb), xb))
    err["no hysteresis"].append(mse_of(nervous(xb), xb))
    err["stale"].append(mse_of(Q.quantize_dequantize(xb, s_st, z_st, "uint8"), xb))
    s_b, z_b = Q.calculate_qparams(xb.min(), xb.max(), "uint8")
    err["dynamic"].append(mse_of(Q.quantize_dequantize(xb, s_b, z_b, "uint8"), xb))
err = {k: np.array(v) for k, v in err.items()}
phases = {
    "scale 1 (0-19 but 8)": np.r_[0:8, 9:20],
    "outlier batch (8)": np.r_[8],
    "2.5x, refitted (22-39)": np.r_[22:40],
    "0.6x, refitted (42-59)": np.r_[42:60],
}
print(f"refits: online at steps {online.recalibrations}, without hysteresis at {nervous.recalibrations}")
print(f"{'phase':24s} " + " ".join(f"{k:>13s}" for k in err))
for name, sl in phases.items():
    print(f"{name:24s} " + " ".join(f"{err[k][sl].mean():13.2e}" for k in err))
sat = np.array([h["saturation"] for h in online.history])
print(
    f"saturation at batch 20 (stale): {100 * sat[20]:.1f} %; after the refit (22-39): max {100 * sat[22:40].max():.2f} %"
)
assert online.recalibrations == [21, 41]  # two alarmed batches after each drift; the outlier at step 8 ignored
assert online.history[8]["alarm"] and not online.history[8]["recalibrated"]
assert 8 in nervous.recalibrations and len(nervous.recalibrations) > len(online.recalibrations)
steady = phases["scale 1 (0-19 but 8)"]
assert err["no hysteresis"][steady].mean() > err["online"][steady].mean()  # its refit on the outlier cost accuracy
up, down = phases["2.5x, refitted (22-39)"], phases["0.6x, refitted (42-59)"]
assert err["online"][up].mean() < 0.01 * err["stale"][up].mean()  # upward drift: stale clips, 100x+ worse
assert err["online"][down].mean() < 0.5 * err["stale"][down].mean()  # downward: stale rounds too coarsely
for sl in (up, down):
    assert err["online"][sl].mean() < 1.5 * err["dynamic"][sl].mean()  # refitted static ~ dynamic, no per-call pass
fig, axes = plt.subplots(1, 2, figsize=(12, 3.2))
for k in ("stale", "online", "dynamic"):
    axes[0].semilogy(err[k], label=k)
for r in online.recalibrations:
    axes[0].axvline(r, color="gray", ls=":")
axes[0].set(xlabel="batch", ylabel="MSE", title="activation quantization error (dotted: refits)")
axes[0].legend()
axes[1].plot(100 * sat, label="saturation %")
axes[1].plot([min(h["mse_ratio"], 50) for h in online.history], label="MSE ratio (capped at 50)")
axes[1].axhline(1, color="gray", ls=":")
axes[1].set(xlabel="batch", title="monitored statistics (online)", yscale="log")
axes[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The online re-calibrator refits exactly twice, one batch after each drift (patience 2), ignores the outlier batch,
# and after each refit its error is within 1.5× of per-batch dynamic qparams, while the stale qparams are 100×+ worse
# after the upward drift and 2×+ worse after the downward one (asserted). The trigger without patience and hysteresis
# refits on the outlier and then has to undo it (more refits and a higher error before the drift, asserted) — in a deployed int8 graph every refit
# also rewrites the consumers' requantization multipliers.

# %% [markdown]
# ## 11. Below 8 bits: FP4 / MX blocks, per-block bit allocation, error feedback [Q74] [Q130] [Q148] [Q190]
#
# Notebook **11** (`11_mixed_precision_memory`) covers the training side: FP4 E2M1 and INT2 with the STE and fp32
# master weights, MX block scaling (§4 there, [Q74]) and Hutchinson Hessian-trace sensitivity for per-layer bit
# allocation (§5 there, [Q148]: `Tr(H_l)` estimated as `E[vᵀHv]` with Rademacher v; give the most bits to the layers
# with the largest `Tr(H_l)/n_l · ‖Q_b(W_l) − W_l‖²`). Here, three small measured pieces on the §5 weight matrix:
#
# 1. **[Q74] FP4 vs INT4 at the same bits.** MXFP4 (E2M1 elements {0, 0.5, 1, 1.5, 2, 3, 4, 6}, one shared 8-bit
#    power-of-two scale per 32) vs int4 with one fp32 scale per 32 — for bell-shaped weights FP4's non-uniform grid
#    puts its levels where the mass is.
# 2. **[Q130] Bits per 64-block under an error bound ε.** For each block pick the fewest bits in (2, 4, 6, 8)
#    whose *measured* relative error (vs the block's own energy) is ≤ ε: blocks whose max is large relative to
#    their standard deviation (heavy tails) need more bits, near-ternary ones only 2 (the median widths are
#    ordered so, asserted). Size = Σ bits + a 16-bit scale and a 2-bit width code per block.
# 3. **[Q190] Error feedback.** Quantizing a stream of small updates (most below half a step) to int4 rounds them
#    to 0 every time: the accumulated sum is lost. Error feedback adds the previous residual before quantizing,
#    `q_t = Q(g_t + e_{t−1})`, `e_t = g_t + e_{t−1} − q_t`, so `Σq = Σg − e_T` with `|e_T| ≤ s/2`: unbiased over time.

# %%
from tinylearn.amp import mx  # noqa: E402

wl = (rng.standard_normal((256, 1024)) * np.exp(0.7 * rng.standard_normal((256, 1024)))).astype(np.float32)
rel = lambda a, b: float(np.mean((a - b) ** 2) / np.mean(b**2))  # noqa: E731
e_mxfp4 = rel(mx.mx_round(wl, "fp4_e2m1", 32), wl)
qq, sc, zp = Q.quantize_groupwise(wl, 32, 4, True)
e_int4 = rel(Q.dequantize_groupwise(qq, sc, zp, 32), wl)
print(
    f"[Q74] rel MSE: MXFP4 (4 + 8/32 = {mx.mx_bits_per_element('fp4_e2m1', 32):.2f} bits) {e_mxfp4:.4f} | "
    f"int4 sym g32 (4 + 32/32 = 5 bits) {e_int4:.4f}"
)
assert e_mxfp4 < 2 * e_int4  # FP4 with a power-of-two scale is in int4-with-fp32-scale's league at fewer bits

eps = 1.5e-2
# a layer whose 64-blocks differ: bell-shaped, heavy-tailed (from the matrix above) and near-ternary ones
kinds = ["bell-shaped", "heavy-tailed", "near-ternary"]
blocks = np.concatenate(
    [
        rng.standard_normal((1024, 64)),
        wl.reshape(-1, 64)[:1024],
        rng.integers(-1, 2, (1024, 64)) + 0.01 * rng.standard_normal((1024, 64)),
    ]
).astype(np.float32)
bits_opts = (2, 4, 6, 8)
chosen_bits = np.zeros(len(blocks), int)
for b in bits_opts[::-1]:  # keep the smallest width that meets eps
    qmax = 2 ** (b - 1) - 1
    s_b = np.abs(blocks).max(1, keepdims=True) / qmax
    err_b = np.mean((np.clip(np.rint(blocks / s_b), -qmax, qmax) * s_b - blocks) ** 2, 1) / np.mean(blocks**2, 1)
    chosen_bits = np.where(err_b <= eps, b, chosen_bits)
chosen_bits = np.where(chosen_bits == 0, 8, chosen_bits)  # (none failed 8 bits here; asserted below)
deq = np.empty_like(blocks)
for b in bits_opts:
    sel = chosen_bits == b
    qmax = 2 ** (b - 1) - 1
    s_b = np.abs(blocks[sel]).max(1, keepdims=True) / qmax
    deq[sel] = np.clip(np.rint(blocks[sel] / s_b), -qmax, qmax) * s_b
blk_err = np.mean((deq - blocks) ** 2, 1) / np.mean(blocks**2, 1)
bits_total = (chosen_bits * 64 + 16 + 2).sum()
for k, name in enumerate(kinds):
    cb = chosen_bits[k * 1024 : (k + 1) * 1024]
    counts = {int(a): int(b) for a, b in zip(*np.unique(cb, return_counts=True))}
    print(f"[Q130] eps={eps}: {name:13s} blocks -> widths {counts}")
print(
    f"[Q130] {bits_total / blocks.size:.2f} bits/weight vs 8.28 for int8 everywhere; worst block error "
    f"{blk_err.max():.1e} <= eps"
)
widths = [np.median(chosen_bits[k * 1024 : (k + 1) * 1024]) for k in range(3)]
assert blk_err.max() <= eps and bits_total / blocks.size < 8.28
assert widths[2] < widths[0] < widths[1]  # ternary < bell-shaped < heavy-tailed

g = rng.normal(0.02, 0.01, (200, 1000)).astype(np.float32)  # 200 small updates, s = 0.1 -> each < s/2
s_g = 0.1
q_plain = Q.quantize_dequantize(g, s_g, 0, "int4")
q_ef, e = np.zeros_like(g), np.zeros(1000, np.float32)
for t_ in range(len(g)):
    v = g[t_] + e
    q_ef[t_] = Q.quantize_dequantize(v, s_g, 0, "int4")
    e = v - q_ef[t_]
true_sum = g.sum(0)
err_plain = np.abs(q_plain.sum(0) - true_sum).mean() / np.abs(true_sum).mean()
err_ef = np.abs(q_ef.sum(0) - true_sum).mean() / np.abs(true_sum).mean()
print(f"[Q190] relative error of the summed updates: plain int4 {err_plain:.3f}, with error feedback {err_ef:.4f}")
assert err_plain > 0.9 and err_ef < 0.02 and np.abs(e).max() <= s_g / 2 + 1e-6

# %% [markdown]
# ### A total error budget split across segments by sensitivity [Q208]
#
# §11's per-block widths meet one bound everywhere; a network instead has one **total** budget $\varepsilon$ on its
# output error to split across segments (layers or groups of layers). Model: quantizing segment $i$ ($n_i$ weights)
# to $b_i$ bits leaves a per-weight MSE $m_i(b_i) \approx c_i 4^{-b_i}$; to first order the output error adds up,
# $E \approx \sum_i w_i m_i$, with $w_i$ the segment's **sensitivity** (output MSE per unit weight MSE, measured by
# quantizing that segment alone: `Q.measure_sensitivities`). Minimising the bits $\sum_i n_i b_i$ subject to
# $E = \varepsilon$: with $b_i = \tfrac12\log_2(c_i/m_i)$ the Lagrangian's stationarity gives
#
# $$\frac{n_i}{2\ln 2\; m_i} = \lambda w_i \;\Rightarrow\; w_i m_i = \varepsilon\,\frac{n_i}{N},\qquad
# m_i = \frac{\varepsilon\, n_i}{N\, w_i}$$
#
# — each segment's *share of the output error* is proportional to its **size**, so its per-weight error bound is
# inversely proportional to its **sensitivity** ($c_i$ drops out). The naive "equal shares" split
# ($w_i m_i = \varepsilon/S$) overpays for large segments. `Q.allocate_error_budget` returns the bounds (with box
# constraints when the widths on offer run out: a bisection on the multiplier); on integer widths,
# `Q.allocate_bits` applies the same condition discretely (per segment $\arg\min_b n_i b + \lambda w_i m_i(b)$,
# $\lambda$ bisected to meet $\varepsilon$, leftover slack spent greedily), against `Q.choose_bits` on the equal
# shares (the smallest width meeting each bound). On the §8 CNN, three segments (conv1, conv2, fc), per-channel
# symmetric weights, widths 2–8, budget = logit MSE vs fp32:

# %%
# NBVAL_IGNORE_OUTPUT
import itertools  # noqa: E402

from tinylearn.quant import error_budget as EB  # noqa: E402

segs = ["features.0", "features.4", "fc"]
bits_on_offer = (2, 3, 4, 5, 6, 7, 8)
n_seg = EB.segment_sizes(cnn, segs)
w_seg = Q.measure_sensitivities(cnn, segs, Xtr[:512], probe_bits=4)
tab_seg = EB.weight_error_table(cnn, segs, bits_on_offer)
print("segments", segs, "weights", n_seg.astype(int).tolist(), "sensitivity", np.round(w_seg, 1).tolist())
m_l = Q.allocate_error_budget(0.1, w_seg, n_seg)
m_u = Q.allocate_error_budget(0.1, w_seg, n_seg, "uniform")
print(
    "eps = 0.1: per-weight bounds, Lagrange",
    np.array2string(m_l, precision=1),
    "| equal shares",
    np.array2string(m_u, precision=1),
)
assert np.allclose(w_seg * m_l, 0.1 * n_seg / n_seg.sum())  # output-error shares proportional to size
ref_lg_cnn = predict(cnn, Xte)
pred_err = lambda b: float(np.sum(w_seg * tab_seg[np.arange(3), [bits_on_offer.index(x) for x in b]]))  # noqa: E731
rows_b, widths_l = [], []
print(
    f"{'eps':>6s} {'Lagrange bits':>13s} {'b/w':>5s} {'logit MSE':>9s} | {'equal-share bits':>16s} {'b/w':>5s} "
    f"{'logit MSE':>9s} | {'exhaustive b/w':>14s}"
)
for eps_b in (3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0):
    b_l, _ = Q.allocate_bits(eps_b, w_seg, n_seg, tab_seg, bits_on_offer)
    b_u = Q.choose_bits(
        tab_seg, bits_on_offer, Q.allocate_error_budget(eps_b, w_seg, n_seg, "uniform", tab_seg[:, -1], tab_seg[:, 0])
    )
    best_b = min(np.dot(c, n_seg) for c in itertools.product(bits_on_offer, repeat=3) if pred_err(c) <= eps_b)
    meas = [mse_of(predict(EB.quantize_segments(cnn, segs, b), Xte), ref_lg_cnn) for b in (b_l, b_u)]
    widths_l.append(b_l)
    rows_b.append((eps_b, np.dot(b_l, n_seg), np.dot(b_u, n_seg), best_b, *meas, pred_err(b_l), pred_err(b_u)))
    print(
        f"{eps_b:6.3f} {str(b_l.tolist()):>13s} {np.dot(b_l, n_seg) / n_seg.sum():5.2f} {meas[0]:9.4f} | "
        f"{str(b_u.tolist()):>16s} {np.dot(b_u, n_seg) / n_seg.sum():5.2f} {meas[1]:9.4f} | "
        f"{best_b / n_seg.sum():14.2f}"
    )
rows_b = np.array(rows_b)
assert np.all(rows_b[:, 6] <= rows_b[:, 0]) and np.all(rows_b[:, 7] <= rows_b[:, 0] * (1 + 1e-9))  # both meet eps
assert np.all(rows_b[:, 1] <= rows_b[:, 2])  # Lagrange never needs more bits than equal shares at the same budget
assert rows_b[:, 1].sum() < 0.95 * rows_b[:, 2].sum()  # and 5 %+ fewer over the sweep
assert np.all(rows_b[:, 1] <= 1.02 * rows_b[:, 3])  # within 2 % of the exhaustive optimum
assert np.all(rows_b[:, 4] <= 1.25 * rows_b[:, 0])  # the measured logit error stays within the budget (+25 %)
assert all(b[0] == b.max() for b in widths_l)  # the small, sensitive conv1 gets the most bits

# %% [markdown]
# At every budget the sensitivity/size split needs at most as many bits as equal shares (5 %+ fewer over the sweep;
# asserted), lands within 2 % of an exhaustive search over all 7³ width combinations, and the *measured* logit
# error of the mixed-width CNN stays within the budget up to the first-order model's slack (25 %, asserted). The
# small conv1 (72 weights, $n_i/w_i$ an order of magnitude below the others) gets the most bits at every budget
# (asserted), as $m_i \propto n_i / w_i$ predicts.

# %% [markdown]
# ### Four objectives, one front: enumerating per-layer bit widths [Q180]
#
# **Answer.** With four objectives (latency, memory, energy, accuracy) there is no single best configuration:
# enumerate the candidates, score each on all four, and keep the **Pareto front**, the configurations no other one
# beats or ties in every objective while beating it in one (`Q.pareto_front`, an O(n²) dominance filter; points equal
# in everything are kept together). The deployment then picks from the front by its constraints. Here: the §8 CNN's
# three layers at widths {2, 4, 8, 16} each, 4³ = 64 configurations (`Q.bit_width_search`). Memory = Σ weights × bits
# (exact); accuracy = measured top-1 on the test set with each layer fake-quantized per output channel; latency and
# energy come from a stated **model** (`Q.BitCostModel`, not a measurement): a 1024-bit MAC datapath (2-bit codes
# run on the 4-bit path), a roofline `max(MACs/lanes, weight bytes/8 B per cycle)` per layer, and energy
# `MACs·(0.03 + 0.025·datapath bits) pJ + 1.25 pJ per weight byte`. The convs have 64 and 16 MACs per weight
# (compute-bound), the fc one (bound by weight reads), so the cost objectives disagree with each other as well as
# with accuracy.

# %%
q180_layers = ["features.0", "features.4", "fc"]
q180_params, q180_macs = Q.layer_profile(cnn, q180_layers, Xte)
cm180 = Q.BitCostModel()
q180_cfgs = Q.enumerate_bit_configs(3, (2, 4, 8, 16))
print("weights", q180_params.tolist(), "| MACs per image", q180_macs.tolist(), "| configurations", len(q180_cfgs))
for cfg in ((16, 16, 16), (8, 8, 8), (4, 4, 4), (2, 2, 2)):
    lat, mem, en = cm180.costs(q180_params, q180_macs, cfg)
    print(f"widths {cfg!s:13s} latency {lat:6.1f} cycles  memory {mem:6d} bits  energy {en:8.1f} pJ (model)")
assert len(q180_cfgs) == 64 and q180_params.tolist() == [72, 1152, 640] and q180_macs.tolist() == [4608, 18432, 640]
assert cm180.costs(q180_params, q180_macs, (8, 8, 8))[1] == 8 * 1864  # memory = sum of weights x bits
assert len({cm180.costs(q180_params, q180_macs, c)[1] for c in q180_cfgs}) == 64  # no two share a memory size
# a toy front with a tie: (1, 3) twice, both kept; (3, 3) dominated by (2, 2). Maximising flips the sense
toy = np.array([[1, 3], [1, 3], [2, 2], [3, 3], [3, 1]])
assert Q.pareto_front(toy).tolist() == [0, 1, 2, 4] and Q.pareto_front(toy, False).tolist() == [3]
assert Q.pareto_front(toy, [True, False]).tolist() == [0, 1]  # min the first, max the second: (1, 3) wins both

# %%
# NBVAL_IGNORE_OUTPUT
res180 = Q.bit_width_search(cnn, q180_layers, Xte, yte, (2, 4, 8, 16), cm180)
obj180, cfg180, front180, mins180 = res180["objectives"], res180["configs"], res180["front"], res180["minimize"]
off180 = np.setdiff1d(np.arange(len(cfg180)), front180)
print(f"{'widths':13s} {'latency':>7s} {'memory':>7s} {'energy':>8s} {'acc %':>6s}   (Pareto front)")
for i in front180[np.argsort(obj180[front180, 1])]:
    lat, mem, en, acc = obj180[i]
    print(f"{str(cfg180[i].tolist()):13s} {lat:7.1f} {mem:7.0f} {en:8.1f} {100 * acc:6.1f}")
front2 = Q.pareto_front(obj180[:, [1, 3]], [True, False])
print(f"front: {len(front180)} of {len(cfg180)} configurations (memory + accuracy alone: {len(front2)})")
i8 = int(np.flatnonzero((cfg180 == 8).all(1))[0])
i2 = int(np.argmin(obj180[:, 1]))
dom8 = [cfg180[j].tolist() for j in front180 if Q.dominates(obj180[j], obj180[i8], mins180.tolist())]
print("all-8-bit", "on the front" if i8 in front180 else f"dominated by {dom8[:3]}")
# every front point is non-dominated; every other point is dominated by a front point
assert not any(Q.dominates(obj180[j], obj180[i], mins180.tolist()) for i in front180 for j in range(len(cfg180)))
assert all(any(Q.dominates(obj180[j], obj180[i], mins180.tolist()) for j in front180) for i in off180)
assert i2 in front180 and cfg180[i2].tolist() == [2, 2, 2]  # the unique cheapest-memory point is an extreme
assert obj180[front180, 3].max() == obj180[:, 3].max()  # the best accuracy is on the front
assert i8 in front180 or dom8  # all-8-bit is on the front or a front point beats it
# memories are all distinct (asserted above), so a memory/accuracy-optimal point cannot be 4-objective dominated
assert set(front2) <= set(front180) and len(front2) >= 2 and len(front180) < len(cfg180)
fig, ax = plt.subplots(figsize=(6, 3.4))
sc = ax.scatter(obj180[:, 1], 100 * obj180[:, 3], c=obj180[:, 2], cmap="viridis", s=18, label="configuration")
ax.scatter(obj180[front180, 1], 100 * obj180[front180, 3], s=80, facecolors="none", edgecolors="r", label="front")
ax.set(xlabel="weight memory (bits)", ylabel="test accuracy (%)", title="64 per-layer width configurations")
fig.colorbar(sc, label="energy (pJ, model)")
ax.legend(loc="lower right")
plt.show()

# %% [markdown]
# The front keeps the extremes (all 2-bit, the cheapest memory, is on it: asserted) and the configurations that buy
# accuracy where it is cheap: the sensitive conv1 is only 72 weights, and 4 bits on the compute-bound conv2 cost no
# more latency than 2. All-8-bit is on the front or beaten by a front point (asserted); in the run above 4-bit mixes
# beat it in all four objectives — at 4 bits the CNN's accuracy moves by a few test images either way, and here it
# moved up. The four-objective front always contains the memory/accuracy front (asserted; memories are distinct);
# it adds the points that a memory/accuracy-dominated configuration keeps by being faster or cheaper in energy.
# With this cost model latency and energy mostly rise with memory, so the two fronts had the same size in the run
# above (printed): extra objectives enlarge the front only where they disagree. Which points are on the front moves
# with a few test images, so the table is unchecked by nbval and only these properties are asserted.

# %% [markdown]
# ## 12. The seed's claims, corrected
#
# | seed claim | correct statement | where it is checked |
# |---|---|---|
# | E4M3 max is 2⁸·(1 + 7/8) = 448 | the number is right, the derivation is not: 2⁸·(1 + 7/8) = 480 is the code s.1111.111, which is NaN; the max is s.1111.110 = 1.75·2⁸ = **448** (240 would be an IEEE-style E4M3 with inf) | §4 asserts, tests/quant/test_quant_fp8.py |
# | 0x7F / 0xFF saturate to the max | 0x7F / 0xFF are the **only NaN codes**; saturation goes to 0x7E / 0xFE (±448), which is what torch's cast does | §4, bit-exact vs torch |
# | round the mantissa, keep the exponent | rounding **carries** into the exponent (1.9375 → 2.0 = 0x40); subnormals round on the fixed 2⁻⁹ grid | §4, all 2¹⁶ high halves vs torch |
# | fake-quant gradient is round()'s derivative (0) / no estimator | **STE**: gradient 1 inside [qmin, qmax], 0 where clipped; LSQ adds d/ds | §6 asserts equality with torch's backward |
# | KL threshold at bin centre / i+1 | threshold = **edges[i]**, the upper edge of the last kept bin; each bin is merged into exactly one level | observers.kl_threshold, tests |
# | scale = max/127, zero point free | torch: symmetric scale = amax / 127.5, affine zero point rounded and clamped into [qmin, qmax] so 0.0 is exact | §1 asserts equality with torch |
#
# Also measured: torch's *learnable* per-tensor fake-quant backward rounds negative zero points as int(z + 0.5),
# so its gradient mask disagrees with its own forward for z < 0; our LSQ uses round(z) in both.

# %% [markdown]
# ## Recap: interview answers
#
# - **[Q21] INT8.** `q = clamp(round(x/s) + z)`, `x̂ = (q − z)s`; affine `s = (M'−m')/255`, symmetric
#   `s = amax/127.5`, 0.0 exact (§1, bit-equal to torch). Rounding noise `s²/12` vs clipping (§2). The int8 layer is
#   an exact int32 GEMM then requantization by `s_x s_w / s_y` (§7, exact on every path). AVX2's `vpmaddubsw` saturates
#   u8×s8 pair sums (2·255·127 = 64770 > 32767), hence fbgemm's 7-bit activations; VNNI accumulates in int32 (§7b).
#   On real digit images 8-bit codes saturate in the bright strokes and 7-bit codes never do (§7c, asserted); the
#   exact AVX2 alternative widens to int16 (`vpmaddwd`) at the same multiply rate, so the choice costs bytes, not
#   exactness; tinylearn picks `vpmaddubsw` only when every code is ≤ 127.
#   Where the integer multiplier is the narrow pipe (one `vpmaddwd` per cycle next to two FMAs), no direct int8 kernel
#   beats fp32: measure the ceilings first (§7), then cut multiplies — Winograd's inner product
#   `(a0 + b1)(a1 + b0) − a0a1 − b0b1 = a0b0 + a1b1` halves them exactly (§7, `avx2_wino`, chosen by a probe).
#   Then fewer products: one level of Strassen does 7 block products instead of 8 — unstable in float, exact in
#   integers mod 2³² (§7, `avx2_strassen`).
#   Per-channel int8 PTQ stays within 0.5 pt of fp32 on digits (§8, asserted).
# - **[Q3] [Q51] [Q84] A faster GEMM by doing less.** Block for the caches and registers first, then cut work:
#   Winograd's inner product halves the multiplies, and Strassen's recursive 2×2 split does 7 block products of 8
#   ((7/8)^l at l levels, 18 block additions per level, asserted). Both are exact for integers (sums mod 2³²) and
#   unstable in float (the error grows with the levels, §7), which is why int8 GEMM can use them and sgemm does not.
#   Cache-oblivious GEMM halves the largest of M, K, N recursively with no cache size in the code: some depth's
#   blocks fill any cache at least half (asserted), where a fixed tile fits one level of one machine.
# - **[Q44] INT4.** Two nibbles per byte; group-wise scales (error falls with group size, §5); per-tensor int4 PTQ
#   loses accuracy and 2 epochs of LSQ QAT bring it within 3 pt of fp32 trained equally long (§8, asserted).
# - **[Q45] FP8.** E4M3 max 448 (only 0x7F/0xFF are NaN, no inf), E5M2 max 57344 with inf; torch saturates E4M3 and
#   overflows E5M2 to inf; delayed scaling `s = 448/max(amax history)` (§4, bit-exact vs torch on 2¹⁶ inputs).
# - **[Q65] Dynamic vs static.** Dynamic = per-call range, one extra pass, never clips; static = calibrated,
#   free, clips under drift: 100×+ error after a 4× drift, within 3× in distribution (§10, asserted). A dynamic
#   int8 Linear = weights prepacked once + per-call min/max → uint8 codes → exact int32 GEMM → dequantize + bias;
#   tinylearn's uses torch's qparams (asserted equal) in one fused C++ call (§7c).
# - **[Q66] Low-bit training.** Fake quant in the forward, STE gradient `1[qmin ≤ q ≤ qmax]` (equal to torch's),
#   LSQ learns `s` with `∂x̂/∂s = round(x/s) − x/s` inside the range (§6); compare QAT at equal epochs (§8).
# - **[Q74] [Q148] Below 8 bits.** MXFP4 (4.25 bits) has less than 2× the error of int4 g32 (5 bits) on bell-shaped
#   weights (§11, asserted); training with FP4/INT2 and Hutchinson `Tr(H)`-based bit allocation: notebook 11.
# - **[Q130] Bits per block.** Smallest width in (2, 4, 6, 8) meeting `ε` per 64-block: every block ≤ ε and fewer
#   bits per weight than int8 everywhere (§11, asserted).
# - **[Q156] Clip threshold.** Scan candidate thresholds t, minimise the histogram-weighted `E[(Q_t(x) − x)²]`
#   (`MSEObserver`); on heavy tails it clips far below max|x|, and on the model KL can lose to MinMax (§3, §8).
# - **[Q190] Error feedback.** `q_t = Q(g_t + e_{t−1})`, `e_t = g_t + e_{t−1} − q_t`: sub-step updates that plain
#   int4 rounds away entirely are summed to within 2 % (§11, asserted).
# - **[Q80] Run-time kernel choice.** Time every version once per shape (results checked equal), cache the
#   fastest, time each call, re-measure when the window exceeds 1.5× the chosen time: re-measured within 2× of the
#   best (usually the best), and a provoked slowdown switches the choice (§7c, asserted).
# - **[Q196] Learnable activation shift/scale.** Per channel $y = (x-\delta)/s$ before a per-tensor quantizer and
#   $\hat y s + \delta$ after it, $\delta$ and $\log s$ trained through the STE with the model; folded into the producer
#   ($W_p/s$, $(b_p-\delta)/s$) and the consumer ($W_c s$, $b_c + W_c\delta$), exact up to fp32 rounding; 50×+ lower
#   int4 error than plain per-tensor on a skewed activation (§9, asserted).
# - **[Q208] Error budget across segments.** Minimising bits at output error $\sum_i w_i m_i = \varepsilon$ gives
#   $w_i m_i = \varepsilon n_i/N$: error shares proportional to size, per-weight bounds $\propto n_i/w_i$; never more bits
#   than equal shares, within 2 % of exhaustive search on the CNN (§11, asserted).
# - **[Q180] Multi-objective bit widths.** Enumerate every per-layer width (4³ = 64 on the CNN), score latency and
#   energy with a stated cost model, memory exactly, accuracy by measurement, and keep the Pareto front with an O(n²)
#   dominance filter (ties kept together); every front point is non-dominated, every other one is dominated by a front
#   point, all-2-bit (least memory) is on it (§11, asserted).
# - **[Q238] Online re-calibration.** Monitor saturation rate and the MSE ratio to a per-batch fit; a Schmitt trigger
#   (on above 1 % / 4×, off below 0.1 % / 2×) with patience 2 and a cooldown refits once per drift, ignores an outlier
#   batch, and then tracks dynamic qparams within 1.5× while the stale ones are 100×+ worse (§10, asserted).
#
# %% [markdown]
# ## Exercises (`exercises/03_quantization/`)
#
# Implement in `stubs.py`, then `pytest exercises/03_quantization`:
# 1. `calculate_qparams` — torch's MinMaxObserver arithmetic (affine and symmetric).
# 2. `quantize` / `dequantize` — bit-exact with `torch.quantize_per_tensor` (mind the fused multiply-add).
# 3. `fake_quantize_backward` — the STE mask.
# 4. `kl_threshold` — TensorRT entropy calibration with correctly aligned bins.
# 5. `fp8_e4m3_encode` — bit-exact with `.to(torch.float8_e4m3fn)` (subnormals, carry, saturation, NaN).
# 6. `pack_int4` / `unpack_int4`.
# 7. `winograd_matmul` — `a @ b` through Winograd's inner product (§7), exact for int8 extremes and odd K.
# 8. `strassen_matmul` — `a @ b` by one level of Strassen's seven block products (§7), exact in int64.
