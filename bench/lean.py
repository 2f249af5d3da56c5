"""Issue 43's table in one command: vtop beside nvitop, live and one-shot.

    python bench/lean.py                                   # this tree's vtop (and nvitop if importable)
    python bench/lean.py --code before=/tmp/old --code after=. --rounds 2 --out /tmp/lean.json
    python bench/lean.py --gpu fake --server --window 20   # a CPU box: vtop's fake NVML, a replayed vLLM

Figures, each per vtop code (``--code NAME=DIR``: DIR holds the ``vtop`` package, put first on
``PYTHONPATH``; default: the vtop this Python imports) and for nvitop where it is importable:

* **live CPU, % of one core**: ``vtop --interval 1`` (nvitop: ``nvitop --interval 1``, its monitor mode)
  in its own 120x40 pseudo-terminal; utime+stime (and its reaped children's) from ``/proc/PID/stat`` over
  ``--window`` seconds after ``--warmup``. Every monitor of a round runs at the same time, watching the same GPUs under the same load.
* **live peak RSS**: ``VmHWM`` of ``/proc/PID/status`` at the end of the window; beside it where the
  resident memory is (``/proc/PID/smaps`` per mapping) and the window's CPU per thread.
* ``--floor``: the smallest Textual app that redraws a line every second (``bench/textual_floor.py --tick``),
  live beside them: the share of vtop's memory and CPU that any Textual monitor pays; on real GPUs also the
  same app reading GPU 0 through NVML every second (``--tick --nvml``): what any Textual GPU monitor pays.
* **``--once --json`` median**: ``vtop --once --json`` wall time, spawn to exit (``nvitop --once``
  beside it), ``--once-runs`` each, the programs taking turns run by run.
* **Python's start alone**: ``python -c pass``, taking turns with the one-shots.

``--gpu real`` (default when NVML answers): the box's GPUs; ``fake``: vtop's ``--simulate-gpus 1``, each
call spinning the CPU time the real one takes on the H200 (nvitop has none: left out); ``none``: ``--no-gpu``. ``--load matmul`` (default when torch sees a
GPU): a bf16 matmul loop on GPU 0 in a child process for the whole run, as in the issue's table.
``--server``: vtop also watches a replayed vLLM (bench/harness.py, the recorded H200 ``/metrics``).
Rounds alternate the order of the codes, so what else the box does falls on each alike. Each
process runs with its working directory in /tmp (``python -m`` puts the working directory first
on ``sys.path``: a run from a checkout would import that checkout's vtop whatever ``PYTHONPATH`` says).
Needs only the standard library (torch for ``--load matmul``).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")

MATMUL = """
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
while True:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    time.sleep(0.05)
"""


class Term:
    """A program in its own 120x40 pseudo-terminal; its output is read and dropped."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd="/tmp",
                                     start_new_session=True)
        os.close(slave)
        self.master = master
        self.tail = b""
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.tail = (self.tail + data)[-4096:]

    def cpu_s(self) -> float | None:
        try:
            f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return sum(int(x) for x in f[11:15]) / TICK  # utime stime, and what it reaped: cutime cstime

    def hwm_mb(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def rss_by_mapping(self, top: int = 8) -> dict[str, float] | None:
        """Where the resident memory is now (MB): ``/proc/PID/smaps`` summed per mapping, the anonymous
        memory (``[anon]``, ``[heap]``: Python's objects and malloc's arenas) apart from each shared
        library, the largest ``top`` and the rest."""
        try:
            text = Path(f"/proc/{self.proc.pid}/smaps").read_text()
        except OSError:
            return None
        kb: dict[str, int] = {}
        name = "[anon]"
        for line in text.splitlines():
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                name = parts[5].rsplit("/", 1)[-1] if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Rss:":
                kb[name] = kb.get(name, 0) + int(parts[1])
        ranked = sorted(kb.items(), key=lambda kv: -kv[1])
        out = {k: round(v / 1024, 2) for k, v in ranked[:top]}
        out["(the rest)"] = round(sum(v for _, v in ranked[top:]) / 1024, 2)
        return out

    def cpu_by_thread(self) -> dict[str, float]:
        """CPU seconds so far per thread, from ``schedstat`` (nanoseconds; ``stat``'s 10 ms clock ticks were
        0.25 ms a second over a 40 s window, as large as the figures told apart), read by
        :func:`harness.thread_cpu_ns`; a second thread of one name is ``NAME#2``, in the order of their ids."""
        from harness import thread_cpu_ns

        out: dict[str, float] = {}
        try:
            threads = thread_cpu_ns(self.proc.pid)
        except OSError:  # the process is gone
            return out
        for _tid, (name, ns) in sorted(threads.items()):
            key, n = name, 1
            while key in out:
                n += 1
                key = f"{name}#{n}"
            out[key] = ns / 1e9
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.master)


_TERM: list[str] = []


def pick_term() -> str:
    """xterm-256color where its terminfo exists (nvitop's curses needs one), else the best one that does."""
    if not _TERM:
        for t in ("xterm-256color", "tmux-256color", "screen-256color", "xterm", "screen", "vt100"):
            r = subprocess.run([sys.executable, "-c", f"import curses; curses.setupterm({t!r}, 1)"],
                               capture_output=True)
            if r.returncode == 0:
                _TERM.append(t)
                break
        else:
            _TERM.append("xterm-256color")
    return _TERM[0]


def env_for(code: str | None) -> dict[str, str]:
    """The environment of one program: bytecode caches on (as an installed vtop has them), a terminal
    type curses knows, and ``code`` first on ``PYTHONPATH`` (before what it held: carried dependencies)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["TERM"] = pick_term()
    if code:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(code).resolve()), os.environ.get("PYTHONPATH")) if p)
    return env


def nvml_ok() -> bool:
    try:
        import pynvml  # type: ignore[import-untyped]

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # noqa: BLE001 - no NVML here
        return False


def torch_gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    r = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                       capture_output=True, timeout=120)
    return r.returncode == 0


def vtop_version(code: str | None) -> str:
    r = subprocess.run([sys.executable, "-c", "import vtop; print(vtop.__version__, vtop.__file__)"],
                       capture_output=True, text=True, env=env_for(code), cwd="/tmp", timeout=60)
    return r.stdout.strip() or r.stderr.strip()[-200:]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, float]:
    """Wall seconds from spawn to exit, the exit status, and the CPU seconds it used (user + system,
    its children's included: on a busy box the CPU time moves less than the wall time)."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=env, cwd="/tmp")
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, p.returncode, ru.ru_utime + ru.ru_stime


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="a vtop to measure: DIR holds its vtop package (repeat; default: the installed vtop)")
    ap.add_argument("--gpu", choices=("auto", "real", "fake", "none"), default="auto")
    ap.add_argument("--load", choices=("auto", "matmul", "none"), default="auto")
    ap.add_argument("--server", action="store_true", help="vtop also watches a replayed vLLM /metrics")
    ap.add_argument("--window", type=float, default=60.0, help="live CPU window, seconds (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1, help="live rounds, the codes' order reversed every other")
    ap.add_argument("--once-runs", type=int, default=8, help="one-shots of each program (default 8)")
    ap.add_argument("--no-nvitop", action="store_true")
    ap.add_argument("--floor", action="store_true",
                    help="also run the Textual floor (bench/textual_floor.py --tick) live beside them: what any "
                         "Textual monitor pays")
    ap.add_argument("--out", help="also write the figures as JSON")
    a = ap.parse_args()

    codes: list[tuple[str, str | None]] = []
    for c in a.code:
        name, _, d = c.partition("=")
        if not d or not (Path(d) / "vtop" / "__init__.py").exists():
            ap.error(f"--code {c}: want NAME=DIR with DIR/vtop/__init__.py")
        codes.append((name, d))
    if not codes:
        codes = [("vtop", None)]
    gpu = a.gpu if a.gpu != "auto" else ("real" if nvml_ok() else "fake")
    load = a.load if a.load != "auto" else ("matmul" if gpu == "real" and torch_gpu() else "none")
    nvitop = (not a.no_nvitop and gpu == "real" and importlib.util.find_spec("nvitop") is not None)
    py = sys.executable
    gpu_args = {"real": [], "fake": ["--simulate-gpus", "1"], "none": ["--no-gpu"]}[gpu]
    once_gpu = gpu_args
    if gpu == "fake":  # each simulated NVML call spins the CPU time the real one takes on the H200
        os.environ["VTOP_SIMULATED_NVML_COST"] = "h200"

    res: dict[str, Any] = {
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(), "gpu": gpu,
        "load": load, "server": a.server, "window_s": a.window, "warmup_s": a.warmup,
        "codes": {n: {"dir": d, "version": vtop_version(d)} for n, d in codes},
        "nvitop": None,
    }
    if nvitop:
        r = subprocess.run([py, "-m", "nvitop", "--version"], capture_output=True, text=True, cwd="/tmp")
        res["nvitop"] = {"version": r.stdout.strip()}
    print(f"# lean bench: gpu {gpu}, load {load}, server {a.server}, window {a.window:g} s x {a.rounds}, "
          f"one-shots {a.once_runs}; nvitop {res['nvitop']['version'] if nvitop else 'not measured'}", flush=True)

    # one start of each program first, not counted: it writes the bytecode caches a user's second start has
    for _name, d in codes:
        timed([py, "-m", "vtop", "--once", "--json", *once_gpu], env_for(d))
    if nvitop:
        timed([py, "-m", "nvitop", "--once"], env_for(None))

    load_proc = None
    server = None
    urls: list[str] = []
    if load == "matmul":
        load_proc = subprocess.Popen([py, "-c", MATMUL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)
    if a.server:
        sys.path.insert(0, str(HERE))
        from harness import ServerProcess

        server = ServerProcess(1)
        urls = list(server.urls)
    live: dict[str, list[dict[str, Any]]] = {n: [] for n, _ in codes}
    if nvitop:
        live["nvitop"] = []
    if a.floor:
        live["textual floor"] = []
        if gpu == "real":
            live["textual floor + NVML"] = []
    try:
        for rnd in range(a.rounds):
            order = codes if rnd % 2 == 0 else list(reversed(codes))
            terms: dict[str, Term] = {}
            for name, d in order:
                terms[name] = Term([py, "-m", "vtop", "--interval", "1", *gpu_args, *urls], env_for(d))
            if nvitop:
                terms["nvitop"] = Term([py, "-m", "nvitop", "--interval", "1"], env_for(None))
            if a.floor:
                terms["textual floor"] = Term([py, str(HERE / "textual_floor.py"), "--tick"], env_for(None))
                if gpu == "real":
                    terms["textual floor + NVML"] = Term([py, str(HERE / "textual_floor.py"), "--tick", "--nvml"],
                                                         env_for(None))
            time.sleep(a.warmup)
            c0 = {k: t.cpu_s() for k, t in terms.items()}
            th0 = {k: t.cpu_by_thread() for k, t in terms.items()}
            t0 = time.monotonic()
            time.sleep(a.window)
            el = time.monotonic() - t0
            for k, t in terms.items():
                c1 = t.cpu_s()
                alive = t.proc.poll() is None
                c = c0[k]
                row = {"cpu_pct": None if c is None or c1 is None else round(100 * (c1 - c) / el, 3),
                       "peak_rss_mb": t.hwm_mb(), "alive": alive,
                       # where the memory and the CPU go (ms of CPU a second, per thread name)
                       "rss_mb_by_mapping": t.rss_by_mapping(),
                       "cpu_ms_per_s_by_thread": {n: round(1000 * (s - th0[k].get(n, 0.0)) / el, 2)
                                                  for n, s in sorted(t.cpu_by_thread().items())
                                                  if s - th0[k].get(n, 0.0) > 0}}
                if not alive:
                    row["exit"] = t.proc.returncode
                    row["tail"] = t.tail.decode(errors="replace")[-300:]
                live[k].append(row)
                print(f"round {rnd + 1} live {k:>8}: CPU {row['cpu_pct']} % of a core, peak RSS "
                      f"{row['peak_rss_mb'] and round(row['peak_rss_mb'], 1)} MB{'' if alive else ' (EXITED)'}",
                      flush=True)
                print(f"    RSS by mapping (MB): {row['rss_mb_by_mapping']}", flush=True)
                print(f"    CPU by thread (ms/s): {row['cpu_ms_per_s_by_thread']}", flush=True)
            for t in terms.values():
                t.stop()

        once: dict[str, list[float]] = {n: [] for n, _ in codes}
        once_cpu: dict[str, list[float]] = {n: [] for n, _ in codes}
        once_rc: dict[str, set[int]] = {n: set() for n, _ in codes}
        start: list[float] = []
        start_cpu: list[float] = []
        if nvitop:
            once["nvitop"], once_cpu["nvitop"], once_rc["nvitop"] = [], [], set()
        for i in range(a.once_runs):
            cases: list[tuple[str, list[str], dict[str, str]]] = [
                (n, [py, "-m", "vtop", "--once", "--json", *once_gpu, *urls], env_for(d)) for n, d in codes]
            if nvitop:
                cases.append(("nvitop", [py, "-m", "nvitop", "--once"], env_for(None)))
            cases.append(("python -c pass", [py, "-c", "pass"], env_for(None)))
            if i % 2:
                cases.reverse()
            for name, argv, env in cases:
                s, rc, cpu = timed(argv, env)
                if name == "python -c pass":
                    start.append(s)
                    start_cpu.append(cpu)
                else:
                    once[name].append(s)
                    once_cpu[name].append(cpu)
                    once_rc[name].add(rc)
    finally:
        if server is not None:
            server.close()
        if load_proc is not None:
            load_proc.kill()
            load_proc.wait()

    res["live"] = live
    res["once_s"] = {k: {"median": med(v), "runs": v, "cpu_median": med(once_cpu[k]), "cpu_runs": once_cpu[k],
                         "exit": sorted(once_rc[k])} for k, v in once.items()}
    res["python_start_s"] = {"median": med(start), "runs": start, "cpu_median": med(start_cpu)}
    names = [n for n, _ in codes] + (["nvitop"] if nvitop else [])

    def live_med(k: str, f: str) -> float | None:
        return med([r[f] for r in live[k] if r[f] is not None])

    def fmt(v: float | None, unit: str, nd: int) -> str:
        return "-" if v is None else f"{v:.{nd}f}{unit}"

    print()
    print(f"| | {' | '.join(names)} |" + (" vtop/nvitop |" if nvitop else ""))
    print("|---" * (len(names) + 1 + (1 if nvitop else 0)) + "|")
    rows = [("live CPU, % of one core", lambda k: live_med(k, "cpu_pct"), " %", 2),
            ("live peak RSS", lambda k: live_med(k, "peak_rss_mb"), " MB", 1),
            ("`--once --json` median" + (" (nvitop: `--once`)" if nvitop else ""),
             lambda k: res["once_s"][k]["median"], " s", 3),
            ("`--once --json` CPU time, median", lambda k: res["once_s"][k]["cpu_median"], " s", 3)]
    for label, get, unit, nd in rows:
        vals = [get(k) for k in names]
        line = f"| {label} | " + " | ".join(fmt(v, unit, nd) for v in vals) + " |"
        if nvitop:
            nv = vals[-1]
            line += " " + ", ".join(f"{n} {v / nv:.2f}x" if v is not None and nv else f"{n} -"
                                    for n, v in zip(names[:-1], vals[:-1])) + " |"
        print(line)
    print(f"| Python's start alone | {fmt(res['python_start_s']['median'], ' s', 3)} "
          f"(CPU {fmt(res['python_start_s']['cpu_median'], ' s', 3)}) |")
    if a.floor:
        print(f"| the Textual floor, live (bench/textual_floor.py --tick) | CPU "
              f"{fmt(live_med('textual floor', 'cpu_pct'), ' %', 2)}, peak RSS "
              f"{fmt(live_med('textual floor', 'peak_rss_mb'), ' MB', 1)} |")
        if "textual floor + NVML" in live:
            print(f"| the Textual floor reading NVML (--tick --nvml) | CPU "
                  f"{fmt(live_med('textual floor + NVML', 'cpu_pct'), ' %', 2)}, peak RSS "
                  f"{fmt(live_med('textual floor + NVML', 'peak_rss_mb'), ' MB', 1)} |")
    for k in names:
        if once_rc[k] - {0, 1, 2}:
            print(f"note: {k} one-shot exit codes {sorted(once_rc[k])}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
