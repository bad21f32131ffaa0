"""The one backend registry every multi-backend op dispatches through, the one ``_C`` loader, device detection.

Layers (read top-down): topic packages (``tl.conv``, ``tl.quant`` ...) -> this module -> ``tinylearn._C``.

Names (one set for every topic):

    python   pure-Python reference cores (allocators, simulators)
    numpy    vectorised numpy reference (always available)
    numba    numba-jitted CPU kernels (or the CUDA simulator where a topic says so)
    cpp      tinylearn._C (C++17, OpenMP, run-time SIMD dispatch; TINYLEARN_CPU_FEATURES forces a path)
    triton   @triton.jit kernels (under TRITON_INTERPRET=1 on a machine with no GPU)
    cuda     cuda_src/*.cu through cupy.RawModule (only with a CUDA device)

``"cpu"`` is accepted everywhere as an alias of ``"cpp"`` (the fused-kernels topic used that name first).

A topic registers each implementation once::

    from tinylearn import backends
    @backends.register("conv.im2col", "numpy")
    def _im2col_numpy(x, ...): ...
    backends.register("conv.im2col", "cpp", _im2col_cpp, priority=20)
    backends.register("gemm.matmul", "cpp", _packed, version="packed")

and its public function calls ``backends.dispatch("conv.im2col", x, ..., backend=backend, version=version)``.
``backend=None`` picks the available backend with the highest priority whose ``when(*args, **kw)`` accepts the
input (e.g. the C++ path only above a size threshold); ``version=None`` picks the backend's default version
(the first registered unless one is registered with ``default=True``).

Errors (one policy): an unknown backend or version name is a ``ValueError`` naming the argument and listing
what exists; a known backend that cannot run here is a ``RuntimeError`` that says why.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

BACKENDS: tuple[str, ...] = ("python", "numpy", "numba", "cpp", "triton", "cuda")
ALIASES: dict[str, str] = {"cpu": "cpp"}
# default preference when an op registers no priority: compiled before interpreted, GPU only when present
_DEFAULT_PRIORITY = {"python": 0, "numpy": 10, "numba": 15, "triton": 5, "cpp": 20, "cuda": 30}


# --------------------------------------------------------------------------------------------- device detection
@functools.cache
def cuda_available() -> bool:
    """True only when a CUDA device can run a kernel (cupy imports without a GPU, so ask the runtime)."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.is_available()) and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@functools.cache
def nvcc_available() -> bool:
    """True when ``nvcc`` is on PATH (it compiles CUDA sources; that does not mean a GPU exists)."""
    return shutil.which("nvcc") is not None


@functools.cache
def clang_available() -> bool:
    """True when ``clang`` is on PATH: tinygrad's CPU device compiles its kernels with it."""
    return shutil.which("clang") is not None


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


@functools.cache
def mpi_available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None and shutil.which("mpirun") is not None


# ------------------------------------------------------------------------------------------------ the _C loader
_C_ERROR = (
    "tinylearn._C (the C++ extension) is not built or failed to load: {err}. "
    "Build it with `make build` (or `pip install -e .` in the repo); backend='numpy' works without it."
)


@functools.cache
def _load_C_root() -> ModuleType:
    try:
        return importlib.import_module("tinylearn._C")
    except ImportError as e:
        raise RuntimeError(_C_ERROR.format(err=e)) from e


_C_LOADED: dict[str | None, ModuleType] = {}  # successful loads only: a missing _C may be built later in the session


def load_C(submodule: str | None = None) -> ModuleType:
    """``tinylearn._C`` (or its submodule ``_C.<submodule>``); RuntimeError with the build command if missing."""
    m = _C_LOADED.get(submodule)
    if m is not None:  # every dispatch probes availability: keep the hit path a dict lookup (~1 us per call before)
        return m
    root = _load_C_root()
    if submodule is None:
        _C_LOADED[None] = root
        return root
    try:
        m = _C_LOADED[submodule] = getattr(root, submodule)
        return m
    except AttributeError as e:
        have = ", ".join(getattr(root, "submodules", []))
        raise RuntimeError(
            f"tinylearn._C has no submodule {submodule!r} (built: {have}); rebuild with `make build`"
        ) from e


def C_available(submodule: str | None = None) -> bool:
    try:
        load_C(submodule)
    except RuntimeError:
        return False
    return True


_PROBES: dict[str, Callable[[], bool]] = {
    "python": lambda: True,
    "numpy": lambda: True,
    "numba": numba_available,
    "cpp": C_available,
    "triton": triton_available,
    "cuda": cuda_available,
}


def backend_available(name: str) -> bool:
    """Whether a backend (by canonical name or alias) can run on this machine at all."""
    return _PROBES[canonical(name)]()


# ------------------------------------------------------------------------------------------------- the registry
@dataclass
class _Impl:
    fn: Callable[..., Any]
    priority: int
    when: Callable[..., bool] | None
    available: Callable[[], bool] | None


@dataclass
class _Op:
    name: str
    impls: dict[str, dict[str, _Impl]] = field(default_factory=dict)  # backend -> version -> impl
    defaults: dict[str, str] = field(default_factory=dict)  # backend -> default version


_REGISTRY: dict[str, _Op] = {}
# (op, backend, version) -> (backend, version, fn) for calls that name a backend and passed every check once;
# register() clears it (a new or replaced implementation)
_RESOLVED: dict[tuple[str, str, str | None], tuple[str, str, Callable[..., Any]]] = {}
# (op, version) -> [(backend, version, impl)] best priority first, for calls that name no backend: availability and
# the `when=` predicate are still asked per call (they depend on the input and on switches like
# TINYLEARN_CPU_FEATURES); only the sort is remembered. register() clears it too.
_RANKED: dict[tuple[str, str | None], list[tuple[str, str, _Impl]]] = {}


def canonical(backend: str, arg: str = "backend") -> str:
    """Map an alias to its canonical backend name; ValueError naming ``arg`` for anything unknown."""
    if not isinstance(backend, str):
        raise TypeError(f"{arg}: must be a str or None, got {type(backend).__name__} {backend!r}")
    name = ALIASES.get(backend, backend)
    if name not in BACKENDS:
        raise ValueError(f"{arg}: unknown backend {backend!r}; backend names are {list(BACKENDS)} (+ alias 'cpu')")
    return name


def register(
    op: str,
    backend: str,
    fn: Callable[..., Any] | None = None,
    *,
    version: str = "default",
    default: bool = False,
    priority: int | None = None,
    when: Callable[..., bool] | None = None,
    available: Callable[[], bool] | None = None,
) -> Any:
    """Register ``fn`` as ``op`` on ``backend`` (variant ``version``). Usable as a decorator when ``fn`` is None.

    priority: higher wins for ``backend=None`` (defaults: cuda 30 > cpp 20 > numba 15 > numpy 10 > triton 5 >
    python 0). when: predicate on the call's arguments; False means "not the fastest for this input" (it is still
    used when named explicitly). available: extra probe beyond the backend's own (e.g. one _C submodule).
    """
    b = canonical(backend)

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        _RESOLVED.clear()
        _RANKED.clear()
        o = _REGISTRY.setdefault(op, _Op(op))
        versions = o.impls.setdefault(b, {})
        versions[version] = _Impl(f, _DEFAULT_PRIORITY[b] if priority is None else priority, when, available)
        if default or b not in o.defaults:
            o.defaults[b] = version
        return f

    return deco if fn is None else deco(fn)


def ops() -> list[str]:
    """Every registered op name."""
    return sorted(_REGISTRY)


def _op(op: str) -> _Op:
    if op not in _REGISTRY:
        raise ValueError(f"op: no backend registered for {op!r}; known ops: {ops()}")
    return _REGISTRY[op]


def _runs_here(backend: str, impl: _Impl) -> bool:
    return backend_available(backend) and (impl.available is None or bool(impl.available()))


def available(op: str) -> list[str]:
    """Backends that can run ``op`` on this machine, fastest first (by priority)."""
    o = _op(op)
    out = []
    for b, vs in o.impls.items():
        impl = vs[o.defaults[b]]
        if _runs_here(b, impl):
            out.append((impl.priority, b))
    return [b for _, b in sorted(out, key=lambda t: -t[0])]


def registered(op: str) -> list[str]:
    """Backends registered for ``op`` (whether or not they can run here)."""
    return list(_op(op).impls)


def versions(op: str, backend: str) -> list[str]:
    """The variants of ``op`` inside ``backend``, in registration order (the ladder)."""
    o = _op(op)
    b = canonical(backend)
    if b not in o.impls:
        raise ValueError(f"backend: {backend!r} has no {op}; registered: {list(o.impls)}")
    return list(o.impls[b])


def _rank(op: str, version: str | None) -> list[tuple[str, str, _Impl]]:
    """The implementations a call naming no backend chooses from, best priority first (ties: registration order)."""
    o = _op(op)
    if version is not None and not any(version in vs for vs in o.impls.values()):
        have = {b: list(vs) for b, vs in o.impls.items()}
        raise ValueError(f"version: {version!r} is not a version of {op}; versions by backend: {have}")
    out = []
    for b, vs in o.impls.items():
        if version is not None and version not in vs:
            continue  # a named version selects the backends that have it
        v = o.defaults[b] if version is None else version
        out.append((b, v, vs[v]))
    return sorted(out, key=lambda t: -t[2].priority)  # stable: equal priorities keep registration order


def resolve(
    op: str,
    backend: str | None = None,
    version: str | None = None,
    args: tuple = (),
    kwargs: dict | None = None,
) -> tuple[str, str, Callable[..., Any]]:
    """Pick (backend, version, fn) for a call. ``backend=None``: the fastest available one accepting the input."""
    if backend is not None:  # a named backend's choice depends on nothing else: after one full check, a dict lookup
        hit = _RESOLVED.get((op, backend, version))
        if hit is not None:
            return hit
    if backend is None:
        ranked = _RANKED.get((op, version))
        if ranked is None:
            ranked = _RANKED[(op, version)] = _rank(op, version)
        kwargs = kwargs or {}
        for b, v, impl in ranked:  # the first one that runs here and accepts the input (the highest priority)
            if _runs_here(b, impl) and (impl.when is None or impl.when(*args, **kwargs)):
                return b, v, impl.fn
        what = op if version is None else f"{op} version {version!r}"
        raise RuntimeError(f"backend: no backend can run {what} here; registered: {list(_op(op).impls)}")
    o = _op(op)
    b = canonical(backend)
    if b not in o.impls:
        raise ValueError(f"backend: {backend!r} has no {op}; backends with it: {list(o.impls)}")
    v = o.defaults[b] if version is None else version
    if not isinstance(v, str) or v not in o.impls[b]:
        raise ValueError(f"version: {version!r} is not a version of {op} on {b!r}; versions: {list(o.impls[b])}")
    impl = o.impls[b][v]
    if not backend_available(b):
        raise RuntimeError(f"backend: {b!r} is not available on this machine for {op}: {why_unavailable(b)}")
    if impl.available is not None and not impl.available():
        raise RuntimeError(f"backend: {b!r} cannot run {op} here (version {v!r} is not available)")
    _RESOLVED[(op, backend, version)] = (b, v, impl.fn)
    return b, v, impl.fn


def dispatch(op: str, *args: Any, backend: str | None = None, version: str | None = None, **kwargs: Any) -> Any:
    """Call ``op`` on the chosen backend/version with the remaining arguments."""
    _, _, fn = resolve(op, backend, version, args, kwargs)
    return fn(*args, **kwargs)


def why_unavailable(backend: str) -> str:
    b = canonical(backend)
    if b == "cpp":
        try:
            load_C()
        except RuntimeError as e:
            return str(e)
        return "available"
    if b == "cuda":
        return "no CUDA device (cupy missing or cupy.cuda.is_available() is False)"
    if b == "triton":
        return "triton is not installed"
    if b == "numba":
        return "numba is not installed"
    return "available"


def env_flag(name: str, default: str = "") -> str:
    """Read a TINYLEARN_* switch (one place, so every topic reads the same spelling)."""
    return os.environ.get(name, default).strip().lower()
