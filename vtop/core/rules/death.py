"""``engine_died``: an engine that died after its server was ready.

Evidence: the startup tracker's :class:`~vtop.core.phases.Failure` in the READY phase: the log's
``Worker proc ... died unexpectedly (exit code: N)``, ``Engine core proc ... died unexpectedly``,
``EngineDeadError: EngineCore encountered an issue`` lines (with a cause logged shortly before). A failure seen in the log is never undone by a later
ready or health event of the same start (the tracker's rule), so a ``/health`` 200 answered in the
same second does not hide it. CUDA OOMs are the OOM rules'. Corpus traces:
tests/corpus/traces/engine-death-enginecore-idle, engine-death-worker-load; quiet on
clean-sigterm-shutdown (vLLM logs ``EngineDeadError`` after ``shutdown triggered``: not a death).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.phases.phase import Phase
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.startup import failure_evidence, failure_words, tracker_failure
from vtop.core.rules.util import engine_of, said_at, short_url, xid_short

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class EngineDied:
    """The engine-death rule (see the module's docstring)."""

    ids = ("engine_died",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        # an engine vtop has no log of: /health said it is dead
        dead = per_server(ctx, mem, dead_by_health)
        f = tracker_failure(ctx, mem)
        if f is None or f.phase is not Phase.READY:
            return dead
        words = failure_words(f)
        title = f"{flags_of(f.engine)['name']} engine on {short_url(ctx.log_target)} died: {words.message}"
        ev = failure_evidence(ctx, mem, f, "")
        fix: tuple[str, ...] = (words.fix,)
        # an XID on its GPUs within a minute of the death: the GPU, not vLLM, is the first suspect
        at = f.arrival if f.arrival is not None else ctx.now
        near = mem.xids_near(ctx, ctx.log_target, at - 60.0, min(ctx.now, at + 60.0))
        if near:
            title += f"; {xid_short(near)}"
            ev = (*ev, *mem.xid_lines(ctx, ctx.log_target, at - 60.0, min(ctx.now, at + 60.0)))
            fix = ("An XID on its GPU came with the death: the GPU faulted (see the XID above); check "
                   "`nvidia-smi -q` and the kernel log (dmesg | grep -i xid) before restarting the server.", *fix)
        return [Alert("engine_died", "critical", title, ev, fix, ctx.log_target, f.arrival)]


def dead_by_health(ev: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """No log: ``/health`` answered 500/503, vLLM's answer once its engine is dead (``EngineDeadError``), and
    the server has not answered as healthy since (the API server exits next, or serves errors). On until the
    server is up again. An engine killed under load can take the API server down before a poll sees the 503:
    from outside that is a stop like a SIGTERM, and nothing is said."""
    d = st.engine_dead
    if d is None or (ev.startup is not None and ev.log_target == url):
        return None  # with the log, its tracker's failure is the rule's (and names the cause)
    since, status = d
    fl = flags_of(engine_of(ev, url))
    if not fl["dead_health"]:
        return None  # an engine whose /health 5xx is no proof of a death (vtop/core/engines.py says which)
    name = fl["name"]
    said = f"/health answered {status}" if status is not None else "/health answered an error"
    title = f"{name} engine on {short_url(url)} died: {said} (no log: its cause is in its output)"
    lines = [f"no log: {said} {said_at(ev, since)}: {fl['dead_health']}",
             "vtop cannot read its output (a pipe, a container, a unit's journal), so it cannot say why"]
    if v.state == "down":
        lines.append("the API server exited after it")
    fix = ("Restart the server: a dead engine does not come back, and requests sent meanwhile fail.",
           "Read the cause where its output goes (`docker logs <container>`, `journalctl -u <unit>`, `kubectl logs "
           "<pod> --previous`; a killed worker, an out-of-memory kill in `dmesg`, a CUDA error), and give vtop the "
           "log (`--log`) to have it named.")
    return Alert("engine_died", "critical", title, tuple(lines), fix, url, since)
