"""The ``cpu`` backend: fused C++ kernels from ``cpp_src/kernels_*.cpp`` (tinylearn._C.kernels), OpenMP over rows.

Each op keeps its versions ladder (llm.c style), every rung selectable and tested in tests/kernels/test_kernels_cpu.py:

- softmax: ``three_pass`` (compiler-vectorised, libm-free exp), ``online`` (lane-wise online max/sum, 2 exps per
  element), ``simd`` (three passes on the explicit vector exp of ``cpp_src/vec_math.h``, one thread), ``simd_omp``
  (``simd`` + OpenMP over rows with a grain of 32 Ki elements per thread), ``online_simd`` (one read for the
  statistics, blocked online rescale, then the write pass).
- log_softmax (forward and backward, one version each): three passes per row (max, sum of exp, write), one exp
  per element; the backward one pass for sum(dy) and one for dx = dy - e^y sum(dy) (cpp_src/kernels_softmax.cpp;
  ``log_softmax_path()`` reports the float32 copy: avx512 / avx2 / scalar after ``TINYLEARN_CPU_FEATURES``).
- cross_entropy (forward and backward, one version each): class-index targets, ignore_index, label smoothing; the
  forward reads each row twice (the log_softmax statistics of cpp_src/softmax_rows.h) and writes per-row losses and
  (max, log sum exp) only, the backward writes softmax - onehot scaled in one pass (cpp_src/kernels_cross_entropy.cpp).
- layer_norm: ``two_pass``, ``welford``, ``simd`` (one pass of shifted sums in float64 lanes + the write pass),
  ``simd_omp``.
- batch_norm (forward and backward, one version each): [N, C, L], OpenMP over channels, double accumulators, the
  training statistics or given (eval) ones; the backward from two per-channel sums, then one pass for dx
  (cpp_src/kernels_batchnorm.cpp, compiled like group_norm's: avx512 / avx2 / baseline copies).
- group_norm (forward and backward, one version each): [N, C, HW] with weight/bias [C] or None, OpenMP over the N*G
  groups, double accumulators, one write pass (cpp_src/kernels_groupnorm.cpp; ``group_norm_path()`` reports the
  compiled copy the call takes: avx512 / avx2 / scalar after ``TINYLEARN_CPU_FEATURES``).
- bias_gelu (forward): ``autovec`` (Abramowitz-Stegun erf, compiler-vectorised), ``simd`` (vec_math.h's
  ``gelu_erf``: max(u, 0) - v Phi(-v) with v = |u|, Phi(-v) = e^{-v^2/2} S(v / (v + 4)), one polynomial and no
  cancellation in the negative tail; the tanh form uses the vector tanh), ``simd_omp``.
- flash attention (forward): ``tiled`` (v0: 4x32 micro-GEMMs the compiler vectorises, OpenMP), ``blocked_simd`` (v1:
  explicit AVX-512/AVX2/scalar micro-kernels on transposed score tiles, vector exp, one thread),
  ``blocked_simd_omp`` (v2, default: v1 + OpenMP over (head, query block)). The backward has the same three names:
  ``tiled`` (the first version), ``blocked_simd`` (FlashAttention-2: P recomputed from the saved logsumexp, dK/dV
  per key block, vector micro-kernels), ``blocked_simd_omp`` (default: OpenMP over (key block, head), dQ summed
  from per-thread buffers).
  [1, 8, N, 64] fp32, one thread, CPU time (dev box, loaded by other jobs): time / torch SDPA 0.55-1.2x at
  N = 512-4096 (``tiled`` 1.0-1.8x), causal ~0.5x its non-causal time (key tiles past the diagonal skipped).

Outputs above 4 MiB: the LayerNorm and bias+GELU SIMD rungs write them with non-temporal (streaming) stores,
which skip the read-for-ownership of each output line and leave the input in cache (cpp_src/common.h,
``_C.kernels.stream_output``; ``TINYLEARN_STREAM_MIN_BYTES`` overrides the threshold). LayerNorm 1024x4096 fp32, one
thread, CPU time on the loaded 2-core AVX-512 box: 2.4 -> 1.6 ms (AVX-512), 2.8 -> 2.0 ms (forced AVX2); neutral
for bias+GELU (compute-bound on the vector erf); softmax keeps normal stores (its rows are already in cache when the
last pass writes them: streaming measured slower).

The SIMD rungs choose AVX-512 / AVX2 / scalar at run time (``TINYLEARN_CPU_FEATURES`` forces it;
``tinylearn.cpu.kernel_paths()`` reports it); scalar and AVX2 give bit-identical results. They are float32 kernels:
float64 (which exists for gradcheck) runs the first rung's code under every version name.

Defaults (best of 30 at one thread, fp32, 4096x768 and 1024x4096, on the 2-core AVX-512 dev box under load from other
jobs; ratio to torch eager): softmax ``simd_omp`` 0.69-0.71x / 0.98x vs ``three_pass`` 0.84-0.86x / 1.08x; LayerNorm
``simd_omp`` 0.51-0.64x / 0.84x vs ``two_pass`` 0.56-0.64x / 0.92x; bias+GELU ``simd_omp`` (the earlier vector-erf form)
0.77-0.80x / 0.80x vs ``autovec`` 0.75-0.77x / 0.83x. With ``gelu_erf`` (about 1.6x fewer multiply/FMA instructions per
element than the vector erf), quiet box, 2 threads, median: bias+GELU 0.49x / 0.57x on AVX-512 and 0.77x / 0.71x with
AVX2 forced on torch and tinylearn (benchmarks/amd-epyc-avx512*/2026-11-24T16*.json), accurate to <= 8 ulp on [-5, 6]
where autovec's A&S erf has a 1.5e-7 absolute error. ``simd_omp`` adds threads only above 2 x 32 Ki elements. numba
would need a JIT warm-up and cannot use OpenMP ``simd`` reductions, so the C++ path is the only cpu path. float16 is
computed in float32 by the dispatcher. (``tinylearn.kernels.softmax/layer_norm(backend="cpu")`` pick their version from
the registry table in ops.py; these defaults apply where a caller passes ``version=None``.)
"""

from __future__ import annotations

import numpy as np

from .. import backends

NATIVE_DTYPES = (np.float32, np.float64)

SOFTMAX_VERSIONS: tuple[str, ...] = ("three_pass", "online", "simd", "simd_omp", "online_simd")
LAYER_NORM_VERSIONS: tuple[str, ...] = ("two_pass", "welford", "simd", "simd_omp")
BIAS_GELU_VERSIONS: tuple[str, ...] = ("autovec", "simd", "simd_omp")
ATTENTION_VERSIONS: tuple[str, ...] = ("tiled", "blocked_simd", "blocked_simd_omp")

DEFAULT_GRAIN = 1 << 15  # kGrain of cpp_src/kernels_math.h: what grain=0 means
SOFTMAX_VERSION = "simd_omp"
LAYER_NORM_VERSION = "simd_omp"
BIAS_GELU_VERSION = "simd_omp"
ATTENTION_VERSION = "blocked_simd_omp"


def _k():
    return backends.load_C("kernels")


def available() -> tuple[bool, str]:
    try:
        _k()
    except RuntimeError as e:
        return False, str(e)
    return True, ""


def vector_math_path() -> str:
    """The path the simd versions take now: 'avx512' | 'avx2' | 'scalar' (after TINYLEARN_CPU_FEATURES)."""
    return str(_k().vec_isa())


def softmax(x: np.ndarray, version: str | None = None, grain: int = 0) -> np.ndarray:
    """Row softmax of x [R, C]; ``grain``: elements per thread at least for the threaded versions (0 = kGrain)."""
    return _k().softmax_forward(x, version or SOFTMAX_VERSION, int(grain))


def softmax_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return _k().softmax_backward(y, dy)


def log_softmax(x: np.ndarray) -> np.ndarray:
    return _k().log_softmax_forward(x)


def log_softmax_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return _k().log_softmax_backward(y, dy)


def cross_entropy(
    x: np.ndarray, target: np.ndarray, ignore_index: int, label_smoothing: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """(loss [R], stats [R, 2], valid row count) of logits rows x [R, C] (cpp_src/kernels_cross_entropy.cpp)."""
    return tuple(_k().cross_entropy_forward(x, target, int(ignore_index), float(label_smoothing)))


def cross_entropy_backward(
    x: np.ndarray, stats: np.ndarray, target: np.ndarray, scale: np.ndarray, ignore_index: int, label_smoothing: float
) -> np.ndarray:
    return _k().cross_entropy_backward(x, stats, target, scale, int(ignore_index), float(label_smoothing))


def log_softmax_path() -> str:
    """The float32 row copy log_softmax_forward/backward take now: 'avx512' | 'avx2' | 'scalar'."""
    return str(_k().log_softmax_path())


def layer_norm(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, version: str | None = None, grain: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm over the rows of x [R, C] -> (y, mean, rstd); ``grain`` as in ``softmax`` (simd_omp only)."""
    return tuple(_k().layer_norm_forward(x, w, b, float(eps), version or LAYER_NORM_VERSION, int(grain)))


def layer_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_k().layer_norm_backward(dy, x, w, mean, rstd))


def batch_norm(
    x: np.ndarray,
    w: np.ndarray | None,
    b: np.ndarray | None,
    mean: np.ndarray | None,
    var: np.ndarray | None,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(y, mean, invstd, var) of x [N, C, L] (cpp_src/kernels_batchnorm.cpp); mean/var None: training."""
    return tuple(_k().batch_norm_forward(x, w, b, mean, var, float(eps)))


def batch_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    w: np.ndarray | None,
    mean: np.ndarray,
    invstd: np.ndarray,
    training: bool,
    need_dx: bool = True,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    return tuple(_k().batch_norm_backward(dy, x, w, mean, invstd, bool(training), bool(need_dx)))


def group_norm(
    x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, num_groups: int, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_k().group_norm_forward(x, w, b, int(num_groups), float(eps)))


def group_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray | None, mean: np.ndarray, rstd: np.ndarray, num_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_k().group_norm_backward(dy, x, w, mean, rstd, int(num_groups)))


def group_norm_path() -> str:
    """The compiled copy of the GroupNorm kernels a call takes now: 'avx512' | 'avx2' | 'scalar'."""
    return str(_k().group_norm_path())


def bias_gelu(x: np.ndarray, b: np.ndarray, approximate: str = "none", version: str | None = None) -> np.ndarray:
    return _k().bias_gelu_forward(x, b, approximate == "tanh", version or BIAS_GELU_VERSION)


def bias_gelu_backward(
    dy: np.ndarray, x: np.ndarray, b: np.ndarray, approximate: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    return tuple(_k().bias_gelu_backward(dy, x, b, approximate == "tanh"))


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, block_size: int = 64, version: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    return tuple(_k().flash_attention_forward(q, k, v, bool(causal), int(block_size), version or ATTENTION_VERSION))


def attention_path(dv: int) -> str:
    """The instruction set the blocked_simd rungs take now for value head dim ``dv``: 'avx512' | 'avx2' | 'scalar'
    (after TINYLEARN_CPU_FEATURES; the widest whose vector width divides ``dv``)."""
    return str(_k().flash_attention_path(int(dv)))


def attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    causal: bool,
    block_size: int = 64,
    version: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ver = version or ATTENTION_VERSION
    return tuple(_k().flash_attention_backward(q, k, v, o, lse, do, bool(causal), int(block_size), ver))
