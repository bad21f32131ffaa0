"""One input policy for every public function that takes numpy arrays (tinylearn._inputs.as_array):

- a torch CPU tensor and a tl.Tensor are accepted wherever a numpy array is, with the same result;
- a wrong dtype is a TypeError naming the argument; a wrong shape is a ValueError naming the argument: the rows
  ``policy-*`` of the bad-input table (tests/common/test_bad_input.py, ``_POLICY``) check this for the same functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn._threads import limited_threads
from tinylearn.dist import bench, keep_awake, multihop_chunks, parity, xor_coding
from tinylearn.gemm import cache_sim
from tinylearn.prune import ratio_model

R = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def i8(*shape: int) -> np.ndarray:
    return R.integers(-8, 8, shape, dtype=np.int8)


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]  # positional arguments; args[0] is the array under test


CASES = [
    Case("conv.im2col", tl.conv.im2col, (f32(1, 2, 5, 5), 3)),
    Case("conv.col2im", tl.conv.col2im, (f32(1, 18, 9), (5, 5), 3)),
    Case("conv.conv2d", tl.conv.conv2d, (f32(1, 2, 5, 5), f32(3, 2, 3, 3))),
    Case("conv.winograd_conv2d", tl.conv.winograd_conv2d, (f32(1, 2, 6, 6), f32(3, 2, 3, 3))),
    Case("conv.max_pool2d", tl.conv.max_pool2d, (f32(1, 2, 6, 6), 2)),
    Case("conv.avg_pool2d", tl.conv.avg_pool2d, (f32(1, 2, 6, 6), 2)),
    Case("quant.quantize", tl.quant.quantize, (f32(4, 5), 0.1, 0)),
    Case("quant.dequantize", tl.quant.dequantize, (i8(4, 5), 0.1, 0)),
    Case("quant.fp8_encode", tl.quant.fp8_encode, (f32(4, 5),)),
    Case("quant.fp8_decode", tl.quant.fp8_decode, (R.integers(0, 255, 6, dtype=np.uint8), "e4m3")),
    Case("quant.pack_int4", tl.quant.pack_int4, (i8(7),)),
    Case("quant.quantize_groupwise", tl.quant.quantize_groupwise, (f32(4, 8), 4)),
    Case("quant.int8_gemm", tl.quant.int8_gemm, (i8(3, 4), i8(4, 2))),
    Case("kernels.softmax", tl.kernels.softmax, (f32(3, 7),)),
    Case("kernels.layer_norm", tl.kernels.layer_norm, (f32(3, 7), f32(7), f32(7))),
    Case("kernels.bias_gelu", tl.kernels.bias_gelu, (f32(3, 7), f32(7))),
    Case("kernels.flash_attention", tl.kernels.flash_attention, (f32(2, 5, 4), f32(2, 5, 4), f32(2, 5, 4))),
    Case("prune.sparsity", tl.prune.sparsity, (f32(4, 5),)),
    Case("sparse.CSR.from_dense", tl.sparse.CSR.from_dense, (f32(4, 5),)),
]
IDS = [c.name for c in CASES]


def _same(a: Any, b: Any) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif hasattr(a, "to_dense"):
        np.testing.assert_array_equal(a.to_dense(), b.to_dense())
    else:
        assert a == b


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_torch_and_tl_tensors_are_accepted(case: Case) -> None:
    x, rest = case.args[0], case.args[1:]
    want = case.fn(x, *rest)
    _same(case.fn(torch.from_numpy(x.copy()), *rest), want)
    _same(case.fn(tl.Tensor(x.copy(), dtype=str(x.dtype)), *rest), want)


def test_non_cpu_or_non_numeric_inputs() -> None:
    from tinylearn._inputs import as_array

    with pytest.raises(TypeError, match="x"):
        as_array(object(), "x")
    with pytest.raises(TypeError, match="bfloat16"):
        as_array(torch.zeros(2, dtype=torch.bfloat16), "x")
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        as_array(np.zeros(3), "x", ndim=2)
    assert as_array([1.0, 2.0], "x", dtypes=("f",)).dtype == np.float64


# Integer arguments (tinylearn._inputs.as_int / is_int): ``operator.index`` semantics, like torch. Each entry builds
# a result from an integer constructor ``n`` (int or a numpy integer); the result (Python ints included: the types
# are compared) must not depend on which. bool and floats stay refused (``True`` is no size, 4.7 is never truncated):
# a TypeError, or the ValueError a function already raised for them.
_MASK = np.kron(np.eye(2, dtype=bool), np.ones((4, 4), dtype=bool))


def _threads_inside(n: int) -> list[int]:
    from threadpoolctl import threadpool_info

    with limited_threads(n):
        return [p["num_threads"] for p in threadpool_info()]


def _hops(n: Callable[[int], Any]) -> list[multihop_chunks.Hop]:
    return [multihop_chunks.Hop("nvlink", 2e-6, 1e-10, n(1)), multihop_chunks.Hop("ib", 5e-6, 1e-9, n(2))]


def _frame(f: parity.ParityFrame) -> list[Any]:
    return [*f.blocks, f.parity, f.crcs, f.nbytes, f.overhead_bytes]


def _code(c: parity.ShardCode) -> list[Any]:
    return [*c.fragments, c.k, c.r, c.shapes]


def _rigl_masks(n: Callable[[int], Any]) -> list[np.ndarray]:
    w = tl.nn.Parameter(np.arange(1.0, 17.0, dtype=np.float32).reshape(4, 4))
    r = tl.prune.rigl.RigL([w], 0.5, delta_t=n(2), t_end=n(10), seed=0)
    w.grad = tl.Tensor(np.ones((4, 4), np.float32))
    r.update(n(2))
    return [*r.masks, np.array(r.should_update(n(4)))]


INT_ARGS: dict[str, Callable[[Callable[[int], Any]], Any]] = {
    "sparse.BSR.from_dense": lambda n: tl.sparse.BSR.from_dense(np.eye(4), n(2)).to_dense(),
    "sparse.BSR.from_dense-pair": lambda n: tl.sparse.BSR.from_dense(np.eye(4), (n(2), n(1))).to_dense(),
    "sparse.CSR-shape": lambda n: tl.sparse.CSR([0, 1], [3], [1.0], (n(1), n(4))).to_dense(),
    "prune.rigl.cosine_update_fraction": lambda n: tl.prune.rigl.cosine_update_fraction(n(5), 0.3, n(100)),
    "prune.rigl.drop_and_grow": lambda n: tl.prune.rigl.drop_and_grow(np.arange(4.0), [1, 1, 0, 0], np.ones(4), n(1)),
    "prune.rigl.RigL": _rigl_masks,
    "prune.AGPSchedule": lambda n: tl.prune.AGPSchedule(0.0, 0.5, n(0), n(10))(n(5)),
    "prune.n_m_mask": lambda n: tl.prune.n_m_mask(np.arange(16.0).reshape(2, 8), n=n(2), m=n(4)),
    "nn.Linear": lambda n: tl.nn.Linear(n(3), n(2)).weight.shape,
    "nn.Embedding": lambda n: tl.nn.Embedding(n(10), n(4)).weight.shape,
    "tl.zeros": lambda n: tl.zeros(n(2), n(3)).data,
    "tl.arange": lambda n: tl.arange(n(5)).data,
    "Tensor.reshape": lambda n: tl.arange(6).reshape(n(2), n(3)).data,
    "Tensor.sum-dim": lambda n: tl.ones((2, 3)).sum(dim=n(1)).data,
    "kernels.softmax-dim": lambda n: tl.kernels.softmax(np.eye(3, dtype=np.float32), dim=n(1)),
    "gemm.roofline": lambda n: tl.gemm.roofline(n(60000), n(1000), 100.0, 10.0),
    "gemm.pack_a": lambda n: tl.gemm.pack_a(np.eye(4, dtype=np.float32), n(2)),
    "inference.blocks_needed": lambda n: tl.inference.blocks_needed(n(10), n(4)),
    "quant.quantize_groupwise": lambda n: tl.quant.quantize_groupwise(np.arange(16.0).reshape(2, 8), group_size=n(4)),
    "data.DataLoader": lambda n: [b[1].data for b in tl.data.DataLoader(np.eye(8), np.arange(8), batch_size=n(3))],
    "prune.AGPSchedule.should_update": lambda n: tl.prune.AGPSchedule(0.0, 0.5, n(0), n(10), n(5)).should_update(n(5)),
    "prune.OneShotSchedule": lambda n: [tl.prune.OneShotSchedule(0.5, n(3))(n(s)) for s in (2, 3)],
    "prune.OneShotSchedule.should_update": lambda n: tl.prune.OneShotSchedule(0.5, n(3)).should_update(n(3)),
    "prune.ratio_model.pattern_features": lambda n: ratio_model.pattern_features(_MASK, n(4), sample=n(1)),
    "prune.ratio_model.measured_nbytes": lambda n: ratio_model.measured_nbytes(_MASK, "bsr", n(4)),
    "prune.ratio_model.random_pattern": lambda n: ratio_model.random_pattern(
        "block", (n(8), n(12)), n(1), np.random.default_rng(0)
    ),
    "prune.ratio_model.CompressionRatioModel": lambda n: ratio_model.CompressionRatioModel("bsr", n(4)).block_size,
    "gemm.occupancy": lambda n: tl.gemm.occupancy(n(256), n(32), n(1024)),
    "gemm.matmul_traffic": lambda n: tl.gemm.matmul_traffic(n(300), n(200), n(100), n(8)),
    "gemm.tile_intensity": lambda n: tl.gemm.tile_intensity(n(6), n(16), n(4)),
    "gemm.cache_sim.CacheSim": lambda n: cache_sim.CacheSim(n(256), n(64), n(2)).run([0, 8, 64, 128, 256, 0]),
    "gemm.cache_sim.matmul_trace": lambda n: list(cache_sim.matmul_trace(n(5), "tiled", n(2), n(8))),
    "gemm.cache_sim.simulate_matmul": lambda n: cache_sim.simulate_matmul(n(8), "tiled", n(1024), n(4), n(64), n(8)),
    "gemm.cache_sim.compulsory_misses": lambda n: cache_sim.compulsory_misses(n(16), n(64), n(4)),
    "threads.limited_threads": lambda n: _threads_inside(n(1)),
    "dist.bench.sample_weights": lambda n: sorted(bench.sample_weights([n(1024), n(4096), n(16384)], n(8)).items()),
    "dist.keep_cores_awake": lambda n: keep_awake.keep_cores_awake(cores=[n(0), n(1)], enabled=False).cores,
    "dist.recursive_doubling_demands": lambda n: xor_coding.recursive_doubling_demands(n(8), n(1)),
    "dist.multihop.Hop": lambda n: multihop_chunks.Hop("x", 1e-6, 1e-9, fan_in=n(2)).fan_in,
    "dist.multihop.pipeline_time": lambda n: multihop_chunks.pipeline_time(n(4096), _hops(n), n(512)),
    "dist.multihop.pipeline_time-list": lambda n: multihop_chunks.pipeline_time(n(4096), _hops(n), [n(512), n(256)]),
    "dist.multihop.adaptive_chunks": lambda n: multihop_chunks.adaptive_chunks(n(4096), _hops(n)),
    "dist.parity.encode_parity": lambda n: _frame(parity.encode_parity(np.arange(10), n(3))),
    "dist.parity.gf256_mul": lambda n: parity.gf256_mul(np.arange(6, dtype=np.uint8), n(29)),
    "dist.parity.shard_columns": lambda n: parity.shard_columns(np.arange(14.0).reshape(2, 7), n(3)),
    "dist.parity.encode_shards": lambda n: _code(parity.encode_shards(np.arange(14.0).reshape(2, 7), n(3), n(2))),
}
INT_KINDS: dict[str, Callable[[int], Any]] = {
    "np.int64": np.int64,
    "np.int32": np.int32,
    "np.uint16": np.uint16,
}


def _same_result(a: Any, b: Any) -> None:
    if isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_result(x, y)
    elif isinstance(a, tuple | np.ndarray) or hasattr(a, "shape"):
        np.testing.assert_array_equal(a, b)
    elif hasattr(a, "__dict__"):
        assert vars(a) == vars(b)
    else:
        assert a == b and type(a) is type(b) or isinstance(a, float), (a, b)


@pytest.mark.parametrize("kind", list(INT_KINDS))
@pytest.mark.parametrize("name", list(INT_ARGS))
def test_numpy_and_torch_integers_are_ints(name: str, kind: str) -> None:
    fn = INT_ARGS[name]
    _same_result(fn(INT_KINDS[kind]), fn(int))


@pytest.mark.parametrize(
    "call",
    [
        lambda: tl.sparse.BSR.from_dense(np.eye(4), 2.0),
        lambda: tl.sparse.BSR.from_dense(np.eye(4), True),
        lambda: tl.sparse.BSR.from_dense(np.eye(4), (2, 1.5)),
        lambda: tl.sparse.CSR([0, 1], [0], [1.0], (1, 4.7)),
        lambda: tl.sparse.CSR([0, 1], [0], [1.0], (np.bool_(True), 4)),
        lambda: tl.prune.rigl.cosine_update_fraction(2.5, 0.3, 100),
        lambda: tl.prune.rigl.drop_and_grow(np.arange(4.0), [1, 1, 0, 0], np.ones(4), True),
        lambda: tl.prune.rigl.RigL([tl.nn.Parameter(np.ones((2, 2), np.float32))], 0.5, delta_t=2.5),
        lambda: tl.prune.rigl.RigL([tl.nn.Parameter(np.ones((2, 2), np.float32))], 0.5, t_end=torch.tensor(9.0)),
    ],
)
def test_bool_and_float_are_not_ints(call: Callable[[], Any]) -> None:
    with pytest.raises(TypeError, match=r"block_size|shape|step|k:|delta_t|t_end"):
        call()


_W = np.arange(14.0).reshape(2, 7)


@pytest.mark.parametrize(
    "call",
    [
        lambda: tl.prune.AGPSchedule(0.0, 0.5, 0, 10)(2.5),
        lambda: tl.prune.AGPSchedule(0.0, 0.5, 0, 10).should_update(np.float64(5)),
        lambda: tl.prune.OneShotSchedule(0.5, 3)(3.5),
        lambda: tl.prune.OneShotSchedule(0.5, 3).should_update(True),
        lambda: tl.gemm.occupancy(True, 32, 0),
        lambda: tl.gemm.occupancy(128, 32.0, 0),
    ],
)
def test_bool_and_float_steps_and_sizes_are_type_errors(call: Callable[[], Any]) -> None:
    with pytest.raises(TypeError, match=r"step|threads_per_block|registers_per_thread"):
        call()


# These functions kept their ValueError for a value that is no int (their tests and the bad-input table rely on it).
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: tl.prune.AGPSchedule(0.0, 0.5, True, 10), "start_step"),
        (lambda: tl.prune.OneShotSchedule(0.5, 2.0), "step"),
        (lambda: ratio_model.pattern_features(_MASK, 4.0), "block_size"),
        (lambda: ratio_model.pattern_features(_MASK, 4, sample=True), "sample"),
        (lambda: ratio_model.random_pattern("uniform", (8.0, 8), 0.5, np.random.default_rng(0)), "shape"),
        (lambda: ratio_model.random_pattern("uniform", (8, 8), np.bool_(True), np.random.default_rng(0)), "density"),
        (lambda: ratio_model.CompressionRatioModel("bsr", np.bool_(True)), "block_size"),
        (lambda: tl.gemm.matmul_traffic(2.5, 3, 4), "m"),
        (lambda: tl.gemm.tile_intensity(4, True), "nr"),
        (lambda: cache_sim.CacheSim(256.0), "size_bytes"),
        (lambda: cache_sim.matmul_trace(4, "ijk", tile=np.float32(2)), "tile"),  # checked at the call, not lazily
        (lambda: cache_sim.compulsory_misses(16.5), "n"),
        (lambda: limited_threads(1.0).__enter__(), "threads"),
        (lambda: bench.sample_weights([1024, 4096], cap=2.5), "cap"),
        (lambda: bench.sample_weights([1024.5, 4096]), "sizes"),
        (lambda: bench.measure((2,), [1024, 4096], ["ring"], rounds=True), "rounds"),
        (lambda: bench.measure((2,), [1024, 4096], ["ring"], rounds=3, weights={1024: 1.5}), "weights"),
        (lambda: bench.measure((2.0,), [1024, 4096], ["ring"], rounds=3), "world_sizes"),
        (lambda: keep_awake.keep_cores_awake(cores=[np.bool_(True)]), "cores"),
        (lambda: xor_coding.recursive_doubling_demands(8.0, 1), "world_size"),
        (lambda: xor_coding.recursive_doubling_demands(8, True), "round_"),
        (lambda: multihop_chunks.Hop("x", 1e-6, 1e-9, fan_in=2.0), "fan_in"),
        (lambda: multihop_chunks.pipeline_time(4096, _hops(int), [512, 256.0]), "chunks"),
        (lambda: multihop_chunks.adaptive_chunks(True, _hops(int)), "nbytes"),
        (lambda: parity.encode_parity(np.arange(10), True), "n_blocks"),
        (lambda: parity.gf256_mul(np.arange(6, dtype=np.uint8), 2.0), "c"),
        (lambda: parity.shard_columns(_W, np.float64(2)), "k"),
        (lambda: parity.encode_shards(_W, 3, r=np.bool_(True)), "r"),
    ],
)
def test_bool_and_float_are_not_ints_valueerror(call: Callable[[], Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        call()


def test_as_int_helper() -> None:
    from tinylearn._inputs import as_int, is_int

    assert as_int(np.int64(256), "size", min=1) == 256 and type(as_int(np.int64(256), "size")) is int
    assert as_int(torch.tensor(3), "n") == 3 and as_int(2**70, "n") == 2**70
    for bad in (True, np.bool_(False), 2.0, np.float32(2), "3", None, torch.tensor(2.0), np.array([1])):
        assert not is_int(bad)
        with pytest.raises(TypeError, match="size: expected an int"):
            as_int(bad, "size")
    with pytest.raises(ValueError, match="size: must be >= 1, got 0"):
        as_int(np.int64(0), "size", min=1)
    with pytest.raises(ValueError, match="size: must be <= 4, got 5"):
        as_int(5, "size", max=4)
