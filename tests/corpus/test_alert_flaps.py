"""An alert that lasts keeps its severity and its start on every face (issue 38 item 5).

Each KV-saturation trace of the corpus is played through the monitor as the screen plays it
(:class:`vtop.monitor.player.Player`, default settings), one recorded second at a time. At every
step three faces are read: the screen model (``Monitor.alerts``), the doctor's timeline (the
monitor's ``alert_log``, what ``vtop replay --doctor`` prints) and the exporter's ``vtop_alert``
series (:func:`vtop.exporter.families`: a severity is a series of its own, so every change of
severity is a series that goes to 0 and one that comes up). Per rule and target, within one
incident (from its first alert to its last), the severity may change at most twice (up to
critical and back down once); the title's "for Ns" counts from the incident's start, so its
``since`` stays the same while it lasts. An incident ends when its alert has been gone
``alert_clear_hold_s`` (vtop/core/rules/hold.py): ``kv-saturation-bursts`` holds three bursts of
KV pressure 45 s apart with an idle cache between them, three incidents on every face, each judged
on its own (a gap shorter than that is inside the incident and counts as two changes).

On main before the hysteresis these traces flipped CRITICAL <-> WARNING 6 to 19 times each
(see the report of the change that added this test).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.corpus.score import TRACES

KV_TRACES = sorted(p for p in TRACES.iterdir() if p.name.startswith("kv-saturation-")) if TRACES.is_dir() else []
MAX_CHANGES = 2


def _changes(seq: list[str | None]) -> int:
    """Severity changes within the incident: from its first alert to its last (a gap of no
    alert in between counts: the alert went away and came back)."""
    on = [i for i, s in enumerate(seq) if s is not None]
    if not on:
        return 0
    inner = seq[on[0]: on[-1] + 1]
    return sum(1 for a, b in zip(inner, inner[1:]) if a != b)


def _incidents(seq: list[tuple[float, str | None]], clear_hold_s: float) -> list[list[str | None]]:
    """``(time, severity)`` split into incidents: a new one begins when the alert comes back after
    having been gone ``clear_hold_s`` or longer (the hold forgets an incident then)."""
    out: list[list[str | None]] = []
    cur: list[str | None] = []
    gone: float | None = None
    for t, sev in seq:
        if sev is None:
            if gone is None:
                gone = t
            cur.append(sev)
            continue
        if gone is not None and t - gone >= clear_hold_s and any(x is not None for x in cur):
            out.append(cur)
            cur = []
        gone = None
        cur.append(sev)
    if any(x is not None for x in cur):
        out.append(cur)
    return out


def _for_s(title: str) -> float | None:
    """The seconds of a title's "for 1m 05s" (None: it says none)."""
    mt = re.search(r"for (?:about )?(?:(\d+)h (\d+)m|(\d+)m (\d+)s|(\d+)s)", title)
    if not mt:
        return None
    h, hm, m, ms, s = mt.groups()
    if h is not None:
        return int(h) * 3600 + int(hm) * 60
    if m is not None:
        return int(m) * 60 + int(ms)
    return float(s)


def play(path: Path) -> tuple[dict[str, dict[tuple[str, str], list[str | None]]],
                               dict[str, dict[tuple[str, str], list[float]]]]:
    """Per face, per (rule, target): the severity at every recorded second (None: no alert); the
    doctor's at each change the monitor logged. And per face and key the times of those entries."""
    from vtop.config import Config
    from vtop.faces.exporter import ExportState, families
    from vtop.monitor.player import open_recording

    player = open_recording(str(path), config=Config())
    m = player.monitor
    state = ExportState()
    faces: dict[str, dict[tuple[str, str], list[str | None]]] = {
        "screen": defaultdict(list), "exporter": defaultdict(list), "since": defaultdict(list),
        "for": defaultdict(list)}
    times: dict[str, dict[tuple[str, str], list[float]]] = {
        "screen": defaultdict(list), "exporter": defaultdict(list), "doctor": defaultdict(list)}
    keys: set[tuple[str, str]] = set()
    t = player.start
    while t < player.end:
        t += 1.0
        player.feed_until(t)
        m.tick()
        now: dict[tuple[str, str], str] = {}
        since: dict[tuple[str, str], str] = {}
        for a in m.alerts:
            now[(a.rule, a.target or "box")] = a.severity
            since[(a.rule, a.target or "box")] = f"{a.since}"
            said = _for_s(a.title)
            if said is not None and a.since is not None:
                # the title's "for Ns" against the time since the incident's start
                faces["for"][(a.rule, a.target or "box")].append(f"{said:.0f}/{m.clock.monotonic() - a.since:.0f}")
        exported: dict[tuple[str, str], str] = {}
        for fam in families(m, state):
            if fam.name != "vtop_alert" or fam.type != "gauge":
                continue
            for s in fam.samples:
                if s.value == 1.0:
                    exported[(s.labels["rule"], s.labels["subject"])] = s.labels["severity"]
        keys |= set(now) | set(exported)
        for k in keys:
            faces["screen"][k].append(now.get(k))
            faces["exporter"][k].append(exported.get(k))
            faces["since"][k].append(since.get(k))
            times["screen"][k].append(t)
            times["exporter"][k].append(t)
    # the doctor's timeline: the severity after each change the monitor logged
    timeline: dict[tuple[str, str], list[str | None]] = defaultdict(list)
    for change in m.alert_log:
        cur = {(a.rule, a.target or "box"): a.severity for a in change.alerts}
        for k in keys | set(cur):
            timeline[k].append(cur.get(k))
            times["doctor"][k].append(change.mono)
    faces["doctor"] = timeline
    return faces, times


@pytest.mark.skipif(not KV_TRACES, reason="no corpus traces")
@pytest.mark.parametrize("path", KV_TRACES, ids=lambda p: p.name)
def test_a_kv_saturation_keeps_its_severity_and_start_on_every_face(path: Path) -> None:
    from vtop.core.rules.alert import Thresholds

    faces, times = play(path)
    clear_hold_s = Thresholds().alert_clear_hold_s
    assert any(k[0] == "kv_saturation" and any(faces["screen"][k]) for k in faces["screen"]), "no KV alert at all"
    for face in ("screen", "doctor", "exporter"):
        for key, seq in faces[face].items():
            for inc in _incidents(list(zip(times[face][key], seq)), clear_hold_s):
                n = _changes(inc)
                assert n <= MAX_CHANGES, f"{face}: {key} changed severity {n} times in one incident: {inc}"
    for key, said in faces["for"].items():
        for pair in said:
            title_s, since_s = (float(x) for x in pair.split("/"))
            assert abs(since_s - title_s) <= 2.0, \
                f"{key}: the title says for {title_s:.0f}s, the incident began {since_s:.0f}s ago: {said}"
    for key, seq in faces["since"].items():
        starts = {s for s in seq if s is not None}
        # one incident, one start (a second incident after a clear would be a second start)
        assert len(starts) <= 1 + _changes([None if s is None else "on" for s in seq]) // 2, (key, starts)
