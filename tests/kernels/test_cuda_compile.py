"""Every cuda_src/*.cu compiles to PTX with ``nvcc -ptx -arch=sm_80`` (skipped with a reason without nvcc)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinylearn.testing import nvcc_available, nvcc_compile_ptx

CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"
SOURCES = sorted(CUDA_SRC.glob("*.cu"))


def test_sources_exist() -> None:
    assert (CUDA_SRC / "vector_reduce.cu") in SOURCES


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not found on PATH")
@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_compiles_to_ptx(source: Path, tmp_path: Path) -> None:
    ptx = nvcc_compile_ptx(source, tmp_path, arch="sm_80")
    text = ptx.read_text()
    assert ".entry" in text  # at least one extern "C" __global__ kernel


def test_shared_device_helpers_live_only_in_common_cuh() -> None:
    """cuda_src/common.cuh holds the warp reductions; no .cu file defines its own copy of one (they include it)."""
    import re

    helpers = re.findall(r"__device__ __forceinline__ \w+ (\w+)\(", (CUDA_SRC / "common.cuh").read_text())
    assert {"warp_allreduce_sum", "warp_reduce_sum"} <= set(helpers)
    for src in SOURCES:
        text = src.read_text()
        copies = [h for h in helpers if re.search(rf"__device__[^;{{]*\b{h}\s*\(", text)]
        assert not copies, f"{src.name} redefines {copies} from common.cuh"
        if any(re.search(rf"\b{h}\s*\(", text) for h in helpers):
            assert '#include "common.cuh"' in text, src.name
