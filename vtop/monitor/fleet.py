"""The fleet: every vLLM or SGLang instance an existing Prometheus scrapes, through the one monitor.

No third orchestration: a :class:`Fleet` turns each refresh of a handful of aggregated
PromQL queries (:mod:`vtop.sources.fleet`) into one :class:`~vtop.model.server.ServerPoll`
per instance (its gauges and *cumulative* counters as a :class:`~vtop.model.metrics.VllmMetrics`, its
engine as the families it serves say, ``up == 0`` as a refused scrape, an old sample as a timeout) and feeds it to the same
:class:`~vtop.monitor.Monitor` the local screen and ``vtop doctor`` drive: the same
:class:`~vtop.core.server.ServerTracker` per instance, the same
:class:`~vtop.core.rules.Diagnoser`, the same alerts (runaway, engine stall, KV saturation).
At start the history comes from ``query_range`` (one step per refresh interval over
``--history``): the trackers and the rules are fed step by step on a clock that reads each
step's time, so a runaway that began 3 minutes before vtop looked is named at once and the
drill-in's sparklines are full.

What the table shows that is computed by Prometheus (``rate``, ``increase``,
``histogram_quantile`` over the last minute) comes from the rates query; what the rules judge
comes from the trackers. Two fleet-only rules (:mod:`vtop.core.rules.fleet`) add DOWN servers
and GPUs with XID errors.

What the fleet cannot know that the box can (:data:`BOX_ONLY`): the server's log (the request
that runs away, by id and ``max_tokens``; the startup phase; an OOM line), the processes
(py-spy dump, which process holds a GPU), NVML's per-process GPU memory. The rows and the
alerts that need it say ``ssh HOST vtop``.

A refresh that fails keeps the last rows, marks them stale as their age grows (the trackers
do that on their own) and says Prometheus' error in words (:attr:`Fleet.error`); it never
blocks: every query has a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vtop.clock import Clock, SystemClock
from vtop.config import Config
from vtop.core.gpu_history import GpuHistory
from vtop.core.rates import Quantiles
from vtop.core.rules.alert import RANK, Alert
from vtop.core.rules.fleet import box_hint, down_alert, on_the_box, xid_alert
from vtop.core.server import ServerView
from vtop.model.fmt import dur
from vtop.model.gpu import OK, GpuPoll, GpuSample
from vtop.model.metrics import VllmMetrics
from vtop.model.server import ServerPoll
from vtop.monitor.monitor import Monitor
from vtop.sources import fleet as q
from vtop.sources.metrics_text import ENGINE_PREFIXES
from vtop.sources.prometheus import PromClient, PromError

__all__ = ["BOX_ONLY", "DEFAULT_REFRESH_S", "Fleet", "FleetClock", "FleetRow", "client_from_config"]

DEFAULT_REFRESH_S = 5.0

#: what a fleet view cannot know that vtop on the box can (the screen's help and the README say it)
BOX_ONLY = (
    "the server's log: which request runs away (its id, max_tokens, age), the startup phase, OOM and error lines",
    "the processes: py-spy dumps of the engine, which process holds each GPU and its memory, launch flags",
    "the kernel's counters of the server's connections: which client's request has streamed longest, since when",
    "NVML on the box: clocks, throttle reasons, temperature; per-second samples (Prometheus scrapes every 15-60 s)",
    "the latency histograms' detail beyond TTFT p50/p99 (the by-age runaway proof needs the e2e buckets)",
)


def client_from_config(cfg: Config, url: str | None = None) -> PromClient:
    """The query client for ``--prometheus URL`` (or ``prometheus_url``), credentials from the config/env."""
    return PromClient(url or cfg.prometheus_url or "", token=cfg.prometheus_token, user=cfg.prometheus_user,
                      password=cfg.prometheus_password, ca_file=cfg.prometheus_ca_file,
                      timeout_s=cfg.prometheus_timeout)


class FleetClock:
    """The monitor's clock: the real one, or, while history is fed, the time of the step fed."""

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.at: tuple[float, float] | None = None

    def monotonic(self) -> float:
        return self.at[0] if self.at is not None else self.base.monotonic()

    def time(self) -> float:
        return self.at[1] if self.at is not None else self.base.time()

    def mono_of(self, wall: float) -> float:
        """A Prometheus time on the monotonic clock (assumes Prometheus' clock is about ours)."""
        return self.base.monotonic() - (self.base.time() - wall)


@dataclass
class FleetRow:
    """One vLLM or SGLang instance as the table and ``--json`` show it."""

    key: str
    job: str
    instance: str
    url: str
    host: str
    model: str | None = None
    engine: str | None = None
    """Whose families it serves ("vllm", "sglang"; None: none seen yet)."""
    state: str = "unknown"
    message: str = ""
    running: float | None = None
    waiting: float | None = None
    kv_pct: float | None = None
    gen_tps: float | None = None
    preempt_ps: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    finished: dict[str, float] | None = None
    engines: int | None = None
    sample_age_s: float | None = None
    gpus: q.FleetHost | None = None
    alerts: tuple[Alert, ...] = ()
    box: str | None = None
    """``ssh HOST vtop`` when an alert needs what only the box has."""
    on_box: q.BoxView | None = None
    """What ``vtop export`` on the box says (its startup phase, its alerts), when it runs there."""

    @property
    def worst(self) -> int:
        """0 critical, 1 warning, 2 info, 3 none; a DOWN row counts as critical."""
        ranks = [RANK.get(a.severity, 3) for a in self.alerts]
        if self.state == "down":
            ranks.append(0)
        return min(ranks, default=3)


@dataclass
class Drill:
    """One instance opened: its server view (the same card as the local screen) and its host's GPUs."""

    row: FleetRow
    view: ServerView | None
    gpus: GpuHistory
    error: str | None = None
    gpu_names: dict[int, str] = field(default_factory=dict)


class Fleet:
    """The fleet's state, refreshed from Prometheus. One event loop; not thread-safe."""

    def __init__(self, config: Config, client: PromClient, *, clock: Clock | None = None,
                 refresh_s: float | None = None, rate_window: str = "1m", freeze_gc: bool = False) -> None:
        self.refresh_s = refresh_s or config.fleet_interval
        self.config = dataclasses.replace(config, interval=self.refresh_s,
                                          history=max(config.history, 10 * self.refresh_s), urls=())
        self.client = client
        self.clock = FleetClock(clock or SystemClock())
        # Each instance is fed once a *scrape* (15-60 s apart, usually): its trackers' rings start at
        # that size and grow if scrapes come as often as the refresh (1,000 instances: 11 MB -> 4 MB)
        self.monitor = Monitor(self.config, clock=self.clock, find_logs=False,
                               feed_interval_s=max(self.refresh_s, self.USUAL_SCRAPE_S))
        self.rate_window = rate_window
        self.freeze_gc = freeze_gc
        """After the history is read, move what exists out of the cyclic GC's passes, and hold the
        collector off during each refresh (the fleet screen and ``bench/fleet.py``: a process that
        is the fleet view; not in tests)."""
        self.rows: dict[str, FleetRow] = {}
        self.hosts: dict[str, q.FleetHost] = {}
        self.boxes: dict[tuple[str, str], q.BoxView] = {}
        self.alerts: list[Alert] = []
        self.error: str | None = None
        """Prometheus' error of the last refresh, in words (None when it answered)."""
        self.error_since: float | None = None
        self.partial: list[str] = []
        """Queries of the last refresh that failed while others answered (their error, in words)."""
        self.last_ok_wall: float | None = None
        self.refreshes = 0
        self.backfilled = False
        self.backfill_note: str | None = None
        self.last_refresh_s: float | None = None
        self.last_queries = 0
        self._known: dict[str, tuple[str, str]] = {}
        self._row_of: dict[tuple[str, str], FleetRow] = {}
        """Each (job, instance)'s row (its key and URL made once, not at every refresh)."""
        self._fed_ts: dict[str, float] = {}
        self._first_eval: float | None = None
        self._vllm_cache: dict[tuple[str, str], q.Instance] | None = None
        self._slow_vecs: dict[int, Any] = {}
        """The last answer of each of :attr:`SLOW_PARTS` (by its index)."""
        self._slot = 0
        self._scrape_gap: dict[tuple[str, str], float] = {}
        self._history_ts: dict[tuple[str, str], float] = {}
        """While the history is read: each instance's newest sample time so far (its scrape interval)."""
        self._due_at: float | None = None
        """When the next scrape of an instance is due (its last sample time + its interval)."""
        self._slow_task: tuple[int, asyncio.Future[Any]] | None = None
        """The slower part sent by the last refresh (its index, the query), collected by the next."""
        self._rates: dict[tuple[str, str], q.Rates] = {}
        self.vllm_asked = 0
        """Refreshes that asked the whole vLLM query (an instance had a new scrape)."""
        self.version = 0
        """Goes up with every refresh that changed what is shown."""

    # ------------------------------------------------------------------ rounds

    @property
    def stale_after_s(self) -> float:
        """A sample older than this is stale (three refreshes, and at least 45 s: scrapes every 15 s
        are usual, and Prometheus returns the last sample for 5 minutes)."""
        return max(45.0, 3 * self.refresh_s)

    async def start(self) -> None:
        """A refresh (the table), then, the first time Prometheus answers, the history (the trackers
        and the rules): a Prometheus that was down when vtop started is read back when it returns."""
        await self.refresh()
        if self.error is None and not self.backfilled:
            await self.backfill()

    #: the slower-moving queries, one part per refresh in turn (all of them at the first refresh):
    #: TTFT over the last minute and the hosts' GPUs (DCGM's scrape is every 15-30 s) change slowly,
    #: and each part alone costs Prometheus ~0.05-0.13 s at 1,000 instances of 8 GPUs
    SLOW_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("rates", ("ttft_p50",)), ("gpu", ("util_sm",)),
        ("rates", ("ttft_p99",)), ("gpu", ("mem_power",)), ("gpu", ("n", "xid")))

    @property
    def slow_every_s(self) -> float:
        """How often each slower part (TTFT p50, p99, the GPUs' two halves) is asked."""
        return len(self.SLOW_PARTS) * self.refresh_s

    def _slow_query(self, kind: str, parts: tuple[str, ...]) -> str:
        if kind == "rates":
            return q.rates_query(self.rate_window, parts=parts)
        return q.gpu_query(parts=parts)

    async def refresh(self) -> None:
        """One round (:meth:`_refresh`); in the fleet screen's process, with the cyclic GC held off
        for its length: the answers' ~100,000 short-lived objects (freed by reference counting)
        set off 70-90 collections a refresh at 1,000 instances, 30-80 ms of it."""
        if not self.freeze_gc or not gc.isenabled():
            await self._refresh()
            return
        gc.disable()
        try:
            await self._refresh()
        finally:
            gc.enable()

    async def _refresh(self) -> None:
        """One round: the queries, each with its deadline; the rows, the rules.

        Asked every refresh: each instance's newest scrape time (cheap), ``up`` and vtop on the
        boxes; the vLLM query (two halves at once) only when an instance has a scrape not read
        yet (else its last answer stands: Prometheus would answer the same samples). The trackers
        and the rules still run every refresh (a stall is time passing with no change).

        The slower parts (:attr:`SLOW_PARTS`, one per refresh in turn) are all asked and awaited
        the first time; after that each is sent at the end of a refresh and collected by the *next*:
        Prometheus works it out between refreshes, and no refresh waits on it (1,000 instances of 8
        GPUs with a new scrape each, 2 cores: 0.35 s a refresh when awaited; TTFT over a minute and
        DCGM's 15-30 s samples are no worse for being 5 s older)."""
        t0 = time.perf_counter()
        before = self.client.queries
        at = round(self.clock.base.time(), 3)
        mono = self.clock.base.monotonic()
        n = len(self.SLOW_PARTS)
        first = self._slow_vecs.keys() != set(range(n))
        slow_got: list[tuple[int, Any]] = self._collect_slow()
        inline = [(i, asyncio.ensure_future(self.client.query(self._slow_query(*self.SLOW_PARTS[i]), at=at)))
                  for i in range(n) if i not in self._slow_vecs] if first and self._slow_task is None else []
        light = [asyncio.ensure_future(self.client.query(p, at=at)) for p in (q.up_query(), q.vtop_query())]
        vllm: dict[tuple[str, str], q.Instance] | BaseException
        early: list[asyncio.Future[Any]] = []
        try:
            cache = self._vllm_cache
            due_at = self._due_at
            due = cache is not None and due_at is not None and at >= due_at + self.INGEST_SLACK_S
            if not due:
                if cache is not None and due_at is not None and at >= due_at:
                    # a scrape is due but may not be in Prometheus yet: the halves go with the check, and
                    # are used if it says a scrape is in (a round trip sooner), else dropped unread; the
                    # sample times are the check's (asked at the same moment: not worked out twice)
                    early = [asyncio.ensure_future(self.client.query(h, at=at)) for h in q.vllm_queries(ts=False)]
                ts = q.parse_ts(await self.client.query(q.ts_query(), at=at))
            if due or cache is None or any(k not in cache or cache[k].ts != v for k, v in ts.items()):
                with_ts = not early
                if with_ts:
                    early = [asyncio.ensure_future(self.client.query(h, at=at)) for h in q.vllm_queries()]
                halves = await asyncio.gather(*early)
                early = []
                vllm = q.parse_vllm([x for h in halves for x in h])
                if not with_ts:
                    for k, inst in vllm.items():
                        inst.ts = ts.get(k)
                self._note_scrapes(cache, vllm, at)
                self._vllm_cache = vllm
                self.vllm_asked += 1
            else:
                vllm = {k: inst for k, inst in cache.items() if k in ts}
        except Exception as e:  # noqa: BLE001 - PromError, or a parse of garbage
            vllm = e
        finally:
            if early:  # sent with the check, not needed (or the check failed): dropped
                for f in early:
                    f.cancel()
                await asyncio.gather(*early, return_exceptions=True)
        lres = await asyncio.gather(*light, return_exceptions=True)
        up: dict[tuple[str, str], float | None] = {}
        if not isinstance(vllm, BaseException):
            up = q.parse_up(lres[0]) if not isinstance(lres[0], BaseException) else {}
            if self.backfilled:
                await self._feed_live(at, mono, vllm, up)
        if inline:
            got_inline = await asyncio.gather(*(t for _, t in inline), return_exceptions=True)
            slow_got += [(i, r) for (i, _), r in zip(inline, got_inline)]
        res = [*lres, *(r for _, r in slow_got)]
        for r in res:
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r
        errs = [r for r in res if isinstance(r, BaseException)]
        self.last_queries = self.client.queries - before
        self.refreshes += 1
        if isinstance(vllm, BaseException):
            self._failed(vllm, mono)
        else:
            self.error = None
            self.error_since = None
            self.last_ok_wall = at
            self.partial = [_words(e) for e in errs]
            self.boxes = q.parse_vtop(res[1]) if not isinstance(res[1], BaseException) else {}
            if self._first_eval is None:
                self._first_eval = at
        self._take_slow(slow_got)
        if not isinstance(vllm, BaseException):
            self._rows(at, vllm, self._rates, up)
        self._judge(mono)
        if not first and self._slow_task is None and not isinstance(vllm, BaseException):
            # sent last: Prometheus works it out while this process has nothing to do (sent while the
            # trackers were fed, the two slowed each other on 2 cores: feeding took 1.3-1.5x as long)
            i = self._slot % n
            self._slow_task = (i, asyncio.ensure_future(self.client.query(self._slow_query(*self.SLOW_PARTS[i]),
                                                                          at=at)))
            self.last_queries += 1  # this refresh's, though it goes out once the refresh is done
        self.version += 1
        self.last_refresh_s = time.perf_counter() - t0

    #: a scrape's sample is in Prometheus this long after the time it carries (the scrape's start)
    INGEST_SLACK_S = 1.0
    #: the scrape interval most Prometheus configurations use for vLLM targets
    USUAL_SCRAPE_S = 15.0

    def _note_scrapes(self, old: dict[tuple[str, str], q.Instance] | None,
                      new: dict[tuple[str, str], q.Instance], at: float) -> None:
        """Each instance's scrape interval (the step between its last two sample times) and when
        the next scrape of any is due: from then on a refresh asks the vLLM query straight away,
        without the sample-time check first (a fleet whose scrapes are spread over the interval
        has one due at every refresh; the check then only cost a round trip). An instance already
        overdue when asked (down, or scraped slowly) is left to the check: else one dead target
        would have the whole vLLM query asked at every refresh."""
        gaps = self._scrape_gap
        due: float | None = None
        for k, inst in new.items():
            prev = old.get(k) if old is not None else None
            if inst.ts is None:
                continue
            if prev is not None and prev.ts is not None and inst.ts > prev.ts:
                gaps[k] = inst.ts - prev.ts
            g = gaps.get(k)
            if g is not None:
                nxt = inst.ts + g
                if nxt > at and (due is None or nxt < due):
                    due = nxt
        self._due_at = due

    def _collect_slow(self) -> list[tuple[int, Any]]:
        """The slower part sent by the last refresh, if its answer is in (else it goes on)."""
        task = self._slow_task
        if task is None or not task[1].done():
            return []
        self._slow_task = None
        i, fut = task
        if fut.cancelled():
            return []
        exc = fut.exception()
        if exc is None:
            self._slot += 1  # the next part is asked next; a failed one again
        return [(i, exc if exc is not None else fut.result())]

    def _take_slow(self, got: list[tuple[int, Any]]) -> None:
        ok = [(i, r) for i, r in got if not isinstance(r, BaseException)]
        for i, r in ok:
            # a GPU part is parsed as it comes, once (all three again at each was ~8 ms at 1,000 hosts)
            self._slow_vecs[i] = q.parse_gpu_part(r) if self.SLOW_PARTS[i][0] == "gpu" else r
        kinds = {self.SLOW_PARTS[i][0] for i, _ in ok}
        if "rates" in kinds:
            self._rates = q.parse_rates([x for i, v in self._slow_vecs.items()
                                         if self.SLOW_PARTS[i][0] == "rates" for x in v])
        if "gpu" in kinds:
            self.hosts = q.merge_gpu_parts(v for i, v in sorted(self._slow_vecs.items())
                                           if self.SLOW_PARTS[i][0] == "gpu")

    async def aclose(self) -> None:
        """Stop a slower query still out and close the client."""
        task, self._slow_task = self._slow_task, None
        if task is not None and not task[1].done():
            task[1].cancel()
            await asyncio.gather(task[1], return_exceptions=True)
        await self.client.aclose()

    def _failed(self, e: BaseException, mono: float) -> None:
        self.error = _words(e)
        if self.error_since is None:
            self.error_since = mono
        for row in self.rows.values():  # the trackers turn stale by age; the rows say so now
            if self.last_ok_wall is not None:
                row.sample_age_s = self.clock.base.time() - self.last_ok_wall

    #: points a history chunk may hold (series x steps): the answer of one ``query_range`` and what
    #: is parsed from it live at once; 1,000 instances read 300 s in one piece held ~290 MB at peak
    CHUNK_POINTS = 60_000

    async def backfill(self) -> None:
        """Feed the trackers and the rules from ``query_range`` over the history, step by step,
        in chunks of time (so a big fleet's history never sits in memory whole)."""
        end = self._first_eval or round(self.clock.base.time(), 3)
        span = self.config.history
        step = self.refresh_s
        per_step = max(1, 9 * len(self.rows))  # ~9 series an instance in the vLLM answer
        chunk = max(2, self.CHUNK_POINTS // per_step) * step
        start = end - span
        n = 0
        try:
            while start <= end:
                stop = min(end, start + chunk - step)
                n += await self._backfill_chunk(start, stop, step)
                start = stop + step
        except PromError as e:
            self.backfill_note = f"no history ({e.message}); the rules judge from now on"
        else:
            self.backfill_note = f"history: {n} steps of {step:g} s from Prometheus"
        finally:
            self.clock.at = None
            self._history_ts = {}
        if self._vllm_cache is not None:
            # the scrape intervals the history showed: the next scrape's time is known from the start
            self._note_scrapes(None, self._vllm_cache, self.clock.base.time())
        self.backfilled = True
        self._judge(self.clock.base.monotonic())
        self.version += 1
        if self.freeze_gc:
            # What was just built (a tracker, windows and rule state per instance) lives as long as
            # vtop: out of the cyclic collector's way. Its full passes walked all of it, ~0.1 s in
            # the middle of a refresh at 1,000 instances, every few refreshes (Python's gc.freeze).
            gc.collect()
            gc.freeze()

    async def _backfill_chunk(self, start: float, end: float, step: float) -> int:
        vr, ur = await asyncio.gather(
            self.client.query_range(q.vllm_query(), start=start, end=end, step=step),
            self.client.query_range(q.up_query(), start=start, end=end, step=step))
        steps = q.parse_vllm_range(vr)
        del vr
        ups: dict[float, dict[tuple[str, str], float | None]] = {}
        for s in ur:
            k = (s.labels.get("job", ""), s.labels.get("instance", ""))
            for t, v in s.points:
                ups.setdefault(t, {})[k] = v
        times = sorted(set(steps) | set(ups))
        last, gaps = self._history_ts, self._scrape_gap
        for t in times:
            mono = self.clock.mono_of(t)
            self.clock.at = (mono, t)
            insts = steps.pop(t, {})
            for k, inst in insts.items():  # each instance's scrape interval, as the live refreshes note it
                ts, prev = inst.ts, last.get(k)
                if ts is not None:
                    if prev is not None and ts > prev:
                        gaps[k] = ts - prev
                    last[k] = ts
            self._feed(t, mono, insts, ups.get(t, {}))
            self.monitor.tick()
        return len(times)

    # ------------------------------------------------------------------ feeding the monitor

    #: instances fed between two turns of the event loop (the screen stays responsive, and the
    #: slower query just sent goes out): ~100 instances are ~8 ms
    FEED_CHUNK = 100

    def _feed(self, t: float, mono: float, vllm: dict[tuple[str, str], q.Instance],
              up: dict[tuple[str, str], float | None]) -> None:
        for _ in self._feed_steps(t, mono, vllm, up, len(self._known) + len(vllm) + len(up) + 1):
            pass

    async def _feed_live(self, t: float, mono: float, vllm: dict[tuple[str, str], q.Instance],
                         up: dict[tuple[str, str], float | None]) -> None:
        for _ in self._feed_steps(t, mono, vllm, up, self.FEED_CHUNK):
            await asyncio.sleep(0)

    def _feed_steps(self, t: float, mono: float, vllm: dict[tuple[str, str], q.Instance],
                    up: dict[tuple[str, str], float | None], chunk: int) -> Iterator[None]:
        """Feed every known instance's poll to the monitor, ``chunk`` at a time (yields between)."""
        for k in vllm:
            self._known.setdefault(_url(k[1]), k)
        for k, v in up.items():
            if v is not None and k[1]:
                self._known.setdefault(_url(k[1]), k)
        done = 0
        stale_after = self.stale_after_s
        fed_ts = self._fed_ts
        apply, poll_of = self.monitor.apply_server, self._poll
        for url, k in list(self._known.items()):
            inst = vllm.get(k)
            upv = up.get(k)
            ts = inst.ts if inst is not None else None
            if ts is not None and (upv is None or upv >= 1) and t - ts <= stale_after:
                # One poll per scrape, at the scrape's own time: Prometheus answers the same sample
                # until its next scrape (every 15-60 s), and fed at every refresh the counters would
                # read flat for most of that: a stalled engine every 20 s.
                if fed_ts.get(url) == ts:
                    continue
                fed_ts[url] = ts
                at = min(ts, t)
                poll = poll_of(at, mono - (t - at), url, k, inst, upv, now=t)
            else:
                poll = poll_of(t, mono, url, k, inst, upv)
            apply(url, poll)
            done += 1
            if done % chunk == 0:
                yield

    def _poll(self, t: float, mono: float, url: str, k: tuple[str, str], inst: q.Instance | None,
              upv: float | None, *, now: float | None = None) -> ServerPoll:
        """The poll of one instance at ``t`` (``now``: the refresh's time, when ``t`` is its scrape's)."""
        now = t if now is None else now
        job, instance = k
        if upv is not None and upv < 1:
            return ServerPoll(t, mono, url, False, "refused",
                              f"Prometheus cannot scrape {instance} (up == 0 in job {job})", None, 0)
        if inst is None:
            if upv is not None:
                return ServerPoll(t, mono, url, False, "not vllm",
                                  f"Prometheus scrapes {instance} (up == 1) but it has no {_FAMILIES} series "
                                  "(vLLM's --disable-log-stats? SGLang without --enable-metrics?)", None, 0)
            return ServerPoll(t, mono, url, False, "refused",
                              f"{instance} is gone from Prometheus (no up, no {_FAMILIES} series)", None, 0)
        if inst.ts is not None and now - inst.ts > self.stale_after_s:
            return ServerPoll(t, mono, url, False, "timeout",
                              f"Prometheus' newest sample of {instance} is {dur(now - inst.ts)} old", None, 0)
        # the families Prometheus does not give the fleet share one empty read-only mapping (five
        # dicts fewer a scrape); the finishes are the parse's own dict, never changed after it
        m = VllmMetrics(model_name=inst.model_name, running=inst.running, waiting=inst.waiting,
                        kv_cache_usage=inst.kv, prompt_tokens_total=inst.prompt, generation_tokens_total=inst.gen,
                        preemptions_total=inst.preempt, request_success_total=inst.finished, is_vllm=True,
                        engine_kind=inst.engine,
                        model_names=(inst.model_name,) if inst.model_name else (), waiting_by_reason=_NONE,
                        spec_accepted_per_pos=_NONE, prompt_tokens_by_source=_NONE, sleep_state=_NONE,
                        http_requests_by_status=_NONE)
        return ServerPoll(t, mono, url, True, None, "", None, 0, metrics=m)

    # ------------------------------------------------------------------ the table

    def _rows(self, at: float, vllm: dict[tuple[str, str], q.Instance], rates: dict[tuple[str, str], q.Rates],
              up: dict[tuple[str, str], float | None]) -> None:
        keys = set(vllm) | {k for k, v in up.items() if v is not None} | set(self._known.values())
        known, rows, hosts, boxes = self._known, self.rows, self.hosts, self.boxes
        stale_after = self.stale_after_s
        for k in keys:
            job, instance = k
            row = self._row_of.get(k)
            if row is None:
                url = _url(instance)
                known.setdefault(url, k)
                key = f"{job}/{instance}"
                row = rows.get(key)
                if row is None:
                    row = rows[key] = FleetRow(key, job, instance, url, q.host_of(instance))
                self._row_of[k] = row
            inst = vllm.get(k)
            r = rates.get(k)
            upv = up.get(k)
            row.gpus = hosts.get(row.host)
            if boxes:  # vtop on the boxes (``vtop export``): none in most fleets
                row.on_box = boxes.get((row.host, q.port_of(instance)))
                extra = boxes.get((row.host, "*"))
                if extra is not None:
                    row.on_box = row.on_box or q.BoxView()
                    row.on_box.alerts = [*row.on_box.alerts, *extra.alerts]
            else:
                row.on_box = None
            if inst is not None:
                row.model = inst.model_name or row.model
                row.engine = inst.engine or row.engine
                row.running, row.waiting = inst.running, inst.waiting
                row.kv_pct = None if inst.kv is None else 100.0 * inst.kv
                row.engines = inst.engines
                row.sample_age_s = None if inst.ts is None else max(0.0, at - inst.ts)
            else:
                row.running = row.waiting = row.kv_pct = None
                row.sample_age_s = None
            row.ttft_p50, row.ttft_p99 = (r.ttft_p50, r.ttft_p99) if r is not None else (None, None)
            # the state before the trackers have it: up / ts
            if upv is not None and upv < 1:
                row.state, row.message = "down", f"Prometheus cannot scrape it (up == 0, job {job})"
            elif inst is None:
                row.state, row.message = ("not vllm", f"up, but no {_FAMILIES} series") if upv is not None else \
                    ("down", "gone from Prometheus")
            elif row.sample_age_s is not None and row.sample_age_s > stale_after:
                row.state, row.message = "stale", f"newest sample {dur(row.sample_age_s)} old"
            else:
                row.state, row.message = "up", "up"

    def _judge(self, now: float) -> None:
        """The monitor's rules, the fleet's own two, each alert on its row, worst first."""
        mon = self.monitor
        if self.backfilled:
            mon.tick()
        by_url: dict[str, FleetRow] = {r.url: r for r in self.rows.values()}
        alerts: list[Alert] = []
        servers, backfilled = mon.servers, self.backfilled
        for row in self.rows.values():
            ws = servers.get(row.url)
            v = ws.last_view if ws is not None else None
            if v is not None and backfilled:
                st, since, _ = ws.tracker.state_now(now)  # type: ignore[union-attr]
                row.state = st
                if st == v.state:
                    row.message = v.message
                # rates from the tracker's windows over the counters, as on the box
                row.gen_tps, row.preempt_ps = v.gen_tps, v.preemptions_ps
                fin = v.finished
                row.finished = None if fin is None else {a: b for a, b in fin.items() if b} if fin else {}
                if row.finished is None and st in ("up", "restarted") and v.metrics is not None \
                        and not v.metrics.request_success_total and (row.engine or "vllm") in q.FINISH_ENGINES:
                    row.finished = {}  # no reason above zero: none finished (not a gap; an engine without a
                    # finish counter stays a gap)
                b = row.on_box
                if st == "down" and b is not None and b.phase:
                    # Prometheus only sees a refused port; vtop on the box reads the start in the log
                    row.state = "starting"
                    took = f" for {dur(b.phase_s)}" if b.phase_s is not None else ""
                    row.message = f"vtop on the box: starting, in {b.phase}{took} (the port refuses until ready)"
                    st = "starting"
                if st == "down":
                    last = v.last_ok_mono
                    alerts.append(down_alert(row.url, row.instance, row.host, since=since, now=now,
                                             why=v.last_error_message or row.message,
                                             last_ok_ago=None if last is None else now - last, engine=row.engine))
            elif row.state == "down" and self.error is None:
                alerts.append(down_alert(row.url, row.instance, row.host, since=now, now=now, why=row.message,
                                         last_ok_ago=None, engine=row.engine))
        for a in mon.alerts:
            owner = by_url.get(a.target or "")
            alerts.append(on_the_box(a, owner.host, owner.engine) if owner is not None else a)
        seen: set[int] = set()
        for h in self.hosts.values():
            if h.xid and id(h) not in seen:
                seen.add(id(h))
                names = h.names()
                urls = [r.url for r in self.rows.values() if r.host in names]
                alerts.append(xid_alert(h.host, h.xid, urls, now=now))
        alerts.sort(key=lambda a: (RANK.get(a.severity, 9), a.since if a.since is not None else now, a.rule,
                                   a.target or ""))
        self.alerts = alerts
        by_target: dict[str, list[Alert]] = {}
        xid_by_host: dict[str, list[Alert]] = {}
        for a in alerts:  # one pass (each row over every alert was O(rows x alerts): 16 ms a refresh)
            by_target.setdefault(a.target or "", []).append(a)
            if a.rule == "gpu_xid":
                xid_by_host.setdefault(a.target or "", []).append(a)
        for row in self.rows.values():
            own = by_target.get(row.url, ())
            g = row.gpus
            xid = xid_by_host.get(f"host:{g.host}", []) if g is not None and xid_by_host else []
            mine = tuple(a for a in alerts if a in own or a in xid) if xid else tuple(own)
            row.alerts = mine
            row.box = box_hint(row.host) if mine and any(a.rule in _NEEDS_BOX for a in mine) else None

    # ------------------------------------------------------------------ reading

    def sorted_rows(self) -> list[FleetRow]:
        """Worst first, then by instance."""
        return sorted(self.rows.values(), key=lambda r: (r.worst, r.instance))

    async def drill(self, key: str) -> Drill:
        """One instance: its tracker's view (the same server card) and its host's GPUs from
        ``query_range`` over the history (full sparklines at once)."""
        row = self.rows[key]
        ws = self.monitor.servers.get(row.url)
        view = ws.tracker.view() if ws is not None else None
        if view is not None and (row.ttft_p50 is not None or row.ttft_p99 is not None):
            view = dataclasses.replace(view, ttft=Quantiles(row.ttft_p50, None, row.ttft_p99, None, None, 60.0,
                                                            False))
        hist = GpuHistory(self.config.history)
        drill = Drill(row, view, hist)
        end = self.clock.base.time()
        try:
            series = await self.client.query_range(q.gpu_detail_query(row.gpus.host if row.gpus else row.host),
                                                   start=end - self.config.history, end=end, step=self.refresh_s)
        except PromError as e:
            drill.error = e.message
            return drill
        for t, gpus in q.parse_gpu_detail(series).items():
            samples = []
            for idx in sorted(gpus):
                p = gpus[idx]
                total = None if p.fb_used_mib is None or p.fb_free_mib is None else p.fb_used_mib + p.fb_free_mib
                samples.append(GpuSample(idx, p.name, p.uuid, util_gpu=p.util,
                                         mem_used=None if p.fb_used_mib is None else int(p.fb_used_mib * 2**20),
                                         mem_total=None if total is None else int(total * 2**20),
                                         power_w=p.power_w, sm_active=p.sm))
                drill.gpu_names[idx] = p.name
            hist.add(GpuPoll(t, self.clock.mono_of(t), OK, gpus=tuple(samples)))
        return drill

    def to_json(self) -> dict[str, Any]:
        """The fleet's state for ``--once --json`` (schema ``vtop.fleet/1``)."""
        return fleet_json(self)


_NEEDS_BOX = ("runaway", "engine_stall", "startup_stall", "startup_failure", "engine_died", "oom_startup",
              "oom_transient", "oom_steady", "api_unresponsive")


#: what the fleet's polls carry for a labelled family Prometheus does not give it
_NONE: Mapping[str, float] = MappingProxyType({})
#: every engine's families, as a row's message says them ("vllm:* or sglang:*")
_FAMILIES = " or ".join(f"{p}*" for p in ENGINE_PREFIXES)


def _url(instance: str) -> str:
    return f"http://{instance}"


def _words(e: BaseException) -> str:
    if isinstance(e, PromError):
        return e.message
    return f"{type(e).__name__}: {e}"


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)


def fleet_json(f: Fleet) -> dict[str, Any]:
    rows = []
    for r in f.sorted_rows():
        g = r.gpus
        rows.append({
            "job": r.job, "instance": r.instance, "host": r.host, "engine": r.engine, "model": r.model,
            "state": r.state,
            "message": r.message, "running": _r(r.running, 0), "waiting": _r(r.waiting, 0),
            "kv_cache_pct": _r(r.kv_pct), "gen_tokens_per_s": _r(r.gen_tps), "preemptions_per_s": _r(r.preempt_ps, 2),
            "ttft_p50_s": _r(r.ttft_p50, 3), "ttft_p99_s": _r(r.ttft_p99, 3),
            "finished_last_min": r.finished, "engines": r.engines, "sample_age_s": _r(r.sample_age_s),
            "gpus": None if g is None else {
                "host": g.host, "count": g.n, "util_mean_pct": _r(g.util), "sm_active_mean_pct": _r(g.sm),
                "mem_used_pct": _r(g.mem_pct), "power_w": _r(g.power_w), "xid": dict(g.xid)},
            "alerts": [a.rule for a in r.alerts],
            "needs_the_box": r.box,
            "from_vtop_on_the_box": None if r.on_box is None else {
                "startup_phase": r.on_box.phase, "startup_phase_s": _r(r.on_box.phase_s),
                "oldest_request_age_s": _r(r.on_box.oldest_s),
                "alerts": [{"rule": a, "severity": b} for a, b in r.on_box.alerts]},
        })
    return {
        "prometheus": f.client.base,
        "refresh_s": f.refresh_s,
        "error": f.error,
        "partial_errors": list(f.partial),
        "history": f.backfill_note,
        "queries_per_refresh": f.last_queries,
        "instances": rows,
        "alerts": [a.to_json() for a in f.alerts],
        "cannot_know": list(BOX_ONLY),
    }
