"""The mean and median the rules take of a few dozen readings, without ``statistics``.

``import statistics`` brings ``fractions``, ``decimal`` and ``random`` with it (18 ms of imports
measured on the busy 2-core dev VM, min of 5, ``-X importtime``), and every face imports the rules:
the one-shot (``vtop --once``) paid it for two functions. These give the same answers as
``statistics.fmean`` (``math.fsum`` over the count) and ``statistics.median`` (the middle value, or
the mean of the two middle ones); an empty input raises ``ValueError`` as theirs do
(``StatisticsError`` is one). ``tests/unit/test_stats.py`` holds them to the library's answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["fmean", "median"]


def fmean(data: Iterable[float]) -> float:
    """The arithmetic mean, as ``statistics.fmean``."""
    xs = data if isinstance(data, (list, tuple)) else list(data)
    if not xs:
        raise ValueError("fmean requires at least one data point")
    return math.fsum(xs) / len(xs)


def median(data: Iterable[float]) -> float:
    """The median, as ``statistics.median``: the middle value, or the mean of the two middle ones."""
    xs = sorted(data)
    n = len(xs)
    if n == 0:
        raise ValueError("no median for empty data")
    if n % 2 == 1:
        return xs[n // 2]
    i = n // 2
    return (xs[i - 1] + xs[i]) / 2
