"""Hardware-aware latency model [Q260]: a per-op latency table MEASURED on this CPU, a whole-network predictor built
on it, and an energy estimate that is a MODEL (labelled as such).

Table. An entry is keyed by (op, shape, bits) and holds the median seconds per call of that op, timed with the bench
harness (``tinylearn.bench.measure``: time-based warm-up, median of repeats) under ``limited_threads(1, torch=True)``:

    op          shape                          bits   implementation timed
    conv2d      (n, cin, cout, k, h, w)        32     tl.nn.Conv2d (im2col + GEMM), stride 1, padding k // 2
                                               8      tl.quant.QuantizedConv2d (quantize, im2col on codes, int8 GEMM,
                                                      requantize, dequantize): the whole cost of an int8 layer here
    linear      (n, in, out)                   32/8   tl.nn.Linear / tl.quant.QuantizedLinear
    relu        (n, c, h, w)                   32     tl.nn.ReLU
    maxpool2d   (n, c, h, w)                   32     tl.nn.MaxPool2d(2)

The table carries the machine fingerprint (CPU model from /proc/cpuinfo, the int8 SIMD path tinylearn dispatches to,
TINYLEARN_CPU_FEATURES, threads) and is cached as JSON; a cache whose fingerprint differs is re-measured, never
reused. A missing entry (a width the grid did not measure) is interpolated linearly in MACs (elements for relu/pool)
between measured entries of the same op, bits and remaining shape; outside the measured range it extrapolates the
nearest segment.

Predictor. lat(net) = sum of table lookups over the net's layers + a fitted correction c0 + c1 * n_layers (least
squares on end-to-end measured networks: the per-network and per-layer overheads a sum of isolated ops misses, e.g.
the reshape before the Linear, cache effects between layers). It is validated on HELD-OUT networks, measured end to
end, by relative error (``validate``).

Energy (a MODEL, not a measurement): this VM exposes no RAPL / powercap counters (/sys/class/powercap absent) and no
frequency counters, so energy = latency x a stated package power. ``DEFAULT_POWER_W`` = 7.5 W: the per-core share of
a 64-core Zen 2 EPYC (AMD's published 240 W TDP for the EPYC 7742/7B12 class) times the 2 cores this VM has, i.e. an
upper-ish bound that assumes the package draws TDP in proportion to the cores used (/proc/cpuinfo names only "AMD
EPYC" here, so the Zen 2 class is an assumption, not a reading). ``rapl_available()`` reports
whether a real counter exists; nothing here reads one.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

OPS = ("conv2d", "linear", "relu", "maxpool2d")
BITS = (8, 32)
SHAPE_LEN = {"conv2d": 6, "linear": 3, "relu": 4, "maxpool2d": 4}
DEFAULT_POWER_W = 7.5  # MODEL: 240 W TDP / 64 cores * 2 cores (see module docstring)
POWER_SOURCE = "MODEL: 240 W TDP (AMD EPYC 7742/7B12 class, Zen 2) / 64 cores x 2 cores; no RAPL on this VM"

Layer = tuple[str, tuple[int, ...], int]


def check_layer(op: Any, shape: Any, bits: Any) -> Layer:
    """Validate one (op, shape, bits) entry; ValueError naming the argument otherwise."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    shape = tuple(int(s) for s in shape)
    if len(shape) != SHAPE_LEN[op] or min(shape) < 1:
        raise ValueError(f"shape: {op} needs {SHAPE_LEN[op]} positive ints, got {shape}")
    if bits not in BITS or (bits == 8 and op not in ("conv2d", "linear")):
        raise ValueError(f"bits: expected 8 or 32 (8 only for conv2d/linear), got {bits!r} for {op}")
    return op, shape, int(bits)


def key(op: str, shape: Sequence[int], bits: int) -> str:
    """JSON key of an entry: 'op|d0,d1,...|bits'."""
    return f"{op}|{','.join(str(int(s)) for s in shape)}|{int(bits)}"


def work(op: str, shape: Sequence[int]) -> float:
    """MACs (conv2d, linear) or elements (relu, maxpool2d): the interpolation coordinate."""
    if op == "conv2d":
        n, cin, cout, k, h, w = shape
        return float(n * cin * cout * k * k * h * w)
    if op == "linear":
        n, i, o = shape
        return float(n * i * o)
    return float(np.prod(shape))


def rapl_available() -> bool:
    """Whether a RAPL energy counter is readable (it is not on this VM; energy here is always a MODEL)."""
    return os.access("/sys/class/powercap/intel-rapl:0/energy_uj", os.R_OK)


def energy_joules(latency_s: float, package_power_w: float = DEFAULT_POWER_W) -> float:
    """MODEL: energy = latency x package power (``POWER_SOURCE`` states where the default watts come from)."""
    if not latency_s >= 0:
        raise ValueError(f"latency_s: expected >= 0, got {latency_s!r}")
    if not package_power_w > 0:
        raise ValueError(f"package_power_w: expected > 0, got {package_power_w!r}")
    return float(latency_s) * float(package_power_w)


def fingerprint(threads: int = 1) -> dict[str, Any]:
    """Machine fingerprint stored with a table: CPU model, int8 SIMD path, forced feature level, threads."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from ..quant.gemm import int8_gemm_paths

        path = int8_gemm_paths()[0]
    except Exception:  # noqa: BLE001 - no C++ extension: numpy path
        path = "numpy"
    return {
        "cpu_model": model,
        "int8_path": path,
        "cpu_features_env": os.environ.get("TINYLEARN_CPU_FEATURES", ""),
        "threads": int(threads),
    }


def _qparams(lo: float, hi: float) -> tuple[float, int]:
    from ..quant import calculate_qparams

    s, z = calculate_qparams(min(lo, 0.0), max(hi, 1e-6), dtype="int8")
    return float(s), int(z)


def make_op(
    op: str,
    shape: Sequence[int],
    bits: int,
    module: Any = None,
    in_range: tuple[float, float] = (0.0, 1.0),
    out_range: tuple[float, float] = (-4.0, 4.0),
) -> Callable[[Any], Any]:
    """A callable x -> y for one layer. ``module`` (a trained tl.nn.Conv2d / Linear) supplies the weights, else
    they are random; bits=8 converts it to QuantizedConv2d / QuantizedLinear with per-channel symmetric weight scales
    and the given float input/output ranges."""
    from .. import nn
    from ..quant.modules_int8 import QuantizedConv2d, QuantizedLinear

    op, shape, bits = check_layer(op, shape, bits)
    if op == "relu":
        return nn.ReLU()
    if op == "maxpool2d":
        return nn.MaxPool2d(2)
    if module is None:
        module = nn.Conv2d(shape[1], shape[2], shape[3], padding=shape[3] // 2) if op == "conv2d" else None
        module = module if module is not None else nn.Linear(shape[1], shape[2])
    if bits == 32:
        return module
    w = module.weight.data.reshape(module.weight.shape[0], -1)
    w_scale = np.maximum(np.abs(w).max(1), 1e-8) / 127.0
    inq, outq = _qparams(*in_range), _qparams(*out_range)
    if op == "conv2d":
        return QuantizedConv2d(module, w_scale, inq, outq)
    return QuantizedLinear.from_float(module, w_scale, inq, outq)


def run_layers(fns: Sequence[Callable[[Any], Any]], layers: Sequence[Layer], x: Any) -> Any:
    """Apply a net's layer callables in order (flattening before the first Linear)."""
    from ..autograd import Tensor

    for fn, (op, _, _) in zip(fns, layers, strict=True):
        if op == "linear" and x.ndim != 2:
            x = Tensor(x.data.reshape(x.shape[0], -1)) if isinstance(x, Tensor) else x.reshape(x.shape[0], -1)
        x = fn(x)
    return x


def input_shape(layers: Sequence[Layer]) -> tuple[int, ...]:
    """Shape of the input a net's first layer takes."""
    op, shape, _ = layers[0]
    if op == "conv2d":
        return (shape[0], shape[1], shape[4], shape[5])
    return (shape[0], shape[1]) if op == "linear" else tuple(shape)


def time_call(fn: Callable[[], Any], repeat: int = 7) -> float:
    """Median seconds per call of ``fn`` (bench harness, one thread for BLAS/OpenMP/torch)."""
    from .._threads import limited_threads
    from ..autograd import no_grad
    from ..bench.timing import measure

    with limited_threads(1, torch=True), no_grad():
        return float(measure(fn, warmup=2, repeat=repeat, min_call_s=2e-4, warmup_s=0.01).median)


def measure_net(
    layers: Sequence[Layer], fns: Sequence[Callable] | None = None, repeat: int = 7, seed: int = 0
) -> float:
    """End-to-end measured median seconds of a whole net (random weights unless ``fns`` are given)."""
    from ..autograd import Tensor

    layers = [check_layer(*lay) for lay in layers]
    fns = list(fns) if fns is not None else [make_op(*lay) for lay in layers]
    x = Tensor(np.random.default_rng(seed).random(input_shape(layers), dtype=np.float32))
    return time_call(lambda: run_layers(fns, layers, x), repeat)


class LatencyTable:
    """Measured per-op latencies (seconds) keyed by (op, shape, bits), with the machine fingerprint."""

    def __init__(self, entries: dict[str, float] | None = None, meta: dict[str, Any] | None = None) -> None:
        self.entries: dict[str, float] = dict(entries or {})
        self.fingerprint: dict[str, Any] = dict(meta or fingerprint())

    def __len__(self) -> int:
        return len(self.entries)

    def measure(self, op: str, shape: Sequence[int], bits: int, repeat: int = 7) -> float:
        """Time one op on random input (median, one thread) and store it."""
        from ..autograd import Tensor

        op, shape, bits = check_layer(op, shape, bits)
        fn = make_op(op, shape, bits)
        x = Tensor(np.random.default_rng(0).random(input_shape([(op, shape, bits)]), dtype=np.float32))
        t = time_call(lambda: fn(x), repeat)
        self.entries[key(op, shape, bits)] = t
        return t

    def lookup(self, op: str, shape: Sequence[int], bits: int) -> float:
        """Measured seconds, or interpolated in MACs among entries sharing op, bits and the non-width dims."""
        op, shape, bits = check_layer(op, shape, bits)
        k = key(op, shape, bits)
        if k in self.entries:
            return self.entries[k]
        # width dims (interpolated over): conv cin/cout, linear in/out, relu/pool channels
        fixed = {"conv2d": (0, 3, 4, 5), "linear": (0,), "relu": (0, 2, 3), "maxpool2d": (0, 2, 3)}[op]
        pts = []
        for kk, t in self.entries.items():
            o, s, b = kk.split("|")
            sh = tuple(int(v) for v in s.split(","))
            if o == op and int(b) == bits and all(sh[i] == shape[i] for i in fixed):
                pts.append((work(op, sh), t))
        if not pts:
            raise KeyError(f"shape: no measured {op} entry with bits={bits} near {shape}; extend the table grid")
        pts.sort()
        xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        w = work(op, shape)
        if len(xs) == 1:
            return float(ys[0] * w / xs[0])
        if w <= xs[0] or w >= xs[-1]:  # extrapolate the nearest segment, never below half the nearest entry
            i = 0 if w <= xs[0] else len(xs) - 2
            slope = (ys[i + 1] - ys[i]) / max(xs[i + 1] - xs[i], 1e-30)
            j = 0 if w <= xs[0] else len(xs) - 1
            return float(max(ys[j] + slope * (w - xs[j]), 0.5 * ys[j]))
        return float(np.interp(w, xs, ys))

    def net_sum(self, layers: Sequence[Layer]) -> float:
        """Sum of per-op lookups over a net."""
        return float(sum(self.lookup(*lay) for lay in layers))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"fingerprint": self.fingerprint, "entries": self.entries}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> LatencyTable:
        d = json.loads(Path(path).read_text())
        return cls(d["entries"], d["fingerprint"])


def build_table(layers: Sequence[Layer], path: str | Path | None = None, repeat: int = 7) -> LatencyTable:
    """Measure every distinct (op, shape, bits) in ``layers``; reuse ``path`` when its fingerprint matches this
    machine (measuring only the entries it lacks) and write the result back."""
    table = LatencyTable()
    if path is not None and Path(path).exists():
        cached = LatencyTable.load(path)
        if cached.fingerprint == table.fingerprint:
            table = cached
    for lay in layers:
        op, shape, bits = check_layer(*lay)
        if key(op, shape, bits) not in table.entries:
            table.measure(op, shape, bits, repeat)
    if path is not None:
        table.save(path)
    return table


class LatencyPredictor:
    """lat(net) = table sum + c0 + c1 * n_layers, (c0, c1) fitted by least squares on measured nets."""

    def __init__(self, table: LatencyTable) -> None:
        self.table = table
        self.coef = np.zeros(2)

    def fit(self, nets: Sequence[Sequence[Layer]], measured_s: Sequence[float]) -> LatencyPredictor:
        if len(nets) != len(measured_s) or len(nets) < 2:
            raise ValueError(f"nets: need >= 2 nets with one measurement each, got {len(nets)} and {len(measured_s)}")
        resid = np.array([m - self.table.net_sum(n) for n, m in zip(nets, measured_s, strict=True)])
        a = np.array([[1.0, len(n)] for n in nets])
        self.coef = np.linalg.lstsq(a, resid, rcond=None)[0]
        return self

    def predict(self, layers: Sequence[Layer]) -> float:
        return max(self.table.net_sum(layers) + self.coef[0] + self.coef[1] * len(layers), 0.0)

    def validate(self, nets: Sequence[Sequence[Layer]], measured_s: Sequence[float]) -> dict[str, float]:
        """Relative errors |pred - meas| / meas on held-out nets: median, max, and the table-sum-only median."""
        rel = [abs(self.predict(n) - m) / m for n, m in zip(nets, measured_s, strict=True)]
        raw = [abs(self.table.net_sum(n) - m) / m for n, m in zip(nets, measured_s, strict=True)]
        return {
            "median_rel_err": float(np.median(rel)),
            "max_rel_err": float(np.max(rel)),
            "median_rel_err_sum_only": float(np.median(raw)),
            "n": len(rel),
        }
