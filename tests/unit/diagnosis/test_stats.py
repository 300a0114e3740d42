import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache_diag.diagnosis.stats import median_ttf, wilson


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (1, 3, 0.0615, 0.7923)],
)
def test_wilson_known_values(k, n, lo, hi):
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_brackets_the_rate(kn):
    k, n = kn
    lo, hi = wilson(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError):
        wilson(4, 3)
    assert wilson(0, 0) == (0.0, 1.0)


def test_median_ttf_ignores_survivors():
    assert median_ttf([None, 3.0, 1.0, None, 2.0]) == 2.0
    assert median_ttf([None, None]) is None
