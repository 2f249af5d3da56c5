"""What one vLLM server is doing, from its polls and its process. Pure: no I/O.

:class:`ServerTracker` is fed one :class:`~vtop.sources.vllm.ServerPoll` per
poll (plus what discovery knows about the process) and answers
:meth:`ServerTracker.view`, a frozen :class:`ServerView` the UI renders.

Why the states are what they are:

* ``starting``: the port refuses but a vLLM process exists. vLLM binds its
  port and does not listen until it is ready, for minutes, so
  "refused" alone cannot say dead.
* ``down``: refused or unreachable and no vLLM process (or vtop cannot see
  the processes, e.g. a remote URL: then the message says so).
* ``up``: ``/metrics`` answers with vLLM metrics in time.
* ``stale``: it answers slower than ``stale_after_s``, times out, drops the
  connection, or the last good scrape is older than 3 poll intervals (the
  monitor itself may be starved). Old numbers are kept but marked.
* ``restarted``: counters went back (a new process) or the process'
  create_time changed; shown for ``restarted_for_s`` after it comes back,
  then ``up``. Rates re-baseline (:mod:`vtop.core.rates`), never negative.
* ``not vllm``: something answers but it is not vLLM metrics (HTML, another
  exporter, ``--disable-log-stats``, 4xx).
* ``engine dead``: ``/health`` answers 500/503 (EngineDeadError) while
  ``/metrics`` may still answer; the API server may exit next.

Series keep gaps: a poll without data appends ``None``, never ``0``.
Rates and quantiles come from windows over cumulative counters, so a
burst shows as it happened and one bad scrape does not spike anything.

``core`` must not import ``sources`` at run time; the poll and process
types are only used for type checking, the code reads attributes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Union

from vtop.clock import Clock
from vtop.core.engines import flags_of
from vtop.core.history import Series, capacity_for
from vtop.core.rates import CounterMapWindow, CounterWindow, HistogramWindow, Quantiles
from vtop.core.stats import median
from vtop.model.fmt import dur

if TYPE_CHECKING:
    from vtop.model.metrics import VllmMetrics
    from vtop.model.procs import ServerProcess
    from vtop.model.server import ModelsInfo, ServerPoll

__all__ = [
    "STATES",
    "UNKNOWN",
    "EngineRow",
    "SpecView",
    "ServerTracker",
    "ServerView",
]

STATES = ("starting", "up", "stale", "down", "restarted", "not vllm", "engine dead")
State = Literal["starting", "up", "stale", "down", "restarted", "not vllm", "engine dead"]

#: pass as ``process=`` when the process table cannot tell (remote server,
#: discovery not run yet)
UNKNOWN: Literal["unknown"] = "unknown"


def engine_kind(process: Any, metrics: VllmMetrics | None) -> str | None:
    """Which engine serves ("vllm", "sglang": :data:`vtop.core.engines.ENGINES`): by the command line
    discovery found, else by the families its /metrics serves (``vllm:`` or ``sglang:``); None when neither
    is known (a URL given with no process on this box, not scraped yet). The one home of this answer: the
    card, the header, ``--once --json``'s ``engine`` and the exporter all read it through
    :attr:`ServerView.engine`."""
    engine = getattr(process, "engine", None) if process is not None and not isinstance(process, str) else None
    if engine is None and metrics is not None:
        engine = metrics.engine_kind
    return engine if isinstance(engine, str) else None
ProcessArg = Union["ServerProcess", None, Literal["unknown"]]

SERIES_NAMES = ("running", "waiting", "kv_pct", "gen_tps", "prompt_tps")

_NO_Q = Quantiles(None, None, None, None, None, 0.0, False)
_CONNECT_FAILS = ("refused", "dns", "other")
_SLOW_FAILS = ("timeout", "reset")


@dataclass(frozen=True, slots=True)
class SpecView:
    """Speculative decoding over the window (vLLM's own definitions, ``vllm/v1/spec_decode/metrics.py``)."""

    #: accepted draft tokens / draft tokens, 0..1 (None: no draft token in the window)
    acceptance: float | None
    #: 1 + accepted / drafts: tokens a step yields, the bonus token counted (None without ``num_drafts``: V0)
    mean_len: float | None
    #: accepted at position i / drafts, per position (empty without the per-position family)
    per_pos: tuple[float, ...]
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One data-parallel engine (or ``label="all"`` for the server total)."""

    label: str
    running: float | None
    waiting: float | None
    #: KV-cache usage in percent, 0..100
    kv_pct: float | None


@dataclass(frozen=True, slots=True)
class LastSeen:
    """A server's gauges as last seen, when they are not live (:meth:`ServerView.last_seen`): one
    wording for every face ("last seen 19 s ago: 4 running, 0 waiting when the engine died")."""

    state: str
    running: float | None
    waiting: float | None
    kv_pct: float | None
    age_s: float
    died: bool = False
    """The log says its engine died (a server down after an engine death)."""

    @property
    def when(self) -> str:
        if self.died or self.state == "engine dead":
            return "when the engine died"
        return "when it stopped answering" if self.state == "down" else "at the last answer"

    def lost(self) -> str:
        """``4 running, 0 waiting when the engine died``: the requests that went with it."""
        def n(x: float | None) -> str:
            return "?" if x is None else f"{x:.0f}"
        return f"{n(self.running)} running, {n(self.waiting)} waiting {self.when}"

    def age(self) -> str:
        """``21 s``, ``1m 05s``: how old the gauges are."""
        return f"{self.age_s:.0f} s" if self.age_s < 60 else dur(self.age_s)

    def words(self) -> str:
        kv = "" if self.kv_pct is None else f", KV {self.kv_pct:.0f}%"
        return f"last seen {self.age()} ago: {self.lost()}{kv}"

    def to_json(self) -> dict[str, float | str | None]:
        return {"running": self.running, "waiting": self.waiting, "kv_cache_pct": self.kv_pct,
                "age_s": round(self.age_s, 1), "when": self.when}


@dataclass(frozen=True)
class ServerView:
    """Everything the UI shows about one server, as of one moment."""

    url: str
    state: State
    #: plain words: what is wrong and since when
    message: str
    #: monotonic time the current state began
    since: float
    #: monotonic time of the last good scrape (None: never)
    last_ok_mono: float | None
    #: wall time of the last good scrape
    last_ok_t: float | None
    #: the last poll's error kind and message (None when it was fine)
    last_error: str | None
    last_error_message: str | None
    #: last good metrics (may be old: check state / last_ok_mono)
    metrics: VllmMetrics | None = field(repr=False)
    #: windowed rates (per second); None when unknown
    prompt_tps: float | None
    gen_tps: float | None
    preemptions_ps: float | None
    #: prefix-cache hit rate in the window, 0..1
    prefix_hit_rate: float | None
    ttft: Quantiles
    itl: Quantiles
    e2e: Quantiles
    #: finished requests by reason within the window (None: < 2 samples)
    finished: Mapping[str, float] | None
    window_s: float
    #: live Series objects (running, waiting, kv_pct, gen_tps, prompt_tps)
    series: Mapping[str, Series] = field(repr=False)
    #: per-engine rows (one per ``engine`` label) and the sum
    engines: tuple[EngineRow, ...]
    total: EngineRow | None
    model_id: str | None
    max_model_len: int | None
    version: str | None
    #: last /health status seen (None: never polled/answered)
    health: int | None
    latency_s: float | None
    #: the process as last fed (None: none found; "unknown": not known)
    process: Any = field(repr=False)
    #: restarts seen by this tracker (counter resets or new process)
    restarts: int
    #: the poll interval the tracker measured
    interval_s: float
    #: monotonic start of the first poll of the current run of failed polls (None while it answers):
    #: since then no complete answer came
    failing_since: float | None = None
    #: polls in a row that got no complete answer within the scraper's deadline (``timeout``): a
    #: server that accepts and never answers, answers late, or trickles its body
    timeouts: int = 0
    #: speculative decoding over the window; None where the server exports no spec-decode family
    spec: SpecView | None = None
    #: prompt tokens by source over the window (``local_compute``, ``local_cache_hit``,
    #: ``external_kv_transfer``); None where absent or < 2 samples
    prompt_by_source: Mapping[str, float] | None = None
    #: time in queue (arrival to first scheduling) over the window
    queue: Quantiles = field(default_factory=lambda: _NO_Q)
    #: HTTP answers of the API server over the window, per second: all, and 5xx (None: no
    #: ``http_requests_total`` family or < 2 samples)
    http_ps: float | None = None
    http_5xx_ps: float | None = None
    #: 0 awake, 1 sleeping (weights offloaded), 2 sleeping (everything discarded); None: no
    #: ``engine_sleep_state`` family. A sleeping engine makes no tokens on purpose: not a stall.
    sleep_level: int | None = None
    #: KV offload traffic over the window, bytes a second (None: no offload family or < 2 samples)
    offload_store_bps: float | None = None
    offload_load_bps: float | None = None
    #: ``/health`` polled and not answered (``timeout``, ``refused``, ...), and since when (monotonic);
    #: None while it answers: what a liveness probe sees, beside :attr:`health`'s last answer
    health_error: str | None = None
    health_error_since: float | None = None
    #: generation and prompt tokens a second over the last ``now_window_s``: the sparklines' rate, and the
    #: card's headline (a 60 s average beside a 5 s sparkline read 2.5k while the runaway alert said 536)
    gen_tps_now: float | None = None
    prompt_tps_now: float | None = None
    now_window_s: float = 5.0
    #: seconds the windowed rates (``gen_tps``, ``prompt_tps``, ``preemptions_ps``) span: at most ``window_s``,
    #: less while vtop has watched less (``doctor --window 15``)
    rate_span_s: float = 0.0

    @property
    def engine(self) -> str | None:
        """The engine serving (:func:`engine_kind`); None: not known (read as vLLM)."""
        return engine_kind(self.process, self.metrics)

    @property
    def engine_name(self) -> str:
        """The engine's own name ("vLLM", "SGLang"), vLLM's while it is not known."""
        return flags_of(self.engine)["name"]

    @property
    def len_word(self) -> str:
        """What the engine calls the longest request (vLLM's ``max_model_len``, SGLang's ``context_length``)."""
        return flags_of(self.engine)["len_word"]

    @property
    def is_live(self) -> bool:
        """Numbers are current (not stale, not down)."""
        return self.state in ("up", "restarted", "engine dead")

    @property
    def gauges_live(self) -> bool:
        """The gauges (running, waiting, KV) are the server's now. Not for a server that is down
        (the last values seen), whose engine died (its API server still answers ``/metrics``,
        frozen at the death), or whose polls are late (stale): those show :meth:`last_seen`."""
        return self.state in ("up", "restarted")

    def last_seen(self, now: float) -> LastSeen | None:
        """The gauges as last seen, with their age, for a server whose gauges are not live
        (:attr:`gauges_live`); None while they are, or when none was ever seen."""
        if self.gauges_live or self.metrics is None or self.last_ok_mono is None:
            return None
        # a dead engine's /metrics still answers, frozen: its values are as old as the death
        at = self.since if self.state == "engine dead" else self.last_ok_mono
        t = self.total
        return LastSeen(self.state, t.running if t else None, t.waiting if t else None, t.kv_pct if t else None,
                        max(0.0, now - at))


class ServerTracker:
    """Turns a stream of polls into a :class:`ServerView`. Not thread-safe:
    feed and view from the same thread (the UI thread is fine: a feed is a
    few dict updates and window appends)."""

    def __init__(
        self,
        url: str,
        *,
        window_s: float = 60.0,
        history_s: float = 300.0,
        stale_after_s: float = 3.0,
        clock: Clock,
        restarted_for_s: float = 30.0,
        interval_s: float = 1.0,
        spark_rate_s: float = 5.0,
    ) -> None:
        self.url = url
        self.window_s = window_s
        self.stale_after_s = stale_after_s
        self.restarted_for_s = restarted_for_s
        self._clock = clock
        self._default_interval = interval_s
        self._feeds: deque[float] = deque(maxlen=9)
        self._interval_key: tuple[int, float] | None = None
        self._interval_val = self._default_interval

        self._prompt = CounterWindow(window_s)
        self._gen = CounterWindow(window_s)
        self._preempt = CounterWindow(window_s)
        self._pc_hits = CounterWindow(window_s)
        self._pc_queries = CounterWindow(window_s)
        self._ttft = HistogramWindow(window_s)
        self._itl = HistogramWindow(window_s)
        self._e2e = HistogramWindow(window_s)
        self._finished = CounterMapWindow(window_s)
        self._spec_drafts = CounterWindow(window_s)
        self._spec_tokens = CounterWindow(window_s)
        self._spec_acc = CounterWindow(window_s)
        self._spec_pos = CounterMapWindow(window_s)
        self._by_source = CounterMapWindow(window_s)
        self._http = CounterMapWindow(window_s)
        self._queue = HistogramWindow(window_s)
        self._off_store = CounterWindow(window_s)
        self._off_load = CounterWindow(window_s)
        # short windows for the sparklines: a 60 s average would flatten a burst
        self.spark_rate_s = spark_rate_s
        self._gen_short = CounterWindow(spark_rate_s)
        self._prompt_short = CounterWindow(spark_rate_s)
        cap = capacity_for(history_s, interval_s)  # the rings are allocated now: flat memory from here
        self._series: dict[str, Series] = {n: Series(history_s, capacity=cap) for n in SERIES_NAMES}
        self._series_view = MappingProxyType(self._series)  # the views' read-only window on them, made once

        self._state: State = "down"
        self._since: float = clock.monotonic()
        self._started = False
        self._msg_detail = ""
        self._last_poll: ServerPoll | None = None
        self._last_ok_mono: float | None = None
        self._last_ok_t: float | None = None
        self._first_fail_mono: float | None = None
        self._timeouts = 0
        self._metrics: VllmMetrics | None = None
        self._health: int | None = None
        self._health_bad_since: float | None = None
        self._health_error: str | None = None
        self._health_error_since: float | None = None
        self._models: ModelsInfo | None = None
        self._version: str | None = None
        self._process: ProcessArg = UNKNOWN
        self._proc_key: tuple[int, float] | None = None
        self._restart_pending = False
        self._restart_at: float | None = None
        self._restart_why = ""
        self._log_phase: str | None = None
        self.restarts = 0

    # -- feeding --

    def feed(self, poll: ServerPoll, *, process: ProcessArg = UNKNOWN, log_phase: str | None = None) -> None:
        """Take one poll and what discovery says about the server's process.

        ``log_phase``: the phase the server's own log says its start is in, while it is
        starting (None otherwise). A refused port is then ``starting``, not ``down``,
        even when no process can be seen (a server in a container, another user's)."""
        mono = poll.mono
        self._log_phase = log_phase
        if self._feeds and mono <= self._feeds[-1]:
            # Out of order or repeated: keep the newest view; no clock goes back.
            if mono < self._feeds[-1]:
                return
        self._feeds.append(mono)
        self._note_process(process)
        poll = self._through_proxy(poll)
        self._last_poll = poll

        if poll.health_polled:
            if poll.health_error is not None:
                self._health_error = poll.health_error
                if self._health_error_since is None:
                    self._health_error_since = mono
            elif poll.health is not None:
                self._health_error = self._health_error_since = None
        if poll.health is not None:
            self._health = poll.health
            if poll.health >= 500:
                if self._health_bad_since is None:
                    self._health_bad_since = mono
            else:
                self._health_bad_since = None
        if poll.models is not None:
            self._models = poll.models
        if poll.version is not None:
            self._version = poll.version

        self._timeouts = self._timeouts + 1 if poll.error == "timeout" else 0
        if poll.ok and poll.metrics is not None:
            self._take_metrics(poll, poll.metrics)
            self._first_fail_mono = None
            state = self._ok_state(poll)
        else:
            self._gap(mono)
            if (poll.error or "other") in _CONNECT_FAILS:
                # Nothing listens: an old /health verdict says nothing about the next process.
                self._health_bad_since = None
                self._health_error = self._health_error_since = None
            if self._first_fail_mono is None:
                self._first_fail_mono = mono
            state = self._fail_state(poll)
        if state != self._state or not self._started:
            self._state = state
            self._since = mono
            self._started = True

    def _note_process(self, process: ProcessArg) -> None:
        self._process = process
        if process is None or isinstance(process, str):
            return
        key = (int(process.pid), float(process.create_time))
        if self._proc_key is not None and key != self._proc_key:
            self._restart_pending = True
            self._restart_why = f"new {flags_of(getattr(process, 'engine', None))['name']} process (pid {process.pid})"
        self._proc_key = key

    def _take_metrics(self, poll: ServerPoll, m: VllmMetrics) -> None:
        t = poll.mono
        reset = False
        # (a family the server does not export is None: skipped here, not by a call that returns)
        for w, v in (
            (self._prompt, m.prompt_tokens_total),
            (self._gen, m.generation_tokens_total),
            (self._preempt, m.preemptions_total),
            (self._pc_hits, m.prefix_cache_hits_total),
            (self._pc_queries, m.prefix_cache_queries_total),
            (self._gen_short, m.generation_tokens_total),
            (self._prompt_short, m.prompt_tokens_total),
        ):
            if v is not None:
                reset |= w.add(t, v)
        if m.request_success_total:
            reset |= self._finished.add(t, m.request_success_total)
        # #29's families: windows only (a missing family stays None; no restart is read from them)
        for cw, cv in ((self._spec_drafts, m.spec_drafts_total), (self._spec_tokens, m.spec_draft_tokens_total),
                       (self._spec_acc, m.spec_accepted_tokens_total), (self._off_store, m.kv_offload_store_bytes_total),
                       (self._off_load, m.kv_offload_load_bytes_total)):
            if cv is not None:
                cw.add(t, cv)
        for mw, mv in ((self._spec_pos, m.spec_accepted_per_pos), (self._by_source, m.prompt_tokens_by_source),
                       (self._http, m.http_requests_by_status)):
            if mv:
                mw.add(t, mv)
        # Histograms carried over from an earlier scrape (vtop.sources.vllm.HIST_EVERY_S) are
        # filed at the time they were read: the window already has them and ignores the copy.
        th = t - m.histograms_age_s
        for hw, h in (
            (self._ttft, m.time_to_first_token_seconds),
            (self._itl, m.inter_token_latency_seconds),
            (self._e2e, m.e2e_request_latency_seconds),
        ):
            if h is not None:
                reset |= hw.add(th, h)
        if m.request_queue_time_seconds is not None:
            self._queue.add(th, m.request_queue_time_seconds)
        if reset and not self._restart_pending:
            self._restart_pending = True
            self._restart_why = "counters went back to zero"
        if self._restart_pending:
            self._restart_pending = False
            self._restart_at = t
            self.restarts += 1

        self._metrics = m
        self._last_ok_mono = t
        self._last_ok_t = poll.t
        s = self._series
        s["running"].append(t, m.running)
        s["waiting"].append(t, m.waiting)
        s["kv_pct"].append(t, None if m.kv_cache_usage is None else 100.0 * m.kv_cache_usage)
        s["gen_tps"].append(t, self._gen_short.rate(t).rate)
        s["prompt_tps"].append(t, self._prompt_short.rate(t).rate)

    def _gap(self, t: float) -> None:
        for s in self._series.values():
            s.append(t, None)

    # -- states --

    def _ok_state(self, poll: ServerPoll) -> State:
        if self._health_bad_since is not None:
            return "engine dead"
        if poll.latency_s is not None and poll.latency_s > self.stale_after_s:
            return "stale"
        if self._restart_at is not None and poll.mono - self._restart_at < self.restarted_for_s:
            return "restarted"
        return "up"

    def _fail_state(self, poll: ServerPoll) -> State:
        kind = poll.error or "other"
        if kind in _CONNECT_FAILS:
            return "starting" if self._has_process() or self._log_phase is not None else "down"
        if kind in _SLOW_FAILS:
            return "stale"
        if kind.startswith("http 5"):
            return "engine dead" if self._health_bad_since is not None else "stale"
        return "not vllm"  # not vllm, garbage, too large, http 4xx

    def _through_proxy(self, poll: ServerPoll) -> ServerPoll:
        """A server in a container reached at a port published on the host: docker-proxy accepts every
        connection and closes it, no byte sent, when nothing listens in the container yet. That is the
        container's port refusing (a start, or a dead server), not a server dropping its answer."""
        p = self._process
        if (poll.error == "reset" and p is not None and not isinstance(p, str) and bool(getattr(p, "published", None))
                and "before the answer" in (poll.message or "")):
            return replace(poll, error="refused", message=(
                f"nothing listens in {getattr(p, 'placement', None) or 'the container'} on port "
                f"{getattr(p, 'inner_port', '?')} (the published port's proxy closed the connection): "
                "vLLM is starting or not running"))
        return poll

    def _has_process(self) -> bool:
        p = self._process
        return p is not None and not isinstance(p, str)

    @property
    def interval_s(self) -> float:
        """The poll interval, measured (median spacing of recent feeds; worked out again only
        after a feed: a view and the paint tick ask it several times a round, for every server)."""
        f = self._feeds
        if len(f) < 3:
            return self._default_interval
        key = (len(f), f[-1])
        if self._interval_key == key:
            return self._interval_val
        gaps = [b - a for a, b in zip(f, list(f)[1:]) if b > a]
        val = min(30.0, max(0.1, median(gaps))) if gaps else self._default_interval
        self._interval_key, self._interval_val = key, val
        return val

    # -- the view --

    def state_now(self, now: float | None = None) -> tuple[State, float, bool]:
        """(state, since, stale by age) as of ``now``, without building a view: the
        paint tick asks this of every server every second to notice one going quiet."""
        now = self._clock.monotonic() if now is None else now
        state = self._state
        since = self._since
        stale_by_age = False
        if state in ("up", "restarted", "engine dead") and self._last_ok_mono is not None:
            if now - self._last_ok_mono > max(3 * self.interval_s, self.stale_after_s):
                stale_by_age = state != "engine dead"
        if state == "restarted" and self._restart_at is not None and now - self._restart_at >= self.restarted_for_s:
            state, since = "up", self._restart_at + self.restarted_for_s
        if stale_by_age:
            state, since = "stale", self._last_ok_mono  # type: ignore[assignment]
        return state, since, stale_by_age

    def view(self) -> ServerView:
        now = self._clock.monotonic()
        interval = self.interval_s
        state, since, stale_by_age = self.state_now(now)

        live = state in ("up", "restarted", "engine dead", "stale")
        m = self._metrics
        poll = self._last_poll
        gen_w = self._gen.rate(now)
        gen = gen_w.rate if live else None
        prompt = self._prompt.rate(now).rate if live else None
        pre = self._preempt.rate(now).rate if live else None
        hit_rate = None
        if live and len(self._pc_queries) > 1:  # a family never fed (a fleet's instance) asks nothing
            dq = self._pc_queries.rate(now).delta
            dh = self._pc_hits.rate(now).delta
            if dq and dh is not None and dq > 0:
                hit_rate = min(1.0, dh / dq)
        fin = self._finished.delta(now).deltas if live else None
        engines, total = _engine_rows(m)
        model_id = self._models.model_id if self._models else None
        if model_id is None and m is not None and m.model_names:
            model_id = m.model_names[0]
        if model_id is None and self._has_process():
            model_id = self._process.served_name  # type: ignore[union-attr]
        max_len = self._models.max_model_len if self._models else None
        if max_len is None and self._has_process():
            max_len = self._process.max_model_len  # type: ignore[union-attr]
        return ServerView(
            url=self.url,
            state=state,
            message=self._message(state, since, now, stale_by_age),
            since=since,
            last_ok_mono=self._last_ok_mono,
            last_ok_t=self._last_ok_t,
            last_error=None if poll is None or poll.ok else poll.error,
            last_error_message=None if poll is None or poll.ok else poll.message,
            metrics=m,
            prompt_tps=prompt,
            gen_tps=gen,
            preemptions_ps=pre,
            prefix_hit_rate=hit_rate,
            ttft=self._ttft.quantiles(now) if live and len(self._ttft) else _NO_Q,
            itl=self._itl.quantiles(now) if live and len(self._itl) else _NO_Q,
            e2e=self._e2e.quantiles(now) if live and len(self._e2e) else _NO_Q,
            finished=MappingProxyType(fin) if fin is not None else None,  # the delta's own new dict
            window_s=self.window_s,
            series=self._series_view,
            engines=engines,
            total=total,
            model_id=model_id,
            max_model_len=max_len,
            version=self._version,
            health=self._health,
            latency_s=poll.latency_s if poll is not None else None,
            process=self._process,
            restarts=self.restarts,
            interval_s=interval,
            failing_since=self._first_fail_mono,
            health_error=self._health_error,
            health_error_since=self._health_error_since,
            timeouts=self._timeouts,
            spec=self._spec_view(now, m) if live else None,
            prompt_by_source=self._map_delta(self._by_source, now, m is not None and bool(m.prompt_tokens_by_source))
            if live else None,
            queue=self._queue.quantiles(now) if live and len(self._queue) else _NO_Q,
            http_ps=self._http_rate(now, None) if live and m is not None and m.http_requests_by_status else None,
            http_5xx_ps=self._http_rate(now, "5") if live and m is not None and m.http_requests_by_status else None,
            sleep_level=sleep_level(m),
            offload_store_bps=self._off_store.rate(now).rate if live and m is not None
            and m.kv_offload_store_bytes_total is not None else None,
            offload_load_bps=self._off_load.rate(now).rate if live and m is not None
            and m.kv_offload_load_bytes_total is not None else None,
            gen_tps_now=self._gen_short.rate(now).rate if live else None,
            prompt_tps_now=self._prompt_short.rate(now).rate if live else None,
            now_window_s=self.spark_rate_s,
            rate_span_s=gen_w.span_s if live else 0.0,
        )

    def _spec_view(self, now: float, m: VllmMetrics | None) -> SpecView | None:
        if m is None or m.spec_draft_tokens_total is None:
            return None
        drafts = self._spec_drafts.rate(now).delta
        toks = self._spec_tokens.rate(now).delta
        acc = self._spec_acc.rate(now).delta
        pos = self._spec_pos.delta(now).deltas or {}
        acceptance = acc / toks if acc is not None and toks else None
        mean_len = 1.0 + acc / drafts if acc is not None and drafts else None
        per_pos: tuple[float, ...] = ()
        if drafts and pos:
            keys = sorted(pos, key=lambda k: (len(k), k))
            per_pos = tuple(min(1.0, pos[k] / drafts) for k in keys)
        return SpecView(None if acceptance is None else min(1.0, acceptance), mean_len, per_pos, drafts, toks, acc)

    @staticmethod
    def _map_delta(w: CounterMapWindow, now: float, present: bool) -> Mapping[str, float] | None:
        if not present:
            return None
        d = w.delta(now)
        return MappingProxyType(dict(d.deltas)) if d.deltas is not None else None

    def _http_rate(self, now: float, prefix: str | None) -> float | None:
        d = self._http.delta(now)
        if d.deltas is None or d.span_s <= 0:
            return None
        return math.fsum(v for k, v in d.deltas.items() if prefix is None or k.startswith(prefix)) / d.span_s

    def _message(self, state: State, since: float, now: float, stale_by_age: bool) -> str:
        poll = self._last_poll
        if poll is None:
            return f"waiting for the first poll of {self.url}"
        dur = _dur(now - since)
        if state == "up":  # the usual answer first: the rest formats a wall-clock time
            return f"up for {dur}" if self.restarts == 0 else f"up for {dur} (restarted {self.restarts}x)"
        at = self._wall_of(since, poll)
        last_ok = (
            f"last good data {_dur(now - self._last_ok_mono)} ago" if self._last_ok_mono is not None else "no data yet"
        )
        proc = self._process
        if state == "restarted":
            ago = _dur(now - (self._restart_at or now))
            return f"restarted {ago} ago ({self._restart_why}); rates start again from then"
        if state == "engine dead":
            bad = self._health
            return (
                f"engine dead: /health answers {bad} for {dur} (since {at}); the engine crashed or hung "
                "and the API server may exit"
            )
        if state == "stale":
            if stale_by_age:
                return f"no fresh data for {dur} (polls are late or not arriving); numbers are from {at}"
            if poll.ok and poll.latency_s is not None:
                return f"answers slowly: /metrics took {poll.latency_s:.1f} s (limit {self.stale_after_s:.1f} s)"
            return f"{poll.message}; stale for {dur}, {last_ok}"
        if state == "starting" and not self._has_process() and self._log_phase is not None:
            return (f"starting: its log shows the start in {self._log_phase}; port refuses connections until "
                    "it is ready (vtop cannot see its process)")
        name = flags_of(engine_kind(proc, self._metrics))["name"]
        if state == "starting":
            pid = getattr(proc, "pid", "?")
            port = getattr(proc, "port", None) or "?"
            age = ""
            ct = getattr(proc, "create_time", None)
            if isinstance(ct, (int, float)) and ct > 0:
                age = f" (started {_dur(max(0.0, poll.t - ct))} ago)"
            if self._restart_pending:
                return (f"restarting: new {name} process {pid}{age}; port {port} refuses connections until it is "
                        f"ready; {last_ok}")
            if self._last_ok_mono is not None:
                return (f"{name} process {pid} still runs but port {port} stopped accepting connections for {dur} "
                        f"(shutting down, or restarting inside the same process); {last_ok}")
            return (
                f"starting: {name} process {pid} is running{age}, port {port} refuses connections until it is "
                "ready (loading weights, compiling, capturing graphs)"
            )
        if state == "down":
            tail = (
                "vtop cannot see this server's processes, so it may also be starting"
                if isinstance(proc, str)
                else f"no {name} process is running"
            )
            return f"down for {dur} (since {at}): {poll.message}; {tail}; {last_ok}"
        if state == "not vllm":
            return f"{poll.message} (for {dur})"
        return poll.message

    @staticmethod
    def _wall_of(mono: float, poll: ServerPoll) -> str:
        wall = poll.t - (poll.mono - mono)
        try:
            return time.strftime("%H:%M:%S", time.localtime(wall))
        except (OverflowError, ValueError, OSError):
            return "?"


def sleep_level(m: VllmMetrics | None) -> int | None:
    """0 awake, 1 or 2 the deepest sleep level of any engine; None without ``engine_sleep_state``.

    vLLM 0.26.0 on the H200 (tests/fixtures/vllm/signals/h200-0.26.0/sleep): ``POST /sleep?level=1``
    sets awake 0, weights_offloaded 1; ``?level=2`` awake 0, discard_all 1; ``/wake_up`` awake 1."""
    if m is None:
        return None
    top = getattr(m, "sleep_state", None)
    rows = [e.sleep_state for e in getattr(m, "engines", ()) if e.sleep_state] or ([top] if top else [])
    if not rows:
        return None
    level = 0
    for st in rows:
        if st.get("awake", 1.0) >= 1.0:
            continue
        level = max(level, 2 if st.get("discard_all", 0.0) >= 1.0 else 1)
    return level


def _pct(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else 100.0 * x


def _engine_rows(m: VllmMetrics | None) -> tuple[tuple[EngineRow, ...], EngineRow | None]:
    if m is None:
        return (), None
    rows = tuple(
        EngineRow(e.engine if e.engine is not None else "-", e.running, e.waiting, _pct(e.kv_cache_usage))
        for e in m.engines
    ) if m.engines else ()
    return rows, EngineRow("all", m.running, m.waiting, _pct(m.kv_cache_usage))


_dur = dur
