"""Where the wall time of ``vtop --once --json`` goes, phase by phase, without a profiler.

    python bench/once_timeline.py                       # 8 runs on this box's GPUs (NVML), median per step
    python bench/once_timeline.py --runs 8 -- --simulate-gpus 1 http://127.0.0.1:9   # vtop's own flags after --
    python bench/once_timeline.py --code /tmp/old       # another vtop (DIR/vtop first on PYTHONPATH)

Why not ``python -m cProfile``: from Python 3.12 on, cProfile is driven by ``sys.monitoring``, which reports
every thread's calls into the one profile: the poll threads' frames land under whatever the main thread
was in, and their times with them (on the lent H100, 2026-12-05, it put 0.316 s "in" ``nvmlShutdown``
while the process used as much CPU as wall time, which a wait on a lock cannot do; on the dev VM with
Python 3.12, the same artefact put 0.15 s in ``asyncio.Runner.close``, which took 4 ms). This script
instead wraps a few of vtop's own functions with ``time.monotonic()`` stamps (the system-wide clock, so
the spawn and the exit, seen by this process, line up with them):

* ``imports``: spawn to ``vtop.cli`` imported, then the headless path (``vtop.faces.headless``, the monitor,
  the NVML source) imported;
* ``main``/``run_once``/``round``: the command line and config, then the one round (``one_round``) from
  its start: each source's first answer (the GPU poll, the process scan, the log, each server's scrape)
  and each diagnosis (the first one imports the rules);
* ``close``: the feed's ``aclose`` (NVML's ``close``: its ``nvmlShutdown``), asyncio's ``Runner.close``;
* ``report``, ``main returned``, ``exit`` (the interpreter's shutdown, to the parent's ``wait``);
* the CPU time of the process and of each poll thread.

The wrapping is in the child only (``python -c``): the ``vtop`` run is the real CLI, ``--once --json`` plus
the flags given after ``--``. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r'''
import json, os, sys, threading, time
MARKS = []
CPU = {}
POLL = {}
def mark(what):
    MARKS.append((time.monotonic(), what))
mark("python started")
import vtop.cli
mark("vtop.cli imported")
import vtop.faces.headless as h, vtop.monitor.monitor as mm, vtop.monitor.live as live
import vtop.monitor.polling as pl, vtop.sources.nvml as nv, asyncio.runners as ar
mark("headless path imported")

def wrap(owner, name, label, once=False):
    f = getattr(owner, name, None)
    if f is None:  # an older vtop without it
        return
    seen = []
    def w(*a, **k):
        first = not seen
        seen.append(1)
        if first or not once:
            mark("> " + label)
        try:
            return f(*a, **k)
        finally:
            if first or not once:
                mark("< " + label)
    setattr(owner, name, w)

wrap(h, "run_once", "run_once")
wrap(mm.Monitor, "diagnose", "diagnose")
wrap(live.LiveFeed, "aclose", "feed.aclose")
wrap(nv.NvmlSource, "close", "NVML close")
wrap(nv.NvmlSource, "poll", "NVML poll")
wrap(ar.Runner, "close", "asyncio Runner.close")
wrap(h, "report", "report")
wrap(h, "format_text", "format")
_apply_server = mm.Monitor.apply_server
def apply_server(self, url, poll):
    mark("scrape answered " + url)
    return _apply_server(self, url, poll)
mm.Monitor.apply_server = apply_server
_one_round = getattr(h, "one_round", None)
async def one_round(monitor, feed):
    mark("> one round")
    try:
        return await _one_round(monitor, feed)
    finally:
        mark("< one round")
if _one_round is not None:
    h.one_round = one_round
_deliver = pl.PollLoop._deliver
def deliver(self, result, error, duration):
    if self.polls == 0:
        mark(f"first answer: {self.name}")
        POLL[self.name] = duration
    return _deliver(self, result, error, duration)
pl.PollLoop._deliver = deliver
_run = pl.PollLoop._run
def run(self):
    try:
        _run(self)
    finally:
        CPU[self.name] = time.thread_time()
pl.PollLoop._run = run

sys.argv = ["vtop"] + json.loads(os.environ["ONCE_TIMELINE_ARGS"])
rc = 0
try:
    mark("> main")
    rc = vtop.cli.main()
finally:
    mark("< main")
    CPU["main thread"] = time.thread_time()
    CPU["process"] = time.process_time()
    with open(os.environ["ONCE_TIMELINE_OUT"], "w") as f:
        json.dump({"marks": MARKS, "cpu": CPU, "poll": POLL, "rc": rc}, f)
sys.exit(rc)
'''


def one_run(code: str | None, args: list[str], out: Path) -> tuple[list[tuple[float, str]], dict[str, float], int]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if code:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(code).resolve()), os.environ.get("PYTHONPATH")) if p)
    env["ONCE_TIMELINE_ARGS"] = json.dumps(["--once", "--json", *args])
    env["ONCE_TIMELINE_OUT"] = str(out)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                         cwd="/tmp")
    _, err = p.communicate()
    t1 = time.monotonic()
    if not out.exists():
        raise SystemExit(f"the child wrote nothing: {err.decode(errors='replace')[-800:]}")
    got = json.loads(out.read_text())
    out.unlink()
    marks = [(0.0, "spawn")] + [(t - t0, w) for t, w in got["marks"]] + [(t1 - t0, "exit (the parent's wait)")]
    cpu = dict(got["cpu"]) | {f"{k}'s first poll (wall)": v for k, v in got["poll"].items()}
    return marks, cpu, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--code", help="a folder holding the vtop package to run (default: the one this Python imports)")
    ap.add_argument("--out", help="also write every run's marks as JSON")
    ap.add_argument("vtop_args", nargs="*", help="vtop's flags after -- (default: none: this box's GPUs, its servers)")
    a = ap.parse_args()
    out = Path(f"/tmp/once-timeline-{os.getpid()}.json")
    one_run(a.code, a.vtop_args, out)  # not counted: writes the bytecode caches
    runs = [one_run(a.code, a.vtop_args, out) for _ in range(a.runs)]
    # the same step's time in each run, by its label and its occurrence (the second diagnosis...)
    steps: dict[tuple[str, int], list[float]] = {}
    order: list[tuple[str, int]] = []
    for marks, _cpu, _rc in runs:
        seen: dict[str, int] = {}
        for t, w in marks:
            k = (w, seen.get(w, 0))
            seen[w] = k[1] + 1
            if k not in steps:
                order.append(k)
            steps.setdefault(k, []).append(t)
    print(f"# vtop --once --json {' '.join(a.vtop_args)}: {a.runs} runs, median ms since spawn (min-max); "
          f"exit {sorted({rc for *_, rc in runs})}")
    for k in sorted(order, key=lambda k: statistics.median(steps[k])):
        ts = steps[k]
        label = k[0] + (f" #{k[1] + 1}" if k[1] else "")
        print(f"{statistics.median(ts) * 1000:8.1f}  ({min(ts) * 1000:.0f}-{max(ts) * 1000:.0f})  {label}"
              + ("" if len(ts) == len(runs) else f"  [{len(ts)} of {len(runs)} runs]"))
    cpu_keys = sorted({k for _, cpu, _ in runs for k in cpu})
    print("CPU ms (and the first polls' wall ms), median: " + ", ".join(
        f"{k} {statistics.median([cpu[k] for _, cpu, _ in runs if k in cpu]) * 1000:.1f}" for k in cpu_keys))
    if a.out:
        Path(a.out).write_text(json.dumps([{"marks": m, "cpu": c, "rc": rc} for m, c, rc in runs], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
