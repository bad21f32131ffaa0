"""save_sharded / load_sharded: 4 real ranks save, 2 ranks and 1 process load (resharding), bitwise; single-process
resharding 4 -> 3 -> 2 with uneven ceil splits; async saves; every bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.parallel.zero_sharding import shard_bounds
from tinylearn.resilience import storage_workers as sw
from tinylearn.resilience.atomic import CheckpointError, CorruptCheckpoint, IncompleteCheckpoint
from tinylearn.resilience.manifest import fingerprint
from tinylearn.resilience.sharded import (
    Shard,
    latest_checkpoint,
    list_checkpoints,
    load_sharded,
    read_manifest,
    save_sharded,
    step_dir,
    unflatten,
)


def _save_single(d: Path, world: int, seed: int = 0, **kw: object) -> None:
    for r in range(world):
        save_sharded(sw.rank_state(r, world, seed), d, rank=r, world_size=world, step=1, **kw)


def _check_whole(got: dict, g: dict) -> None:
    for k, v in g.items():
        if isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes(), k
        else:
            assert got[k] == v, k


def test_four_ranks_save_two_ranks_and_one_load(tmp_path: Path) -> None:
    d = step_dir(tmp_path, 1)
    da = step_dir(tmp_path / "async", 1)
    both = tl.dist.launch(sw.save_and_reshard, 4, str(d), 2, 0, str(da), timeout_s=60)  # 4 save, 2 reload
    res = [b["saved"] for b in both]
    assert [r["committed"] for r in res] == [True] * 4 and len({r["fingerprint"] for r in res}) == 1
    assert [b.get("sub_world") for b in both] == [2, 2, None, None] and both[1]["sub_rank"] == 1
    man = read_manifest(d)
    assert man["world_size"] == 4 and man["meta"] == {"saved_by": 4}
    assert len(man["tensors"]["opt.flat"]["chunks"]) == 4
    assert len(man["tensors"]["norm.weight"]["chunks"]) == 1  # replicated: saved by 4 ranks, kept once
    assert man["tensors"]["emb"]["sharded"] is False
    g = sw.global_state()
    for r, got in enumerate(b["loaded"] for b in both[:2]):
        lo, hi = shard_bounds(sw.FLAT_NUMEL, 2, r)
        assert got["opt.flat"][1] == (lo,) and got["opt.flat"][0].tobytes() == g["opt.flat"][lo:hi].tobytes()
        rlo, rhi = shard_bounds(sw.ROW_SHAPE[0], 2, r)
        assert got["tp.row"][0].tobytes() == np.ascontiguousarray(g["tp.row"][rlo:rhi]).tobytes()
        (_, c0), (_, nc) = sw.col_box(sw.COL_SHAPE[1], 2, r, sw.COL_SHAPE[0])
        assert got["tp.col"][1] == (0, c0)
        assert got["tp.col"][0].tobytes() == np.ascontiguousarray(g["tp.col"][:, c0 : c0 + nc]).tobytes()
        nlo, nhi = shard_bounds(7, 2, r)
        assert got["norm.weight"][0].tobytes() == g["norm.weight"][nlo:nhi].tobytes()
        assert got["emb"].tobytes() == g["emb"].tobytes() and got["step"] == 7 and got["lr"] == 0.125
    _check_whole(load_sharded(d), g)  # one process: whole tensors
    assert [r["async_committed"] for r in res] == [True, False, False, False]  # rank 0 commits
    _check_whole(load_sharded(da), g)


def test_single_process_reshard_4_3_2_uneven(tmp_path: Path) -> None:
    g = sw.global_state(seed=3)
    d4 = tmp_path / "w4"
    _save_single(d4, 4, seed=3)
    src = d4
    for n in (3, 2):
        dn = tmp_path / f"w{n}"
        for r in range(n):
            t = {"tp.col": sw.col_box(sw.COL_SHAPE[1], n, r, sw.COL_SHAPE[0])}
            got = load_sharded(src, world_size=n, rank=r, template=t)
            lo, hi = shard_bounds(sw.FLAT_NUMEL, n, r)
            assert got["opt.flat"].data.tobytes() == g["opt.flat"][lo:hi].tobytes()
            assert got["opt.flat"].offsets == (lo,) and got["opt.flat"].global_shape == (sw.FLAT_NUMEL,)
            (_, c0), (_, nc) = t["tp.col"]
            assert got["tp.col"].data.tobytes() == np.ascontiguousarray(g["tp.col"][:, c0 : c0 + nc]).tobytes()
            save_sharded(unflatten(got), dn, rank=r, world_size=n, step=1)  # re-save under the new layout
        man = read_manifest(dn)
        assert man["world_size"] == n and len(man["tensors"]["opt.flat"]["chunks"]) == n
        assert man["fingerprint"] == read_manifest(d4)["fingerprint"]
        _check_whole(load_sharded(dn), g)
        src = dn
    # ceil splits are uneven: 1001 over 3 ranks = 334, 334, 333
    assert [shard_bounds(sw.FLAT_NUMEL, 3, r) for r in range(3)] == [(0, 334), (334, 668), (668, 1001)]


def test_layout_is_aligned_and_listed(tmp_path: Path) -> None:
    d = step_dir(tmp_path, 1)
    _save_single(d, 2)
    man = read_manifest(d)
    offsets = [c["offset"] for t in man["tensors"].values() for c in t["chunks"]]
    assert all(o % 64 == 0 for o in offsets)
    assert sorted(p.name for p in d.iterdir()) == [
        "manifest.json",
        "rank00000.bin",
        "rank00000.json",
        "rank00001.bin",
        "rank00001.json",
    ]
    assert man["fingerprint"] == fingerprint(man["tensors"])
    assert latest_checkpoint(tmp_path) == d and list_checkpoints(tmp_path) == [(1, d, "ok")]


def test_inputs_torch_tl_nested_and_async(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    state = {
        "torch": torch.arange(6, dtype=torch.float64).reshape(2, 3).t(),  # non-contiguous
        "tl": tl.Tensor(a),
        "m": {"n": {"x": np.float16([1.5, 2.5])}},
        "scalar0d": np.array(3.0),
        "objs": [1, "a", None, 2.5],
    }
    h = save_sharded(state, tmp_path / "a", async_=True, step=5)
    assert h.stall_s >= 0
    man = h.wait(timeout=30)
    assert h.done() and man.committed and man.step == 5
    got = load_sharded(tmp_path / "a")
    assert got["torch"].tobytes() == state["torch"].contiguous().numpy().tobytes()
    assert got["tl"].tobytes() == a.tobytes() and got["m.n.x"].dtype == np.float16
    assert got["scalar0d"].shape == () and got["scalar0d"] == 3.0 and got["objs"] == [1, "a", None, 2.5]
    assert unflatten(got)["m"]["n"]["x"].tolist() == [1.5, 2.5]


def test_corrupt_byte_names_file_and_key(tmp_path: Path) -> None:
    d = tmp_path / "c"
    _save_single(d, 2)
    man = read_manifest(d)
    c = man["tensors"]["tp.row"]["chunks"][1]
    p = d / c["file"]
    b = bytearray(p.read_bytes())
    b[c["offset"] + 5] ^= 0x10
    p.write_bytes(bytes(b))
    with pytest.raises(CorruptCheckpoint, match=r"rank00001\.bin.*'tp\.row'.*crc32"):
        load_sharded(d)
    load_sharded(d, verify=False)  # the check is what caught it
    (d / "rank00001.bin").unlink()
    with pytest.raises(CorruptCheckpoint, match=r"rank00001\.bin: missing rank file"):
        load_sharded(d)


def test_missing_rank_file_listed(tmp_path: Path) -> None:
    d = step_dir(tmp_path, 3)
    _save_single(d, 2)
    (d / "rank00001.bin").unlink()
    assert list_checkpoints(tmp_path) == [(3, d, "missing rank file rank00001.bin")]
    assert latest_checkpoint(tmp_path) is None


def test_manifest_of_another_model(tmp_path: Path) -> None:
    d = tmp_path / "m"
    _save_single(d, 2)
    with pytest.raises(CheckpointError, match=r"'tp\.row'.*\(10, 6\).*\(10, 5\).*another model"):
        load_sharded(d, template={"tp.row": np.zeros((10, 5), np.float32)})
    with pytest.raises(CheckpointError, match=r"'tp\.row'.*float32.*float64"):
        load_sharded(d, template={"tp.row": np.zeros((10, 6))})
    with pytest.raises(CheckpointError, match=r"'head\.w' is not in the checkpoint"):
        load_sharded(d, template={"head.w": np.zeros(3)})
    with pytest.raises(CheckpointError, match=r"template\['tp\.row'\].*\(0, 0\).*\(11, 6\).*\(10, 6\)"):
        load_sharded(d, world_size=2, rank=0, template={"tp.row": ((0, 0), (11, 6))})


def test_no_manifest_is_incomplete(tmp_path: Path) -> None:
    d = step_dir(tmp_path, 2)
    save_sharded(sw.rank_state(0, 2), d, rank=0, world_size=2, step=2)  # rank 1 never wrote: no commit
    with pytest.raises(IncompleteCheckpoint, match="no manifest.json"):
        load_sharded(d)
    assert list_checkpoints(tmp_path)[0][2].endswith("(the save was not committed: a writer died or is still writing)")
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(CorruptCheckpoint, match="manifest does not parse"):
        load_sharded(d)
    (d / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CorruptCheckpoint, match="not a tinylearn-sharded manifest"):
        read_manifest(d)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"world_size": 0}, r"world_size: expected an int >= 1, got 0"),
        ({"world_size": 2, "rank": 2}, r"rank: expected an int in \[0, world_size=2\), got 2"),
        ({"world_size": 2, "rank": -1}, r"rank: .* got -1"),
        ({"world_size": 2.0}, r"world_size: .* got 2\.0"),
    ],
)
def test_bad_rank_world_size(tmp_path: Path, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        save_sharded({"a": np.zeros(2)}, tmp_path, **kw)
    _save_single(tmp_path / "ok", 1)
    with pytest.raises(ValueError, match=match):
        load_sharded(tmp_path / "ok", **kw)


def test_bad_state_values(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"state\['opt\.fn'\]: unsupported type function"):
        save_sharded({"opt": {"fn": lambda: 0}}, tmp_path)
    with pytest.raises(TypeError, match=r"state\['s'\]: unsupported type set"):
        save_sharded({"s": {1, 2}}, tmp_path)
    with pytest.raises(TypeError, match=r"state\['u'\]: dtype <U1"):
        save_sharded({"u": np.array(["a"])}, tmp_path)
    with pytest.raises(ValueError, match=r"data\.shape \(3,\) at offsets \(2,\) does not fit global_shape \(4,\)"):
        Shard(np.zeros(3), (2,), (4,))
    with pytest.raises(ValueError, match=r"offsets: expected a tuple of non-negative ints, got \(-1,\)"):
        Shard(np.zeros(3), (-1,), (4,))
    # two ranks claiming different data for overlapping boxes: refused at commit
    save_sharded({"w": Shard(np.zeros(3), (0,), (4,))}, tmp_path / "o", rank=0, world_size=2)
    with pytest.raises(CheckpointError, match=r"'w': chunks overlap"):
        save_sharded({"w": Shard(np.zeros(3), (1,), (4,))}, tmp_path / "o", rank=1, world_size=2)


def test_memory_budget(tmp_path: Path) -> None:
    _save_single(tmp_path, 4)
    whole = sum(v.nbytes for v in sw.global_state().values() if isinstance(v, np.ndarray))
    got = load_sharded(tmp_path, world_size=2, rank=0, max_bytes_per_rank=whole)
    assert got["opt.flat"].data.size == 501
    with pytest.raises(ValueError, match=r"rank 0 of world_size=1 needs \d+ bytes.*max_bytes_per_rank=1000"):
        load_sharded(tmp_path, world_size=1, rank=0, max_bytes_per_rank=1000)
