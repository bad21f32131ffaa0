"""Optimizer base: parameter groups (dicts with their own hyper-parameters, e.g. ``lr``), per-parameter state.

Updates happen in place on ``p.data`` under no graph recording. Each optimizer's per-parameter update is one op
in ``tinylearn.backends`` (``optim.sgd_step``, ``optim.adam_step``) with two backends computing the same update:
"numpy" (several in-place array passes) and "cpp" (one fused pass per parameter, tinylearn._C.optim; used for
C-contiguous float32/float64 parameters, the others fall back to the numpy passes). ``backend=None`` (default; "auto"
is accepted as its old spelling) takes what ``tinylearn.backends`` picks: a ``backends.use(op, backend=...)`` pin,
else the fastest available (cpp when the extension is built); "cpu" is an alias of "cpp". The backend is resolved
once, when the optimizer is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import backends
from ..autograd.tensor import Tensor


def has_fused_steps() -> bool:
    """True when tinylearn._C.optim (the fused C++ updates) is built."""
    return backends.C_available("optim")


def register_step(
    op: str,
    numpy_fn: Callable[..., None],
    cpp_fn: Callable[..., None],
    example: Callable[[Any], tuple[tuple, dict]] | None = None,
) -> None:
    """Register an optimizer's per-parameter update ``fn(opt, w, g, state, group)`` on its two backends
    (``example``: rng -> ((opt, w, g, state, group), {}) for the registry's conformance test)."""
    backends.register(op, "numpy", numpy_fn, example=example)
    backends.register(op, "cpp", cpp_fn, available=has_fused_steps)


class Optimizer:
    op = ""  # the registry op of the per-parameter update; a subclass without one overrides ``_update``
    # extra keyword arguments of the fused C++ updates. {} = the kernels' default: OpenMP only for parameters of >= 4M
    # elements. {"parallel_min": 1 << 18} selects the pre-issue-18 threshold (a benchmark rung, see
    # tinylearn.autograd.bench.step_phases); below it the update runs on the calling thread.
    _omp_kw: dict[str, int] = {}

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *, backend: str | None = None) -> None:
        if backend == "auto":  # the old spelling of None
            backend = None
        if self.op:  # the registry checks the name: ValueError listing the backends registered for the op
            self.backend, _, self._step_fn = backends.resolve(self.op, backend)
        elif backend in (None, "numpy"):
            self.backend, self._step_fn = "numpy", None
        else:
            raise ValueError(f"backend: {type(self).__name__} has only a numpy update, got {backend!r}")
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Any]] = {}
        self._scratch: dict[tuple, np.ndarray] = {}
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor) or not isinstance(params, Iterable) or isinstance(params, str | bytes | dict):
            raise TypeError(
                f"params: expected an iterable of Tensors or of param-group dicts, got {type(params).__name__}"
            )
        params = list(params)
        if not params:
            raise ValueError("params: optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict[str, Any]) -> None:
        ps = group["params"]
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        for i, p in enumerate(ps):
            if not isinstance(p, Tensor):
                raise TypeError(f"params: element {i} is {type(p).__name__}, expected a Tensor/Parameter")
            if not p.requires_grad:
                raise ValueError(f"params: element {i} (shape {p.shape}) does not require grad")
        g = {**self.defaults, **group, "params": ps}
        for name in ("lr", "momentum", "dampening", "weight_decay", "eps"):
            if name in g:
                check_hyper(name, g[name])
        if "betas" in g:
            check_betas(g["betas"])
        seen = {id(p) for old in self.param_groups for p in old["params"]}
        if len({id(p) for p in ps}) != len(ps) or any(id(p) in seen for p in ps):
            raise ValueError("some parameters appear in more than one parameter group")  # torch's wording
        self.param_groups.append(g)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.data = np.zeros_like(p.data)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if st is None:
                    st = self.state[p] = {}
                g = p.grad.data
                if g.shape != p.data.shape:
                    raise ValueError(f"grad: shape {g.shape} does not match parameter shape {p.data.shape}")
                if not p.data.flags.writeable:
                    p.data = p.data.copy()
                self._update(p.data, g, st, group)
        return loss

    @property
    def _fused(self) -> Any:
        """tinylearn._C.optim when this optimizer runs on cpp, else None (looked up, not stored: copyable)."""
        return backends.load_C("optim") if self.backend == "cpp" else None

    def fused_ok(self, *arrays: np.ndarray) -> bool:
        """True when the C++ kernel can update these arrays in place (same float dtype, C-contiguous, writable)."""
        if self._fused is None:
            return False
        dt = arrays[0].dtype
        if dt != np.float32 and dt != np.float64:
            return False
        return all(a.dtype == dt and a.flags.c_contiguous and a.flags.writeable for a in arrays)

    def scratch(self, like: np.ndarray, slot: int = 0) -> np.ndarray:
        """A reusable temporary with ``like``'s shape/dtype (saves one allocation + page faults per update)."""
        key = (like.shape, like.dtype.str, slot)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = np.empty_like(like)
        return buf

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
        if self._step_fn is None:
            raise RuntimeError(f"{type(self).__name__} must implement _update or set op")
        self._step_fn(self, w, g, state, group)

    def state_dict(self) -> dict[str, Any]:
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {
            "state": {
                index[id(p)]: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                for p, s in self.state.items()
            },
            "param_groups": [
                {**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
                for g in self.param_groups
            ],
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        flat = [p for g in self.param_groups for p in g["params"]]
        for sg, g in zip(sd.get("param_groups", []), self.param_groups):
            idx = list(sg.get("params", []))
            if len(idx) != len(g["params"]) or any(
                isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < len(flat) for i in idx
            ):
                raise ValueError(
                    f"state_dict: param_groups params {idx} do not index this optimizer's {len(flat)} parameters "
                    f"(group of {len(g['params'])})"
                )
        for i in sd.get("state", {}):
            if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < len(flat):
                raise ValueError(f"state_dict: state index {i!r} is not a param index in [0, {len(flat)})")
        if len(sd["param_groups"]) != len(self.param_groups):
            raise ValueError(
                f"state_dict: {len(sd['param_groups'])} param groups, optimizer has {len(self.param_groups)}"
            )
        for g, sg in zip(self.param_groups, sd["param_groups"]):
            g.update({k: v for k, v in sg.items() if k != "params"})
        self.state = {
            flat[int(i)]: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            for i, s in sd["state"].items()
        }


def check_hyper(name: str, v: Any) -> float:
    """A hyper-parameter (lr, momentum, eps, ...): a finite real >= 0; TypeError/ValueError naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__} {v!r}")
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: must be finite and >= 0, got {v}")
    return float(v)


def check_betas(betas: Any) -> tuple[float, float]:
    """Adam's (beta1, beta2): a pair of finite numbers in [0, 1); ValueError naming betas otherwise."""
    try:
        b = tuple(float(x) for x in betas)
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair of floats, got {betas!r}") from None
    if len(b) != 2 or not all(0.0 <= x < 1.0 for x in b):
        raise ValueError(f"betas: expected a pair (beta1, beta2) each in [0, 1), got {betas!r}")
    return b
