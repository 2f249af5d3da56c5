"""Run on the GPU machine: vtop's and nvitop's own cost, side by side, watching a busy real H200.

    python3 tools/device/h200_overhead.py OUTDIR [--window 60] [--warmup 10] [--interval 1]
    python3 tools/device/h200_overhead.py OUTDIR --dry-run     # rehearsal without a GPU

1. A GPU load starts in its own process: a torch bf16 8192x8192 matmul loop,
   for warm-up + window + 15 s (it prints the TFLOP/s it reached at the end).
2. Five seconds later vtop (``python3 -m vtop --interval 1 http://127.0.0.1:P``,
   P a port that refuses: no vLLM here, real NVML) and nvitop
   (``python3 -m nvitop --interval 1``: its default monitor mode) start at the
   same time, each in its own 120x40 pseudo-terminal: a tmux session when tmux
   is installed, else a pty (``pty.fork``, TIOCSWINSZ set before exec, a
   reader thread draining its output, as a terminal would).
3. After the warm-up, the CPU seconds (utime+stime from /proc, the process and
   its descendants, plus the children it reaped) of each are measured over the
   same window; peak RSS is VmHWM (the process; the sum over its tree too).

Intervals: vtop polls NVML, repaints and scrapes once per ``--interval``.
nvitop's ``--interval`` (default 2 s) is its process-panel update interval;
its device panel takes a snapshot every 0.5 s cached for 1 s (only an
interval under 1 s changes that) and its curses loop redraws every 0.2 s
when no key comes. Both are run with ``--interval 1``; the JSON says so.

If nvitop is not importable, or exits (no NVML in a dry run), the report says
so and vtop is still measured. ``--dry-run``: vtop gets ``--simulate-gpus 1``
and the load is a sleeping process instead of torch.

Writes OUTDIR/h200-overhead.json and prints a table with the ratio vtop/nvitop.
Needs vtop importable (PYTHONPATH=/tmp/vtop-site:<repo root>) and nvitop
installed (bash /tmp/vllm-gpu/add_wheels.sh .vllm-gpu/vtop-whl puts it in
/tmp/vtop-site).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

COLS, ROWS = 120, 40
CLK_TCK = os.sysconf("SC_CLK_TCK")

LOAD = r"""
import sys, time
seconds, dry = float(sys.argv[1]), sys.argv[2] == "dry"
if dry:
    print("load: dry run, sleeping", flush=True)
    time.sleep(seconds)
    print("load: done", flush=True)
    sys.exit(0)
import torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print(f"load: {torch.cuda.get_device_name(0)}, bf16 {n}x{n} matmul loop for {seconds:.0f} s", flush=True)
t0 = time.time(); it = 0
while time.time() - t0 < seconds:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    it += 20
dt = time.time() - t0
print(f"load: done, {it} matmuls in {dt:.1f} s = {2 * n**3 * it / dt / 1e12:.0f} TFLOP/s", flush=True)
"""


def pick_term() -> str:
    """xterm-256color where its terminfo exists (nvitop's curses needs one), else the best one that does."""
    for t in ("xterm-256color", "tmux-256color", "screen-256color", "xterm", "screen", "vt100"):
        r = subprocess.run([sys.executable, "-c", f"import curses; curses.setupterm({t!r}, 1)"], capture_output=True)
        if r.returncode == 0:
            return t
    return "xterm-256color"


TERM = "xterm-256color"


# ------------------------------------------------------------------ /proc
def _stat(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()


def _tree(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                kids.setdefault(int(_stat(int(d))[1]), []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [pid], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def tree_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` and its live descendants (utime+stime) plus what each reaped (cutime+cstime)."""
    total, ok = 0.0, False
    for p in _tree(pid):
        try:
            f = _stat(p)
        except OSError:
            continue
        ok = True
        total += sum(int(x) for x in f[11:15]) / CLK_TCK  # utime stime cutime cstime
    return total if ok else None


def vm(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def tree_hwm_kb(pid: int) -> int:
    return sum(vm(p, "VmHWM") or 0 for p in _tree(pid))


def alive(pid: int) -> bool:
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------- terminals
class Term:
    """One program in its own 120x40 terminal: tmux if installed, else a pty with a reader thread."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], use_tmux: bool) -> None:
        self.name = name
        self.argv = argv
        self.use_tmux = use_tmux
        self.socket = f"vtop-ovh-{os.getpid()}-{name}"  # a tmux server of its own: stop() kills it
        self.out = bytearray()
        self.fd: int | None = None
        self.exit_status: int | None = None
        env = dict(env, TERM=TERM, COLUMNS=str(COLS), LINES=str(ROWS))
        env.pop("TMUX", None)
        self.started = time.monotonic()
        if use_tmux:
            cmd = "exec " + " ".join(_q(a) for a in argv)
            tm = ["tmux", "-L", self.socket]
            # Server first (a placeholder session), so remain-on-exit holds before the program starts:
            # a program that dies at once leaves its last screen and exit status to read.
            subprocess.run(tm + ["-f", "/dev/null", "new-session", "-d", "-s", "keep", "-x", "20", "-y", "5", "exec cat"],
                           check=True, env=env)
            subprocess.run(tm + ["set-option", "-g", "remain-on-exit", "on"], check=True, env=env)
            self.started = time.monotonic()
            subprocess.run(tm + ["new-session", "-d", "-s", name, "-x", str(COLS), "-y", str(ROWS), cmd],
                           check=True, env=env)
            self.pid = int(subprocess.check_output(["tmux", "-L", self.socket, "list-panes", "-t", name, "-F",
                                                    "#{pane_pid}"], text=True, env=env).split()[0])
            self.env = env
        else:
            import fcntl
            import pty
            import struct
            import termios

            pid, fd = pty.fork()
            if pid == 0:  # child: the pty is our controlling terminal on 0/1/2
                try:
                    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
                    os.execvpe(argv[0], argv, env)
                finally:
                    os._exit(127)
            self.pid, self.fd = pid, fd
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
            self._reader = threading.Thread(target=self._drain, daemon=True)
            self._reader.start()

    def _drain(self) -> None:
        assert self.fd is not None
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the child side closed
                break
            if not chunk:
                break
            self.out += chunk
            if len(self.out) > 4 << 20:
                del self.out[: len(self.out) - (1 << 20)]

    def screen(self) -> str:
        """The screen (tmux) or the tail of the raw output with escape sequences stripped (pty)."""
        if self.use_tmux:
            r = subprocess.run(["tmux", "-L", self.socket, "capture-pane", "-p", "-t", self.name],
                               capture_output=True, text=True, env=self.env)
            return r.stdout
        raw = bytes(self.out[-200_000:]).decode("utf-8", "replace")
        return re.sub(r"\x1b(\[[0-9;?<>=$]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78NOMDEHc])", "", raw)

    def poll_exit(self) -> int | None:
        if self.exit_status is not None:
            return self.exit_status
        if self.use_tmux:
            r = subprocess.run(["tmux", "-L", self.socket, "display-message", "-p", "-t", self.name,
                                "#{pane_dead} #{pane_dead_status}"], capture_output=True, text=True, env=self.env)
            parts = r.stdout.split()
            if parts and parts[0] == "1":
                self.exit_status = int(parts[1]) if len(parts) > 1 and parts[1].lstrip("-").isdigit() else -1
            elif r.returncode != 0:
                self.exit_status = -1
        else:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_status = os.waitstatus_to_exitcode(status)
        return self.exit_status

    def stop(self) -> None:
        if self.poll_exit() is None:
            if self.use_tmux:
                subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", self.name, "q"], capture_output=True,
                               env=self.env)
            else:
                assert self.fd is not None
                try:
                    os.write(self.fd, b"q")
                except OSError:
                    pass
            end = time.monotonic() + 5
            while time.monotonic() < end and self.poll_exit() is None and alive(self.pid):
                time.sleep(0.1)
            if alive(self.pid):
                try:
                    os.kill(self.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                time.sleep(0.5)
                if alive(self.pid):
                    os.kill(self.pid, signal.SIGKILL)
        if self.use_tmux:
            subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, env=self.env)
            sock = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / self.socket
            sock.unlink(missing_ok=True)
        else:
            if self.exit_status is None:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    self.exit_status = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    pass
            if self.fd is not None:
                try:
                    os.close(self.fd)
                except OSError:
                    pass


def _q(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_./:=@%+-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def closed_port() -> tuple[int, socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1], s


# -------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?", default="/tmp/h200-overhead")
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds after the start before measuring")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: vtop --simulate-gpus 1, a sleeping load")
    ap.add_argument("--no-tmux", action="store_true", help="use the pty path even where tmux exists")
    a = ap.parse_args()
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    use_tmux = bool(shutil.which("tmux")) and not a.no_tmux
    global TERM
    TERM = pick_term()
    py = sys.executable
    res: dict[str, Any] = {
        "host": socket.gethostname(), "python": platform.python_version(), "dry_run": a.dry_run,
        "terminal": f"tmux {COLS}x{ROWS}" if use_tmux else f"pty {COLS}x{ROWS} (tmux absent)" if not a.no_tmux
        else f"pty {COLS}x{ROWS}",
        "window_s": a.window, "warmup_s": a.warmup, "interval_s": a.interval,
        "nproc": os.cpu_count(), "TERM": TERM,
    }
    try:
        res["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        res["gpu"] = None

    env = dict(os.environ)
    # The load runs with the image's own packages only (vtop's site must not shadow torch's).
    load_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    load_s = a.warmup + a.window + 15
    load = subprocess.Popen([py, "-c", LOAD, str(load_s), "dry" if a.dry_run else "gpu"], env=load_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    load_lines: list[str] = []

    def read_load() -> None:
        assert load.stdout is not None
        for line in load.stdout:
            load_lines.append(line)

    threading.Thread(target=read_load, daemon=True).start()

    port, sock = closed_port()
    vtop_argv = [py, "-m", "vtop", "--interval", f"{a.interval:g}", f"http://127.0.0.1:{port}"]
    if a.dry_run:
        vtop_argv += ["--simulate-gpus", "1"]
    nvitop_argv = [py, "-m", "nvitop", "--interval", f"{a.interval:g}"]
    try:
        import vtop

        res["vtop_version"] = vtop.__version__
    except Exception as e:  # noqa: BLE001
        print(f"vtop is not importable ({e}); set PYTHONPATH=/tmp/vtop-site:<repo root>", file=sys.stderr)
        load.kill()
        return 2
    spec = importlib.util.find_spec("nvitop")
    res["nvitop_found"] = spec is not None
    if spec is not None:
        try:
            res["nvitop_version"] = subprocess.run([py, "-m", "nvitop", "--version"], capture_output=True, text=True,
                                                   timeout=60, env=env).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    res["cmd"] = {"vtop": " ".join(vtop_argv[1:]), "nvitop": " ".join(nvitop_argv[1:]) if spec else None}
    res["intervals"] = {
        "vtop": f"NVML poll, repaint and scrape every {a.interval:g} s; process discovery every {max(5, 5 * a.interval):g} s",
        "nvitop": (f"--interval {a.interval:g}: process panel every {a.interval:g} s; device panel snapshots every "
                   f"{min(a.interval / 3, 1.0) if a.interval < 1 else 0.5:g} s (cached "
                   f"{a.interval if a.interval < 1 else 1.0:g} s); curses redraw every 0.2 s"),
    }

    # Let the load reach the GPU before the monitors start.
    t_load = time.monotonic()
    while time.monotonic() - t_load < (3 if a.dry_run else 60) and not any(ln.startswith("load:") for ln in load_lines):
        time.sleep(0.2)
    time.sleep(2)

    terms: dict[str, Term] = {}
    try:
        terms["vtop"] = Term("vtop", vtop_argv, env, use_tmux)
        if spec is not None:
            terms["nvitop"] = Term("nvitop", nvitop_argv, env, use_tmux)
        time.sleep(a.warmup)
        c0 = {k: tree_cpu(t.pid) for k, t in terms.items()}
        w0 = time.monotonic()
        time.sleep(a.window / 2)
        mid = {k: t.screen() for k, t in terms.items()}
        time.sleep(a.window / 2)
        c1 = {k: tree_cpu(t.pid) for k, t in terms.items()}
        wall = time.monotonic() - w0
        for k, t in terms.items():
            r: dict[str, Any] = {"pid": t.pid}
            st = t.poll_exit()
            if st is not None or c0[k] is None or c1[k] is None:
                r["error"] = ("exited" + ("" if st in (None, -1) else f" (status {st})")
                              + " before the end of the window")
                scr = t.screen().strip()
                r["output_tail"] = scr[-1500:]
            else:
                cpu = c1[k] - c0[k]  # type: ignore[operator]
                r.update({
                    "cpu_s": cpu, "cpu_s_per_min": cpu * 60 / wall, "cpu_pct_one_core": 100 * cpu / wall,
                    "peak_rss_mb": (vm(t.pid, "VmHWM") or 0) / 1024,
                    "peak_rss_tree_mb": tree_hwm_kb(t.pid) / 1024,
                    "rss_mb": (vm(t.pid, "VmRSS") or 0) / 1024,
                    "tree_pids": len(_tree(t.pid)),
                    "threads": vm(t.pid, "Threads"),
                })
            scr = mid.get(k, "")
            r["screen_mid"] = scr[-6000:]
            if k == "vtop":
                r["saw_gpu"] = bool(re.search(r"\d+ × ", scr))
            else:
                r["saw_gpu"] = "NVITOP" in scr.upper() and ("MiB" in scr or "GiB" in scr)
            res[k] = r
        res["window_measured_s"] = wall
    finally:
        for t in terms.values():
            t.stop()
        sock.close()
        try:
            load.wait(timeout=5 if a.dry_run else load_s + 30)
        except subprocess.TimeoutExpired:
            load.kill()
    res["load"] = [ln.rstrip() for ln in load_lines][-5:]
    for k, t in terms.items():
        res[k]["exit_status"] = t.exit_status
    if "nvitop" not in res:
        res["nvitop"] = {"error": "nvitop is not installed (bash /tmp/vllm-gpu/add_wheels.sh .vllm-gpu/vtop-whl, "
                                  "then PYTHONPATH=/tmp/vtop-site:...)"}

    v, n = res["vtop"], res["nvitop"]
    ratio: dict[str, float | None] = {}
    for key in ("cpu_s_per_min", "peak_rss_mb"):
        ratio[key] = v[key] / n[key] if key in v and key in n and n[key] else None
    res["ratio_vtop_over_nvitop"] = ratio
    (out / "h200-overhead.json").write_text(json.dumps(res, indent=1) + "\n")

    print(f"\n{res.get('gpu') or 'no GPU (dry run)'}; {res['terminal']}; {a.window:.0f} s window after {a.warmup:.0f} s; "
          f"both at --interval {a.interval:g}")
    print(f"load: {' | '.join(res['load'][-2:])}")
    hdr = f"{'':10}{'CPU s/min':>10}{'% core':>9}{'peak RSS MB':>13}{'(tree)':>9}  note"
    print(hdr)
    print("-" * len(hdr))
    for k in ("vtop", "nvitop"):
        r = res[k]
        if "cpu_s_per_min" in r:
            note = "" if r.get("saw_gpu") else "GPU not seen on its screen"
            print(f"{k:10}{r['cpu_s_per_min']:10.3f}{r['cpu_pct_one_core']:9.2f}{r['peak_rss_mb']:13.1f}"
                  f"{r['peak_rss_tree_mb']:9.1f}  {note}")
        else:
            tail = (r.get("output_tail") or "").strip().splitlines()[:1] or [""]
            print(f"{k:10}{'-':>10}{'-':>9}{'-':>13}{'-':>9}  {r['error']} {tail[0][:100]}")
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print(f"{'vtop/nvitop':10}{fmt(ratio['cpu_s_per_min']):>10}{'':9}{fmt(ratio['peak_rss_mb']):>13}")
    print(f"\nwritten: {out / 'h200-overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
