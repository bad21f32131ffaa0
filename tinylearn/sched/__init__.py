"""``tinylearn.sched``: multi-tenant job scheduling, fairness and power capping (topic 18).

Real jobs on this machine, one policy interface shared with a simulator validated against them, and the power,
thermal and economic models around a cluster. Every simulated or modelled number is labelled MODEL. Names resolve
lazily.

    jobs / policies     Job, JobState, validate_job; Policy (select(waiting, running, free, now)) with FIFO, SJF,
                        SRPT, EDF, PriorityAging, WeightedUrgency, Backfill (EASY), WeightedFair (weighted DRF)
    cluster             Cluster(devices=..., policy=..., preempt="suspend"|"checkpoint"): jobs as worker processes
                        pinned to this machine's cores, paused / stopped at step boundaries (worker.py); the
                        ClusterReport of measured JCT, waits, utilisation, Jain's index (metrics.py)
    simulator           Simulator (discrete events, the same policies, device models with sources in device_model.py),
                        synthetic_trace (traces.py), calibrate / validate against the real runs (calibrate.py),
                        heterogeneous placement (hetero.py, hetero_cost.py)
    power and heat      PID, PowerCapAllocator, DualThresholdController, BatchSizeController (power.py), DVFS
                        (power_dvfs.py), the plant they control (plant.py), online power models and spike prediction
                        (predict.py), temperature prediction and heat-aware migration (thermal.py) -- all MODEL
    economics           DRF and weighted max-min (fairness.py), Shapley cost shares (shapley.py), auctions and games
                        (market.py), Pareto fronts and Tchebycheff queues (pareto.py), tabular Q-learning over tenants
                        (tenant_rl.py)
    bench               ``tinylearn bench sched`` (bench.py)
"""

from __future__ import annotations

from .._lazy import lazy_exports

_MODULES: dict[str, tuple[str, ...]] = {
    "jobs": ("Job", "JobState", "validate_job", "jain_index"),
    "policies": (
        "Policy",
        "FIFO",
        "SJF",
        "SRPT",
        "EDF",
        "PriorityAging",
        "WeightedUrgency",
        "Backfill",
        "WeightedFair",
        "POLICIES",
        "make_policy",
    ),
    "cluster": ("Cluster",),
    "metrics": ("ClusterReport",),
    "sim": ("Simulator", "SimReport", "simulate", "single_machine"),
    "traces": ("synthetic_trace", "arrival_rate"),
    "calibrate": ("calibrate", "validate"),
    "device_model": ("DeviceSpec", "A100", "H100", "DEVICES"),
    "hetero": ("heft", "Platform", "default_platform", "gpt_graph"),
    "hetero_cost": ("composite", "anneal", "min_energy_dp", "min_energy_greedy"),
    "plant": ("Plant", "FirstOrderPlant"),
    "power": (
        "PID",
        "PowerCapAllocator",
        "DualThresholdController",
        "BatchSizeController",
        "step_response",
        "response_metrics",
        "fit_power_model",
        "best_batch",
    ),
    "power_dvfs": ("MultiObjectiveDVFS", "frequency_waveform", "arrhenius_af"),
    "predict": ("RLSPowerModel", "throttle_run"),
    "thermal": ("TempPredictor", "heat_aware_migration"),
    "fairness": ("drf_allocate", "weighted_max_min"),
    "shapley": ("shapley_exact", "shapley_mc"),
    "market": ("second_price_auction", "power_slot_auction", "pure_nash", "price_of_anarchy"),
    "pareto": ("ParetoFront", "TchebycheffQueue", "pareto_filter", "choose_kernel"),
    "tenant_rl": ("q_learning", "KernelLaunchEnv"),
}
_EXPORTS = {name: mod for mod, names in _MODULES.items() for name in names}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
__all__ = sorted(_EXPORTS)
