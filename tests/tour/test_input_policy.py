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
from tinylearn.dist import bench, keep_awake, multihop_chunks, parity, workers, xor_coding
from tinylearn.gemm import cache_sim
from tinylearn.kernels import fusion_split
from tinylearn.memory.estimate import plan_recompute
from tinylearn.prune import ratio_model
from tinylearn.quant.error_budget import fake_quantize_bits
from tinylearn.quant.modules import weight_observer

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


def _stages(n: Callable[[int], Any]) -> list[fusion_split.Stage]:
    return [fusion_split.Stage(f"s{i}", n(r), n(2), n(4)) for i, r in enumerate((40, 90, 60, 120))]


def _machine(n: Callable[[int], Any]) -> fusion_split.Machine:
    return fusion_split.Machine(peak_flops=n(40000), bandwidth=n(8000), launch_s=n(0), threads=n(256))


def _per_channel(n: Callable[[int], Any]) -> Any:
    obs = tl.quant.PerChannelMinMaxObserver(ch_axis=n(1))
    obs(np.arange(12.0, dtype=np.float32).reshape(3, 4))
    return [*obs.calculate_qparams(), obs.ch_axis]


def _histogram(n: Callable[[int], Any], cls: type) -> Any:
    obs = cls(bins=n(256))
    obs(np.linspace(-3, 3, 101, dtype=np.float32))
    return [*obs.calculate_qparams(), obs.bins]


def _recalibrator(n: Callable[[int], Any]) -> list[Any]:
    r = tl.quant.OnlineRecalibrator(patience=n(1), cooldown=n(0))
    for k in range(4):
        r(np.linspace(0, 1 + 5 * k, 64, dtype=np.float32))
    return [r.patience, r.cooldown, r.recalibrations, r.scale, r.zero_point]


def _autotuner(n: Callable[[int], Any]) -> list[Any]:
    t = iter(range(10**6))
    tuner = tl.quant.KernelAutotuner(
        {"a": np.add, "b": np.subtract}, repeat=n(2), warmup=n(1), window=n(3), drift=n(1), timer=lambda: next(t)
    )
    return [tuner(np.ones(2), np.ones(2)), tuner.repeat, tuner.warmup, tuner.window]


def _packed(n: Callable[[int], Any]) -> np.ndarray:
    w = tl.quant.PackedInt8Weight(np.arange(-8, 8, dtype=np.int8).reshape(4, 4))
    return w.matmul(np.arange(8, dtype=np.uint8).reshape(2, 4), zero_point=n(3), backend="numpy")


def _cache(n: Callable[[int], Any]) -> list[Any]:
    clock = tl.memory.ManualClock()
    c = tl.memory.TensorCache(n(64), ttl=n(5), clock=clock)
    c.put("a", np.zeros(4, np.float32))
    clock.advance(n(3))
    hit = c.get("a") is not None
    clock.advance(n(3))
    return [c.capacity_bytes, c.ttl, hit, c.get("a") is None, clock()]


def _collectives(n: Callable[[int], Any]) -> list[Any]:
    import torch.distributed as dist

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.arange(6.0)
        tl.dist.all_reduce(x, algorithm="hierarchical", node_size=n(1), chunk_bytes=n(8))
        return tl.dist.broadcast(x, src=n(0)).tolist()
    finally:
        if own:
            dist.destroy_process_group()


def _lowprec(n: Callable[[int], Any]) -> list[Any]:
    opt = tl.amp.lowprec_state.ShardedLowPrecisionAdam(n(10), state_format="int8", world_size=n(3))
    return [opt.numel, opt.world_size, opt.shards, opt.state_bytes()]


def _scaler(n: Callable[[int], Any]) -> list[Any]:
    s = tl.amp.layer_scaler.PerGroupScaler(n(2), growth_interval=n(3))
    for _ in range(4):
        s.update([False, True])
    return [s.n_groups, s.growth_interval, s.scales]


def _hutchinson(n: Callable[[int], Any]) -> np.ndarray:
    w = tl.nn.Parameter(np.array([1.0, 2.0], np.float32))
    return tl.amp.hutchinson_trace(lambda: (w * w * w).sum(), [w], n_samples=n(3), seed=n(0))


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
    "quant.LearnableShiftScale": lambda n: tl.quant.LearnableShiftScale(n(4)).shift.shape,
    "quant.saturation_rate": lambda n: tl.quant.saturation_rate(np.linspace(-1, 3, 50), 0.01, n(3)),
    "quant.OnlineRecalibrator": _recalibrator,
    "quant.strassen_reference": lambda n: tl.quant.strassen_reference(np.arange(16).reshape(4, 4), np.eye(4), n(1)),
    "quant.cache_oblivious_matmul": lambda n: tl.quant.cache_oblivious_matmul(np.ones((4, 6)), np.ones((6, 2)), n(2)),
    "quant.requantize": lambda n: tl.quant.requantize(np.arange(-4, 4, dtype=np.int32), 0.5, n(3), n(0), n(255)),
    "quant.PackedInt8Weight.matmul": _packed,
    "quant.enumerate_bit_configs": lambda n: tl.quant.enumerate_bit_configs(n(2), (n(4), n(8))),
    "quant.BitCostModel": lambda n: tl.quant.BitCostModel({n(4): n(4), n(8): n(8)}, lanes_bits=n(512)).costs(
        [10, 20], [100, 200], [4, 8]
    ),
    "quant.KernelAutotuner": _autotuner,
    "quant.allocate_error_budget": lambda n: tl.quant.allocate_error_budget(n(2), [1.0, 2.0], [3, 4]),
    "quant.fake_quantize_bits": lambda n: fake_quantize_bits(np.linspace(-1, 1, 12).reshape(3, 4), n(4), axis=n(1)),
    "quant.PerChannelMinMaxObserver": _per_channel,
    "quant.HistogramObserver": lambda n: _histogram(n, tl.quant.HistogramObserver),
    "quant.PercentileObserver": lambda n: _histogram(n, tl.quant.PercentileObserver),
    "quant.MSEObserver": lambda n: tl.quant.MSEObserver(n_candidates=n(20), bins=n(64)).n_candidates,
    "quant.kl_threshold": lambda n: tl.quant.kl_threshold(np.ones(16), np.arange(17.0), n(4), start=n(6)),
    "quant.weight_observer": lambda n: vars(weight_observer(bits=n(4), ch_axis=n(0))),
    "kernels.fusion_split.Stage": lambda n: _stages(n),
    "kernels.fusion_split.Machine": _machine,
    "kernels.fusion_split.segment_regs": lambda n: fusion_split.segment_regs(_stages(n), n(16)),
    "kernels.fusion_split.segment_time": lambda n: fusion_split.segment_time(_stages(n), n(4096), n(4), _machine(n)),
    "kernels.fusion_split.split_time": lambda n: fusion_split.split_time(_stages(n), [n(2)], n(4096), n(4)),
    "kernels.fusion_split.linear_scan": lambda n: fusion_split.linear_scan(_stages(n), n(128), n(16)),
    "kernels.fusion_split.choose_split": lambda n: fusion_split.choose_split(_stages(n), n(4096), n(4)),
    "kernels.fusion_split.optimal_split": lambda n: fusion_split.optimal_split(_stages(n), n(4096), n(4)),
    "kernels.layer_norm-eps": lambda n: tl.kernels.layer_norm(
        np.eye(3, dtype=np.float32), np.ones(3), np.zeros(3), eps=n(1)
    ),
    "memory.estimate": lambda n: tl.memory.estimate(
        tl.nn.Sequential(tl.nn.Linear(4, 8), tl.nn.ReLU(), tl.nn.Linear(8, 2)), (n(2), n(4)), checkpoint_segments=n(2)
    ),
    "memory.plan_recompute": lambda n: plan_recompute([n(3), n(5), n(2)], [1.0, 2.0, 1.0], n(6)),
    "memory.random_ops": lambda n: tl.memory.random_ops(n(20), (n(1), n(64)), max_live=n(4)),
    "memory.pair_ops": lambda n: tl.memory.pair_ops(n(3), n(256)),
    "memory.TensorCache": _cache,
    "dist.all_reduce+broadcast": _collectives,
    "dist.launch": lambda n: [
        (o["rank"], o["world_size"], o["args"]) for o in tl.dist.launch(workers.rank_info, n(1), 5, timeout_s=n(60))
    ],
    "amp.ShardedLowPrecisionAdam": _lowprec,
    "amp.PerGroupScaler": _scaler,
    "amp.hutchinson_trace": _hutchinson,
    "amp.quantize_symmetric": lambda n: tl.amp.quantize_symmetric(np.linspace(-1, 1, 9), n(3)),
    "inference.form_batches": lambda n: tl.inference.form_batches(
        [0.0, 0.1, 0.2, 1.5, 1.6], [5, 40, 7, 9, 33], n(2), n(1), bucket_width=n(16)
    ),
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
        (lambda: tl.quant.LearnableShiftScale(True), "num_features"),
        (lambda: tl.quant.saturation_rate(np.ones(4), 0.1, True), "zero_point"),
        (lambda: tl.quant.saturation_rate(np.ones(4), True, 3), "scale"),
        (lambda: tl.quant.OnlineRecalibrator(patience=2.0), "patience"),
        (lambda: tl.quant.OnlineRecalibrator(cooldown=np.bool_(False)), "cooldown"),
        (lambda: tl.quant.strassen_reference(np.eye(4), np.eye(4), 1.0), "levels"),
        (lambda: tl.quant.cache_oblivious_matmul(np.eye(4), np.eye(4), True), "leaf"),
        (lambda: tl.quant.enumerate_bit_configs(2.0), "n_layers"),
        (lambda: tl.quant.enumerate_bit_configs(2, (4, True)), "widths"),
        (lambda: tl.quant.BitCostModel({4.0: 4}), "datapath_bits"),
        (lambda: tl.quant.BitCostModel(lanes_bits=True), "lanes_bits"),
        (lambda: tl.quant.KernelAutotuner({"a": np.add}, repeat=True), "repeat"),
        (lambda: tl.quant.KernelAutotuner({"a": np.add}, warmup=1.0), "warmup"),
        (lambda: tl.quant.KernelAutotuner({"a": np.add}, drift=True), "drift"),
        (lambda: tl.quant.allocate_error_budget(True, [1.0], [2]), "budget"),
        (lambda: fake_quantize_bits(np.ones((2, 2)), 4.0), "bits"),
        (lambda: fake_quantize_bits(np.ones((2, 2)), 4, axis=True), "axis"),
        (lambda: tl.quant.HistogramObserver(bins=256.0), "bins"),
        (lambda: weight_observer(bits=np.float64(8)), "bits"),
        (lambda: fusion_split.Stage("s", True, 1.0, 4.0), "regs"),
        (lambda: fusion_split.Stage("s", 4, np.bool_(True), 4.0), "flops"),
        (lambda: fusion_split.Machine(saturation=True), "saturation"),
        (lambda: fusion_split.segment_regs(_stages(int), 16.0), "base_regs"),
        (lambda: fusion_split.segment_time(_stages(int), 4096.0, 4), "n"),
        (lambda: fusion_split.split_time(_stages(int), [2.0], 4096, 4), "cuts"),
        (lambda: fusion_split.linear_scan(_stages(int), True), "cap"),
        (lambda: tl.memory.estimate(tl.nn.Linear(4, 2), (2.0, 4)), "input_shape"),
        (lambda: tl.memory.estimate(tl.nn.Linear(4, 2), (2, 4), checkpoint_segments=True), "checkpoint_segments"),
        (lambda: tl.memory.TensorCache(64.0), "capacity_bytes"),
        (lambda: tl.memory.TensorCache(64, ttl=True), "ttl"),
        (lambda: tl.memory.ManualClock().advance(True), "dt"),
        (lambda: tl.dist.launch(print, 2.0), "world_size"),
        (lambda: tl.dist.launch(print, np.bool_(True)), "world_size"),
        (lambda: tl.dist.launch(print, 1, timeout_s=True), "timeout_s"),
        (lambda: tl.dist.all_reduce(torch.ones(2), node_size=2.0), "node_size"),
        (lambda: tl.dist.all_reduce(torch.ones(2), chunk_bytes=64.0), "chunk_bytes"),
        (lambda: tl.amp.lowprec_state.ShardedLowPrecisionAdam(10.0), "numel"),
        (lambda: tl.amp.lowprec_state.ShardedLowPrecisionAdam(10, world_size=True), "world_size"),
        (lambda: tl.amp.layer_scaler.PerGroupScaler(2.0), "n_groups"),
        (lambda: tl.amp.layer_scaler.PerGroupScaler(2, growth_interval=np.bool_(True)), "growth_interval"),
        (lambda: tl.amp.quantize_symmetric(np.ones(3), 4.0), "bits"),
        (lambda: tl.inference.form_batches([0.0], [4], True, 1.0), "max_batch"),
        (lambda: tl.inference.form_batches([0.0], [4], 2, True), "window"),
        (lambda: tl.inference.form_batches([0.0], [4], 2, 1.0, bucket_width=16.0), "bucket_width"),
    ],
)
def test_bool_and_float_are_not_ints_valueerror(call: Callable[[], Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        call()


# These kept their TypeError (as_int): the message starts with the argument's name.
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: tl.quant.requantize(np.zeros(2, np.int32), 0.5, True, 0, 255), "zero_point"),
        (lambda: tl.quant.requantize(np.zeros(2, np.int32), 0.5, 0, 0.0, 255), "quant_min"),
        (lambda: tl.quant.PerChannelMinMaxObserver(ch_axis=True), "ch_axis"),
        (lambda: tl.quant.MSEObserver(n_candidates=2.5), "n_candidates"),
        (lambda: tl.quant.kl_threshold(np.ones(16), np.arange(17.0), 4.0), "num_levels"),
        (lambda: tl.quant.kl_threshold(np.ones(16), np.arange(17.0), 4, start=6.5), "start"),
        (lambda: tl.kernels.softmax(np.eye(3, dtype=np.float32), dim=1.0), "dim"),
        (lambda: plan_recompute([3.0, 5], [1.0, 2.0], 6), "act_bytes"),
        (lambda: tl.memory.random_ops(2.5), "n_ops"),
        (lambda: tl.memory.pair_ops(2.5, 8), "n_pairs"),
        (lambda: tl.memory.pair_ops(np.bool_(True), 8), "n_pairs"),
    ],
)
def test_bool_and_float_are_not_ints_typeerror(call: Callable[[], Any], name: str) -> None:
    with pytest.raises(TypeError, match=rf"^{name}: "):
        call()


def test_numpy_floats_are_numbers() -> None:
    """Arguments typed ``float`` take numpy floats (np.float32 is no Python float subclass) with the same result."""
    for f in (np.float32, np.float64):
        assert tl.inference.form_batches([0.0, 0.4, 1.2], [4, 9, 4], 2, f(0.5)) == tl.inference.form_batches(
            [0.0, 0.4, 1.2], [4, 9, 4], 2, 0.5
        )
        assert tl.memory.TensorCache(64, ttl=f(2.5)).ttl == 2.5
        assert fusion_split.Machine(saturation=f(0.5)).saturation == 0.5
        assert tl.quant.KernelAutotuner({"a": np.add}, drift=f(0.5)).drift == 0.5
        assert tl.quant.saturation_rate(np.linspace(-1, 3, 50), f(0.5), 3) == tl.quant.saturation_rate(
            np.linspace(-1, 3, 50), 0.5, 3
        )
        budget = tl.quant.allocate_error_budget(f(2.0), [1.0, 2.0], [3, 4])
        np.testing.assert_allclose(budget, tl.quant.allocate_error_budget(2.0, [1.0, 2.0], [3, 4]))


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
