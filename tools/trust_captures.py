"""Tmux captures of issue 38's six on-screen findings, before and after (120x40 and 80x24).

    python -m tools.trust_captures --before /tmp/vtop-before/.venv/bin/vtop [--after .venv/bin/vtop]
                                   [--out /tmp/trust-captures] [--only 1,5]

Each finding is shown by one recorded corpus trace played live in real time
(``python -m tests.corpus.serve_trace TRACE --from S --log FILE``); four vtops watch it at once
in detached tmux sessions (the "before" and the "after" build, each at 120x40 and 80x24), all
against the same URL and log, and at the finding's seconds the panes are captured as text
(``tmux capture-pane -p``), after the keys the finding needs (``r`` for the requests screen).
Files: ``OUT/finding-N-before|after-WxH.txt`` (and ``.ansi``: the same with its colours, for
``less -R``) and ``OUT/INDEX.md`` (per finding: the trace, the
second of the trace captured, what to look at).

"Before" is vtop at commit ddf724c (before issue 38's trust work), built in its own venv::

    mkdir -p /tmp/vtop-before && git archive ddf724c | tar -x -C /tmp/vtop-before
    python3 -m venv /tmp/vtop-before/.venv
    /tmp/vtop-before/.venv/bin/pip install -e /tmp/vtop-before -c /tmp/vtop-before/tests/constraints.txt

(PYTHONPATH does not override an editable install: each build needs its own venv.) "After" is
this checkout's vtop. Each vtop runs with a fresh ``HOME`` so neither reads the other's files.
Takes about 6 minutes; needs tmux.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = ((120, 40), (80, 24))


@dataclass(frozen=True)
class Shot:
    """One capture: the finding it shows, the trace's second (from its launch) it is taken at, the
    keys sent to every vtop just before it, and what to look at."""

    finding: int
    at_s: float
    look: str
    keys: tuple[str, ...] = ()
    #: also read the alert's first line every second for this long before the shot (a flap shows there)
    watch_s: float = 0.0
    #: what changed between the builds, as these captures show it (checked by eye on a run)
    changed: str = ""


@dataclass(frozen=True)
class Play:
    """One trace played once (``--from`` seconds after its launch) for one or more shots."""

    trace: str
    start_s: float
    shots: tuple[Shot, ...] = field(default_factory=tuple)


FINDINGS = {
    1: "after the engine dies the screen still looks busy and blames the start",
    2: "'requests in flight' counts every logged request without a finish line",
    3: "one runaway, three wordings of its age",
    4: "three numbers for one rate",
    5: "alerts flap (a KV saturation's severity and its 'for Ns')",
    6: "the log's clock (8 h behind) trusted over what vtop sees",
}

PLAYS = (
    Play("engine-death-enginecore-load", 80.0, (
        Shot(1, 130.0, "the EngineCore was killed at +109.4 s under 4 running: the DOWN card's gauges (live or last "
             "seen, with their age), requests in flight, the start's line (ready vs FAILED)",
             changed="before: 'running 4' with nothing said of its age, 'requests in flight: 216' (every logged "
             "request of the run), the start redrawn '✗ FAILED ... ✗ ready 0.0 s'; after: a line 'gauges above: last "
             "seen 21 s ago: 4 running, 0 waiting when the engine died' (120x40), 'requests in flight: none (server "
             "DOWN; 4 running, 0 waiting when the engine died)', the start '✓ ready in 56 s' and the death its own "
             "line ('✗ the engine died ... after ready'). Not yet: at 80x24 the card is cut to running/waiting "
             "and neither the 'last seen' line nor the start shows; the 'greyed' gauges are drawn in the label's "
             "colour, pure white, brighter than a live value (see the .ansi)"),)),
    Play("runaway-with-short-traffic", 70.0, (
        Shot(2, 138.0, "a runaway began at +80.5 s among short requests (request log on, no finish lines): "
             "'requests in flight' and its oldest under the alert",
             changed="before: 'requests in flight: 19 · oldest cmpl-998c... ≤57s, max_tokens 22' (a 22-token request "
             "long finished) under an alert naming the runaway; after: 'in flight 1 (1 run, 0 wait) · oldest "
             "chatcmpl-81cec... at least 53s, max_tokens 65,516 (none from client)' (80x24: '1 in flight · oldest "
             "chatcmpl-81ce… ≥53s, max_tokens 65,516 (client: unset)'), the alert's request"),
        Shot(3, 141.0, "the same moment on the requests screen (r): the runaway's age there vs in the alert "
             "(lower bound or upper bound)", ("r",),
             changed="before: the alert says 'at least 53s' (finding 2), the r screen lists 20 requests 'in flight' "
             "with upper bounds ('≤57s' for the runaway, '≤59s' for a 22-token one) under 'ages are upper bounds'; "
             "after: the alert 'running at least 53s, came at most 55s ago' (finding 2), the r screen '1 in "
             "flight · 3 received in the last 10 s by the request log', the runaway 'at least 53s', 'at most 58s ago'"),
    )),
    Play("runaway-streaming-after-others", 55.0, (
        Shot(4, 125.0, "3 streams of 1500 tokens, then a runaway from +72.4 s: the headline gen tok/s, its "
             "sparkline and the alert's rate (their windows)",
             changed="before: headline gen tok/s 693 (a 60 s average, its window unsaid) beside a sparkline of "
             "5 s values falling to ~400, the alert '481 tok/s' with no window; after: the headline 412 with the "
             "sparkline's '5s' beside it, the alert '481 tok/s over 10 s', prompt '5s', preempt and hit '60s'"),)),
    Play("kv-saturation-many-seqs", 40.0, (
        Shot(5, 150.0, "KV full from +57.3 s (93 s before this capture): the alert's severity and its 'for Ns' "
             "(restarted at each flip, or counted from the incident's start); the -alerts.txt files: the alert's "
             "line each second from +70 s, with the severity changes counted", watch_s=80.0,
             changed="before: WARNING 'for 37s' 93 s into the saturation, and over 80 s the title flipped "
             "CRITICAL <-> WARNING 11 times (12 changes less its appearance) with its 'for' restarting (30s, 34s, 39s, 20s, 25s ...: never past 40s); after: CRITICAL "
             "'for 1m 37s', one change in 80 s (the alert's appearance), 'for' counting from the incident's start"),)),
    Play("normal-idle-3min-clock-minus8h", 0.0, (
        Shot(6, 30.0, "a normal start whose log stamps are 8 h behind vtop's clock (ready at +37.5 s): a "
             "'startup stalled ... no new log line for 8h' warning, or none",
             changed="before: 'WARNING Startup of :P stalled in torch.compile: no new log line for 8h 00m' and a "
             "'POSSIBLE HANG ... 8 h 00 min' in the start panel, 30 s into a normal start whose lines arrive every "
             "second; after: no alert, the start's phases ticking on (lines vtop saw arrive are news)"),)),
)


#: a tmux server of its own (``tmux -L``): another tmux user's ``kill-server`` on the box leaves it be
SOCKET = "vtop-trust-captures"


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=check)


def play(p: Play, builds: dict[str, str], out: Path, tag: str) -> list[tuple[Shot, str]]:
    """Serve ``p.trace`` from ``p.start_s``, start the four vtops, take the shots; the files written."""
    work = Path(tempfile.mkdtemp(prefix="trustcap-"))
    log = work / "vllm.log"
    srv = subprocess.Popen([sys.executable, "-m", "tests.corpus.serve_trace", p.trace, "--from", str(p.start_s),
                            "--log", str(log)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    t0 = time.monotonic()
    sessions: list[tuple[str, str, int, int]] = []
    written: list[tuple[Shot, str]] = []
    try:
        assert srv.stdout is not None
        first = srv.stdout.readline()
        url = next((w for w in first.split() if w.startswith("http://")), None)
        if url is None:
            raise RuntimeError(f"serve_trace said: {first!r}")
        for name, exe in builds.items():
            for w, h in SIZES:
                s = f"trustcap-{tag}-{name}-{w}x{h}"
                home = work / f"home-{name}-{w}x{h}"
                home.mkdir()
                cmd = (f"env HOME={shlex.quote(str(home))} XDG_CONFIG_HOME={shlex.quote(str(home / '.config'))} "
                       f"XDG_STATE_HOME={shlex.quote(str(home / '.state'))} "
                       f"XDG_CACHE_HOME={shlex.quote(str(home / '.cache'))} TERM=xterm-256color "
                       f"{shlex.quote(exe)} {shlex.quote(url)} --log {shlex.quote(str(log))}")
                tmux("kill-session", "-t", s, check=False)
                tmux("new-session", "-d", "-s", s, "-x", str(w), "-y", str(h), cmd)
                sessions.append((s, name, w, h))
        for shot in sorted(p.shots, key=lambda x: x.at_s):
            due = shot.at_s - p.start_s
            if shot.watch_s:
                written += watch(shot, sessions, out, t0, p.start_s, due)
            wait = due - (time.monotonic() - t0)
            if wait > 0:
                time.sleep(wait)
            if shot.keys:
                was = {s: tmux("capture-pane", "-p", "-t", s, check=False).stdout for s, *_ in sessions}
                for s, *_ in sessions:
                    for k in shot.keys:
                        tmux("send-keys", "-t", s, k, check=False)
                # a busy 2-core box takes a while to draw the new screen: wait (15 s at most) until every pane
                # shows it
                until = time.monotonic() + 15.0
                while time.monotonic() < until:
                    time.sleep(0.5)
                    if all(_first_diff(was[s], tmux("capture-pane", "-p", "-t", s, check=False).stdout)
                           for s, *_ in sessions):
                        break
            for s, name, w, h in sessions:
                # plain text, and the same with its colours (-e: SGR escapes; a greyed gauge shows only there)
                for flags, ext in ((("-p",), "txt"), (("-p", "-e"), "ansi")):
                    r = tmux("capture-pane", *flags, "-t", s, check=False)
                    text = r.stdout if r.returncode == 0 else f"(no pane: {r.stderr.strip()})\n"
                    f = out / f"finding-{shot.finding}-{name}-{w}x{h}.{ext}"
                    f.write_text(text)
                    written.append((shot, f.name))
            print(f"finding {shot.finding}: {p.trace} at +{shot.at_s:.0f} s captured", flush=True)
    finally:
        for s, *_ in sessions:
            tmux("kill-session", "-t", s, check=False)
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    return written


def _first_diff(before: str, now: str) -> bool:
    """Whether a new screen opened: a modal's top border (``█▀▀▀``, both builds) in the pane's top lines
    that were not there before."""
    def modal(pane: str) -> bool:
        return any("█▀▀▀▀" in ln for ln in pane.splitlines()[:4])
    return modal(now) and not modal(before)


def alert_line(pane: str) -> str:
    """The first alert's severity and title from a captured pane ('' when no alert shows)."""
    for ln in pane.splitlines():
        for sev in ("CRITICAL", "WARNING"):
            i = ln.find(f" {sev} ")
            if i >= 0:
                return ln[i + 1:].rstrip(" │┃")
    return ""


def watch(shot: Shot, sessions: list[tuple[str, str, int, int]], out: Path, t0: float, start_s: float,
          due: float) -> list[tuple[Shot, str]]:
    """Each second from ``shot.watch_s`` before the shot: the first alert's line in every 120-column pane;
    the severity changes counted. Files ``finding-N-BUILD-WxH-alerts.txt``."""
    lines: dict[tuple[str, int, int], list[str]] = {(n, w, h): [] for _, n, w, h in sessions if w == 120}
    sevs: dict[tuple[str, int, int], list[str]] = {k: [] for k in lines}
    begin = due - shot.watch_s
    while time.monotonic() - t0 < due:
        el = time.monotonic() - t0
        if el >= begin:
            for s, n, w, h in sessions:
                if (n, w, h) in lines:
                    r = tmux("capture-pane", "-p", "-t", s, check=False)
                    a = alert_line(r.stdout)
                    lines[(n, w, h)].append(f"+{start_s + el:.1f} s  {a or '(no alert)'}")
                    sevs[(n, w, h)].append(a.split(" ", 1)[0])
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - el)))
    written = []
    for (n, w, h), rows in lines.items():
        sv = sevs[(n, w, h)]
        changes = sum(1 for a, b in zip(sv, sv[1:]) if a != b)
        f = out / f"finding-{shot.finding}-{n}-{w}x{h}-alerts.txt"
        f.write_text(f"# the first alert's line each second, +{start_s + begin:.0f} s to +{start_s + due:.0f} s of "
                     f"the trace: {changes} severity changes (no alert -> an alert counts as one)\n" + "\n".join(rows) + "\n")
        written.append((shot, f.name))
    return written


def _head() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %cd", "--date=iso"], capture_output=True,
                       text=True, check=False)
    return r.stdout.strip() or "an unknown commit"


def index(out: Path, shots: list[tuple[Play, Shot]], builds: dict[str, str]) -> None:
    lines = ["# Issue 38: the six on-screen findings, before and after", "",
             "The numbers under 'changed' are from one run (2026-12-05): a re-run gives the same picture, its "
             "seconds and counts a little different.", "",
             "Made by `python -m tools.trust_captures` (its docstring says how). Builds: "
             + "; ".join(f"{k} = `{v}`" for k, v in builds.items()) + f" (before: vtop at commit ddf724c, before issue 38's trust work; after: this checkout at {_head()}).",
             "Each trace played live from the second shown (`python -m tests.corpus.serve_trace TRACE --from S "
             "--log FILE`), four vtops watching it at once; the trace's second of each capture is from its launch.",
             ""]
    for p, shot in shots:
        files = ", ".join(f"finding-{shot.finding}-{b}-{w}x{h}.txt" for b in builds for w, h in SIZES)
        lines += [f"## Finding {shot.finding}: {FINDINGS[shot.finding]}", "",
                  f"- trace `{p.trace}`, played from +{p.start_s:.0f} s, captured at +{shot.at_s:.0f} s"
                  + (f" after the keys {' '.join(shot.keys)}" if shot.keys else ""),
                  f"- look at: {shot.look}"]
        if shot.changed:
            lines.append(f"- changed: {shot.changed}")
        for b in builds:
            f = out / f"finding-{shot.finding}-{b}-120x40-alerts.txt"
            if f.is_file():
                head = f.read_text().splitlines()[0].lstrip("# ")
                lines.append(f"- {b}, {f.name}: {head}")
        lines += [f"- files: {files} (and .ansi: with colours, `less -R`)", ""]
    (out / "INDEX.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.trust_captures", description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the 'before' vtop executable (ddf724c's, in its own venv)")
    ap.add_argument("--after", default=str(Path(sys.executable).with_name("vtop")),
                    help="the 'after' vtop executable (default: this venv's)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/trust-captures"))
    ap.add_argument("--only", default="", help="comma-separated finding numbers (default: all six)")
    ap.add_argument("--index-only", action="store_true", help="only write OUT/INDEX.md (the captures are there)")
    a = ap.parse_args(argv)
    if a.index_only:
        builds = {"before": a.before, "after": a.after}
        index(a.out, [(p, s) for p in PLAYS for s in p.shots], builds)
        print(f"{a.out / 'INDEX.md'} written", flush=True)
        return 0
    if shutil.which("tmux") is None:
        ap.error("tmux is not installed")
    for exe in (a.before, a.after):
        if not os.access(exe, os.X_OK):
            ap.error(f"not an executable: {exe}")
    only = {int(x) for x in a.only.split(",") if x.strip()} or set(FINDINGS)
    a.out.mkdir(parents=True, exist_ok=True)
    builds = {"before": a.before, "after": a.after}
    tag = str(os.getpid())
    done: list[tuple[Play, Shot]] = []
    for p in PLAYS:
        want = tuple(s for s in p.shots if s.finding in only)
        if not want:
            continue
        play(Play(p.trace, p.start_s, want), builds, a.out, tag)
        done += [(p, s) for s in want]
    if only == set(FINDINGS):
        index(a.out, done, builds)
    print(f"captures in {a.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
