"""Alert hysteresis (vtop/core/rules/hold.py): a severity rises at once, falls only after the
rules said lower for ``alert_hold_s``; an incident keeps its start while it lasts. The clock is
the ticks' ``now`` (injected): no wall clock anywhere."""

from __future__ import annotations

from vtop.core.rules.alert import Alert
from vtop.core.rules.hold import AlertHold

URL = "http://127.0.0.1:8000"


def _kv(sev: str, since: float) -> Alert:
    return Alert("kv_saturation", sev, f"KV cache full ({sev})", target=URL, since=since)


def _shown(hold: AlertHold, now: float, *alerts: Alert) -> str | None:
    out = hold.apply(list(alerts), now)
    return out[0].severity if out else None


def test_a_severity_rises_at_once_and_falls_only_after_holding_lower() -> None:
    h = AlertHold(10.0, 5.0)
    assert _shown(h, 0.0, _kv("warning", 0.0)) == "warning"
    assert _shown(h, 1.0, _kv("critical", 0.5)) == "critical"  # up: at once
    # the rules flip back and forth every second: what is shown stays critical
    for t in range(2, 31):
        assert _shown(h, float(t), _kv("warning" if t % 2 else "critical", float(t))) == "critical"
    # lower for 10 s in a row: then it falls
    seen = [_shown(h, 31.0 + i, _kv("warning", 31.0 + i)) for i in range(12)]
    assert seen[:10] == ["critical"] * 10 and seen[10:] == ["warning", "warning"], seen


def test_an_incident_keeps_its_start_through_flips_and_short_gaps() -> None:
    h = AlertHold(10.0, 5.0)
    (a,) = h.apply([_kv("critical", 100.0)], 115.0)
    assert a.since == 100.0
    # the rule's own start restarts at each dip (kv_high_since): the incident's does not
    (b,) = h.apply([_kv("warning", 118.0)], 118.0)
    assert b.since == 100.0 and h.started(("kv_saturation", URL), 118.0) == 100.0
    # gone for 3 s (< 5): not shown (it cleared), but back within 5 s it is the same incident, still critical
    assert h.apply([], 121.0) == []
    (c,) = h.apply([_kv("warning", 124.0)], 124.0)
    assert c.since == 100.0 and c.severity == "critical"


def test_an_alert_clears_at_once_and_one_after_the_clear_hold_is_a_new_incident() -> None:
    h = AlertHold(10.0, 5.0)
    h.apply([_kv("critical", 0.0)], 0.0)
    assert h.apply([], 1.0) == []  # an incident that ended reads as ended
    assert h.apply([], 6.0) == []
    (a,) = h.apply([_kv("warning", 50.0)], 50.0)
    assert a.since == 50.0 and a.severity == "warning"


def test_the_diagnoser_shows_every_face_the_held_alerts() -> None:
    """Through the diagnoser: what ``update`` returns (what every face reads) is the held answer."""
    from vtop.core.evidence import Evidence
    from vtop.core.rules import Diagnoser

    class Flip:
        ids = ("kv_saturation",)

        def __init__(self) -> None:
            self.n = 0

        def check(self, ev: Evidence, mem: object) -> list[Alert]:
            self.n += 1
            return [_kv("critical" if self.n % 2 else "warning", ev.now)]

    d = Diagnoser()
    d.rules = (Flip(),)
    got = [d.update(Evidence(float(t)))[0] for t in range(20)]
    assert {a.severity for a in got} == {"critical"}
    assert {a.since for a in got} == {0.0}
