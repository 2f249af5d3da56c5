"""Shared helpers for the benchmarks: vtop in tmux, /proc readings, replayed vLLM servers.

* :class:`Tmux`: a private tmux server (its own ``-L`` socket, so it neither
  sees nor disturbs anyone else's sessions) with 120x40 panes; ``capture``,
  ``send_keys`` and ``wait_for`` (polling ``capture-pane -p`` every 10 ms).
* :func:`cpu_seconds`, :func:`vm_kb`: utime+stime and VmHWM/VmRSS from /proc.
* :class:`MetricsTimeline` and :func:`serve`: local HTTP servers that answer
  like vLLM 0.26.0 on an H200: ``/metrics`` replays the recorded timeline
  (``tests/fixtures/vllm/h200-0.26.0-metrics-timeline.jsonl.xz``, one record a
  second, in time order, looping; counters keep growing across the loop),
  ``/health`` 200, ``/v1/models`` (``/tmp/tiny``, ``max_model_len`` 32768),
  ``/version`` 0.26.0. ``GET /_bench/hang`` makes ``/metrics`` accept and
  never answer (until ``/_bench/unhang``); ``/_bench/stats`` counts the TCP
  connections accepted and the requests answered.

    python bench/harness.py serve 2      # two servers; prints their URLs, serves until stdin closes
"""

from __future__ import annotations

import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent
TIMELINE = ROOT / "tests" / "fixtures" / "vllm" / "h200-0.26.0-metrics-timeline.jsonl.xz"
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL_S = 0.010  # capture-pane polling period


def vtop_cmd() -> list[str]:
    """vtop as a user starts it: the venv's console script next to this Python."""
    exe = Path(sys.executable).parent / "vtop"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vtop"]


# --------------------------------------------------------------------- /proc
def _stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()  # fields from 3 (state) on; comm may hold spaces


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one process, from /proc/PID/stat (utime, stime)."""
    f = _stat_fields(pid)
    return int(f[11]) / CLK_TCK, int(f[12]) / CLK_TCK


def thread_cpu_ns(pid: int) -> dict[int, tuple[str, int]]:
    """Per thread of ``pid``: (kernel name, CPU nanoseconds run so far), from
    /proc/PID/task/*/{comm,schedstat}. vtop's poll threads name themselves
    (``vtop-gpu``...); the main thread (tid == pid) is the UI thread."""
    out: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        tid = int(task.name)
        out[tid] = ("UI (main)" if tid == pid else comm, ns)
    return out


def thread_ms_per_s(a: dict[int, tuple[str, int]], b: dict[int, tuple[str, int]], seconds: float) -> dict[str, float]:
    """CPU ms a second by thread name between two :func:`thread_cpu_ns` readings."""
    out: dict[str, float] = {}
    for tid, (name, ns) in b.items():
        if tid in a:
            out[name] = out.get(name, 0.0) + (ns - a[tid][1]) / 1e6 / seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def vm_kb(pid: int, key: str = "VmHWM") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    """PIDs below ``pid`` (from /proc/*/stat ppid), not including it."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(_stat_fields(int(d))[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# ---------------------------------------------------------------------- tmux
@dataclass
class Tmux:
    """A private tmux server; every pane 120x40 with TERM=xterm-256color inside."""

    width: int = 120
    height: int = 40
    socket: str = field(default_factory=lambda: f"vtop-bench-{os.getpid()}")
    capture_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not shutil.which("tmux"):
            sys.exit("bench: needs tmux (apt-get install tmux)")
        self.env = dict(os.environ, TERM="xterm-256color")
        self.env.pop("COLORTERM", None)
        self.env.pop("TMUX", None)
        # Bytecode caches as an installed vtop has them (pip compiles at install time). This
        # environment may say PYTHONDONTWRITEBYTECODE=1, and vtop here is an editable checkout
        # without __pycache__: every start would compile vtop's own modules again (~0.2 s).
        # The caches go to a folder of their own, not into the repository.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "vtop-bench-pycache")
        # Simulated GPUs cost what the H200's NVML calls cost (a demo's cost nothing).
        self.env["VTOP_SIMULATED_NVML_COST"] = "h200"
        # The server is started once here, so a session's spawn time is not a server start.
        self._tmux("new-session", "-d", "-s", "keepalive", "-x", "20", "-y", "5", "exec cat")
        self._tmux("set-option", "-g", "default-terminal", "xterm-256color")

    def _tmux(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def new(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, float]:
        """Start ``argv`` in a new session; returns (pane pid, monotonic time just before the spawn)."""
        cmd = "exec " + " ".join(_sh_quote(a) for a in argv)
        extra: list[str] = []
        for k, v in (env or {}).items():
            extra += ["-e", f"{k}={v}"]
        t0 = time.monotonic()
        self._tmux("new-session", "-d", "-s", name, "-x", str(self.width), "-y", str(self.height), *extra, cmd)
        pid = int(self._tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
        return pid, t0

    def capture(self, name: str) -> str:
        t = time.perf_counter()
        out = self._tmux("capture-pane", "-p", "-t", name, check=False)
        self.capture_s.append(time.perf_counter() - t)
        return out

    def send_keys(self, name: str, *keys: str) -> None:
        self._tmux("send-keys", "-t", name, *keys)

    def alive(self, name: str) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", name],
                              capture_output=True, env=self.env).returncode == 0

    def kill(self, name: str) -> None:
        self._tmux("kill-session", "-t", name, check=False)

    def close(self) -> None:
        self._tmux("kill-server", check=False)
        sock = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / self.socket
        sock.unlink(missing_ok=True)  # tmux may leave it behind

    def wait_for(self, name: str, pred: Callable[[str], bool], timeout: float = 10.0,
                 since: float | None = None) -> tuple[float | None, str]:
        """Poll capture-pane every 10 ms until ``pred(screen)``; (seconds since ``since`` or None, last screen)."""
        start = time.monotonic() if since is None else since
        deadline = time.monotonic() + timeout
        nxt = time.monotonic()
        screen = ""
        while True:
            screen = self.capture(name)
            now = time.monotonic()
            if pred(screen):
                return now - start, screen
            if now > deadline:
                return None, screen
            nxt += POLL_S
            time.sleep(max(0.0, nxt - time.monotonic()))

    def polling_resolution(self) -> dict[str, float]:
        """What one capture-pane costs (the granularity of every time measured by polling)."""
        xs = sorted(self.capture_s) or [0.0]
        return {
            "poll_period_ms": POLL_S * 1000,
            "capture_pane_median_ms": 1000 * xs[len(xs) // 2],
            "capture_pane_p95_ms": 1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))],
            "captures": len(self.capture_s),
        }


def _sh_quote(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_./:=@%+-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def key_latencies(tmux: Tmux, name: str, key: str, shown: Callable[[str], bool], n: int,
                  timeout: float = 5.0, seed: int = 1, sent: list[float] | None = None) -> list[float | None]:
    """Press ``key`` ``n`` times; each press flips ``shown(screen)``. Seconds from send-keys to the
    first capture that shows the flip (None: not within ``timeout``). Presses are spaced by a random
    0.1-0.4 s so they land at every phase of the app's 1 Hz repaint. ``sent`` gets each press's
    send time (``time.monotonic``)."""
    import random

    rnd = random.Random(seed)
    out: list[float | None] = []
    state = shown(tmux.capture(name))
    for _ in range(n):
        time.sleep(0.1 + 0.3 * rnd.random())
        t0 = time.monotonic()
        if sent is not None:
            sent.append(t0)
        tmux.send_keys(name, key)
        took, screen = tmux.wait_for(name, lambda s, want=not state: shown(s) == want, timeout=timeout, since=t0)
        out.append(took)
        state = shown(screen)
    return out


def tmux_floor(tmux: Tmux, n: int = 20) -> list[float | None]:
    """The same press-and-poll loop against ``cat`` (the terminal echoes the key): tmux's own round trip."""
    tmux.new("floor", ["cat"])
    time.sleep(0.2)
    try:
        out: list[float | None] = []
        import random

        rnd = random.Random(2)
        for i in range(n):
            time.sleep(0.05 + 0.1 * rnd.random())
            t0 = time.monotonic()
            tmux.send_keys("floor", "x")
            took, _ = tmux.wait_for("floor", lambda s, k=i + 1: s.count("x") >= k, timeout=5, since=t0)
            out.append(took)
        return out
    finally:
        tmux.kill("floor")


# ------------------------------------------------------------ replayed vLLM
class MetricsTimeline:
    """The recorded H200 /metrics timeline, one payload a second, looping with counters that keep growing."""

    MONO_SUFFIXES = ("_bucket", "_count", "_sum", "_total")

    def __init__(self, path: Path = TIMELINE) -> None:
        rows = [json.loads(line) for line in lzma.open(path, "rt")]
        rows = sorted((r for r in rows if "text" in r), key=lambda r: r["t"])
        self.texts: list[str] = [r["text"] for r in rows]
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)", self.texts[-1], re.M))
        mono_types = {"counter", "histogram", "summary"}

        def monotonic(name: str) -> bool:
            if types.get(name) == "counter":
                return True
            for suf in self.MONO_SUFFIXES:
                if name.endswith(suf) and types.get(name[: -len(suf)]) in mono_types:
                    return True
            return False

        first: dict[str, float] = {}
        last: dict[str, float] = {}
        for text in self.texts:
            for line in text.split("\n"):
                if not line or line[0] == "#":
                    continue
                key, _, val = line.rpartition(" ")
                name = key.split("{", 1)[0]
                if not monotonic(name):
                    continue
                try:
                    v = float(val)
                except ValueError:
                    continue
                first.setdefault(key, 0.0 if text is not self.texts[0] else v)
                last[key] = v
        self.delta = {k: last[k] - first.get(k, 0.0) for k in last if last[k] - first.get(k, 0.0) > 0}
        self._cache: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.texts)

    def payload(self, i: int, names: tuple[str, ...] = ()) -> bytes:
        """The i-th second's body (i may be past the end: the loop goes on with counters offset);
        with ``names``, restricted to those samples the way vLLM's ``/metrics?name[]=...`` is."""
        k, j = divmod(i, len(self.texts))
        with self._lock:
            hit = self._cache.get((k, j, names))
        if hit is not None:
            return hit
        if names:
            body = restrict_lines(self.payload(i).decode(), names)
            with self._lock:
                self._cache[(k, j, names)] = body
            return body
        text = self.texts[j]
        if k:
            out = []
            for line in text.split("\n"):
                if line and line[0] != "#":
                    key, _, val = line.rpartition(" ")
                    d = self.delta.get(key)
                    if d:
                        line = f"{key} {float(val) + k * d!r}"
                out.append(line)
            text = "\n".join(out)
        body = text.encode()
        with self._lock:
            if len(self._cache) > 8:
                self._cache.clear()
            self._cache[(k, j, ())] = body
        return body


def restrict_lines(text: str, names: tuple[str, ...]) -> bytes:
    """What :func:`restricted` answers, read off the text line by line: the samples named,
    and the HELP/TYPE lines of their families. The replay serves this (under a
    millisecond; the library takes 15-35 ms a payload, which showed as the scrape's
    latency); tests/unit/test_bench_harness.py checks both read the same on every
    payload of the timeline."""
    want = set(names)
    lines = text.split("\n")
    fams: set[str] = set()
    for line in lines:
        if line and line[0] != "#":
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in want:
                fams.add(name)
                for suf in ("_bucket", "_count", "_sum", "_total"):
                    if name.endswith(suf):
                        fams.add(name[: -len(suf)])
    out: list[str] = []
    for line in lines:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            if line.split(" ", 3)[2] in fams:
                out.append(line)
        elif line and line[0] != "#" and line.split("{", 1)[0].split(" ", 1)[0] in want:
            out.append(line)
    return ("\n".join(out) + "\n").encode()


def restricted(text: str, names: tuple[str, ...]) -> bytes:
    """``text`` as prometheus_client serves it when asked ``?name[]=...`` (what vLLM's
    /metrics does): its own parser, registry and exposition, so the replay answers a
    restricted scrape exactly as the real library would."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))

    class Replayed:
        def collect(self) -> list[object]:
            return families

        def describe(self) -> list[object]:
            return families

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Replayed())  # type: ignore[arg-type]
    return generate_latest(reg.restricted_registry(names))


MODELS = {
    "object": "list",
    "data": [{"id": "/tmp/tiny", "object": "model", "created": 1796032449, "owned_by": "vllm",
              "root": "/tmp/tiny", "parent": None, "max_model_len": 32768, "permission": []}],
}


def make_server(timeline: MetricsTimeline, offset_s: int = 0, host: str = "127.0.0.1",
                now: Callable[[], float] = time.monotonic) -> ThreadingHTTPServer:
    """One vLLM look-alike on an ephemeral port (call ``serve_forever`` in a thread).
    ``now``: the clock that picks the timeline's second (bench/soak_fast.py's is fake)."""
    t0 = now() - offset_s
    hang = threading.Event()
    release = threading.Event()
    stats = {"connections": 0, "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def setup(self) -> None:
            stats["connections"] += 1
            super().setup()

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if not path.startswith("/_bench/"):
                stats["requests"] += 1
            if path in ("/metrics", "/metrics/"):
                if hang.is_set():
                    release.wait()  # accepted, read, never answered
                    self.close_connection = True
                    return
                # As vLLM routes it: /metrics is prometheus-fastapi-instrumentator's handler
                # (the whole registry, whatever the query); /metrics/ the prometheus_client
                # app mounted beside it, which restricts its answer to ?name[]=...
                names = tuple(parse_qs(urlsplit(self.path).query).get("name[]", ())) if path == "/metrics/" else ()
                body = timeline.payload(int(now() - t0), names)
                self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/health":
                self._send(200, b"", "application/json")
            elif path == "/v1/models":
                self._send(200, json.dumps(MODELS).encode(), "application/json")
            elif path == "/version":
                self._send(200, b'{"version":"0.26.0"}', "application/json")
            elif path == "/_bench/hang":
                release.clear()
                hang.set()
                self._send(200, b"hanging\n", "text/plain")
            elif path == "/_bench/stats":
                self._send(200, json.dumps(stats).encode(), "application/json")
            elif path == "/_bench/unhang":
                hang.clear()
                release.set()
                self._send(200, b"answering\n", "text/plain")
            else:
                self._send(404, b'{"detail":"Not Found"}', "application/json")

    srv = ThreadingHTTPServer((host, 0), Handler)
    srv.daemon_threads = True
    srv.release = release  # type: ignore[attr-defined]
    return srv


def serve(n: int) -> None:
    """``n`` servers in this process; first stdout line is a JSON list of URLs; ends when stdin closes."""
    timeline = MetricsTimeline()
    servers = [make_server(timeline, offset_s=i * 37) for i in range(n)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(json.dumps([f"http://127.0.0.1:{s.server_address[1]}" for s in servers]), flush=True)
    sys.stdin.read()
    for s in servers:
        s.release.set()  # type: ignore[attr-defined]
        s.shutdown()


def serve_static(n: int) -> None:
    """``n`` servers as a fake written from the fault matrix answers (tests/helpers/badserver.py, mode
    ``ok``): one real vLLM 0.32.0 CPU ``/metrics`` text, the same every time (its counters never move
    while it says requests run), the whole of it whatever the query (no ``?name[]=`` restriction)."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers.badserver import BadServer

    servers = [BadServer("ok") for _ in range(n)]
    print(json.dumps([s.url for s in servers]), flush=True)
    sys.stdin.read()
    for s in servers:
        s.__exit__()


class ServerProcess:
    """:func:`serve` in a child process (its CPU is not vtop's and does not share the bench's GIL).
    ``kind="static"``: :func:`serve_static` instead (the fault matrix's fakes)."""

    def __init__(self, n: int, kind: str = "replay") -> None:
        mode = {"replay": "serve", "static": "serve-static"}[kind]
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), mode, str(n)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.urls: list[str] = json.loads(self.proc.stdout.readline())

    def control(self, i: int, what: str) -> bytes:
        import urllib.request

        with urllib.request.urlopen(f"{self.urls[i]}/_bench/{what}", timeout=5) as r:
            return r.read()

    def stats(self, i: int) -> dict[str, int]:
        """TCP connections accepted and requests answered by server ``i`` (the bench's own not counted)."""
        s = json.loads(self.control(i, "stats"))
        s["connections"] -= 1  # this request's own
        return s

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def closed_port() -> tuple[int, object]:
    """A port that refuses connections: bound, never listening (keep the socket until done)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1], s


# ------------------------------------------------------------------- machine
def python_speed_ms(rounds: int = 7) -> float:
    """CPU time (median of ``rounds``, ms) of a fixed pure-Python loop of formatting and
    dict work, the kind vtop's UI thread does: how fast this box runs Python. The same
    vtop code cost 5.6-7.4 ms a second of UI thread on different GPU boxes of one type;
    this puts a number on the box beside each run."""
    import statistics

    def work() -> int:
        d: dict[str, int] = {}
        for i in range(20000):
            s = f"{i:5d} {i * 0.5:.1f}% {i % 7}"
            d[s[-6:]] = len(s) + d.get(s[-6:], 0)
        return sum(d.values())

    times = []
    for _ in range(rounds):
        t = time.thread_time()
        work()
        times.append(time.thread_time() - t)
    return 1000 * statistics.median(times)


def machine_info() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import textual

        tv = textual.__version__
    except Exception:  # noqa: BLE001
        tv = None
    try:
        from vtop import __version__ as vv
    except Exception:  # noqa: BLE001
        vv = None

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    tmux_v = subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.strip() if shutil.which("tmux") else None
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {
        "cpu_model": model,
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "textual": tv,
        "vtop": vv,
        "tmux": tmux_v,
        "git_head": git("rev-parse", "--short", "HEAD"),
        "vtop_tree_dirty": bool(git("status", "--porcelain", "--", "vtop")),
        "loadavg_start": loadavg(),
        "python_speed_ms": round(python_speed_ms(), 2),
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "serve-static":
        serve_static(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
