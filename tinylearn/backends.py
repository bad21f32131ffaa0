"""The one backend registry every multi-backend op dispatches through, the one ``_C`` loader, device detection.

Layers (read top-down): topic packages (``tl.conv``, ``tl.quant`` ...) -> this module -> ``tinylearn._C``.
One loader each: ``load_C(submodule)`` for the C++ extension, ``cuda_module(source)`` for cuda_src/*.cu.

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
(the first registered unless one is registered with ``default=True``). ``with backends.use(op, backend=...,
version=...)`` pins that choice for calls passing ``backend=None`` (the one pin; no topic keeps a global switch).
``versions(op, backend)`` lists one backend's ladder; ``versions(op)`` gives ``{backend: [version, ...]}``.

Errors (one policy): an unknown backend or version name is a ``ValueError`` naming the argument and listing
what exists; a known backend that cannot run here is a ``RuntimeError`` that says why.

Why one file (> 500 lines): it is the one layer between the topic packages and compiled code that the import
contracts protect (only this module imports ``_C``, loads CUDA sources, probes devices); the registry's lookups
(resolve, use, versions, the conformance hooks) share its private tables and caches.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from . import topics

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


# ---------------------------------------------------------------------------------------------- the CUDA loader
@functools.cache
def cuda_module(source: str) -> Any:
    """``cupy.RawModule`` of ``cuda_src/<source>.cu`` (nvrtc-compiled on first use, cached): the one CUDA loader.

    RuntimeError when no CUDA device is usable (nothing here pretends a CPU result came from a GPU); ValueError
    listing the shipped sources for an unknown ``source``. Sources come from the checkout or the wheel's copy
    (``tinylearn._resources.cuda_source``); ``-I`` lets kernels include ``cuda_src/common.cuh``.
    """
    from ._resources import cuda_source

    path = cuda_source(source)
    if not cuda_available():
        raise RuntimeError(
            f"cuda: cannot load {path.name}: no CUDA device (tinylearn.backends.cuda_available() is False); "
            "the sources are only compile-checked on this machine"
        )
    import cupy

    # nvcc when present (its host headers: <cstdint> etc.), else NVRTC (device-only headers)
    kind = "nvcc" if nvcc_available() else "nvrtc"
    return cupy.RawModule(code=path.read_text(), options=("-std=c++14", f"-I{path.parent}"), backend=kind)


def cuda_library(source: str) -> Any:
    """``ctypes.CDLL`` of ``cuda_src/<source>.cu`` built with ``nvcc -shared`` (for sources with host drivers,
    which NVRTC cannot compile), cached under ``$XDG_CACHE_HOME/tinylearn/cuda`` per source modification time and
    built aside then renamed, so concurrent builds never load half a file. Needs nvcc (it builds and loads without
    a device; calling into it needs one: callers check ``cuda_available()``)."""
    import ctypes
    import subprocess
    from pathlib import Path

    from ._resources import cuda_source

    src = cuda_source(source)
    if not nvcc_available():
        raise RuntimeError(f"cuda: {src.name} has a host driver and needs nvcc to build; nvcc is not on PATH")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tinylearn" / "cuda"
    cache.mkdir(parents=True, exist_ok=True)
    lib = cache / f"{src.stem}-{int(src.stat().st_mtime)}.so"
    if not lib.is_file():
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", f"-I{src.parent}", "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"cuda: nvcc failed on {src.name} (exit {proc.returncode}):\n{proc.stderr}")
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


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
    example: Callable[[Any], tuple[tuple, dict]] | None = None  # rng -> (args, kwargs) for the conformance test
    compared: Callable[[Any], Any] | None = None  # output -> the part the conformance test compares


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
    example: Callable[[Any], tuple[tuple, dict]] | None = None,
    compared: Callable[[Any], Any] | None = None,
) -> Any:
    """Register ``fn`` as ``op`` on ``backend`` (variant ``version``). Usable as a decorator when ``fn`` is None.

    priority: higher wins for ``backend=None`` (defaults: cuda 30 > cpp 20 > numba 15 > numpy 10 > triton 5 >
    python 0). when: predicate on the call's arguments; False means "not the fastest for this input" (it is still
    used when named explicitly). available: extra probe beyond the backend's own (e.g. one _C submodule).
    example: ``rng -> (args, kwargs)``, a small random input for the op (one per op, any registration may give
    it): tests/common/test_conformance.py runs every backend x version on it against the reference backend.
    compared: ``output -> what to compare`` (one per op, like example): the arrays that must agree across
    implementations when the output also holds implementation details (a saved intermediate some versions skip) or
    is an object (an allocator core: compare the offsets a fixed workload gets).
    """
    b = canonical(backend)

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        _RESOLVED.clear()
        _RANKED.clear()
        o = _REGISTRY.setdefault(op, _Op(op))
        if example is not None:
            o.example = example
        if compared is not None:
            o.compared = compared
        versions = o.impls.setdefault(b, {})
        versions[version] = _Impl(f, _DEFAULT_PRIORITY[b] if priority is None else priority, when, available)
        if default or b not in o.defaults:
            o.defaults[b] = version
        return f

    return deco if fn is None else deco(fn)


_LOADED: set[str] = set()  # registering modules of the topic table already imported


def load_registered(package: str | None = None) -> None:
    """Import the modules the topic table lists as registering ops (``Topic.registers``): all of them, or those of
    one package. Registration goes through the table: an op is found by name whether or not its package was
    imported, and ``ops()`` lists every op of the table."""
    for mod in topics.registering_modules(package):
        if mod not in _LOADED:
            importlib.import_module(mod)
            _LOADED.add(mod)


def ops() -> list[str]:
    """Every registered op name (the topic table's registering modules are imported first)."""
    load_registered()
    return sorted(_REGISTRY)


def is_registered(op: str) -> bool:
    """Whether ``op`` has a registered backend (its package's registering modules are imported first)."""
    if op not in _REGISTRY and isinstance(op, str) and "." in op:
        load_registered(op.split(".", 1)[0])
    return op in _REGISTRY


def _op(op: str) -> _Op:
    if not is_registered(op):  # "conv.x": the table's conv.* modules register it
        raise ValueError(f"op: no backend registered for {op!r}; known ops: {ops()}")
    return _REGISTRY[op]


def compared(op: str, output: Any) -> Any:
    """The part of ``output`` (one implementation's result of ``op``) that every implementation must agree on."""
    o = _op(op)
    return output if o.compared is None else o.compared(output)


def example(op: str, rng: Any) -> tuple[tuple, dict] | None:
    """``(args, kwargs)``: the op's registered example input drawn from ``rng`` (None if it registered none)."""
    o = _op(op)
    return None if o.example is None else o.example(rng)


def runs_here(op: str, backend: str, version: str) -> bool:
    """Whether ``op`` on ``backend`` (variant ``version``) can run on this machine (names must be registered)."""
    b = canonical(backend)
    return _runs_here(b, _op(op).impls[b][version])


def _runs_here(backend: str, impl: _Impl) -> bool:  # backend is canonical here (asked on every dispatch)
    return _PROBES[backend]() and (impl.available is None or bool(impl.available()))


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


def versions(op: str, backend: str | None = None) -> list[str] | dict[str, list[str]]:
    """The variants of ``op``, in registration order (the ladder).

    ``versions(op, backend)``: the list for one backend. ``versions(op)``: every backend's list as a dict
    ``{backend: [version, ...]}`` in registration order (canonical backend names, whether or not they run here).
    """
    o = _op(op)
    if backend is None:
        return {b: list(vs) for b, vs in o.impls.items()}
    b = canonical(backend)
    if b not in o.impls:
        raise ValueError(f"backend: {backend!r} has no {op}; registered: {list(o.impls)}")
    return list(o.impls[b])


# ------------------------------------------------------------------------------------------------------ pinning
# op -> (backend, version) pinned by use(); never mutated in place (use() sets a new mapping)
_PINS: contextvars.ContextVar[Mapping[str, tuple[str | None, str | None]]] = contextvars.ContextVar(
    "tinylearn_backend_pins", default=MappingProxyType({})
)


@contextlib.contextmanager
def use(op: str, *, backend: str | None = None, version: str | None = None) -> Iterator[None]:
    """Pin what ``dispatch``/``resolve`` pick for ``op`` when the caller passes ``backend=None`` (the one pin).

    ``backend`` (and ``version``, else that backend's default) replaces the automatic choice; ``version`` alone
    restricts the automatic choice to backends that have it. A caller that names a backend is not affected; a
    caller that names only a version keeps its version on the pinned backend. Nestable (the innermost wins;
    ``use(op)`` with neither restores the automatic choice inside an outer pin), restored on exit, per thread and
    per asyncio task (a ``contextvars.ContextVar``). Names are checked on entry (ValueError naming the argument
    and listing what exists); whether the backend runs here is checked on dispatch (RuntimeError)::

        with backends.use("kernels.softmax", backend="numpy", version="online"):
            tl.kernels.softmax(x)          # numpy's online softmax
    """
    o = _op(op)
    b = None if backend is None else canonical(backend)
    if b is not None and b not in o.impls:
        raise ValueError(f"backend: {backend!r} has no {op}; backends with it: {list(o.impls)}")
    if version is not None:
        if not isinstance(version, str):
            raise TypeError(f"version: must be a str or None, got {type(version).__name__} {version!r}")
        where = o.impls[b] if b is not None else {v for vs in o.impls.values() for v in vs}
        if version not in where:
            raise ValueError(
                f"version: {version!r} is not a version of {op} on {b or 'any backend'}; versions: "
                f"{list(o.impls[b]) if b is not None else versions(op)}"
            )
    pins = dict(_PINS.get())
    if b is None and version is None:
        pins.pop(op, None)
    else:
        pins[op] = (b, version)
    token = _PINS.set(pins)
    try:
        yield
    finally:
        _PINS.reset(token)


def pinned(op: str) -> tuple[str | None, str | None] | None:
    """The (backend, version) ``use`` pins for ``op`` in this context, or None when the choice is automatic."""
    return _PINS.get().get(op)


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
    """Pick (backend, version, fn) for a call. ``backend=None``: what ``use`` pins for ``op``, else the fastest
    available one accepting the input."""
    if backend is None:
        pins = _PINS.get()
        if pins and op in pins:
            pb, pv = pins[op]
            backend, version = pb, pv if version is None else version
    if backend is not None:  # a named backend's choice depends on nothing else: after one full check, a dict lookup
        hit = _RESOLVED.get((op, backend, version))
        if hit is not None:
            return hit
    if backend is None:
        if _TUNED is not None and version is None:  # a tuned configuration for this shape class, if one is stored
            hit = _TUNED(op, args, kwargs or {})
            if hit is not None:
                return hit
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
    b, v, fn = resolve(op, backend, version, args, kwargs)
    if _DISPATCH_HOOK is not None:  # tl.profile(): the recorder runs the call and times it
        return _DISPATCH_HOOK(op, b, v, fn, args, kwargs)
    return fn(*args, **kwargs)


# ------------------------------------------------------------------------------------- tuned choices, profiling
# tinylearn.tune installs a provider while TINYLEARN_TUNE is "cached" or "search" (or tune.set_mode): asked by calls
# that name no backend, no version and have no pin; (op, args, kwargs) -> (backend, version, fn) of the tuned
# configuration for this input's shape class, or None for "no tuned choice: rank as usual"
_TUNED: Callable[[str, tuple, dict], tuple[str, str, Callable[..., Any]] | None] | None = None
# tinylearn.profiler installs a recorder while a tl.profile() block runs: (op, backend, version, fn, args, kwargs)
_DISPATCH_HOOK: Callable[..., Any] | None = None


def set_tuned_provider(
    provider: Callable[[str, tuple, dict], tuple[str, str, Callable[..., Any]] | None] | None,
) -> Callable[..., Any] | None:
    """Install (or with None remove) the tuned-choice provider that ``backend=None`` calls consult before the
    priorities; returns the previous one. Pins (``use``) and a named backend or version still win."""
    global _TUNED
    if provider is not None and not callable(provider):
        raise TypeError(f"provider: expected a callable or None, got {type(provider).__name__}")
    prev, _TUNED = _TUNED, provider
    return prev


def set_dispatch_hook(hook: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Install (or with None remove) the hook every ``dispatch`` call goes through (the profiler's recorder):
    ``hook(op, backend, version, fn, args, kwargs)`` must call ``fn(*args, **kwargs)`` and return its result."""
    global _DISPATCH_HOOK
    if hook is not None and not callable(hook):
        raise TypeError(f"hook: expected a callable or None, got {type(hook).__name__}")
    prev, _DISPATCH_HOOK = _DISPATCH_HOOK, hook
    return prev


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
