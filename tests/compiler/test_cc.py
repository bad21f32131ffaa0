"""cc: compiling, the disk and in-process caches, concurrent builds (threads and processes compile once), the
unwritable-cache fallback, compiler errors, and TINYLEARN_CPU_FEATURES really choosing the instruction set."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from codegen_cases import inputs_for, softmax

from tinylearn.compiler import cc, codegen_cpp
from tinylearn.compiler.kernel_ir import evaluate


def scale_source(factor: float = 2.0) -> str:
    """A tiny unique translation unit (a fresh uuid: never in any cache yet)."""
    return (
        f"// {uuid.uuid4()}\n#include <cstdint>\n"
        f'extern "C" void scale(const float* x, float* y, int64_t n) {{ for (int64_t i = 0; i < n; ++i) '
        f"y[i] = {factor}f * x[i]; }}\n"
    )


def call_scale(lib: ctypes.CDLL) -> np.ndarray:
    x = np.arange(5, dtype=np.float32)
    y = np.empty_like(x)
    lib.scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.scale(x.ctypes.data, y.ctypes.data, 5)
    return y


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_second_load_is_an_in_process_cache_hit(fresh_cache):
    src = scale_source()
    before = dict(cc.stats)
    lib = cc.load(src, "scale")
    assert cc.stats["compiles"] == before["compiles"] + 1
    t0 = time.perf_counter()
    again = cc.load(src, "scale")
    elapsed = time.perf_counter() - t0
    assert again is lib and cc.stats["memory_hits"] == before["memory_hits"] + 1
    assert elapsed < 5e-3, f"a cache hit took {elapsed * 1e3:.2f} ms"  # functional check: a hash, not a compile
    np.testing.assert_array_equal(call_scale(again), 2 * np.arange(5, dtype=np.float32))
    assert [p.suffix for p in fresh_cache.glob("scale-*")] == [".so"]  # no temporary left behind


def test_disk_cache_survives_the_process_cache(fresh_cache):
    src = scale_source(3.0)
    cc.load(src, "scale")
    cc.clear_memory_cache()
    compiles, disk = cc.stats["compiles"], cc.stats["disk_hits"]
    lib = cc.load(src, "scale")
    assert cc.stats["compiles"] == compiles and cc.stats["disk_hits"] == disk + 1
    np.testing.assert_array_equal(call_scale(lib), 3 * np.arange(5, dtype=np.float32))


def test_key_depends_on_source_flags_and_compiler():
    cxx = cc.compiler()
    base = cc.cache_key("a", cxx, cc.flags("scalar"))
    assert base != cc.cache_key("b", cxx, cc.flags("scalar"))
    assert base != cc.cache_key("a", cxx, cc.flags("avx2"))
    assert cc.compiler_version(cxx) in subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout


def test_two_threads_building_the_same_kernel_compile_once(fresh_cache):
    src = scale_source(4.0)
    barrier, libs, errors = threading.Barrier(2), [], []

    def work():
        try:
            barrier.wait()
            libs.append(cc.load(src, "scale"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    before = cc.stats["compiles"]
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(libs) == 2
    assert cc.stats["compiles"] == before + 1  # the second thread waited on the file lock, then found the .so
    for lib in libs:
        np.testing.assert_array_equal(call_scale(lib), 4 * np.arange(5, dtype=np.float32))


def test_two_processes_building_the_same_kernel_compile_once(fresh_cache):
    src = scale_source(5.0)
    code = (
        "import sys; from tinylearn.compiler import cc; cc.load(sys.stdin.read(), 'scale'); print(cc.stats['compiles'])"
    )
    env = {"TINYLEARN_CACHE_DIR": str(fresh_cache), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(src, timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(int(o) for o in outs) == [0, 1]
    assert len(list(fresh_cache.glob("scale-*.so"))) == 1


def test_unwritable_cache_dir_falls_back_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad = blocker / "sub"  # cannot be created, even by root
    monkeypatch.setenv("TINYLEARN_CACHE_DIR", str(bad))
    with pytest.warns(UserWarning, match=f"cache dir {bad} is not writable.*compiled kernels go to"):
        lib = cc.load(scale_source(6.0), "scale")
    np.testing.assert_array_equal(call_scale(lib), 6 * np.arange(5, dtype=np.float32))


def test_compile_error_names_compiler_command_and_stderr(fresh_cache):
    bad = '#include <cstdint>\nextern "C" void broken(int64_t n) { return n +; }\n'
    with pytest.raises(RuntimeError) as info:
        cc.load(bad, "broken")
    msg = str(info.value)
    assert f"C++ compiler {cc.compiler()!r} failed on kernel 'broken'" in msg
    assert "command: " in msg and "-fopenmp -shared -fPIC -o" in msg and "error" in msg
    assert not list(fresh_cache.glob("*.cpp")) and not list(fresh_cache.glob("*.tmp"))


def test_missing_compiler_names_it(fresh_cache, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++-42")
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler '/nonexistent/g\\+\\+-42' cannot run"):
        cc.load(scale_source(), "scale")


def test_flags_follow_tinylearn_cpu_features(monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    scalar = cc.flags()
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx2")
    avx2 = cc.flags()
    monkeypatch.delenv("TINYLEARN_CPU_FEATURES")
    native = cc.flags()
    for f in (scalar, avx2, native):
        assert f[0] == "-O3" and f[-3:] == ["-fopenmp", "-shared", "-fPIC"] and "-ffast-math" not in f
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx9000")
    with pytest.raises(ValueError, match="TINYLEARN_CPU_FEATURES: unknown value 'avx9000'"):
        cc.flags()
    if cc.platform.machine().lower() in ("x86_64", "amd64"):
        assert scalar == [
            "-O3",
            "-march=x86-64",
            "-fno-math-errno",
            "-fno-trapping-math",
            "-fopenmp",
            "-shared",
            "-fPIC",
        ]
        assert "-mavx2" in avx2 and "-mfma" in avx2 and "-march=native" in native


@pytest.mark.skipif(cc.platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 instruction sets")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump not found on PATH")
@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_forced_level_compiles_that_instruction_set(level, fresh_cache, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    k = softmax(3, 64)
    ck = codegen_cpp.build(k)
    xs = inputs_for(k)
    np.testing.assert_allclose(ck(*xs)[0], evaluate(k, xs)[0], rtol=1e-5, atol=1e-5)
    (lib,) = fresh_cache.glob("tl_softmax-*.so")
    asm = subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True).stdout
    assert ("%ymm" in asm) == (level == "avx2"), (
        f"{level}: 256-bit registers {'missing' if level == 'avx2' else 'used'}"
    )
