"""vtop.core.stats gives the answers of the standard library's ``statistics`` (which the rules used)."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vtop.core.stats import fmean, median

FLOATS = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(st.lists(FLOATS, min_size=1, max_size=60))
def test_fmean_and_median_are_the_librarys(xs: list[float]) -> None:
    assert fmean(xs) == statistics.fmean(xs)
    assert fmean(iter(xs)) == statistics.fmean(xs)  # an iterator, as the rules pass generators
    assert median(xs) == statistics.median(xs)
    assert median(x for x in xs) == statistics.median(xs)


def test_ints_and_the_two_middles() -> None:
    assert median([3, 1, 2]) == 2 and median([4, 1, 3, 2]) == 2.5 and fmean([1, 2]) == 1.5


def test_empty_raises_value_error_as_the_library_does() -> None:
    for f in (fmean, median):
        with pytest.raises(ValueError):
            f([])
        with pytest.raises(ValueError):
            getattr(statistics, f.__name__)([])


def test_the_headless_path_does_not_import_statistics() -> None:
    import subprocess
    import sys

    code = "import sys, vtop.faces.headless, vtop.core.rules; print('statistics' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
