"""Run on the GPU machine: vtop records a real vLLM 0.26.0 on the H200 from before its
launch through a burst of load and a runaway request, for ``vtop demo`` and the tests.

    python3 tools/device/h200_demo_session.py OUTDIR [--budget-s 520]

What happens (one clock, the GPU machine's):
* ``/tmp/tiny`` (the recipe's tiny random-weight Llama) is given a 131,072-token
  context (``max_position_embeddings``), and vLLM is started by the recipe's
  ``orchestrate.py --launch --stop`` with ``--max-model-len 131072
  --enable-log-requests`` (``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``): the incident
  behind vtop, a chat request without ``max_tokens`` that may run to 131k tokens.
* orchestrate's phases: idle, load (200 requests at concurrency 64, then a burst
  of 1500), then the runaway (streaming chat, no max_tokens, ``ignore_eos``) for
  ``--runaway-s`` seconds, after which the client hangs up and vLLM aborts it.
* vtop runs the whole time as the real app (Textual's run_test, 120x40, its real
  sources: NVML, process discovery, /metrics, the log) with ``--record``.
* ``vtop --once --json`` runs during the burst, and ``vtop doctor --json``
  during the runaway, as separate processes, as a user would run them.

Writes into OUTDIR: ``demo.jsonl.gz`` (the recording), ``seen.json`` (what the
live app showed, every 5 s), ``once-burst.json``, ``doctor-runaway.json``,
``doctor-runaway.txt``, ``serve.log``, ``rec.tgz`` (orchestrate's own files).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

URL = "http://127.0.0.1:8000"
LOG = "/tmp/vllm/serve.log"
MAX_LEN = 131072


def widen_model(path: str = "/tmp/tiny") -> None:
    cfg = Path(path) / "config.json"
    d = json.loads(cfg.read_text())
    d["max_position_embeddings"] = MAX_LEN
    cfg.write_text(json.dumps(d, indent=1))
    tc = Path(path) / "tokenizer_config.json"
    if tc.exists():
        t = json.loads(tc.read_text())
        t["model_max_length"] = MAX_LEN
        tc.write_text(json.dumps(t, indent=1))


def side_run(args: list[str], out: Path, name: str) -> None:
    env = dict(os.environ)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "vtop", *args], capture_output=True, text=True, timeout=60, env=env)
    (out / name).write_text(r.stdout)
    print(f"{name}: exit {r.returncode} in {time.time() - t0:.1f} s; stderr: {r.stderr[-400:]}", flush=True)


async def main(out: Path, budget_s: float, runaway_s: float) -> None:
    from vtop.config import Config
    from vtop.ui.app import VtopApp

    out.mkdir(parents=True, exist_ok=True)
    widen_model()
    cfg = Config(urls=(URL,), log=LOG, interval=1.0, history=300, record=str(out / "demo.jsonl.gz"))
    app = VtopApp(cfg, hostname="h200")
    env = dict(os.environ, VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    t0 = time.time()
    orch = subprocess.Popen(
        [sys.executable, "/tmp/vllm-gpu/orchestrate.py", "--launch", "--stop", "--phases", "idle,load,runaway",
         "--runaway-s", str(runaway_s), "--out", "/tmp/rec", "--budget-s", str(int(budget_s - 25)),
         "--", "--max-model-len", str(MAX_LEN), "--enable-log-requests"],
        stdout=open("/tmp/orch.log", "w"), stderr=subprocess.STDOUT, env=env,
    )
    seen: list[dict[str, object]] = []
    side: dict[str, bool] = {}
    loop = asyncio.get_running_loop()
    async with app.run_test(size=(120, 40)) as pilot:
        next_rec = 0.0
        while orch.poll() is None and time.time() - t0 < budget_s:
            await pilot.pause(0.5)
            now = time.time() - t0
            entry = app.monitor.servers.get(URL)
            sv = entry.last_view if entry else None
            lv = app.log_view
            if now >= next_rec:
                next_rec = now + 5
                rec: dict[str, object] = {"s": round(now, 1), "t": round(time.time(), 2),
                                          "server": sv.state if sv else None,
                                          "phase": (lv.snapshot.current.value if lv and lv.snapshot.current else
                                                    (lv.snapshot.state if lv else None))}
                if sv is not None and sv.total is not None:
                    rec.update(running=sv.total.running, waiting=sv.total.waiting, kv_pct=sv.total.kv_pct,
                               gen_tps=sv.gen_tps)
                alerts = getattr(app, "alerts", None)
                if alerts:
                    rec["alerts"] = [a.title for a in alerts]
                reqs = getattr(lv, "inflight", None) if lv else None
                if reqs:
                    rec["inflight"] = [[r.request_id, round(r.age_s), r.max_tokens] for r in reqs[:3]]
                seen.append(rec)
                print(json.dumps(rec)[:300], flush=True)
            # a user's one-shot views, as separate processes, at two moments
            ev = _events()
            if "burst" not in side and "load_b_begin" in ev and time.time() - ev["load_b_begin"] > 4:
                side["burst"] = True
                await loop.run_in_executor(None, side_run, ["--once", "--json", URL, "--log", LOG], out, "once-burst.json")
            if "doctor" not in side and "runaway_begin" in ev and time.time() - ev["runaway_begin"] > 130:
                side["doctor"] = True
                await loop.run_in_executor(None, side_run, ["doctor", URL, "--log", LOG, "--window", "10s", "--json"],
                                           out, "doctor-runaway.json")
                await loop.run_in_executor(None, side_run, ["doctor", URL, "--log", LOG, "--window", "5s"],
                                           out, "doctor-runaway.txt")
        await pilot.pause(2.0)
        app.save_screenshot(str(out / "vtop-end.svg"))
    try:
        orch.wait(timeout=30)
    except subprocess.TimeoutExpired:
        orch.kill()
    (out / "seen.json").write_text(json.dumps({"t0": t0, "seen": seen}, indent=0, default=str))
    shutil.copy(LOG, out / "serve.log")
    with tarfile.open(out / "rec.tgz", "w:gz") as tf:
        for p in ("/tmp/rec", "/tmp/orch.log"):
            if os.path.exists(p):
                tf.add(p, arcname=os.path.basename(p))


def _events() -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        for line in Path("/tmp/rec/events.jsonl").read_text().splitlines():
            d = json.loads(line)
            out.setdefault(d.get("ev"), float(d.get("t", 0)))
    except (OSError, ValueError):
        pass
    return out


if __name__ == "__main__":
    a = sys.argv
    budget = float(a[a.index("--budget-s") + 1]) if "--budget-s" in a else 520.0
    runaway = float(a[a.index("--runaway-s") + 1]) if "--runaway-s" in a else 200.0
    asyncio.run(main(Path(a[1]), budget, runaway))
