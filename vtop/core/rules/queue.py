"""``queue_wedge``: requests wait and the engine schedules none of them.

Evidence: ``running`` is 0 and ``waiting`` above 0 in every sample for ``queue_wedge_s``, and
no token was generated, no prompt token taken and no request finished in that time (the
counters stood still), while ``/metrics`` answers. Before vtop's first sample the log's stats
lines say since when (``Running: 0 reqs, Waiting: N reqs`` with zero throughput), so a short
``doctor`` window names a wedge that began before it.

Why an incident: vLLM's scheduler admits a waiting request as soon as it fits; with nothing
running every block of the KV cache is free, so a queue that does not move with nothing running
is a scheduler that stopped admitting (vllm#53868 "engine wedges at Running: 0 / Waiting: 3", with a
KV-offloading connector; vllm#39863; vllm#45414 without one: health checks pass for minutes while
the queue waits). ``engine_stall`` needs requests running; this is the other half.

Not a wedge: a start (no ``/metrics`` yet: the server is not up), a queue that drains (running
goes above 0 at once), an engine put to sleep (``engine_sleep_state``), a server that restarted
(its counters are new). Corpus: no normal trace has 30 s of it; the wedge itself could not be caused
on the CPU build (see tests/unit/test_queue_wedge.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import LIVE, dur, engine_of, num, short_url

if TYPE_CHECKING:
    from vtop.core.loghistory import LogHistoryView
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class QueueWedge:
    """The queue-wedge rule (see the module's docstring)."""

    ids = ("queue_wedge",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, queue_wedge)


@dataclass(frozen=True)
class WedgeFinding:
    """A queue that does not move with nothing running: since when, how many wait (and why, where
    vLLM says), the counters that stood still, the KV usage, and the log's word when it said since when."""

    url: str
    since: float
    now: float
    waiting: float
    by_reason: Mapping[str, float]
    gen: float | None
    prompt: float | None
    kv_pct: float | None
    health: int | None
    log_line: str | None
    #: the server's engine (:data:`vtop.core.engines.ENGINES`; None: vLLM's words): the fix names its flags
    engine: str | None = None


def queue_wedge(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    f = wedge_finding(ctx, mem, url, v, st)
    return wedge_alert(f, mem.th) if f is not None else None


def _log_since(hist: LogHistoryView | None, first_seen: float) -> tuple[float, str] | None:
    """The trailing stats lines that show the same wedge (running 0, requests waiting, no
    throughput) reaching back to vtop's first sample: since the first of them."""
    if hist is None or not hist.stats:
        return None
    pts = hist.stats
    i = len(pts)
    while i > 0 and pts[i - 1].running == 0 and pts[i - 1].waiting > 0 and pts[i - 1].gen_tps <= 0 \
            and pts[i - 1].prompt_tps <= 0:
        i -= 1
    if i == len(pts) or pts[-1].mono < first_seen - 30.0 or pts[i].mono >= first_seen:
        return None
    p = pts[i]
    return p.mono, (f"the log's stats lines: running 0, {p.waiting} waiting and no throughput in every line since "
                    f"{dur(pts[-1].mono - p.mono)} before the last one")


def wedge_finding(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> WedgeFinding | None:
    s = st.last
    if s is None or v.state not in LIVE or v.sleep_level or st.queue_since is None:
        return None
    if s.running is None or s.running > 0 or not s.waiting:
        return None
    since = st.queue_since if st.last_progress_t is None else max(st.queue_since, st.last_progress_t)
    log_line = None
    if st.first_t is not None and since <= st.first_t:
        got = _log_since(ctx.history_of(url), st.first_t)
        if got is not None and got[0] < since:
            since, log_line = got
    if ctx.now - since < mem.th.queue_wedge_s:
        return None
    m = v.metrics
    return WedgeFinding(url, mem.started("queue_wedge", url, since), ctx.now, s.waiting,
                        dict(m.waiting_by_reason) if m is not None else {}, s.gen, s.prompt, s.kv, v.health, log_line,
                        engine_of(ctx, url))


_WEDGE_FIX = (
    "Collect first, before any restart: a py-spy dump of {engine_proc} (press d, or py-spy dump --pid "
    "{engine_pid}; {tp_procs} too for TP>1) and `curl -s <server>/metrics | grep -E {queue_grep}.",
    "Restart the server: a scheduler that stopped admitting does not recover by itself, and /health stays 200, "
    "so a health check alone will not restart it.",
    "{wedge_seen}",
)


def wedge_alert(f: WedgeFinding, th: Thresholds) -> Alert:
    """The words of a wedged queue."""
    span = dur(f.now - f.since)
    why = ", ".join(f"{num(n)} {r}" for r, n in sorted(f.by_reason.items()) if n)
    ev = [
        f"running 0, waiting {num(f.waiting)}{f' ({why})' if why else ''} for {span}: nothing scheduled, no token "
        "generated, no request finished",
        f"generation tokens stuck at {num(f.gen)}, prompt tokens at {num(f.prompt)}",
    ]
    if f.kv_pct is not None:
        ev.append(f"KV cache at {f.kv_pct:.1f} %: with nothing running the cache is not what the queue waits for")
    if f.log_line is not None:
        ev.append(f.log_line)
    if f.health is not None:
        ev.append(f"/health answers {f.health}: the API server is alive, the scheduler admits nothing")
    title = f"Queue wedged on {short_url(f.url)}: {num(f.waiting)} waiting, nothing running for {span}"
    return Alert("queue_wedge", "critical", title, tuple(ev),
                 tuple(x for x in (t.format_map(flags_of(f.engine)) for t in _WEDGE_FIX) if x), f.url, f.since)
