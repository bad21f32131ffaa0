"""Reference answers for exercises/12_compiler: thin calls into tinylearn.compiler."""

from __future__ import annotations

from typing import Any

import numpy as np

from tinylearn.compiler import codegen_cpp, fusion, listsched
from tinylearn.compiler.kernel_ir import Buffer, FusedKernel, Instr
from tinylearn.compiler.passes import cse as cse_pass

POINTWISE = {"Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "ReLU", "GELU", "Abs"}


def cse(graph: Any) -> int:
    return cse_pass.run(graph).changed


def fusion_groups(graph: Any) -> list[list[str]]:
    plan = fusion.plan(graph)
    return [[n.name for n in g.nodes] for g in plan.groups]


def recompute_cheaper(
    producer_nbytes: int, n_readers: int, cone_ops: int, leaf_nbytes: int, numel: int, flop_cost: float = 1.0
) -> bool:
    return fusion.recompute_cheaper(producer_nbytes, n_readers, cone_ops, leaf_nbytes, numel, flop_cost)


def row_reduce(x: np.ndarray, op: str) -> np.ndarray:
    if op not in ("sum", "max"):
        raise ValueError(f"op: expected 'sum' or 'max', got {op!r}")
    rows, cols = x.shape
    red = "sum" if op == "sum" else "max_reduce"
    kernel = FusedKernel(
        f"row_{op}",
        (rows, cols),
        1,
        [Buffer("x", (rows, cols), "float32", (cols, 1))],
        [Buffer("out", (rows, 1), "float32", (1, 0))],
        [Instr(0, "load", (), 0), Instr(1, red, (0,)), Instr(-1, "store", (1,), 0)],
    )
    return codegen_cpp.build(kernel)(x)[0].reshape(rows)


def list_schedule(block: list, machine: Any) -> list[int]:
    return list(listsched.list_schedule(block, machine).start)
