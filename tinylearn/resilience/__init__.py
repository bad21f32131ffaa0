"""``tinylearn.resilience``: training that survives failures (topic 15).

    checkpoints (sharded.py, manifest.py)   save_sharded / load_sharded: every rank writes its shard, rank 0 commits
                                a manifest (shapes, dtypes, crc32) last; load reshards to any world size; atomic
                                writes (atomic.py); torch DCP interop (dcp_compat.py); torn-write and disk-full
                                drills (faults.py)
    async and incremental       AsyncCheckpointer (async_ckpt.py, async_process.py): snapshot to host, a writer
                                process (shared memory, O_DIRECT) or thread, versions so only changed shards are
                                written; delta chains and XOR diffs (incremental.py); a shard
                                migrating between tiers under live updates (tier_log.py)
    erasure coding              Reed-Solomon over GF(2^8) with a C++ split-nibble kernel (erasure.py,
                                cpp_src/resilience_gf256.cpp); protect / repair a checkpoint's files (ec_files.py);
                                in-memory peer replication (replication.py)
    elastic training            run(): resume from the last checkpoint at any world size, Young/Daly interval with C
                                measured (elastic.py); ZeRO / DDP state as shards (zero_state.py); tensor-parallel
                                layers and pipeline stages as shards, loadable into another layout
                                (parallel_state.py); the torchrun kill-and-resume drill (drills.py)
    failure schedules           failure math (failure_math.py), stragglers and bounded staleness (stragglers.py),
                                pipeline replay after a stage failure (pipeline_replay.py), risk-triggered migration
                                (risk.py), redundant execution under a budget (redundancy.py)

Names resolve lazily (``tl.resilience.save_sharded`` imports sharded.py on first use).
"""

from __future__ import annotations

from .._lazy import lazy_exports

_MODULES = {
    "atomic": ("atomic_write", "CheckpointError", "CorruptCheckpoint", "IncompleteCheckpoint", "DiskFull",
               "remove_stale_temps"),
    "sharded": ("Shard", "save_sharded", "load_sharded", "AsyncSave", "latest_checkpoint", "list_checkpoints",
                "read_manifest", "step_dir"),
    "manifest": ("Manifest", "fingerprint"),
    "dcp_compat": ("to_dcp", "from_dcp"),
    "faults": ("torn_write_drill", "disk_full_rlimit", "disk_full_tmpfs"),
    "erasure": ("encode", "decode", "rebuild", "gf256_matmul", "cauchy_parity_matrix"),
    "ec_files": ("protect", "repair", "damaged_files"),
    "replication": ("PeerReplicator",),
    "async_ckpt": ("AsyncCheckpointer", "load_async", "latest_async_checkpoint", "torch_versions"),
    "incremental": ("DeltaCheckpointer", "compact", "XorChain", "xor_delta", "xor_apply"),
    "tier_log": ("TieredShard",),
    "elastic": ("run", "RunReport", "global_batch", "ensure_group"),
    "parallel_state": ("TPState", "PipelineStageState", "tp_shards", "load_tp_state", "pp_shards", "load_pp_state"),
    "zero_state": ("ZeroState", "DDPState", "MultiState", "zero_shards", "load_zero_state", "ddp_shards",
                   "load_ddp_state"),
    "drills": ("live_vs_restart",),
    "failure_math": ("cluster_mtbf", "p_no_failure", "expected_failures", "young_interval", "daly_interval",
                     "optimal_interval", "expected_completion_time", "measure_checkpoint_cost"),
    "stragglers": ("StragglerDetector", "detect_stragglers", "ParameterServer", "run_async_sgd", "run_sync_sgd"),
    "pipeline_replay": ("build_schedule", "replay_set", "PipelineExecutor"),
    "risk": ("RiskPredictor", "evaluate_migration", "migration_bytes"),
    "redundancy": ("knapsack_exact", "greedy_by_ratio", "choose_redundant", "expected_recompute_cost"),
}  # fmt: skip
_EXPORTS = {name: mod for mod, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
