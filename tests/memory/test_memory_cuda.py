"""cuda_src/memory_stream_ordered_alloc.cu: compiles to PTX (nvcc) here; runs only on a GPU (cudaMallocAsync pool),
as the ``cuda`` backend of op ``memory.stream_ordered_checksum`` (numpy reference over a host CachingAllocator)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinylearn.testing import cuda_available, nvcc_available, nvcc_compile_ptx

CU = Path(__file__).resolve().parents[2] / "cuda_src" / "memory_stream_ordered_alloc.cu"


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not found")
def test_stream_ordered_alloc_compiles_to_ptx(tmp_path: Path) -> None:
    ptx = nvcc_compile_ptx(CU, tmp_path).read_text()
    assert ".entry fill_iota" in ptx and ".entry scale_add" in ptx


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not found")
def test_cuda_backend_library_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuda backend's ``nvcc -shared`` build (NVRTC rejects the host driver) links here without a GPU."""
    from tinylearn.memory import stream_ordered

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lib = stream_ordered._library.__wrapped__()
    assert lib.tl_stream_ordered_demo.restype is not None
    assert list((tmp_path / "tinylearn" / "cuda").glob("memory_stream_ordered_alloc-*.so"))


def test_stream_ordered_checksum_reference() -> None:
    from tinylearn import memory

    for n, iters in ((1, 3), (1000, 5), (4097, 2), (7, 0)):
        assert memory.stream_ordered_checksum(n, iters, backend="numpy") == iters * n * (n - 1) / 2
    for bad, arg in (((0, 1), "n"), ((3, -1), "iters")):
        with pytest.raises(ValueError, match=arg):
            memory.stream_ordered_checksum(*bad)
    with pytest.raises(TypeError, match="n"):
        memory.stream_ordered_checksum(2.5, 1)


def test_stream_ordered_demo_is_the_cuda_backend() -> None:
    """Registered as cuda version ``mempool_async``; without a GPU, naming it is the registry's RuntimeError."""
    from tinylearn import backends, memory

    op = "memory.stream_ordered_checksum"
    assert backends.versions(op) == {"numpy": ["default"], "cuda": ["mempool_async"]}
    assert backends.resolve(op, args=(10, 2))[0] == "numpy" or cuda_available()
    if not cuda_available():
        with pytest.raises(RuntimeError, match="not available on this machine.*no CUDA device"):
            memory.stream_ordered_checksum(10, 2, backend="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available() or not nvcc_available(), reason="no CUDA device or no nvcc")
def test_stream_ordered_alloc_runs_on_gpu() -> None:
    from tinylearn import memory

    n, iters = 1000, 5
    assert memory.stream_ordered_checksum(n, iters, backend="cuda") == pytest.approx(iters * n * (n - 1) / 2, rel=1e-5)
