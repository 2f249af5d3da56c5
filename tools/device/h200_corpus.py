"""Record incident traces from the real vLLM 0.26.0 on the H200 machine, in the corpus format.

    python3 -m tools.device.h200_corpus SCENARIO[,SCENARIO...] --out DIR [--budget-s N] [--small] [--scale F]
    python3 -m tools.device.h200_corpus --list

Runs ON the GPU machine (``tools/device/README-corpus.md`` has the exact ``run`` commands), from the
repo root with ``PYTHONPATH=/tmp/vtop-site:$PWD``. Each scenario writes ``DIR/SCENARIO/`` in the format
of ``tests/corpus/FORMAT.md``, with the pieces of ``tools/corpus/record.py`` (its sampler, log segments,
traffic and truth) and these differences:

* the server is the shared recipe's: ``serve.sh`` starts ``vllm serve /tmp/tiny --host 127.0.0.1 --port
  8000 --max-model-len 32768 --gpu-memory-utilization 0.5`` (+ the scenario's flags) under setsid, its
  log at ``/tmp/vllm/serve.log`` (copied byte for byte), its pid and launch time in
  ``/tmp/vllm/serve.json``; the ``launch`` event carries that ``t_launch``; ``stop.sh`` stops it at the
  end of each scenario (after the last sample, so the trace does not hold the shutdown);
* ``gpu.jsonl.gz`` (new, optional): NVML once a second (FORMAT.md); absent when NVML is not there;
* every process of ``procs.jsonl.gz`` carries ``"cpu"``: its user+system CPU seconds.

On a box without the GPU recipe (the dry run), ``VTOP_H200_SERVE`` / ``VTOP_H200_STOP`` name stand-ins
for serve.sh / stop.sh (``tools/device/cpu_serve.sh`` / ``cpu_stop.sh`` start the CPU build) and
``VTOP_H200_RUN_DIR`` the folder of serve.pid / serve.json / serve.log (default ``/tmp/vllm``);
``--small`` scales the loads down for a CPU server and ``--scale`` the scenario's waits.

Every scenario is bounded and stops by itself; ``--budget-s`` skips a scenario whose estimate does not
fit in what is left. Exit status 0 when every scenario ran without error.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import gzip
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


def _pytest_stand_in() -> None:
    """tools.corpus.record imports tests.real.conftest, which imports pytest for its fixtures only: where
    pytest is not installed (the GPU machine, unless /tmp/vtop-site has it) a stand-in with its decorators."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        import types

        def deco(*a: Any, **k: Any) -> Any:
            return a[0] if a and callable(a[0]) and not k else (lambda f: f)

        stub = types.ModuleType("pytest")
        stub.fixture = stub.hookimpl = deco  # type: ignore[attr-defined]
        sys.modules["pytest"] = stub


_pytest_stand_in()

from tools.corpus import record as R  # noqa: E402

RUN_DIR = Path(os.environ.get("VTOP_H200_RUN_DIR", "/tmp/vllm"))
SERVE = os.environ.get("VTOP_H200_SERVE", "/tmp/vllm-gpu/serve.sh")
STOP = os.environ.get("VTOP_H200_STOP", "/tmp/vllm-gpu/stop.sh")
LOG = RUN_DIR / "serve.log"
#: the Python with torch on the GPU machine (the image's; /tmp/site/bin/vllm runs on it)
TORCH_PY = os.environ.get("VTOP_H200_TORCH_PY", "")

#: GPU sizes (the H200 recipe: max_num_seqs 1024, 32,768-token context, ~460 tok/s for one stream)
GPU_PARAMS: dict[str, Any] = {
    "burst_n": 1500, "burst_tokens": 192, "burst_cap_s": 120.0,
    "steady_conc": 16, "steady_tokens": 256,
    "runaway_hangup_s": 75.0,
    "pool_nonstream": 8, "pool_nonstream_tokens": 8192,
    # the no-log stall's three streams (h200-engine-stall-streams-nolog): long enough to outlast the stop
    "nolog_stream_tokens": 8192,
    "hog_gib": float(os.environ.get("VTOP_H200_HOG_GIB", "100")),
    "ready_timeout_s": 400.0,
    # a tqdm frame of the capture, e.g. "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|...| 20/51"
    "capture_re": rb"Capturing CUDA graphs[^\r\n]*?(\d+)/(\d+)",
}
#: --small: a CPU server of 2 cores (the dry run)
SMALL_PARAMS: dict[str, Any] = {
    **GPU_PARAMS, "burst_n": 48, "burst_tokens": 48, "burst_cap_s": 120.0, "steady_conc": 4, "steady_tokens": 48,
    "runaway_hangup_s": 40.0, "pool_nonstream": 2, "pool_nonstream_tokens": 96,
    "nolog_stream_tokens": 1500, "hog_gib": float(os.environ.get("VTOP_H200_HOG_GIB", "0")),
    "capture_re": os.environ.get("VTOP_H200_CAPTURE_RE", r"Warming up model for the compilation").encode(),
}


def _mono_of(t_wall: float) -> float:
    return time.monotonic() - (time.time() - t_wall)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read().decode(errors="replace")
    except OSError:
        return False
    return st[st.rfind(")") + 2:].split()[:1] != ["Z"]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` from /proc/PID/stat (fields 14 and 15), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read().decode(errors="replace")
        rest = st[st.rfind(")") + 2:].split()
        return round((int(rest[11]) + int(rest[12])) / R.CLK, 2)
    except (OSError, IndexError, ValueError):
        return None


def proc_title(rec: dict[str, Any]) -> str:
    """A process's short name as vtop shows GPU processes: a ``VLLM::`` title, ``vllm serve``, else its name."""
    cmd = rec.get("cmdline") or []
    if cmd and cmd[0].startswith(("VLLM::", "ray::")):
        return str(cmd[0].split()[0])
    if len(cmd) > 2 and cmd[1].endswith("vllm") and cmd[2] == "serve":
        return "vllm serve"
    return str(rec.get("name") or "?")


# --- the server: serve.sh / stop.sh ------------------------------------------------------


class GpuServer:
    """The vLLM that ``serve.sh`` starts (attributes as :class:`tests.real.conftest.RealVllm` has them)."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None
        self.log_path: Path | None = None
        self.model: str | None = None
        self.max_model_len: int | None = None
        self.served_model_dir: str | None = None

    @property
    def url(self) -> str:
        port = (self.info or {}).get("port", 8000)
        return f"http://127.0.0.1:{port}"

    @property
    def pid(self) -> int | None:
        return int(self.info["pid"]) if self.info else None

    def is_running(self) -> bool:
        return _alive(self.pid)

    def launch(self, extra: tuple[str, ...] = (), *, pipe: bool = False) -> dict[str, Any]:
        """Start vLLM with serve.sh; ``pipe``: its stdout and stderr a PIPE (serve.sh's ``--log /dev/stdout``
        reopens this recorder's pipe), which a thread here copies into LOG for the trace: no file that vtop
        could find behind the process (``/proc/PID/fd/1`` reads ``pipe:[...]``), as under a supervisor."""
        self.stop(quiet=True)
        with contextlib.suppress(OSError):
            (RUN_DIR / "serve.json").unlink()
        with contextlib.suppress(OSError):
            LOG.unlink()
        if pipe:
            return self._launch_piped(extra)
        cmd = ["bash", SERVE, "--log", str(LOG)] + (["--", *extra] if extra else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        print(f"[serve] {' '.join(cmd)} -> rc {r.returncode}: {(r.stdout + r.stderr).strip()[-500:]}", flush=True)
        if r.returncode != 0:
            raise R.ServerFailed(f"serve.sh failed (rc {r.returncode}): {(r.stdout + r.stderr)[-1000:]}")
        self.info = json.loads((RUN_DIR / "serve.json").read_text())
        self.log_path = Path(self.info.get("log") or LOG)
        cmdline = [str(c) for c in self.info.get("cmd") or []]
        self.served_model_dir = cmdline[cmdline.index("serve") + 1] if "serve" in cmdline[:-1] else None
        self.model = self.max_model_len = None
        return self.info

    def _launch_piped(self, extra: tuple[str, ...]) -> dict[str, Any]:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        LOG.write_bytes(b"")
        cmd = ["bash", SERVE, "--log", "/dev/stdout"] + (["--", *extra] if extra else [])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        assert p.stdout is not None
        out = p.stdout

        def tee() -> None:  # until vLLM (which holds the pipe's write end) exits
            with open(LOG, "ab") as f:
                while True:
                    chunk = out.read1(65536)
                    if not chunk:
                        break
                    f.write(chunk)
                    f.flush()

        threading.Thread(target=tee, daemon=True, name="vllm-pipe").start()
        try:
            rc = p.wait(120)
        except subprocess.TimeoutExpired as e:
            raise R.ServerFailed("serve.sh did not return in 120 s") from e
        print(f"[serve] {' '.join(cmd)} -> rc {rc} (vLLM's stdout: a pipe, copied to {LOG})", flush=True)
        if rc != 0:
            time.sleep(0.5)
            raise R.ServerFailed(f"serve.sh failed (rc {rc}): {self.log_tail()}")
        self.info = json.loads((RUN_DIR / "serve.json").read_text())
        self.info["log"] = str(LOG)  # serve.sh wrote /dev/stdout: the copy is the trace's log
        self.log_path = LOG
        cmdline = [str(c) for c in self.info.get("cmd") or []]
        self.served_model_dir = cmdline[cmdline.index("serve") + 1] if "serve" in cmdline[:-1] else None
        self.model = self.max_model_len = None
        return self.info

    def wait_health(self, timeout: float) -> float:
        """Seconds from the launch to ``/health`` 200; reads the model id. Raises ServerFailed."""
        assert self.info is not None
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as c:
            while True:
                if not self.is_running():
                    raise R.ServerFailed(f"vLLM exited during startup\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if c.get(self.url + "/health").status_code == 200:
                        break
                if time.monotonic() >= deadline:
                    raise R.ServerFailed(f"not healthy after {timeout:.0f} s\n{self.log_tail()}")
                time.sleep(0.25)
            try:
                models = c.get(self.url + "/v1/models", timeout=30).json()["data"]
                self.model = models[0]["id"]
                self.max_model_len = int(models[0]["max_model_len"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                raise R.ServerFailed(f"healthy, but /v1/models unreadable: {e}") from e
        return time.time() - float(self.info["t_launch"])

    def tree(self) -> list[dict[str, Any]]:
        """This server's processes only: the API server and its descendants (never another vLLM of the box,
        which record.vllm_tree adds for the process table)."""
        procs = R.all_procs()
        if self.pid not in procs:
            return []
        kids: dict[int, list[int]] = {}
        for r in procs.values():
            kids.setdefault(r["ppid"], []).append(r["pid"])
        out, stack, seen = [], [self.pid], set()
        while stack:
            p = stack.pop()
            if p in seen or p not in procs:
                continue
            seen.add(p)
            out.append(procs[p])
            stack.extend(kids.get(p, ()))
        return sorted(out, key=lambda r: r["pid"])

    def engine_pids(self) -> list[int]:
        """EngineCore (on one GPU the model runs in it) and any VLLM::Worker under it (the CPU build has one)."""
        cores, workers = [], []
        for r in self.tree():
            if r["pid"] == self.pid:
                continue
            title = (r["cmdline"] or [""])[0]
            if title.startswith("VLLM::EngineCore") or r["name"].startswith("VLLM::EngineCor"):
                cores.append(r["pid"])
            elif title.startswith("VLLM::Worker"):
                workers.append(r["pid"])
        return cores + workers

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def log_tail(self, n: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self, quiet: bool = False) -> None:
        try:
            r = subprocess.run(["bash", STOP], capture_output=True, text=True, timeout=90)
            if not quiet or r.returncode:
                print(f"[stop] rc {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}", flush=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"[stop] {type(e).__name__}: {e}", flush=True)

    def _emergency_stop(self) -> None:
        if self.is_running():
            self.stop()


# --- NVML ----------------------------------------------------------------------------------


class Nvml:
    """One sample a second of every GPU (``gpu.jsonl.gz``'s ``gpus``); raises at init when NVML is absent."""

    def __init__(self, module: Any = None) -> None:
        if module is None:
            import pynvml as module  # nvidia-ml-py (in the GPU image)
        N = self.N = module
        N.nvmlInit()
        self.handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
        self.limits: list[float | None] = []
        self.gpm: dict[int, list[Any]] = {}
        self.errors: dict[str, str] = {}
        self.util_seen: dict[int, int] = {}  # per GPU, the newest per-process utilization sample's time (us)
        for i, h in enumerate(self.handles):
            try:
                self.limits.append(N.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            except Exception:  # noqa: BLE001 - a gap
                self.limits.append(None)
            try:
                if N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                    a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
                    N.nvmlGpmSampleGet(h, a)
                    self.gpm[i] = [a, b]
            except Exception as e:  # noqa: BLE001 - no GPM: sm_active None
                self.errors.setdefault("gpm_init", repr(e))

    def _try(self, key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a gap, the first error of each kind kept
            self.errors.setdefault(key, repr(e))
            return None

    def _sm_active(self, i: int, h: Any) -> float | None:
        N = self.N
        pair = self.gpm.get(i)
        if pair is None:
            return None
        a, b = pair
        try:
            N.nvmlGpmSampleGet(h, b)
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = a, b
            mg.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
            N.nvmlGpmMetricsGet(mg)
            self.gpm[i] = [b, a]  # the newest is the first of the next pair
            v = float(mg.metrics[0].value)
            if getattr(mg.metrics[0], "nvmlReturn", 0) != 0 or v != v:
                return None
            return round(v / 100.0, 4)  # percent -> fraction
        except Exception as e:  # noqa: BLE001
            self.errors.setdefault("gpm", repr(e))
            return None

    def sample(self) -> list[dict[str, Any]]:
        N = self.N
        out = []
        for i, h in enumerate(self.handles):
            u = self._try("util", lambda h=h: N.nvmlDeviceGetUtilizationRates(h))
            m = self._try("mem", lambda h=h: N.nvmlDeviceGetMemoryInfo(h))
            p = self._try("power", lambda h=h: N.nvmlDeviceGetPowerUsage(h))
            ps = self._try("procs", lambda h=h: N.nvmlDeviceGetComputeRunningProcesses(h))
            sm = self._proc_sm(i, h) if ps else None
            thr = self._try("throttle", lambda h=h: N.nvmlDeviceGetCurrentClocksEventReasons(h))
            from vtop.model.gpu import decode_throttle
            out.append({
                "index": i,
                "util": u.gpu if u is not None else None,
                "mem_used": int(m.used) if m is not None else None,
                "mem_total": int(m.total) if m is not None else None,
                "power_w": round(p / 1000.0, 1) if p is not None else None,
                "power_limit_w": self.limits[i],
                "sm_active": self._sm_active(i, h),
                "procs": [[int(x.pid), int(x.usedGpuMemory) if x.usedGpuMemory is not None else None]
                          + ([] if sm is None else [sm.get(int(x.pid), 0.0)])
                          for x in (ps or [])],
                "throttle": None if thr is None else list(decode_throttle(int(thr)) or ()),
            })
        return out

    def _proc_sm(self, i: int, h: Any) -> dict[int, float] | None:
        """Each process's mean SM share (%) since the last sample (nvmlDeviceGetProcessUtilization), as
        vtop/sources/nvml.py reads it: {} when NVML holds no sample (NVML_ERROR_NOT_FOUND), None on error."""
        N = self.N
        try:
            raw = N.nvmlDeviceGetProcessUtilization(h, self.util_seen.get(i, 0))
        except Exception as e:  # noqa: BLE001
            if isinstance(e, getattr(N, "NVMLError_NotFound", ())):
                return {}
            self.errors.setdefault("proc_util", repr(e))
            return None
        sums: dict[int, list[float]] = {}
        for smp in raw or ():
            self.util_seen[i] = max(self.util_seen.get(i, 0), int(smp.timeStamp))
            if 0 <= smp.smUtil <= 100:
                sums.setdefault(int(smp.pid), []).append(float(smp.smUtil))
        return {pid: round(sum(v) / len(v), 1) for pid, v in sums.items()}

    def mem_used(self) -> list[int | None]:
        """Memory used of every GPU (no GPM sample taken: that pair belongs to the sampler's thread)."""
        N = self.N
        return [getattr(self._try("mem", lambda h=h: N.nvmlDeviceGetMemoryInfo(h)), "used", None) for h in self.handles]


def open_nvml() -> tuple[Nvml | None, str | None]:
    try:
        if os.environ.get("VTOP_H200_FAKE_NVML") == "1":  # the dry run of the GPU sampling: vtop's scripted GPU
            from vtop.sources.fake_nvml import simulated

            return Nvml(simulated(1)), None
        return Nvml(), None
    except Exception as e:  # noqa: BLE001 - no GPU here (the dry run): no gpu.jsonl.gz
        return None, f"{type(e).__name__}: {e}"


# --- the sampler: record.py's, + cpu seconds per process, + gpu.jsonl.gz ------------------


class GpuSampler(R.Sampler):
    def __init__(self, out: Path, srv: Any, nvml: Nvml | None) -> None:
        super().__init__(out, srv)
        self.nvml = nvml
        if nvml is not None:
            self.files["gpu"] = gzip.open(out / "gpu.jsonl.gz", "wt", encoding="utf-8", compresslevel=9)
            self.threads.append(threading.Thread(target=self._loop, args=(1.0, self._gpu), daemon=True,
                                                 name="sample-gpu"))

    def _gpu(self, client: httpx.Client) -> None:
        assert self.nvml is not None
        t, mono = R.now()
        gpus = self.nvml.sample()
        names = {}
        for pid in sorted({p[0] for g in gpus for p in g["procs"]}):
            rec = R.read_proc(pid)
            if rec is not None:
                names[str(pid)] = proc_title(rec)
        self._write("gpu", {"t": round(t, 3), "mono": round(mono, 3), "gpus": gpus, "names": names})

    def _procs(self, client: httpx.Client) -> None:
        # record.py's, with "cpu" (user+system seconds) in every process
        self.log.follow(self.srv.log_path)
        self._log_index()
        t, mono = R.now()
        roots = {self.srv.pid} if self.srv.pid else set()
        tree = R.vllm_tree(R.all_procs(), roots)
        for rec in tree:
            if "cpu" not in rec:
                rec["cpu"] = cpu_seconds(rec["pid"])
        pids = tuple(r["pid"] for r in tree)
        if pids != self._procs_last or mono >= self._procs_next:
            self._procs_last = pids
            self._procs_next = mono + 2.0 - 0.05
            self._write("procs", {"t": round(t, 3), "mono": round(mono, 3), "procs": tree})


# --- the context -----------------------------------------------------------------------


class GpuCtx(R.Ctx):
    def __init__(self, sc: R.Scenario, out: Path, seconds: float, work: Path, params: dict[str, Any],
                 scale: float) -> None:
        super().__init__(sc, out, seconds, work)
        self.srv = GpuServer()  # type: ignore[assignment]
        self.p = params
        self.scale = scale
        self.nvml: Nvml | None = None
        self.hog: subprocess.Popen[bytes] | None = None

    def event_at(self, t_wall: float, what: str, **kw: Any) -> dict[str, Any]:
        ev = {"t": round(t_wall, 3), "mono": round(_mono_of(t_wall), 3), "what": what, **kw}
        with self._ev_lock:
            self.events.append(ev)
            self._ev_file.write(json.dumps(ev) + "\n")
            self._ev_file.flush()
        print(f"[{time.strftime('%H:%M:%S')}] {what} {json.dumps(kw)}", flush=True)
        return ev

    def sleep(self, s: float) -> None:
        time.sleep(max(0.0, s * self.scale))

    def launch(self, extra_args: tuple[str, ...] = (), *, pipe: bool = False, **_: Any) -> None:  # type: ignore[override]
        srv: GpuServer = self.srv  # type: ignore[assignment]
        info = srv.launch(extra_args, pipe=pipe)
        cmd = R.mask_argv([str(c) for c in info.get("cmd") or []])
        flags = cmd[cmd.index("serve") + 2:] if "serve" in cmd[:-1] else []
        if self.flags is None:
            self.flags = flags
        self.event_at(float(info["t_launch"]), "launch", pid=info["pid"], flags=flags, model=srv.served_model_dir,
                      env=None, kv_cache_space_gib=None, cmd=cmd, log=str(info.get("log")))

    def wait_ready(self, timeout: float | None = None) -> float:
        srv: GpuServer = self.srv  # type: ignore[assignment]
        s = srv.wait_health(timeout or self.p["ready_timeout_s"])
        self.event("ready", healthy_after_s=round(s, 1), model=srv.model, max_model_len=srv.max_model_len)
        return s

    def wait_exit(self, timeout: float) -> int | None:
        srv: GpuServer = self.srv  # type: ignore[assignment]
        deadline = time.monotonic() + timeout
        while srv.is_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        if srv.is_running():
            return None
        self.event("server_exit", pid=srv.pid, returncode=None)  # not our child: serve.sh's setsid
        return 0

    def engine(self, timeout: float = 10.0) -> list[int]:
        srv: GpuServer = self.srv  # type: ignore[assignment]
        deadline = time.monotonic() + timeout
        while True:
            pids = srv.engine_pids()
            if pids or time.monotonic() >= deadline:
                return pids
            time.sleep(0.2)


# --- traffic ---------------------------------------------------------------------------

_WORDS: list[str] = []


def _prompt(rng: random.Random, lo: int, hi: int) -> str:
    if not _WORDS:
        w = random.Random(11)
        _WORDS.extend("".join(w.choice("bcdfghjklmnprstvwz") + w.choice("aeiou") for _ in range(w.randint(1, 4)))
                      for _ in range(3000))
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def burst(ctx: GpuCtx, n: int, max_tokens: int, cap_s: float) -> dict[str, Any]:
    """``n`` /v1/completions at once (a client connection each), cancelled after ``cap_s``."""
    url, model = ctx.srv.url, ctx.srv.model

    async def run() -> dict[str, Any]:
        rng = random.Random(5)
        res: list[tuple[float, float, Any]] = []
        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(cap_s + 30), limits=limits) as c:
            async def one() -> None:
                body = {"model": model, "prompt": _prompt(rng, 20, 300), "max_tokens": max_tokens,
                        "temperature": 0.8, "ignore_eos": True}
                t = time.monotonic()
                try:
                    r = await c.post("/v1/completions", json=body)
                    res.append((t, time.monotonic(), r.status_code))
                except Exception as e:  # noqa: BLE001 - counted
                    res.append((t, time.monotonic(), type(e).__name__))

            tasks = [asyncio.create_task(one()) for _ in range(n)]
            _done, pending = await asyncio.wait(tasks, timeout=cap_s)
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        ok = sorted(b - a for a, b, s in res if s == 200)
        return {"ok": len(ok), "failed": len(res) - len(ok), "cancelled": len(pending),
                "errors": sorted({str(s) for _, _, s in res if s != 200})[:5],
                "lat_p50": round(ok[len(ok) // 2], 2) if ok else None, "lat_max": round(ok[-1], 2) if ok else None}

    return asyncio.run(run())


class SteadyLoad:
    """``conc`` clients each sending /v1/completions one after the other until stopped (bounded in time)."""

    def __init__(self, ctx: GpuCtx, conc: int, max_tokens: int, time_limit: float) -> None:
        self.ctx, self.conc, self.max_tokens, self.time_limit = ctx, conc, max_tokens, time_limit
        self.sent = self.ok = self.failed = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(conc)]

    def start(self) -> SteadyLoad:
        self.ctx.event("load_begin", kind="steady", concurrency=self.conc, max_tokens=self.max_tokens)
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        rng = random.Random(100 + i)
        t0 = time.monotonic()
        with httpx.Client(base_url=self.ctx.srv.url, timeout=httpx.Timeout(150.0, connect=5.0)) as c:
            while not self._stop.is_set() and time.monotonic() - t0 < self.time_limit:
                body = {"model": self.ctx.srv.model, "prompt": _prompt(rng, 20, 200), "max_tokens": self.max_tokens,
                        "temperature": 0.8, "ignore_eos": True}
                with self.lock:
                    self.sent += 1
                try:
                    ok = c.post("/v1/completions", json=body).status_code == 200
                except Exception:  # noqa: BLE001 - counted
                    ok = False
                    self._stop.wait(1.0)
                with self.lock:
                    if ok:
                        self.ok += 1
                    else:
                        self.failed += 1

    def stop(self, timeout: float = 160.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.ctx.event("load_end", kind="steady", sent=self.sent, ok=self.ok, failed=self.failed)


# --- scenarios -----------------------------------------------------------------------------


@dataclass
class GpuScenario:
    sc: R.Scenario
    estimate_s: float  # launch to end, with a cold-ish start, for --budget-s


SCENARIOS: dict[str, GpuScenario] = {}


def scenario(name: str, cls: str, estimate_s: float) -> Callable[[Callable[[GpuCtx], None]], Callable[[GpuCtx], None]]:
    def deco(fn: Callable[[GpuCtx], None]) -> Callable[[GpuCtx], None]:
        SCENARIOS[name] = GpuScenario(R.Scenario(name, cls, fn, 0.0, " ".join((fn.__doc__ or "").split())),  # type: ignore[arg-type]
                                      estimate_s)
        return fn

    return deco


def _ready_then_short_traffic(ctx: GpuCtx) -> Any:
    """Launch to ready, 15 s idle, short requests (max_tokens 16-64) every 2-5 s from then on, 5 s of them."""
    ctx.launch()
    ctx.wait_ready()
    ctx.sleep(15)
    short = R.ShortTraffic(ctx, max_count=100, time_limit=200 * ctx.scale)  # type: ignore[arg-type]
    short.start()
    ctx.sleep(5)
    return short


@scenario("h200-runaway-short-traffic", "runaway", 300)
def runaway_short_traffic(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (request logging off): cold launch through graph capture to ready,
    15 s idle, then short requests (max_tokens 16-64) every 2-5 s and one streaming chat request without
    max_tokens (ignore_eos) that would run ~70 s to the 32,768-token limit; the client hangs up at +75 s
    unless it finished first; 30 s after."""
    short = _ready_then_short_traffic(ctx)
    ra = R.Stream(ctx, "runaway", read_timeout=120.0, time_limit=300.0).start()  # type: ignore[arg-type]
    if not ra.done.wait(ctx.p["runaway_hangup_s"] * ctx.scale):
        ra.hangup()
    ctx.sleep(30)
    short.stop()


@scenario("h200-runaway-nonstreaming-short-traffic", "runaway", 300)
def runaway_nonstreaming_short_traffic(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (request logging off): launch through graph capture to ready, 15 s
    idle, then short requests (max_tokens 16-64) every 2-5 s and one NON-streaming chat request without
    max_tokens (ignore_eos) that runs ~60 s to the 32,768-token limit (58.7 s on 2026-12-02; the streaming one
    69-71 s), on a connection of its own that stays silent until the answer; the client hangs up at +75 s (its read timeout) unless it finished first;
    30 s after."""
    short = _ready_then_short_traffic(ctx)
    give_up = float(ctx.p["runaway_hangup_s"]) * ctx.scale
    body = {"model": ctx.srv.model, "ignore_eos": True, "temperature": 0.8,
            "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    ra = R.NonStream(ctx, "runaway", "/v1/chat/completions", body, give_up_s=give_up).start()  # type: ignore[arg-type]
    if not ra.done.wait(give_up + 40):
        ctx.notes.append("the non-streaming request did not end with the client's read timeout")
    ctx.sleep(30)
    short.stop()


def _capture_watch(ctx: GpuCtx, rx: re.Pattern[bytes], timeout: float) -> tuple[float | None, str | None]:
    """Wait for a capture progress frame strictly inside its range (k/n with 0 < k < n; a pattern without
    groups: any match) and SIGSTOP the engine at once (its pids are looked up beforehand, every 0.5 s: the
    capture of 51 sizes takes about a second); returns (wall time the frame was read, the frame), or
    (None, None) when nothing was stopped."""
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    engine: list[int] = []
    next_lookup = 0.0

    def stop(found: tuple[float, str]) -> tuple[float, str]:
        pids = engine or ctx.engine(5)
        assert pids, "no VLLM::EngineCore"
        ctx.stop_procs(pids, "EngineCore" if len(pids) == 1 else "EngineCore+Worker")
        return found

    deadline = time.monotonic() + timeout
    pos = 0
    last_frame: tuple[float, str] | None = None
    while time.monotonic() < deadline:
        if srv.log_path is not None:
            try:
                with open(srv.log_path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except OSError:
                chunk = b""
            if chunk:
                t_read = time.time()
                pos += len(chunk)
                for m in rx.finditer(chunk):
                    frame = m.group(0).decode(errors="replace")[-200:]
                    last_frame = (t_read, frame)
                    if m.groups():
                        k, n = int(m.group(1)), int(m.group(2))
                        if 0 < k < n:
                            return stop((t_read, frame))
                    else:
                        return stop((t_read, frame))
                if b"Graph capturing finished" in chunk and last_frame is not None:
                    ctx.notes.append("the capture finished before a frame inside its range was read")
                    return stop(last_frame)
        if time.monotonic() >= next_lookup:
            next_lookup = time.monotonic() + 0.5
            engine = srv.engine_pids()
            if not srv.is_running():
                return None, None
        time.sleep(0.005)
    return None, None


@scenario("h200-startup-stall-graph-capture", "startup_stall", 330)
def startup_stall_graph_capture(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags: launch; while the log shows CUDA graph capture in progress (a tqdm
    frame of `Capturing CUDA graphs (...): N%|...| k/51`), the VLLM::EngineCore process (on one GPU the model
    runs in it) is SIGSTOPped for 120 s: the progress stops, the port stays refused; SIGCONT, the start
    completes; 20 s after."""
    ctx.launch()
    rx = re.compile(ctx.p["capture_re"])
    t_frame, frame = _capture_watch(ctx, rx, 400)
    if t_frame is None:
        ctx.notes.append("never saw a capture progress frame: nothing was stopped")
        return
    late = [p for p in ctx.engine(0) if p not in ctx.stopped_pids]  # a Worker spawned since the last look-up
    if late:
        ctx.stop_procs(late, "Worker")
    size = ctx.sampler.log.size() if ctx.sampler else 0
    ctx.event_at(t_frame, "last_progress", frame=frame)
    ctx.event("log_size_at_sigstop", size=size)
    ctx.sleep(120)
    ctx.cont_procs()
    ctx.wait_ready(300)
    ctx.sleep(20)


HOG = """
import os, sys, time, torch
n = int(float(sys.argv[1]) * 2**30)
x = torch.empty(n, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(sys.argv[2], "w").write(str(n))
time.sleep(float(sys.argv[3]))
"""


def _torch_python() -> str:
    if TORCH_PY:
        return TORCH_PY
    for py in (sys.executable, "/opt/torch/.venv/bin/python3", "python3"):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([py, "-c", "import torch"], capture_output=True, timeout=120, env=env)
        if r.returncode == 0:
            return py
    raise R.ServerFailed("no Python with torch for the memory hog")


@scenario("h200-startup-failure-cuda-oom", "startup_failure", 180)
def startup_failure_cuda_oom(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0: another process (torch, started under setsid) holds ~100 GiB of the GPU's memory;
    vLLM is launched with the default --gpu-memory-utilization 0.5 and fails at startup: the free memory is
    less than the 50 % it wants (ValueError: Free memory on device ... on startup is less than desired GPU
    memory utilization); the server exits; the hog is killed at the end."""
    gib = float(ctx.p["hog_gib"])
    if gib > 0:
        ready = ctx.work / "hog.ready"
        with contextlib.suppress(OSError):
            ready.unlink()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the image's torch, nothing of ours
        ctx.hog = subprocess.Popen([_torch_python(), "-c", HOG, str(gib), str(ready), "900"], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=open(ctx.work / "hog.err", "wb"), start_new_session=True)  # noqa: SIM115
        ctx.event("hog_start", pid=ctx.hog.pid, gib=gib)
        deadline = time.monotonic() + 120
        while not ready.exists() and ctx.hog.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            err = (ctx.work / "hog.err").read_text(errors="replace")[-800:]
            raise R.ServerFailed(f"the memory hog did not allocate {gib} GiB: {err}")
        ctx.event("hog_ready", pid=ctx.hog.pid, gib=gib, mem_used=ctx.nvml.mem_used() if ctx.nvml else None)
    # VTOP_H200_OOM_ARGS: flags that make the CPU build fail at startup too (the dry run)
    ctx.launch(tuple(os.environ.get("VTOP_H200_OOM_ARGS", "").split()))
    if ctx.wait_exit(300) is None:
        ctx.notes.append("the server did not exit within 300 s")
    ctx.sleep(10)
    m = re.search(r"Free memory on device[^\n]*", ctx.srv.log_text())
    ctx.truth_extra["memory_error_line"] = m.group(0)[:400] if m else None
    ctx.truth_extra["hog_gib"] = gib


MATMUL = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
(a @ b).sum().item()
open(sys.argv[1], "w").write("1")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


@scenario("h200-neighbour-matmul", "gpu_neighbour", 330)
def neighbour_matmul(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (request logging off): launch to ready, 10 s idle; 32 streaming chat
    requests at a time (max_tokens 8192, ignore_eos, each replaced when done) for ~170 s; 60 s into the load a
    torch process (setsid, not vLLM's) runs bf16 8192x8192 matmuls on the same GPU for 60 s (neighbour_ready ..
    neighbour_end); 50 s after it ends the load stops; 20 s idle. Issue 40's noisy neighbour: vLLM's token rate
    before, during and after, NVML's per-process SM share (procs' third field) and the clock-event reasons.
    Truth: began = neighbour_ready, should_alert_by = began + 45 s, ended = neighbour_end."""
    ctx.launch()
    ctx.wait_ready()
    ctx.sleep(10)
    pool = R.StreamPool(ctx, n=32, max_tokens=8192, max_total=2000, time_limit=180 * ctx.scale)  # type: ignore[arg-type]
    pool.start()
    ctx.sleep(60 * ctx.scale)
    ready = ctx.work / "matmul.ready"
    with contextlib.suppress(OSError):
        ready.unlink()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the image's torch, nothing of ours
    ctx.hog = subprocess.Popen([_torch_python(), "-c", MATMUL, str(ready), str(60 * ctx.scale)], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=open(ctx.work / "matmul.err", "wb"), start_new_session=True)  # noqa: SIM115
    ctx.event("neighbour_start", pid=ctx.hog.pid)
    deadline = time.monotonic() + 120
    while not ready.exists() and ctx.hog.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not ready.exists():
        ctx.notes.append("the matmul process did not start: " + (ctx.work / "matmul.err").read_text(errors="replace")[-400:])
    ctx.event("neighbour_ready", pid=ctx.hog.pid)
    ctx.hog.wait(60 * ctx.scale + 60)
    ctx.event("neighbour_end", pid=ctx.hog.pid, rc=ctx.hog.returncode)
    ctx.sleep(50 * ctx.scale)
    pool.stop()
    ctx.sleep(20)


def _prompt_logprobs_burst(ctx: GpuCtx, n: int, prompt_tokens: int) -> list[str]:
    """``n`` completions at once, each a prompt of ``prompt_tokens`` token ids with ``prompt_logprobs`` 5 and
    max_tokens 1 (vLLM computes the log-softmax over the whole vocabulary for every prompt token); each
    answer's status or error, in order."""
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    out: list[str] = [""] * n
    body = {"model": srv.model, "prompt": [1000 + i % 500 for i in range(prompt_tokens)], "max_tokens": 1,
            "prompt_logprobs": 5, "temperature": 0.0}

    def one(i: int) -> None:
        try:
            with httpx.Client(timeout=httpx.Timeout(180.0, connect=5.0)) as c:
                r = c.post(f"{srv.url}/v1/completions", json=body)
                out[i] = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            out[i] = f"{type(e).__name__}: {str(e)[:120]}"

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    return out


@scenario("h200-runtime-oom-prompt-logprobs", "runtime_oom", 420)
def runtime_oom_prompt_logprobs(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, --gpu-memory-utilization 0.97 --max-num-batched-tokens 32768 (little room beside what
    vLLM profiled, long prefills in one step): launch to ready, 10 s idle, short requests every 2-5 s; 30 s
    after ready, bursts of long prompts (30,000 token ids each, prompt_logprobs 5, max_tokens 1) at 2, 4, 8
    and 16 at once, 15 s apart, until the engine dies (issue 40's runtime OOM by stage: the log-softmax over the
    vocabulary for every prompt token outgrows what the profile run measured) or all four bursts are answered;
    30 s after. Truth: began = the burst that killed it (oom_burst), should_alert_by = the engine's death seen
    (health not 200 or the process gone) + 10 s. What vLLM did is in events.jsonl (each answer's status)."""
    ctx.launch(("--gpu-memory-utilization", "0.97", "--max-num-batched-tokens", "32768"))
    ctx.wait_ready()
    ctx.sleep(10)
    short = R.ShortTraffic(ctx, max_count=100, time_limit=300 * ctx.scale)  # type: ignore[arg-type]
    short.start()
    ctx.sleep(20)
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    for n in (2, 4, 8, 16):
        ctx.event("oom_burst", n=n, prompt_tokens=30000)
        answers = _prompt_logprobs_burst(ctx, n, 30000)
        ctx.event("oom_burst_answered", n=n, answers=answers)
        dead = not srv.is_running()
        if not dead:
            try:
                with httpx.Client(timeout=5.0) as c:
                    dead = c.get(f"{srv.url}/health").status_code != 200
            except httpx.HTTPError:
                dead = True
        if dead:
            ctx.event("engine_dead_seen", after_burst=n)
            break
        ctx.sleep(15)
    else:
        ctx.notes.append("no OOM: every burst was answered (vLLM's chunked prefill kept the logits small?)")
    ctx.sleep(30)
    short.stop()


@scenario("h200-starts-history-budget", "normal", 420)
def starts_history_budget(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0: three starts of the same model, each to ready and 5 s more, their logs kept as
    start-0.log .. start-2.log: the first with the default --gpu-memory-utilization 0.5 (the compile cache as
    the machine has it: cold on a fresh one), the second the same (the compile cache warm: its hit), the third
    at 0.8. Issue 40's start history (this model's phase times, cold then warm) and memory budget (vLLM's
    profiling lines at 0.5 and 0.8 beside NVML). The trace is the last start; truth: normal."""
    cache = Path.home() / ".cache" / "vllm" / "torch_compile_cache"
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    for k, extra in enumerate(((), (), ("--gpu-memory-utilization", "0.8"))):
        ctx.event("start_begin", k=k, extra=list(extra), compile_cache_present=cache.exists())
        ctx.launch(extra)
        ready_s = ctx.wait_ready()
        ctx.sleep(5)
        if srv.log_path is not None and srv.log_path.exists():
            shutil.copyfile(srv.log_path, ctx.out / f"start-{k}.log")
        ctx.event("start_kept", k=k, healthy_after_s=round(ready_s, 1), mem_used=ctx.nvml.mem_used() if ctx.nvml else None)
        if k < 2:
            srv.stop()
            ctx.sleep(3)
    ctx.sleep(10)


@scenario("h200-normal-burst-queue", "normal", 200)
def normal_burst_queue(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (max_num_seqs 1024): warm launch to ready, 10 s idle, a burst of 1500
    /v1/completions at once (max_tokens 192, ignore_eos, prompts of 20-300 words): running capped at 1024 and a
    waiting queue of hundreds that drains in ~20 s; then 30 s idle. Normal."""
    ctx.launch()
    ctx.wait_ready()
    ctx.sleep(10)
    n, mt = int(ctx.p["burst_n"]), int(ctx.p["burst_tokens"])
    ctx.event("load_begin", kind="burst", n=n, concurrency=n, max_tokens=mt)
    res = burst(ctx, n, mt, float(ctx.p["burst_cap_s"]))
    ctx.event("load_end", kind="burst", **res)
    ctx.sleep(30)


@scenario("h200-normal-streams", "normal", 300)
def normal_streams(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (request logging off): launch to ready, 10 s idle; then for ~120 s,
    12 streaming chat requests at a time with max_tokens 8192 (ignore_eos; each replaced when done) and short
    requests (max_tokens 16-64) every 2-5 s over one kept-alive connection; the streams still running are hung
    up at the end; 20 s idle. Normal: long answers streaming on many connections at once, none near a minute.
    Recorded for the kernel's counters of the connections (conns.jsonl.gz)."""
    ctx.launch()
    ctx.wait_ready()
    ctx.sleep(10)
    short = R.ShortTraffic(ctx, max_count=100, time_limit=150 * ctx.scale)  # type: ignore[arg-type]
    short.start()
    pool = R.StreamPool(ctx, n=12, max_tokens=8192, max_total=300, time_limit=120 * ctx.scale)  # type: ignore[arg-type]
    pool.start()
    ctx.sleep(120 * ctx.scale)
    pool.stop()
    short.stop()
    ctx.sleep(20)


@scenario("h200-normal-long-nonstreaming", "normal", 280)
def normal_long_nonstreaming(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (request logging off): launch to ready, 10 s idle; then for ~120 s,
    8 NON-streaming chat requests at a time with max_tokens 8192 (ignore_eos; a connection each, silent until
    its answer; each replaced when done) and short requests (max_tokens 16-64) every 2-5 s; those still running
    at the end are let finish; 20 s idle. Normal: long answers that come back whole, none near a minute."""
    ctx.launch()
    ctx.wait_ready()
    ctx.sleep(10)
    short = R.ShortTraffic(ctx, max_count=100, time_limit=150 * ctx.scale)  # type: ignore[arg-type]
    short.start()
    pool = R.NonStreamPool(ctx, n=int(ctx.p["pool_nonstream"]), max_tokens=int(ctx.p["pool_nonstream_tokens"]),  # type: ignore[arg-type]
                           give_up_s=120.0, max_total=300, time_limit=120 * ctx.scale)
    pool.start()
    ctx.sleep(120)
    pool.stop()
    short.stop()
    ctx.sleep(20)


@scenario("h200-engine-stall-load", "engine_stall", 220)
def engine_stall_load(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags: warm launch, steady load (16 concurrent /v1/completions, max_tokens
    256); after 20 s the VLLM::EngineCore is SIGSTOPped for 45 s, SIGCONT, 30 s after."""
    ctx.launch()
    ctx.wait_ready()
    load = SteadyLoad(ctx, int(ctx.p["steady_conc"]), int(ctx.p["steady_tokens"]),
                      time_limit=(20 + 45 + 30 + 10) * ctx.scale).start()
    ctx.sleep(20)
    pids = ctx.engine(5)
    assert pids, "no VLLM::EngineCore"
    ctx.stop_procs(pids, "EngineCore" if len(pids) == 1 else "EngineCore+Worker")
    ctx.sleep(45)
    ctx.cont_procs()
    ctx.sleep(30)
    load.stop()


@scenario("h200-engine-stall-streams-nolog", "engine_stall", 280)
def engine_stall_streams_nolog(ctx: GpuCtx) -> None:
    """H200, vLLM 0.26.0, default flags (request logging off), vLLM's stdout and stderr a PIPE (no log file for
    vtop to find; the recorder copies it for the trace, truth log_for_vtop false): launch to ready, 10 s idle;
    3 streaming chat requests with max_tokens 8192 (ignore_eos; each replaced when done); after 20 s the
    VLLM::EngineCore is SIGSTOPped for 75 s while the three clients wait on open streams; `vtop doctor --window
    15 URL` (no --log) is started 30 s after the stop, so its window ends at 45 s, its output kept in the trace
    (doctor-30s.txt, its exit status in events.jsonl); SIGCONT, 30 s after. Issue 49's proof: the doctor names
    the stall, dated from the connections (the kernel's last-sent time of the three streams)."""
    ctx.truth_extra.update(log_for_vtop=False, doctor_after_s=[30])
    ctx.launch(pipe=True)
    ctx.wait_ready()
    ctx.sleep(10)
    pool = R.StreamPool(ctx, n=3, max_tokens=int(ctx.p["nolog_stream_tokens"]), max_total=60,  # type: ignore[arg-type]
                        time_limit=(20 + 75 + 30) * ctx.scale)
    pool.start()
    ctx.sleep(20)
    pids = ctx.engine(5)
    assert pids, "no VLLM::EngineCore"
    eng = pids[:1]  # the EngineCore only (its workers, where there are any, left running)
    ctx.stop_procs(eng, "EngineCore")
    stopped_at = time.monotonic()
    doc = _doctor_after(ctx, stopped_at + 30 * ctx.scale, "doctor-30s")
    rest = 75 * ctx.scale - (time.monotonic() - stopped_at)
    time.sleep(max(0.0, rest))
    ctx.cont_procs()
    if doc is not None:
        doc.join(60)
    ctx.sleep(30)
    pool.stop()


def _doctor_after(ctx: GpuCtx, at_mono: float, name: str) -> threading.Thread | None:
    """At ``at_mono``, `python3 -m vtop doctor --window 15 URL` (no --log) in a thread; its stdout and stderr
    to TRACE/NAME.txt, its exit status and times to events.jsonl (doctor_begin / doctor_end)."""
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    window = 15.0 * ctx.scale

    def run() -> None:
        time.sleep(max(0.0, at_mono - time.monotonic()))
        cmd = [sys.executable, "-m", "vtop", "doctor", "--window", f"{window:g}", srv.url]
        ctx.event("doctor_begin", cmd=cmd[1:], name=name)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=window + 90)
            (ctx.out / f"{name}.txt").write_text(r.stdout + (("\n--- stderr\n" + r.stderr) if r.stderr else ""))
            ctx.event("doctor_end", name=name, exit_code=r.returncode,
                      first_lines=[ln for ln in r.stdout.splitlines() if ln.startswith(("[", "no alerts"))][:4])
        except (OSError, subprocess.SubprocessError) as e:
            ctx.event("doctor_end", name=name, error=f"{type(e).__name__}: {e}")

    t = threading.Thread(target=run, daemon=True, name=name)
    t.start()
    return t


# --- recording ---------------------------------------------------------------------------


def _truth(ctx: GpuCtx, index: list[dict[str, Any]], log: bytes, version: str | None) -> dict[str, Any]:
    truth = R.build_truth(ctx, index, log, version)
    cls = ctx.sc.cls
    if cls == "runaway" and truth["ended"] is None:
        end = ctx.first("runaway_end")  # it ran to the length limit before the hang-up
        truth["ended"] = end and end["t"]
    if cls == "startup_stall":
        st, lp = ctx.first("sigstop"), ctx.first("last_progress")
        if st is not None:
            truth["began"] = truth["detectable_from"] = st["t"]
            truth["should_alert_by"] = round((lp or st)["t"] + R.BUDGET["startup_stall"], 3)
    if cls == "runtime_oom":
        bursts = [e for e in ctx.events if e.get("what") == "oom_burst"]
        dead = ctx.first("engine_dead_seen")
        if dead is not None and bursts:
            truth["began"] = truth["detectable_from"] = bursts[-1]["t"]
            truth["should_alert_by"] = round(dead["t"] + R.BUDGET["runtime_oom"], 3)
    if cls == "gpu_neighbour":
        nb, end = ctx.first("neighbour_ready"), ctx.first("neighbour_end")
        if nb is not None:
            truth["began"] = truth["detectable_from"] = nb["t"]
            truth["should_alert_by"] = round(nb["t"] + R.BUDGET["gpu_neighbour"], 3)
            truth["ended"] = end and end["t"]
    truth["server"]["gpu"] = ctx.truth_extra.pop("gpu_name", None)
    truth["recorder"] = "tools/device/h200_corpus.py"
    return truth


def record_one(gs: GpuScenario, out: Path, params: dict[str, Any], scale: float) -> int:
    sc = gs.sc
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = R.WORK / ("h200-" + out.name)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = GpuCtx(sc, out, 0.0, work, params, scale)
    nvml, why = open_nvml()
    ctx.nvml = nvml
    if nvml is None:
        ctx.notes.append(f"NVML unavailable ({why}): no gpu.jsonl.gz.")
    else:
        with contextlib.suppress(Exception):
            name = nvml.N.nvmlDeviceGetName(nvml.handles[0])
            ctx.truth_extra["gpu_name"] = name.decode() if isinstance(name, bytes) else str(name)
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    atexit.register(srv._emergency_stop)
    sampler = GpuSampler(out, srv, nvml)
    ctx.sampler = sampler
    t0 = time.monotonic()
    rc = 0
    sampler.start()
    try:
        try:
            sc.fn(ctx)  # type: ignore[arg-type]
        except (R.ServerFailed, AssertionError, httpx.HTTPError, OSError, subprocess.SubprocessError) as e:
            ctx.notes.append(f"scenario error: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            ctx.event("scenario_error", error=str(e)[:2000])
            rc = 1
        except KeyboardInterrupt as e:  # SIGTERM (timeout) or Ctrl-C: still write what was recorded
            ctx.notes.append(f"interrupted ({e}) before the scenario ended")
            ctx.event("interrupted", error=str(e))
            rc = 130
        ctx.event("end")
    finally:
        ctx.close()  # SIGCONT of anything still stopped
        sampler.stop()
        version = None
        with contextlib.suppress(Exception):
            for line in gzip.open(out / "info.jsonl.gz", "rt"):
                version = json.loads(line).get("version") or version
        srv.stop()
        if ctx.hog is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(ctx.hog.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                ctx.hog.wait(30)
            print(f"[hog] pid {ctx.hog.pid} killed", flush=True)
            deadline = time.monotonic() + 30  # the next scenario's start must find the memory free
            while nvml is not None and time.monotonic() < deadline:
                used = [u for u in nvml.mem_used() if u is not None]
                if not used or max(used) < 8 * 2**30:
                    break
                time.sleep(0.5)
        atexit.unregister(srv._emergency_stop)
        if nvml is not None and nvml.errors:
            ctx.truth_extra["nvml_errors"] = nvml.errors
    size_limit = sampler.last_index[2] if sampler.last_index else 0
    log = sampler.log.data(size_limit)
    with gzip.open(out / "log.bin.gz", "wb", compresslevel=9) as f:
        f.write(log)
    index = [json.loads(x) for x in gzip.open(out / "log-index.jsonl.gz", "rt") if x.strip()]
    ours = {e.get("pid") for e in ctx.events if e["what"] == "launch"}
    others: set[int] = set()
    with contextlib.suppress(Exception):
        for x in gzip.open(out / "procs.jsonl.gz", "rt"):
            others |= {r["pid"] for r in json.loads(x)["procs"] if R.is_vllm_server(r) and r["pid"] not in ours}
    if others:
        ctx.notes.append(f"Another vLLM server (pid {sorted(others)}) ran on the box during the recording.")
    truth = _truth(ctx, index, log, version)
    truth["duration_s"] = round(time.monotonic() - t0, 1)
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(json.dumps({"trace": str(out), "duration_s": truth["duration_s"], "size": sum(sizes.values()),
                      "files": sizes, "metrics_rows": sampler.counts,
                      "truth": {k: truth[k] for k in ("class", "began", "should_alert_by", "ended")},
                      "key_lines": R.key_lines(log)}, indent=2), flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tools.device.h200_corpus", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="?", help="comma-separated: " + ",".join(SCENARIOS))
    ap.add_argument("--out", type=Path, help="the folder the trace folders go into")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip a scenario whose estimate does not fit")
    ap.add_argument("--small", action="store_true", help="loads sized for a CPU server (the dry run)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the scenario's waits (the dry run)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list or not a.scenarios:
        for g in SCENARIOS.values():
            print(f"{g.sc.name:<36} {g.sc.cls:<16} ~{g.estimate_s:>3.0f} s  {g.sc.doc[:90]}")
        return 0
    if a.out is None:
        ap.error("--out is required")
    names = [n for n in a.scenarios.split(",") if n]
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; known: {', '.join(SCENARIOS)}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a burst holds 1500 connections
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    params = SMALL_PARAMS if a.small else GPU_PARAMS
    deadline = time.monotonic() + a.budget_s
    rc = 0
    for n in names:
        g = SCENARIOS[n]
        left = deadline - time.monotonic()
        if g.estimate_s * max(a.scale, 0.5) > left:
            print(f"[skip] {n}: ~{g.estimate_s:.0f} s does not fit in the {left:.0f} s left", flush=True)
            rc = rc or 3
            continue
        print(f"[scenario] {n} (~{g.estimate_s:.0f} s, {left:.0f} s left)", flush=True)
        one = record_one(g, a.out / n, params, a.scale)
        rc = one or rc
        if one == 130:
            break
    return rc


if __name__ == "__main__":
    sys.exit(main())
