"""How long ``vtop --once --json`` takes, wall clock, beside ``nvitop --once`` and ``nvidia-smi``.

    python bench/oneshot.py                       # a replayed vLLM (the H200 /metrics timeline), 20 runs
    python bench/oneshot.py --runs 20 --url http://127.0.0.1:8000 --out /tmp/oneshot.json

Each case is a new process, as a user or a check runner starts it, timed from spawn to exit
(``time.perf_counter`` around ``subprocess.run``); the cases take turns run by run, so what
else the box does falls on all of them alike. Cases:

* ``python -c pass`` and ``python -c "import vtop.faces.headless"``: the interpreter's start and
  the headless path's imports, the floor under everything else;
* ``vtop --once --json URL``: the one round (issue #26 item 5: within 0.5 s on the H200
  box), and with ``--no-gpu`` (the difference is NVML: its load, init and first reads);
* ``vtop --once --json --window 2s URL``: the measured window (``--window-runs``, 3);
* ``nvitop --once`` and ``nvidia-smi``, when found (``--nvitop CMD``: another nvitop, e.g.
  from a scratch venv; it is never a dependency of vtop).

Needs only the standard library and an installed vtop (``vtop`` beside this Python, else
``python -m vtop``; ``--vtop`` to say which). Without ``--url`` it serves the recorded H200
``/metrics`` timeline of ``tests/fixtures`` in a child process (as bench/harness.py's
servers, with Nagle's algorithm off: Python's http.server writes headers and body apart,
and a delayed ACK then held each answer 40 ms, which vLLM's uvicorn does not do).
Prints a table (median, p90, min, max, exit status, what the report said) and, with
``--out``, writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def vtop_cmd(given: str | None) -> list[str]:
    if given:
        return given.split()
    exe = Path(sys.executable).parent / "vtop"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vtop"]


def p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def serve() -> None:
    """The child: one replayed vLLM 0.26.0 on an ephemeral port; prints its URL, serves until stdin closes."""
    import threading

    sys.path.insert(0, str(HERE))
    from harness import TIMELINE, MetricsTimeline, make_server

    if not TIMELINE.exists():
        print(json.dumps({"error": f"{TIMELINE} is not here: pass --url"}), flush=True)
        return
    srv = make_server(MetricsTimeline())
    srv.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(json.dumps({"url": f"http://127.0.0.1:{srv.server_address[1]}"}), flush=True)
    sys.stdin.read()
    srv.release.set()  # type: ignore[attr-defined]
    srv.shutdown()


class Replay:
    def __enter__(self) -> str:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        got = json.loads(self.proc.stdout.readline() or '{"error": "the replay server did not start"}')
        if "url" not in got:
            self.__exit__()
            sys.exit(f"bench/oneshot.py: {got['error']}")
        return str(got["url"])

    def __exit__(self, *exc: object) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def said(name: str, rc: int, out: str) -> str:
    """What one run reported, in a few words (so a fast run is seen to have answered)."""
    if name.startswith("vtop"):
        try:
            rep = json.loads(out)
        except ValueError:
            return "no JSON"
        srv = ", ".join(f"{s['state']} run {s['running']} wait {s['waiting']} gen {s['gen_tokens_per_s']}"
                        for s in rep.get("servers", []))
        gpus = len(rep.get("gpu", {}).get("gpus", []))
        return f"{srv}; {gpus} GPU{'s' if gpus != 1 else ''} ({rep['gpu']['status']})"
    if rc != 0:
        return (out.strip().splitlines() or ["(nothing)"])[0][:60]
    return f"{len(out.splitlines())} lines"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs of each case (default 20)")
    ap.add_argument("--window-runs", type=int, default=3, help="runs of the --window 2s case (default 3; 0: none)")
    ap.add_argument("--url", help="the vLLM server to read (default: a replayed H200 vLLM in a child process)")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--vtop", help="the vtop command (default: vtop beside this Python, else python -m vtop)")
    ap.add_argument("--nvitop", help="the nvitop command (default: nvitop on PATH, if any)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve()
        return 0
    if a.url:
        return run(a, a.url, "given")
    with Replay() as url:
        return run(a, url, "replayed H200 vLLM 0.26.0 /metrics")


def run(a: argparse.Namespace, url: str, server: str) -> int:
    vt = vtop_cmd(a.vtop)
    env = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent"}  # no user config
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached
    cases: list[tuple[str, list[str], int]] = [
        ("python -c pass", [sys.executable, "-c", "pass"], a.runs),
        ("python -c 'import vtop.faces.headless'", [sys.executable, "-c", "import vtop.faces.headless"], a.runs),
        ("vtop --once --json URL", [*vt, "--once", "--json", url], a.runs),
        ("vtop --once --json --no-gpu URL", [*vt, "--once", "--json", "--no-gpu", url], a.runs),
    ]
    if a.window_runs > 0:
        cases.append(("vtop --once --json --window 2s URL", [*vt, "--once", "--json", "--window", "2s", url],
                      a.window_runs))
    found = shutil.which("nvitop")
    nvitop = a.nvitop.split() if a.nvitop else ([found] if found else None)
    if nvitop:
        cases.append(("nvitop --once", [*nvitop, "--once"], a.runs))
    if smi := shutil.which("nvidia-smi"):
        cases.append(("nvidia-smi", [smi], a.runs))
    # one warm-up each (page cache, bytecode), not counted
    for _, cmd, _n in cases:
        subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    walls: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    rcs: dict[str, list[int]] = {name: [] for name, _, _ in cases}
    last: dict[str, str] = {}
    for i in range(max(n for _, _, n in cases)):
        for name, cmd, n in cases:
            if i >= n:
                continue
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
            walls[name].append(time.perf_counter() - t0)
            rcs[name].append(done.returncode)
            last[name] = said(name, done.returncode,
                              done.stdout + (done.stderr if done.returncode and not done.stdout else ""))
    rows: list[dict[str, Any]] = []
    for name, cmd, _n in cases:
        w = walls[name]
        rows.append({"case": name, "cmd": cmd, "runs": len(w), "median_s": round(statistics.median(w), 4),
                     "p90_s": round(p90(w), 4), "min_s": round(min(w), 4), "max_s": round(max(w), 4),
                     "wall_s": [round(x, 4) for x in w], "exit": sorted(set(rcs[name])), "said": last[name]})
    vtop_version = subprocess.run([*vt, "--version"], capture_output=True, text=True, env=env).stdout.strip()
    gpu = "none"
    if smi:
        gpu = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() or "nvidia-smi -L: nothing"
    head = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "vtop": vtop_version, "gpu": gpu, "url": url, "server": server,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"{head['vtop']} on {head['host']} ({head['cpus']} CPUs, Python {head['python']}); GPU: {gpu.splitlines()[0]}")
    print(f"server: {url} ({server})")
    print(f"{'case':36} {'runs':>4} {'median':>8} {'p90':>8} {'min':>8} {'max':>8}  exit  said")
    for r in rows:
        print(f"{r['case']:36} {r['runs']:>4} {r['median_s']:>7.3f}s {r['p90_s']:>7.3f}s {r['min_s']:>7.3f}s "
              f"{r['max_s']:>7.3f}s  {','.join(map(str, r['exit'])):4}  {r['said']}")
    if a.out:
        Path(a.out).write_text(json.dumps({**head, "cases": rows}, indent=2) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
