"""Quantization codec throughput (issue 17): quantize / dequantize int8 and FP8 encode / decode, every rung of the
C++ versions ladder (cpp_src/quant_affine.cpp, cpp_src/quant_fp8.cpp) and the numpy reference, vs torch eager and
tinygrad (TinyJit, DEV=CPU), in one process on the same data.

    from tinylearn.quant.bench_codec import codec_table
    print(codec_table())            # 1M float32 elements; codec_table(1 << 22) for 4M

Goals from the issue (reported, never asserted): quantize per-tensor int8 <= 1.0x torch, dequantize int8 <= 1.0x
torch, FP8 e4m3 encode <= 2x torch. Before timing, every tinylearn row is checked bit-exact against torch on the
benchmark data (the note says "bit-exact" or names the mismatch count); tinygrad rows say how many codes differ
from torch. Thread count: OMP_NUM_THREADS / torch.get_num_threads() of the process (run once with
OMP_NUM_THREADS=1 and once with 2 to compare); the v2_threads rung only splits inputs >= 2 x 65536 elements.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends
from ..bench import Comparison, Table, tinygrad_jit

DEFAULT_SIZE = 1 << 20


def _rungs(op: str) -> list[tuple[str, str | None]]:
    """(backend, version) rows for one op: the numpy reference, then the C++ ladder in order when built."""
    rows: list[tuple[str, str | None]] = [("numpy", None)]
    if "cpp" in backends.available(op):
        order = ("v0_scalar", "v1_simd", "v2_threads")
        rows += [("cpp", v) for v in order if v in backends.versions(op, "cpp")]
    return rows


def _label(backend: str, version: str | None, level: str, threads: int) -> str:
    if backend == "numpy":
        return "tinylearn numpy (reference)"
    if version == "v0_scalar":
        return "tinylearn cpp v0_scalar"
    if version == "v1_simd":
        return f"tinylearn cpp v1_simd [{level}]"
    return f"tinylearn cpp v2_threads [{level}, {threads} thr]"


def _exact_note(got: np.ndarray, ref: np.ndarray) -> str:
    g, r = np.asarray(got), np.asarray(ref)
    if g.dtype.kind == "f":
        g, r = g.view(np.uint32), r.astype(np.float32).view(np.uint32)
    bad = int(np.count_nonzero(g.reshape(-1) != r.reshape(-1)))
    return "bit-exact vs torch" if bad == 0 else f"MISMATCH: {bad} of {r.size} differ from torch"


def _add_rungs(
    c: Any,
    op: str,
    call: Callable[[str, str | None], Any],
    ref: np.ndarray,
    level: str,
    threads: int,
    values: bool = False,
) -> None:
    for b, v in _rungs(op):
        out = call(b, v)
        note = _exact_note(out, ref)
        if values and b == "numpy" and note != "bit-exact vs torch":  # numpy decode: values equal, NaN bits differ
            eq = np.array_equal(np.asarray(out), ref, equal_nan=True)
            note = "equal to torch (NaN payload bits differ)" if eq else note
        c.add(_label(b, v, level, threads), lambda b=b, v=v: call(b, v), note=note)


def codec_table(size: int | None = None, progress: Callable[[str], None] | None = None, repeat: int = 10) -> Table:
    """Time quantize / dequantize int8 and FP8 e4m3 (saturating) / e5m2 encode and decode on ``size`` float32
    elements (default 2^20): numpy reference and each C++ rung vs torch eager (baseline) and tinygrad."""
    import torch

    from . import affine, fp8

    n = DEFAULT_SIZE if size is None else int(size)
    if n < 1:
        raise ValueError(f"size: must be a positive number of elements, got {size!r}")
    threads = torch.get_num_threads()
    level = affine.simd_level() or "not built"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cmp = Comparison(
        f"quantization codec, {n} float32 elements, {threads} thread(s)",
        baseline="torch",
        progress=progress,
        repeat=repeat,
    )
    rng = np.random.default_rng(17)
    x = rng.standard_normal(n).astype(np.float32)
    tx = torch.from_numpy(x)
    s, z = affine.calculate_qparams(x.min(), x.max(), "int8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tq = torch.quantize_per_tensor(tx, s, z, torch.qint8)
        tq_fn = lambda: torch.quantize_per_tensor(tx, s, z, torch.qint8)  # noqa: E731
    q_ref = tq.int_repr().numpy()
    q = q_ref.copy()
    dq_ref = tq.dequantize().numpy()
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    x8 = x * np.float32(100.0)  # spread over the FP8 range: subnormals, normals and (e4m3) saturation
    tx8 = torch.from_numpy(x8)

    def tg_quant(tg: Any) -> Callable[[], Any]:
        tv = tg.Tensor(x).realize()
        f = tinygrad_jit(lambda v: (v * (1.0 / s) + z).round().clip(-128, 127).cast(tg.dtypes.int8))
        return lambda: f(tv)

    with cmp.case(f"quantize per-tensor int8 ({n})", nbytes=5.0 * n) as c:
        _add_rungs(
            c,
            "quant.quantize_per_tensor",
            lambda b, v: affine.quantize(x, s, z, "int8", backend=b, version=v),
            q_ref,
            level,
            threads,
        )
        c.add("torch", tq_fn, note="torch.quantize_per_tensor (qint8)")
        c.add_tinygrad("tinygrad", tg_quant, note=_tg_check(tg_quant, q_ref, "round/clip/cast"))

    def tg_dequant(tg: Any) -> Callable[[], Any]:
        tv = tg.Tensor(q).realize()
        f = tinygrad_jit(lambda v: (v.cast(tg.dtypes.float32) - z) * s)
        return lambda: f(tv)

    with cmp.case(f"dequantize int8 ({n})", nbytes=5.0 * n) as c:
        _add_rungs(
            c,
            "quant.dequantize_per_tensor",
            lambda b, v: affine.dequantize(q, s, z, backend=b, version=v),
            dq_ref,
            level,
            threads,
        )
        c.add("torch", lambda: tq.dequantize(), note="Tensor.dequantize()")
        c.add_tinygrad("tinygrad", tg_dequant, note=_tg_check(tg_dequant, dq_ref, "(q - z) * s"))

    for fmt, sat, title in (("e4m3", True, "fp8 e4m3 encode, saturating"), ("e5m2", False, "fp8 e5m2 encode")):
        ref = tx8.to(tdt[fmt]).view(torch.uint8).numpy()

        def tg_enc(tg: Any, fmt: str = fmt) -> Callable[[], Any]:
            tv = tg.Tensor(x8).realize()
            dt = tg.dtypes.fp8e4m3 if fmt == "e4m3" else tg.dtypes.fp8e5m2
            f = tinygrad_jit(lambda v: v.cast(dt).bitcast(tg.dtypes.uint8))
            return lambda: f(tv)

        with cmp.case(f"{title} ({n})", nbytes=5.0 * n) as c:
            _add_rungs(
                c,
                "quant.fp8_encode",
                lambda b, v, fmt=fmt, sat=sat: fp8.fp8_encode(x8, fmt, sat, backend=b, version=v),
                ref,
                level,
                threads,
            )
            c.add(
                "torch",
                lambda fmt=fmt: tx8.to(tdt[fmt]),
                note=f"x.to(torch.float8_{fmt}{'fn' if fmt == 'e4m3' else ''})",
            )
            c.add_tinygrad("tinygrad", lambda tg, fmt=fmt: tg_enc(tg, fmt), note=_tg_check(tg_enc, ref, "cast"))

    for fmt in ("e4m3", "e5m2"):
        codes = tx8.to(tdt[fmt]).view(torch.uint8).numpy()
        t8 = torch.from_numpy(codes).view(tdt[fmt])
        ref = t8.float().numpy()

        def tg_dec(tg: Any, fmt: str = fmt, codes: np.ndarray = codes) -> Callable[[], Any]:
            tv = tg.Tensor(codes).realize()
            dt = tg.dtypes.fp8e4m3 if fmt == "e4m3" else tg.dtypes.fp8e5m2
            f = tinygrad_jit(lambda v: v.bitcast(dt).cast(tg.dtypes.float32))
            return lambda: f(tv)

        with cmp.case(f"fp8 {fmt} decode ({n})", nbytes=5.0 * n) as c:
            _add_rungs(
                c,
                "quant.fp8_decode",
                lambda b, v, fmt=fmt, codes=codes: fp8.fp8_decode(codes, fmt, backend=b, version=v),
                ref,
                level,
                threads,
                values=True,
            )
            c.add("torch", lambda t8=t8: t8.float(), note="Tensor.float()")
            c.add_tinygrad(
                "tinygrad", lambda tg, fmt=fmt, codes=codes: tg_dec(tg, fmt, codes), note=_tg_check(tg_dec, ref, "cast")
            )
    cmp.note(
        f"ratio = median / torch median (< 1: faster than torch). SIMD level {level}, {threads} thread(s) "
        f"(torch.get_num_threads; OMP_NUM_THREADS sets both). 1-min load average {load:.1f}"
        + (" (loaded machine: timings noisy)" if load > 2 else "")
        + ". Goals: quantize <= 1.0x, dequantize <= 1.0x, e4m3 encode <= 2x torch."
    )
    return cmp.table


def _tg_check(build: Callable[..., Callable[[], Any]], ref: np.ndarray, what: str) -> str:
    """Note for a tinygrad row: run it once and count the results that differ from torch ("" if it cannot run)."""
    from ..bench import tinygrad_status
    from ..bench.comparators import import_tinygrad

    ok, reason = tinygrad_status()
    if not ok:
        return reason
    try:
        fn = build(import_tinygrad())
        for _ in range(3):
            out = fn()
        got = out.numpy()
    except Exception as e:  # the row itself will report the failure
        return f"TinyJit {what} ({type(e).__name__})"
    if got.dtype.kind == "f":
        same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
        bad = int(np.count_nonzero(~same))
    else:
        bad = int(np.count_nonzero(got.reshape(-1) != ref.reshape(-1)))
    return f"TinyJit {what}; " + ("bit-exact vs torch" if bad == 0 else f"{bad} of {ref.size} values differ from torch")


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(codec_table(int(sys.argv[1]) if len(sys.argv) > 1 else None))
