from __future__ import annotations

from vtop.core.history import Series, resample
from vtop.core.spark import spark, spark_rows


def test_resample_right_aligned_with_gaps() -> None:
    s = Series(window_s=10)
    for t, v in [(1, 10.0), (2, None), (3, 30.0), (9, 90.0), (10, 100.0)]:
        s.append(t, v)
    cells = s.buckets(now=10, width=10)
    # cell i covers (i, i+1]: the sample at t lands in cell t-1; "now" is the last cell
    assert cells[0] == 10.0
    assert cells[1] is None  # a None sample is a gap, not a zero
    assert cells[2] == 30.0
    assert cells[3:8] == (None, None, None, None, None)
    assert cells[8] == 90.0
    assert cells[9] == 100.0
    assert s.buckets(now=20, width=10) == (None,) * 10  # all of it scrolled out


def test_resample_takes_the_max_so_spikes_survive() -> None:
    pts = [(float(t), 5.0) for t in range(1, 300)]
    pts[150] = (151.0, 100.0)
    cells = resample(pts, now=300, width=30, window_s=300)
    assert max(c for c in cells if c is not None) == 100.0
    assert sum(1 for c in cells if c == 100.0) == 1


def test_series_drops_old_points_and_restarts_when_clock_goes_back() -> None:
    s = Series(window_s=5)
    for t in range(10):
        s.append(float(t), float(t))
    assert [t for t, _ in s] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    s.append(3.0, 1.0)
    assert len(s) == 1 and s.latest() == 1.0


def test_spark_is_fixed_scale() -> None:
    # Textual's own Sparkline draws a steady 95 % as flat and low; ours must draw it high.
    assert spark([95.0] * 5) == "█████"
    assert spark([0.0] * 5) == "▁▁▁▁▁"
    assert spark([50.0]) == "▄"
    assert spark([None, 0.0, None]) == " ▁ "  # gap vs zero: different cells
    assert spark([float("nan")]) == " "
    assert spark([150.0, -5.0]) == "█▁"  # clamped


def test_multirow_spark() -> None:
    rows = spark_rows([100.0, 50.0, 0.0, None], height=2)
    assert rows == ["█   ", "██▁ "]


def test_narrow_cells_hold_the_last_sample_but_a_silence_is_a_gap() -> None:
    # 1 Hz samples drawn on cells of 0.5 s: every other cell gets no sample.
    pts = [(float(t), 50.0) for t in range(1, 11)]
    strict = resample(pts, now=10, width=20, window_s=10)
    assert None in strict
    held = resample(pts, now=10, width=20, window_s=10, max_gap=2.5)
    assert held[1:] == (50.0,) * 19
    # the source then falls silent for 6 s: the cells after max_gap are gaps
    held = resample(pts, now=16, width=16, window_s=16, max_gap=2.5)
    assert held[-4:] == (None,) * 4 and held[-5] == 50.0 and held[-6] == 50.0  # held for 2 s, then a gap
    # an explicit None sample stays a gap and is not carried forward as a value
    pts2 = [(1.0, 10.0), (2.0, None), (3.0, 30.0)]
    assert resample(pts2, now=3, width=6, window_s=3, max_gap=2.5) == (None, 10.0, 10.0, None, None, 30.0)


def test_one_row_fast_path_matches_the_general_one() -> None:
    import random

    rnd = random.Random(7)
    vals = [None if rnd.random() < 0.1 else rnd.uniform(-20, 130) for _ in range(500)] + [float("nan")]
    assert spark(vals) == spark_rows(vals, 1)[0]
    assert spark(vals, lo=10, hi=20) == spark_rows(vals, 1, lo=10, hi=20)[0]


def test_cells_sit_on_a_fixed_grid_so_still_data_does_not_shimmer() -> None:
    # 1 Hz samples, 60 s on 12 cells of 5 s: between two boundaries only the last
    # cell may change; crossing a boundary shifts the chart by exactly one cell.
    s = Series(window_s=120)
    vals = [float((7 * t) % 50) for t in range(200)]
    for t in range(1, 101):
        s.append(float(t), vals[t])
    a = s.buckets(now=101.0, width=12, window_s=60)
    s.append(102.0, vals[102])
    b = s.buckets(now=102.0, width=12, window_s=60)
    assert a[:-1] == b[:-1]  # 101 and 102 are in the same 5 s cell (100, 105]
    for t in range(103, 106):
        s.append(float(t), vals[t])
    c = s.buckets(now=105.5, width=12, window_s=60)
    assert c[:-2] == b[1:-1]  # one cell to the left
    assert c[-2] == max(vals[101:106])  # (100, 105] is now finished


def test_cached_cells_equal_a_fresh_resample() -> None:
    import random

    rnd = random.Random(11)
    for trial in range(40):
        win = rnd.choice([30.0, 60.0, 300.0])
        s = Series(window_s=2 * win)  # as the app keeps them: twice the chart
        pts: list[tuple[float, float | None]] = []
        t = rnd.uniform(0, 1000)
        for _ in range(400):
            step = rnd.choice([0.25, 0.5, 1.0, 1.0, 1.0, 3.0, 12.0])
            late = rnd.random() < 0.05 and pts
            t_new = t - rnd.uniform(0, 2.0) if late else t + step  # late: a poll that started earlier
            if late and t_new <= pts[-1][0]:
                t_new = pts[-1][0]  # equal times are allowed, going back restarts the series
            t = max(t, t_new)
            v = None if rnd.random() < 0.1 else rnd.uniform(0, 100)
            s.append(t_new, v)
            pts.append((t_new, v))
            pts = [p for p in pts if p[0] >= t_new - s.window_s]
            if rnd.random() < 0.5:
                for width in (7, 20, 60):
                    now = t + rnd.choice([0.0, 0.0, 0.3])
                    gap = rnd.choice([None, 2.5])
                    got = s.buckets(now, width, win, max_gap=gap)
                    want = resample(list(s), now, width, win, max_gap=gap)
                    assert got == want, (trial, width, now, gap)


def test_peak_is_the_largest_value_still_in_the_window() -> None:
    s = Series(window_s=10)
    assert s.peak() is None
    s.append(1, None)
    assert s.peak() is None  # a gap is not a zero
    for t, v in [(2, 50.0), (3, float("nan")), (4, 20.0)]:
        s.append(t, v)
    assert s.peak() == 50.0 == max(v for _, v in s if v is not None)
    s.append(13, 5.0)  # t=2 (50) has scrolled out of the 10 s window
    assert s.peak() == max(v for _, v in s if v is not None) == 20.0


def test_sparkline_redrawn_from_changed_cells_equals_a_whole_drawing() -> None:
    """A chart fed by a series (last cell filling, the grid shifting, gaps, a restart,
    scale and width changes) draws the same string as spark() of its cells, every step;
    and the cheap paths are really taken."""
    import random

    from vtop.core import spark as spark_mod
    from vtop.core.spark import SparkLine

    rng = random.Random(7)
    s = Series(600.0)
    line = SparkLine()
    t, width, hi = 0.0, 40, 100.0
    whole = 0
    real_spark = spark_mod.spark

    def counting(values, lo=0.0, hi=100.0):  # type: ignore[no-untyped-def]
        nonlocal whole
        whole += len(values) > 2
        return real_spark(values, lo, hi)

    spark_mod.spark = counting  # type: ignore[assignment]
    try:
        steps = 0
        for step in range(2000):
            t += rng.choice([0.5, 1.0, 1.0, 1.0, 7.0])
            if step == 1200:
                t = 5.0  # a clock that went back: the series starts over
            s.append(t, None if rng.random() < 0.05 else rng.uniform(0, 140))
            if step % 400 == 399:
                width = rng.choice([20, 40, 73])
            if step % 250 == 249:
                hi = rng.choice([50.0, 100.0, 1024.0])
            vals = s.buckets(t, width, 300.0, max_gap=3.0)
            assert line.draw(vals, 0.0, hi) == real_spark(vals, 0.0, hi), f"step {step}"
            steps += 1
    finally:
        spark_mod.spark = real_spark  # type: ignore[assignment]
    assert whole < steps / 4  # most steps reuse the last string


def test_sparklines_keep_one_line_per_chart_and_stay_bounded() -> None:
    from vtop.core.spark import SparkLines

    lines = SparkLines(max_lines=2)
    a, b = (10.0, 50.0, 90.0), (90.0, None, 10.0)
    assert lines.draw("a", a) == spark(a) and lines.draw("b", b) == spark(b)
    assert lines.draw("a", a[1:] + (20.0,)) == spark(a[1:] + (20.0,))  # chart "a" kept its own last string
    assert lines.draw("c", b, 0.0, 1000.0) == spark(b, 0.0, 1000.0)  # full: the old ones are let go
    assert len(lines._lines) == 1
