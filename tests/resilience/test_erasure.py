"""Reed–Solomon over GF(2^8) (tinylearn.resilience.erasure) and the C++ region kernel (resilience.gf256_matmul)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tinylearn import backends
from tinylearn.dist.parity import gf256_mul
from tinylearn.resilience import erasure as ec

needs_c = pytest.mark.skipif(not backends.C_available("resilience"), reason="tinylearn._C.resilience not built")


def _mul_slow(a: int, b: int) -> int:
    """Carry-less multiply then reduce by 0x11d (independent of the log/exp tables)."""
    p = 0
    for i in range(8):
        if b >> i & 1:
            p ^= a << i
    for i in range(15, 7, -1):
        if p >> i & 1:
            p ^= 0x11D << (i - 8)
    return p


def test_field_tables_match_carryless_multiply() -> None:
    t = ec._mul_table()
    rng = np.random.default_rng(0)
    for a, b in rng.integers(0, 256, (400, 2)):
        assert t[a, b] == _mul_slow(int(a), int(b))
    assert (t[1] == np.arange(256)).all() and (t[0] == 0).all()
    for a in range(1, 256):
        assert ec.gf_mul(a, ec.gf_inv(a)) == 1
    # the same field as notebook 06's parity code
    x = rng.integers(0, 256, 300, dtype=np.uint8)
    for c in (0, 1, 2, 29, 255):
        assert np.array_equal(ec.gf_mul(c, x), gf256_mul(x, c))
    with pytest.raises(ValueError, match="0 has no inverse"):
        ec.gf_inv(0)


def test_matrix_inverse_gauss_jordan() -> None:
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 12):
        p = ec.cauchy_parity_matrix(n, n)  # Cauchy: every square matrix of it is invertible
        inv = ec.gf_mat_inv(p)
        assert np.array_equal(ec.gf_mat_mul(p, inv), np.eye(n, dtype=np.uint8))
        assert np.array_equal(ec.gf_mat_mul(inv, p), np.eye(n, dtype=np.uint8))
    m = rng.integers(0, 256, (4, 4), dtype=np.uint8)
    m[3] = m[0] ^ m[1]  # dependent row (sum = XOR)
    with pytest.raises(ValueError, match="singular"):
        ec.gf_mat_inv(m)
    with pytest.raises(ValueError, match="square"):
        ec.gf_mat_inv(np.zeros((2, 3), np.uint8))


def test_parity_matrix_first_row_ones_and_mds() -> None:
    k, r = 6, 3
    p = ec.cauchy_parity_matrix(k, r)
    assert p.shape == (r, k) and (p[0] == 1).all() and (p != 0).all()
    gen = np.concatenate([np.eye(k, dtype=np.uint8), p])
    for rows in itertools.combinations(range(k + r), k):  # every k-subset of the generator is invertible: MDS
        ec.gf_mat_inv(gen[list(rows)])
    with pytest.raises(ValueError, match="k \\+ r must be <= 256"):
        ec.cauchy_parity_matrix(250, 7)


def test_r1_is_xor_parity() -> None:
    rng = np.random.default_rng(2)
    data = [rng.integers(0, 256, 333, dtype=np.uint8) for _ in range(5)]
    (p,) = ec.encode(data, 1)
    assert np.array_equal(p, np.bitwise_xor.reduce(np.stack(data)))
    # and parity 0 of any r is the XOR too
    assert np.array_equal(ec.encode(data, 3)[0], p)


def _check_all_patterns(k: int, r: int, length: int, seed: int, backend: str | None = None) -> None:
    rng = np.random.default_rng(seed)
    data = [rng.integers(0, 256, length, dtype=np.uint8) for _ in range(k)]
    parity = ec.encode(data, r, backend=backend)
    shards = [*data, *parity]
    for n_lost in range(r + 1):
        for lost in itertools.combinations(range(k + r), n_lost):
            got = [None if i in lost else s for i, s in enumerate(shards)]
            full = ec.rebuild(got, k, r, backend=backend)
            for a, b in zip(full, shards, strict=True):
                assert np.array_equal(a, b), (k, r, lost)


@pytest.mark.parametrize(("k", "r"), [(1, 1), (2, 1), (3, 2), (4, 3), (5, 2), (2, 4)])
def test_every_loss_pattern_small(k: int, r: int) -> None:
    _check_all_patterns(k, r, 37, seed=k * 10 + r, backend="numpy")


@needs_c
def test_every_loss_pattern_cpp() -> None:
    _check_all_patterns(6, 3, 131, seed=7, backend="cpp")


def test_random_loss_patterns_larger() -> None:
    rng = np.random.default_rng(3)
    for k, r in ((10, 4), (20, 6), (200, 56)):
        data = [rng.integers(0, 256, 97, dtype=np.uint8) for _ in range(k)]
        shards = [*data, *ec.encode(data, r)]
        for _ in range(4):
            lost = set(rng.choice(k + r, size=r, replace=False).tolist())
            got = ec.decode([None if i in lost else s for i, s in enumerate(shards)], k, r)
            assert all(np.array_equal(a, b) for a, b in zip(got, data, strict=True)), (k, r, lost)


def test_unequal_lengths_padded_and_trimmed() -> None:
    data = [b"abc", b"defgh", b"", b"ij"]
    parity = ec.encode(data, 2)
    assert [p.size for p in parity] == [5, 5]
    lengths = [len(d) for d in data]
    got = ec.decode([None, data[1], data[2], None, *parity], 4, 2, lengths=lengths)
    assert [g.tobytes() for g in got] == data
    full = ec.rebuild([data[0], None, data[2], data[3], None, parity[1]], 4, 2, lengths=lengths)
    assert full[1].tobytes() == b"defgh" and np.array_equal(full[4], parity[0])


def test_too_many_losses_and_bad_input() -> None:
    data = [bytes([i]) * 8 for i in range(4)]
    shards = [*data, *ec.encode(data, 2)]
    with pytest.raises(ValueError, match="3 shards lost .* r = 2"):
        ec.decode([None, None, None, *shards[3:]], 4, 2)
    with pytest.raises(ValueError, match="expected k \\+ r = 6"):
        ec.decode(shards[:5], 4, 2)
    with pytest.raises(ValueError, match="uint8"):
        ec.encode([np.zeros(4, np.float32)], 1)
    with pytest.raises(ValueError, match="list of k shards"):
        ec.encode(b"abc", 1)
    with pytest.raises(ValueError, match="lengths"):
        ec.decode(shards, 4, 2, lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="r: expected an int >= 0"):
        ec.encode(data, -1)


# ------------------------------------------------------------------------------------------ the C++ kernel
def _ref(c: np.ndarray, srcs: list[np.ndarray]) -> np.ndarray:
    return ec.gf256_matmul(c, srcs, backend="numpy")


def _paths() -> list[str]:
    c = backends.load_C("resilience")
    out = ["scalar", "simd"]
    for v in ("avx2", "avx512"):
        try:
            c.gf256_path(v)
            out.append(v)
        except ValueError:
            pass
    return out


@needs_c
@pytest.mark.parametrize("length", [0, 1, 31, 32, 63, 64, 65, 200, 4097, 70_001])
def test_cpp_versions_bit_exact(length: int) -> None:
    c = backends.load_C("resilience")
    rng = np.random.default_rng(length)
    coeffs = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    coeffs[0, 0], coeffs[1, 1], coeffs[2, 2] = 0, 1, 0  # the skip and XOR-only fast paths
    srcs = [rng.integers(0, 256, length, dtype=np.uint8) for _ in range(5)]
    ref = _ref(coeffs, srcs)
    for v in _paths():
        assert np.array_equal(c.gf256_matmul(coeffs, srcs, v), ref), v
    for v in ("simd", "scalar"):
        assert np.array_equal(ec.gf256_matmul(coeffs, srcs, backend="cpp", version=v), ref), v


@needs_c
def test_cpp_misaligned_views_and_mul_add() -> None:
    c = backends.load_C("resilience")
    rng = np.random.default_rng(5)
    buf = rng.integers(0, 256, 10_000, dtype=np.uint8)
    srcs = [buf[1:1001], buf[3003:4003], buf[7:1007]]  # views at odd offsets (unaligned loads)
    strided = buf[::3][:1000]  # non-contiguous: copied by the binding
    coeffs = rng.integers(2, 256, (2, 4), dtype=np.uint8)
    ref = _ref(coeffs, [*srcs, np.ascontiguousarray(strided)])
    for v in _paths():
        assert np.array_equal(c.gf256_matmul(coeffs, [*srcs, strided], v), ref), v
        out = np.zeros(1003, np.uint8)
        dst = out[3:]  # misaligned destination
        dst[:] = srcs[0]
        c.gf256_mul_add(dst, srcs[1], 77, v)
        assert np.array_equal(dst, srcs[0] ^ ec.gf_mul(77, srcs[1])), v
    with pytest.raises(ValueError, match="c must be in 0..255"):
        c.gf256_mul_add(dst, srcs[1], 256)
    with pytest.raises(ValueError, match="equal lengths"):
        c.gf256_matmul(coeffs[:, :2], [buf[:10], buf[:11]])
    with pytest.raises(ValueError, match="version"):
        c.gf256_matmul(coeffs[:, :1], [buf[:10]], "nope")


@needs_c
def test_forced_cpu_features(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    coeffs = rng.integers(0, 256, (2, 3), dtype=np.uint8)
    srcs = [rng.integers(0, 256, 1000, dtype=np.uint8) for _ in range(3)]
    ref = _ref(coeffs, srcs)
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    assert ec.gf256_path("simd") == "scalar"
    assert np.array_equal(ec.gf256_matmul(coeffs, srcs, backend="cpp"), ref)
    with pytest.raises(ValueError, match="avx2"):
        ec.gf256_path("avx2")
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx2")
    assert ec.gf256_path("simd") in ("avx2", "scalar")
    assert np.array_equal(ec.gf256_matmul(coeffs, srcs, backend="cpp"), ref)


def test_registered_versions_and_numpy_fallback() -> None:
    assert backends.versions(ec.OP, "cpp") == ["simd", "scalar"]
    assert "numpy" in backends.registered(ec.OP)
    args, kw = backends.example(ec.OP, np.random.default_rng(0))
    assert ec.gf256_matmul(*args, backend="numpy", **kw).shape == (3, 201)
    # encode / decode run on the numpy reference alone (what a machine without _C does)
    data = [b"hello", b"world"]
    p = ec.encode(data, 2, backend="numpy")
    assert [d.tobytes() for d in ec.decode([None, None, *p], 2, 2, backend="numpy")] == data
