"""Public fused ops and the backend dispatcher: validate, reshape to canonical 2-D/3-D, call one backend.

    softmax(x, dim=-1)                     y = exp(x - max) / sum exp(x - max) along ``dim``
    log_softmax(x, dim=-1)                 y = (x - max) - log sum exp(x - max) along ``dim`` (in ops_log_softmax.py)
    layer_norm(x, weight, bias, eps)       over the trailing ``weight.ndim`` dims; biased variance (like torch)
    group_norm(x, num_groups, weight, bias, eps)  x [N, C, *], per group of C/G channels (in ops_group_norm.py)
    bias_gelu(x, bias, approximate)        gelu(x + bias), bias broadcast along the last dim
    flash_attention(q, k, v, causal)       softmax(q k^T / sqrt(D)) v on [..., N, D], tiled with online softmax

Backends (``available_backends()``), registered in ``tinylearn.backends`` as ops ``kernels.<op>`` (one
``_register`` call per backend and ladder below; pin one with ``backends.use("kernels.softmax", backend=...)``):
``numpy`` (unfused reference), ``cpu`` (= ``cpp``: fused C++/OpenMP), ``triton``
(``@triton.jit`` kernels; on a CPU box they run under TRITON_INTERPRET=1), ``cuda`` (cuda_src/ kernels through
cupy, only when a GPU exists). Backward functions exist for ``numpy`` and ``cpu`` (and ``cuda`` where a kernel is
written); flash-attention backward recomputes P from the saved log-sum-exp.

Inputs (``tinylearn._inputs.as_array``): numpy arrays, tl.Tensors or torch CPU tensors of any layout
(non-contiguous and broadcast views are copied to C order), float32/float64, plus float16 (computed in float32,
returned as float16); other dtypes are a TypeError. Outputs are numpy arrays with the input's dtype.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_array, as_int
from .conformance_examples import conformance_examples

_FLOATS = (np.float16, np.float32, np.float64)
PUBLIC_NAMES = {"cpp": "cpu"}  # this topic named the C++ backend "cpu" first; both spellings are accepted

_MODULES = {
    "numpy": "tinylearn.kernels.reference",
    "cpp": "tinylearn.kernels.cpu",
    "triton": "tinylearn.kernels.triton_kernels",
    "cuda": "tinylearn.kernels.cuda",
}
# backend=None: cpp when built, else numpy. triton runs interpreted on a CPU box and cuda moves host arrays over
# PCIe for one memory-bound op, so both are used only when named.
_PRIORITY = {"numpy": 10, "cpp": 20, "triton": 5, "cuda": 1}
_ALL = ("softmax", "softmax_backward", "layer_norm", "layer_norm_backward", "bias_gelu", "bias_gelu_backward")
_ATTN = ("attention", "attention_backward")
_GN = ("group_norm", "group_norm_backward")  # numpy and cpp only
_LSM = ("log_softmax", "log_softmax_backward")  # numpy and cpp only
_CE = ("cross_entropy", "cross_entropy_backward")  # numpy and cpp only (tl.nn.functional.cross_entropy calls them)
_BN = ("batch_norm", "batch_norm_backward")  # numpy and cpp only (tl.nn.functional.batch_norm calls them)


class Kernel:
    """One registered kernel: imports its backend module on first call (triton/cupy are heavy) and checks that
    the module can run in this process (e.g. Triton's interpreter mode), else RuntimeError saying why."""

    def __init__(self, backend: str, module: str, attr: str, fixed: dict[str, Any]) -> None:
        self.backend, self.module_name, self.attr, self.fixed = backend, module, attr, fixed
        self._ready: Any = None  # the module once available() said yes (a backend that runs stays runnable)

    @property
    def module(self) -> Any:
        if self._ready is not None:  # every Tensor-level call asks several times: keep the hit path one attribute
            return self._ready
        mod = importlib.import_module(self.module_name)
        ok, why = mod.available()
        if not ok:
            raise RuntimeError(f"backend: {public_name(self.backend)!r} cannot run {self.attr} in this process: {why}")
        self._ready = mod
        return mod

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return getattr(self.module, self.attr)(*args, **self.fixed, **kw)


def _register(op: str, backend: str, versions: tuple[str, ...] = ("default",), attr: str | None = None) -> None:
    """Register ``<backend module>.<attr or op>`` as ``kernels.<op>``, one entry per version (the first is the
    default); a named cpp/triton version reaches the kernel as ``version=`` (numpy's versions are separate
    functions, named by ``attr``). The module is imported on the first call."""
    extra = (lambda: backends.C_available("kernels")) if backend == "cpp" else None
    for v in versions:
        fixed = {"version": v} if v != "default" and backend in ("cpp", "triton") else {}
        kernel = Kernel(backend, _MODULES[backend], attr or op, fixed)
        backends.register(
            f"kernels.{op}",
            backend,
            kernel,
            version=v,
            priority=_PRIORITY[backend],
            available=extra,
            example=_EXAMPLES.get(op),
        )


_EXAMPLES = conformance_examples()
_register("softmax", "numpy", ("three_pass",))
_register("softmax", "numpy", ("online",), attr="softmax_online")
for _op in _ALL[1:] + _ATTN + _GN + _LSM + _CE + _BN:
    _register(_op, "numpy")
# cpp: the first version of each ladder is the default (vec_math SIMD, OpenMP over rows above a grain size)
_register("softmax", "cpp", ("simd_omp", "three_pass", "online", "simd", "online_simd"))
_register("layer_norm", "cpp", ("simd_omp", "two_pass", "welford", "simd"))
for _op in _ATTN:
    _register(_op, "cpp", ("blocked_simd_omp", "tiled", "blocked_simd"))
for _op in ("softmax_backward", "layer_norm_backward", "bias_gelu", "bias_gelu_backward") + _GN + _LSM + _CE + _BN:
    _register(_op, "cpp")
_register("softmax", "triton", ("one_block", "online"))
for _op in ("layer_norm", "bias_gelu", "attention"):
    _register(_op, "triton")
for _op in _ALL + ("attention",):
    _register(_op, "cuda")


def public_name(backend: str) -> str:
    return PUBLIC_NAMES.get(backend, backend)


def available_backends() -> list[str]:
    """Backends that can run here, in the documented order: numpy always; cpu if the C++ extension is built;
    triton if installed; cuda only with a CUDA device (``tinylearn.backends.cuda_available()``)."""
    here = set(backends.available("kernels.softmax"))
    return [public_name(b) for b in backends.registered("kernels.softmax") if b in here]


def default_backend() -> str:
    """What ``backend=None`` runs: cpu when the C++ extension is built, else numpy."""
    return public_name(backends.resolve("kernels.softmax")[0])


def _kernel(op: str, backend: str | None, version: str | None = None) -> Kernel:
    """The registered kernel for ``op``; registry errors gain the list of backends available here."""
    try:
        _, _, fn = backends.resolve(f"kernels.{op}", backend, version)
    except (ValueError, RuntimeError) as e:
        raise type(e)(f"{e}; available: {available_backends()}") from None
    return fn


def tensor_path(op: str, dtype: Any) -> tuple[str, str | None] | None:
    """(backend, version) a Tensor-level op (``tl.nn.functional``) runs ``kernels.<op>`` on for ``dtype``: the
    registry's choice (a ``backends.use`` pin, else the fastest available), or ``("numpy", None)`` when that backend
    lacks the dtype (fp64 always keeps fp64). None: not float32/float64, so the Tensor op's own numpy code runs."""
    if np.dtype(dtype).type not in (np.float32, np.float64):
        return None
    b, v, k = backends.resolve(f"kernels.{op}")
    return (b, v) if np.dtype(dtype).type in k.module.NATIVE_DTYPES else ("numpy", None)


def affine_path(op: str, x: np.ndarray, *params: np.ndarray | None) -> tuple[str, str | None] | None:
    """``tensor_path`` of a normalization op (layer_norm, group_norm, batch_norm) on ``x`` with its affine
    ``params`` (weight, bias; None when absent), or None for the Tensor op's own numpy code: empty input, or a
    parameter of another dtype than x."""
    if x.size == 0 or any(p is not None and p.dtype != x.dtype for p in params):
        return None
    return tensor_path(op, x.dtype)


def backward_backend(op: str, forward_backend: str) -> str:
    """The backend for ``kernels.<op>_backward`` after a forward on ``forward_backend``: the same one when it has a
    backward kernel, else the numpy reference."""
    return forward_backend if forward_backend in backends.registered(f"kernels.{op}_backward") else "numpy"


def _as_float(x: Any, name: str) -> np.ndarray:
    return as_array(x, name, dtypes=_FLOATS)


def _compute_dtype(k: Kernel, dtype: np.dtype, name: str) -> type:
    """The dtype the backend computes in: native if it has it, float16 -> float32 otherwise, else a TypeError."""
    native = k.module.NATIVE_DTYPES
    if dtype.type in native:
        return dtype.type
    if dtype.type == np.float16 and np.float32 in native:
        return np.float32
    names = [np.dtype(t).name for t in native] + (["float16"] if np.float32 in native else [])
    raise TypeError(f"{name}: dtype {dtype} is not supported by backend {public_name(k.backend)!r}; supported: {names}")


def _prep(a: np.ndarray, ct: type) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=ct)


def _check_dim(dim: int, ndim: int) -> int:
    dim = as_int(dim, "dim")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ValueError(f"dim: {dim} out of range for an array with {ndim} dimensions")
    return int(dim) % max(ndim, 1)


def _rows(x: np.ndarray, ct: type) -> np.ndarray:
    c = x.shape[-1] if x.ndim else 1
    return _prep(x, ct).reshape(-1, c)


# ------------------------------------------------------------------------------------------------ softmax
def along_rows(
    op: str, arrays: tuple[tuple[str, Any], ...], dim: int, backend: str | None, version: str | None = None, **kw: Any
) -> np.ndarray:
    """The row-wise kernels' entry point (softmax, log_softmax and their backwards): check the named arrays (float,
    one shape), move ``dim`` last, call ``kernels.<op>`` on the canonical rows [R, C] and move the result back, in
    the first array's dtype. Extra keywords go to the kernel."""
    (name, first), *rest = arrays
    first = _as_float(first, name)
    others = []
    for nm, a in rest:
        a = _as_float(a, nm)
        if a.shape != first.shape:
            raise ValueError(f"{nm}: shape {a.shape} does not match {name} shape {first.shape}")
        others.append(a)
    mod = _kernel(op, backend, version)
    ct = _compute_dtype(mod, first.dtype, name)
    if first.ndim == 0:
        raise ValueError(f"{name}: {op} needs at least one dimension, got a 0-d array")
    d = _check_dim(dim, first.ndim)
    moved = [np.moveaxis(a, d, -1) for a in (first, *others)]
    if moved[0].size == 0:
        return np.empty(first.shape, dtype=first.dtype)
    out = mod(*(_rows(m, ct) for m in moved), **kw).reshape(moved[0].shape)
    return np.moveaxis(out, -1, d).astype(first.dtype, copy=False)


def softmax(
    x: np.ndarray, dim: int = -1, *, backend: str | None = None, version: str | None = None, **kw: Any
) -> np.ndarray:
    """Numerically stable softmax along ``dim``. ``version``: 'three_pass'|'online' (numpy, cpu), 'simd_omp' (cpu
    default)|'simd'|'online_simd' (cpu), 'one_block'|'online' (triton);
    extra keywords go to the kernel (e.g. triton's ``block=``)."""
    return along_rows("softmax", (("x", x),), dim, backend, version, **kw)


def softmax_backward(y: np.ndarray, dy: np.ndarray, dim: int = -1, *, backend: str | None = None) -> np.ndarray:
    """dx = y * (dy - sum(dy * y, dim)) from the forward output ``y``."""
    return along_rows("softmax_backward", (("y", y), ("dy", dy)), dim, backend)


# ------------------------------------------------------------------------------------------------ LayerNorm
def _ln_params(x: np.ndarray, weight: Any, bias: Any, ct: type) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], int]:
    if weight is None and bias is None:
        raise ValueError("weight: layer_norm needs weight or bias to know the normalised shape (both are None)")
    ref = _as_float(weight if weight is not None else bias, "weight" if weight is not None else "bias")
    norm = ref.shape
    k = len(norm)
    if k == 0 or x.ndim < k or x.shape[-k:] != norm:
        raise ValueError(f"weight: normalised shape {norm} does not match the trailing dims of x shape {x.shape}")
    for nm, p in (("weight", weight), ("bias", bias)):
        if p is not None and _as_float(p, nm).shape != norm:
            raise ValueError(f"{nm}: shape {np.shape(p)} does not match the normalised shape {norm}")
    c = int(np.prod(norm))
    w = np.ones(c, ct) if weight is None else _prep(weight, ct).reshape(c)
    b = np.zeros(c, ct) if bias is None else _prep(bias, ct).reshape(c)
    return w, b, norm, c


def layer_norm(
    x: np.ndarray,
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
    return_stats: bool = False,
    version: str | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm over the trailing ``weight.ndim`` dims: (x - mean) / sqrt(var + eps) * weight + bias.

    ``return_stats=True`` also returns (mean, rstd) with shape x.shape[:-weight.ndim] for the backward.
    ``version``: 'simd_omp' (default)|'two_pass'|'welford'|'simd' on cpu.
    """
    x = _as_float(x, "x")
    mod = _kernel("layer_norm", backend, version)
    ct = _compute_dtype(mod, x.dtype, "x")
    if isinstance(eps, bool) or not (isinstance(eps, int | float | np.integer | np.floating) and eps >= 0):
        raise ValueError(f"eps: must be a number >= 0, got {eps!r}")
    eps = float(eps)
    w, b, norm, c = _ln_params(x, weight, bias, ct)
    lead = x.shape[: x.ndim - len(norm)]
    x2 = _prep(x, ct).reshape(-1, c)
    if x2.shape[0] == 0:
        y, mean, rstd = np.empty(x.shape, x.dtype), np.empty(lead, ct), np.empty(lead, ct)
    else:
        y, mean, rstd = mod(x2, w, b, float(eps))
    y = y.reshape(x.shape).astype(x.dtype, copy=False)
    if return_stats:
        return y, np.asarray(mean).reshape(lead), np.asarray(rstd).reshape(lead)
    return y


def layer_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    weight: np.ndarray | None,
    mean: np.ndarray,
    rstd: np.ndarray,
    *,
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dweight, dbias) from the saved (mean, rstd); weight None means ones. dweight/dbias have weight's shape."""
    x, dy = _as_float(x, "x"), _as_float(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match x shape {x.shape}")
    mod = _kernel("layer_norm_backward", backend)
    ct = _compute_dtype(mod, x.dtype, "x")
    if weight is None:
        raise ValueError("weight: layer_norm_backward needs weight (pass np.ones(normalised_shape))")
    w, _, norm, c = _ln_params(x, weight, None, ct)
    r = x.size // c if c else 0
    mean, rstd = _as_float(mean, "mean"), _as_float(rstd, "rstd")
    lead = x.shape[: x.ndim - len(norm)]
    for nm, s in (("mean", mean), ("rstd", rstd)):
        if s.size != r:
            raise ValueError(f"{nm}: shape {s.shape} does not match x's leading shape {lead}")
    dx, dw, db = mod(
        _prep(dy, ct).reshape(-1, c), _prep(x, ct).reshape(-1, c), w, _prep(mean, ct).ravel(), _prep(rstd, ct).ravel()
    )
    return dx.reshape(x.shape).astype(x.dtype, copy=False), dw.reshape(norm), db.reshape(norm)


# ------------------------------------------------------------------------------------------------ bias + GELU
def _check_approx(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: must be 'none' or 'tanh', got {approximate!r}")


def _gelu_prep(x: Any, bias: Any, mod: Kernel) -> tuple[np.ndarray, np.ndarray, type]:
    x, bias = _as_float(x, "x"), _as_float(bias, "bias")
    ct = _compute_dtype(mod, x.dtype, "x")
    if x.ndim == 0 or bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias: shape {bias.shape} must be ({x.shape[-1] if x.ndim else '?'},) for x shape {x.shape}")
    return x, _prep(bias, ct), ct


def bias_gelu(x: np.ndarray, bias: np.ndarray, *, backend: str | None = None, approximate: str = "none") -> np.ndarray:
    """gelu(x + bias): erf form (``approximate='none'``, torch's default) or tanh form."""
    _check_approx(approximate)
    mod = _kernel("bias_gelu", backend)
    x, b, ct = _gelu_prep(x, bias, mod)
    if x.size == 0:
        return np.empty(x.shape, x.dtype)
    return mod(_rows(x, ct), b, approximate).reshape(x.shape).astype(x.dtype, copy=False)


def bias_gelu_backward(
    dy: np.ndarray, x: np.ndarray, bias: np.ndarray, *, backend: str | None = None, approximate: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dbias): dx = dy * gelu'(x + bias), dbias = dx summed over all leading dims."""
    _check_approx(approximate)
    mod = _kernel("bias_gelu_backward", backend)
    bias = _as_float(bias, "bias")
    x, b, ct = _gelu_prep(x, bias, mod)
    dy = _as_float(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match x shape {x.shape}")
    dx, db = mod(_rows(dy, ct), _rows(x, ct), b, approximate)
    return dx.reshape(x.shape).astype(x.dtype, copy=False), db.astype(bias.dtype, copy=False)


# ------------------------------------------------------------------------------------------------ attention
def _attn_prep(
    q: Any, k: Any, v: Any, block_size: int, mod: Kernel
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...], type]:
    q, k, v = _as_float(q, "q"), _as_float(k, "k"), _as_float(v, "v")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q/k/v: need equal ranks >= 2 ([..., N, D]), got q {q.shape}, k {k.shape}, v {v.shape}")
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead:
        raise ValueError(f"q/k/v: leading (batch, head) dims differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: head dim {k.shape[-1]} does not match q head dim {q.shape[-1]} (q {q.shape}, k {k.shape})"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v: sequence length {v.shape[-2]} does not match k's {k.shape[-2]} (k {k.shape}, v {v.shape})"
        )
    if k.shape[-2] < 1 or q.shape[-1] < 1:
        raise ValueError(f"k: need at least one key and head dim >= 1, got k {k.shape}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q/k/v: dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    block_size = as_int(block_size, "block_size", min=1)
    ct = _compute_dtype(mod, q.dtype, "q")

    def flat(a: np.ndarray) -> np.ndarray:
        return _prep(a, ct).reshape((math.prod(lead),) + a.shape[-2:])  # not -1: ambiguous for empty arrays

    return flat(q), flat(k), flat(v), lead, ct


def _block(block_size: int, q3: np.ndarray, k3: np.ndarray) -> int:
    """block_size capped at the longest sequence (rounded up to a power of two >= 16, which triton needs): a bigger
    tile computes the same thing with more scratch (block_size=10**6 used to abort inside the C++ kernel)."""
    b, n = int(block_size), max(q3.shape[1], k3.shape[1], 1)
    cap = max(16, 1 << (n - 1).bit_length())
    if b <= cap:
        return b
    return cap if b & (b - 1) == 0 else n  # a non-power-of-two stays one (triton still rejects it)


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool = False,
    block_size: int = 64,
    *,
    backend: str | None = None,
    return_lse: bool = False,
    version: str | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T / sqrt(D) [+ causal mask]) v for q [..., Nq, D], k [..., Nk, D], v [..., Nk, Dv].

    ``causal`` masks key j > query i (top-left aligned, as torch's ``is_causal``). ``return_lse`` also returns
    the row log-sum-exp [..., Nq] that the backward needs. ``version`` (cpu): 'blocked_simd_omp' (default) |
    'blocked_simd' | 'tiled' — the rungs of cpp_src/kernels_flash_attention.cpp; ``block_size`` is the query rows
    per work item (the blocked rungs stream 64-key tiles).
    """
    q, k, v = _as_float(q, "q"), _as_float(k, "k"), _as_float(v, "v")
    mod = _kernel("attention", backend, version)
    q3, k3, v3, lead, _ = _attn_prep(q, k, v, block_size, mod)
    if q3.shape[0] == 0 or q3.shape[1] == 0:  # zero queries (or an empty batch): empty result, like torch
        o, lse = np.zeros(q3.shape[:2] + (v3.shape[2],), q3.dtype), np.zeros(q3.shape[:2], q3.dtype)
    else:
        o, lse = mod(q3, k3, v3, bool(causal), _block(block_size, q3, k3))
    o = o.reshape(lead + o.shape[-2:]).astype(q.dtype, copy=False)
    if return_lse:
        return o, np.asarray(lse).reshape(lead + (q3.shape[1],))
    return o


def flash_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    dout: np.ndarray,
    causal: bool = False,
    block_size: int = 64,
    *,
    backend: str | None = None,
    version: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) by recomputation: P = exp(S - lse) tile by tile, never stored whole.

    cpu backend, ``version``: 'blocked_simd_omp' (default: the FlashAttention-2 backward with vector micro-kernels,
    OpenMP over key blocks, each owning its dK and dV rows; dQ summed from per-thread buffers) | 'blocked_simd' (one
    thread) | 'tiled' (the first version). float64 runs the tiled scalar code under every name; extra memory O(N)."""
    q, k, v = _as_float(q, "q"), _as_float(k, "k"), _as_float(v, "v")
    mod = _kernel("attention_backward", backend, version)
    q3, k3, v3, lead, ct = _attn_prep(q, k, v, block_size, mod)
    o, dout, lse = _as_float(o, "o"), _as_float(dout, "dout"), _as_float(lse, "lse")
    want = lead + (q3.shape[1], v3.shape[2])
    if o.shape != want or dout.shape != want:
        raise ValueError(f"o/dout: shapes {o.shape}/{dout.shape} must be {want}")
    if lse.shape != lead + (q3.shape[1],):
        raise ValueError(f"lse: shape {lse.shape} must be {lead + (q3.shape[1],)}")
    o3 = _prep(o, ct).reshape(q3.shape[:2] + (v3.shape[2],))
    g3 = _prep(dout, ct).reshape(o3.shape)
    l2 = _prep(lse, ct).reshape(q3.shape[:2])
    if q3.size == 0:  # zero queries: no gradient flows anywhere
        dq, dk, dv = np.zeros_like(q3), np.zeros_like(k3), np.zeros_like(v3)
    else:
        dq, dk, dv = mod(q3, k3, v3, o3, l2, g3, bool(causal), _block(block_size, q3, k3))
    return (
        dq.reshape(q.shape).astype(q.dtype, copy=False),
        dk.reshape(k.shape).astype(k.dtype, copy=False),
        dv.reshape(v.shape).astype(v.dtype, copy=False),
    )
