import numpy as np

from evora.strategies.shaping import average_ranks, centered_ranks, zscore


def test_zscore_matches_definition():
    f = np.array([1.0, 2.0, 4.0, 7.0])
    assert np.allclose(zscore(f), (f - f.mean()) / f.std())


def test_all_ties_give_zero_weights():
    assert np.all(zscore(np.ones(6)) == 0)
    assert np.all(centered_ranks(np.ones(6)) == 0)


def test_centered_ranks_span_minus_half_to_half_and_average_ties():
    w = centered_ranks(np.array([0.3, 0.1, 0.3, 0.9]))
    assert w.min() == -0.5 and w.max() == 0.5
    assert w[0] == w[2]  # tied candidates share a rank: ties add no noise
    assert abs(w.sum()) < 1e-12


def test_average_ranks_are_scipys_rankdata_average():
    from scipy.stats import rankdata

    rng = np.random.default_rng(0)
    for values in (
        rng.normal(size=33),
        rng.integers(0, 4, size=40).astype(float),  # many ties, as greedy decoding gives
        np.array([2.0, 2.0, 2.0]),
        np.array([-0.0, 0.0, np.inf, -np.inf, 1.0]),
        np.array([1.0, np.nan, 0.0]),
    ):
        assert np.array_equal(average_ranks(values), rankdata(values, method="average"), equal_nan=True)
