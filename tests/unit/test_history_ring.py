"""The chart series' ring (vtop/core/history.py): the same points and cells as a plain list
would give, whatever the wrap, with flat memory (issue #25 item 5)."""

from __future__ import annotations

import math
import random

from vtop.core.history import Series, capacity_for, resample


class ListSeries:
    """What the series kept before the ring: a list of points, trimmed the same way."""

    def __init__(self, window_s: float, max_points: int) -> None:
        self.window_s, self.max_points = window_s, max_points
        self.pts: list[tuple[float, float | None]] = []

    def append(self, t: float, v: float | None) -> None:
        if self.pts and t < self.pts[-1][0]:
            self.pts = []
        cutoff = t - self.window_s
        if self.pts and self.pts[0][0] < cutoff:
            self.pts = [p for p in self.pts if p[0] > cutoff]
        self.pts.append((t, None if v is None or v != v else v))
        self.pts = self.pts[-self.max_points :]


def test_wraparound_keeps_the_points_in_order() -> None:
    s = Series(window_s=10.0, capacity=8)
    ref = ListSeries(10.0, 4096)
    for i in range(100):  # a point a second: 10 or 11 live once trimmed, the ring wraps many times
        s.append(float(i), float(i * 2))
        ref.append(float(i), float(i * 2))
        ts = [t for t, _ in s]
        assert ts == sorted(ts) and ts[-1] == float(i) and list(s) == ref.pts
    assert [t for t, _ in s] == [float(t) for t in range(90, 100)]
    assert [v for _, v in s] == [float(2 * t) for t in range(90, 100)]
    assert s.capacity == 16  # grew once (8 -> 16) to hold the window, never again
    assert s.latest() == 198.0 and s.latest_t() == 99.0 and s.peak() == 198.0


def test_gaps_are_none_whether_given_as_none_or_nan() -> None:
    s = Series(window_s=100.0, capacity=4)
    for t, v in [(1, 5.0), (2, None), (3, math.nan), (4, 7.0), (5, None), (6, 1.0)]:  # wraps at 5
        s.append(float(t), v)
    assert s.values() == [5.0, None, None, 7.0, None, 1.0]
    s.append(7.0, None)
    assert s.latest() is None and s.peak() == 7.0
    only_gaps = Series(window_s=10.0, capacity=2)
    for t in range(5):
        only_gaps.append(float(t), None)
    assert only_gaps.peak() is None and only_gaps.buckets(4.0, 5, 5.0) == (None,) * 5


def test_trimming_by_time_keeps_the_window_and_frees_slots() -> None:
    s = Series(window_s=5.0, capacity=8)
    for t in range(10):
        s.append(float(t), float(t))
    assert [t for t, _ in s] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # as the lists did (see test_history_spark)
    s.append(100.0, 1.0)  # a long silence: everything before it is out of the window
    assert list(s) == [(100.0, 1.0)] and s.capacity == 8
    s.append(99.0, 2.0)  # the clock went back: start over
    assert list(s) == [(99.0, 2.0)]


def test_max_points_drops_the_oldest_and_stops_growing() -> None:
    s = Series(window_s=1000.0, max_points=10, capacity=4)
    for t in range(25):
        s.append(float(t), float(t))
    assert s.capacity == 10 and [t for t, _ in s] == [float(t) for t in range(15, 25)]


def test_capacity_is_allocated_up_front_and_reserve_grows_it() -> None:
    cap = capacity_for(600.0, 0.25)
    assert 2400 < cap <= 1.15 * 2400
    assert capacity_for(600.0, 0.25, max_points=1000) == 1000
    assert capacity_for(600.0, math.nan) == capacity_for(600.0, 0.0) == 64  # no usable interval: start small
    s = Series(600.0, capacity=cap)
    assert len(s._t) == len(s._v) == cap and len(s) == 0
    for i in range(10):
        s.append(float(i), 1.0)
    s.reserve(cap + 100)
    assert s.capacity == cap + 100 and [t for t, _ in s] == [float(i) for i in range(10)]
    s.reserve(10)  # never shrinks
    assert s.capacity == cap + 100
    s.reserve(10**6)  # nor grows past max_points
    assert s.capacity == s.max_points == 4096


def test_the_ring_answers_as_a_list_would_across_wraps() -> None:
    rnd = random.Random(25)
    for trial in range(60):
        window = rnd.choice([5.0, 30.0, 120.0])
        max_points = rnd.choice([6, 50, 4096])
        s = Series(window, max_points=max_points, capacity=rnd.choice([1, 3, 16, None]))
        ref = ListSeries(window, max_points)
        t = rnd.uniform(0, 100)
        for _ in range(300):
            t += rnd.choice([0.0, 0.25, 0.5, 1.0, 1.0, 7.0])
            if rnd.random() < 0.02:
                t -= rnd.uniform(1, 20)  # a clock that went back
            v = None if rnd.random() < 0.1 else (math.nan if rnd.random() < 0.05 else rnd.uniform(0, 100))
            s.append(t, v)
            ref.append(t, v)
            assert list(s) == ref.pts, trial
            assert len(s) == len(ref.pts) <= max_points
            vals = [x for _, x in ref.pts if x is not None]
            assert s.peak() == (max(vals) if vals else None)
            if rnd.random() < 0.3:
                for width in (5, 60):
                    now = t + rnd.choice([0.0, 0.4])
                    gap = rnd.choice([None, 1.5])
                    win = rnd.choice([window, window / 2])
                    want = resample(ref.pts, now, width, win, max_gap=gap)
                    # every cell computed from the ring (the reuse of finished cells between
                    # calls is test_history_spark's test_cached_cells_equal_a_fresh_resample)
                    s._cells.clear()
                    assert s.buckets(now, width, win, max_gap=gap) == want, trial
