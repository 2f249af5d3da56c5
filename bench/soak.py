"""Does vtop's memory stay flat over a long watch? (issue #25 item 5)

    .venv/bin/python bench/soak.py                 # 30 min: 8 simulated GPUs + 4 servers at --interval 0.25
    .venv/bin/python bench/soak.py --minutes 8     # a shorter run (a slope shows in 8-10 min)
    .venv/bin/python bench/soak.py --big-body      # only the big-body cases (~3 min)
    .venv/bin/python bench/soak.py --trace /tmp/t  # vtop under tracemalloc (bench/soak_trace.py): what grows
    .venv/bin/python bench/soak_fast.py            # its time-compressed twin: 30 min on a fake clock in ~6 min

**The soak.** vtop as a user starts it (the venv's ``vtop``) in a 120x40 tmux
pane, as bench/run.py does: ``--simulate-gpus 8`` (the fake NVML, each call
spinning what it costs on the H200) and four replayed H200 vLLM servers
(bench/harness.py: the recorded ``/metrics`` timeline, looping, counters
growing), ``--interval 0.25`` (the fastest vtop allows: four scrapes a second
per server, 16 a second in all). Every 10 s (``--sample-s``) it reads vtop's
VmRSS and VmHWM from /proc/PID/status and its CPU time from /proc/PID/stat,
and prints a line a minute. The verdict: the largest RSS after minute 5
(``--settle-min``; the 5-minute sparkline history is full by then) against
the RSS at minute 5, PASS within 10 %.

**The big bodies** (``--big-body``; the soak runs them too, after, unless
``--no-big-body``). A server whose ``/metrics`` answers 64 MiB (``--big-mib``) of
Prometheus text, once close-delimited (no Content-Length, ``Connection:
close``: the body ends when the server closes) and once with its
Content-Length; ``/health``, ``/v1/models`` and ``/version`` answer as vLLM.
vtop (no GPUs, ``--interval 0.25``) watches it for 45 s (``--big-s``); the
result is its peak RSS (VmHWM) and what the card says of the 16 MiB limit. The
same vtop against one replayed server is the baseline. Target: under 150 MB.

Results go to bench/results/soak-<UTC time>.json (every sample).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import ServerProcess, Tmux, cpu_seconds, machine_info, vm_kb, vtop_cmd  # noqa: E402

RSS_TOLERANCE = 0.10
BIG_TARGET_MB = 150.0
MIB = 1024 * 1024


# ------------------------------------------------------------- the big server
def _big_body_chunk() -> bytes:
    """1 MiB of Prometheus text vLLM-shaped enough that a reader would parse it all."""
    lines = []
    i = 0
    size = 0
    while size < MIB:
        ln = f'vllm:num_requests_running{{engine="0",model_name="big",pad="{i:08d}"}} 1.0\n'
        lines.append(ln)
        size += len(ln)
        i += 1
    return "".join(lines).encode()[:MIB]


def big_serve(mib: int) -> None:
    """Two servers in this process: /metrics sends ``mib`` MiB close-delimited on the
    first, with Content-Length on the second. Prints their URLs as a JSON list; ends
    when stdin closes."""
    head = (b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            b"# TYPE vllm:num_requests_running gauge\n")
    chunk = _big_body_chunk()
    total = mib * MIB
    small = {
        "/health": (b"", "application/json"),
        "/version": (b'{"version":"0.26.0"}', "application/json"),
        "/v1/models": (json.dumps({"object": "list", "data": [{"id": "big", "object": "model",
                                                               "max_model_len": 32768}]}).encode(),
                       "application/json"),
    }

    def handle(conn: socket.socket, with_length: bool) -> None:
        try:
            conn.settimeout(30)
            req = b""
            while b"\r\n\r\n" not in req:
                got = conn.recv(4096)
                if not got:
                    return
                req += got
            path = req.split(b" ", 2)[1].decode("latin-1").split("?", 1)[0]
            if path.rstrip("/") == "/metrics":
                hdr = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"
                hdr += f"content-length: {total}\r\n".encode() if with_length else b""
                conn.sendall(hdr + b"connection: close\r\n\r\n" + head)
                sent = len(head)
                while sent < total:
                    piece = chunk[: total - sent]
                    conn.sendall(piece)
                    sent += len(piece)
            else:
                body, ctype = small.get(path, (b'{"detail":"Not Found"}', "application/json"))
                code = b"200 OK" if path in small else b"404 Not Found"
                conn.sendall(b"HTTP/1.1 " + code + f"\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
                             "connection: close\r\n\r\n".encode() + body)
        except OSError:
            pass  # vtop hung up (it stops reading at its limit): that is the point
        finally:
            conn.close()

    def accept_loop(srv: socket.socket, with_length: bool) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn, with_length), daemon=True).start()

    urls = []
    for with_length in (False, True):
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        threading.Thread(target=accept_loop, args=(srv, with_length), daemon=True).start()
        urls.append(f"http://127.0.0.1:{srv.getsockname()[1]}")
    print(json.dumps(urls), flush=True)
    sys.stdin.read()


class BigServer:
    def __init__(self, mib: int) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_bigserve", str(mib)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.close_url, self.length_url = json.loads(self.proc.stdout.readline())

    def __enter__(self) -> BigServer:
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------ helpers
def status_line(tmux: Tmux, name: str) -> str:
    s = tmux.capture(name)
    return s.splitlines()[0] if s else ""


def rss_mb(pid: int) -> float:
    return vm_kb(pid, "VmRSS") / 1024


def hwm_mb(pid: int) -> float:
    return vm_kb(pid, "VmHWM") / 1024


def at_minute(samples: list[dict[str, Any]], minute: float) -> dict[str, Any] | None:
    """The sample nearest ``minute`` (None when the run did not get there)."""
    if not samples or samples[-1]["t_s"] < minute * 60 - 15:
        return None
    return min(samples, key=lambda s: abs(s["t_s"] - minute * 60))


def verdict(samples: list[dict[str, Any]], settle_min: float) -> dict[str, Any]:
    base = at_minute(samples, settle_min)
    after = [s for s in samples if s["t_s"] >= settle_min * 60]
    if base is None or len(after) < 2:
        return {"settle_min": settle_min, "judged": False, "why": "the run did not last past the settle time"}
    peak = max(after, key=lambda s: s["rss_mb"])
    growth = peak["rss_mb"] / base["rss_mb"] - 1
    last = samples[-1]
    # the slope after settling (least squares, MB an hour), for reading a short run
    xs = [s["t_s"] / 3600 for s in after]
    ys = [s["rss_mb"] for s in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {
        "settle_min": settle_min,
        "judged": True,
        "rss_at_settle_mb": base["rss_mb"],
        "max_rss_after_mb": peak["rss_mb"],
        "max_at_min": round(peak["t_s"] / 60, 1),
        "last_rss_mb": last["rss_mb"],
        "growth_pct": round(100 * growth, 1),
        "slope_mb_per_h": round(slope, 2),
        "pass": growth <= RSS_TOLERANCE,
    }


# --------------------------------------------------------------------- soak
def soak(args: argparse.Namespace, tmux: Tmux) -> dict[str, Any]:
    with ServerProcess(args.servers, kind=args.fake) as sp:
        argv = sp.urls + ["--interval", str(args.interval), "--simulate-gpus", str(args.gpus)]
        if args.history:
            argv += ["--history", args.history]
        env: dict[str, str] = {}
        if args.trace:
            argv = [sys.executable, str(HERE / "soak_trace.py"), str(Path(args.trace).resolve()), *argv]
            env["VTOP_SOAK_TRACE_S"] = str(args.trace_s)
            env["VTOP_SOAK_TRACE_FRAMES"] = str(args.trace_frames)
        else:
            argv = vtop_cmd() + argv
        pid, t0 = tmux.new("soak", argv, env)
        want = f"vLLM: {args.servers} up" if args.servers > 1 else "vLLM: up"
        took, screen = tmux.wait_for("soak", lambda s: want in (s.splitlines()[0] if s else ""), timeout=240 if args.trace else 60)
        if took is None:
            tmux.kill("soak")
            sys.exit(f"soak: vtop did not show {want!r} in time; status line: "
                     f"{screen.splitlines()[0] if screen else '(nothing)'}")
        print(f"soak: vtop pid {pid}, {args.gpus} GPUs + {args.servers} servers at --interval {args.interval}, "
              f"{args.minutes:g} min, a sample every {args.sample_s:g} s", flush=True)
        print(f"{'min':>6} {'RSS MB':>8} {'peak MB':>8} {'CPU %':>6}  status line", flush=True)
        samples: list[dict[str, Any]] = []
        start = time.monotonic()
        cpu0 = sum(cpu_seconds(pid))
        prev_t, prev_cpu = start, cpu0
        end = start + args.minutes * 60
        next_print = 0.0
        k = 0
        while True:
            k += 1
            nxt = start + k * args.sample_s
            time.sleep(max(0.0, min(nxt, end) - time.monotonic()))
            now = time.monotonic()
            try:
                cpu = sum(cpu_seconds(pid))
                rss, hwm = rss_mb(pid), hwm_mb(pid)
            except OSError:
                sys.exit(f"soak: vtop (pid {pid}) ended after {(now - start) / 60:.1f} min")
            s: dict[str, Any] = {"t_s": round(now - start, 1), "rss_mb": round(rss, 2), "hwm_mb": round(hwm, 2),
                 "cpu_pct": round(100 * (cpu - prev_cpu) / (now - prev_t), 2), "cpu_s": round(cpu - cpu0, 2)}
            samples.append(s)
            prev_t, prev_cpu = now, cpu
            if now - start >= next_print or now >= end:
                line = status_line(tmux, "soak")
                s["status"] = line.strip()
                print(f"{s['t_s'] / 60:6.1f} {rss:8.1f} {hwm:8.1f} {s['cpu_pct']:6.1f}  {line.strip()[:70]}",
                      flush=True)
                next_print += 60
            if now >= end:
                break
        alive = tmux.alive("soak")
        try:  # how many scrapes vtop made (a busy box polls less often than asked)
            requests = sum(sp.stats(i)["requests"] for i in range(args.servers))
        except OSError:
            requests = None
        tmux.send_keys("soak", "q")
        time.sleep(1)
        tmux.kill("soak")
    cpu_total = samples[-1]["cpu_s"] if samples else 0.0
    return {
        "gpus": args.gpus, "servers": args.servers, "fake": args.fake, "interval": args.interval, "history": args.history,
        "minutes": args.minutes, "traced": bool(args.trace), "vtop_alive_at_end": alive,
        "cpu_pct_mean": round(100 * cpu_total / (samples[-1]["t_s"] or 1), 2) if samples else None,
        "server_requests": requests,
        "server_requests_per_s": round(requests / (time.monotonic() - start), 2) if requests else None,
        "samples": samples,
        "verdict": verdict(samples, args.settle_min),
    }


# ----------------------------------------------------------------- big body
def big_case(tmux: Tmux, name: str, url: str, seconds: float) -> dict[str, Any]:
    argv = vtop_cmd() + [url, "--interval", "0.25", "--no-gpu"]
    pid, _ = tmux.new(name, argv)
    tmux.wait_for(name, lambda s: "q Quit" in s, timeout=60)
    t_end = time.monotonic() + seconds
    rss_max = 0.0
    while time.monotonic() < t_end:
        time.sleep(0.5)
        try:
            rss_max = max(rss_max, rss_mb(pid))
        except OSError:
            break
    screen = tmux.capture(name)
    try:
        hwm = hwm_mb(pid)
        rss = rss_mb(pid)
    except OSError:
        hwm = rss = float("nan")
    tmux.send_keys(name, "q")
    time.sleep(1)
    tmux.kill(name)
    flat = " ".join(screen.split())
    return {"case": name, "url": url, "seconds": seconds, "peak_rss_mb": round(hwm, 1),
            "rss_end_mb": round(rss, 1), "names_the_limit": "16 MiB" in flat,
            "screen_excerpt": [ln.rstrip() for ln in screen.splitlines() if "MiB" in ln or "large" in ln][:4],
            "pass": hwm < BIG_TARGET_MB}


def big_bodies(args: argparse.Namespace, tmux: Tmux) -> list[dict[str, Any]]:
    out = []
    with BigServer(args.big_mib) as big:
        for name, url in (("close-delimited", big.close_url), ("content-length", big.length_url)):
            r = big_case(tmux, name, url, args.big_s)
            r["body_mib"] = args.big_mib
            out.append(r)
            print(f"big body, {args.big_mib} MiB {name}: peak RSS {r['peak_rss_mb']:.1f} MB "
                  f"({'PASS' if r['pass'] else 'MISS'} < {BIG_TARGET_MB:.0f}); the card: "
                  f"{' '.join(r['screen_excerpt'][:1]).strip(' ┃│') or '(says nothing of the limit)'}", flush=True)
    with ServerProcess(1) as sp:
        r = big_case(tmux, "baseline", sp.urls[0], args.big_s)
        out.append(r)
        print(f"baseline, one replayed server: peak RSS {r['peak_rss_mb']:.1f} MB", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--fake", choices=("replay", "static"), default="replay",
                    help="the servers: the replayed H200 timeline (default), or static: the fault matrix's fake "
                         "(tests/helpers/badserver.py), one vLLM 0.32.0 CPU text, whole whatever the query")
    ap.add_argument("--history", default=None, help="vtop's --history (default: vtop's own, 5 min)")
    ap.add_argument("--settle-min", type=float, default=5.0)
    ap.add_argument("--trace", metavar="DIR", help="run vtop under tracemalloc, dumps in DIR (slower)")
    ap.add_argument("--trace-s", type=float, default=60.0, help="seconds between tracemalloc dumps")
    ap.add_argument("--trace-frames", type=int, default=1, help="tracemalloc frames (0: object counts only)")
    ap.add_argument("--big-body", action="store_true", help="only the big-body cases")
    ap.add_argument("--no-big-body", action="store_true", help="only the soak")
    ap.add_argument("--big-mib", type=int, default=64)
    ap.add_argument("--big-s", type=float, default=45.0)
    ap.add_argument("--out", help="JSON file (default bench/results/soak-<time>.json)")
    args = ap.parse_args()

    # A run in the background ignores SIGINT; end it with SIGTERM and still close tmux and the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: terminated"))
    result: dict[str, Any] = {"machine": machine_info(), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                      time.gmtime())}
    tmux = Tmux()
    try:
        if not args.big_body:
            result["soak"] = soak(args, tmux)
        if not args.no_big_body:
            result["big_body"] = big_bodies(args, tmux)
    finally:
        tmux.close()
    result["loadavg_end"] = os.getloadavg()[0]

    if "soak" in result:
        sk = result["soak"]
        print(f"\nRSS over the soak ({sk['gpus']} GPUs + {sk['servers']} servers, --interval {sk['interval']}):")
        print("| minute | RSS MB | peak MB |\n| --- | --- | --- |")
        for m in (1, 2, 5, 10, 15, 20, 25, 30, 45, 60):
            s = at_minute(sk["samples"], m)
            if s is not None:
                print(f"| {m} | {s['rss_mb']:.1f} | {s['hwm_mb']:.1f} |")
        v = sk["verdict"]
        if v["judged"]:
            print(f"verdict: RSS at minute {v['settle_min']:g} {v['rss_at_settle_mb']:.1f} MB, largest after "
                  f"{v['max_rss_after_mb']:.1f} MB (minute {v['max_at_min']}): {v['growth_pct']:+.1f} % "
                  f"-> {'PASS' if v['pass'] else 'MISS'} (within {RSS_TOLERANCE:.0%}); slope after settling "
                  f"{v['slope_mb_per_h']:+.2f} MB/h; CPU mean {sk['cpu_pct_mean']} % of one core; "
                  f"the servers answered {sk['server_requests_per_s']} requests a second "
                  f"(asked: {sk['servers'] / sk['interval']:.0f} scrapes a second, and /health every 5 s)")
        else:
            print(f"verdict: not judged ({v['why']})")
    out = Path(args.out) if args.out else HERE / "results" / f"soak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {out}")
    ok = result.get("soak", {}).get("verdict", {}).get("pass", True) and all(
        r["pass"] for r in result.get("big_body", []) if r["case"] != "baseline")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_bigserve":
        big_serve(int(sys.argv[2]))
    else:
        raise SystemExit(main())
