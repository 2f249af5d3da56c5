"""``engine_stall``: a frozen engine behind a live API server.

Evidence: ``running > 0`` while the generation/prompt token counters and the finished-request
count stay flat for ``engine_stall_s``, and ``/metrics`` still answers (a frozen engine keeps
``/health`` at 200 and freezes the gauges). Before vtop's first sample, the log says since when
(:meth:`vtop.core.loghistory.LogHistoryView.stalled_since`): the stats lines with zero throughput
and requests running, the silence after them (vLLM drops a second idle interval to DEBUG), the
shm-broadcast 60 s wait; so ``doctor --window 15`` names a stall that began before it. The line
before the zero ones often still counts a sliver of tokens (the outputs made before the stop,
handed over after it): that interval is the one the engine stopped in, and its share of the
rate before it says about when (:meth:`~vtop.core.loghistory.LogHistoryView.stopped_within`;
the title then says "about"); without it the evidence would come up to a stats interval late. GPU-Util near 0 during the silence says the engine
launches no work (a Python-side hang or a stopped process); GPU-Util high with idle SMs says a
collective (NCCL) waits for a peer. Corpus traces: tests/corpus/traces/engine-stall-enginecore,
engine-stall-worker-only; quiet on every normal-* trace.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import LIVE, dur, num, short_url, xid_short

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class EngineStall:
    """The engine-stall rule (see the module's docstring)."""

    ids = ("engine_stall",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, engine_stall)


def engine_stall(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    th = mem.th
    s = st.last
    if s is None or v.state not in LIVE or not s.running or s.running <= 0:
        return None
    if v.sleep_level:  # put to sleep (POST /sleep): it makes no tokens on purpose, not a stall
        return None
    if st.last_progress_t is None or st.busy_since is None:
        return None
    since = max(st.last_progress_t, st.busy_since)
    now = ctx.now
    from_log = None
    hist = ctx.history_of(url)
    if hist is not None and st.first_t is not None and since <= st.first_t:
        # Nothing moved and requests ran from vtop's first sample on: the log says since when.
        from_log = hist.stalled_since(now, st.first_t)
        if from_log is not None and from_log[0] < since:
            since = from_log[0]
        else:
            from_log = None
    if now - since < th.engine_stall_s:
        return None
    short = short_url(url)
    about = "about " if from_log is not None and from_log[2] else ""
    ev = [
        f"running {num(s.running)}, waiting {num(s.waiting)} for {about}{dur(now - since)} with no new token and no "
        "request finished",
        f"generation tokens stuck at {num(s.gen)}, prompt tokens at {num(s.prompt)}",
    ]
    if from_log is not None:
        ev.append(from_log[1])
    if v.health is not None or v.latency_s is not None:
        lat = f", /metrics in {v.latency_s * 1000:.0f} ms" if v.latency_s is not None else ""
        ev.append(f"the server still answers (/health {v.health if v.health is not None else '?'}{lat}): "
                  "the API server is alive, the engine is not moving")
    for idx in mem.gpus_of(ctx, url):
        gl = mem.gpu_line(idx, since, now)
        if gl:
            gs = mem.gpus[idx]
            pts = gs.between(since, now)
            utils = [p.util for p in pts if p.util is not None]
            sms = [p.sm for p in pts if p.sm is not None]
            mu = statistics.fmean(utils) if utils else None
            ms = statistics.fmean(sms) if sms else None
            if mu is not None and mu < 5:
                gl += ": the engine launches no GPU work (a Python-side hang, a deadlock, or a stopped process)"
            elif mu is not None and mu >= th.sm_idle_util and ms is not None and ms < th.sm_idle_active:
                gl += ": busy with idle SMs, the signature of a collective (NCCL) waiting for a peer"
            ev.append(gl)
    xids = mem.xid_lines(ctx, url, since - 60.0, now)
    ev.extend(xids)
    fix = [
        "Press d for a py-spy dump of the EngineCore (the workers for TP>1): it shows where the engine waits.",
        "Look in the log for 'No available shared memory broadcast block found in 60 seconds' (a worker is stuck).",
        "If it does not move again, restart the server: /health stays 200 while the engine is frozen, so a health "
        "check alone will not restart it.",
    ]
    title = f"Engine stalled on {short}: {num(s.running)} running, no token for {about}{dur(now - since)}"
    if xids:
        fix.insert(0, "An XID on its GPU came with the stall: the GPU faulted (see the XID above); check "
                      "`nvidia-smi -q` and the kernel log (dmesg | grep -i xid), reset or replace the GPU.")
        title += f"; {xid_short(mem.xids_near(ctx, url, since - 60.0, now))}"
    return Alert("engine_stall", "critical", title, tuple(ev), tuple(fix), url, since)
