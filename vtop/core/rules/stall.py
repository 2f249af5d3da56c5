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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import LIVE, dur, num, short_url, xid_short
from vtop.core.stats import fmean

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class EngineStall:
    """The engine-stall rule (see the module's docstring)."""

    ids = ("engine_stall",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, engine_stall)


@dataclass(frozen=True)
class StallFinding:
    """An engine that stopped: since when (``about`` when the log's stats lines only bound it), what
    it holds, whether the API server still answers, the GPUs' means over the silence, XIDs near it."""

    url: str
    since: float
    now: float
    about: bool
    running: float | None
    waiting: float | None
    gen: float | None
    prompt: float | None
    #: the log's line that says since when (None: /metrics said it)
    log_line: str | None
    health: int | None
    latency_s: float | None
    #: per GPU: (its line, mean GPU-Util, mean SM activity) over the silence
    gpus: tuple[tuple[str, float | None, float | None], ...]
    xid_lines: tuple[str, ...]
    xid_title: str


def engine_stall(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    f = stall_finding(ctx, mem, url, v, st)
    return stall_alert(f, mem.th) if f is not None else None


def _stall_since(ctx: Evidence, url: str, st: ServerState) -> tuple[float, tuple[float, str, bool] | None] | None:
    """Since when nothing moved while requests ran, and the log's word on it when it reaches further back."""
    if st.last_progress_t is None or st.busy_since is None:
        return None
    since = max(st.last_progress_t, st.busy_since)
    hist = ctx.history_of(url)
    if hist is not None and st.first_t is not None and since <= st.first_t:
        # Nothing moved and requests ran from vtop's first sample on: the log says since when.
        from_log = hist.stalled_since(ctx.now, st.first_t)
        if from_log is not None and from_log[0] < since:
            return from_log[0], from_log
    return since, None


def stall_finding(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> StallFinding | None:
    s = st.last
    if s is None or v.state not in LIVE or not s.running or s.running <= 0:
        return None
    if v.sleep_level:  # put to sleep (POST /sleep): it makes no tokens on purpose, not a stall
        return None
    got = _stall_since(ctx, url, st)
    if got is None or ctx.now - got[0] < mem.th.engine_stall_s:
        return None
    since, from_log = got
    now = ctx.now
    gpus = []
    for idx in mem.gpus_of(ctx, url):
        gl = mem.gpu_line(idx, since, now)
        if gl:
            pts = mem.gpus[idx].between(since, now)
            utils = [p.util for p in pts if p.util is not None]
            sms = [p.sm for p in pts if p.sm is not None]
            gpus.append((gl, fmean(utils) if utils else None, fmean(sms) if sms else None))
    return StallFinding(
        url, since, now, from_log is not None and from_log[2], s.running, s.waiting, s.gen, s.prompt,
        from_log[1] if from_log is not None else None, v.health, v.latency_s, tuple(gpus),
        tuple(mem.xid_lines(ctx, url, since - 60.0, now)), xid_short(mem.xids_near(ctx, url, since - 60.0, now)),
    )


_STALL_FIX = (
    "Press d for a py-spy dump of the EngineCore (the workers for TP>1): it shows where the engine waits.",
    "Look in the log for 'No available shared memory broadcast block found in 60 seconds' (a worker is stuck).",
    "If it does not move again, restart the server: /health stays 200 while the engine is frozen, so a health "
    "check alone will not restart it.",
)


def stall_alert(f: StallFinding, th: Thresholds) -> Alert:
    """The words of an engine stall."""
    about = "about " if f.about else ""
    span = dur(f.now - f.since)
    ev = [
        f"running {num(f.running)}, waiting {num(f.waiting)} for {about}{span} with no new token and no "
        "request finished",
        f"generation tokens stuck at {num(f.gen)}, prompt tokens at {num(f.prompt)}",
    ]
    if f.log_line is not None:
        ev.append(f.log_line)
    if f.health is not None or f.latency_s is not None:
        lat = f", /metrics in {f.latency_s * 1000:.0f} ms" if f.latency_s is not None else ""
        ev.append(f"the server still answers (/health {f.health if f.health is not None else '?'}{lat}): "
                  "the API server is alive, the engine is not moving")
    for gl, mu, ms in f.gpus:
        if mu is not None and mu < 5:
            gl += ": the engine launches no GPU work (a Python-side hang, a deadlock, or a stopped process)"
        elif mu is not None and mu >= th.sm_idle_util and ms is not None and ms < th.sm_idle_active:
            gl += ": busy with idle SMs, the signature of a collective (NCCL) waiting for a peer"
        ev.append(gl)
    ev.extend(f.xid_lines)
    fix: tuple[str, ...] = _STALL_FIX
    title = f"Engine stalled on {short_url(f.url)}: {num(f.running)} running, no token for {about}{span}"
    if f.xid_lines:
        fix = ("An XID on its GPU came with the stall: the GPU faulted (see the XID above); check "
               "`nvidia-smi -q` and the kernel log (dmesg | grep -i xid), reset or replace the GPU.", *fix)
        title += f"; {f.xid_title}"
    return Alert("engine_stall", "critical", title, tuple(ev), fix, f.url, f.since)
