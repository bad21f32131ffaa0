"""``tinylearn.tune``: autotuning over the library's own kernels (topic 17).

Search spaces are declared next to the kernels they tune (``tinylearn.tunable``); this package measures
configurations (warm-up, repeats, outlier rejection, a correctness check before any timing), stores records in a
SQLite database with the machine's fingerprint, searches (grid, random, annealing, evolution, optuna TPE, a learned
XGBoost cost model) and installs the provider that ``backend=None`` dispatch consults (``TINYLEARN_TUNE=off|cached|
search``). Names resolve lazily.

    measure / records       measure_config (check, then time: warm-up, repeats, outlier rejection, re-measure when
                            noisy), RecordDB (SQLite, fingerprinted), fingerprint
    searchers               GridSearch, RandomSearch, AnnealSearch, EvolutionSearch, TPESearch (optuna),
                            ModelGuidedSearch (XGBoost ranking cost model, cost_model.py); tune / best / confirm
    dispatch                TINYLEARN_TUNE=off|cached|search, tuned() context, install()
    compiled                tune_compiled: the loop schedule of every fused kernel of a tl.compile'd function
    bandits                 UCB1 over implementations (bandit.py); run-time statistics choosing compiler variants
                            (variants.py); clustering new variants to reuse measurements (clustering.py)
    predictive models       the next step's time from its history (ar_predict.py), concurrent-kernel interference
                            (interference.py), a pre-silicon proxy of a GEMM schedule (proxy_model.py, a MODEL)
"""

from __future__ import annotations

from .._lazy import lazy_exports

_MODULES: dict[str, tuple[str, ...]] = {
    "measure": ("measure_config", "Measurement", "check_output"),
    "fingerprint": ("fingerprint", "machine_id"),
    "records": ("RecordDB",),
    "searchers": (
        "Searcher",
        "GridSearch",
        "RandomSearch",
        "AnnealSearch",
        "EvolutionSearch",
        "SEARCHERS",
        "config_key",
    ),
    "tpe": ("TPESearch",),
    "tuner": ("tune", "best", "confirm", "TuneResult"),
    "dispatch": ("tuned", "mode", "set_mode", "install"),
    "compiled": ("tune_compiled", "compiled_kernels"),
    "bandit": ("UCB1", "run_bandit", "BanditResult"),
    "cost_model": ("CostModel", "ModelGuidedSearch", "transfer"),
    "clustering": ("VariantClusters", "time_config"),
    "variants": ("VariantBandit", "VariantStats", "BanditRun", "run_batches", "loop_stats"),
    "ar_predict": (
        "ARPredictor",
        "LSTMPredictor",
        "LSTMCell",
        "LastValue",
        "collect_step_times",
        "compare_predictors",
        "pick_batch_size",
    ),
    "interference": (
        "Kernel",
        "default_kernels",
        "measure_pairs",
        "pair_features",
        "InterferenceModel",
        "fit_from_rows",
        "loo_error",
        "order_by_interference",
        "PairWorkers",
        "bandwidth_demand",
        "l2_bytes",
        "llc_bytes",
    ),
    "proxy_model": (
        "ProxyParams",
        "GemmEstimate",
        "gemm_cost",
        "cpu_params",
        "HYPOTHETICAL",
        "rank_configs",
        "validate_on_cpu",
        "schedule_features",
    ),
}
_EXPORTS = {name: mod for mod, names in _MODULES.items() for name in names}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
__all__ = sorted(_EXPORTS)
