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
* every process of ``procs.jsonl.gz`` carries ``"cpu"``: its user+system CPU seconds;
* the runtime-OOM scenario serves a copy of ``/tmp/tiny`` (``VTOP_H200_TINY``) with a vocabulary of 151,936
  (``resize_vocab``, plain Python) through a copy of serve.sh that names it (``serve_script_for``), with
  ``VLLM_USE_V2_MODEL_RUNNER=0``: its docstring has the arithmetic.

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
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
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
#: the model serve.sh serves (the shared recipe's make_tiny.py builds it; the dry run: /tmp/tinyllama)
TINY = Path(os.environ.get("VTOP_H200_TINY", "/tmp/tiny"))

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
    # h200-runtime-oom-prompt-logprobs: the served copy's vocabulary and the prompts' length (token ids)
    "oom_vocab": 151936, "oom_prompt_tokens": 30000,
    # a tqdm frame of the capture, e.g. "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|...| 20/51"
    "capture_re": rb"Capturing CUDA graphs[^\r\n]*?(\d+)/(\d+)",
}
#: --small: a CPU server of 2 cores (the dry run)
SMALL_PARAMS: dict[str, Any] = {
    **GPU_PARAMS, "burst_n": 48, "burst_tokens": 48, "burst_cap_s": 120.0, "steady_conc": 4, "steady_tokens": 48,
    "runaway_hangup_s": 40.0, "pool_nonstream": 2, "pool_nonstream_tokens": 96,
    "nolog_stream_tokens": 1500, "hog_gib": float(os.environ.get("VTOP_H200_HOG_GIB", "0")),
    "oom_vocab": 32000, "oom_prompt_tokens": 1500,  # the CPU build's 2,048-token context, a box of 2 cores
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

    def launch(self, extra: tuple[str, ...] = (), *, pipe: bool = False, serve: str | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
        """Start vLLM with serve.sh; ``pipe``: its stdout and stderr a PIPE (serve.sh's ``--log /dev/stdout``
        reopens this recorder's pipe), which a thread here copies into LOG for the trace: no file that vtop
        could find behind the process (``/proc/PID/fd/1`` reads ``pipe:[...]``), as under a supervisor.
        ``serve``: another serve script (default SERVE); ``env``: variables added to its environment (vLLM
        inherits them: serve.sh exports its own and keeps the rest)."""
        self.stop(quiet=True)
        with contextlib.suppress(OSError):
            (RUN_DIR / "serve.json").unlink()
        with contextlib.suppress(OSError):
            LOG.unlink()
        script = serve or SERVE
        full_env = {**os.environ, **(env or {})}
        if pipe:
            return self._launch_piped(extra, script, full_env)
        cmd = ["bash", script, "--log", str(LOG)] + (["--", *extra] if extra else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env)
        print(f"[serve] {' '.join(cmd)} -> rc {r.returncode}: {(r.stdout + r.stderr).strip()[-500:]}", flush=True)
        if r.returncode != 0:
            raise R.ServerFailed(f"serve.sh failed (rc {r.returncode}): {(r.stdout + r.stderr)[-1000:]}")
        self.info = json.loads((RUN_DIR / "serve.json").read_text())
        self.log_path = Path(self.info.get("log") or LOG)
        cmdline = [str(c) for c in self.info.get("cmd") or []]
        self.served_model_dir = cmdline[cmdline.index("serve") + 1] if "serve" in cmdline[:-1] else None
        self.model = self.max_model_len = None
        return self.info

    def _launch_piped(self, extra: tuple[str, ...], script: str, env: dict[str, str]) -> dict[str, Any]:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        LOG.write_bytes(b"")
        cmd = ["bash", script, "--log", "/dev/stdout"] + (["--", *extra] if extra else [])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env)
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

    def launch(self, extra_args: tuple[str, ...] = (), *, pipe: bool = False, serve: str | None = None,  # type: ignore[override]
               env: dict[str, str] | None = None, **_: Any) -> None:
        """serve.sh (or ``serve``) with ``extra_args``; ``env``: added to vLLM's environment and recorded in the
        launch event (the truth's ``server.env``)."""
        srv: GpuServer = self.srv  # type: ignore[assignment]
        info = srv.launch(extra_args, pipe=pipe, serve=serve, env=env)
        cmd = R.mask_argv([str(c) for c in info.get("cmd") or []])
        flags = cmd[cmd.index("serve") + 2:] if "serve" in cmd[:-1] else []
        if self.flags is None:
            self.flags = flags
        self.event_at(float(info["t_launch"]), "launch", pid=info["pid"], flags=flags, model=srv.served_model_dir,
                      env=dict(env) if env else None, kv_cache_space_gib=None, cmd=cmd, log=str(info.get("log")))

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
    Truth: began = neighbour_ready, should_alert_by = began + 45 s, ended = neighbour_end. (On the H100 of
    2026-12-05 the tiny model's decode did not slow at all: it is bound by the CPU, about 4 ms a step, not by
    the GPU; see h200-neighbour-gpu-bound.)"""
    ctx.launch()
    _neighbour_under_load(ctx)


#: a 7B-shaped Llama (Llama-3-8B's layer shapes, the tiny model's vocabulary of 8,000): 7.0e9 parameters, 14 GB
#: of bf16 that a decode step reads whole, about 4-5 ms a step on an H100's 3.35 TB/s: bound by the GPU
WIDE_CONFIG = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}


def wide_copy(src: Path, dst: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``src`` (its config and tokenizer, no weights) with ``overrides`` in config.json, for vLLM's
    ``--load-format dummy`` (random weights made on the GPU at load: nothing to write or read)."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json", ".bin")):
            shutil.copy2(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(overrides)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return {"src": str(src), "dst": str(dst), "config": overrides, "files": sorted(p.name for p in dst.iterdir())}


@scenario("h200-neighbour-gpu-bound", "gpu_neighbour", 330)
def neighbour_gpu_bound(ctx: GpuCtx) -> None:
    """H200 or H100, vLLM 0.26.0: as h200-neighbour-matmul, but vLLM serves a 7B-shaped copy of the tiny model
    (Llama-3-8B's layer shapes: hidden 4096, 32 layers, MLP 14336, 32 heads, 8 KV heads; the tiny model's
    tokenizer and vocabulary of 8,000) with --load-format dummy (random weights made at load), so that a decode
    step reads 14 GB of weights and is bound by the GPU: 32 streams (max_tokens 8192, ignore_eos) from 10 s after
    ready; 60 s in, a torch process (setsid, not vLLM's) runs bf16 8192x8192 matmuls on the same GPU for 60 s;
    50 s after, the load stops; 20 s idle. Truth: began = neighbour_ready, should_alert_by = began + 45 s,
    ended = neighbour_end (if vLLM's tokens per running request do not fall by a quarter, the trace is normal
    and its notes say so)."""
    dst = TINY.with_name(f"{TINY.name}-wide")
    try:
        made = wide_copy(TINY, dst, WIDE_CONFIG)
    except (OSError, ValueError) as e:
        raise R.ServerFailed(f"could not make the wide copy of {TINY}: {type(e).__name__}: {e}") from e
    ctx.event("model_copy", **made)
    ctx.truth_extra["model_copy"] = {"src": made["src"], "config": WIDE_CONFIG, "load_format": "dummy"}
    ctx.launch(("--load-format", "dummy"), serve=serve_script_for(dst, ctx.work))
    _neighbour_under_load(ctx)


def _neighbour_under_load(ctx: GpuCtx) -> None:
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


# --- the runtime OOM: a copy of the tiny model with a large vocabulary ---------------------------------

#: safetensors dtypes this copy can pad: element size and how one float is packed (BF16: a float32's top half)
_ST_DTYPES: dict[str, tuple[int, Callable[[float], bytes]]] = {
    "BF16": (2, lambda x: struct.pack("<f", x)[2:]),
    "F16": (2, lambda x: struct.pack("<e", x)),
    "F32": (4, lambda x: struct.pack("<f", x)),
}
#: the vocabulary-sized tensors of a Llama checkpoint (rows = token ids); tied embeddings have no lm_head
_VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")
_RESIZE_MARK = ".vtop-resized.json"


def _random_rows(dtype: str, n_elems: int, std: float, seed: int) -> bytes:
    """``n_elems`` values of N(0, std) in ``dtype``: a block of 65,521 (a prime: rows of any width do not
    repeat in step with it) drawn once and tiled, so that 70 M values take a second in plain Python."""
    size, pack = _ST_DTYPES[dtype]
    rng = random.Random(seed)
    k = 65521
    block = b"".join(pack(rng.gauss(0.0, std)) for _ in range(k))
    reps = -(-n_elems // k)
    return (block * reps)[: n_elems * size]


def _read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header, byte buffer) of a safetensors file (8-byte little-endian header length, JSON, data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_safetensors(path: Path, header: dict[str, Any], tensors: list[tuple[str, bytes]]) -> int:
    """Write ``tensors`` (name, bytes) in that order under ``header``'s dtypes and shapes (offsets
    recomputed; the JSON padded with spaces to a multiple of 8 bytes, as safetensors writes it)."""
    out: dict[str, Any] = {}
    if "__metadata__" in header:
        out["__metadata__"] = header["__metadata__"]
    pos = 0
    for name, data in tensors:
        out[name] = {"dtype": header[name]["dtype"], "shape": header[name]["shape"], "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    head = json.dumps(out, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, data in tensors:
            f.write(data)
    return 8 + len(head) + pos


def resize_vocab(src: Path, dst: Path, vocab: int, seed: int = 40) -> dict[str, Any]:
    """Copy the model folder ``src`` to ``dst`` with ``vocab`` token rows: config.json's ``vocab_size``, and the
    embedding and lm_head of its safetensors grown to [vocab, hidden] (the old rows kept, the new ones random
    N(0, initializer_range) in the checkpoint's dtype); the tokenizer and every other file copied as they are,
    so the new ids are never produced by the tokenizer (as Qwen's 151,936 rows beside a tokenizer of 151,665).
    Plain Python (no torch): ~1-3 s for the tiny model. Written beside ``dst`` and renamed into place; a
    ``dst`` already made for the same source and vocabulary is kept. Returns what was done (the launch's event)."""
    t0 = time.monotonic()
    cfg = json.loads((src / "config.json").read_text())
    old = int(cfg["vocab_size"])
    mark = {"src": str(src), "vocab_from": old, "vocab_to": vocab}
    with contextlib.suppress(OSError, ValueError):
        if json.loads((dst / _RESIZE_MARK).read_text()) == mark:
            return {**mark, "dst": str(dst), "reused": True, "seconds": 0.0}
    if vocab < old:
        raise ValueError(f"{src}: vocab_size {old} is larger than {vocab}")
    std = float(cfg.get("initializer_range", 0.02))
    tmp = dst.with_name(dst.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    grown: dict[str, list[list[int]]] = {}
    total = 0
    for f in sorted(src.iterdir()):
        if f.suffix == ".safetensors":
            header, buf = _read_safetensors(f)
            names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
            tensors = []
            for name in names:
                meta = header[name]
                a, b = meta["data_offsets"]
                data = buf[a:b]
                if name in _VOCAB_TENSORS and meta["shape"][0] == old:
                    dt = meta["dtype"]
                    if dt not in _ST_DTYPES:
                        raise ValueError(f"{f.name}: {name} is {dt}, not one of {sorted(_ST_DTYPES)}")
                    width = int(meta["shape"][1])
                    data += _random_rows(dt, (vocab - old) * width, std, seed + len(grown))
                    grown[name] = [list(meta["shape"]), [vocab, width]]
                    meta["shape"] = [vocab, width]
                tensors.append((name, data))
            total += _write_safetensors(tmp / f.name, header, tensors)
        elif f.name == "config.json":
            (tmp / f.name).write_text(json.dumps({**cfg, "vocab_size": vocab}, indent=2) + "\n")
        elif f.is_dir():
            shutil.copytree(f, tmp / f.name)
        else:
            shutil.copy2(f, tmp / f.name)
    if "model.embed_tokens.weight" not in grown:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"{src}: no model.embed_tokens.weight of {old} rows in its safetensors")
    index = tmp / "model.safetensors.index.json"
    if index.exists():  # the weight map names the same tensors; only the total size grew
        idx = json.loads(index.read_text())
        idx.setdefault("metadata", {})["total_size"] = sum(
            _read_safetensors_size(p) for p in tmp.glob("*.safetensors"))
        index.write_text(json.dumps(idx, indent=2) + "\n")
    (tmp / _RESIZE_MARK).write_text(json.dumps(mark) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return {**mark, "dst": str(dst), "reused": False, "tensors": grown, "bytes": total,
            "seconds": round(time.monotonic() - t0, 1)}


def _read_safetensors_size(path: Path) -> int:
    header, _ = _read_safetensors(path)
    return max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)


def serve_script_for(model: Path, work: Path, serve: str = SERVE, served: Path | None = None) -> str:
    """A copy of the serve script (in ``work``) that serves ``model`` where it served ``served`` (default TINY):
    the shared recipe's serve.sh names /tmp/tiny in its command and its install check; the CPU stand-in names
    its default model. Raises ServerFailed when the script does not name that folder."""
    served = served or TINY
    text = Path(serve).read_text()
    new, n = re.subn(re.escape(str(served)) + r"(?![\w.-])", str(model), text)
    if n == 0:
        raise R.ServerFailed(f"{serve} does not name {served}: cannot point it at {model}")
    out = work / f"serve-{model.name}.sh"
    out.write_text(new)
    return str(out)


#: a CUDA OOM in vLLM's log (torch's exception, or the caching allocator's message)
OOM_RE = re.compile(rb"[^\n]*(?:OutOfMemoryError|CUDA out of memory)[^\n]*")


class DeathWatch:
    """The engine's death, seen as soon as it shows: an EngineCore (or the API server) process gone or a
    zombie (every 0.25 s), or /health ANSWERING other than 200 (every 1 s). A /health that does not answer in
    time is not death: a busy API server does that (tests/corpus/traces/h100-api-unresponsive-prompt-logprobs).
    Writes ``engine_dead_seen`` once."""

    def __init__(self, ctx: GpuCtx) -> None:
        self.ctx = ctx
        self.srv: GpuServer = ctx.srv  # type: ignore[assignment]
        self.dead = threading.Event()
        self._stop = threading.Event()
        self.engines = ctx.engine(5)
        self._thread = threading.Thread(target=self._run, daemon=True, name="death-watch")

    def start(self) -> DeathWatch:
        self._thread.start()
        return self

    def _seen(self, how: str, **kw: Any) -> None:
        self.ctx.event("engine_dead_seen", how=how, **kw)
        self.dead.set()

    def _run(self) -> None:
        next_health = 0.0
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0)) as c:
            while not self._stop.is_set():
                gone = [p for p in self.engines if not _alive(p)]
                if gone:
                    return self._seen("EngineCore gone", pids=gone)
                if not self.srv.is_running():
                    return self._seen("API server gone", pid=self.srv.pid)
                if time.monotonic() >= next_health:
                    next_health = time.monotonic() + 1.0
                    code = None
                    with contextlib.suppress(httpx.HTTPError):
                        code = c.get(self.srv.url + "/health").status_code
                    if code is not None and code != 200:
                        return self._seen("/health answered", status=code)
                self._stop.wait(0.25)
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _prompt_logprobs_burst(ctx: GpuCtx, n: int, prompt_tokens: int) -> list[str]:
    """``n`` completions at once, each a prompt of ``prompt_tokens`` token ids (1000-1499, inside any tokenizer
    here) with ``prompt_logprobs`` 5 and max_tokens 1 (vLLM computes the log-softmax over the whole vocabulary
    for every prompt token); each answer's status or error, in order."""
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
    """H200 or H100, vLLM 0.26.0, a copy of the tiny model with a vocabulary of 151,936 (Qwen's; made in the call
    from /tmp/tiny: config.json's vocab_size, the embedding and lm_head grown with random bf16 rows, the same
    tokenizer of 8,000), VLLM_USE_V2_MODEL_RUNNER=0 (the V1 model runner, 0.26's default for MoE and hybrid
    models), --gpu-memory-utilization 0.97 --max-num-batched-tokens 32768: launch to ready, 10 s idle, short
    requests every 2-5 s; 30 s after ready, bursts of long prompts (30,000 token ids each, prompt_logprobs 5,
    max_tokens 1) at 2, 4, 8 and 16 at once, 15 s apart, until the engine dies or a CUDA OOM is logged (issue
    40's runtime OOM by stage) or all four bursts are answered (then the trace is a normal one, and says so);
    30 s after. Truth: began = the burst that killed it (oom_burst), should_alert_by = the engine's death seen
    (an EngineCore gone, or /health answering non-200) + 10 s; oom_line = the log's first OOM line. Why it
    OOMs, from vLLM 0.26.0's source: the V1 runner's _get_prompt_logprobs_dict takes, for each request of a
    step, the logits of all its prompt tokens in that step at once (compute_logits, bf16) and their log_softmax
    in fp32; --max-num-batched-tokens 32768 lets a whole 30,000-token prompt into one step, so one request
    needs 29,999 x 151,936 x 2 B = 8.49 GiB of logits, then 16.98 GiB of log-probabilities (25.5 GiB; 42.4
    GiB if torch first copies the bf16 logits to fp32). The profile run sized activations with 32,768 tokens
    through the layers and the sampler on 1,024 rows of logits (~0.6 GiB per fp32 copy): none of that. What
    is free at run time is the 3 % left by 0.97 plus that profiled peak: on an H100 (79.18 GiB) 2.4 GiB + a
    few, on an H200 (139.8 GiB) 4.2 GiB + a few; 25.5 GiB exceeds both about threefold, so the first request
    of the burst of 2 should die (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.49 or 16.98
    GiB). Neither piece alone does it: the tiny model's 8,000 rows need 30,000 x 8,000 x 6 B = 1.4 GB (the
    2026-12-05 H100 run: no OOM, the API server unresponsive instead), and 0.26's default V2 runner computes
    prompt logprobs 1,024 rows at a time (compute_prompt_logprobs_with_chunking: 1,024 x 151,936 x 6 B =
    0.9 GB, what the profile's sampler already held), at any vocabulary. The fixes: --max-num-batched-tokens
    (4,096: 3.5 GiB) or the V2 runner; --max-logprobs (default 20) only refuses requests that ask for more
    than it: prompt_logprobs 0 needs the same memory."""
    vocab, n_tok = int(ctx.p["oom_vocab"]), int(ctx.p["oom_prompt_tokens"])
    dst = TINY.with_name(f"{TINY.name}-v{vocab}")
    try:
        made = resize_vocab(TINY, dst, vocab)
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise R.ServerFailed(f"could not make the {vocab}-token copy of {TINY}: {type(e).__name__}: {e}") from e
    ctx.event("model_copy", **made)
    ctx.truth_extra["model_copy"] = {k: made.get(k) for k in ("src", "vocab_from", "vocab_to")}
    serve = serve_script_for(dst, ctx.work)
    ctx.launch(("--gpu-memory-utilization", "0.97", "--max-num-batched-tokens", "32768"), serve=serve,
               env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    if srv.served_model_dir != str(dst):
        raise R.ServerFailed(f"the server serves {srv.served_model_dir}, not the copy {dst}")
    ctx.wait_ready()
    if "Using V2 Model Runner" in srv.log_text():
        ctx.notes.append("vLLM used the V2 model runner although VLLM_USE_V2_MODEL_RUNNER=0: it computes prompt "
                         "logprobs 1,024 rows at a time, so no OOM was expected.")
    ctx.sleep(10)
    short = R.ShortTraffic(ctx, max_count=100, time_limit=300 * ctx.scale)  # type: ignore[arg-type]
    short.start()
    ctx.sleep(20)
    watch = DeathWatch(ctx).start()
    oom: str | None = None
    for n in (2, 4, 8, 16):
        ctx.event("oom_burst", n=n, prompt_tokens=n_tok)
        answers = _prompt_logprobs_burst(ctx, n, n_tok)
        ctx.event("oom_burst_answered", n=n, answers=answers)
        m = OOM_RE.search(srv.log_text().encode(errors="replace"))
        oom = m.group(0).decode(errors="replace").strip()[:400] if m else None
        if oom or any(a != "HTTP 200" for a in answers):
            watch.dead.wait(30)  # the engine's death follows its error within a second or two
        if watch.dead.is_set() or oom:
            break
        ctx.sleep(15)
    ctx.truth_extra["oom_line"] = oom
    if not watch.dead.is_set() and oom is None:
        told = [f"{sum(a == 'HTTP 200' for a in e['answers'])}/{e['n']}" for e in ctx.events
                if e["what"] == "oom_burst_answered"]
        ctx.notes.append(f"No OOM: the engine lived through every burst, HTTP 200 for {', '.join(told)} (a normal "
                         "trace, not a runtime OOM).")
    elif oom is None:
        ctx.notes.append("The engine died without a CUDA OOM line in the log.")
    elif not watch.dead.is_set():
        ctx.notes.append("A CUDA OOM was logged but the engine did not die within 30 s.")
    ctx.sleep(30)
    watch.stop()
    short.stop()


#: h200-startup-failure-max-model-len: the KV cache vLLM is to find (GiB): half of what one 32,768-token request of
#: the tiny model needs (32,768 x 8,192 B = 0.25 GiB), so neither 0 ("No available memory for the cache blocks")
#: nor enough, whatever the few hundredths of a GiB the profile varies by
KV_SHORT_TARGET_GIB = 0.12
#: vLLM 0.26.0's own use before the KV cache on the H200 (tests/fixtures/logs/vllm-0.26.0-h200-startup.log: a 69.9
#: GiB budget less "Available KV cache memory: 69.45 GiB"; the H100's start in h100-starts-history-budget the same)
NON_KV_GIB = 0.45


def _nvml_total_gib() -> float | None:
    """The GPU's total memory by nvidia-smi (MiB; NVML's, with the driver's part: 140.4 GiB on the H200)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return float(out[0]) / 1024 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


@scenario("h200-startup-failure-max-model-len", "startup_failure", 200)
def startup_failure_max_model_len(ctx: GpuCtx) -> None:
    """H200 or H100, vLLM 0.26.0, the tiny model at --max-model-len 32768 (0.25 GiB of KV cache for one request)
    with a --gpu-memory-utilization so small that the KV cache vLLM finds after profiling is about
    KV_SHORT_TARGET_GIB: (NON_KV_GIB + that) / the GPU's total (0.0041 on an H200). vLLM fails at startup with
    "ValueError: To serve at least one request with the model's max seq len (32768), (0.25 GiB KV cache is
    needed, which is larger than the available KV cache memory (A GiB)" and exits: a real KV-cache failure (issue
    40). Then the arithmetic meets vLLM again: the utilization that holds one full-length request, worked out by
    vtop's own code from the failure line (vtop.core.phases.PhaseTracker, vtop.core.membudget.util_for_length,
    NVML's total as the budget takes it), is launched; it must become ready (fit_launch, fit_ready or
    fit_failed). Truth: began = the error line, ended = the fitted start's ready."""
    from vtop.core.membudget import util_for_length

    total = _nvml_total_gib() or 139.8
    util = round((NON_KV_GIB + KV_SHORT_TARGET_GIB) / total, 4)
    ctx.event("kv_short_launch", util=util, total_gib=round(total, 2))
    ctx.launch(("--gpu-memory-utilization", str(util)))
    if ctx.wait_exit(300) is None:
        ctx.notes.append("the server did not exit within 300 s")
        return
    ctx.sleep(5)
    srv: GpuServer = ctx.srv  # type: ignore[assignment]
    snap = _tracked(srv.log_text())
    f = snap.failure
    ctx.truth_extra["kv_short"] = {"util": util, "failure": f.kind if f is not None else None,
                                   "line": f.line.strip()[:400] if f is not None else None,
                                   "kv_available_gib": snap.facts.kv_available_gib}
    if f is None or f.kind != "max_model_len":
        ctx.notes.append(f"the start failed as {f.kind if f else 'nothing vtop knows'}, not for max_model_len")
        return
    need, avail = float(f.get("need") or 0), float(f.get("avail") or 0)
    fit = util_for_length(util, total, need, avail)
    ctx.event("fit_launch", util=fit, need_gib=need, avail_gib=avail, est=f.get("est"))
    if fit is None:
        ctx.notes.append("vtop's arithmetic found no utilization that holds one full-length request")
        return
    ctx.launch(("--gpu-memory-utilization", str(fit)))
    try:
        s = ctx.wait_ready(240)
    except R.ServerFailed as e:
        ctx.event("fit_failed", error=str(e)[:300])
        ctx.notes.append(f"the start at vtop's --gpu-memory-utilization {fit} did not become ready")
        return
    ctx.event("fit_ready", util=fit, healthy_after_s=round(s, 1),
              kv_available_gib=_tracked(srv.log_text()).facts.kv_available_gib)
    ctx.sleep(10)


def _tracked(log: str) -> Any:
    """A start's log as vtop's phase tracker reads it (its snapshot: the failure, the facts)."""
    from vtop.core.phases import PhaseTracker

    tr = PhaseTracker()
    for i, ln in enumerate(log.splitlines()):
        tr.feed(ln, 1000.0 + i * 0.001)
    return tr.snapshot()


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


def runtime_oom_outcome(ctx: R.Ctx, index: list[dict[str, Any]], log: bytes) -> tuple[str, float | None, float | None]:
    """What a runtime-OOM recording turned out to be: (class, began, should_alert_by). ``runtime_oom`` when the
    engine died or a CUDA OOM was logged: began = the last burst sent before that (the one that killed it),
    should_alert_by = the death seen (else the OOM line's arrival) + 10 s; ``startup_failure`` when vLLM never
    became ready (build_truth dates it at the first error line); else ``normal`` (no OOM came)."""
    if ctx.first("ready") is None:
        return "startup_failure", None, None
    dead = ctx.first("engine_dead_seen")
    m = OOM_RE.search(log)
    t_oom = R.log_time_of(m.end(), index) if m is not None else None
    t_end = dead["t"] if dead is not None else t_oom
    if t_end is None:
        return "normal", None, None
    sent = [e["t"] for e in ctx.events if e["what"] == "oom_burst" and e["t"] <= t_end]
    return "runtime_oom", (sent[-1] if sent else t_end), round(t_end + R.BUDGET["runtime_oom"], 3)


def _truth(ctx: GpuCtx, index: list[dict[str, Any]], log: bytes, version: str | None) -> dict[str, Any]:
    oom_at: tuple[float | None, float | None] = (None, None)
    if ctx.sc.cls == "runtime_oom":  # the class is what came: a runtime OOM, a failed start or a normal trace
        cls_now, *oom = runtime_oom_outcome(ctx, index, log)
        oom_at = (oom[0], oom[1])
        ctx.sc = replace(ctx.sc, cls=cls_now)
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
        truth["began"] = truth["detectable_from"] = oom_at[0]
        truth["should_alert_by"] = oom_at[1]
    if cls == "startup_failure" and ctx.first("fit_ready") is not None:
        truth["ended"] = ctx.first("fit_ready")["t"]  # type: ignore[index]
        truth["expected_phase"] = "ready"  # the start at vtop's number is the last one
    if cls == "gpu_neighbour":
        nb, end = ctx.first("neighbour_ready"), ctx.first("neighbour_end")
        if nb is not None:
            truth["began"] = truth["detectable_from"] = nb["t"]
            truth["should_alert_by"] = round(nb["t"] + R.BUDGET["gpu_neighbour"], 3)
            truth["ended"] = end and end["t"]
    truth["server"]["gpu"] = ctx.truth_extra.pop("gpu_name", None)
    truth["recorder"] = "tools/device/h200_corpus.py"
    return truth


def record_one(gs: GpuScenario, out: Path, params: dict[str, Any], scale: float, *,
               make_ctx: Callable[..., GpuCtx] | None = None,
               finish_truth: Callable[[GpuCtx, dict[str, Any]], None] | None = None) -> int:
    """Record one scenario into ``out``. ``make_ctx`` (GpuCtx's arguments): another engine's context (its server,
    its launch; tools/device/h200_sglang.py); ``finish_truth``: what that engine adds to the truth before it is
    written."""
    sc = gs.sc
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = R.WORK / ("h200-" + out.name)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = (make_ctx or GpuCtx)(sc, out, 0.0, work, params, scale)
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
    if finish_truth is not None:
        finish_truth(ctx, truth)
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
