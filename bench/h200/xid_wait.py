"""vtop's NVML XID path on a real GPU box: it waits, it times out, and it costs nothing measurable.

    python bench/h200/xid_wait.py --out bench/h200/xid-wait-<date>.json     # on the H200 (stdlib + pynvml + vtop)

No XID is expected on a healthy box: what this shows is the path itself, as vtop runs it.

1. ``tick``: ``NvmlSource.poll()`` at 1 Hz for ``--polls`` (10) polls, as the NVML thread runs it: every poll
   drains the XID event set with ``nvmlEventSetWait`` (vtop's timeout, 0 ms). Per poll: the poll's wall and
   thread CPU time, the drain's wall time and number of waits, the events drained.
2. ``long waits``: ``--long-waits`` (5) drains with a ``--long-wait-ms`` (1000) timeout: each must block about
   that long (it waits), return no event and no error (it times out), and use next to no CPU (it sleeps in the
   driver, no busy loop): thread CPU time of each.
3. ``cost``: the same polls with the XID path off (``NvmlSource(xid=False)``) and on, alternated, ``--polls``
   each: median thread CPU time of a poll, the difference is what the XID path costs a tick.
4. Faults and PCIe: the first poll's ECC counts, remapped rows, retired pages (or None), the notes NVML gave
   (what is not supported), and one ``read_pcie()`` (TX and RX of every GPU: ~21 ms a call) timed; vtop reads
   it in a thread of its own every 30 s, never on the tick.

Prints the figures and writes them as JSON to ``--out``. ~30 s in all.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from vtop.sources.nvml import NvmlSource  # noqa: E402


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _proc_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--polls", type=int, default=10)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between polls (vtop's tick)")
    ap.add_argument("--long-waits", type=int, default=5)
    ap.add_argument("--long-wait-ms", type=int, default=1000)
    ap.add_argument("--simulate", type=int, default=0, metavar="N",
                    help="N simulated GPUs (vtop's fake NVML, one XID 79 injected on GPU 0): checks this script")
    a = ap.parse_args()
    fake = None
    if a.simulate:
        from vtop.sources.fake_nvml import FakeGpu, FakeNvml

        fake = FakeNvml([FakeGpu() for _ in range(a.simulate)])
        fake.inject_xid(0, 79)
    t_start = time.monotonic()
    cpu_start = _proc_cpu()
    out: dict[str, Any] = {"simulated_gpus": a.simulate, "host": platform.node(), "python": platform.python_version(),
                           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    src = NvmlSource(fake, pcie_every_s=None)
    t0 = time.perf_counter()
    first = src.poll()
    out["first_poll_ms"] = round(1000 * (time.perf_counter() - t0), 3)
    out["status"], out["message"], out["driver"] = first.status, first.message, first.driver
    out["notes"] = list(first.notes)
    out["gpus"] = len(first.gpus)
    out["xid_event_set"] = src._xid_set is not None
    out["xid_registered"] = [d.index for d in src._devices if d.xid_registered]
    out["faults"] = [
        {"gpu": g.index, "name": g.name, "ecc_corrected": g.ecc_corrected, "ecc_uncorrected": g.ecc_uncorrected,
         "rows_remapped": g.rows_remapped, "rows_remapped_corr": g.rows_remapped_corr,
         "remap_pending": g.remap_pending, "remap_failed": g.remap_failed, "retired_pages": g.retired_pages}
        for g in first.gpus
    ]
    print(f"{out['gpus']} GPU(s), driver {out['driver']}; XID event set: {out['xid_event_set']}, "
          f"registered GPUs {out['xid_registered']}; notes: {out['notes'] or 'none'}")
    if not out["xid_event_set"]:
        print("no XID event set: nothing more to measure")

    # 1. the tick path
    ticks = []
    events: list[dict[str, Any]] = [x.to_json() for x in first.xids]
    for _ in range(a.polls):
        time.sleep(a.gap)
        c0, w0 = time.thread_time(), time.perf_counter()
        p = src.poll()
        ticks.append({
            "poll_wall_ms": round(1000 * (time.perf_counter() - w0), 4),
            "poll_cpu_ms": round(1000 * (time.thread_time() - c0), 4),
            "xid_drain_wall_ms": None if src.xid_wait_s is None else round(1000 * src.xid_wait_s, 4),
            "xid_waits": src.xid_waits, "xids": len(p.xids),
        })
        events += [x.to_json() for x in p.xids]
    out["tick"] = {"timeout_ms": src.xid_wait_ms, "polls": ticks,
                   "median_xid_drain_wall_ms": _med([t["xid_drain_wall_ms"] for t in ticks
                                                     if t["xid_drain_wall_ms"] is not None]),
                   "median_poll_cpu_ms": _med([t["poll_cpu_ms"] for t in ticks])}
    print(f"tick: {a.polls} polls, XID drain median {out['tick']['median_xid_drain_wall_ms']} ms wall "
          f"(timeout {src.xid_wait_ms} ms), poll CPU median {out['tick']['median_poll_cpu_ms']} ms")

    # 2. long waits: it waits, then times out, without spinning
    longs = []
    for _ in range(a.long_waits if out["xid_event_set"] else 0):
        c0, w0 = time.thread_time(), time.perf_counter()
        got = src.drain_xids(time.monotonic(), time.time(), a.long_wait_ms)
        longs.append({"wall_ms": round(1000 * (time.perf_counter() - w0), 3),
                      "cpu_ms": round(1000 * (time.thread_time() - c0), 4), "xids": len(got),
                      "waits": src.xid_waits})
        events += [x.to_json() for x in got]
    out["long_waits"] = {"timeout_ms": a.long_wait_ms, "waits": longs,
                         "median_wall_ms": _med([w["wall_ms"] for w in longs]),
                         "median_cpu_ms": _med([w["cpu_ms"] for w in longs])}
    notes = list(src.poll().notes)
    out["notes_after"] = notes
    print(f"long waits: {len(longs)} x timeout {a.long_wait_ms} ms: wall median {out['long_waits']['median_wall_ms']} "
          f"ms, CPU median {out['long_waits']['median_cpu_ms']} ms; notes after: {notes or 'none'}")

    # 3. the XID path's cost a tick: off vs on, alternated
    off = NvmlSource(fake, pcie_every_s=None, xid=False)
    off.poll()
    off.poll()
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    for _ in range(a.polls):
        for s, xs in ((off, cpu_off), (src, cpu_on)):
            time.sleep(a.gap / 2)
            c0 = time.thread_time()
            s.poll()
            xs.append(1000 * (time.thread_time() - c0))
    m_on, m_off = _med(cpu_on), _med(cpu_off)
    out["cost"] = {"poll_cpu_ms_xid_on": [round(x, 4) for x in cpu_on],
                   "poll_cpu_ms_xid_off": [round(x, 4) for x in cpu_off],
                   "median_on_ms": m_on, "median_off_ms": m_off,
                   "median_diff_ms": None if m_on is None or m_off is None else round(m_on - m_off, 4)}
    print(f"cost: poll CPU median {m_on} ms with XID, {m_off} ms without: "
          f"{out['cost']['median_diff_ms']} ms a tick")
    off.close()

    # 4. PCIe, once (vtop: its own thread, every 30 s)
    w0, c0 = time.perf_counter(), time.thread_time()
    src.read_pcie()
    pcie_wall = time.perf_counter() - w0
    last = src.poll()
    out["pcie"] = {"read_all_wall_ms": round(1000 * pcie_wall, 2),
                   "read_all_cpu_ms": round(1000 * (time.thread_time() - c0), 3),
                   "calls": 2 * len(last.gpus),
                   "per_call_wall_ms": round(1000 * pcie_wall / max(1, 2 * len(last.gpus)), 2),
                   "kbs": [[g.index, g.pcie_tx_kbs, g.pcie_rx_kbs] for g in last.gpus]}
    print(f"PCIe: {out['pcie']['calls']} calls in {out['pcie']['read_all_wall_ms']} ms "
          f"({out['pcie']['per_call_wall_ms']} ms a call), CPU {out['pcie']['read_all_cpu_ms']} ms")
    src.close()
    out["xid_events"] = events
    out["elapsed_s"] = round(time.monotonic() - t_start, 2)
    out["process_cpu_s"] = round(_proc_cpu() - cpu_start, 4)
    out["pid"] = os.getpid()
    print(f"XID events seen: {len(events)}; process CPU {out['process_cpu_s']} s over {out['elapsed_s']} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
