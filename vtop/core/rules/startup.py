"""``startup_stall`` and ``startup_failure``: a start that hangs, a start that failed.

``startup_stall`` -- evidence, per phase, from the tracker's :class:`~vtop.core.phases.Quiet`:

* a phase that prints progress (``Loading safetensors checkpoint shards: N/M``, ``Capturing CUDA
  graphs ... N/M``) has stalled when no step came for ``startup_progress_x`` times its longest step
  so far (tqdm's elapsed time and the frames' arrival say how long a step takes), and at least
  ``startup_progress_floor_s``;
* a silent phase (torch.compile, memory profiling, process start, or a bar not yet timed; not the
  weights, whose reads wait on I/O with the CPU still) has
  stalled when the log is silent for ``startup_still_s`` AND the server's processes are still: the
  CPU seconds (user + system, from the process scans) of the tree, or of the processes doing the
  work (the workers, else the engine cores), grew by less than ``startup_still_cpu_frac`` of a core
  over that window, AND, where GPU data exists, the GPU idled (mean GPU-Util below
  ``startup_still_gpu_util``). A busy silent compile (CPU moving) stays quiet. A doctor that
  attached during the silence (the log's stamps say it is that old) judges the CPU over what it
  watched, ``startup_still_min_span_s`` at least. Where no CPU reading exists (an old recording,
  a server whose processes vtop cannot see), none is invented: only the ceiling applies;
* the ceiling: the tracker's :class:`~vtop.core.phases.StallInfo`, the log silent for
  ``--stall-threshold`` (10 minutes), whatever else is seen; there the GPUs' SM activity during the
  silence (busy SMs make it "info": the phase may just be slow) and 'No available shared memory
  broadcast block' waits are evidence too.

Corpus trace: tests/corpus/traces/startup-stall-compile (the Worker SIGSTOPped in torch.compile for
150 s, the log silent); quiet on every normal-* trace and the H200 start in
vtop/data/demo-h200-vllm-0.26.0.jsonl.gz (graph capture progress frames).

``startup_failure`` -- evidence: the tracker's :class:`~vtop.core.phases.Failure` of a start that
never became ready (its telling line, its phase, the usual fix; for a KV cache or max_model_len
that does not fit, the other processes on the GPU). CUDA OOMs are the OOM rules'. Corpus traces:
tests/corpus/traces/startup-failure-bad-max-model-len, startup-failure-kv-too-large,
startup-failure-kv-too-small.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from vtop.core.phases import Phase
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.oom import is_oom_failure
from vtop.core.rules.stillness import still_start
from vtop.core.rules.util import dur, short_url

if TYPE_CHECKING:
    from vtop.core.phases import Failure


class StartupStall:
    """The startup-stall rule (see the module's docstring)."""

    ids = ("startup_stall",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        a = startup_stall(ctx, mem)
        # a start vtop has no log of, judged by its processes (vtop/core/rules/stillness.py)
        return ([] if a is None else [a]) + per_server(ctx, mem, still_start)


class StartupFailure:
    """The startup-failure rule (see the module's docstring)."""

    ids = ("startup_failure",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        f = tracker_failure(ctx, mem)
        if f is None or f.phase is Phase.READY:
            return []
        where = f" during {f.phase.label}" if f.phase is not None else ""
        # The tracker's message may name the phase already ("ValueError during memory profiling").
        message = f.message.removesuffix(where) if where else f.message
        title = f"vLLM on {short_url(ctx.log_target)} failed to start{where}: {message}"
        return [Alert("startup_failure", "critical", title, failure_evidence(ctx, mem, f, where), (f.fix,),
                      ctx.log_target, f.arrival)]


def tracker_failure(ctx: Evidence, mem: Memory) -> Failure | None:
    """The failure of the log's start, unless it is a CUDA OOM (the OOM rules name those)."""
    snap = ctx.startup
    if snap is None or snap.state != "failed" or snap.failure is None or is_oom_failure(snap.failure):
        return None
    return snap.failure


def failure_evidence(ctx: Evidence, mem: Memory, f: Failure, where: str) -> tuple[str, ...]:
    message = f.message.removesuffix(where) if where else f.message
    ev = [f"{message}{where}", f"telling line: {f.line.strip()[:300]}"]
    if f.kind in ("kv_no_memory", "kv_host_memory", "gpu_free_at_start", "max_model_len"):
        ev += mem.other_procs_lines(ctx, ctx.log_target, f.arrival)
    return tuple(ev)


def _progress_stopped(ctx: Evidence, mem: Memory) -> list[str] | None:
    """Evidence lines when the current phase's progress bar stopped for several of its steps."""
    q, th = ctx.quiet, mem.th
    if q is None or not q.progressing or q.step_s is None:
        return None
    limit = max(th.startup_progress_floor_s, th.startup_progress_x * q.step_s)
    silent = q.silent_at(ctx.now)
    if silent < limit:
        return None
    return [
        f"progress stopped: no step for {dur(silent)}, while its longest step so far took {q.step_s:.1f} s "
        f"(stalled past {th.startup_progress_x:g}x that, {dur(th.startup_progress_floor_s)} at least)"
    ]


def _cpu_still(ctx: Evidence, mem: Memory, window_s: float) -> list[str] | None:
    """Evidence lines when the server's processes used (almost) no CPU over the last ``window_s``;
    None when they did, or when there is no reading to tell (never a guess)."""
    st = mem.servers.get(ctx.log_target) if ctx.log_target else None
    if st is None or not st.cpu_samples:
        return None
    b = st.cpu_samples[-1]
    a = st.cpu_at(b.t - window_s)
    watched = ""
    if a is None:
        # Attached during the silence (doctor --window 15): the processes over what vtop watched.
        first = st.cpu_samples[0]
        if b.t - first.t < mem.th.startup_still_min_span_s:
            return None
        a = first
        watched = " (all vtop watched)"
    # The newest scan must be recent: a stale one says nothing about now.
    if ctx.now - b.t > max(30.0, window_s):
        return None
    span = b.t - a.t
    allow = mem.th.startup_still_cpu_frac * span
    common = [p for p in b.cpu if p in a.cpu]
    if not common:
        return None
    used = {p: b.cpu[p] - a.cpu[p] for p in common}
    tree = sum(used.values())
    if tree < allow:
        return [f"the server's processes used {tree:.2f} s of CPU in {dur(span)}{watched} ({len(common)} "
                "processes, read from the process table): nothing runs"]
    still = [p for p in b.working if p in used and used[p] < allow]
    if not still:
        return None
    who = ", ".join(f"{b.names.get(p, 'process')} (pid {p}) {used[p]:.2f} s" for p in still)
    return [f"CPU time in {dur(span)}{watched}: {who}, while the tree used {tree:.1f} s: the process doing the "
            "start's work does not run (stopped, or blocked)"]


def _gpu_idle(ctx: Evidence, mem: Memory, window_s: float) -> tuple[bool, list[str]] | None:
    """(idle, evidence) of the server's GPUs over the last ``window_s``; None without GPU data."""
    idxs = mem.gpus_of(ctx, ctx.log_target) or sorted(mem.gpus)
    utils: list[float] = []
    for idx in idxs:
        utils += [p.util for p in mem.gpus[idx].between(ctx.now - window_s, ctx.now) if p.util is not None]
    if not utils:
        return None
    mean = statistics.fmean(utils)
    return mean < mem.th.startup_still_gpu_util, [f"GPU-Util {mean:.0f} % over the same {dur(window_s)}"]


def _went_still(ctx: Evidence, mem: Memory) -> list[str] | None:
    """Evidence lines when a silent phase's log, processes and GPUs all stopped moving."""
    q, th = ctx.quiet, mem.th
    if q is None or q.silent_at(ctx.now) < th.startup_still_s or (q.progressing and q.step_s is not None):
        return None
    if q.phase is Phase.WEIGHTS:
        # Reading weights waits on the disk or the network, not the CPU: a first shard of 5 GB at
        # 100 MB/s is 50 s of a still process. Only its progress (once timed) and the ceiling judge it.
        return None
    cpu = _cpu_still(ctx, mem, th.startup_still_s)
    if cpu is None:
        return None
    gpu = _gpu_idle(ctx, mem, th.startup_still_s)
    if gpu is not None and not gpu[0]:
        return None
    return cpu + (gpu[1] if gpu is not None else [])


def startup_stall(ctx: Evidence, mem: Memory) -> Alert | None:
    snap = ctx.startup
    if not (snap is None or snap.state == "starting"):
        return None
    stall = ctx.stall
    why: list[str] = []
    still = False
    if stall is None and ctx.quiet is not None:
        why = _progress_stopped(ctx, mem) or []
        if not why:
            why = _went_still(ctx, mem) or []
            still = bool(why)
        if why:
            stall = ctx.quiet.as_stall(ctx.now)
    if stall is None:
        return None
    tgt = ctx.log_target
    since = ctx.now - stall.silent_s
    ev = [f"no new log line and no progress for {dur(stall.silent_s)} in {stall.label}", *why]
    hist = ctx.history
    if hist is not None and hist.backlog_lag_s > 0 and hist.backlog_lag_from is not None:
        # Read as a backlog (doctor, or the screen just attached): say what dates the silence.
        what = ("the last line's time stamp" if hist.backlog_lag_from == "stamp" else
                "the log file's modification time (its last line, a progress frame, has no time stamp)")
        ev.append(f"the log was read at attach: its last line was written {dur(hist.backlog_lag_s)} before vtop "
                  f"read it, by {what}")
    if not still and not why:
        ev.append("no process readings were used (vtop sees no process for this server, or none that old): "
                  "the silence alone, past the threshold")
    if snap is not None and stall.phase is not None:
        pv = snap.phase(stall.phase)
        if pv is not None and pv.progress:
            ev.append("progress: " + ", ".join(f"{p.label} {p.n}/{p.total}" for p in pv.progress))
    if stall.last_line:
        ev.append(f"last line: {stall.last_line.strip()[:200]}")
    if snap is not None and snap.facts.shm_broadcast_waits:
        ev.append(
            f"{snap.facts.shm_broadcast_waits} 'No available shared memory broadcast block' message(s): "
            "a worker is not answering"
        )
    idxs = mem.gpus_of(ctx, tgt) or sorted(mem.gpus)
    busy_sm: list[float] = []
    for idx in idxs:
        gl = mem.gpu_line(idx, since, ctx.now)
        if gl:
            ev.append(gl + " during the silence")
            busy_sm += [p.sm for p in mem.gpus[idx].between(since, ctx.now) if p.sm is not None]
    working = bool(busy_sm) and statistics.fmean(busy_sm) >= 50.0
    if working:
        ev.append("the SMs are busy: the phase may just be slow (a big model's first torch.compile or profiling)")
    fix = []
    if still:
        fix.append("Nothing runs: see whether a process is stopped or blocked (ps -o pid,stat,wchan,cmd: T is "
                   "stopped, D waits on I/O); kill -CONT a stopped one.")
    if stall.hint:
        fix.append(stall.hint[0].upper() + stall.hint[1:] + ".")
    fix.append("Press d for a py-spy dump of the EngineCore (the workers for TP>1) to see where it waits.")
    title = f"Startup of {short_url(tgt)} stalled in {stall.label}: no new log line for {dur(stall.silent_s)}"
    return Alert("startup_stall", "info" if working else "warning", title, tuple(ev), tuple(fix), tgt, since)
