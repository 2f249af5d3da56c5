"""The diagnoser's memory is bounded by time, not by how fast the polls come (#25 item 5).

It keeps 15 minutes (``Thresholds.history_s``) of every server's samples and every GPU's
points. At ``--interval 0.25`` that was 3600 of each: with 8 GPUs and 4 servers about 15 MB
that filled for 15 minutes, most of the soak's growth after minute 5 (bench/soak.py). Counted
here, not measured as RSS: the diagnoser fed as the app feeds it (tests/helpers/diag_fixtures.py)."""

from __future__ import annotations

from tests.helpers import diag_fixtures as F
from vtop.core.history import Series, capacity_for
from vtop.core.rules.state import GpuState, ServerState, keep_recent


def _feed(step_s: float, seconds: float) -> F.Session:
    ses = F.Session()
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    t0 = ses.now + 1
    for i in range(int(seconds / step_s)):
        t = t0 + i * step_s
        ses.gpu(F.gpu_poll(t, F.h200_sample(97.0, 80.0, 70.0 + (i % 10) / 10, [(F.ENGINE_PID, 69.0)])))
        ses.metrics(F.grow(base, generation_tokens_total=(base.generation_tokens_total or 0) + 900.0 * i),
                    mono=t, max_model_len=32768)
        ses.tick()
    return ses


def _held(ses: F.Session) -> tuple[ServerState, GpuState]:
    mem = ses.diag._mem  # what the rules read from one tick to the next
    return mem.servers[ses.url], mem.gpus[0]


def test_polls_four_a_second_keep_what_one_a_second_keeps() -> None:
    ses = _feed(0.25, 300.0)  # 1200 polls in 5 minutes
    st, gs = _held(ses)
    # about one item a second (and the newest): ~300, where every poll was kept (1200)
    assert 295 <= len(st.samples) <= 305, len(st.samples)
    assert 295 <= len(gs.points) <= 305, len(gs.points)
    assert st.samples[-1].t == gs.points[-1].t == ses.now  # the newest poll is always there
    assert st.times == sorted(st.times) and [s.t for s in st.samples] == st.times
    gaps = [b - a for a, b in zip(st.times, st.times[1:-1])]
    assert min(gaps) >= 0.9 - 1e-9 and max(gaps) <= 1.25 + 1e-9  # about a second apart


def test_polls_a_second_apart_are_all_kept() -> None:
    ses = _feed(1.0, 120.0)
    st, gs = _held(ses)
    assert len(st.samples) == len(gs.points) == 120
    ses = _feed(0.5, 120.0)
    st, gs = _held(ses)
    assert 119 <= len(st.samples) <= 122 and 119 <= len(gs.points) <= 122, (len(st.samples), len(gs.points))


def test_keep_recent_still_drops_what_is_older_than_the_history() -> None:
    times: list[float] = []
    items: list[int] = []
    for i in range(4 * 3600):  # an hour at 0.25 s
        keep_recent(times, items, i * 0.25, i, 900.0)
    assert items[-1] == 4 * 3600 - 1
    assert times[0] >= times[-1] - 1.07 * 900.0  # dropped in batches of at most 1/16
    assert 900 <= len(items) <= 1.07 * 900


def test_a_chart_series_lets_its_dead_points_go() -> None:
    # A GPU chart keeps twice the window (10 minutes at --history 5m); at --interval 0.25 its
    # lists held up to twice that again (dead points dropped only once they were half). Its
    # ring is sized for the window at the poll interval when made, and stays that size.
    cap = capacity_for(600.0, 0.25)
    s = Series(600.0, capacity=cap)
    n = 4 * 3600  # an hour at 0.25 s
    for i in range(n):
        s.append(i * 0.25, float(i % 100))
        if i == 2400:
            assert s.capacity == cap  # full at 10 minutes, allocated from the first point
    assert len(s) == 2400  # the live points: 600 s at 4 a second
    assert s.capacity == cap <= 1.15 * 2400 and len(s._t) == len(s._v) == cap, (cap, len(s._t))
    assert s.latest() == float((n - 1) % 100)
    # without a hint the ring grows as the points come, never past max_points
    s = Series(600.0, max_points=3000)
    for i in range(n):
        s.append(i * 0.25, 1.0)
    assert len(s) == 2400 and 2400 <= s.capacity <= 3000
