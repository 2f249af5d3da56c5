"""Stand-in processes: a played trace's vLLM process tree, mirrored on this box.

:mod:`tests.corpus.serve_trace` plays a trace's ``/metrics``, ``/health`` and log; vtop also
reads the process table (``/proc``), which a trace can only describe (``procs.jsonl.gz``). A
doctor run against the play then saw no process for its server: no CPU readings, so a silent
startup stall could not be judged live as it is on a real box. :class:`ProcMirror` starts, for
each process of the recorded server's tree, a small stand-in process that vtop's discovery
takes for it, and keeps it doing what the recorded one did, second by second:

* the API server: ``PYTHON DIR/vllm serve MODEL ... --port PORT`` (the recorded arguments, the
  port the play serves), its stdout the played log file (as vLLM's, so vtop finds it is that
  log's writer); the others are the children of their recorded parent's stand-in, their
  command line the recorded process title (``VLLM::EngineCore``, ``VLLM::Worker``), as
  setproctitle leaves it;
* CPU: a process whose recorded CPU time did not grow over the last recorded second is
  stopped (SIGSTOP, as the recording's stops were); one whose did runs a loop that uses about
  that share of a core, capped at :data:`MAX_DUTY` (a recorded 100 % is mirrored as 5 %: only
  "moving" against "still" matters to vtop's rules, and the box is shared). A trace whose process
  rows carry their ``state`` (recorded from 2026-12-04 on) is mirrored by it: a process recorded in
  state ``T`` is stopped, a still one that was not sleeps (duty 0), as the recorded one did;
* no log (``log_path=None``): the API server's stand-in writes to a pipe no one reads, as vLLM's
  stdout under a supervisor (vtop then finds no log to follow);
* a process that appears in the recording is started then (by its parent's stand-in, so the
  tree is real); one that disappears is killed (with its children).

Not mirrored: pids (the log names the recorded ones), the processes' start times (a stand-in
starts when the play reaches it, or at the play's start for what ran before), their memory and
GPUs. Every stand-in dies with its parent (PR_SET_PDEATHSIG) and all are killed at
:meth:`ProcMirror.stop`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

#: the most of a core a stand-in uses while its recorded process was busy
MAX_DUTY = 0.05
#: a recorded process that used less than this share of a core over its last second is stopped
STILL_RATE = 0.002
#: the stand-in's loop period, seconds
PERIOD_S = 0.05

_STANDIN = r'''
import ctypes, os, signal, sys, time
D, ME = os.environ["VTOP_STANDIN_DIR"], os.environ["VTOP_STANDIN_ID"]
libc = ctypes.CDLL(None)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the parent
if os.getppid() != int(os.environ["VTOP_STANDIN_PARENT"]):
    sys.exit(0)  # the parent died before the line above
title = os.environ.get("VTOP_STANDIN_TITLE", "")
if title:
    libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME: the 15-char comm, as setproctitle sets it
with open(f"{D}/{ME}.pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(f"{D}/{ME}.pid.tmp", f"{D}/{ME}.pid")
duty, started, checked = 0.0, set(), 0.0
period = float(os.environ.get("VTOP_STANDIN_PERIOD", "0.05"))
while True:
    now = time.monotonic()
    if now - checked >= 0.2:
        checked = now
        try:
            with open(f"{D}/{ME}.duty") as f:
                duty = min(1.0, max(0.0, float(f.read() or 0)))
        except (OSError, ValueError):
            pass
        for name in os.listdir(D):
            if name.startswith(ME + ".spawn.") and name not in started:
                started.add(name)
                with open(f"{D}/{name}") as f:
                    kid_title = f.read().strip()
                kid = name.split(".spawn.", 1)[1]
                env = dict(os.environ, VTOP_STANDIN_ID=kid, VTOP_STANDIN_TITLE=kid_title,
                           VTOP_STANDIN_PARENT=str(os.getpid()))
                if os.fork() == 0:
                    os.execve(os.environ["VTOP_STANDIN_PY"], [kid_title, os.environ["VTOP_STANDIN_SCRIPT"]], env)
        with __import__("contextlib").suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
    end = time.monotonic() + duty * period
    while time.monotonic() < end:
        pass
    time.sleep(max(0.0, period - duty * period))
'''


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _port_of(cmdline: list[str]) -> str | None:
    for i, a in enumerate(cmdline):
        if a == "--port" and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if a.startswith("--port="):
            return a.split("=", 1)[1]
    return None


def _serve_args(cmdline: list[str]) -> list[str] | None:
    """The arguments from ``serve`` on, if this is a ``vllm serve`` command line."""
    for i, a in enumerate(cmdline[:4]):
        if a == "serve" and i > 0 and os.path.basename(cmdline[i - 1]) == "vllm":
            return list(cmdline[i:])
    return None


class ProcTimeline:
    """The recorded server's process tree at a trace second: {pid: (ppid, title, cmdline, cpu, t)}."""

    def __init__(self, trace: Path, origin_mono: float, port: str | None) -> None:
        self.rows = _rows(trace / "procs.jsonl.gz")
        self.offs = [float(r["mono"]) - origin_mono for r in self.rows]
        self.port = port

    def tree_at(self, off: float) -> dict[int, dict[str, Any]]:
        i = bisect_right(self.offs, off)
        if not i:
            return {}
        procs = {int(p["pid"]): p for p in self.rows[i - 1].get("procs") or []}
        roots = [pid for pid, p in procs.items() if _serve_args(list(p.get("cmdline") or [])) is not None
                 and (self.port is None or _port_of(list(p.get("cmdline") or [])) == self.port)]
        out: dict[int, dict[str, Any]] = {}
        todo = list(roots[:1])
        while todo:
            pid = todo.pop(0)
            out[pid] = procs[pid]
            todo += [k for k, p in procs.items() if int(p.get("ppid") or 0) == pid and k not in out]
        return out

    def rate(self, pid: int, off: float) -> float | None:
        """Share of a core the recorded process used over the last recorded second before ``off``
        (None: no CPU reading)."""
        i = bisect_right(self.offs, off)
        if i < 2:
            return None
        a, b = self.rows[i - 2], self.rows[i - 1]
        ca = next((p.get("cpu") for p in a.get("procs") or [] if int(p["pid"]) == pid), None)
        cb = next((p.get("cpu") for p in b.get("procs") or [] if int(p["pid"]) == pid), None)
        dt = float(b["mono"]) - float(a["mono"])
        if ca is None or cb is None or dt <= 0:
            return None
        return max(0.0, (float(cb) - float(ca)) / dt)


    def state(self, pid: int, off: float) -> str | None:
        """The recorded state letter of the process at ``off`` (None: the trace has none)."""
        i = bisect_right(self.offs, off)
        if not i:
            return None
        p = next((p for p in self.rows[i - 1].get("procs") or [] if int(p["pid"]) == pid), None)
        x = p.get("state") if p is not None else None
        return x if isinstance(x, str) and x else None


class ProcMirror:
    """The stand-ins of one play (see the module doc). :meth:`apply` at each tick of the play."""

    def __init__(self, trace: Path, origin_mono: float, recorded_port: str | None, port: int,
                 log_path: Path | None, python: str = sys.executable) -> None:
        self.timeline = ProcTimeline(trace, origin_mono, recorded_port)
        self.port = port
        self.log_path = log_path
        self.python = python
        self.dir = Path(tempfile.mkdtemp(prefix="standin-"))
        self.script = self.dir / "vllm"
        self.script.write_text(_STANDIN)
        self._root: subprocess.Popen[bytes] | None = None
        self._root_pid: int | None = None  # the recorded pid the root stands in for
        self._known: dict[int, int | None] = {}  # recorded pid -> stand-in pid (None: asked, not yet up)
        self._stopped: set[int] = set()
        self._duty: dict[int, float] = {}

    @property
    def available(self) -> bool:
        return bool(self.timeline.rows)

    def pids(self) -> dict[int, int]:
        """Recorded pid -> stand-in pid, of those up."""
        self._read_pids()
        return {k: v for k, v in self._known.items() if v is not None}

    def _read_pids(self) -> None:
        for rec, pid in list(self._known.items()):
            if pid is None:
                with contextlib.suppress(OSError, ValueError):
                    self._known[rec] = int((self.dir / f"p{rec}.pid").read_text())

    def _env(self, rec: int, title: str, parent: int) -> dict[str, str]:
        return dict(os.environ, VTOP_STANDIN_DIR=str(self.dir), VTOP_STANDIN_ID=f"p{rec}",
                    VTOP_STANDIN_TITLE=title, VTOP_STANDIN_PARENT=str(parent), VTOP_STANDIN_PY=self.python,
                    VTOP_STANDIN_SCRIPT=str(self.script), VTOP_STANDIN_PERIOD=str(PERIOD_S))

    def apply(self, off: float) -> None:
        tree = self.timeline.tree_at(off)
        root = next((pid for pid, p in tree.items() if _serve_args(list(p.get("cmdline") or [])) is not None), None)
        if root != self._root_pid:
            self._kill_all()
            if root is not None:
                self._start_root(root, tree[root])
        self._read_pids()
        for rec, p in tree.items():
            if rec in self._known:
                continue
            parent = int(p.get("ppid") or 0)
            if self._known.get(parent) is None:
                continue  # its parent's stand-in is not up yet: next tick
            title = " ".join(p.get("cmdline") or []).strip() or str(p.get("name") or "python3")
            (self.dir / f"p{parent}.spawn.p{rec}").write_text(title.split()[0] if "::" in title else "python3")
            self._known[rec] = None
        for rec in [r for r in self._known if r not in tree and r != self._root_pid]:
            pid = self._known.pop(rec)
            if pid is not None:
                self._signal(pid, signal.SIGCONT)
                self._signal(pid, signal.SIGKILL)
        # a stand-in still to start a child runs until it has (a stopped process cannot fork)
        waiting = {int(tree[r].get("ppid") or 0) for r, pid in self._known.items() if pid is None and r in tree}
        for rec, pid in self.pids().items():
            rate = self.timeline.rate(rec, off)
            if rec in waiting:
                rate = max(rate or 0.0, STILL_RATE)
            if rate is None:
                continue
            state = self.timeline.state(rec, off)
            if state is not None and state not in ("T", "t") and rate < STILL_RATE:
                rate = 0.0  # still, not stopped: it sleeps, as the recorded one did
            elif (state in ("T", "t") and rec not in waiting) or (state is None and rate < STILL_RATE):
                if rec not in self._stopped:
                    self._signal(pid, signal.SIGSTOP)
                    self._stopped.add(rec)
                continue
            if rec in self._stopped:
                self._signal(pid, signal.SIGCONT)
                self._stopped.discard(rec)
            duty = round(min(MAX_DUTY, rate), 3)
            if self._duty.get(rec) != duty:
                self._duty[rec] = duty
                tmp = self.dir / f"p{rec}.duty.tmp"
                tmp.write_text(str(duty))
                tmp.replace(self.dir / f"p{rec}.duty")

    def _start_root(self, rec: int, p: dict[str, Any]) -> None:
        args = _serve_args(list(p.get("cmdline") or [])) or ["serve"]
        args = list(args)
        for i, a in enumerate(args):
            if a == "--port" and i + 1 < len(args):
                args[i + 1] = str(self.port)
            elif a.startswith("--port="):
                args[i] = f"--port={self.port}"
        if self.log_path is None:  # no log for vtop: a pipe no one reads
            self._root = subprocess.Popen([self.python, str(self.script), *args], stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self._env(rec, "", os.getpid()))
        else:
            with open(self.log_path, "ab") as log:  # its stdout is the log, as vLLM's is
                self._root = subprocess.Popen([self.python, str(self.script), *args], stdout=log, stderr=log,
                                              stdin=subprocess.DEVNULL, env=self._env(rec, "", os.getpid()))
        self._root_pid = rec
        self._known[rec] = None

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)

    def _kill_all(self) -> None:
        self._read_pids()
        for pid in [p for p in self._known.values() if p is not None]:
            self._signal(pid, signal.SIGCONT)
            self._signal(pid, signal.SIGKILL)
        if self._root is not None:
            with contextlib.suppress(Exception):
                self._root.kill()
                self._root.wait(5)
        self._root, self._root_pid = None, None
        self._known.clear()
        self._stopped.clear()
        self._duty.clear()
        for f in self.dir.iterdir():
            if f.name != "vllm":
                with contextlib.suppress(OSError):
                    f.unlink()

    def stop(self) -> None:
        self._kill_all()
        # the grandchildren die with their parents (PR_SET_PDEATHSIG); give them a moment
        time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
