"""Parallel training on real processes (built on ``tl.dist``): ZeRO 1/2/3, Megatron tensor parallelism,
pipeline schedules (GPipe, 1F1B, interleaved) with a runtime, and a 3D-parallel planner.

    import tinylearn as tl
    opt = tl.parallel.ZeroOptimizer(model, torch.optim.Adam, stage=2, lr=1e-3)     # inside a launched rank
    tl.parallel.zero_memory_per_rank(7_000_000_000, stage=3, world_size=64)          # bytes per rank
    tl.parallel.pipeline_schedule("1f1b", 4, 8); tl.parallel.bubble_fraction("1f1b", 4, 8)
    tl.parallel.map_reduce(my_records, mapper, reducer)                             # inside a launched rank
    tl.parallel.plan_3d(64, 7_000_000_000, 32, 4096, 2048, 512, 80e9, link=dict(alpha_s=5e-6, beta_s_per_byte=1e-11))

Same code under ``torchrun`` (NCCL or gloo) on many machines: ``tl.dist.launch`` then runs in place.
"""

from .bandit import microbatch_step_time, tune_microbatch
from .buffers import buffer_depths, simulate_stream, stream_period
from .mapreduce import map_reduce, partition
from .moe_parallel import ExpertParallelMoE, expert_parallel
from .pipeline import PipelineParallel
from .planner import Plan, estimate_3d, plan_3d
from .ring_attention import ring_attention, zigzag_shard, zigzag_unshard
from .schedules import SCHEDULES, bubble_fraction, peak_in_flight, pipeline_schedule, simulate, validate_schedule
from .seq_parallel import SequenceParallelMLP
from .tensor_parallel import (
    ColumnParallelLinear,
    DenseMLP,
    DenseSelfAttention,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    allreduces_per_layer,
    collective_counts,
    copy_to_tp,
    reduce_from_tp,
    reset_counts,
    simulate_column_parallel,
    simulate_row_parallel,
)
from .ulysses import ulysses_attention
from .zero import ZeroOptimizer, consolidate_state, shard_bounds, shard_state, zero_memory_per_rank

__all__ = [
    "SCHEDULES",
    "ExpertParallelMoE",
    "SequenceParallelMLP",
    "expert_parallel",
    "ring_attention",
    "ulysses_attention",
    "zigzag_shard",
    "zigzag_unshard",
    "ColumnParallelLinear",
    "DenseMLP",
    "DenseSelfAttention",
    "ParallelMLP",
    "ParallelSelfAttention",
    "PipelineParallel",
    "Plan",
    "RowParallelLinear",
    "ZeroOptimizer",
    "allreduces_per_layer",
    "bubble_fraction",
    "buffer_depths",
    "collective_counts",
    "consolidate_state",
    "copy_to_tp",
    "estimate_3d",
    "map_reduce",
    "microbatch_step_time",
    "partition",
    "peak_in_flight",
    "pipeline_schedule",
    "plan_3d",
    "reduce_from_tp",
    "reset_counts",
    "shard_bounds",
    "shard_state",
    "simulate",
    "simulate_column_parallel",
    "simulate_row_parallel",
    "simulate_stream",
    "stream_period",
    "tune_microbatch",
    "validate_schedule",
    "zero_memory_per_rank",
]

from .checkpoint_interval import (  # noqa: E402 - appended exports (issue 36)
    CheckpointTuner,
    failure_trace,
    simulate_checkpointing,
    waste_rate,
    young_daly_interval,
)
from .rebalance import (  # noqa: E402
    LayerRebalancer,
    migration_seconds,
    partition_layers,
    pipeline_step_time,
    simulate_rebalance,
    simulate_reslicing,
    split_batch,
    stage_times,
)
from .topology import Level, Placement, comm_per_step, group_levels, map_3d  # noqa: E402

__all__ += [
    "CheckpointTuner",
    "Level",
    "LayerRebalancer",
    "Placement",
    "comm_per_step",
    "failure_trace",
    "group_levels",
    "map_3d",
    "migration_seconds",
    "partition_layers",
    "pipeline_step_time",
    "simulate_checkpointing",
    "simulate_rebalance",
    "simulate_reslicing",
    "split_batch",
    "stage_times",
    "waste_rate",
    "young_daly_interval",
]
from .staleness import (  # noqa: E402 - appended exports (Q185)
    RULES,
    aggregate_stale,
    delay_compensate,
    least_squares_problem,
    simulate_async_sgd,
    staleness_weight,
)

__all__ += [
    "RULES",
    "aggregate_stale",
    "delay_compensate",
    "least_squares_problem",
    "simulate_async_sgd",
    "staleness_weight",
]
from .graph_plan import (  # noqa: E402 - appended exports (Q147)
    Chain,
    GraphPlan,
    OpNode,
    check_graph,
    layer_chain,
    min_max_partition,
    plan_graph,
    to_chain,
)

__all__ += ["Chain", "GraphPlan", "OpNode", "check_graph", "layer_chain", "min_max_partition", "plan_graph", "to_chain"]
from .reshard import (  # noqa: E402 - appended exports (Q134)
    Transfer,
    apply_plan,
    consolidate_bytes,
    plan_traffic,
    reshard_plan,
    reshard_zero,
)

__all__ += ["Transfer", "apply_plan", "consolidate_bytes", "plan_traffic", "reshard_plan", "reshard_zero"]
