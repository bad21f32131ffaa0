"""Exercises for notebook 12 (a small deep-learning compiler). Replace each ``raise NotImplementedError`` with your
code, then run

    pytest exercises/12_compiler                  # your answers
    pytest exercises/12_compiler --impl=reference

The graph exercises work on ``tinylearn.compiler.Graph`` (``graph.nodes`` in execution order; a call node has
``.kind == "call"``, ``.op`` (the Function class name, e.g. "Add", "Mul", "GELU", "MatMul"), ``.target`` (the
class), ``.args`` (input ``Node``s and plain literals), ``.kwargs``, ``.shape``, ``.nbytes``; ``graph.outputs``;
``graph.replace_all_uses(old, new)``; ``graph.users()`` -> {node: [nodes reading it]}).

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

POINTWISE = {"Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "ReLU", "GELU", "Abs"}


def cse(graph: Any) -> int:
    """Remove common subexpressions from ``graph`` in place; return the number of nodes removed.

    Two call nodes compute the same value when they have the same op (``node.target``), the same input nodes (by
    identity) in the same order and equal literal arguments/kwargs. Keep the first, point every user of the later
    one at it (``graph.replace_all_uses``), and drop the later one from ``graph.nodes``. Note that after a
    replacement, nodes further down may become duplicates too (one pass in execution order catches them).
    """
    raise NotImplementedError("reference solution: tinylearn/compiler/passes/cse.py:run")


def fusion_groups(graph: Any) -> list[list[str]]:
    """Group the point-wise call nodes (``node.op in POINTWISE``) of ``graph`` into fused kernels; return each
    group as the list of its node names in execution order, groups in the order of their first node.

    Rule (greedy, in execution order): a point-wise node joins the group of one of its inputs when that input is
    in a group and joining creates no cycle (no other input of the node depends, through a node outside the
    group, on the group: e.g. a MatMul reading the group and feeding this node); else it starts a new group.
    Non-point-wise nodes (MatMul, Linear, ...) are never in a group: they split chains.
    """
    raise NotImplementedError("reference solution: tinylearn/compiler/fusion.py:plan")


def recompute_cheaper(
    producer_nbytes: int, n_readers: int, cone_ops: int, leaf_nbytes: int, numel: int, flop_cost: float = 1.0
) -> bool:
    """Should a point-wise producer read by ``n_readers`` other kernels be recomputed inside each of them?

    Storing it costs one write plus one read per reader: ``producer_nbytes * (1 + n_readers)`` bytes.
    Recomputing costs, per reader, reading the producer's leaf inputs again (``leaf_nbytes``) plus its ``cone_ops``
    point-wise ops on ``numel`` elements, each op weighted as ``flop_cost`` bytes of traffic. Recompute when that
    is strictly cheaper.
    """
    raise NotImplementedError("reference solution: tinylearn/compiler/fusion.py:recompute_cheaper")


def row_reduce(x: np.ndarray, op: str) -> np.ndarray:
    """Reduce a C-contiguous float32 [rows, cols] array over its last axis with ``op`` = "sum" or "max" by
    generating C++ source, compiling it with ``tinylearn.compiler.cc.load(source, name)`` (returns a
    ``ctypes.CDLL``) and calling your ``extern "C"`` function with ctypes pointers. Return a float32 [rows] array.
    "max" must propagate NaN like ``np.max`` (a row with a NaN gives NaN). Raise ValueError naming ``op`` for any
    other op.
    """
    raise NotImplementedError("reference solution: tinylearn/compiler/codegen_cpp.py:build (+ kernel_ir.py)")


def list_schedule(block: list, machine: Any) -> list[int]:
    """Issue cycle of each op of ``block`` (``tinylearn.compiler.listsched.Op``s) on ``machine``.

    Build the dependence DAG with ``listsched.build_dag(block, machine)`` (``dag.preds()``: per op, the list of
    (predecessor, latency) pairs; ``dag.heights()``: latency-weighted longest path to the exit; ``dag.unit[i]``:
    the functional unit op i needs). Each cycle, among the ops whose predecessors' results are ready, issue those
    with the greatest height first, at most ``machine.issue_width`` per cycle and at most ``machine.units[u]`` per
    unit u per cycle.
    """
    raise NotImplementedError("reference solution: tinylearn/compiler/listsched.py:list_schedule")
