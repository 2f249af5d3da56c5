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

import statistics
from typing import TYPE_CHECKING

from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_gpu
from vtop.core.rules.util import dur, flag, num, short_url

if TYPE_CHECKING:
    pass


class SmIdle:
    """The sm_idle rule (see the module's docstring)."""

    ids = ("sm_idle",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_gpu(ctx, mem, sm_idle)


def sm_idle(ctx: Evidence, mem: Memory, idx: int) -> Alert | None:
    th = mem.th
    gs = mem.gpus[idx]
    p = gs.points[-1] if gs.points else None
    if p is None:
        return None
    if mem.starting_on(ctx, idx):
        gs.idle_since = None
        return None
    if p.t != gs.idle_last_t:
        gs.idle_last_t = p.t
        busy = p.util is not None and p.util >= th.sm_idle_util
        if busy and p.sm is not None and p.sm < th.sm_idle_active:
            if gs.idle_since is None:
                gs.idle_since, gs.idle_util, gs.idle_sm = p.t, [], []
            gs.idle_util.append(p.util)  # type: ignore[arg-type]
            gs.idle_sm.append(p.sm)
            if len(gs.idle_util) > 4096:
                del gs.idle_util[:2048], gs.idle_sm[:2048]
        elif busy and p.sm is None:
            pass  # no GPM reading this time: neither starts nor breaks a streak
        else:
            gs.idle_since = None
    if gs.idle_since is None or ctx.now - gs.idle_since < th.sm_idle_s:
        return None
    since = gs.idle_since
    mu = statistics.fmean(gs.idle_util)
    ms = statistics.fmean(gs.idle_sm)
    ev = [
        f"GPU-Util {mu:.0f} % but SM activity {ms:.1f} % for {dur(ctx.now - since)} "
        f"(>= {th.sm_idle_util:.0f} % vs < {th.sm_idle_active:.0f} %)",
        "GPU-Util counts the time any kernel runs; GPM SM activity says how many SMs work: the GPU is launch-bound "
        "(many tiny kernels) or waiting inside a kernel",
    ]
    names = mem.proc_names(ctx, p.procs)
    if names:
        ev.append("processes: " + ", ".join(names))
    owners = ctx.gpu_owner.get(idx, [])
    eager = False
    for url in owners:
        proc = ctx.process_of(url)
        if proc is not None and flag(proc, "--enforce-eager") is not None:
            eager = True
            ev.append(f"{short_url(url)} runs with --enforce-eager: no CUDA graphs, one launch per kernel")
        st = mem.servers.get(url)
        if st is not None and st.last is not None and st.last.running:
            r0 = st.at(ctx.now - 30.0)
            if r0 is not None and r0.gen is not None and st.last.gen is not None and st.last.gen <= r0.gen:
                ev.append(f"{short_url(url)} has {num(st.last.running)} running but no token in 30 s")
    fix = []
    if owners:
        if eager:
            fix.append("Drop --enforce-eager so vLLM captures CUDA graphs (far fewer kernel launches).")
        fix.append("Batch more work per step: more concurrent requests, or a higher --max-num-seqs.")
    fix.append(
        "If tokens/s is flat too, press d for a py-spy dump: a tensor-parallel worker stuck in an NCCL collective "
        "shows 100 % GPU-Util with idle SMs."
    )
    if not owners:
        fix.append("Otherwise check the process on this GPU for a spinning kernel or tiny batch sizes.")
    title = f"gpu{idx} busy but SMs idle: GPU-Util {mu:.0f} %, SM activity {ms:.1f} % for {dur(ctx.now - since)}"
    return Alert("sm_idle", "warning", title, tuple(ev), tuple(fix), f"gpu{idx}", since)
