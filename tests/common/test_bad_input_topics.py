"""Bad input, driven by the topic table: every package of every topic in ``tinylearn.topics.TOPICS`` gets garbage.

For each package a list of calls with garbage arguments (wrong type, wrong ndim, negative sizes, NaN, huge values)
and the clean error each must raise: a built-in TypeError / ValueError / IndexError / RuntimeError (or MemoryError
where the request is a memory request) whose message names the offending argument. All calls of one package run
in one child interpreter with a per-call alarm and an overall timeout, so a segfault, an abort or a hang fails that
package's test (naming the call that was running) instead of killing or stalling the test run.

A topic package without a row here fails ``test_every_topic_package_has_bad_input_cases``: adding a topic to the
table means adding its garbage here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tinylearn.topics import TOPICS

# Known bugs in packages owned by other helpers (reported, not fixed here): the case runs and its result is shown,
# but it does not fail the test; once fixed, drop the id from this table so that it guards the fix.
KNOWN_BUGS: dict[str, str] = {}

# (case id, statement, accepted exception names, fragment the message must contain: the argument's name)
Case = tuple[str, str, tuple[str, ...], str]
TV = ("TypeError", "ValueError")

CASES: dict[str, list[Case]] = {
    "bench": [
        ("measure-not-callable", "tl.bench.measure(3)", TV, "fn"),
        ("measure-negative-repeat", "tl.bench.measure(lambda: None, repeat=-1)", TV, "repeat"),
        ("run_topic-unknown", "tl.bench.run_topic('nope')", TV, "topic"),
        ("run_topic-int", "tl.bench.run_topic(3)", TV, "topic"),
    ],
    "testing": [
        ("make_array-negative-shape", "tl.testing.make_array((-1, 2))", TV, "shape"),
        ("make_array-bad-dtype", "tl.testing.make_array((2,), dtype='banana')", TV, "dtype"),
        ("make_array-bad-layout", "tl.testing.make_array((2, 2), layout='zigzag')", TV, "layout"),
        ("tolerance-bad-dtype", "tl.testing.tolerance('banana')", TV, "dtype"),
    ],
    "autograd": [
        ("Tensor-None", "tl.Tensor(None)", TV, "data"),
        ("Tensor-strings", "tl.Tensor(['a', 'b'])", TV, "data"),
        ("full-negative", "tl.full((-2, 3), 1.0)", TV, "shape"),
        ("zeros-float-shape", "tl.zeros((2.5, 3))", TV, "shape"),
        ("arange-zero-step", "tl.arange(0, 5, 0)", TV, "step"),
        ("arange-nan", "tl.arange(0, float('nan'))", TV, "end"),
        ("reshape-bad", "tl.Tensor(np.ones(6)).reshape(4, 2)", TV, "shape"),
        ("sum-dim-float", "tl.Tensor(np.ones((2, 3))).sum(dim=1.5)", TV, "dim"),
        ("transpose-dim-out-of-range", "tl.Tensor(np.ones((2, 3))).transpose(0, 5)", TV + ("IndexError",), "dim"),
        ("cat-empty", "tl.cat([], 0)", TV, "tensors"),
        ("gradcheck-not-callable", "tl.autograd.gradcheck(3, [tl.Tensor(np.ones(2), requires_grad=True)])", TV, "fn"),
    ],
    "nn": [
        ("Linear-negative", "tl.nn.Linear(-1, 3)", TV, "in_features"),
        ("Linear-float", "tl.nn.Linear(2.5, 3)", TV, "in_features"),
        ("Conv2d-zero-kernel", "tl.nn.Conv2d(3, 4, 0)", TV, "kernel_size"),
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
    ],
    "optim": [
        ("SGD-negative-lr", "tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=-1.0)", TV, "lr"),
        (
            "SGD-nan-momentum",
            "tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=0.1, momentum=float('nan'))",
            TV,
            "momentum",
        ),
        ("Adam-short-betas", "tl.optim.Adam([tl.nn.Parameter(np.ones(2))], betas=(0.9,))", TV, "betas"),
        ("Adam-not-params", "tl.optim.Adam(3)", TV, "params"),
        (
            "StepLR-zero-step",
            "tl.optim.StepLR(tl.optim.SGD([tl.nn.Parameter(np.ones(2))], lr=0.1), 0)",
            TV,
            "step_size",
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
    ],
    "quant": [
        ("qparams-nan", "tl.quant.calculate_qparams(float('nan'), 1.0)", TV, "min_val"),
        ("qparams-bad-dtype", "tl.quant.calculate_qparams(0.0, 1.0, dtype='int7')", TV, "dtype"),
        ("quantize-str-scale", "tl.quant.quantize(np.ones(3), 'a', 0)", TV, "scale"),
        ("quantize-zero-scale", "tl.quant.quantize(np.ones(3), 0.0, 0)", TV, "scale"),
        ("quantize-zp-out-of-range", "tl.quant.quantize(np.ones(3), 0.1, 1000)", TV, "zero_point"),
        ("quantize-strings", "tl.quant.quantize(np.array(['a']), 0.1, 0)", TV, "x"),
        ("fp8-bad-fmt", "tl.quant.fp8_encode(np.ones(3), fmt='e3m3')", TV, "fmt"),
        ("pack_int4-huge", "tl.quant.pack_int4(np.array([65539, 65535]))", TV, "q"),
        ("unpack_int4-negative-n", "tl.quant.unpack_int4(np.zeros(2, np.uint8), -1)", TV, "n"),
        ("int8_gemm-float", "tl.quant.int8_gemm(np.ones((2, 2)), np.ones((2, 2), np.int8))", TV, "a_int8"),
        ("int8_gemm-mismatch", "tl.quant.int8_gemm(np.ones((2, 3), np.int8), np.ones((2, 2), np.int8))", TV, "b_int8"),
        ("requantize-range", "tl.quant.requantize(np.ones(3, np.int32), 0.5, 0, 1000, -1000)", TV, "quant_"),
        ("requantize-nan", "tl.quant.requantize(np.ones(3, np.int32), float('nan'), 0, -128, 127)", TV, "multiplier"),
        ("groupwise-bad-bits", "tl.quant.quantize_groupwise(np.ones((2, 8)), group_size=4, bits=0)", TV, "bits"),
        ("groupwise-zero-group", "tl.quant.quantize_groupwise(np.ones((2, 8)), group_size=0)", TV, "group_size"),
        ("observer-strings", "tl.quant.MinMaxObserver()(np.array(['a', 'b']))", TV, "x"),
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
        ("sparsity-str", "tl.prune.sparsity('abc')", TV, "module_or_array"),
        ("AGP-nan", "tl.prune.AGPSchedule(0.0, float('nan'), 0, 10)", TV, "final_sparsity"),
        ("AGP-end-before-start", "tl.prune.AGPSchedule(0.0, 0.5, 10, 5)", TV, "end_step"),
        ("n_m-n-gt-m", "tl.prune.n_m_mask(np.ones((2, 8)), n=5, m=4)", TV, "n"),
    ],
    "sparse": [
        ("CSR-float-shape", "tl.sparse.CSR([0, 1], [0], [1.0], (1, 4.7))", TV, "shape"),
        ("CSR-index-overflow", "tl.sparse.CSR([0, 1], [2**32 + 1], [1.0], (1, 4))", TV, "indices"),
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
    ],
    "dist": [
        ("predict-nan-bytes", "tl.dist.cost_model.predict('ring', float('nan'), 4, 1e-5, 1e-10)", TV, "nbytes"),
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
    ],
    "memory": [
        ("malloc-bool-cpp", "tl.memory.FirstFitAllocator(1024, backend='cpp').malloc(True)", TV, "nbytes"),
        ("malloc-negative", "tl.memory.FirstFitAllocator(1024).malloc(-5)", TV, "nbytes"),
        (
            "malloc-huge-cpp",
            "tl.memory.BuddyAllocator(1 << 16, backend='cpp').malloc(2**62)",
            TV + ("MemoryError",),
            "nbytes",
        ),
        ("free-foreign-cpp", "tl.memory.BumpAllocator(1024, backend='cpp').free(7)", TV, "offset"),
        ("Buddy-capacity-str", "tl.memory.BuddyAllocator('big')", TV, "capacity"),
        ("Caching-split-negative", "tl.memory.CachingAllocator(1 << 20, max_split_size=-5)", TV, "max_split_size"),
        ("Slab-empty-sizes", "tl.memory.SlabAllocator([])", TV, "sizes"),
        ("plan-negative-size", "tl.memory.plan([(-4, 0, 1)])", TV, "size"),
        ("plan-last-before-first", "tl.memory.plan([(4, 3, 1)])", TV, "last_use"),
        ("align_up-zero", "tl.memory.align_up(5, 0)", TV, "a"),
        ("next_pow2-negative", "tl.memory.next_pow2(-3)", TV, "n"),
        ("random_ops-negative", "tl.memory.random_ops(-1)", TV, "n_ops"),
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
    ],
}

_CHILD = r"""
import json, signal, sys, warnings
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
for cid, stmt in json.loads(sys.stdin.read()):
    print("START", cid, flush=True)
    signal.alarm({per_call_s})
    try:
        exec(stmt, {{"np": np, "tl": tl}})
    except Hang:
        res = {{"id": cid, "exc": "HANG", "msg": ""}}
    except BaseException as e:
        # the built-in classes it is (a library subclass such as OutOfMemory(MemoryError) counts as MemoryError)
        bases = [k.__name__ for k in type(e).__mro__ if k.__name__ in BUILTINS and k.__module__ == "builtins"]
        res = {{"id": cid, "exc": bases or [type(e).__name__], "msg": str(e)[:500]}}
    else:
        res = {{"id": cid, "exc": None, "msg": ""}}
    finally:
        signal.alarm(0)
    print("RESULT " + json.dumps(res), flush=True)
"""

PER_CALL_S = 60


def _topic_packages() -> list[str]:
    return sorted({p for t in TOPICS for p in t.packages})


def test_every_topic_package_has_bad_input_cases():
    missing = [p for p in _topic_packages() if not CASES.get(p)]
    assert not missing, f"topic packages without bad-input cases in {__file__}: {missing}"
    ids = [c[0] for cases in CASES.values() for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"


@pytest.mark.parametrize("pkg", _topic_packages())
def test_garbage_raises_a_clean_error_naming_the_argument(pkg: str):
    cases = CASES.get(pkg, [])
    if not cases:
        pytest.fail(f"no bad-input cases for topic package {pkg!r}")
    code = _CHILD.format(pkg=pkg, per_call_s=PER_CALL_S)
    payload = json.dumps([(c[0], textwrap.dedent(c[1])) for c in cases])
    try:
        p = subprocess.run(
            [sys.executable, "-c", code], input=payload, capture_output=True, text=True, timeout=PER_CALL_S * 4
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
    for cid, stmt, excs, frag in cases:
        r = results.get(cid)
        if r is None:
            problem = f"{cid}: no result"
        elif r["exc"] is None:
            problem = f"{cid}: accepted silently: {stmt}"
        elif not set(r["exc"]) & set(excs):
            problem = f"{cid}: raised {'/'.join(r['exc'])} (want {'/'.join(excs)}): {r['msg']}"
        elif frag.lower() not in r["msg"].lower():
            problem = f"{cid}: {'/'.join(r['exc'])} message does not name {frag!r}: {r['msg']}"
        else:
            continue
        (known if cid in KNOWN_BUGS else problems).append(problem)
    assert not problems, f"{pkg}: {len(problems)} of {len(cases)} bad-input cases wrong:\n" + "\n".join(problems)
    if known:
        pytest.xfail(f"{pkg}: known bugs (see KNOWN_BUGS): " + "; ".join(known))
