"""Record incident traces from the real SGLang 0.5.17 on the H200 machine (issue 42), in the corpus format, with
vtop's own recording of each beside it.

    python3 -m tools.device.h200_sglang SCENARIO[,SCENARIO...] --out DIR [--budget-s N] [--small] [--scale F]
                                         [--engine sglang|vllm-cpu] [--skip-recorded ROOT]
    python3 -m tools.device.h200_sglang --list

Runs ON the GPU machine after ``sglang_install.sh`` (``tools/device/README-sglang.md`` has the exact ``run``
calls, through ``tools/device/h200_sglang.sh``), from the repo root with ``PYTHONPATH=/tmp/vtop-site:$PWD``.
Everything that is not SGLang's is ``tools/device/h200_corpus.py``'s machinery (its sampler with NVML and the
processes' CPU seconds, its context, its loads, its truth and ``record_one``) and ``tools/corpus/record.py``'s
(streams, short traffic, stream pools, the log segments); what is the engine's is a row of :data:`ENGINES`:

* the server: ``sglang_serve.sh`` starts ``python3 -m sglang.launch_server --model-path /tmp/tiny --port 30000
  --enable-metrics --attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5
  --context-length 32768`` under setsid, and every scenario adds ``--log-requests --log-requests-level 1
  --max-running-requests 64`` (flag names read in 0.5.17's ``srt/server_args.py``: level 1 logs the sampling
  parameters, ``max_new_tokens`` among them, and no prompt; vtop's ``vtop/core/requests/sglang_log.py`` reads
  those lines); ``sglang_stop.sh`` stops it (SIGCONT of its group, SIGINT, SIGKILL of what is left after 30 s);
* the engine's process, the one a stall stops: ``sglang::scheduler`` (SGLang's setproctitle; on one GPU the
  model runs in it);
* where the flags begin in its command line (after ``sglang.launch_server``), the log's CUDA graph capture
  (``Capturing batches (bs=... avail_mem=...):  25%|...| 1/4``, 0.5.17's ``decode_cuda_graph_runner.py``) and
  its queue gauge (``sglang:num_queue_reqs``).

``/metrics`` bodies keep the ``sglang:`` families (``record.KEEP_PREFIXES``); SGLang serves no ``/version``, so
``info.jsonl.gz``'s version is ``/server_info``'s (asked once per server process). The truth says
``"engine": "sglang"`` and the version under ``server.sglang`` (``server.vllm`` stays null).

vtop itself: each scenario starts ``python3 -m vtop --once --json --window W --interval 1 --record REC URL``
(no ``--log``: vtop finds the log behind the launcher's stdout, as a user's ``vtop URL`` would) before the
launch, and stops it with SIGINT at the scenario's end (the recording is closed; no report is printed then), in
``VTOPDIR/SCENARIO/`` (``--vtop-dir``, default ``DIR.vtop``): ``rec.jsonl.gz``, ``vtop.log``. The screenshots
(``python -m tools.make_screenshots sglang``) and the replay tests (``tests/unit/test_h200_sglang_replay.py``)
read the launch-burst-runaway's.

The dry run (no GPU, no SGLang): ``--engine vllm-cpu`` puts the vLLM CPU build in SGLang's place
(``cpu_serve.sh`` / ``cpu_stop.sh`` on ``$VTOP_CPU_PORT``, default 18431, ``--max-num-seqs 8
--enable-log-requests``, its ``VLLM::EngineCore`` stopped instead of the scheduler), with ``--small`` loads and
``--scale`` waits: every path but SGLang's own runs (README-sglang.md says which ones do not).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.device import h200_corpus as C  # first: it puts in pytest's stand-in for record.py

R = C.R
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Engine:
    """What differs between engines for the recorder; everything else is shared."""

    key: str  #: the truth's ``server.engine``
    run_dir: Path  #: where the serve script writes serve.json (pid, t_launch, log, port, cmd) and serve.pid
    serve: str  #: the serve script: ``[--log PATH] [-- FLAGS...]``
    stop: str  #: the stop script (no arguments)
    port: int  #: the port, known before the launch (vtop is started against it first)
    flags: tuple[str, ...]  #: every scenario's flags beyond the serve script's own
    engine_titles: tuple[str, ...]  #: process titles of the engine (what a stall stops), by their start
    launcher: str  #: the argv element after which the engine's flags begin
    model_flag: str | None  #: the model's flag; None: the model is the argument after ``launcher``
    capture_re: bytes  #: a progress frame of CUDA graph capture (groups: k, n); informational
    waiting_metric: str  #: the queue's gauge in /metrics
    env: dict[str, str] = field(default_factory=dict)  #: added to the serve and stop scripts' environment


def engines() -> dict[str, Engine]:
    """The engines this recorder knows (read at call time: the dry run's come from the environment)."""
    cpu_run = Path(os.environ.get("VTOP_H200_RUN_DIR", "/tmp/h200sgl-dry/run"))
    cpu_port = int(os.environ.get("VTOP_CPU_PORT", "18431"))
    return {
        "sglang": Engine(
            key="sglang", run_dir=Path("/tmp/sglang"), serve=str(HERE / "sglang_serve.sh"),
            stop=str(HERE / "sglang_stop.sh"), port=30000,
            flags=("--log-requests", "--log-requests-level", "1", "--max-running-requests", "64"),
            engine_titles=("sglang::scheduler",), launcher="sglang.launch_server", model_flag="--model-path",
            capture_re=rb"Capturing batches \([^)\r\n]*\):[^\r\n]*?(\d+)/(\d+)",
            waiting_metric="sglang:num_queue_reqs"),
        # the dry run's stand-in: the vLLM CPU build (tools/device/cpu_serve.sh) where SGLang would be
        "vllm-cpu": Engine(
            key="vllm", run_dir=cpu_run, serve=str(HERE / "cpu_serve.sh"), stop=str(HERE / "cpu_stop.sh"),
            port=cpu_port, flags=("--max-num-seqs", "8", "--enable-log-requests"),
            engine_titles=("VLLM::EngineCore",), launcher="serve", model_flag=None,
            capture_re=os.environ.get("VTOP_H200_CAPTURE_RE", r"Warming up model for the compilation").encode(),
            waiting_metric="vllm:num_requests_waiting",
            env={"VTOP_H200_RUN_DIR": str(cpu_run), "VTOP_CPU_PORT": str(cpu_port)}),
    }


#: the H200's sizes. The burst: 600 completions at once against --max-running-requests 64, so ~536 wait; the
#: stall: 8 streams (max_tokens 8192, each replaced when done) with the scheduler stopped for 60 s; the normal
#: load: 16 completions (max_tokens 256) + 8 streams (max_tokens 2048) + short requests, none near a minute
GPU_PARAMS: dict[str, Any] = {
    **C.GPU_PARAMS, "burst_n": 600, "burst_tokens": 256, "burst_cap_s": 150.0,
    "steady_conc": 16, "steady_tokens": 256, "pool_n": 8, "pool_tokens": 2048,
    "stall_streams": 8, "stall_stream_tokens": 8192, "stall_s": 60.0,
    "runaway_hangup_s": 75.0, "ready_timeout_s": 420.0,
}
#: --small: a CPU server of 2 cores (the dry run; its --max-num-seqs 8 against bursts of 24)
SMALL_PARAMS: dict[str, Any] = {
    **GPU_PARAMS, "burst_n": 24, "burst_tokens": 32, "burst_cap_s": 150.0,
    "steady_conc": 2, "steady_tokens": 32, "pool_n": 2, "pool_tokens": 64,
    "stall_streams": 2, "stall_stream_tokens": 1500, "runaway_hangup_s": 40.0, "ready_timeout_s": 400.0,
}


# --- the server -------------------------------------------------------------------------------


class EngineServer(C.GpuServer):
    """The server an :class:`Engine`'s serve script starts (``h200_corpus.GpuServer``'s attributes)."""

    def __init__(self, eng: Engine) -> None:
        super().__init__()
        self.eng = eng

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{(self.info or {}).get('port', self.eng.port)}"

    @property
    def log_file(self) -> Path:
        return self.eng.run_dir / "serve.log"

    def _env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.eng.env, **(env or {})}

    def launch(self, extra: tuple[str, ...] = (), *, pipe: bool = False, serve: str | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
        """The serve script with the engine's flags and ``extra``; reads back its serve.json."""
        if pipe:
            raise R.ServerFailed("h200_sglang does not serve through a pipe")
        self.stop(quiet=True)
        self.eng.run_dir.mkdir(parents=True, exist_ok=True)
        for f in (self.eng.run_dir / "serve.json", self.log_file):
            with contextlib.suppress(OSError):
                f.unlink()
        cmd = ["bash", serve or self.eng.serve, "--log", str(self.log_file), "--", *self.eng.flags, *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=self._env(env))
        print(f"[serve] {' '.join(cmd)} -> rc {r.returncode}: {(r.stdout + r.stderr).strip()[-500:]}", flush=True)
        if r.returncode != 0:
            raise R.ServerFailed(f"{Path(cmd[1]).name} failed (rc {r.returncode}): {(r.stdout + r.stderr)[-1000:]}")
        self.info = json.loads((self.eng.run_dir / "serve.json").read_text())
        self.log_path = Path(self.info.get("log") or self.log_file)
        self.served_model_dir = model_of([str(c) for c in self.info.get("cmd") or []], self.eng)
        self.model = self.max_model_len = None
        return self.info

    def engine_pids(self) -> list[int]:
        """The engine's processes under the launcher (SGLang: each ``sglang::scheduler``, one per TP rank)."""
        out = []
        for r in self.tree():
            title = (r["cmdline"] or [""])[0]
            # comm keeps 15 characters: "sglang::schedul", "VLLM::EngineCor"
            if r["pid"] != self.pid and any(title.startswith(t) or r["name"] == t[:15] for t in self.eng.engine_titles):
                out.append(int(r["pid"]))
        return out

    def stop(self, quiet: bool = False) -> None:
        try:
            r = subprocess.run(["bash", self.eng.stop], capture_output=True, text=True, timeout=90, env=self._env())
            if not quiet or r.returncode:
                print(f"[stop] rc {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}", flush=True)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"[stop] {type(e).__name__}: {e}", flush=True)


def model_of(cmd: list[str], eng: Engine) -> str | None:
    """The model folder of a serve command line: after ``--model-path`` (or ``--model-path=``), else the
    argument after the launcher (``vllm serve MODEL``)."""
    if eng.model_flag is not None:
        for i, a in enumerate(cmd):
            if a == eng.model_flag and i + 1 < len(cmd):
                return cmd[i + 1]
            if a.startswith(eng.model_flag + "="):
                return a.split("=", 1)[1]
        return None
    i = cmd.index(eng.launcher) if eng.launcher in cmd[:-1] else -1
    return cmd[i + 1] if i >= 0 else None


def flags_of(cmd: list[str], eng: Engine) -> list[str]:
    """The engine's flags of a serve command line: what follows the launcher (and the model, where it is
    positional)."""
    if eng.launcher not in cmd:
        return []
    i = cmd.index(eng.launcher) + (1 if eng.model_flag is not None else 2)
    return cmd[i:]


# --- vtop's own recording -----------------------------------------------------------------------


class VtopRecording:
    """vtop itself, recording: ``python3 -m vtop --once --json --window W --interval 1 --record REC URL`` (no
    ``--log``), started before the launch, stopped with SIGINT at the end (it closes the recording: vtop's
    ``run_once`` returns 130 after ``recorder.close()``); its stdout in ``report.json`` (empty when stopped
    early), its stderr in ``vtop.log``."""

    def __init__(self, ctx: EngineCtx, folder: Path, window_s: float) -> None:
        self.ctx, self.folder, self.window_s = ctx, folder, window_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def rec(self) -> Path:
        return self.folder / "rec.jsonl.gz"

    def start(self) -> VtopRecording:
        self.folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            self.rec.unlink()
        cmd = [sys.executable, "-m", "vtop", "--once", "--json", "--window", f"{int(self.window_s)}s",
               "--interval", "1", "--record", str(self.rec), self.ctx.srv.url]
        with open(self.folder / "report.json", "wb") as out, open(self.folder / "vtop.log", "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True)
        self.ctx.event("vtop_start", pid=self.proc.pid, cmd=cmd[1:])
        time.sleep(2.0)  # its first round, before the launch
        if self.proc.poll() is not None:
            self.ctx.notes.append(f"vtop exited at once (rc {self.proc.returncode}): "
                                  + (self.folder / "vtop.log").read_text(errors="replace")[-300:])
        return self

    def stop(self) -> int | None:
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
                self.ctx.notes.append("vtop did not stop on SIGINT within 30 s: killed (its recording may be cut)")
        size = self.rec.stat().st_size if self.rec.exists() else None
        self.ctx.event("vtop_end", pid=p.pid, rc=p.returncode, rec_bytes=size)
        return p.returncode


# --- the context ------------------------------------------------------------------------------


class EngineCtx(C.GpuCtx):
    """h200_corpus's context with an :class:`Engine`'s server, and vtop's own recording beside the trace."""

    def __init__(self, sc: R.Scenario, out: Path, seconds: float, work: Path, params: dict[str, Any], scale: float,
                 *, eng: Engine, vtop_dir: Path | None) -> None:
        super().__init__(sc, out, seconds, work, params, scale)
        self.eng = eng
        self.srv = EngineServer(eng)  # type: ignore[assignment]
        self.vtop_dir = vtop_dir
        self.truth_extra["engine"] = eng.key

    def launch(self, extra_args: tuple[str, ...] = (), **_: Any) -> None:
        srv: EngineServer = self.srv  # type: ignore[assignment]
        info = srv.launch(extra_args)
        cmd = R.mask_argv([str(c) for c in info.get("cmd") or []])
        flags = flags_of(cmd, self.eng)
        if self.flags is None:
            self.flags = flags
        self.event_at(float(info["t_launch"]), "launch", pid=info["pid"], flags=flags, model=srv.served_model_dir,
                      env=None, kv_cache_space_gib=None, cmd=cmd, log=str(info.get("log")), engine=self.eng.key)

    @contextlib.contextmanager
    def vtop_recording(self, window_s: float) -> Iterator[VtopRecording | None]:
        """vtop's own recording around the block (none without a vtop folder)."""
        if self.vtop_dir is None:
            yield None
            return
        v = VtopRecording(self, self.vtop_dir / self.out.name, window_s).start()
        try:
            yield v
        finally:
            v.stop()

    def note_capture(self) -> None:
        """What the log showed of CUDA graph capture up to now (truth ``capture``): its progress frames, the first
        and the last, and the largest k/n seen."""
        srv: EngineServer = self.srv  # type: ignore[assignment]
        data = srv.log_text().encode(errors="replace")
        frames = list(re.finditer(self.eng.capture_re, data))
        if not frames:
            self.notes.append("no CUDA graph capture frame in the log before ready")
        txt = [m.group(0).decode(errors="replace").strip()[-160:] for m in frames]
        self.truth_extra["capture"] = {"frames": len(frames), "first": txt[0] if txt else None,
                                       "last": txt[-1] if txt else None}


class QueueWatch:
    """The engine's queue gauge (``Engine.waiting_metric``) once a second while a load runs: its largest value,
    for the load's event (a burst that made a queue says how long)."""

    def __init__(self, ctx: EngineCtx) -> None:
        self.ctx = ctx
        self.max: float | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="queue-watch")

    def __enter__(self) -> QueueWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(15)

    def _run(self) -> None:
        name = self.ctx.eng.waiting_metric
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0)) as c:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    v = gauge(c.get(self.ctx.srv.url + "/metrics").text, name)
                    if v is not None:
                        self.samples += 1
                        self.max = v if self.max is None else max(self.max, v)
                self._stop.wait(1.0)


def gauge(text: str, name: str) -> float | None:
    """The sum of a gauge's samples in a /metrics body (all label sets), or None when it is absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            with contextlib.suppress(ValueError, IndexError):
                total += float(line.rsplit(" ", 1)[1])
                seen = True
    return total if seen else None


# --- the scenarios -------------------------------------------------------------------------------

SCENARIOS: dict[str, C.GpuScenario] = {}


def scenario(name: str, cls: str, estimate_s: float) -> Callable[[Callable[[EngineCtx], None]], Callable[[EngineCtx], None]]:
    def deco(fn: Callable[[EngineCtx], None]) -> Callable[[EngineCtx], None]:
        SCENARIOS[name] = C.GpuScenario(R.Scenario(name, cls, fn, 0.0, " ".join((fn.__doc__ or "").split())),  # type: ignore[arg-type]
                                        estimate_s)
        return fn

    return deco


@scenario("h200-sglang-launch-burst-runaway", "runaway", 330)
def launch_burst_runaway(ctx: EngineCtx) -> None:
    """H200, SGLang 0.5.17 (tiny random Llama, --context-length 32768, --mem-fraction-static 0.5, --attention-backend
    triton, --max-running-requests 64, --log-requests --log-requests-level 1, --enable-metrics), vtop recording
    from before the launch: launch through CUDA graph capture to ready, 10 s idle; a burst of 600 /v1/completions at
    once (max_tokens 256, ignore_eos): 64 running and the rest queued, until all are answered; 10 s idle; then short
    requests (max_tokens 16-64) every 2-5 s and ONE streaming chat request without max_tokens (ignore_eos: SGLang's
    ChatCompletionRequest field, passed into its sampling params; with no max_tokens SGLang's max_new_tokens is None
    and the scheduler allows the context length less the prompt), hung up by the client at +75 s unless it finished
    first; 30 s after."""
    with ctx.vtop_recording(float(ctx.p["ready_timeout_s"]) + 400 * ctx.scale):
        ctx.launch()
        ctx.wait_ready()
        ctx.note_capture()
        ctx.sleep(10)
        n, mt = int(ctx.p["burst_n"]), int(ctx.p["burst_tokens"])
        ctx.event("load_begin", kind="burst", n=n, concurrency=n, max_tokens=mt)
        with QueueWatch(ctx) as q:
            res = C.burst(ctx, n, mt, float(ctx.p["burst_cap_s"]))
        ctx.event("load_end", kind="burst", waiting_max=q.max, **res)
        ctx.truth_extra["burst"] = {"n": n, "max_tokens": mt, "waiting_max": q.max, **res}
        if not q.max:
            ctx.notes.append(f"the burst made no queue that /metrics showed ({ctx.eng.waiting_metric} max {q.max})")
        ctx.sleep(10)
        short = R.ShortTraffic(ctx, max_count=100, time_limit=200 * ctx.scale)
        short.start()
        ctx.sleep(5)
        ra = R.Stream(ctx, "runaway", read_timeout=120.0, time_limit=300.0).start()
        if not ra.done.wait(float(ctx.p["runaway_hangup_s"]) * ctx.scale):
            ra.hangup()
        ctx.sleep(30)
        short.stop()


@scenario("h200-sglang-scheduler-stall", "engine_stall", 250)
def scheduler_stall(ctx: EngineCtx) -> None:
    """H200, SGLang 0.5.17 (flags as the launch-burst-runaway's), vtop recording from before the launch: launch to
    ready, 10 s idle; 8 streaming chat requests at a time (max_tokens 8192, ignore_eos, each replaced when done);
    after 20 s the sglang::scheduler process (on one GPU the model runs in it) is SIGSTOPped for 60 s while the
    streams wait on open connections (SGLang's /health asks the scheduler for a token: it answers 503 after its
    20 s timeout, the port stays open), SIGCONT, 30 s after."""
    with ctx.vtop_recording(float(ctx.p["ready_timeout_s"]) + 300 * ctx.scale):
        ctx.launch()
        ctx.wait_ready()
        ctx.note_capture()
        ctx.sleep(10)
        stall = float(ctx.p["stall_s"])
        pool = R.StreamPool(ctx, n=int(ctx.p["stall_streams"]), max_tokens=int(ctx.p["stall_stream_tokens"]),
                            max_total=200, time_limit=(20 + stall + 30 + 10) * ctx.scale)
        pool.start()
        ctx.sleep(20)
        pids = ctx.engine(5)
        assert pids, f"no {' / '.join(ctx.eng.engine_titles)} under the server"
        ctx.stop_procs(pids, ctx.eng.engine_titles[0])
        ctx.sleep(stall)
        ctx.cont_procs()
        ctx.sleep(30)
        pool.stop()


@scenario("h200-sglang-normal-load", "normal", 230)
def normal_load(ctx: EngineCtx) -> None:
    """H200, SGLang 0.5.17 (flags as the launch-burst-runaway's), vtop recording from before the launch: launch to
    ready, 10 s idle; for ~120 s a steady mixed load under --max-running-requests 64 (no queue): 16 clients sending
    /v1/completions one after the other (max_tokens 256, ignore_eos), 8 streaming chat requests at a time
    (max_tokens 2048, ignore_eos, each replaced when done) and short requests (max_tokens 16-64) every 2-5 s; 20 s
    idle. Normal: every request has a max_tokens, none near a minute."""
    with ctx.vtop_recording(float(ctx.p["ready_timeout_s"]) + 250 * ctx.scale):
        ctx.launch()
        ctx.wait_ready()
        ctx.note_capture()
        ctx.sleep(10)
        steady = C.SteadyLoad(ctx, int(ctx.p["steady_conc"]), int(ctx.p["steady_tokens"]), time_limit=120 * ctx.scale)
        pool = R.StreamPool(ctx, n=int(ctx.p["pool_n"]), max_tokens=int(ctx.p["pool_tokens"]), max_total=400,
                            time_limit=120 * ctx.scale)
        short = R.ShortTraffic(ctx, max_count=100, time_limit=130 * ctx.scale)
        with QueueWatch(ctx) as q:
            steady.start()
            pool.start()
            short.start()
            ctx.sleep(120)
            pool.stop()
            short.stop()
            steady.stop()
        ctx.truth_extra["waiting_max"] = q.max
        ctx.sleep(20)


# --- recording ---------------------------------------------------------------------------------


def finish_truth(ctx: C.GpuCtx, truth: dict[str, Any]) -> None:
    """The engine's words in the truth: ``server.engine``, its version under its own key (``server.vllm`` null
    for SGLang), this recorder, and where vtop's own recording is."""
    eng: Engine = ctx.eng  # type: ignore[attr-defined]
    server = truth["server"]
    server["engine"] = truth.pop("engine", eng.key)
    if eng.key != "vllm":
        server[eng.key] = server.get("vllm")
        server["vllm"] = None
    truth["recorder"] = "tools/device/h200_sglang.py"
    vdir = ctx.vtop_dir  # type: ignore[attr-defined]
    if vdir is not None:
        truth["vtop_recording"] = f"{vdir.name}/{ctx.out.name}/rec.jsonl.gz"


def recorded(root: Path, name: str) -> Path | None:
    """A trace of ``name`` already recorded under ``root`` (``ROOT/*/NAME/truth.json``, by an earlier call on
    the same machine) that ran without a scenario error, else None."""
    for t in sorted(root.glob(f"*/{name}/truth.json")):
        with contextlib.suppress(OSError, ValueError):
            if "scenario error" not in json.loads(t.read_text()).get("notes", ""):
                return t.parent
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tools.device.h200_sglang", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="?", help="comma-separated: " + ",".join(SCENARIOS))
    ap.add_argument("--out", type=Path, help="the folder the trace folders go into")
    ap.add_argument("--vtop-dir", type=Path, help="vtop's own recordings (default: OUT.vtop)")
    ap.add_argument("--no-vtop", action="store_true", help="no vtop recording beside the traces")
    ap.add_argument("--engine", default="sglang", choices=sorted(engines()),
                    help="sglang (the GPU machine) or vllm-cpu (the dry run's stand-in)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip a scenario whose estimate does not fit")
    ap.add_argument("--small", action="store_true", help="loads sized for a CPU server (the dry run)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the scenario's waits (the dry run)")
    ap.add_argument("--skip-recorded", type=Path, metavar="ROOT",
                    help="skip a scenario already recorded without error under ROOT/*/NAME/")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list or not a.scenarios:
        for g in SCENARIOS.values():
            print(f"{g.sc.name:<36} {g.sc.cls:<14} ~{g.estimate_s:>3.0f} s  {g.sc.doc[:90]}")
        return 0
    if a.out is None:
        ap.error("--out is required")
    names = [n for n in a.scenarios.split(",") if n]
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; known: {', '.join(SCENARIOS)}")
    eng = engines()[a.engine]
    vtop_dir = None if a.no_vtop else (a.vtop_dir or a.out.with_name(a.out.name + ".vtop"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a burst holds 600 connections
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    params = SMALL_PARAMS if a.small else GPU_PARAMS
    deadline = time.monotonic() + a.budget_s
    make_ctx = functools.partial(EngineCtx, eng=eng, vtop_dir=vtop_dir)
    rc = 0
    for n in names:
        g = SCENARIOS[n]
        done = recorded(a.skip_recorded, n) if a.skip_recorded else None
        if done is not None:
            print(f"[skip] {n}: recorded already in {done}", flush=True)
            continue
        left = deadline - time.monotonic()
        if g.estimate_s * max(a.scale, 0.5) > left:
            print(f"[skip] {n}: ~{g.estimate_s:.0f} s does not fit in the {left:.0f} s left", flush=True)
            rc = rc or 3
            continue
        print(f"[scenario] {n} (~{g.estimate_s:.0f} s, {left:.0f} s left; engine {a.engine})", flush=True)
        one = C.record_one(g, a.out / n, params, a.scale, make_ctx=make_ctx, finish_truth=finish_truth)
        rc = one or rc
        if one == 130:
            break
    return rc


if __name__ == "__main__":
    sys.exit(main())
