"""Triton code generation: a ``FusedKernel`` -> one ``@triton.jit`` kernel (the form Inductor emits for GPUs).

Two shapes of program, both block-level (Triton's unit is a block of elements, not a thread):

* point-wise: a 1-D grid, each program takes ``BLOCK`` consecutive domain elements; the flat element index is
  split into the coalesced dim indices (``%`` and ``//`` by constant extents) and each load is
  ``tl.load(in + offset, mask=e < N)``.
* reduction: a grid over *row blocks*: each program holds ``BR`` whole rows as a ``BR x BC`` tile (``BC`` = the
  row length rounded up to a power of two, so a row must fit in one block: ``MAX_BLOCK_COLS``). Element-level
  registers are ``BR x BC`` tensors, computed once (no recomputation: the tile is in registers); a ``sum`` is
  ``tl.sum(tl.where(mask, x, 0), axis=1, keep_dims=True)``, a ``max_reduce`` a ``tl.max`` over ``-inf``-padded
  lanes plus a NaN flag (numpy semantics), both ``BR x 1`` row-level tensors that broadcast back over the tile.

Semantics follow ``kernel_ir.evaluate``; ``tanh`` and ``pow`` are spelled with ``tl.exp``/``tl.log`` (libdevice is
GPU-only: the interpreter has no libdevice), ``pow`` handling negative bases with integral exponents like C.
Indices are int32: fine for the small shapes this backend is checked on.

``build_triton(kernel)`` writes the source to a file (``@triton.jit`` reads its function's source from a file),
imports it and returns a callable. Without CUDA it runs under Triton's CPU interpreter: ``TRITON_INTERPRET=1``
must be set before triton is first imported (that is when ``tl.max``'s own helpers are decorated), so this module
sets it before importing triton and refuses (RuntimeError with the reason) when triton was imported too early.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os

import numpy as np

from .codegen_cpp import check_arrays, function_name
from .kernel_ir import FusedKernel
from .kernel_plan import Dim, KernelPlan, plan

MAX_BLOCK_COLS = 16384
TILE_ELEMENTS = 4096  # BR x BC of a reduction program; BLOCK of a point-wise one is 1024
TL_DTYPE = {"float32": "tl.float32", "float64": "tl.float64"}


def _literal(v: float) -> str:
    v = float(v)
    return f'float("{v}")' if math.isinf(v) or math.isnan(v) else repr(v)


def triton_expr(op: str, a: list[str], dt: str) -> str:
    """The Triton expression for one point-wise op (``dt``: ``tl.float32`` / ``tl.float64``)."""
    x = a[0] if a else ""
    nan_all = "propagate_nan=tl.PropagateNan.ALL"
    table = {
        "neg": f"-{x}",
        "exp": f"tl.exp({x})",
        "log": f"tl.log({x})",
        "sqrt": f"tl.sqrt({x})",
        "rsqrt": f"1.0 / tl.sqrt({x})",
        "tanh": f"1.0 - 2.0 / (tl.exp(2.0 * {x}) + 1.0)",
        "sigmoid": f"1.0 / (1.0 + tl.exp(-{x}))",
        "relu": f"tl.maximum({x}, tl.zeros_like({x}), {nan_all})",
        "abs": f"tl.abs({x})",
        "erf": f"tl.erf({x})",
        "recip": f"1.0 / {x}",
        "square": f"{x} * {x}",
    }
    if op in table:
        return table[op]
    b = a[1] if len(a) > 1 else ""
    infix = {"add": "+", "sub": "-", "mul": "*", "div": "/", "gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}
    if op in ("add", "sub", "mul", "div"):
        return f"{x} {infix[op]} {b}"
    if op in infix:
        return f"tl.where({x} {infix[op]} {b}, 1.0, 0.0).to({dt})"
    if op in ("max", "min"):
        return f"tl.{op}imum({x}, {b}, {nan_all})"
    if op == "pow":  # |x|^b, signed for a negative base with an integral exponent, NaN otherwise (like powf)
        p = f"tl.exp({b} * tl.log(tl.abs({x})))"
        odd = f"({b} - 2.0 * tl.floor({b} * 0.5)) == 1.0"
        neg = f"tl.where({b} == tl.floor({b}), tl.where({odd}, -{p}, {p}), float('nan'))"
        return f"tl.where({b} == 0.0, 1.0, tl.where({x} < 0.0, {neg}, {p})).to({dt})"
    if op == "where":
        return f"tl.where({x} != 0.0, {b}, {a[2]})"
    raise ValueError(f"op: no Triton form for {op!r}")


def _decompose(flat: str, dims: list[Dim]) -> list[str]:
    """Statements splitting the flat index ``flat`` into the indices of ``dims`` (row-major)."""
    out, inner = [], 1
    for i, d in enumerate(reversed(dims)):
        expr = flat if inner == 1 else f"({flat} // {inner})"
        out.append(f"{d.var} = {expr}" if i == len(dims) - 1 else f"{d.var} = {expr} % {d.extent}")
        inner *= d.extent
    return out[::-1]


def _offset(p: KernelPlan, strides: tuple[int, ...], zero: str) -> str:
    """``sum index_d * stride_d``; ``zero`` (a zero tensor of the block's shape) when nothing varies: a plain 0
    would make a scalar pointer, which ``tl.load`` refuses with a block mask."""
    terms = [d.var if s == 1 else f"{d.var} * {s}" for d, s in zip(p.dims, strides) if s]
    return " + ".join(terms) or zero


def block_sizes(kernel: FusedKernel) -> dict[str, int]:
    """The constexpr block sizes of ``kernel``'s program (``BLOCK``, or ``BR`` and ``BC``)."""
    if kernel.reduce_dims == 0:
        return {"BLOCK": 1024}
    bc = 1 << max(0, (kernel.cols - 1).bit_length())
    if bc > MAX_BLOCK_COLS:
        raise ValueError(
            f"kernel {kernel.name!r}: rows of {kernel.cols} elements; this backend keeps a row in one "
            f"block (at most {MAX_BLOCK_COLS})"
        )
    br = min(1 << max(0, (kernel.rows - 1).bit_length()), max(1, TILE_ELEMENTS // bc))
    return {"BR": br, "BC": bc}


def emit_triton(kernel: FusedKernel) -> str:
    """The Python source of a module holding ``kernel`` as one ``@triton.jit`` function."""
    p = plan(kernel)
    dt = TL_DTYPE[kernel.dtype]
    red = kernel.reduce_dims > 0
    params = [f"in{j}" for j in range(len(kernel.inputs))] + [f"out{j}" for j in range(len(kernel.outputs))]
    params += ["BR: tl.constexpr", "BC: tl.constexpr"] if red else ["BLOCK: tl.constexpr"]
    body = ["pid = tl.program_id(0)"]
    if red:
        body += ["row = pid * BR + tl.arange(0, BR)[:, None]", "col = tl.arange(0, BC)[None, :]"]
        body += [f"rmask = row < {kernel.rows}", f"mask = rmask & (col < {kernel.cols})"]
        body += _decompose("row", p.row_dims) + _decompose("col", p.red_dims)
        shape1 = "[1, 1]"
    else:
        body += ["e = pid * BLOCK + tl.arange(0, BLOCK)", f"mask = e < {math.prod(kernel.shape)}"]
        body += _decompose("e", p.dims)
        shape1 = "[1]"
    for ins in kernel.body:
        r = f"r{ins.out}"
        args = [f"r{a}" for a in ins.args]
        if ins.op == "load":
            off = _offset(p, p.in_strides[ins.attr], "(row + col) * 0" if red else "e * 0")
            body.append(f"{r} = tl.load(in{ins.attr} + ({off}), mask=mask, other=0.0).to({dt})")
        elif ins.op == "const":
            body.append(f"{r} = tl.full({shape1}, {_literal(ins.attr)}, {dt})")
        elif ins.op == "sum":
            body.append(f"{r} = tl.sum(tl.where(mask, {args[0]}, 0.0), axis=1, keep_dims=True).to({dt})")
        elif ins.op == "max_reduce":
            body.append(f"{r} = tl.max(tl.where(mask, {args[0]}, -float('inf')), axis=1, keep_dims=True)")
            flag = f"tl.max(tl.where(mask & ({args[0]} != {args[0]}), 1, 0), axis=1, keep_dims=True)"
            body.append(f"{r} = tl.where({flag} > 0, float('nan'), {r}).to({dt})")
        elif ins.op == "store":
            m = "rmask" if ins in p.row_stores else "mask"
            off = _offset(
                p, p.out_strides[ins.attr], ("row * 0" if m == "rmask" else "(row + col) * 0") if red else "e * 0"
            )
            body.append(f"tl.store(out{ins.attr} + ({off}), {args[0]}, mask={m})")
        else:
            body.append(f"{r} = {triton_expr(ins.op, args, dt)}")
    lines = [
        f'"""Generated by tinylearn.compiler.codegen_triton from FusedKernel {kernel.name!r} '
        f'({kernel.dtype}, domain {kernel.shape})."""',
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def {function_name(kernel)}({', '.join(params)}):",
        *("    " + s for s in body),
        "",
    ]
    return "\n".join(lines)


def _import_triton():
    """Import triton, in interpreter mode without CUDA; RuntimeError when that mode cannot be had."""
    if os.environ.get("TRITON_INTERPRET") is None:
        from ..backends import cuda_available

        if not cuda_available():
            os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language.standard as std
        from triton.runtime.jit import JITFunction
    except Exception as e:  # noqa: BLE001 - any import failure means: no triton here
        raise RuntimeError(f"triton is not usable: {type(e).__name__}: {e}") from e
    helper = getattr(std, "max", None)
    if os.environ.get("TRITON_INTERPRET") == "1" and type(helper) is JITFunction:
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set (torch imports it lazily); "
            "import tinylearn.compiler.codegen_triton first or export TRITON_INTERPRET=1 before starting Python"
        )
    return triton


class TritonKernel:
    """``kernel`` as a Triton program: call it with numpy arrays, get numpy arrays (runs on CUDA or the interpreter)."""

    def __init__(self, kernel: FusedKernel, source: str, fn, interpreted: bool) -> None:
        self.kernel, self.source, self.fn, self.interpreted = kernel, source, fn, interpreted
        self.blocks = block_sizes(kernel)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        import torch

        k = self.kernel
        device = "cpu" if self.interpreted else "cuda"
        ins = [torch.from_numpy(a).to(device) for a in check_arrays(k, arrays)]
        outs = [torch.empty(b.shape, dtype=getattr(torch, k.dtype), device=device) for b in k.outputs]
        if k.reduce_dims:
            grid = (max(1, -(-k.rows // self.blocks["BR"])),)
        else:
            grid = (max(1, -(-math.prod(k.shape) // self.blocks["BLOCK"])),)
        self.fn[grid](*ins, *outs, **self.blocks)
        return [o.cpu().numpy() for o in outs]


def build_triton(kernel: FusedKernel) -> TritonKernel:
    """Emit, write, import and wrap ``kernel``'s Triton program (RuntimeError when triton is not usable)."""
    source = emit_triton(kernel)
    block_sizes(kernel)  # a row too long for one block: ValueError before any import
    _import_triton()
    from .cc import cache_dir

    folder = cache_dir() / "triton"
    folder.mkdir(exist_ok=True)
    path = folder / f"{function_name(kernel)}_{hashlib.sha256(source.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return TritonKernel(
        kernel, source, getattr(module, function_name(kernel)), os.environ.get("TRITON_INTERPRET") == "1"
    )
