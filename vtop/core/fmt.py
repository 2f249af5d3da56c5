"""Small text helpers shared by the core's messages (pure)."""

from __future__ import annotations


def dur(s: float) -> str:
    """``42s``, ``3m 05s``, ``2h 10m``: a duration as people say it on call."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
