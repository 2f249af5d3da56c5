"""Which vLLM servers to watch, and the async loops that poll them.

* URLs on the command line win; with none, servers are discovered in the
  process table (a thread, every few seconds) and each gets a card; with
  none found, ``http://localhost:8000`` is watched so a server started later,
  or one vtop cannot see (another container), still shows up.
* Each server is polled by one asyncio task on the UI loop (async HTTP with
  a deadline; the task awaits its poll before sleeping, so polls of one
  server never overlap). One :class:`~vtop.sources.http11.HttpPool` serves
  them all.
* Discovery also tells the trackers whether a vLLM process exists (refused
  + process = ``starting``, refused + none = ``down``), which PIDs hold the
  GPUs (for the GPU cards), and where the first server's log goes.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from vtop.clock import Clock, SystemClock
from vtop.core.server import UNKNOWN, ServerTracker, ServerView
from vtop.sources.http11 import HttpPool
from vtop.sources.urls import FALLBACK_URL, LOCAL_HOSTS, normalize_url, url_matches
from vtop.sources.urls import url_hostport as _hostport
from vtop.ui.polling import PollLoop
from vtop.ui.widgets.server_panel import ServerCard

if TYPE_CHECKING:
    from vtop.sources.discovery import ServerProcess
    from vtop.sources.vllm import ServerPoll, VllmScraper
    from vtop.ui.app import VtopApp


def _discover_servers() -> list[ServerProcess]:
    """The process scan, imported in the discovery thread on its first run: the
    scanner and the scraper (:meth:`ServerEntry.scraper`) are not needed for the
    first frame, whose cards only need the URLs (about 16 ms of imports on the
    dev VM, about a twentieth of its first frame)."""
    from vtop.sources.discovery import discover_servers

    return discover_servers()

@dataclass
class ServerEntry:
    url: str
    make_scraper: Callable[[], VllmScraper]
    tracker: ServerTracker
    card: ServerCard
    from_cli: bool
    process: ServerProcess | None = None
    task: asyncio.Task[None] | None = None
    last_view: ServerView | None = None
    polls: int = 0
    dirty: bool = False
    history: list[str] = field(default_factory=list)
    """States seen, in order (tests and the record)."""
    _scraper: VllmScraper | None = None

    @property
    def scraper(self) -> VllmScraper:
        """Made at the first poll (or first use), not with the card."""
        if self._scraper is None:
            self._scraper = self.make_scraper()
        return self._scraper


class ServerWatch:
    def __init__(self, app: VtopApp, *, clock: Clock | None = None, discover: Callable[[], list[ServerProcess]] | None = None) -> None:
        self.app = app
        self.config = app.config
        self.clock = clock or SystemClock()
        self.discover = discover or _discover_servers
        self.entries: dict[str, ServerEntry] = {}
        self.processes: list[ServerProcess] = []
        self.discovered_once = False
        self.gpu_owner: dict[int, str] = {}
        """GPU-holding PID -> what it is (``EngineCore of :8000``)."""
        self.on_view: list[Callable[[ServerEntry, ServerView], None]] = []
        self.on_first_discovery: list[Callable[[list[ServerProcess]], None]] = []
        self.on_discovery: list[Callable[[list[ServerProcess]], None]] = []
        self._client: HttpPool | None = None
        self._action_client: Any = None
        self._disc_loop: PollLoop | None = None
        self.api_key = self.config.api_key or os.environ.get("VLLM_API_KEY") or None
        self._autopoll = False

    # -------------------------------------------------------------- set-up
    @property
    def client(self) -> HttpPool:
        """The scrapes' connections (and the snapshot's /metrics)."""
        if self._client is None:
            self._client = HttpPool()
        return self._client

    @property
    def action_client(self) -> Any:
        """An ``httpx.AsyncClient`` for the test request (streaming POST, JSON):
        made, and httpx imported, the first time a key needs it."""
        if self._action_client is None:
            import httpx

            # Never let environment proxies reroute a request to a local server.
            self._action_client = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        return self._action_client

    def start(self, *, autopoll: bool = True) -> None:
        # Scraping starts after the first process scan (a few ms): a refused port
        # means "starting" if a vLLM process exists, "down" if not, and polling
        # before the scan would flash a wrong "down" at every start.
        self._autopoll = autopoll
        self.add_cli_urls()
        if autopoll:
            self._disc_loop = PollLoop(self.app, "discovery", max(5.0, 5 * self.config.interval),
                                       self._discover_blocking, self._on_discovery)
            self._disc_loop.start()

    def add_cli_urls(self) -> None:
        """A card for each URL given (no polling yet): they are in the first frame."""
        for url in self.config.urls:
            self.add(normalize_url(url), from_cli=True, autopoll=False)

    def new_tracker(self, url: str) -> ServerTracker:
        return ServerTracker(url, window_s=60.0, history_s=self.config.history * 2, clock=self.clock,
                             interval_s=self.config.interval)

    def reset(self) -> None:
        """Forget what was seen (a replay seeking back): new trackers, same cards."""
        for e in self.entries.values():
            e.tracker = self.new_tracker(e.url)
            e.last_view = None
            e.process = None
            e.polls = 0
            e.history.clear()
        self.processes = []
        self.gpu_owner = {}

    def add(self, url: str, *, from_cli: bool, autopoll: bool = True) -> ServerEntry:
        if url in self.entries:
            return self.entries[url]
        def make_scraper() -> VllmScraper:
            from vtop.sources.vllm import VllmScraper

            return VllmScraper(url, client=self.client, api_key=self.api_key, clock=self.clock)

        tracker = self.new_tracker(url)
        card = ServerCard(url, window_s=self.config.history, max_gap=max(2.5 * self.config.interval, self.config.interval + 1.0),
                          classes="server-card")
        entry = ServerEntry(url, make_scraper, tracker, card, from_cli)
        self.entries[url] = entry
        self.app.mount_server_card(card)
        if autopoll:
            entry.task = asyncio.get_running_loop().create_task(self._run(entry), name=f"scrape {url}")
        return entry

    def stop(self) -> None:
        if self._disc_loop is not None:
            self._disc_loop.stop()
        for e in self.entries.values():
            if e.task is not None:
                e.task.cancel()

    async def aclose(self) -> None:
        self.stop()
        if self._client is not None:
            await self._client.aclose()
        if self._action_client is not None:
            await self._action_client.aclose()

    # ----------------------------------------------------------- discovery
    def _discover_blocking(self) -> list[ServerProcess]:
        return self.discover()

    #: seconds between process scans while every watched server answers; a scan reads
    #: /proc for every process (4 % of vtop's CPU at 5 s with 2 busy servers)
    SETTLED_SCAN_S = 30.0

    def _on_discovery(self, result: Any, error: BaseException | None) -> None:
        if error is None:
            self.apply_discovery(list(result))
        loop = self._disc_loop
        if loop is not None:
            # Fast while something is starting, down or unknown (a start must show within
            # seconds); slow once every server answers, whether or not its process is on
            # this box (a server in another container, or a remote URL, has none to find:
            # scanning for it every 5 s was 0.1 % of a core for nothing).
            settled = bool(self.entries) and all(
                e.last_view is not None and e.last_view.state == "up" for e in self.entries.values())
            base = max(5.0, 5 * self.config.interval)
            loop.interval = max(base, self.SETTLED_SCAN_S) if settled else base
        # Discovery is best effort (the process table can be denied): poll anyway.
        self._start_tasks()

    def _start_tasks(self) -> None:
        if not self._autopoll:
            return
        for e in self.entries.values():
            if e.task is None:
                e.task = asyncio.get_running_loop().create_task(self._run(e), name=f"scrape {e.url}")

    def apply_discovery(self, servers: list[ServerProcess], *, autopoll: bool = True) -> None:
        first = not self.discovered_once
        self.discovered_once = True
        self.processes = servers
        rec = self.app.recorder
        if rec is not None and autopoll:
            rec.processes(self.clock.time(), self.clock.monotonic(), servers)
        if not self.config.urls:
            for sp in servers:
                if not any(self._matches(url, sp) for url in self.entries):
                    self.add(sp.url, from_cli=False, autopoll=autopoll)
            if not self.entries:
                self.add(FALLBACK_URL, from_cli=False, autopoll=autopoll)
        for url, e in self.entries.items():
            e.process = next((sp for sp in servers if self._matches(url, sp)), None)
            if e.process is not None:
                if self.api_key is None and e.process.api_key:
                    e.scraper._api_key = e.process.api_key  # the server's own --api-key, for /v1 only
                e.card.max_num_seqs = e.process.max_num_seqs
                e.card.extra_title = f"pid {e.process.pid}" + (f" TP={e.process.tp}" if e.process.tp > 1 else "")
        owner: dict[int, str] = {}
        for sp in servers:
            port = f":{sp.port}"
            for c in sp.children:
                if c.holds_gpu:
                    name = c.title.split("::", 1)[-1] if "::" in c.title else c.role
                    owner[c.pid] = f"{name} of {port}"
            if not sp.children and sp.pid:
                owner.setdefault(sp.pid, f"vLLM {port}")
        self.gpu_owner = owner
        if first:
            for cb in self.on_first_discovery:
                cb(servers)
        for cb in self.on_discovery:
            cb(servers)

    @staticmethod
    def _matches(url: str, sp: ServerProcess) -> bool:
        return url_matches(url, sp)

    def process_arg(self, e: ServerEntry) -> Any:
        if not self.discovered_once:
            return UNKNOWN
        host, _ = _hostport(e.url)
        if e.process is None and host not in LOCAL_HOSTS:
            return UNKNOWN  # a remote server: the local process table says nothing about it
        return e.process

    def tick(self) -> None:
        """Every paint tick: a server whose poll is stuck turns stale on screen too."""
        for e in self.entries.values():
            if e.last_view is None:
                continue
            if e.tracker.state_now()[0] != e.last_view.state:
                e.last_view = e.tracker.view()
                e.dirty = True
                self.app._dirty.add("servers")

    def paint(self) -> None:
        """On the UI thread, from the app's paint: show the views that changed."""
        now = self.clock.monotonic()
        for e in self.entries.values():
            if e.dirty and e.last_view is not None:
                e.dirty = False
                e.card.show(e.last_view, now)

    # -------------------------------------------------------------- polling
    def next_delay(self, e: ServerEntry, failures: int) -> float:
        """Seconds until the next poll: the interval while the server answers; backing
        off (doubling) while nothing listens, up to 2 s while a vLLM process is starting
        (ready should show within 2 s) and 5 s when there is none (a refused connect and
        its name lookup every second were a sixth of vtop's CPU on an idle box)."""
        base = self.config.interval
        v = e.last_view
        if v is None or failures == 0 or v.state not in ("down", "starting"):
            return base
        cap = 2.0 if v.state == "starting" else 5.0
        return min(max(cap, base), base * 2 ** min(failures, 6))

    async def _run(self, e: ServerEntry) -> None:
        failures = 0
        while True:
            started = self.clock.monotonic()
            view = await self.poll_once(e)
            failures = 0 if view.state not in ("down", "starting") or view.last_error is None else failures + 1
            delay = self.next_delay(e, failures)
            await asyncio.sleep(max(0.05, delay - (self.clock.monotonic() - started)))

    async def poll_once(self, e: ServerEntry, poll: ServerPoll | None = None) -> ServerView:
        """One scrape (or a given poll, for replays and tests), fed and shown."""
        if poll is None:
            poll = await e.scraper.poll()
            rec = self.app.recorder
            if rec is not None:
                rec.server(poll, fed=self.clock.monotonic())
        return self.apply_poll(e, poll)

    def apply_poll(self, e: ServerEntry, poll: ServerPoll) -> ServerView:
        """Feed one poll (live or recorded) to the server's tracker and tell the app."""
        e.tracker.feed(poll, process=self.process_arg(e))
        view = e.tracker.view()
        if (self._disc_loop is not None and e.last_view is not None and e.last_view.state == "up"
                and view.state != "up"):
            self._disc_loop.poke()  # is its process still there? (scans are slow while all is well)
        e.polls += 1
        if not e.history or e.history[-1] != view.state:
            e.history.append(view.state)
        e.last_view = view
        e.dirty = True
        for cb in self.on_view:
            cb(e, view)
        return view
