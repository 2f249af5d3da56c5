"""``api_unresponsive``: an API server that accepts connections and does not answer.

Evidence: the server tracker's scrape outcomes (:class:`~vtop.core.server.ServerView`): the last
poll got no complete ``/metrics`` answer within the scraper's deadline (``timeout``: the
connection was accepted, then no answer, an answer that came too late, or a body trickled out
slower than the deadline), and no complete answer came since the first poll of that run
(``failing_since``). A refused port is not this (``down``/``starting``); an HTTP error or a body
that is not vLLM's is not either (the server answered).

Why an incident: vLLM's API server is one asyncio event loop (uvicorn). A synchronous call in a
handler, a huge prompt being tokenized in the loop, or a stuck request-level hook block every
request at once: ``/metrics``, ``/health`` and the clients' requests alike, while the port stays
open, so a load balancer's TCP check and a ``ps`` see nothing wrong. The fix starts with where
the loop is: a py-spy dump of the API server process.

Severity: a warning once it has been silent for ``api_silent_s`` (two scrape deadlines: one slow
scrape on a loaded box is not an incident), critical after ``api_silent_critical_s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.stillness import tree_cpu
from vtop.core.rules.util import dur, short_url

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class ApiUnresponsive:
    """The unresponsive-API-server rule (see the module's docstring)."""

    ids = ("api_unresponsive",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, api_unresponsive)


def silent_for(now: float, v: ServerView) -> float | None:
    """Seconds the server has accepted scrapes without a complete answer (None: it answers, or the
    last failure was not a timeout)."""
    if v.last_error != "timeout" or v.failing_since is None:
        return None
    return max(0.0, now - v.failing_since)


#: the API server's CPU over the silence, as a share of one core, at or above which its event loop is busy
#: (the work is in the loop), and at or below which it waits. Recorded on vLLM 0.26.0 (an H100): while the
#: API server built the prompt logprobs of 16 prompts of 30,000 tokens it used 99-101 % of a core for 47 s,
#: its EngineCore 2 %, and answered neither /metrics nor /health
LOOP_BUSY_FRAC = 0.8
LOOP_IDLE_FRAC = 0.05


def _loop_cpu(st: ServerState, pid: int | None, since: float | None) -> tuple[bool, str] | None:
    """(busy, the line) from the process scans over the silence: the API server process's CPU time;
    None without two scans of it over at least 2 s, or between the two bounds."""
    if pid is None or since is None:
        return None
    use = tree_cpu(st, since)
    if use is None or use.span_s < 2.0 or pid not in use.used:
        return None
    frac = use.used[pid] / use.span_s
    head = f"CPU time in {dur(use.span_s)}: the API server (pid {pid}) {use.used[pid]:.1f} s ({frac:.0%} of a core)"
    if frac >= LOOP_BUSY_FRAC:
        return True, f"{head}: its event loop is busy with work of its own, not waiting"
    if frac <= LOOP_IDLE_FRAC:
        return False, f"{head}: its event loop does not run (blocked on a call, or waiting)"
    return None


def api_unresponsive(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    th = mem.th
    silent = silent_for(ctx.now, v)
    if silent is None or silent < th.api_silent_s:
        return None
    severity = "critical" if silent >= th.api_silent_critical_s else "warning"
    short = short_url(url)
    title = (f"API server of {short} not answering: no complete /metrics answer for {dur(silent)} "
             f"(connections accepted)")
    ev = [
        f"{v.timeouts} scrape{'s' if v.timeouts != 1 else ''} in a row timed out: "
        f"{v.last_error_message or 'no complete answer in time'}",
    ]
    if v.last_ok_mono is None:
        ev.append("no complete answer since vtop began watching it")
    else:
        ev.append(f"last complete answer {dur(max(0.0, ctx.now - v.last_ok_mono))} ago")
    if v.health_error is not None and v.health_error_since is not None:
        for_s = max(0.0, ctx.now - v.health_error_since)
        ev.append(f"/health not answered either ({v.health_error}{f' for {dur(for_s)}' if for_s >= 1.0 else ''}): "
                  "a liveness probe on /health fails too")
    elif v.health is not None:
        ev.append(f"/health last answered {v.health}")
    ev.append("the port accepts connections, so a TCP health check still passes")
    proc = ctx.process_of(url)
    pid = proc.pid if proc is not None else None
    who = f"the API server (pid {pid})" if pid is not None else "the API server"
    cpu = _loop_cpu(st, pid, v.failing_since)
    if cpu is not None:
        ev.append(cpu[1])
    busy = cpu is not None and cpu[0]
    dump = (f"py-spy dump --pid {pid if pid is not None else '<API server pid>'} (or press d): where {who}'s event "
            "loop is " + ("busy (a huge prompt tokenized, prompt logprobs or a large answer built in the loop)" if busy
                          else "blocked (a synchronous call in a handler, a huge prompt tokenized in the loop, a stuck hook)"))
    idle = ("If py-spy shows the loop idle in epoll, look between vtop and the port: a proxy, a firewall, "
            "another process on the port")
    fix = (dump, *(() if busy else (idle,)), f"Check by hand: curl -m 5 -sS {url}/metrics | head")
    return Alert("api_unresponsive", severity, title, tuple(ev), fix, url, v.failing_since)
