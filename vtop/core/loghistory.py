"""The server log's history: its stamped stats lines, read back as a time series. Pure: no I/O.

vtop's rules judge what they saw of ``/metrics``; ``vtop doctor --window 15`` (or the
screen just attached) sees 15 s of it. The log remembers more: while requests run, vLLM
writes a stats line every 10 s (``VLLM_LOG_STATS_INTERVAL``), stamped
``LEVEL MM-DD HH:MM:SS`` in the local time of the server's box, with no year::

    (APIServer pid=1551) INFO 12-02 01:43:37 [loggers.py:335] Engine 000: Avg prompt throughput:
    5.7 tokens/s, Avg generation throughput: 127.4 tokens/s, Running: 1 reqs, Waiting: 0 reqs,
    CPU KV cache usage: 0.2%, Prefix cache hit rate: 0.0%

Forms across versions (facts from the vLLM sources): V0 ``Running: N reqs, Swapped: N reqs,
Pending: N reqs, GPU KV cache usage: X%, CPU KV cache usage: Y%``; V1 0.8+ ``Engine 000:``
before it (``N Engines Aggregated:`` with data parallelism), ``Waiting:`` instead of
``Pending:``; 0.12+ ``Preemptions: N`` (only when N > 0, the count in that interval) between
Waiting and the KV usage, 0.20+ ``Deferred: N reqs``; 0.33 ``<DEV> KV cache usage`` and an
optional ``KV fetch: ...`` part. An interval with no throughput, after another such
interval, is logged at DEBUG: **silence after a line with zero throughput means the next
interval had none either** (an idle server, or a frozen engine). The shm-broadcast line
``No available shared memory broadcast block found in 60 seconds`` says a worker did not
answer for a minute.

SGLang's scheduler logs its own periodic lines (``Decode batch, #running-req: ...`` every 40 decode steps,
``Prefill batch, #new-seq: ...`` for every batch of new requests; :data:`STATS_LINES` has each engine's
patterns, the words of SGLang's are below): they go into the same history, one point a second per
data-parallel rank. What the rules ask of the history holds for them with one difference said where it
matters: an SGLang engine logs nothing while it makes no step (no line with zero throughput), so its silence
is not read as "no token made" (:meth:`LogHistoryView.quiet_since` needs a line with zero throughput).

:class:`LogHistory` is fed every line with when it was read (monotonic and wall clock),
keeps the last ``keep_s`` (15 min) of stats lines by their stamps, bounded in count, and
:meth:`LogHistory.snapshot` gives a frozen :class:`LogHistoryView` on the monitor's
monotonic clock that the rules question: since when has no token been made
(:meth:`LogHistoryView.quiet_since`), since when has no request begun while some ran
(:meth:`LogHistoryView.no_new_request_since`), has ``running`` stayed up since a time
(:meth:`LogHistoryView.busy_through`), the KV usage points of a window.

The stamp's clock (:mod:`vtop.core.logclock`): the log's clock minus vtop's wall clock is
measured from the lines as they arrive (a whole time-zone offset, or the measured one of a
skewed clock), and for a backlog read at attach from its last line against the file's
modification time. A line vtop saw arrive is news: the backlog's lag is 0 once a line came
after the attach.
"""

from __future__ import annotations

import calendar
import math
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from vtop.core.logclock import LAG_MIN_S, LogClock, local_offset

__all__ = ["STATS_LINES", "STATS_NEEDLES", "LogHistory", "LogHistoryView", "StatsLine", "StatsPoint", "in_flight",
           "parse_stats"]

STATS_RE = re.compile(
    r"(?:Engine (?P<engine>\d+): |(?P<nagg>\d+) Engines Aggregated: )?"
    r"Avg prompt throughput: (?P<ptps>[\d.]+) tokens/s, Avg generation throughput: (?P<gtps>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, (?:Swapped: \d+ reqs, Pending|Waiting): (?P<waiting>\d+) reqs"
    r"(?:, Deferred: \d+ reqs)?(?:, KV fetch: \d+ waiting to start, \d+ in progress, \d+ completed waiting)?"
    r"(?:, Preemptions: (?P<preempt>\d+))?"
    r"(?:, (?:[A-Za-z]+ )?KV cache usage: (?P<kv>[\d.]+)%)?"
)

# SGLang's scheduler logs two lines of the same kind (read in SGLang 0.5.17's
# ``srt/managers/scheduler_components/metrics_reporter.py``, ``report_decode_stats`` and ``report_prefill_stats``;
# 0.5.6 and older in ``srt/managers/scheduler_metrics_mixin.py``, the same fields). Only attention-TP rank 0 of
# each data-parallel group logs them (``is_stats_logging_rank``), tagged by its ranks in the record's prefix
# (``[2026-12-05 03:00:12 DP1 TP0]``):
#
# * ``Decode batch, #running-req: 1, #token: 90, token usage: 0.00, cuda graph: True, gen throughput (token/s):
#   125.14, #queue-req: 0`` every ``--decode-log-interval`` decode steps (40 by default), while requests decode;
#   ``gen throughput`` is the tokens made since the last such line over the time since it. Older releases end
#   the first word with ``.`` and the line with ``, ``; ``SGLANG_LOG_FORWARD_ITERS`` puts `` [N]`` after
#   ``batch``; speculative decoding adds ``accept len: ...``, PD disaggregation its queues, ``cpu graph`` /
#   ``npu graph`` on other devices.
# * ``Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0,
#   #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 41.2`` for every batch of
#   new requests (each chunk of a chunked prefill); 0.5.6 and older end after ``#queue-req``. vtop reads
#   ``#new-token``: the prompt tokens taken in that line's second (the stamps are whole seconds), summed over
#   the second's prefill lines, not SGLang's ``input throughput`` (new tokens over the time since the last
#   prefill line, which an idle spell before it makes near zero, and older releases do not log).
#
# The KV use is the ``token usage`` (0..1) of the KV pool; a hybrid model logs each pool (``full token usage``,
# ``swa token usage``, ``mamba usage``; HiSparse ``gpu token usage`` beside the host's ``cpu token usage``): the
# fullest GPU pool is read, as SGLang's own ``sglang:token_usage`` gauge does.
SGL_DECODE_RE = re.compile(
    r"Decode batch(?: \[\d+\])?[.,] #running-req: (?P<running>\d+), .*?"
    r"gen throughput \(token/s\): (?P<gtps>[\d.]+), #queue-req: (?P<waiting>\d+)"
)
SGL_PREFILL_RE = re.compile(
    r"Prefill batch(?: \[\d+\])?[.,] #new-seq: (?P<new>\d+), #new-token: (?P<ptok>\d+), #cached-token: \d+, .*?"
    r"#running-req: (?P<running>\d+), #queue-req: (?P<waiting>\d+)"
)
SGL_USAGE_RE = re.compile(r"(?:^|, )(?:(?:full|swa|gpu) token|token|mamba) usage: (?P<v>\d+(?:\.\d+)?)")


@dataclass(frozen=True, slots=True)
class StatsLine:
    """One kind of an engine's periodic stats line.

    ``pattern``'s named groups say what the line gives: ``running`` and ``waiting`` (requests); ``gtps``
    generation tokens/s; ``ptps`` prompt tokens/s (a rate: lines of one second are not added), or ``ptok`` the
    prompt tokens taken in the line's second (lines of one second add up); ``kv`` the KV cache use in %;
    ``preempt`` preemptions in the interval; ``engine`` / ``nagg`` vLLM's data-parallel tag; ``new`` the requests
    the line's batch took in, in flight beside ``running`` and ``waiting`` (SGLang's ``#new-seq``: its Prefill
    line's ``#running-req`` counts the batch that was decoding before them). A group the pattern lacks is 0
    (throughputs, new requests) or not known (KV use, preemptions)."""

    #: a cheap test before the pattern (``in`` the message), and what the attach-time read of the log's tail
    #: looks for (:data:`vtop.monitor.logwatch.BACKFILL_NEEDLES`)
    needle: str
    pattern: re.Pattern[str]
    #: the KV pools' used fractions (0..1, group ``v``): the fullest is the line's KV use
    usage: re.Pattern[str] | None = None


#: Each engine's periodic stats lines, by the engine of the log's line format (:attr:`LogEvent.engine
#: <vtop.core.phases.patterns.LogEvent.engine>`; vLLM's where it is None). The rules and the history read
#: whichever engine's lines come: no rule names an engine.
STATS_LINES: dict[str, tuple[StatsLine, ...]] = {
    "vllm": (StatsLine("Avg prompt throughput", STATS_RE),),
    "sglang": (StatsLine("Decode batch", SGL_DECODE_RE, SGL_USAGE_RE),
               StatsLine("Prefill batch", SGL_PREFILL_RE, SGL_USAGE_RE)),
}
#: every engine's needles (the attach-time tail read's)
STATS_NEEDLES: tuple[str, ...] = tuple(sl.needle for lines in STATS_LINES.values() for sl in lines)
#: SGLang's data-parallel rank in a record's prefix (``DP1 TP0``): the lines of one rank are one series
_DP_RANK_RE = re.compile(r"\bDP\d+\b")
SHM_WAIT = "No available shared memory broadcast block found"
#: vLLM's stats interval (``VLLM_LOG_STATS_INTERVAL``, 10 s by default; V0 logs every 5 s)
STATS_INTERVAL_S = 10.0
#: slack for the 1 s resolution of the stamps and the interval's jitter (lines land at 10.0-10.4 s)
SLACK_S = 2.0
#: a stats line with at most this share of the throughput of the line before it (requests running
#: in both) is the interval an engine stopped in (:meth:`LogHistoryView.stopped_within`)
COLLAPSE_FRAC = 0.25
#: while it worked in that interval the engine is taken to have run at no less than this share of
#: the rate before (with the same requests running, a decode step costs about the same)
RATE_FLOOR = 0.5


@dataclass(frozen=True, slots=True)
class StatsPoint:
    """One stats line (the engines of one second summed), on the monitor's monotonic clock."""

    mono: float
    prompt_tps: float
    gen_tps: float
    running: int
    waiting: int
    kv_pct: float | None
    preemptions: int | None
    arrived: float | None = None
    """When vtop saw it arrive (monotonic), after the backlog; None: in the backlog vtop read at attach (or
    not known). A line that came after vtop's first poll of the server is news, whatever its stamp says, and
    never part of what came before (:mod:`vtop.core.backfill`)."""


def parse_stats(message: str, engine: str | None = None,
                rank: str | None = None) -> tuple[str, float, float, int, int, float | None, int | None] | None:
    """(engine, prompt tok/s, generation tok/s, running, waiting, KV %, preemptions) of a stats
    line's message (:data:`STATS_LINES` of ``engine``, vLLM's when None), or None for any other line.
    The first item is the series the line belongs to: vLLM's data-parallel engine (``000``, ``agg2``), SGLang's
    data-parallel rank read from the record's prefix ``rank`` (``DP1``), ``-`` for the only one."""
    got = _parse(message, engine, rank)
    return None if got is None else got[0]


def in_flight(message: str, engine: str | None = None, rank: str | None = None) -> tuple[str, int] | None:
    """(series, requests in flight) of a stats line's message (:data:`STATS_LINES` of ``engine``, vLLM's when
    None; the series as :func:`parse_stats` says it), or None for any other line. In flight: running, waiting
    and the requests the line's batch took in (``new``). 0 says that series had nothing in flight when it
    logged: vLLM's line after its requests ended says ``Running: 0 reqs, Waiting: 0 reqs``; SGLang's lines
    never say 0 (a Decode batch is logged for a batch of at least one request, a Prefill batch takes at least
    one new one, and an idle scheduler logs nothing)."""
    got = _parse(message, engine, rank)
    if got is None:
        return None
    stats, _, new = got
    return stats[0], stats[3] + stats[4] + new


def _parse(message: str, engine: str | None, rank: str | None
           ) -> tuple[tuple[str, float, float, int, int, float | None, int | None], bool, int] | None:
    """:func:`parse_stats`, whether the line's prompt figure is tokens of its second (lines of one second add),
    and the requests its batch took in (``new``, 0 where the line does not say)."""
    for sl in STATS_LINES.get(engine or "vllm", ()):
        if sl.needle not in message:
            continue
        m = sl.pattern.search(message)
        if m is None:
            return None
        g = m.groupdict()
        try:
            kv = float(g["kv"]) if g.get("kv") is not None else None
            if kv is None and sl.usage is not None:
                kv = max((round(100.0 * float(u.group("v")), 9) for u in sl.usage.finditer(message)), default=None)
            if g.get("engine") is not None:
                key = g["engine"]
            elif g.get("nagg") is not None:
                key = f"agg{g['nagg']}"
            else:
                dp = _DP_RANK_RE.search(rank) if rank else None
                key = dp.group(0) if dp is not None else "-"
            ptok = g.get("ptok")
            prompt = float(ptok if ptok is not None else g.get("ptps") or 0.0)
            return ((key, prompt, float(g.get("gtps") or 0.0), int(g["running"]), int(g["waiting"]),
                     kv if kv is None or math.isfinite(kv) else None,
                     int(g["preempt"]) if g.get("preempt") is not None else None), ptok is not None,
                    int(g.get("new") or 0))
        except ValueError:
            return None
    return None


_NEEDLES: dict[str, tuple[str, ...]] = {e: tuple(sl.needle for sl in lines) for e, lines in STATS_LINES.items()}


def _combine(old: tuple[Any, ...], new: tuple[Any, ...], arr: float | None, *, adds: bool) -> tuple[Any, ...]:
    """Two distinct stats lines of one second and one engine (SGLang's Decode and Prefill batches): the prompt
    tokens of the second added where the lines count tokens (``adds``), else the larger rate; the larger
    generation rate, running, waiting and KV use (counts of one moment each, of the same requests); the
    preemptions added; the earliest arrival (None, the backlog, first)."""
    p, g, r, w, kv, pre, a = old
    p2, g2, r2, w2, kv2, pre2 = new
    return (p + p2 if adds else max(p, p2), max(g, g2), max(r, r2), max(w, w2),
            kv if kv2 is None else (kv2 if kv is None else max(kv, kv2)),
            pre if pre2 is None else (pre2 if pre is None else pre + pre2),
            None if a is None or arr is None else min(a, arr))


def _stamp_seconds(stamp: tuple[int, int, int, int, int], year: int) -> float | None:
    mon, day, hh, mi, ss = stamp
    try:
        return float(calendar.timegm((year, mon, day, hh, mi, ss, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


@dataclass(frozen=True)
class LogHistoryView:
    """The stats lines of the last minutes, oldest first, and the shm-broadcast waits, on
    the monotonic clock of the monitor at the poll (``mono``)."""

    mono: float
    stats: tuple[StatsPoint, ...] = ()
    shm_waits: tuple[float, ...] = ()
    offset_s: float | None = None
    """The log's clock minus the wall clock (the box's UTC offset), as worked out."""
    backlog_lag_s: float = 0.0
    """How long before vtop read it the backlog's last line was written (:meth:`LogHistory.backlog_lag`)."""
    backlog_lag_from: str | None = None
    """What says so: "stamp" (the last line's time stamp) or "mtime" (the file's modification time)."""
    wall: float | None = None
    """The wall clock at ``mono`` (with ``offset_s``, :meth:`to_mono` puts a log time on the monitor's clock)."""

    def to_mono(self, t: float | None) -> float | None:
        """A time on the log's clock (a stamp read as UTC, as the phase tracker keeps them) on the
        monitor's monotonic clock, by the measured offset; None when the offset is not known."""
        if t is None or self.offset_s is None or self.wall is None:
            return None
        return t - self.offset_s + (self.mono - self.wall)

    @property
    def last(self) -> StatsPoint | None:
        return self.stats[-1] if self.stats else None

    def quiet_since(self, now: float) -> tuple[float, int] | None:
        """(since when, running then): no token made and no prompt taken from that time until
        ``now``, while requests were running, by the log alone. The trailing stats lines with
        zero throughput and ``running`` >= 1 say no token was made in their intervals; the
        silence after such a line says the same of the intervals after it (vLLM drops a
        second zero interval to DEBUG). None when the last line shows throughput (or none
        shows running requests), or when a line is overdue after a busy one."""
        run = self._quiet_run(now)
        return None if run is None else (run[1], run[2])

    def stopped_within(self, now: float) -> tuple[float, str] | None:
        """(about when, why): where :meth:`quiet_since` starts at a line that still made
        tokens, but at most ``COLLAPSE_FRAC`` of the generation throughput of the line before
        it, requests running in both, that line's interval is the one the engine stopped in:
        a frozen engine leaves its interval partly filled. How long the engine worked in it
        is bounded: its generated tokens at no less than ``RATE_FLOOR`` of the earlier rate
        (the same requests decode at about the same speed), its prompt tokens at no less than
        the highest prompt throughput any stats line shows (an interval's average cannot beat
        the engine's speed). Taking that work at the interval's start, the engine stopped
        about then. An estimate (the work could have been spread over the interval), so said
        as "about"; ``None`` when the lines show no such collapse."""
        run = self._quiet_run(now)
        if run is None:
            return None
        i, start, _ = run
        pts = self.stats
        if i < 2:
            return None
        prev, pp = pts[i - 1], pts[i - 2]
        if start != prev.mono or prev.running < 1 or pp.running < 1 or pp.gen_tps <= 0:
            return None
        span = prev.mono - pp.mono
        if span <= 0 or span > STATS_INTERVAL_S + SLACK_S or prev.gen_tps > COLLAPSE_FRAC * pp.gen_tps:
            return None
        worked = prev.gen_tps * span / (RATE_FLOOR * pp.gen_tps)
        if prev.prompt_tps > 0:
            fastest = max(p.prompt_tps for p in pts)
            worked += prev.prompt_tps * span / fastest
        if worked >= span:
            return None
        t = pp.mono + worked
        return (t, f"the stats line {now - prev.mono:.0f} s ago made {prev.gen_tps:g} tokens/s, "
                   f"{prev.gen_tps / pp.gen_tps * 100:.0f} % of the {pp.gen_tps:g} of the line before it with "
                   f"{prev.running} request(s) running: its work took at most {worked:.1f} s of its {span:.0f} s "
                   f"(decoding at half the earlier rate or more), so the engine stopped about {now - t:.0f} s ago")

    def _quiet_run(self, now: float) -> tuple[int, float, int] | None:
        """(index of the first of the trailing zero lines, since when, least running) for
        :meth:`quiet_since`."""
        pts = self.stats
        if not pts:
            return None
        last = pts[-1]
        if last.gen_tps > 0 or last.prompt_tps > 0 or last.running < 1:
            return None
        i = len(pts) - 1
        while i > 0:
            p = pts[i - 1]
            if p.gen_tps > 0 or p.prompt_tps > 0 or p.running < 1 or pts[i].mono - p.mono > STATS_INTERVAL_S + SLACK_S:
                break
            i -= 1
        first = pts[i]
        # The first zero line covers the interval before it: no token since its start.
        start = first.mono - STATS_INTERVAL_S
        prev = pts[i - 1] if i > 0 else None
        if prev is not None and first.mono - prev.mono <= STATS_INTERVAL_S + SLACK_S:
            start = max(start, prev.mono)
        else:
            start = first.mono  # the interval before it is unknown: only from the line on
        return (i, start, min(p.running for p in pts[i:])) if start < now else None

    def stalled_since(self, now: float, first_seen: float) -> tuple[float, str, bool] | None:
        """(since when, why) the engine made no token, by the log, for a server whose
        ``/metrics`` showed requests running and nothing moving from ``first_seen`` on:
        the trailing stats lines with zero throughput and requests running
        (:meth:`quiet_since`) when they reach ``first_seen``, taken back into the interval the
        engine stopped in when the line before them shows it (:meth:`stopped_within`), or a
        shm-broadcast wait (a worker silent 60 s) logged since a minute before ``first_seen``.
        The last item says whether the time is the interval's estimate (said "about")."""
        out: tuple[float, str, bool] | None = None
        q = self.quiet_since(now)
        if q is not None and self.stats[-1].mono >= first_seen - 300.0:
            out = (q[0], f"the log's stats lines show no token made since {now - q[0]:.0f} s ago with "
                         f"{q[1]} request(s) running (vLLM stops the line after two idle intervals)", False)
            est = self.stopped_within(now)
            if est is not None and est[0] < q[0]:
                out = (est[0], f"{out[1]}; {est[1]}", True)
        for t in self.shm_waits:
            if first_seen - 60.0 <= t <= now and (out is None or t - 60.0 < out[0]):
                out = (t - 60.0, f"the log says a worker did not answer for 60 s ({now - t:.0f} s ago: "
                                 "'No available shared memory broadcast block found in 60 seconds')", False)
        return out

    def oldest_running(self, now: float, first_seen: float, prompt_flat: bool,
                       named: tuple[str, float | None, bool, Any, bool] | None) -> tuple[float, float | None, str] | None:
        """(since, running then, why): a request running now has run since ``since`` at
        least, by the log, for a server whose ``/metrics`` showed requests running in every
        sample from ``first_seen`` on. Either no request began since a stats line where
        requests ran (:meth:`no_new_request_since`; the lines must reach ``first_seen`` and
        ``prompt_flat`` say ``/metrics`` saw no prompt token since), or the request log names
        a request sent without ``max_tokens`` (``named``: id, age, ..., client omitted it),
        not aborted, and every stats line since it came shows requests running
        (:meth:`busy_through`)."""
        best: tuple[float, float | None, str] | None = None
        nn = self.no_new_request_since()
        if nn is not None and prompt_flat and self.stats[-1].mono >= first_seen - SLACK_S:
            t0, r0 = nn
            best = (t0, float(r0), f"the log's stats lines: {r0} request(s) running {now - t0:.0f} s ago, and in "
                                   "every line since requests ran and no prompt was taken (no request began)")
        if named is not None and named[4] and named[1] is not None:
            t_recv = now - named[1]
            if (best is None or t_recv < best[0]) and self.busy_through(t_recv, now):
                best = (t_recv, None, f"the request log: {named[0]} came {named[1]:.0f} s ago without max_tokens "
                                      "and was not aborted; every stats line since shows requests running")
        return best

    def no_new_request_since(self) -> tuple[float, int] | None:
        """(t0, running at t0): requests ran at the stats line ``t0``, and every later line
        shows ``running`` >= 1 and no prompt throughput (no request began: a new one must
        be prefilled), each within a stats interval of the one before. The requests running
        since are all from ``t0`` or before, up to the last line; None when the last line
        shows a prompt taken."""
        pts = self.stats
        if len(pts) < 2:
            return None
        i = len(pts) - 1
        if pts[i].prompt_tps > 0 or pts[i].running < 1:
            return None
        while i > 0:
            p, q = pts[i - 1], pts[i]
            if q.mono - p.mono > STATS_INTERVAL_S + SLACK_S or p.running < 1:
                break
            i -= 1
            if p.prompt_tps > 0:
                break  # this line took a prompt: the requests it counts may be new, but they ran at its time
        if i == len(pts) - 1:
            return None
        return pts[i].mono, pts[i].running

    def busy_through(self, t0: float, t1: float) -> bool:
        """Every stats line from ``t0`` to ``t1`` shows ``running`` >= 1, with no gap longer
        than a stats interval (a busy server logs every interval), and one comes at or
        before ``t0 + interval`` and at or after ``t1 - interval``."""
        pts = [p for p in self.stats if t0 - SLACK_S <= p.mono <= t1 + SLACK_S]
        if not pts or pts[0].mono > t0 + STATS_INTERVAL_S + SLACK_S or pts[-1].mono < t1 - STATS_INTERVAL_S - SLACK_S:
            return False
        if any(p.running < 1 for p in pts):
            return False
        return all(b.mono - a.mono <= STATS_INTERVAL_S + SLACK_S for a, b in zip(pts, pts[1:]))

    def kv_points(self, a: float, b: float) -> list[tuple[float, float]]:
        """(time, KV %) of the stats lines in ``[a, b)``."""
        return [(p.mono, p.kv_pct) for p in self.stats if a <= p.mono < b and p.kv_pct is not None]


class LogHistory:
    """Fed every log line (:meth:`feed`); :meth:`snapshot` answers. Not thread-safe: the
    log's polling thread feeds it and takes the snapshot, as for the phase tracker."""

    def __init__(self, *, keep_s: float = 900.0, max_points: int = 4096, local_offset: Any = None) -> None:
        self.keep_s = keep_s
        self.max_points = max_points
        self._points: dict[tuple[float, str], tuple[Any, ...]] = {}
        #: the lines each point was made of (their hashes): a line read again is not added twice
        self._seen: dict[tuple[float, str], set[int]] = {}
        self._newest: float | None = None
        self._shm: deque[float] = deque(maxlen=64)
        self.clock = LogClock(local_offset)
        self._year: int | None = None
        self._last_month: int | None = None
        self._last_stamp: Any = None
        self._last_t: float | None = None
        self._last_line: tuple[float, float] | None = None  # (stamp, arrival) of the last stamped line but shm waits
        self._last_unstamped = False
        self._last_arrival: float | None = None  # when the last unstamped line arrived (monotonic)
        #: what the last :meth:`backlog_lag` was read from ("stamp", "mtime"; None: no lag)
        self.lag_from: str | None = None

    def reset(self) -> None:
        self._points.clear()
        self._seen.clear()
        self._newest = None
        self._shm.clear()
        self.clock.reset()
        self._year = None
        self._last_month = None
        self._last_stamp = None
        self._last_t = None
        self._last_line = None
        self._last_unstamped = False
        self._last_arrival = None

    def backlog_lag(self, mono: float, wall: float, written: float | None = None) -> float:
        """How long before it was read the last line was written, when that is known and
        more than a few seconds: a log read as a backlog at attach, where every line arrives
        at once and silence measured on the arrival clock starts at the attach. Known from
        the last line's stamp, or, when the last line has none (a tqdm frame, a traceback),
        from ``written``: when the file was last written (its modification time, wall
        clock), which is at or after that line was (so the lag is never longer than it
        was). 0 when the last line came after the attach: vtop saw it arrive, it is news
        whatever its stamp says."""
        self.clock.note_written(written)
        self.lag_from = None
        if self._last_unstamped:
            if (written is None or self._last_arrival is None or written > wall + SLACK_S
                    or self.clock.is_live(self._last_arrival)):
                return 0.0
            lag = self._last_arrival - (written - wall + mono)
            self.lag_from = "mtime" if lag > LAG_MIN_S else None
            return lag if lag > LAG_MIN_S else 0.0
        off = self.offset(wall)
        if self._last_line is None or off is None:
            return 0.0
        t, arrival = self._last_line
        if self.clock.is_live(arrival):
            return 0.0
        at = t + 0.5 - off + (mono - wall)  # when it was written, on the monotonic clock
        lag = arrival - at
        self.lag_from = "stamp" if lag > LAG_MIN_S else None
        return lag if lag > LAG_MIN_S else 0.0

    def feed(self, event: Any, wall: float, arrival: float | None = None) -> None:
        """One parsed line (:class:`~vtop.core.phases.LogEvent`: ``stamp``, ``message``,
        ``kind``), read at wall-clock ``wall`` (monotonic ``arrival``)."""
        stamp = getattr(event, "stamp", None)
        kind = getattr(event, "kind", None)
        self.clock.is_live(arrival)  # the first lines read are the backlog
        if stamp is None or kind != "record":
            if kind in ("progress", "raw", "uvicorn") and getattr(event, "text", "").strip():
                self._last_unstamped = True  # a tqdm frame, a traceback, uvicorn's own: when, the log does not say
                self._last_arrival = arrival
            return
        msg: str = event.message
        got = _parse(msg, getattr(event, "engine", None), getattr(event, "proc", None)) \
            if any(n in msg for n in _NEEDLES.get(getattr(event, "engine", None) or "vllm", ())) else None
        stats = got[0] if got is not None else None
        shm = SHM_WAIT in msg
        if stamp == self._last_stamp:
            t = self._last_t  # lines of one second share a stamp: converted once
        else:
            t = self._log_time(stamp, wall)
            self._last_stamp, self._last_t = stamp, t
        if t is None:
            return
        self.clock.feed(t, wall, arrival)
        if stats is not None:
            if self._newest is None or t > self._newest:
                self._newest = t
            if t < self._newest - self.keep_s:
                return
            # Keyed by stamp and engine: the attach-time tail read and the forward read
            # give the same lines (in any order). vLLM logs one stats line a second per engine at
            # most; SGLang several (a Decode and Prefill batches): the distinct lines of one second
            # are combined (:func:`_combine`), a line read twice counted once.
            key = (t, stats[0])
            # when vtop saw it arrive: None for the backlog read at attach (what was there before vtop)
            arr = arrival if self.clock.is_live(arrival) else None
            old = self._points.get(key)
            seen = self._seen.setdefault(key, set())
            h = hash(msg)
            if old is None:
                self._points[key] = (*stats[1:], arr)
            elif h not in seen:
                self._points[key] = _combine(old, stats[1:], arr, adds=got is not None and got[1])
            elif old[-1] is not None and (arr is None or arr < old[-1]):
                self._points[key] = (*old[:-1], arr)  # the first read of it kept
            seen.add(h)
            if len(self._points) > self.max_points:
                cut = self._newest - self.keep_s
                keep = sorted(k for k in self._points if k[0] >= cut)[-self.max_points // 2:]
                self._points = {k: self._points[k] for k in keep}
                self._seen = {k: self._seen[k] for k in keep if k in self._seen}
        elif shm and t not in self._shm:
            self._shm.append(t)
        if not shm and arrival is not None:
            self._last_line = (t, arrival)
            self._last_unstamped = False

    def _log_time(self, stamp: tuple[int, int, int, int, int], wall: float) -> float | None:
        if self._year is None:
            self._year = time.gmtime(wall).tm_year
        mon = stamp[0]
        if self._last_month is not None and mon < self._last_month - 6:
            self._year += 1  # December -> January
        self._last_month = mon
        t = _stamp_seconds(stamp, self._year)
        if t is not None and self._last_month is not None and t - wall > 180 * 86400:
            self._year -= 1  # a December log read in January
            t = _stamp_seconds(stamp, self._year)
        return t

    def offset(self, wall: float) -> float | None:
        """The log clock minus the wall clock (:meth:`vtop.core.logclock.LogClock.offset`)."""
        return self.clock.offset(wall)

    def snapshot(self, mono: float, wall: float) -> LogHistoryView:
        off = self.offset(wall)
        if off is None:
            return LogHistoryView(mono, wall=wall)
        shift = mono - wall - off  # stamp seconds -> monotonic
        merged: dict[float, list[Any]] = {}
        cut = (self._newest or 0.0) - self.keep_s
        for (t, _eng), (p, g, r, w, kv, pre, arr) in self._points.items():
            if t < cut:
                continue
            cur = merged.get(t)
            if cur is None:
                merged[t] = [p, g, r, w, kv, pre, arr]
            else:  # another engine's line of the same second (data parallel)
                cur[0] += p
                cur[1] += g
                cur[2] += r
                cur[3] += w
                cur[4] = kv if cur[4] is None else (cur[4] if kv is None else max(cur[4], kv))
                cur[5] = pre if cur[5] is None else (cur[5] + (pre or 0))
                cur[6] = arr if cur[6] is None else (cur[6] if arr is None else min(cur[6], arr))
        # A stamp is the second the line was written in: its middle is the best guess.
        pts = tuple(StatsPoint(min(mono, t + 0.5 + shift), *v) for t, v in sorted(merged.items()))
        return LogHistoryView(mono, pts, tuple(sorted(min(mono, t + 0.5 + shift) for t in self._shm)), off,
                              wall=wall)


_local_offset = local_offset
