"""Two real vLLM servers on one GPU (an H200 or an H100), recorded by vtop itself (issue 39; run by
h200_two_servers.sh; session 25's run, on an H100, is tests/fixtures/h100-two-servers/).

On the GPU machine, after the shared recipe's install (``/tmp/site``, ``/tmp/tiny``), from the repo root::

    PYTHONPATH=/tmp/vtop-site:$PWD python3 -m tools.device.h200_two_servers --out /tmp/two

What it does, on one clock (``events.jsonl``: ``{"t", "ev", ...}``):

1. starts ``vtop --once --json --window W --record rec.jsonl.gz http://127.0.0.1:8000 http://127.0.0.1:8001``
   first (no ``--log``: vtop finds the first server's log itself), so the starts are recorded;
2. starts ``vllm serve /tmp/tiny --port 8000 --gpu-memory-utilization 0.4`` under setsid, waits for ``/health``,
   then the same on 8001 (one after the other: two profiling runs at once would each count the other's
   memory as taken);
3. both idle (``--idle-s``);
4. load on 8000 only: completions at concurrency 32, max_tokens 128, for ``--load-s``;
5. at once, for ``--incident-s`` (default: the rest of ``--budget-s``): on 8000 a runaway (one streamed chat request with no max_tokens, ignore_eos)
   among short requests; on 8001 its EngineCore SIGSTOPped while a few requests wait on it; then SIGCONT;
6. stops both servers (SIGINT, then SIGKILL of the group after 20 s), waits for vtop's report.

Writes into ``--out``: ``rec.jsonl.gz`` (vtop's recording), ``report.json`` (its ``--once --json``),
``vtop.log``, ``serve-8000.log``, ``serve-8001.log``, ``events.jsonl``, ``nvidia-smi.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PORTS = (8000, 8001)
VLLM = os.environ.get("VTOP_H200_VLLM_BIN", "/tmp/site/bin/vllm")
MODEL = os.environ.get("VTOP_H200_MODEL", "/tmp/tiny")


class Run:
    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self._ev = open(out / "events.jsonl", "a")  # noqa: SIM115 - for the whole run
        self._lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def ev(self, name: str, **kw: Any) -> None:
        line = json.dumps({"t": time.time(), "ev": name, **kw})
        with self._lock:
            self._ev.write(line + "\n")
            self._ev.flush()
        print(line, flush=True)

    def serve(self, port: int, extra: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": "/tmp/site", "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_USE_FLASHINFER_SAMPLER": "0"}  # as serve.sh (its comments say why)
        cmd = [VLLM, "serve", MODEL, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "32768",
               "--gpu-memory-utilization", "0.4", *extra]
        log = open(self.out / f"serve-{port}.log", "wb")  # noqa: SIM115 - the server's
        self.procs[port] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
        self.ev("vllm_launch", port=port, pid=self.procs[port].pid, cmd=cmd)

    def wait_health(self, port: int, limit_s: float) -> float | None:
        t0 = time.time()
        while time.time() - t0 < limit_s:
            if self.procs[port].poll() is not None:
                self.ev("vllm_exited", port=port, rc=self.procs[port].returncode)
                return None
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        self.ev("health_ready", port=port, after_s=round(time.time() - t0, 1))
                        return time.time() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        return None

    def engine_pid(self, port: int) -> int | None:
        """The EngineCore under the API server (its title ``VLLM::EngineCore``)."""
        api = self.procs[port].pid
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                ppid = int(stat[stat.rfind(")") + 2:].split()[1])
                cmd = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == api and cmd.startswith("VLLM::EngineCore"):
                return int(d.name)
        return None

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGINT)
        t0 = time.time()
        for port, p in self.procs.items():
            try:
                p.wait(timeout=max(1.0, 20 - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
            self.ev("vllm_stopped", port=port, rc=p.returncode)


def post(port: int, path: str, body: dict[str, Any], timeout: float) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return 0


def load(port: int, seconds: float, concurrency: int, max_tokens: int, run: Run, name: str) -> None:
    end = time.time() + seconds
    counts = {"ok": 0, "err": 0}

    def worker(i: int) -> None:
        n = 0
        while time.time() < end:
            n += 1
            code = post(port, "/v1/completions", {"model": MODEL, "prompt": f"worker {i} request {n} " * 20,
                                                  "max_tokens": max_tokens, "ignore_eos": True}, 120)
            counts["ok" if code == 200 else "err"] += 1

    run.ev(f"{name}_begin", port=port, concurrency=concurrency, max_tokens=max_tokens, seconds=seconds)
    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=seconds + 130)
    run.ev(f"{name}_end", port=port, **counts)


def runaway(port: int, seconds: float, run: Run) -> None:
    """One streamed chat request with no max_tokens, closed after ``seconds`` (vLLM aborts it)."""
    body = json.dumps({"model": MODEL, "stream": True, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "Tell me a very long story."}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    run.ev("runaway_begin", port=port)
    chunks, end = 0, time.time() + seconds
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            for line in r:
                if line.startswith(b"data: "):
                    chunks += 1
                if time.time() > end or line.strip() == b"data: [DONE]":
                    break
    except (urllib.error.URLError, OSError) as e:
        run.ev("runaway_error", port=port, error=str(e))
    run.ev("runaway_end", port=port, chunks=chunks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/two")
    ap.add_argument("--idle-s", type=float, default=25)
    ap.add_argument("--load-s", type=float, default=40)
    ap.add_argument("--incident-s", type=float, default=None,
                    help="default: what is left of the budget (vtop's window ends with it)")
    ap.add_argument("--start-limit-s", type=float, default=200)
    ap.add_argument("--budget-s", type=float, default=420, help="end everything by then (from this start)")
    a = ap.parse_args(argv)
    t_start = time.time()
    run = Run(Path(a.out))
    window = int(a.budget_s - 8)
    vtop = subprocess.Popen(
        [sys.executable, "-m", "vtop", "--once", "--json", "--window", f"{window}s", "--interval", "1",
         "--record", str(run.out / "rec.jsonl.gz"), *(f"http://127.0.0.1:{p}" for p in PORTS)],
        stdout=open(run.out / "report.json", "wb"), stderr=open(run.out / "vtop.log", "wb"),  # noqa: SIM115
        start_new_session=True)
    run.ev("vtop_started", pid=vtop.pid, window_s=window)
    time.sleep(3)
    try:
        for port in PORTS:
            run.serve(port, [])
            if run.wait_health(port, a.start_limit_s) is None:
                run.ev("abandoned", why=f"{port} never became healthy")
                return 1
        run.ev("engines", pids={str(p): run.engine_pid(p) for p in PORTS})
        with open(run.out / "nvidia-smi.txt", "w") as f:
            try:
                subprocess.run(["nvidia-smi"], stdout=f, stderr=subprocess.STDOUT, timeout=30, check=False)
            except (OSError, subprocess.SubprocessError) as e:
                f.write(f"nvidia-smi: {e}\n")
        run.ev("idle_begin")
        time.sleep(a.idle_s)
        run.ev("idle_end")
        load(8000, a.load_s, 32, 128, run, "load")
        time.sleep(5)
        left = a.budget_s - (time.time() - t_start) - 45  # the stop, and vtop's last reads
        incident_s = max(30.0, left if a.incident_s is None else min(a.incident_s, left))
        eng = run.engine_pid(8001)
        threads = [threading.Thread(target=runaway, args=(8000, incident_s, run), daemon=True),
                   threading.Thread(target=load, args=(8000, incident_s, 2, 32, run, "short"), daemon=True)]
        for t in threads:
            t.start()
        if eng is not None:
            os.kill(eng, signal.SIGSTOP)
            run.ev("sigstop", port=8001, pid=eng)
        waiting = threading.Thread(target=load, args=(8001, min(20.0, incident_s), 4, 16, run, "stalled_requests"),
                                   daemon=True)
        waiting.start()
        time.sleep(incident_s)
        if eng is not None:
            os.kill(eng, signal.SIGCONT)
            run.ev("sigcont", port=8001, pid=eng)
        for t in [*threads, waiting]:
            t.join(timeout=60)
        time.sleep(5)
    finally:
        run.stop_all()
        try:
            vtop.wait(timeout=max(5.0, a.budget_s - (time.time() - t_start)))
        except subprocess.TimeoutExpired:
            vtop.terminate()
            vtop.wait(timeout=10)
        run.ev("vtop_done", rc=vtop.returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
