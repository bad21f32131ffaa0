# %% [markdown]
# # 02 · Convolution as GEMM: im2col, col2im, Winograd, BN folding, deformable conv
#
# **Interview questions this notebook answers** (seed 003; the section answering question n carries the tag `[Qn]`):
#
# - **[Q2]** How does a convolution work, and how do you write a custom conv operator for PyTorch? (§1, §3, §4)
# - **[Q22]** im2col: what role does it play, what does it cost in memory and time, how is it optimised? (§2, §3,
#   §5, §8)
# - **[Q32]** The core conv optimisations — Winograd, im2col, depthwise, GEMM efficiency, BN folding (§3, §6–§8)
# - **[Q103]** Reparameterisation for inference: fold adjacent linear layers, a scale/normalisation, Conv +
#   per-channel scale into one layer — what it saves and when it does not (§7b)
# - **[Q98]** Why is a naive NCHW 3×3 conv cache-unfriendly, and what does a row-block (tiled) version change? (§5)
# - **[Q144]** Deformable conv: bilinear-sampled im2col, and how dynamic offsets change tiling / cache reuse (§9)
#
# Along the way: the output-size formula; the backward pass (dX = col2im(Wᵀ·dY), dW = dY·colsᵀ); Winograd
# F(2×2, 3×3) multiplications and its fp16 accuracy; where a conv layer sits on the roofline, and what really
# costs against torch (the GEMM, not the im2col copy).
#
# Everything runs on `tinylearn.conv` (numpy arrays in and out, layouts of `torch.nn.functional.unfold/fold`),
# checked against torch as the oracle. Set `TINYLEARN_FULL=1` for full-size benchmarks. Timings in this notebook
# were taken on a shared, loaded machine; they are printed, never asserted as "A faster than B".

# %%
import tinylearn as tl  # first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from tinylearn.conv import winograd

FULL = os.environ.get("TINYLEARN_FULL") == "1"
rng = np.random.default_rng(0)
torch.manual_seed(0)
np.set_printoptions(precision=3, suppress=True, linewidth=120)
print("backends:", tl.conv.BACKENDS, "| C++ kernels built:", tl.conv.cpp_available())

# %% [markdown]
# ## 1. Direct convolution: the seven loops [Q2]
#
# `y[n, o, p, q] = b[o] + Σ_c Σ_i Σ_j w[o, c, i, j] · xpad[n, c, p·s + i·d, q·s + j·d]`, with
# `OH = floor((H + 2p − d(k−1) − 1)/s) + 1`. Below, the loops written out (tiny sizes only!) against torch.


# %%
def direct_conv(x, w, b, s=1, p=0):
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    OH, OW = tl.conv.conv_out_size(H, kh, s, p, 1), tl.conv.conv_out_size(W, kw, s, p, 1)
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    y = np.zeros((N, O, OH, OW), x.dtype)
    for n in range(N):
        for o in range(O):
            for oh in range(OH):
                for ow in range(OW):
                    acc = b[o]
                    for c in range(C):
                        for i in range(kh):
                            for j in range(kw):
                                acc += w[o, c, i, j] * xp[n, c, oh * s + i, ow * s + j]
                    y[n, o, oh, ow] = acc
    return y


x = rng.standard_normal((1, 2, 5, 5))
w = rng.standard_normal((3, 2, 3, 3))
b = rng.standard_normal(3)
y_loops = direct_conv(x, w, b, s=2, p=1)
y_torch = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=2, padding=1).numpy()
assert np.allclose(y_loops, y_torch, atol=1e-12)
print("output shape", y_loops.shape, "| formula: OH =", tl.conv.conv_out_size(5, 3, 2, 1, 1))

# %% [markdown]
# ## 2. im2col: every receptive field becomes a column [Q22]
#
# `cols[n, (c·kh + i)·kw + j, oh·OW + ow] = xpad[n, c, oh·s + i·d, ow·s + j·d]` — rows are (channel, kernel
# offset), columns are output pixels. A 1-channel 4×4 image with a 3×3 kernel, stride 1, padding 0 gives 2×2
# outputs, so a 9×4 column matrix: each column is one 3×3 window, flattened.

# %%
img = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
cols = tl.conv.im2col(img, 3)
assert np.array_equal(cols, F.unfold(torch.from_numpy(img), 3).numpy())
print(cols[0].astype(int))

fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), gridspec_kw={"width_ratios": [1, 1.1]})
axes[0].imshow(img[0, 0], cmap="viridis")
for (r, c), v in np.ndenumerate(img[0, 0]):
    axes[0].text(c, r, int(v), ha="center", va="center", color="w")
axes[0].add_patch(plt.Rectangle((-0.45, -0.45), 2.9, 2.9, fill=False, ec="red", lw=2))
axes[0].set_title("input 4×4 (window of output 0 in red)")
axes[1].imshow(cols[0], cmap="viridis", aspect="auto")
for (r, c), v in np.ndenumerate(cols[0]):
    axes[1].text(c, r, int(v), ha="center", va="center", color="w", fontsize=8)
axes[1].add_patch(plt.Rectangle((-0.45, -0.5), 0.9, 9, fill=False, ec="red", lw=2))
axes[1].set_xlabel("output pixel l = oh·OW + ow")
axes[1].set_ylabel("row (c, i, j)")
axes[1].set_title("im2col: 9 × 4 column matrix")
for a in axes:
    a.set_xticks([])
    a.set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# The three backends (numpy stride tricks, numba `prange`, C++ with threads over channels) produce
# **bit-identical** columns, and match `F.unfold` exactly — it is a pure copy. A grid of kernel / stride / padding /
# dilation, including non-square ones (the C++ versions ladder, v0 → v1, is in §8):

# %%
x = rng.standard_normal((2, 3, 11, 9)).astype(np.float32)
grid = [(3, 1, 1, 1), ((2, 3), (2, 1), (1, 0), (1, 2)), (5, 3, 2, 1), (1, 1, 0, 1)]
avail = ["numpy", "numba", "cpp"] if tl.conv.cpp_available() else ["numpy", "numba"]
for k, s, p, d in grid:
    ref = F.unfold(torch.from_numpy(x), k, d, p, s).numpy()
    for be in avail:
        assert np.array_equal(tl.conv.im2col(x, k, s, p, d, backend=be), ref)
    print(f"k={k!s:7} s={s!s:7} p={p!s:7} d={d!s:7} -> cols {ref.shape}: bit-exact for {avail}")

# %% [markdown]
# ## 3. Convolution = one GEMM (and depthwise = groups) [Q2] [Q22] [Q32]
#
# With `K = C·kh·kw` and `L = OH·OW`: `Y[OC, L] = W.reshape(OC, K) @ cols[K, L]`. tinylearn lays the whole batch
# side by side (`cols` is `[K, N·L]`), so one BLAS call does the layer. Groups split the channels: group g uses
# rows `g·K/G … (g+1)·K/G` of the columns and its own `OC/G` filters; depthwise is `groups = C`.

# %%
x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
for groups, oc in [(1, 6), (2, 6), (4, 8)]:
    w = (rng.standard_normal((oc, 4 // groups, 3, 3)) / 3).astype(np.float32)
    ours = tl.conv.conv2d(x, w, None, stride=1, padding=1, groups=groups)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1, groups=groups)
    tl.testing.assert_close(ours, ref)
    print(f"groups={groups}: Y {ours.shape} matches torch (fp32 tolerance)")

# %% [markdown]
# ## 4. Backward through col2im [Q2]
#
# `Y = W·cols` is a matrix product, so `dW = dY·colsᵀ` and `dcols = Wᵀ·dY`. im2col is a linear map
# `x ↦ cols`; its adjoint (transpose) is **col2im**, which adds every column entry back onto the pixel it was
# copied from — overlapping windows accumulate. Hence `dX = col2im(Wᵀ·dY)` and `db = Σ dY`.
# First the adjoint identity ⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩, then the gradients against torch autograd.

# %%
x64 = rng.standard_normal((2, 3, 7, 6))
c64 = rng.standard_normal(tl.conv.im2col(x64, 3, 2, 1).shape)
lhs = np.vdot(tl.conv.im2col(x64, 3, 2, 1), c64)
rhs = np.vdot(x64, tl.conv.col2im(c64, (7, 6), 3, 2, 1))
assert np.isclose(lhs, rhs, rtol=1e-12)
print(f"<im2col(x), c> = {lhs:.6f}   <x, col2im(c)> = {rhs:.6f}")

w64 = rng.standard_normal((4, 3, 3, 3))
b64 = rng.standard_normal(4)
y, cols = tl.conv.conv2d_forward(x64, w64, b64, 2, 1)
gy = rng.standard_normal(y.shape)
dx, dw, db = tl.conv.conv2d_backward(gy, x64, w64, 2, 1, cols=cols)
tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x64, w64, b64))
F.conv2d(tx, tw, tb, 2, 1).backward(torch.from_numpy(gy))
for name, ours, ref in [("dX", dx, tx.grad), ("dW", dw, tw.grad), ("db", db, tb.grad)]:
    tl.testing.assert_close(ours, ref, "float64")
    print(f"{name} {ours.shape} matches torch autograd (fp64)")

# %% [markdown]
# The same kernels back `tl.nn.functional.conv2d` / `tl.nn.Conv2d` through the autograd `Function` API, so a
# fp64 central-difference gradcheck runs through im2col → GEMM → col2im. Pooling uses the same windowing:
# max-pool routes each gradient to its window's argmax via col2im, avg-pool spreads `dY / divisor`.

# %%
xt = tl.Tensor(rng.standard_normal((1, 2, 6, 6)), requires_grad=True, dtype="float64")
wt = tl.Tensor(rng.standard_normal((2, 1, 3, 3)), requires_grad=True, dtype="float64")
assert tl.autograd.gradcheck(lambda a, ww: tl.nn.functional.conv2d(a, ww, None, 1, 1, 1, 2), [xt, wt])
assert tl.autograd.gradcheck(lambda a: tl.nn.functional.max_pool2d(a, 3, 2, 1), [xt])
assert tl.autograd.gradcheck(lambda a: tl.nn.functional.avg_pool2d(a, 3, 2, 1, count_include_pad=False), [xt])
print("gradcheck passed: depthwise conv2d, max_pool2d, avg_pool2d(count_include_pad=False)")

# %% [markdown]
# ### A custom PyTorch conv operator
#
# The same two formulas make a `torch.autograd.Function`: forward is
# `F.unfold` + one batched matmul, backward is `dW = Σₙ dYₙ·colsₙᵀ`, `dX = F.fold(Wᵀ·dY)` (fold is unfold's
# adjoint), `db = Σ dY`. `torch.autograd.gradcheck` (fp64 central differences) checks the hand-written backward.


# %%
class Im2colConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, stride, padding):
        N, _, H, W = x.shape
        OC, _, kh, kw = w.shape
        cols = F.unfold(x, (kh, kw), padding=padding, stride=stride)  # [N, C*kh*kw, L]
        y = w.reshape(OC, -1) @ cols + b[:, None]  # [N, OC, L]
        ctx.save_for_backward(x, w, cols)
        ctx.conf = (stride, padding)
        OH, OW = (H + 2 * padding - kh) // stride + 1, (W + 2 * padding - kw) // stride + 1
        return y.reshape(N, OC, OH, OW)

    @staticmethod
    def backward(ctx, gy):
        x, w, cols = ctx.saved_tensors
        stride, padding = ctx.conf
        g = gy.reshape(gy.shape[0], gy.shape[1], -1)  # [N, OC, L]
        dw = (g @ cols.transpose(1, 2)).sum(0).reshape(w.shape)
        dx = F.fold(w.reshape(w.shape[0], -1).T @ g, x.shape[2:], w.shape[2:], padding=padding, stride=stride)
        return dx, dw, g.sum((0, 2)), None, None


tx = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
tw = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
tb = torch.randn(4, dtype=torch.float64, requires_grad=True)
assert torch.allclose(Im2colConv2d.apply(tx, tw, tb, 2, 1), F.conv2d(tx, tw, tb, 2, 1), atol=1e-12)
assert torch.autograd.gradcheck(lambda a, ww, bb: Im2colConv2d.apply(a, ww, bb, 2, 1), (tx, tw, tb))
print("Im2colConv2d: forward == F.conv2d, hand-written backward passes torch.autograd.gradcheck (fp64)")

# %% [markdown]
# ## 5. The memory lesson: im2col's workspace is kh·kw × the input; row-block tiling [Q22] [Q98]
#
# Every input pixel is copied once per kernel offset that reads it: the column matrix is about `kh·kw / s²` times
# the input. For ResNet layers at batch 8 (fp32):

# %%
layers = [
    ("3x3 64@56", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("3x3 128@28", (8, 128, 28, 28), (128, 128, 3, 3), 1, 1),
    ("3x3 256@14", (8, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    ("7x7/2 3@224", (8, 3, 224, 224), (64, 3, 7, 7), 2, 3),
]
print(f"{'layer':12} {'input MB':>9} {'cols MB':>8} {'ratio':>6}")
for name, xs, ws, s, p in layers:
    inp = np.prod(xs) * 4 / 2**20
    colsmb = tl.conv.im2col_workspace_bytes(xs, ws, s, p) / 2**20
    print(f"{name:12} {inp:9.1f} {colsmb:8.1f} {colsmb / inp:6.2f}")

# %% [markdown]
# ### Why the naive NCHW loop is cache-unfriendly, and the row-block fix [Q98]
#
# In §1's loop nest the innermost
# reduction walks `c, i, j`: consecutive `c` are `H·W·4` bytes apart (12.5 KB at 56²), so every tap of every output
# touches a different cache line, and each input pixel is re-fetched for each of the `kh·kw` windows and each of
# the `OC` filters — by the time a row is needed again it has been evicted. Blocking fixes reuse: keep a band of
# input rows (the `kh` rows an output row needs) hot and use it for all filters at once. `conv2d_tiled` does exactly
# that on top of im2col: it lowers and multiplies **R output rows at a time**, so the workspace is `N·K·R·OW`
# elements instead of `N·K·OH·OW` (R = OH is plain im2col) — at the price of more, smaller GEMMs. Same result,
# different time/memory point (torch and tinygrad expose no such knob — oneDNN and tinygrad's codegen tile
# internally — so this sweep is tinylearn only):

# %%
# NBVAL_IGNORE_OUTPUT
xs = rng.standard_normal((2 if not FULL else 8, 64, 56, 56)).astype(np.float32)
ws = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
full_y = tl.conv.conv2d(xs, ws, None, 1, 1)
rows_list = [1, 2, 4, 8, 14, 28, 56] if FULL else [1, 4, 14, 56]
tile_ms, tile_mb = [], []
for r in tqdm(rows_list, desc="rows per tile", leave=False):
    yt = tl.conv.conv2d_tiled(xs, ws, None, 1, 1, rows_per_tile=r)
    assert np.allclose(yt, full_y, atol=1e-4)
    tile_ms.append(
        tl.bench.measure(
            lambda r=r: tl.conv.conv2d_tiled(xs, ws, None, 1, 1, rows_per_tile=r), warmup=1, repeat=3
        ).median
        * 1e3
    )
    tile_mb.append(tl.conv.im2col_workspace_bytes(xs.shape, ws.shape, 1, 1, rows=r) / 2**20)
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(tile_mb, tile_ms, "o-")
for r, mb, ms in zip(rows_list, tile_mb, tile_ms):
    ax.annotate(f"R={r}", (mb, ms), fontsize=8, xytext=(3, 3), textcoords="offset points")
ax.set_xscale("log")
ax.set_xlabel("column workspace (MB, log)")
ax.set_ylabel("conv time (ms)")
ax.set_title(f"tiled im2col, 64->64 3x3 @56², batch {xs.shape[0]}")
plt.tight_layout()
plt.show()
print("ms per rows-per-tile R:", {r: round(t, 1) for r, t in zip(rows_list, tile_ms)})
assert abs(tile_mb[-1] / tile_mb[0] - 56) < 1e-9  # workspace is linear in R: R=56 (untiled) needs 56x R=1
print(
    f"Reading: R=1 needs {tile_mb[-1] / tile_mb[0]:.0f}x less workspace ({tile_mb[0]:.2f} vs {tile_mb[-1]:.1f} MB) "
    f"and takes {tile_ms[0] / tile_ms[-1]:.2f}x the time of untiled im2col (56 small GEMMs instead of one; loaded)."
)

# %% [markdown]
# ## 6. Winograd F(2×2, 3×3) [Q32]
#
# `Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A` on 4×4 input tiles. Per 2×2 output tile (and per input/output channel pair)
# direct convolution multiplies **2·2 outputs × 3·3 taps = 36** times; Winograd does the **4·4 = 16** products of
# the elementwise ⊙ — 2.25× fewer. The transforms are additions (plus the ½ of G, applied once per filter), and
# they amortise: `Bᵀ d B` is shared by every output channel, `G g Gᵀ` by every tile. Lavin & Gray's matrices:

# %%
print("B^T =\n", winograd.BT, "\nG =\n", winograd.G, "\nA^T =\n", winograd.AT)
print(
    "multiplies per 2x2 output tile:",
    tl.conv.MULS_DIRECT_PER_TILE,
    "->",
    tl.conv.MULS_WINOGRAD_PER_TILE,
    f"({tl.conv.MULS_DIRECT_PER_TILE / tl.conv.MULS_WINOGRAD_PER_TILE:.2f}x fewer)",
)
x = rng.standard_normal((2, 16, 14, 14)).astype(np.float32)
w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
tl.testing.assert_close(
    tl.conv.winograd_conv2d(x, w, padding=1),
    F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1),
    reduction_size=2000,
)
print("winograd_conv2d matches torch within fp32 tolerance")

# %% [markdown]
# **Error study.** Reference: the same conv in fp64. Compare im2col + GEMM and Winograd, both computed entirely in
# fp32 and in fp16. Two effects pull in opposite directions: Winograd's GEMMs reduce over C instead of 9·C (shorter
# sums, less accumulated rounding), but its transforms round the *transformed* tiles — which mix magnitudes and
# cancel (`d0 − d2` in Bᵀ d B, the ½ in G) — before the products, and the output transform adds those rounded
# products again. In fp32 both errors sit at the ~1e-7 level; in fp16 (10-bit mantissa) the transform rounding
# dominates and Winograd is about 2× worse than im2col + GEMM (1.3–4× on every C, asserted) — which is why
# low-precision Winograd needs care.

# %%
# NBVAL_IGNORE_OUTPUT
errs = {}
for C in [4, 16, 64]:
    x = rng.standard_normal((2, C, 16, 16))
    w = rng.standard_normal((16, C, 3, 3)) / np.sqrt(9 * C)
    ref = tl.conv.conv2d(x, w, None, 1, 1)
    scale = np.abs(ref).max()
    for dt in ["float32", "float16"]:
        xd, wd = x.astype(dt), w.astype(dt)
        direct = tl.conv.conv2d(xd, wd, None, 1, 1, backend="numpy").astype(np.float64)
        wino = tl.conv.winograd_conv2d(xd, wd, padding=1).astype(np.float64)
        errs[(C, dt)] = (np.abs(direct - ref).max() / scale, np.abs(wino - ref).max() / scale)
        print(f"C={C:3d} {dt}: max rel error im2col+GEMM {errs[(C, dt)][0]:.2e}   winograd {errs[(C, dt)][1]:.2e}")
assert all(1.3 < errs[(C, "float16")][1] / errs[(C, "float16")][0] < 4 for C in [4, 16, 64])  # fp16: ~2x worse
assert all(max(errs[(C, "float32")]) < 1e-5 for C in [4, 16, 64])  # fp32: both at rounding level
fig, ax = plt.subplots(figsize=(5.5, 3.2))
for dt, mk in [("float32", "o"), ("float16", "s")]:
    ax.semilogy([4, 16, 64], [errs[(C, dt)][0] for C in [4, 16, 64]], mk + "-", label=f"im2col+GEMM {dt}")
    ax.semilogy([4, 16, 64], [errs[(C, dt)][1] for C in [4, 16, 64]], mk + "--", label=f"winograd {dt}")
ax.set_xlabel("input channels (reduction length / 9)")
ax.set_ylabel("max |err| / max |y|")
ax.legend(fontsize=8)
ax.set_title("Winograd F(2x2,3x3) vs im2col+GEMM, error vs fp64")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. Folding BatchNorm into the convolution [Q32]
#
# In eval mode `BN(conv(x)) = γ·(Wx + b − μ)/√(σ² + ε) + β`. With `s = γ/√(σ² + ε)` per output channel this is
# one conv with `W' = s·W` and `b' = s·(b − μ) + β` — BN disappears from the inference graph.

# %%
conv = torch.nn.Conv2d(8, 16, 3, padding=1)
bn = torch.nn.BatchNorm2d(16)
with torch.no_grad():
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.uniform_(0.5, 1.5)
    bn.bias.uniform_(-1, 1)
bn.eval()
xb = torch.randn(2, 8, 10, 10)
with torch.no_grad():
    expected = bn(conv(xb))
wf, bf = tl.conv.fold_batchnorm(
    conv.weight.detach().numpy(),
    conv.bias.detach().numpy(),
    bn.running_mean.numpy(),
    bn.running_var.numpy(),
    bn.weight.detach().numpy(),
    bn.bias.detach().numpy(),
    bn.eps,
)
folded = tl.conv.conv2d(xb.numpy(), wf, bf, 1, 1)
tl.testing.assert_close(folded, expected)
print(
    "folded conv == conv then BN (fp32 tolerance); max abs diff < 1e-5:",
    bool(np.abs(folded - expected.numpy()).max() < 1e-5),
)

# %% [markdown]
# ### 7b. Reparameterisation for inference: linear chains, scales, Conv + channel scale [Q103]
#
# **The answer.** Any chain of *affine* ops with no nonlinearity between them is one affine op, so at inference
# time it can be folded into the weights once, offline:
#
# - **Adjacent linear layers** `W2(W1x + b1) + b2 = (W2W1)x + (W2b1 + b2)` — one GEMM instead of two, no
#   intermediate tensor to write and re-read. It saves FLOPs and parameters only when the hidden width `h`
#   satisfies `h·(d_in + d_out) > d_in·d_out`; a low-rank bottleneck (`d → r → d`, LoRA-style) gets *bigger* when
#   folded, so there you keep the factors (or fold only the LoRA delta into a full-rank `W`).
# - **A scale/normalisation after a layer** (eval BatchNorm, a learned per-channel scale such as LayerScale):
#   `s·(Wx + b) + t` → `W' = s·W`, `b' = s·b + t`, per output channel, for conv and linear alike.
# - **A normalisation's affine before a linear** (LayerNorm/RMSNorm γ, β): `W(γ⊙x̂ + β) + b` →
#   `W' = W·diag(γ)`, `b' = Wβ + b`; the normalisation itself (x̂) stays, only its affine part is folded. Not valid
#   before a zero-padded conv (the shift would move the padding too).
#
# Benefits: fewer kernels and launches, no memory traffic for the intermediate activations (each removed
# element-wise op reads and writes the whole activation), fewer parameters, and a graph a fusing backend sees as a
# single GEMM/conv. Costs: the folded layer differs from the original by rounding only (asserted below at fp32
# tolerance against torch), but folding a wide-ranging per-channel scale into the weights widens their range —
# quantise *after* folding, per channel. Training-time structure (BN statistics, branches) is kept; only the
# deployed graph is folded. `tl.conv.fold_linear_chain`, `fold_channel_scale` (which reuses `fold_batchnorm` with
# mean 0, var 1, eps 0) and `fold_input_affine` implement the three folds; `linear_chain_cost` counts the saving.

# %%
torch_state = torch.random.get_rng_state()  # restored at the end: later sections keep their random draws
torch.manual_seed(1)
mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 32)).eval()
xl = torch.randn(128, 64)
with torch.no_grad():
    expected = mlp(xl)
Wc, bc = tl.conv.fold_linear_chain([m.weight.detach().numpy() for m in mlp], [m.bias.detach().numpy() for m in mlp])
tl.testing.assert_close(xl.numpy() @ Wc.T + bc, expected)
cost = tl.conv.linear_chain_cost([(256, 64), (32, 256)], tokens=128)
print("Linear(64->256) -> Linear(256->32), 128 tokens:", cost)
assert cost["params_folded"] * 10 < cost["params_chain"] and cost["flops_folded"] * 10 < cost["flops_chain"]
print(
    f"folded: {cost['params_chain'] / cost['params_folded']:.1f}x fewer parameters, "
    f"{cost['flops_chain'] / cost['flops_folded']:.1f}x fewer FLOPs, and no [128, 256] intermediate"
)
bottleneck = tl.conv.linear_chain_cost([(16, 256), (256, 16)])
print("bottleneck Linear(256->16) -> Linear(16->256):", bottleneck)
assert bottleneck["params_folded"] > 7 * bottleneck["params_chain"]  # folding a low-rank pair makes it ~7.8x bigger

# Conv -> eval BatchNorm -> per-channel scale (LayerScale) -> one conv
conv = torch.nn.Conv2d(8, 16, 3, padding=1)
bn = torch.nn.BatchNorm2d(16).eval()
with torch.no_grad():
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.uniform_(0.5, 1.5)
    bn.bias.uniform_(-1, 1)
gamma = torch.rand(16) * 0.2 + 0.05
xc = torch.randn(2, 8, 16, 16)
with torch.no_grad():
    expected = bn(conv(xc)) * gamma[None, :, None, None]
w1, b1 = tl.conv.fold_batchnorm(
    conv.weight.detach().numpy(),
    conv.bias.detach().numpy(),
    bn.running_mean.numpy(),
    bn.running_var.numpy(),
    bn.weight.detach().numpy(),
    bn.bias.detach().numpy(),
    bn.eps,
)
w2, b2 = tl.conv.fold_channel_scale(w1, b1, gamma.numpy())
folded = tl.conv.conv2d(xc.numpy(), w2, b2, 1, 1)
tl.testing.assert_close(folded, expected)
n_out = folded.size  # N * OC * OH * OW
flops_conv = tl.conv.conv2d_flops(xc.shape, w2.shape, 1, 1)
flops_affine = 2 * n_out + 1 * n_out  # BN: one multiply + one add per element; the scale: one multiply
traffic_removed = 2 * 2 * n_out * 4  # two element-wise passes, each reads and writes the fp32 activation
print(
    f"Conv+BN+scale -> one conv: FLOPs {flops_conv + flops_affine:,} -> {flops_conv:,}, parameters removed "
    f"{4 * 16 + 16} (BN mean/var/gamma/beta + scale), activation traffic removed {traffic_removed:,} B, kernels 3 -> 1"
)
assert flops_affine == 3 * 2 * 16 * 16 * 16 and traffic_removed == 2 * 2 * n_out * 4

# LayerNorm's gamma/beta folded into the next Linear: the normalisation stays, its affine disappears
ln = torch.nn.LayerNorm(64)
with torch.no_grad():
    ln.weight.uniform_(0.5, 1.5)
    ln.bias.uniform_(-1, 1)
proj = torch.nn.Linear(64, 32)
with torch.no_grad():
    expected = proj(ln(xl))
    xhat = F.layer_norm(xl, (64,))
wi, bi = tl.conv.fold_input_affine(
    proj.weight.detach().numpy(), proj.bias.detach().numpy(), ln.weight.detach().numpy(), ln.bias.detach().numpy()
)
tl.testing.assert_close(xhat.numpy() @ wi.T + bi, expected)
print("all three folds match the unfolded torch computation at fp32 tolerance")
torch.random.set_rng_state(torch_state)

# %% [markdown]
# ## 8. Speed vs torch and tinygrad: what really costs, and the roofline [Q22] [Q32]
#
# The forward of five ResNet layers in tinylearn, torch (oneDNN's direct/implicit-GEMM kernels) and tinygrad
# (TinyJit on its CPU device, clang-compiled). tinylearn appears as two rungs of its C++ forward ladder:
# **v1** = C++ im2col + one OpenBLAS GEMM over the whole batch via `np.matmul`, then a row-copy transpose to NCHW
# with the bias fused (the 1×1 layer: a batched matmul on x itself, no im2col), and the default **v3** = the
# direct convolution where it applies (the 3×3 layers, and the stem on a planar input), else **v2** = the implicit
# GEMM (both described after the ladder below). Then the v1 forward taken apart: the im2col copy, the GEMM alone,
# and the GEMM's GFLOP/s against the machine's measured SGEMM peak. (`python -m tinylearn bench conv` adds
# forward+backward, the im2col GB/s against STREAM copy and the small-CNN training step.)

# %%
# NBVAL_IGNORE_OUTPUT
import time  # noqa: E402

from tinylearn.bench import measure  # noqa: E402
from tinylearn.conv._params import window_params  # noqa: E402
from tinylearn.conv.bench import LAYERS, _tg_fwd, layer_arrays  # noqa: E402
from tinylearn.conv.conv2d import conv_cols  # noqa: E402

batch = 8 if FULL else 2
bench_be = "cpp" if tl.conv.cpp_available() else "numpy"
v1 = "v1" if bench_be == "cpp" else None  # the im2col + OpenBLAS rung (numpy: its only path)
ours = f"tinylearn ({bench_be} v1)"
ours2 = "tinylearn (cpp v3)"
cmp = tl.bench.Comparison(f"conv2d forward, fp32, batch {batch}", repeat=3 if not FULL else 10)
points, parts = [], {}
sq = rng.standard_normal((768, 768), dtype=np.float32)
for name, C, OC, H, k, s, p in tqdm(LAYERS, desc="conv layers", leave=False):
    x, w, b = layer_arrays(C, OC, H, k, batch)
    flops = tl.conv.conv2d_flops(x.shape, w.shape, s, p)
    y = tl.conv.conv2d(x, w, b, s, p)
    with cmp.case(name, flops=flops) as c:
        r = c.add(ours, lambda x=x, w=w, b=b, s=s, p=p: tl.conv.conv2d(x, w, b, s, p, backend=bench_be, version=v1))
        if bench_be == "cpp":
            r2 = c.add(ours2, lambda x=x, w=w, b=b, s=s, p=p: tl.conv.conv2d(x, w, b, s, p, backend="cpp"))
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
        rt = c.add("torch", lambda tx=tx, tw=tw, tb=tb, s=s, p=p: F.conv2d(tx, tw, tb, s, p))
        c.add_tinygrad("tinygrad", lambda tg, x=x, w=w, b=b, s=s, p=p: _tg_fwd(tg, x, w, b, s, p))
    kk, s2, p2, d2, out = window_params(x.shape, w.shape[2:], s, p, 1, "x")
    cols = conv_cols(x, kk, s2, p2, d2, out, bench_be)  # [C*kh*kw, N*OH*OW]
    w2 = w.reshape(OC, -1)
    # same sums in another GEMM shape: equal up to fp32 summation order (DESIGN.md tolerance, wide for K > 1000)
    ref = (w2 @ cols).reshape(OC, batch, -1).transpose(1, 0, 2) + b[:, None]
    tl.testing.assert_close(y.reshape(batch, OC, -1), ref, reduction_size=w2.shape[1])
    # the breakdown uses the best of 5 runs (the least load-disturbed statistic on a shared machine)
    t_cols = measure(
        lambda kk=kk, s2=s2, p2=p2, d2=d2, out=out, x=x: conv_cols(x, kk, s2, p2, d2, out, bench_be), warmup=1, repeat=5
    ).min
    # the GEMM alone, timed alternately with a square 768^3 SGEMM so both see the same load (best of 5 each)
    w2 @ cols, sq @ sq  # warm-up
    t_g, t_sq = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        w2 @ cols
        t_g.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sq @ sq
        t_sq.append(time.perf_counter() - t0)
    t_gemm = min(t_g)
    t_total = measure(
        lambda x=x, w=w, b=b, s=s, p=p: tl.conv.conv2d(x, w, b, s, p, backend=bench_be, version=v1), warmup=1, repeat=5
    ).min
    parts[name] = {
        "total": t_total,
        "cols": t_cols,
        "gemm": t_gemm,
        "gemm_gflops": flops / t_gemm / 1e9,
        "shape": (OC, w2.shape[1], cols.shape[1]),
        "cols_mb": cols.nbytes / 1e6,
        "sq_gflops": 2 * 768**3 / min(t_sq) / 1e9,
    }
    # minimum DRAM traffic: read x and w, write y once (fp32)
    intensity = flops / (4 * (x.size + w.size + y.size))
    points += [(f"{name} ({bench_be} v1)", intensity, r.gflops), (f"{name} (torch)", intensity, rt.gflops)]
    if bench_be == "cpp":
        points.append((f"{name} (cpp v3)", intensity, r2.gflops))
table = cmp.table
print(table)
rows = {(row.case, row.impl): row for row in table.rows}
tg_ok = all(rows[(n[0], "tinygrad")].median_ms is not None for n in LAYERS)
ratio = {n[0]: rows[(n[0], ours)].median_ms / rows[(n[0], "torch")].median_ms for n in LAYERS}
ratio2 = {
    n[0]: rows[(n[0], ours2)].median_ms / rows[(n[0], "torch")].median_ms for n in LAYERS if (n[0], ours2) in rows
}
print(
    f"Reading: tinylearn v1 takes {min(ratio.values()):.2f}x-{max(ratio.values()):.2f}x torch's time per layer"
    + (f", v3 (the default) {min(ratio2.values()):.2f}x-{max(ratio2.values()):.2f}x" if ratio2 else "")
    + " (<1 = tinylearn faster)"
    + (
        "; tinygrad takes "
        + ", ".join(f"{rows[(n[0], 'tinygrad')].median_ms / rows[(n[0], 'torch')].median_ms:.2f}x" for n in LAYERS)
        + " torch's time (loaded machine)."
        if tg_ok
        else f"; tinygrad: {rows[(LAYERS[0][0], 'tinygrad')].note}."
    )
)
assert all(rows[(n[0], ours)].median_ms > 0 and rows[(n[0], "torch")].median_ms > 0 for n in LAYERS)

# %% [markdown]
# **What really costs.** If im2col were the reason torch leads, the copy would dominate tinylearn's time. Taken
# apart, tinylearn's v1 forward is three parts: the column copy, the GEMM, and the rest — the transpose of `[OC, N·L]`
# back to NCHW with the bias (C++ row copies), and first-touch page faults of the 3.6–14.5 MB buffers (asserted,
# batch 2) that are freshly allocated on every call. (For the 1×1 layer the table's "im2col" column is the transpose
# the old path needed; the forward itself skips it.) On the deeper 3×3 layers (C ≥ 128) the GEMM does 2·OC = 256–512
# FLOPs per copied element (asserted from the shapes) and the copy none, so the copy *should* cost less than the
# GEMM; the cell prints the measured ratio but does not assert it: the copy writes a freshly allocated buffer, so
# its time includes page faults and thread wake-ups, and on some machines it measured slower than the GEMM. The
# GEMMs are skinny (M = OC = 64…256 rows against N = batch·OH·OW = 392…6272 columns); their rate relative to a
# square 768³ SGEMM timed alternately with them is printed — close to it on a quiet machine, erratic under load.
# What oneDNN saves is the *data movement around* the GEMM: it never materialises the columns (implicit GEMM over a
# blocked `nChw16c` layout that keeps the kernel's input band in cache), writes its output in place in the final
# layout, and reuses its buffers. A faster GEMM-based conv therefore starts with no column matrix and an output
# written directly in NCHW — not with a faster copy. That is the v2 rung (after the ladder below).

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.bench import roofline  # noqa: E402

peak = roofline.peak_gflops(n=1024, repeat=3).gflops
print(f"square SGEMM peak (1024^3, this BLAS, loaded): {peak:.0f} GFLOP/s")
print("tinylearn v1 forward taken apart (best of 5 runs each; square = 768^3 SGEMM timed alternately with the GEMM):")
print(
    f"{'layer':18} {'GEMM M x K x N':>18} {'im2col %':>9} {'GEMM %':>7} {'rest %':>7} "
    f"{'GEMM GFLOP/s':>13} {'vs square':>10}"
)
for name, d in parts.items():
    M_, K_, N_ = d["shape"]
    rest = max(0.0, 1 - (d["cols"] + d["gemm"]) / d["total"])
    print(
        f"{name:18} {f'{M_}x{K_}x{N_}':>18} {100 * d['cols'] / d['total']:8.0f}% {100 * d['gemm'] / d['total']:6.0f}% "
        f"{100 * rest:6.0f}% {d['gemm_gflops']:13.1f} {100 * d['gemm_gflops'] / d['sq_gflops']:9.0f}%"
    )
deep = [n[0] for n in LAYERS if n[4] == 3 and n[1] >= 128]
print(
    f"Reading: on the C >= 128 3x3 layers im2col takes {min(parts[n]['cols'] / parts[n]['gemm'] for n in deep):.2f}-"
    f"{max(parts[n]['cols'] / parts[n]['gemm'] for n in deep):.2f}x the GEMM's time; the GEMMs run at "
    f"{min(d['gemm_gflops'] / d['sq_gflops'] for d in parts.values()):.0%}-"
    f"{max(d['gemm_gflops'] / d['sq_gflops'] for d in parts.values()):.0%} of the alternately timed square SGEMM "
    f"(square-SGEMM peak from roofline.peak_gflops: {peak:.0f} GFLOP/s; shares of best-of-5 times do not add up "
    "exactly; loaded machine)."
)
# the arithmetic behind "the copy should cost less than the GEMM" (the timing itself varies by machine and load):
# on the C >= 128 3x3 layers the GEMM does 2*OC = 256-512 flops per copied element
assert all(256 <= 2 * parts[n]["shape"][0] <= 512 for n in deep), {n: parts[n]["shape"] for n in deep}
assert FULL or all(3.5 < d["cols_mb"] < 14.5 for n, d in parts.items() if n.startswith("3x3"))  # 3.6-14.5 MB

# %% [markdown]
# ### The C++ im2col ladder: v0 → v1, against the STREAM copy roof [Q22]
#
# im2col is a copy, so its ceiling is the machine's copy bandwidth, not its FLOP rate. The C++ file keeps its
# versions side by side (`cpp_src/conv_im2col.cpp`, `version="v0"|"v1"`, both checked bit for bit against
# `F.unfold` / `F.fold` in the tests):
#
# - **v0** — OpenMP over the `N·C` image planes; per (tap, output row) a bounds test, a `memcpy` of the valid
#   span (stride 1) or an indexed gather. In the batch-folded `[K, N·L]` layout a plane's rows land `N·L` apart.
#   Its hidden cost: after the parallel region libgomp's workers *spin*, and on a 2-core machine they fight the
#   OpenBLAS threads of the GEMM that runs next.
# - **v1** — threads over *input channels × kernel rows*: item (c, i) owns a contiguous block of `kw` rows of the
#   column matrix and writes it front to back (a 1- or 3-channel input layer still splits evenly); the valid
#   (oh, ow) ranges of each tap are computed once, so the row loop is `memset` / copy / `memset` with no
#   per-element index test; stride 1 and 2 are compile-time constants (`memcpy` and a vectorised even-element
#   gather). The threads are plain `std::thread`s that exit when the items run out — nothing spins after the copy.
#
# Bytes moved by im2col: x read once plus the columns written once; GB/s = bytes / best time, compared with the
# STREAM "copy" kernel (`dst = src`, 2 × bytes counted, 128 MiB, same threads). The columns of these layers
# (3.6–14.5 MB at batch 2) partly stay in the last-level cache, so im2col can exceed the DRAM copy figure. The
# GEMM is OpenBLAS (`np.matmul`): the project's own C++ GEMM (`tl.gemm.matmul(backend="cpp")`, the packed-SIMD ladder
# of the GEMM topic) gives the same product, and its time on the first layer's shape is printed next to OpenBLAS's.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn import backends as _be  # noqa: E402
from tinylearn.conv.bench import stream_copy_gbs  # noqa: E402
from tinylearn.conv.im2col import im2col_raw  # noqa: E402

copy_gbs = stream_copy_gbs(repeat=3)
print(f"STREAM copy (128 MiB, C++ threads): {copy_gbs:.1f} GB/s (loaded machine)")
ladder = {}
if tl.conv.cpp_available():
    print(f"{'layer':18} {'v0 ms':>7} {'v1 ms':>7} {'v1 GB/s':>8} {'% of copy':>10}")
    for name, C, OC, H, k, s, p in LAYERS:
        if k == 1:
            continue  # the 1x1 layer builds no columns
        x, w, b = layer_arrays(C, OC, H, k, batch)
        kk, s2, p2, d2, out = window_params(x.shape, w.shape[2:], s, p, 1, "x")
        t = {}
        for v in ("v0", "v1"):
            t[v] = measure(
                lambda v=v, x=x, kk=kk, s2=s2, p2=p2, out=out: im2col_raw(x, kk, s2, p2, (1, 1), out, "cpp", "KNL", v),
                warmup=1,
                repeat=5,
            ).min
        c0 = im2col_raw(x, kk, s2, p2, (1, 1), out, "cpp", "KNL", "v0")
        c1 = im2col_raw(x, kk, s2, p2, (1, 1), out, "cpp", "KNL", "v1")
        assert np.array_equal(c0, c1)  # the ladder's rungs agree bit for bit
        nbytes = x.nbytes + c1.nbytes
        assert nbytes == 4 * (x.size + C * kk[0] * kk[1] * batch * out[0] * out[1])  # x read + cols written, fp32
        ladder[name] = {"v0": t["v0"], "v1": t["v1"], "gbs": nbytes / t["v1"] / 1e9}
        print(
            f"{name:18} {1e3 * t['v0']:7.2f} {1e3 * t['v1']:7.2f} {ladder[name]['gbs']:8.1f} "
            f"{100 * ladder[name]['gbs'] / copy_gbs:9.0f}%"
        )
    # the GEMM: OpenBLAS vs the project's C++ GEMM on the first layer's [OC, K] x [K, N*L]
    name, C, OC, H, k, s, p = LAYERS[0]
    x, w, b = layer_arrays(C, OC, H, k, batch)
    kk, s2, p2, d2, out = window_params(x.shape, w.shape[2:], s, p, 1, "x")
    cols = conv_cols(x, kk, s2, p2, d2, out, "cpp")
    w2 = w.reshape(OC, -1)
    t_blas = measure(lambda: w2 @ cols, warmup=1, repeat=3).min
    if _be.C_available("gemm"):
        t_own = measure(lambda: tl.gemm.matmul(w2, cols, backend="cpp"), warmup=1, repeat=3).min
        tl.testing.assert_close(tl.gemm.matmul(w2, cols, backend="cpp"), w2 @ cols, reduction_size=w2.shape[1])
        print(
            f"{name} GEMM {OC}x{w2.shape[1]}x{cols.shape[1]}: OpenBLAS {1e3 * t_blas:.2f} ms, project C++ GEMM "
            f"{1e3 * t_own:.2f} ms ({t_own / t_blas:.1f}x; conv2d v1 uses OpenBLAS, v2 the C++ GEMM's micro-kernels)"
        )
assert copy_gbs > 0.1
assert not tl.conv.cpp_available() or len(ladder) == 4

# %% [markdown]
# **Reading the ladder.** Both rungs produce the same bytes (asserted); v1 is the default. What changed is *how*
# the copy runs, not what it computes: contiguous per-thread writes, no index tests inside rows, and no threads
# left spinning against the GEMM's. The backward uses the same kernels: it keeps the forward's columns for
# `dW = dYᵀ·colsᵀ` (one GEMM over the whole batch), computes `dX = col2im(Wᵀ·dYᵀ)` (one GEMM, then the adjoint
# copy, threaded over the image planes) and `db = Σ dY` — one GEMM per gradient.

# %% [markdown]
# ### v2: implicit GEMM — no column matrix, one thread pool [Q22] [Q32]
#
# The v1 forward switches between three thread pools inside one conv: the im2col threads, OpenBLAS's pthreads
# (which busy-spin after each call) and the transpose threads; on 2 cores each switch costs. v2
# (`_C.conv.conv2d_forward`, `cpp_src/conv_implicit.cpp`) runs everything in one OpenMP team and builds no columns:
#
# - the GEMM is a packed MR×NR register-blocked micro-kernel: on AVX-512 an 8×32 fp32 one of the conv's own
#   (64 / 128 / 256 output channels are whole 8-row panels, so no edge tile), at the AVX2 / scalar levels the
#   project GEMM's (`cpp_src/gemm.cpp`, 6×16 / a scalar loop, through `gemm_ukr.h`); `TINYLEARN_CPU_FEATURES`
#   picks the level;
# - **B is packed straight from the image**: a tile of whole NR-column panels of output positions (the batch side
#   by side, as in the KNL layout) × KC kernel rows is written into the micro-panels by row segments (AVX-512,
#   stride 1: one masked vector load per segment; otherwise the memset / copy / gather of im2col v1), so the
#   "columns" only exist as one L2-sized block per thread;
# - A (the weights) is packed once per call; the micro-kernel accumulates into `y`'s NCHW memory (`ldc = OH·OW`),
#   whose tile starts as the bias — no transpose; a micro-panel that spans two images goes through a scratch tile.
#
# Its backward for stride 1 computes `dX` as the same kernel on the flipped, transposed weights
# (`dX = conv2d(dY, W̃, padding = d(k−1) − p)`): no col2im; `dW` (groups = 1) is a GEMM whose reduction runs over
# the N·OH·OW positions, its column blocks again generated in cache. The table puts the GEMM rates side by side on each
# layer's `[OC, K] × [K, N·L]` product: OpenBLAS, the project GEMM called from Python (`tl.gemm.matmul`, packing
# a materialised column matrix), and v2's whole forward (im2col-in-packing included).

# %%
# NBVAL_IGNORE_OUTPUT
v2_rates = {}
if tl.conv.cpp_available() and _be.C_available("gemm"):
    print(f"micro-kernel ISA: {_be.load_C('conv').micro_kernel_isa()}")
    print(f"{'layer':18} {'M x K x N':>18} {'OpenBLAS':>9} {'C++ GEMM':>9} {'v2 conv':>8}  GFLOP/s (best of 3, loaded)")
    for name, C, OC, H, k, s, p in LAYERS:
        x, w, b = layer_arrays(C, OC, H, k, batch)
        kk, s2, p2, d2, out = window_params(x.shape, w.shape[2:], s, p, 1, "x")
        cols = conv_cols(x, kk, s2, p2, d2, out, "cpp")
        w2 = w.reshape(OC, -1)
        flops = 2 * OC * w2.shape[1] * cols.shape[1]
        y2, c2 = tl.conv.conv2d_forward(x, w, b, s, p, backend="cpp", version="v2")
        assert c2 is None  # v2 builds no column matrix
        ey = F.conv2d(*(torch.from_numpy(a) for a in (x, w, b)), s, p).numpy()
        tl.testing.assert_close(y2, ey, reduction_size=w2.shape[1])  # same result as torch (fp32 tolerance)
        t_blas = measure(lambda w2=w2, cols=cols: w2 @ cols, warmup=1, repeat=3).min
        t_own = measure(lambda w2=w2, cols=cols: tl.gemm.matmul(w2, cols, backend="cpp"), warmup=1, repeat=3).min
        t_v2 = measure(
            lambda x=x, w=w, b=b, s=s, p=p: tl.conv.conv2d(x, w, b, s, p, backend="cpp", version="v2"), repeat=3
        ).min
        v2_rates[name] = (flops / t_blas / 1e9, flops / t_own / 1e9, flops / t_v2 / 1e9)
        M_, K_, N_ = OC, w2.shape[1], cols.shape[1]
        print(f"{name:18} {f'{M_}x{K_}x{N_}':>18} " + " ".join(f"{g:9.1f}" for g in v2_rates[name]))
assert not (tl.conv.cpp_available() and _be.C_available("gemm")) or len(v2_rates) == len(LAYERS)
assert all(min(r) > 0.1 for r in v2_rates.values())  # every path runs at > 0.1 GFLOP/s, even loaded

# %% [markdown]
# **Reading v2.** The GEMM inside v2 is a micro-kernel like the project GEMM column's, yet it is fed differently:
# its B block is built in cache from the image instead of read from a column matrix in memory, its output lands in
# NCHW, and no other thread pool wakes up between the stages — so on a quiet machine the v2 column can exceed the
# project GEMM's rate on the very same product, and the v2 rows of the first table close most of v1's gap to
# torch (the printed rates are loaded and vary run to run, so no ordering is asserted). What is left to oneDNN: a
# blocked `nChw16c` layout (no packing of B at all: its kernels load the input directly, 16 channels per vector),
# which matters most where the packing is amortised over few output channels (64→64 @56, the 3-channel stem).

# %% [markdown]
# ### v3: direct convolution over a channel-blocked layout [Q22] [Q32]
#
# v2 still packs `K × N·L` values of B per call — 9× the input for a 3×3 conv — and `perf` puts that packing at
# ~12% of its time at 256 channels, with the micro-kernel itself near the FMA peak. v3 (`cpp_src/conv_direct.cpp`,
# oneDNN's scheme) removes the packing: it reorders the input **once** to `[N][C/16][H+2p][W+2p][16]` (a zero
# border, so padding costs no branch) and the weights to `[OC/16][C/16][kh][kw][16c][16o]`, then computes
#
# `y[n, ob·16+o, oh, ow] = b + Σ_{cb,i,j,c} xb[n][cb][oh+i][ow+j][c] · wb[ob][cb][i][j][c][o]`
#
# with a register tile of 14 output columns × 32 output channels: per `(cb, i, j, c)` two weight vectors are
# loaded and each of the 14 input values is broadcast into two FMAs — 28 accumulators, 28 FMAs per 16 loads, the
# input read in place. A 16×16 register transpose writes the tile back to NCHW. The AVX2 build of the same source
# (`conv_direct_simd.inc`, compiled once per instruction set) uses 8-channel blocks (`nChw8c`) and a 6 × 16 tile
# in its 16 registers: 12 accumulators, 2 weight vectors, 1 broadcast. (A 7 × 16 tile needs 17: GCC spilled one
# accumulator to the stack, a store-to-load chain in every step, and on a true AVX2 build the forward ran at 1.9×
# torch's time instead of ~1.05×. A forced-AVX2 run on an AVX-512 machine built with `-march=native` hides this,
# since there the AVX2 code may use all 32 registers: measure AVX2 kernels with a portable build.) v3 covers fp32,
# stride 1, no dilation, groups 1, kernels larger than 1×1 and channel counts
# that are multiples of the block (`_C.conv.direct_eligible`, `direct_block()`); everything else, and
# `version="v2"`, runs v2. With no GEMM packing to amortise, v3 also suits small layers: `version=None` sends every
# fp32 conv it covers to it, including the digits CNN's 8→16 one, which v2 leaves to v1 (im2col + OpenBLAS) below 32
# output channels. On an AVX-512 machine, channel counts that 16 does not divide but 8 does take the AVX2 build.
# The dX of a stride-1 conv is the same kernel on the flipped weights, so it speeds up the backward too, and dW has
# a v3 kernel of its own on the same layout: one work item per (16 output channels, 16 input channels) pair owns a
# `16×16×kh×kw` block of dW and accumulates it over the positions (16 FMAs per dY vector), so the threads never
# reduce into shared memory.
#
# **Small C: the stem.** The 7×7/2 stem has 3 input channels, which no block divides, so the blocked layout would
# pad 3 channels to 16 (5× the FMAs). Its forward keeps the input planar instead, only zero-padded
# (`xp[n][c][H+2p][W+2p]`), with the weights as `[OC/16][C][kh][kw][16o]`, and uses the same register tile: per
# `(c, i, j)` two weight vectors and 14 broadcasts of `xp[c][oh·s+i][(ow0+u)·s+j]` — the stride only spaces out the
# broadcasts (`_C.conv.direct_forward_eligible`: no block divides C, one divides OC, column stride 1 or 2). Two
# lessons from making it fast: GCC at `-O3` noticed that column `j+2` reuses the values of column `j` and carried
# them through general registers and the stack (165 spill moves per step) until *predictive commoning* was turned
# off for this function; and the AVX2 build's masked stores (`vmaskmovps`) for the tile's last columns are slow on
# AMD cores, so it writes 4 + 2 + 1 lanes with plain stores (the digits CNN's 1→8 layer: 200 → 115 µs).

# %%
# NBVAL_IGNORE_OUTPUT
v3_rows = {}
C_conv = _be.load_C("conv") if tl.conv.cpp_available() else None
for name, C, OC, H, k, s, p in LAYERS:
    if C_conv is None or not C_conv.direct_forward_eligible(C, OC, (k, k), (s, s), (1, 1), 1):
        continue
    x, w, b = layer_arrays(C, OC, H, k, batch)
    y3, _ = tl.conv.conv2d_forward(x, w, b, s, p, backend="cpp", version="v3")
    ey = F.conv2d(*(torch.from_numpy(a) for a in (x, w, b)), s, p).numpy()
    tl.testing.assert_close(y3, ey, reduction_size=C * k * k)  # v3 = torch within the fp32 tolerance
    tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
    t = {
        ver: measure(
            lambda x=x, w=w, b=b, s=s, p=p, v=ver: tl.conv.conv2d(x, w, b, s, p, backend="cpp", version=v),
            warmup=1,
            repeat=5,
        ).min
        for ver in ("v2", "v3")
    }
    t["torch"] = measure(lambda tx=tx, tw=tw, tb=tb, s=s, p=p: F.conv2d(tx, tw, tb, s, p), warmup=1, repeat=5).min
    v3_rows[name] = t
    print(
        f"{name:18} v2 {1e3 * t['v2']:6.2f} ms  v3 {1e3 * t['v3']:6.2f} ms  torch {1e3 * t['torch']:6.2f} ms  "
        f"v3/v2 {t['v3'] / t['v2']:.2f}  v3/torch {t['v3'] / t['torch']:.2f}  (best of 5)"
    )
# with AVX2 or AVX-512 the three 3x3 layers take the blocked kernel and the stem the planar one; at the scalar level
# the table is empty (v3 = v2)
print(f"v3 channel block here: {C_conv.direct_block() if C_conv is not None else 0}")
assert not v3_rows or set(v3_rows) == {n for n, *_ in LAYERS if n.startswith(("3x3", "7x7"))}
assert all(min(t.values()) > 0 for t in v3_rows.values())

# %% [markdown]
# **Reading v3.** The `v3/v2` column is the packing v3 no longer does (plus its two reorders, which it does
# instead); `v3/torch` is the distance left to oneDNN's own direct kernels. Both are this run's timings on a shared
# machine, so the cell asserts correctness against torch, not an ordering. The 1×1 layer stays on v2: its B panels
# are plain copies of x, so there is no packing to save, and v3's reorders would be pure overhead.

# %%
# NBVAL_IGNORE_OUTPUT
bw = roofline.stream_bandwidth(n=4_000_000, repeat=3) if tl.conv.cpp_available() else 10.0
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
tl.bench.plot_table(table, metric="gflops", ax=axes[0], log=False)
axes[0].set_title("conv2d forward GFLOP/s")
roofline.roofline_plot(axes[1], peak, bw, points)
plt.tight_layout()
plt.show()
intens = [pt[1] for pt in points]
print(
    f"measured peak {peak:.0f} GFLOP/s (SGEMM), STREAM {bw:.1f} GB/s; ridge at {peak / bw:.1f} FLOP/byte; "
    f"layer intensities {min(intens):.0f}-{max(intens):.0f} FLOP/byte"
)
assert peak > 0 and bw > 0
assert min(intens) > 10  # every layer: > 10 FLOP/byte of minimum traffic
assert min(pt[1] for pt in points if pt[0].startswith("3x3")) > 50

# %% [markdown]
# **Reading the roofline.** With the minimum traffic (read x and w, write y once) every layer's intensity is above
# 10 FLOP/byte and the 3×3 layers' above 50 (both asserted); x86 CPUs have their ridge at a few to a few tens of
# FLOP/byte (this machine's, measured under load, is printed above), so the 3×3 layers are compute-bound *if* the
# kernel keeps its working set in cache. tinylearn's points sit below the compute roof because of the data
# movement around its GEMM (breakdown above) and because the column matrix adds `kh·kw`× traffic that the
# minimum-traffic intensity does not count. The 1×1 layer needs no im2col at all, only a transpose.

# %% [markdown]
# ## 9. Deformable convolution: bilinear-sampled im2col [Q144]
#
# Deformable conv (Dai et al. 2017; v2 adds a modulation mask) lets every output pixel move each of its `kh·kw`
# taps by a learned offset (Δy, Δx) predicted by a small conv from the input. Read at a fractional position with
# bilinear interpolation, `x(py, px) = Σ over the 4 corners of (1−|py−y|)(1−|px−x|)·x[y, x]` (corners outside the
# image read 0), so im2col becomes a *gather with weights*:
# `cols[n, (c, i, j), l] = m · bilinear(x[n, c], oh·s − p + i·d + Δy, ow·s − p + j·d + Δx)` and the rest is the
# same GEMM. `tinylearn.conv.deformable` implements it in numpy (offset/mask layouts of torchvision's
# `deform_conv2d`, which is not installed here, so the oracle is a seven-loop direct implementation). With zero
# offsets every sample hits a pixel exactly, the bilinear weights are (1, 0, 0, 0), and the columns are im2col's.

# %%
from tinylearn.conv import deformable  # noqa: E402

x = rng.standard_normal((2, 3, 9, 8))
w = rng.standard_normal((4, 3, 3, 3))
b = rng.standard_normal(4)
off0 = np.zeros((2, 18, 5, 4))  # stride 2, padding 1 -> 5x4 outputs
assert np.array_equal(deformable.deform_im2col(x, off0, 3, 2, 1), tl.conv.im2col(x, 3, 2, 1))
tl.testing.assert_close(
    deformable.deform_conv2d(x, off0, w, b, 2, 1), F.conv2d(*map(torch.from_numpy, (x, w, b)), 2, 1), "float64"
)
off = 1.7 * rng.standard_normal(off0.shape)
mask = rng.random((2, 9, 5, 4))
fast = deformable.deform_conv2d(x, off, w, b, 2, 1, mask=mask)
loops = deformable.deform_conv2d_direct(x, off, w, b, 2, 1, mask=mask)
err = np.abs(fast - loops).max()
assert err < 1e-12
print("zero offsets: columns == im2col bit for bit, output == F.conv2d (fp64 tolerance)")
print("random offsets (std 1.7 px) + v2 mask: vectorised == seven-loop reference (max |diff| < 1e-12)")

# %% [markdown]
# **Scheduling with dynamic offsets.** A regular conv's output tile of `th×tw` pixels reads a fixed
# `(th+kh−1)×(tw+kw−1)` input patch, known at compile time: tile so that patch × channels fits in L1/L2 and every
# loaded pixel is reused by up to `kh·kw` taps. With offsets the footprint is only known at run time and grows with
# the offsets' spread, so reuse falls and the gather goes irregular. A practical schedule: (1) compute the
# offsets first (they are a cheap conv), (2) per output tile take the **bounding box** of the sampled corners
# (`sampling_footprint` measures it), (3) pick the tile size so that `bbox × C_block × 4 bytes` fits the cache
# level, shrinking tiles where the offsets are large, (4) vectorise along output pixels (the bilinear weights
# and the four gathers are SIMD-friendly; the gathers are the cost) and along channels (one offset serves all C).
# Measured below on a 32×32 image with 3×3 taps and 4×4 output tiles:

# %%
rows_fp = []
for std in [0.0, 0.5, 1.0, 2.0, 4.0]:
    offs = std * np.random.default_rng(1).standard_normal((1, 18, 32, 32))
    fp = deformable.sampling_footprint(offs, (32, 32), 3, 1, 1, tile=(4, 4))
    rows_fp.append((std, fp))
print(f"{'offset std (px)':>15} {'taps/tile':>10} {'distinct px':>12} {'reuse':>7} {'bbox px':>8}")
for std, fp in rows_fp:
    print(f"{std:15.1f} {fp['samples']:10.0f} {fp['distinct']:12.1f} {fp['reuse']:7.1f} {fp['bbox']:8.1f}")
r0, r4 = rows_fp[0][1], rows_fp[-1][1]
assert r0["distinct"] <= 36 and r0["bbox"] <= 36  # zero offsets: at most the 6x6 patch of a 4x4 tile
assert r4["distinct"] > 3 * r0["distinct"] and r4["reuse"] < r0["reuse"] / 3
print(
    f"Reading: offsets of std 4 px make a 4x4 tile touch {r4['distinct'] / r0['distinct']:.1f}x as many distinct "
    f"pixels ({r4['distinct']:.0f} vs {r0['distinct']:.0f}) and cut the reuse per loaded pixel from "
    f"{r0['reuse']:.1f} to {r4['reuse']:.1f}; the tile's bounding box grows {r4['bbox'] / r0['bbox']:.1f}x."
)

# %% [markdown]
# (Deformable conv is not in torch core or tinygrad — torchvision's `ops.deform_conv2d` is torch's, and it is not
# installed here — so there is no three-way timing for it.)
#
# ## Recap: interview answers
#
# - **[Q2] What a conv computes, and a custom operator.** `y[n,o,p,q] = b[o] + Σ_{c,i,j} w[o,c,i,j]·x[n,c,ps+id,
#   qs+jd]` with `OH = ⌊(H+2p−d(k−1)−1)/s⌋+1`. As a PyTorch op: forward `W·unfold(x)`, backward
#   `dW = Σ dY·colsᵀ`, `dX = fold(Wᵀ·dY)`, `db = ΣdY` in a `torch.autograd.Function`; §4's `Im2colConv2d` passes
#   fp64 `gradcheck` and matches `F.conv2d` to 1e-12.
# - **[Q22] im2col.** It copies every receptive field into a column so that the conv is one GEMM
#   `[OC, C·kh·kw] @ [C·kh·kw, N·OH·OW]`. Cost: memory `kh·kw/s²` × the input (9× for 3×3, 12.25× for the 7×7/2
#   stem, §5), bounded by row-tiling to `N·K·R·OW`. Time: on the C ≥ 128 3×3 layers the GEMM does 256–512 FLOPs
#   per copied element (§8), so the copy should be the smaller part — but a fresh buffer's page faults can make it
#   as slow as the GEMM; what a GEMM-based conv loses to oneDNN is the data movement around the GEMM. Optimised
#   im2col streams: threads over input channels (× kernel rows), each writing its contiguous block of rows, tap
#   ranges hoisted out of the row loop (memset / memcpy / memset), no spinning thread pool next to the BLAS
#   threads; its roof is the STREAM copy bandwidth (§8 ladder v0 → v1). A 1×1 stride-1 conv needs no im2col:
#   `y[n] = W·x[n]`. Better still, no column matrix at all: v2 packs the GEMM's B panels straight from the image
#   (implicit GEMM), writes NCHW directly and runs in one thread pool (§8 v2); v3 drops the packing too, reading a
#   channel-blocked copy of the input in place (§8 v3).
# - **[Q32] Conv optimisations.** Winograd F(2×2,3×3) does 16 instead of 36 multiplies per tile (2.25×) but is
#   ~2× less accurate in fp16 (§6, asserted worse on every C); depthwise = `groups = C` (§3); BN folds into
#   `W' = γW/√(σ²+ε)`, `b' = γ(b−μ)/√(σ²+ε)+β` (§7). Against oneDNN the cost is the materialised columns, the
#   transpose back to NCHW and freshly allocated buffers (§8): implicit GEMM in a blocked layout avoids all three
#   (v3: reorder the input once to `[N][C/16][H+2p][W+2p][16]`, a 14-column × 32-channel register tile).
# - **[Q103] Reparameterisation.** Affine ops with no nonlinearity between fold into one: `W2W1`, `W2b1 + b2` for a
#   linear chain (64→256→32: ~12× fewer parameters and FLOPs, asserted; a 256→16→256 bottleneck grows ~7.8× when
#   folded, so keep it factored); `s·W`, `s·b + t` for a BN/scale after a conv or linear; `W·diag(γ)`, `Wβ + b` for
#   a normalisation's affine before a linear. Conv+BN+scale becomes one conv (3 kernels → 1, two activation passes
#   gone), equal to torch at fp32 tolerance (§7b).
# - **[Q98] Naive NCHW conv and row blocking.** The inner (c, i, j) loop strides `H·W·4` bytes per channel and
#   re-fetches each pixel for every tap and filter. Tiling R output rows keeps the input band hot and cuts the
#   workspace linearly in R (R=1 is 56× smaller than untiled at 56², asserted), at the cost of smaller GEMMs.
# - **[Q144] Deformable conv.** im2col with a bilinear gather at `base + Δ` (zero Δ ⇒ exactly im2col, asserted),
#   then the same GEMM. Offsets are data-dependent, so tiles are sized at run time from the sampled bounding box:
#   std-4-px offsets triple a 4×4 tile's distinct footprint and cut reuse by more than 3× (asserted, §9).
#
# ## Exercises (`exercises/02_im2col_conv/`)
#
# Implement in `stubs.py`, then `pytest exercises/02_im2col_conv`:
#
# 1. `conv_output_size` — the floor formula, with a ValueError when the kernel does not fit.
# 2. `im2col` — numpy, F.unfold layout, no Python loop over output pixels.
# 3. `col2im` — the adjoint, accumulating overlaps (F.fold).
# 4. `conv2d_im2col` — forward as im2col + one GEMM.
# 5. `conv2d_weight_grad` — dW = Σₙ dYₙ · colsₙᵀ.
# 6. `winograd_input_transform` — Bᵀ d B, and check a whole F(2×2,3×3) tile against direct correlation.
