"""Small pieces the rules share: number and name formatting, reading a server's command line. Pure."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vtop.core.rates import HistogramDelta
from vtop.model.fmt import dur
from vtop.model.gpu import XidEvent
from vtop.model.procs import ServerProcess

if TYPE_CHECKING:
    from vtop.core.evidence import Evidence

__all__ = ["GIB", "LIVE", "cap_suggestion", "dur", "flag", "gib", "hist_count_at_least", "json_keys",
           "num", "plural", "short_url", "version_tuple", "xid_short"]

GIB = float(2**30)
#: server states in which a server serves (the rules that read /metrics judge only these)
LIVE = ("up", "restarted")


def num(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def gib(b: float | None) -> str:
    return "?" if b is None else f"{b / GIB:.1f} GiB"


def short_url(url: str | None) -> str:
    """``:8000`` for a local server, ``host:port`` otherwise."""
    if not url:
        return "the server"
    m = re.match(r"^[a-z]+://(\[[^\]]+\]|[^/:]+)(?::(\d+))?", url)
    if not m:
        return url
    host, port = m.group(1), m.group(2) or ""
    if host in ("127.0.0.1", "localhost", "[::1]", "0.0.0.0"):
        return f":{port}" if port else host
    return f"{host}:{port}" if port else host


def plural(n: float, word: str) -> str:
    return f"{n:,.0f} {word}" + ("" if round(n) == 1 else "s")


def engine_of(ctx: Evidence, url: str | None) -> str | None:
    """The engine serving ``url`` (:data:`vtop.core.engines.ENGINES`): by the command line
    discovery found, else the families its /metrics serves, else the followed log's line format; None: not
    known (the fixes then name vLLM's flags)."""
    proc = ctx.process_of(url)
    if proc is not None and proc.engine:
        return proc.engine
    v = ctx.servers.get(url) if url is not None else None
    if v is not None and v.metrics is not None and v.metrics.engine_kind:
        return v.metrics.engine_kind
    if ctx.startup is not None and (url is None or ctx.log_target == url):
        return ctx.startup.facts.engine
    return None


def flag(proc: ServerProcess, name: str) -> str | None:
    """Value of ``--name`` on a server's command line (``""`` for a bare flag)."""
    argv = proc.argv
    val: str | None = None
    for i, tok in enumerate(argv):
        if tok == name:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            val = "" if nxt.startswith("--") else nxt
        elif tok.startswith(name + "="):
            val = tok[len(name) + 1:]
    return val


def version_tuple(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def hist_count_at_least(delta: HistogramDelta | None, limit: float) -> tuple[float, float | None]:
    """(observations in buckets whose lower edge is >= ``limit``, that edge)."""
    if delta is None or not delta.buckets:
        return 0.0, None
    total = delta.buckets[-1][1]
    prev_le = 0.0
    prev_c = 0.0
    for le, c in delta.buckets:
        if prev_le >= limit:
            return max(0.0, total - prev_c), prev_le
        prev_le, prev_c = le, c
    return 0.0, None


def json_keys(s: str | None) -> set[str]:
    if not s:
        return set()
    try:
        obj = json.loads(s)
    except ValueError:
        return set(re.findall(r"[\"']?(\w+)[\"']?\s*:", s))
    return set(obj) if isinstance(obj, dict) else set()


def cap_suggestion(mml: int | None) -> int:
    """A generation cap to suggest: 4096, or half the context when that is smaller."""
    if not mml:
        return 4096
    return min(4096, max(256, int(mml) // 2))


def xid_short(xids: Iterable[XidEvent]) -> str:
    """``XID 79 on gpu0`` (the first; ``+N more``) for a title."""
    xs = list(xids)
    if not xs:
        return ""
    x = xs[0]
    where = f" on gpu{x.gpu}" if x.gpu is not None else ""
    more = f" (+{len(xs) - 1} more)" if len(xs) > 1 else ""
    return f"XID {x.xid}{where}{more}"


def said_at(ctx: Evidence, mono: float) -> str:
    """A moment of the tick's monotonic clock as the wall clock says it, ``at 05:10:53`` (the same words at
    every tick, so an alert's evidence does not repaint each second); ``42s ago`` where the wall is not known."""
    if ctx.wall is None:
        return f"{dur(ctx.now - mono)} ago"
    try:
        return "at " + time.strftime("%H:%M:%S", time.localtime(ctx.wall - (ctx.now - mono)))
    except (OverflowError, ValueError, OSError):
        return f"{dur(ctx.now - mono)} ago"
