"""``tinylearn bench conv``: im2col + GEMM convolution vs torch F.conv2d vs tinygrad, forward and forward+backward,
plus the small-CNN training step.

Layers (ResNet-style, NCHW fp32): 3x3 64->64 @56², 128->128 @28², 256->256 @14², a 1x1 64->256 @56² and the 7x7/2
stem 3->64 @224². Batch 4 by default (about 2 minutes with tinygrad's JIT compiles), 8 with ``full=True``
(which also adds a torch.compile column).

Columns: median and best ms, ratio to torch (of the medians; "min x torch" = ratio of the best runs, the steadier
figure on a shared machine), GFLOP/s (forward 2·N·OC·OH·OW·C·kh·kw; forward+backward 3x that: dX and dW each cost
one forward). For the tinylearn rows of the forward table: "im2col %" = share of the forward spent building the
column matrix (best of each), "im2col GB/s" = (bytes of x read + bytes of cols written) / best im2col time and
"% copy" = that as a share of the STREAM copy bandwidth measured here (``stream_copy_gbs``), "GEMM GFLOP/s" = the
[OC, K] x [K, N*L] GEMM alone (OpenBLAS via np.matmul). The "cpp" row is the default rung, v3 (the direct
channel-blocked kernel where it applies, or the planar small-C one for the stem, else v2), "cpp v2" the implicit
GEMM (neither builds a column matrix: their "GEMM GFLOP/s" is the whole forward's, im2col columns empty); "cpp v1" /
"cpp v0" are the older rungs (C++ im2col v1 / v0 + OpenBLAS + transpose). In forward+backward, "cpp" = v3/v2
forward and dX as a conv for stride 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .. import backends as registry
from ..bench import Comparison, Table, measure, tinygrad_jit
from ._params import window_params
from .conv2d import _is_pointwise, conv2d, conv2d_backward, conv2d_flops, conv2d_forward, conv_cols
from .tiled import im2col_workspace_bytes

# name, C, OC, H, kernel, stride, padding
LAYERS = [
    ("3x3 64->64 @56", 64, 64, 56, 3, 1, 1),
    ("3x3 128->128 @28", 128, 128, 28, 3, 1, 1),
    ("3x3 256->256 @14", 256, 256, 14, 3, 1, 1),
    ("1x1 64->256 @56", 64, 256, 56, 1, 1, 0),
    ("7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3),
]


def backends() -> list[str]:
    """The im2col backends that run here, in registration order (numpy, numba, cpp)."""
    here = set(registry.available("conv.im2col"))
    return [b for b in registry.registered("conv.im2col") if b in here]


def layer_arrays(C: int, OC: int, H: int, k: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, C, H, H), dtype=np.float32)
    w = (rng.standard_normal((OC, C, k, k), dtype=np.float32) / np.sqrt(C * k * k)).astype(np.float32)
    b = rng.standard_normal(OC, dtype=np.float32)
    return x, w, b


def stream_copy_gbs(nbytes: int = 1 << 27, repeat: int = 7) -> float:
    """STREAM "copy" bandwidth in GB/s: best of ``repeat`` copies of ``nbytes`` (default 128 MiB, 4x the L3 of
    common server CPUs) counted as 2 * nbytes moved (read + write). The C++ kernel runs on the im2col threads
    (``_C.conv.stream_copy``); without the extension, numpy's single-threaded copy."""
    if nbytes < 1 << 20:
        raise ValueError(f"nbytes: need at least 1 MiB to measure memory bandwidth, got {nbytes}")
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    if registry.C_available("conv"):
        kern = registry.load_C("conv").stream_copy
        fn: Callable[[], object] = lambda: kern(dst, src)  # noqa: E731
    else:
        fn = lambda: np.copyto(dst, src)  # noqa: E731
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def im2col_stats(
    x: np.ndarray, w: np.ndarray, s: int, p: int, backend: str, version: str | None = None, repeat: int = 5
) -> dict[str, float]:
    """Best-of-``repeat`` times (s) of im2col alone, the GEMM alone and the whole forward, and the derived figures:
    share (im2col / forward), im2col GB/s (x read + cols written) and GEMM GFLOP/s."""
    k, s2, p2, d2, out = window_params(x.shape, w.shape[2:], s, p, 1, "x")
    OC = w.shape[0]
    if backend == "cpp" and version in (None, "v2", "v3"):  # v2 / v3: no column matrix, no separate GEMM
        t_all = measure(lambda: conv2d(x, w, None, s, p, backend="cpp", version=version), warmup=1, repeat=repeat).min
        flops = 2.0 * OC * w[0].size * x.shape[0] * out[0] * out[1]
        return {
            "t_cols": 0.0,
            "t_gemm": t_all,
            "t_all": t_all,
            "share": 0.0,
            "gbs": None,
            "gemm_gflops": flops / t_all / 1e9,
        }
    cols = conv_cols(x, k, s2, p2, d2, out, backend, version)
    w2 = w.reshape(OC, -1)
    t_cols = measure(lambda: conv_cols(x, k, s2, p2, d2, out, backend, version), warmup=1, repeat=repeat).min
    t_gemm = measure(lambda: w2 @ cols, warmup=1, repeat=repeat).min
    t_all = measure(lambda: conv2d(x, w, None, s, p, backend=backend, version=version), warmup=1, repeat=repeat).min
    direct = _is_pointwise(k, s2, p2, d2)  # the forward builds no columns at all (batched matmul on x)
    return {
        "t_cols": t_cols,
        "t_gemm": t_gemm,
        "t_all": t_all,
        "share": 0.0 if direct else min(1.0, t_cols / t_all),
        "gbs": (x.nbytes + cols.nbytes) / t_cols / 1e9,
        "gemm_gflops": 2.0 * OC * cols.shape[0] * cols.shape[1] / t_gemm / 1e9,
    }


def im2col_share(x: np.ndarray, w: np.ndarray, s: int, p: int, backend: str, repeat: int = 5) -> float:
    """Fraction of the forward time spent building the column matrix (best run of each)."""
    return im2col_stats(x, w, s, p, backend, repeat=repeat)["share"]


def _fwd_bwd(x, w, b, gy, s, p, backend, version: str | None = None) -> Callable[[], object]:
    def run():
        y, cols = conv2d_forward(x, w, b, s, p, backend=backend, version=version)
        return conv2d_backward(gy, x, w, s, p, backend=backend, cols=cols, version=version)

    return run


def run(
    full: bool = False, progress: Callable[[str], None] | None = None, cnn: bool = True, tinygrad: bool = True
) -> list[Table]:
    import torch

    batch = 8 if full else 4
    repeat = 10 if full else 5
    copy_gbs = stream_copy_gbs()
    fwd = Comparison(f"conv2d forward, fp32, batch {batch}", repeat=repeat, progress=progress)
    fb = Comparison(f"conv2d forward+backward (dX, dW, db), fp32, batch {batch}", repeat=repeat, progress=progress)
    fwd.note(f"torch {torch.__version__} with {torch.get_num_threads()} threads (oneDNN/mkldnn conv kernels)")
    fwd.note(
        "tinylearn numpy/numba/cpp v1/cpp v0 = im2col (backend) + one OpenBLAS GEMM per group over the whole batch "
        "(np.matmul) + a row-copy transpose to NCHW; 1x1 = direct batched matmul (no im2col). cpp = v3: the direct "
        "kernels (channel-blocked for C, OC multiples of the SIMD block, stride 1; planar input for a small C such as "
        "the stem's 3, strided too), else v2; cpp v2 = implicit GEMM (packed micro-kernels, B packed from the image)"
    )
    fwd.note(f"STREAM copy here: {copy_gbs:.1f} GB/s (128 MiB, 2 x bytes counted); '% copy' = im2col GB/s / that")
    fb.note(
        "backward, numpy/numba: dW = dYᵀ @ colsᵀ (cols reused from forward), dX = col2im(Wᵀ @ dYᵀ), db = sum dY; "
        "cpp: dX of stride-1 layers = the conv of dY with the flipped weights (v3/v2 kernels), dW on v3/v2 (no columns)"
    )
    if full:
        fwd.note("torch.compile (inductor) column only with full=True: its compile takes tens of seconds per shape")
    for layer in LAYERS:
        _bench_layer(fwd, fb, layer, batch, copy_gbs, compile_torch=full, tinygrad=tinygrad)
    tables = [fwd.table, fb.table]
    if cnn:
        tables.append(cnn_table(repeat=repeat, progress=progress, tinygrad=tinygrad))
    for t in tables:  # the best run too: on a shared, loaded machine the minimum is the less noisy statistic
        for r in t.rows:
            r.extra["min ms"] = None if r.min_ms is None else round(r.min_ms, 2)
            base = t.get(r.case, t.baseline)
            ok = base is not None and base.min_ms and r.min_ms is not None
            r.extra["min x torch"] = round(r.min_ms / base.min_ms, 2) if ok else None
    return tables


def _bench_layer(
    fwd: Comparison,
    fb: Comparison,
    layer: tuple,
    batch: int,
    copy_gbs: float,
    compile_torch: bool = False,
    tinygrad: bool = True,
) -> None:
    import torch
    import torch.nn.functional as F

    name, C, OC, H, k, s, p = layer
    x, w, b = layer_arrays(C, OC, H, k, batch)
    flops = conv2d_flops(x.shape, w.shape, s, p)
    y_ref = conv2d(x, w, b, s, p)
    gy = np.random.default_rng(1).standard_normal(y_ref.shape, dtype=np.float32)
    ws_mb = im2col_workspace_bytes(x.shape, w.shape, s, p) / 2**20
    tx, tw, tb, tgy = (torch.from_numpy(a) for a in (x, w, b, gy))
    impls: list[tuple[str, str, str | None]] = [(be, be, None) for be in backends()]
    if "cpp" in backends():
        impls += [("cpp v2", "cpp", "v2"), ("cpp v1", "cpp", "v1"), ("cpp v0", "cpp", "v0")]
    with fwd.case(name, flops=flops) as c:
        for label, be, ver in impls:
            st = im2col_stats(x, w, s, p, be, ver)
            gbs = st["gbs"]
            extra = {
                "im2col %": round(100 * st["share"]),
                "im2col GB/s": None if gbs is None else round(gbs, 1),
                "% copy": None if gbs is None else round(100 * gbs / copy_gbs),
                "GEMM GFLOP/s": round(st["gemm_gflops"], 1),
                "cols MB": round(ws_mb, 1),
            }
            c.add(label, lambda be=be, ver=ver: conv2d(x, w, b, s, p, backend=be, version=ver), **extra)
        c.add("torch", lambda: F.conv2d(tx, tw, tb, s, p))
        if compile_torch:
            c.add_torch_compile("torch.compile", lambda a, ww, bb: F.conv2d(a, ww, bb, s, p), tx, tw, tb)
        if tinygrad:
            c.add_tinygrad("tinygrad", lambda tg: _tg_fwd(tg, x, w, b, s, p))
    with fb.case(name, flops=3 * flops) as c:
        for label, be, ver in impls:
            if ver != "v0":
                c.add(label, _fwd_bwd(x, w, b, gy, s, p, be, ver))
        txg, twg, tbg = (t.clone().requires_grad_(True) for t in (tx, tw, tb))

        def torch_fb():
            y = F.conv2d(txg, twg, tbg, s, p)
            return torch.autograd.grad(y, (txg, twg, tbg), tgy)

        c.add("torch", torch_fb)
        if tinygrad:
            c.add_tinygrad("tinygrad", lambda tg: _tg_fwd_bwd(tg, x, w, b, gy, s, p))


def cnn_table(repeat: int = 5, progress: Callable[[str], None] | None = None, tinygrad: bool = True) -> Table:
    """The training step of the small CNN (conv3x3 1->8, pool, conv3x3 8->16, pool, linear; bs32, SGD momentum):
    tinylearn (autograd + these conv kernels) vs torch eager vs tinygrad; models from tinylearn.autograd.bench."""
    from ..autograd.bench import _batch, tinygrad_step_builder, tinylearn_cnn_step, torch_cnn_model, torch_step

    cmp = Comparison("CNN training step conv8-conv16-fc, bs32 28x28, fp32", repeat=max(repeat, 10), progress=progress)
    step, tl_cnn = tinylearn_cnn_step()
    X, y = _batch((32, 1, 28, 28))
    tcnn = torch_cnn_model(tl_cnn)
    with cmp.case("CNN conv8-conv16-fc bs32") as case:
        case.add("tinylearn", step)
        case.add("torch", torch_step(tcnn, X, y))
        if tinygrad:
            state = {k: v.detach().numpy().copy() for k, v in tcnn.state_dict().items()}
            case.add_tinygrad("tinygrad", tinygrad_step_builder("cnn", X, y, state))
    return cmp.table


def _tg_fwd(tg, x, w, b, s, p) -> Callable[[], object]:
    X, W, B = tg.Tensor(x), tg.Tensor(w), tg.Tensor(b)
    f = tinygrad_jit(lambda a, ww, bb: a.conv2d(ww, bb, stride=s, padding=p))
    return lambda: f(X, W, B)


def _tg_fwd_bwd(tg, x, w, b, gy, s, p) -> Callable[[], object]:
    X, W, B, GY = tg.Tensor(x), tg.Tensor(w), tg.Tensor(b), tg.Tensor(gy)

    def step(a, ww, bb):
        y = a.conv2d(ww, bb, stride=s, padding=p)
        return (y, *y.gradient(a, ww, bb, gradient=GY))

    f = tinygrad_jit(step)
    return lambda: f(X, W, B)


if __name__ == "__main__":  # pragma: no cover
    import sys

    for t in run(full="--full" in sys.argv, progress=lambda m: print(m, file=sys.stderr)):
        print(t.to_text(), "\n")
