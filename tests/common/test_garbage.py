"""Hypothesis garbage input, driven by the topic table: every package of every topic row gets representative public
calls with one argument replaced by drawn garbage.

One entry per call (``CALLS[package]``): a statement with ``g`` in the place of one argument, the argument's name
and the kinds of garbage to draw for it (``ints``, ``reals``, ``arrays``, ``names``, ``callables`` or a custom
table). Each kind splits into categories (NaN/inf, floats where an int is expected, bools, strings, None, negative
and huge ints, nested lists, wrong-rank, complex and 0-size arrays, unknown names, numpy scalars) and each
(call, category) pair is one test, so a known bug is pinned to exactly the category that shows it.

Property, per draw:
- an invalid draw raises a built-in TypeError / ValueError / IndexError / RuntimeError (MemoryError too for a
  memory request) whose message names the argument;
- a valid draw (a numpy integer where an int is expected, a numpy float where a float is) succeeds and gives the
  same result as the plain Python number;
- a 0-size array either succeeds or raises as above.

Every call runs in one long-lived child interpreter (restarted after a death) with a per-call limit, so a segfault,
an abort or a hang in a C++ or numba kernel fails that one test, naming the call and the garbage, instead of
killing or stalling the run. Draws are derandomized: the suite is deterministic, and a ``KNOWN`` entry (a bug in a
package another change owns) is a strict xfail that turns red once fixed.

Complements tests/common/test_bad_input.py (hand-picked rows per package); a topic package without entries here
fails ``test_every_topic_row_has_garbage_calls``, naming the row.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_bad_input import _topic_packages

from tinylearn.topics import TOPICS

# Known bugs in packages owned by other changes (issue 38): "<call id>:<category>" -> what happens. Each is a strict
# xfail: the test runs, and once the bug is fixed it passes and the strict xfail fails: then drop the entry.
KNOWN: dict[str, str] = {}

PER_CALL_S = 15  # one call in the child (a hang fails the test after this)
START_S = 180  # the child's imports (every topic package) on a loaded machine
FAST = settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],  # no shrinking: the first failing draw is reported as drawn (and quickly)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ERRORS = ("TypeError", "ValueError", "IndexError", "RuntimeError")
NP_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.intp)

# ------------------------------------------------------------------------------------------------- garbage kinds
NAN_INF = st.sampled_from([math.nan, math.inf, -math.inf])
NESTED = st.recursive(st.integers(0, 3), lambda c: st.lists(c, max_size=3), max_leaves=6).filter(
    lambda v: isinstance(v, list)
)
TEXT = st.text(max_size=4)


def _np_ints(valid: tuple[int, ...]) -> st.SearchStrategy:
    def fits(t: type, v: int) -> bool:
        info = np.iinfo(t)
        return info.min <= v <= info.max

    pairs = [(t, v) for t in NP_INTS for v in valid if fits(t, v)]
    return st.sampled_from(pairs).map(lambda p: p[0](p[1]))


def ints(
    lo: int | None = 0,
    hi: int | None = None,
    *,
    valid: tuple[int, ...] = (1, 2),
    huge: bool = True,
    none_ok: bool = False,
    lists: list[Any] | None = None,
) -> dict[str, st.SearchStrategy]:
    """Garbage for an int argument valid in [lo, hi] (None: unbounded); ``valid`` values (in range) feed the numpy-int
    draws; ``huge``: ints past 2**40 are garbage (False where a huge value is valid: a stride, a capped block size);
    ``lists``: the invalid lists where some lists are valid (a pair, a tuple of dims; default: any nested list)."""
    cats: dict[str, st.SearchStrategy] = {
        "float": st.floats(-1e6, 1e6),  # integral floats (2.0) too: torch refuses them where it wants an int
        "nan_inf": NAN_INF,
        "bool": st.booleans(),
        "str": TEXT,
        "np_int": _np_ints(valid),
    }
    if not none_ok:
        cats["none"] = st.none()
    cats["list"] = NESTED if lists is None else st.sampled_from(lists)
    if lo is not None:
        cats["below"] = st.integers(lo - 2**64, lo - 1)
    if hi is not None:
        cats["above"] = st.integers(hi + 1, hi + 2**64)
    elif huge:
        cats["huge"] = st.integers(2**40, 2**80)
    return cats


def reals(
    lo: float | None = 0.0,
    hi: float | None = None,
    *,
    lo_ok: bool = False,
    hi_ok: bool = True,
    inf_ok: bool = False,
    none_ok: bool = False,
    valid: tuple[float, ...] = (0.5,),
) -> dict[str, st.SearchStrategy]:
    """Garbage for a float argument valid in (lo, hi] (``lo_ok``/``hi_ok``: the bound itself is valid)."""
    cats: dict[str, st.SearchStrategy] = {
        "nan_inf": st.just(math.nan) if inf_ok else NAN_INF,
        "str": TEXT,
        "list": NESTED,
        "np_float": st.tuples(st.sampled_from([np.float32, np.float64]), st.sampled_from(valid)).map(
            lambda p: p[0](p[1])
        ),
    }
    if not none_ok:
        cats["none"] = st.none()
    if lo is not None:
        cats["below"] = st.floats(-1e30, lo, exclude_max=lo_ok)
    if hi is not None:
        cats["above"] = st.floats(hi, 1e30, exclude_min=hi_ok)
    return cats


def arrays(
    shape: tuple[int, ...],
    ranks: tuple[int, ...] | None = None,
    *,
    complex_bad: bool = True,
    empty: bool = True,
) -> dict[str, st.SearchStrategy]:
    """Garbage for an array argument of this (valid) shape; ``ranks``: the valid ranks (None: any)."""
    cats: dict[str, st.SearchStrategy] = {
        "str": st.sampled_from(["abc", "", np.full(shape, "a")]),
        "none": st.none(),
        "ragged": st.sampled_from([[1.0, [2.0, 3.0]], [[1.0, 2.0], [3.0]], [[1.0], "a"], {"a": 1}]),
    }
    if ranks is not None:
        bad = [r for r in range(6) if r not in ranks]
        cats["wrong_rank"] = st.sampled_from(bad).map(lambda r: np.ones((2,) * r, np.float32))
    if complex_bad:
        cats["complex"] = st.just(np.ones(shape, np.complex64))
    if empty and shape:
        cats["empty"] = st.integers(0, len(shape) - 1).map(
            lambda i: np.ones(tuple(0 if j == i else d for j, d in enumerate(shape)), np.float32)
        )
    return cats


def names(valid: tuple[str, ...] = ()) -> dict[str, st.SearchStrategy]:
    """Garbage for a name (a str from a fixed set): an unknown name, an int, None."""
    unknown = st.text(alphabet="jkwyzJ!-_ é", max_size=6).filter(lambda s: s not in valid)
    return {"unknown": unknown, "int": st.integers(-5, 5), "none": st.none()}


def callables() -> dict[str, st.SearchStrategy]:
    return {"int": st.integers(-5, 5), "str": TEXT, "none": st.none()}


def pick(**cats: list[Any]) -> dict[str, st.SearchStrategy]:
    """A custom kind: category -> the values to draw from."""
    return {name: st.sampled_from(values) for name, values in cats.items()}


VALID_CATEGORIES = ("np_int", "np_float")  # must succeed and equal the plain-number call
MAYBE_CATEGORIES = ("empty",)  # may succeed (a 0-size result) or raise a clean error


class Call(NamedTuple):
    id: str  # "<package>.<function>/<argument>"
    stmt: str  # an expression with ``g`` in the argument's place (``np`` and ``tl`` are in scope)
    arg: str  # the argument name the error message must contain
    kind: dict[str, st.SearchStrategy]
    setup: str = ""  # runs first in the same namespace (must not raise)
    view: str = "r"  # what to compare for a valid draw (``r``: the result; objects: a field of it)
    memory: bool = False  # a memory request: MemoryError is a clean error too


# ---------------------------------------------------------------------------------------------- the calls table
_X4 = "x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)"
_LIN = "m = tl.nn.Linear(3, 2)"
_OPT = "opt = tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=0.1)"
_PROBS = "p = np.array([0.1, 0.2, 0.3, 0.4])"
_QKV = "q = k = v = np.random.default_rng(0).standard_normal((1, 2, 9, 8)).astype(np.float32)"
_EYE = "s = tl.sparse.CSR.from_dense(np.eye(4, dtype=np.float32))"

_SERVE_SETUP = (
    "from tinylearn.serve import Engine\nfrom tinylearn.serve.checkpoint import tiny_model\nm = tiny_model(0)"
)
CALLS: dict[str, list[Call]] = {
    "bench": [
        Call(
            "bench.measure/repeat",
            "tl.bench.measure(lambda: None, repeat=g, warmup=0, warmup_s=0.0)",
            "repeat",
            ints(1, huge=False),
            view="len(r.times)",
        ),
        Call("bench.measure/fn", "tl.bench.measure(g, repeat=1, warmup=0)", "fn", callables()),
        Call("bench.run_topic/name", "tl.bench.run_topic(g)", "topic", names()),
    ],
    "testing": [
        Call("testing.make_array/shape", "tl.testing.make_array((2, g))", "shape", ints(0, huge=False)),
        Call("testing.make_array/dtype", "tl.testing.make_array((2,), dtype=g)", "dtype", names()),
        Call("testing.make_array/layout", "tl.testing.make_array((2, 2), layout=g)", "layout", names()),
        Call(
            "testing.tolerance/reduction_size",
            "tl.testing.tolerance('float32', g)",
            "reduction_size",
            ints(0, huge=False, none_ok=True),
        ),
    ],
    "autograd": [
        Call("autograd.zeros/shape", "tl.zeros(g, 3)", "shape", ints(0, huge=True), memory=True),
        Call(
            "autograd.sum/dim",
            "tl.Tensor(np.ones((2, 3))).sum(dim=g)",
            "dim",
            ints(-2, 1, valid=(-1, 0, 1), none_ok=True, lists=[[0, 0], [5], [[0]], [0.5]]),
        ),
        Call(
            "autograd.transpose/dim1",
            "tl.Tensor(np.ones((2, 3))).transpose(0, g)",
            "dim",
            ints(-2, 1, valid=(-1, 0, 1)),
        ),
        Call("autograd.arange/end", "tl.arange(0, g)", "end", reals(0.0, None, lo_ok=True, none_ok=True)),
        Call("autograd.Tensor/data", "tl.Tensor(g)", "data", arrays((2, 3), complex_bad=False, empty=False)),
    ],
    "nn": [
        Call("nn.Linear/in_features", "tl.nn.Linear(g, 2)", "in_features", ints(1), view="r.weight.shape"),
        Call(
            "nn.Conv2d/kernel_size",
            "tl.nn.Conv2d(1, 1, g)",
            "kernel_size",
            ints(1, lists=[[], [1, 2, 3], [[1], [1]], [1.5, 1]]),
            view="r.weight.shape",
        ),
        Call("nn.Dropout/p", "tl.nn.Dropout(g)", "p", reals(0.0, 1.0, lo_ok=True), view="r.p"),
        Call(
            "nn.functional.softmax/dim",
            "tl.nn.functional.softmax(tl.Tensor(np.ones((2, 3))), dim=g)",
            "dim",
            ints(-2, 1, valid=(-1, 0, 1), none_ok=True),  # None: torch's legacy implicit dim
        ),
    ],
    "optim": [
        Call("optim.SGD/lr", "tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=g)", "lr", reals(0.0, lo_ok=True)),
        Call(
            "optim.Adam/betas",
            "tl.optim.Adam([tl.nn.Parameter(np.ones(2))], betas=g)",
            "betas",
            pick(
                short=[(0.9,), (), (0.9, 0.99, 0.999)],
                nan=[(math.nan, 0.9), (0.9, math.nan)],
                out_of_range=[(1.0, 0.9), (-0.1, 0.9), (0.9, 1.5)],
                str=["ab", ("a", 0.9)],
                none=[None],
            ),
        ),
        Call(
            "optim.StepLR/step_size",
            "tl.optim.StepLR(opt, g)",
            "step_size",
            ints(1, huge=False, valid=(1, 3)),
            setup=_OPT,
            view="[(r.step(), r.get_last_lr())[1] for _ in range(4)]",
        ),
    ],
    "data": [
        Call(
            "data.DataLoader/batch_size",
            "tl.data.DataLoader(np.ones((5, 2)), np.ones(5), batch_size=g)",
            "batch_size",
            ints(1, huge=False, valid=(1, 2, 3)),
            view="[b[0].shape for b in r]",
        ),
        Call(
            "data.train_test_split/test_size",
            "tl.data.train_test_split(np.ones((8, 2)), np.ones(8), test_size=g)",
            "test_size",
            reals(0.0, 1.0, hi_ok=False),
        ),
        Call(
            "data.DataLoader/X",
            "tl.data.DataLoader(g, np.ones(2))",
            "X",
            arrays((2, 3), complex_bad=False, empty=False),
        ),
    ],
    "conv": [
        Call("conv.im2col/kernel_size", "tl.conv.im2col(x, g)", "kernel_size", ints(1, 6), setup=_X4),
        Call("conv.im2col/stride", "tl.conv.im2col(x, 2, stride=g)", "stride", ints(1, huge=False), setup=_X4),
        Call(
            "conv.im2col/padding-cpp",
            "tl.conv.im2col(x, 2, padding=g, backend='cpp')",
            "padding",
            ints(0),
            setup=_X4,
        ),
        Call("conv.im2col/x", "tl.conv.im2col(g, 2)", "x", arrays((1, 2, 6, 6), ranks=(3, 4))),
        Call(
            "conv.conv2d/groups",
            "tl.conv.conv2d(x, np.ones((2, 1, 3, 3), np.float32), groups=g)",
            "groups",
            ints(1, valid=(2,)),
            setup=_X4,
        ),
    ],
    "quant": [
        Call("quant.quantize/scale", "tl.quant.quantize(np.ones(4, np.float32), g, 0)", "scale", reals(0.0)),
        Call(
            "quant.quantize/zero_point",
            "tl.quant.quantize(np.ones(4, np.float32), 0.1, g)",
            "zero_point",
            ints(-128, 127, valid=(0, 3)),
        ),
        Call(
            "quant.quantize/zero_point-cpp",
            "tl.quant.quantize(np.ones(4, np.float32), 0.1, g, backend='cpp')",
            "zero_point",
            ints(-128, 127, valid=(0, 3)),
        ),
        Call("quant.quantize/x", "tl.quant.quantize(g, 0.1, 0)", "x", arrays((4, 5))),
        Call(
            "quant.quantize_groupwise/group_size",
            "tl.quant.quantize_groupwise(np.ones((2, 8), np.float32), group_size=g)",
            "group_size",
            ints(1, valid=(2, 4)),
        ),
    ],
    "prune": [
        Call(
            "prune.l1_unstructured/amount",
            "tl.prune.l1_unstructured(m, 'weight', g)",
            "amount",
            reals(0.0, 1.0, lo_ok=True),
            setup=_LIN,
            view="r.weight.numpy()",
        ),
        Call(
            "prune.l1_unstructured/amount-count",
            "tl.prune.l1_unstructured(m, 'weight', g)",
            "amount",
            {"above": st.integers(7, 2**64), "below": st.integers(-(2**64), -1), "np_int": _np_ints((0, 2, 6))},
            setup=_LIN,
            view="r.weight.numpy()",
        ),
        Call("prune.n_m_mask/n", "tl.prune.n_m_mask(np.ones((2, 8)), n=g, m=4)", "n", ints(0, 4, valid=(1, 2))),
        Call(
            "prune.sparsity/module_or_array",
            "tl.prune.sparsity(g)",
            "module_or_array",
            arrays((4, 5), complex_bad=False),
        ),
    ],
    "sparse": [
        Call("sparse.CSR.from_dense/a", "tl.sparse.CSR.from_dense(g)", "a", arrays((4, 5), ranks=(2,))),
        Call(
            "sparse.BSR.from_dense/block_size",
            "tl.sparse.BSR.from_dense(np.ones((4, 4)), g)",
            "block_size",
            ints(1, 4, valid=(1, 2, 4)),
            view="r.to_dense()",
        ),
        *[
            Call(
                f"sparse.CSR.matmul/dense-{backend}",
                f"s.matmul(g, backend={backend!r})",
                "dense",
                arrays((4, 3), ranks=(1, 2)),
                setup=_EYE,
            )
            for backend in ("numba", "cpp")
        ],
    ],
    "kernels": [
        Call(
            "kernels.softmax/dim",
            "tl.kernels.softmax(np.ones((2, 3), np.float32), dim=g)",
            "dim",
            ints(-2, 1, valid=(-1, 0, 1)),
        ),
        Call("kernels.softmax/x", "tl.kernels.softmax(g)", "x", arrays((2, 3))),
        *[
            Call(
                f"kernels.flash_attention/block_size-{backend}",
                f"tl.kernels.flash_attention(q, k, v, block_size=g, backend={backend!r})",
                "block_size",
                ints(1, huge=False, valid=(4, 16)),  # a huge block is capped
                setup=_QKV,
            )
            for backend in ("cpu", "cpp")
        ],
        Call(
            "kernels.layer_norm/eps",
            "tl.kernels.layer_norm(np.ones((2, 3), np.float32), np.ones(3, np.float32), None, eps=g)",
            "eps",
            reals(0.0, lo_ok=True, inf_ok=True, valid=(1e-5, 0.5)),
        ),
    ],
    "dist": [
        Call("dist.simulate/world_size", "tl.dist.simulate('ring', g, 1e6)", "world_size", ints(1, huge=False)),
        Call("dist.simulate/algorithm", "tl.dist.simulate(g, 4, 1e6)", "algorithm", names()),
        Call("dist.ring_schedule/rank", "tl.dist.ring_schedule(g, 0, 4)", "rank", ints(0, 3)),
        Call("dist.bounds/parts", "tl.dist.bounds(10, g)", "parts", ints(1, huge=False, valid=(1, 3))),
        Call(
            "dist.predict/nbytes",
            "tl.dist.cost_model.predict('ring', g, 4, 1e-5, 1e-10)",
            "nbytes",
            reals(0.0, lo_ok=True, valid=(1024.0,)),
        ),
    ],
    "memory": [
        *[
            Call(
                f"memory.FirstFitAllocator.malloc/nbytes-{backend}",
                "a.malloc(g)",
                "nbytes",
                ints(1, valid=(1, 64)),
                setup=f"a = tl.memory.FirstFitAllocator(1 << 16, backend={backend!r})",
                memory=True,
            )
            for backend in ("python", "cpp")
        ],
        Call(
            "memory.BuddyAllocator/capacity",
            "tl.memory.BuddyAllocator(g)",
            "capacity",
            ints(1, huge=False, valid=(1024, 4096)),
            view="r.stats()",
        ),
        Call("memory.align_up/a", "tl.memory.align_up(5, g)", "a", ints(1, huge=False, valid=(4, 64))),
        Call("memory.plan/size", "tl.memory.plan([(g, 0, 1), (8, 1, 2)])", "size", ints(0, huge=False)),
    ],
    "gemm": [
        Call("gemm.matmul/a", "tl.gemm.matmul(g, np.ones((3, 2), np.float32))", "a", arrays((4, 3), ranks=(2,))),
        Call(
            "gemm.matmul/a-cpp",
            "tl.gemm.matmul(g, np.ones((3, 2), np.float32), backend='cpp')",
            "a",
            arrays((4, 3), ranks=(2,)),
        ),
        Call(
            "gemm.occupancy/threads_per_block",
            "tl.gemm.occupancy(g, 32, 0)",
            "threads_per_block",
            ints(1, valid=(128, 256)),
        ),
        Call("gemm.pack_a/mr", "tl.gemm.pack_a(np.ones((4, 4), np.float32), g)", "mr", ints(1, valid=(2, 4))),
        Call("gemm.roofline/flops", "tl.gemm.roofline(g, 1e6, 100.0, 10.0)", "flops", reals(0.0, lo_ok=True)),
    ],
    "inference": [
        Call(
            "inference.top_k_filter/k",
            "tl.inference.top_k_filter(p, g)",
            "k",
            ints(1, huge=False, valid=(1, 3)),
            setup=_PROBS,
        ),
        Call("inference.top_p_filter/top_p", "tl.inference.top_p_filter(p, g)", "top_p", reals(0.0, 1.0), setup=_PROBS),
        Call(
            "inference.sample_from/probs",
            "tl.inference.sample_from(g, np.random.default_rng(0))",
            "probs",
            {
                **arrays((4,), ranks=(1,), empty=False),
                **pick(
                    nan=[np.array([0.5, np.nan, 0.5, 0.0])],
                    negative=[np.array([0.5, -0.5, 0.5, 0.5])],
                    all_zero=[np.zeros(4)],
                ),
            },
        ),
        Call(
            "inference.generate/prompt_ids",
            "tl.inference.generate(lm, g, 2)",
            "prompt_ids",
            pick(
                float=[[1.7, 2.9], [1.0, 2.0]],
                bool=[[True, False]],
                str=["ab", ["a", "b"]],
                out_of_range=[[0, 8], [-1, 2]],
                none=[None],
                nested=[[[1, 2]]],
                np_int=[[np.int64(1), np.int32(2)]],
            ),
            setup="lm = tl.inference.TableLM(np.random.default_rng(0).standard_normal((8, 8)))",
        ),
        Call(
            "inference.blocks_needed/block_size", "tl.inference.blocks_needed(10, g)", "block_size", ints(1, huge=False)
        ),
    ],
    "parallel": [
        Call(
            "parallel.bubble_fraction/n_stages",
            "tl.parallel.bubble_fraction('1f1b', g, 8)",
            "n_stages",
            ints(1, huge=False, valid=(1, 4)),
        ),
        Call(
            "parallel.pipeline_schedule/n_microbatches",
            "tl.parallel.pipeline_schedule('gpipe', 2, g)",
            "n_microbatches",
            ints(1, huge=False, valid=(1, 3)),
        ),
        Call("parallel.shard_bounds/rank", "tl.parallel.shard_bounds(10, 4, g)", "rank", ints(0, 3)),
        Call(
            "parallel.zero_memory_per_rank/stage", "tl.parallel.zero_memory_per_rank(10**6, g, 4)", "stage", ints(0, 3)
        ),
        Call(
            "parallel.plan_3d/world_size",
            "tl.parallel.plan_3d(g, 10**9, 24, 2048, 1024, 64, 80e9)",
            "world_size",
            ints(1, huge=False, valid=(8,)),
            view="[repr(p) for p in r]",
        ),
    ],
    "amp": [
        Call(
            "amp.GradScaler/init_scale",
            "tl.amp.GradScaler(init_scale=g)",
            "init_scale",
            reals(0.0),
            view="r.get_scale()",
        ),
        Call(
            "amp.GradScaler/growth_interval",
            "tl.amp.GradScaler(growth_interval=g)",
            "growth_interval",
            ints(1, huge=False, valid=(1, 100)),
            view="r.state_dict()",
        ),
        Call(
            "amp.mx_quantize/block_size",
            "tl.amp.mx_quantize(np.ones(32, np.float32), block_size=g)",
            "block_size",
            ints(1, valid=(8, 32)),
        ),
        Call("amp.int2_quantize/scale", "tl.amp.int2_quantize(np.ones(4), g)", "scale", reals(0.0)),
        Call("amp.fp4_encode/x", "tl.amp.fp4_encode(g)", "x", arrays((4, 5))),
    ],
    "compress": [
        Call(
            "compress.LoRALinear/r",
            "LoRALinear(tl.nn.Linear(8, 4), r=g, alpha=8)",
            "r",
            ints(1, 4, valid=(1, 2)),
            setup="from tinylearn.compress import LoRALinear\ntl.manual_seed(0)",
            view="(r.r, r.scaling)",
        ),
        Call(
            "compress.distill_loss/T",
            "distill_loss(s, t, T=g, alpha=1.0)",
            "T",
            reals(0.0, valid=(2.0,)),
            setup="from tinylearn.compress import distill_loss\ns, t = tl.ones(2, 3), tl.zeros(2, 3)",
            view="float(r.item())",
        ),
    ],
    "resilience": [
        Call(
            "resilience.young_interval/checkpoint_s",
            "young_interval(g, 100.0)",
            "checkpoint_s",
            reals(0.0, valid=(2.0,)),
            setup="from tinylearn.resilience import young_interval",
        ),
        Call(
            "resilience.cluster_mtbf/n_nodes",
            "cluster_mtbf(100.0, g)",
            "n_nodes",
            ints(1, valid=(1, 2), huge=False),  # a formula: any node count is arithmetic, not an allocation
            setup="from tinylearn.resilience import cluster_mtbf",
        ),
        Call(
            "resilience.encode/r",
            "encode([b'ab', b'cd'], g)",
            "r",
            ints(0, 254, valid=(1, 2)),
            setup="from tinylearn.resilience import encode",
            view="[p.tobytes() for p in r]",
        ),
    ],
    "tune": [
        Call(
            "tune.UCB1/c",
            "UCB1([0, 1], c=g)",
            "c",
            reals(0.0, lo_ok=True),
            setup="from tinylearn.tune import UCB1",
        ),
        Call(
            "tune.VariantClusters/k",
            "VariantClusters(tunable.get('gemm.matmul'), g).k",
            "k",
            ints(1, 1 << 20, valid=(1, 4), huge=False),
            setup="from tinylearn import tunable\nfrom tinylearn.tune import VariantClusters",
        ),
        Call(
            "tune.ARPredictor/order",
            "ARPredictor(order=g).order",
            "order",
            ints(0, 1 << 16, valid=(0, 2), huge=False),
            setup="from tinylearn.tune import ARPredictor",
        ),
    ],
    "profiler": [
        Call(
            "profiler.HotspotMonitor/threshold_fraction",
            "HotspotMonitor(threshold_fraction=g)",
            "threshold_fraction",
            reals(0.0, 1.0, valid=(0.3,)),
            setup="from tinylearn.profiler import HotspotMonitor",
        ),
    ],
    "sched": [
        Call(
            "sched.Job/steps",
            "Job('a', g).steps",
            "steps",
            ints(1, None, valid=(1, 3), huge=False),
            setup="from tinylearn.sched import Job",
        ),
        Call(
            "sched.synthetic_trace/load",
            "[round(t, 9) for t, _ in synthetic_trace(5, 8, g, 0)]",
            "load",
            reals(0.0, 100.0, valid=(1.5,)),
            setup="from tinylearn.sched import synthetic_trace",
        ),
        Call(
            "sched.PID/kp",
            "PID(g, 0.0, 0.0, 100.0, 0.0, 1.0).kp",
            "kp",
            reals(0.0, lo_ok=True, valid=(0.5,)),
            setup="from tinylearn.sched import PID",
        ),
    ],
    "longctx": [
        Call(
            "longctx.MoE/num_experts",
            "MoE(8, 16, g)",
            "num_experts",
            ints(2, None, valid=(2, 4), huge=False),
            setup="from tinylearn.longctx import MoE\ntl.manual_seed(0)",
            view="r.num_experts",
        ),
        Call(
            "longctx.capacity/capacity_factor",
            "capacity(16, 4, 1, g)",
            "capacity_factor",
            reals(0.0, valid=(1.25,)),
            setup="from tinylearn.longctx import capacity",
        ),
        Call(
            "longctx.local/layout block_size",
            "local(1).layout(64, 64, g).nnz",
            "block_size",
            ints(1, None, valid=(16, 32), huge=False),
            setup="from tinylearn.longctx import local",
        ),
    ],
    "serve": [
        Call(
            "serve.SamplingParams/max_tokens",
            "SamplingParams(max_tokens=g)",
            "max_tokens",
            ints(1, huge=False, valid=(1, 16)),
            setup="from tinylearn.serve import SamplingParams",
            view="r.max_tokens",
        ),
        Call(
            "serve.SamplingParams/temperature",
            "SamplingParams(temperature=g)",
            "temperature",
            reals(0.0, lo_ok=True),
            setup="from tinylearn.serve import SamplingParams",
            view="r.temperature",
        ),
        Call(
            "serve.Engine/policy",
            "Engine(m, policy=g)",
            "policy",
            names(("fcfs", "spf", "edf", "priority")),
            setup=_SERVE_SETUP,
        ),
        Call(
            "serve.Engine.add_request/prompt",
            "Engine(m).add_request(g)",
            "prompt",
            arrays((4,), ranks=(1,)),
            setup=_SERVE_SETUP,
        ),
    ],
    "compiler": [
        Call(
            "compiler.mark_dynamic/dim",
            "tl.compiler.mark_dynamic(tl.ones(2, 3), g)",
            "dim",
            ints(-2, 1, valid=(-1, 0, 1)),
            view="tuple(r.shape)",
        ),
        Call(
            "compiler.chaitin_briggs/k",
            "ra.chaitin_briggs(ra.sum_of_squares_loop(), g)",
            "k",
            ints(1, huge=False, valid=(3, 5)),
            setup="from tinylearn.compiler import regalloc as ra",
            view="r.summary()",
        ),
        Call("compiler.compile/backend", "tl.compile(lambda x: x, backend=g)", "backend", names(("cpp", "numpy"))),
    ],
}


def _params() -> list:
    out = []
    for pkg in sorted(CALLS):
        for call in CALLS[pkg]:
            for cat in call.kind:
                key = f"{call.id}:{cat}"
                marks = [pytest.mark.xfail(strict=True, reason=KNOWN[key])] if key in KNOWN else []
                out.append(pytest.param(call, cat, id=key, marks=marks))
    return out


PARAMS = _params()


# ------------------------------------------------------------------------------------ the child interpreter (worker)
def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Deep equality of two results (arrays exactly, NaN equal to NaN; objects by their fields)."""
    if hasattr(a, "numpy") and callable(a.numpy):
        a, b = a.numpy(), b.numpy() if hasattr(b, "numpy") else b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a).__module__.startswith("tinylearn") and hasattr(a, "__dict__") and depth < 3:
        return type(a) is type(b) and _same(vars(a), vars(b), depth + 1)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (an uncomparable pair is a mismatch)
        return False


def _send(f: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


class _Hang(BaseException):
    pass


def _alarm(*_: Any) -> None:
    raise _Hang()


def _run(tl: Any, setup: str, stmt: str, view: str, value: Any) -> Any:
    """One call in a fresh namespace (seeded), ``g`` bound to ``value``; the view of its result."""
    ns: dict[str, Any] = {"np": np, "tl": tl, "math": math}
    for code in (setup, None):
        np.random.seed(0)
        if tl is not None:
            tl.manual_seed(0)
        if code is not None:
            exec(code, ns)
    ns["g"] = value
    ns["r"] = eval(stmt, ns)
    return eval(view, ns)


def _plain(g: Any) -> Any:
    """The plain Python value of a numpy scalar (or of a list of them)."""
    if isinstance(g, np.generic):
        return g.item()
    return [x.item() if isinstance(x, np.generic) else x for x in g]


def _outcome(tl: Any, alarm_s: int, setup: str, stmt: str, view: str, g: Any, mode: str) -> dict:
    """Run one request in the child: what it returned or raised (and, for a valid draw, the plain call's result)."""
    signal.alarm(alarm_s)
    try:
        got = _run(tl, setup, stmt, view, g)
        res: dict[str, Any] = {"raised": None, "result": repr(got)[:300]}
        if mode == "valid":
            ref = _run(tl, setup, stmt, view, _plain(g))
            res.update(same=_same(got, ref), ref=repr(ref)[:300])
    except _Hang:
        res = {"raised": ["HANG"], "type": "HANG", "msg": f"no result within {alarm_s} s"}
    except BaseException as e:  # noqa: BLE001  (every outcome is reported to the parent)
        bases = [k.__name__ for k in type(e).__mro__ if k.__module__ == "builtins"]
        res = {"raised": bases, "type": f"{type(e).__module__}.{type(e).__qualname__}", "msg": str(e)[:500]}
    finally:
        signal.alarm(0)
    return res


def _serve(import_all: bool, alarm_s: int) -> None:
    """The child: read (setup, stmt, view, g, mode) requests from stdin, answer each with its outcome; a Python-level
    hang is cut by an alarm after ``alarm_s`` (the parent kills a hang in C code). ``import_all=False``: no tinylearn
    (the harness's own test)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a print in the library goes to stderr, not into the protocol
    tl = None
    if import_all:
        import importlib

        import tinylearn as tl

        for pkg in _topic_packages():
            importlib.import_module(f"tinylearn.{pkg}")
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    inp = sys.stdin.buffer
    _send(out, "ready")
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        _send(out, _outcome(tl, alarm_s, *pickle.loads(inp.read(struct.unpack("<Q", head)[0]))))


class _Worker:
    """The parent's handle on the child interpreter: restarted after a death or a hang."""

    def __init__(self, import_all: bool = True, per_call_s: int = PER_CALL_S) -> None:
        self.import_all, self.per_call_s = import_all, per_call_s
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None
        self.err = tempfile.TemporaryFile()

    def _start(self) -> None:
        here = str(Path(__file__).parent)
        args = f"{self.import_all}, {max(1, self.per_call_s - 3)}"
        code = f"import sys; sys.path.insert(0, {here!r}); from test_garbage import _serve; _serve({args})"
        self.err.seek(0)
        self.err.truncate()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err
        )
        ready = self._recv(START_S)
        assert ready == "ready", f"garbage worker did not start: {ready}"

    def _read(self, n: int, deadline_s: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd, buf = self.proc.stdout.fileno(), b""
        while len(buf) < n:
            if not select.select([fd], [], [], deadline_s)[0]:
                return None
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _recv(self, timeout_s: float) -> Any:
        try:
            head = self._read(8, timeout_s)
            body = None if head is None else self._read(struct.unpack("<Q", head)[0], timeout_s)
        except EOFError:
            self._stop()
            self.err.seek(0)
            tail = self.err.read().decode(errors="replace")[-1500:]
            return {"raised": ["CRASH"], "type": "CRASH", "msg": f"child died ({self.rc}): {tail}"}
        if body is None:
            self._stop()
            return {"raised": ["HANG"], "type": "HANG", "msg": f"no answer within {timeout_s} s (killed)"}
        return pickle.loads(body)

    def _stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.rc = self.proc.wait()
            self.proc = None

    def call(self, call: Call, g: Any, mode: str) -> dict:
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        _send(self.proc.stdin, (call.setup, call.stmt, call.view, g, mode))
        return self._recv(self.per_call_s)

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._stop()
        self.err.close()


@pytest.fixture(scope="module")
def worker():
    w = _Worker()
    yield w
    w.close()


# ------------------------------------------------------------------------------------------------------- tests
def test_every_topic_row_has_garbage_calls():
    missing = [(t.name, p) for t in TOPICS for p in t.packages if not CALLS.get(p)]
    assert not missing, f"topic rows whose packages have no garbage calls in {__file__}: {missing}"
    assert set(CALLS) <= set(_topic_packages()), f"calls for packages not in the topic table: {set(CALLS)}"
    ids = [c.id for calls in CALLS.values() for c in calls]
    assert len(ids) == len(set(ids)), f"duplicate call ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    for pkg, calls in CALLS.items():
        assert all(c.id.startswith(f"{pkg}.") for c in calls), f"{pkg}: call ids must start with {pkg!r}"


def test_worker_survives_a_crash_and_a_hang():
    """The harness itself: an abort, a Python-level hang (the child's alarm) and a hang the alarm cannot cut (the
    parent kills the child) each come back as an outcome naming what happened, and the next call still runs."""
    w = _Worker(import_all=False, per_call_s=3)
    try:
        crash = w.call(Call("x.abort/g", "__import__('os').abort()", "g", {}), None, "bad")
        assert crash["raised"] == ["CRASH"] and "child died" in crash["msg"], crash
        assert "CRASH" in str(_problem(Call("x.abort/g", "", "g", {}), "none", None, crash))
        slow = w.call(Call("x.sleep/g", "__import__('time').sleep(60)", "g", {}), None, "bad")
        assert slow["raised"] == ["HANG"] and "within 1 s" in slow["msg"], slow
        blocked = "(__import__('signal').pthread_sigmask(0, [14]), __import__('time').sleep(60))"  # block SIGALRM
        stuck = w.call(Call("x.stuck/g", blocked, "g", {}), None, "bad")
        assert stuck["raised"] == ["HANG"] and "killed" in stuck["msg"], stuck
        ok = w.call(Call("x.add/g", "g + 1", "g", {}), 41, "bad")
        assert ok["raised"] is None and ok["result"] == "42", ok
    finally:
        w.close()


def test_known_bugs_name_existing_cases():
    keys = {p.id for p in PARAMS}
    stale = sorted(set(KNOWN) - keys)
    assert not stale, f"KNOWN entries that name no (call, category): {stale}"


def _short(g: Any) -> str:
    """A one-line description of a draw (an array by its shape and dtype)."""
    if isinstance(g, np.ndarray):
        return f"array(shape={g.shape}, dtype={g.dtype})"
    return repr(g)[:200]


def _problem(call: Call, cat: str, g: Any, r: dict) -> str | None:
    """What is wrong with one outcome (None: the property holds)."""
    what = f"{call.id} with {cat} garbage {_short(g)}"
    if cat in VALID_CATEGORIES:
        if r["raised"]:
            return f"{what}: a valid value was refused: {r['type']}: {r['msg']}"
        if not r["same"]:
            return f"{what}: result differs from the plain number's: {r['result']} != {r['ref']}"
        return None
    if r["raised"] is None:
        return None if cat in MAYBE_CATEGORIES else f"{what}: accepted silently, returned {r['result']}"
    allowed = ERRORS + (("MemoryError",) if call.memory else ())
    if not set(r["raised"]) & set(allowed):
        return f"{what}: raised {r['type']} (want {'/'.join(allowed)}): {r['msg']}"
    if call.arg.lower() not in r["msg"].lower():
        return f"{what}: {r['type']} does not name {call.arg!r}: {r['msg']}"
    return None


@FAST
@given(data=st.data())
@pytest.mark.parametrize(("call", "cat"), PARAMS)
def test_garbage_is_refused_cleanly(worker, call: Call, cat: str, data):
    g = data.draw(call.kind[cat], label=call.arg)
    mode = "valid" if cat in VALID_CATEGORIES else "bad"
    problem = _problem(call, cat, g, worker.call(call, g, mode))
    assert problem is None, problem
