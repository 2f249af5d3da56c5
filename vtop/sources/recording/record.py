"""Recording samples as JSONL, and reading them back.

One JSON object a line, ``kind`` saying what it is. The first line is a
header ``{"kind": "header", "schema": "vtop-record", "version": 2, ...}``
(with what was recorded, where and by what); then, in the order they
happened, on the recording box's clocks (``t`` wall, ``mono`` monotonic):

* ``gpu``: one :class:`~vtop.model.gpu.GpuPoll` (fields that are ``None``
  left out), with ``names``: pid -> process name for the GPU processes.
* ``server``: one :class:`~vtop.sources.vllm.ServerPoll` without its
  metrics, plus ``m``: the parsed metrics as numbers, only the fields that
  changed since this server's previous record, and ``mk: 1`` on a full
  record (the first, then one a minute, so a reader can start anywhere).
* ``procs``: the vLLM server processes found (argv with secrets masked),
  written when the set changes.
* ``conns``: the kernel's counters of the connections to the local servers' ports
  (:mod:`vtop.sources.sockets`), written while there are any (and once when they went).
* ``log``: lines read from the vLLM log in one poll (prompts redacted unless
  asked otherwise), and ``logmark``: ``ready`` / ``launch`` events handed to
  the phase tracker from elsewhere.
* ``alerts``: the diagnosis when it changes (for people reading the file; a
  replay works them out again from the samples).
* ``mark``: a label for what was going on (benchmarks, tests); ``note``: a
  sample that could not be encoded (the recording goes on).

Readers skip kinds they do not know, and damaged lines (a crash mid-line).
Version 1 files (``gpu`` and ``mark`` only) read the same.

Writes never happen on the caller's thread: calls put a dict on a queue and
one daemon writer thread encodes, writes and flushes it (once a second), so
the UI thread never waits on a disk. The file stops growing at ``max_bytes``
(default 200 MB) with a one-line reason on screen; nothing before is lost.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import queue
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from vtop import __version__
from vtop.model.gpu import GpuPoll

SCHEMA = "vtop-record"
VERSION = 2
KEYFRAME_EVERY = 60


def _open(path: Path, mode: str) -> IO[str]:
    if "a" in mode or "w" in mode:
        # A recording holds log lines and server details: 0600 whatever the umask, as the
        # snapshot bundle's files are. The file is made (or narrowed) before a byte is written.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def _compact_gpu(poll: GpuPoll) -> dict[str, Any]:
    d = _nan_to_none(poll.to_json())
    # ``lost`` False is the default; a fault flag's False (remap_pending) is a reading, kept
    d["gpus"] = [{k: v for k, v in g.items() if v is not None and (v is not False or k != "lost")} for g in d["gpus"]]
    for k in ("message", "duration_s", "driver", "nvml_version"):
        if d.get(k) is None:
            d.pop(k, None)
    if not d.get("notes"):
        d.pop("notes", None)
    return d


class Recorder:
    """Appends samples to a JSONL file (``.gz`` for gzip); stops at ``max_bytes``.

    Thread-safe; every method returns at once (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 200 * 2**20,
                 meta: dict[str, Any] | None = None, redact_prompts: bool = True) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.redact_prompts = redact_prompts
        self.stopped_reason: str | None = None
        self.records = 0
        self._lock = threading.Lock()
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._f = _open(self.path, "a")
        self._written = self.path.stat().st_size if self.path.exists() else 0
        self._q: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._last_m: dict[str, dict[str, Any]] = {}
        self._since_key: dict[str, int] = {}
        self._last_procs: Any = None
        self._had_conns = False
        self._closed = False
        self._thread = threading.Thread(target=self._writer, name="vtop-recorder", daemon=True)
        self._thread.start()
        if new:
            header = {
                "kind": "header",
                "schema": SCHEMA,
                "version": VERSION,
                "vtop": __version__,
                "host": socket.gethostname(),
                "platform": platform.platform(),
                "started_t": time.time(),
            }
            header.update(meta or {})
            self._put(header)

    # -- the writer thread --
    def _put(self, obj: Any) -> None:
        """A record, or a function that makes one (or None) on the writer thread."""
        if not self._closed:
            self._q.put(obj)

    def _writer(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                obj = self._q.get(timeout=1.0)
            except queue.Empty:
                obj = {}
            if obj is None:
                break
            if callable(obj):
                # encoding (metrics to JSON, the change against the last record) happens
                # here, never on the caller's thread (the UI thread, for server polls)
                try:
                    obj = obj() or {}
                except Exception as e:  # noqa: BLE001 - a bad sample must not end the recording
                    obj = {"kind": "note", "message": f"a sample could not be recorded: {type(e).__name__}: {e}"}
            ev = obj.get("__flush__") if obj else None
            if obj and ev is None:
                self._write(obj)
            if ev is not None or time.monotonic() - last_flush >= 1.0:
                last_flush = time.monotonic()
                with self._lock:
                    try:
                        self._f.flush()
                    except (OSError, ValueError) as e:
                        self.stopped_reason = self.stopped_reason or f"recording stopped: {e}"
                if ev is not None:
                    ev.set()
        with self._lock:
            try:
                self._f.close()
            except OSError:
                pass

    def _write(self, obj: dict[str, Any]) -> None:
        with self._lock:
            if self.stopped_reason:
                return
            try:
                line = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str) + "\n"
            except ValueError:
                line = json.dumps(_nan_to_none(obj), separators=(",", ":"), default=str) + "\n"
            if self._written + len(line) > self.max_bytes:
                self.stopped_reason = f"recording stopped at its size limit ({self.max_bytes / 2**20:.0f} MB)"
                self._f.flush()
                return
            try:
                self._f.write(line)
            except (OSError, ValueError) as e:
                self.stopped_reason = f"recording stopped: {e}"
                return
            self._written += len(line)
            self.records += 1

    # -- what can be recorded --
    def gpu(self, poll: GpuPoll, names: dict[int, str] | None = None) -> None:
        """Encoded on the writer thread, as a server poll is: the caller is the UI thread."""
        names = dict(names) if names else None
        self._put(lambda: self._encode_gpu(poll, names))

    @staticmethod
    def _encode_gpu(poll: GpuPoll, names: dict[int, str] | None) -> dict[str, Any]:
        d = {"kind": "gpu", **_compact_gpu(poll)}
        if names:
            d["names"] = {str(k): v for k, v in names.items()}
        return d

    def server(self, poll: Any, fed: float | None = None) -> None:
        """A :class:`~vtop.sources.vllm.ServerPoll`; metrics as changes (see module doc).
        ``fed``: the monotonic time the poll was handed to the tracker (its rates are
        worked out then), so a replay computes them at the same instant."""
        self._put(lambda: self._encode_server(poll, fed))

    def _encode_server(self, poll: Any, fed: float | None) -> dict[str, Any]:
        """On the writer thread (the only one that touches ``_last_m``)."""
        from vtop.sources.codec import metrics_to_json, poll_to_json

        d: dict[str, Any] = {"kind": "server", **poll_to_json(poll, metrics=False)}
        if fed is not None:
            d["fed"] = round(fed, 6)
        if poll.metrics is not None:
            m = metrics_to_json(poll.metrics)
            prev = self._last_m.get(poll.url)
            n = self._since_key.get(poll.url, KEYFRAME_EVERY)
            if prev is None or n >= KEYFRAME_EVERY:
                d["m"], d["mk"] = m, 1
                self._since_key[poll.url] = 1
            else:
                d["m"] = {k: v for k, v in m.items() if prev.get(k) != v}
                self._since_key[poll.url] = n + 1
            self._last_m[poll.url] = m
        return d

    def processes(self, t: float, mono: float, servers: Iterable[Any]) -> None:
        """The server processes found; written only when they changed."""
        servers = list(servers)
        self._put(lambda: self._encode_procs(t, mono, servers))

    def _encode_procs(self, t: float, mono: float, servers: list[Any]) -> dict[str, Any] | None:
        from vtop.sources.codec import process_to_json

        procs = [process_to_json(sp) for sp in servers]
        if procs == self._last_procs:
            return None
        self._last_procs = procs
        return {"kind": "procs", "t": t, "mono": mono, "servers": procs}

    def conns(self, read: Any) -> None:
        """One read of the local servers' connections; nothing while there are none."""
        self._put(lambda: self._encode_conns(read))

    def _encode_conns(self, read: Any) -> dict[str, Any] | None:
        from vtop.sources.sockets import conn_read_to_json

        had, self._had_conns = self._had_conns, bool(read.conns or read.error)
        if not had and not self._had_conns:
            return None
        return {"kind": "conns", **conn_read_to_json(read)}

    def log(self, t: float, mono: float, lines: list[str]) -> None:
        if not lines:
            return
        from vtop.model.redact import redact_prompts, scrub_secrets

        # secrets by pattern always (a log prints 'api_key': [...] whatever vtop knows); prompts unless asked
        lines = [scrub_secrets(redact_prompts(x) if self.redact_prompts else x) for x in lines]
        self._put({"kind": "log", "t": t, "mono": mono, "lines": lines})

    def logmark(self, what: str, **kw: Any) -> None:
        self._put({"kind": "logmark", "what": what, **kw})

    def alerts(self, t: float, mono: float, alerts: list[dict[str, Any]]) -> None:
        self._put({"kind": "alerts", "t": t, "mono": mono, "alerts": alerts})

    def mark(self, t: float, label: str, **extra: Any) -> None:
        self._put({"kind": "mark", "t": t, "label": label, **extra})

    @property
    def bytes_written(self) -> int:
        return self._written

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything put so far is on disk (tests, exit). False on timeout."""
        ev = threading.Event()
        self._q.put({"__flush__": ev})
        return ev.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout=5.0)


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def read(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every record of a file; a damaged line (e.g. cut by a crash) is skipped."""
    with _open(Path(path), "r") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def gpu_polls(path: str | os.PathLike[str]) -> list[GpuPoll]:
    return [GpuPoll.from_json(r) for r in read(path) if r.get("kind") == "gpu"]


class ReplayGpuSource:
    """Hands out recorded polls one per ``poll()``; after the last one, says the recording ended."""

    def __init__(self, polls: list[GpuPoll]) -> None:
        self._polls = polls
        self._i = 0

    def poll(self) -> GpuPoll:
        if self._i < len(self._polls):
            p = self._polls[self._i]
            self._i += 1
            return p
        last = self._polls[-1] if self._polls else None
        return GpuPoll(
            t=last.t if last else 0.0, mono=last.mono if last else 0.0, status="absent", message="end of recording"
        )

    def close(self) -> None:
        pass


def polls_from_sampler(path: str | os.PathLike[str]) -> list[GpuPoll]:
    """Read the 5 Hz NVML sampler format of the GPU-machine recordings
    (``nvml.jsonl``: a ``header`` line with static GPU facts, then one flat line
    per GPU per sample with ``util_gpu``, ``mem_used``, ``gpm_sm_active``...)
    into :class:`GpuPoll` objects, one per sample time."""
    from vtop.model.gpu import GpuProcess, GpuSample

    statics: dict[int, dict[str, Any]] = {}
    driver = nvml_version = None
    out: list[GpuPoll] = []
    cur_t: float | None = None
    cur: list[GpuSample] = []
    cur_mono = 0.0

    def flush() -> None:
        if cur_t is not None and cur:
            out.append(GpuPoll(t=cur_t, mono=cur_mono, status="ok", gpus=tuple(cur), driver=driver,
                               nvml_version=nvml_version))

    def num(d: dict[str, Any], k: str) -> float | None:
        v = d.get(k)
        if v is None or isinstance(v, bool):
            return None
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        return None if f != f else f

    for r in read(path):
        if r.get("type") == "header":
            driver, nvml_version = r.get("driver"), r.get("nvml")
            for g in r.get("gpus", []):
                statics[int(g["index"])] = g
            continue
        if "gpu" not in r or "t" not in r:
            continue
        t = float(r["t"])
        if t != cur_t:
            flush()
            cur_t, cur, cur_mono = t, [], float(r.get("mono", t))
        idx = int(r["gpu"])
        st = statics.get(idx, {})
        procs = r.get("procs")
        cur.append(
            GpuSample(
                index=idx,
                name=st.get("name", "GPU"),
                uuid=st.get("uuid"),
                util_gpu=num(r, "util_gpu"),
                util_mem=num(r, "util_mem"),
                mem_used=None if r.get("mem_used") is None else int(r["mem_used"]),
                mem_total=None if r.get("mem_total") is None else int(r["mem_total"]),
                power_w=num(r, "power_w"),
                power_limit_w=num(st, "power_limit_w"),
                temp_c=num(r, "temp_c"),
                sm_clock_mhz=num(r, "sm_clock"),
                mem_clock_mhz=num(r, "mem_clock"),
                procs=None if procs is None else tuple(GpuProcess(int(p[0]), int(p[1])) for p in procs),
                sm_active=num(r, "gpm_sm_active"),
                sm_occupancy=num(r, "gpm_sm_occupancy"),
                dram_bw=num(r, "gpm_dram_bw_util"),
            )
        )
    flush()
    return out


# --- reading a whole recording back, in order ----------------------------------


class RecordEvent:
    """One decoded record: ``kind`` and ``data`` (a GpuPoll, a ServerPoll, a
    list of ServerProcess, a list of log lines, a dict for the rest)."""

    __slots__ = ("kind", "t", "mono", "data", "extra", "at")

    def __init__(self, kind: str, t: float, mono: float, data: Any, extra: Any = None) -> None:
        self.kind, self.t, self.mono, self.data, self.extra = kind, t, mono, data, extra
        #: when it took effect (monotonic): a server poll when it was fed to its
        #: tracker, which is when the live screen worked out its rates
        self.at = extra if kind == "server" and isinstance(extra, float) else mono

    def __repr__(self) -> str:
        return f"RecordEvent({self.kind!r}, t={self.t:.3f})"


def decode(records: Iterable[dict[str, Any]]) -> Iterator[RecordEvent]:
    """Turn raw records into typed events, rebuilding each server's metrics
    from its keyframes and changes. A record that cannot be decoded is skipped
    (a recording is evidence: one bad line must not lose the rest)."""
    from vtop.sources.codec import metrics_from_json, poll_from_json, process_from_json

    full: dict[str, dict[str, Any]] = {}
    for r in records:
        kind = r.get("kind")
        try:
            if kind == "header":
                yield RecordEvent("header", float(r.get("started_t") or 0.0), 0.0, r)
            elif kind == "gpu":
                poll = GpuPoll.from_json(r)
                names = {int(k): str(v) for k, v in (r.get("names") or {}).items()}
                yield RecordEvent("gpu", poll.t, poll.mono, poll, names)
            elif kind == "server":
                url = str(r["url"])
                metrics = None
                m = r.get("m")
                if isinstance(m, dict):
                    if r.get("mk") or url not in full:
                        if not r.get("mk"):
                            continue  # changes without a keyframe before them: cannot rebuild
                        full[url] = dict(m)
                    else:
                        full[url] = {**full[url], **m}
                    metrics = metrics_from_json(full[url])
                spoll = poll_from_json(r, metrics)
                fed = r.get("fed")
                yield RecordEvent("server", spoll.t, spoll.mono, spoll, float(fed) if fed is not None else None)
            elif kind == "procs":
                procs = [process_from_json(p) for p in r.get("servers") or ()]
                yield RecordEvent("procs", float(r["t"]), float(r["mono"]), procs)
            elif kind == "conns":
                from vtop.sources.sockets import conn_read_from_json

                read = conn_read_from_json(r)
                yield RecordEvent("conns", read.t, read.mono, read)
            elif kind == "log":
                yield RecordEvent("log", float(r["t"]), float(r["mono"]), [str(x) for x in r.get("lines") or ()])
            elif kind in ("logmark", "alerts", "mark"):
                t = float(r.get("t") or 0.0)
                yield RecordEvent(kind, t, float(r.get("mono", t)), r)
        except (KeyError, TypeError, ValueError):
            continue


def load(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[RecordEvent]]:
    """The header and every event of a recording, sorted by monotonic time
    (sources write from different threads, so the file is nearly, not exactly, in order)."""
    header: dict[str, Any] = {}
    out: list[RecordEvent] = []
    for ev in decode(read(path)):
        if ev.kind == "header":
            if not header:
                header = ev.data
            continue
        out.append(ev)
    out.sort(key=lambda e: e.at)
    return header, out
