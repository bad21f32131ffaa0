"""Public fused ops and the backend dispatcher: validate, reshape to canonical 2-D/3-D, call one backend.

    softmax(x, dim=-1)                     y = exp(x - max) / sum exp(x - max) along ``dim``
    layer_norm(x, weight, bias, eps)       over the trailing ``weight.ndim`` dims; biased variance (like torch)
    bias_gelu(x, bias, approximate)        gelu(x + bias), bias broadcast along the last dim
    flash_attention(q, k, v, causal)       softmax(q k^T / sqrt(D)) v on [..., N, D], tiled with online softmax

Backends (``available_backends()``): ``numpy`` (unfused reference), ``cpu`` (fused C++/OpenMP), ``triton``
(``@triton.jit`` kernels; on a CPU box they run under TRITON_INTERPRET=1), ``cuda`` (cuda_src/ kernels through
cupy, only when a GPU exists). Backward functions exist for ``numpy`` and ``cpu`` (and ``cuda`` where a kernel is
written); flash-attention backward recomputes P from the saved log-sum-exp.

Inputs: numpy arrays of any layout (non-contiguous and broadcast views are copied to C order), float32/float64,
plus float16 (computed in float32, returned as float16). Outputs have the input's dtype.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

from ..testing.devices import cuda_available, triton_available

_MODULES = {
    "numpy": "tinylearn.kernels.reference",
    "cpu": "tinylearn.kernels.cpu",
    "triton": "tinylearn.kernels.triton_kernels",
    "cuda": "tinylearn.kernels.cuda",
}
_FLOATS = (np.float16, np.float32, np.float64)


def _cpu_ok() -> bool:
    try:
        importlib.import_module("tinylearn._C").kernels  # noqa: B018
    except (ImportError, AttributeError):
        return False
    return True


def available_backends() -> list[str]:
    """Backends that can run here: numpy always; cpu if the C++ extension is built; triton if installed;
    cuda only with a CUDA device (``tinylearn.testing.cuda_available()``)."""
    out = ["numpy"]
    if _cpu_ok():
        out.append("cpu")
    if triton_available():
        out.append("triton")
    if cuda_available():
        out.append("cuda")
    return out


def default_backend() -> str:
    return "cpu" if _cpu_ok() else "numpy"


def _backend(name: str | None, op: str, need: str | None = None) -> ModuleType:
    name = default_backend() if name is None else name
    avail = available_backends()
    if not isinstance(name, str) or name not in _MODULES:
        raise ValueError(f"backend: unknown backend {name!r} for {op}; available: {avail}")
    if name not in avail:
        raise RuntimeError(f"backend: {name!r} is not available on this machine for {op}; available: {avail}")
    mod = importlib.import_module(_MODULES[name])
    ok, why = mod.available() if hasattr(mod, "available") else (True, "")
    if not ok:
        raise RuntimeError(f"backend: {name!r} cannot run {op} in this process: {why}")
    if need is not None and not hasattr(mod, need):
        have = [b for b in avail if hasattr(importlib.import_module(_MODULES[b]), need)]
        raise ValueError(f"backend: {name!r} has no {op}; backends with it: {have}")
    return mod


def _as_float(x: Any, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        if type(x).__module__.startswith("torch"):
            raise TypeError(f"{name}: expected a numpy array, got a torch tensor (use tinylearn.kernels.torch_ops)")
        x = np.asarray(x)
    if x.dtype.type not in _FLOATS:
        raise ValueError(f"{name}: unsupported dtype {x.dtype}; supported: float16, float32, float64")
    return x


def _compute_dtype(mod: ModuleType, dtype: np.dtype, backend: str, name: str) -> type:
    """The dtype the backend computes in: native if it has it, float16 -> float32 otherwise, else an error."""
    native = mod.NATIVE_DTYPES
    if dtype.type in native:
        return dtype.type
    if dtype.type == np.float16 and np.float32 in native:
        return np.float32
    names = [np.dtype(t).name for t in native] + (["float16"] if np.float32 in native else [])
    raise ValueError(f"{name}: dtype {dtype} is not supported by backend {backend!r}; supported: {names}")


def _prep(a: np.ndarray, ct: type) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=ct)


def _check_dim(dim: int, ndim: int) -> int:
    if not isinstance(dim, int | np.integer) or not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ValueError(f"dim: {dim} out of range for an array with {ndim} dimensions")
    return int(dim) % max(ndim, 1)


def _rows(x: np.ndarray, ct: type) -> np.ndarray:
    c = x.shape[-1] if x.ndim else 1
    return _prep(x, ct).reshape(-1, c)


# ------------------------------------------------------------------------------------------------ softmax
def softmax(x: np.ndarray, dim: int = -1, backend: str | None = None, **kw: Any) -> np.ndarray:
    """Numerically stable softmax along ``dim``. Extra keywords go to the backend (e.g. ``version='online'``)."""
    x = _as_float(x, "x")
    mod = _backend(backend, "softmax")
    ct = _compute_dtype(mod, x.dtype, backend or default_backend(), "x")
    if x.ndim == 0:
        raise ValueError("x: softmax needs at least one dimension, got a 0-d array")
    d = _check_dim(dim, x.ndim)
    xm = np.moveaxis(x, d, -1)
    if xm.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    y = mod.softmax(_rows(xm, ct), **kw).reshape(xm.shape)
    return np.moveaxis(y, -1, d).astype(x.dtype, copy=False)


def softmax_backward(y: np.ndarray, dy: np.ndarray, dim: int = -1, backend: str | None = None) -> np.ndarray:
    """dx = y * (dy - sum(dy * y, dim)) from the forward output ``y``."""
    y, dy = _as_float(y, "y"), _as_float(dy, "dy")
    if y.shape != dy.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match y shape {y.shape}")
    mod = _backend(backend, "softmax_backward", need="softmax_backward")
    ct = _compute_dtype(mod, y.dtype, backend or default_backend(), "y")
    d = _check_dim(dim, y.ndim)
    ym, gm = np.moveaxis(y, d, -1), np.moveaxis(dy, d, -1)
    dx = mod.softmax_backward(_rows(ym, ct), _rows(gm, ct)).reshape(ym.shape)
    return np.moveaxis(dx, -1, d).astype(y.dtype, copy=False)


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
    backend: str | None = None,
    return_stats: bool = False,
    **kw: Any,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm over the trailing ``weight.ndim`` dims: (x - mean) / sqrt(var + eps) * weight + bias.

    ``return_stats=True`` also returns (mean, rstd) with shape x.shape[:-weight.ndim] for the backward.
    """
    x = _as_float(x, "x")
    mod = _backend(backend, "layer_norm")
    ct = _compute_dtype(mod, x.dtype, backend or default_backend(), "x")
    if not (isinstance(eps, int | float) and eps >= 0):
        raise ValueError(f"eps: must be a number >= 0, got {eps!r}")
    w, b, norm, c = _ln_params(x, weight, bias, ct)
    lead = x.shape[: x.ndim - len(norm)]
    x2 = _prep(x, ct).reshape(-1, c)
    if x2.shape[0] == 0:
        y, mean, rstd = np.empty(x.shape, x.dtype), np.empty(lead, ct), np.empty(lead, ct)
    else:
        y, mean, rstd = mod.layer_norm(x2, w, b, float(eps), **kw)
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
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dweight, dbias) from the saved (mean, rstd); weight None means ones. dweight/dbias have weight's shape."""
    x, dy = _as_float(x, "x"), _as_float(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match x shape {x.shape}")
    mod = _backend(backend, "layer_norm_backward", need="layer_norm_backward")
    ct = _compute_dtype(mod, x.dtype, backend or default_backend(), "x")
    if weight is None:
        raise ValueError("weight: layer_norm_backward needs weight (pass np.ones(normalised_shape))")
    w, _, norm, c = _ln_params(x, weight, None, ct)
    r = x.size // c if c else 0
    mean, rstd = _as_float(mean, "mean"), _as_float(rstd, "rstd")
    lead = x.shape[: x.ndim - len(norm)]
    for nm, s in (("mean", mean), ("rstd", rstd)):
        if s.size != r:
            raise ValueError(f"{nm}: shape {s.shape} does not match x's leading shape {lead}")
    dx, dw, db = mod.layer_norm_backward(
        _prep(dy, ct).reshape(-1, c), _prep(x, ct).reshape(-1, c), w, _prep(mean, ct).ravel(), _prep(rstd, ct).ravel()
    )
    return dx.reshape(x.shape).astype(x.dtype, copy=False), dw.reshape(norm), db.reshape(norm)


# ------------------------------------------------------------------------------------------------ bias + GELU
def _check_approx(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: must be 'none' or 'tanh', got {approximate!r}")


def _gelu_prep(x: Any, bias: Any, mod: ModuleType, backend: str | None) -> tuple[np.ndarray, np.ndarray, type]:
    x, bias = _as_float(x, "x"), _as_float(bias, "bias")
    ct = _compute_dtype(mod, x.dtype, backend or default_backend(), "x")
    if x.ndim == 0 or bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias: shape {bias.shape} must be ({x.shape[-1] if x.ndim else '?'},) for x shape {x.shape}")
    return x, _prep(bias, ct), ct


def bias_gelu(x: np.ndarray, bias: np.ndarray, backend: str | None = None, approximate: str = "none") -> np.ndarray:
    """gelu(x + bias): erf form (``approximate='none'``, torch's default) or tanh form."""
    _check_approx(approximate)
    mod = _backend(backend, "bias_gelu")
    x, b, ct = _gelu_prep(x, bias, mod, backend)
    if x.size == 0:
        return np.empty(x.shape, x.dtype)
    return mod.bias_gelu(_rows(x, ct), b, approximate).reshape(x.shape).astype(x.dtype, copy=False)


def bias_gelu_backward(
    dy: np.ndarray, x: np.ndarray, bias: np.ndarray, backend: str | None = None, approximate: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dbias): dx = dy * gelu'(x + bias), dbias = dx summed over all leading dims."""
    _check_approx(approximate)
    mod = _backend(backend, "bias_gelu_backward", need="bias_gelu_backward")
    x, b, ct = _gelu_prep(x, bias, mod, backend)
    dy = _as_float(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match x shape {x.shape}")
    dx, db = mod.bias_gelu_backward(_rows(dy, ct), _rows(x, ct), b, approximate)
    return dx.reshape(x.shape).astype(x.dtype, copy=False), db.astype(bias.dtype, copy=False)


# ------------------------------------------------------------------------------------------------ attention
def _attn_prep(
    q: Any, k: Any, v: Any, block_size: int, mod: ModuleType, backend: str | None
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
        raise ValueError(f"q/k/v: dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not isinstance(block_size, int | np.integer) or block_size < 1:
        raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
    ct = _compute_dtype(mod, q.dtype, backend or default_backend(), "q")

    def flat(a: np.ndarray) -> np.ndarray:
        return _prep(a, ct).reshape((-1,) + a.shape[-2:])

    return flat(q), flat(k), flat(v), lead, ct


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool = False,
    block_size: int = 64,
    backend: str | None = None,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T / sqrt(D) [+ causal mask]) v for q [..., Nq, D], k [..., Nk, D], v [..., Nk, Dv].

    ``causal`` masks key j > query i (top-left aligned, as torch's ``is_causal``). ``return_lse`` also returns
    the row log-sum-exp [..., Nq] that the backward needs.
    """
    mod = _backend(backend, "flash_attention")
    q3, k3, v3, lead, _ = _attn_prep(q, k, v, block_size, mod, backend)
    o, lse = mod.attention(q3, k3, v3, bool(causal), int(block_size))
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
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) by recomputation: P = exp(S - lse) tile by tile, never stored whole (cpu backend)."""
    mod = _backend(backend, "flash_attention_backward", need="attention_backward")
    q3, k3, v3, lead, ct = _attn_prep(q, k, v, block_size, mod, backend)
    o, dout, lse = _as_float(o, "o"), _as_float(dout, "dout"), _as_float(lse, "lse")
    want = lead + (q3.shape[1], v3.shape[2])
    if o.shape != want or dout.shape != want:
        raise ValueError(f"o/dout: shapes {o.shape}/{dout.shape} must be {want}")
    if lse.shape != lead + (q3.shape[1],):
        raise ValueError(f"lse: shape {lse.shape} must be {lead + (q3.shape[1],)}")
    o3 = _prep(o, ct).reshape(q3.shape[:2] + (v3.shape[2],))
    g3 = _prep(dout, ct).reshape(o3.shape)
    l2 = _prep(lse, ct).reshape(q3.shape[:2])
    dq, dk, dv = mod.attention_backward(q3, k3, v3, o3, l2, g3, bool(causal), int(block_size))
    return (
        dq.reshape(q.shape).astype(q.dtype, copy=False),
        dk.reshape(k.shape).astype(k.dtype, copy=False),
        dv.reshape(v.shape).astype(v.dtype, copy=False),
    )
