"""Compile generated C++ with the system compiler, cache the shared library on disk and in the process, load it.

    lib = cc.load(source, "tl_softmax")   # ctypes.CDLL; the first call compiles (~0.3-1 s), later ones are lookups

The command is ``$CXX`` (else g++, c++ or clang++) ``-O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp
-shared -fPIC``. ``-fno-trapping-math`` lets gcc compute both sides of a select speculatively (no program here reads
floating-point exception flags; results, rounding and NaN propagation are unchanged): without it gcc jump-threads
the clamps of the inline ``tl_expf``/``tl_erff``/``tl_tanhf`` into branches it may not if-convert, and an ``omp
simd`` loop calling them stays scalar ("control flow in loop") on SSE2 and AVX2; only AVX-512's masked operations
vectorised it.
``TINYLEARN_CPU_FEATURES`` (``tinylearn.cpu.forced``) swaps ``-march=native`` for the level it forces, so a
forced-path test run really runs that instruction set: ``scalar`` -> ``-march=x86-64`` (SSE2, the x86-64
baseline), ``avx2`` -> ``-march=x86-64 -mavx2 -mfma -mf16c`` (Haswell's vector set); ``avx512`` or unset -> native.

Two caches, one key: sha256 of (source, command flags, the compiler's ``--version`` line).

* disk: ``$TINYLEARN_CACHE_DIR`` (default ``~/.cache/tinylearn/compiler``: platformdirs' user cache dir when
  installed, else ``$XDG_CACHE_HOME``) holds ``<name>-<key>.so``. A build compiles to a temporary name and
  ``os.replace``-s it into place (atomic: a reader never sees half a library), under an ``fcntl.flock`` on
  ``<key>.lock``, so two processes or threads building the same kernel compile it once; the second finds the
  library when it gets the lock. An unwritable cache dir falls back to a temporary dir, with a ``UserWarning``.
* process: a dict key -> loaded ``ctypes.CDLL``; a second ``load`` of the same source costs a hash (microseconds).

A missing compiler or a compile error raises RuntimeError naming the compiler, the command and the first lines of
its stderr.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from ..cpu import forced

STDERR_LINES = 20
_LOADED: dict[str, ctypes.CDLL] = {}
_VERSIONS: dict[str, str] = {}
_LOCK = threading.Lock()
_WARNED: set[str] = set()
stats = {"compiles": 0, "disk_hits": 0, "memory_hits": 0}  # counters, for tests and the notebook


def compiler() -> str:
    """The C++ compiler command: ``$CXX``, else the first of g++, c++, clang++ on PATH (``g++`` if none is)."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), "g++")


def compiler_version(cxx: str | None = None) -> str:
    """The first line of ``cxx --version`` (part of the cache key); RuntimeError if the compiler cannot run."""
    cxx = cxx or compiler()
    if cxx not in _VERSIONS:
        try:
            proc = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise RuntimeError(f"C++ compiler {cxx!r} cannot run ({e}); command: {cxx} --version") from e
        _VERSIONS[cxx] = (proc.stdout.splitlines() or [f"{cxx} exit {proc.returncode}"])[0]
    return _VERSIONS[cxx]


def flags(level: str | None = None) -> list[str]:
    """The compile flags for ``level`` ('scalar' | 'avx2' | 'avx512' | None = TINYLEARN_CPU_FEATURES or native)."""
    level = level if level is not None else forced()
    arch: list[str] = []
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        arch = {"scalar": ["-march=x86-64"], "avx2": ["-march=x86-64", "-mavx2", "-mfma", "-mf16c"]}.get(
            level or "", ["-march=native"]
        )
    elif level is None or level == "avx512":
        arch = ["-mcpu=native"] if platform.machine().lower() in ("aarch64", "arm64") else []
    return ["-O3", *arch, "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]


def _default_dir() -> Path:
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("tinylearn")) / "compiler"
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinylearn" / "compiler"


def cache_dir() -> Path:
    """``$TINYLEARN_CACHE_DIR`` or the default; a temporary dir (and a UserWarning) when that is not writable."""
    wanted = Path(os.environ.get("TINYLEARN_CACHE_DIR") or _default_dir()).expanduser()
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=wanted, prefix=".probe-")
        probe.close()
        return wanted
    except OSError as e:
        fallback = Path(tempfile.gettempdir()) / f"tinylearn-compiler-{os.getuid()}"
        fallback.mkdir(parents=True, exist_ok=True)
        if str(wanted) not in _WARNED:
            _WARNED.add(str(wanted))
            warnings.warn(
                f"tinylearn.compiler: cache dir {wanted} is not writable ({e.strerror or e}); "
                f"compiled kernels go to {fallback} (set TINYLEARN_CACHE_DIR to choose another)",
                UserWarning,
                stacklevel=3,
            )
        return fallback


def cache_key(source: str, cxx: str, flag_list: list[str]) -> str:
    text = "\0".join([source, cxx, " ".join(flag_list), compiler_version(cxx)])
    return hashlib.sha256(text.encode()).hexdigest()


def compile_source(source: str, name: str = "kernel") -> Path:
    """The shared library for ``source``: from the disk cache, or compiled now (once, even across processes)."""
    cxx, flag_list = compiler(), flags()
    key = cache_key(source, cxx, flag_list)
    name = re.sub(r"[^\w.-]", "_", name)[:64]  # part of a file name
    folder = cache_dir()
    lib = folder / f"{name}-{key[:24]}.so"
    if lib.exists():
        stats["disk_hits"] += 1
        return lib
    with open(folder / f"{key[:24]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another thread/process compiles the same key
        try:
            if lib.exists():
                stats["disk_hits"] += 1
                return lib
            stats["compiles"] += 1
            src = folder / f"{name}-{key[:24]}.{os.getpid()}.{threading.get_ident()}.cpp"
            tmp = src.with_suffix(".so.tmp")
            src.write_text(source)
            cmd = [cxx, *flag_list, "-o", str(tmp), str(src)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.SubprocessError) as e:
                raise RuntimeError(f"C++ compiler {cxx!r} could not run: {e}\ncommand: {' '.join(cmd)}") from e
            finally:
                src.unlink(missing_ok=True)
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                head = "\n".join(proc.stderr.splitlines()[:STDERR_LINES])
                raise RuntimeError(
                    f"C++ compiler {cxx!r} failed on kernel {name!r} (exit {proc.returncode})\n"
                    f"command: {' '.join(cmd)}\nstderr (first {STDERR_LINES} lines):\n{head}"
                )
            os.replace(tmp, lib)
            return lib
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load(source: str, name: str = "kernel") -> ctypes.CDLL:
    """``source`` compiled and loaded (ctypes); cached in the process by the same key as on disk."""
    key = cache_key(source, compiler(), flags())
    hit = _LOADED.get(key)
    if hit is not None:
        stats["memory_hits"] += 1
        return hit
    lib = ctypes.CDLL(str(compile_source(source, name)))  # threads racing here meet at the file lock
    with _LOCK:
        return _LOADED.setdefault(key, lib)


def clear_memory_cache() -> None:
    """Forget the loaded libraries (they stay mapped; the next ``load`` re-opens from the disk cache)."""
    _LOADED.clear()
