"""``tinylearn bench compress``: LoRA / QLoRA fine-tuning against torch + peft, NF4 memory and matmul, low-rank
factorisation, distillation.

Everything runs in one process at one thread (``limited_threads(1, torch=True)``: BLAS, OpenMP and torch's intra-op
pool), so the rows compare implementations per core, not thread counts. Five tables:

    fine-tuning step   a TinyGPT (torch_reference's seeded weights, LoRA on q_proj / v_proj, next-token loss on a
                       seeded bigram corpus), an MLP on sklearn digits (64 -> hidden -> hidden -> 10, pretrained a
                       few steps in torch, LoRA r=8 on every Linear) and the digits CNN (``tl.nn.models.DigitsCNN``
                       without batch norm: two 3x3 convs, pooling, Linear 128 -> 10; pretrained a few steps, LoRA
                       on its Linear ``fc``; the convs stay frozen in the LoRA runs and train in full fine-tuning).
                       Every run of a model starts from the same
                       weights and batches: full fine-tune, LoRA and QLoRA (NF4 base + LoRA) in tinylearn; full
                       fine-tune and peft LoRA (``get_peft_model``, the adapter initialised from tinylearn's A so
                       both LoRA runs start from the same weights) in torch; Adam. Columns: step time (median of
                       the harness after warm-up; implementations timed in 3 alternating rounds whose samples are
                       pooled, so load on a shared box hits them alike), trainable params, state MB (params +
                       grads + optimizer state, summed from the live arrays), peak MB (``tl.memory.measure_peak``:
                       numpy allocations of one step through a pooled allocator; torch's CPU allocator is not
                       traced, so '-' there), final loss on the fine-tuning set after ``steps`` steps, and for the
                       digits models test accuracy
                       on the 497 held-out images. tinygrad: one n/a row (no LoRA / peft).
                       Goal: LoRA step <= 1.1x torch + peft (reported per model in the table's notes, not
                       asserted).
    QLoRA memory, NF4 matmul   weight bytes per parameter (``.nbytes`` of codes + scales) of NF4 with and without double
                       quantization vs fp32 (goal: <= 0.3x fp32), and y = x W^T with W in NF4: the C++ kernel
                       (simd, scalar), numpy dequantize + matmul, and torch's fp32 matmul on the dense W.
    low rank           a trained MLP's Linears factorised by SVD at several energies (``factorize``): forward time
                       of a batch against the dense model, parameters kept, test accuracy (no fine-tuning).
    distillation       a small student trained alone vs distilled from a trained teacher (T=4, alpha=0.9), the same
                       epochs, optimiser and batches (300 labelled images for the student); test accuracy and NLL,
                       mean over seeds.

Default sizes run in well under a minute on 2 cores; ``full=True`` uses a wider MLP, more steps and seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import limited_threads
from ..bench import Comparison, Table
from ..bench.table import Row
from ..bench.timing import measure
from .bench_models import (  # noqa: F401  (bench.digits & co: the names this module held)
    CNN_TARGETS,
    digits,
    digits_images,
    tl_cnn,
    tl_mlp,
    token_data,
    torch_cnn,
    torch_mlp,
)

LORA_BASELINE = "torch + peft LoRA"
TINYGRAD_NA = "n/a: tinygrad has no LoRA / peft (no adapter layers, no NF4)"
TARGETS = ["0", "2", "4"]


def sizes(full: bool = False) -> dict[str, Any]:
    """Default (or full) sizes; every key can be overridden in the table functions."""
    if full:
        return dict(hidden=1024, batch=128, steps=40, repeat=10, r=8, alpha=16.0, mm=(256, 1024, 1024),
                    energies=(0.5, 0.6, 0.7, 0.8, 0.9), train_epochs=6, seeds=(0, 1, 2, 3, 4, 5, 6, 7),
                    distill_epochs=100,
                    gpt=dict(vocab=128, d_model=128, n_layers=2, seq=64, n_seq=128, batch=16))  # fmt: skip
    return dict(hidden=512, batch=64, steps=20, repeat=7, r=8, alpha=16.0, mm=(64, 512, 512),
                energies=(0.5, 0.6, 0.7, 0.8, 0.9), train_epochs=3, seeds=(0, 1, 2), distill_epochs=100,
                gpt=dict(vocab=64, d_model=64, n_layers=2, seq=32, n_seq=64, batch=8))  # fmt: skip


def _batches(steps: int, batch: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.choice(n, batch, replace=False) for _ in range(steps)]


def _nbytes(v: Any) -> int:
    """Bytes of a numpy array or a tinylearn Tensor; 0 for anything else (None, step counters)."""
    from ..autograd import Tensor

    if isinstance(v, Tensor):
        return int(v.data.nbytes)
    return int(v.nbytes) if isinstance(v, np.ndarray) else 0


def _tl_loss(model: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """Cross-entropy of ``model(x)`` against ``y``: features -> classes, or token ids -> next-token logits."""
    from ..autograd import Tensor
    from ..nn import functional as F

    logits = model(Tensor(x) if x.dtype.kind == "f" else x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _torch_loss(model: Any, x: Any, y: Any) -> Any:
    import torch

    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _tl_run(model: Any, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray], lr: float,
            test: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:  # fmt: skip
    """Adam on the trainable parameters: a step closure, and the state after running every batch once (with the
    accuracy on ``test`` = (X, y) when given)."""
    from .. import optim
    from ..autograd import Tensor, no_grad
    from .qlora import qlora_layers

    params = [p for p in model.parameters() if p.requires_grad]
    opt = optim.Adam(params, lr=lr)
    it = {"i": 0}

    def step() -> float:
        b = batches[it["i"] % len(batches)]
        it["i"] += 1
        loss = _tl_loss(model, X[b], y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    for _ in batches:
        step()
    with no_grad():
        final = float(_tl_loss(model, X, y).item())
        acc = None if test is None else float((model(Tensor(test[0])).data.argmax(-1) == test[1]).mean())
    state = sum(_nbytes(p) for p in model.parameters()) + sum(_nbytes(p.grad) for p in params)
    state += sum(_nbytes(v) for st in opt.state.values() for k, v in st.items() if k != "step")
    state += sum(m.weight_nf4.nbytes for _, m in qlora_layers(model))
    return {"step": step, "final_loss": final, "test_acc": acc, "trainable": sum(p.data.size for p in params),
            "state": state, "model": model}  # fmt: skip


def _torch_run(model: Any, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray], lr: float,
               test: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:  # fmt: skip
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    it = {"i": 0}

    def step() -> float:
        b = torch.from_numpy(batches[it["i"] % len(batches)])
        it["i"] += 1
        loss = _torch_loss(model, Xt[b], yt[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    for _ in batches:
        step()
    with torch.no_grad():
        final = float(_torch_loss(model, Xt, yt).item())
        acc = None
        if test is not None:
            acc = float((model(torch.from_numpy(test[0])).argmax(-1).numpy() == test[1]).mean())
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    state += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state += sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items() if k != "step")
    return {"step": step, "final_loss": final, "test_acc": acc, "trainable": sum(p.numel() for p in params),
            "state": state, "model": model}  # fmt: skip


def _task(task: str, hidden: int, gpt: dict[str, int]) -> tuple[Any, Callable[[Any], Any], list[str], Any, Any, Any]:
    """(torch model, torch model -> tinylearn twin, LoRA targets, inputs, targets, (test inputs, test targets) or
    None) of one fine-tuning task."""
    if task == "mlp":
        X, y, Xte, yte = digits()
        return torch_mlp(hidden), tl_mlp, TARGETS, X, y, (Xte, yte)
    if task == "cnn":
        X, y, Xte, yte = digits_images()
        return torch_cnn(), tl_cnn, CNN_TARGETS, X, y, (Xte, yte)
    import torch

    from ..inference.config import GPTConfig
    from ..inference.model import TinyGPT
    from ..inference.torch_ref import torch_reference

    cfg = GPTConfig(vocab_size=gpt["vocab"], d_model=gpt["d_model"], n_heads=4, n_layers=gpt["n_layers"],
                    max_seq_len=gpt["seq"])  # fmt: skip
    torch.manual_seed(0)
    tm = torch_reference(cfg)
    X, y = token_data(gpt["vocab"], gpt["n_seq"], gpt["seq"])
    twin = lambda m: TinyGPT.from_config(cfg).load_torch_state_dict(m.state_dict())  # noqa: E731
    return tm, twin, ["q_proj", "v_proj"], X, y, None


def finetune_runs(hidden: int = 512, batch: int = 64, steps: int = 20, r: int = 8, alpha: float = 16.0,
                  lr: float = 1e-3, task: str = "mlp",
                  gpt: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every fine-tuning run of the first table for ``task`` ("mlp": the digits MLP with LoRA on its 3 Linears;
    "cnn": the digits CNN with LoRA on its Linear; "gpt": a TinyGPT with LoRA on q_proj / v_proj, next-token loss
    on ``token_data``), from the same weights and
    batches, ``steps`` Adam steps each (the step closures keep training when called again). Keys: the table's impl
    names; each value holds ``step``, ``final_loss`` (cross-entropy on the whole fine-tuning set after ``steps``
    steps), ``test_acc`` (digits tasks: accuracy on the held-out split; None for "gpt"), ``trainable``, ``state``
    (bytes of params, grads and Adam's moments, not its step counters) and
    ``model`` (the trained model: tinylearn, torch, or the peft wrapper)."""
    import copy

    import peft
    import torch

    from .lora import apply_lora
    from .peft_compat import to_peft_model
    from .qlora import apply_qlora

    if task not in ("mlp", "cnn", "gpt"):
        raise ValueError(f"task: expected 'mlp', 'cnn' or 'gpt', got {task!r}")
    tm, twin, targets, X, y, test = _task(task, hidden, gpt or sizes()["gpt"])
    batches = _batches(steps, batch, len(X))
    runs: dict[str, dict[str, Any]] = {}
    runs["tinylearn full FT"] = _tl_run(twin(tm), X, y, batches, lr, test)
    lora = apply_lora(twin(tm), targets, r=r, alpha=alpha)
    # torch + peft from the same base and the same initial A (B = 0 on both sides)
    pm = to_peft_model(copy.deepcopy(tm), lora)
    runs["tinylearn LoRA"] = _tl_run(lora, X, y, batches, lr, test)
    runs["tinylearn QLoRA"] = _tl_run(apply_qlora(twin(tm), targets, r=r, alpha=alpha), X, y, batches, lr, test)
    runs["torch full FT"] = _torch_run(copy.deepcopy(tm), X, y, batches, lr, test)
    runs[LORA_BASELINE] = _torch_run(pm, X, y, batches, lr, test)
    if test is not None:  # before fine-tuning: the pretrained base
        with torch.no_grad():
            runs[LORA_BASELINE]["base_test_acc"] = float((tm(torch.from_numpy(test[0])).argmax(-1).numpy()
                                                          == test[1]).mean())  # fmt: skip
    trainable, _ = pm.get_nb_trainable_parameters()
    runs[LORA_BASELINE]["peft_trainable"] = int(trainable)
    runs[LORA_BASELINE]["peft_version"] = peft.__version__
    return runs


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int, rounds: int = 3) -> dict[str, Any]:
    """Time every fn in ``rounds`` alternating passes (each ``measure(fn, warmup=3, repeat=ceil(repeat / rounds))``)
    and pool each fn's samples: a load change on a shared machine then hits every implementation alike instead of
    the ones timed during it. Returns ``bench.timing.Timing`` per name (median / min over the pooled samples)."""
    import statistics

    from ..bench.timing import Timing

    per = max(2, -(-repeat // rounds))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            samples[k] += measure(fn, warmup=3, repeat=per).times
    return {k: Timing(statistics.median(v), min(v), max(v), v) for k, v in samples.items()}


def finetune_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (i): fine-tuning step time, trainable params, state / peak memory, final loss, test accuracy (digits
    models); digits MLP, digits CNN and TinyGPT. The notes give each model's LoRA / torch + peft step ratio against
    the 1.1x goal."""
    from ..memory import measure_peak

    s = {**sizes(full), **kw}
    g = s["gpt"]
    t = Table(f"LoRA / QLoRA fine-tuning step (Adam lr 1e-3, r={s['r']}, alpha={s['alpha']}, 1 thread)",
              baseline=LORA_BASELINE)  # fmt: skip
    cases = {
        "mlp": f"digits MLP 64-{s['hidden']}-{s['hidden']}-10, b{s['batch']}, {s['steps']} steps",
        "cnn": f"digits CNN conv16-conv32-fc, LoRA on fc, b{s['batch']}, {s['steps']} steps",
        "gpt": f"TinyGPT d{g['d_model']} L{g['n_layers']} T{g['seq']}, b{g['batch']}, {s['steps']} steps",
    }
    goal_notes = []
    with limited_threads(1, torch=True):
        for task, case in cases.items():
            batch = g["batch"] if task == "gpt" else s["batch"]
            runs = finetune_runs(s["hidden"], batch, s["steps"], s["r"], s["alpha"], task=task, gpt=g)
            times = interleaved({k: v["step"] for k, v in runs.items()}, s["repeat"])
            for impl, run in runs.items():
                tm = times[impl]
                peak = measure_peak(run["step"]) / 2**20 if impl.startswith("tinylearn") else None
                extra = {
                    "trainable": run["trainable"],
                    "state MB": run["state"] / 2**20,
                    "final loss": run["final_loss"],
                    "test acc": run["test_acc"],
                }
                t.add(Row(case, impl, tm.median_ms, tm.min * 1e3, peak_mb=peak, extra=extra))
                if progress is not None:
                    progress(f"finetune {task} / {impl}")
            t.add(Row(case, "tinygrad", None, note=TINYGRAD_NA))
            b = runs[LORA_BASELINE]
            n_tl = runs["tinylearn LoRA"]["trainable"]
            t.notes.append(f"{task}: peft {b['peft_version']} trainable {b['peft_trainable']} "
                           f"(get_nb_trainable_parameters), tinylearn LoRA {n_tl}"
                           + (f"; test acc of the pretrained base before fine-tuning {b['base_test_acc']:.4f}"
                              if "base_test_acc" in b else ""))  # fmt: skip
            goal_notes.append(case)
    t.compute_ratios()
    for case in goal_notes:
        r = t.get(case, "tinylearn LoRA")
        if r is not None and r.ratio is not None:
            verdict = "met" if r.ratio <= 1.1 else "NOT met"
            t.notes.append(f"goal LoRA step <= 1.1x torch + peft: {case.split(',')[0]}: {r.ratio:.3f}x ({verdict})")
    t.notes.append("goal: tinylearn LoRA step <= 1.1x torch + peft LoRA (reported, not asserted); peak MB: "
                   "tl.memory.measure_peak (numpy allocations; torch's CPU allocator is not traced); TinyGPT from "
                   "torch_reference's seeded init, LoRA on q_proj / v_proj")  # fmt: skip
    return t


def nf4_memory_rows(shape: tuple[int, int] = (512, 512), block_size: int = 64) -> list[Row]:
    """Measured weight bytes of one [out, in] weight: fp32, NF4 (absmax fp32), NF4 + double quantization."""
    from .nf4 import nf4_quantize

    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 0.02
    rows = [Row(f"weight {shape[0]}x{shape[1]}", "fp32", None, extra={"bytes": w.nbytes, "bits/param": 32.0,
                                                                         "ratio to fp32": 1.0})]  # fmt: skip
    for dq in (False, True):
        q = nf4_quantize(w, block_size=block_size, double_quant=dq)
        impl = f"NF4 block {block_size}" + (" + double quant" if dq else "")
        rows.append(Row(rows[0].case, impl, None, extra={"bytes": q.nbytes, "bits/param": q.bits_per_param,
                                                         "ratio to fp32": q.nbytes / w.nbytes}))  # fmt: skip
    return rows


def qlora_memory_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (ii a): measured NF4 weight bytes per parameter against fp32 (one [N, K] weight of the matmul below)."""
    s = {**sizes(full), **kw}
    _, K, N = s["mm"]
    t = Table("QLoRA weight memory (measured .nbytes of codes + scales)", baseline="fp32")
    for row in nf4_memory_rows((N, K)):
        t.add(row)
    t.add(Row(t.rows[0].case, "tinygrad", None, note=TINYGRAD_NA))
    t.notes.append("goal: NF4 weight memory <= 0.3x fp32 (column 'ratio to fp32'); bitsandbytes' NF4 is CUDA-only")
    if progress is not None:
        progress("qlora memory")
    return t


def nf4_matmul_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (ii b): y = x W^T with W in NF4: tinylearn C++ (simd, scalar), numpy dequantize + matmul, torch fp32."""
    import torch

    from .. import backends
    from .nf4 import nf4_dequantize, nf4_matmul, nf4_matmul_path, nf4_quantize

    s = {**sizes(full), **kw}
    M, K, N = s["mm"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
    q = nf4_quantize(w, block_size=64)
    cmp = Comparison(f"NF4 matmul y = x W^T, x [{M}, {K}], W [{N}, {K}] NF4 block 64 + double quant, 1 thread",
                     baseline="torch fp32", repeat=s["repeat"], progress=progress)  # fmt: skip
    with limited_threads(1, torch=True), cmp.case(f"{M}x{K} @ nf4[{N}x{K}]^T", flops=2.0 * M * K * N) as c:
        if backends.C_available("compress"):
            for v in ("simd", "scalar"):
                c.add(f"tinylearn cpp {v}", lambda v=v: nf4_matmul(x, q, backend="cpp", version=v),
                      note=f"path {nf4_matmul_path(v)}")  # fmt: skip
        else:
            c.unavailable("tinylearn cpp simd", "n/a: tinylearn._C built without the compress kernels")
        c.add("numpy dequant + matmul", lambda: x @ nf4_dequantize(q).T)
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        c.add("torch fp32", lambda: xt @ wt.T, note="dense fp32 weight (4x the bytes)")
        c.unavailable("tinygrad", TINYGRAD_NA)
    return cmp.table


def train_mlp(hidden: int, epochs: int, seed: int = 0) -> Any:
    """A tinylearn MLP 64 -> hidden -> hidden -> 10 trained with Adam on the digits train split."""
    from .. import autograd, nn
    from .distill import train_supervised

    autograd.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    X, y, _, _ = digits()
    return train_supervised(m, X, y, epochs, lr=1e-3, seed=seed)


def lowrank_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (iii): forward time and test accuracy of the SVD-factorised MLP at several energies vs dense."""
    from ..autograd import Tensor, no_grad
    from .distill import clone, evaluate
    from .lowrank import count_params, factorize

    s = {**sizes(full), **kw}
    _, _, Xte, yte = digits()
    xb = Tensor(np.tile(Xte, (4, 1))[:1024])
    with limited_threads(1, torch=True):
        dense = train_mlp(s["hidden"], s["train_epochs"])
        models = [("dense", dense, None)]
        for e in s["energies"]:
            m = clone(dense)
            rep = factorize(m, energy=e)
            ranks = "/".join(str(r["rank"]) if r["replaced"] else "full" for r in rep)
            models.append((f"energy {e}", m, ranks))
        t = Table(f"Low-rank factorisation (SVD, no fine-tuning): digits MLP 64-{s['hidden']}-{s['hidden']}-10, "
                  f"forward of a [1024, 64] batch, 1 thread", baseline="dense")  # fmt: skip
        for name, m, ranks in models:
            m.eval()
            with no_grad():
                tm = measure(lambda m=m: m(xb), warmup=3, repeat=s["repeat"])
            acc, nll = evaluate(m, Xte, yte)
            extra = {"ranks": ranks or "-", "params": count_params(m), "test acc": acc, "test nll": nll}
            t.add(Row("forward", name, tm.median_ms, tm.min * 1e3, extra=extra))
            if progress is not None:
                progress(f"lowrank / {name}")
    t.compute_ratios()
    for r in t.rows:
        r.extra["speed-up"] = 1.0 / r.ratio if r.ratio else None
    return t


def distill_runs(seeds: tuple[int, ...] = (0, 1, 2), epochs: int = 100, teacher_hidden: int = 256,
                 student_hidden: int = 32, n_labelled: int = 300, T: float = 4.0,
                 alpha: float = 0.9) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    """(test accuracy, test NLL) per seed: a teacher trained on the whole train split (30 epochs, Adam 3e-3), and a
    student trained alone vs distilled from it on the first ``n_labelled`` images only (same init, optimiser and
    batches per seed; the setting of tests/compress/test_distill.py's claim)."""
    from .. import autograd, nn
    from .distill import clone, evaluate, train_distilled, train_supervised

    X, y, Xte, yte = digits()
    out: dict[str, list[tuple[float, float]]] = {"teacher": [], "student alone": [], "student distilled": []}
    for seed in seeds:
        autograd.manual_seed(100 + seed)
        teacher = nn.Sequential(nn.Linear(64, teacher_hidden), nn.ReLU(), nn.Linear(teacher_hidden, 10))
        teacher = train_supervised(teacher, X, y, 30, lr=3e-3, seed=seed)
        autograd.manual_seed(seed)
        student = nn.Sequential(nn.Linear(64, student_hidden), nn.ReLU(), nn.Linear(student_hidden, 10))
        Xl, yl = X[:n_labelled], y[:n_labelled]
        alone = train_supervised(clone(student), Xl, yl, epochs, lr=1e-2, seed=seed)
        dist = train_distilled(teacher, clone(student), Xl, yl, epochs, T=T, alpha=alpha, lr=1e-2, seed=seed)
        out["teacher"].append(evaluate(teacher, Xte, yte))
        out["student alone"].append(evaluate(alone, Xte, yte))
        out["student distilled"].append(evaluate(dist, Xte, yte))
    return out


def distill_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (iv): test accuracy / NLL of a 32-unit student trained alone vs distilled, mean over seeds."""
    s = {**sizes(full), **kw}
    with limited_threads(1, torch=True):
        res = distill_runs(tuple(s["seeds"]), s["distill_epochs"])
    t = Table(f"Distillation: digits, teacher 64-256-10 (all {len(digits()[0])} train images) -> student 64-32-10 "
              f"(300 labelled), T=4, alpha=0.9, {s['distill_epochs']} epochs, seeds {tuple(s['seeds'])}",
              baseline="student alone")  # fmt: skip
    for impl, runs in res.items():
        a, nll = np.asarray([r[0] for r in runs]), np.asarray([r[1] for r in runs])
        t.add(Row("test set", impl, None, extra={"mean acc": float(a.mean()), "min acc": float(a.min()),
                                                "max acc": float(a.max()), "mean nll": float(nll.mean()),
                                                "seeds": len(a)}))  # fmt: skip
    gain = [d[0] - a[0] for d, a in zip(res["student distilled"], res["student alone"], strict=True)]
    t.notes.append(f"distilled - alone accuracy per seed: {', '.join(f'{g:+.4f}' for g in gain)} (the claim is "
                   "asserted over seeds in tests/compress/test_distill.py, not here)")  # fmt: skip
    if progress is not None:
        progress("distill")
    return t


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    """``tinylearn bench compress``: fine-tuning, QLoRA memory / matmul, low rank, distillation."""
    return [
        finetune_table(full, progress),
        qlora_memory_table(full, progress),
        nf4_matmul_table(full, progress),
        lowrank_table(full, progress),
        distill_table(full, progress),
    ]
