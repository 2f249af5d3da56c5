"""Run on the GPU machine: vtop itself (real NVML, real polling threads, headless
Textual) watches a real H200 through idle, a large bf16 matmul loop and a
tiny-kernel loop, records every sample it read, and saves an SVG per phase.

    python3 tools/device/h200_nvml_session.py OUTDIR

The load runs in a separate process (its PID shows in NVML's process list,
as a vLLM EngineCore's would). Writes OUTDIR/h200-nvml-session.jsonl (vtop's
record format, with "mark" lines at each phase change), one SVG per phase and
summary.json (util and SM activity per phase, from the recording).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

LOAD = r"""
import sys, time
dry = len(sys.argv) > 1
scale = 0.15 if dry else 1.0
phases = [("idle", 6), ("heavy", 20), ("tiny", 20), ("idle-after", 6)]
if not dry:
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 64, device="cuda")
    torch.cuda.synchronize()
for name, dur in phases:
    print(name, time.time(), flush=True)
    end = time.time() + dur * scale
    while time.time() < end:
        if dry or name.startswith("idle"):
            time.sleep(0.05)
            continue
        if name == "heavy":
            for _ in range(20): a @ a
        elif name == "tiny":
            for _ in range(200): x = x * 1.0001
        torch.cuda.synchronize()
print("end", time.time(), flush=True)
"""


async def main(out: Path) -> None:
    from vtop.config import Config
    from vtop.ui.app import VtopApp

    out.mkdir(parents=True, exist_ok=True)
    rec = out / "h200-nvml-session.jsonl"
    rec.unlink(missing_ok=True)
    dry = bool(os.environ.get("DRYRUN"))  # rehearsal on a machine without a GPU
    app = VtopApp(Config(interval=1.0, history=60, record=str(rec), simulate_gpus=1 if dry else 0), hostname="h200")
    child = subprocess.Popen([sys.executable, "-c", LOAD] + (["dry"] if dry else []), stdout=subprocess.PIPE, text=True)
    async with app.run_test(size=(120, 30)) as pilot:
        loop = asyncio.get_running_loop()
        phase = None
        while True:
            line = await loop.run_in_executor(None, child.stdout.readline)  # type: ignore[union-attr]
            if not line:
                break
            name, t = line.split()
            if phase not in (None, "idle"):
                app.save_screenshot(str(out / f"h200-{phase}.svg"))
            phase = name
            assert app.recorder is not None
            app.recorder.mark(float(t), name, load_pid=child.pid)
            print("phase", name, flush=True)
        await pilot.pause(1.5)
        app.save_screenshot(str(out / "h200-end.svg"))
    child.wait()
    summarize(rec, out / "summary.json")


def summarize(rec: Path, dest: Path) -> None:
    from vtop.sources.recording.record import read

    phase = None
    per: dict[str, dict[str, list[float]]] = {}
    for r in read(rec):
        if r["kind"] == "mark":
            phase = r["label"]
        elif r["kind"] == "gpu" and phase and r["gpus"]:
            g = r["gpus"][0]
            d = per.setdefault(phase, {"util_gpu": [], "sm_active": [], "sm_occupancy": [], "dram_bw": [], "power_w": []})
            for k in d:
                if g.get(k) is not None:
                    d[k].append(g[k])
    summary = {
        ph: {k: {"n": len(v), "median": statistics.median(v), "max": max(v)} for k, v in d.items() if v}
        for ph, d in per.items()
    }
    dest.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
