"""Small text helpers shared by the core and the sources: durations as people say them, numbers from text (pure)."""

from __future__ import annotations


def dur(s: float) -> str:
    """``42s``, ``3m 05s``, ``2h 10m``: a duration as people say it on call."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


def to_int(text: str | None) -> int | None:
    """``int(text)``, or None for None and anything that is not a whole number."""
    if text is None:
        return None
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def to_float(text: str | None) -> float | None:
    """``float(text)``, or None for None and anything that is not a number."""
    if text is None:
        return None
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


#: how much of a log line an alert or the startup panel quotes
LINE_QUOTE_CHARS = 300


def clip(text: str, n: int = LINE_QUOTE_CHARS) -> str:
    """``text`` cut to at most ``n`` characters at a space, with "…" where it was cut: a quoted line never ends
    mid-number (vLLM's "the estimated maximum model length is 17488" cut at 300 characters read "is 1")."""
    if len(text) <= n:
        return text
    head = text[: n - 1]
    cut = head.rfind(" ")
    return (head[:cut] if cut > n // 2 else head).rstrip() + "…"
