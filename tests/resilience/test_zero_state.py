"""zero_state: a ZeroOptimizer (stages 1, 2, 3) saved as Shards at N ranks and loaded at N' ranks equals the
consolidated ``state_dict()`` and the parameters bitwise, for every N, N' in {1, 2, 3, 4} (4 real processes); 16-bit
parameters keep their fp32 masters; a DDP model round-trips through its 1/N slices; bad input is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tinylearn.dist.launch import launch
from tinylearn.resilience import elastic_workers as ew
from tinylearn.resilience.atomic import CheckpointError
from tinylearn.resilience.sharded import read_manifest, save_sharded
from tinylearn.resilience.zero_state import DDPState, MultiState, ZeroState, ddp_shards, load_ddp_state


def test_zero_roundtrip_every_world_size(tmp_path: Path) -> None:
    res = launch(ew.zero_roundtrip_job, 4, str(tmp_path), timeout_s=60)[0]
    assert len(res) == 3 * 4 * 4
    assert [k for k, ok in res.items() if not ok] == []
    # each rank wrote only its own slice: a 3-rank checkpoint has 3 chunks per parameter, of ceil(numel/3)
    man = read_manifest(tmp_path / "s2_float32_n3")
    w = man["tensors"]["zero.param.0"]
    assert w["shape"] == [8 * 9] and [c["shape"] for c in w["chunks"]] == [[24], [24], [24]]
    assert isinstance(man["objects"]["zero.state.0.step"], list)  # Adam's step: replicated, an object


def test_zero_roundtrip_fp16_masters(tmp_path: Path) -> None:
    res = launch(ew.zero_roundtrip_job, 3, str(tmp_path), (1, 3), (2, 3), 2, "float16", timeout_s=60)[0]
    assert res and all(res.values()), res
    assert "zero.master.0" in read_manifest(tmp_path / "s1_float16_n2")["tensors"]


def _ddp(seed: int, dims: tuple[int, int] = (4, 3)) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Linear(*dims)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.randn(5, dims[0])).sum().backward()
    opt.step()
    return m, opt


def test_ddp_slices_reassemble(tmp_path: Path) -> None:
    m, opt = _ddp(0)
    for r in range(3):  # three ranks' slices, saved one after another in this process
        save_sharded(ddp_shards(m, opt, 3, r), tmp_path, rank=r, world_size=3, step=0)
    m2, opt2 = _ddp(1)
    load_ddp_state(m2, opt2, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters(), strict=True))
    sd, sd2 = opt.state_dict(), opt2.state_dict()
    for i in sd["state"]:
        for k, v in sd["state"][i].items():
            assert torch.equal(v, sd2["state"][i][k]) and v.dtype == sd2["state"][i][k].dtype, (i, k)
    assert sd["param_groups"] == sd2["param_groups"]


def test_another_model_is_named(tmp_path: Path) -> None:
    m, opt = _ddp(0)
    save_sharded(DDPState(m, opt).to_checkpoint(), tmp_path, step=0)
    m2, opt2 = _ddp(0, (5, 3))
    with pytest.raises(CheckpointError, match=r"ddp\.param\.0"):
        load_ddp_state(m2, opt2, tmp_path)
    with pytest.raises(CheckpointError, match="not in the checkpoint"):
        load_ddp_state(m, opt, tmp_path, prefix="other.")


def test_bad_input() -> None:
    m, opt = _ddp(0)
    with pytest.raises(TypeError, match="opt: expected a ZeroOptimizer"):
        ZeroState(opt)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        DDPState(opt, opt)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer: expected a torch.optim.Optimizer"):
        DDPState(m, m)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="produced twice"):
        MultiState(DDPState(m, opt), DDPState(m, opt)).to_checkpoint()


def test_world_too_small_for_zero3_is_named(tmp_path: Path) -> None:
    """ZeRO-3 saved at 2 ranks: each rank holds half the state. Resuming at 1 rank with a budget that holds a half
    but not the whole is a ValueError naming max_bytes_per_rank on every rank, before anything is read; at 2 ranks
    the same budget resumes."""
    launch(ew.memory_check_job, 2, str(tmp_path), 2, None, timeout_s=60)  # checkpoints at steps 0 and 1
    half = launch(ew.memory_check_job, 2, str(tmp_path), 2, None, timeout_s=60)
    needs = [r["need"] for r in half]
    assert needs[0] and needs[1] and all(r["error"] is None and r["resumed_from"] == 1 for r in half)
    budget = max(needs) + 8
    before = sorted(p.name for p in tmp_path.iterdir())
    one = launch(ew.memory_check_job, 1, str(tmp_path), 4, budget, timeout_s=60)[0]
    assert one["need"] > budget and one["need"] >= sum(needs) - 64, one  # the whole state (minus ceil padding)
    assert one["error"] is not None and "max_bytes_per_rank" in one["error"] and "world_size=1" in one["error"]
    assert f"needs {one['need']} bytes" in one["error"] and f"max_bytes_per_rank={budget}" in one["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing read into the model, nothing written
    two = launch(ew.memory_check_job, 2, str(tmp_path), 4, budget, timeout_s=60)
    assert all(r["error"] is None and r["resumed_from"] == 1 for r in two), two


def test_ddp_state_budget(tmp_path: Path) -> None:
    m, opt = _ddp(0)
    save_sharded(DDPState(m, opt).to_checkpoint(), tmp_path, step=0)
    need = DDPState(m, opt).bytes_needed(tmp_path)
    assert need == sum(p.numel() * 4 for p in m.parameters()) * 3  # params + Adam's two moments, fp32
    m2, opt2 = _ddp(1)
    w = m2.weight.detach().clone()
    with pytest.raises(ValueError, match=rf"max_bytes_per_rank: rank 0 of world_size=1 needs {need} bytes"):
        DDPState(m2, opt2, max_bytes_per_rank=need - 1).from_checkpoint(tmp_path)
    assert torch.equal(m2.weight, w)  # nothing installed
    DDPState(m2, opt2, max_bytes_per_rank=need).from_checkpoint(tmp_path)
    assert torch.equal(m2.weight, m.weight)
    with pytest.raises(ValueError, match="max_bytes_per_rank: expected an int >= 0 or None, got -1"):
        DDPState(m, opt, max_bytes_per_rank=-1)


def test_tensor_parallel_state_any_layout(tmp_path: Path) -> None:
    """TP shards saved by 2 ranks (q/k/v/fc1 row blocks, o/fc2 column blocks, replicated biases by rank 0) load into
    the dense model (TP 2 -> 1) bitwise equal to the unsharded reference; a dense checkpoint loads into TP 2
    (full -> row/column blocks) and gives the reference's output."""
    from tinylearn.resilience.parallel_state import TPState, load_tp_state, tp_shards
    from tinylearn.testing import assert_close

    out_tp = launch(ew.tp_save_job, 2, str(tmp_path / "tp2"), 0, timeout_s=60)[0]
    man = read_manifest(tmp_path / "tp2")
    q, o, ob = (man["tensors"][k] for k in ("attn.q.weight", "attn.o.weight", "attn.o.bias"))
    assert q["shape"] == [8, 8] and [c["offsets"] for c in q["chunks"]] == [[0, 0], [4, 0]]  # rows: axis 0
    assert o["shape"] == [8, 8] and [c["offsets"] for c in o["chunks"]] == [[0, 0], [0, 4]]  # columns: axis 1
    assert not ob["sharded"] and len(ob["chunks"]) == 1  # the row layer's bias is replicated: rank 0 wrote it
    axes = man["objects"]
    assert axes["split_axis.attn.q.weight"] == 0 and axes["split_axis.mlp.fc2.weight"] == 1
    assert axes["split_axis.mlp.fc2.bias"] is None

    ref = ew.DenseBlock(0)
    dense = ew.DenseBlock(1)  # another init: the load overwrites every parameter
    load_tp_state(dense, tmp_path / "tp2")
    for (k, a), b in zip(ref.state_dict().items(), dense.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    with torch.no_grad():
        want = ref(ew.block_input())
    assert_close(out_tp, want, "float32")
    assert TPState(dense).bytes_needed(tmp_path / "tp2") == sum(p.numel() * 4 for p in ref.parameters())

    save_sharded(tp_shards(ref), tmp_path / "dense", step=0)  # a dense checkpoint: whole tensors
    got = launch(ew.tp_load_job, 2, str(tmp_path / "dense"), 1, timeout_s=60)
    for r, res in enumerate(got):
        assert_close(res["out"], want, "float32")
        p = res["params"]
        assert torch.equal(p["attn.q.weight"], ref.attn.q.weight[4 * r : 4 * r + 4])  # row block of rank r
        assert torch.equal(p["mlp.fc2.weight"], ref.mlp.fc2.weight[:, 8 * r : 8 * r + 8])  # column block
        assert torch.equal(p["mlp.fc2.bias"], ref.mlp.fc2.bias)


def test_tensor_parallel_state_bad_checkpoint(tmp_path: Path) -> None:
    from tinylearn.resilience.parallel_state import load_tp_state, tp_shards

    save_sharded(tp_shards(ew.DenseBlock(0)), tmp_path / "a", step=0)
    with pytest.raises(CheckpointError, match=r"'attn.q.weight'.*global shape \(8, 8\).*\(16, 16\)"):
        load_tp_state(ew.DenseBlock(0, embed=16, ffn=32), tmp_path / "a")
    with pytest.raises(CheckpointError, match="'x.attn.q.weight': not in the checkpoint"):
        load_tp_state(ew.DenseBlock(0), tmp_path / "a", prefix="x.")


def test_pipeline_stages_any_split(tmp_path: Path) -> None:
    """A 7-layer Sequential saved by 2 stages ([0, 4), [4, 7), each its own layers under global indices) loads
    into 1 stage and into 3 stages ([0, 2), [2, 5), [5, 7)) bitwise; the layout is in the keys."""
    from tinylearn.resilience.parallel_state import PipelineStageState, load_pp_state

    def model(seed: int) -> torch.nn.Sequential:
        torch.manual_seed(seed)
        layers: list[torch.nn.Module] = []
        for i in range(4):
            layers.append(torch.nn.Linear(6 + i, 7 + i))
            if i < 3:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)

    ref = model(0)
    for r, (lo, hi) in enumerate([(0, 4), (4, 7)]):
        save_sharded(PipelineStageState(ref[lo:hi], lo).to_checkpoint(), tmp_path, rank=r, world_size=2, step=0)
    man = read_manifest(tmp_path)
    assert set(man["tensors"]) == {f"{i}.{w}" for i in (0, 2, 4, 6) for w in ("weight", "bias")}
    assert [c["file"] for c in man["tensors"]["4.weight"]["chunks"]] == ["rank00001.bin"]  # stage 1 wrote it

    whole = model(1)
    load_pp_state(whole, tmp_path, 0)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), whole.parameters(), strict=True))
    x = torch.randn(3, 6)
    for lo, hi in [(0, 2), (2, 5), (5, 7)]:
        stage = model(2)[lo:hi]
        st = PipelineStageState(stage, lo)
        assert st.bytes_needed(tmp_path) == sum(p.numel() * 4 for p in ref[lo:hi].parameters())
        st.from_checkpoint(tmp_path)
        with torch.no_grad():
            assert torch.equal(stage(x if lo == 0 else ref[:lo](x)), ref[:hi](x))
    with pytest.raises(CheckpointError, match="'5.weight': not in the checkpoint"):
        load_pp_state(model(0)[4:7], tmp_path, 5)  # a wrong offset
    with pytest.raises(ValueError, match="first_layer: expected an int >= 0"):
        PipelineStageState(ref, -1)
