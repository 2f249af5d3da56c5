"""The monitor: what vtop knows about the box, fed by timestamped results.

Every face (the screen, ``--once``, ``doctor``, ``replay``/``demo``, the bench)
drives one :class:`Monitor`. It owns everything between the sources and the
widgets: the GPU history, one :class:`~vtop.core.server.ServerTracker` per
server, which servers to watch (the URLs given, else the ones discovered),
which process each is, which PIDs hold the GPUs, which log to follow and what
it says (:class:`~vtop.monitor.logwatch.LogWatch`), the diagnosis, and the
recorder. It starts nothing and does no I/O of its own beyond looking up, when
the server processes change, which one writes the log: results come in
through ``apply_*`` (from :mod:`vtop.monitor.live` on a live box, from
:mod:`vtop.monitor.player` for a recording), and :meth:`tick` closes a round:
servers that went quiet turn stale, and the rules run over what came.

Faces read its state (``servers``, ``gpu_history``, ``log_view``, ``alerts``)
and ask :meth:`take_changes` what changed since they last looked. The clock
is injected: a recording replayed through a monitor gives the same alerts at
the same recorded times at any speed, in any face.

Not thread-safe: feed and read it from one thread (the event loop's).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from vtop.clock import Clock, SystemClock
from vtop.config import Config
from vtop.core.download import CacheScan, DownloadProgress, DownloadTracker
from vtop.core.engines import flags_of
from vtop.core.gpu_history import GpuHistory
from vtop.core.phases.phase import Phase
from vtop.core.requests.conns import READ_EVERY_S, ConnTracker
from vtop.core.server import UNKNOWN, LastSeen, ServerTracker, ServerView
from vtop.model.gpu import ABSENT, OFF, GpuPoll
from vtop.sources.urls import FALLBACK_URL, LOCAL_HOSTS, normalize_url, url_hostport, url_matches

if TYPE_CHECKING:
    from vtop.core.backfill import Backfill
    from vtop.core.evidence import Evidence
    from vtop.core.membudget import MemoryBudget
    from vtop.core.rules import Alert, Diagnoser
    from vtop.core.start_history import StartHistory, StartUsual
    from vtop.core.timeline import Timeline
    from vtop.model.requests import ServerRequests
    from vtop.monitor.logwatch import LogView, LogWatch
    from vtop.sources.discovery import ServerProcess
    from vtop.sources.vllm import ServerPoll

#: the phases of a start in which it may be fetching its model from the Hub (the API server reads the
#: config in process start; the workers fetch the weights in the weights phase)
DOWNLOAD_PHASES = (Phase.PROCESS_START, Phase.ENGINE_INIT, Phase.WEIGHTS)

#: what :meth:`Monitor.take_changes` can say
GPU, SERVERS, LOG, LOG_SOURCE, ALERTS = "gpu", "servers", "log", "log-source", "alerts"

#: how long before vtop first read the log a line must be to tell of the time before vtop (the first
#: read of a start followed from its launch comes a poll or two after it)
PAST_SLACK_S = 5.0

#: A live monitor keeps the last this many alert changes and server states (``alert_log``,
#: ``WatchedServer.history``): both grew with every change for as long as vtop ran (a
#: replayed H200 timeline at --interval 0.25 changed the alerts about twice a minute).
#: A replay keeps them all (``vtop doctor`` on a recording prints the whole timeline).
KEEP_CHANGES = 1000


def _append_bounded(items: list[Any], item: Any, keep: int | None) -> None:
    items.append(item)
    if keep is not None and len(items) > 2 * keep:  # dropped in batches: cheap per call
        del items[: len(items) - keep]


@dataclass(eq=False)
class WatchedServer:
    """One server the monitor watches."""

    url: str
    tracker: ServerTracker
    from_cli: bool
    process: ServerProcess | None = None
    """Its vLLM process on this box, when discovery found one."""
    last_view: ServerView | None = None
    version: int = 0
    """Goes up with every new view: a face repaints the server when it moved."""
    polls: int = 0
    history: list[str] = field(default_factory=list)
    """States seen, in order (tests and the record)."""
    conns: ConnTracker = field(default_factory=ConnTracker)
    """Its connections as the kernel counts them (a server on this box only; vtop/sources/sockets.py)."""
    first_poll: float | None = None
    """When vtop first polled it (monotonic): its charts are live from then, the log's before."""


class AlertChange(NamedTuple):
    """The alerts, from the moment they changed (recorded clocks in a replay)."""

    mono: float
    t: float
    alerts: tuple[Alert, ...]

    def key(self) -> tuple[tuple[str, str, str | None], ...]:
        return tuple((a.rule, a.severity, a.target) for a in self.alerts)


def make_recorder(config: Config, **meta: Any) -> Any:
    """The recorder ``--record`` asks for, or None."""
    if not config.record:
        return None
    from vtop.sources.recording.record import Recorder

    return Recorder(config.record, max_bytes=config.record_max_mb * 2**20, redact_prompts=config.redact_prompts,
                    meta={"interval": config.interval, "history": config.history, **meta})


def make_log_watch(config: Config, *, clock: Clock, log_fd: int | None = None) -> LogWatch | None:
    """The log ``--log`` names (a path, or ``-`` for ``log_fd``/standard input), or None."""
    if not config.log:
        return None
    from vtop.monitor.logwatch import LogWatch
    from vtop.sources.logtail import LogTailer, StreamTailer

    src = StreamTailer(log_fd if log_fd is not None else 0) if config.log == "-" else LogTailer(config.log)
    return LogWatch(src, clock=clock, stall_threshold_s=config.stall_threshold)


class Monitor:
    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        recorder: Any = None,
        log_watch: LogWatch | None = None,
        live: bool = True,
        find_logs: bool = True,
        feed_interval_s: float | None = None,
        box_history: bool = True,
    ) -> None:
        self.config = config
        #: how far apart a server's polls usually come (its trackers' first guess, and the size their
        #: history rings start at): the poll interval, or a fleet's usual scrape interval
        self.feed_interval_s = feed_interval_s or config.interval
        self.clock: Clock = clock or SystemClock()
        self.live = live
        """False for a recording: its own ``logmark`` events say when the server was
        launched and ready, so the health answers and the process table do not."""
        self._keep_changes: int | None = KEEP_CHANGES if live else None
        self.find_logs = find_logs and live
        """With no ``--log``, follow the log of the server discovery finds (its stdout)."""
        self.recorder = recorder
        self.gpu_history = GpuHistory(config.history, interval_s=config.interval)
        self.proc_names: dict[int, str] = {}
        self.gpu_error: str | None = None
        self.servers: dict[str, WatchedServer] = {}
        self.processes: list[ServerProcess] = []
        self.discovered_once = False
        self.gpu_owner: dict[int, str] = {}
        """GPU-holding PID -> what it is (``EngineCore of :8000``)."""
        self.api_key: str | None = config.api_key or os.environ.get("VLLM_API_KEY") or None
        self.log_watch: LogWatch | None = log_watch
        if log_watch is not None:
            log_watch.recorder = recorder
        self.log_view: LogView | None = None
        self.log_message: str | None = None
        """Where the log comes from, or why none is followed (for the startup panel)."""
        self.log_server: str | None = None
        """The URL of the server whose process writes the followed log, once known."""
        self._log_tried_for: tuple[Any, ...] | None = None
        self._launch_marked: Any = None
        self._diagnoser: Diagnoser | None = None
        self.alerts: list[Alert] = []
        self.alert_log: list[AlertChange] = []
        """Every change of the alerts, in order (the replay test and the scoreboard)."""
        self._alerts_key: tuple[tuple[str, str, str | None], ...] | None = None
        """The set of alerts (``AlertChange.key``) the last diagnosis found; None before the first."""
        self.notes: list[str] = []
        """Things that went wrong that no panel shows (``--once`` prints them)."""
        self.on_server_view: list[Callable[[WatchedServer, ServerView], None]] = []
        """Called with every new view of a server, as it is applied (tests, a recording's checks)."""
        self._changes: set[str] = set()
        self._undiagnosed = False
        self.download = DownloadTracker()
        """The Hub download of the start being followed (scanned by :mod:`vtop.sources.hfcache`)."""
        self.start_history: StartHistory | None = None
        """The earlier starts this start is judged against (:mod:`vtop.core.start_history`): this box's, once read
        from its file; in a replay, the recording's own starts before this one, kept in memory as they reach ready
        (a recording is judged on what it holds, not on the replaying box's history); None with the history off."""
        self._usual_cache: tuple[Any, StartUsual | None] = (None, None)
        self._budget_cache: tuple[Any, list[MemoryBudget]] = (None, [])
        self._kept_start: float | None = None
        self._writes: list[Any] = []
        """The threads writing this box's files (the start history): :meth:`finish_writes` waits for them."""
        #: this monitor reads and keeps this box's start history: live and no recording (a raw trace is replayed
        #: ``live``, its launch and ready worked out as live, but its starts are another box's: kept, they became this
        #: box's history, and each replay was judged against the recordings replayed before it)
        self.box_history = live and box_history and config.start_history
        if self.box_history:
            self._read_start_history()
        elif config.start_history:
            self._new_memory_history()
        self._conn_errors_said: set[str] = set()
        self._unmapped_said = False
        self._backfill: Backfill | None = None
        self._backfill_key: tuple[Any, float | None, str, tuple[int, int] | None] | None = None

    # ------------------------------------------------------------------ reading
    @property
    def diagnoser(self) -> Diagnoser:
        if self._diagnoser is None:
            from vtop.core.rules import Diagnoser, Thresholds

            self._diagnoser = Diagnoser(Thresholds(runaway_s=self.config.runaway_threshold,
                                                 startup_ceiling_s=self.config.stall_threshold))
        return self._diagnoser

    @diagnoser.setter
    def diagnoser(self, value: Diagnoser) -> None:
        self._diagnoser = value

    def take_changes(self) -> set[str]:
        """What changed since the last call (``GPU``, ``SERVERS``, ``LOG``, ``LOG_SOURCE``, ``ALERTS``)."""
        out, self._changes = self._changes, set()
        return out

    @property
    def in_flight(self) -> dict[str, ServerRequests]:
        """Per server URL, its requests in flight as of the last diagnosis
        (:func:`vtop.core.requests.requests_in_flight`): the one answer every face shows."""
        return self._diagnoser.in_flight if self._diagnoser is not None else {}

    def requests_of(self, url: str | None = None) -> ServerRequests | None:
        """The answer for ``url`` (default: the server the followed log belongs to, else the first)."""
        got = self.in_flight
        if url is None:
            url = self.log_target if self.log_target in got else next(iter(got), None)
        return got.get(url) if url is not None else None

    def views(self) -> dict[str, ServerView]:
        return {url: ws.last_view for url, ws in self.servers.items() if ws.last_view is not None}

    def action_server(self) -> WatchedServer | None:
        """The server the action keys act on: the first one with a process, else the first."""
        watched = list(self.servers.values())
        return next((ws for ws in watched if ws.process is not None), watched[0] if watched else None)

    @property
    def log_target(self) -> str | None:
        """The URL of the server the followed log belongs to."""
        if self.log_server in self.servers:
            return self.log_server
        ws = self.action_server()
        return ws.url if ws is not None else None

    def log_target_down(self) -> LastSeen | None:
        """The gauges of the server the followed log belongs to, as last seen, when they are not
        live (down, a dead engine, late polls): then the log's requests in flight are not known
        to be in flight (they went with the engine), and every face says so."""
        url = self.log_target
        ws = self.servers.get(url) if url is not None else None
        if ws is None or ws.last_view is None or ws.last_view.state == "stale":
            return None
        return self.last_seen(ws.last_view)

    def server_gpus(self, url: str) -> list[tuple[int, int | None]]:
        """``(GPU index, bytes)`` of each GPU the server's processes are on by the last NVML poll, with the
        memory they hold there (None: NVML gave no number for one of them): what its card names, so two
        servers on one GPU each say theirs (issue 39: "gpu0 32.4 GiB" on each of the H100's two)."""
        ws = self.servers.get(url)
        sp = ws.process if ws is not None else None
        poll = self.gpu_history.last_poll
        if sp is None or poll is None:
            return []
        pids = {int(sp.pid), *(int(c.pid) for c in sp.children)}
        out: list[tuple[int, int | None]] = []
        for g in poll.gpus:
            mine = [p.used_bytes for p in (g.procs or ()) if int(p.pid) in pids]
            if mine:
                out.append((g.index, None if any(b is None for b in mine) else sum(b for b in mine if b is not None)))
        return out

    def last_seen(self, view: ServerView) -> LastSeen | None:
        """``view``'s gauges as last seen when they are not live (:meth:`ServerView.last_seen`), said
        "when the engine died" when the log of that server says its engine died after it was ready."""
        seen = view.last_seen(self.clock.monotonic())
        lv = self.log_view
        if seen is not None and lv is not None and view.url == self.log_target:
            f = lv.snapshot.failure
            if lv.snapshot.state == "failed" and f is not None and f.phase is Phase.READY:
                seen = replace(seen, died=True)
        return seen

    def backfill(self, url: str) -> Backfill | None:
        """The charts of ``url`` before vtop first polled it, from the log's stats lines (the server the
        followed log belongs to only; :mod:`vtop.core.backfill`); None when the log has none of then."""
        lv = self.log_view
        ws = self.servers.get(url)
        if lv is None or ws is None or url != self.log_target or lv.history is None:
            return None
        from vtop.core.backfill import backfill_from

        starts = [s.started for s in lv.past_starts] + [lv.snapshot.started]
        bf = backfill_from(lv.history, ws.first_poll, starts)
        # the same answer keeps its object (the card redraws on a new one): it changes only while the
        # backlog read at attach is still coming in
        key = (lv, ws.first_poll, url, None if bf is None else (len(bf.points), len(bf.splits)))
        if self._backfill_key != key:
            self._backfill, self._backfill_key = bf, key
        return self._backfill

    def has_past(self) -> bool:
        """The followed log says something of the time before vtop started reading it (a stats line,
        or a start, from before then): the timeline key is offered."""
        lv = self.log_view
        h = lv.history if lv is not None else None
        if lv is None or lv.attached is None or h is None:
            return False
        at = lv.attached - PAST_SLACK_S
        if h.stats and h.stats[0].mono < at:
            return True
        starts = [s.started for s in lv.past_starts] + [lv.snapshot.started]
        return any((m := h.to_mono(t)) is not None and m < at for t in starts)

    def wall_of(self, mono: float) -> str:
        """A monotonic time as this box's local ``HH:MM:SS``."""
        import time

        try:
            return time.strftime("%H:%M:%S", time.localtime(self.clock.time() - (self.clock.monotonic() - mono)))
        except (OverflowError, ValueError, OSError):
            return "?"

    def timeline(self) -> Timeline | None:
        """What the followed log says happened, before vtop started and since (:mod:`vtop.core.timeline`):
        the one answer the timeline key, the snapshot bundle, ``doctor`` and ``--json`` give."""
        lv = self.log_view
        if lv is None or lv.lines_total == 0:
            return None
        from vtop.core.timeline import build_timeline

        return build_timeline(lv.snapshot, lv.past_starts, lv.history, lv.problem_kinds,
                              warnings=lv.warnings, errors=lv.errors, attached=lv.attached,
                              now=self.clock.monotonic())

    def api_key_for(self, url: str) -> str | None:
        """The key for a server's ``/v1`` endpoints: the one configured, else its own ``--api-key``."""
        if self.api_key:
            return self.api_key
        ws = self.servers.get(url)
        return ws.process.api_key if ws is not None and ws.process is not None else None

    def gpu_stale_after_s(self) -> float:
        """GPU readings older than this are stale (NVML stopped answering: a hung call): three poll
        intervals, at least 3 s. One bound for every face (the screen, ``--once``/``doctor``, the exporter)."""
        return max(3.0, 3.0 * self.config.interval)

    def gpu_readings_age(self) -> float | None:
        """Seconds since the last GPU readings came (None: no GPU read yet, or none to read)."""
        poll = self.gpu_history.last_poll
        if poll is None or not poll.gpus:
            return None
        return max(0.0, self.clock.monotonic() - poll.mono)

    def gpu_stale_for(self) -> float | None:
        """The GPU readings' age when they are stale (:meth:`gpu_stale_after_s`), else None."""
        age = self.gpu_readings_age()
        return age if age is not None and age > self.gpu_stale_after_s() else None

    def gpu_activity(self, since_mono: float) -> tuple[float | None, float | None]:
        """Mean GPU util and SM activity since ``since_mono`` (the busiest GPU), for the stall note."""
        best: tuple[float | None, float | None] = (None, None)
        for tr in self.gpu_history.tracks.values():
            util = [v for t, v in tr.series["util"] if t >= since_mono and v is not None]
            sm = [v for t, v in tr.series["sm"] if t >= since_mono and v is not None]
            if not util:
                continue
            u = sum(util) / len(util)
            s = sum(sm) / len(sm) if sm else None
            if best[0] is None or u > best[0]:
                best = (u, s)
        return best

    def history_json(self) -> dict[str, Any]:
        """Every series, for the snapshot bundle."""
        from vtop.core.backfill import BACKFILL_SERIES

        def pts(series: Any) -> list[list[float | None]]:
            return [[round(t, 3), v] for t, v in series]

        return {
            "gpus": {str(i): {k: pts(s) for k, s in tr.series.items()} for i, tr in self.gpu_history.tracks.items()},
            "servers": {url: {k: pts(s) for k, s in ws.last_view.series.items()} if ws.last_view else {}
                        for url, ws in self.servers.items()},
            # the charts before vtop first polled a server, from its log's stats lines (vtop.core.backfill)
            "servers_from_log": {url: {"until": round(bf.until, 3), "restarts_at": [round(t, 3) for t in bf.splits],
                                       **{k: pts(bf.series(k)) for k in BACKFILL_SERIES}}
                                 for url in self.servers if (bf := self.backfill(url)) is not None},
        }

    # ------------------------------------------------------------------ servers
    def new_tracker(self, url: str) -> ServerTracker:
        return ServerTracker(url, window_s=60.0, history_s=max(self.config.history * 2, 120.0), clock=self.clock,
                             interval_s=self.feed_interval_s)

    def add_server(self, url: str, *, from_cli: bool) -> WatchedServer:
        ws = self.servers.get(url)
        if ws is None:
            ws = self.servers[url] = WatchedServer(url, self.new_tracker(url), from_cli)
            self._changes.add(SERVERS)
        return ws

    def add_cli_urls(self) -> None:
        """A server for each URL given (they are in the first frame, before any poll)."""
        for url in self.config.urls:
            self.add_server(normalize_url(url), from_cli=True)

    def process_arg(self, ws: WatchedServer) -> Any:
        """What the tracker is told of the server's process: UNKNOWN before the first
        scan and for a remote server (the local process table says nothing of it)."""
        if not self.discovered_once:
            return UNKNOWN
        host, _ = url_hostport(ws.url)
        if ws.process is None and host not in LOCAL_HOSTS:
            return UNKNOWN
        return ws.process

    def apply_procs(self, servers: list[ServerProcess]) -> None:
        """The vLLM server processes found on this box (a process scan)."""
        self.discovered_once = True
        self.processes = list(servers)
        if self.recorder is not None:
            self.recorder.processes(self.clock.time(), self.clock.monotonic(), servers)
        if not self.config.urls:
            for sp in servers:
                if not any(url_matches(url, sp) for url in self.servers):
                    self.add_server(sp.url, from_cli=False)
            if not self.servers:
                self.add_server(FALLBACK_URL, from_cli=False)
        for url, ws in self.servers.items():
            proc = next((sp for sp in servers if url_matches(url, sp)), None)
            if proc is not ws.process:
                ws.process = proc
                ws.version += 1
                self._changes.add(SERVERS)
        owner: dict[int, str] = {}
        for sp in servers:
            port = f":{sp.port}"
            where = f" · {sp.placement}" if sp.placement else ""
            for c in sp.children:
                if c.holds_gpu:
                    name = c.title.split("::", 1)[-1] if "::" in c.title else c.role
                    owner[c.pid] = f"{name} of {port}{where}"
            if not sp.children and sp.pid:
                owner.setdefault(sp.pid, f"{flags_of(sp.engine)['name']} {port}{where}")
        self.gpu_owner = owner
        self._follow_log(servers)

    def conn_ports(self) -> frozenset[int]:
        """The ports of the watched servers whose connections this box's kernel holds in vtop's
        network namespace: a local URL, or one whose process discovery found here (not one in a
        network namespace of its own: :meth:`conn_netns`)."""
        out = set()
        for url, ws in self.servers.items():
            host, port = url_hostport(url)
            if ws.process is not None and ws.process.own_netns:
                continue
            if host in LOCAL_HOSTS or ws.process is not None:
                out.add(port)
        return frozenset(out)

    def conn_netns(self) -> list[tuple[str, int, int]]:
        """``(url, pid, port inside)`` of each watched server that listens in a network namespace
        of its own (a container): its connections are read there."""
        return [(url, ws.process.pid, ws.process.inner_port) for url, ws in self.servers.items()
                if ws.process is not None and ws.process.own_netns]

    def missing_evidence(self) -> list[str]:
        """The evidence vtop lacks now, each with what would give it (issue 49): the vLLM log, the
        processes of a local server (another PID namespace, a container), the kernel's counters of
        its connections (another network namespace, a read that failed, a server on another box).
        Said once by the doctor's notes and under the screen's log line; empty when nothing is
        missing that a rule would read."""
        out: list[str] = []
        # no vLLM at all (nothing answers, no process): no log is no news, not a missing piece of evidence
        live = any(ws.process is not None or (ws.last_view is not None and ws.last_view.state not in ("down", "not vllm"))
                   for ws in self.servers.values())
        if self.log_view is None and self.log_watch is None and live:
            out.append("evidence missing: the vLLM log (see the log line): a stall or a stalled start that began "
                       "before vtop looked is dated from the connections and the processes only")
        for url, ws in self.servers.items():
            host, port = url_hostport(url)
            v = ws.last_view
            if v is None or v.state in ("down", "not vllm"):
                continue
            where = f":{port}" if host in LOCAL_HOSTS else url
            running = v.metrics.running if v.metrics is not None else None
            if host in LOCAL_HOSTS and ws.process is None and self.discovered_once:
                out.append(f"evidence missing for {where}: its processes (no vLLM process behind it is visible here: a "
                           "container or another PID namespace, another user): CPU time and process state; run vtop "
                           "where it sees them (on the host, or `docker run --pid=container:NAME ...`)")
            if host not in LOCAL_HOSTS and ws.process is None:
                out.append(f"evidence missing for {where}: its connections' counters (a server on another box: the "
                           "kernel that holds them is there); run vtop on the server's box")
            elif ws.conns.error is not None:
                out.append(f"evidence missing for {where}: its connections' counters ({ws.conns.error})")
            elif ws.conns.empty_reads >= 2 and running:
                out.append(f"evidence missing for {where}: its connections (the kernel here holds none to port {port}, "
                           "not even vtop's own: the server's sockets are in another network namespace, e.g. behind "
                           "docker's port mapping); run vtop in its namespace (`docker run --network container:NAME "
                           "...` or `nsenter -n -t PID`)")
        return out

    def conns_read_every(self) -> float:
        """Seconds until the next read of the connections should come (the soonest any server asks:
        :meth:`vtop.core.requests.conns.ConnTracker.read_every`)."""
        return min((ws.conns.read_every() for ws in self.servers.values()), default=READ_EVERY_S)

    def apply_conns(self, read: Any) -> None:
        """One read of the kernel's connections (:class:`vtop.sources.sockets.ConnRead`, live or
        recorded): each local server takes those of its port."""
        if self.recorder is not None:
            self.recorder.conns(read)
        url_of = getattr(read, "url", None)
        if url_of is not None:
            ws = self.servers.get(url_of)
            if ws is None:
                return
            inner = ws.process.inner_port if ws.process is not None else url_hostport(url_of)[1]
            ws.conns.feed(read.mono, [c for c in read.conns if c.port == inner], read.error)
            if read.error is not None and url_of not in self._conn_errors_said:
                self._conn_errors_said.add(url_of)  # once: it would be the same every read
                self.notes.append(f"{url_of}: {read.error}")
            return
        ports = self.conn_ports()
        for url, ws in self.servers.items():
            port = url_hostport(url)[1]
            if port not in ports:
                continue
            ws.conns.feed(read.mono, [c for c in read.conns if c.port == port], read.error)
        # no diagnosis of its own: the servers' polls, at the same interval, run the rules

    def apply_server(self, url: str, poll: ServerPoll) -> ServerView:
        """One poll of a server (live or recorded)."""
        ws = self.servers.get(url) or self.add_server(url, from_cli=True)
        if self.recorder is not None:
            self.recorder.server(poll, fed=self.clock.monotonic())
        ws.tracker.feed(poll, process=self.process_arg(ws), log_phase=self._log_phase_of(url))
        view = ws.tracker.view()
        ws.polls += 1
        if ws.first_poll is None:
            ws.first_poll = poll.mono
        if not ws.history or ws.history[-1] != view.state:
            _append_bounded(ws.history, view.state, self._keep_changes)
        ws.last_view = view
        ws.version += 1
        self._changes.add(SERVERS)
        self._undiagnosed = True
        lw = self.log_watch
        if lw is not None and url == self.log_target:
            mono = self.clock.monotonic()
            lw.note_server(view, mono)
            if self.live and view.health == 200 and view.state in ("up", "restarted"):
                lw.mark_ready(mono)
        for cb in self.on_server_view:
            cb(ws, view)
        return view

    def _log_phase_of(self, url: str) -> str | None:
        """The phase the followed log shows a start in, for the server it belongs to."""
        lv = self.log_view
        if lv is None or url != self.log_target or lv.snapshot.state != "starting":
            return None
        cur = lv.snapshot.current
        return cur.label if cur is not None else Phase.PROCESS_START.label

    # ---------------------------------------------------------------------- GPU
    def apply_gpu(self, poll: GpuPoll, names: dict[int, str] | None = None) -> None:
        """One NVML poll (``names``: PID -> process name of its GPU processes)."""
        if names is not None:
            self.proc_names = names
            self._say_unmapped(poll, names)
        if self.recorder is not None and self.live:
            self.recorder.gpu(poll, names)
        if poll.status in (ABSENT, OFF) or poll.gpus:
            self.gpu_history.add(poll)
        self.gpu_error = None
        self._changes.add(GPU)
        self._undiagnosed = True

    def _say_unmapped(self, poll: GpuPoll, names: dict[int, str]) -> None:
        """Once: the GPU processes vtop cannot tie to a process here (it runs in a container)."""
        from vtop.sources.procs import UNMAPPED

        if self._unmapped_said or not self.live:
            return
        pids = sorted({p.pid for g in poll.gpus for p in (g.procs or ()) if names.get(p.pid) == UNMAPPED})
        if pids:
            self._unmapped_said = True
            self.notes.append(
                f"vtop runs in a PID namespace of its own (a container without --pid=host): NVML gives the host's "
                f"PIDs, so the GPU processes {', '.join(map(str, pids))} are not tied to any process or server here; "
                "run vtop on the host, or in its container with --pid=host, to see whose they are")

    def apply_gpu_error(self, error: BaseException) -> None:
        self.gpu_error = f"GPU poll failed: {type(error).__name__}: {error}"
        self.notes.append(self.gpu_error)
        self._changes.add(GPU)

    # ---------------------------------------------------------------------- log
    def apply_log(self, view: LogView) -> None:
        """One poll of the followed log (the tail and its trackers, read in a thread)."""
        self.log_view = view
        self._changes.add(LOG)
        self._undiagnosed = True
        if view.snapshot.state == "ready" and self.start_history is not None:
            self._keep_start(view.snapshot)

    # ------------------------------------------------------------ start history
    def _read_start_history(self) -> None:
        """Read the history file in a thread (a home on a network filesystem may hang); until it is read
        the start is judged without it."""
        import threading

        from vtop.core.start_history import history_from
        from vtop.sources.statefile import history_path, load_json

        path = history_path()

        def run() -> None:
            data, problem = load_json(path)
            hist, bad = history_from(data, str(path))
            problem = problem or bad
            if problem:
                self.notes.append(problem)
            self.start_history = hist

        threading.Thread(target=run, name="vtop-start-history", daemon=True).start()

    def _new_memory_history(self) -> None:
        """A history of this monitor's own, in memory, empty (a replay, or one seeking back): the starts it sees
        reach ready join it through :meth:`_keep_start` as the box's do, and nothing is read or written."""
        from vtop.core.start_history import StartHistory

        self.start_history = StartHistory()
        self._kept_start = None

    def _keep_start(self, snap: Any) -> None:
        """A start that reached ready joins the history (once: the same start read again is kept once),
        and this box's file is written in a thread (a replay's history is in memory only)."""
        import threading

        from vtop.core.start_history import past_of
        from vtop.sources.statefile import history_path, save_json

        hist = self.start_history
        if hist is None or snap.started == self._kept_start:
            return
        got = past_of(snap)
        if got is None or not hist.add(*got):
            return
        self._kept_start = snap.started
        if not self.box_history:
            return
        data = hist.to_json()  # taken here, on the loop's thread: the history may change meanwhile
        path = history_path()

        def run() -> None:
            problem = save_json(path, data)
            if problem:
                self.notes.append(problem)

        t = threading.Thread(target=run, name="vtop-start-history-save", daemon=True)
        self._writes = [w for w in self._writes if w.is_alive()] + [t]
        t.start()

    def finish_writes(self, timeout_s: float = 2.0) -> bool:
        """Wait, ``timeout_s`` at most in all, for the files being written in threads (the start history): a
        one-shot that ends in the round a start reached ready exited before the thread wrote it, and the start
        was lost (the corrupt-history test saw the old file left, now and then). False: one still writes."""
        import time

        deadline = time.monotonic() + timeout_s
        for t in self._writes:
            t.join(max(0.0, deadline - time.monotonic()))
        self._writes = [t for t in self._writes if t.is_alive()]
        return not self._writes

    def memory_budget(self) -> list[MemoryBudget]:
        """The followed start's GPU memory budget, per GPU (:func:`vtop.core.membudget.memory_budget`, the
        evidence's :attr:`~vtop.core.evidence.Evidence.memory_budget`: what the startup-failure rule quotes)."""
        if self.log_view is None:
            return []
        # the panel asks every redraw: computed again only when the log or the GPUs have news
        key = (self.log_view, self.gpu_history.last_poll, self.processes, len(self.servers))
        old = self._budget_cache[0]
        if old is None or any(a is not b for a, b in zip(old[:3], key[:3])) or old[3] != key[3]:
            self._budget_cache = (key, self.evidence().memory_budget)
        return self._budget_cache[1]

    def oom_finding(self) -> Alert | None:
        """The OOM rules' alert of a CUDA OOM of the followed server at run time (its stage and fix), while one is
        held: what the startup panel says of an engine that died of it (one finding, one wording)."""
        tgt = self.log_target
        return next((a for a in self.alerts if a.rule in ("oom_transient", "oom_steady")
                     and (tgt is None or a.target == tgt)), None)

    def startup_extras(self) -> dict[str, Any]:
        """What ``--once --json`` and the snapshot's phases.json add to the tracker's summary: this start against
        its history (each phase's usual time, the compile cache's hit or miss) and the memory budget."""
        lv = self.log_view
        if lv is None:
            return {}
        usual = self.start_usual()
        snap = lv.snapshot
        cached = snap.facts.compile_cached
        return {
            "history": None if usual is None else usual.to_json(),
            "compile_cache": None if cached is None else ("hit" if cached else "miss"),
            "usually": {} if usual is None else {
                v.phase.value: usual.phases[v.phase].words() for v in snap.phases if v.phase in usual.phases},
            "memory_budget": [b.to_json() for b in self.memory_budget()],
        }

    def start_usual(self) -> StartUsual | None:
        """What the followed start's phases usually take on this box (None: no earlier start of it kept,
        or no history read)."""
        hist, lv = self.start_history, self.log_view
        if hist is None or lv is None:
            return None
        from vtop.core.start_history import key_of

        key = key_of(lv.snapshot)
        cache_key = (id(hist), hist.version, key, lv.snapshot.started)
        if self._usual_cache[0] != cache_key:
            self._usual_cache = (cache_key, hist.usual(key, this_start=lv.snapshot.started))
        return self._usual_cache[1]

    # ----------------------------------------------------------------- download
    def download_target(self) -> tuple[int | None, str] | None:
        """(server pid, Hub repo) while the followed start may be downloading (process start, engine
        init, weights) and its model is a Hub repo id, not a folder; else None (nothing to scan)."""
        lv = self.log_view
        if lv is None or lv.snapshot.state != "starting" or lv.snapshot.current not in DOWNLOAD_PHASES:
            return None
        tgt = self.log_target
        ws = self.servers.get(tgt) if tgt is not None else None
        proc = ws.process if ws is not None else None
        model = (proc.model if proc is not None else None) or lv.snapshot.facts.model
        from vtop.sources.hfcache import is_repo_id

        if model is None or not is_repo_id(model):
            return None
        return (proc.pid if proc is not None else None), model

    def apply_download(self, scan: CacheScan | None) -> None:
        """One scan of the Hub cache (None: nothing to scan now)."""
        if scan is None:
            return
        self.download.add(scan)
        self._changes.add(LOG)
        self._undiagnosed = True

    def download_progress(self) -> DownloadProgress | None:
        """The download of the start being followed, while it starts (None: none seen)."""
        lv = self.log_view
        if lv is None or lv.snapshot.state != "starting":
            return None
        return self.download.progress(self.clock.monotonic())

    def apply_log_error(self, error: BaseException) -> None:
        self._say_log(f"vLLM log: reading failed: {type(error).__name__}: {error}")

    def _say_log(self, message: str) -> None:
        if message != self.log_message:
            self.log_message = message
            self._changes.add(LOG_SOURCE)

    def _follow_log(self, servers: list[ServerProcess]) -> None:
        """Which log to follow, and the launch time of the server that writes it.

        With ``--log``: the log is given; its server is the first one found behind the
        URLs watched (its launch time goes to the phase tracker once per launch).
        Without: the log of the first such server (its stdout, when that is a file),
        looked for again whenever the servers found change while none is followed:
        vLLM is often started after vtop."""
        if not self.live:
            return
        mine = [sp for sp in servers if any(url_matches(u, sp) for u in self.servers)]
        lw = self.log_watch
        if lw is not None:
            writer = self._writer_of_log(mine)
            if writer is not None and self._launch_marked != writer.key:
                self._launch_marked = writer.key
                self.log_server = next((u for u in self.servers if url_matches(u, writer)), None)
                lw.mark_launch_of(writer)
            return
        if not self.find_logs or self.config.log:
            return
        tried = tuple(sp.key for sp in servers)
        if tried == self._log_tried_for:
            return
        self._log_tried_for = tried
        if not servers:
            self._say_log("vLLM log: no vLLM process on this box to read it from; pass --log PATH (or --log -). "
                          "Nothing to watch here? `vtop demo` plays a real incident recorded on an H200.")
            return
        if not mine:
            self._say_log("vLLM log: none of the given URLs is served by a vLLM process on this box; "
                          "pass --log PATH (or --log -)")
            return
        from vtop.monitor.logwatch import LogWatch

        sp = mine[0]
        watch, where = LogWatch.for_server(sp, clock=self.clock, recorder=self.recorder,
                                           stall_threshold_s=self.config.stall_threshold)
        self._say_log(f"vLLM log: {where}")
        if watch is None:
            return
        self.log_watch = watch
        self._launch_marked = sp.key
        self.log_server = next((u for u in self.servers if url_matches(u, sp)), None)

    def _writer_of_log(self, mine: list[ServerProcess]) -> ServerProcess | None:
        """The server process that writes the ``--log`` file: a log belongs to one server,
        and another vLLM on the box (another port) must never feed its tracker. The one
        whose stdout or stderr is that very file; when that cannot be read (another user,
        a container), the only server watched, if there is one."""
        path = self.config.log
        if not mine:
            return None
        if not path or path == "-":
            return mine[0] if len(mine) == 1 else None
        from vtop.sources.logtail import log_written_by

        verdicts = [(sp, log_written_by(sp.pid, path)) for sp in mine]
        writers = [sp for sp, v in verdicts if v]
        if writers:
            return writers[0]
        unknown = [sp for sp, v in verdicts if v is None]
        return unknown[0] if len(mine) == 1 and unknown else None

    # ------------------------------------------------------------------- rounds
    def tick(self) -> list[Alert]:
        """Close a round: servers whose polls stopped turn stale, and the rules run
        over what came since the last round (they keep state from one round to the
        next, so every round must be seen). Returns the alerts."""
        for ws in self.servers.values():
            v = ws.last_view
            if v is not None and ws.tracker.state_now()[0] != v.state:
                ws.last_view = ws.tracker.view()
                ws.version += 1
                self._changes.add(SERVERS)
                self._undiagnosed = True
        if self._undiagnosed:
            self.diagnose()
        return self.alerts

    def diagnose(self) -> list[Alert]:
        """Run the rules over what is known now; note and record the alerts when they change."""
        self._undiagnosed = False
        now = self.clock.monotonic()
        alerts = self.diagnoser.update(self.evidence(now))
        if alerts != self.alerts:
            self._changes.add(ALERTS)  # a title or its evidence moved on (an age, a rate): repaint
        self.alerts = alerts
        change = AlertChange(now, self.clock.time(), tuple(alerts))
        key = change.key()
        if key != self._alerts_key:
            # The first diagnosis says "none" once (the panel's empty state, the recording's first
            # line); after it, only a new set of alerts is a change. Keyed on the last set seen, not
            # on alert_log (which starts with the first alert): with no alert since the start, every
            # round repainted the alerts panel, refitted the screen and recorded an empty list.
            self._alerts_key = key
            if self.alert_log or alerts:
                _append_bounded(self.alert_log, change, self._keep_changes)
            self._changes.add(ALERTS)
            if self.recorder is not None:
                self.recorder.alerts(change.t, now, [a.to_json() for a in alerts])
        return alerts

    def evidence(self, now: float | None = None) -> Evidence:
        """What the rules are given now (:class:`~vtop.core.evidence.Evidence`): the servers' views,
        the GPU history, the followed log (of the server at :attr:`log_target`) and each local
        server's connections."""
        from vtop.core.evidence import Evidence, LogEvidence

        lv = self.log_view
        log = None
        if lv is not None:
            log = LogEvidence(
                target=self.log_target, snapshot=lv.snapshot, stall=lv.stall, quiet=lv.quiet, lines=lv.recent,
                inflight=lv.inflight, request_logging=lv.request_logging, finishes_logged=lv.finishes_logged,
                history=lv.history, logged_since_start=lv.logged_since_start, usual=self.start_usual(),
            )
        return Evidence(
            now=self.clock.monotonic() if now is None else now,
            servers=self.views(),
            gpus=self.gpu_history if self.gpu_history.tracks else None,
            log=log,
            conns={url: ws.conns for url, ws in self.servers.items() if ws.conns.last_mono is not None},
            download=self.download_progress(),
            wall=self.clock.time(),
            proc_names=self.proc_names,
        )

    def reset(self) -> None:
        """Forget everything seen (a replay seeking back): the servers stay, empty."""
        self.gpu_history.tracks.clear()
        self.gpu_history.last_poll = None
        self.proc_names = {}
        for ws in self.servers.values():
            ws.tracker = self.new_tracker(ws.url)
            ws.last_view = None
            ws.process = None
            ws.polls = 0
            ws.first_poll = None
            ws.history.clear()
            ws.conns = ConnTracker()
            ws.version += 1
        self.processes = []
        self.gpu_owner = {}
        self.discovered_once = False
        # the log's new tracker needs the launch of its server again: after a seek back the start
        # read "process start 14 s" instead of 47 s (issue 38 item 1)
        self._launch_marked = None
        self.log_server = None
        self._log_tried_for = None
        from vtop.core.rules import Diagnoser

        self.diagnoser = Diagnoser(self.diagnoser.thresholds)  # its history ran ahead of the new position
        self.alerts = []
        self.alert_log = []
        self._alerts_key = None
        self.log_view = None
        self.download.reset()
        if not self.box_history and self.config.start_history:
            self._new_memory_history()  # the starts before the new position are kept again as it plays on
        if self.log_watch is not None:
            self.log_watch.reset()
        self._changes.update((GPU, SERVERS, LOG, ALERTS))
