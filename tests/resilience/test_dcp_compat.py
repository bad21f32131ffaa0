"""tinylearn checkpoints <-> torch.distributed.checkpoint (DCP), single process, bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tinylearn.resilience import storage_workers as sw
from tinylearn.resilience.dcp_compat import from_dcp, to_dcp
from tinylearn.resilience.sharded import load_sharded, save_sharded

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_state_saved_by_dcp_reads_equal(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    sd = {
        "model": {"w": torch.randn(5, 4, generator=g), "b": torch.arange(4, dtype=torch.int32)},
        "opt": {"m": torch.randn(7, dtype=torch.float64, generator=g), "h": torch.randn(3, generator=g).half()},
        "mask": torch.tensor([True, False]),
        "step": 11,
        "names": ["a", "b"],
    }
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    got = from_dcp(tmp_path)
    assert sorted(got) == ["mask", "model.b", "model.w", "names", "opt.h", "opt.m", "step"]
    for k, t in [
        ("model.w", sd["model"]["w"]),
        ("model.b", sd["model"]["b"]),
        ("opt.m", sd["opt"]["m"]),
        ("opt.h", sd["opt"]["h"]),
        ("mask", sd["mask"]),
    ]:
        assert got[k].dtype == t.numpy().dtype and got[k].tobytes() == t.numpy().tobytes(), k
    assert got["step"] == 11 and got["names"] == ["a", "b"]
    # and into a tinylearn checkpoint, whole
    save_sharded(got, tmp_path / "tl")
    back = load_sharded(tmp_path / "tl")
    assert back["model.w"].tobytes() == sd["model"]["w"].numpy().tobytes()


def test_to_dcp_loads_with_dcp_load(tmp_path: Path) -> None:
    d = tmp_path / "tl"
    for r in range(3):  # a 3-rank sharded checkpoint: to_dcp merges the chunks
        save_sharded(sw.rank_state(r, 3), d, rank=r, world_size=3, step=1)
    to_dcp(d, tmp_path / "dcp")
    g = sw.global_state()
    tgt = {  # nested, as a torch user would hold it: DCP flattens to the same dotted keys
        "opt": {"flat": torch.zeros(sw.FLAT_NUMEL)},
        "tp": {"row": torch.zeros(sw.ROW_SHAPE), "col": torch.zeros(sw.COL_SHAPE, dtype=torch.float64)},
        "norm": {"weight": torch.zeros(7)},
        "emb": torch.zeros(5, 3, dtype=torch.int64),
        "step": 0,
        "lr": 0.0,
    }
    dcp.load(tgt, storage_reader=dcp.FileSystemReader(str(tmp_path / "dcp")), no_dist=True)
    pairs = [
        (tgt["opt"]["flat"], "opt.flat"),
        (tgt["tp"]["row"], "tp.row"),
        (tgt["tp"]["col"], "tp.col"),
        (tgt["norm"]["weight"], "norm.weight"),
        (tgt["emb"], "emb"),
    ]
    for t, k in pairs:
        assert t.numpy().tobytes() == g[k].tobytes(), k
    assert tgt["step"] == 7 and tgt["lr"] == 0.125
    assert from_dcp(tmp_path / "dcp")["tp.col"].tobytes() == g["tp.col"].tobytes()  # round trip


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"dcp_dir: no DCP \.metadata file"):
        from_dcp(tmp_path)
    dcp.save(
        {"x": torch.ones(2, dtype=torch.bfloat16)}, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True
    )
    with pytest.raises(TypeError, match=r"'x': bfloat16"):
        from_dcp(tmp_path)


def test_bench_save_load_rows() -> None:
    from tinylearn.resilience.bench_storage import bench_save_load

    tb = bench_save_load([1 << 16], repeat=1)
    assert tb.cases() == ["save 0.0625 MiB", "load 0.0625 MiB"]
    saves = [r for r in tb.rows if r.case.startswith("save")]
    impls = ["torch.save", "tinylearn", "tinylearn (no fsync)", "torch DCP", "tinygrad safe_save"]
    assert [r.impl for r in saves] == impls
    ran = [r for r in tb.rows if not r.note.startswith("n/a")]  # tinygrad's rows say why when it cannot run here
    assert all(r.median_ms is not None and r.median_ms > 0 for r in ran), [r.note for r in tb.rows]
    assert all(r.extra["bytes_on_disk"] >= 1 << 16 for r in saves if r in ran)
    with pytest.raises(ValueError, match=r"nbytes_list: .* got 134217728"):
        bench_save_load([128 << 20])
