"""Benchmark: one training step (forward + backward + optimizer) — tinylearn vs torch eager vs tinygrad (TinyJit).

Cases (``run()``; ``TINYLEARN_FULL=1`` / ``full=True`` adds torch.compile and more repeats):
  * MLP 784-512-512-10, batch 128, SGD(momentum=0.9), softmax cross-entropy  — GEMM-bound: ~0.3 GFLOP per step
  * small CNN (conv3x3(1->8)-ReLU-maxpool2-conv3x3(8->16)-ReLU-maxpool2-linear) on [32, 1, 28, 28]
  * op overhead: a 7-op graph on 16x16 tensors — pure framework overhead (Python dispatch vs C++ dispatch)
  * ops (second table): the torch-breadth ops on the notebooks' hot path — pad, scaled_dot_product_attention,
    einsum, group_norm — forward + backward (loss = sum(out * g)), same inputs in all three frameworks

All implementations get identical initial weights and the same batch. ``run(threads=None)`` times the step at the
thread count in effect (torch.get_num_threads()) and adds MLP/CNN rows at 1 and 2 threads (tinylearn vs torch).
``profile_mlp_step()`` returns cProfile's view of where a tinylearn step spends its time; ``step_phases()`` the
median forward / backward / optimizer split, tinylearn vs torch, with ``legacy=True`` selecting the pre-issue-18
path as a rung: max pooling through im2col + argmax (tinylearn.conv) and fused optimizer updates with OpenMP from
256k elements (now 4M: below that the update stays on the calling thread).

Why one file (> 500 lines): the step benchmark builds the same MLP/CNN in three frameworks with identical weights
and times them in one loop; the three builders and the timing must stay together to stay comparable.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import limited_threads
from ..bench import Comparison, Table, tinygrad_jit

MLP_SIZES = (784, 512, 512, 10)
MLP_CASE = "MLP 784-512-512-10 bs128"
CNN_CASE = "CNN conv8-conv16-fc bs32 28x28"


def _mlp_weights(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:]):
        b = 1 / np.sqrt(i)
        out.append((rng.uniform(-b, b, (o, i)).astype(np.float32), rng.uniform(-b, b, o).astype(np.float32)))
    return out


def _batch(shape: tuple[int, ...], n_classes: int = 10, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, n_classes, shape[0]).astype(np.int64)


# -- tinylearn ------------------------------------------------------------------------------------------------------
LEGACY_OMP_MIN = 1 << 18  # the fused optimizer kernels' OpenMP threshold before issue 18


def tinylearn_mlp_step(batch: int = 128, legacy: bool = False) -> Callable[[], Any]:
    return _tl_mlp_phases(batch, legacy)[3]


def _tl_mlp_phases(batch: int = 128, legacy: bool = False) -> tuple[Callable[[], Any], ...]:
    """(forward, backward, optimizer, step) closures of the tinylearn MLP step (forward stores the loss)."""
    from tinylearn import nn
    from tinylearn.nn import functional as F

    layers: list[nn.Module] = []
    for k, (w, b) in enumerate(_mlp_weights()):
        lin = nn.Linear(w.shape[1], w.shape[0])
        lin.weight.data[...] = w
        lin.bias.data[...] = b
        layers += [lin] + ([nn.ReLU()] if k < 2 else [])
    model = nn.Sequential(*layers)
    X, y = _batch((batch, 784))
    return _tl_phases(model, X, y, legacy, F.cross_entropy)


def _tl_phases(model: Any, X: np.ndarray, y: np.ndarray, legacy: bool, loss_fn: Any) -> tuple[Callable[[], Any], ...]:
    import tinylearn as tl

    opt = tl.optim.SGD(list(model.parameters()), lr=0.01, momentum=0.9)
    if legacy:
        opt._omp_kw = {"parallel_min": LEGACY_OMP_MIN}
    xt = tl.Tensor(X)
    box: list[Any] = [None]

    def forward() -> None:
        box[0] = loss_fn(model(xt), y)

    def backward() -> None:
        opt.zero_grad()
        box[0].backward()

    def step() -> float:
        forward()
        backward()
        opt.step()
        return box[0].data

    return forward, backward, opt.step, step


def _cnn_tl(legacy: bool = False) -> Any:
    from tinylearn import nn

    pool = _im2col_pool_module() if legacy else nn.MaxPool2d
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        pool(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        pool(2),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, 10),
    )


def _im2col_pool_module() -> type:
    from tinylearn import nn
    from tinylearn.conv.functional import max_pool2d_im2col

    class Im2colMaxPool2d(nn.MaxPool2d):
        """The pre-issue-18 path of nn.MaxPool2d: im2col windows + argmax (conv.functional.max_pool2d_im2col)."""

        def forward(self, x: Any) -> Any:
            return max_pool2d_im2col(x, self.kernel_size, self.stride, self.padding, self.dilation)

    return Im2colMaxPool2d


def tinylearn_cnn_step(batch: int = 32, legacy: bool = False) -> tuple[Callable[[], Any], Any]:
    phases, model = _tl_cnn_phases(batch, legacy)
    return phases[3], model


def _tl_cnn_phases(batch: int = 32, legacy: bool = False) -> tuple[tuple[Callable[[], Any], ...], Any]:
    import tinylearn as tl
    from tinylearn.nn import functional as F

    tl.manual_seed(0)
    model = _cnn_tl(legacy)
    X, y = _batch((batch, 1, 28, 28))
    return _tl_phases(model, X, y, legacy, F.cross_entropy), model


# -- torch ------------------------------------------------------------------------------------------------------------
def torch_mlp_model() -> Any:
    import torch

    layers: list[Any] = []
    for k, (w, b) in enumerate(_mlp_weights()):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin] + ([torch.nn.ReLU()] if k < 2 else [])
    return torch.nn.Sequential(*layers)


def torch_step(model: Any, X: np.ndarray, y: np.ndarray, compile: bool = False) -> Callable[[], Any]:
    return _torch_phases(model, X, y, compile)[3]


def _torch_phases(model: Any, X: np.ndarray, y: np.ndarray, compile: bool = False) -> tuple[Callable[[], Any], ...]:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fwd = torch.compile(model) if compile else model
    xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    box: list[Any] = [None]

    def forward() -> None:
        box[0] = torch.nn.functional.cross_entropy(fwd(xt), yt)

    def backward() -> None:
        opt.zero_grad()
        box[0].backward()

    def step() -> Any:
        forward()
        backward()
        opt.step()
        return box[0]

    return forward, backward, opt.step, step


def torch_cnn_model(tl_model: Any) -> Any:
    import torch

    m = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 7 * 7, 10),
    )
    m.load_state_dict({k: torch.from_numpy(np.array(v.data)) for k, v in tl_model.state_dict().items()})
    return m


# -- tinygrad ---------------------------------------------------------------------------------------------------------
def tinygrad_step_builder(
    kind: str, X: np.ndarray, y: np.ndarray, state: dict[str, np.ndarray]
) -> Callable[[Any], Any]:
    def build(tg: Any) -> Callable[[], Any]:
        from tinygrad import Tensor
        from tinygrad import nn as tnn
        from tinygrad.helpers import Context

        params = {k: Tensor(np.ascontiguousarray(v)).realize() for k, v in state.items()}
        if kind == "mlp":

            def model(x: Any) -> Any:
                h = x.linear(params["0.weight"].T, params["0.bias"]).relu()
                h = h.linear(params["2.weight"].T, params["2.bias"]).relu()
                return h.linear(params["4.weight"].T, params["4.bias"])
        else:

            def model(x: Any) -> Any:
                h = x.conv2d(params["0.weight"], params["0.bias"], padding=1).relu().max_pool2d(2)
                h = h.conv2d(params["3.weight"], params["3.bias"], padding=1).relu().max_pool2d(2)
                return h.flatten(1).linear(params["7.weight"].T, params["7.bias"])

        opt = tnn.optim.SGD(list(params.values()), lr=0.01, momentum=0.9)
        xt, yt = Tensor(X).realize(), Tensor(y.astype(np.int32)).realize()

        def train(x: Any, t: Any) -> Any:
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(t).backward()
            opt.step()
            return loss

        jitted = tinygrad_jit(train)

        def run() -> Any:
            with Context(TRAINING=1):
                return jitted(xt, yt)

        return run

    return build


def _overhead_cases(cmp: Comparison) -> None:
    import torch

    import tinylearn as tl

    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3)]
    a, b, c = (tl.Tensor(x, requires_grad=True) for x in arrs)
    ta, tb, tc = (torch.tensor(x, requires_grad=True) for x in arrs)

    def tl_fn() -> None:
        ((a * b + c).relu() @ b - a).tanh().sum().backward()
        a.grad = b.grad = c.grad = None

    def th_fn() -> None:
        ((ta * tb + tc).relu() @ tb - ta).tanh().sum().backward()
        ta.grad = tb.grad = tc.grad = None

    def tg_build(tg: Any) -> Callable[[], Any]:
        from tinygrad import Tensor

        xs = [Tensor(x).realize() for x in arrs]

        def fwd_bwd(p: Any, q: Any, r: Any) -> Any:
            return tuple(((p * q + r).relu() @ q - p).tanh().sum().gradient(p, q, r))

        jitted = tinygrad_jit(fwd_bwd)
        return lambda: jitted(*xs)

    with cmp.case("op overhead: 7 ops on 16x16, fwd+bwd") as case:
        case.add("tinylearn", tl_fn)
        case.add("torch", th_fn)
        case.add_tinygrad("tinygrad", tg_build, note="TinyJit: the 7 ops fused into a few kernels, replayed")


# (name, shapes of the differentiable inputs, tinylearn fn(m, *xs), torch fn, tinygrad fn); m = the tl / torch module
_OPS_SHAPES = {
    "pad": [(8, 16, 32, 32)],
    "sdpa": [(4, 4, 64, 32)] * 3,
    "einsum": [(4, 4, 64, 32), (4, 4, 64, 32)],
    "group_norm": [(8, 32, 16, 16), (32,), (32,)],
    "interpolate": [(8, 16, 32, 32)],
    "max_pool2d": [(8, 32, 32, 32)],
    "embedding": [(1000, 64)],
    "cross_entropy": [(256, 100)],
}
OPS_CASE_NAMES = {
    "pad": "pad reflect (1,1,1,1) [8,16,32,32]",
    "sdpa": "sdpa causal [4,4,64,32]",
    "einsum": "einsum bhqd,bhkd->bhqk [4,4,64,32]",
    "group_norm": "group_norm 8 groups [8,32,16,16]",
    "interpolate": "interpolate bilinear x2 [8,16,32,32]",
    "max_pool2d": "max_pool2d 2x2 [8,32,32,32]",
    "embedding": "embedding [1000,64] x idx [32,64]",
    "cross_entropy": "cross_entropy [256,100]",
}
# the integer inputs of the embedding / cross_entropy rows (fixed, the same in every framework)
_EMB_IDX = np.random.default_rng(2).integers(0, 1000, (32, 64))
_CE_LABELS = np.random.default_rng(1).integers(0, 100, 256)


def _ops_tl_torch(name: str, m: Any, xs: list[Any]) -> Any:
    F = m.nn.functional
    if name == "pad":
        return F.pad(xs[0], (1, 1, 1, 1), mode="reflect")
    if name == "sdpa":
        return F.scaled_dot_product_attention(xs[0], xs[1], xs[2], is_causal=True)
    if name == "einsum":
        return m.einsum("bhqd,bhkd->bhqk", xs[0], xs[1])
    if name == "interpolate":
        return F.interpolate(xs[0], scale_factor=2, mode="bilinear", align_corners=False)
    if name == "max_pool2d":
        return F.max_pool2d(xs[0], 2)
    if name == "embedding":
        return F.embedding(m.tensor(_EMB_IDX), xs[0])
    if name == "cross_entropy":
        return F.cross_entropy(xs[0], m.tensor(_CE_LABELS)).reshape(1)
    return F.group_norm(xs[0], 8, xs[1], xs[2], eps=1e-5)


def _ops_tinygrad(name: str, xs: list[Any]) -> Any:
    if name == "pad":
        return xs[0].pad(((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
    if name == "sdpa":
        return xs[0].scaled_dot_product_attention(xs[1], xs[2], is_causal=True)
    if name in ("einsum", "embedding", "cross_entropy"):
        from tinygrad import Tensor

        if name == "embedding":
            return xs[0][Tensor(_EMB_IDX.astype(np.int32))]
        if name == "cross_entropy":
            return xs[0].sparse_categorical_crossentropy(Tensor(_CE_LABELS.astype(np.int32))).reshape(1)
        return Tensor.einsum("bhqd,bhkd->bhqk", xs[0], xs[1])
    if name == "interpolate":
        return xs[0].interpolate((64, 64), mode="linear", align_corners=False)
    if name == "max_pool2d":
        return xs[0].max_pool2d(2)
    x, w, b = xs
    n, c = x.shape[:2]
    y = x.reshape(n, 8, -1).layernorm(axis=-1, eps=1e-5).reshape(x.shape)
    return y * w.reshape(1, c, 1, 1) + b.reshape(1, c, 1, 1)


def _ops_inputs(name: str) -> tuple[list[np.ndarray], np.ndarray]:
    import torch

    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal(s).astype(np.float32) for s in _OPS_SHAPES[name]]
    out = _ops_tl_torch(name, torch, [torch.from_numpy(a) for a in arrs])
    return arrs, rng.standard_normal(tuple(out.shape)).astype(np.float32)


def ops_case_fns(name: str) -> dict[str, Callable[[], Any]]:
    """No-argument fwd+bwd callables for one ops case: {"tinylearn": ..., "torch": ...} (tinygrad: ``_ops_tg``)."""
    import torch

    import tinylearn as tl

    arrs, g = _ops_inputs(name)
    txs = [tl.Tensor(a, requires_grad=True) for a in arrs]
    ths = [torch.tensor(a, requires_grad=True) for a in arrs]
    tg_g = tl.Tensor(g)
    th_g = torch.from_numpy(g)

    def tl_fn() -> Any:
        for x in txs:
            x.grad = None
        (_ops_tl_torch(name, tl, txs) * tg_g).sum().backward()
        return txs[0].grad

    def th_fn() -> Any:
        for x in ths:
            x.grad = None
        (_ops_tl_torch(name, torch, ths) * th_g).sum().backward()
        return ths[0].grad

    return {"tinylearn": tl_fn, "torch": th_fn}


def _ops_tg(name: str) -> Callable[[Any], Callable[[], Any]]:
    def build(tg: Any) -> Callable[[], Any]:
        from tinygrad import Tensor

        arrs, g = _ops_inputs(name)
        xs = [Tensor(a).realize() for a in arrs]
        gt = Tensor(g).realize()

        def fwd_bwd(*ins: Any) -> Any:
            loss = (_ops_tinygrad(name, list(ins)) * gt).sum()
            return tuple(loss.gradient(*ins))

        jitted = tinygrad_jit(fwd_bwd)
        return lambda: jitted(*xs)

    return build


def _ops_cases(progress: Callable[[str], None] | None, repeat: int) -> Table:
    cmp = Comparison(
        "autodiff: breadth ops on the notebooks' hot path, fwd + bwd, fp32 CPU", repeat=repeat, progress=progress
    )
    cmp.note("loss = sum(op(x) * g); tinygrad: Tensor.gradient under TinyJit (DEV=CPU)")
    for name, label in OPS_CASE_NAMES.items():
        fns = ops_case_fns(name)
        with cmp.case(label) as case:
            case.add("tinylearn", fns["tinylearn"])
            case.add("torch", fns["torch"])
            case.add_tinygrad("tinygrad", _ops_tg(name))
    return cmp.table


CASES = ("mlp", "cnn", "overhead", "ops")


THREAD_ROWS = (1, 2)  # extra MLP / CNN rows (tinylearn vs torch) at these thread counts


def run(
    full: bool = False,
    progress: Callable[[str], None] | None = None,
    threads: int | None = None,
    cases: tuple[str, ...] = CASES,
    thread_rows: tuple[int, ...] = THREAD_ROWS,
) -> list[Table]:
    """Time ``cases`` (subset of CASES) with ``threads`` threads for torch, numpy's BLAS and OpenMP (restored
    afterwards); ``threads=None`` keeps the count in effect (torch.get_num_threads()).

    Returns the training-step table (mlp / cnn / overhead, plus "@N thread(s)" MLP/CNN rows of tinylearn and torch
    for each count of ``thread_rows`` other than ``threads`` and at most os.cpu_count()) and, when "ops" is among
    ``cases``, the breadth-ops table.
    """
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise ValueError(f"cases: unknown case(s) {bad}; known: {list(CASES)}")
    import torch

    if threads is None:
        threads = torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: expected a positive int or None, got {threads!r}")
    extra = tuple(t for t in dict.fromkeys(thread_rows) if t != threads and 1 <= t <= (os.cpu_count() or 1))
    with limited_threads(threads, torch=True):
        return _run(full, progress, tuple(cases), threads, extra)


def _run(
    full: bool, progress: Callable[[str], None] | None, cases: tuple[str, ...], threads: int, extra: tuple[int, ...]
) -> list[Table]:
    full = full or os.environ.get("TINYLEARN_FULL") == "1"
    repeat = 20 if full else 10
    cmp = Comparison(
        "autodiff: one training step (fwd + bwd + SGD momentum), fp32 CPU", repeat=repeat, progress=progress
    )
    cmp.note(
        f"threads: {threads} for torch, numpy's BLAS and OpenMP alike (run(threads=...)); rows named '@N thread(s)' "
        "run at N; tinygrad DEV=CPU with TinyJit"
    )

    if "mlp" in cases:
        _mlp_case(cmp, full)
    if "cnn" in cases:
        _cnn_case(cmp, full)
    for n in extra:
        with limited_threads(n, torch=True):
            if "mlp" in cases:
                _thread_row(cmp, "mlp", n)
            if "cnn" in cases:
                _thread_row(cmp, "cnn", n)
    if "overhead" in cases:
        _overhead_cases(cmp)
    if not full:
        cmp.note("torch.compile rows: run with full=True / TINYLEARN_FULL=1 (compilation takes ~1 min here)")
    tables = [cmp.table]
    if "ops" in cases:
        tables.append(_ops_cases(progress, repeat))
    return tables


def _mlp_case(cmp: Comparison, full: bool) -> None:
    X, y = _batch((128, 784))
    tmodel = torch_mlp_model()
    state = {k: v.detach().numpy().copy() for k, v in tmodel.state_dict().items()}
    # 8 GEMMs: forward 3, backward dW 3, dX 2 (the input needs no gradient), 2 flops per multiply-add
    macs = 784 * 512 + 512 * 512 + 512 * 10
    with cmp.case(MLP_CASE, flops=2 * 128 * (3 * macs - 784 * 512)) as case:
        case.add("tinylearn", tinylearn_mlp_step())
        case.add("torch", torch_step(tmodel, X, y))
        if full:
            case.add_torch_compile("torch.compile", torch_step(torch_mlp_model(), X, y, compile=True))
        case.add_tinygrad("tinygrad", tinygrad_step_builder("mlp", X, y, state))


def _cnn_case(cmp: Comparison, full: bool) -> None:
    step, tl_cnn = tinylearn_cnn_step()
    Xc, yc = _batch((32, 1, 28, 28))
    tcnn = torch_cnn_model(tl_cnn)
    cstate = {k: v.detach().numpy().copy() for k, v in tcnn.state_dict().items()}
    with cmp.case(CNN_CASE) as case:
        case.add("tinylearn", step)
        case.add("torch", torch_step(tcnn, Xc, yc))
        if full:
            case.add_torch_compile("torch.compile", torch_step(torch_cnn_model(tl_cnn), Xc, yc, compile=True))
        case.add_tinygrad("tinygrad", tinygrad_step_builder("cnn", Xc, yc, cstate))


def _thread_row(cmp: Comparison, kind: str, n: int) -> None:
    tl_fns, th_fns = _step_pair(kind)
    label = {"mlp": MLP_CASE, "cnn": CNN_CASE}[kind] + f" @{n} thread" + ("s" if n > 1 else "")
    with cmp.case(label) as case:
        case.add("tinylearn", tl_fns[3])
        case.add("torch", th_fns[3])


def _step_pair(kind: str, legacy: bool = False) -> tuple[tuple[Callable[[], Any], ...], tuple[Callable[[], Any], ...]]:
    """(tinylearn phases, torch phases) of one step of ``kind`` ("mlp" | "cnn"), same weights and batch."""
    if kind == "mlp":
        X, y = _batch((128, 784))
        return _tl_mlp_phases(128, legacy), _torch_phases(torch_mlp_model(), X, y)
    if kind == "cnn":
        X, y = _batch((32, 1, 28, 28))
        tl_fns, model = _tl_cnn_phases(32, legacy)
        return tl_fns, _torch_phases(torch_cnn_model(model), X, y)
    raise ValueError(f"kind: expected 'mlp' or 'cnn', got {kind!r}")


PHASES = ("forward", "backward", "optimizer")


def step_phases(
    kind: str = "mlp", threads: int = 1, steps: int = 20, legacy: bool = False, warmup: int = 3
) -> dict[str, dict[str, float]]:
    """Median milliseconds of each phase of one training step, {"tinylearn": {phase: ms}, "torch": {...}}.

    Phases: forward (model + cross-entropy), backward (zero_grad + loss.backward()), optimizer (SGD momentum step).
    torch, numpy's BLAS and OpenMP run at ``threads``; each framework runs its ``steps`` steps on its own (not
    interleaved). ``legacy=True``: tinylearn's pre-issue-18 path (im2col max pooling, OpenMP optimizer updates from
    256k elements).
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps/warmup: need steps >= 1 and warmup >= 0, got {steps}, {warmup}")
    with limited_threads(threads, torch=True):
        out = {}
        for name, fns in zip(("tinylearn", "torch"), _step_pair(kind, legacy)):
            for _ in range(warmup):
                fns[3]()
            samples: list[list[float]] = [[] for _ in PHASES]
            for _ in range(steps):
                for i, fn in enumerate(fns[:3]):
                    t0 = time.perf_counter()
                    fn()
                    samples[i].append(time.perf_counter() - t0)
            out[name] = {ph: statistics.median(v) * 1e3 for ph, v in zip(PHASES, samples)}
    return out


def profile_mlp_step(steps: int = 20, top: int = 12, batch: int = 128, threads: int = 1) -> str:
    """cProfile of ``steps`` tinylearn MLP training steps (BLAS capped at ``threads``); top entries by own time."""
    with limited_threads(threads):
        return _profile(steps, top, batch)


def _profile(steps: int, top: int, batch: int) -> str:
    step = tinylearn_mlp_step(batch)
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(top)
    return buf.getvalue()
