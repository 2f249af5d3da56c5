"""``vtop doctor`` run DURING each incident of the corpus, in real time.

    python -m tests.corpus.live_doctor [TRACE ...] [--json] [--jobs 3] [--window 15] [--lead 2]

Issue 24 asks that "``doctor --window 15`` run during each live incident of the corpus
(real time) names it, with a non-zero exit for warning or worse". This checks exactly that:
each trace is served live by :mod:`tests.corpus.serve_trace` (its log written up to the start
at once, then growing second by second) and the real CLI runs against it as a subprocess::

    python -m vtop doctor --window 15 --json URL --log LOGFILE

* a trace with ``expect_rules`` (an incident): the play and the doctor start together at
  ``T0 = should_alert_by - window - lead`` (0 at least), so the doctor's report comes about when
  the truth says the incident should be named (the ``rep@`` column: the trace second it came;
  later than should_alert_by + 1 s fails as late: the doctor took 15-17 s for --window 15 on
  this box, hence a lead of 3 s).
  An incident with nothing to accumulate (``should_alert_by - began < lead + 1``: a startup
  failure, named at its first error line) starts 1 s before ``began`` instead (point
  ``first-line``): a window ending before that line could not contain it. It passes when an alert of an expected rule of
  warning or critical severity is in the report AND the exit status is non-zero.
* a normal / restart / clean-shutdown trace (no ``expect_rules``): the doctor runs at 2-3
  points: the busiest ``window`` seconds (most running + waiting; the middle of an idle
  trace), near the end (``END_MARGIN_S`` before it), and for a clean shutdown across the
  SIGTERM and just after it. It passes with no alert of warning or worse and exit 0
  -- except after a clean shutdown, where the port refuses: a down server may exit non-zero,
  but no incident may be named.

Runs ``--jobs`` plays at once (each is real time: ~window + 2 s); prints a table and a total
line, or ``--json``. Stand-in processes mirror the recorded process tree behind the port
(:mod:`tests.corpus.standin`: its titles, and whether each process's CPU time moved), so the
doctor reads a process table as on the recorded box; ``--no-procs`` plays without them (the
doctor then sees no vLLM process, and a silent startup stall has no CPU evidence). ``--no-log`` plays
every trace without its log (the stand-in API server writes to a pipe, the doctor gets no ``--log``:
vLLM's stdout under a supervisor); a trace whose truth says ``"log_for_vtop": false`` is always
played so, and its ``doctor_after_s`` seconds add doctor runs started that long after the incident
began (point ``after+N``). ``--doctor-arg`` adds flags to every doctor
run (e.g. ``--doctor-arg=--no-gpu``). Exit status: 0 when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.corpus.serve_trace import TraceServer, TraceTimeline

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRACES = HERE / "traces"
BAD = ("warning", "critical")
WINDOW_S = 15.0
#: the doctor starts this much before should_alert_by - window (its own start-up takes 1-3 s)
LEAD_S = 3.0
#: an incident's report counts as in time when the doctor exited by should_alert_by + this (the
#: trace's one-second rows; the exit comes after the report is written)
IN_TIME_SLACK_S = 1.0
JOBS = 3
#: a point "near the end" leaves this much of the trace after the window: on a busy box the
#: doctor took up to 7 s more than its window (seen: 22 s for --window 15, three at a time),
#: and a trace that ends under it reads as a server gone down
END_MARGIN_S = 12.0
#: a quiet point of a clean-shutdown trace ends this long before its SIGTERM at the latest
#: (the doctor takes 1-3 s more than its window; clean-sigterm-idle is ready only 20 s before it)
SHUTDOWN_MARGIN_S = 4.0

#: a normal trace without a log for vtop: a doctor also runs this long after the launch, during the start
START_POINT_S = 20.0
#: a trace with connections (conns.jsonl.gz): its play starts this long before the incident began
CONN_PREROLL_S = 2.0
#: ... or, for a normal trace, this long before the doctor (kept-alive and long requests keep their age)
CONN_LOOKBACK_S = 60.0

_RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)


@dataclass
class Job:
    trace: str
    path: str
    cls: str
    point: str  # "alert" | "busiest" | "end" | "shutdown" | "after-shutdown"
    start: float  # trace second the play and the doctor start at
    expect_rules: list[str]
    should_alert_by: float | None
    #: what passes: "named" (an incident), "quiet" (exit 0, no warning), "no-incident" (after a shutdown),
    #: "unnameable" (an incident a 15 s window cannot prove, its truth says why: no other warning)
    expect: str
    why: str | None = None
    #: played without its log (``--no-log``, or the truth's ``"log_for_vtop": false``): the stand-in
    #: API server writes to a pipe, the doctor gets no ``--log``
    no_log: bool = False


@dataclass
class Run:
    trace: str
    cls: str
    point: str
    start: float
    should_alert_by: float | None
    expect_rules: list[str]
    expect: str
    #: why a window cannot name this incident (truth.json's ``window_why``), for expect "unnameable"
    why: str | None = None
    exit_code: int | None = None
    named: bool = False
    rule: str | None = None
    severity: str | None = None
    alerts: list[dict[str, str]] = field(default_factory=list)
    others_bad: list[str] = field(default_factory=list)
    server_state: str | None = None
    #: the doctor's row for the server: state, model, running, waiting, kv_cache_pct
    server: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    #: the trace second when the doctor exited (compare with should_alert_by)
    ended_at: float | None = None
    #: the trace had played to its end (the port closed) before the doctor exited
    trace_ended: bool = False
    #: an "alert" point: the doctor exited by should_alert_by (+ IN_TIME_SLACK_S); None elsewhere
    in_time: bool | None = None
    ok: bool = False
    error: str | None = None

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _load(text: str | None) -> float:
    if not text:
        return 0.0
    return sum(float(m) for m in _RUNNING.findall(text)) + sum(float(m) for m in _WAITING.findall(text))


def busiest_start(tl: TraceTimeline, window: float) -> float | None:
    """The trace second starting the ``window`` with the most running + waiting (port open)."""
    offs = tl.metrics.offs
    loads = [(o, _load(r.get("text"))) for o, r in zip(offs, tl.metrics.rows) if r.get("status") == 200]
    best: tuple[float, float] | None = None
    for o, _ in loads:
        if o + window + 2 > tl.end:
            break
        s = sum(v for p, v in loads if o <= p < o + window)
        if best is None or s > best[1]:
            best = (o, s)
    return None if best is None or best[1] <= 0 else best[0]


def plan(paths: list[Path], window: float = WINDOW_S, lead: float = LEAD_S, *, no_log: bool = False) -> list[Job]:
    """The doctor runs for these traces (see the module doc); ``no_log``: every one without its log
    (the trace's name then ends in `` [no log]``)."""
    out = []
    for p in paths:
        for j in _plan_one(p, window, lead):
            if no_log:
                j.no_log, j.trace = True, j.trace + " [no log]"
            out.append(j)
    return out


def _plan_one(p: Path, window: float, lead: float) -> list[Job]:
    jobs: list[Job] = []
    tl = TraceTimeline(p)
    cls = str(tl.truth.get("class"))
    rules = [str(r) for r in tl.truth.get("expect_rules") or []]
    sab = tl.should_alert_by

    no_log = tl.truth.get("log_for_vtop") is False

    def job(point: str, start: float, expect: str) -> Job:
        return Job(tl.name, str(p), cls, point, round(max(0.0, start), 1), rules, sab, expect, no_log=no_log)

    if rules:
        if sab is None:
            return jobs
        if tl.truth.get("window_nameable") is False:
            # Nothing in a window can prove it (truth.json says why): doctor must invent nothing.
            j = job("alert", sab - window - lead, "unnameable")
            j.why = str(tl.truth.get("window_why") or "window_nameable: false")
            return [j]
        began = tl.began if tl.began is not None else sab
        if sab - began < lead + 1:
            # nothing to accumulate (a startup failure: named at its first error line): a window
            # ending before that line could not see it, so it starts just before the line
            jobs.append(job("first-line", began - 1, "named"))
        else:
            jobs.append(job("alert", sab - window - lead, "named"))
        # the truth may ask for doctors started this long after the incident began (issue 49: 30 s
        # and 60 s after an engine's stop); each must name it, whatever its window ends past the deadline
        for s in tl.truth.get("doctor_after_s") or ():
            jobs.append(job(f"after+{float(s):g}", began + float(s), "named"))
        return jobs
    end_start = tl.end - window - END_MARGIN_S
    # A quiet point must end before a clean shutdown's SIGTERM (after it the port refuses).
    last_quiet = end_start
    if cls == "clean_shutdown" and tl.began is not None:
        last_quiet = min(end_start, tl.began - window - SHUTDOWN_MARGIN_S)
    up = next((o for o in tl.metrics.offs if tl.port_open(o)), None)
    busy = busiest_start(tl, window)
    if busy is not None and (up is None or busy >= up):
        jobs.append(job("busiest", min(busy, max(last_quiet, up or 0.0)), "quiet"))
    elif up is not None and last_quiet >= up:  # no load at all (an idle server): the middle of its ready time
        jobs.append(job("middle", (up + last_quiet) / 2, "quiet"))
    if no_log and cls == "normal" and not tl.port_open(START_POINT_S + window):
        # a start without a log (issue 49): a busy start stays quiet, whatever its processes do
        jobs.append(job("starting", START_POINT_S, "quiet"))
    if cls == "clean_shutdown":
        began = tl.began
        if began is not None:
            jobs.append(job("shutdown", began - window / 2, "no-incident"))
        # the port refuses from the SIGTERM on; the trace's end closing it changes nothing
        after = began + 2 if began is not None else end_start
        jobs.append(job("after-shutdown", min(after, tl.end - window), "no-incident"))
    else:
        jobs.append(job("end", end_start, "quiet"))
    return jobs


def run_job(job: Job, *, window: float = WINDOW_S, python: str = sys.executable,
            doctor_args: tuple[str, ...] = (), procs: bool = True) -> Run:
    run = Run(job.trace, job.cls, job.point, job.start, job.should_alert_by, job.expect_rules, job.expect, job.why)
    conns = (Path(job.path) / "conns.jsonl.gz").exists()
    play_from = job.start
    if conns:
        # The kernel's counters of the connections are mirrored by real connections
        # (tests.corpus.connmirror): a request's age counts from when its connection was
        # mirrored, so the play starts early enough to hold the incident's request (or a
        # minute of what came before), and the doctor starts at the job's second as always.
        tl = TraceTimeline(job.path)
        began = tl.began if job.expect_rules and tl.began is not None else None
        play_from = max(0.0, min(job.start, began - CONN_PREROLL_S) if began is not None
                        else job.start - CONN_LOOKBACK_S)
    srv = TraceServer(job.path, start_at=play_from, procs=procs, conns=conns, log_for_vtop=not job.no_log)
    try:
        srv.start()
        while srv.offset() < job.start and not srv.ended:
            time.sleep(min(0.2, job.start - srv.offset()))
        cmd = [python, "-m", "vtop", "doctor", "--window", f"{window:g}", "--json", srv.url,
               *(() if job.no_log else ("--log", str(srv.log_path))), *doctor_args]
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=window + 90, cwd=ROOT)
        except subprocess.TimeoutExpired:
            run.error = f"doctor still running after {window + 90:.0f} s"
            return run
        finally:
            run.wall_s = round(time.monotonic() - t0, 1)
            run.ended_at = round(srv.offset(), 1)
            run.trace_ended = srv.ended
        run.exit_code = r.returncode
        try:
            rep = json.loads(r.stdout)
        except json.JSONDecodeError:
            run.error = f"no JSON from doctor (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}"
            return run
    finally:
        srv.cleanup()
    return judge(run, rep)


def judge(run: Run, rep: dict[str, Any]) -> Run:
    """Fill ``run`` from the doctor's JSON report ``rep`` (and ``run.exit_code``): named? passed?"""
    alerts = [a for a in rep.get("alerts") or [] if isinstance(a, dict)]
    run.alerts = [{"rule": str(a.get("rule")), "severity": str(a.get("severity")), "title": str(a.get("title"))}
                  for a in alerts]
    servers = rep.get("servers") or []
    if servers and isinstance(servers[0], dict):
        run.server = {k: servers[0].get(k) for k in ("state", "model", "running", "waiting", "kv_cache_pct")}
        run.server_state = str(servers[0].get("state"))
    hits = [a for a in run.alerts if a["rule"] in run.expect_rules]
    hits.sort(key=lambda a: a["severity"] not in BAD)
    if hits:
        run.named, run.rule, run.severity = True, hits[0]["rule"], hits[0]["severity"]
    run.others_bad = [f"{a['rule']}:{a['severity']}" for a in run.alerts
                      if a["severity"] in BAD and a["rule"] not in run.expect_rules]
    if run.expect == "named":
        run.ok = run.named and run.severity in BAD and run.exit_code not in (0, None)
        if run.point == "alert" and run.should_alert_by is not None and run.ended_at is not None:
            run.in_time = run.ended_at <= run.should_alert_by + IN_TIME_SLACK_S
            run.ok = run.ok and run.in_time
    elif run.expect == "unnameable":
        run.ok = not run.others_bad
    elif run.expect == "quiet":
        run.ok = not run.others_bad and run.exit_code == 0
        if run.trace_ended and not run.ok:
            run.error = "the trace ended (its port closed) before the doctor finished: run it with less load"
    else:  # after a clean shutdown: no incident named (a down port may exit non-zero)
        run.ok = not run.others_bad
    return run


def run_all(jobs: list[Job], *, window: float = WINDOW_S, parallel: int = JOBS,
            doctor_args: tuple[str, ...] = (), progress: Any = None, procs: bool = True) -> list[Run]:
    out: list[Run | None] = [None] * len(jobs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
        futs = {ex.submit(run_job, j, window=window, doctor_args=doctor_args, procs=procs): i
                for i, j in enumerate(jobs)}
        for f in concurrent.futures.as_completed(futs):
            i = futs[f]
            try:
                out[i] = f.result()
            except Exception as e:  # noqa: BLE001 - one broken play must not lose the others
                j = jobs[i]
                out[i] = Run(j.trace, j.cls, j.point, j.start, j.should_alert_by, j.expect_rules, j.expect,
                             j.why, error=f"{type(e).__name__}: {e}")
            if progress is not None:
                r = out[i]
                assert r is not None
                progress.write(f"  done {r.trace} [{r.point}] exit {r.exit_code} {'ok' if r.ok else 'FAIL'}\n")
                progress.flush()
    return [r for r in out if r is not None]


def totals(runs: list[Run]) -> dict[str, Any]:
    inc = [r for r in runs if r.expect == "named"]
    unn = [r for r in runs if r.expect == "unnameable"]
    rest = [r for r in runs if r.expect not in ("named", "unnameable")]
    return {
        "not_nameable": len(unn),
        "not_nameable_named_anyway": sum(1 for r in unn if r.named and r.severity in BAD),
        "not_nameable_false_alarms": sum(len(r.others_bad) for r in unn),
        "incidents": len(inc),
        "incidents_named": sum(1 for r in inc if r.named),
        "incidents_named_warning_or_worse": sum(1 for r in inc if r.named and r.severity in BAD),
        "incidents_nonzero_exit": sum(1 for r in inc if r.exit_code not in (0, None)),
        "incidents_ok": sum(1 for r in inc if r.ok),
        "incidents_late": sum(1 for r in inc if r.in_time is False),
        "quiet_runs": len(rest),
        "quiet_ok": sum(1 for r in rest if r.ok),
        "false_alarms": sum(len(r.others_bad) for r in rest),
        "errors": sum(1 for r in runs if r.error),
    }


def table(runs: list[Run], window: float) -> str:
    head = f"{'trace':36} {'class':15} {'point':14} {'start':>6} {'sab':>6} {'rep@':>6} {'named?':6} " \
           f"{'rule:severity':28} {'exit':>4} {'wall':>5}  ok"
    lines = [head, "-" * len(head)]
    for r in runs:
        sab = f"+{r.should_alert_by:.0f}" if r.should_alert_by is not None else "-"
        if r.named:
            named = "late" if r.in_time is False else "yes"
            what = f"{r.rule}:{r.severity}"
        elif r.expect == "unnameable":
            named = "n/a"
            what = "not nameable in a window: see below"
        else:
            named = "no" if r.expect == "named" else "-"
            what = ", ".join(f"{a['rule']}:{a['severity']}" for a in r.alerts) or "(none)"
        if r.error:
            what = f"ERROR {r.error}"
        rep = "-" if r.ended_at is None else f"+{r.ended_at:.0f}"
        lines.append(f"{r.trace[:36]:36} {r.cls[:15]:15} {r.point:14} {'+' + format(r.start, '.0f'):>6} {sab:>6} "
                     f"{rep:>6} {named:6} {what[:28]:28} {'-' if r.exit_code is None else r.exit_code:>4} "
                     f"{'-' if r.wall_s is None else format(r.wall_s, '.0f'):>5}  {'ok' if r.ok else 'FAIL'}")
    t = totals(runs)
    for r in runs:
        if r.expect == "unnameable":
            lines.append(f"  {r.trace}: not nameable from a {window:g} s window ({r.why}); passes with no other "
                         "warning")
    lines.append("")
    lines.append(
        f"doctor --window {window:g} live: incidents named {t['incidents_named']}/{t['incidents']} "
        f"(warning or worse {t['incidents_named_warning_or_worse']}, non-zero exit {t['incidents_nonzero_exit']}, "
        f"late {t['incidents_late']}, pass {t['incidents_ok']}); quiet points pass {t['quiet_ok']}/{t['quiet_runs']} "
        f"(false alarms {t['false_alarms']}); not nameable in a window {t['not_nameable']} "
        f"(false alarms {t['not_nameable_false_alarms']}); errors {t['errors']}")
    return "\n".join(lines)


def trace_paths(names: list[str]) -> list[Path]:
    if not names:
        return sorted(p for p in TRACES.iterdir() if (p / "truth.json").is_file())
    out = []
    for n in names:
        p = Path(n)
        if not p.is_dir():
            p = TRACES / n
        if not (p / "truth.json").is_file():
            raise SystemExit(f"live_doctor: no trace {n}")
        out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.corpus.live_doctor", description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", help="trace folders or names (default: the whole corpus)")
    ap.add_argument("--json", action="store_true", help="print the runs and totals as JSON")
    ap.add_argument("--jobs", type=int, default=JOBS, help=f"plays at once (default {JOBS})")
    ap.add_argument("--window", type=float, default=WINDOW_S, help=f"doctor --window (default {WINDOW_S:g})")
    ap.add_argument("--lead", type=float, default=LEAD_S,
                    help=f"start this long before should_alert_by - window (default {LEAD_S:g})")
    ap.add_argument("--doctor-arg", action="append", default=[], metavar="ARG", help="an extra doctor flag (repeat)")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    ap.add_argument("--no-procs", action="store_true",
                    help="no stand-in processes for the recorded process tree (the doctor then sees none)")
    ap.add_argument("--no-log", action="store_true",
                    help="play each trace without its log: the stand-in server writes to a pipe, the doctor gets "
                         "no --log (a trace whose truth says log_for_vtop: false is always played so)")
    ns = ap.parse_args(argv)
    jobs = plan(trace_paths(ns.traces), ns.window, ns.lead, no_log=ns.no_log)
    if ns.list:
        for j in jobs:
            print(f"{j.trace:36} {j.point:14} +{j.start:.0f} ({j.expect})")
        return 0
    t0 = time.monotonic()
    print(f"{len(jobs)} doctor runs, {ns.jobs} at a time, ~{ns.window + 3:.0f} s each ...", file=sys.stderr)
    runs = run_all(jobs, window=ns.window, parallel=ns.jobs, doctor_args=tuple(ns.doctor_arg), progress=sys.stderr,
                   procs=not ns.no_procs)
    if ns.json:
        print(json.dumps({"window_s": ns.window, "lead_s": ns.lead, "runs": [r.row() for r in runs],
                          "totals": totals(runs), "elapsed_s": round(time.monotonic() - t0, 1)}, indent=2))
    else:
        print(table(runs, ns.window))
        print(f"({time.monotonic() - t0:.0f} s)")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
