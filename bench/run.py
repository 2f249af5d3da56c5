"""vtop's overhead, all of it, in one table (issue #8).

    .venv/bin/python bench/run.py            # about 6 minutes
    .venv/bin/python bench/run.py --quick    # about 3 minutes (20 s CPU windows, 0.5 GB log)
    .venv/bin/python bench/run.py --profile  # + 90 s: py-spy of scenario (c), top functions by own time
                                             # (/tmp/vtop-pyspy-c.svg flame graph, .txt folded stacks)

Each scenario runs vtop as a user starts it (the venv's ``vtop`` script) in a
120x40 tmux pane with ``--interval 1``:

  (a) idle      ``--no-gpu`` and one URL whose port refuses (bound, not listening)
  (b) 1+1       ``--simulate-gpus 1`` and one replayed vLLM server
  (c) 8+2       ``--simulate-gpus 8`` and two replayed vLLM servers

Simulated GPUs answer through vtop's fake NVML, whose calls spin inside
vtop's process the CPU time each real call took on the H200 box (~0.39 ms a
GPU a tick; bench/nvml_calibrate.py measures it), letting go of the GIL
while they spin as the real (ctypes) calls do. Servers are
stdlib HTTP servers in a child process (bench/harness.py) replaying the
recorded H200 ``/metrics`` timeline at one payload a second.

Per scenario:

* CPU: utime+stime of the vtop process from /proc/PID/stat over a window
  that starts after a warm-up (10 s; 60 s window, 20 s with --quick).
* peak RSS: VmHWM from /proc/PID/status at the end (the key presses included).
* vtop runs with bytecode caches (PYTHONPYCACHEPREFIX in /tmp, written by a
  priming start whose first frame is reported apart), as an installed vtop has.
* first frame: from just before ``tmux new-session`` to the first
  ``capture-pane`` showing the footer's key hints; polled every 10 ms.
  Each scenario starts 5 times (``--starts``), each quit at its first frame
  but the last, which goes on to be measured: the median is judged (one
  start is one draw of what else the box was doing), the slowest is shown.
  "first data": until the status bar shows the GPUs / servers answering.
  Before the scenarios, the floor under it: a bare Textual app with a key
  line (bench/textual_floor.py) and vtop as in (c), started in turn
  (``--floor-starts``, 6 each): medians of both and what vtop adds.
* key latency: ``l`` (log pane on/off, a 14-row box appears or goes) pressed
  20 times; send-keys to the first capture showing the change. Then, in (b)
  and (c), server 1's /metrics is made to accept and never answer; once the
  card says STALE the 20 presses are repeated ("hung"). The tmux floor is the
  same loop against ``cat`` (the terminal echoes the key): subtract it.
  PASS/MISS is on the p95 (the floor not subtracted).
* box busy: how busy all CPUs were during the window; other work on a small
  box slows vtop's threads and the tmux round trips, so compare runs with
  similar figures.

Then: /metrics parse time (bench/parse_metrics.py), attaching to a 2 GB log
(bench/log_attach.py), and the bytes an hour that ``--record`` writes with
8 GPUs and 2 servers at 1 Hz (plain JSONL and .gz, two vtops side by side).

Results also go to bench/results/latest.json with the machine's description.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import (  # noqa: E402
    ServerProcess,
    Tmux,
    closed_port,
    cpu_seconds,
    key_latencies,
    loadavg,
    machine_info,
    thread_cpu_ns,
    thread_ms_per_s,
    tmux_floor,
    vm_kb,
    vtop_cmd,
)

TARGETS = {
    "cpu_pct": 1.0,  # % of one core (the figure is for (c); shown for all)
    "first_frame_s": 0.5,
    "rss_mb": 80.0,
    "key_ms": 50.0,  # judged on p95
    "parse_ms": 3.0,
    "attach_s": 0.3,
}
KEY = "l"
SCENARIOS = [
    {"id": "a", "label": "(a) idle: --no-gpu, port closed", "gpus": 0, "servers": 0},
    {"id": "b", "label": "(b) 1 GPU + 1 server", "gpus": 1, "servers": 1},
    {"id": "c", "label": "(c) 8 GPUs + 2 servers", "gpus": 8, "servers": 2},
]
_BOXED_BLANK = re.compile(r"^│ +│$")


def box_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, sum(f)


def log_pane_shown(screen: str) -> bool:
    """The log pane (no log watched: an empty bordered box) is on screen."""
    return sum(1 for line in screen.splitlines() if _BOXED_BLANK.match(line.rstrip())) >= 4


def footer_shown(screen: str) -> bool:
    return "q Quit" in screen


def fmt_range(xs: list[float | None]) -> str:
    ok = [x for x in xs if x is not None]
    miss = len(xs) - len(ok)
    return (f"{min(ok):.2f}-{max(ok):.2f}" if ok else "none") + (f", {miss} never drawn" if miss else "")


def stats_ms(xs: list[float | None]) -> dict[str, Any]:
    ok = sorted(1000 * x for x in xs if x is not None)
    if not ok:
        return {"n": len(xs), "missed": len(xs), "median_ms": None, "p95_ms": None, "max_ms": None, "all_ms": []}
    return {
        "n": len(xs),
        "missed": len(xs) - len(ok),
        "median_ms": statistics.median(ok),
        "p95_ms": ok[min(len(ok) - 1, round(0.95 * (len(ok) - 1)))],
        "max_ms": ok[-1],
        "all_ms": [None if x is None else round(1000 * x, 1) for x in xs],
    }


def vtop_args(gpus: int, urls: list[str]) -> list[str]:
    a = vtop_cmd() + urls + ["--interval", "1"]
    return a + (["--simulate-gpus", str(gpus)] if gpus else ["--no-gpu"])


def data_shown(sc: dict[str, Any]) -> Callable[[str], bool]:
    gpus, servers = sc["gpus"], sc["servers"]

    def pred(screen: str) -> bool:
        status = screen.splitlines()[0] if screen else ""
        gpu_ok = ("GPU: off" in status) if not gpus else (f"{gpus} × NVIDIA H200" in status)
        if not servers:
            srv_ok = "vLLM: down" in status
        elif servers == 1:
            srv_ok = "vLLM: up" in status
        else:
            srv_ok = f"vLLM: {servers} up" in status
        return gpu_ok and srv_ok

    return pred


def quit_vtop(tmux: Tmux, name: str, pid: int, timeout: float = 5.0) -> float | None:
    """Press q; seconds until the process is gone (None: it had to be killed)."""
    t0 = time.monotonic()
    tmux.send_keys(name, "q")
    while time.monotonic() - t0 < timeout:
        try:
            gone = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
        except OSError:  # gone between two looks (ENOENT, or ESRCH while it was being reaped)
            gone = True
        if gone:
            return time.monotonic() - t0
        time.sleep(0.02)
    tmux.kill(name)
    return None


def one_first_frame(tmux: Tmux, name: str, argv: list[str]) -> float | None:
    """Start ``argv`` in a tmux window, time its first frame (the key line shown), quit it."""
    pid, t0 = tmux.new(name, argv)
    ff, _ = tmux.wait_for(name, footer_shown, timeout=30, since=t0)
    quit_vtop(tmux, name, pid)
    tmux.kill(name)
    return ff


def first_frame_floor(tmux: Tmux, n: int) -> dict[str, Any]:
    """First frames of bench/textual_floor.py (a bare Textual app with a key
    line) and of vtop as in (c), ``n`` starts each, alternating: the box's and
    the framework's share of vtop's first frame, and what vtop adds to it."""
    port, sock = closed_port()
    argvs = {
        "floor": [sys.executable, str(HERE / "textual_floor.py")],
        "vtop": vtop_cmd() + ["--simulate-gpus", "8", "--interval", "1", f"http://127.0.0.1:{port}"],
    }
    got: dict[str, list[float | None]] = {k: [] for k in argvs}
    try:
        for i in range(n):
            for k in (("floor", "vtop") if i % 2 == 0 else ("vtop", "floor")):
                got[k].append(one_first_frame(tmux, "ff", argvs[k]))
                time.sleep(0.3)
    finally:
        sock.close()  # type: ignore[attr-defined]
    out: dict[str, Any] = {"starts": n}
    for k, xs in got.items():
        ok = [x for x in xs if x is not None]
        out[k] = {"median_s": statistics.median(ok) if ok else None, "all_s": [None if x is None else round(x, 3) for x in xs]}
    if out["floor"]["median_s"] is not None and out["vtop"]["median_s"] is not None:
        out["vtop_minus_floor_s"] = out["vtop"]["median_s"] - out["floor"]["median_s"]
    return out


def extra_first_frames(tmux: Tmux, argv: list[str], n: int) -> list[float | None]:
    """``n`` more starts of the scenario's own command line (its servers up), each
    quit as soon as its first frame shows: one start is one sample of a figure
    that moves with what else the box is doing at that moment."""
    out: list[float | None] = []
    for _ in range(n):
        out.append(one_first_frame(tmux, "ff-extra", argv))
        time.sleep(0.3)
    return out


def run_scenario(tmux: Tmux, sc: dict[str, Any], warmup: float, window: float, presses: int,
                 starts: int = 1) -> dict[str, Any]:
    name = f"sc-{sc['id']}"
    res: dict[str, Any] = {"id": sc["id"], "label": sc["label"], "gpus": sc["gpus"], "servers": sc["servers"]}
    port_sock = None
    sp = ServerProcess(sc["servers"]) if sc["servers"] else None
    try:
        if sp is not None:
            urls = sp.urls
        else:
            port, port_sock = closed_port()
            urls = [f"http://127.0.0.1:{port}"]
        argv = vtop_args(sc["gpus"], urls)
        res["argv"] = " ".join(argv[1:] if argv[0].endswith("vtop") else argv)
        extra = extra_first_frames(tmux, argv, starts - 1)
        res["loadavg_before"] = loadavg()
        pid, t0 = tmux.new(name, argv)
        ff, screen = tmux.wait_for(name, footer_shown, timeout=30, since=t0)
        res["first_frame_s"] = ff
        res["first_frames_s"] = [None if x is None else round(x, 3) for x in extra + [ff]]
        seen = [x for x in extra + [ff] if x is not None]
        res["first_frame_median_s"] = statistics.median(seen) if seen else None
        fd, screen = tmux.wait_for(name, data_shown(sc), timeout=30, since=t0)
        res["first_data_s"] = fd
        if fd is None:
            res["error"] = "the status bar never showed the expected GPUs/servers; screen:\n" + screen
        time.sleep(max(0.0, t0 + warmup - time.monotonic()))
        st0 = [sp.stats(i) for i in range(len(sp.urls))] if sp is not None else []
        b0 = box_jiffies()
        u0, s0 = cpu_seconds(pid)
        th0 = thread_cpu_ns(pid)
        w0 = time.monotonic()
        time.sleep(window)
        u1, s1 = cpu_seconds(pid)
        th1 = thread_cpu_ns(pid)
        wall = time.monotonic() - w0
        # by thread (nanoseconds, schedstat): which source costs what
        res["threads_ms_per_s"] = thread_ms_per_s(th0, th1, wall)
        b1 = box_jiffies()
        # How busy the whole box was meanwhile (all CPUs, vtop included): others' work skews the figures.
        res["box_busy_pct"] = 100 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1])
        if sp is not None:
            st1 = [sp.stats(i) for i in range(len(sp.urls))]
            # per server and minute: TCP connections vtop opened, requests it made (the bench's own not counted)
            res["server_traffic_per_min"] = [
                {"connections": (b["connections"] - a["connections"] - 1) * 60 / wall,
                 "requests": (b["requests"] - a["requests"]) * 60 / wall} for a, b in zip(st0, st1)]
        cpu = (u1 - u0) + (s1 - s0)
        res.update({
            "window_s": wall,
            "user_s": u1 - u0,
            "sys_s": s1 - s0,
            "cpu_s_per_min": cpu * 60 / wall,
            "cpu_pct": 100 * cpu / wall,
            "rss_mb_after_window": vm_kb(pid, "VmRSS") / 1024,
            "peak_rss_mb_after_window": vm_kb(pid, "VmHWM") / 1024,
            "threads": int(next(ln.split()[1] for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                                if ln.startswith("Threads:"))),
            "loadavg_after_window": loadavg(),
        })
        screen = tmux.capture(name)
        res["screen_after_window"] = screen
        if not data_shown(sc)(screen):
            res["error"] = "after the window the status bar did not show the expected GPUs/servers"
        res["key"] = stats_ms(key_latencies(tmux, name, KEY, log_pane_shown, presses))
        if sp is not None:
            sp.control(0, "hang")
            stale, screen = tmux.wait_for(name, lambda s: "STALE" in s, timeout=20)
            res["hang_seen_after_s"] = stale
            res["key_hung"] = stats_ms(key_latencies(tmux, name, KEY, log_pane_shown, presses, seed=3))
            res["screen_hung"] = tmux.capture(name)
            sp.control(0, "unhang")
        res["peak_rss_mb"] = vm_kb(pid, "VmHWM") / 1024
        res["quit_s"] = quit_vtop(tmux, name, pid)
    finally:
        tmux.kill(name)
        if sp is not None:
            sp.close()
        if port_sock is not None:
            port_sock.close()  # type: ignore[attr-defined]
    return res


def measure_record(tmux: Tmux, warmup: float, window: float) -> dict[str, Any]:
    """Two vtops (8 GPUs, 2 servers, 1 Hz), one with --record X.jsonl, one with --record X.jsonl.gz."""
    tmp = Path(tempfile.mkdtemp(prefix="vtop-bench-rec-"))
    out: dict[str, Any] = {"gpus": 8, "servers": 2}
    try:
        with ServerProcess(2) as sp:
            files = {"jsonl": tmp / "rec.jsonl", "gz": tmp / "rec.jsonl.gz"}
            pids = {}
            for k, f in files.items():
                pids[k], _ = tmux.new(f"rec-{k}", vtop_args(8, sp.urls) + ["--record", str(f)])
            t_start = time.monotonic()
            time.sleep(warmup)
            size0 = files["jsonl"].stat().st_size if files["jsonl"].exists() else 0
            g0 = time.monotonic()
            time.sleep(window)
            size1 = files["jsonl"].stat().st_size if files["jsonl"].exists() else 0
            grow_s = time.monotonic() - g0
            for k in files:
                out[f"quit_{k}_s"] = quit_vtop(tmux, f"rec-{k}", pids[k])
                tmux.kill(f"rec-{k}")
            ran = time.monotonic() - t_start
        out["growth_window_s"] = grow_s
        out["growth_bytes"] = size1 - size0
        out["bytes_per_hour_growth"] = (size1 - size0) * 3600 / grow_s if grow_s else None
        for k, f in files.items():
            info: dict[str, Any] = {"exists": f.exists()}
            if f.exists():
                info["size"] = f.stat().st_size
                kinds: Counter[str] = Counter()
                ts: list[float] = []
                line_bytes: Counter[str] = Counter()
                header = 0
                try:
                    opener = gzip.open if f.suffix == ".gz" else open
                    with opener(f, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
                        for line in fh:
                            try:
                                r = json.loads(line)
                            except json.JSONDecodeError:
                                kinds["(damaged)"] += 1
                                continue
                            kind = str(r.get("kind"))
                            kinds[kind] += 1
                            line_bytes[kind] += len(line.encode())
                            if kind == "header":
                                header = len(line.encode())
                            t = r.get("t")
                            if isinstance(t, (int, float)) and t > 1e9:
                                ts.append(float(t))
                except (OSError, EOFError) as e:
                    info["read_error"] = f"{type(e).__name__}: {e}"
                info["records"] = dict(kinds)
                info["uncompressed_bytes_by_kind"] = dict(line_bytes)
                info["span_s"] = (max(ts) - min(ts)) if len(ts) > 1 else None
                info["ran_s"] = ran
                # bytes an hour from the whole file over the span its samples cover (header aside)
                span = info["span_s"] or ran
                base = header if k == "jsonl" else 0
                info["bytes_per_hour"] = (info["size"] - base) * 3600 / span if span else None
                info["uncompressed_bytes_per_hour"] = (sum(line_bytes.values()) - header) * 3600 / span if span else None
            out[k] = info
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def pyspy_profile(tmux: Tmux, seconds: float, rate: int) -> dict[str, Any]:
    """py-spy record (raw folded stacks) of scenario (c); own time per function (leaf frames)."""
    pyspy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if not pyspy:
        return {"error": "py-spy not found"}
    out: dict[str, Any] = {"seconds": seconds, "rate": rate}
    tmp = Path(tempfile.mkdtemp(prefix="vtop-bench-spy-"))
    try:
        with ServerProcess(2) as sp:
            pid, _ = tmux.new("spy", vtop_args(8, sp.urls))
            time.sleep(10)
            raw = Path(tempfile.gettempdir()) / "vtop-pyspy-c.txt"
            c0 = sum(cpu_seconds(pid))
            # Threads py-spy sees as idle (blocked in a system call) are left out; a thread waiting for the
            # GIL still counts. (--gil was tried: on Python 3.11 it counted 3-4x more GIL-holding samples
            # than vtop had CPU time, so it is not used.)
            r = subprocess.run([pyspy, "record", "--nonblocking", "-r", str(rate), "-d", str(int(seconds)),
                                "-f", "raw", "-t", "-o", str(raw), "--pid", str(pid)], capture_output=True, text=True)
            out["cpu_pct_while_sampled"] = 100 * (sum(cpu_seconds(pid)) - c0) / seconds
            svg = Path(tempfile.gettempdir()) / "vtop-pyspy-c.svg"
            if r.returncode != 0 or not raw.exists():
                out["error"] = r.stderr[-2000:]
                return out
            own: Counter[str] = Counter()
            incl: Counter[str] = Counter()
            threads: Counter[str] = Counter()
            total = 0
            for line in raw.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                cnt = int(n)
                # "thread (TID): NAME;frame;...;leaf", a frame "func (file:line)": grouped by function
                frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
                total += cnt
                threads[re.sub(r"^thread \(\d+\): ", "", frames[0])] += cnt
                if len(frames) > 1:
                    own[frames[-1]] += cnt
                for f in set(frames[1:]):
                    incl[f] += cnt
            out["samples"] = total
            out["top_own"] = [{"function": f, "samples": c, "pct": 100 * c / total} for f, c in own.most_common(25)]
            out["top_inclusive"] = [{"function": f, "samples": c, "pct": 100 * c / total} for f, c in incl.most_common(40)]
            out["threads"] = [{"thread": f, "samples": c, "pct": 100 * c / total} for f, c in threads.most_common()]
            subprocess.run([pyspy, "record", "--nonblocking", "-r", str(rate), "-d", "20", "-o", str(svg),
                            "--pid", str(pid)], capture_output=True, text=True)
            out["svg"] = str(svg) if svg.exists() else None
            out["raw"] = str(raw)
            quit_vtop(tmux, "spy", pid)
            tmux.kill("spy")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# -------------------------------------------------------------------- output
def mark(value: float | None, target: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if value <= target else "MISS"


def fmt_key(k: dict[str, Any] | None) -> str:
    if not k:
        return "-"
    if k["median_ms"] is None:
        return f"none of {k['n']} seen"
    miss = f" ({k['missed']} lost)" if k["missed"] else ""
    return f"{k['median_ms']:4.0f} /{k['p95_ms']:4.0f} {mark(k['p95_ms'], TARGETS['key_ms'])}{miss}"


def fmt_first_frame(s: dict[str, Any]) -> str:
    """The median of the scenario's starts, the slowest in brackets; PASS/MISS on the median."""
    xs = [x for x in s.get("first_frames_s") or [s["first_frame_s"]] if x is not None]
    med = s.get("first_frame_median_s", s["first_frame_s"])
    if med is None or not xs:
        return "-"
    worst = f" ({max(xs):.2f})" if len(xs) > 1 else ""
    return f"{med:.2f}{worst} {mark(med, TARGETS['first_frame_s'])}"


def repeated_cpu(scenarios: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Scenario id -> its CPU figures (% of a core), for the scenarios run more than once."""
    by: dict[str, list[float]] = {}
    for s in scenarios:
        if s.get("cpu_pct") is not None:
            by.setdefault(s["id"], []).append(s["cpu_pct"])
    return {k: v for k, v in by.items() if len(v) > 1}


def print_report(r: dict[str, Any]) -> None:
    m = r["machine"]
    print()
    print(f"vtop overhead: {m['cpu_model']}, {m['nproc']} CPUs, Python {m['python']}, Textual {m['textual']}, "
          f"vtop {m['vtop']} ({m['git_head']}{', vtop/ modified' if m['vtop_tree_dirty'] else ''}), {m['tmux']}")
    if m.get("python_speed_ms"):
        print(f"this box's Python speed: a reference loop in {m['python_speed_ms']:.1f} ms of CPU (lower is faster; "
              "the same vtop costs more on a slower box)")
    print(f"120x40 tmux pane, --interval 1; CPU over {r['window_s']:.0f} s after a {r['warmup_s']:.0f} s warm-up; "
          f"key '{KEY}' pressed {r['presses']} times")
    cols = ["scenario", "CPU s/min", "% core", "peak RSS MB", "1st frame s (max)", "1st data s",
            "key ms med/p95", "key ms med/p95, hung"]
    tgt = ["target", "", f"<= {TARGETS['cpu_pct']:.2f}", f"<= {TARGETS['rss_mb']:.0f}",
           f"med <= {TARGETS['first_frame_s']}", "", f"p95 <= {TARGETS['key_ms']:.0f}", f"p95 <= {TARGETS['key_ms']:.0f}"]
    rows = [cols, tgt]
    for s in r["scenarios"]:
        rows.append([
            s["label"],
            f"{s['cpu_s_per_min']:.3f}",
            f"{s['cpu_pct']:.2f} {mark(s['cpu_pct'], TARGETS['cpu_pct'])}",
            f"{s['peak_rss_mb']:.1f} {mark(s['peak_rss_mb'], TARGETS['rss_mb'])}",
            fmt_first_frame(s),
            "-" if s["first_data_s"] is None else f"{s['first_data_s']:.2f}",
            fmt_key(s.get("key")),
            fmt_key(s.get("key_hung")) if s["servers"] else "- (nothing to hang)",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 1:
            print("  ".join("-" * w for w in widths))
    for sid, runs in repeated_cpu(r["scenarios"]).items():
        print(f"({sid}) over {len(runs)} runs: median {statistics.median(runs):.2f} % of a core, "
              f"{min(runs):.2f}-{max(runs):.2f}")
    if r.get("first_frame_prime_s") is not None:
        print(f"first frame of a priming start before these (page cache, .pyc): {r['first_frame_prime_s']:.2f} s")
    ff = r.get("first_frame_floor")
    if ff and ff["floor"]["median_s"] is not None and ff["vtop"]["median_s"] is not None:
        print(f"first frame, {ff['starts']} starts each, alternating: a bare Textual app with a key line "
              f"{ff['floor']['median_s']:.2f} s (median; {fmt_range(ff['floor']['all_s'])}), vtop as in (c) "
              f"{ff['vtop']['median_s']:.2f} s ({fmt_range(ff['vtop']['all_s'])}): vtop adds "
              f"{1000 * ff['vtop_minus_floor_s']:.0f} ms")
    fl = r["tmux_floor"]
    res = r["tmux_resolution"]
    print(f"tmux floor (same press-and-poll loop against cat): median {fl['median_ms']:.0f} ms, p95 {fl['p95_ms']:.0f} ms; "
          f"polling every {res['poll_period_ms']:.0f} ms, one capture-pane takes {res['capture_pane_median_ms']:.1f} ms "
          f"(p95 {res['capture_pane_p95_ms']:.1f}), so a figure is late by up to ~{res['poll_period_ms'] + res['capture_pane_p95_ms']:.0f} ms")
    for s in r["scenarios"]:
        extra = []
        if s.get("error"):
            extra.append("ERROR: " + s["error"].splitlines()[0])
        if s.get("quit_s") is None:
            extra.append("did not quit on q within 5 s")
        if s["servers"]:
            extra.append(f"hung server shown STALE after {s['hang_seen_after_s']:.1f} s" if s.get("hang_seen_after_s")
                         else "hung server never shown STALE")
        if s.get("server_traffic_per_min"):
            extra.append("per server a minute: " + ", ".join(f"{t['requests']:.0f} requests over {t['connections']:.0f} "
                                                            "new connections" for t in s["server_traffic_per_min"]))
        if s.get("threads_ms_per_s"):
            extra.append("CPU ms a second by thread: " + ", ".join(
                f"{k} {v:.2f}" for k, v in s["threads_ms_per_s"].items() if v >= 0.01))
        extra.append(f"user/sys {s['user_s']:.2f}/{s['sys_s']:.2f} s, {s['threads']} threads, "
                     f"load {s['loadavg_before']:.2f}->{s['loadavg_after_window']:.2f}, "
                     f"box {s['box_busy_pct']:.0f} % busy in the window")
        print(f"  {s['id']}: " + "; ".join(extra))

    print()
    p, a, rec = r.get("parse"), r.get("attach"), r.get("record")
    rows = [["other", "figure", "target", ""]]
    if p:
        rows.append(["/metrics parse, warm (worst median of 5 real payloads)", f"{p['worst_warm_median_ms']:.2f} ms",
                     f"<= {TARGETS['parse_ms']} ms", mark(p["worst_warm_median_ms"], TARGETS["parse_ms"])])
        rows.append(["/metrics parse, cold = first scrape (worst median)", f"{p['worst_cold_median_ms']:.2f} ms",
                     f"<= {TARGETS['parse_ms']} ms", mark(p["worst_cold_median_ms"], TARGETS["parse_ms"])])
        rows.append([f"/metrics parse, H200 timeline replay ({p['replay_scrapes']} scrapes) median/p95",
                     f"{p['replay_median_ms']:.2f}/{p['replay_p95_ms']:.2f} ms", f"<= {TARGETS['parse_ms']} ms",
                     mark(p["replay_p95_ms"], TARGETS["parse_ms"])])
    if a:
        rows.append([f"attach to a {a['bytes'] / 1e9:.1f} GB log (median of {a['runs']})", f"{a['median_s']:.3f} s",
                     f"<= {TARGETS['attach_s']} s", mark(a["median_s"], TARGETS["attach_s"])])
    if rec:
        for k, label in (("jsonl", "--record FILE.jsonl"), ("gz", "--record FILE.jsonl.gz")):
            i = rec.get(k) or {}
            if not i.get("exists"):
                rows.append([f"{label}, 8 GPUs + 2 servers, 1 Hz", "no file written", "", ""])
                continue
            bph = i.get("bytes_per_hour")
            recs = ", ".join(f"{n} {kind}" for kind, n in sorted(i.get("records", {}).items()))
            fig = "-" if bph is None else f"{bph / 1e6:.1f} MB/h"
            if k == "jsonl" and rec.get("bytes_per_hour_growth"):
                fig += f" (growth {rec['bytes_per_hour_growth'] / 1e6:.1f})"
            if k == "gz" and i.get("uncompressed_bytes_per_hour"):
                fig += f" ({i['uncompressed_bytes_per_hour'] / 1e6:.1f} raw)"
            rows.append([f"{label}, 8 GPUs + 2 servers, 1 Hz [{recs}]", fig, "", i.get("read_error", "")])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    prof = r.get("profile")
    if prof and prof.get("top_own"):
        print(f"\npy-spy, scenario (c), {prof['seconds']:.0f} s at {prof['rate']} Hz, {prof['samples']} samples of "
              f"non-idle threads (vtop at {prof['cpu_pct_while_sampled']:.2f} % of a core while sampled): own time")
        for t in prof["top_own"][:10]:
            print(f"  {t['pct']:5.1f} %  {t['function']}")
        print("  by thread: " + ", ".join(f"{t['thread']} {t['pct']:.0f} %" for t in prof["threads"][:6]))
    elif prof:
        print(f"\npy-spy: {prof.get('error')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 s CPU windows, 0.5 GB log, 20 s record")
    ap.add_argument("--only", default="abc", help="scenarios to run, e.g. c (default abc)")
    ap.add_argument("--skip", default="", help="comma list of: parse, attach, record")
    ap.add_argument("--profile", action="store_true", help="also py-spy scenario (c) (60 s at 250 Hz)")
    ap.add_argument("--presses", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each scenario this many times in a row (the GPU box's runs differ by up to 0.15 %%)")
    ap.add_argument("--starts", type=int, default=5,
                    help="first frames per scenario: this many starts, the last one measured on; the median is judged")
    ap.add_argument("--floor-starts", type=int, default=6,
                    help="starts each of a bare Textual app and of vtop, alternating, for the first-frame floor (0: skip)")
    ap.add_argument("--out", default=str(HERE / "results" / "latest.json"))
    a = ap.parse_args()
    warmup = 10.0
    window = 20.0 if a.quick else 60.0
    skip = set(filter(None, a.skip.split(",")))

    r: dict[str, Any] = {"quick": a.quick, "warmup_s": warmup, "window_s": window, "presses": a.presses,
                         "key": KEY, "targets": TARGETS, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    r["machine"] = machine_info()
    tmux = Tmux()
    try:
        r["tmux_floor"] = stats_ms(tmux_floor(tmux, a.presses))
        # One start before the measured ones: the first after a while also reads vtop and Textual from
        # disk (and may write .pyc files); the scenarios then start as a user's second start does.
        r["first_frame_prime_s"] = one_first_frame(
            tmux, "prime", vtop_cmd() + ["--no-gpu", "--interval", "1", "http://127.0.0.1:9"])
        if a.floor_starts:
            print("first frame: bare Textual app / vtop, alternating ...", file=sys.stderr, flush=True)
            r["first_frame_floor"] = first_frame_floor(tmux, a.floor_starts)
        r["scenarios"] = []
        for sc in SCENARIOS:
            if sc["id"] not in a.only:
                continue
            for k in range(max(1, a.repeat)):
                print(f"scenario {sc['label']} ...", file=sys.stderr, flush=True)
                res = run_scenario(tmux, sc, warmup, window, a.presses, a.starts)
                if a.repeat > 1:
                    res["label"] += f" #{k + 1}"
                r["scenarios"].append(res)
        if "record" not in skip:
            print("record ...", file=sys.stderr, flush=True)
            r["record"] = measure_record(tmux, warmup, window)
        if a.profile:
            print("py-spy of scenario (c) ...", file=sys.stderr, flush=True)
            (HERE / "results").mkdir(exist_ok=True)
            r["profile"] = pyspy_profile(tmux, 60.0, 250)
        r["tmux_resolution"] = tmux.polling_resolution()
    finally:
        tmux.close()
    if "parse" not in skip:
        print("parse ...", file=sys.stderr, flush=True)
        import parse_metrics

        r["parse"] = parse_metrics.summary(50 if a.quick else 200)
    if "attach" not in skip:
        print("attach ...", file=sys.stderr, flush=True)
        import log_attach

        r["attach"] = log_attach.attach_summary(0.5 if a.quick else 2.0, runs=5)
    r["machine"]["loadavg_end"] = loadavg()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1, default=str) + "\n")
    print_report(r)
    print(f"\nresults: {out}")
    return 1 if any(s.get("error") for s in r["scenarios"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
