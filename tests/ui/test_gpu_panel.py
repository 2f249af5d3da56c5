"""Pilot tests of the GPU panel: sizes, a hung NVML call, a lost GPU, no GPU at all."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pynvml

from tests.conftest import FIXTURES, fake_gpus, make_app
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.sources.fake_nvml import FakeGpu, FakeNvml
from vtop.sources.nvml import NvmlSource
from vtop.sources.recording.record import ReplayGpuSource, polls_from_sampler
from vtop.ui.app import VtopApp
from vtop.ui.widgets.gpu_panel import GpuCard, GpuLines, GpuPanel, layout_for


async def feed(app: VtopApp, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        await app.poll_gpu_once()
        clock.advance(1.0)


def card_text(card: GpuCard) -> str:
    return card.render().plain


def test_layout_rule() -> None:
    assert layout_for(8, 80, 16) == (True, 1)  # 8 GPUs at 80x24: one line each
    assert layout_for(8, 200, 52) == (False, 2)  # 200x60: full cards in two columns
    assert layout_for(1, 80, 16) == (False, 1)
    assert layout_for(1, 60, 12) == (False, 1)


async def test_eight_gpus_at_80x24_are_one_line_each(clock: FakeClock) -> None:
    src, _ = fake_gpus(8, clock)
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, clock, 30)
        await pilot.pause()
        panel = app.query_one(GpuPanel)
        assert panel.compact
        assert not any(c.display for c in app.query(GpuCard))
        lines = app.query_one(GpuLines)
        assert lines.region.height == 8 and 0 < lines.region.y and lines.region.bottom < 24
        assert lines.region.width <= 80
        text = lines.render().plain.splitlines()
        assert len(text) == 8
        for i, t in enumerate(text):
            assert t.startswith(f"{i} H200") and "util" in t and "SM" in t and "mem" in t
            assert "/140G" in t and len(t) <= 80
        assert "8 × NVIDIA H200" in app.gpu_status_text()


async def test_eight_gpus_at_200x60_are_full_cards_in_two_columns(clock: FakeClock) -> None:
    src, _ = fake_gpus(8, clock)
    app = make_app(src)
    async with app.run_test(size=(200, 60)) as pilot:
        await feed(app, clock, 30)
        await pilot.pause()
        cards = list(app.query(GpuCard))
        assert not app.query_one(GpuPanel).compact
        assert all(c.display and c.region.height == 7 for c in cards)  # 5 rows: util, SM act, power, mem, bw
        assert len({c.region.x for c in cards}) == 2
        assert max(c.region.bottom for c in cards) < 60
        t = card_text(cards[0])
        for word in ("util", "SM act", "power", "mem", "bw", "W/700", "°C", "GiB", "MHz"):
            assert word in t
        assert cards[0].border_title == "GPU 0 · H200"
        assert "70.0 GiB" in (cards[0].border_subtitle or "")


async def test_small_terminal_60x20(clock: FakeClock) -> None:
    src, _ = fake_gpus(2, clock)
    app = make_app(src)
    async with app.run_test(size=(60, 20)) as pilot:
        await feed(app, clock, 5)
        await pilot.pause()
        for c in app.query(GpuCard):
            assert c.region.right <= 60
            assert "util" in card_text(c)
        await pilot.press("c")
        assert app.query_one(GpuPanel).compact and app.query_one(GpuLines).display


async def test_hung_nvml_call_keeps_the_ui_answering_and_says_so() -> None:
    """A hung NVML call: the screen says so, and a key is handled while the call is still hung.
    Waits for events (a 30 s guard each), never on how fast a busy box is."""
    release = threading.Event()
    entered = threading.Event()
    hang = {"on": False}

    def util() -> object:
        if hang["on"]:
            entered.set()
            release.wait(120)
        return SimpleNamespace(gpu=50, memory=10)

    async def until(pilot, cond) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            await pilot.pause(0.05)

    src = NvmlSource(FakeNvml([FakeGpu(overrides={"utilization": util})]))
    app = VtopApp(Config(interval=0.25, history=60), gpu_source=src, autopoll=True, hang_after_s=0.6, hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.feed.gpu_loop is not None and app.feed.gpu_loop.polls >= 1)
        loop = app.feed.gpu_loop
        hang["on"] = True
        await until(pilot, entered.is_set)
        await until(pilot, lambda: app.gpu_hung)  # the watchdog noticed at a tick
        before = app.query_one(GpuPanel).compact  # chosen from the room: either way
        await pilot.press("c")  # a key is handled while NVML is stuck:
        assert app.query_one(GpuPanel).compact is not before
        assert loop.in_flight_since is not None and not release.is_set()  # ...the call had not returned
        assert "NVML not answering" in app.gpu_status_text()
        assert app.query_one("GpuPanel").has_class("-stale")
        hang["on"] = False
        release.set()
        await until(pilot, lambda: not app.gpu_hung and not app.query_one("GpuPanel").has_class("-stale"))
        assert "NVML not answering" not in app.gpu_status_text()


async def test_lost_gpu_is_shown_and_the_other_goes_on(clock: FakeClock) -> None:
    a, b = FakeGpu(), FakeGpu()
    src = NvmlSource(FakeNvml([a, b], clock=clock.monotonic), clock=clock)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(app, clock, 3)
        b.lost = True
        await feed(app, clock, 3)
        await pilot.pause()
        c0, c1 = app.query(GpuCard)
        assert c1.has_class("-lost") and "LOST" in (c1.border_title or "")
        assert "GPU is lost" in card_text(c1)
        assert "util" in card_text(c0) and "LOST" not in card_text(c0)
        assert "1 LOST" in app.gpu_status_text()
        # the lost GPU's chart has a gap (blank cells) where it was lost, not zeros
        vals = app.gpu_history.tracks[1].series["util"].values()
        assert vals[-3:] == [None, None, None] and all(v is not None for v in vals[:3])


async def test_no_gpu_says_so_and_keeps_running() -> None:
    src = NvmlSource(FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)))
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.poll_gpu_once()
        await pilot.pause()
        msg = str(app.query_one("#gpu-message").render())
        assert "GPU: none" in msg and "libnvidia-ml.so.1 not found" in msg
        assert not list(app.query(GpuCard))
        await pilot.press("c")  # still alive and answering
        assert app.is_running


async def test_no_gpu_flag() -> None:
    app = VtopApp(Config(no_gpu=True), autopoll=False, hostname="t")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "--no-gpu" in str(app.query_one("#gpu-message").render())
        assert app.gpu_status_text() == "GPU: off"


async def test_real_h200_recording_replays_into_the_panel() -> None:
    polls = polls_from_sampler(FIXTURES / "nvml" / "h200-vllm-0.26.0-startup-load-runaway.jsonl")
    app = make_app(ReplayGpuSource(polls[:400]))
    async with app.run_test(size=(120, 30)) as pilot:
        for _ in range(400):
            await app.poll_gpu_once()
        await pilot.pause()
        (card,) = app.query(GpuCard)
        t = card_text(card)
        last = polls[399].gpus[0]
        assert f"{last.util_gpu:3.0f}%" in t
        assert "/140 GiB" in t and "700" in t
        assert card.border_title == "GPU 0 · H200"


def test_runs_strip_is_what_textual_would_make_of_the_runs() -> None:
    """The hand-padded strip of a row equals Textual's own crop_extend of the same
    segments, cell for cell and style for style: short rows, exact, too long
    (cut inside a run), wide characters, empty runs, runs of equal style merged."""
    import random

    from rich.segment import Segment
    from rich.style import Style
    from textual.strip import Strip

    from vtop.ui.widgets.gpu_panel import runs_strip

    base = Style(color="white", bgcolor="black")
    styles = {"": base, "hot": base + Style(color="red", bold=True), "dim": base + Style(dim=True)}

    def style_of(key: str, b: Style) -> Style:
        return styles[key]

    rng = random.Random(7)
    pieces = ["", " ", "util ", " 99%", "▁▂▃█", "GPU 0 H200", "模型", "é", "x" * 30]
    for _ in range(400):
        runs = [(rng.choice(pieces), rng.choice(list(styles))) for _ in range(rng.randint(0, 8))]
        width = rng.randint(1, 120)
        got = runs_strip(runs, width, base, style_of)
        want = Strip([Segment(t, styles[k]) for t, k in runs if t]).crop_extend(0, width, base)
        assert got.cell_length == width
        assert list(Segment.simplify(got)) == list(Segment.simplify(want)), (runs, width)


async def test_content_width_is_textuals_content_region_width(clock: FakeClock) -> None:
    """The rows are drawn at ``content_width()`` (the layout's size less padding and
    border) instead of asking ``content_region`` each row: both must agree, for the
    line widget, for bordered and padded cards, and after a resize."""
    from vtop.ui.widgets.server_panel import ServerCard

    src, _ = fake_gpus(2, clock)
    app = make_app(src)
    async with app.run_test(size=(150, 40)) as pilot:
        await feed(app, clock, 5)
        app.monitor.add_server("http://x:1", from_cli=True)
        app.paint()
        card = app.cards["http://x:1"]
        assert isinstance(card, ServerCard)
        await pilot.pause()
        for size in ((150, 40), (80, 24), (200, 60), (61, 20)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            widgets = [*app.query(GpuCard), app.query_one(GpuLines), card]
            shown = [w for w in widgets if w.display and w.region.width]
            assert shown, size
            for w in shown:
                assert w.content_width() == w.content_region.width, (size, w)
            assert any(w.styles.gutter.width for w in shown)  # a bordered card was among them


async def test_current_theme_follows_theme_changes(clock: FakeClock) -> None:
    """``current_theme`` is kept between calls; a new theme name, or a theme registered
    again under the current name, is seen at once (Textual's own answer compared)."""
    from textual.app import App
    from textual.theme import Theme

    src, _ = fake_gpus(1, clock)
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        first = app.current_theme
        assert app.current_theme is first is App.current_theme.fget(app)  # type: ignore[attr-defined]
        app.theme = "nord"
        await pilot.pause()
        assert app.current_theme.name == "nord" == App.current_theme.fget(app).name  # type: ignore[attr-defined]
        app.register_theme(Theme(name="nord", primary="#ff0000", dark=False))
        assert app.current_theme.primary == "#ff0000"
        assert app.ansi_theme is app.ansi_theme_light  # the new theme is a light one
        app.unregister_theme("nord")
        assert app.current_theme.name != "nord"


async def test_each_poll_reaches_the_screen(clock: FakeClock) -> None:
    """New readings repaint the GPU lines (only the rows that changed are refreshed)."""
    src, _ = fake_gpus(8, clock)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(app, clock, 5)
        await pilot.pause()
        lines = app.query_one(GpuLines)
        shown = []
        for _ in range(5):
            await feed(app, clock, 1)
            await pilot.pause()
            shown.append("\n".join(s.text for s in app.screen._compositor.render_strips()[:12]))
        assert len(set(shown)) == 5  # each poll's readings reached the screen
        assert lines.line_of(0)[:40] in shown[-1]


def test_gpu_process_names_are_looked_up_when_the_pids_change_or_every_4_s(clock: FakeClock) -> None:
    """A lookup reads /proc for every GPU process: not every second for the same PIDs.
    (GPUs that say they are real: simulated ones' made-up pids are never looked up.)"""
    src, fake = fake_gpus(8, clock)
    fake.SIMULATED = False  # type: ignore[misc]
    app = make_app(src)
    looked: list[list[int]] = []
    names_of = app.feed.names
    real = names_of.names
    names_of.names = lambda pids: (looked.append(list(pids)), real(pids))[1]  # type: ignore[method-assign]
    shown = []
    for _ in range(9):  # 9 polls a second apart
        poll, names = app.feed.gpu_blocking()
        shown.append(names)
        clock.advance(1.0)
    assert looked == [list(range(4000, 4008))] * 3  # at 0, 4 and 8 s
    assert all(set(n) == set(range(4000, 4008)) for n in shown)  # every poll has the names
    t = clock.monotonic()
    names_of.names_for((1, 2), t)
    names_of.names_for((2, 1), t + 1)
    names_of.names_for((1, 3), t + 1.5)  # a process came and went: looked up at once
    assert looked[3:] == [[1, 2], [1, 3]]


async def test_power_row_is_power_against_the_limit_on_a_fixed_scale(clock: FakeClock) -> None:
    """Power as a row of the card: its value is the share of the enforced limit (350 of 700 W: 50 %),
    its sparkline drawn on 0-100 %, beside util and SM activity; the fault corner says ECC and remaps."""
    gpus = [FakeGpu(overrides={"power": 350_000, "utilization": SimpleNamespace(gpu=100, memory=10),
                               "ecc_uncorrected": 2, "remapped_rows": (0, 1, 1, 0)})]
    fake = FakeNvml(gpus, clock=clock.monotonic)
    app = make_app(NvmlSource(fake, clock=clock))
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(app, clock, 10)
        await pilot.pause()
        (card,) = list(app.query(GpuCard))
        rows = card_text(card).splitlines()
        labels = [r.split()[0] for r in rows]
        assert labels[:3] == ["util", "SM", "power"]
        power = rows[2]
        assert power.split()[1] == "50%" and "350 W/700" in power
        assert "▄" in power  # half the fixed scale, every cell the same
        assert "ECC unc 2 · remap 1 pending" in rows[4]
