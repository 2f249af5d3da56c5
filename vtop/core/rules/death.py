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

from vtop.core.engines import flags_of
from vtop.core.phases.phase import Phase
from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory
from vtop.core.rules.startup import failure_evidence, failure_words, tracker_failure
from vtop.core.rules.util import short_url, xid_short


class EngineDied:
    """The engine-death rule (see the module's docstring)."""

    ids = ("engine_died",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        f = tracker_failure(ctx, mem)
        if f is None or f.phase is not Phase.READY:
            return []
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
