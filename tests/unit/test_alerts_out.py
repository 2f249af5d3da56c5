"""Alert delivery (issue #41): one message per change of an incident, the rate limit, retries with
backoff, failures said once, the formats, and the webhook URLs' secrets kept out of what vtop shows.

Clocks are injected (a sender's ``clock`` and ``sleep``); the local receivers are real HTTP servers
(``tests/helpers/webhook_receiver.py``) and the command a real ``sh``. Nothing asserts wall-clock time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.webhook_receiver import Receiver
from vtop.actions.alerts_out import (
    AlertEvent,
    CommandTarget,
    Delivery,
    IncidentChanges,
    Policy,
    Sender,
    SendError,
    WebhookTarget,
    parse_webhook,
    payload,
    webhook_kind,
)
from vtop.config import ConfigError, build
from vtop.core.rules.alert import Alert
from vtop.core.rules.hold import AlertHold
from vtop.model.redact import redact_webhook, scrub_secrets

SLACK = "https://hooks.slack.com/services/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"
ENV = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent"}


def alert(sev: str = "critical", rule: str = "engine_stall", target: str | None = "http://127.0.0.1:8000",
          title: str = "Engine stall on :8000: running 4, no token for 21 s", since: float | None = 100.0) -> Alert:
    return Alert(rule, sev, title, evidence=("running 4, waiting 0",), fix=("look at the EngineCore",),
                 target=target, since=since)


def event(kind: str = "start", sev: str = "critical") -> AlertEvent:
    a = alert(sev)
    return AlertEvent(kind, a.rule, sev, a.title, a.target, evidence=a.evidence, fix=a.fix, started_at=1000.0,
                      at=1065.0, host="box1")


# ----------------------------------------------------------------------------- one message per change
def test_a_flapping_incident_through_the_hold_is_one_start_one_change_and_one_clear() -> None:
    """The rules' raw verdict flips every tick (a KV cache at 95-100 %); through the hold (as the diagnoser
    applies it) the delivery sends one start, one change when the severity really falls, one clear."""
    hold = AlertHold(hold_s=10.0, clear_hold_s=10.0)
    ch = IncidentChanges(clear_hold_s=10.0, host="box1")
    got: list[tuple[float, str, str]] = []
    t = 0.0

    def tick(raw: list[Alert]) -> None:
        for ev in ch.observe(hold.apply(raw, t), t, 5000.0 + t):
            got.append((t, ev.event, ev.severity))

    for i in range(30):  # critical/warning flips: the hold shows critical throughout
        tick([alert("critical" if i % 2 == 0 else "warning", title=f"KV full for {i} s", since=0.0)])
        t += 1.0
    for _ in range(15):  # warning for good: falls after hold_s
        tick([alert("warning", since=0.0)])
        t += 1.0
    for _ in range(3):  # gone for 3 s, back: the same incident (nothing sent)
        tick([])
        t += 1.0
    tick([alert("warning", since=0.0)])
    t += 1.0
    for _ in range(12):  # gone for good: the clear comes clear_hold_s later
        tick([])
        t += 1.0
    assert [(k, s) for _, k, s in got] == [("start", "critical"), ("change", "warning"), ("clear", "warning")]
    assert got[1][0] == 39.0  # the rules said warning from 29 on: the fall waited for the hold's 10 s
    assert got[2][0] == 49.0 + 10.0  # gone at 49: cleared after clear_hold_s


def test_title_changes_send_nothing_and_the_start_time_is_the_incidents() -> None:
    ch = IncidentChanges(host="h")
    evs = ch.observe([alert(title="for 21 s", since=90.0)], 100.0, 1100.0)
    assert [e.event for e in evs] == ["start"] and evs[0].started_at == 1090.0
    for i in range(1, 20):
        assert ch.observe([alert(title=f"for {21 + i} s", since=90.0)], 100.0 + i, 1100.0 + i) == []
    clear = [e for i in range(20, 40) for e in ch.observe([], 100.0 + i, 1100.0 + i)]
    assert [e.event for e in clear] == ["clear"]
    assert clear[0].title == "for 40 s" and clear[0].lasted_s == pytest.approx(1130.0 - 1090.0)


def test_below_the_least_severity_nothing_goes_until_it_rises() -> None:
    ch = IncidentChanges(min_severity="warning", host="h")
    assert ch.observe([alert("info", rule="risky_flags")], 0.0, 0.0) == []
    assert [(e.event, e.severity) for e in ch.observe([alert("warning", rule="risky_flags")], 1.0, 1.0)] == [
        ("start", "warning")]
    quiet = IncidentChanges(min_severity="warning", host="h")
    quiet.observe([alert("info", rule="risky_flags")], 0.0, 0.0)
    assert [e for i in range(1, 30) for e in quiet.observe([], float(i), float(i))] == []  # never said: no clear
    with pytest.raises(ValueError):
        IncidentChanges(min_severity="loud")


def test_two_targets_get_the_same_messages_and_a_delivery_on_the_tick_only_queues() -> None:
    class Slow:
        label, deadline_s = "slow", 5.0

        def __init__(self) -> None:
            self.got: list[str] = []

        def send(self, ev: AlertEvent, deadline_s: float) -> None:
            self.got.append(ev.event)

    a, b = Slow(), Slow()
    d = Delivery([a, b], threads=False, host="h")
    d.observe([alert()], 0.0, 0.0)
    assert a.got == [] and [s.pending() for s in d.senders] == [1, 1]  # queued, not sent on the tick
    for s in d.senders:
        while s.step():
            pass
    assert a.got == b.got == ["start"]


# ----------------------------------------------------------------------------- rate limit, retries, once
class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


class Scripted:
    """A target that fails as told: a list of SendError (or None for success) per attempt."""

    label, deadline_s = "scripted", 5.0

    def __init__(self, script: list[SendError | None], clock: FakeTime) -> None:
        self.script = list(script)
        self.clock = clock
        self.sent_at: list[float] = []

    def send(self, ev: AlertEvent, deadline_s: float) -> None:
        err = self.script.pop(0) if self.script else None
        if err is not None:
            raise err
        self.sent_at.append(self.clock.t)


def sender(target: Any, ft: FakeTime, notices: list[str], **policy: Any) -> Sender:
    return Sender(target, Policy(**policy), notify=notices.append, clock=ft.clock, sleep=ft.sleep)


def test_the_rate_limit_lets_a_burst_through_then_paces_and_drops_nothing() -> None:
    ft = FakeTime()
    tgt = Scripted([], ft)
    notes: list[str] = []
    s = sender(tgt, ft, notes, burst=3, refill_s=10.0)
    for _ in range(6):
        s.offer(event())
    while s.step():
        pass
    assert tgt.sent_at == [0.0, 0.0, 0.0, 10.0, 20.0, 30.0]
    assert s.sent == 6 and notes == []


def test_a_full_queue_drops_the_oldest_and_says_it_once() -> None:
    ft = FakeTime()
    notes: list[str] = []
    s = sender(Scripted([], ft), ft, notes, queue_max=3)
    for i in range(6):
        s.offer(event("start" if i == 0 else "change"))
    assert s.pending() == 3 and s.dropped == 3
    assert len(notes) == 1 and "the oldest are dropped" in notes[0]


def test_a_failure_that_may_pass_is_retried_with_a_doubling_backoff() -> None:
    ft = FakeTime()
    tgt = Scripted([SendError("HTTP 503", retry=True), SendError("no answer within 5 s", retry=True), None], ft)
    notes: list[str] = []
    s = sender(tgt, ft, notes, attempts=3, backoff_s=2.0)
    s.offer(event())
    s.step()
    assert ft.sleeps == [2.0, 4.0] and tgt.sent_at == [6.0]
    assert s.attempts_made == 3 and s.sent == 1 and notes == []


def test_a_mistake_is_not_retried() -> None:
    ft = FakeTime()
    tgt = Scripted([SendError("HTTP 404: no such hook", retry=False)], ft)
    notes: list[str] = []
    s = sender(tgt, ft, notes)
    s.offer(event())
    s.step()
    assert s.attempts_made == 1 and s.lost == 1 and ft.sleeps == []
    assert notes == ["alert delivery to scripted failed: HTTP 404: no such hook (later failures are not repeated)"]


def test_failures_are_said_once_and_the_recovery_once() -> None:
    ft = FakeTime()
    fail = SendError("HTTP 500", retry=True)
    tgt = Scripted([fail] * 9 + [None], ft)
    notes: list[str] = []
    s = sender(tgt, ft, notes, attempts=3)
    for kind in ("start", "change", "clear", "start"):
        s.offer(event(kind))
    while s.step():
        pass
    assert s.lost == 3 and s.sent == 1
    assert notes == ["alert delivery to scripted failed: HTTP 500 (3 attempts) (later failures are not repeated)",
                     "alert delivery to scripted works again (3 message(s) were not delivered)"]


# ----------------------------------------------------------------------------- formats
def test_the_format_is_chosen_by_host_or_prefix() -> None:
    assert webhook_kind(SLACK) == ("slack", SLACK)
    assert webhook_kind("https://ntfy.sh/vtop-box1") == ("ntfy", "https://ntfy.sh/vtop-box1")
    assert webhook_kind("https://ntfy.example.org/alerts")[0] == "ntfy"
    assert webhook_kind("https://example.org/hook") == ("json", "https://example.org/hook")
    assert webhook_kind("slack:http://127.0.0.1:9/x") == ("slack", "http://127.0.0.1:9/x")
    assert webhook_kind("ntfy:https://push.example/t") == ("ntfy", "https://push.example/t")
    assert webhook_kind("json:https://hooks.slack.com/x")[0] == "json"


def test_the_three_formats() -> None:
    ev = event("start")
    url, body = payload("json", ev, "http://h/x")
    j = json.loads(body)
    assert url == "http://h/x" and j["schema"] == "vtop.alert/1" and j["event"] == "start"
    assert j["rule"] == "engine_stall" and j["severity"] == "critical" and j["host"] == "box1"
    assert j["started_at"] == "1970-01-01T00:16:40Z" and j["evidence"] == ["running 4, waiting 0"]
    url, body = payload("slack", ev, SLACK)
    s = json.loads(body)
    assert url == SLACK and set(s) == {"text"}
    assert s["text"].startswith(":red_circle: *START [CRITICAL] Engine stall on :8000") and "fix: look at" in s["text"]
    url, body = payload("ntfy", event("clear"), "https://user:pw@ntfy.example/sub/vtop-box1")
    n = json.loads(body)
    assert url == "https://ntfy.example/sub/"  # JSON publishing: the root, the topic in the body
    assert n["topic"] == "vtop-box1" and n["priority"] == 3 and n["tags"] == ["white_check_mark"]
    assert n["title"].startswith("CLEAR [CRITICAL] Engine stall") and "(lasted 1m 05s)" in n["title"]
    assert json.loads(payload("ntfy", ev, "https://ntfy.sh/t")[1])["priority"] == 5


def test_the_command_gets_the_json_on_stdin_and_the_variables(tmp_path: Path) -> None:
    out = tmp_path / "got"
    CommandTarget(f'cat > {out}; env | grep ^VTOP_ALERT_ | sort >> {out}').send(event("change", "warning"), 10.0)
    text = out.read_text()
    first, *env = text.splitlines()
    assert json.loads(first)["event"] == "change"
    assert "VTOP_ALERT_EVENT=change" in env and "VTOP_ALERT_SEVERITY=warning" in env
    assert "VTOP_ALERT_RULE=engine_stall" in env and any(x.startswith("VTOP_ALERT_TITLE=Engine stall") for x in env)


def test_a_failing_or_hung_command_is_a_retryable_failure(tmp_path: Path) -> None:
    with pytest.raises(SendError) as e:
        CommandTarget("echo 'bad SLACK_TOKEN=abcdef' >&2; exit 4").send(event(), 10.0)
    assert e.value.retry and e.value.why == "exited with status 4: bad SLACK_TOKEN=***"
    with pytest.raises(SendError) as e:
        CommandTarget("sleep 60").send(event(), 0.2)
    assert e.value.retry and "did not finish within 0.2 s (killed)" in e.value.why


# ----------------------------------------------------------------------------- real HTTP and secrets
def test_a_webhook_posts_to_a_real_receiver_with_basic_auth() -> None:
    with Receiver("ok") as r:
        WebhookTarget("json", f"http://bot:pa55@127.0.0.1:{r.port}/hook/abc").send(event(), 5.0)
        WebhookTarget("slack", f"{r.url}/services/T/B/X").send(event("clear"), 5.0)
    assert [p["path"] for p in r.posts] == ["/hook/abc", "/services/T/B/X"]
    assert r.posts[0]["headers"]["Authorization"] == "Basic Ym90OnBhNTU="
    assert r.posts[0]["json"]["event"] == "start" and "CLEAR" in r.posts[1]["json"]["text"]


def test_a_500_that_echoes_the_secret_path_is_scrubbed() -> None:
    with Receiver("500") as r:
        t = WebhookTarget("json", f"{r.url}/hooks/s3cr3t-t0ken-value")
        with pytest.raises(SendError) as e:
            t.send(event(), 5.0)
    assert e.value.retry and e.value.why.startswith("HTTP 500")
    assert "s3cr3t" not in e.value.why and "s3cr3t" not in t.label
    assert t.label == f"json webhook {r.url}/***"


@pytest.mark.slow
def test_a_receiver_that_hangs_is_cut_at_the_deadline_and_said_once() -> None:
    with Receiver("hang") as r:
        notes: list[str] = []
        ft = FakeTime()
        s = Sender(WebhookTarget("json", f"{r.url}/x"), Policy(attempts=2, backoff_s=0.0), notify=notes.append,
                   clock=ft.clock, sleep=ft.sleep)
        s.target.deadline_s = 0.3  # type: ignore[misc]
        s.offer(event())
        s.offer(event("clear"))
        while s.step():
            pass
    assert r.hangs == 4 and s.lost == 2
    assert notes == [f"alert delivery to json webhook {r.url}/*** failed: no answer within 0.3 s (2 attempts) "
                     "(later failures are not repeated)"]


def test_secrets_in_urls_never_show() -> None:
    assert redact_webhook(SLACK) == "https://hooks.slack.com/***"
    assert redact_webhook("ntfy:https://ntfy.sh/my-private-topic") == "ntfy:https://ntfy.sh/***"
    assert redact_webhook("https://u:p@example.org:8443/x?token=1") == "https://example.org:8443/***"
    assert redact_webhook("https://example.org") == "https://example.org"
    assert scrub_secrets(f"posting to {SLACK} failed") == "posting to https://hooks.slack.com/services/*** failed"
    assert scrub_secrets("GET /send?chat=1&token=abc123&x=2") == "GET /send?chat=1&token=***&x=2"
    assert scrub_secrets("https://discord.com/api/webhooks/1/abc") == "https://discord.com/api/webhooks/***"
    with pytest.raises(ValueError) as e:
        parse_webhook("ftp://example.org/s3cr3t")
    assert "s3cr3t" not in str(e.value)
    with pytest.raises(ValueError, match="names its topic"):
        parse_webhook("ntfy:https://ntfy.example/")
    assert parse_webhook(SLACK).label == "slack webhook https://hooks.slack.com/***"


def test_settings_from_the_environment_and_a_bad_webhook_is_one_line_without_its_secret() -> None:
    cfg = build({}, env={"VTOP_WEBHOOK": f"{SLACK} ntfy:https://push.example/t", "VTOP_ON_ALERT": "logger x",
                         "VTOP_ALERT_MIN_SEVERITY": "critical", "XDG_CONFIG_HOME": "/nonexistent"})
    assert cfg.webhook == (SLACK, "ntfy:https://push.example/t") and cfg.on_alert == "logger x"
    assert cfg.alert_min_severity == "critical"
    assert "s3cr3t" not in repr(cfg) and "logger" not in repr(cfg)
    with pytest.raises(ConfigError) as e:
        build({"webhook": ["gopher://example.org/s3cr3t"]}, env={"XDG_CONFIG_HOME": "/nonexistent"})
    assert "s3cr3t" not in str(e.value) and "gopher://example.org/***" in str(e.value)
    r = subprocess.run([sys.executable, "-m", "vtop", "watch", "--webhook", "ftp://example.org/s3cr3t", "--no-gpu"],
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 3 and "Traceback" not in r.stderr and "s3cr3t" not in r.stderr, r.stderr
    assert "vtop watch: error: webhook ftp://example.org/***" in r.stderr


def test_close_gives_the_waiting_messages_their_chance_and_counts_what_is_left() -> None:
    with Receiver("ok") as r:
        d = Delivery([WebhookTarget("json", f"{r.url}/x")], host="h")
        d.observe([alert()], 0.0, time.time())
        left = d.close(timeout=30.0)
    assert left == 0 and r.events() == [("start", "engine_stall")]


def test_an_ntfy_url_without_its_topic_is_refused_at_the_settings() -> None:
    for bad in ("ntfy:https://push.example/", "https://ntfy.sh"):
        with pytest.raises(ConfigError, match="names its topic"):
            build({"webhook": [bad]}, env={"XDG_CONFIG_HOME": "/nonexistent"})
    assert build({"webhook": ["json:https://ntfy.sh/"]}, env={"XDG_CONFIG_HOME": "/nonexistent"}).webhook


def test_a_sender_reads_as_busy_until_it_has_said_what_happened() -> None:
    """A face that waits for ``pending() == 0`` and then takes the notices must find the failure there."""
    ft = FakeTime()
    seen: list[int] = []
    s = Sender(Scripted([SendError("HTTP 500", retry=False)], ft), Policy(), clock=ft.clock, sleep=ft.sleep)
    s.notify = lambda line: seen.append(s.pending())
    s.offer(event())
    s.step()
    assert seen == [1] and s.pending() == 0
