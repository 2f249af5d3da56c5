"""Alert delivery without Prometheus (issue #41): a command and webhooks, one message per change.

vtop's alerts keep their identity while an incident lasts (:mod:`vtop.core.rules.hold`: a severity
rises at once and falls only after ``alert_hold_s``; an alert of the same rule and target back within
``alert_clear_hold_s`` is the same incident). :class:`IncidentChanges` turns the alerts of each tick
into at most one message per change of an incident:

* ``start``: an incident reaches the severity asked for (``warning`` by default: ``risky_flags``'
  infos page nobody unless ``--alert-severity info``);
* ``change``: its severity changed (as the hold shows it: a wobble is not a change);
* ``clear``: it has been gone for ``alert_clear_hold_s``, the same hold in which a return would
  have been the same incident (so a scrape that dips under a line sends nothing, and the clear
  comes that long after the screen's).

:class:`Delivery` hands each message to every :class:`Sender` (one a target: the ``--on-alert``
command, each ``--webhook``), each with a thread of its own: the tick only appends to a queue and
never waits for a target, and a hung target holds up only its own queue. A sender is rate-limited
(a token bucket: :attr:`Policy.burst` at once, then one every :attr:`Policy.refill_s`; what waits
is sent later, never dropped unless :attr:`Policy.queue_max` are waiting), gives every attempt a
deadline, retries a failure that may pass (no answer, a refused connection, HTTP 5xx/408/429, a
command that timed out or exited non-zero) :attr:`Policy.attempts` times with a backoff, and says
a failure once (:meth:`Delivery.take_notices`: the screen shows it, ``vtop watch`` prints one line
on stderr), and once more when the target works again.

A webhook's URL is its secret: it is shown and written only as :func:`vtop.model.redact.redact_webhook`
makes it (``https://hooks.slack.com/***``), and every error text is scrubbed of it.

Textual-free, and no import of the monitor: the faces call :meth:`Delivery.observe` with the
monitor's alerts after each tick.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vtop import __version__
from vtop.config import Config
from vtop.core.rules.alert import RANK, Alert
from vtop.model.fmt import dur
from vtop.model.redact import basic_auth, redact_webhook, scrub_secrets

__all__ = ["AlertEvent", "CommandTarget", "Delivery", "IncidentChanges", "Policy", "SendError", "Sender",
           "WebhookTarget", "delivery_for", "make_delivery", "parse_webhook"]

EVENTS = ("start", "change", "clear")
SCHEMA = "vtop.alert/1"
Key = tuple[str, str | None]


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _rank(severity: str) -> int:
    return RANK.get(severity, len(RANK))


# ------------------------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class AlertEvent:
    """One change of an incident, as every target gets it."""

    event: str
    """``start``, ``change`` or ``clear``"""
    rule: str
    severity: str
    """the severity now (a clear: the last one shown)"""
    title: str
    """the alert's title (a clear: the last one shown)"""
    target: str | None
    previous_severity: str | None = None
    evidence: tuple[str, ...] = ()
    fix: tuple[str, ...] = ()
    started_at: float | None = None
    """wall-clock time the incident began"""
    at: float = 0.0
    """wall-clock time vtop saw the change"""
    host: str = ""

    @property
    def key(self) -> Key:
        return (self.rule, self.target)

    @property
    def lasted_s(self) -> float | None:
        return None if self.started_at is None else max(0.0, self.at - self.started_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "vtop": __version__, "event": self.event, "rule": self.rule,
            "severity": self.severity, "previous_severity": self.previous_severity, "title": self.title,
            "target": self.target, "host": self.host, "evidence": list(self.evidence), "fix": list(self.fix),
            "started_at": _iso(self.started_at), "time": _iso(self.at),
            "lasted_s": None if self.lasted_s is None else round(self.lasted_s, 1),
        }

    def env(self) -> dict[str, str]:
        """The ``VTOP_ALERT_*`` variables ``--on-alert``'s command gets (the JSON is on its stdin)."""
        return {
            "VTOP_ALERT_EVENT": self.event, "VTOP_ALERT_RULE": self.rule, "VTOP_ALERT_SEVERITY": self.severity,
            "VTOP_ALERT_PREVIOUS_SEVERITY": self.previous_severity or "", "VTOP_ALERT_TITLE": self.title,
            "VTOP_ALERT_TARGET": self.target or "", "VTOP_ALERT_HOST": self.host,
            "VTOP_ALERT_STARTED_AT": _iso(self.started_at) or "", "VTOP_ALERT_TIME": _iso(self.at) or "",
        }

    def headline(self) -> str:
        """``START [CRITICAL] Engine stall on :8000: ...``, ``CHANGE [WARNING was CRITICAL] ...``,
        ``CLEAR [CRITICAL] ... (lasted 1m 05s)``: the line ``vtop watch`` prints and the messages' title."""
        sev = self.severity.upper()
        if self.event == "change" and self.previous_severity:
            sev += f" was {self.previous_severity.upper()}"
        tail = f" (lasted {dur(self.lasted_s)})" if self.event == "clear" and self.lasted_s is not None else ""
        return f"{self.event.upper()} [{sev}] {self.title}{tail}"

    def text(self) -> str:
        """The message's body as plain text: the headline, the host, the evidence and the fix."""
        lines = [self.headline(), f"on {self.host}" + (f" at {_iso(self.at)}" if self.at else "")]
        if self.event != "clear":
            lines += [f"- {e}" for e in self.evidence]
            lines += [f"fix: {f}" for f in self.fix]
        return "\n".join(lines)


@dataclass
class _Open:
    start: float | None
    severity: str
    alert: Alert
    announced: bool
    gone_since: float | None = None


class IncidentChanges:
    """The alerts of each tick -> the changes to announce (see the module's docstring). Pure: the
    clock is the caller's (``now`` monotonic, ``wall`` its wall-clock twin)."""

    def __init__(self, *, min_severity: str = "warning", clear_hold_s: float = 10.0, host: str | None = None) -> None:
        if min_severity not in RANK:
            raise ValueError(f"severity: one of {', '.join(RANK)}, got {min_severity!r}")
        self.min_rank = RANK[min_severity]
        self.clear_hold_s = clear_hold_s
        self.host = host if host is not None else socket.gethostname()
        self.open: dict[Key, _Open] = {}

    def observe(self, alerts: Iterable[Alert], now: float, wall: float, clear_hold_s: float | None = None
                ) -> list[AlertEvent]:
        hold = self.clear_hold_s if clear_hold_s is None else clear_hold_s
        out: list[AlertEvent] = []
        said: set[Key] = set()
        for a in alerts:
            if a.key in said:
                continue
            said.add(a.key)
            inc = self.open.get(a.key)
            start = None if a.since is None else wall - (now - a.since)
            if inc is None:
                inc = self.open[a.key] = _Open(start, a.severity, a, announced=False)
            prev, inc.alert, inc.gone_since = inc.severity, a, None
            if start is not None and (inc.start is None or start < inc.start):
                inc.start = start
            if not inc.announced:
                inc.severity = a.severity
                if _rank(a.severity) <= self.min_rank:
                    inc.announced = True
                    out.append(self._event("start", inc, wall))
            elif a.severity != prev:
                inc.severity = a.severity
                out.append(self._event("change", inc, wall, previous=prev))
        for key in [k for k in self.open if k not in said]:
            inc = self.open[key]
            if inc.gone_since is None:
                inc.gone_since = now
            if now - inc.gone_since >= hold:
                del self.open[key]
                if inc.announced:
                    out.append(self._event("clear", inc, wall))
        return out

    def _event(self, kind: str, inc: _Open, wall: float, previous: str | None = None) -> AlertEvent:
        a = inc.alert
        return AlertEvent(kind, a.rule, inc.severity, a.title, a.target, previous_severity=previous,
                          evidence=a.evidence, fix=a.fix, started_at=inc.start, at=wall, host=self.host)


# -------------------------------------------------------------------------------------------- targets
class SendError(Exception):
    """One attempt failed: ``why`` in words (scrubbed), ``retry`` whether another may work."""

    def __init__(self, why: str, *, retry: bool) -> None:
        super().__init__(why)
        self.why = why
        self.retry = retry


class Target(Protocol):
    label: str
    """what vtop shows and writes of it (no secret)"""
    deadline_s: float

    def send(self, ev: AlertEvent, deadline_s: float) -> None: ...


#: HTTP answers that may pass: retried (the rest of 4xx is a mistake another try repeats)
RETRY_STATUS = frozenset({408, 425, 429})
#: how much of a failed answer's body is read and shown
BODY_LIMIT = 4096
PREFIXES = ("slack", "ntfy", "json")


def webhook_kind(url: str) -> tuple[str, str]:
    """``(kind, url)`` of a ``--webhook`` value: an explicit ``slack:``/``ntfy:``/``json:`` prefix, else by
    host: ``hooks.slack.com`` is Slack, ``ntfy.sh`` (or a host named ``ntfy.*``) is ntfy, anything else
    gets vtop's own JSON."""
    from urllib.parse import urlsplit

    head, colon, tail = url.strip().partition(":")
    if colon and head.lower() in PREFIXES and not tail.startswith("//"):
        return head.lower(), tail.strip()
    host = (urlsplit(url.strip()).hostname or "").lower()
    if host == "hooks.slack.com":
        return "slack", url.strip()
    if host == "ntfy.sh" or host.startswith("ntfy."):
        return "ntfy", url.strip()
    return "json", url.strip()


def parse_webhook(spec: str) -> WebhookTarget:
    """A :class:`WebhookTarget`; ValueError (its text shows no secret) for what cannot be posted to."""
    from urllib.parse import urlsplit

    kind, url = webhook_kind(spec)
    shown = redact_webhook(spec)
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        raise ValueError(f"--webhook {shown}: not a URL") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"--webhook {shown}: an http:// or https:// URL (with an optional slack:, ntfy: "
                         "or json: before it)")
    if not parts.hostname:
        raise ValueError(f"--webhook {shown}: no host in it")
    if kind == "ntfy" and not parts.path.strip("/"):
        raise ValueError(f"--webhook {shown}: an ntfy URL names its topic (https://ntfy.sh/TOPIC)")
    return WebhookTarget(kind, url)


def _ntfy_priority(severity: str, event: str) -> int:
    if event == "clear":
        return 3
    return {"critical": 5, "warning": 4}.get(severity, 3)


def payload(kind: str, ev: AlertEvent, url: str) -> tuple[str, bytes]:
    """``(url to post to, JSON body)`` of one message in ``kind``'s format.

    * ``json``: :meth:`AlertEvent.to_json` (schema ``vtop.alert/1``);
    * ``slack``: an incoming webhook's ``{"text": ...}`` (the headline in bold, the evidence and fix);
    * ``ntfy``: ntfy's JSON publishing (posted to the server's root with the topic in the body, so a
      title with any character works): title, message, priority (5 critical, 4 warning, 3 else and
      for a clear) and a tag."""
    if kind == "slack":
        icon = {"critical": ":red_circle:", "warning": ":warning:"}.get(ev.severity, ":information_source:")
        if ev.event == "clear":
            icon = ":white_check_mark:"
        lines = ev.text().split("\n")
        body: dict[str, Any] = {"text": f"{icon} *{lines[0]}*\n" + "\n".join(lines[1:])}
        return url, json.dumps(body).encode()
    if kind == "ntfy":
        from urllib.parse import urlsplit, urlunsplit

        p = urlsplit(url)
        base, _, topic = p.path.rstrip("/").rpartition("/")
        root = urlunsplit((p.scheme, p.netloc.rpartition("@")[2], base + "/", p.query, ""))
        tag = "white_check_mark" if ev.event == "clear" else {"critical": "rotating_light", "warning": "warning"}.get(
            ev.severity, "information_source")
        body = {"topic": topic, "title": ev.headline(), "message": "\n".join(ev.text().split("\n")[1:]) or ev.title,
                "priority": _ntfy_priority(ev.severity, ev.event), "tags": [tag]}
        return root, json.dumps(body).encode()
    return url, json.dumps(ev.to_json()).encode()


class WebhookTarget:
    """A POST of each message to a URL (h11, vtop's one HTTP client: :mod:`vtop.sources.http11`)."""

    deadline_s = 5.0

    def __init__(self, kind: str, url: str) -> None:
        from vtop.model.redact import split_userinfo

        self.kind = kind
        shown, userinfo = split_userinfo(url)
        self._auth = basic_auth(userinfo) if userinfo is not None else None
        self.url = url if userinfo is None else _strip_userinfo(url)
        self.label = f"{kind} webhook {redact_webhook(url)}"
        self._secrets = _secret_parts(url)

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return scrub_secrets(text)

    def send(self, ev: AlertEvent, deadline_s: float) -> None:
        to, body = payload(self.kind, ev, self.url)
        try:
            status, answer = asyncio.run(self._post(to, body, deadline_s))
        except SendError as e:
            raise SendError(self.scrub(e.why), retry=e.retry) from None
        if 200 <= status < 300:
            return
        said = answer.decode("utf-8", "replace").strip().splitlines()
        tail = f": {said[0][:200]}" if said else ""
        raise SendError(self.scrub(f"HTTP {status}{tail}"), retry=status >= 500 or status in RETRY_STATUS)

    async def _post(self, url: str, body: bytes, deadline_s: float) -> tuple[int, bytes]:
        from vtop.sources.http11 import HttpError, HttpPool, within

        headers = [("Content-Type", "application/json"), ("User-Agent", f"vtop/{__version__}"),
                   ("Accept-Encoding", "identity"), ("Connection", "close")]
        if self._auth is not None:
            headers.append(("Authorization", self._auth))
        pool = HttpPool(max_idle=0)

        async def exchange() -> tuple[int, bytes]:
            async with pool.stream("POST", url, headers=headers, body=body,
                                   connect_timeout=deadline_s) as r:
                return r.status or 0, await r.read(BODY_LIMIT)

        try:
            return await within(exchange(), deadline_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise SendError(f"no answer within {deadline_s:g} s", retry=True) from None
        except HttpError as e:
            raise SendError(e.message, retry=True) from None
        except OSError as e:
            raise SendError(f"{type(e).__name__}: {e.strerror or e}", retry=True) from None
        finally:
            await pool.aclose()


def _strip_userinfo(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc.rpartition("@")[2], p.path, p.query, p.fragment))


def _secret_parts(url: str) -> list[str]:
    """The parts of a webhook's URL an error text must not show: its path, query and user info."""
    from urllib.parse import urlsplit

    try:
        p = urlsplit(url)
    except ValueError:
        return [url]
    out = [url, _strip_userinfo(url)]
    out += [x for x in (p.path.strip("/"), p.query, p.netloc.rpartition("@")[0]) if len(x) >= 4]
    return sorted(set(out), key=len, reverse=True)


class CommandTarget:
    """``--on-alert CMD``: ``sh -c CMD`` with the message as JSON on stdin and ``VTOP_ALERT_*`` in its
    environment; in a session of its own, killed (its whole group) past the deadline."""

    deadline_s = 10.0

    def __init__(self, command: str) -> None:
        self.command = command
        shown = scrub_secrets(command)
        self.label = "command " + (shown if len(shown) <= 60 else shown[:57] + "...")

    def send(self, ev: AlertEvent, deadline_s: float) -> None:
        data = (json.dumps(ev.to_json()) + "\n").encode()
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", self.command], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env={**os.environ, **ev.env()}, start_new_session=True)
        except OSError as e:
            raise SendError(f"cannot run it: {e.strerror or e}", retry=False) from None
        try:
            _, err = proc.communicate(data, timeout=deadline_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            raise SendError(f"did not finish within {deadline_s:g} s (killed)", retry=True) from None
        if proc.returncode != 0:
            last = err.decode("utf-8", "replace").strip().splitlines()
            tail = f": {last[-1][:200]}" if last else ""
            raise SendError(scrub_secrets(f"exited with status {proc.returncode}{tail}"), retry=True)


# -------------------------------------------------------------------------------------------- senders
@dataclass(frozen=True)
class Policy:
    """How a sender paces, bounds and retries (seconds)."""

    attempts: int = 3
    """tries of one message in all (the first and two retries)"""
    backoff_s: float = 2.0
    """the wait before the first retry; doubled before each next one"""
    burst: int = 5
    """messages sent at once before the rate limit paces them ..."""
    refill_s: float = 12.0
    """... then one every this long (5 a minute)"""
    queue_max: int = 100
    """messages waiting per target at most; beyond, the oldest goes (and that is said once)"""


@dataclass
class Sender:
    """One target's queue and thread (see the module's docstring). ``clock`` and ``sleep`` are injected
    in tests; :meth:`step` sends the next message synchronously (the thread calls it in a loop)."""

    target: Target
    policy: Policy = field(default_factory=Policy)
    notify: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] | None = None
    sent: int = 0
    lost: int = 0
    dropped: int = 0
    attempts_made: int = 0

    def __post_init__(self) -> None:
        self._queue: deque[AlertEvent] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._tokens = float(self.policy.burst)
        self._filled_at = self.clock()
        self._failing = False
        self._lost_failing = 0
        self._drop_said = False
        self._busy = False
        self._thread: threading.Thread | None = None

    # the tick's side: never blocks beyond a lock held for a deque operation
    def offer(self, ev: AlertEvent) -> None:
        with self._cond:
            if len(self._queue) >= self.policy.queue_max:
                self._queue.popleft()
                self.dropped += 1
                if not self._drop_said:
                    self._drop_said = True
                    self.notify(f"alert delivery to {self.target.label}: more than {self.policy.queue_max} messages "
                                "waiting; the oldest are dropped")
            self._queue.append(ev)
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    # the thread's side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"vtop-alert-{self.target.label[:20]}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _wait(self, seconds: float) -> None:
        if self.sleep is not None:
            self.sleep(seconds)
        else:
            self._stop.wait(seconds)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - a sender's bug must not end its thread unsaid
                self.notify(f"alert delivery to {self.target.label}: {type(e).__name__}: {scrub_secrets(str(e))}")

    def _take_token(self) -> None:
        """Wait (on the injected clock) until the rate limit lets one message go."""
        p = self.policy
        while True:
            now = self.clock()
            self._tokens = min(float(p.burst), self._tokens + (now - self._filled_at) / p.refill_s)
            self._filled_at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            self._wait((1.0 - self._tokens) * p.refill_s)
            if self._stop.is_set() and self.sleep is None:
                return

    def step(self) -> bool:
        """Send the next message (rate limit, attempts, backoff); False when none waits."""
        with self._cond:
            if not self._queue:
                return False
            ev = self._queue.popleft()
            self._busy = True
        try:
            self._take_token()
            self._settle(self._attempts(ev))
        finally:  # after what it said: nothing pending means all said
            with self._cond:
                self._busy = False
        return True

    def _settle(self, why: str | None) -> None:
        if why is None:
            self.sent += 1
            if self._failing:
                self._failing = False
                self.notify(f"alert delivery to {self.target.label} works again"
                            + (f" ({self._lost_failing} message(s) were not delivered)" if self._lost_failing else ""))
                self._lost_failing = 0
        else:
            self.lost += 1
            self._lost_failing += 1
            if not self._failing:  # said once, until it works again
                self._failing = True
                self.notify(f"alert delivery to {self.target.label} failed: {why} (later failures are not repeated)")

    def _attempts(self, ev: AlertEvent) -> str | None:
        """None once sent; else why the last attempt failed."""
        p = self.policy
        wait = p.backoff_s
        why = "not tried"
        for n in range(p.attempts):
            if n:
                self._wait(wait)
                wait *= 2
                if self._stop.is_set() and self.sleep is None:
                    return why
            self.attempts_made += 1
            try:
                self.target.send(ev, self.target.deadline_s)
                return None
            except SendError as e:
                why = e.why + (f" ({n + 1} attempts)" if n else "")
                if not e.retry:
                    return why
        return why


class Delivery:
    """Every target's :class:`Sender`, fed by :class:`IncidentChanges` (see the module's docstring)."""

    def __init__(self, targets: Sequence[Target], *, min_severity: str = "warning", policy: Policy | None = None,
                 threads: bool = True, host: str | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.changes = IncidentChanges(min_severity=min_severity, host=host)
        self._notices: deque[str] = deque(maxlen=100)
        self._lock = threading.Lock()
        self.senders = [Sender(t, policy or Policy(), notify=self._notice, clock=clock, sleep=sleep) for t in targets]
        self.events: list[AlertEvent] = []
        """every message handed to the senders (the last 1000)"""
        if threads:
            for s in self.senders:
                s.start()

    @property
    def labels(self) -> list[str]:
        return [s.target.label for s in self.senders]

    def _notice(self, line: str) -> None:
        with self._lock:
            self._notices.append(line)

    def take_notices(self) -> list[str]:
        """What went wrong (or right again) since the last call: each failure once."""
        with self._lock:
            out = list(self._notices)
            self._notices.clear()
        return out

    def observe(self, alerts: Iterable[Alert], now: float, wall: float, clear_hold_s: float | None = None
                ) -> list[AlertEvent]:
        """This tick's alerts: the changes found are queued to every target (never waited for)."""
        evs = self.changes.observe(alerts, now, wall, clear_hold_s)
        for ev in evs:
            for s in self.senders:
                s.offer(ev)
        if evs:
            self.events.extend(evs)
            if len(self.events) > 2000:
                del self.events[:1000]
        return evs

    def observe_monitor(self, monitor: Any) -> list[AlertEvent]:
        """:meth:`observe` with a :class:`vtop.monitor.Monitor`'s alerts, clock and hold (after its tick)."""
        clock = monitor.clock
        return self.observe(monitor.alerts, clock.monotonic(), clock.time(),
                            monitor.diagnoser.thresholds.alert_clear_hold_s)

    def close(self, timeout: float = 0.0) -> int:
        """Stop the senders; give those with messages waiting up to ``timeout`` in all to send them.
        Returns how many messages were left unsent."""
        deadline = time.monotonic() + timeout
        while timeout > 0 and any(s.pending() for s in self.senders) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = sum(s.pending() for s in self.senders)
        for s in self.senders:
            s.stop()
        return left


def make_delivery(on_alert: str | None, webhooks: Sequence[str], *, min_severity: str = "warning",
                  policy: Policy | None = None) -> Delivery | None:
    """The delivery the settings ask for, or None (no command, no webhook). ValueError for a bad webhook
    (its text shows no secret)."""
    targets: list[Target] = []
    if on_alert:
        targets.append(CommandTarget(on_alert))
    targets += [parse_webhook(w) for w in webhooks]
    if not targets:
        return None
    return Delivery(targets, min_severity=min_severity, policy=policy)


def delivery_for(config: Config, *, policy: Policy | None = None) -> Delivery | None:
    """:func:`make_delivery` from the settings (``on_alert``, ``webhook``, ``alert_min_severity``)."""
    return make_delivery(config.on_alert, config.webhook, min_severity=config.alert_min_severity, policy=policy)
