"""Run on the GPU machine: vtop watches a real vLLM 0.26.0 start on the H200 from before
its launch, then a 1500-request burst and a runaway request, and writes down what it saw.

    python3 tools/device/h200_vllm_session.py OUTDIR [--budget-s 420]

vtop runs headless (Textual's run_test) with its real sources: NVML, process
discovery, the /metrics scraper on http://127.0.0.1:8000 and the log
/tmp/vllm/serve.log (which does not exist yet when vtop starts). The load is
the shared recipe's orchestrate.py (``--launch --stop --phases load,runaway``).

Writes into OUTDIR:
  seen.json        every change of startup phase and server state as vtop saw it live,
                   with the seconds since launch and the tracker's own numbers
  vtop-*.svg       screenshots when the phase or the server state changed (at most 12)
  vtop-record.jsonl  vtop's NVML recording of the run
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

URL = "http://127.0.0.1:8000"
LOG = "/tmp/vllm/serve.log"


async def main(out: Path, budget_s: float) -> None:
    from vtop.config import Config
    from vtop.ui.app import VtopApp

    out.mkdir(parents=True, exist_ok=True)
    cfg = Config(urls=(URL,), log=LOG, interval=1.0, history=300, record=str(out / "vtop-record.jsonl"),
                 stall_threshold=120)
    app = VtopApp(cfg, hostname="h200")
    seen: list[dict[str, object]] = []
    shots = 0
    t0 = time.time()
    if os.environ.get("REHEARSAL"):  # on the CPU box: the real vLLM CPU build stands in
        Path(LOG).parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PORT="8000", LOG=LOG, PIDFILE="/tmp/vllm/serve.pid", HEALTH_TIMEOUT_S=str(int(budget_s)))
        orch = subprocess.Popen(["bash", "-c", "bash tests/real/vllm_cpu/recipe.sh start; sleep 5; bash tests/real/vllm_cpu/recipe.sh stop"],
                                env=env, stdout=open("/tmp/orch.log", "w"), stderr=subprocess.STDOUT)
    else:
        orch = subprocess.Popen(
        [sys.executable, "/tmp/vllm-gpu/orchestrate.py", "--launch", "--stop", "--phases", "load,runaway",
         "--runaway-s", "40", "--out", "/tmp/rec", "--budget-s", str(int(budget_s - 20))],
        stdout=open("/tmp/orch.log", "w"), stderr=subprocess.STDOUT,
    )
    async with app.run_test(size=(120, 44)) as pilot:
        last_key: tuple[object, ...] | None = None
        while orch.poll() is None and time.time() - t0 < budget_s:
            await pilot.pause(0.5)
            lv = app.log_view
            entry = app.monitor.servers.get(URL)
            sv = entry.last_view if entry else None
            snap = lv.snapshot if lv else None
            key = (
                snap.state if snap else None,
                snap.current.value if snap and snap.current else None,
                sv.state if sv else None,
                bool(sv and sv.total and (sv.total.waiting or 0) > 0),
            )
            if key != last_key:
                last_key = key
                rec: dict[str, object] = {
                    "s": round(time.time() - t0, 1),
                    "tracker_state": key[0],
                    "phase": key[1],
                    "server_state": key[2],
                    "waiting": key[3],
                    "elapsed_in_phase_s": lv.current_elapsed_s if lv else None,
                    "stall": lv.stall.label if lv and lv.stall else None,
                }
                if sv is not None and sv.total is not None:
                    rec.update(running=sv.total.running, waiting_n=sv.total.waiting, kv_pct=sv.total.kv_pct,
                               gen_tps=sv.gen_tps)
                if snap is not None:
                    rec["phases"] = [
                        [p.phase.value, p.duration_s, [[g.label, g.n, g.total] for g in p.progress]]
                        for p in snap.phases
                    ]
                seen.append(rec)
                print(json.dumps(rec)[:300], flush=True)
                if shots < 12:
                    shots += 1
                    name = f"vtop-{shots:02d}-{key[1] or key[0]}-{key[2]}.svg".replace(" ", "_")
                    app.save_screenshot(str(out / name))
        await pilot.pause(1.0)
        app.save_screenshot(str(out / "vtop-end.svg"))
        lv = app.log_view
        final = {
            "seen": seen,
            "final_tracker_state": lv.snapshot.state if lv else None,
            "total_s": lv.snapshot.total_s if lv else None,
            "facts": dataclasses.asdict(lv.snapshot.facts) if lv else None,
            "server_states": app.monitor.servers[URL].history if URL in app.monitor.servers else [],
        }
    try:
        orch.wait(timeout=30)
    except subprocess.TimeoutExpired:
        orch.kill()
    (out / "seen.json").write_text(json.dumps(final, indent=1, default=str))


if __name__ == "__main__":
    budget = float(sys.argv[sys.argv.index("--budget-s") + 1]) if "--budget-s" in sys.argv else 420.0
    asyncio.run(main(Path(sys.argv[1]), budget))
