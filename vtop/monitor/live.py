"""A live box's sources, polled on a schedule and handed to a :class:`~vtop.monitor.Monitor`.

* NVML (with the GPU processes' names) and the log are each read by one
  :class:`~vtop.monitor.polling.PollLoop` thread whose result waits for the
  next :meth:`LiveFeed.collect` (the face's tick), so a result never wakes the
  event loop on its own and polls never overlap.
* Each server is scraped by one asyncio task on the event loop (async HTTP
  with a deadline; the task awaits its poll before sleeping). One
  :class:`~vtop.sources.http11.HttpPool` serves them all. A refused port backs
  off while nothing listens.
* The kernel's counters of the local servers' connections (:mod:`vtop.sources.sockets`: one
  netlink dump, about 2 ms of CPU) are read by their own thread every 10 s (every 2 s while an
  answer has streamed 20 s or more) while a local server has a request running, applied at the
  tick like NVML's; the runaway rule's evidence of one request's age.
* The process table is scanned in its own thread every few seconds (every
  30 s once every server answers; at once when one stops answering): it says
  whether a vLLM process exists (refused + process = ``starting``), which PIDs
  hold the GPUs, and where the log goes. Scraping starts after the first scan,
  so a start does not flash a wrong "down" (and in ``vtop --once``'s one round,
  after the followed log's first read too: its one scrape is judged with it).

Every result is applied on the event loop's thread, so the monitor needs no
lock. The screen and ``--once``/``doctor`` both run this; only their ticks differ
(the screen paints at its tick; ``--once`` reports at the end of its window).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from vtop.model.gpu import GpuPoll
from vtop.monitor.monitor import Monitor
from vtop.monitor.polling import PollLoop
from vtop.sources.urls import url_hostport

if TYPE_CHECKING:
    from vtop.sources.discovery import ServerProcess
    from vtop.sources.http11 import HttpPool
    from vtop.sources.vllm import VllmScraper


class GpuSourceLike(Protocol):
    def poll(self) -> GpuPoll: ...
    def close(self) -> None: ...


def discover_servers() -> list[ServerProcess]:
    """The process scan, imported in the discovery thread on its first run: the
    scanner is not needed for the first frame (about 16 ms of imports on the dev VM)."""
    from vtop.sources.discovery import discover_servers as scan

    return scan()


class LiveFeed:
    #: seconds between process scans while every watched server answers; a scan reads
    #: /proc for every process (4 % of vtop's CPU at 5 s with 2 busy servers)
    SETTLED_SCAN_S = 30.0
    #: seconds between scans of the Hub cache while a start may be downloading, and each scan's deadline
    DOWNLOAD_EVERY_S = 2.0
    DOWNLOAD_DEADLINE_S = 1.0
    #: while no start downloads, the download thread sleeps this long between looks, and is woken
    #: (``PollLoop.poke``) the tick a start's download phase appears: waking every 2 s to find nothing
    #: to scan was 0.06 ms of CPU a second on a lent H100, a sixth of what the process scans cost
    DOWNLOAD_IDLE_S = 60.0

    def __init__(
        self,
        monitor: Monitor,
        *,
        gpu_source: GpuSourceLike | None,
        discover: Callable[[], list[ServerProcess]] | None = discover_servers,
        hang_after_s: float | None = None,
    ) -> None:
        self.monitor = monitor
        self.config = monitor.config
        self.gpu_source = gpu_source
        self.discover = discover
        self._hang_given = hang_after_s is not None
        self.hang_after_s = hang_after_s if hang_after_s is not None else max(3.0, 3 * self.config.interval)
        self.gpu_loop: PollLoop | None = None
        self.log_loop: PollLoop | None = None
        self.disc_loop: PollLoop | None = None
        self.conns_loop: PollLoop | None = None
        self.download_loop: PollLoop | None = None
        #: (server pid, Hub repo) the download thread scans (set on the event loop's thread; None: none)
        self._download_target: tuple[int | None, str] | None = None
        self._hub_scanner: Any = None
        #: the ports whose connections the conns thread reads (set on the event loop's thread)
        self._conn_ports: frozenset[int] = frozenset()
        #: ``(url, pid, port)`` of the servers whose connections it reads in their own network namespace
        self._conn_netns: tuple[tuple[str, int, int], ...] = ()
        #: the sockets made in those namespaces, kept from read to read (used in the conns thread only)
        self._netns_sockets: Any = None
        self.scrapers: dict[str, VllmScraper] = {}
        #: the sources that never answered by the end of a headless window (set by vtop.faces.headless.watch)
        self.silent: list[str] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._client: HttpPool | None = None
        self._names: Any = None
        self._scraping = False
        self._stopped = False
        #: ``vtop --once`` without a window (:func:`vtop.faces.headless.one_round`): one GPU poll, no second one
        #: for the exit to wait on (set before :meth:`start`)
        self.one_round = False
        #: called on the event loop's thread when a source's answer is there (a poll thread's result waiting
        #: for :meth:`collect`, a scrape applied): the one round waits on it (set before :meth:`start`)
        self.wake: Callable[[], None] | None = None

    # ------------------------------------------------------------- lifecycle
    @property
    def client(self) -> HttpPool:
        """The scrapes' connections (also the snapshot's ``/metrics``)."""
        if self._client is None:
            from vtop.sources.http11 import HttpPool

            self._client = HttpPool()
        return self._client

    def start(self) -> None:
        """Start every source; call on the event loop's thread."""
        self.monitor.add_cli_urls()
        if self.gpu_source is not None:
            self.gpu_loop = PollLoop("gpu", self.config.interval, self.gpu_blocking, self._on_gpu, at_tick=True,
                                     max_polls=1 if self.one_round else None, on_ready=self.wake)
            self.gpu_loop.start()
        self._start_log_loop()
        self._conn_ports, self._conn_netns = self._busy_ports(), self._busy_netns()
        self.conns_loop = PollLoop("conns", self._conns_every(), self.conns_blocking, self._on_conns, at_tick=True,
                                   on_ready=self.wake)
        self.conns_loop.start()
        self._download_target = self.monitor.download_target()
        self.download_loop = PollLoop("download", self._download_every(), self.download_blocking,
                                      self._on_download, at_tick=True, on_ready=self.wake)
        self.download_loop.start()
        if self.discover is not None:
            self.disc_loop = PollLoop("discovery", self._scan_every(), self.discover, self.on_discovery,
                                      on_ready=self.wake)
            self.disc_loop.start()
        else:
            self._scraping = True
            self._start_scrapes()

    def stop(self) -> None:
        self._stopped = True
        for loop in (self.gpu_loop, self.log_loop, self.disc_loop, self.conns_loop, self.download_loop):
            if loop is not None:
                loop.stop()
        for task in self.tasks.values():
            task.cancel()

    async def aclose(self) -> None:
        self.stop()
        if self._netns_sockets is not None:
            self._netns_sockets.close()  # each keeps a container's network namespace alive
        if self._client is not None:
            await self._client.aclose()
        if self.gpu_source is not None:
            try:
                self.gpu_source.close()
            except Exception:  # noqa: BLE001 - shutting down: NVML may already be gone
                pass
        if self.monitor.log_watch is not None:
            self.monitor.log_watch.close()

    def set_interval(self, seconds: float) -> None:
        """A new poll interval, from the next poll of every source on (the screen's
        ``+``/``-``); the monitor's config says it too. The caller checks the bounds."""
        import dataclasses

        self.config = dataclasses.replace(self.config, interval=seconds)
        self.monitor.config = self.config
        if not self._hang_given:
            self.hang_after_s = max(3.0, 3 * seconds)
        for loop in (self.gpu_loop, self.log_loop):
            if loop is not None:
                loop.interval = seconds
        if self.conns_loop is not None:
            self.conns_loop.interval = self._conns_every()
        if self.disc_loop is not None:
            self.disc_loop.interval = max(self.disc_loop.interval, self._scan_every())

    def collect(self) -> None:
        """At the face's tick: apply the NVML and log results waiting, and start
        polling what the monitor took on since (a log found, a server discovered)."""
        for loop in (self.gpu_loop, self.log_loop, self.conns_loop, self.download_loop):
            if loop is not None:
                loop.collect()
        self._conn_ports, self._conn_netns = self._busy_ports(), self._busy_netns()
        self._follow_download(self.monitor.download_target())
        self._scan_soon_if_pending()
        self._start_log_loop()
        self._start_scrapes()

    #: the alerts a process scan may end (a stopped engine sent SIGCONT): scans stay fast while one is up
    SCAN_DECIDED = ("engine_stall", "startup_stall")

    def _scans_decide(self) -> bool:
        """A rule's finding is pending, or an alert the process scans may end is up: the next scan may
        decide it, so it should come soon."""
        d = self.monitor.diagnoser
        return bool(d.pending) or any(a.rule in self.SCAN_DECIDED for a in d.alerts)

    def _scan_soon_if_pending(self) -> None:
        """A finding pending (or an alert the scans may end) while the process scans are settled (30 s
        apart): scan now, and every ``_scan_every`` while it lasts (:meth:`on_discovery`). It waited up to
        30 s for the next scan: on the real run of two servers on one H100 (tests/fixtures/h100-two-servers)
        the first scan to see :8001's EngineCore stopped came 20 s after its SIGSTOP, the second, which
        names it, 30 s after that."""
        loop = self.disc_loop
        if loop is not None and loop.interval > self._scan_every() and self._scans_decide():
            loop.interval = self._scan_every()
            loop.poke()

    def gpu_hung_for(self) -> float | None:
        """Seconds the NVML call in flight has taken, when past ``hang_after_s``."""
        loop = self.gpu_loop
        if loop is None:
            return None
        t = loop.in_flight_for()
        return t if t > self.hang_after_s else None

    # ------------------------------------------------------------------- GPU
    @property
    def names(self) -> Any:
        """The GPU processes' names (:class:`~vtop.sources.procs.ProcNames`), made when first needed."""
        if self._names is None:
            from vtop.sources.procs import ProcNames

            self._names = ProcNames()
        return self._names

    def gpu_blocking(self) -> tuple[GpuPoll, dict[int, str]]:
        """In the NVML thread: the poll and its processes' names."""
        assert self.gpu_source is not None
        poll = self.gpu_source.poll()
        if getattr(self.gpu_source, "simulated", False):
            # made-up pids: this box's process of that pid (if any) is not theirs
            return poll, {p.pid: "simulated" for g in poll.gpus for p in (g.procs or ())}
        names = self.names.names_for((p.pid for g in poll.gpus for p in (g.procs or ())), poll.mono)
        return poll, names

    def _on_gpu(self, result: Any, error: BaseException | None) -> None:
        if error is not None:
            self.monitor.apply_gpu_error(error)
            return
        poll, names = result
        self.monitor.apply_gpu(poll, names)

    async def poll_gpu_once(self) -> GpuPoll | None:
        """One poll through a real thread, applied here (tests, a face driven by hand)."""
        if self.gpu_source is None:
            return None
        result = await asyncio.to_thread(self.gpu_blocking)
        self._on_gpu(result, None)
        return result[0]

    # ----------------------------------------------------------------- conns
    def _conns_every(self) -> float:
        return max(self.config.interval, self.monitor.conns_read_every())

    @staticmethod
    def _worth_a_read(v: Any) -> bool:
        """A server's connections are worth a read: not polled yet, a request running, or ``/metrics`` not
        answering while the server is there (stale, or its engine dead): then the kernel's counters are the
        evidence left. Before, a server whose ``/metrics`` had never answered (vtop started while it was too
        loaded to answer: stale, no metrics) was not read at all."""
        if v is None:
            return True
        running = v.metrics.running if v.metrics is not None else None
        if running is not None:
            return running >= 1
        return v.state in ("stale", "engine dead")

    def _busy_ports(self) -> frozenset[int]:
        """The ports worth a read (:meth:`_worth_a_read`) of the local servers. An idle box costs no dump
        at all; a runaway needs a request running."""
        m = self.monitor
        local = m.conn_ports()
        return frozenset(url_hostport(url)[1] for url, ws in m.servers.items()
                         if url_hostport(url)[1] in local and self._worth_a_read(ws.last_view))

    def _busy_netns(self) -> tuple[tuple[str, int, int], ...]:
        """The servers in a network namespace of their own worth a read there (as :meth:`_busy_ports`)."""
        out = []
        for url, pid, port in self.monitor.conn_netns():
            if self._worth_a_read(self.monitor.servers[url].last_view):
                out.append((url, pid, port))
        return tuple(out)

    def conns_blocking(self) -> Any:
        """In the conns thread: the kernel's connections to the local servers' ports, then those of
        each server in its own network namespace, read there (a list of reads)."""
        from vtop.sources.sockets import NetnsSockets, read_conns, read_conns_in

        reads = [read_conns(self._conn_ports)]
        if self._netns_sockets is None and self._conn_netns:
            self._netns_sockets = NetnsSockets()
        socks = self._netns_sockets
        for url, pid, port in self._conn_netns:
            reads.append(read_conns_in(pid, {port}, url=url, sockets=socks))
        if socks is not None:  # a kept socket keeps its namespace alive: none for a server no longer read
            socks.keep_only({pid for _url, pid, _port in self._conn_netns})
        return reads

    def _on_conns(self, result: Any, error: BaseException | None) -> None:
        from vtop.sources.sockets import ConnRead

        if error is not None:
            result = [ConnRead(time.time(), time.monotonic(), (), f"{type(error).__name__}: {error}")]
        servers = self.monitor.servers
        for read in result if isinstance(result, list) else [result]:
            if read.url is not None:
                ws = servers.get(read.url)
                if read.conns or read.error or (ws is not None and ws.conns.last_mono is not None):
                    self.monitor.apply_conns(read)
            elif read.conns or read.error or any(ws.conns.last_mono is not None for ws in servers.values()):
                self.monitor.apply_conns(read)
        if self.conns_loop is not None:
            # set before the thread resumes (it waits for this result to be applied, then waits this
            # long): a long answer streaming makes the next read come in 2 s, not 10
            self.conns_loop.interval = self._conns_every()

    # -------------------------------------------------------------- download
    def download_blocking(self) -> Any:
        """In the download thread: one scan of the Hub cache for the start's repo (a stat per file, cut at
        :attr:`DOWNLOAD_DEADLINE_S`), or None while no start is in a phase that downloads."""
        target = self._download_target
        if target is None:
            return None
        if self._hub_scanner is None:
            from vtop.sources.hfcache import HubCacheScanner

            self._hub_scanner = HubCacheScanner()
        return self._hub_scanner.scan(target[0], target[1], deadline_s=self.DOWNLOAD_DEADLINE_S)

    def _download_every(self) -> float:
        return self.DOWNLOAD_EVERY_S if self._download_target is not None else self.DOWNLOAD_IDLE_S

    def _follow_download(self, target: tuple[int | None, str] | None) -> None:
        """The start's download to scan (None: none): a new one is scanned at once, then every 2 s."""
        new = target is not None and target != self._download_target
        self._download_target = target
        loop = self.download_loop
        if loop is not None:
            loop.interval = self._download_every()
            if new:
                loop.poke()

    def _on_download(self, result: Any, error: BaseException | None) -> None:
        if error is None:
            self.monitor.apply_download(result)

    # ------------------------------------------------------------------- log
    def _start_log_loop(self) -> None:
        lw = self.monitor.log_watch
        if lw is None or self.log_loop is not None or self._stopped:
            return
        self.log_loop = PollLoop("log", self.config.interval, lw.poll, self._on_log, at_tick=True, on_ready=self.wake)
        self.log_loop.start()

    def _on_log(self, view: Any, error: BaseException | None) -> None:
        if error is not None:
            self.monitor.apply_log_error(error)
        else:
            self.monitor.apply_log(view)

    # ------------------------------------------------------------- discovery
    def _scan_every(self) -> float:
        return max(5.0, 5 * self.config.interval)

    def on_discovery(self, result: Any, error: BaseException | None) -> None:
        m = self.monitor
        if error is None:
            m.apply_procs(list(result))
        else:  # the process table may be denied: go on with the URLs
            m.notes.append(f"process discovery failed: {type(error).__name__}: {error}")
            m.discovered_once = True
        loop = self.disc_loop
        if loop is not None:
            # Fast while something is starting, down or unknown (a start must show within
            # seconds); slow once every server answers, whether or not its process is on
            # this box (a server in another container, or a remote URL, has none to find:
            # scanning for it every 5 s was 0.1 % of a core for nothing). Fast again while a rule's
            # finding is pending (a frozen engine: its processes' CPU time and state decide it soon).
            settled = bool(m.servers) and all(
                ws.last_view is not None and ws.last_view.state == "up" for ws in m.servers.values()) \
                and not self._scans_decide()
            base = self._scan_every()
            loop.interval = max(base, self.SETTLED_SCAN_S) if settled else base
        self._scraping = True  # discovery is best effort: poll anyway
        self._start_log_loop()
        self._start_scrapes()

    # --------------------------------------------------------------- servers
    #: ``one_round``: seconds a first scrape waits for the followed log's first read (below)
    LOG_FIRST_S = 1.0

    def _start_scrapes(self) -> None:
        if not self._scraping or self._stopped:
            return
        log = self.log_loop
        if self.one_round and log is not None and log.polls == 0 and log.in_flight_for() < self.LOG_FIRST_S:
            # One round judges each server from its one scrape, and a refused port is "starting" or "down" by
            # what the log says of the start at that moment (``Monitor.apply_server``): a log read after the
            # scrape came too late for it, so the same box gave STARTING (exit 0) or DOWN (exit 2) by which
            # thread was first (bench/once_same.py, the corpus's startup traces). The scrapes start once the log
            # has answered (``collect``), or once its first read has taken a second (a hung file is not waited for).
            return
        for url in self.monitor.servers:
            if url not in self.tasks:
                self.tasks[url] = asyncio.get_running_loop().create_task(self._run(url), name=f"scrape {url}")

    def scraper(self, url: str) -> VllmScraper:
        """The scraper of one server, made at its first poll (its module is not
        needed for the first frame)."""
        s = self.scrapers.get(url)
        if s is None:
            from vtop.sources.vllm import VllmScraper

            s = self.scrapers[url] = VllmScraper(url, client=self.client, clock=self.monitor.clock,
                                                 userinfo=self.config.credentials_for(url))
        s.api_key = self.monitor.api_key_for(url)
        return s

    def next_delay(self, url: str, failures: int) -> float:
        """Seconds until the next poll: the interval while the server answers or is
        starting (ready should show within an interval of the port opening: with a
        back-off it showed 0.7-4.8 s late); backing off (doubling) up to 5 s while
        nothing listens and nothing is starting (a refused connect and its name lookup
        every second were a sixth of vtop's CPU on an idle box)."""
        base = self.config.interval
        ws = self.monitor.servers.get(url)
        v = ws.last_view if ws is not None else None
        if v is None or failures == 0 or v.state != "down":
            return base
        return min(max(5.0, base), base * 2 ** min(failures, 6))

    async def poll_server_once(self, url: str) -> Any:
        """One scrape of ``url``, applied (the task's step; tests)."""
        ws = self.monitor.servers.get(url)
        was = ws.last_view.state if ws is not None and ws.last_view is not None else None
        poll = await self.scraper(url).poll()
        view = self.monitor.apply_server(url, poll)
        if self.wake is not None:
            self.wake()
        if was == "up" and view.state != "up" and self.disc_loop is not None:
            self.disc_loop.poke()  # is its process still there? (scans are slow while all is well)
        return view

    async def _run(self, url: str) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            view = await self.poll_server_once(url)
            failures = 0 if view.state not in ("down", "starting") or view.last_error is None else failures + 1
            delay = self.next_delay(url, failures)
            await asyncio.sleep(max(0.05, delay - (time.monotonic() - started)))
