"""Startup phases of a vLLM server, read from its log. Pure: no I/O, no Textual.

* :mod:`.phase`: :class:`Phase` and its labels, what the monitor and the rules name on every start;
* :mod:`.types`: what the tracker reports (:class:`StartupSnapshot`, :class:`Failure`, :class:`Quiet`,
  :class:`StallInfo`, :class:`LogLine`...; :class:`Phase` again);
* :mod:`.patterns`: the log's line formats and message patterns (:func:`parse_line`, :class:`LogEvent`);
* :mod:`.tracker`: :class:`PhaseTracker`, the state machine over the lines, and :func:`summarize`.

Every name here loads its module when it is first asked for: the patterns and the tracker (some sixty
regular expressions compiled at import), so the dashboard draws its first frame, and the panels name
phases, without paying for the parser until a log is read; the snapshot's types (nine dataclasses, ~6 ms
on the dev VM), so a ``vtop --once`` without a log does not build them (issue 43). The words of a failure and its usual fix are the
startup rules' (:func:`vtop.core.rules.startup.failure_words`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vtop.core.phases.patterns import LogEvent, parse_line
    from vtop.core.phases.phase import Phase
    from vtop.core.phases.tracker import DEFAULT_STALL_S, PhaseTracker, summarize
    from vtop.core.phases.types import (
        Failure,
        LogLine,
        PhaseView,
        Progress,
        Quiet,
        RankTiming,
        StallInfo,
        StartupFacts,
        StartupSnapshot,
    )
    from vtop.model.logtext import banner_version, is_progress_frame, split_glued, strip_ansi

__all__ = [
    "DEFAULT_STALL_S",
    "Failure",
    "LogEvent",
    "LogLine",
    "Phase",
    "PhaseTracker",
    "PhaseView",
    "Progress",
    "Quiet",
    "RankTiming",
    "StallInfo",
    "StartupFacts",
    "StartupSnapshot",
    "banner_version",
    "is_progress_frame",
    "parse_line",
    "split_glued",
    "strip_ansi",
    "summarize",
]

_LAZY = {
    "Phase": "vtop.core.phases.phase",
    **dict.fromkeys(("Failure", "LogLine", "PhaseView", "Progress", "Quiet", "RankTiming", "StallInfo", "StartupFacts",
                     "StartupSnapshot"), "vtop.core.phases.types"),
    "LogEvent": "vtop.core.phases.patterns",
    "parse_line": "vtop.core.phases.patterns",
    "DEFAULT_STALL_S": "vtop.core.phases.tracker",
    "PhaseTracker": "vtop.core.phases.tracker",
    "summarize": "vtop.core.phases.tracker",
    "banner_version": "vtop.model.logtext",
    "is_progress_frame": "vtop.model.logtext",
    "split_glued": "vtop.model.logtext",
    "strip_ansi": "vtop.model.logtext",
}


def __getattr__(name: str) -> Any:
    """Every name here, loaded from its module on first use (PEP 562)."""
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
