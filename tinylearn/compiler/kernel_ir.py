"""The fused-kernel IR: what fusion (``fusion.py``) hands to the code generators (``codegen_*.py``).

A ``FusedKernel`` is one loop nest over an iteration domain ``shape``. Its body is a three-address program in SSA
form (``Instr``: register ``out`` = ``op``(registers ``args``), like tinygrad's UOps or a linear Inductor body):

    domain   shape = (d_0, ..., d_{n-1}); the last ``reduce_dims`` dims are reduced (0: a pure point-wise kernel)
             rows = prod(shape[:n - reduce_dims]), cols = prod(shape[n - reduce_dims:])
    loads    ``load`` reads input ``attr`` at the current index: offset = sum_d index_d * input.strides[d]
             (strides in elements over the *domain* dims; 0 where the input is broadcast)
    reduce   ``sum`` / ``max`` of an element-level register over the reduced dims -> a row-level register;
             every register computed only from row-level registers and constants is row-level too
    stores   ``store`` writes register ``args[0]`` to output ``attr``; an output has the domain shape, or (for a
             row-level register) the domain shape with the reduced dims set to 1 (e.g. LayerNorm's mean/rstd)

Semantics (the contract every backend meets, checked against ``evaluate`` below): compute in ``dtype`` (float32
or float64; inputs are converted on load, outputs are written in ``dtype``); a reduction sees every element of its
row; ``div`` is IEEE division; ``max``/``min`` propagate NaN like numpy's maximum/minimum. Point-wise registers that
a reduction and a later store both need may be recomputed (Inductor does this) or kept — either is legal.

Ops and their arity: ``UNARY`` (1), ``BINARY`` (2), ``where`` (3: cond != 0 ? a : b), ``load``/``const`` (0, value
in ``attr``), ``sum``/``max_reduce`` (1), ``store`` (1, output index in ``attr``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "erf", "recip", "square")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow", "gt", "ge", "lt", "le", "eq")
REDUCE = ("sum", "max_reduce")
OPS = (*UNARY, *BINARY, "where", "load", "const", *REDUCE, "store")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Buffer:
    """An input or output of a kernel: its own shape and dtype, and its element strides over the domain dims."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]  # one per domain dim, in elements; 0 = broadcast along that dim


@dataclass(frozen=True)
class Instr:
    out: int  # the register this instruction defines (-1 for store)
    op: str
    args: tuple[int, ...] = ()
    attr: Any = None  # load: input index; const: the value; store: output index


@dataclass
class FusedKernel:
    name: str
    shape: tuple[int, ...]
    reduce_dims: int
    inputs: list[Buffer]
    outputs: list[Buffer]
    body: list[Instr]
    dtype: str = "float32"
    meta: dict[str, Any] = field(default_factory=dict)  # provenance: the graph nodes fused into this kernel

    @property
    def rows(self) -> int:
        return math.prod(self.shape[: len(self.shape) - self.reduce_dims])

    @property
    def cols(self) -> int:
        return math.prod(self.shape[len(self.shape) - self.reduce_dims :])

    def row_level(self) -> set[int]:
        """The registers that hold one value per row (reductions and what is computed only from them)."""
        row: set[int] = set()
        for ins in self.body:
            if (
                ins.op in REDUCE
                or (ins.op == "const")
                or (ins.op in (*UNARY, *BINARY, "where") and all(a in row for a in ins.args))
            ):
                row.add(ins.out)
        return row

    def validate(self) -> None:
        """Raise ValueError naming the first malformed part (unknown op, register used before definition, ...)."""
        if self.dtype not in DTYPES:
            raise ValueError(f"FusedKernel.dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if not 0 <= self.reduce_dims <= len(self.shape):
            raise ValueError(f"FusedKernel.reduce_dims: must be in [0, {len(self.shape)}], got {self.reduce_dims}")
        for b in (*self.inputs, *self.outputs):
            if len(b.strides) != len(self.shape):
                raise ValueError(f"buffer {b.name!r}: {len(b.strides)} strides for a {len(self.shape)}-d domain")
        defined: set[int] = set()
        arity = {**dict.fromkeys(UNARY, 1), **dict.fromkeys(BINARY, 2), "where": 3, "load": 0, "const": 0}
        arity.update({"sum": 1, "max_reduce": 1, "store": 1})
        for i, ins in enumerate(self.body):
            if ins.op not in arity:
                raise ValueError(f"instruction {i}: unknown op {ins.op!r}")
            if len(ins.args) != arity[ins.op]:
                raise ValueError(f"instruction {i} ({ins.op}): {len(ins.args)} args, expected {arity[ins.op]}")
            missing = [a for a in ins.args if a not in defined]
            if missing:
                raise ValueError(f"instruction {i} ({ins.op}): register(s) {missing} used before definition")
            if ins.op == "load" and not 0 <= ins.attr < len(self.inputs):
                raise ValueError(f"instruction {i}: load of input {ins.attr!r}, kernel has {len(self.inputs)}")
            if ins.op == "store" and not 0 <= ins.attr < len(self.outputs):
                raise ValueError(f"instruction {i}: store to output {ins.attr!r}, kernel has {len(self.outputs)}")
            if ins.op != "store":
                if ins.out in defined:
                    raise ValueError(f"instruction {i}: register {ins.out} defined twice (the body is SSA)")
                defined.add(ins.out)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


_NP_UNARY = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "abs": np.abs,
    "erf": _erf,
    "recip": lambda x: 1 / x,
    "square": np.square,
}
_NP_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
    "gt": np.greater,
    "ge": np.greater_equal,
    "lt": np.less,
    "le": np.less_equal,
    "eq": np.equal,
}


def evaluate(kernel: FusedKernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run ``kernel`` with numpy: the reference semantics (and the compiler's ``numpy`` backend)."""
    kernel.validate()
    if len(arrays) != len(kernel.inputs):
        raise ValueError(f"arrays: kernel {kernel.name!r} takes {len(kernel.inputs)} inputs, got {len(arrays)}")
    dt = np.dtype(kernel.dtype)
    n, k = len(kernel.shape), kernel.reduce_dims
    axes = tuple(range(n - k, n))
    regs: dict[int, np.ndarray] = {}
    outs: list[np.ndarray | None] = [None] * len(kernel.outputs)
    with np.errstate(all="ignore"):
        for ins in kernel.body:
            a = [regs[r] for r in ins.args]
            if ins.op == "load":
                buf, x = kernel.inputs[ins.attr], arrays[ins.attr]
                if tuple(x.shape) != buf.shape:
                    raise ValueError(f"arrays[{ins.attr}]: shape {x.shape}, kernel expects {buf.shape}")
                view = np.lib.stride_tricks.as_strided(
                    np.ascontiguousarray(x, dtype=dt), kernel.shape, [s * dt.itemsize for s in buf.strides]
                )
                regs[ins.out] = view
            elif ins.op == "const":
                regs[ins.out] = np.asarray(ins.attr, dtype=dt)
            elif ins.op in _NP_UNARY:
                regs[ins.out] = _NP_UNARY[ins.op](a[0]).astype(dt, copy=False)
            elif ins.op in _NP_BINARY:
                regs[ins.out] = _NP_BINARY[ins.op](a[0], a[1]).astype(dt, copy=False)
            elif ins.op == "where":
                regs[ins.out] = np.where(a[0] != 0, a[1], a[2]).astype(dt, copy=False)
            elif ins.op == "sum":
                regs[ins.out] = np.broadcast_to(a[0], kernel.shape).sum(axis=axes, keepdims=True, dtype=dt)
            elif ins.op == "max_reduce":
                regs[ins.out] = np.broadcast_to(a[0], kernel.shape).max(axis=axes, keepdims=True)
            elif ins.op == "store":
                buf = kernel.outputs[ins.attr]
                outs[ins.attr] = np.ascontiguousarray(np.broadcast_to(a[0], buf.shape), dtype=dt)
    missing = [kernel.outputs[i].name for i, o in enumerate(outs) if o is None]
    if missing:
        raise ValueError(f"kernel {kernel.name!r}: outputs {missing} are never stored")
    return outs  # type: ignore[return-value]
