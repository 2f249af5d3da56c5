"""Record an incident trace from the REAL vLLM CPU server, independent of vtop.

    python -m tools.corpus.record SCENARIO --out tests/corpus/traces/NAME [--seconds N]
    python -m tools.corpus.record --list

Starts the real ``vllm serve`` (the CPU build, :class:`tests.real.conftest.RealVllm`: venv
``$VTOP_VLLM_VENV`` = /tmp/vllmcpu, model ``$VTOP_VLLM_MODEL`` = /tmp/tinyllama, on
127.0.0.1 only), samples it once a second in threads while the scenario runs, and writes
the trace as ``tests/corpus/FORMAT.md`` says:

* ``metrics.jsonl.gz``: ``GET /metrics`` every second; the body keeps only the ``vllm:``
  families (less the ``vllm:*_created`` gauges: constant creation times) and
  ``process_start_time_seconds``, with their ``# HELP`` / ``# TYPE``; the names of the families
  left out are listed in ``"dropped"`` on the first line that saw them. That is still 3-4 KB
  gzip a second; ``python -m tools.corpus.shrink TRACE`` then keeps only what vtop reads;
* ``health.jsonl.gz``: ``GET /health`` every second;
* ``info.jsonl.gz``: ``/version`` and ``/v1/models``, a line when they change (polled every
  5 s while healthy and at once when /health turns 200);
* ``procs.jsonl.gz``: the server's process tree (and any other vLLM process on the box) from
  ``/proc``, every second, each process with its CPU time so far (``"cpu"``: user + system
  seconds); ``--api-key`` and other secret flag values masked as ``***``;
* ``conns.jsonl.gz``: the kernel's counters of every connection to the server's port, every
  second (:func:`vtop.sources.sockets.read_conns`: when each one's request arrived, how many
  bytes of its answer the client acknowledged);
* ``log.bin.gz`` + ``log-index.jsonl.gz``: the server's stdout+stderr byte for byte (the
  fixture's own ``# vtop test fixture`` header line left out; the logs of several starts
  concatenated) and its size each second;
* ``events.jsonl``: what the recorder did, when; ``truth.json``: what happened, computed
  from the events (``began`` / ``should_alert_by`` / ``ended``).

Every scenario is bounded in requests and time and stops by itself; the server is
killed at the end (after the last sample, so the trace does not hold the shutdown
unless the scenario is about it). Only one vLLM server at a time: the recorder waits
(``--wait-other``) until no other ``vllm serve`` runs on the box before it starts.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gzip
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.real.conftest import RealVllm, ServerFailed

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent.parent / "tests" / "corpus" / "traces"
INDEX = TRACES / "INDEX.md"
WORK = Path(os.environ.get("VTOP_CORPUS_WORK", "/tmp/vtop-corpus"))

#: seconds from ``began`` to ``should_alert_by`` per class (startup_failure: 0, at the error line)
BUDGET = {"runaway": 60.0, "engine_stall": 30.0, "engine_death": 5.0, "kv_saturation": 40.0,
          "startup_stall": 90.0, "startup_failure": 0.0,
          # the neighbour's 20 s streak, its minute before, and the hold: 45 s from its first kernel
          "gpu_neighbour": 45.0,
          # a CUDA OOM in a running engine: named within 10 s of its death being seen
          "runtime_oom": 10.0}
#: vtop rule names (vtop.core.rules.RULES) that count as naming each class
EXPECT = {"runaway": ["runaway"], "engine_stall": ["engine_stall"], "engine_death": ["engine_died"],
          "kv_saturation": ["kv_saturation"], "startup_stall": ["startup_stall"],
          "startup_failure": ["startup_failure"], "restart": [], "normal": [], "clean_shutdown": [],
          "gpu_neighbour": ["gpu_neighbour"], "runtime_oom": ["oom_transient", "oom_steady"]}
SECRET_FLAGS = ("--api-key", "--hf-token", "--ssl-keyfile-password")
FIXTURE_HEADER = b"# vtop test fixture"
PROMPT = "Tell me about the quick brown fox and the lazy dog"


# --- small helpers -------------------------------------------------------------------


def now() -> tuple[float, float]:
    return time.time(), time.monotonic()


def mask_argv(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, a in enumerate(out):
        for flag in SECRET_FLAGS:
            if a == flag and i + 1 < len(out):
                out[i + 1] = "***"
            elif a.startswith(flag + "="):
                out[i] = flag + "=***"
    return out


_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEEP_EXACT = ("process_start_time_seconds",)


#: the engines' own families (vLLM's ``vllm:``; SGLang's ``sglang:`` with ``--enable-metrics``,
#: tools/device/h200_sglang.py records it through this sampler)
KEEP_PREFIXES = ("vllm:", "sglang:")


def _kept(name: str) -> bool:
    # *_created are gauges of the counters' and histograms' creation times: constant for a start
    # (process_start_time_seconds says the same), unread by vtop, and a fifth of the body
    return (name.startswith(KEEP_PREFIXES) and not name.endswith("_created")) or name in KEEP_EXACT


def filter_metrics(text: str) -> tuple[str, set[str]]:
    """The body with only the ``vllm:`` families (+ process_start_time_seconds); the dropped family names."""
    keep: list[str] = []
    dropped: set[str] = set()
    typed: set[str] = set()
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue
            name = parts[2]
            typed.add(name)
            if _kept(name):
                keep.append(line)
            else:
                dropped.add(name)
            continue
        m = _NAME_RE.match(line)
        if m is None:
            continue
        name = m.group(0)
        if _kept(name):
            keep.append(line)
        elif not any(name.startswith(f) for f in typed if not _kept(f)):
            dropped.add(name)
    return ("\n".join(keep) + "\n") if keep else "", dropped


def refilter(trace: Path) -> None:
    """Apply :func:`filter_metrics` again to a trace's metrics.jsonl.gz (after the filter changed)."""
    path = trace / "metrics.jsonl.gz"
    rows = [json.loads(x) for x in gzip.open(path, "rt", encoding="utf-8") if x.strip()]
    seen: set[str] = set()
    for r in rows:
        seen |= set(r.get("dropped") or ())
        if r.get("status") == 200 and r.get("text"):
            text, dropped = filter_metrics(r["text"])
            r["text"] = text
            new = sorted(dropped - seen)
            if new:
                r["dropped"] = sorted(set(r.get("dropped") or ()) | set(new))
                seen |= dropped
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    tmp.replace(path)


def _err_kind(e: Exception) -> str:
    if isinstance(e, httpx.ConnectError):
        return "refused"
    if isinstance(e, httpx.TimeoutException):
        return "timeout"
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
        return "disconnected"
    return type(e).__name__


# --- /proc ---------------------------------------------------------------------------


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime"):
                return float(line.split()[1])
    return 0.0


BOOT = _boot_time()
CLK = os.sysconf("SC_CLK_TCK")


def read_proc(pid: int) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    lp, rp = stat.find("("), stat.rfind(")")
    if lp < 0 or rp < 0:
        return None
    rest = stat[rp + 2:].split()
    if len(rest) < 20 or rest[0] == "Z":
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0")]
    while args and args[-1] == "":
        args.pop()
    # fields after the ")" of /proc/PID/stat, 0-based from state: utime 11, stime 12 (clock ticks), starttime 19
    try:
        cpu: float | None = round((int(rest[11]) + int(rest[12])) / CLK, 2)
    except (ValueError, IndexError):
        cpu = None
    # rest[0] is the state letter: R running, S sleeping, D waiting on I/O, T stopped by a signal, t traced
    return {"pid": pid, "ppid": int(rest[1]), "name": stat[lp + 1:rp], "cmdline": mask_argv(args),
            "create_time": round(BOOT + int(rest[19]) / CLK, 2), "cpu": cpu, "state": rest[0]}


def all_procs() -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            rec = read_proc(int(d))
            if rec is not None:
                out[rec["pid"]] = rec
    return out


def is_vllm_server(rec: dict[str, Any]) -> bool:
    cmd = rec["cmdline"]
    j = " ".join(cmd[:6])
    return ("serve" in cmd[:4] and any(c.endswith("/vllm") or c == "vllm" for c in cmd[:2])) or \
        "vllm.entrypoints.openai.api_server" in j


def is_vllm_titled(rec: dict[str, Any]) -> bool:
    cmd = rec["cmdline"]
    return bool(cmd) and cmd[0].startswith("VLLM::")


def vllm_tree(procs: dict[int, dict[str, Any]], roots: set[int]) -> list[dict[str, Any]]:
    """The processes under ``roots`` and under any vLLM server / VLLM:: process of the box."""
    roots = set(roots) | {p for p, r in procs.items() if is_vllm_server(r) or is_vllm_titled(r)}
    kids: dict[int, list[int]] = {}
    for r in procs.values():
        kids.setdefault(r["ppid"], []).append(r["pid"])
    seen: set[int] = set()
    stack = [p for p in roots if p in procs]
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        stack.extend(kids.get(p, ()))
    return [procs[p] for p in sorted(seen)]


def other_servers(mine: set[int]) -> list[dict[str, Any]]:
    procs = all_procs()
    return [r for r in procs.values() if is_vllm_server(r) and r["pid"] not in mine]


# --- the server ----------------------------------------------------------------------


class Server(RealVllm):
    """:class:`RealVllm` with env overrides (``None`` removes a variable) and a forced model folder."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.env_over: dict[str, str | None] = {}
        self.force_model: Path | None = None

    def _env(self, fresh_cache: bool, n: int) -> dict[str, str]:
        env = super()._env(fresh_cache, n)
        for k, v in self.env_over.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def _model_for(self, max_model_len: int) -> Path:
        if self.force_model is not None:
            return self.force_model
        return super()._model_for(max_model_len)


# --- the log (several starts concatenated, the fixture's header left out) ---------------


class LogSegments:
    """The log's files one after another, as the log-index's sizes count them. A segment is a file: a new
    path, or a new file at the same path (serve.sh removes serve.log and starts a new one at each launch: the
    file before is gone by its path, so each segment keeps its file open and is read through that; a scenario
    of three starts kept only the last file, under an index whose size went back to 0 at each launch)."""

    def __init__(self) -> None:
        # [path, header_len or None, final_size or None, open file or None, inode or None]
        self.segs: list[list[Any]] = []
        self.lock = threading.Lock()

    def follow(self, path: Path | None) -> None:
        with self.lock:
            if path is None:
                return
            ino = self._ino(path)
            if self.segs and self.segs[-1][0] == path:
                last = self.segs[-1]
                if last[3] is None and ino is not None:
                    last[3], last[4] = self._open(path)
                if ino is None or last[4] is None or ino == last[4]:
                    return
            if self.segs:
                last = self.segs[-1]
                last[2] = self._raw_size(last)
            fh, ino = self._open(path)
            self.segs.append([path, None, None, fh, ino])

    @staticmethod
    def _ino(path: Path) -> int | None:
        try:
            return path.stat().st_ino
        except OSError:
            return None

    @staticmethod
    def _open(path: Path) -> tuple[Any, int | None]:
        try:
            fh = open(path, "rb")  # noqa: SIM115 - kept open: the segment is read through it once replaced
        except OSError:
            return None, None
        return fh, os.fstat(fh.fileno()).st_ino

    @staticmethod
    def _raw_size(seg: list[Any]) -> int:
        try:
            if seg[3] is not None:
                return os.fstat(seg[3].fileno()).st_size
            return seg[0].stat().st_size
        except (OSError, ValueError):
            return 0

    @staticmethod
    def _read(seg: list[Any]) -> bytes:
        try:
            if seg[3] is not None:
                seg[3].seek(0)
                return seg[3].read()
            return seg[0].read_bytes()
        except (OSError, ValueError):
            return b""

    def _header(self, seg: list[Any]) -> int:
        if seg[1] is None:
            head = self._read(seg)[:8192]
            if head.startswith(FIXTURE_HEADER):
                nl = head.find(b"\n")
                if nl < 0:
                    return len(head)  # not complete yet
                seg[1] = nl + 1
            elif head:
                seg[1] = 0
            else:
                return 0
        return int(seg[1])

    def size(self) -> int:
        with self.lock:
            total = 0
            for seg in self.segs:
                raw = seg[2] if seg[2] is not None else self._raw_size(seg)
                total += max(0, raw - self._header(seg))
            return total

    def data(self, limit: int) -> bytes:
        with self.lock:
            parts = []
            for seg in self.segs:
                b = self._read(seg)
                if seg[2] is not None:
                    b = b[:seg[2]]
                parts.append(b[self._header(seg):])
        return b"".join(parts)[:limit]


# --- the sampler -----------------------------------------------------------------------


class Sampler:
    """Threads writing metrics/health/info/procs/log-index once a second."""

    def __init__(self, out: Path, srv: Server) -> None:
        self.out = out
        self.srv = srv
        self.stop_ev = threading.Event()
        self.log = LogSegments()
        self.latest: dict[str, float] = {}
        self.healthy = False
        self.last_log_size = 0
        self.last_index: tuple[float, float, int] | None = None
        self.files = {k: gzip.open(out / f"{k}.jsonl.gz", "wt", encoding="utf-8", compresslevel=9)
                      for k in ("metrics", "health", "info", "procs", "log-index", "conns")}
        self.threads = [threading.Thread(target=self._loop, args=(p, fn), daemon=True, name=f"sample-{n}")
                        for n, p, fn in (("metrics", 1.0, self._metrics), ("health", 1.0, self._health),
                                         ("procs", 1.0, self._procs), ("conns", 1.0, self._conns))]
        self._dropped_seen: set[str] = set()
        self._info_last: Any = None
        self._server_info_seen: dict[Any, str | None] = {}
        self._info_next = 0.0
        self._procs_last: tuple[int, ...] | None = None
        self.counts = {"metrics": 0, "metrics_ok": 0}
        #: no connection counters in the trace (a server in another network namespace): conns.jsonl.gz left out
        self.skip_conns = False
        #: no process table in the trace (vtop in a container without the host's PID namespace sees none of the
        #: server's processes): procs.jsonl.gz left out (the thread still follows the log and writes its index)
        self.skip_procs = False

    def _write(self, key: str, row: dict[str, Any]) -> None:
        self.files[key].write(json.dumps(row, separators=(",", ":")) + "\n")

    def start(self) -> None:
        for th in self.threads:
            th.start()

    def stop(self) -> None:
        self.stop_ev.set()
        for th in self.threads:
            th.join(30)
        self._log_index()  # the last size, after everything else
        for f in self.files.values():
            f.close()

    def _loop(self, period: float, fn: Callable[[httpx.Client], None]) -> None:
        nxt = time.monotonic()
        with httpx.Client(timeout=httpx.Timeout(10.0, connect=3.0)) as client:
            while not self.stop_ev.is_set():
                try:
                    fn(client)
                except Exception as e:  # noqa: BLE001 - a sampler never dies
                    print(f"[sampler] {fn.__name__}: {type(e).__name__}: {e}", file=sys.stderr)
                nxt += period
                t = time.monotonic()
                if nxt < t:
                    nxt = t + period - ((t - nxt) % period)
                self.stop_ev.wait(max(0.0, nxt - t))

    # metrics
    def _metrics(self, client: httpx.Client) -> None:
        t, mono = now()
        row: dict[str, Any] = {"t": round(t, 3), "mono": round(mono, 3)}
        try:
            r = client.get(self.srv.url + "/metrics")
            row["dt"] = round(time.monotonic() - mono, 4)
            row["status"], row["error"] = r.status_code, None
            if r.status_code == 200:
                text, dropped = filter_metrics(r.text)
                new = sorted(dropped - self._dropped_seen)
                if new:
                    row["dropped"] = new
                    self._dropped_seen |= dropped
                row["text"] = text
                self._parse_latest(text)
                self.counts["metrics_ok"] += 1
            else:
                row["text"] = r.text[:2000]
        except Exception as e:  # noqa: BLE001
            row["dt"] = round(time.monotonic() - mono, 4)
            row["status"], row["error"], row["text"] = None, _err_kind(e), None
        self.counts["metrics"] += 1
        self._write("metrics", row)

    _GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
               "kv": "vllm:kv_cache_usage_perc", "preempt": "vllm:num_preemptions_total",
               "gen": "vllm:generation_tokens_total"}

    def _parse_latest(self, text: str) -> None:
        vals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            for key, name in self._GAUGES.items():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    with contextlib.suppress(ValueError, IndexError):
                        vals[key] = vals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        self.latest = vals

    # health + info
    def _health(self, client: httpx.Client) -> None:
        t, mono = now()
        row: dict[str, Any] = {"t": round(t, 3), "mono": round(mono, 3)}
        try:
            r = client.get(self.srv.url + "/health", timeout=5.0)
            row["status"], row["error"] = r.status_code, None
        except Exception as e:  # noqa: BLE001
            row["status"], row["error"] = None, _err_kind(e)
        row["dt"] = round(time.monotonic() - mono, 4)
        self._write("health", row)
        ok = row["status"] == 200
        turned = ok and not self.healthy
        self.healthy = ok
        if ok and (turned or time.monotonic() >= self._info_next):
            self._info_next = time.monotonic() + 5.0
            self._info(client)

    def _info(self, client: httpx.Client) -> None:
        t, mono = now()
        try:
            r = client.get(self.srv.url + "/version", timeout=5.0)
            version = r.json().get("version") if r.status_code == 200 else None
            if version is None and r.status_code == 404:
                version = self._server_info_version(client)
            models = client.get(self.srv.url + "/v1/models", timeout=5.0).json()
        except Exception:  # noqa: BLE001 - next time
            return
        key = json.dumps([version, [{k: m.get(k) for k in ("id", "root", "parent", "owned_by", "max_model_len")}
                                    for m in (models.get("data") or []) if isinstance(m, dict)]], sort_keys=True)
        if key != self._info_last:
            self._info_last = key
            self._write("info", {"t": round(t, 3), "mono": round(mono, 3), "version": version, "models": models})

    def _server_info_version(self, client: httpx.Client) -> str | None:
        """SGLang serves no ``/version``: its ``/server_info`` carries ``"version"`` (0.5.x, as vtop reads
        it). Asked once per server process: it is a round trip to SGLang's scheduler."""
        pid = getattr(self.srv, "pid", None)
        if pid in self._server_info_seen:
            return self._server_info_seen[pid]
        v = client.get(self.srv.url + "/server_info", timeout=5.0).json().get("version")
        self._server_info_seen[pid] = str(v) if v else None
        return self._server_info_seen[pid]

    # procs + log index
    def _procs(self, client: httpx.Client) -> None:
        self.log.follow(self.srv.log_path)
        self._log_index()
        t, mono = now()
        roots = {self.srv.pid} if self.srv.pid else set()
        tree = vllm_tree(all_procs(), roots)
        pids = tuple(r["pid"] for r in tree)
        # every second (the thread's period): each process's CPU time moves between samples
        self._procs_last = pids
        if not self.skip_procs:
            self._write("procs", {"t": round(t, 3), "mono": round(mono, 3), "procs": tree})

    # the kernel's counters of the server's connections (what vtop.sources.sockets reads live)
    def _conns(self, client: httpx.Client) -> None:
        from vtop.sources.sockets import conn_read_to_json, read_conns

        if self.skip_conns:
            return
        port = int(self.srv.url.rsplit(":", 1)[1].split("/")[0])
        row = conn_read_to_json(read_conns({port}))
        row["t"], row["mono"] = round(float(row["t"]), 3), round(float(row["mono"]), 3)  # type: ignore[arg-type]
        self._write("conns", row)

    def _log_index(self) -> None:
        t, mono = now()
        size = self.log.size()
        self.last_log_size = size
        self.last_index = (t, mono, size)
        self._write("log-index", {"t": round(t, 3), "mono": round(mono, 3), "size": size})


# --- traffic (bounded) --------------------------------------------------------------------


class Stream:
    """One streaming chat request in a thread, until it finishes or :meth:`hangup` closes it."""

    def __init__(self, ctx: Ctx, what: str, max_tokens: int | None = None, content: str = "Tell me a very long story.",
                 read_timeout: float = 180.0, time_limit: float = 600.0) -> None:
        self.ctx = ctx
        self.what = what
        self.body: dict[str, Any] = {"model": ctx.srv.model, "stream": True, "ignore_eos": True, "temperature": 0.8,
                                     "stream_options": {"include_usage": True},
                                     "messages": [{"role": "user", "content": content}]}
        if max_tokens is not None:
            self.body["max_tokens"] = max_tokens
        self.read_timeout = read_timeout
        self.time_limit = time_limit
        self.id: str | None = None
        self.chunks = 0
        self.finish: str | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"stream-{what}")

    def start(self) -> Stream:
        self.ctx.event(self.what + "_begin", max_tokens=self.body.get("max_tokens"), stream=True)
        self._t.start()
        return self

    def hangup(self) -> None:
        if not self.done.is_set():
            self._stop.set()
            self._t.join(30)
            self.ctx.event("client_hangup", of=self.what, request_id=self.id, chunks=self.chunks)

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            with httpx.Client(timeout=httpx.Timeout(30.0, read=self.read_timeout)) as c, \
                    c.stream("POST", self.ctx.srv.url + "/v1/chat/completions", json=self.body) as r:
                if r.status_code != 200:
                    self.error = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                    return
                for line in r.iter_lines():
                    if self._stop.is_set() or time.monotonic() - t0 > self.time_limit:
                        return  # closing the stream: vLLM aborts the request
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    d = json.loads(line[6:])
                    if self.id is None and d.get("id"):
                        self.id = d["id"]
                        self.ctx.event(self.what + "_id", request_id=self.id)
                    self.chunks += 1
                    fr = (d.get("choices") or [{}])[0].get("finish_reason") if d.get("choices") else None
                    if fr:
                        self.finish = fr
        except Exception as e:  # noqa: BLE001 - noted in the events
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if not self._stop.is_set():
                self.ctx.event(self.what + "_end", request_id=self.id, chunks=self.chunks, finish=self.finish,
                               error=self.error)
            self.done.set()


class ShortTraffic:
    """Short requests (max_tokens 16-64) every few seconds, completions and chat, at most 3 in flight."""

    def __init__(self, ctx: Ctx, period: tuple[float, float] = (2.0, 5.0), max_tokens: tuple[int, int] = (16, 64),
                 max_count: int = 150, time_limit: float = 400.0, seed: int = 7) -> None:
        self.ctx = ctx
        self.period, self.max_tokens = period, max_tokens
        self.max_count, self.time_limit = max_count, time_limit
        self.rng = random.Random(seed)
        self.sent = self.ok = self.failed = 0
        self._stop = threading.Event()
        self._inflight = threading.Semaphore(3)
        self._t = threading.Thread(target=self._run, daemon=True, name="short-traffic")
        # no keep-alive: uvicorn closes an idle connection after 5 s, a race with the next request of a slow period
        self._client = httpx.Client(base_url=ctx.srv.url, timeout=httpx.Timeout(120.0, connect=5.0),
                                    limits=httpx.Limits(max_keepalive_connections=0))

    def start(self) -> ShortTraffic:
        self.ctx.event("load_begin", kind="short", period=list(self.period), max_tokens=list(self.max_tokens))
        self._t.start()
        return self

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._t.join(130)
            self.ctx.event("load_end", kind="short", sent=self.sent, ok=self.ok, failed=self.failed)

    def _one(self, i: int) -> None:
        mt = self.rng.randint(*self.max_tokens)
        try:
            if i % 2:
                body = {"model": self.ctx.srv.model, "max_tokens": mt, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"{PROMPT} #{i}"}]}
                r = self._client.post("/v1/chat/completions", json=body)
            else:
                body = {"model": self.ctx.srv.model, "prompt": f"{PROMPT} #{i}", "max_tokens": mt, "ignore_eos": True}
                r = self._client.post("/v1/completions", json=body)
            if r.status_code == 200:
                self.ok += 1
            else:
                self.failed += 1
        except Exception:  # noqa: BLE001 - counted
            self.failed += 1
        finally:
            self._inflight.release()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and self.sent < self.max_count and time.monotonic() - t0 < self.time_limit:
            if self._inflight.acquire(timeout=1.0):
                self.sent += 1
                threading.Thread(target=self._one, args=(self.sent,), daemon=True).start()
                self._stop.wait(self.rng.uniform(*self.period))


class ClosedLoop:
    """``n`` clients in a closed loop: each sends a short request (max_tokens 16-64, completions and chat in
    turn, not streamed) as soon as its last one is answered, until stopped; bounded in count and time."""

    def __init__(self, ctx: Ctx, n: int, max_tokens: tuple[int, int] = (16, 64), max_count: int = 5000,
                 time_limit: float = 400.0, seed: int = 13) -> None:
        self.ctx, self.n, self.max_tokens = ctx, n, max_tokens
        self.max_count, self.time_limit = max_count, time_limit
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.sent = self.ok = self.failed = 0
        self.secs: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._worker, args=(k,), daemon=True, name=f"loop-{k}")
                         for k in range(n)]

    def start(self) -> ClosedLoop:
        self.ctx.event("load_begin", kind="closed_loop", concurrency=self.n, max_tokens=list(self.max_tokens))
        for th in self._threads:
            th.start()
        return self

    def _take(self) -> tuple[int, int] | None:
        with self.lock:
            if self.sent >= self.max_count:
                return None
            self.sent += 1
            return self.sent, self.rng.randint(*self.max_tokens)

    def _worker(self, k: int) -> None:
        t0 = time.monotonic()
        with httpx.Client(base_url=self.ctx.srv.url, timeout=httpx.Timeout(120.0, connect=5.0)) as client:
            while not self._stop.is_set() and time.monotonic() - t0 < self.time_limit:
                got = self._take()
                if got is None:
                    return
                i, mt = got
                t1 = time.monotonic()
                try:
                    if i % 2:
                        r = client.post("/v1/chat/completions", json={
                            "model": self.ctx.srv.model, "max_tokens": mt, "ignore_eos": True,
                            "messages": [{"role": "user", "content": f"{PROMPT} #{i}"}]})
                    else:
                        r = client.post("/v1/completions", json={
                            "model": self.ctx.srv.model, "prompt": f"{PROMPT} #{i}", "max_tokens": mt,
                            "ignore_eos": True})
                    good = r.status_code == 200
                except Exception:  # noqa: BLE001 - counted
                    good = False
                with self.lock:
                    if good:
                        self.ok += 1
                        self.secs.append(time.monotonic() - t1)
                    else:
                        self.failed += 1

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(130)
        secs = sorted(self.secs)
        self.ctx.event("load_end", kind="closed_loop", sent=self.sent, ok=self.ok, failed=self.failed,
                       secs_p50=round(secs[len(secs) // 2], 2) if secs else None,
                       secs_max=round(secs[-1], 2) if secs else None)


class StreamPool:
    """``n`` concurrent streaming chat requests with ``max_tokens``, each replaced when done, until stopped."""

    def __init__(self, ctx: Ctx, n: int, max_tokens: int, max_total: int = 400, time_limit: float = 400.0) -> None:
        self.ctx, self.n, self.max_tokens = ctx, n, max_tokens
        self.max_total, self.time_limit = max_total, time_limit
        self.started = self.finished = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.live: list[Stream] = []
        self._t = threading.Thread(target=self._run, daemon=True, name="stream-pool")

    def start(self) -> StreamPool:
        self.ctx.event("load_begin", kind="stream_pool", concurrency=self.n, max_tokens=self.max_tokens)
        self._t.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.time_limit:
            with self.lock:
                self.live = [s for s in self.live if not s.done.is_set()]
                while len(self.live) < self.n and self.started < self.max_total:
                    s = Stream(self.ctx, "pool", max_tokens=self.max_tokens, content=f"{PROMPT} #{self.started}")
                    s.ctx = _Quiet(self.ctx)  # type: ignore[assignment]
                    s._t.start()
                    self.live.append(s)
                    self.started += 1
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)
        with self.lock:
            live = list(self.live)
        for s in live:
            s._stop.set()
        for s in live:
            s._t.join(30)
        self.ctx.event("load_end", kind="stream_pool", started=self.started, hung_up=len(live))


class NonStreamPool:
    """``n`` concurrent NON-streaming chat requests with ``max_tokens`` (a connection each), each replaced when
    done, until stopped. :meth:`stop` starts no more and waits for those in flight to end (a non-streaming
    client has nothing to hang up on short of its read timeout ``give_up_s``)."""

    def __init__(self, ctx: Ctx, n: int, max_tokens: int, give_up_s: float = 120.0, max_total: int = 400,
                 time_limit: float = 400.0) -> None:
        self.ctx, self.n, self.max_tokens, self.give_up_s = ctx, n, max_tokens, give_up_s
        self.max_total, self.time_limit = max_total, time_limit
        self.started = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.live: list[tuple[float, NonStream]] = []
        self.ended: list[tuple[float, NonStream]] = []  # (seconds from its start to its end seen, request)
        self._t = threading.Thread(target=self._run, daemon=True, name="nonstream-pool")

    def start(self) -> NonStreamPool:
        self.ctx.event("load_begin", kind="nonstream_pool", concurrency=self.n, max_tokens=self.max_tokens,
                       stream=False)
        self._t.start()
        return self

    def _reap(self) -> None:
        now_ = time.monotonic()
        for t0, s in self.live:
            if s.done.is_set():
                self.ended.append((now_ - t0, s))
        self.live = [(t0, s) for t0, s in self.live if not s.done.is_set()]

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.time_limit:
            with self.lock:
                self._reap()
                while len(self.live) < self.n and self.started < self.max_total:
                    body = {"model": self.ctx.srv.model, "max_tokens": self.max_tokens, "ignore_eos": True,
                            "temperature": 0.8, "messages": [{"role": "user", "content": f"{PROMPT} #{self.started}"}]}
                    s = NonStream(_Quiet(self.ctx), "pool", "/v1/chat/completions", body,  # type: ignore[arg-type]
                                  give_up_s=self.give_up_s).start()
                    self.live.append((time.monotonic(), s))
                    self.started += 1
            self._stop.wait(0.25)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)
        deadline = time.monotonic() + self.give_up_s + 30
        with self.lock:
            live = [s for _, s in self.live]
        for s in live:
            s.done.wait(max(0.0, deadline - time.monotonic()))
        with self.lock:
            self._reap()
            ended, left = list(self.ended), len(self.live)
        secs = sorted(round(d, 1) for d, _ in ended)
        ok = [s for _, s in ended if s.status == 200]
        self.ctx.event("load_end", kind="nonstream_pool", started=self.started, ended=len(ended), ok=len(ok),
                       finish=sorted({str(s.finish) for s in ok}),
                       completion_tokens=sorted({(s.usage or {}).get("completion_tokens") for s in ok},
                                                key=lambda x: x if isinstance(x, int) else -1)[-3:],
                       errors=sorted({str(s.error)[:120] for _, s in ended if s.error})[:5],
                       secs_p50=secs[len(secs) // 2] if secs else None, secs_max=secs[-1] if secs else None,
                       still_running=left)


class _Quiet:
    """A ctx for pooled streams: their per-request events are not written."""

    def __init__(self, ctx: Ctx) -> None:
        self.srv = ctx.srv

    def event(self, *a: Any, **k: Any) -> None:
        pass


class NonStream:
    """One NON-streaming request in a thread; the client gives up (closes the connection: vLLM aborts the
    request) when its read timeout ``give_up_s`` passes, as a client with a timeout does."""

    def __init__(self, ctx: Ctx, what: str, path: str, body: dict[str, Any], give_up_s: float) -> None:
        self.ctx, self.what, self.path, self.body, self.give_up_s = ctx, what, path, body, give_up_s
        self.status: int | None = None
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"nonstream-{what}")

    def start(self) -> NonStream:
        self.ctx.event(self.what + "_begin", path=self.path, max_tokens=self.body.get("max_tokens", "absent"),
                       stream=False, give_up_s=self.give_up_s)
        self._t.start()
        return self

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=httpx.Timeout(30.0, read=self.give_up_s)) as c:
                r = c.post(self.ctx.srv.url + self.path, json=self.body)
            self.status = r.status_code
            if r.status_code == 200:
                js = r.json()
                self.finish = (js.get("choices") or [{}])[0].get("finish_reason")
                self.usage = js.get("usage")
            else:
                self.error = f"HTTP {r.status_code}: {r.text[:300]}"
            self.ctx.event(self.what + "_end", status=self.status, finish=self.finish, usage=self.usage,
                           error=self.error)
        except httpx.ReadTimeout:
            self.ctx.event("client_hangup", of=self.what, reason=f"read timeout after {self.give_up_s:.0f} s")
        except Exception as e:  # noqa: BLE001 - noted in the events
            self.error = f"{type(e).__name__}: {e}"
            self.ctx.event(self.what + "_end", status=None, error=self.error)
        finally:
            self.done.set()


class MixedTraffic:
    """Chat and completion requests, streaming or not, ``max_tokens`` drawn from a range, with a concurrency
    that changes every ``step`` seconds within ``concurrency``; bounded in count and time."""

    def __init__(self, ctx: Ctx, concurrency: tuple[int, int] = (1, 6), max_tokens: tuple[int, int] = (16, 512),
                 step: float = 20.0, max_count: int = 800, time_limit: float = 200.0, seed: int = 11,
                 prompt: Callable[[int, random.Random], str] | None = None, kind: str = "mixed") -> None:
        self.ctx, self.concurrency, self.max_tokens, self.step = ctx, concurrency, max_tokens, step
        self.max_count, self.time_limit, self.kind = max_count, time_limit, kind
        self.rng = random.Random(seed)
        self.prompt = prompt or (lambda i, rng: f"{PROMPT} #{i}")
        self.level = concurrency[0]
        self.sent = self.ok = self.failed = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = 0.0
        self._threads = [threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"{kind}-{i}")
                         for i in range(concurrency[1])]
        self._ctl = threading.Thread(target=self._control, daemon=True, name=f"{kind}-ctl")

    def start(self) -> MixedTraffic:
        self.ctx.event("load_begin", kind=self.kind, concurrency=list(self.concurrency),
                       max_tokens=list(self.max_tokens))
        self._t0 = time.monotonic()
        self._ctl.start()
        for th in self._threads:
            th.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._ctl.join(5)
        for th in self._threads:
            th.join(150)
        self.ctx.event("load_end", kind=self.kind, sent=self.sent, ok=self.ok, failed=self.failed,
                       prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                       errors=self.errors[:3])

    def _over(self) -> bool:
        return self._stop.is_set() or time.monotonic() - self._t0 > self.time_limit

    def _control(self) -> None:
        while not self._over():
            with self.lock:
                self.level = self.rng.randint(*self.concurrency)
            self.ctx.event("load_level", kind=self.kind, concurrency=self.level)
            self._stop.wait(self.step)

    def _worker(self, slot: int) -> None:
        with httpx.Client(base_url=self.ctx.srv.url, timeout=httpx.Timeout(150.0, connect=5.0)) as client:
            while not self._over():
                with self.lock:
                    active = slot < self.level and self.sent < self.max_count
                    if active:
                        self.sent += 1
                        i = self.sent
                        mt = self.rng.randint(*self.max_tokens)
                        chat, stream = self.rng.random() < 0.5, self.rng.random() < 0.5
                        text = self.prompt(i, self.rng)
                if not active:
                    self._stop.wait(0.5)
                    continue
                try:
                    usage = self._one(client, text, mt, chat, stream)
                    with self.lock:
                        self.ok += 1
                        if usage:
                            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                            self.completion_tokens += int(usage.get("completion_tokens") or 0)
                except Exception as e:  # noqa: BLE001 - counted
                    with self.lock:
                        self.failed += 1
                        if len(self.errors) < 20:
                            self.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
                self._stop.wait(self.rng.uniform(0.0, 1.0))

    def _one(self, client: httpx.Client, text: str, mt: int, chat: bool, stream: bool) -> dict[str, Any] | None:
        body: dict[str, Any] = {"model": self.ctx.srv.model, "max_tokens": mt, "ignore_eos": True}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = text
            path = "/v1/completions"
        if not stream:
            r = client.post(path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            return dict(r.json().get("usage") or {})
        body.update(stream=True, stream_options={"include_usage": True})
        usage = None
        with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    usage = json.loads(line[6:]).get("usage") or usage
        return usage


# --- the context a scenario runs in ----------------------------------------------------


@dataclass
class Scenario:
    name: str
    cls: str
    fn: Callable[[Ctx], None]
    seconds: float
    doc: str


SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, cls: str, seconds: float) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    def deco(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        SCENARIOS[name] = Scenario(name, cls, fn, seconds, (fn.__doc__ or "").strip())
        return fn

    return deco


class Ctx:
    def __init__(self, sc: Scenario, out: Path, seconds: float, work: Path) -> None:
        self.sc = sc
        self.out = out
        self.seconds = seconds
        self.work = work
        self.srv = Server(work)
        self.events: list[dict[str, Any]] = []
        self._ev_file = open(out / "events.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._ev_lock = threading.Lock()
        self.sampler: Sampler | None = None
        self.flags: list[str] | None = None
        self.stopped_pids: list[int] = []
        self.truth_extra: dict[str, Any] = {}
        self.notes: list[str] = []

    def event(self, what: str, **kw: Any) -> dict[str, Any]:
        t, mono = now()
        ev = {"t": round(t, 3), "mono": round(mono, 3), "what": what, **kw}
        with self._ev_lock:
            self.events.append(ev)
            self._ev_file.write(json.dumps(ev) + "\n")
            self._ev_file.flush()
        print(f"[{time.strftime('%H:%M:%S')}] {what} {json.dumps(kw) if kw else ''}", flush=True)
        return ev

    def first(self, what: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["what"] == what), None)

    def last(self, what: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e["what"] == what), None)

    def sleep(self, s: float) -> None:
        time.sleep(max(0.0, s))

    # -- the server
    def launch(self, extra_args: tuple[str, ...] = (), *, max_model_len: int | None = None, log_requests: bool = True,
               fresh_cache: bool = False, env: dict[str, str | None] | None = None,
               force_model: Path | None = None) -> None:
        self.srv.env_over = dict(env or {})
        self.srv.force_model = force_model
        self.srv.launch(extra_args, max_model_len=max_model_len, log_requests=log_requests, fresh_cache=fresh_cache)
        pid = self.srv.pid
        cmd: list[str] = []
        for _ in range(50):
            rec = read_proc(pid) if pid else None
            if rec and rec["cmdline"]:
                cmd = rec["cmdline"]
                break
            time.sleep(0.02)
        flags = cmd[cmd.index("serve") + 2:] if "serve" in cmd else []
        if self.flags is None:
            self.flags = flags
        env_shown = {k: (None if v is None else v) for k, v in self.srv.env_over.items()}
        self.event("launch", pid=pid, flags=flags, model=str(self.srv.served_model_dir), env=env_shown or None,
                   kv_cache_space_gib=None if "VLLM_CPU_KVCACHE_SPACE" in self.srv.env_over
                   else os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))

    def wait_ready(self, timeout: float = 300.0) -> float:
        s = self.srv.wait_health(timeout)
        self.event("ready", healthy_after_s=round(s, 1), model=self.srv.model, max_model_len=self.srv.max_model_len)
        return s

    def start(self, *a: Any, **kw: Any) -> None:
        self.launch(*a, **kw)
        self.wait_ready()

    def wait_exit(self, timeout: float) -> int | None:
        proc = self.srv.proc
        if proc is None:
            return None
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        rc = proc.poll()
        if rc is not None:
            self.event("server_exit", pid=proc.pid, returncode=rc)
        return rc

    def wait_log(self, pattern: str, timeout: float) -> bool:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if rx.search(self.srv.log_text()):
                return True
            if not self.srv.is_running():
                return False
            time.sleep(0.1)
        return False

    def stop_procs(self, pids: list[int], what: str) -> None:
        for p in pids:
            os.kill(p, signal.SIGSTOP)
            self.stopped_pids.append(p)
        self.event("sigstop", pids=pids, of=what)

    def cont_procs(self) -> None:
        pids = list(self.stopped_pids)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        self.stopped_pids.clear()
        self.event("sigcont", pids=pids)

    def close(self) -> None:
        for p in self.stopped_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        self.stopped_pids.clear()
        self._ev_file.close()


# --- the scenarios ----------------------------------------------------------------------

#: a runaway must outlive its 60 s budget: the CPU server decodes one stream at 220-300 tok/s, so an
#: 8192 context ends by itself after 27-37 s; 65536 keeps it going for minutes
RUNAWAY_MML = 65536


@scenario("runaway-with-short-traffic", "runaway", 150)
def runaway_with_short_traffic(ctx: Ctx) -> None:
    """--max-model-len 65536 --enable-log-requests; one streaming chat request without max_tokens (ignore_eos)
    for ~150 s while short requests (max_tokens 16-64) come and go every 2-5 s; then the client hangs up; 30 s after."""
    _runaway_among_short(ctx, log_requests=True)


def _runaway_among_short(ctx: Ctx, *, log_requests: bool) -> None:
    ctx.start(max_model_len=RUNAWAY_MML, log_requests=log_requests)
    short = ShortTraffic(ctx).start()
    ctx.sleep(15)
    ra = Stream(ctx, "runaway").start()
    ctx.sleep(ctx.seconds)
    ra.hangup()
    ctx.sleep(30)
    short.stop()


@scenario("runaway-alone-no-request-log", "runaway", 150)
def runaway_alone_no_request_log(ctx: Ctx) -> None:
    """--max-model-len 65536, request logging off; one streaming chat request without max_tokens (ignore_eos),
    nothing else, ~150 s; the client hangs up; 30 s after."""
    ctx.start(max_model_len=RUNAWAY_MML, log_requests=False)
    ctx.sleep(10)
    ra = Stream(ctx, "runaway").start()
    ctx.sleep(ctx.seconds)
    ra.hangup()
    ctx.sleep(30)


@scenario("runaway-short-traffic-no-request-log", "runaway", 120)
def runaway_short_traffic_no_request_log(ctx: Ctx) -> None:
    """--max-model-len 65536, request logging off (vLLM's default); short requests (max_tokens 16-64) every
    2-5 s over one kept-alive connection, and one streaming chat request without max_tokens (ignore_eos) on its
    own for ~120 s; then the client hangs up; 30 s after. Records the kernel's counters of the connections."""
    _runaway_among_short(ctx, log_requests=False)


def _runaway_beside_closed_loop(ctx: Ctx, n: int) -> None:
    assert ctx.sampler is not None
    ctx.sampler.skip_conns = True  # a server in another network namespace: no connection counters
    ctx.start(max_model_len=RUNAWAY_MML, log_requests=False)
    loop = ClosedLoop(ctx, n, time_limit=ctx.seconds + 90).start()
    ctx.sleep(20)
    ra = Stream(ctx, "runaway").start()
    ctx.sleep(ctx.seconds)
    ra.hangup()
    ctx.sleep(30)
    loop.stop()


@scenario("runaway-closed-loop-3-no-request-log", "runaway", 120)
def runaway_closed_loop_3(ctx: Ctx) -> None:
    """--max-model-len 65536, request logging off (vLLM's default), and no connection counters (conns.jsonl.gz
    left out, as for a server in another network namespace); a closed loop of 3 clients, each sending a short
    request (max_tokens 16-64, non-streamed completions and chat in turn) as soon as its last one is answered,
    and after 20 s one streaming chat request without max_tokens (ignore_eos) for ~120 s; then the client hangs
    up; 30 s after."""
    _runaway_beside_closed_loop(ctx, 3)


@scenario("runaway-closed-loop-8-no-request-log", "runaway", 120)
def runaway_closed_loop_8(ctx: Ctx) -> None:
    """--max-model-len 65536, request logging off (vLLM's default), and no connection counters (conns.jsonl.gz
    left out, as for a server in another network namespace); a closed loop of 8 clients, each sending a short
    request (max_tokens 16-64, non-streamed completions and chat in turn) as soon as its last one is answered,
    and after 20 s one streaming chat request without max_tokens (ignore_eos) for ~120 s; then the client hangs
    up; 30 s after."""
    _runaway_beside_closed_loop(ctx, 8)


@scenario("runaway-streaming-after-others", "runaway", 120)
def runaway_streaming_after_others(ctx: Ctx) -> None:
    """--max-model-len 65536 --enable-log-requests; 3 legitimate streaming requests with max_tokens 1500 running
    (each replaced when done), then the runaway (no max_tokens) starts for ~120 s; hang up; 30 s after."""
    ctx.start(max_model_len=RUNAWAY_MML, log_requests=True)
    pool = StreamPool(ctx, n=3, max_tokens=1500, max_total=60, time_limit=ctx.seconds + 90).start()
    ctx.sleep(25)
    ra = Stream(ctx, "runaway").start()
    ctx.sleep(ctx.seconds)
    ra.hangup()
    ctx.sleep(30)
    pool.stop()


@scenario("normal-long-generation-max-tokens", "normal", 150)
def normal_long_generation_max_tokens(ctx: Ctx) -> None:
    """--max-model-len 8192; legitimate streaming chat requests with max_tokens 6000 (ignore_eos), one after
    the other for ~150 s, plus light short traffic: long generations that finish by themselves (length)."""
    ctx.start(max_model_len=8192, log_requests=True)
    short = ShortTraffic(ctx, period=(4.0, 8.0)).start()
    ctx.sleep(10)
    t_end = time.monotonic() + ctx.seconds
    n = 0
    while time.monotonic() < t_end and n < 8:
        s = Stream(ctx, "long_request", max_tokens=6000, time_limit=300).start()
        n += 1
        while not s.done.wait(1.0):
            if time.monotonic() > t_end + 60:
                s.hangup()
                break
        ctx.sleep(3)
    ctx.sleep(10)
    short.stop()


@scenario("normal-long-generation-20k", "normal", 150)
def normal_long_generation_20k(ctx: Ctx) -> None:
    """--max-model-len 65536; ONE legitimate streaming chat request with max_tokens 20000 (ignore_eos, under half
    of max_model_len), running for well over a minute and finishing by itself (length), plus light short
    traffic: a long generation the client asked for, NOT a runaway."""
    ctx.start(max_model_len=RUNAWAY_MML, log_requests=True)
    short = ShortTraffic(ctx, period=(4.0, 8.0)).start()
    ctx.sleep(10)
    s = Stream(ctx, "long_request", max_tokens=20000, time_limit=ctx.seconds + 120).start()
    if not s.done.wait(ctx.seconds + 120):
        s.hangup()
        ctx.notes.append("the 20000-token request did not finish in time and was hung up")
    ctx.sleep(20)
    short.stop()


def _bursts(ctx: Ctx, max_tokens: int, every_s: float, max_bursts: int) -> None:
    ctx.start(("--max-num-seqs", "4"), log_requests=True)
    ctx.sleep(10)
    t_end = time.monotonic() + ctx.seconds
    b = 0
    while time.monotonic() < t_end and b < max_bursts:
        b += 1
        ctx.event("load_begin", kind="burst", n=32, concurrency=32, max_tokens=max_tokens, burst=b)
        t0 = time.monotonic()
        res = ctx.srv.load(n=32, concurrency=32, max_tokens=max_tokens, time_limit_s=60, request_timeout_s=150)
        ctx.event("load_end", kind="burst", burst=b, ok=res.ok, failed=res.failed, elapsed_s=round(res.elapsed_s, 1))
        ctx.sleep(every_s - (time.monotonic() - t0))
    ctx.sleep(15)


@scenario("normal-bursts-waiting-queue", "normal", 150)
def normal_bursts_waiting_queue(ctx: Ctx) -> None:
    """--max-num-seqs 4; bursts of 32 concurrent completions (max_tokens 96) every ~35 s: running 4 and a
    waiting queue of up to 28 that drains within 2-3 s per burst; normal."""
    _bursts(ctx, max_tokens=96, every_s=35, max_bursts=8)


@scenario("normal-bursts-long-queue", "normal", 160)
def normal_bursts_long_queue(ctx: Ctx) -> None:
    """--max-num-seqs 4; bursts of 32 concurrent completions (max_tokens 768) every ~40 s: running 4 and a
    waiting queue of up to 28 that drains over ~15-25 s per burst; normal."""
    _bursts(ctx, max_tokens=768, every_s=40, max_bursts=6)


@scenario("normal-idle-3min", "normal", 180)
def normal_idle_3min(ctx: Ctx) -> None:
    """Default flags; the server idles for ~180 s after it is ready (only the recorder's scrapes)."""
    ctx.start(log_requests=True)
    ctx.sleep(ctx.seconds)


def _steady_load(ctx: Ctx, seconds: float) -> Any:
    ctx.event("load_begin", kind="steady", concurrency=4, max_tokens=64)
    return ctx.srv.start_load(n=2000, concurrency=4, max_tokens=64, time_limit_s=seconds, request_timeout_s=150)


def _clean_stop(ctx: Ctx, of: str) -> None:
    """Stop the server cleanly (SIGTERM), its stop and its exit on the trace's timeline."""
    pid = ctx.srv.pid
    ctx.event("sigterm", pid=pid, of=of)
    ctx.srv.stop()
    ctx.event("server_exit", pid=pid, returncode=ctx.srv.proc.returncode if ctx.srv.proc else None)


def _end_load(ctx: Ctx, fut: Any, timeout: float = 200) -> None:
    try:
        res = fut.result(timeout=timeout)
        ctx.event("load_end", kind="steady", sent=res.sent, ok=res.ok, failed=res.failed,
                  errors=res.errors[:3], elapsed_s=round(res.elapsed_s, 1))
    except Exception as e:  # noqa: BLE001
        ctx.event("load_end", kind="steady", error=f"{type(e).__name__}: {e}")


@scenario("engine-stall-enginecore", "engine_stall", 60)
def engine_stall_enginecore(ctx: Ctx) -> None:
    """Steady load (4 concurrent completions, max_tokens 64); SIGSTOP the EngineCore for 60 s, SIGCONT, 30 s after."""
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, 20 + ctx.seconds + 30)
    ctx.sleep(20)
    eng = ctx.srv.engine_pid(timeout=5)
    assert eng, "no EngineCore"
    ctx.stop_procs([eng], "EngineCore")
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.sleep(30)
    _end_load(ctx, fut, 60)


@scenario("engine-stall-worker-only", "engine_stall", 60)
def engine_stall_worker_only(ctx: Ctx) -> None:
    """Steady load; SIGSTOP only the VLLM::Worker (a child of EngineCore on the CPU build) for 60 s, SIGCONT, 30 s after."""
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, 20 + ctx.seconds + 30)
    ctx.sleep(20)
    workers = ctx.srv.worker_pids()
    assert workers, "no VLLM::Worker"
    ctx.stop_procs(workers, "Worker")
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.sleep(30)
    _end_load(ctx, fut, 60)


@scenario("clean-sigterm-shutdown", "clean_shutdown", 30)
def clean_sigterm_shutdown(ctx: Ctx) -> None:
    """Steady load for 30 s, then SIGTERM to the API server (a clean shutdown), 20 s of the refused port after."""
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, ctx.seconds + 1)  # no new requests once the server is going down
    ctx.sleep(ctx.seconds)
    pid = ctx.srv.pid
    assert pid
    os.kill(pid, signal.SIGTERM)
    ctx.event("sigterm", pid=pid, of="api_server")
    ctx.wait_exit(60)
    ctx.sleep(20)
    _end_load(ctx, fut, 30)


def _no_kv_env() -> dict[str, str | None]:
    # RealVllm sets VLLM_CPU_KVCACHE_SPACE=1 (GiB); it would override --kv-cache-memory-bytes
    return {"VLLM_CPU_KVCACHE_SPACE": None}


@scenario("startup-failure-kv-too-small", "startup_failure", 20)
def startup_failure_kv_too_small(ctx: Ctx) -> None:
    """--max-model-len 8192 with --kv-cache-memory-bytes 4 MiB (2,048 tokens): the KV cache cannot hold one
    sequence, the engine fails at startup and the server exits."""
    ctx.launch(("--kv-cache-memory-bytes", str(4 * 2**20)), max_model_len=8192, log_requests=True, env=_no_kv_env())
    rc = ctx.wait_exit(300)
    if rc is None:
        ctx.notes.append("the server did not exit within 300 s")
    ctx.sleep(ctx.seconds)


@scenario("startup-failure-kv-too-large", "startup_failure", 20)
def startup_failure_kv_too_large(ctx: Ctx) -> None:
    """VLLM_CPU_KVCACHE_SPACE=64 (GiB), more than the box has: the worker refuses to allocate the KV cache
    (ValueError: Available memory on node 0 ... is less than requested memory for kv), the server exits."""
    ctx.launch((), log_requests=True, env={"VLLM_CPU_KVCACHE_SPACE": "64"})
    rc = ctx.wait_exit(300)
    if rc is None:
        ctx.notes.append("the server did not exit within 300 s")
    ctx.sleep(ctx.seconds)


@scenario("startup-failure-bad-max-model-len", "startup_failure", 20)
def startup_failure_bad_max_model_len(ctx: Ctx) -> None:
    """--max-model-len 4096 on the 2048-position model, without VLLM_ALLOW_LONG_MAX_MODEL_LEN: config
    validation fails in the API server before the engine starts; the server exits."""
    ctx.launch(max_model_len=4096, log_requests=True, force_model=ctx.srv.model_dir,
               env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": None})
    rc = ctx.wait_exit(300)
    if rc is None:
        ctx.notes.append("the server did not exit within 300 s")
    ctx.sleep(ctx.seconds)


@scenario("restart-counter-reset", "restart", 40)
def restart_counter_reset(ctx: Ctx) -> None:
    """Steady load 40 s; stop the server (SIGTERM, clean); start it again with the same flags; load 40 s:
    counters reset, a new process_start_time_seconds, new pids."""
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, ctx.seconds)
    ctx.sleep(ctx.seconds)
    _end_load(ctx, fut, 60)
    ctx.sleep(3)
    _clean_stop(ctx, "api_server (restart)")
    ctx.sleep(3)
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, ctx.seconds)
    ctx.sleep(ctx.seconds)
    _end_load(ctx, fut, 60)
    ctx.sleep(10)


@scenario("startup-stall-compile", "startup_stall", 150)
def startup_stall_compile(ctx: Ctx) -> None:
    """Fresh compile cache; when the Worker logs "Warming up model for the compilation..." it is SIGSTOPped
    for 150 s (EngineCore left running): a silent startup with the port refused; SIGCONT, the start completes."""
    ctx.launch(log_requests=True, fresh_cache=True)
    if not ctx.wait_log(r"Warming up model for the compilation", 300):
        ctx.notes.append("never saw the compile phase")
        return
    time.sleep(1.0)
    workers = ctx.srv.worker_pids()
    assert workers, "no VLLM::Worker"
    size = ctx.sampler.log.size() if ctx.sampler else 0
    ctx.stop_procs(workers, "Worker")
    ctx.event("log_size_at_sigstop", size=size)
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.wait_ready(300)
    ctx.sleep(20)


@scenario("engine-death-enginecore-idle", "engine_death", 30)
def engine_death_enginecore_idle(ctx: Ctx) -> None:
    """Idle server; kill -9 the EngineCore; the API server notices and exits; 30 s after."""
    ctx.start(log_requests=True)
    ctx.sleep(20)
    eng = ctx.srv.engine_pid(timeout=5)
    assert eng
    os.kill(eng, signal.SIGKILL)
    ctx.event("kill", pid=eng, of="EngineCore", signal="SIGKILL")
    ctx.wait_exit(60)
    ctx.sleep(ctx.seconds)


@scenario("engine-death-worker-load", "engine_death", 30)
def engine_death_worker_load(ctx: Ctx) -> None:
    """Steady load; kill -9 the VLLM::Worker; EngineCore / the API server notice and exit; 30 s after."""
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, 21)  # no new requests once the server is dead
    ctx.sleep(20)
    workers = ctx.srv.worker_pids()
    assert workers
    for w in workers:
        os.kill(w, signal.SIGKILL)
    ctx.event("kill", pid=workers[0], pids=workers, of="Worker", signal="SIGKILL")
    ctx.wait_exit(60)
    ctx.sleep(ctx.seconds)
    _end_load(ctx, fut, 30)


def _kv_saturation(ctx: Ctx, kv_mib: int, streams: int, max_tokens: int) -> None:
    ctx.start(("--kv-cache-memory-bytes", str(kv_mib * 2**20)), log_requests=True, env=_no_kv_env())
    ctx.sleep(10)
    pool = StreamPool(ctx, n=streams, max_tokens=max_tokens, max_total=400, time_limit=ctx.seconds + 120).start()
    deadline = time.monotonic() + 120
    full = None
    while time.monotonic() < deadline:
        sm = ctx.sampler.latest if ctx.sampler else {}
        if sm.get("kv", 0.0) >= 0.95:
            full = ctx.event("kv_full", kv=sm.get("kv"), running=sm.get("running"), waiting=sm.get("waiting"),
                             preemptions=sm.get("preempt"))
            break
        time.sleep(0.5)
    if full is None:
        ctx.notes.append("KV usage never reached 95 % within 120 s of the load")
    ctx.sleep(ctx.seconds)
    pool.stop()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sm = ctx.sampler.latest if ctx.sampler else {}
        if sm.get("kv", 1.0) < 0.5:
            ctx.event("kv_released", kv=sm.get("kv"), running=sm.get("running"), waiting=sm.get("waiting"),
                      preemptions=sm.get("preempt"))
            break
        time.sleep(0.5)
    ctx.sleep(20)


@scenario("kv-saturation-bursts", "kv_saturation", 60)
def kv_saturation_bursts(ctx: Ctx) -> None:
    """--kv-cache-memory-bytes 12 MiB (6,144 tokens: 3 sequences of 2,048) and three bursts of 16 concurrent
    streaming requests with max_tokens 1800, each held --seconds (60 s) after KV usage first reaches 95 %, then
    hung up on; 45 s of an idle cache between bursts: KV usage at 95-100 % with preemptions and a waiting queue
    in each burst, nothing between them (KV pressure that comes in bursts, issue 38 item 10b: a short doctor
    window between two bursts). Events: kv_full (the first one begins the incident) and burst_end per burst,
    kv_released after the last; doctor_after_s: 5 s after each burst but the last ended (the live doctor's
    window in the quiet between two bursts). (A first try, 6 streams in an 8 MiB cache for 40 s, was too mild: KV 71-100 %,
    median 85-90 %, 1-4 waiting.)"""
    ctx.start(("--kv-cache-memory-bytes", str(12 * 2**20)), log_requests=True, env=_no_kv_env())
    ctx.sleep(10)
    bursts = 3
    for burst in range(bursts):
        pool = StreamPool(ctx, n=16, max_tokens=1800, max_total=200, time_limit=ctx.seconds + 120).start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            sm = ctx.sampler.latest if ctx.sampler else {}
            if sm.get("kv", 0.0) >= 0.95:
                ctx.event("kv_full", burst=burst, kv=sm.get("kv"), running=sm.get("running"),
                          waiting=sm.get("waiting"), preemptions=sm.get("preempt"))
                break
            time.sleep(0.5)
        else:
            ctx.notes.append(f"burst {burst}: KV usage never reached 95 % within 120 s of the load")
        ctx.sleep(ctx.seconds)
        pool.stop()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sm = ctx.sampler.latest if ctx.sampler else {}
            if sm.get("kv", 1.0) < 0.5:
                ctx.event("burst_end", burst=burst, kv=sm.get("kv"), running=sm.get("running"),
                          waiting=sm.get("waiting"), preemptions=sm.get("preempt"))
                break
            time.sleep(0.5)
        if burst < bursts - 1:
            ctx.sleep(45)
    # the live doctor's extra runs: 5 s after each burst but the last ended, the window all in the quiet
    first = ctx.first("kv_full")
    if first is not None:
        ends = [e["t"] for e in ctx.events if e["what"] == "burst_end"][:bursts - 1]
        ctx.truth_extra["doctor_after_s"] = [round(t - first["t"] + 5.0) for t in ends]
    sm = ctx.sampler.latest if ctx.sampler else {}
    ctx.event("kv_released", kv=sm.get("kv"), running=sm.get("running"), waiting=sm.get("waiting"),
              preemptions=sm.get("preempt"))
    ctx.sleep(20)


@scenario("kv-saturation-preemptions", "kv_saturation", 150)
def kv_saturation_preemptions(ctx: Ctx) -> None:
    """--kv-cache-memory-bytes 12 MiB (6,144 tokens: 3 sequences of 2,048) and 16 concurrent streaming
    requests with max_tokens 1800: KV usage at 95-100 %, preemptions, a waiting queue, for ~150 s; then the
    clients hang up."""
    _kv_saturation(ctx, kv_mib=12, streams=16, max_tokens=1800)


@scenario("kv-saturation-many-seqs", "kv_saturation", 150)
def kv_saturation_many_seqs(ctx: Ctx) -> None:
    """--kv-cache-memory-bytes 24 MiB (12,288 tokens) and 32 concurrent streaming requests with max_tokens 1800:
    many short sequences, so a preemption frees only a few % of the cache and KV usage stays near 100 %, with
    preemptions and a waiting queue, for ~150 s; then the clients hang up."""
    _kv_saturation(ctx, kv_mib=24, streams=32, max_tokens=1800)


# --- more variations (recorded 2026-12-02 with the process tree's CPU time) -----------------


@scenario("runaway-nonstreaming-request-log", "runaway", 150)
def runaway_nonstreaming_request_log(ctx: Ctx) -> None:
    """--max-model-len 65536 --enable-log-requests; one NON-streaming chat request without max_tokens (ignore_eos;
    vLLM fills in max_model_len - prompt) while short requests (max_tokens 16-64) come and go every 2-5 s; the
    client gives up after ~150 s (its read timeout: the connection closes, vLLM aborts the request); 30 s after.
    (/v1/completions cannot make this runaway on vLLM 0.32: its max_tokens defaults to 16, and an explicit null
    was served as 16 too.)"""
    _nonstreaming_runaway_among_short(ctx, log_requests=True, seed=21)


def _nonstreaming_runaway_among_short(ctx: Ctx, *, log_requests: bool, seed: int) -> None:
    ctx.start(max_model_len=RUNAWAY_MML, log_requests=log_requests)
    short = ShortTraffic(ctx, seed=seed).start()
    ctx.sleep(15)
    body = {"model": ctx.srv.model, "ignore_eos": True, "temperature": 0.8,
            "messages": [{"role": "user", "content": "Write a very long essay about the sea."}]}
    ra = NonStream(ctx, "runaway", "/v1/chat/completions", body, give_up_s=ctx.seconds).start()
    if not ra.done.wait(ctx.seconds + 30):
        ctx.notes.append("the non-streaming request did not end with the client's timeout")
    ctx.sleep(30)
    short.stop()


@scenario("runaway-nonstreaming-short-traffic-no-request-log", "runaway", 120)
def runaway_nonstreaming_short_traffic_no_request_log(ctx: Ctx) -> None:
    """--max-model-len 65536, request logging off (vLLM's default); short requests (max_tokens 16-64) every
    2-5 s, and one NON-streaming chat request without max_tokens (ignore_eos) on its own connection: nothing
    of its answer is sent until it ends; the client gives up after ~120 s (its read timeout: vLLM aborts the
    request); 30 s after. Records the kernel's counters of the connections (the request's only trace)."""
    _nonstreaming_runaway_among_short(ctx, log_requests=False, seed=23)


@scenario("normal-long-nonstreaming-max-tokens", "normal", 150)
def normal_long_nonstreaming_max_tokens(ctx: Ctx) -> None:
    """--max-model-len 8192, request logging off; legitimate NON-streaming chat requests with max_tokens 3000
    (ignore_eos), two at a time, each replaced when done, for ~150 s, plus short requests every 2-5 s: long
    answers sent whole at their end, none near a minute. Records the kernel's counters of the connections."""
    ctx.start(max_model_len=8192, log_requests=False)
    short = ShortTraffic(ctx, seed=29).start()
    ctx.sleep(10)
    t_end = time.monotonic() + ctx.seconds
    body = {"model": ctx.srv.model, "ignore_eos": True, "temperature": 0.8, "max_tokens": 3000,
            "messages": [{"role": "user", "content": "Write a long essay about rivers."}]}
    live: list[NonStream] = []
    n = 0
    while time.monotonic() < t_end and n < 16:
        live = [x for x in live if not x.done.is_set()]
        while len(live) < 2 and n < 16:
            live.append(NonStream(ctx, "long_request", "/v1/chat/completions", body, give_up_s=120).start())
            n += 1
        ctx.sleep(1)
    for x in live:
        x.done.wait(120)
    ctx.sleep(15)
    short.stop()


@scenario("runaway-during-burst-queue", "runaway", 150)
def runaway_during_burst_queue(ctx: Ctx) -> None:
    """--max-model-len 65536 --max-num-seqs 4 --enable-log-requests; bursts of 24 concurrent completions
    (max_tokens 384) every ~40 s, each with a waiting queue; 3 s into the second burst (4 running, ~20 waiting)
    a streaming chat request without max_tokens (ignore_eos) is sent: it waits its turn in the queue, then holds
    one of the 4 slots for ~150 s while the bursts go on; the client hangs up; 30 s after."""
    ctx.start(("--max-num-seqs", "4"), max_model_len=RUNAWAY_MML, log_requests=True)
    ctx.sleep(10)
    burst_no = [0]
    stop = threading.Event()

    def bursts() -> None:
        t_end = time.monotonic() + 40 + ctx.seconds + 40
        while not stop.is_set() and time.monotonic() < t_end and burst_no[0] < 8:
            burst_no[0] += 1
            b = burst_no[0]
            ctx.event("load_begin", kind="burst", n=24, concurrency=24, max_tokens=384, burst=b)
            t0 = time.monotonic()
            res = ctx.srv.load(n=24, concurrency=24, max_tokens=384, time_limit_s=60, request_timeout_s=200)
            ctx.event("load_end", kind="burst", burst=b, ok=res.ok, failed=res.failed,
                      elapsed_s=round(res.elapsed_s, 1))
            stop.wait(max(0.0, 40 - (time.monotonic() - t0)))

    th = threading.Thread(target=bursts, daemon=True, name="bursts")
    th.start()
    deadline = time.monotonic() + 120
    while burst_no[0] < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ctx.sleep(3)
    sm = ctx.sampler.latest if ctx.sampler else {}
    ctx.event("queue_at_runaway", running=sm.get("running"), waiting=sm.get("waiting"))
    ra = Stream(ctx, "runaway").start()
    ctx.sleep(ctx.seconds)
    ra.hangup()
    ctx.sleep(30)
    stop.set()
    th.join(250)


def _kill_tree_member(ctx: Ctx, what: str) -> None:
    if what == "EngineCore":
        eng = ctx.srv.engine_pid(timeout=5)
        assert eng, "no EngineCore"
        os.kill(eng, signal.SIGKILL)
        ctx.event("kill", pid=eng, of="EngineCore", signal="SIGKILL")
    else:
        workers = ctx.srv.worker_pids()
        assert workers, "no VLLM::Worker"
        for w in workers:
            os.kill(w, signal.SIGKILL)
        ctx.event("kill", pid=workers[0], pids=workers, of="Worker", signal="SIGKILL")


@scenario("engine-death-enginecore-load", "engine_death", 30)
def engine_death_enginecore_load(ctx: Ctx) -> None:
    """Steady load (4 concurrent completions, max_tokens 64); kill -9 the EngineCore; the API server notices
    and exits; 30 s after."""
    ctx.start(log_requests=True)
    fut = _steady_load(ctx, 21)  # no new requests once the server is dead
    ctx.sleep(20)
    _kill_tree_member(ctx, "EngineCore")
    ctx.wait_exit(60)
    ctx.sleep(ctx.seconds)
    _end_load(ctx, fut, 30)


@scenario("engine-death-worker-idle", "engine_death", 30)
def engine_death_worker_idle(ctx: Ctx) -> None:
    """Idle server; kill -9 the VLLM::Worker (as the kernel's OOM killer would); EngineCore and the API server
    notice and exit; 30 s after."""
    ctx.start(log_requests=True)
    ctx.sleep(20)
    _kill_tree_member(ctx, "Worker")
    if ctx.wait_exit(60) is None:
        ctx.notes.append("the server was still running 60 s after the kill")
    ctx.sleep(ctx.seconds)


def _stop_tree(ctx: Ctx, root: int, what: str) -> list[int]:
    """SIGSTOP ``root`` and then its descendants (a stopped parent forks no more), as one event."""
    import psutil

    pids: list[int] = []
    for _ in range(3):
        try:
            tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        new = [p.pid for p in tree if p.pid not in pids]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
                pids.append(p)
                ctx.stopped_pids.append(p)
    ctx.event("sigstop", pids=pids, of=what)
    return pids


def _startup_stall(ctx: Ctx, pattern: str, what: str, root: Callable[[], int | None]) -> None:
    ctx.launch(log_requests=True)
    if not ctx.wait_log(pattern, 300):
        ctx.notes.append(f"never saw {pattern!r}")
        return
    pid = root()
    assert pid, f"no {what}"
    _stop_tree(ctx, pid, what)
    time.sleep(0.5)  # what was written before the stop reaches the log file
    size = ctx.sampler.log.size() if ctx.sampler else 0
    ctx.event("log_size_at_sigstop", size=size)
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.wait_ready(300)
    ctx.sleep(20)


@scenario("startup-stall-process-start", "startup_stall", 150)
def startup_stall_process_start(ctx: Ctx) -> None:
    """When the API server logs its "non-default args" line (right after the banner), the whole process tree
    (the API server and whatever it has spawned) is SIGSTOPped for 150 s, as a process blocked on a hung
    filesystem would be: no log, no CPU time, the port not open; SIGCONT, the start completes."""
    _startup_stall(ctx, r"non-default args", "API server tree", lambda: ctx.srv.pid)


@scenario("startup-stall-engine-init", "startup_stall", 150)
def startup_stall_engine_init(ctx: Ctx) -> None:
    """When the EngineCore logs "Initializing a V1 LLM engine", it (and any Worker it has spawned) is SIGSTOPped
    for 150 s, the API server left running and waiting for it: a silent engine init with the port refused;
    SIGCONT, the start completes."""
    _startup_stall(ctx, r"Initializing a V1 LLM engine", "EngineCore tree", lambda: ctx.srv.engine_pid(timeout=10))


@scenario("startup-failure-missing-module", "startup_failure", 20)
def startup_failure_missing_module(ctx: Ctx) -> None:
    """--load-format fastsafetensors, whose package (fastsafetensors) this vLLM build does not have: the Worker
    fails to import it when it loads the weights (ModuleNotFoundError), the engine fails to start, the server
    exits."""
    ctx.launch(("--load-format", "fastsafetensors"), log_requests=True)
    rc = ctx.wait_exit(300)
    if rc is None:
        ctx.notes.append("the server did not exit within 300 s")
    ctx.sleep(ctx.seconds)


@scenario("normal-steady-mixed", "normal", 180)
def normal_steady_mixed(ctx: Ctx) -> None:
    """Default flags, --enable-log-requests; ~180 s of mixed traffic: chat and completions, streaming and not,
    max_tokens 16-512 (ignore_eos), the concurrency changing every 20 s between 1 and 6; normal."""
    ctx.start(log_requests=True)
    ctx.sleep(10)
    mix = MixedTraffic(ctx, concurrency=(1, 6), max_tokens=(16, 512), step=20, time_limit=ctx.seconds).start()
    ctx.sleep(ctx.seconds)
    mix.stop()
    ctx.sleep(15)


@scenario("clean-sigterm-idle", "clean_shutdown", 20)
def clean_sigterm_idle(ctx: Ctx) -> None:
    """Idle server (a few requests early on, then nothing for 20 s); SIGTERM to the API server (a clean
    shutdown of an idle server); 20 s of the refused port after."""
    ctx.start(log_requests=True)
    res = ctx.srv.load(n=6, concurrency=2, max_tokens=32, time_limit_s=30)
    ctx.event("load_end", kind="few", ok=res.ok, failed=res.failed)
    ctx.sleep(20)
    pid = ctx.srv.pid
    assert pid
    os.kill(pid, signal.SIGTERM)
    ctx.event("sigterm", pid=pid, of="api_server")
    ctx.wait_exit(60)
    ctx.sleep(ctx.seconds)


@scenario("restart-idle", "restart", 30)
def restart_idle(ctx: Ctx) -> None:
    """A few requests, then an idle server is restarted: SIGTERM (clean), started again with the same flags
    (the operator's restart), a few requests, idle 30 s: counters reset, new pids, no incident."""
    ctx.start(log_requests=True)
    res = ctx.srv.load(n=8, concurrency=2, max_tokens=32, time_limit_s=30)
    ctx.event("load_end", kind="few", ok=res.ok, failed=res.failed)
    ctx.sleep(15)
    _clean_stop(ctx, "api_server (restart)")
    ctx.sleep(3)
    ctx.start(log_requests=True)
    res = ctx.srv.load(n=4, concurrency=2, max_tokens=32, time_limit_s=30)
    ctx.event("load_end", kind="few", ok=res.ok, failed=res.failed)
    ctx.sleep(ctx.seconds)


@scenario("engine-stall-enginecore-worker-streaming", "engine_stall", 60)
def engine_stall_enginecore_worker_streaming(ctx: Ctx) -> None:
    """3 streaming chat requests with max_tokens 1500 running (each replaced when done); SIGSTOP both the
    EngineCore and its VLLM::Worker for 60 s (the clients wait on open streams), SIGCONT, 30 s after."""
    ctx.start(log_requests=True)
    pool = StreamPool(ctx, n=3, max_tokens=1500, max_total=60, time_limit=20 + ctx.seconds + 30).start()
    ctx.sleep(20)
    eng = ctx.srv.engine_pid(timeout=5)
    workers = ctx.srv.worker_pids()
    assert eng and workers, "no EngineCore / Worker"
    ctx.stop_procs([eng, *workers], "EngineCore+Worker")
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.sleep(30)
    pool.stop()


# --- without a log for vtop (issue 49): vLLM's stdout on a pipe vtop cannot follow -------------------
# The recorder still keeps the log (log.bin.gz, for the reader); truth.json's "log_for_vtop": false says
# vtop had none: the scoreboard and the live doctor play these traces without it (tests/corpus/FORMAT.md).


@scenario("engine-stall-streaming-nolog", "engine_stall", 90)
def engine_stall_streaming_nolog(ctx: Ctx) -> None:
    """No log for vtop (its stdout on a pipe: log_for_vtop false); 3 streaming chat requests with max_tokens
    1500 running (each replaced when done); SIGSTOP the EngineCore for 90 s while the clients wait on open
    streams (their connections silent: the kernel's last-sent time dates the stop); doctor --window 15 started
    30 s and 60 s after the stop (doctor_after_s) ends inside it; SIGCONT, 30 s after."""
    ctx.truth_extra.update(log_for_vtop=False, doctor_after_s=[30, 60])
    ctx.start(log_requests=False)
    pool = StreamPool(ctx, n=3, max_tokens=1500, max_total=60, time_limit=20 + ctx.seconds + 30).start()
    ctx.sleep(20)
    eng = ctx.srv.engine_pid(timeout=5)
    assert eng, "no EngineCore"
    ctx.stop_procs([eng], "EngineCore")
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.sleep(30)
    pool.stop()


@scenario("startup-stall-compile-nolog", "startup_stall", 150)
def startup_stall_compile_nolog(ctx: Ctx) -> None:
    """No log for vtop (log_for_vtop false); fresh compile cache; when the Worker logs "Warming up model for
    the compilation..." the whole server tree (API server, EngineCore, Worker) is SIGSTOPped for --seconds (150 by
    default): every process in state T, no CPU time added, the port closed; SIGCONT, the start completes."""
    ctx.truth_extra["log_for_vtop"] = False
    ctx.launch(log_requests=False, fresh_cache=True)
    if not ctx.wait_log(r"Warming up model for the compilation", 300):
        ctx.notes.append("never saw the compile phase")
        return
    time.sleep(1.0)
    assert ctx.srv.pid, "no API server"
    _stop_tree(ctx, ctx.srv.pid, "server tree")
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.wait_ready(300)
    ctx.sleep(20)


@scenario("startup-stall-compile-history-noprocs", "startup_stall", 150)
def startup_stall_compile_history_noprocs(ctx: Ctx) -> None:
    """No process table in the trace (procs.jsonl.gz left out: vtop in a container without the host's PID
    namespace sees none of the server's processes); the box's compile cache (no fresh one). A first start to
    ready, 10 s idle, SIGTERM (clean); the same flags again: when the Worker logs "Warming up model for the
    compilation..." the EngineCore and its Worker are SIGSTOPped for --seconds (150 by default), the API server left
    waiting for them: a silent torch.compile that no CPU reading can judge, named only from the first start's phase
    times (issue 40's start history: the trace's own earlier start, as a vtop that watched it live kept it);
    SIGCONT, the start completes."""
    assert ctx.sampler is not None
    ctx.sampler.skip_procs = True
    ctx.start(log_requests=True)
    ctx.sleep(10)
    _clean_stop(ctx, "api_server (the second start follows)")
    ctx.sleep(3)
    ctx.launch(log_requests=True)
    if not ctx.wait_log(r"Warming up model for the compilation", 300):
        ctx.notes.append("never saw the compile phase")
        return
    eng = ctx.srv.engine_pid(timeout=10)
    assert eng, "no EngineCore"
    _stop_tree(ctx, eng, "EngineCore tree")
    time.sleep(0.5)  # what was written before the stop reaches the log file
    size = ctx.sampler.log.size()
    ctx.event("log_size_at_sigstop", size=size)
    ctx.sleep(ctx.seconds)
    ctx.cont_procs()
    ctx.wait_ready(300)
    ctx.sleep(20)


@scenario("normal-start-load-nolog", "normal", 150)
def normal_start_load_nolog(ctx: Ctx) -> None:
    """No log for vtop (log_for_vtop false); a normal start (fresh compile cache: the silent torch.compile
    runs, its CPU moving) then ~150 s of load: 3 streaming chat requests with max_tokens 300 (each replaced
    when done) beside short requests (max_tokens 16-64) every few seconds; normal."""
    ctx.truth_extra["log_for_vtop"] = False
    ctx.start(log_requests=False, fresh_cache=True)
    pool = StreamPool(ctx, n=3, max_tokens=300, max_total=400, time_limit=ctx.seconds).start()
    short = ShortTraffic(ctx, time_limit=ctx.seconds).start()
    ctx.sleep(ctx.seconds)
    pool.stop()
    short.stop()
    ctx.sleep(10)


_WORDS = ("river stone cloud lantern harbor meadow signal copper violet engine garden winter market "
          "forest candle mirror thunder silver window ladder orchard").split()


@scenario("normal-long-prompts", "normal", 150)
def normal_long_prompts(ctx: Ctx) -> None:
    """--max-model-len 8192; ~150 s of long prompts (about 1,000-6,000 tokens, random words) with short outputs
    (max_tokens 8-32), chat and completions, streaming and not, 1-3 at a time: prefill-heavy; normal."""
    ctx.start(max_model_len=8192, log_requests=True)
    probe = " ".join(_WORDS * 10)
    try:
        n = int(ctx.srv.post("/tokenize", json={"model": ctx.srv.model, "prompt": probe}).json()["count"])
        per_word = n / (len(_WORDS) * 10)
    except Exception:  # noqa: BLE001 - a guess then
        per_word = 2.0
    ctx.event("prompt_calibration", tokens_per_word=round(per_word, 2))

    def prompt(i: int, rng: random.Random) -> str:
        words = int(rng.randint(1000, 6000) / max(per_word, 0.5))
        return " ".join(rng.choice(_WORDS) for _ in range(words))

    ctx.sleep(5)
    mix = MixedTraffic(ctx, concurrency=(1, 3), max_tokens=(8, 32), step=25, time_limit=ctx.seconds, seed=5,
                       prompt=prompt, kind="long_prompts").start()
    ctx.sleep(ctx.seconds)
    mix.stop()
    ctx.sleep(15)


@scenario("kv-saturation-few-long-seqs", "kv_saturation", 120)
def kv_saturation_few_long_seqs(ctx: Ctx) -> None:
    """--kv-cache-memory-bytes 8 MiB (4,096 tokens: 2 sequences of 2,048) and 6 concurrent streaming requests with
    max_tokens 1900: few running, each preemption drops a long sequence and recomputes it later; KV usage near
    100 % with a waiting queue for ~120 s; then the clients hang up."""
    _kv_saturation(ctx, kv_mib=8, streams=6, max_tokens=1900)


# --- truth ------------------------------------------------------------------------------


ERROR_RE = re.compile(rb"(?:\) |^)(?:ERROR|CRITICAL) \d\d-\d\d |^Traceback \(most recent call last\)|"
                      rb"^\w+(?:\.\w+)*(?:Error|Exception): ", re.M)


def error_line(log: bytes, m: re.Match[bytes] | None) -> str | None:
    """The whole log line the error match is on."""
    if m is None:
        return None
    a = log.rfind(b"\n", 0, m.start()) + 1
    b = log.find(b"\n", m.start())
    return log[a:b if b >= 0 else len(log)].decode(errors="replace").rstrip("\r")[:400]


def log_time_of(offset_end: int, index: list[dict[str, Any]]) -> float | None:
    """Wall time of the first log-index sample whose size covers ``offset_end``."""
    for r in index:
        if r["size"] >= offset_end:
            return float(r["t"])
    return None


def build_truth(ctx: Ctx, index: list[dict[str, Any]], log: bytes, version: str | None) -> dict[str, Any]:
    cls = ctx.sc.cls
    began = detectable = by = ended = None
    phase: str | None = "ready"
    ev = ctx.first
    if cls == "runaway":
        b, e = ev("runaway_begin"), ev("client_hangup")
        began = b and b["t"]
        ended = e and e["t"]
    elif cls == "engine_stall":
        b, e = ev("sigstop"), ev("sigcont")
        began, ended = b and b["t"], e and e["t"]
    elif cls == "engine_death":
        b = ev("kill")
        began = b and b["t"]
        phase = None
    elif cls == "kv_saturation":
        b, e = ev("kv_full"), ev("kv_released")
        began, ended = b and b["t"], e and e["t"]
    elif cls == "startup_stall" and ctx.truth_extra.get("log_for_vtop") is False:
        # no log for vtop: the incident it can see begins with the stop (the processes go still)
        st, e = ev("sigstop"), ev("sigcont")
        began, ended = st and st["t"], e and e["t"]
    elif cls == "startup_stall":
        s, e = ev("log_size_at_sigstop"), ev("sigcont")
        if s is not None:
            began = log_time_of(int(s["size"]), index)
            st = ev("sigstop")
            if began is None and st is not None:
                began = st["t"]
        ended = e and e["t"]
    elif cls == "startup_failure":
        m = ERROR_RE.search(log)
        if m is not None:
            nl = log.find(b"\n", m.start())
            began = log_time_of(nl + 1 if nl >= 0 else len(log), index)
        ex = ev("server_exit")
        ended = None
        phase = "failed"
        ctx.truth_extra["error_line"] = error_line(log, m)
        ctx.truth_extra["server_exit"] = ex and ex["t"]
    elif cls == "restart":
        b, e = ev("sigterm"), ctx.last("ready")
        began, ended = b and b["t"], e and e["t"]
    elif cls == "clean_shutdown":
        b, e = ev("sigterm"), ev("server_exit")
        began, ended = b and b["t"], e and e["t"]
        phase = "stopped"
    elif cls == "normal":
        r = ev("ready")
        began = None
        ended = None
        _ = r
    if began is not None and cls in BUDGET:
        by = round(began + BUDGET[cls], 3)
        detectable = began
    first_launch = ev("launch")
    return {
        "name": ctx.out.name,
        "class": cls,
        "expect_rules": EXPECT[cls],
        "began": began,
        "detectable_from": detectable,
        "should_alert_by": by,
        "ended": ended,
        "expected_phase": phase,
        "server": {"url": ctx.srv.url, "flags": ctx.flags or [], "vllm": version,
                   "model": first_launch and first_launch.get("model"),
                   "env": first_launch and first_launch.get("env"),
                   "kv_cache_space_gib": first_launch and first_launch.get("kv_cache_space_gib")},
        "notes": " ".join(" ".join([ctx.sc.doc, *ctx.notes]).split()),
        **ctx.truth_extra,
    }


KEY_LINES = [
    ("request logged", rb"Received request (\S+)[^\n]*?max_tokens=(\d+|None)"),
    ("aborted", rb"Aborted request[^\n]*"),
    ("stats", rb"Engine 000: Avg prompt throughput[^\n]*"),
    ("preemptions", rb"Preemptions: \d+"),
    ("shm wait", rb"No available shared memory broadcast block[^\n]*"),
    ("error", rb"(?:ERROR|CRITICAL) \d\d-\d\d[^\n]*"),
    ("EngineDeadError", rb"EngineDeadError[^\n]*"),
    ("died", rb"died unexpectedly[^\n]*"),
    ("shutdown", rb"\[shutdown\][^\n]*"),
    ("ValueError", rb"ValueError: [^\n]*"),
    ("validation", rb"Value error, [^\n]*"),
    ("traceback", rb"Traceback \(most recent call last\)"),
    ("ready", rb"Application startup complete"),
]


def key_lines(log: bytes) -> list[str]:
    out = []
    for label, rx in KEY_LINES:
        ms = list(re.finditer(rx, log))
        if ms and label == "request logged":
            mts = sorted({m.group(2).decode() for m in ms}, key=lambda x: (x == "None", int(x) if x.isdigit() else 0))
            out.append(f"request logged x{len(ms)}: `Received request ... max_tokens=` {', '.join(mts[-4:])} "
                       f"(largest {len(mts[-4:])} of {len(mts)} values)")
        elif ms:
            txt = ms[0].group(0).decode(errors="replace").strip()
            txt = re.sub(r"\s+", " ", txt)[:140]
            out.append(f"{label} x{len(ms)}: `{txt}`")
    return out


def _human(n: int) -> str:
    return f"{n / 1024:.0f} KB" if n < 2**20 else f"{n / 2**20:.2f} MB"


def write_index(trace: Path) -> None:
    """Write (or rewrite) the trace's line in traces/INDEX.md, from its files."""
    truth = json.loads((trace / "truth.json").read_text())
    events = [json.loads(x) for x in (trace / "events.jsonl").read_text().splitlines() if x.strip()]
    with gzip.open(trace / "log.bin.gz", "rb") as f:
        log = f.read()
    name, cls = trace.name, str(truth["class"])
    doc = SCENARIOS[name].doc if name in SCENARIOS else str(truth.get("notes", ""))
    doc = " ".join(doc.split())
    ready = [e for e in events if e["what"] == "ready"]
    if ready:
        doc += " Ready after " + ", ".join(f"{e['healthy_after_s']:.0f} s" for e in ready) + "."
    size = sum(p.stat().st_size for p in trace.iterdir())
    TRACES.mkdir(parents=True, exist_ok=True)
    head = ("# The traces\n\nOne line per trace (written by `tools/corpus/record.py`): name, class, duration "
            "(launch to end), what was done, key log lines seen, size on disk.\n\n"
            "| name | class | duration | what | key log lines | size |\n| --- | --- | --- | --- | --- | --- |\n")
    lines = INDEX.read_text().splitlines() if INDEX.exists() else head.rstrip("\n").splitlines()
    row = (f"| {name} | {cls} | {float(truth.get('duration_s') or 0):.0f} s | {doc.replace('|', '/')} | "
           f"{'; '.join(k.replace('|', '/') for k in key_lines(log))} | {_human(size)} |")
    lines = [ln for ln in lines if not ln.startswith(f"| {name} |")]
    # the first table's rows, sorted with this one; what follows it (the derived traces' section) as it was
    first = next(i for i, ln in enumerate(lines) if ln.startswith("| --- |")) + 1
    end = first
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    lines[first:end] = sorted([*lines[first:end], row])
    INDEX.write_text("\n".join(lines) + "\n")


# --- main ---------------------------------------------------------------------------------


def wait_for_others(limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    said = 0.0
    while True:
        others = other_servers(set())
        if not others:
            return
        if time.monotonic() >= deadline:
            raise SystemExit(f"another vllm serve still runs after {limit_s:.0f} s: {[r['pid'] for r in others]}")
        if time.monotonic() - said > 30:
            said = time.monotonic()
            print(f"[wait] another vllm serve runs ({[r['pid'] for r in others]}); waiting", flush=True)
        time.sleep(1)  # another helper's servers may follow each other closely: catch the gap


def record(sc: Scenario, out: Path, seconds: float, wait_other: float) -> int:
    wait_for_others(wait_other)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = WORK / out.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ctx = Ctx(sc, out, seconds, work)
    atexit.register(ctx.srv._emergency_stop)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    sampler = Sampler(out, ctx.srv)
    ctx.sampler = sampler
    t0 = time.monotonic()
    rc = 0
    sampler.start()
    try:
        try:
            sc.fn(ctx)
        except (ServerFailed, AssertionError) as e:
            ctx.notes.append(f"scenario error: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            ctx.event("scenario_error", error=str(e)[:2000])
            rc = 1
        ctx.event("end")
    finally:
        ctx.close()
        sampler.stop()
        version = None
        with contextlib.suppress(Exception):
            for line in gzip.open(out / "info.jsonl.gz", "rt"):
                version = json.loads(line).get("version") or version
        ctx.srv.stop()
        atexit.unregister(ctx.srv._emergency_stop)
    if sampler.skip_conns:
        (out / "conns.jsonl.gz").unlink(missing_ok=True)
    if sampler.skip_procs:
        (out / "procs.jsonl.gz").unlink(missing_ok=True)
    size_limit = sampler.last_index[2] if sampler.last_index else 0
    log = sampler.log.data(size_limit)
    with gzip.open(out / "log.bin.gz", "wb", compresslevel=9) as f:
        f.write(log)
    index = [json.loads(x) for x in gzip.open(out / "log-index.jsonl.gz", "rt") if x.strip()]
    ours = {e.get("pid") for e in ctx.events if e["what"] == "launch"}
    others: set[int] = set()
    with contextlib.suppress(Exception):
        for x in gzip.open(out / "procs.jsonl.gz", "rt"):
            others |= {r["pid"] for r in json.loads(x)["procs"] if is_vllm_server(r) and r["pid"] not in ours}
    if others:
        ctx.notes.append(f"Another vLLM server (pid {sorted(others)}) ran on the box during the recording.")
    truth = build_truth(ctx, index, log, version)
    duration = time.monotonic() - t0
    truth["duration_s"] = round(duration, 1)
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir())
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    keys = key_lines(log)
    print(json.dumps({"trace": str(out), "duration_s": round(duration, 1), "size": total, "files": sizes,
                      "metrics_rows": sampler.counts, "truth": {k: truth[k] for k in
                                                                ("class", "began", "should_alert_by", "ended")},
                      "key_lines": keys}, indent=2))
    if out.resolve().parent == TRACES.resolve():
        write_index(out)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.corpus.record", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", choices=sorted(SCENARIOS))
    ap.add_argument("--out", type=Path, help="the trace folder (default tests/corpus/traces/SCENARIO)")
    ap.add_argument("--seconds", type=float, help="length of the scenario's main phase (default per scenario)")
    ap.add_argument("--wait-other", type=float, default=1800.0,
                    help="seconds to wait for another vllm serve on the box to go away (default 1800)")
    ap.add_argument("--list", action="store_true", help="list the scenarios")
    ap.add_argument("--refilter", type=Path, nargs="+", metavar="TRACE",
                    help="filter these traces' /metrics bodies again (and rewrite their INDEX.md lines)")
    ap.add_argument("--reindex", type=Path, nargs="+", metavar="TRACE", help="rewrite these traces' INDEX.md lines")
    a = ap.parse_args(argv)
    if a.refilter:
        for t in a.refilter:
            refilter(t)
            write_index(t)
        return 0
    if a.reindex:
        for t in a.reindex:
            write_index(t)
        return 0
    if a.list or not a.scenario:
        for s in SCENARIOS.values():
            print(f"{s.name:<38} {s.cls:<16} {s.seconds:>4.0f} s  {s.doc.splitlines()[0]}")
        return 0
    sc = SCENARIOS[a.scenario]
    seconds = a.seconds if a.seconds is not None else sc.seconds
    if not 1 <= seconds <= 600:
        ap.error("--seconds must be in 1..600")
    return record(sc, a.out or TRACES / sc.name, seconds, a.wait_other)


if __name__ == "__main__":
    sys.exit(main())
