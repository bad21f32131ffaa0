"""``tinylearn bench compress`` at tiny sizes: every row present with positive numbers, LoRA trainable-parameter
counts equal to peft's, and tinylearn vs torch + peft fine-tuning from the same weights and batches reaching the same
loss and adapter weights (the correctness check that makes the step-time comparison honest). No timing is asserted."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tinylearn.compress import bench
from tinylearn.compress.lora import lora_layers

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

TINY_GPT = dict(vocab=32, d_model=32, n_layers=1, seq=8, n_seq=16, batch=4)
TINY = dict(hidden=32, batch=16, steps=6, r=4, alpha=8.0, gpt=TINY_GPT)
IMPLS = ["tinylearn full FT", "tinylearn LoRA", "tinylearn QLoRA", "torch full FT", bench.LORA_BASELINE]


def test_finetune_runs_match_peft_and_torch(capsys: pytest.CaptureFixture[str]) -> None:
    runs = bench.finetune_runs(**TINY)
    assert list(runs) == IMPLS
    pm = runs[bench.LORA_BASELINE]["model"]
    capsys.readouterr()
    pm.print_trainable_parameters()
    m = re.search(r"trainable params:\s*([\d,]+)", capsys.readouterr().out)
    assert m is not None
    n_peft = int(m.group(1).replace(",", ""))
    h, r = TINY["hidden"], TINY["r"]
    expect = r * (64 + h) + r * (h + h) + r * (h + 10)  # A [r, in] + B [out, r] on each of the 3 Linears
    assert runs["tinylearn LoRA"]["trainable"] == runs["tinylearn QLoRA"]["trainable"] == n_peft == expect
    assert runs[bench.LORA_BASELINE]["trainable"] == n_peft
    n_full = 64 * h + h + h * h + h + h * 10 + 10
    assert runs["tinylearn full FT"]["trainable"] == runs["torch full FT"]["trainable"] == n_full
    # the same weights, batches and Adam: the same loss after the same steps (fp32, a few steps of accumulated rounding)
    for ours, theirs in (("tinylearn LoRA", bench.LORA_BASELINE), ("tinylearn full FT", "torch full FT")):
        assert runs[ours]["final_loss"] == pytest.approx(runs[theirs]["final_loss"], rel=1e-4, abs=1e-5), ours
    assert runs["tinylearn LoRA"]["final_loss"] != pytest.approx(runs["tinylearn full FT"]["final_loss"], rel=1e-3)
    # and the same adapter weights: B moved away from 0 on both sides, identically
    pp = dict(pm.named_parameters())
    for n, layer in lora_layers(runs["tinylearn LoRA"]["model"]):
        for ab in ("lora_A", "lora_B"):
            theirs = pp[f"base_model.model.{n}.{ab}.default.weight"].detach().numpy()
            np.testing.assert_allclose(getattr(layer, ab).data, theirs, rtol=1e-4, atol=1e-5, err_msg=f"{n}.{ab}")
        assert np.abs(layer.lora_B.data).max() > 1e-4
    # QLoRA trains the same adapter on an NF4 base: close to LoRA's loss, not equal to it
    ql, lo = runs["tinylearn QLoRA"]["final_loss"], runs["tinylearn LoRA"]["final_loss"]
    assert ql != lo and abs(ql - lo) < 0.1 * lo
    # state bytes: LoRA keeps the frozen base (no grads / Adam state for it); QLoRA's base is NF4
    st = {k: v["state"] for k, v in runs.items()}
    assert st["tinylearn QLoRA"] < st["tinylearn LoRA"] < st["tinylearn full FT"] == st["torch full FT"]
    assert st["tinylearn LoRA"] == st[bench.LORA_BASELINE]


def test_finetune_gpt_matches_peft() -> None:
    """TinyGPT with LoRA on q_proj / v_proj: tinylearn and torch_reference + peft agree after the same steps."""
    runs = bench.finetune_runs(**TINY, task="gpt")
    d = TINY_GPT["d_model"]
    expect = TINY_GPT["n_layers"] * 2 * TINY["r"] * (d + d)
    assert runs["tinylearn LoRA"]["trainable"] == runs[bench.LORA_BASELINE]["peft_trainable"] == expect
    for ours, theirs in (("tinylearn LoRA", bench.LORA_BASELINE), ("tinylearn full FT", "torch full FT")):
        assert runs[ours]["final_loss"] == pytest.approx(runs[theirs]["final_loss"], rel=1e-4, abs=1e-5), ours
    assert runs["tinylearn LoRA"]["final_loss"] < np.log(TINY_GPT["vocab"]) + 0.5  # near-uniform start, finite
    assert all(run["test_acc"] is None for run in runs.values())  # a language model: loss only
    with pytest.raises(ValueError, match="task"):
        bench.finetune_runs(**TINY, task="rnn")


def test_finetune_cnn_matches_peft_and_reports_accuracy() -> None:
    """The digits CNN (LoRA on its Linear): tinylearn and torch + peft reach the same loss and test accuracy from
    the same weights and batches; full fine-tuning trains the convs too; every digits run reports test accuracy."""
    runs = bench.finetune_runs(**TINY, task="cnn")
    r = TINY["r"]
    assert runs["tinylearn LoRA"]["trainable"] == runs["tinylearn QLoRA"]["trainable"] == r * (128 + 10)
    assert runs[bench.LORA_BASELINE]["peft_trainable"] == r * (128 + 10)
    n_full = 16 * 9 + 16 + 32 * 16 * 9 + 32 + 128 * 10 + 10
    assert runs["tinylearn full FT"]["trainable"] == runs["torch full FT"]["trainable"] == n_full
    n_test = len(bench.digits()[2])
    for ours, theirs in (("tinylearn LoRA", bench.LORA_BASELINE), ("tinylearn full FT", "torch full FT")):
        assert runs[ours]["final_loss"] == pytest.approx(runs[theirs]["final_loss"], rel=1e-4, abs=1e-5), ours
        assert abs(runs[ours]["test_acc"] - runs[theirs]["test_acc"]) <= 2 / n_test, ours  # argmax ties at most
    for name, run in runs.items():
        assert 0.1 < run["test_acc"] <= 1.0, name  # pretrained 30 steps: well above chance
    # the test accuracy is the model's, measured: it matches a recount on the trained tinylearn model
    import tinylearn as tl

    _, _, Xte, yte = bench.digits_images()
    with tl.no_grad():
        pred = runs["tinylearn QLoRA"]["model"](tl.Tensor(Xte)).data.argmax(-1)
    assert runs["tinylearn QLoRA"]["test_acc"] == pytest.approx(float((pred == yte).mean()))


def test_finetune_table_rows() -> None:
    t = bench.finetune_table(repeat=2, **TINY)
    assert len(t.cases()) == 3 and t.impls() == IMPLS + ["tinygrad"]
    for case in t.cases():
        for impl in IMPLS:
            row = t.get(case, impl)
            assert row.median_ms > 0 and row.ratio > 0 and row.extra["trainable"] > 0 and row.extra["state MB"] > 0
            assert np.isfinite(row.extra["final loss"]) and row.extra["final loss"] > 0
            acc = row.extra["test acc"]
            assert (acc is None) == case.startswith("TinyGPT") and (acc is None or 0 < acc <= 1)
            assert (row.peak_mb is not None and row.peak_mb > 0) == impl.startswith("tinylearn")
        assert t.get(case, "tinygrad").note.startswith("n/a")
    goals = [n for n in t.notes if n.startswith("goal LoRA step")]
    assert [n.split(": ")[1] for n in goals] == [
        "digits MLP 64-32-32-10",
        "digits CNN conv16-conv32-fc",
        "TinyGPT d32 L1 T8",
    ]
    for case, note in zip(t.cases(), goals, strict=True):  # the printed ratio is the table's
        assert f"{t.get(case, 'tinylearn LoRA').ratio:.3f}x" in note


def test_qlora_tables() -> None:
    mem = bench.qlora_memory_table(mm=(4, 128, 64))
    assert mem.impls() == ["fp32", "NF4 block 64", "NF4 block 64 + double quant", "tinygrad"]
    fp32, nf4, dq = (mem.rows[i].extra for i in range(3))
    assert fp32["bytes"] == 128 * 64 * 4 and fp32["bits/param"] == 32.0
    # codes 4 bits + one fp32 absmax per 64 -> 4.5 bits; double quant: int8 absmax + fp32 steps per 256 blocks
    assert nf4["bits/param"] == pytest.approx(4.5) and 4.0 < dq["bits/param"] < nf4["bits/param"]
    assert dq["ratio to fp32"] <= 0.3  # the goal, a measured byte count (not a timing)
    mm = bench.nf4_matmul_table(mm=(4, 128, 64), repeat=2)
    assert {"tinylearn cpp simd", "numpy dequant + matmul", "torch fp32", "tinygrad"} <= set(mm.impls())
    for row in mm.rows:
        assert (row.median_ms is not None and row.median_ms > 0 and row.gflops > 0) or row.note.startswith("n/a")


def test_lowrank_table() -> None:
    t = bench.lowrank_table(hidden=32, train_epochs=1, energies=(0.3, 0.99), repeat=2)
    assert t.impls() == ["dense", "energy 0.3", "energy 0.99"]
    rows = t.rows
    assert all(r.median_ms > 0 and r.extra["speed-up"] > 0 and 0 < r.extra["test acc"] <= 1 for r in rows)
    assert rows[1].extra["params"] < rows[0].extra["params"]  # energy 0.3 factorises and drops parameters
    assert rows[2].extra["params"] <= rows[0].extra["params"]


def test_distill_table() -> None:
    t = bench.distill_table(seeds=(0,), distill_epochs=2)
    assert t.impls() == ["teacher", "student alone", "student distilled"]
    for r in t.rows:
        assert 0.1 < r.extra["mean acc"] <= 1 and r.extra["mean nll"] > 0 and r.extra["seeds"] == 1
