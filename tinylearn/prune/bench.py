"""Benchmarks for ``tinylearn bench prune``: where does sparsity buy speed?

1. SpMM  A (M x K, unstructured sparsity s) @ B (K x N), fp32, s = 50 .. 99 %: tinylearn CSR (C++/OpenMP, numba),
   dense numpy (BLAS), torch dense (baseline), torch.sparse CSR, tinygrad dense (TinyJit). Dense GEMM does
   2MKN flops at near-peak speed; CSR does 2*nnz*N flops but each one gathers a row of B by index, so it wins
   only past a crossover sparsity (typically > 90 % on a CPU).
2. SpMV  y = A x, 90 / 99 %: CSR vs ELL (C++) vs dense numpy vs torch.sparse: a memory-bound kernel, so the win
   is bytes (8 bytes per fp32 nonzero with int32 columns vs 4 per dense entry: break-even near 50 % sparsity).
3. Structured pruning: DigitsCNN-style convnet forward, dense vs masked (same cost: masks do not skip work) vs
   50 % of channels physically removed (``surgery.shrink``): tinylearn and the same weights in torch.

Threads: every library is limited to ``TINYLEARN_BENCH_THREADS`` threads (default 1: a per-core comparison that
stays meaningful on a small shared machine, where a 2-thread OpenMP/BLAS barrier can wait a whole scheduler
time slice). BLAS and OpenMP through threadpoolctl, torch.set_num_threads, numba.set_num_threads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import limited_threads as _limited_threads
from ..bench import Comparison, Table, tinygrad_jit


def _sparse_matrix(M: int, K: int, sparsity: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float32)
    a[rng.random((M, K)) < sparsity] = 0
    return a


def spmm_table(full: bool = False, progress: Callable[[str], None] | None = None) -> Table:
    import torch

    from ..sparse import CSR

    M, K, N = (2048, 2048, 512) if full else (1024, 1024, 256)
    sparsities = (0.5, 0.7, 0.9, 0.95, 0.98, 0.99)
    cmp = Comparison(f"SpMM fp32 ({M}x{K} sparse) @ ({K}x{N}) dense", baseline="torch", progress=progress)
    rng = np.random.default_rng(0)
    B = rng.standard_normal((K, N)).astype(np.float32)
    tB = torch.from_numpy(B)
    for i, s in enumerate(sparsities):
        A = _sparse_matrix(M, K, s, seed=i)
        csr = CSR.from_dense(A)
        tA, tS = torch.from_numpy(A), csr.to_torch()
        name = f"{int(round(s * 100))}% sparse"
        with cmp.case(name, flops=2.0 * M * K * N) as c:  # GFLOP/s counts the *dense* work for comparability
            c.add("tinylearn csr cpp", lambda csr=csr: csr.matmul(B, backend="cpp"), nnz=csr.nnz)
            c.add("tinylearn csr numba", lambda csr=csr: csr.matmul(B, backend="numba"), nnz=csr.nnz)
            c.add("numpy dense", lambda A=A: A @ B)
            c.add("torch", lambda tA=tA: tA @ tB, note="dense torch.mm")
            c.add("torch.sparse csr", lambda tS=tS: tS @ tB, nnz=csr.nnz)

            def build(tg: Any, A: np.ndarray = A) -> Callable[[], Any]:
                fn = tinygrad_jit(lambda a, b: a @ b)
                ga, gb = tg.Tensor(A).realize(), tg.Tensor(B).realize()
                return lambda: fn(ga, gb)

            c.add_tinygrad("tinygrad dense", build)
    cmp.note("GFLOP/s = dense-equivalent 2MKN / time, so sparse rows above the dense ones are real wins")
    cmp.note("torch.compile is not applicable to torch.sparse CSR matmul; the dense baseline is eager torch.mm")
    return cmp.table


def spmv_table(full: bool = False, progress: Callable[[str], None] | None = None) -> Table:
    import torch

    from ..sparse import CSR, ELL

    M = K = 8192 if full else 4096
    cmp = Comparison(f"SpMV fp32 ({M}x{K}) @ x", baseline="torch", progress=progress)
    x = np.random.default_rng(1).standard_normal(K).astype(np.float32)
    tx = torch.from_numpy(x)
    for i, s in enumerate((0.9, 0.99)):
        A = _sparse_matrix(M, K, s, seed=10 + i)
        csr, ell = CSR.from_dense(A), ELL.from_dense(A)
        tA, tS = torch.from_numpy(A), csr.to_torch()
        with cmp.case(f"{int(s * 100)}% sparse", nbytes=None) as c:
            c.add("tinylearn csr cpp", lambda csr=csr: csr.matmul(x), bytes=csr.nbytes)
            c.add(
                "tinylearn ell cpp",
                lambda ell=ell: ell.matmul(x),
                bytes=ell.indices.nbytes + ell.data.nbytes,
                note=f"{ell.padding_fraction:.0%} padding",
            )
            c.add("numpy dense", lambda A=A: A @ x, bytes=A.nbytes)
            c.add("torch", lambda tA=tA: tA @ tx, note="dense torch.mv", bytes=A.nbytes)
            c.add("torch.sparse csr", lambda tS=tS: tS @ tx, bytes=csr.nbytes)
    cmp.note("ELL pads every row to the longest one (column-major, for coalesced GPU loads): padding costs loads")
    return cmp.table


def torch_chain(model: Any) -> Any:
    """The same chain of layers as a torch.nn.Sequential with copied weights (eval mode)."""
    import torch

    from ..nn.layers import BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU
    from .surgery import _leaves

    layers: list[Any] = []
    for m in _leaves(model):
        if isinstance(m, Conv2d):
            t = torch.nn.Conv2d(
                m.weight.shape[1],
                m.weight.shape[0],
                m.kernel_size,
                stride=m.stride,
                padding=m.padding,
                bias=m.bias is not None,
            )
        elif isinstance(m, Linear):
            t = torch.nn.Linear(m.weight.shape[1], m.weight.shape[0], bias=m.bias is not None)
        elif isinstance(m, BatchNorm2d):
            t = torch.nn.BatchNorm2d(m.weight.shape[0], eps=m.eps)
            t.running_mean.copy_(torch.from_numpy(m.running_mean.data))
            t.running_var.copy_(torch.from_numpy(m.running_var.data))
        elif isinstance(m, ReLU):
            t = torch.nn.ReLU()
        elif isinstance(m, MaxPool2d):
            t = torch.nn.MaxPool2d(m.kernel_size, m.stride, m.padding)
        elif isinstance(m, Flatten):
            t = torch.nn.Flatten()
        else:
            raise ValueError(f"model: no torch twin for {type(m).__name__}")
        with torch.no_grad():
            if hasattr(t, "weight") and t.weight is not None:
                t.weight.copy_(torch.from_numpy(np.ascontiguousarray(m.weight.data)))
            if getattr(t, "bias", None) is not None:
                t.bias.copy_(torch.from_numpy(np.ascontiguousarray(m.bias.data)))
        layers.append(t)
    return torch.nn.Sequential(*layers).eval()


def structured_table(full: bool = False, progress: Callable[[str], None] | None = None) -> Table:
    import torch

    from ..autograd import manual_seed
    from ..autograd.grad_mode import no_grad
    from ..autograd.tensor import Tensor
    from ..nn.models import DigitsCNN
    from . import surgery

    c1, c2, batch = (64, 128, 512) if full else (32, 64, 256)
    manual_seed(0)
    dense = DigitsCNN(c1, c2).eval()
    masked = DigitsCNN(c1, c2).eval()
    masked.load_state_dict(dense.state_dict())
    surgery.mask_channels(masked, 0.5)
    small = surgery.shrink(masked)
    x = np.random.default_rng(0).random((batch, 1, 8, 8)).astype(np.float32)
    tx = Tensor(x)
    cmp = Comparison(
        f"structured pruning: DigitsCNN({c1},{c2}) forward, batch {batch}", baseline="torch", progress=progress
    )

    def fwd(model: Any) -> Callable[[], Any]:
        def run() -> Any:
            with no_grad():
                return model(tx)

        return run

    t_dense, t_small = torch_chain(dense), torch_chain(small)
    tt = torch.from_numpy(x)
    with cmp.case("forward") as c:
        for label, m in (("dense", dense), ("masked 50% (weight*mask)", masked), ("shrunk 50% channels", small)):
            c.add(f"tinylearn {label}", fwd(m), params=surgery.count_parameters(m))
        with torch.no_grad():
            c.add("torch", lambda: t_dense(tt), note="dense, eager", params=surgery.count_parameters(dense))
            c.add("torch shrunk 50% channels", lambda: t_small(tt), params=surgery.count_parameters(small))
            c.add_torch_compile("torch.compile dense", t_dense, tt)
            c.add_torch_compile("torch.compile shrunk", t_small, tt)
    with no_grad():
        diff = float(np.abs(small(tx).data - masked(tx).data).max())
    cmp.note(f"shrunk vs masked outputs: max |diff| = {diff:.2e} (surgery is exact)")
    return cmp.table


def limited_threads(n: int) -> contextlib.AbstractContextManager[None]:
    """Limit BLAS / OpenMP (threadpoolctl), torch and numba to ``n`` threads; restore afterwards."""
    return _limited_threads(n, torch=True, numba=True, name="TINYLEARN_BENCH_THREADS")


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    n = int(os.environ.get("TINYLEARN_BENCH_THREADS", "1"))
    with limited_threads(n):
        tables = [spmm_table(full, progress), spmv_table(full, progress), structured_table(full, progress)]
    for t in tables:
        t.notes.append(f"{n} thread(s) per library (TINYLEARN_BENCH_THREADS)")
    return tables


if __name__ == "__main__":  # pragma: no cover
    for t in run():
        print(t, "\n")
