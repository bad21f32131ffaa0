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
