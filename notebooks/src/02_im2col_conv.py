# %% [markdown]
# # 02 · Convolution as GEMM: im2col, col2im, Winograd and BN folding
#
# **Interview questions this notebook answers** (seed 003, questions 2, 22, 32, 98, 144):
#
# 1. What is the output size of a convolution with kernel *k*, stride *s*, padding *p*, dilation *d*?
# 2. How does im2col turn a convolution into one matrix multiply, and what does it cost in memory?
# 3. Derive the backward pass of a convolution: why is dX a `col2im` of Wᵀ·dY and dW a GEMM with the columns?
# 4. What is Winograd F(2×2, 3×3), how many multiplications does it save per output tile, and what does it cost
#    in numerical accuracy (fp32 vs fp16)?
# 5. How do you fold a BatchNorm into the preceding convolution for inference?
# 6. Is a conv layer compute- or memory-bound on a CPU? (roofline placement)
#
# Everything runs on `tinylearn.conv` (numpy arrays in and out, layouts of `torch.nn.functional.unfold/fold`),
# checked against torch as the oracle. Set `TINYLEARN_FULL=1` for full-size benchmarks.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

import tinylearn as tl
from tinylearn.conv import winograd

FULL = os.environ.get("TINYLEARN_FULL") == "1"
rng = np.random.default_rng(0)
torch.manual_seed(0)
np.set_printoptions(precision=3, suppress=True, linewidth=120)
print("backends:", tl.conv.BACKENDS, "| C++ kernels built:", tl.conv.cpp_available())

# %% [markdown]
# ## 1. Direct convolution: the seven loops
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
# ## 2. im2col: every receptive field becomes a column
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
# The three backends (numpy stride tricks, numba `prange`, C++/OpenMP) produce **bit-identical** columns, and
# match `F.unfold` exactly — it is a pure copy. A grid of kernel / stride / padding / dilation, including
# non-square ones:

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
# ## 3. Convolution = one GEMM
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
# ## 4. Backward through col2im
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
# ## 5. The memory lesson: im2col's workspace is kh·kw × the input
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
# Tiling bounds it: `conv2d_tiled` lowers and multiplies R output rows at a time, so the workspace is
# `N·K·R·OW` elements — at the price of more, smaller GEMMs. Same result, different time/memory point:

# %%
# NBVAL_IGNORE_OUTPUT
xs = rng.standard_normal((2 if not FULL else 8, 64, 56, 56)).astype(np.float32)
ws = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
full_y = tl.conv.conv2d(xs, ws, None, 1, 1)
rows_list = [1, 2, 4, 8, 14, 28, 56] if FULL else [1, 4, 14, 56]
tile_ms, tile_mb = [], []
for r in rows_list:
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
print({r: round(t, 1) for r, t in zip(rows_list, tile_ms)})

# %% [markdown]
# ## 6. Winograd F(2×2, 3×3)
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
# dominates and Winograd is about 2× worse than im2col + GEMM — larger tiles (F(4×4, 3×3), F(6×6, 3×3)) get much
# worse, which is why low-precision Winograd needs care.

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
assert all(errs[(C, "float16")][1] > errs[(C, "float16")][0] for C in [4, 16, 64])  # fp16: Winograd is worse
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
# ## 7. Folding BatchNorm into the convolution
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
# ## 8. Speed: backends vs torch, and where each layer sits on the roofline
#
# (The full comparison incl. tinygrad and forward+backward is `python -m tinylearn bench conv`.) Here: the
# forward of the ResNet layers in tinylearn (numpy / C++ im2col + OpenBLAS GEMM) and torch (oneDNN), and the share
# of tinylearn's time spent building columns.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.conv.bench import LAYERS, layer_arrays  # noqa: E402

batch = 8 if FULL else 2
bench_be = "cpp" if tl.conv.cpp_available() else "numpy"
cmp = tl.bench.Comparison(f"conv2d forward, batch {batch}", repeat=3 if not FULL else 10)
points, share = [], {}
for name, C, OC, H, k, s, p in LAYERS:
    x, w, b = layer_arrays(C, OC, H, k, batch)
    flops = tl.conv.conv2d_flops(x.shape, w.shape, s, p)
    y = tl.conv.conv2d(x, w, b, s, p)
    with cmp.case(name, flops=flops) as c:
        r = c.add(bench_be, lambda x=x, w=w, b=b, s=s, p=p: tl.conv.conv2d(x, w, b, s, p, backend=bench_be))
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
        rt = c.add("torch", lambda tx=tx, tw=tw, tb=tb, s=s, p=p: F.conv2d(tx, tw, tb, s, p))
    share[name] = tl.conv.bench.im2col_share(x, w, s, p, bench_be, repeat=3)
    # minimum DRAM traffic: read x and w, write y once (fp32)
    intensity = flops / (4 * (x.size + w.size + y.size))
    points += [(f"{name} ({bench_be})", intensity, r.gflops), (f"{name} (torch)", intensity, rt.gflops)]
table = cmp.table
print(table)
print("share of tinylearn forward in im2col:", {k: f"{100 * v:.0f}%" for k, v in share.items()})
assert all(0 < v < 1 for v in share.values())  # shares of measured times (they vary with load)

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.bench import roofline  # noqa: E402

peak = roofline.peak_gflops(n=1024, repeat=3).gflops
bw = roofline.stream_bandwidth(n=4_000_000, repeat=3) if tl.conv.cpp_available() else 10.0
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
tl.bench.plot_table(table, metric="gflops", ax=axes[0], log=False)
axes[0].set_title("conv2d forward GFLOP/s")
roofline.roofline_plot(axes[1], peak, bw, points)
plt.tight_layout()
plt.show()
print(f"measured peak {peak:.0f} GFLOP/s (SGEMM), STREAM {bw:.1f} GB/s; ridge at {peak / bw:.1f} FLOP/byte")
assert peak > 0 and bw > 0

# %% [markdown]
# **Reading the roofline.** Each 3×3 layer does ~2·K FLOPs per output element and touches each input element
# only a few times, so its intensity (tens to hundreds of FLOP/byte) is right of the ridge: conv layers are
# compute-bound if the kernel keeps data in cache. im2col moves them left in practice — it writes and re-reads
# a `kh·kw`× larger column matrix, which is why the im2col share is large for the cheap-GEMM layers (7×7 stem with
# C=3, depthwise) and why implicit-GEMM / direct kernels (oneDNN) win there. The 1×1 layer needs no im2col at all.
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
