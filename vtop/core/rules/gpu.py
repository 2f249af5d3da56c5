"""``sm_idle``: a GPU that reads busy while its SMs are idle.

Evidence: NVML GPU-Util at or above ``sm_idle_util`` while GPM SM activity stays below
``sm_idle_active`` for ``sm_idle_s`` (only where the GPU reports SM activity: a poll without a
GPM reading neither starts nor breaks the streak; never during a start, where that is expected).
GPU-Util counts the time any kernel runs; SM activity says how many SMs work: the GPU is
launch-bound (``--enforce-eager``, tiny batches) or waiting inside a kernel (an NCCL collective
waiting for a peer). Corpus traces: none (the corpus is the CPU build and the H200 recordings
have no such stretch); tests/unit/test_diagnose.py feeds synthetic GPU polls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory, per_gpu
from vtop.core.rules.util import dur, engine_of, flag, num, short_url
from vtop.core.stats import fmean

if TYPE_CHECKING:
    from vtop.core.rules.state import GpuPoint, GpuState


class SmIdle:
    """The sm_idle rule (see the module's docstring)."""

    ids = ("sm_idle",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_gpu(ctx, mem, sm_idle)


@dataclass(frozen=True)
class SmIdleFinding:
    """A GPU busy with idle SMs: since when, the means over the streak, and who is on it."""

    gpu: int
    since: float
    now: float
    util: float
    sm: float
    #: the processes on the GPU, named (``EngineCore of :8000 (pid 1048, 70.0 GiB)``)
    procs: tuple[str, ...]
    #: the servers with a process on it, those that run with --enforce-eager, and those with
    #: requests running and no token in 30 s
    owners: tuple[str, ...]
    eager: tuple[str, ...]
    stuck: tuple[tuple[str, float], ...]
    #: the engine of the first server on it (:data:`vtop.core.engines.ENGINES`; None: vLLM's words)
    engine: str | None = None


def sm_idle(ctx: Evidence, mem: Memory, idx: int) -> Alert | None:
    f = sm_idle_finding(ctx, mem, idx)
    return sm_idle_alert(f, mem.th) if f is not None else None


def _note_streak(gs: GpuState, p: GpuPoint, th: Thresholds) -> None:
    """Take a new point into the streak of busy-with-idle-SMs points (a point without a GPM
    reading neither starts nor breaks it)."""
    if p.t == gs.idle_last_t:
        return
    gs.idle_last_t = p.t
    busy = p.util is not None and p.util >= th.sm_idle_util
    if busy and p.sm is None:
        return
    if not (busy and p.sm is not None and p.sm < th.sm_idle_active):
        gs.idle_since = None
        return
    if gs.idle_since is None:
        gs.idle_since, gs.idle_util, gs.idle_sm = p.t, [], []
    gs.idle_util.append(p.util)  # type: ignore[arg-type]
    gs.idle_sm.append(p.sm)
    if len(gs.idle_util) > 4096:
        del gs.idle_util[:2048], gs.idle_sm[:2048]


def sm_idle_finding(ctx: Evidence, mem: Memory, idx: int) -> SmIdleFinding | None:
    th = mem.th
    gs = mem.gpus[idx]
    p = gs.points[-1] if gs.points else None
    if p is None:
        return None
    if mem.starting_on(ctx, idx):
        gs.idle_since = None
        return None
    _note_streak(gs, p, th)
    if gs.idle_since is None or ctx.now - gs.idle_since < th.sm_idle_s:
        return None
    owners = tuple(ctx.gpu_owner.get(idx, []))
    eager = tuple(u for u in owners if (pr := ctx.process_of(u)) is not None
                  and flag(pr, flags_of(pr.engine)["eager"]) is not None)
    stuck = []
    for url in owners:
        st = mem.servers.get(url)
        if st is not None and st.last is not None and st.last.running:
            r0 = st.at(ctx.now - 30.0)
            if r0 is not None and r0.gen is not None and st.last.gen is not None and st.last.gen <= r0.gen:
                stuck.append((url, st.last.running))
    return SmIdleFinding(idx, gs.idle_since, ctx.now, fmean(gs.idle_util), fmean(gs.idle_sm),
                         tuple(mem.proc_names(ctx, p.procs)), owners, eager, tuple(stuck),
                         engine_of(ctx, owners[0]) if owners else None)


def sm_idle_alert(f: SmIdleFinding, th: Thresholds) -> Alert:
    """The words of an sm_idle finding."""
    span = dur(f.now - f.since)
    fl = flags_of(f.engine)
    ev = [
        f"GPU-Util {f.util:.0f} % but SM activity {f.sm:.1f} % for {span} "
        f"(>= {th.sm_idle_util:.0f} % vs < {th.sm_idle_active:.0f} %)",
        "GPU-Util counts the time any kernel runs; GPM SM activity says how many SMs work: the GPU is launch-bound "
        "(many tiny kernels) or waiting inside a kernel",
    ]
    if f.procs:
        ev.append("processes: " + ", ".join(f.procs))
    for url in f.owners:
        if url in f.eager:
            ev.append(f"{short_url(url)} runs with {fl['eager']}: no CUDA graphs, one launch per kernel")
        ev += [f"{short_url(u)} has {num(n)} running but no token in 30 s" for u, n in f.stuck if u == url]
    fix = []
    if f.owners:
        if f.eager:
            fix.append(f"Drop {fl['eager']} so {fl['name']} captures CUDA graphs (far fewer kernel launches).")
        fix.append(f"Batch more work per step: more concurrent requests, or a higher {fl['seqs']}.")
    fix.append(
        "If tokens/s is flat too, press d for a py-spy dump: a tensor-parallel worker stuck in an NCCL collective "
        "shows 100 % GPU-Util with idle SMs."
    )
    if not f.owners:
        fix.append("Otherwise check the process on this GPU for a spinning kernel or tiny batch sizes.")
    title = f"gpu{f.gpu} busy but SMs idle: GPU-Util {f.util:.0f} %, SM activity {f.sm:.1f} % for {span}"
    return Alert("sm_idle", "warning", title, tuple(ev), tuple(fix), f"gpu{f.gpu}", f.since)
