"""Bad input, driven by the topic table: every package of every topic in ``tinylearn.topics.TOPICS`` gets garbage.

One row per bad call: (case id, statement, accepted exception names, fragment the message must contain, setup).
The error must be a built-in TypeError / ValueError / IndexError / RuntimeError (or MemoryError where the request is
a memory request) whose message names the offending argument. A row whose accepted names are ``OK`` (empty) must
run without raising: its statement checks a result with ``assert`` (a huge block size is capped, NaN elements are
ignored, a corrupted index never reads out of bounds). ``setup`` runs first in the same namespace (``np``, ``tl``)
and must not raise, so an error while building the inputs never passes for the error under test.

All rows of one package run in one child interpreter (one test per package, so ``pytest -n 2`` splits them) with a
per-call alarm and an overall timeout: a segfault, an abort or a hang fails that package's test, naming the call
that was running, instead of killing or stalling the test run.

A topic package without rows here fails ``test_every_topic_package_has_bad_input_cases``: adding a topic to the
table means adding its garbage here.

Why one file: the rows are the suite (one table, one runner); split by package they would need one runner each or a
shared helper module outside this folder's naming rule, and the table would no longer read as one list.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest

from tinylearn.topics import TOPICS

# Known bugs in packages owned by other helpers (reported, not fixed here): the case runs and its result is shown,
# but it does not fail the test; once fixed, drop the id from this table so that it guards the fix.
KNOWN_BUGS: dict[str, str] = {}

TV = ("TypeError", "ValueError")
OK: tuple[str, ...] = ()  # the statement must run without raising (it asserts on its result)


class Case(NamedTuple):
    id: str
    stmt: str
    excs: tuple[str, ...]
    frag: str
    setup: str = ""


# dist.launch pickles its rank function by reference, so the functions live at top level here; the child puts this
# folder on sys.path and imports them from this module.
def _ar_chunk() -> None:
    import torch

    import tinylearn.dist as d

    rank = torch.distributed.get_rank()
    d.all_reduce(torch.ones(4096), algorithm="ring", chunk_bytes=1024 * (rank + 1))


def _ar_node_size() -> None:
    import torch

    import tinylearn.dist as d

    rank = torch.distributed.get_rank()
    d.all_reduce(torch.ones(64), algorithm="hierarchical", node_size=1 + rank % 2)


# The CLI must refuse an output path it cannot write before minutes of benchmarking, with no traceback. For --plot
# the parent folder is made read-only; as root (every folder writable) the parent is a regular file instead.
_BENCH_SETUP = """
import os, subprocess, sys, tempfile
tmp = tempfile.mkdtemp()
"""
_BENCH_JSON = """
target = os.path.join(tmp, "missing", "dir", "x.json")
p = subprocess.run([sys.executable, "-m", "tinylearn", "bench", "matmul", "--json", target],
                   capture_output=True, text=True, timeout=60)
assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
assert os.path.dirname(target) in p.stderr or target in p.stderr, p.stderr
"""
_BENCH_PLOT = """
parent = os.path.join(tmp, "missing", "dir")
os.makedirs(parent)
os.chmod(parent, 0o500)
if os.access(parent, os.W_OK):
    os.chmod(parent, 0o700)
    os.rmdir(parent)
    open(parent, "w").close()
target = os.path.join(parent, "plots")
p = subprocess.run([sys.executable, "-m", "tinylearn", "bench", "matmul", "--plot", target],
                   capture_output=True, text=True, timeout=60)
assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
assert parent in p.stderr or target in p.stderr, p.stderr
"""

# NaN elements are ignored (like torch's nan-aware reductions); finite values still count.
_OBSERVER_NAN = """
x = np.linspace(-2, 3, 101).astype(np.float32)
with_nan = x.copy()
with_nan[[0, 50]] = np.nan
a, b = tl.quant.{obs}(), tl.quant.{obs}()
a(with_nan)
b(np.delete(x, [0, 50]))
(sa, za), (sb, zb) = a.calculate_qparams(), b.calculate_qparams()
np.testing.assert_allclose(np.asarray(sa, np.float64), np.asarray(sb, np.float64), rtol=1e-6)
np.testing.assert_array_equal(np.asarray(za), np.asarray(zb))
"""
_OBSERVERS = ("MinMaxObserver", "PercentileObserver", "MSEObserver", "HistogramObserver", "MovingAverageMinMaxObserver")

# A corrupted index array either cannot be written (read-only: ValueError) or every kernel validates it.
_SPARSE_CORRUPT = """
s.indices.flat[0] = -5
s.matmul(np.ones((4, 2), np.float32), backend="{backend}")
"""

# The one input policy of tinylearn._inputs.as_array (tests/tour/test_input_policy.py checks that torch and tl
# tensors are accepted): a wrong dtype is a TypeError, a wrong shape a ValueError, each naming the argument.
# (function, call with {x} for the array under test, its argument name, a valid shape and dtype for it, a dtype it
# must reject, a shape it must reject or None when every shape is valid)
_POLICY: dict[str, list[tuple[str, str, str, tuple[int, ...], str, str, tuple[int, ...] | None]]] = {
    "conv": [
        ("im2col", "tl.conv.im2col({x}, 3)", "x", (1, 2, 5, 5), "float32", "complex64", (5, 5)),
        ("col2im", "tl.conv.col2im({x}, (5, 5), 3)", "cols", (1, 18, 9), "float32", "complex64", (18,)),
        (
            "conv2d",
            "tl.conv.conv2d({x}, np.ones((3, 2, 3, 3), np.float32))",
            "x",
            (1, 2, 5, 5),
            "float32",
            "complex64",
            (2, 5, 5),
        ),
        (
            "winograd_conv2d",
            "tl.conv.winograd_conv2d({x}, np.ones((3, 2, 3, 3), np.float32))",
            "x",
            (1, 2, 6, 6),
            "float32",
            "complex64",
            (6, 6),
        ),
        ("max_pool2d", "tl.conv.max_pool2d({x}, 2)", "x", (1, 2, 6, 6), "float32", "complex64", (6, 6)),
        ("avg_pool2d", "tl.conv.avg_pool2d({x}, 2)", "x", (1, 2, 6, 6), "float32", "complex64", (6, 6)),
    ],
    "quant": [
        ("quantize", "tl.quant.quantize({x}, 0.1, 0)", "x", (4, 5), "float32", "complex64", None),
        ("dequantize", "tl.quant.dequantize({x}, 0.1, 0)", "q", (4, 5), "int8", "float32", None),
        ("fp8_encode", "tl.quant.fp8_encode({x})", "x", (4, 5), "float32", "complex64", None),
        ("fp8_decode", "tl.quant.fp8_decode({x}, 'e4m3')", "codes", (6,), "uint8", "float32", None),
        ("pack_int4", "tl.quant.pack_int4({x})", "q", (7,), "int8", "float32", None),
        ("quantize_groupwise", "tl.quant.quantize_groupwise({x}, 4)", "w", (4, 8), "float32", "complex64", None),
        ("int8_gemm", "tl.quant.int8_gemm({x}, np.ones((4, 2), np.int8))", "a_int8", (3, 4), "int8", "int16", (4,)),
    ],
    "kernels": [
        ("softmax", "tl.kernels.softmax({x})", "x", (3, 7), "float32", "int32", None),
        (
            "layer_norm",
            "tl.kernels.layer_norm({x}, np.ones(7, np.float32), np.zeros(7, np.float32))",
            "x",
            (3, 7),
            "float32",
            "int32",
            (5,),
        ),
        ("bias_gelu", "tl.kernels.bias_gelu({x}, np.ones(7, np.float32))", "x", (3, 7), "float32", "int32", (3, 5)),
        (
            "flash_attention",
            "tl.kernels.flash_attention({x}, *[np.ones((2, 5, 4), np.float32)] * 2)",
            "q",
            (2, 5, 4),
            "float32",
            "int32",
            (4,),
        ),
    ],
    "prune": [("sparsity", "tl.prune.sparsity({x})", "module_or_array", (4, 5), "float32", "str_", None)],
    "sparse": [("CSR.from_dense", "tl.sparse.CSR.from_dense({x})", "a", (4, 5), "float32", "complex64", (2, 2, 2))],
}


def _policy_rows(pkg: str) -> list[tuple]:
    """The input-policy rows of one package: its wrong dtypes and wrong shapes."""
    rows: list[tuple] = []
    for name, call, arg, shape, good, bad_dtype, bad_shape in _POLICY[pkg]:
        rows.append((f"policy-{name}-dtype", call.format(x=f"np.zeros({shape}, np.{bad_dtype})"), ("TypeError",), arg))
        if bad_shape is not None:
            bad = call.format(x=f"np.zeros({bad_shape}, np.{good})")
            rows.append((f"policy-{name}-shape", bad, ("ValueError",), arg))
    return rows


# One list of rows per topic package: (id, statement, accepted exception names or OK, message fragment[, setup]).
# Rows that need files, permissions or process groups build them in their setup snippet (the bench CLI rows, the
# dist.launch rows), so every case of the suite is a row: no explicit test beside the two below.
# the compiler's submodules (regalloc, listsched, ...) load on import, as a learner's script imports them
_CSETUP = (
    "import tinylearn.compiler as C\n"
    "from tinylearn.compiler import cc, codegen_cpp, kernel_ir, listsched, loops, polyhedral, regalloc\n"
    "B, I = kernel_ir.Buffer, kernel_ir.Instr"
)

_SSETUP = (
    "from tinylearn.serve import DeltaKVStore, Engine, SamplingParams, TieredKVStore\n"
    "from tinylearn.serve import checkpoint, latency, loadgen, server\n"
    "m = checkpoint.tiny_model(0)"
)

_KSETUP = "from tinylearn.compress import distill, lora, lowrank, nf4\nlin = tl.nn.Linear(8, 4)"
_LSETUP = (
    "import torch\nfrom tinylearn import longctx as lc\nqkv = [np.ones((1, 1, 64, 8), np.float32) for _ in range(3)]"
)
_TSETUP = "from tinylearn import tune as tn, tunable\nsp = tunable.get('gemm.matmul')\nsh = {'M': 8, 'N': 8, 'K': 8}"
_PSETUP = "from tinylearn import profiler as pf\np = pf.profile()\nwith p:\n    pass"
_SCSETUP = "import tinylearn.sched as sc\nc = sc.Cluster()\nc.submit(sc.Job('kept', 1))"
_RSETUP = (
    "import tempfile\nfrom tinylearn.resilience import atomic, ec_files, elastic, erasure, failure_math, sharded\n"
    "d = tempfile.mkdtemp()\nsharded.save_sharded({'w': np.ones(4, np.float32)}, d + '/ok')"
)

CASES: dict[str, list[tuple]] = {
    "bench": [
        ("measure-not-callable", "tl.bench.measure(3)", TV, "fn"),
        ("measure-negative-repeat", "tl.bench.measure(lambda: None, repeat=-1)", TV, "repeat"),
        ("run_topic-unknown", "tl.bench.run_topic('nope')", TV, "topic"),
        ("run_topic-int", "tl.bench.run_topic(3)", TV, "topic"),
        ("cli-json-missing-folder", _BENCH_JSON, OK, "", _BENCH_SETUP),
        ("cli-plot-folder-not-writable", _BENCH_PLOT, OK, "", _BENCH_SETUP),
    ],
    "testing": [
        ("make_array-negative-shape", "tl.testing.make_array((-1, 2))", TV, "shape"),
        ("make_array-bad-dtype", "tl.testing.make_array((2,), dtype='banana')", TV, "dtype"),
        ("make_array-bad-layout", "tl.testing.make_array((2, 2), layout='zigzag')", TV, "layout"),
        ("tolerance-bad-dtype", "tl.testing.tolerance('banana')", TV, "dtype"),
    ],
    "autograd": [
        ("Tensor-None", "tl.Tensor(None)", ("TypeError",), "data"),
        ("Tensor-strings", "tl.Tensor(['a', 'b'])", ("TypeError",), "data"),
        ("full-negative", "tl.full((-2, 3), 1.0)", TV, "shape"),
        ("zeros-float-shape", "tl.zeros((2.5, 3))", TV, "shape"),
        ("arange-zero-step", "tl.arange(0, 5, 0)", TV, "step"),
        ("arange-nan", "tl.arange(0, float('nan'))", TV, "end"),
        ("reshape-bad", "tl.Tensor(np.ones(6)).reshape(4, 2)", TV, "shape"),
        ("sum-dim-float", "tl.Tensor(np.ones((2, 3))).sum(dim=1.5)", TV, "dim"),
        ("transpose-dim-out-of-range", "tl.Tensor(np.ones((2, 3))).transpose(0, 5)", TV + ("IndexError",), "dim"),
        ("cat-empty", "tl.cat([], 0)", TV, "tensors"),
        # torch's exception types (issue 38): a dim out of range is an IndexError, a shape mismatch a RuntimeError
        ("flip-dim-out-of-range", "tl.ones(2, 3).flip(5)", ("IndexError",), "dim"),
        ("roll-dim-out-of-range", "tl.ones(2, 3).roll(1, -3)", ("IndexError",), "dim"),
        ("cumsum-dim-out-of-range", "tl.ones(2, 3).cumsum(2)", ("IndexError",), "dim"),
        ("cumprod-0d-dim-out-of-range", "tl.Tensor(np.float32(2)).cumprod(1)", ("IndexError",), "dim"),
        ("argmax-dim-out-of-range", "tl.ones(2, 3).argmax(7)", ("IndexError",), "7"),
        ("size-dim-out-of-range", "tl.ones(2, 3).size(4)", ("IndexError",), "dim"),
        ("cat-shape-mismatch", "tl.cat([tl.ones(2, 3), tl.ones(4, 5)])", ("RuntimeError",), "shape"),
        ("mm-1d", "tl.ones(2, 3).mm(tl.ones(3))", ("RuntimeError",), "shape"),
        ("remainder-broadcast", "tl.ones(2, 3) % tl.ones(4)", ("RuntimeError",), "shape"),
        ("lt-broadcast", "tl.ones(2, 3) < tl.ones(4)", ("RuntimeError",), "shape"),
        ("einsum-ellipsis-mismatch", "tl.einsum('...i,...i', tl.ones(2, 3), tl.ones(4, 3))", ("RuntimeError",), "..."),
        ("index-out-of-bounds", "tl.ones(3)[5]", ("IndexError",), "5"),
        ("scatter-reduce-bad", "tl.ones(2, 3).scatter(1, tl.tensor([[0]]), 1.0, reduce='mean')", TV, "reduce"),
        ("meshgrid-bad-indexing", "tl.meshgrid(tl.ones(2), indexing='yx')", TV, "indexing"),
        ("meshgrid-empty", "tl.meshgrid()", TV, "tensors"),
        ("linspace-float-steps", "tl.linspace(0, 1, 2.5)", TV, "steps"),
        ("linspace-negative-steps", "tl.linspace(0, 1, -1, dtype=np.int64)", TV, "steps"),
        ("int-pow-negative-int", "tl.tensor([2, 3]) ** -1", TV, "exponent"),
        ("gradcheck-not-callable", "tl.autograd.gradcheck(3, [tl.Tensor(np.ones(2), requires_grad=True)])", TV, "fn"),
        (
            "backward-after-inplace-change-of-saved-tensor",
            "y.backward()",
            ("RuntimeError",),
            "modified by an inplace operation",
            """
            a = tl.Tensor(np.ones(3), requires_grad=True)
            b = tl.Tensor(np.full(3, 2.0), requires_grad=True)
            y = (a * b).sum()
            with tl.no_grad():
                b += 10
            """,
        ),
        (
            # like torch: tensor([1.0, nan, 3.0]).max().backward() gives the grad [0, 1, 0] (the NaN is the max); the
            # value is pinned because importing torch would cost this child more than all its other rows together
            "max-backward-nan-like-torch",
            "x.max().backward()\nnp.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 0.0])",
            OK,
            "",
            "x = tl.Tensor(np.array([1.0, np.nan, 3.0]), requires_grad=True)",
        ),
    ],
    "nn": [
        ("Linear-negative", "tl.nn.Linear(-1, 3)", TV, "in_features"),
        ("Linear-float", "tl.nn.Linear(2.5, 3)", TV, "in_features"),
        ("Conv2d-zero-kernel", "tl.nn.Conv2d(3, 4, 0)", ("ValueError",), "kernel_size"),
        ("Conv2d-wrong-ndim", "tl.nn.Conv2d(1, 1, 1)(tl.Tensor(np.ones((2, 2), np.float32)))", TV, "shape"),
        ("Embedding-negative", "tl.nn.Embedding(-3, 2)", TV, "num_embeddings"),
        ("Embedding-index-oob", "tl.nn.Embedding(3, 2)(tl.Tensor(np.array([5])))", TV + ("IndexError",), "5"),
        ("Dropout-p-nan", "tl.nn.Dropout(float('nan'))", TV, "p"),
        ("Dropout-p-2", "tl.nn.functional.dropout(tl.Tensor(np.ones(3)), p=2.0)", TV, "p"),
        ("LayerNorm-wrong-shape", "tl.nn.LayerNorm(4)(tl.Tensor(np.ones((2, 3), np.float32)))", TV, "shape"),
        ("softmax-dim-float", "tl.nn.functional.softmax(tl.Tensor(np.ones((2, 3))), dim=1.0)", TV, "dim"),
        (
            "cross_entropy-target-oob",
            "tl.nn.functional.cross_entropy(tl.Tensor(np.ones((2, 3))), np.array([0, 7]))",
            TV + ("IndexError",),
            "target",
        ),
        (
            "Conv2d-huge-padding",
            "tl.nn.Conv2d(1, 1, 1, padding=2**31 - 1)(tl.Tensor(np.ones((1, 1, 2, 2), np.float32)))",
            ("ValueError",),
            "padding",
        ),
        (
            "sdpa-gqa-heads-not-dividing",
            "tl.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True)",
            ("RuntimeError",),
            "heads",
            "q, k = tl.Tensor(np.ones((1, 6, 2, 4), np.float32)), tl.Tensor(np.ones((1, 4, 2, 4), np.float32))",
        ),
        (
            "sdpa-fully-masked-row-is-zero",
            "assert not np.isnan(o.data).any() and (o.data[0, 1] == 0).all()",
            OK,
            "",
            """
            m = np.ones((2, 3), bool)
            m[1] = False
            q = tl.Tensor(np.ones((1, 2, 4), np.float32))
            o = tl.nn.functional.scaled_dot_product_attention(q, q[:, :1].expand(1, 3, 4), q[:, :1].expand(1, 3, 4), m)
            """,
        ),
        ("pad-float-entry", "tl.nn.functional.pad(tl.Tensor(np.ones((2, 3))), (1.5, 1))", ("TypeError",), "pad"),
        ("pad-crop-past-size", "tl.nn.functional.pad(tl.Tensor(np.ones((2, 3))), (-2, -2))", TV, "pad"),
        (
            "cross_entropy-label_smoothing-2",
            "tl.nn.functional.cross_entropy(tl.Tensor(np.ones((2, 3))), np.array([0, 1]), label_smoothing=2.0)",
            TV,
            "label_smoothing",
        ),
        (
            "cross_entropy-weight-wrong-length",
            "tl.nn.functional.cross_entropy(tl.Tensor(np.ones((2, 3))), np.array([0, 1]), weight=np.ones(4))",
            TV,
            "weight",
        ),
    ],
    "optim": [
        ("SGD-negative-lr", "tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=-1.0)", TV, "lr"),
        (
            "SGD-nan-momentum",
            "tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=0.1, momentum=float('nan'))",
            ("ValueError",),
            "momentum",
        ),
        ("Adam-short-betas", "tl.optim.Adam([tl.nn.Parameter(np.ones(2))], betas=(0.9,))", ("ValueError",), "betas"),
        ("Adam-not-params", "tl.optim.Adam(3)", TV, "params"),
        (
            "StepLR-zero-step",
            "tl.optim.StepLR(tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=0.1), 0)",
            TV,
            "step_size",
        ),
        (
            "SGD-param-in-two-groups",
            "tl.optim.SGD([{'params': [p]}, {'params': [p]}], lr=0.1)",
            ("ValueError",),
            "more than one parameter group",
            "p = tl.nn.Parameter(tl.zeros(3))",
        ),
        (
            "load_state_dict-bad-index",
            "opt.load_state_dict(sd)",
            ("ValueError",),
            "param",
            """
            opt = tl.optim.Adam([tl.nn.Parameter(tl.zeros(2))])
            sd = opt.state_dict()
            sd["param_groups"][0]["params"] = [7]
            """,
        ),
    ],
    "data": [
        ("DataLoader-zero-batch", "tl.data.DataLoader(np.ones((4, 2)), np.ones(4), batch_size=0)", TV, "batch_size"),
        ("DataLoader-len-mismatch", "tl.data.DataLoader(np.ones((4, 2)), np.ones(3))", TV, "y"),
        (
            "split-test-size-nan",
            "tl.data.train_test_split(np.ones((4, 2)), np.ones(4), test_size=float('nan'))",
            TV,
            "test_size",
        ),
        ("split-test-size-2", "tl.data.train_test_split(np.ones((4, 2)), np.ones(4), test_size=2.0)", TV, "test_size"),
    ],
    "conv": [
        ("im2col-2d", "tl.conv.im2col(np.ones((2, 2), np.float32), 1)", TV, "x"),
        ("im2col-str", "tl.conv.im2col('abc', 1)", TV, "x"),
        ("im2col-negative-stride", "tl.conv.im2col(np.ones((1, 1, 4, 4), np.float32), 2, stride=-1)", TV, "stride"),
        (
            "im2col-huge-padding-cpp",
            "tl.conv.im2col(np.ones((1, 1, 2, 2), np.float32), 1, padding=2**62, backend='cpp')",
            TV,
            "padding",
        ),
        ("conv2d-channel-mismatch", "tl.conv.conv2d(np.ones((1, 2, 4, 4)), np.ones((1, 3, 3, 3)))", TV, "w"),
        ("conv2d-groups-zero", "tl.conv.conv2d(np.ones((1, 2, 4, 4)), np.ones((1, 2, 3, 3)), groups=0)", TV, "groups"),
        ("col2im-negative-size", "tl.conv.col2im(np.ones((1, 4, 1)), (-2, 2), 2)", TV, "output_size"),
        ("max_pool2d-zero-kernel", "tl.conv.max_pool2d(np.ones((1, 1, 4, 4)), 0)", TV, "kernel_size"),
        ("winograd-5x5", "tl.conv.winograd_conv2d(np.ones((1, 1, 6, 6)), np.ones((1, 1, 5, 5)))", TV, "w"),
        ("conv_output_size-float", "tl.conv.conv_output_size(4.5, 2)", TV, "size"),
        (
            "im2col-huge-padding-int32-cpp",
            "tl.conv.im2col(np.ones((1, 1, 2, 2), np.float32), 1, padding=2**31 - 1, backend='cpp')",
            ("ValueError",),
            "padding",
        ),
        (
            "im2col-complex",
            "tl.conv.im2col(np.ones((1, 1, 3, 3), np.complex64), 2, backend='numpy')",
            ("TypeError",),
            "x",
        ),
        ("im2col-str-array", "tl.conv.im2col(np.full((1, 1, 3, 3), 'a'), 2, backend='numpy')", ("TypeError",), "x"),
        (
            "conv2d-huge-valid-stride-numpy",
            "np.testing.assert_array_equal(tl.conv.conv2d(x, w, stride=2**62, backend='numpy'), ref)",
            OK,
            "",
            # a 1x1 kernel of ones with a stride past the input keeps the top-left pixel (torch's conv2d gives the same)
            """
            x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
            w = np.ones((1, 1, 1, 1), np.float32)
            ref = x[:, :, :1, :1]
            """,
        ),
        (
            "max_pool2d-int-keeps-dtype",
            "assert y.dtype == np.int64 and y.data.tolist() == [[[[5, 7], [13, 15]]]]",
            OK,
            "",
            "y = tl.nn.functional.max_pool2d(tl.Tensor(np.arange(16).reshape(1, 1, 4, 4)), 2)",
        ),
        *_policy_rows("conv"),
    ],
    "quant": [
        ("qparams-nan", "tl.quant.calculate_qparams(float('nan'), 1.0)", TV, "min_val"),
        ("qparams-bad-dtype", "tl.quant.calculate_qparams(0.0, 1.0, dtype='int7')", TV, "dtype"),
        ("quantize-str-scale", "tl.quant.quantize(np.ones(3), 'a', 0)", TV, "scale"),
        ("quantize-zero-scale", "tl.quant.quantize(np.ones(3), 0.0, 0)", TV, "scale"),
        ("quantize-zp-out-of-range", "tl.quant.quantize(np.ones(3), 0.1, 1000)", TV, "zero_point"),
        ("quantize-strings", "tl.quant.quantize(np.array(['a']), 0.1, 0)", TV, "x"),
        ("fp8-bad-fmt", "tl.quant.fp8_encode(np.ones(3), fmt='e3m3')", TV, "fmt"),
        ("pack_int4-huge", "tl.quant.pack_int4(np.array([65539, 65535]))", ("ValueError",), "q"),
        ("unpack_int4-negative-n", "tl.quant.unpack_int4(np.zeros(2, np.uint8), -1)", TV, "n"),
        ("int8_gemm-float", "tl.quant.int8_gemm(np.ones((2, 2)), np.ones((2, 2), np.int8))", TV, "a_int8"),
        ("int8_gemm-mismatch", "tl.quant.int8_gemm(np.ones((2, 3), np.int8), np.ones((2, 2), np.int8))", TV, "b_int8"),
        ("requantize-range", "tl.quant.requantize(np.ones(3, np.int32), 0.5, 0, 1000, -1000)", TV, "quant_"),
        (
            "requantize-nan",
            "tl.quant.requantize(np.ones(3, np.int32), float('nan'), 0, -128, 127)",
            ("ValueError",),
            "multiplier",
        ),
        ("groupwise-bad-bits", "tl.quant.quantize_groupwise(np.ones((2, 8)), group_size=4, bits=0)", TV, "bits"),
        ("groupwise-zero-group", "tl.quant.quantize_groupwise(np.ones((2, 8)), group_size=0)", TV, "group_size"),
        ("observer-strings", "tl.quant.MinMaxObserver()(np.array(['a', 'b']))", TV, "x"),
        *[(f"observer-ignores-nan-{o}", _OBSERVER_NAN.format(obs=o), OK, "") for o in _OBSERVERS],
        ("observer-all-nan", "tl.quant.MinMaxObserver()(np.full(8, np.nan, np.float32))", ("ValueError",), "NaN"),
        *[
            (f"requantize-{name}", f"tl.quant.requantize(np.array([1, 2000], np.int32), {args})", ("ValueError",), frag)
            for name, args, frag in (
                ("zp-out-of-range", "0.5, 1000, -128, 127", "zero_point"),
                ("min-above-max", "0.5, 0, 10, -10", "quant_min"),
                ("min-below-int8", "0.5, 0, -1000, 127", "quant_min"),
            )
        ],
        *[
            (f"weight_observer-bits-{b}", f"tl.quant.modules.weight_observer(bits={b})", ("ValueError",), "bits")
            for b in (0, 1, 33)
        ],
        *_policy_rows("quant"),
    ],
    "prune": [
        ("l1-amount-negative", "tl.prune.l1_unstructured(tl.nn.Linear(2, 2), 'weight', -0.5)", TV, "amount"),
        ("l1-amount-too-big", "tl.prune.l1_unstructured(tl.nn.Linear(2, 2), 'weight', 10)", TV, "amount"),
        (
            "l1-no-such-param",
            "tl.prune.l1_unstructured(tl.nn.Linear(2, 2), 'nope', 0.5)",
            TV + ("AttributeError",),
            "nope",
        ),
        ("sparsity-str", "tl.prune.sparsity('abc')", ("TypeError",), "module_or_array"),
        ("AGP-nan", "tl.prune.AGPSchedule(0.0, float('nan'), 0, 10)", TV, "final_sparsity"),
        ("AGP-end-before-start", "tl.prune.AGPSchedule(0.0, 0.5, 10, 5)", TV, "end_step"),
        ("n_m-n-gt-m", "tl.prune.n_m_mask(np.ones((2, 8)), n=5, m=4)", TV, "n"),
        *_policy_rows("prune"),
    ],
    "sparse": [
        ("CSR-float-shape", "tl.sparse.CSR([0, 1], [0], [1.0], (1, 4.7))", ("TypeError",), "shape"),
        ("CSR-index-overflow", "tl.sparse.CSR([0, 1], [2**32 + 1], [1.0], (1, 4))", ("ValueError",), "indices"),
        ("CSR-indptr-decreasing", "tl.sparse.CSR([0, 2, 1], [0, 1], [1.0, 2.0], (2, 4))", TV, "indptr"),
        ("CSR-from-3d", "tl.sparse.CSR.from_dense(np.ones((2, 2, 2)))", TV, "a"),
        (
            "CSR-matmul-mismatch",
            "tl.sparse.CSR.from_dense(np.eye(3, dtype=np.float32)).matmul(np.ones((4, 2), np.float32))",
            TV,
            "shape",
        ),
        (
            "ELL-matmul-cpp-mismatch",
            "tl.sparse.ELL.from_dense(np.eye(3, dtype=np.float32)).matmul(np.ones((4, 2), np.float32), backend='cpp')",
            TV,
            "shape",
        ),
        ("BSR-zero-block", "tl.sparse.BSR.from_dense(np.ones((4, 4)), 0)", TV, "block_size"),
        ("BSR-block-not-divisor", "tl.sparse.BSR.from_dense(np.ones((4, 4)), 3)", TV, "block_size"),
        *[
            (
                f"{fmt}-corrupted-indices-{backend}",
                _SPARSE_CORRUPT.format(backend=backend),
                ("ValueError", "IndexError"),
                "",
                f"s = tl.sparse.{fmt}.from_dense(np.eye(4, dtype=np.float32))",
            )
            for fmt in ("CSR", "ELL")
            for backend in ("numpy", "numba", "cpp")
        ],
        *[
            (
                f"CSR-unchecked-{name}-{backend}-{kind}",
                f"tl.sparse.CSR({indptr}, [0, 1, 2], np.ones(3, np.float32), (3, 3), check=False)"
                f".matmul(np.ones({xshape}, np.float32), backend='{backend}')",
                ("ValueError",),
                "indptr",
            )
            for name, indptr in (
                ("indptr-past-nnz", "[0, 1, 2, 1000]"),
                ("indptr-decreasing", "[0, 3, 1, 3]"),
                ("indptr-not-from-0", "[-2, 1, 2, 3]"),
                ("indptr-short", "[0, 3]"),
            )
            for backend in ("numpy", "numba", "cpp")
            for kind, xshape in (("spmv", "3"), ("spmm", "(3, 2)"))
        ],
        *[
            (
                f"CSR-unchecked-column-{col}-{backend}",
                f"tl.sparse.CSR([0, 1, 2, 3], [0, {col}, 2], np.ones(3, np.float32), (3, 3), check=False)"
                f".matmul(np.ones((3, 2), np.float32), backend='{backend}')",
                ("ValueError",),
                "column",
            )
            for col in (-5, 3, 2**31 - 1)
            for backend in ("numpy", "numba", "cpp")
        ],
        *[
            (
                f"BSR-unchecked-indptr-{backend}",
                "tl.sparse.BSR([0, 2, 1], [0, 1], np.ones((2, 2, 2), np.float32), (4, 4), check=False)"
                f".matmul(np.ones(4, np.float32), backend='{backend}')",
                ("ValueError",),
                "indptr",
            )
            for backend in ("numpy", "cpp")
        ],
        (
            "CSR-unchecked-to_dense",
            "tl.sparse.CSR([0, 5, 2, 3], [0, 1, 2], np.ones(3), (3, 3), check=False).to_dense()",
            ("ValueError",),
            "indptr",
        ),
        *_policy_rows("sparse"),
    ],
    "kernels": [
        ("softmax-str", "tl.kernels.softmax('abc')", TV, "x"),
        ("softmax-dim-oob", "tl.kernels.softmax(np.ones((2, 3), np.float32), dim=5)", TV + ("IndexError",), "dim"),
        (
            "layer_norm-eps-nan",
            "tl.kernels.layer_norm(np.ones((2, 3)), np.ones(3), np.zeros(3), eps=float('nan'))",
            TV,
            "eps",
        ),
        ("layer_norm-weight-shape", "tl.kernels.layer_norm(np.ones((2, 3)), np.ones(4), np.zeros(4))", TV, "weight"),
        (
            "bias_gelu-bias-shape",
            "tl.kernels.bias_gelu(np.ones((2, 3), np.float32), np.ones(4, np.float32))",
            TV,
            "bias",
        ),
        (
            "bias_gelu-approximate",
            "tl.kernels.bias_gelu(np.ones((2, 3), np.float32), np.ones(3, np.float32), approximate='x')",
            TV,
            "approximate",
        ),
        ("flash-1d", "q = np.ones(8, np.float32); tl.kernels.flash_attention(q, q, q)", TV, "q"),
        (
            "flash-block-zero-cpu",
            "q = np.ones((1, 1, 4, 8), np.float32); tl.kernels.flash_attention(q, q, q, block_size=0, backend='cpu')",
            TV,
            "block_size",
        ),
        (
            "flash-block-negative-cpu",
            "q = np.ones((1, 1, 4, 8), np.float32); tl.kernels.flash_attention(q, q, q, block_size=-3, backend='cpu')",
            TV,
            "block_size",
        ),
        (
            "kernels.softmax-dim-float",
            "tl.kernels.softmax(np.ones((2, 3), np.float32), dim=1.0)",
            ("TypeError",),
            "dim",
        ),
        (
            "flash-huge-block-capped-cpp",
            """
            a = tl.kernels.flash_attention(q, k, v, block_size=10**6, backend="cpp")
            b = tl.kernels.flash_attention(q, k, v, backend="numpy")
            assert float(np.abs(a - b).max()) < 1e-5
            """,
            OK,
            "",
            "q, k, v = (np.random.default_rng(0).standard_normal((3, 2, 9, 8)).astype(np.float32))",
        ),
        (
            "flash-zero-queries-every-backend",
            """
            for backend in tl.kernels.available_backends():
                out = tl.kernels.flash_attention(q, k, k, backend=backend)
                assert out.shape == (2, 0, 8), (backend, out.shape)
            """,
            OK,
            "",
            "q, k = np.zeros((2, 0, 8), np.float32), np.ones((2, 5, 8), np.float32)",
        ),
        *_policy_rows("kernels"),
    ],
    "dist": [
        (
            "predict-nan-bytes",
            "tl.dist.cost_model.predict('ring', float('nan'), 4, 1e-5, 1e-10)",
            ("ValueError",),
            "nbytes",
        ),
        ("predict-bad-algorithm", "tl.dist.cost_model.predict('nope', 1e6, 4, 1e-5, 1e-10)", TV, "algorithm"),
        ("simulate-world-zero", "tl.dist.simulate('ring', 0, 1e6)", TV, "world_size"),
        ("simulate-nan-alpha", "tl.dist.simulate('tree', 4, 1e6, alpha_s=float('nan'))", TV, "alpha_s"),
        ("ring_schedule-rank-oob", "tl.dist.ring_schedule(5, 0, 4)", TV + ("IndexError",), "rank"),
        ("bounds-negative", "tl.dist.bounds(-1, 2)", TV, "n"),
        ("launch-world-zero", "tl.dist.launch(print, 0)", TV, "world_size"),
        (
            "all_reduce-no-group",
            "import torch; tl.dist.all_reduce(torch.ones(2))",
            TV + ("RuntimeError",),
            "not initialized",
        ),
        (
            "predict-nan-alpha",
            "tl.dist.cost_model.predict('ring', 1024, 4, float('nan'), 1e-10)",
            ("ValueError",),
            "alpha_s",
        ),
        (
            "simulate-ring-nan-alpha",
            "tl.dist.simulate('ring', 4, 1024, alpha_s=float('nan'))",
            ("ValueError",),
            "alpha_s",
        ),
        # a different chunk_bytes used to abort the rank inside gloo, a different node_size to deadlock until timeout
        (
            "all_reduce-chunk_bytes-differs-across-ranks",
            "tl.dist.launch(_ar_chunk, 2, timeout_s=60)",
            ("ValueError", "RuntimeError"),
            "chunk_bytes: mismatch across ranks",
            "from test_bad_input import _ar_chunk",
        ),
        (
            "all_reduce-node_size-differs-across-ranks",
            "tl.dist.launch(_ar_node_size, 4, timeout_s=60)",
            ("ValueError", "RuntimeError"),
            "node_size: mismatch across ranks",
            "from test_bad_input import _ar_node_size",
        ),
    ],
    "memory": [
        ("malloc-negative", "tl.memory.FirstFitAllocator(1024).malloc(-5)", TV, "nbytes"),
        (
            "malloc-huge-cpp",
            "tl.memory.BuddyAllocator(1 << 16, backend='cpp').malloc(2**62)",
            TV + ("MemoryError",),
            "nbytes",
        ),
        ("free-foreign-cpp", "tl.memory.BumpAllocator(1024, backend='cpp').free(7)", TV, "offset"),
        ("Buddy-capacity-str", "tl.memory.BuddyAllocator('big')", TV, "capacity"),
        (
            "Caching-split-negative",
            "tl.memory.CachingAllocator(1 << 20, max_split_size=-5)",
            ("ValueError",),
            "max_split_size",
        ),
        ("Slab-empty-sizes", "tl.memory.SlabAllocator([])", TV, "sizes"),
        ("plan-negative-size", "tl.memory.plan([(-4, 0, 1)])", TV, "size"),
        ("plan-last-before-first", "tl.memory.plan([(4, 3, 1)])", TV, "last_use"),
        ("align_up-zero", "tl.memory.align_up(5, 0)", TV, "a"),
        ("next_pow2-negative", "tl.memory.next_pow2(-3)", TV, "n"),
        ("random_ops-negative", "tl.memory.random_ops(-1)", TV, "n_ops"),
        *[
            (
                f"malloc-{bad!r}-{backend}",
                "try:\n    a.malloc(bad)\nfinally:\n    assert a.stats()['n_alloc'] == 0",
                ("TypeError",),
                "nbytes",
                f"a = tl.memory.FirstFitAllocator(1 << 16, backend={backend!r}); bad = {bad!r}",
            )
            for backend in ("python", "cpp")
            for bad in (True, 1.5, None, "64")
        ],
        *[
            (
                f"free-{bad!r}-{backend}",
                f"tl.memory.FirstFitAllocator(1 << 16, backend={backend!r}).free({bad!r})",
                ("TypeError",),
                "offset",
            )
            for backend in ("python", "cpp")
            for bad in (1.5, None, "0")
        ],
        (
            "replay-bad-ops",
            "tl.memory.FirstFitAllocator(1 << 16).replay(np.array([[0, 5, 64]]))",
            ("ValueError",),
            "ops",
        ),
    ],
    "parallel": [
        ("bubble-unknown", "tl.parallel.bubble_fraction('nope', 4, 8)", TV, "name"),
        ("bubble-zero-stages", "tl.parallel.bubble_fraction('1f1b', 0, 8)", TV, "n_stages"),
        ("schedule-negative-mb", "tl.parallel.pipeline_schedule('gpipe', 2, -1)", TV, "n_microbatches"),
        ("zero-stage-7", "tl.parallel.zero_memory_per_rank(10**6, 7, 4)", TV, "stage"),
        ("shard_bounds-rank-oob", "tl.parallel.shard_bounds(10, 4, 9)", TV + ("IndexError",), "rank"),
        (
            "plan_3d-nan-memory",
            "tl.parallel.plan_3d(8, 10**9, 24, 2048, 1024, 64, float('nan'))",
            TV,
            "memory_per_rank_bytes",
        ),
        # plan_3d used to loop over every integer up to world_size: divisors from the factorisation now
        (
            "plan_3d-world-1e9",
            "assert isinstance(tl.parallel.plan_3d(10**9, 10**9, 24, 2048, 1024, 64, 8e10), list)",
            OK,
            "",
        ),
        ("plan_3d-world-prime", "assert tl.parallel.plan_3d(2**61 - 1, 10**9, 24, 2048, 1024, 64, 8e10) == []", OK, ""),
        ("plan_3d-world-2**64", "tl.parallel.plan_3d(2**64, 10**9, 24, 2048, 1024, 64, 8e10)", TV, "world_size"),
        ("plan_3d-world-float", "tl.parallel.plan_3d(8.0, 10**9, 24, 2048, 1024, 64, 8e10)", TV, "world_size"),
        # a parameter listed twice was updated twice (stages 1/2) or crashed the rank (stage 3): refused up front
        (
            "ZeroOptimizer-param-listed-twice",
            "tl.parallel.ZeroOptimizer([w, w], torch.optim.SGD, stage=3, lr=0.1)",
            ("ValueError",),
            "params[1]",
            "import torch; w = torch.nn.Parameter(torch.ones(3))",
        ),
        (
            "ZeroOptimizer-bucket-cap-zero",
            "tl.parallel.ZeroOptimizer([w], torch.optim.SGD, stage=2, bucket_cap_bytes=0, lr=0.1)",
            TV,
            "bucket_cap_bytes",
            "import torch; w = torch.nn.Parameter(torch.ones(3))",
        ),
    ],
    "gemm": [
        ("matmul-int", "tl.gemm.matmul(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32))", TV, "a"),
        ("matmul-1d", "tl.gemm.matmul(np.ones(2, np.float32), np.ones((2, 2), np.float32))", TV, "a"),
        (
            "matmul-bad-version",
            "tl.gemm.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), backend='cpp', version='warp')",
            TV,
            "version",
        ),
        ("roofline-nan", "tl.gemm.roofline(float('nan'), 1e6, 100.0, 10.0)", TV, "flops"),
        ("roofline-negative-bytes", "tl.gemm.roofline(1e9, -1.0, 100.0, 10.0)", TV, "nbytes"),
        ("occupancy-zero-threads", "tl.gemm.occupancy(0, 32, 0)", TV, "threads_per_block"),
        ("occupancy-bad-arch", "tl.gemm.occupancy(128, 32, 0, arch='sm_1')", TV, "arch"),
        ("pack_a-zero-mr", "tl.gemm.pack_a(np.ones((4, 4), np.float32), 0)", TV, "mr"),
        *[
            (
                f"C-{fn}-threads-{name}",
                f"tl.backends.load_C('gemm').{call.format(t=t)}",
                excs,
                "threads",
            )
            for fn, call in (
                ("matmul", "matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32), threads={t})"),
                ("fma_peak", "fma_peak(iters=1000, threads={t}, repeat=1)"),
            )
            for name, t, excs in (
                ("negative", "-1", ("ValueError",)),
                ("float", "2.0", ("TypeError",)),
                ("bool", "True", ("TypeError",)),
                ("str", "'4'", ("TypeError",)),
                ("100000", "100000", OK),
                ("huge", "10**30", OK),
            )
        ],
    ],
    "inference": [
        ("GPTConfig-heads", "tl.inference.GPTConfig(10, 30, 4, 1, 16)", TV, "n_heads"),
        ("GPTConfig-negative-vocab", "tl.inference.GPTConfig(-10, 32, 4, 1, 16)", TV, "vocab_size"),
        ("top_k-negative", "tl.inference.top_k_filter(np.ones(4) / 4, -1)", TV, "k"),
        ("top_p-nan", "tl.inference.top_p_filter(np.ones(4) / 4, float('nan'))", TV, "top_p"),
        ("PagedKVCache-zero-blocks", "tl.inference.PagedKVCache(1, 1, 8, 0)", TV, "num_blocks"),
        ("blocks_needed-zero-block", "tl.inference.blocks_needed(10, 0)", TV, "block_size"),
        ("rope-odd-dim", "tl.inference.rope_tables(16, 7)", TV, "head_dim"),
        ("poisson-nan-rate", "tl.inference.poisson_requests(4, float('nan'))", TV, "rate"),
        ("serving-bad-policy", "tl.inference.simulate_serving([], policy='nope')", TV, "policy"),
        *[
            (cid, stmt, excs, arg, "m = tl.inference.TinyGPT(16, 16, 2, 1, 32)")
            for cid, stmt, excs, arg in (
                ("generate-float-ids", "tl.inference.generate(m, [1.7, 2.9], 2)", ("TypeError",), "prompt_ids"),
                ("generate-str-ids", "tl.inference.generate(m, ['a'], 2)", ("TypeError",), "prompt_ids"),
                ("generate-bool-ids", "tl.inference.generate(m, [1, True], 2)", ("TypeError",), "prompt_ids"),
                ("generate-empty-prompt", "tl.inference.generate(m, [], 2)", TV, "prompt_ids"),
                ("generate-bool-max-new", "tl.inference.generate(m, [1], True)", TV, "max_new_tokens"),
                ("generate-float-seed", "tl.inference.generate(m, [1], 2, temperature=1.0, seed=1.5)", TV, "seed"),
                ("generate-str-kv-cache", "tl.inference.generate(m, [1], 2, kv_cache='no')", TV, "kv_cache"),
                ("generate-np-int-ok", "assert len(tl.inference.generate(m, np.array([1]), np.int64(2))) == 2", OK, ""),
            )
        ],
        ("filter_probs-nan", "tl.inference.filter_probs([float('nan'), 1.0])", ("RuntimeError",), "logits"),
        ("filter_probs-all-masked", "tl.inference.filter_probs([-np.inf, -np.inf])", ("RuntimeError",), "logits"),
        *[
            (cid, f"tl.inference.sample_from(np.array({p}), np.random.default_rng(0))", ("RuntimeError",), "probs")
            for cid, p in (
                ("sample_from-nan", "[np.nan, 0.5]"),
                ("sample_from-negative", "[-1.0, 2.0]"),
                ("sample_from-all-zero", "[0.0, 0.0, 0.0]"),
            )
        ],
        ("sample_from-int-rng", "tl.inference.sample_from(np.ones(2) / 2, 0)", TV, "rng"),
        (
            "paged-int8-inf",
            "c.append(s, 0, np.array([[[np.inf, 1, 2, 3]]], np.float32), np.ones((1, 1, 4), np.float32))",
            TV,
            "k",
            "c = tl.inference.PagedKVCache(1, 1, 4, 4, 2, dtype='int8'); s = c.new_sequence()",
        ),
        ("quantize_int8-nan", "tl.inference.quantize_int8(np.array([[[np.nan, 1.0]]]))", TV, "x"),
        ("blocks_needed-float", "tl.inference.blocks_needed(10.5, 3)", TV, "n_tokens"),
        ("kv_bytes-negative", "tl.inference.kv_bytes_per_token(-1, 2, 3)", TV, "n_layers"),
        ("priority_keep-nan", "tl.inference.priority_keep([float('nan'), 1.0], 1)", TV, "scores"),
        ("dense_attention-1d", "tl.inference.dense_attention(np.ones(4), np.ones(4), np.ones(4))", TV, "q"),
        ("accept_draft-nan", "tl.inference.accept_draft(float('nan'), 0.5, 0.3)", TV, "p_x"),
        ("poisson-negative-len", "tl.inference.poisson_requests(2, 1.0, prompt_len=(-10, 5))", TV, "prompt_len"),
        ("causal_mask-float", "tl.inference.causal_mask(1.5, 0)", TV, "t"),
        ("GPTConfig-rope-str", "tl.inference.GPTConfig(16, 16, 2, 1, 32, rope='x')", TV, "rope"),
        ("GPTConfig-np-int-ok", "assert tl.inference.GPTConfig(np.int64(16), 16, 2, 1, 32).vocab_size == 16", OK, ""),
        ("delta_compress-nan", "tl.inference.delta_compress(np.array([[np.nan, 1.0]]), 0.1)", TV, "x"),
        ("weighted_tail-nan", "tl.inference.weighted_tail_latency([float('nan')], [1.0])", TV, "latencies"),
    ],
    "compiler": [
        ("compile-bad-backend", "tl.compile(lambda x: x, backend='tpu')", TV, "backend", _CSETUP),
        ("compile-bad-mode", "tl.compile(lambda x: x, mode='fast')", TV, "mode", _CSETUP),
        ("compile-not-callable", "tl.compile(3)", TV, "fn", _CSETUP),
        ("mark_dynamic-bad-dim", "tl.compiler.mark_dynamic(tl.ones(2, 3), 5)", TV, "dim", _CSETUP),
        ("regalloc-zero-registers", "C.regalloc.chaitin_briggs(C.regalloc.sum_of_squares_loop(), 0)", TV, "k", _CSETUP),
        ("linear_scan-negative", "C.regalloc.linear_scan(C.regalloc.sum_of_squares_loop(), -1)", TV, "k", _CSETUP),
        ("list_schedule-str-machine", "C.listsched.list_schedule([], 'zen4')", TV, "machine", _CSETUP),
        ("polyhedral-not-unimodular", "C.polyhedral.check_unimodular([[2, 0], [0, 1]], 2)", TV, "transform", _CSETUP),
        ("polyhedral-unknown-loop", "C.polyhedral.loop_nest([('i', 0, 3)], 'A[i] = A[j]')", TV, "'j'", _CSETUP),
        ("cc-not-cpp", "C.cc.load('this is not C++')", ("RuntimeError",), "compiler", _CSETUP),
        (
            "codegen-int8-kernel",
            "C.codegen_cpp.build(C.kernel_ir.FusedKernel('k', (2,), 0, [], [], [], dtype='int8'))",
            TV,
            "dtype",
            _CSETUP,
        ),
        (
            "kernel-unknown-op",
            "C.loops.lower(C.kernel_ir.FusedKernel('k', (2,), 0, [], [], [C.kernel_ir.Instr(0, 'frobnicate', ())]))",
            TV,
            "frobnicate",
            _CSETUP,
        ),
        (
            "evaluate-wrong-shape",
            "C.kernel_ir.evaluate(C.kernel_ir.FusedKernel('k', (2,), 0, [B('a', (2,), 'float32', (1,))], "
            "[B('o', (2,), 'float32', (1,))], [I(0, 'load', (), 0), I(-1, 'store', (0,), 0)]), [np.ones(3)])",
            TV,
            "arrays[0]",
            _CSETUP,
        ),
    ],
    "serve": [
        ("SamplingParams-max_tokens-0", "SamplingParams(max_tokens=0)", TV, "max_tokens", _SSETUP),
        ("SamplingParams-temperature-neg", "SamplingParams(temperature=-1)", TV, "temperature", _SSETUP),
        ("SamplingParams-top_p-1.5", "SamplingParams(top_p=1.5)", TV, "top_p", _SSETUP),
        ("Engine-unknown-policy", "Engine(m, policy='lifo')", TV, "policy", _SSETUP),
        ("Engine-zero-blocks", "Engine(m, num_blocks=0)", TV, "num_blocks", _SSETUP),
        ("Engine-not-a-model", "Engine('model')", TV, "model", _SSETUP),
        ("add_request-empty", "Engine(m).add_request([])", TV, "prompt", _SSETUP),
        ("add_request-out-of-vocab", "Engine(m).add_request([999])", TV, "prompt", _SSETUP),
        ("add_request-too-long", "Engine(m).add_request(list(range(256)) * 3)", TV, "prompt", _SSETUP),
        ("TieredKVStore-no-fast", "TieredKVStore((2, 2), fast_blocks=0)", TV, "fast_blocks", _SSETUP),
        ("TieredKVStore-disk-no-path", "TieredKVStore((2, 2), fast_blocks=1, disk_blocks=2)", TV, "disk_path", _SSETUP),
        ("DeltaKVStore-neg-threshold", "DeltaKVStore(-0.1)", TV, "threshold", _SSETUP),
        ("DeltaKVStore-keyframe", "DeltaKVStore(0.0, keyframe_every=0)", TV, "keyframe_every", _SSETUP),
        (
            "load_model-missing",
            "checkpoint.load_model('/nonexistent/x.safetensors')",
            ("FileNotFoundError",),
            "path",
            _SSETUP,
        ),  # fmt: skip
        ("StepCostModel-empty-log", "latency.StepCostModel.fit([])", TV, "step_log", _SSETUP),
        ("server-public-host", "server.check_host('0.0.0.0')", TV, "host", _SSETUP),
        ("loadgen-remote-url", "loadgen.run_load('http://example.com:80')", TV, "base_url", _SSETUP),
    ],
    "compress": [
        ("LoRALinear-rank-0", "lora.LoRALinear(lin, r=0, alpha=8)", TV, "r", _KSETUP),
        ("LoRALinear-rank-too-big", "lora.LoRALinear(lin, r=5, alpha=8)", TV, "r", _KSETUP),
        ("LoRALinear-alpha-0", "lora.LoRALinear(lin, r=2, alpha=0)", TV, "alpha", _KSETUP),
        (
            "apply_lora-no-match",
            "lora.apply_lora(tl.nn.Sequential(tl.nn.Linear(4, 4)), target_modules=['q_proj'], r=2, alpha=4)",
            TV,
            "Linear modules in the model",
            _KSETUP,
        ),
        (
            "merge-twice",
            "l = lora.LoRALinear(lin, r=2, alpha=4)\nl.merge()\nl.merge()",
            TV + ("RuntimeError",),
            "merge",
            _KSETUP,
        ),  # fmt: skip
        ("nf4-int-weights", "nf4.nf4_quantize(np.arange(64))", TV, "w", _KSETUP),
        ("nf4-bad-block", "nf4.nf4_quantize(np.ones(64, np.float32), block_size=7)", TV, "block_size", _KSETUP),
        ("distill-T-0", "distill.distill_loss(tl.randn(2, 3), tl.randn(2, 3), T=0, alpha=0.5)", TV, "T", _KSETUP),
        ("distill-alpha", "distill.distill_loss(tl.randn(2, 3), tl.randn(2, 3), T=2, alpha=1.5)", TV, "alpha", _KSETUP),
        ("rsvd-rank-0", "lowrank.randomized_svd(np.ones((4, 4)), 0)", TV, "r", _KSETUP),
        ("energy-above-1", "lowrank.rank_for_energy(np.ones(3), 1.5)", TV, "energy", _KSETUP),
    ],
    "resilience": [
        ("decode-too-many-lost", "erasure.decode([None, None, b'x'], k=2, r=1)", TV, "r = 1", _RSETUP),
        ("young-negative-C", "failure_math.young_interval(-1.0, 100.0)", TV, "checkpoint_s", _RSETUP),
        ("cluster_mtbf-no-nodes", "failure_math.cluster_mtbf(100.0, 0)", TV, "n_nodes", _RSETUP),
        ("save_sharded-object", "sharded.save_sharded({'a': object()}, d + '/x')", TV, "state['a']", _RSETUP),
        ("load_sharded-no-dir", "sharded.load_sharded(d + '/nope')", ("RuntimeError",), "nope", _RSETUP),
        ("load_sharded-rank", "sharded.load_sharded(d + '/ok', world_size=2, rank=5)", TV, "rank", _RSETUP),
        ("Shard-out-of-box", "sharded.Shard(np.ones(4), (3,), (5,))", TV, "global_shape", _RSETUP),
        ("atomic_write-tmp-name", "atomic.atomic_write(d + '/.tmp-x', b'')", TV, "path", _RSETUP),
        ("run-steps-0", "elastic.run(lambda s, st: None, {}, ckpt_dir=d + '/e', steps=0)", TV, "steps", _RSETUP),
        ("protect-r-0", "ec_files.protect(d + '/ok', 0)", TV, "r", _RSETUP),
    ],
    "profiler": [
        ("table-sort_by", "p.table(sort_by='nope')", TV, "sort_by", _PSETUP),
        ("trace-missing-dir", "p.export_chrome_trace('/nonexistent_dir/x.json')", TV, "path", _PSETUP),
        ("record_function-name", "with pf.record_function(3):\n    pass", TV, "name", _PSETUP),
        ("HotspotMonitor-threshold", "pf.HotspotMonitor(threshold_fraction=2.0)", TV, "threshold_fraction", _PSETUP),
        ("HotspotMonitor-retune", "pf.HotspotMonitor().check(p, 3)", TV, "retune", _PSETUP),
        ("roofline-peak", "p.roofline(peak_gflops=-1)", TV, "peak_gflops", _PSETUP),
    ],
    "tune": [
        ("tune-budget-0", "tn.tune('gemm.matmul', sh, budget=0, store=False)", TV, "budget", _TSETUP),
        ("tune-searcher", "tn.tune('gemm.matmul', sh, searcher='beam', store=False)", TV, "searcher", _TSETUP),
        ("tune-shape-negative", "tn.tune('gemm.matmul', {'M': -8, 'N': 8, 'K': 8}, store=False)", TV, "shape", _TSETUP),
        ("tune-shape-missing", "tn.tune('gemm.matmul', {'M': 8}, store=False)", TV, "shape", _TSETUP),
        ("tune-unknown-op", "tn.tune('gemm.nothing', sh, store=False)", TV, "op", _TSETUP),
        ("set_mode-unknown", "tn.set_mode('fast')", TV, "mode", _TSETUP),
        ("tune_compiled-not-compiled", "tn.tune_compiled(lambda x: x)", TV, "compiled", _TSETUP),
        ("UCB1-no-arms", "tn.UCB1([])", TV, "arms", _TSETUP),
        ("UCB1-negative-c", "tn.UCB1([1, 2], c=-1)", TV, "c", _TSETUP),
        ("CostModel-kind", "tn.CostModel(sp, kind='svm')", TV, "kind", _TSETUP),
        ("measure_config-partial", "tn.measure_config(sp, {'mc': 3}, ())", TV, "config", _TSETUP),
        ("VariantClusters-k-0", "tn.VariantClusters(sp, 0)", TV, "k", _TSETUP),
        ("ARPredictor-order", "tn.ARPredictor(order=-1)", TV, "order", _TSETUP),
        ("ARPredictor-exog-str", "tn.ARPredictor(exog='batch_size')", TV, "exog", _TSETUP),
        ("ProxyParams-lanes", "tn.ProxyParams('x', 1.0, 0, 6, 16, 100.0, 10.0, 32.0, 1 << 20)", TV, "lanes", _TSETUP),
        ("Space-empty", "tunable.Space('x', (), *[None] * 4)", TV, "params", _TSETUP),
        ("Param-repeats", "tunable.Param('mc', (1, 1))", TV, "values", _TSETUP),
    ],
    "sched": [
        ("Job-steps-negative", "sc.Job('a', -1)", TV, "steps", _SCSETUP),
        ("Job-est-nan", "sc.Job('a', 1, est_step_s=float('nan'))", TV, "est_step_s", _SCSETUP),
        ("submit-demand-negative", "c.submit(sc.Job('a', 1), demand={'cpu': -1})", TV, "demand", _SCSETUP),
        ("submit-larger-than-cluster", "c.submit(sc.Job('b', 1), demand={'cpu': 3})", TV, "demand", _SCSETUP),
        ("submit-deadline-past", "c.submit(sc.Job('d', 1), deadline_s=-1.0)", TV, "deadline_s", _SCSETUP),
        ("submit-at-nan", "c.submit(sc.Job('e', 1), at_s=float('nan'))", TV, "at_s", _SCSETUP),
        ("submit-duplicate-name", "c.submit(sc.Job('kept', 2))", TV, "name", _SCSETUP),
        ("submit-lost-nothing", "assert [js.name for js in c.queue] == ['kept']", OK, "", _SCSETUP),
        ("run-timeout-0", "c.run(timeout_s=0)", TV, "timeout_s", _SCSETUP),
        ("Cluster-preempt", "sc.Cluster(preempt='migrate')", TV, "preempt", _SCSETUP),
        ("Cluster-step-timeout", "sc.Cluster(step_timeout_s=-1)", TV, "step_timeout_s", _SCSETUP),
        ("make_policy-unknown", "sc.make_policy('lottery')", TV, "policy", _SCSETUP),
        ("Simulator-capacity", "sc.Simulator({'gpu': -1}, sc.FIFO())", TV, "devices", _SCSETUP),
        (
            "Simulator-job-too-big",
            "sc.Simulator({'gpu': 4}, sc.FIFO()).simulate([(0.0, sc.Job('big', 1, {'gpu': 8}))])",
            TV,
            "demand",
            _SCSETUP,
        ),  # fmt: skip
        ("synthetic_trace-n", "sc.synthetic_trace(-1, 64, 1.5, 0)", TV, "n_jobs", _SCSETUP),
        ("synthetic_trace-load", "sc.synthetic_trace(10, 64, -1.5, 0)", TV, "load", _SCSETUP),
        ("PID-gain", "sc.PID(-1, 0, 0, 100, 0, 1)", TV, "kp", _SCSETUP),
        ("PID-limits", "sc.PID(1, 0, 0, 100, 5, 1)", TV, "out_min", _SCSETUP),
        ("shapley_mc-samples", "sc.shapley_mc(['a', 'b'], lambda s: 1.0, samples=0)", TV, "samples", _SCSETUP),
        ("drf-capacity", "sc.drf_allocate({'cpu': -9}, {'A': {'cpu': 1}})", TV, "capacity", _SCSETUP),
        ("auction-negative-bid", "sc.second_price_auction({'a': -1.0, 'b': 2.0})", TV, "bids", _SCSETUP),
        ("WeightedFair-quota", "sc.WeightedFair(quota={'A': -1})", TV, "quota", _SCSETUP),
        ("PowerCapAllocator-cap", "sc.PowerCapAllocator(cap_w=-5)", TV, "cap_w", _SCSETUP),
    ],
    "longctx": [
        ("MoE-top_k-above-experts", "lc.MoE(8, 16, 1, top_k=2)", TV, "top_k", _LSETUP),
        ("MoE-top_k-3", "lc.MoE(8, 16, 4, top_k=3)", TV, "top_k", _LSETUP),
        ("MoE-capacity-0", "lc.MoE(8, 16, 4, capacity_factor=0)", TV, "capacity_factor", _LSETUP),
        ("MoE-aux-loss", "lc.MoE(8, 16, 4, aux_loss='x')", TV, "aux_loss", _LSETUP),
        ("capacity-no-experts", "lc.capacity(16, 0, 1, 1.0)", TV, "num_experts", _LSETUP),
        ("zigzag-seq-not-divisible", "lc.zigzag_shard(torch.ones(1, 8, 4), 0, 3)", TV, "seq", _LSETUP),
        ("zigzag-rank", "lc.zigzag_shard(torch.ones(1, 8, 4), 5, 2)", TV, "rank", _LSETUP),
        (
            "ring-without-process-group",
            "lc.ring_attention(*[torch.ones(1, 1, 8, 4)] * 3)",
            ("RuntimeError",),
            "torch.distributed is not initialized",
            _LSETUP,
        ),  # fmt: skip
        ("ring_bytes-negative", "lc.ring_bytes(-1, 2, 2, 2, 2)", TV, "batch", _LSETUP),
        ("sp_bytes-seq", "lc.sp_bytes(1, 7, 4, 2)", TV, "seq", _LSETUP),
        ("block-sparse-layout-str", "lc.block_sparse_attention(*qkv, 'x')", TV, "pattern", _LSETUP),
        ("layout-block-0", "lc.local(1).layout(64, 64, 0)", TV, "block_size", _LSETUP),
        ("global-tokens-negative", "lc.global_tokens(-1)", TV, "n", _LSETUP),
        ("soft-matching-nan", "lc.bipartite_soft_matching(np.full((4, 8), np.nan), 1)", TV, "metric", _LSETUP),
        ("plan_replication-world-0", "lc.plan_replication([1, 2], 0)", TV, "world_size", _LSETUP),
        ("search_patterns-budget", "lc.search_patterns((np.ones((2, 2)), np.ones((2, 2))), -1)", TV, "budget", _LSETUP),
        (
            "search_patterns-method",
            "lc.search_patterns((np.ones((2, 2)), np.ones((2, 2))), 4, method='beam')",
            TV,
            "method",
            _LSETUP,
        ),  # fmt: skip
        (
            "quant_matching-bound",
            "x = np.ones((8, 4), np.float32)\nlc.quant_aware_matching(x, x, 2, -0.1)",
            TV,
            "bound",
            _LSETUP,
        ),  # fmt: skip
        ("int8_roundtrip-nan", "lc.int8_roundtrip(np.array([[1.0, np.nan]]))", TV, "x", _LSETUP),
    ],
    "amp": [
        ("GradScaler-negative", "tl.amp.GradScaler(init_scale=-1.0)", TV, "init_scale"),
        ("GradScaler-nan-growth", "tl.amp.GradScaler(growth_factor=float('nan'))", TV, "growth_factor"),
        ("fp4_encode-str", "tl.amp.fp4_encode('abc')", TV, "x"),
        ("mx-zero-block", "tl.amp.mx_quantize(np.ones(32, np.float32), block_size=0)", TV, "block_size"),
        ("mx-bad-fmt", "tl.amp.mx_quantize(np.ones(32, np.float32), fmt='fp3')", TV, "fmt"),
        ("int2-zero-scale", "tl.amp.int2_quantize(np.ones(4), 0.0)", TV, "scale"),
        ("allocate_bits-nan", "tl.amp.allocate_bits([1.0, float('nan')], [np.ones(4), np.ones(4)])", TV, "traces"),
        ("round_to_bf16-str", "tl.amp.round_to_bf16('abc')", TV, "x"),
        ("absmax_scale-nan", "tl.amp.absmax_scale(np.array([np.nan, 1.0]), 'fp4')", TV, "x"),
        ("absmax_scale-inf", "tl.amp.absmax_scale(np.array([np.inf]), 'int2')", TV, "x"),
        ("int2-nan", "tl.amp.int2_quantize(np.array([np.nan]), 1.0)", TV, "x"),
        ("int2-str-scale", "tl.amp.int2_quantize(np.ones(2), 'a')", TV, "scale"),
        ("quantize_symmetric-nan", "tl.amp.quantize_symmetric(np.array([np.nan, 1.0]), 4)", TV, "w"),
        ("mx-bool-block", "tl.amp.mx_quantize(np.ones(32, np.float32), block_size=True)", TV, "block_size"),
        ("mx-axis-out-of-range", "tl.amp.mx_quantize(np.ones(32, np.float32), axis=5)", ("IndexError",), "axis"),
        ("mx_bits-zero-block", "tl.amp.mx_bits_per_element('fp4_e2m1', 0)", TV, "block_size"),
        ("mx_bits-bad-fmt", "tl.amp.mx_bits_per_element('x')", TV, "fmt"),
        ("mx_dequantize-garbage", "tl.amp.mx_dequantize(np.ones(2), np.ones(3))", TV, "shared_exp"),
        ("GradScaler-str-scale", "tl.amp.GradScaler(init_scale='a')", TV, "init_scale"),
        ("GradScaler-int-enabled", "tl.amp.GradScaler(enabled=1)", TV, "enabled"),
        ("GradScaler-nan-new-scale", "tl.amp.GradScaler().update(new_scale=float('nan'))", TV, "new_scale"),
        (
            "GradScaler-step-twice",
            "s.step(opt)",
            ("RuntimeError",),
            "step() has already been called",
            "p = tl.nn.Parameter(tl.ones(2)); opt = tl.optim.SGD([p], lr=1.0); s = tl.amp.GradScaler()\n"
            "s.scale(p.sum()).backward(); s.step(opt)",
        ),
        ("update_scale-nan", "tl.amp.update_scale(float('nan'), 0, False, 2.0, 0.5, 10)", TV, "scale"),
        ("autocast-torch-dtype-ok", "import torch\nwith tl.autocast(dtype=torch.bfloat16): pass", OK, ""),
        ("autocast-int-dtype", "tl.autocast(dtype=3)", TV, "dtype"),
        ("autocast-garbage-dtype", "tl.autocast(dtype='garbage')", TV, "dtype"),
        ("op_category-int", "tl.amp.op_category(3)", TV, "fn_class"),
        ("allowed_formats-empty", "tl.amp.allowed_formats({})", TV, "s"),
        (
            "allocate_bits-float-bits",
            "tl.amp.allocate_bits([1.0], [np.ones(4)], candidates=(2.5, 4))",
            TV,
            "candidates",
        ),
        ("ShardedAdam-str-feedback", "tl.amp.ShardedLowPrecisionAdam(4, error_feedback='no')", TV, "error_feedback"),
        ("quantize_state-int8-nan", "tl.amp.quantize_state(np.array([np.nan], np.float32), 'int8')", TV, "x"),
        ("lowrank_factors-nan", "tl.amp.lowrank_factors(np.full((3, 3), np.nan), 0.1)", TV, "x"),
        ("select_by_priority-str", "tl.amp.select_by_priority('a', [1.0], 1.0)", TV, "mem"),
        ("finfo-garbage", "tl.amp.finfo('x')", TV, "dtype"),
        (
            "checkpoint-bad-determinism",
            "tl.autograd.checkpoint(lambda h: h, tl.ones(2), determinism_check='x')",
            TV,
            "determinism_check",
        ),
        (
            "checkpoint-stateful-fn",
            "checkpoint(f, x).backward()",
            ("RuntimeError",),
            "checkpoint",
            "from tinylearn.autograd import checkpoint\nc = [0]\n"
            "def f(h):\n    c[0] += 1\n    return h * h * c[0]\nx = tl.tensor(2.0, requires_grad=True)",
        ),
    ],
}


_CHILD = r"""
import json, signal, sys, textwrap, warnings
sys.path.insert(0, {here!r})
import numpy as np
import tinylearn as tl
import tinylearn.{pkg}

warnings.simplefilter("ignore")
class Hang(BaseException):
    pass
def _alarm(*_):
    raise Hang()
signal.signal(signal.SIGALRM, _alarm)
BUILTINS = ("TypeError", "ValueError", "IndexError", "RuntimeError", "MemoryError", "AttributeError", "KeyError")
for cid, setup, stmt in json.loads(sys.stdin.read()):
    print("START", cid, flush=True)
    ns = {{"np": np, "tl": tl}}
    signal.alarm({per_call_s})
    try:
        try:
            exec(setup, ns)
        except BaseException as e:
            if isinstance(e, Hang):
                raise
            res = {{"id": cid, "exc": ["SETUP"], "msg": f"setup raised {{type(e).__name__}}: {{str(e)[:500]}}"}}
        else:
            exec(stmt, ns)
            res = {{"id": cid, "exc": None, "msg": ""}}
    except Hang:
        res = {{"id": cid, "exc": ["HANG"], "msg": "no result within {per_call_s} s"}}
    except BaseException as e:
        # the built-in classes it is (a library subclass such as OutOfMemory(MemoryError) counts as MemoryError)
        bases = [k.__name__ for k in type(e).__mro__ if k.__name__ in BUILTINS and k.__module__ == "builtins"]
        res = {{"id": cid, "exc": bases or [type(e).__name__], "msg": str(e)[:500]}}
    finally:
        signal.alarm(0)
    print("RESULT " + json.dumps(res), flush=True)
"""

PER_CALL_S = 60
OVERALL_S = 300  # one package's child, all its calls together


def _topic_packages() -> list[str]:
    return sorted({p for t in TOPICS for p in t.packages})


def _cases(pkg: str) -> list[Case]:
    return [Case(*row) for row in CASES.get(pkg, [])]


def test_every_topic_package_has_bad_input_cases():
    missing = [p for p in _topic_packages() if not CASES.get(p)]
    assert not missing, f"topic packages without bad-input cases in {__file__}: {missing}"
    ids = [c.id for pkg in CASES for c in _cases(pkg)]
    assert len(ids) == len(set(ids)), f"duplicate case ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    assert set(CASES) <= set(_topic_packages()), (
        f"rows for packages not in the topic table: {set(CASES) - set(_topic_packages())}"
    )


def _problem(case: Case, r: dict | None) -> str | None:
    """What is wrong with one call's result (None: it did what the row asks)."""
    if r is None:
        return f"{case.id}: no result"
    if r["exc"] is None:
        return None if case.excs == OK else f"{case.id}: accepted silently: {textwrap.dedent(case.stmt).strip()}"
    if case.excs == OK or not set(r["exc"]) & set(case.excs):
        want = "no error" if case.excs == OK else "/".join(case.excs)
        return f"{case.id}: raised {'/'.join(r['exc'])} (want {want}): {r['msg']}"
    if case.frag.lower() not in r["msg"].lower():
        return f"{case.id}: {'/'.join(r['exc'])} message does not name {case.frag!r}: {r['msg']}"
    return None


@pytest.mark.parametrize("pkg", _topic_packages())
def test_garbage_raises_a_clean_error_naming_the_argument(pkg: str):
    cases = _cases(pkg)
    if not cases:
        pytest.fail(f"no bad-input cases for topic package {pkg!r}")
    code = _CHILD.format(pkg=pkg, per_call_s=PER_CALL_S, here=str(Path(__file__).parent))
    payload = json.dumps([(c.id, textwrap.dedent(c.setup), textwrap.dedent(c.stmt)) for c in cases])
    try:
        p = subprocess.run(
            [sys.executable, "-c", code], input=payload, capture_output=True, text=True, timeout=OVERALL_S
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        started = [ln for ln in out.splitlines() if ln.startswith("START")]
        pytest.fail(f"{pkg}: hang; last call started: {started[-1] if started else None}")
    results = {}
    last_started = None
    for ln in p.stdout.splitlines():
        if ln.startswith("START "):
            last_started = ln[6:]
        elif ln.startswith("RESULT "):
            r = json.loads(ln[7:])
            results[r["id"]] = r
    if p.returncode != 0:
        pytest.fail(f"{pkg}: child died with {p.returncode} during {last_started!r}: {p.stderr[-3000:]}")
    problems, known = [], []
    for case in cases:
        problem = _problem(case, results.get(case.id))
        if problem:
            (known if case.id in KNOWN_BUGS else problems).append(problem)
    assert not problems, f"{pkg}: {len(problems)} of {len(cases)} bad-input cases wrong:\n" + "\n".join(problems)
    if known:
        pytest.xfail(f"{pkg}: known bugs (see KNOWN_BUGS): " + "; ".join(known))
