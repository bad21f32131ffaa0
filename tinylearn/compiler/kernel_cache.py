"""The pattern-hash kernel cache [Q206, Q237]: fused kernels with the same structure compile once per process.

Many layers produce the same fused kernel (LayerNorm's normalisation, a GEMM epilogue ``bias + GELU``): the same
instructions on buffers of the same dtype, strides and shape. Two keys decide reuse:

    pattern_key(kernel)   the structure with register numbers renumbered in definition order and every size
                          replaced by a symbol (``s0, s1, ...`` by first appearance; equal sizes share a symbol):
                          body, reduce_dims, dtype, buffer dtypes, which sizes are equal, and the strides. Used for
                          statistics (how many distinct patterns) and as the first half of the lookup key.
    code key              what must be equal for one compiled object to serve both kernels:
                          numpy   the concrete kernel (``evaluate`` runs its shapes: nothing is compiled)
                          cpp     sha256 of the generated C++ with comments (buffer names, the loop-nest listing)
                                  stripped and the function named by the pattern: the loop extents are run-time
                                  arguments (``n_i0``...), so kernels that differ only in an extent share one
                                  library; a size baked in (a stride, 1/n, a tile) changes the code and the key
                          triton  the concrete kernel (no size-generic reuse claimed)

A hit returns a callable for *this* kernel's sizes (for cpp: the cached library driven with this kernel's
extents). The same code key is also ``cc.py``'s disk-cache key (sha256 of the source, flags, compiler version), so a
new process loads the library instead of compiling it. ``CACHE.stats``: requests, hits, builds (new code: a C++ library
compiled or loaded from cc's disk cache, a numpy wrapper made), fallbacks; ``CACHE.patterns`` holds the distinct
pattern hashes seen.

Measured: 4 TinyGPT blocks (d 32, 4 heads) compiled with the cpp backend: 21 fused kernels, 6 distinct patterns,
6 builds (15 cache hits); a 4-layer LayerNorm/Linear/GELU/Linear MLP stack: 5 kernels, 3 builds. A dynamic batch
dim: one C++ library serves every batch size (tests/compiler/test_shapes.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import re
from collections.abc import Callable
from typing import Any

from .kernel_ir import FusedKernel, evaluate


def _renumber(kernel: FusedKernel) -> list[tuple]:
    regs: dict[int, int] = {}
    body = []
    for ins in kernel.body:
        args = tuple(regs.get(a, -1 - a) for a in ins.args)
        out = -1
        if ins.out >= 0:
            out = regs.setdefault(ins.out, len(regs))
        attr = repr(ins.attr) if ins.op == "const" else ins.attr
        body.append((out, ins.op, args, attr))
    return body


def pattern_key(kernel: FusedKernel) -> tuple:
    """The kernel's structure with normalised registers and sizes as symbols (see the module docstring)."""
    sym: dict[int, str] = {}

    def s(n: int) -> str:
        return sym.setdefault(int(n), f"s{len(sym)}")

    dom = tuple(s(n) for n in kernel.shape)
    bufs = tuple(
        (io, tuple(s(n) for n in b.shape), b.dtype, tuple(b.strides))
        for io, bs in (("in", kernel.inputs), ("out", kernel.outputs))
        for b in bs
    )
    return (dom, kernel.reduce_dims, kernel.dtype, bufs, tuple(_renumber(kernel)))


def pattern_hash(kernel: FusedKernel) -> str:
    """16 hex digits of ``pattern_key``: the name a kernel's code gets in the cache."""
    return hashlib.sha256(repr(pattern_key(kernel)).encode()).hexdigest()[:16]


def concrete_key(kernel: FusedKernel) -> tuple:
    """``pattern_key`` plus the concrete sizes: equal keys compute the same thing on the same shapes."""
    sizes = (kernel.shape, tuple(b.shape for b in (*kernel.inputs, *kernel.outputs)))
    return (pattern_key(kernel), sizes)


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)  # C++ comments (no string literals in generated code)


class KernelCache:
    """Process-wide cache of built kernels keyed by code key; shared by every CompiledFunction."""

    def __init__(self) -> None:
        self.stats = {"requests": 0, "hits": 0, "builds": 0, "fallbacks": 0}
        self._fns: dict[tuple, Any] = {}  # code key -> built object (numpy: the callable; cpp: (library, source))
        self.patterns: set[str] = set()

    def clear(self) -> None:
        self._fns.clear()
        self.patterns.clear()
        for k in self.stats:
            self.stats[k] = 0

    def get(self, kernel: FusedKernel, backend: str) -> tuple[Callable[..., list], str, str | None]:
        """(callable for this kernel, backend used, reason for a fallback to numpy or None)."""
        self.stats["requests"] += 1
        ph = pattern_hash(kernel)
        self.patterns.add(ph)
        if backend == "cpp":
            try:
                return self._cpp(kernel, ph), "cpp", None
            except Exception as e:  # a missing compiler or toolchain: numpy runs the same IR
                self.stats["fallbacks"] += 1
                return self._numpy(kernel), "numpy", f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if backend == "numpy":
            return self._numpy(kernel), "numpy", None
        key = (backend, concrete_key(kernel))
        if key in self._fns:
            self.stats["hits"] += 1
            return self._fns[key], backend, None
        try:
            mod = importlib.import_module(f"tinylearn.compiler.codegen_{backend}")
            build_fn = getattr(mod, f"build_{backend}", None)
            if build_fn is None:
                raise ImportError(f"tinylearn.compiler.codegen_{backend} has no build function")
            fn = build_fn(kernel)
        except Exception as e:
            self.stats["fallbacks"] += 1
            return self._numpy(kernel), "numpy", f"{type(e).__name__}: {e}".splitlines()[0][:200]
        self.stats["builds"] += 1
        self._fns[key] = fn
        return fn, backend, None

    def _numpy(self, kernel: FusedKernel) -> Callable[..., list]:
        key = ("numpy", concrete_key(kernel))
        fn = self._fns.get(key)
        if fn is not None:
            self.stats["hits"] += 1
            return fn
        self.stats["builds"] += 1
        fn = self._fns[key] = lambda *a, k=kernel: evaluate(k, list(a))
        return fn

    def _cpp(self, kernel: FusedKernel, ph: str) -> Callable[..., list]:
        from . import cc, codegen_cpp, tuning
        from .loops import default_schedule, lower

        named = dataclasses.replace(kernel, name=f"k{ph}")  # the function is named by its pattern
        tuned = tuning.tuned_schedule(named, ph)  # a tuned record of this pattern's shape class (topic 17), else None
        nest = (tuned or default_schedule)(lower(named))
        source = codegen_cpp.emit(nest)
        code = _COMMENT.sub("", source)  # comments name this kernel's extents and buffers: not part of the code
        key = ("cpp", hashlib.sha256(code.encode()).hexdigest())
        lib = self._fns.get(key)
        if lib is not None:
            self.stats["hits"] += 1
        else:
            self.stats["builds"] += 1
            lib = self._fns[key] = cc.load(code, codegen_cpp.function_name(named))
        return codegen_cpp.CompiledKernel(named, nest, source, lib)

    def summary(self, kernels: list[FusedKernel]) -> str:
        """'N fused kernels, P distinct patterns' for a list of kernels (e.g. every graph of a compiled model)."""
        pats = {pattern_hash(k) for k in kernels}
        return f"{len(kernels)} fused kernels, {len(pats)} distinct patterns"


CACHE = KernelCache()
