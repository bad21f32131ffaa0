"""``tinylearn bench conv``: im2col + GEMM convolution vs torch F.conv2d vs tinygrad, forward and forward+backward.

Layers (ResNet-style, NCHW fp32): 3x3 64->64 @56², 128->128 @28², 256->256 @14², a 1x1 64->256 @56² and the 7x7/2
stem 3->64 @224². Batch 4 by default (about 2 minutes with tinygrad's JIT compiles), 8 with ``full=True``
(which also adds a torch.compile column).

Columns: median ms, ratio to torch, GFLOP/s (forward 2·N·OC·OH·OW·C·kh·kw; forward+backward 3x that: dX and dW
each cost one forward), and for the tinylearn rows the share of the forward spent in im2col (the rest is the GEMM
plus the output transpose) and the column-matrix workspace in MB.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import backends as registry
from ..bench import Comparison, Table, measure, tinygrad_jit
from ._params import window_params
from .conv2d import conv2d, conv2d_backward, conv2d_flops, conv2d_forward, conv_cols
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


def im2col_share(x, w, s: int, p: int, backend: str, repeat: int = 5) -> float:
    """Fraction of the forward time spent building the column matrix (median of both timings)."""
    k, s2, p2, d2, out = window_params(x.shape, w.shape[2:], s, p, 1, "x")
    t_cols = measure(lambda: conv_cols(x, k, s2, p2, d2, out, backend), warmup=1, repeat=repeat).median
    t_all = measure(lambda: conv2d(x, w, None, s, p, backend=backend), warmup=1, repeat=repeat).median
    return min(1.0, t_cols / t_all)


def _fwd_bwd(x, w, b, gy, s, p, backend) -> Callable[[], object]:
    def run():
        y, cols = conv2d_forward(x, w, b, s, p, backend=backend)
        return conv2d_backward(gy, x, w, s, p, backend=backend, cols=cols)

    return run


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    import torch

    batch = 8 if full else 4
    repeat = 10 if full else 5
    fwd = Comparison(f"conv2d forward, fp32, batch {batch}", repeat=repeat, progress=progress)
    fb = Comparison(f"conv2d forward+backward (dX, dW, db), fp32, batch {batch}", repeat=repeat, progress=progress)
    fwd.note(f"torch {torch.__version__} with {torch.get_num_threads()} threads (oneDNN/mkldnn conv kernels)")
    fwd.note(
        "tinylearn = im2col (backend) + one OpenBLAS GEMM per group via np.matmul; 'im2col %' = share of its forward"
    )
    fb.note("backward: dW = dY @ colsᵀ (cols reused from forward), dX = col2im(Wᵀ @ dY), db = sum dY")
    if full:
        fwd.note("torch.compile (inductor) column only with full=True: its compile takes tens of seconds per shape")
    for layer in LAYERS:
        _bench_layer(fwd, fb, layer, batch, compile_torch=full)
    tables = [fwd.table, fb.table]
    for t in tables:  # the best run too: on a shared, loaded machine the minimum is the less noisy statistic
        for r in t.rows:
            r.extra["min ms"] = None if r.min_ms is None else round(r.min_ms, 2)
    return tables


def _bench_layer(fwd: Comparison, fb: Comparison, layer: tuple, batch: int, compile_torch: bool = False) -> None:
    import torch
    import torch.nn.functional as F

    name, C, OC, H, k, s, p = layer
    x, w, b = layer_arrays(C, OC, H, k, batch)
    flops = conv2d_flops(x.shape, w.shape, s, p)
    y_ref = conv2d(x, w, b, s, p)
    gy = np.random.default_rng(1).standard_normal(y_ref.shape, dtype=np.float32)
    ws_mb = im2col_workspace_bytes(x.shape, w.shape, s, p) / 2**20
    tx, tw, tb, tgy = (torch.from_numpy(a) for a in (x, w, b, gy))
    with fwd.case(name, flops=flops) as c:
        for be in backends():
            share = im2col_share(x, w, s, p, be)
            extra = {"im2col %": round(100 * share), "cols MB": round(ws_mb, 1)}
            c.add(be, lambda be=be: conv2d(x, w, b, s, p, backend=be), **extra)
        c.add("torch", lambda: F.conv2d(tx, tw, tb, s, p))
        if compile_torch:
            c.add_torch_compile("torch.compile", lambda a, ww, bb: F.conv2d(a, ww, bb, s, p), tx, tw, tb)
        c.add_tinygrad("tinygrad", lambda tg: _tg_fwd(tg, x, w, b, s, p))
    with fb.case(name, flops=3 * flops) as c:
        for be in backends():
            c.add(be, _fwd_bwd(x, w, b, gy, s, p, be))
        txg, twg, tbg = (t.clone().requires_grad_(True) for t in (tx, tw, tb))

        def torch_fb():
            y = F.conv2d(txg, twg, tbg, s, p)
            return torch.autograd.grad(y, (txg, twg, tbg), tgy)

        c.add("torch", torch_fb)
        c.add_tinygrad("tinygrad", lambda tg: _tg_fwd_bwd(tg, x, w, b, gy, s, p))


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
