"""The screenshots in screenshots/ show the app as it is (issue 26, item 9).

Every SVG directly under screenshots/ is written by ``python -m tools.make_screenshots``
(from recordings); this fails when one is older than the code it shows: its footer is not
the footer the app draws now at that width (live or replay), or a panel title has another
form than the app's. Regenerate them with that one command and look at them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.screen_text import svg_lines
from tools import make_screenshots
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.ui.app import VtopApp
from vtop.ui.replay import replay_app
from vtop.ui.widgets.keys_bar import KeysBar

SHOTS = Path(__file__).resolve().parents[2] / "screenshots"
ALERT_TITLE = re.compile(r"[╭┏][─━] (\d+ alerts?[^─━]*?) [─━]")


def test_every_screenshot_is_made_by_the_one_command() -> None:
    on_disk = sorted(p.name for p in SHOTS.glob("*.svg"))
    assert on_disk == sorted(make_screenshots.MADE)


async def footer_of(replay: bool, width: int, past: bool = False) -> str:
    """The footer the app draws at ``width``; ``past``: with the log telling of the time before vtop
    started (a late look: the timeline key ``h`` is offered)."""
    app = (replay_app(str(demo_path()), config=Config(), name="demo") if replay
           else VtopApp(Config(no_gpu=True), autopoll=False, hostname="t"))
    async with app.run_test(size=(width, 24)) as pilot:
        if past:
            app.monitor.has_past = lambda: True  # type: ignore[method-assign]
            app.refresh_bindings()
        await pilot.pause()
        return str(app.query_one(KeysBar).render()).strip()


async def test_screenshots_show_todays_footer_and_titles() -> None:
    footers: dict[tuple[bool, int, bool], str] = {}
    alerts_title = "(e: all, with every fix)"
    stale = []
    for name in make_screenshots.MADE:
        lines = svg_lines((SHOTS / name).read_text())
        width = max(len(ln) for ln in lines)
        for m in ALERT_TITLE.finditer("\n".join(lines)):
            if not m.group(1).endswith(alerts_title):
                stale.append(f"{name}: alert box titled {m.group(1)!r}")
        footer = lines[-1].strip()
        if footer.startswith(("╰", "┗")) or not footer:
            continue  # a full-screen view (help, alerts): its own keys line is checked below
        replay = lines[0].lstrip().startswith("REPLAY")
        key = (replay, width, name.startswith("late-look"))
        if key not in footers:
            footers[key] = await footer_of(*key)
        if footer != footers[key]:
            stale.append(f"{name}: footer {footer!r}, the app now draws {footers[key]!r}")
    assert not stale, "screenshots older than the code (python -m tools.make_screenshots):\n" + "\n".join(stale)


@pytest.mark.parametrize("name,title", [("demo-h200-help.svg", "vtop help"), ("help-live.svg", "vtop help"),
                                        ("demo-h200-runaway-alert-e.svg", "Alerts: every line, every fix")])
def test_full_screen_views_have_todays_titles(name: str, title: str) -> None:
    from vtop.ui import screens

    src = Path(screens.__file__).read_text()
    lines = svg_lines((SHOTS / name).read_text())
    assert f'"{title}"' in src  # the app still calls it so
    assert title in lines[1]
