"""Recording samples as JSONL, and reading them back.

One JSON object a line. The first line is a header ``{"kind": "header",
"schema": "vtop-record", "version": 1, ...}``; then ``{"kind": "gpu", ...}``
lines, each a :class:`~vtop.sources.gpu.GpuPoll` as JSON, and ``{"kind":
"mark", "label": ...}`` lines that say what was going on (e.g. the load phase
of a benchmark). Later kinds (server metrics, log events, alerts) are added
beside these; readers skip kinds they do not know.

The recorder is called from the polling thread, never from the UI thread.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import socket
import threading
from pathlib import Path
from typing import IO, Any, Iterator

from vtop import __version__
from vtop.sources.gpu import GpuPoll

SCHEMA = "vtop-record"
VERSION = 1


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


class Recorder:
    """Appends samples to a JSONL file (``.gz`` for gzip); stops at ``max_bytes``."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 200 * 2**20, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.stopped_reason: str | None = None
        self._lock = threading.Lock()
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._f = _open(self.path, "a")
        self._written = self.path.stat().st_size if self.path.exists() else 0
        if new:
            header = {
                "kind": "header",
                "schema": SCHEMA,
                "version": VERSION,
                "vtop": __version__,
                "host": socket.gethostname(),
                "platform": platform.platform(),
            }
            header.update(meta or {})
            self._write(header)

    def _write(self, obj: dict[str, Any]) -> None:
        with self._lock:
            if self.stopped_reason:
                return
            line = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str) + "\n"
            if self._written + len(line) > self.max_bytes:
                self.stopped_reason = f"recording stopped at its size limit ({self.max_bytes} bytes)"
                self._f.flush()
                return
            self._f.write(line)
            self._written += len(line)

    def gpu(self, poll: GpuPoll) -> None:
        self._write({"kind": "gpu", **_nan_to_none(poll.to_json())})

    def mark(self, t: float, label: str, **extra: Any) -> None:
        self._write({"kind": "mark", "t": t, "label": label, **extra})

    def flush(self) -> None:
        with self._lock:
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


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
    from vtop.sources.gpu import GpuProcess, GpuSample

    statics: dict[int, dict[str, Any]] = {}
    driver = nvml_version = None
    out: list[GpuPoll] = []
    cur_t: float | None = None
    cur: list[GpuSample] = []
    cur_mono = 0.0

    def flush() -> None:
        if cur_t is not None and cur:
            out.append(GpuPoll(t=cur_t, mono=cur_mono, status="ok", gpus=tuple(cur), driver=driver, nvml_version=nvml_version))

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
