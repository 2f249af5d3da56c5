"""``startup_stall`` and ``startup_failure``: a start that hangs, a start that failed.

``startup_stall`` -- evidence: the startup tracker's :class:`~vtop.core.phases.StallInfo` (the log
silent and no progress for the stall threshold in the current phase), with the GPUs' activity during
the silence (busy SMs make it "info": the phase may just be slow) and any 'No available shared
memory broadcast block' waits. Corpus trace: tests/corpus/traces/startup-stall-compile (workers
frozen in torch.compile, the log silent); quiet on every normal-* trace.

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
from vtop.core.rules.context import Ctx
from vtop.core.rules.oom import is_oom_failure
from vtop.core.rules.util import dur, short_url

if TYPE_CHECKING:
    from vtop.core.phases import Failure


class StartupStall:
    """The startup-stall rule (see the module's docstring)."""

    ids = ("startup_stall",)

    def check(self, ctx: Ctx) -> list[Alert]:
        a = startup_stall(ctx)
        return [] if a is None else [a]


class StartupFailure:
    """The startup-failure rule (see the module's docstring)."""

    ids = ("startup_failure",)

    def check(self, ctx: Ctx) -> list[Alert]:
        f = tracker_failure(ctx)
        if f is None or f.phase is Phase.READY:
            return []
        where = f" during {f.phase.label}" if f.phase is not None else ""
        # The tracker's message may name the phase already ("ValueError during memory profiling").
        message = f.message.removesuffix(where) if where else f.message
        title = f"vLLM on {short_url(ctx.log_target)} failed to start{where}: {message}"
        return [Alert("startup_failure", "critical", title, failure_evidence(ctx, f, where), (f.fix,),
                      ctx.log_target, f.arrival)]


def tracker_failure(ctx: Ctx) -> Failure | None:
    """The failure of the log's start, unless it is a CUDA OOM (the OOM rules name those)."""
    snap = ctx.startup
    if snap is None or snap.state != "failed" or snap.failure is None or is_oom_failure(snap.failure):
        return None
    return snap.failure


def failure_evidence(ctx: Ctx, f: Failure, where: str) -> tuple[str, ...]:
    message = f.message.removesuffix(where) if where else f.message
    ev = [f"{message}{where}", f"telling line: {f.line.strip()[:300]}"]
    if f.kind in ("kv_no_memory", "kv_host_memory", "max_model_len"):
        ev += ctx.other_procs_lines(ctx.log_target, f.arrival)
    return tuple(ev)


def startup_stall(ctx: Ctx) -> Alert | None:
    snap = ctx.startup
    stall = ctx.stall
    if stall is None or not (snap is None or snap.state == "starting"):
        return None
    tgt = ctx.log_target
    since = ctx.now - stall.silent_s
    ev = [f"no new log line and no progress for {dur(stall.silent_s)} in {stall.label}"]
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
    idxs = ctx.gpus_of(tgt) or sorted(ctx.mem.gpus)
    busy_sm: list[float] = []
    for idx in idxs:
        gl = ctx.gpu_line(idx, since, ctx.now)
        if gl:
            ev.append(gl + " during the silence")
            busy_sm += [p.sm for p in ctx.mem.gpus[idx].between(since, ctx.now) if p.sm is not None]
    working = bool(busy_sm) and statistics.fmean(busy_sm) >= 50.0
    if working:
        ev.append("the SMs are busy: the phase may just be slow (a big model's first torch.compile or profiling)")
    fix = []
    if stall.hint:
        fix.append(stall.hint[0].upper() + stall.hint[1:] + ".")
    fix.append("Press d for a py-spy dump of the EngineCore (the workers for TP>1) to see where it waits.")
    title = f"Startup of {short_url(tgt)} stalled in {stall.label}: no new log line for {dur(stall.silent_s)}"
    return Alert("startup_stall", "info" if working else "warning", title, tuple(ev), tuple(fix), tgt, since)
