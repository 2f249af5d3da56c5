"""Hand a clean widget's lines back as they were last frame.

Textual's compositor renders a partial update as one rectangle around every
changed region, and asks each widget that overlaps it for all of its lines
(``Compositor._get_renders``). A widget with no changed line then costs a
pass through ``StylesCache.render_widget`` anyway: its background colours (a
walk up the DOM), its region, its border titles' styles, the line filters,
before the cached strips come back. With GPU rows near the top and server
cards below changing every second, that rectangle spans most of the screen,
so the status line, the startup panel, the key hints and the containers paid
it every frame, for lines that had not changed: 0.45 ms a second of the UI
thread on the 2-core dev box with 8 GPUs + 2 servers, by per-call accounting
(an upper bound: the accounting costs too). Whole-process runs, alternating,
could not tell the gain from their own spread, on that box or the GPU box.

:class:`FrameMemo` keeps the last answer and returns it while the widget's
styles cache says nothing in it is dirty, the crop and line filters are the
same and the first cached line is the very strip it was. Textual marks lines
dirty for everything that changes a widget's look (``refresh``, a new size,
style or theme, scrolling, a link under the mouse); those are the cases that
go back through Textual's own path. It reads two attributes of Textual's
``StylesCache`` (``_dirty_lines`` and ``_cache``), which is why textual is
pinned exactly in pyproject.toml; tests/ui/test_frame_memo.py fails if they
go away or mean something else.
"""

from __future__ import annotations

from typing import Any

from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import Static


class FrameMemo:
    """Mixin for a Textual widget (put it before the widget class)."""

    _frame_memo: tuple[Region, list[Any], Any, Strip | None, list[Strip]] | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        cache = self._styles_cache  # type: ignore[attr-defined]
        filters = self.get_line_filters()  # type: ignore[attr-defined]
        hover = self.hover_style  # type: ignore[attr-defined]
        memo = self._frame_memo
        if (
            memo is not None
            and not cache._dirty_lines
            and memo[0] == crop
            and memo[1] == filters
            and memo[2] is hover
            and memo[3] is cache._cache.get(crop.y)
        ):
            return memo[4]
        strips: list[Strip] = super().render_lines(crop)  # type: ignore[misc]
        self._frame_memo = (crop, list(filters), hover, cache._cache.get(crop.y), strips)
        return strips


class MemoStatic(FrameMemo, Static):
    """A ``Static`` whose clean frames are handed back (:class:`FrameMemo`)."""


class MemoVertical(FrameMemo, Vertical):
    """A ``Vertical`` container, same."""


class MemoVerticalScroll(FrameMemo, VerticalScroll):
    """A ``VerticalScroll`` container, same."""


class MemoScreen(FrameMemo, Screen[Any]):
    """The main screen, same: its own lines are the background behind every widget."""
