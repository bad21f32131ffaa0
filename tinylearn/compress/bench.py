"""``tinylearn bench compress``: LoRA / QLoRA fine-tuning against torch + peft, NF4 memory and matmul, low-rank
factorisation, distillation.

Everything runs in one process at one thread (``limited_threads(1, torch=True)``: BLAS, OpenMP and torch's intra-op
pool), so the rows compare implementations per core, not thread counts. Four tables:

    fine-tuning step   the same MLP on sklearn digits (64 -> hidden -> hidden -> 10, pretrained a few steps in
                       torch; every run starts from those weights): full fine-tune, LoRA (r=8 on every Linear) and
                       QLoRA (NF4 base + LoRA) in tinylearn; full fine-tune and peft LoRA (``get_peft_model``, the
                       adapter initialised from tinylearn's A so both LoRA runs start from the same weights) in
                       torch. Adam, the same batches. Columns: step time (median of the harness after warm-up),
                       trainable params, state MB (params + grads + optimizer state, summed from the live arrays),
                       peak MB (``tl.memory.measure_peak``: numpy allocations of one step through a pooled
                       allocator; torch's CPU allocator is not traced, so '-' there), final loss on the fine-tuning
                       set after ``steps`` steps. tinygrad: one n/a row (no LoRA / peft). Goal: LoRA step <= 1.1x
                       torch + peft (reported, not asserted).
    QLoRA memory/matmul  weight bytes per parameter (``.nbytes`` of codes + scales) of NF4 with and without double
                       quantization vs fp32 (goal: <= 0.3x fp32), and y = x W^T with W in NF4: the C++ kernel
                       (simd, scalar), numpy dequantize + matmul, and torch's fp32 matmul on the dense W.
    low rank           a trained MLP's Linears factorised by SVD at several energies (``factorize``): forward time
                       of a batch against the dense model, parameters kept, test accuracy (no fine-tuning).
    distillation       a small student trained alone vs distilled from a trained teacher (T=4, alpha=0.9), the same
                       epochs, optimiser and batches; test accuracy, mean and spread over seeds.

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

LORA_BASELINE = "torch + peft LoRA"
TINYGRAD_NA = "n/a: tinygrad has no LoRA / peft (no adapter layers, no NF4)"
TARGETS = ["0", "2", "4"]


def sizes(full: bool = False) -> dict[str, Any]:
    """Default (or full) sizes; every key can be overridden in the table functions."""
    if full:
        return dict(hidden=1024, batch=128, steps=40, repeat=10, r=8, alpha=16.0, mm=(256, 1024, 1024),
                    energies=(0.5, 0.7, 0.9, 0.95, 0.99), train_epochs=6, seeds=(0, 1, 2, 3, 4), distill_epochs=12)  # fmt: skip
    return dict(hidden=512, batch=64, steps=20, repeat=7, r=8, alpha=16.0, mm=(64, 512, 512),
                energies=(0.5, 0.8, 0.95, 0.99), train_epochs=3, seeds=(0, 1, 2), distill_epochs=8)  # fmt: skip


def digits(n_train: int = 1300) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn digits flattened to [N, 64] float32, a fixed permutation split (train, test)."""
    from ..data import load_digits

    X, y = load_digits()
    X = X.reshape(len(X), -1).astype(np.float32)
    idx = np.random.default_rng(0).permutation(len(X))
    X, y = X[idx], y[idx]
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def torch_mlp(hidden: int, seed: int = 0, pretrain_steps: int = 30) -> Any:
    """torch MLP 64 -> hidden -> hidden -> 10, seeded, pretrained ``pretrain_steps`` SGD steps on digits."""
    import torch

    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                             torch.nn.ReLU(), torch.nn.Linear(hidden, 10))  # fmt: skip
    X, y, _, _ = digits()
    opt = torch.optim.SGD(tm.parameters(), lr=0.05)
    for i in range(pretrain_steps):
        b = slice((i * 64) % 1216, (i * 64) % 1216 + 64)
        loss = torch.nn.functional.cross_entropy(tm(torch.from_numpy(X[b])), torch.from_numpy(y[b]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return tm


def tl_mlp(tm: Any) -> Any:
    """The tinylearn twin of ``torch_mlp`` holding the same weights."""
    from .. import nn

    h = tm[0].out_features
    m = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    m.load_state_dict({k: v.detach().numpy().copy() for k, v in tm.state_dict().items()})
    return m


def _batches(steps: int, batch: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.choice(n, batch, replace=False) for _ in range(steps)]


def _tl_run(model: Any, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray], lr: float) -> dict[str, Any]:
    """Adam on the trainable parameters: a step closure, and the state after running every batch once."""
    from .. import optim
    from ..autograd import Tensor, no_grad
    from ..nn import functional as F

    params = [p for p in model.parameters() if p.requires_grad]
    opt = optim.Adam(params, lr=lr)
    it = {"i": 0}

    def step() -> float:
        b = batches[it["i"] % len(batches)]
        it["i"] += 1
        loss = F.cross_entropy(model(Tensor(X[b])), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    for _ in batches:
        step()
    with no_grad():
        final = float(F.cross_entropy(model(Tensor(X)), y).item())
    state = sum(p.data.nbytes for p in model.parameters()) + sum(p.grad.data.nbytes for p in params if p.grad is not None)
    state += sum(np.asarray(v).nbytes for s in opt.state.values() for v in s.values() if hasattr(v, "nbytes"))
    state += sum(getattr(v, "data", v).nbytes for s in opt.state.values() for v in s.values() if hasattr(v, "data"))
    from .qlora import qlora_layers

    state += sum(m.weight_nf4.nbytes for _, m in qlora_layers(model))
    return {"step": step, "final_loss": final, "trainable": sum(p.data.size for p in params), "state": state}


def _torch_run(model: Any, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray], lr: float) -> dict[str, Any]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    it = {"i": 0}

    def step() -> float:
        b = torch.from_numpy(batches[it["i"] % len(batches)])
        it["i"] += 1
        loss = torch.nn.functional.cross_entropy(model(Xt[b]), yt[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    for _ in batches:
        step()
    with torch.no_grad():
        final = float(torch.nn.functional.cross_entropy(model(Xt), yt).item())
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    state += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return {"step": step, "final_loss": final, "trainable": sum(p.numel() for p in params), "state": state}


def finetune_runs(hidden: int = 512, batch: int = 64, steps: int = 20, r: int = 8, alpha: float = 16.0,
                  lr: float = 1e-3) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every fine-tuning run of the first table, from the same pretrained weights and batches, ``steps`` steps each
    (the step closures keep training when called again). Keys: the table's impl names."""
    import copy

    import peft

    from .lora import apply_lora
    from .peft_compat import to_peft_model
    from .qlora import apply_qlora

    X, y, _, _ = digits()
    batches = _batches(steps, batch, len(X))
    tm = torch_mlp(hidden)
    runs: dict[str, dict[str, Any]] = {}
    runs["tinylearn full FT"] = _tl_run(tl_mlp(tm), X, y, batches, lr)
    lora = apply_lora(tl_mlp(tm), TARGETS, r=r, alpha=alpha)
    # torch + peft from the same base and the same initial A (B = 0 on both sides)
    pm = to_peft_model(copy.deepcopy(tm), lora)
    runs["tinylearn LoRA"] = _tl_run(lora, X, y, batches, lr)
    runs["tinylearn QLoRA"] = _tl_run(apply_qlora(tl_mlp(tm), TARGETS, r=r, alpha=alpha), X, y, batches, lr)
    runs["torch full FT"] = _torch_run(copy.deepcopy(tm), X, y, batches, lr)
    runs[LORA_BASELINE] = _torch_run(pm, X, y, batches, lr)
    trainable, _ = pm.get_nb_trainable_parameters()
    runs[LORA_BASELINE]["peft_trainable"] = int(trainable)
    runs[LORA_BASELINE]["peft_version"] = peft.__version__
    return runs


def finetune_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (i): fine-tuning step time, trainable params, state / peak memory, final loss."""
    from ..memory import measure_peak

    s = {**sizes(full), **kw}
    t = Table(f"LoRA / QLoRA fine-tuning step: digits MLP 64-{s['hidden']}-{s['hidden']}-10, batch {s['batch']}, "
              f"Adam, r={s['r']}, 1 thread", baseline=LORA_BASELINE)  # fmt: skip
    case = f"train step, {s['steps']} steps"
    with limited_threads(1, torch=True):
        runs = finetune_runs(s["hidden"], s["batch"], s["steps"], s["r"], s["alpha"])
        for impl, run in runs.items():
            tm = measure(run["step"], warmup=3, repeat=s["repeat"])
            peak = measure_peak(run["step"]) / 2**20 if impl.startswith("tinylearn") else None
            t.add(Row(case, impl, tm.median_ms, tm.min * 1e3, peak_mb=peak,
                      extra={"trainable": run["trainable"], "state MB": run["state"] / 2**20,
                             "final loss": run["final_loss"]}))  # fmt: skip
            if progress is not None:
                progress(f"finetune / {impl}")
    t.add(Row(case, "tinygrad", None, note=TINYGRAD_NA))
    t.compute_ratios()
    t.notes.append(f"peft {runs[LORA_BASELINE]['peft_version']}: trainable {runs[LORA_BASELINE]['peft_trainable']} "
                   f"(get_nb_trainable_parameters), tinylearn LoRA {runs['tinylearn LoRA']['trainable']}")  # fmt: skip
    t.notes.append("goal: tinylearn LoRA step <= 1.1x torch + peft LoRA (reported, not asserted); peak MB: "
                   "tl.memory.measure_peak (numpy allocations; torch's CPU allocator is not traced)")  # fmt: skip
    return t


def nf4_memory_rows(shape: tuple[int, int] = (512, 512), block_size: int = 64) -> list[Row]:
    """Measured weight bytes of one [out, in] weight: fp32, NF4 (absmax fp32), NF4 + double quantization."""
    from .nf4 import nf4_quantize

    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 0.02
    rows = [Row(f"weight {shape[0]}x{shape[1]}", "fp32", None, extra={"bytes": w.nbytes, "bits/param": 32.0,
                                                                         "x fp32": 1.0})]  # fmt: skip
    for dq in (False, True):
        q = nf4_quantize(w, block_size=block_size, double_quant=dq)
        impl = f"NF4 block {block_size}" + (" + double quant" if dq else "")
        rows.append(Row(rows[0].case, impl, None, extra={"bytes": q.nbytes, "bits/param": q.bits_per_param,
                                                         "x fp32": q.nbytes / w.nbytes}))  # fmt: skip
    return rows


def qlora_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (ii): NF4 weight memory per parameter and the NF4 matmul (cpp / numpy / torch fp32)."""
    import torch

    from .. import backends
    from .nf4 import nf4_dequantize, nf4_matmul, nf4_matmul_path, nf4_quantize

    s = {**sizes(full), **kw}
    M, K, N = s["mm"]
    mem = Table("QLoRA weight memory (measured .nbytes of codes + scales)", baseline="fp32")
    for row in nf4_memory_rows((N, K)):
        mem.add(row)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
    q = nf4_quantize(w, block_size=64)
    cmp = Comparison(f"NF4 matmul y = x W^T, x [{M}, {K}], W [{N}, {K}] (1 thread)", baseline="torch fp32",
                     repeat=s["repeat"], progress=progress)  # fmt: skip
    with limited_threads(1, torch=True), cmp.case(f"{M}x{K} @ nf4[{N}x{K}]^T", flops=2.0 * M * K * N) as c:
        if backends.C_available("compress"):
            for v in ("simd", "scalar"):
                c.add(f"tinylearn cpp {v}", lambda v=v: nf4_matmul(x, q, backend="cpp", version=v),
                      note=f"path {nf4_matmul_path(v)}")  # fmt: skip
        else:
            c.unavailable("tinylearn cpp simd", "n/a: tinylearn._C built without the compress kernels")
        c.add("numpy dequant + matmul", lambda: x @ nf4_dequantize(q).T)
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        c.add("torch fp32", lambda: xt @ wt.T, note="dense fp32 weight")
        c.unavailable("tinygrad", TINYGRAD_NA)
    out = cmp.table
    for r in mem.rows:
        out.rows.insert(len(mem.rows) and mem.rows.index(r), r)
    out.notes.append("goal: NF4 weight memory <= 0.3x fp32 (see 'x fp32'); bitsandbytes' NF4 kernels are CUDA-only")
    return out


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
            t.add(Row("forward", name, tm.median_ms, tm.min * 1e3,
                      extra={"ranks": ranks or "-", "params": count_params(m), "test acc": acc, "test nll": nll}))  # fmt: skip
            if progress is not None:
                progress(f"lowrank / {name}")
    t.compute_ratios()
    for r in t.rows:
        r.extra["speed-up"] = 1.0 / r.ratio if r.ratio else None
    return t


def distill_runs(seeds: tuple[int, ...] = (0, 1, 2), epochs: int = 8, teacher_hidden: int = 256,
                 student_hidden: int = 16, T: float = 4.0, alpha: float = 0.9) -> dict[str, list[float]]:  # fmt: skip
    """Test accuracies of the student trained alone and distilled (same init per seed), and of the teacher."""
    from .. import autograd, nn
    from .distill import clone, evaluate, train_distilled, train_supervised

    X, y, Xte, yte = digits()
    out: dict[str, list[float]] = {"teacher": [], "student alone": [], "student distilled": []}
    teacher = nn.Sequential(nn.Linear(64, teacher_hidden), nn.ReLU(), nn.Linear(teacher_hidden, 10))
    autograd.manual_seed(100)
    teacher = train_supervised(teacher, X, y, epochs, lr=1e-3)
    for seed in seeds:
        autograd.manual_seed(seed)
        student = nn.Sequential(nn.Linear(64, student_hidden), nn.ReLU(), nn.Linear(student_hidden, 10))
        alone = train_supervised(clone(student), X, y, epochs, lr=1e-2, seed=seed)
        dist = train_distilled(teacher, clone(student), X, y, epochs, T=T, alpha=alpha, lr=1e-2, seed=seed)
        out["student alone"].append(evaluate(alone, Xte, yte)[0])
        out["student distilled"].append(evaluate(dist, Xte, yte)[0])
    out["teacher"].append(evaluate(teacher, Xte, yte)[0])
    return out


def distill_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    """Table (iv): test accuracy of a 16-unit student trained alone vs distilled, mean over seeds."""
    s = {**sizes(full), **kw}
    with limited_threads(1, torch=True):
        res = distill_runs(tuple(s["seeds"]), s["distill_epochs"])
    t = Table(f"Distillation: digits, teacher 64-256-10 -> student 64-16-10, T=4, alpha=0.9, {s['distill_epochs']} "
              f"epochs, seeds {tuple(s['seeds'])}", baseline="student alone")  # fmt: skip
    for impl, accs in res.items():
        a = np.asarray(accs)
        t.add(Row("test accuracy", impl, None, extra={"mean acc": float(a.mean()), "min": float(a.min()),
                                                     "max": float(a.max()), "runs": len(a)}))  # fmt: skip
    if progress is not None:
        progress("distill")
    return t


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    """``tinylearn bench compress``: fine-tuning, QLoRA memory / matmul, low rank, distillation."""
    return [
        finetune_table(full, progress),
        qlora_table(full, progress),
        lowrank_table(full, progress),
        distill_table(full, progress),
    ]
