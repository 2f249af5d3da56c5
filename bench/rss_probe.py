"""Where a live vtop's resident memory goes on a GPU box: vtop beside variants of itself, all at once.

    python bench/rss_probe.py --window 40 --out /tmp/rss.json      # on the GPU box (bench/lean.py's set-up)

Each variant runs live in its own 120x40 pseudo-terminal (bench/lean.py's ``Term``), watching the same GPUs
under the same load (``--load matmul``: lean.py's bf16 loop), for ``--warmup`` + ``--window`` seconds; then,
per variant: peak RSS (``VmHWM``), RSS per mapping (``/proc/PID/smaps``), the anonymous regions (count, the
largest by RSS with their size: glibc's per-thread malloc arenas are 64 MiB reservations, Python's object
arenas 1 MiB) and the threads. The variants tell the parts apart:

* ``vtop``: as users run it (``--interval 1``);
* ``vtop-sim``: ``--simulate-gpus 1``: no NVML library loaded (vtop's fake NVML);
* ``vtop-arena1``: ``MALLOC_ARENA_MAX=1``: one malloc arena for every thread (what per-thread arenas cost);
* ``vtop-no-gpm``, ``vtop-no-xid``, ``vtop-no-pcie``, ``vtop-no-procs``: vtop with its NVML source's GPM samples,
  XID event set, PCIe thread or process list (and each process's SM share) left out (each an argument of ``NvmlSource``, set by a wrapper: no flag of vtop's has them);
* ``imports``: Python with the modules a live vtop imports, doing nothing (the code's share);
* ``nvml``: Python, pynvml and a one-second loop of the calls vtop makes each tick (NVML's own share);
* ``nvitop`` (where importable) and the Textual floor (``bench/textual_floor.py --tick``).

Standard library only (torch for the load).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from lean import MATMUL, Term, env_for, nvml_ok, torch_gpu  # noqa: E402

IMPORTS = (
    "import time, vtop.cli, vtop.ui.app, vtop.monitor.live, vtop.core.rules, vtop.sources.nvml, "
    "vtop.sources.vllm, vtop.sources.procs, vtop.sources.discovery, pynvml\n"
    "time.sleep(100000)\n"
)

#: vtop's CLI with one of its NVML source's arguments forced (bench only: vtop has no flag for them)
WITHOUT = (
    "import sys, vtop.sources.nvml as n\n"
    "orig = n.NvmlSource.__init__\n"
    "def init(self, *a, **k):\n"
    "    k.update({kw}); orig(self, *a, **k)\n"
    "n.NvmlSource.__init__ = init\n"
    "from vtop.cli import main\n"
    "sys.exit(main(['--interval', '1', *sys.argv[1:]]))\n"
)

NVML_LOOP = """
import time, pynvml as N
N.nvmlInit()
hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
while True:
    for h in hs:
        N.nvmlDeviceGetUtilizationRates(h); N.nvmlDeviceGetMemoryInfo(h); N.nvmlDeviceGetPowerUsage(h)
        N.nvmlDeviceGetTemperature(h, 0); N.nvmlDeviceGetClockInfo(h, 1); N.nvmlDeviceGetClockInfo(h, 2)
        N.nvmlDeviceGetComputeRunningProcesses(h)
    time.sleep(1)
"""


def anon_regions(pid: int, top: int = 12) -> dict[str, Any] | None:
    """The anonymous mappings (no file; ``[heap]`` apart): how many, their RSS in all, and the largest by RSS
    with their size in KiB."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return None
    regions: list[tuple[int, int, str]] = []  # (rss kB, size kB, perms)
    cur: list[Any] | None = None
    for line in text.splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            anon = len(parts) <= 5
            cur = [0, (hi - lo) // 1024, parts[1]] if anon else None
            if cur is not None:
                regions.append(cur)  # type: ignore[arg-type]
        elif parts and parts[0] == "Rss:" and cur is not None:
            cur[0] = int(parts[1])
    regions.sort(key=lambda r: -r[0])
    return {
        "count": len(regions),
        "rss_mb": round(sum(r[0] for r in regions) / 1024, 2),
        "largest": [{"rss_kb": r[0], "size_kb": r[1], "perms": r[2]} for r in regions[:top]],
        "by_size_kb": _by_size(regions),
    }


def _by_size(regions: list[Any]) -> dict[str, float]:
    """RSS (MB) of the anonymous regions grouped by their size class."""
    out: dict[str, float] = {}
    for rss, size, _p in regions:
        k = ("<=1MiB" if size <= 1024 else "<=8MiB" if size <= 8192 else "<=64MiB" if size <= 65536
             else ">64MiB")
        out[k] = round(out.get(k, 0.0) + rss / 1024, 2)
    return out


def threads(pid: int) -> list[str]:
    out = []
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task")):
            out.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
    except OSError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--load", choices=("matmul", "none"), default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    py = sys.executable
    real = nvml_ok()
    gpu = [] if real else ["--simulate-gpus", "1"]
    env = env_for(None)
    variants: list[tuple[str, list[str], dict[str, str]]] = [
        ("vtop", [py, "-m", "vtop", "--interval", "1", *gpu], env),
        ("vtop-sim", [py, "-m", "vtop", "--interval", "1", "--simulate-gpus", "1"], env),
        ("vtop-arena1", [py, "-m", "vtop", "--interval", "1", *gpu], env | {"MALLOC_ARENA_MAX": "1"}),
        ("vtop-no-gpm", [py, "-c", WITHOUT.format(kw="gpm=False"), *gpu], env),
        ("vtop-no-xid", [py, "-c", WITHOUT.format(kw="xid=False"), *gpu], env),
        ("vtop-no-pcie", [py, "-c", WITHOUT.format(kw="pcie_every_s=None"), *gpu], env),
        ("vtop-no-procs", [py, "-c", WITHOUT.format(kw="processes=False"), *gpu], env),
        ("imports", [py, "-c", IMPORTS], env),
        ("floor", [py, str(HERE / "textual_floor.py"), "--tick"], env),
    ]
    if real:
        variants.append(("nvml", [py, "-c", NVML_LOOP], env))
    if importlib.util.find_spec("nvitop") is not None:
        variants.append(("nvitop", [py, "-m", "nvitop", "--interval", "1"], env))
    load = a.load or ("matmul" if torch_gpu() else "none")
    loader = subprocess.Popen([py, "-c", MATMUL]) if load == "matmul" else None
    if loader is not None:
        time.sleep(8)
    terms = {name: Term(argv, e) for name, argv, e in variants}
    try:
        time.sleep(a.warmup)
        cpu0 = {n: t.cpu_s() for n, t in terms.items()}
        th0 = {n: t.cpu_by_thread() for n, t in terms.items()}
        time.sleep(a.window)
        res: dict[str, Any] = {}
        for n, t in terms.items():
            c0, c1 = cpu0[n], t.cpu_s()
            res[n] = {
                "alive": t.proc.poll() is None,
                "peak_rss_mb": t.hwm_mb(),
                "cpu_pct": None if c0 is None or c1 is None else round(100 * (c1 - c0) / a.window, 3),
                "rss_mb_by_mapping": t.rss_by_mapping(top=10),
                "anon": anon_regions(t.proc.pid),
                "threads": threads(t.proc.pid),
                "cpu_ms_per_s_by_thread": {k: round(1000 * (v - th0[n].get(k, 0.0)) / a.window, 2)
                                           for k, v in t.cpu_by_thread().items()},
            }
            if not res[n]["alive"]:
                res[n]["tail"] = t.tail.decode("utf-8", "replace")[-800:]
    finally:
        for t in terms.values():
            t.stop()
        if loader is not None:
            loader.kill()
            loader.wait()
    doc = {"python": sys.version.split()[0], "nvml": real, "load": load, "window_s": a.window, "variants": res}
    for n, r in res.items():
        anon = r["anon"] or {}
        print(f"{n:18} peak {r['peak_rss_mb'] or 0:6.1f} MB  cpu {r['cpu_pct']} %  alive {r['alive']}  "
              f"threads {len(r['threads'])} {sorted(set(r['threads']))}")
        print(f"{'':18} CPU ms/s by thread {r['cpu_ms_per_s_by_thread']}")
        print(f"{'':18} by mapping {r['rss_mb_by_mapping']}")
        print(f"{'':18} anon: {anon.get('count')} regions, {anon.get('rss_mb')} MB, by size {anon.get('by_size_kb')}")
        print(f"{'':18} largest anon (rss kB/size kB): "
              + ", ".join(f"{x['rss_kb']}/{x['size_kb']}" for x in anon.get("largest", [])))
        if "tail" in r:
            print(f"{'':18} tail: {r['tail']!r}")
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
