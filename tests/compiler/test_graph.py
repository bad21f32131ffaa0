"""Graph IR: the table print, copies, use replacement, structural hashing."""

from __future__ import annotations

import numpy as np

import tinylearn as tl
from tinylearn.compiler import trace
from tinylearn.compiler.graph import Graph, Node


def _x(*shape: int) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32))


def test_table_lists_every_node_with_shape_and_dtype():
    g = trace(lambda x: (x * 2.0).exp().sum(-1), _x(3, 4))
    text = g.table()
    lines = text.splitlines()
    assert lines[0].split() == ["#", "name", "kind", "op", "inputs", "shape", "dtype"]
    assert [n.op for n in g.nodes] == ["placeholder", "Mul", "Exp", "Sum"]
    assert "%mul, " not in text and "%x0, 2" in text  # Mul's inputs: the placeholder and the literal
    assert "[3]" in lines[-2] and "float32" in lines[-2]  # Sum's row: shape [3]
    assert lines[-1] == "output (single): %sum"
    assert str(g) == text


def test_copy_is_deep_in_structure_and_hash_is_stable():
    g = trace(lambda x: x.exp() + x, _x(2, 3))
    c = g.copy()
    assert [n.op for n in c.nodes] == [n.op for n in g.nodes]
    assert all(a is not b for a, b in zip(c.nodes, g.nodes))
    assert c.signature() == g.signature()
    c.nodes[1].op = "Log"  # a structural change changes the hash
    assert c.signature() != g.signature()


def test_replace_all_uses_rewires_args_and_outputs():
    g = Graph()
    x = g.add(Node("x", "placeholder", "placeholder", 0, shape=(2,), dtype=np.float32))
    y = g.add(Node("y", "placeholder", "placeholder", 1, shape=(2,), dtype=np.float32))
    a = g.add(Node("a", "call", "Add", None, (x, x), shape=(2,), dtype=np.float32))
    g.outputs = [x]
    assert g.replace_all_uses(x, y) == 3
    assert a.args == (y, y) and g.outputs == [y]
    assert g.users()[y] == [a, a]
