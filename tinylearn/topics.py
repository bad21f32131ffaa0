"""The topic table: one row per topic, the single place a topic is added.

Used by ``tinylearn bench`` (bench module), ``tinylearn check`` (exercise folder), the foundation tests (every
listed file exists), the README curriculum map and the question index. ``get()`` accepts any of a topic's names:
the package name (``quant``), the notebook name (``03_quantization``), its number (``03``), the bench name, or an
alias.

Why one file (> 500 lines): the table is the single place a topic is added (a row per topic, each naming its
package, notebook, tests, bench, C++/CUDA sources and questions); split across files it would stop being one table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    name: str  # short name: the package under tinylearn/ and the bench topic
    notebook: str  # notebooks/<notebook>.ipynb, notebooks/src/<notebook>.py
    title: str
    packages: tuple[str, ...]  # tinylearn subpackages this topic owns
    exercises: str | None  # exercises/<exercises>/ (None: no exercise folder)
    tests: tuple[str, ...]  # test modules, in tests/<name>/<module>.py
    bench: str | None  # module defining run(full=False, progress=None) -> list[Table]
    cpp: tuple[str, ...] = ()  # cpp_src/ files (globs allowed)
    cuda: tuple[str, ...] = ()  # cuda_src/ files (globs allowed)
    aliases: tuple[str, ...] = ()
    questions: str = ""  # seed question numbers the notebook answers (the README map's column)
    # test modules run by the sanitizer job (tools/sanitize_all.sh) against the ASan/UBSan build of _C: None = all of
    # them when the topic has C++ sources, none otherwise; a tuple names the ones that reach C++
    sanitize: tuple[str, ...] | None = None
    # test modules whose results cannot depend on a CPU numeric path (file layout, CLI, packaging, docs, nvcc,
    # process launchers): marked ``path_independent`` by tests/conftest.py, so make test-portable does not rerun them
    path_independent: tuple[str, ...] = ()
    # why the notebook must have the cores to itself ("" = it may share them: tools/nbval_run.py and lab_test.py run
    # two such notebooks at once, and rerun one alone if it fails beside another); set where an assert reads a
    # measurement of several processes, of the cores' capacity or of latency tails (collective times, real job
    # timings, TPOT p99)
    notebook_exclusive: str = ""
    # modules (under tinylearn/) whose import registers this topic's ops in tinylearn.backends: backends imports them
    # from here the first time an op of one of the topic's packages is asked for, so an op is found whether or not
    # its package was imported (tests/tour/test_foundation.py checks that every registering module is listed)
    registers: tuple[str, ...] = ()

    def sanitized_tests(self) -> tuple[str, ...]:
        """The test files (paths) the sanitizer job runs for this topic."""
        mods = self.sanitize if self.sanitize is not None else (self.tests if self.cpp else ())
        return tuple(f"tests/{self.name}/{m}.py" for m in mods)

    def test_paths(self) -> tuple[str, ...]:
        """The test files, relative to the repository root."""
        return tuple(f"tests/{self.name}/{m}.py" for m in self.tests)

    @property
    def number(self) -> str:
        return self.notebook.split("_", 1)[0]

    def names(self) -> tuple[str, ...]:
        return (self.name, self.notebook, self.number, *self.aliases)


TOPICS: tuple[Topic, ...] = (
    Topic(
        "tour",
        "00_tour",
        "Tour: roofline and honest benchmarking",
        ("bench", "testing"),
        None,
        (
            "test_foundation",
            "test_api_surface",
            "test_roofline",
            "test_question_index",
            "test_bench_record",
            "test_cpu_dispatch",
            "test_input_policy",
            "test_lab",
            "test_notebook_markers",
            "test_packaging",
            "test_nbcompare",
            "test_machine",
            "test_cli",
        ),
        "tinylearn.bench.matmul",
        ("machine.cpp",),
        aliases=("matmul",),
        questions="—",
        sanitize=("test_cpu_dispatch", "test_roofline", "test_machine"),
        path_independent=(
            "test_foundation",
            "test_api_surface",
            "test_question_index",
            "test_bench_record",
            "test_lab",
            "test_notebook_markers",
            "test_packaging",
            "test_nbcompare",
            "test_cli",
        ),
    ),
    Topic(
        "autograd",
        "01_autodiff",
        "Autodiff engine, nn, optim",
        ("autograd", "nn", "optim", "data"),
        "01_autodiff",
        (
            "test_autograd",
            "test_nn",
            "test_optim",
            "test_data",
            "test_ops_breadth",
            "test_ops_modules",
            "test_relu_kernel",
            "test_autograd_hardening",
            "test_pad_fast",
            "test_gemm_route",
        ),
        "tinylearn.autograd.bench",
        ("optim*.cpp", "autograd_*.cpp"),
        aliases=("autodiff",),
        questions="4, 17, 18, 24, 34, 70, 93",
        sanitize=(
            "test_autograd",
            "test_nn",
            "test_optim",
            "test_data",
            "test_ops_breadth",
            "test_ops_modules",
            "test_relu_kernel",
            "test_autograd_hardening",
        ),
        registers=("autograd.relu", "autograd.ops_index", "optim.optimizer"),
    ),
    Topic(
        "conv",
        "02_im2col_conv",
        "im2col convolution",
        ("conv",),
        "02_im2col_conv",
        (
            "test_conv",
            "test_conv_im2col",
            "test_conv_implicit",
            "test_conv_nn",
            "test_conv_deformable",
            "test_ops_spatial",
            "test_conv_fold",
            "test_conv_params",
        ),
        "tinylearn.conv.bench",
        ("conv_*.cpp", "conv_*.h", "conv_direct_simd.inc"),
        aliases=("im2col",),
        questions="2, 22, 32, 98, 103, 144",
        sanitize=(
            "test_conv",
            "test_conv_im2col",
            "test_conv_implicit",
            "test_conv_nn",
            "test_conv_deformable",
            "test_ops_spatial",
        ),
        registers=("conv.conv2d", "conv.im2col", "conv.functional_pool"),
    ),
    Topic(
        "quant",
        "03_quantization",
        "Quantization: INT8/INT4/FP8, observers, PTQ/QAT",
        ("quant",),
        "03_quantization",
        (
            "test_quant",
            "test_quant_fp8",
            "test_quant_gemm",
            "test_quant_ptq",
            "test_quant_calibration_more",
            "test_quant_pareto",
            "test_quant_equalize",
        ),
        "tinylearn.quant.bench",
        ("quant_*.cpp", "quant_*.h"),
        ("quant_*.cu",),
        aliases=("quantization",),
        questions="3, 13, 21, 44, 45, 51, 65, 66, 74, 80, 84, 130, 148, 156, 180, 190, 196, 208, 238",
        sanitize=(
            "test_quant",
            "test_quant_fp8",
            "test_quant_gemm",
            "test_quant_ptq",
        ),
        registers=("quant.affine", "quant.fp8", "quant.gemm", "quant.modules", "quant.cuda"),
    ),
    Topic(
        "prune",
        "04_pruning",
        "Pruning and sparsity",
        ("prune", "sparse"),
        "04_pruning",
        ("test_prune", "test_sparse", "test_prune_rigl", "test_prune_ratio_model"),
        "tinylearn.prune.bench",
        ("sparse*.cpp",),
        ("sparse_*.cu",),
        aliases=("pruning", "sparse"),
        questions="26, 46, 95, 97, 128, 152, 167, 173, 184, 187, 197",
        sanitize=(
            "test_prune",
            "test_sparse",
            "test_prune_rigl",
        ),
        registers=("sparse.base", "sparse.cuda"),
    ),
    Topic(
        "kernels",
        "05_fused_kernels",
        "Fused kernels: softmax, LayerNorm, bias+GELU, flash attention",
        ("kernels",),
        "05_fused_kernels",
        (
            "test_kernels",
            "test_kernels_bench",
            "test_kernels_cpu",
            "test_kernels_cuda",
            "test_kernels_notebook_helpers",
            "test_kernels_numba",
            "test_kernels_torch",
            "test_kernels_traffic",
            "test_flash_cpu",
            "test_kernels_split",
            "test_cuda_compile",
            "test_vec_math",
            "test_group_norm",
            "test_log_softmax",
            "test_cross_entropy",
            "test_batch_norm",
        ),
        "tinylearn.kernels.bench",
        ("kernels*.cpp", "flash_attention_simd.inc"),
        ("kernels_*.cu", "vector_reduce.cu"),
        aliases=("fused_kernels",),
        questions="5, 13, 17, 18, 31, 54, 55, 69, 72, 79, 101, 205",
        sanitize=(
            "test_kernels",
            "test_kernels_cpu",
            "test_kernels_torch",
            "test_flash_cpu",
            "test_vec_math",
            "test_group_norm",
            "test_log_softmax",
            "test_cross_entropy",
            "test_batch_norm",
        ),
        path_independent=("test_cuda_compile",),
        registers=("kernels.ops", "kernels.reduce"),
    ),
    Topic(
        "dist",
        "06_allreduce",
        "All-reduce and collectives",
        ("dist",),
        "06_allreduce",
        (
            "test_dist",
            "test_dist_launchers",
            "test_dist_model",
            "test_dist_cost_fit",
            "test_dist_planning",
            "test_dist_compression_more",
            "test_dist_topology_more",
            "test_dist_parity_more",
            "test_dist_counters",
        ),
        "tinylearn.dist.bench",
        aliases=("allreduce",),
        questions="25, 30, 61, 85, 94, 102a, 122, 141, 145, 157, 160, 192, 201, 209, 223, 230, 235, 283",
        path_independent=("test_dist_launchers",),
        notebook_exclusive="gloo processes on every core; asserts on the measured collective times (16 MB vs 64 KB, "
        "fitted costs)",
    ),
    Topic(
        "memory",
        "07_memory_pools",
        "Memory pools and allocators",
        ("memory",),
        "07_memory_pools",
        (
            "test_memory",
            "test_memory_cuda",
            "test_memory_planner",
            "test_memory_compaction",
            "test_memory_fastpath",
            "test_memory_tensor_cache",
        ),
        "tinylearn.memory.bench",
        ("memory*.cpp", "memory/*.h"),
        ("memory_*.cu",),
        aliases=("memory_pools",),
        questions="14, 27, 37, 49, 59, 76, 88b, 217, 222",
        sanitize=(
            "test_memory",
            "test_memory_planner",
            "test_memory_compaction",
            "test_memory_fastpath",
        ),
        registers=("memory.base", "memory.stream_ordered"),
    ),
    Topic(
        "gemm",
        "08_gemm",
        "GEMM: naive to near-BLAS, roofline, CUDA basics",
        ("gemm",),
        "08_gemm",
        ("test_gemm", "test_gemm_gpu", "test_gemm_occupancy"),
        "tinylearn.gemm.bench",
        ("gemm*.cpp",),
        ("gemm_*.cu",),
        aliases=("matmul_ladder",),
        questions="3, 5, 11, 50, 51, 55, 56, 63, 77, 226",
        sanitize=("test_gemm",),
        registers=("gemm.ops",),
    ),
    Topic(
        "inference",
        "09_llm_inference",
        "LLM inference: KV cache, paged attention, sampling, speculative decoding, batching",
        ("inference",),
        "09_llm_inference",
        (
            "test_inference",
            "test_inference_paged",
            "test_inference_paged_cpp",
            "test_inference_more",
            "test_inference_hardening",
            "test_inference_rope",
            "test_decode_fast",
        ),
        "tinylearn.inference.bench",
        ("inference*.cpp",),
        aliases=("llm_inference",),
        questions="17, 106, 107, 114, 124, 133, 137, 155, 203, 247",
        sanitize=(
            "test_inference",
            "test_inference_paged",
            "test_inference_paged_cpp",
            "test_inference_rope",
        ),
        registers=("inference.paged", "inference.rope"),
    ),
    Topic(
        "parallel",
        "10_parallel_training",
        "Parallel training: ZeRO, tensor and pipeline parallelism, 3D planning",
        ("parallel",),
        "10_parallel_training",
        (
            "test_parallel",
            "test_parallel_dist",
            "test_parallel_more",
            "test_parallel_staleness",
            "test_parallel_hardening",
            "test_parallel_graph",
            "test_parallel_reshard",
        ),
        "tinylearn.parallel.bench",
        aliases=("parallel_training", "zero", "pipeline"),
        questions="8, 25, 39, 41, 48, 75, 96, 134, 147, 150, 176, 185, 207, 240, 252, 255, 274",
    ),
    Topic(
        "amp",
        "11_mixed_precision_memory",
        "Mixed precision and training memory: autocast, loss scaling, FP4/INT2/MX, checkpointing, memory estimate",
        ("amp",),
        "11_mixed_precision_memory",
        (
            "test_amp",
            "test_amp_formats",
            "test_checkpoint",
            "test_memory_estimate",
            "test_amp_more",
            "test_amp_saved_precision",
            "test_amp_hardening",
            "test_amp_bf16",
        ),
        "tinylearn.amp.bench",
        cpp=("amp_*.cpp",),
        aliases=("mixed_precision", "autocast"),
        questions="64, 74, 81, 102b, 105, 119, 148, 169, 219, 239, 250, 253",
        sanitize=(
            "test_amp",
            "test_amp_formats",
            "test_checkpoint",
            "test_amp_bf16",
        ),
        registers=("amp.bf16_ops",),
    ),
    Topic(
        "compiler",
        "12_compiler",
        "A small deep-learning compiler: capture, passes, fusion, loops, C++/Triton/CUDA codegen, vs torch.compile",
        ("compiler",),
        "12_compiler",
        (
            "test_graph",
            "test_trace",
            "test_passes",
            "test_fusion",
            "test_compile",
            "test_autograd_compile",
            "test_shapes",
            "test_memory_plan",
            "test_layout",
            "test_loops",
            "test_codegen_cpp",
            "test_cc",
            "test_codegen_triton",
            "test_codegen_cuda",
            "test_regalloc",
            "test_listsched",
            "test_polyhedral",
            "test_compiler_bench",
            "test_horizontal",
        ),
        "tinylearn.compiler.bench",
        aliases=("compile", "jit"),
        questions="19, 29, 36, 47, 54, 68, 72, 82, 83, 93, 108, 206, 215, 237, 275, 281",
        # the generated C++ is compiled by the system compiler into its own .so, not into _C: no sanitizer run
        sanitize=(),
        # the bench test checks the table's structure (rows, cold compile times), not numbers
        path_independent=(
            "test_regalloc",
            "test_listsched",
            "test_polyhedral",
            "test_codegen_cuda",
            "test_compiler_bench",
        ),
    ),
    Topic(
        "serve",
        "13_llm_serving",
        "LLM serving: continuous batching, paged KV with prefix caching, chunked prefill, preemption, KV tiers, "
        "an OpenAI-compatible server, load tests",
        ("serve",),
        "13_llm_serving",
        (
            "test_serve_engine",
            "test_serve_scheduler",
            "test_serve_block_manager",
            "test_serve_tiering",
            "test_serve_latency",
            "test_serve_server",
            "test_serve_hf",
            "test_serve_loadgen",
            "test_serve_journal",
            "test_serve_prewarm",
            "test_serve_eviction",
            "test_serve_autoscale",
            "test_serve_pipeline",
            "test_serve_beams",
            "test_serve_parallel_choice",
            "test_serve_bench",
            "test_serve_admission",
            "test_serve_token_eviction",
            "test_serve_fault_load",
            "test_serve_fp8_kv",
            "test_serve_delta_tier",
        ),
        "tinylearn.serve.bench",
        aliases=("serving", "llm_serving"),
        questions="106, 107, 113, 124, 133, 137, 143, 162, 183, 189, 193, 198, 203, 220, 224, 244, 259, 261",
        # the engine reaches C++ through the paged-attention decode kernel and the GEMMs of TinyGPT's layers
        sanitize=("test_serve_engine", "test_serve_block_manager"),
        path_independent=("test_serve_tiering", "test_serve_journal", "test_serve_prewarm"),
        notebook_exclusive="asserts on per-token latency percentiles (TPOT p99) and worst engine steps, which a "
        "neighbour's time slices set (shared runs failed on them twice)",
    ),
    Topic(
        "compress",
        "14_compression",
        "Compression: LoRA and QLoRA (NF4), distillation, low-rank factorisation, hardware-aware search, vs peft",
        ("compress",),
        "14_compression",
        (
            "test_lora",
            "test_peft_parity",
            "test_multi_lora",
            "test_lora_adapt",
            "test_nf4",
            "test_qlora",
            "test_distill",
            "test_lowrank",
            "test_grad_compress",
            "test_latency_table",
            "test_nas",
            "test_mixed_config",
            "test_compress_bench",
        ),
        "tinylearn.compress.bench",
        cpp=("compress_nf4.cpp",),
        aliases=("compression", "lora"),
        questions="28, 40, 100, 116, 117, 121, 136, 195, 204, 218, 245, 260",
        sanitize=("test_nf4", "test_qlora"),
        registers=("compress.nf4",),
    ),
    Topic(
        "resilience",
        "15_resilient_training",
        "Resilient training: sharded, async, incremental and erasure-coded checkpoints, elastic restart under torchrun",
        ("resilience",),
        "15_resilient_training",
        (
            "test_sharded",
            "test_faults",
            "test_dcp_compat",
            "test_erasure",
            "test_ec_files",
            "test_replication",
            "test_async_ckpt",
            "test_incremental",
            "test_tier_log",
            "test_elastic",
            "test_zero_state",
            "test_drills",
            "test_failure_math",
            "test_stragglers",
            "test_pipeline_replay",
            "test_risk",
            "test_redundancy",
            "test_resilience_bench",
        ),
        "tinylearn.resilience.bench",
        cpp=("resilience_gf256.cpp",),
        aliases=("resilient_training", "fault_tolerance"),
        questions="109, 120, 134, 157, 177, 179, 185, 191, 207, 225",
        # the erasure code reaches C++ through the GF(2^8) region kernel
        sanitize=("test_erasure", "test_ec_files"),
        # bytes on disk, processes and launchers: no CPU numeric path changes what these tests check
        path_independent=(
            "test_sharded",
            "test_faults",
            "test_dcp_compat",
            "test_replication",
            "test_async_ckpt",
            "test_incremental",
            "test_tier_log",
            "test_elastic",
            "test_zero_state",
            "test_drills",
            "test_failure_math",
            "test_risk",
            "test_resilience_bench",
        ),
        registers=("resilience.erasure",),
    ),
    Topic(
        "longctx",
        "16_long_context_moe",
        "Long context and mixture of experts: ring and Ulysses attention, sequence parallelism, MoE with expert "
        "parallelism, block-sparse attention",
        ("longctx",),
        "16_long_context_moe",
        (
            "test_ring_attention",
            "test_ulysses",
            "test_seq_parallel",
            "test_sp_chunk",
            "test_moe",
            "test_moe_balance",
            "test_moe_parallel",
            "test_expert_heat",
            "test_expert_grads",
            "test_bandwidth_quota",
            "test_moe_quant_router",
            "test_sparse_attention",
            "test_token_merge",
            "test_token_merge_quant",
            "test_pattern_search",
            "test_multiscale_attention",
            "test_shared_kv_attention",
            "test_attention_pruning",
            "test_longctx_bench",
        ),
        "tinylearn.longctx.bench",
        cpp=("longctx_sparse_attn.cpp",),
        aliases=("long_context", "moe", "long_context_moe"),
        questions="31, 52, 53, 73, 86, 112, 121, 132, 142b, 168, 188, 200, 211, 231, 233, 242",
        # the block-sparse kernel is the topic's only C++
        sanitize=("test_sparse_attention", "test_pattern_search"),
        # the code under test in these is communication and merge logic on torch ops with no tinylearn CPU-feature
        # dispatch (each compares with torch's single-process result under the same settings), or the bench tables
        path_independent=(
            "test_ring_attention",
            "test_ulysses",
            "test_seq_parallel",
            "test_moe_parallel",
            "test_expert_heat",
            "test_expert_grads",
            "test_sp_chunk",
            "test_bandwidth_quota",
            "test_longctx_bench",
        ),
        registers=("nn.sparse_attention",),
    ),
    Topic(
        "tune",
        "17_autotuning_profiling",
        "Autotuning and profiling: search spaces next to the kernels, measured search (grid, random, annealing, "
        "evolution, TPE, a learned cost model), tuned dispatch, an op profiler with a torch-like table, a Chrome trace",
        ("tune", "profiler"),
        "17_autotuning_profiling",
        (
            "test_tunable",
            "test_measure",
            "test_records",
            "test_searchers",
            "test_tuner",
            "test_dispatch",
            "test_bandit",
            "test_spaces",
            "test_compiled_schedules",
            "test_cost_model",
            "test_clustering",
            "test_variants",
            "test_recorder",
            "test_flops",
            "test_table",
            "test_profiler_trace",
            "test_counters",
            "test_hotspots",
            "test_ar_predict",
            "test_interference",
            "test_proxy_model",
            "test_tune_bench",
        ),
        "tinylearn.tune.bench",
        aliases=("autotuning", "profiling", "profile", "autotuning_profiling"),
        questions="62, 70, 80, 87, 110, 123, 129, 139, 212, 228, 236",
        # the spaces run the C++ kernels of other topics (their own tests run under the sanitizers); here only the
        # space checks reach C++
        sanitize=("test_spaces",),
        path_independent=("test_records", "test_profiler_trace", "test_counters", "test_tune_bench"),
        registers=("gemm.tuning", "kernels.tuning", "conv.tuning", "quant.tuning", "compiler.tuning"),
    ),
    Topic(
        "sched",
        "18_cluster_scheduling",
        "Cluster scheduling: real jobs on this machine's cores under FIFO/SJF/SRPT/backfill/EDF/aging/weighted DRF, "
        "a discrete-event GPU-cluster simulator calibrated on them, power capping and thermal control (MODEL), "
        "fairness and cost sharing",
        ("sched",),
        "18_cluster_scheduling",
        (
            "test_policies",
            "test_cluster",
            "test_metrics",
            "test_sim",
            "test_traces",
            "test_calibrate",
            "test_hetero",
            "test_plant",
            "test_power",
            "test_predict",
            "test_thermal",
            "test_fairness",
            "test_shapley",
            "test_market",
            "test_pareto",
            "test_tenant_rl",
            "test_sched_bench",
        ),
        "tinylearn.sched.bench",
        aliases=("scheduling", "cluster_scheduling", "cluster"),
        questions="71, 115, 126, 127, 131, 138, 140, 154, 155, 165, 171, 172, 182, 186, 194, 227, 229, 234, 243, 246, "
        "254, 256, 263, 282",
        path_independent=("test_sched_bench",),
        notebook_exclusive="runs real jobs on this machine's cores and asserts their measured completion-time order "
        "per policy",
    ),
)


# cross-topic suites in tests/common/ (no single topic owns them): why each is exempt from a row
COMMON_TESTS: dict[str, str] = {
    "test_bad_input": "bad input for every topic package, driven by this table: one child process per package, rows "
    "with the exception and the argument each call must name (the input policy included)",
    "test_properties": "hypothesis property tests over conv, kernels, sparse, quant, gemm and the allocators",
    "test_conformance": "every registered op x backend x version against its python/numpy reference on the op's "
    "registered example (backends.register(example=)): cross-topic by construction",
    "test_garbage": "hypothesis garbage for every topic package, driven by this table: representative calls x garbage "
    "categories (NaN/inf, floats for ints, bools, strings, None, huge/negative ints, nested lists, wrong-rank/complex/"
    "0-size arrays; numpy scalars as valid values) in one crash-safe child interpreter",
}


def exclusive_notebooks() -> dict[str, str]:
    """notebooks/<name>.ipynb -> why it runs alone (``Topic.notebook_exclusive``); the others may share the cores."""
    return {f"{t.notebook}.ipynb": t.notebook_exclusive for t in TOPICS if t.notebook_exclusive}


def notebook_plan(names: list[str], jobs: int) -> tuple[list[str], list[str]]:
    """(alone, shared): the notebooks (``<name>.ipynb``, in the given order) to run one at a time first, and those
    that may run ``jobs`` at a time -- the topic table's exclusive ones alone, or every one when ``jobs`` is 1.
    tools/nbval_run.py and tools/lab_test.py both run this plan, each with its own engine."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected an int >= 1, got {jobs!r}")
    exclusive = exclusive_notebooks()
    alone = [n for n in names if jobs == 1 or n in exclusive]
    return alone, [n for n in names if n not in alone]


def path_independent_tests() -> set[str]:
    """The test files (paths) whose results cannot depend on the CPU numeric path (not rerun by test-portable)."""
    return {f"tests/{t.name}/{m}.py" for t in TOPICS for m in t.path_independent}


def sanitizer_tests() -> list[str]:
    """Every test file the sanitizer job runs: each row's C++-reaching modules, then the common suites that probe
    the C++ kernels (bad input, properties)."""
    out = [path for t in TOPICS for path in t.sanitized_tests()]
    common = ("test_bad_input", "test_properties", "test_conformance", "test_garbage")
    return out + [f"tests/common/{m}.py" for m in common]


# library modules no test names directly (tests/tour/test_foundation.py checks the rest): module -> the tests that
# exercise it through the public API
INDIRECTLY_TESTED: dict[str, str] = {
    "tinylearn.nn.sparse_attention_bench": "bench_sparse: tests/longctx/test_longctx_bench.py (the block-sparse table)",
    "tinylearn.serve.engine_control": "Engine admission (kv_budget_blocks, AdmissionController) and token-priority "
    "eviction: tests/serve/test_serve_admission.py, test_serve_token_eviction.py",
    "tinylearn._lazy": "the lazy names of tinylearn.serve and tinylearn.compress: every test importing from them",
    "tinylearn.autograd.methods": "Tensor methods: tests/autograd/test_autograd.py, test_ops_breadth.py",
    "tinylearn.autograd.methods_breadth": "Tensor methods: tests/autograd/test_ops_breadth.py",
    "tinylearn.autograd.methods_movement": "Tensor movement/indexing methods: tests/autograd/test_ops_breadth.py, "
    "test_autograd_hardening.py",
    "tinylearn.autograd.ops_math": "Tensor.round/atan2/copysign...: tests/autograd/test_ops_breadth.py (gradcheck)",
    "tinylearn.autograd.ops_movement": "Tensor.roll/tril/pad/diagonal: tests/autograd/test_ops_breadth.py, "
    "test_pad_fast.py",
    "tinylearn.autograd.ops_scan": "Tensor.prod/logsumexp/cumsum: tests/autograd/test_ops_breadth.py",
    "tinylearn.autograd.ops_shape": "reshape/permute/expand/getitem: tests/autograd/test_autograd.py",
    "tinylearn.dist._forkserver_guard": "imported by tl.dist.launch: tests/dist/test_dist.py",
    "tinylearn.memory.viz": "plot_arena: notebook 07 (nbval)",
    "tinylearn.gemm.numba_cpu": "tl.gemm.matmul(backend='numba'): tests/gemm/test_gemm.py",
    "tinylearn.conv._numba": "tl.conv.im2col/col2im(backend='numba'): tests/conv/test_conv_im2col.py",
    "tinylearn.conv.convnd": "3-d im2col/col2im behind conv3d and the 3-d pools: tests/conv/test_ops_spatial.py",
    "tinylearn.nn.functional_spatial": "re-exports (conv1d/3d, pools, interpolate): tests/conv/test_ops_spatial.py",
}


def registering_modules(package: str | None = None) -> tuple[str, ...]:
    """The modules (``tinylearn.<module>``) the table lists as registering backends ops; with ``package``, those of
    that package only (an op named ``"conv.conv2d"`` is registered by a listed ``conv.*`` module)."""
    mods = (m for t in TOPICS for m in t.registers)
    return tuple(f"tinylearn.{m}" for m in mods if package is None or m.split(".", 1)[0] == package)


def all_topics() -> tuple[Topic, ...]:
    return TOPICS


def get(name: str) -> Topic:
    """The topic with this name, notebook name, number or alias; ValueError listing the known names."""
    if not isinstance(name, str):
        raise TypeError(f"topic: must be a str, got {type(name).__name__}")
    key = name.strip().removesuffix(".ipynb").removesuffix(".py")
    for t in TOPICS:
        if key in t.names():
            return t
    known = ", ".join(f"{t.name} ({t.notebook})" for t in TOPICS)
    raise ValueError(f"topic: unknown topic {name!r}; known topics: {known}")


def bench_topics() -> dict[str, str]:
    """bench name -> module, in curriculum order (``tinylearn bench`` uses the short name; aliases resolve)."""
    return {t.name: t.bench for t in TOPICS if t.bench}
