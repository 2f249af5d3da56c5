"""One helper for the widgets' component styles."""

from __future__ import annotations

from rich.style import Style
from textual.widget import Widget


def component_style(widget: Widget, name: str) -> Style:
    """The component class ``name``'s style as a partial style (only what it sets, so it lays over
    the widget's own), with its colour as the screen shows it.

    ``get_component_rich_style(name, partial=True)`` leaves a colour with an alpha (``$text-disabled``,
    ``$text-muted``: the foreground at some percent) unblended: it came out as full white, so the
    greyed gauges of a DOWN card and the dimmed keys of ``--readonly`` were drawn brighter than live
    text. The full style's colour is blended against the widget's background."""
    partial = widget.get_component_rich_style(name, partial=True)
    full = widget.get_component_rich_style(name, partial=False)
    return partial + Style(color=full.color) if partial.color is not None else partial
