"""Which request on a server's connections has waited longest for the end of its answer, from the
kernel's counters.

Fed each read of :func:`vtop.sources.sockets.read_conns` for one server's port (plain
:class:`~vtop.sources.sockets.Conn`-like objects: ``local``, ``remote``, ``last_sent_s``,
``last_recv_s``, ``bytes_acked``, ``bytes_received``), a :class:`ConnTracker` says which connection
carries a request still in flight, and since when its request came (its evidence: see
vtop/sources/sockets.py). A connection counts once it was read twice with the same request (its
arrival time agrees within :data:`SAME_REQUEST_S`) and either

* its answer *streams*: more bytes acknowledged at a read within the last :data:`FLOWING_S` (without
  byte counters, data sent that recently), so a kept-alive connection gone idle never counts, and an
  answer that ended stops counting within :data:`FLOWING_S`; or
* its answer is *pending*: the request came (``bytes_received`` > 0) and the server has sent nothing
  since (``last_sent`` at or before ``last_recv``). A non-streamed completion is sent whole when it
  ends, so a request without ``"stream": true`` shows nothing else while it decodes. The kernel stamps
  both times when it accepts a connection, so a connection that carried no request yet reads equal
  times and 0 bytes received: never pending. An answered request leaves ``last_sent`` after
  ``last_recv``: never pending. What a pending request does is not known from the connection (queued
  or decoding): the runaway rule takes one only while nothing waits (vtop/core/rules/runaway.py).
  Measured on loopback (Linux 6.x): a request sent and not answered reads ``last_sent_s`` 1.204,
  ``last_recv_s`` 1.200 and 28 bytes received; answered, 1.100 / 2.304; an accepted connection with
  no data yet 0.504 / 0.504 and 0 bytes; or
* its answer is *silent*: it began (data sent after the request came) and nothing was sent for
  :data:`SILENT_S` or more while the connection stays open. The server closes a kept-alive
  connection 5 s after its answer ended, so such an answer has not ended: its request is in flight,
  as old as its arrival, but nothing says it decodes (a frozen engine sends nothing; nor does a
  server whose client stopped reading, though its engine may have finished the answer). One read
  says so (the kernel's times), as it does for :meth:`ConnTracker.silence`; the runaway rule never
  takes a silent answer (vtop/core/requests/__init__.py keeps the oldest answer that is not silent
  apart for it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vtop.model.requests import READ_GIVEN_UP

#: data sent this recently: the answer is still flowing (a streamed completion sends a chunk per
#: token or a few; 5 s also spans a slow decode step under load)
FLOWING_S = 5.0
#: two reads carry the same request when its arrival (read time - last_recv) agrees this closely
#: (the kernel counts in ms, the reads are stamped after the dump)
SAME_REQUEST_S = 1.0
#: seconds between two reads (live, vtop.monitor.live; replayed, vtop.monitor.player): a dump walks the
#: kernel's whole table of TCP connections whatever the filter (1.9 ms of CPU on the dev VM, with
#: 262,144 buckets; vtop's whole live loop is ~1 % of a core), and a request's age is counted from its
#: arrival, not from the read: two reads fit in a 15 s doctor window
READ_EVERY_S = 10.0
#: ... but every this many seconds while an answer has streamed FAST_AFTER_S or more: what is known of
#: it is then never older than that (read every 10 s, a runaway's claim outlived its hang-up by up to
#: 10 s, and the alert came back for a second when a short request ran after it)
FAST_READ_S = 2.0
FAST_AFTER_S = 20.0
#: a read older than this says nothing about now (the reads stopped: a denied or hung source, or the
#: server went idle)
STALE_S = 25.0
#: vLLM's API server (uvicorn, ``timeout_keep_alive=VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default in
#: vllm/envs.py) closes a kept-alive connection 5 s after its answer ended: a connection still open
#: whose answer began and has sent nothing for longer than this carries an answer that has not ended
#: (a stream gone silent), never an idle kept-alive one
SILENT_S = 8.0


@dataclass(frozen=True)
class Streaming:
    """One connection whose answer has streamed since its request came."""

    remote: str
    """The client's ``addr:port``."""
    since: float
    """When the request arrived (monotonic, as the reads)."""
    age_s: float
    """Seconds from its arrival to the latest read."""
    seen_s: float
    """Seconds vtop has seen this answer streaming (first to latest read)."""
    bytes_sent: int | None
    """Bytes acknowledged by the client since vtop first saw it (None without counters)."""
    others: int
    """Other connections with a request in flight (streaming, pending or silent) at the latest read."""
    pending: bool = False
    """No byte of the answer sent since the request came (a non-streamed completion: sent whole at
    its end); False: the answer streams, or is silent."""
    silent_since: float | None = None
    """An answer gone silent (begun, nothing sent for :data:`SILENT_S` or more, the connection open):
    when its last byte was sent (monotonic, as the reads); None: not silent."""


@dataclass(frozen=True)
class Silence:
    """The answers in flight that have gone silent at the latest read: every connection whose answer
    began (data sent after its request came) and sent nothing for :data:`SILENT_S` or more, while no
    answer streams. What dates a frozen engine from before vtop looked (the engine-stall rule)."""

    streams: int
    """Connections whose answer began and has been silent :data:`SILENT_S` or more."""
    since: float
    """The youngest silence: when the last byte was sent on any of them (monotonic, as the reads)."""
    oldest: float
    """The oldest silence (monotonic)."""
    pending: int
    """Other connections with a request of :data:`SILENT_S` or more and no byte of its answer yet (a
    non-streamed completion)."""
    read_mono: float
    """The read that says so."""


@dataclass
class _Seen:
    req_at: float
    first_mono: float
    first_acked: int | None
    mono: float
    acked: int | None
    streaming: bool
    #: the latest read that found more bytes acknowledged than the one before (None: never)
    moved_mono: float | None = None
    #: the request came and nothing was sent since, at this read
    unanswered: bool = False
    #: ... at this read and the one before, with the same request
    pending: bool = False
    #: the kernel's seconds since data was last sent / received at this read (None: not given)
    sent_s: float | None = None
    recv_s: float | None = None

    @property
    def answering(self) -> bool:
        """Its answer streams, or has not begun (what the runaway rule may take, and fast reads follow)."""
        return self.streaming or self.pending

    @property
    def silent(self) -> bool:
        """Its answer began (data sent after the request came) and nothing was sent for :data:`SILENT_S`
        or more, the connection still open: an answer that has not ended (see :data:`SILENT_S`)."""
        return (not self.streaming and self.sent_s is not None and self.recv_s is not None
                and SILENT_S <= self.sent_s < self.recv_s)

    @property
    def in_flight(self) -> bool:
        return self.answering or self.silent


class ConnTracker:
    """The connections to one server's port, read after read."""

    def __init__(self) -> None:
        self._conns: dict[tuple[str, str], _Seen] = {}
        self.last_mono: float | None = None
        self.error: str | None = None
        self.reads = 0
        #: reads in a row that found no connection at all to the port (vtop's own scrapes hold one
        #: when the server's sockets are in this network namespace: several in a row say they are not)
        self.empty_reads = 0

    def feed(self, mono: float, conns: Iterable[Any], error: str | None = None) -> None:
        """One read at ``mono``; ``error`` when it failed: a read given up at its deadline
        (:data:`~vtop.model.requests.READ_GIVEN_UP`) says nothing of now, and what the read before knew
        stands until it is :data:`STALE_S` old (on a loaded box one read in three was given up, and
        forgetting made every request start over: a runaway took two good reads in a row to be seen);
        any other failure (denied, the server gone) forgets it."""
        self.error = error
        if error is not None:
            if READ_GIVEN_UP in error:
                return
            self._conns.clear()
            self.last_mono = None
            return
        self.reads += 1
        conns = list(conns)
        self.empty_reads = 0 if conns else self.empty_reads + 1
        now: dict[tuple[str, str], _Seen] = {}
        for c in conns:
            sent, recv = c.last_sent_s, c.last_recv_s
            if recv is None:
                continue
            key = (c.local, c.remote)
            req_at = mono - recv
            acked = c.bytes_acked
            prev = self._conns.get(key)
            flowing = sent is not None and sent <= FLOWING_S and sent < recv
            # the request came and nothing was sent since: equal times with bytes received (the
            # request came in the millisecond the connection was accepted), or, without the byte
            # counters, sent strictly before it
            rcvd = getattr(c, "bytes_received", None)
            unanswered = sent is not None and (sent >= recv and rcvd > 0 if rcvd is not None else sent > recv)
            if prev is None or abs(prev.req_at - req_at) > SAME_REQUEST_S:
                now[key] = _Seen(req_at, mono, acked, mono, acked, False, unanswered=unanswered, sent_s=sent,
                                 recv_s=recv)
                continue
            moved_mono = prev.moved_mono
            if acked is not None and prev.acked is not None:
                if acked > prev.acked:
                    moved_mono = mono
            elif flowing:
                moved_mono = mono
            # moving: more bytes acknowledged within FLOWING_S (two reads a moment apart may see the
            # same count while the answer flows: a chunk a token, not a byte a millisecond)
            moving = moved_mono is not None and mono - moved_mono <= FLOWING_S
            now[key] = _Seen(prev.req_at, prev.first_mono, prev.first_acked, mono, acked, flowing and moving,
                             moved_mono, unanswered, unanswered and prev.unanswered, sent, recv)
        self._conns = now
        self.last_mono = mono

    def in_flight(self, now: float) -> list[Streaming]:
        """The requests in flight at the latest read (answers streaming, answers pending: nothing sent
        since the request came, and answers gone silent), oldest request first (empty when the latest
        read is older than :data:`STALE_S` at ``now``)."""
        if self.last_mono is None or now - self.last_mono > STALE_S:
            return []
        on = [(k, s) for k, s in self._conns.items() if s.in_flight]
        on.sort(key=lambda ks: ks[1].req_at)
        out = []
        for (_local, remote), s in on:
            sent = s.acked - s.first_acked if s.acked is not None and s.first_acked is not None else None
            silent = s.silent and s.sent_s is not None
            out.append(Streaming(remote, s.req_at, s.mono - s.req_at, s.mono - s.first_mono, sent, len(on) - 1,
                                 pending=s.pending and not s.streaming,
                                 silent_since=s.mono - s.sent_s if silent and s.sent_s is not None else None))
        return out

    def silence(self, now: float) -> Silence | None:
        """The answers gone silent at the latest read (see :class:`Silence`); None when the read is
        stale at ``now``, an answer streams (or one to a request older than :data:`SILENT_S` sent a
        byte within it), or no begun answer has been silent :data:`SILENT_S`. A request of the last
        :data:`SILENT_S` (a scrape, a health check) says nothing either way."""
        if self.last_mono is None or now - self.last_mono > STALE_S:
            return None
        silent: list[float] = []
        pending = 0
        for s in self._conns.values():
            if s.streaming:
                return None
            if s.sent_s is None or s.recv_s is None:
                continue
            if s.recv_s < SILENT_S:
                # a request of the last seconds (a scrape, a health check: vtop's own /metrics read is
                # caught between its request and its answer at one read in several): says nothing yet
                continue
            if s.unanswered:
                pending += 1
            elif s.silent:
                silent.append(s.mono - s.sent_s)
            elif s.sent_s < s.recv_s:
                return None  # an answer to an older request sent a byte moments ago: not silent
        if not silent:
            return None
        return Silence(len(silent), max(silent), min(silent), pending, self.last_mono)

    def streaming(self, now: float) -> list[Streaming]:
        """The answers streaming at the latest read, oldest request first."""
        return [x for x in self.in_flight(now) if not x.pending and x.silent_since is None]

    def read_every(self) -> float:
        """Seconds until the next read should come: :data:`FAST_READ_S` while a request has been in
        flight :data:`FAST_AFTER_S` or more at the latest read, or one that old looks so at its first read
        (its answer sent a byte after the request came, or none yet: one more read says whether it moves),
        else :data:`READ_EVERY_S`. Without the second, a runaway first seen at 20 s waited 10 s more."""
        for s in self._conns.values():
            if s.mono - s.req_at < FAST_AFTER_S:
                continue
            looks = s.unanswered or (s.sent_s is not None and s.recv_s is not None
                                     and s.sent_s <= FLOWING_S and s.sent_s < s.recv_s)
            if s.answering or looks:  # (a silent answer: nothing to follow closely)
                return FAST_READ_S
        return READ_EVERY_S

    def oldest(self, now: float, *, pending: bool = True, silent: bool = True) -> Streaming | None:
        """The request in flight longest; ``pending=False`` leaves out the answers not begun,
        ``silent=False`` the answers gone silent."""
        got = [x for x in self.in_flight(now) if (pending or not x.pending) and (silent or x.silent_since is None)]
        return got[0] if got else None
