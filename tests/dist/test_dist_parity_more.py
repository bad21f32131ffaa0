"""Column shards with r = 1 or 2 parity fragments (tinylearn.dist.parity: shard_columns, encode_shards,
recover_shards, gf256_mul) [Q157]."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from tinylearn.dist.parity import ShardCode, encode_shards, gf256_mul, recover_shards, shard_columns


def _matrix(rows: int = 6, cols: int = 23, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, cols)).astype(dtype)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------------------------ shard_columns


def test_shard_columns_widths_and_roundtrip() -> None:
    w = _matrix()
    shards = shard_columns(w, 5)
    assert [s.shape for s in shards] == [(6, 5), (6, 5), (6, 5), (6, 4), (6, 4)]
    assert all(s.flags.c_contiguous for s in shards)
    assert _same_bits(np.concatenate(shards, axis=1), w)
    assert len(shard_columns(w, 1)) == 1 and len(shard_columns(w, 23)) == 23


@pytest.mark.parametrize("k", [0, -1, 2.0, "3", None])
def test_shard_columns_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match="k"):
        shard_columns(_matrix(), k)  # type: ignore[arg-type]


def test_shard_columns_too_many_shards_and_bad_shape() -> None:
    with pytest.raises(ValueError, match="k: expected at most 23"):
        shard_columns(_matrix(), 24)
    with pytest.raises(ValueError, match="w: expected a 2-D"):
        shard_columns(np.zeros(10, np.float32), 2)
    with pytest.raises(ValueError, match="w: expected a 2-D"):
        shard_columns(np.zeros((2, 3, 4), np.float32), 2)


# ------------------------------------------------------------------------------------------------ gf256_mul


def test_gf256_mul_field_properties() -> None:
    x = np.arange(256, dtype=np.uint8)
    assert np.array_equal(gf256_mul(x, 1), x)
    assert not gf256_mul(x, 0).any()
    assert np.array_equal(gf256_mul(x, 2)[:128], (x[:128].astype(np.int64) * 2).astype(np.uint8))  # no reduction
    assert int(gf256_mul(np.array([0x80], np.uint8), 2)[0]) == 0x1D  # x^8 = x^4 + x^3 + x^2 + 1 (0x11d)
    for c in (3, 29, 200, 255):  # every non-zero c is a bijection (invertible) and distributes over xor
        assert np.unique(gf256_mul(x[1:], c)).size == 255
        a, b = x[:128], x[128:]
        assert np.array_equal(gf256_mul(a ^ b, c), gf256_mul(a, c) ^ gf256_mul(b, c))
    assert np.array_equal(gf256_mul(gf256_mul(x, 7), 9), gf256_mul(x, int(gf256_mul(np.array([7], np.uint8), 9)[0])))


@pytest.mark.parametrize("c", [-1, 256, 1.5, "2", None])
def test_gf256_mul_bad_constant(c: object) -> None:
    with pytest.raises(ValueError, match="c: expected an int in 0..255"):
        gf256_mul(np.zeros(3, np.uint8), c)  # type: ignore[arg-type]


def test_gf256_mul_bad_dtype() -> None:
    with pytest.raises(ValueError, match="data: expected a uint8 array"):
        gf256_mul(np.zeros(3, np.int32), 2)


# ------------------------------------------------------------------------------------------------ encode / recover


def test_encode_shards_layout() -> None:
    w = _matrix()
    code = encode_shards(w, 5, r=2)
    assert isinstance(code, ShardCode) and code.k == 5 and code.r == 2 and len(code.fragments) == 7
    assert {f.nbytes for f in code.fragments if f is not None} == {6 * 5 * 4}  # padded to the widest shard
    assert code.overhead == pytest.approx(2 / 5)
    data = [f for f in code.fragments[:5] if f is not None]
    assert np.array_equal(code.fragments[5], np.bitwise_xor.reduce(np.stack(data), axis=0))  # P is the plain XOR
    assert _same_bits(recover_shards(code), w)


@pytest.mark.parametrize("r", [1, 2])
@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_recover_every_loss_pattern_up_to_r(k: int, r: int) -> None:
    w = _matrix()
    for m in range(r + 1):
        for lost in combinations(range(k + r), m):
            code = encode_shards(w, k, r=r)
            for i in lost:
                code.fragments[i] = None
            assert _same_bits(recover_shards(code), w), (k, r, lost)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.uint8])
def test_recover_other_dtypes_and_special_values(dtype: type) -> None:
    w = _matrix(4, 9, dtype)
    if np.issubdtype(dtype, np.floating):
        w[0, 0], w[1, 3], w[2, 5] = np.nan, np.inf, -0.0
    code = encode_shards(w, 4, r=2)
    code.fragments[1] = code.fragments[3] = None
    assert _same_bits(recover_shards(code), w)


def test_recover_two_data_shards_large_k() -> None:
    w = _matrix(3, 255, np.float32)
    code = encode_shards(w, 255, r=2)
    code.fragments[0] = code.fragments[254] = None
    assert _same_bits(recover_shards(code), w)


def test_two_plain_xor_parities_cannot_recover_pairs() -> None:
    # the reason for the GF(2^8) weights: with 0/1 weights (k > 3) some pair has equal weight columns
    d = [np.array([v], np.uint8) for v in (5, 9, 17, 33)]
    c1, c2 = (1, 1, 1, 1), (1, 0, 1, 0)  # P = xor all, P2 = xor of even shards: shards 0 and 2 share (1, 1)
    swapped = [d[0] ^ 1, d[1], d[2] ^ 1, d[3]]  # a different pair (d0, d2) with the same two parities
    for c in (c1, c2):
        p = np.bitwise_xor.reduce([x for x, ci in zip(d, c, strict=True) if ci])
        p_alt = np.bitwise_xor.reduce([x for x, ci in zip(swapped, c, strict=True) if ci])
        assert np.array_equal(p, p_alt)
    w = np.stack([np.concatenate(d), np.concatenate(swapped)]).astype(np.uint8)  # GF weights tell them apart
    for row in w:
        code = encode_shards(row.reshape(1, 4), 4, r=2)
        code.fragments[0] = code.fragments[2] = None
        assert _same_bits(recover_shards(code), row.reshape(1, 4))


@pytest.mark.parametrize("r", [1, 2])
def test_recover_refuses_more_than_r_losses(r: int) -> None:
    code = encode_shards(_matrix(), 5, r=r)
    for i in range(r + 1):
        code.fragments[i] = None
    with pytest.raises(ValueError, match=f"code: {r + 1} lost fragments"):
        recover_shards(code)


def test_recover_wrong_fragment_count() -> None:
    code = encode_shards(_matrix(), 5, r=1)
    code.fragments.append(None)
    with pytest.raises(ValueError, match="code: expected 6 fragments"):
        recover_shards(code)


@pytest.mark.parametrize("r", [0, 3, -1, 1.0, "2", None])
def test_encode_shards_bad_r(r: object) -> None:
    with pytest.raises(ValueError, match="r: expected 1 or 2"):
        encode_shards(_matrix(), 3, r=r)  # type: ignore[arg-type]


def test_encode_shards_bad_k_and_w() -> None:
    with pytest.raises(ValueError, match="k: expected at most 255"):
        encode_shards(_matrix(2, 300), 256)
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        encode_shards(_matrix(), 0)
    with pytest.raises(ValueError, match="w: expected a 2-D"):
        encode_shards(np.zeros(8, np.float32), 2)
