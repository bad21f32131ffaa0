"""tinylearn.prune.ratio_model: pattern statistics, measured packed bytes, the linear compression-ratio model."""

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.prune.ratio_model import (
    FEATURES,
    FORMATS,
    KINDS,
    CompressionRatioModel,
    measured_nbytes,
    pattern_features,
    random_pattern,
)


def _patterns(n, seed, shape=(32, 64)):
    g = np.random.default_rng(seed)
    return [random_pattern(KINDS[i % len(KINDS)], shape, float(g.uniform(0.05, 0.5)), g) for i in range(n)]


def test_pattern_features_by_hand():
    m = np.zeros((8, 8), dtype=bool)
    m[0, :4] = True  # row 0: 4 of 8 kept, inside blocks (0,0) of 4x4
    m[5, 7] = True  # row 5: 1 kept, block (1,1)
    f = dict(zip(FEATURES, pattern_features(m, 4), strict=True))
    fill = np.array([4, 0, 0, 0, 0, 1, 0, 0]) / 8
    assert f["density"] == 5 / 64 and f["row_fill_max"] == 0.5 and f["row_fill_std"] == pytest.approx(fill.std())
    assert f["block_occupancy"] == 2 / 4 and f["inv_k"] == 1 / 8 and f["r_over_k"] == 4 / 8


def test_pattern_features_sampled_uses_a_share_of_block_rows():
    m = np.zeros((16, 8), dtype=bool)
    m[:4] = True  # only block row 0 is dense
    full = pattern_features(m, 4)
    sampled = [pattern_features(m, 4, sample=0.25, seed=s)[0] for s in range(20)]
    assert full[0] == 0.25 and set(sampled) <= {0.0, 1.0} and 1.0 in sampled and 0.0 in sampled
    np.testing.assert_array_equal(pattern_features(m, 4, sample=1.0), full)


@pytest.mark.parametrize("fmt", FORMATS)
def test_measured_nbytes_matches_the_format_arrays(fmt):
    m = _patterns(1, 3)[0]
    a = m.astype(np.float32)
    if fmt == "csr":
        f = tl.sparse.CSR.from_dense(a)
        expect = f.nbytes
    elif fmt == "ell":
        f = tl.sparse.ELL.from_dense(a)
        expect = f.indices.nbytes + f.data.nbytes
    else:
        f = tl.sparse.BSR.from_dense(a, 4)
        expect = f.indptr.nbytes + f.indices.nbytes + f.data.nbytes
    assert measured_nbytes(m, fmt) == expect
    nnz, rows = int(m.sum()), m.shape[0]
    if fmt == "csr":
        assert expect == 8 * nnz + 8 * (rows + 1)


@pytest.mark.parametrize("kind", KINDS)
def test_random_pattern_kinds(kind):
    g = np.random.default_rng(0)
    m = random_pattern(kind, (64, 64), 0.25, g)
    assert m.shape == (64, 64) and m.dtype == bool and 0 < m.mean() < 0.6
    if kind == "n_m":
        assert (m.reshape(64, 16, 4).sum(-1) == 1).all()
    if kind == "block":
        b = m.reshape(16, 4, 16, 4)
        assert (b.all(axis=(1, 3)) == b.any(axis=(1, 3))).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_model_fits_and_predicts_held_out_sizes(fmt):
    train, test = _patterns(40, 0), _patterns(15, 1)
    model = CompressionRatioModel(fmt).fit(train)
    for m in test:
        measured = measured_nbytes(m, fmt)
        assert model.predict_nbytes(m) == pytest.approx(measured, rel=0.02)
        assert model.predict_ratio(m) == pytest.approx(m.size * 4 / measured, rel=0.02)
    coef = model.coefficients()
    law = {"csr": ("density", 2.0), "ell": ("row_fill_max", 2.0), "bsr": ("block_occupancy", 1.0625)}[fmt]
    assert coef[law[0]] == pytest.approx(law[1], abs=0.02) and "intercept" in coef


def test_density_only_model_misses_ell():
    train, test = _patterns(40, 0), _patterns(15, 1)
    model = CompressionRatioModel("ell", features=["density", "inv_k"]).fit(train)
    errs = [abs(model.predict_nbytes(m) - measured_nbytes(m, "ell")) / measured_nbytes(m, "ell") for m in test]
    assert np.mean(errs) > 0.1


def test_fit_with_given_nbytes_equals_measuring():
    train = _patterns(20, 0)
    a = CompressionRatioModel("csr").fit(train)
    b = CompressionRatioModel("csr").fit(train, [measured_nbytes(m, "csr") for m in train])
    np.testing.assert_allclose(a.coef_, b.coef_)


def test_bad_input():
    m = np.ones((8, 8), dtype=bool)
    with pytest.raises(ValueError, match="mask"):
        pattern_features(np.ones(8), 4)
    with pytest.raises(ValueError, match="block_size"):
        pattern_features(m, 3)
    with pytest.raises(ValueError, match="block_size"):
        pattern_features(m, 0)
    with pytest.raises(ValueError, match="sample"):
        pattern_features(m, 4, sample=0)
    with pytest.raises(ValueError, match="fmt"):
        measured_nbytes(m, "coo")
    with pytest.raises(ValueError, match="kind"):
        random_pattern("zebra", (8, 8), 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="density"):
        random_pattern("uniform", (8, 8), 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="shape"):
        random_pattern("uniform", (8, 6), 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng"):
        random_pattern("uniform", (8, 8), 0.5, 0)
    with pytest.raises(ValueError, match="fmt"):
        CompressionRatioModel("coo")
    with pytest.raises(ValueError, match="features"):
        CompressionRatioModel("csr", features=["nope"])
    with pytest.raises(ValueError, match="block_size"):
        CompressionRatioModel("csr", block_size=0)
    with pytest.raises(ValueError, match="sample"):
        CompressionRatioModel("csr", sample=2)
    with pytest.raises(ValueError, match="masks"):
        CompressionRatioModel("csr").fit([m, m])
    with pytest.raises(ValueError, match="masks"):
        CompressionRatioModel("csr").fit(m)
    with pytest.raises(ValueError, match="nbytes"):
        CompressionRatioModel("csr", features=["density"]).fit([m] * 5, [1, 2])
    with pytest.raises(RuntimeError, match="fit"):
        CompressionRatioModel("csr").predict_ratio(m)
