"""Does a change leave what ``vtop --once`` prints as it was? Two vtops, the same fixtures, a diff.

    python bench/once_same.py --code before=/tmp/old --code after=.     # every case, JSON and text
    python bench/once_same.py --code before=/tmp/old --code after=. --only trace: --keep /tmp/same

For issue 43's one-shot work (imports deferred, nothing else meant to move): each case is served
on 127.0.0.1 from a recorded fixture and each vtop's ``python -m vtop --once`` (``--json``, then
plain text) runs against it as a new process, the two codes taking turns:

* ``metrics:NAME``: a real ``/metrics`` text of ``tests/fixtures/vllm`` (H200 0.26.0, CPU 0.32.0),
  served unchanged on every scrape, no log;
* ``log:NAME``: the H200 idle ``/metrics`` beside a real vLLM log of ``tests/fixtures/logs``
  (``--log``: the phase tracker, the request lines, the stats history and the rules they feed);
* ``trace:NAME``: a corpus trace (``tests/corpus/traces``) held at one second (its truth's
  ``should_alert_by``, else its middle) by :class:`tests.corpus.serve_trace.TraceServer` with a
  clock that does not move: that second's ``/metrics``, health and log, the stamps moved to now;
* ``refused+gpu``: a port that refuses beside one simulated GPU.

GPUs are off (``--no-gpu``) but in the last case, whose simulated readings move with the clock.
What moves from run to run whatever the code does is masked before the diff (stamps, ages,
durations, the host, the simulated GPU's readings, pids); everything else must be equal. Exit 0
when no case differs, 1 otherwise (the differing lines are shown; ``--keep DIR`` keeps every
output). Each code runs twice a case (a b b a): a case is the same when some run of one prints what
some run of the other does, and UNSTABLE (not a failure; its diffs are shown) when neither code
printed the same thing twice: a one round's outcome that is a race between its sources. Needs the repository (its fixtures and ``tests.corpus``), nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIX = ROOT / "tests" / "fixtures"
TRACES = ROOT / "tests" / "corpus" / "traces"
#: the traces played, one of each class (an incident or a quiet one)
TRACE_NAMES = ("runaway-with-short-traffic", "engine-stall-enginecore", "engine-death-worker-load",
               "startup-failure-kv-too-small", "startup-stall-compile", "kv-saturation-preemptions", "startup-stall-engine-init",
               "normal-steady-mixed", "clean-sigterm-shutdown", "restart-counter-reset",
               "h100-api-unresponsive-prompt-logprobs")
LOGS = ("vllm-0.26.0-h200-startup.log", "vllm-0.26.0-h200-failure.log", "vllm-0.32.0-cpu-startup.log",
        "vllm-0.32.0-cpu-shutdown.log")

#: JSON keys whose values move with the clock or the box, whatever the code
MOVING_KEYS = re.compile(r"^(t|time|host|vtop|window_s|age_s|age_.*_s|.*_age_s|ago_s|.*_ago_s|log_history_s|history_s|since|since_s|"
                         r"elapsed_s|duration_s|silent_s|for_s|mono|pid|pids|started|.*_t|first_seen|last_seen)$")
GPU_NUMBERS = re.compile(r"^(util_pct|util_mean_pct|mem_used_bytes|mem_pct|power_w|temp_c|used_bytes|"
                         r"sm_active_pct|sm_active_mean_pct)$")
TEXT_MOVING = [
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "HH:MM:SS"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b"), "STAMP"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|m|h|min)\b"), "DUR"),
    (re.compile(r"\b(?:\d+h)?(?:\d+m)?\d+s\b"), "DUR"),
    (re.compile(r"\bpid \d+\b"), "pid N"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:PORT"),
    # a simulated GPU's readings move with the clock
    (re.compile(r"(GPU \d+ [^:\n]*: )[^\n]*"), r"\1READINGS"),
    (re.compile(r"/tmp/[\w./-]+"), "/tmp/PATH"),
]


def mask_text(s: str) -> str:
    for rx, rep in TEXT_MOVING:
        s = rx.sub(rep, s)
    return s


def mask_json(x: Any, key: str = "", gpu: bool = False) -> Any:
    if isinstance(x, dict):
        return {k: ("~" if MOVING_KEYS.match(k) or (gpu and GPU_NUMBERS.match(k)) else mask_json(v, k, gpu))
                for k, v in x.items()}
    if isinstance(x, list):
        return [mask_json(v, key, gpu) for v in x]
    if isinstance(x, str):
        return mask_text(x)
    return x


def env_for(code: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VTOP_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(code).resolve()), os.environ.get("PYTHONPATH")) if p)
    env["XDG_CONFIG_HOME"] = env["HOME"] = "/nonexistent"  # no user config
    env["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="vtop-same-state-")  # no start history of earlier runs
    return env


def once(code: str, args: list[str], as_json: bool) -> tuple[int, str]:
    argv = [sys.executable, "-m", "vtop", "--once", *(["--json"] if as_json else []), *args]
    r = subprocess.run(argv, capture_output=True, text=True, env=env_for(code), cwd="/tmp", timeout=120)
    return r.returncode, r.stdout + (f"\n[stderr]\n{r.stderr}" if r.stderr.strip() else "")


@contextmanager
def static_server(body: str) -> Iterator[str]:
    sys.path.insert(0, str(ROOT))
    from tests.helpers.metrics_server import MetricsServer

    with MetricsServer([body]) as srv:
        yield srv.url


@contextmanager
def trace_server(name: str) -> Iterator[tuple[str, str]]:
    sys.path.insert(0, str(ROOT))
    from tests.corpus.serve_trace import TraceServer, TraceTimeline

    tl = TraceTimeline(TRACES / name)
    at = tl.should_alert_by if tl.should_alert_by is not None else tl.end / 2
    at = min(max(0.0, at), tl.end)
    frozen = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vtop-same-") as d:
        log = Path(d) / "vllm.log"
        srv = TraceServer(tl, start_at=at, log_path=log, clock=lambda: frozen, log_for_vtop=True)
        with srv:
            srv.settle()
            yield srv.url, str(log)


Case = tuple[str, Callable[[], Any], Callable[[Any], list[str]], bool]


def cases(only: str | None) -> list[Case]:
    out: list[Case] = []

    def add(name: str, ctx: Callable[[], Any], args: Callable[[Any], list[str]], gpu: bool = False) -> None:
        if only is None or name.startswith(only):
            out.append((name, ctx, args, gpu))

    for p in sorted((FIX / "vllm").glob("*.txt")):
        body = p.read_text()
        add(f"metrics:{p.stem}", lambda body=body: static_server(body), lambda url: ["--no-gpu", url])
    idle = (FIX / "vllm" / "h200-0.26.0-metrics-idle.txt").read_text()
    for name in LOGS:
        add(f"log:{name}", lambda: static_server(idle),
            lambda url, name=name: ["--no-gpu", "--log", str(FIX / "logs" / name), url])
    for name in TRACE_NAMES:
        if (TRACES / name).is_dir():
            add(f"trace:{name}", lambda name=name: trace_server(name),
                lambda got: ["--no-gpu", "--log", got[1], got[0]])
    add("refused+gpu", lambda: _nothing(), lambda _: ["--simulate-gpus", "1", "http://127.0.0.1:9"], gpu=True)
    return out


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR", help="two vtops (DIR/vtop)")
    ap.add_argument("--only", help="the cases whose name starts with this (metrics:, log:, trace:, refused)")
    ap.add_argument("--keep", help="write every output under this folder")
    a = ap.parse_args()
    codes = [c.partition("=")[::2] for c in a.code]
    if len(codes) != 2 or not all((Path(d) / "vtop" / "__init__.py").exists() for _, d in codes):
        ap.error("want two --code NAME=DIR, each DIR holding vtop/")
    keep = Path(a.keep) if a.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    bad = unstable = 0
    todo = cases(a.only)
    for i, (name, ctx, args, gpu) in enumerate(todo):
        outs: dict[str, list[str]] = {c: [] for c, _ in codes}
        with ctx() as got:
            argv = args(got)
            for n, (cname, d) in enumerate(codes + codes[::-1] if i % 2 == 0 else codes[::-1] + codes):
                text_out = []
                for as_json in (True, False):
                    rc, text = once(d, argv, as_json)
                    shown = mask_text(text)
                    if as_json:
                        with contextlib.suppress(ValueError):
                            shown = json.dumps(mask_json(json.loads(text.split("\n[stderr]")[0]), gpu=gpu), indent=1,
                                               sort_keys=True)
                    text_out.append(f"exit {rc} ({'json' if as_json else 'text'})\n{shown}")
                    if keep:
                        (keep / f"{name.replace(':', '_')}.{cname}{n // 2}.{'json' if as_json else 'txt'}").write_text(text)
                outs[cname].append("\n".join(text_out))
        (x1, x2), (y1, y2) = (outs[c] for c, _ in codes)
        if {x1, x2} & {y1, y2}:
            verdict = "SAME"
        elif x1 == x2 or y1 == y2:  # one code printed the same twice, and the other never that
            verdict = "DIFF"
            bad += 1
            print("".join(difflib.unified_diff(x1.splitlines(True), y1.splitlines(True), codes[0][0], codes[1][0],
                                               n=1))[:4000])
        else:  # each code differs from itself: the case's outcome is a race, whatever the code
            verdict = "UNSTABLE"
            unstable += 1
            for c, (u, v) in outs.items():
                if u != v:
                    print("".join(difflib.unified_diff(u.splitlines(True), v.splitlines(True), f"{c} run 1",
                                                       f"{c} run 2", n=0))[:2000])
        print(f"{verdict:9} {name} ({x1.splitlines()[0]})", flush=True)
    print(f"{len(todo) - bad - unstable} of {len(todo)} cases print the same; {bad} differ; {unstable} differ "
          "from run to run whatever the code (neither code printed the same twice)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
