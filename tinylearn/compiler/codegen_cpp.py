"""C++ code generation: a scheduled loop nest (``loops.py``) -> one ``extern "C"`` function, compiled and called.

The generated function takes the inputs as ``const float*`` (``const double*`` for a float64 kernel), then the
outputs, then one ``int64_t`` extent per coalesced dim (``n_i0, n_j0, ...``); strides are compile-time constants
(the kernel's shapes are static). Every register is a ``const`` local declared where the nest computes it, so the
C++ compiler sees plain SSA code it can keep in registers and vectorise:

    extern "C" void tl_softmax(const float* __restrict in0, float* __restrict out0, int64_t n_i0, int64_t n_j0) {
      #pragma omp parallel for schedule(static)
      for (int64_t i0 = 0; i0 < n_i0; i0 += 1) {
        float acc2 = -INFINITY; int nan2 = 0;
        #pragma omp simd reduction(max:acc2) reduction(|:nan2)
        for (int64_t j0 = 0; j0 < n_j0; j0 += 1) { const float r0 = in0[i0*1000 + j0]; ... }
        ...

Semantics match ``kernel_ir.evaluate``: IEEE arithmetic (no -ffast-math), ``max``/``min`` propagate NaN like numpy
(``tl_max``), a ``max_reduce`` keeps a NaN flag beside its accumulator (an OpenMP ``max`` reduction would drop a
NaN lane).

float32 ``sum`` in a vectorised loop: blocked two-level accumulation. The loop runs in blocks of ``SUM_BLOCK``
(512) elements; within a block a float accumulator with ``#pragma omp simd reduction(+:...)`` (the compiler keeps
one partial sum per SIMD lane: 4 with SSE2, 8 with AVX2, 16 with AVX-512), after the block its total is added to a
double. Error bound (same-sign terms, e.g. softmax): each lane sums <= 512 / 4 = 128 terms in float32, so the
relative error is <= ~128 eps32 = 7.6e-6 (in practice ~sqrt(128) eps32 ~ 7e-7), independent of the row length;
the double over blocks adds nothing measurable. Summing in double throughout (the previous scheme) halved the
vector width (float -> double conversions) for no accuracy the tolerance (rtol 1e-5) needs. A non-vectorised
loop (unrolled or short) keeps the plain double accumulator. Kept row buffers (``loops.keep_rule``) come from a
per-thread scratch (``tl_scratch``: grown on demand, freed at thread exit), so a parallel row loop needs no
allocation per row. Measured (1 thread, AMD EPYC Zen 5, [2048, 2048] fp32 softmax kernel): 4.8 ms with two
exps per element and double sums, 3.0 ms with the row buffer and blocked float sums (torch 3.1, torch.compile 3.2).

float32 ``exp``/``erf``/``tanh`` are inline branch-free polynomials (``MATH32``, from cpp_src/vec_math.h, <= 3
ulp): a libm call keeps an ``omp simd`` loop scalar unless -ffast-math (which would break the NaN rules) lets
glibc's vector variants in; float64 uses libm. gcc vectorises every innermost loop of the default schedule
(checked with ``-fopt-info-vec-optimized`` in test_codegen_cpp: softmax's three loops, GELU's point-wise loop;
64-byte vectors on AVX-512). ``build`` compiles through ``cc.load`` (disk + in-process cache) and wraps the
function in a ``CompiledKernel`` that validates, converts and allocates like ``evaluate`` does (or writes into
the caller's ``out=`` arrays: the memory planner's arena slots).
"""

from __future__ import annotations

import ctypes
import math
import re
from collections.abc import Callable

import numpy as np

from . import cc
from .kernel_ir import FusedKernel
from .loops import Keep, Loop, LoopNest, Reduce, Reload, RowBuffers, Store, default_schedule, lower

CTYPE = {"float32": "float", "float64": "double"}
SUM_BLOCK = 512  # float32 sums: elements per block of float (per-lane) partial sums, totals in double; 0: all double


def c_literal(value: float, dtype: str) -> str:
    """``value`` rounded to ``dtype`` (as ``evaluate`` does) and spelled as a C literal of that type."""
    v = float(np.float32(value)) if dtype == "float32" else float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    text = repr(v)
    return f"{text}f" if dtype == "float32" else text


def c_expr(op: str, a: list[str], dtype: str, own_math: bool = False) -> str:
    """The C expression for one point-wise op on operand expressions ``a`` (shared by the C++ and CUDA backends).

    ``own_math``: float32 exp/erf/tanh (and sigmoid's exp) call the vectorisable ``tl_expf``/``tl_erff``/``tl_tanhf``
    of ``MATH32`` instead of libm (whose calls keep ``omp simd`` loops scalar without -ffast-math)."""
    f = "f" if dtype == "float32" else ""
    own = own_math and dtype == "float32"
    exp = "tl_expf" if own else f"exp{f}"
    one, zero = c_literal(1.0, dtype), c_literal(0.0, dtype)
    x = a[0] if a else ""
    unary = {
        "neg": f"-{x}",
        "rsqrt": f"{one} / sqrt{f}({x})",
        "sigmoid": f"{one} / ({one} + {exp}(-{x}))",
        "relu": f"tl_max({x}, {zero})",
        "abs": f"fabs{f}({x})",
        "recip": f"{one} / {x}",
        "square": f"{x} * {x}",
    }
    if op in unary:
        return unary[op]
    if op in ("exp", "tanh", "erf") and own:
        return f"tl_{op}f({x})"
    if op in ("exp", "log", "sqrt", "tanh", "erf"):
        return f"{op}{f}({x})"
    infix = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if op in infix:
        return f"{a[0]} {infix[op]} {a[1]}"
    compare = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}
    if op in compare:
        return f"({a[0]} {compare[op]} {a[1]}) ? {one} : {zero}"
    if op in ("max", "min"):
        return f"tl_{op}({a[0]}, {a[1]})"
    if op == "pow":
        return f"pow{f}({a[0]}, {a[1]})"
    if op == "where":
        return f"({a[0]} != {zero}) ? {a[1]} : {a[2]}"
    raise ValueError(f"op: no C form for {op!r}")


def function_name(kernel: FusedKernel) -> str:
    return "tl_" + re.sub(r"\W", "_", kernel.name)


PRELUDE = """#include <cmath>
#include <cstdint>

// max/min that propagate NaN like numpy.maximum/minimum (std::fmax would drop it)
template <class T> static inline T tl_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> static inline T tl_min(T a, T b) { return (a < b || a != a) ? a : b; }
static inline int64_t tl_imin(int64_t a, int64_t b) { return a < b ? a : b; }
"""

# per-thread scratch for kept row buffers (loops.keep_rule): grown on demand, 64-byte aligned, freed at thread exit
SCRATCH = """#include <cstdlib>
struct tl_scratch_t {
  void* p[8] = {}; size_t cap[8] = {};
  ~tl_scratch_t() { for (void* q : p) free(q); }
};
static thread_local tl_scratch_t tl_scratch_tls;
static inline void* tl_scratch(int slot, size_t n) {
  tl_scratch_t& s = tl_scratch_tls;
  if (s.cap[slot] < n) {
    free(s.p[slot]);
    s.p[slot] = aligned_alloc(64, (n + 63) / 64 * 64);
    s.cap[slot] = s.p[slot] ? n : 0;
  }
  return s.p[slot];
}
"""


def _horner(coeffs: list[str], t: str) -> str:
    expr = coeffs[0]
    for c in coeffs[1:]:
        expr = f"({expr}) * {t} + {c}"
    return expr


_EXP_P = ["1.9875691500e-4f", "1.3981999507e-3f", "8.3334519073e-3f", "4.1665795894e-2f", "1.6666665459e-1f"]
_EXP_P += ["5.0000001201e-1f"]
_ERF_P = ["7.898202140e-05f", "-8.024351373e-04f", "5.190053212e-03f", "-2.685480830e-02f", "1.128361242e-01f"]
_ERF_P += ["-3.761262884e-01f", "1.128379167e+00f"]
_ERFCX_Q = ["-3.8357987e-07f", "1.6588418e-06f", "-4.0093432e-06f", "1.4425777e-05f", "-5.8942707e-05f"]
_ERFCX_Q += ["2.1283205e-04f", "-7.3371300e-04f", "2.4660928e-03f", "-8.0014750e-03f", "2.4938174e-02f"]
_ERFCX_Q += ["-7.4347360e-02f", "2.1080635e-01f"]
_TANH_P = ["2.307981356e-03f", "-8.359916095e-03f", "2.177493312e-02f", "-5.396022793e-02f", "1.333330959e-01f"]
_TANH_P += ["-3.333333326e-01f"]

# float32 exp/erf/tanh as branch-free inline code (both sides of every branch computed, then a select), so that an
# `omp simd` loop calling them vectorises; the algorithms and coefficients of cpp_src/vec_math.h's scalar versions
# (exp: Cody-Waite reduction + cephes polynomial, 2^n from exponent bits in two halves -- one for erf's e^{-x^2},
# whose n >= -24 keeps 2^n normal, 4 vector ops fewer; erf: x P(x^2) below 1, else 1 - e^{-x^2} erfcx(|x|);
# tanh: x + x^3 P(x^2) below 0.625, else 1 - 2 / (e^{2|x|} + 1)). NaN -> NaN.
MATH32 = f"""
static inline float tl_from_bits(int32_t b) {{ float f; __builtin_memcpy(&f, &b, 4); return f; }}
static inline float tl_pow2(int32_t n) {{ return tl_from_bits((int32_t)((uint32_t)(n + 127) << 23)); }}
static inline float tl_exp_core(float x) {{  // x in [-104, 89]: n = round(x log2 e), r = x - n ln2 (two parts)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  const float y = ({_horner(_EXP_P, "r")}) * (r * r) + r + 1.0f;
  const int32_t ni = (int32_t)n, n1 = ni >> 1;
  return (y * tl_pow2(n1)) * tl_pow2(ni - n1);
}}
static inline float tl_exp_core1(float x) {{  // x in [-16, 0] (erf's e^(-x^2)): n >= -24, one 2^n scale is normal
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  const float y = ({_horner(_EXP_P, "r")}) * (r * r) + r + 1.0f;
  return y * tl_pow2((int32_t)n);
}}
static inline float tl_expf(float x) {{
  const float lo = x > -104.0f ? x : -104.0f, xc = lo < 89.0f ? lo : 89.0f;
  const float y = tl_exp_core(xc);
  return x != x ? x + x : y;
}}
static inline float tl_erff(float x) {{
  const float a = fabsf(x) < 4.0f ? fabsf(x) : 4.0f, t = a * a;
  const float small = x * ({_horner(_ERF_P, "t")});
  const float q = {_horner(_ERFCX_Q, "(a - 2.5f)")};
  const float big = copysignf(1.0f - tl_exp_core1(-t) * q, x);
  return x != x ? x + x : (a < 1.0f ? small : big);
}}
static inline float tl_tanhf(float x) {{
  const float a = fabsf(x), t = x * x;
  const float small = copysignf((x * t) * ({_horner(_TANH_P, "t")}) + x, x);
  const float big = copysignf(1.0f - 2.0f / (tl_expf(a + a) + 1.0f), x);
  return x != x ? x + x : (a < 0.625f ? small : big);
}}
"""


def emit(nest: LoopNest) -> str:
    """The C++ translation unit for ``nest`` (a comment with the printed nest, the prelude, one function)."""
    k, p = nest.kernel, nest.plan
    T = CTYPE[k.dtype]
    acc_t = "double" if k.dtype == "float32" else T

    def stmt(node, block: set[int] = frozenset()) -> list[str]:
        if isinstance(node, RowBuffers):  # sized by the run-time extents: the code stays size-generic
            row = " * ".join(f"n_{d.var}" for d in p.red_dims) or "1"
            return [
                f"{T}* __restrict rb{r} = ({T}*)tl_scratch({slot}, sizeof({T}) * (size_t)({row}));"
                for slot, r in enumerate(node.regs)
            ]
        if isinstance(node, Keep):
            return [f"rb{node.reg}[{nest.row_index()}] = r{node.reg};"]
        if isinstance(node, Reload):
            return [f"const {T} r{node.reg} = rb{node.reg}[{nest.row_index()}];"]
        ins = node.instr
        if isinstance(node, Store):
            return [f"out{ins.attr}[{nest.index(p.out_strides[ins.attr])}] = r{ins.args[0]};"]
        if isinstance(node, Reduce):
            v, acc, nan = f"r{ins.args[0]}", f"acc{ins.out}", f"nan{ins.out}"
            if ins.op == "sum":
                return {
                    "init": [f"{acc_t} {acc} = 0;"],
                    "update": [f"{'b' if ins.out in block else ''}{acc} += {v};"],
                    "finish": [f"const {T} r{ins.out} = ({T}){acc};"],
                }[node.phase]
            return {
                "init": [f"{T} {acc} = -INFINITY; int {nan} = 0;"],
                "update": [f"{acc} = {v} > {acc} ? {v} : {acc};", f"{nan} |= ({v} != {v});"],
                "finish": [f"const {T} r{ins.out} = {nan} ? ({T})NAN : {acc};"],
            }[node.phase]
        if ins.op == "load":
            return [f"const {T} r{ins.out} = in{ins.attr}[{nest.index(p.in_strides[ins.attr])}];"]
        if ins.op == "const":
            return [f"const {T} r{ins.out} = {c_literal(ins.attr, k.dtype)};"]
        return [f"const {T} r{ins.out} = {c_expr(ins.op, [f'r{a}' for a in ins.args], k.dtype, own_math=True)};"]

    def blocked(loop: Loop) -> set[int]:
        """The float32 sums this vectorised loop accumulates blockwise (float partial sums, double block totals)."""
        if k.dtype != "float32" or not loop.simd or loop.step != 1 or loop.parallel or SUM_BLOCK <= 0:
            return set()
        return {i.out for i in loop.reductions() if i.op == "sum"}

    def pragma(loop: Loop, block: set[int]) -> list[str]:
        clauses = []
        for ins in loop.reductions():
            acc = f"{'b' if ins.out in block else ''}acc{ins.out}"
            clauses.append(f"reduction(+:{acc})" if ins.op == "sum" else f"reduction(max:{acc})")
            if ins.op != "sum":
                clauses.append(f"reduction(|:nan{ins.out})")
        if loop.parallel:
            return [f"#pragma omp parallel for{' simd' if loop.simd else ''} schedule(static)"]
        if loop.simd:
            return [" ".join(["#pragma omp simd", *clauses])]
        return [f"#pragma GCC unroll {loop.unroll}"] if loop.unroll else []

    lines: list[str] = []

    def block(nodes: list, depth: int, sums: set[int] = frozenset()) -> None:
        pad = "  " * depth
        for node in nodes:
            if isinstance(node, Loop):
                stop = node.stop.replace("min(", "tl_imin(")
                v, inner = node.var, blocked(node)
                start, lp, d = node.start, pad, depth
                if inner:  # for (vb = start; vb < stop; vb += SUM_BLOCK) { float bacc = 0; simd loop; acc += bacc; }
                    lines.append(f"{pad}for (int64_t {v}_b = {start}; {v}_b < {stop}; {v}_b += {SUM_BLOCK}) {{")
                    lines.extend(f"{pad}  {T} bacc{r} = 0;" for r in sorted(inner))
                    start, stop, lp, d = f"{v}_b", f"tl_imin({stop}, {v}_b + {SUM_BLOCK})", pad + "  ", depth + 1
                lines.extend(lp + x for x in pragma(node, inner))
                lines.append(f"{lp}for (int64_t {v} = {start}; {v} < {stop}; {v} += {node.step}) {{")
                block(node.body, d + 1, inner)
                lines.append(lp + "}")
                if inner:
                    lines.extend(f"{lp}acc{r} += bacc{r};" for r in sorted(inner))
                    lines.append(pad + "}")
            else:
                lines.extend(pad + x for x in stmt(node, sums))

    args = [f"const {T}* __restrict in{j} /* {b.name} */" for j, b in enumerate(k.inputs)]
    args += [f"{T}* __restrict out{j} /* {b.name} */" for j, b in enumerate(k.outputs)]
    args += [f"int64_t n_{d.var}" for d in p.dims]
    header = [f"// generated by tinylearn.compiler.codegen_cpp from FusedKernel {k.name!r}; its loop nest:"]
    header += ["//   " + line for line in str(nest).splitlines()]
    lines.append(f'extern "C" void {function_name(k)}({", ".join(args)}) {{')
    block(nest.prologue, 1)
    block(nest.body, 1)
    lines.append("}")
    own = k.dtype == "float32" and any(i.op in ("exp", "erf", "tanh", "sigmoid") for i in k.body)
    scratch = SCRATCH if nest.kept() else ""
    return "\n".join(header) + "\n" + PRELUDE + scratch + (MATH32 if own else "") + "\n" + "\n".join(lines) + "\n"


def check_arrays(kernel: FusedKernel, arrays: tuple) -> list[np.ndarray]:
    """The inputs converted to the kernel dtype and C-contiguous; ValueError naming the first bad argument."""
    if len(arrays) != len(kernel.inputs):
        names = [b.name for b in kernel.inputs]
        raise ValueError(f"arrays: kernel {kernel.name!r} takes {len(names)} inputs {names}, got {len(arrays)}")
    out = []
    for j, (a, b) in enumerate(zip(arrays, kernel.inputs)):
        x = np.asarray(a)
        if x.dtype.kind not in "biuf":
            raise ValueError(f"arrays[{j}] ({b.name!r}): dtype {x.dtype} is not a real number type")
        if tuple(x.shape) != tuple(b.shape):
            raise ValueError(f"arrays[{j}] ({b.name!r}): shape {tuple(x.shape)}, kernel expects {tuple(b.shape)}")
        out.append(np.ascontiguousarray(x, dtype=kernel.dtype))
    return out


class CompiledKernel:
    """A compiled ``FusedKernel``: call it with the input arrays, get the output arrays (new, contiguous)."""

    def __init__(self, kernel: FusedKernel, nest: LoopNest, source: str, library: ctypes.CDLL) -> None:
        self.kernel, self.nest, self.source, self.library = kernel, nest, source, library
        self.name = function_name(kernel)
        self._fn = getattr(library, self.name)
        n_ptr = len(kernel.inputs) + len(kernel.outputs)
        self._fn.argtypes = [ctypes.c_void_p] * n_ptr + [ctypes.c_int64] * len(nest.plan.dims)
        self._fn.restype = None
        self._sizes = [d.extent for d in nest.plan.dims]

    def __call__(self, *arrays: np.ndarray, out: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Run on ``arrays``; ``out``: one preallocated C-contiguous array per output (kernel dtype and shape), written
        in place and returned (the memory planner's arena slots). An output may be the memory of an input only when
        the kernel is point-wise and reads that input at the output's index (``passes.memory_plan``'s rule)."""
        ins = check_arrays(self.kernel, arrays)
        if out is None:
            outs = [np.empty(b.shape, dtype=self.kernel.dtype) for b in self.kernel.outputs]
        else:
            outs = list(out)
            if len(outs) != len(self.kernel.outputs):
                raise ValueError(
                    f"out: kernel {self.kernel.name!r} has {len(self.kernel.outputs)} outputs, got {len(outs)}"
                )
            for j, (o, b) in enumerate(zip(outs, self.kernel.outputs)):
                if not isinstance(o, np.ndarray) or o.dtype != np.dtype(self.kernel.dtype) or tuple(o.shape) != b.shape:
                    got = f"{getattr(o, 'dtype', type(o).__name__)} {getattr(o, 'shape', '')}"
                    raise ValueError(f"out[{j}] ({b.name!r}): expected {self.kernel.dtype} {b.shape}, got {got}")
                if not (o.flags.c_contiguous and o.flags.writeable):
                    raise ValueError(f"out[{j}] ({b.name!r}): must be a writeable C-contiguous array")
        self._fn(*[a.ctypes.data for a in ins], *[o.ctypes.data for o in outs], *self._sizes)
        return outs

    def __repr__(self) -> str:
        return f"CompiledKernel({self.kernel.name!r}, {self.kernel.dtype}, domain={self.kernel.shape})"


def build(kernel: FusedKernel, schedule: LoopNest | Callable[[LoopNest], object] | None = None) -> CompiledKernel:
    """Lower, schedule, emit and compile ``kernel``.

    ``schedule``: None -> ``default_schedule``; a ``LoopNest`` of this kernel (already lowered and scheduled);
    or a function applied to ``lower(kernel)`` (e.g. ``lambda n: n.tile("i0", 1024).vectorize("i0")``).
    """
    if isinstance(schedule, LoopNest):
        if schedule.kernel is not kernel:
            raise ValueError(f"schedule: a loop nest of kernel {schedule.kernel.name!r}, not of {kernel.name!r}")
        nest = schedule
    elif schedule is None:
        nest = default_schedule(lower(kernel))
    elif callable(schedule):
        nest = lower(kernel)
        schedule(nest)
    else:
        raise ValueError(f"schedule: expected None, a LoopNest or a callable, got {type(schedule).__name__}")
    source = emit(nest)
    return CompiledKernel(kernel, nest, source, cc.load(source, function_name(kernel)))
