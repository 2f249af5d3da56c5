"""``vtop replay FILE --csv [OUT]``: a recording's GPU and server samples as CSV.

One row per recorded sample, oldest first: a GPU poll gives one row per GPU
(``kind`` gpu, ``id`` its index), a server poll one row (``kind`` server, ``id``
its URL). The columns a row has no value for are empty, never 0 (a GPU row has
no queue; a failed scrape has no numbers). The header names each column with
its unit, so a spreadsheet reads it as is: filter ``kind`` and plot
``memory_used_mib`` against ``timestamp`` to tell a transient spike from a
steady climb, as ``nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu
--format=csv -l 1`` would have.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

MIB = 2**20
COLUMNS = (
    "timestamp", "epoch_s", "kind", "id",
    "utilization_gpu_pct", "sm_active_pct", "memory_used_mib", "memory_total_mib", "memory_used_pct",
    "power_w", "temperature_c", "sm_clock_mhz",
    "running", "waiting", "kv_cache_pct", "prompt_tokens_total", "generation_tokens_total",
    "preemptions_total", "scrape_ok",
)


def _num(v: float | int | None, scale: float = 1.0, digits: int = 2) -> str:
    if v is None:
        return ""
    x = v / scale
    return str(int(x)) if float(x).is_integer() else f"{x:.{digits}f}"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def rows(events: Iterable[Any]) -> Iterator[dict[str, str]]:
    """The CSV rows of a recording's events (:func:`vtop.sources.recording.record.load`)."""
    for e in events:
        if e.kind == "gpu":
            for g in e.data.gpus:
                pct = (100.0 * g.mem_used / g.mem_total) if g.mem_used is not None and g.mem_total else None
                yield {
                    "timestamp": _stamp(e.t), "epoch_s": f"{e.t:.3f}", "kind": "gpu", "id": str(g.index),
                    "utilization_gpu_pct": _num(g.util_gpu), "sm_active_pct": _num(g.sm_active),
                    "memory_used_mib": _num(g.mem_used, MIB, 0), "memory_total_mib": _num(g.mem_total, MIB, 0),
                    "memory_used_pct": _num(pct), "power_w": _num(g.power_w), "temperature_c": _num(g.temp_c),
                    "sm_clock_mhz": _num(g.sm_clock_mhz),
                }
        elif e.kind == "server":
            p = e.data
            m = p.metrics
            row = {"timestamp": _stamp(e.t), "epoch_s": f"{e.t:.3f}", "kind": "server", "id": p.url,
                   "scrape_ok": "1" if p.ok else "0"}
            if m is not None:
                kv = m.kv_cache_usage
                row.update(running=_num(m.running), waiting=_num(m.waiting),
                           kv_cache_pct=_num(None if kv is None else 100.0 * kv),
                           prompt_tokens_total=_num(m.prompt_tokens_total),
                           generation_tokens_total=_num(m.generation_tokens_total),
                           preemptions_total=_num(m.preemptions_total))
            yield row


def write_csv(path: str, out: IO[str]) -> int:
    """Write ``path``'s samples to ``out``; the number of rows. Raises ``ValueError``/``OSError``."""
    from vtop.sources.recording.record import load
    from vtop.sources.recording.trace import is_trace, load_trace

    _header, events = load_trace(path) if is_trace(path) else load(path)
    if not events:
        raise ValueError("the recording holds no samples")
    w = csv.DictWriter(out, fieldnames=COLUMNS, restval="", lineterminator="\n")
    w.writeheader()
    n = 0
    for row in rows(events):
        w.writerow(row)
        n += 1
    return n
