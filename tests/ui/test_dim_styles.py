"""Greyed text is grey: the DOWN card's last-seen gauges and --readonly's dimmed keys were drawn in full
white (a component style with an alpha colour, read partial, comes out unblended)."""

from __future__ import annotations

from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.widgets.keys_bar import KeysBar
from vtop.ui.widgets.server_panel import ServerCard
from vtop.ui.widgets.styles import component_style


def _lum(style) -> float:  # type: ignore[no-untyped-def]
    r, g, b = style.color.get_truecolor()
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


async def test_dim_runs_are_darker_than_the_text_around_them() -> None:
    app = VtopApp(Config(no_gpu=True, urls=("http://127.0.0.1:9",), readonly=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        card = app.query_one(ServerCard)
        base = card.rich_style
        dim = component_style(card, "gpu-card--dim")
        assert _lum(dim) < 0.75 * _lum(base), (dim, base)
        # the partial read alone (what the widgets used) is the bug: brighter than the text
        assert _lum(card.get_component_rich_style("gpu-card--dim", partial=True)) > _lum(base)
        # a style laid over the widget's own sets no background of its own where the class sets none
        assert dim.bgcolor is None
        # the dimmed keys of --readonly: darker than the enabled ones
        bar = app.query_one(KeysBar)
        assert _lum(component_style(bar, "keys-bar--off")) < 0.75 * _lum(component_style(bar, "keys-bar--key"))
