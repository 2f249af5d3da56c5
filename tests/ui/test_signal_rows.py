"""Issue #29's rows of a server card, from the real recording of a CPU server with n-gram speculative
decoding and prefix caching (tests/fixtures/cpu-incidents/spec-prefix-load.jsonl.gz, made by
tests/real/test_real_signals.py): folded to one line by default, a line per family after ``i``, cut to
the card at 80x24; a server that exports none of a family shows nothing of it."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import diag_fixtures as F
from vtop.config import Config
from vtop.core.server import ServerTracker
from vtop.ui.replay import replay_app
from vtop.ui.widgets.server_panel import signal_lines

REC = Path(__file__).resolve().parents[1] / "fixtures" / "cpu-incidents" / "spec-prefix-load.jsonl.gz"


def text_of(card, width: int) -> list[str]:  # type: ignore[no-untyped-def]
    return ["".join(r[0] for r in row) for row in card.all_lines(width)]


async def test_spec_and_prefix_rows_fold_and_unfold_at_80x24() -> None:
    app = replay_app(str(REC), config=Config(), name="spec")
    async with app.run_test(size=(80, 24)) as pilot:
        d = app.replay
        assert d is not None
        d.paused = True
        await pilot.pause()
        d.seek(d.end - 3.0)
        await pilot.pause()
        (card,) = app.cards.values()
        v = card.view
        assert v is not None and v.spec is not None and v.spec.acceptance is not None
        width = card.content_width()
        folded = text_of(card, width)
        assert f"spec acc {100 * v.spec.acceptance:.0f}% len {v.spec.mean_len:.2f}" in folded[-1]
        assert "[i] detail" in folded[-1] and not any("spec:" in t for t in folded)
        await pilot.press("i")
        await pilot.pause(0.3)
        assert card.detail
        full = text_of(card, width)
        assert len(full) == len(folded) + 3  # spec, prefix cache, queue/flight/5xx, cache config for one line
        assert any(t.startswith("spec: accepted") and "per pos" in t for t in full)
        assert any(t.startswith("prefix cache: hit") for t in full)
        assert any(t.startswith("cache: block 128") for t in full)
        mine = full[len(folded) - 1:]  # the rows of signal_lines: cut to the card ("…"), never past it
        assert len(mine) == 4 and all(len(t) <= width for t in mine)
        # the card got its rows: its region holds every line
        assert card.region.height == len(full) + 2
        await pilot.press("i")
        await pilot.pause(0.3)
        assert text_of(card, width) == folded


def test_absent_families_show_nothing() -> None:
    """The H200 0.26 payload has no spec-decode or LoRA family: no spec or LoRA words on its card;
    a payload without any #29 family (V0-era, written) gives no signal row at all."""
    ses = F.Session(url="http://127.0.0.1:8000")
    m = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    for i in range(3):
        ses.metrics(F.grow(m, generation_tokens_total=m.generation_tokens_total + 100 * i), mono=F.R.BASE + i)
    v = ses.server_tracker.view()
    assert v.spec is None and m.lora_running is None
    folded = " ".join("".join(r[0] for r in row) for row in signal_lines(v, 118, False))
    detail = " ".join("".join(r[0] for r in row) for row in signal_lines(v, 118, True))
    assert "spec" not in folded and "LoRA" not in folded and "spec" not in detail and "LoRA" not in detail
    assert "cache: block 16" in detail
    v0 = F.fixture_metrics("h200-0.26.0-metrics-idle.txt")
    bare = ServerTracker("http://h:1", clock=ses.clock)
    stripped = F.grow(v0, spec_draft_tokens_total=None, http_requests_by_status={}, sleep_state={},
                      request_queue_time_seconds=None, cache_config=None)
    bare.feed(F.poll("http://h:1", stripped, mono=ses.clock.monotonic()))
    assert signal_lines(bare.view(), 118, False) == []


def _view_of(text: str):  # type: ignore[no-untyped-def]
    from vtop.clock import FakeClock
    from vtop.sources.metrics_text import parse_vllm_metrics

    clock = FakeClock()
    tr = ServerTracker("http://127.0.0.1:8000", clock=clock)
    for _ in range(2):
        tr.feed(F.poll(tr.url, parse_vllm_metrics(text), mono=clock.monotonic()))
        clock.advance(1.0)
    return tr.view()


def test_lora_and_sleep_rows_from_the_recorded_payloads() -> None:
    sig = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "signals"
    text = (sig / "lora" / "metrics-load.txt").read_text()
    v = _view_of(text)
    folded = ["".join(r[0] for r in row) for row in signal_lines(v, 78, False)]
    detail = ["".join(r[0] for r in row) for row in signal_lines(v, 78, True)]
    assert "LoRA tiny-lora (wait 1)" in folded[0]
    assert "LoRA: running tiny-lora · waiting tiny-lora · max 2" in detail
    assert not any(t.startswith("SLEEPING") for t in folded + detail)  # awake
    # asleep: the real vLLM 0.26.0 payloads after POST /sleep?level=1 and ?level=2 (H200, 2026-12-02)
    h200 = sig / "h200-0.26.0" / "sleep"
    for name, lvl, words in (("metrics-1-sleep1.txt", 1, "weights offloaded"),
                             ("metrics-3-sleep2.txt", 2, "all discarded")):
        asleep = _view_of((h200 / name).read_text())
        for detail_on in (False, True):
            (first, *_) = signal_lines(asleep, 78, detail_on)
            assert first[0][0].startswith(f"SLEEPING (level {lvl}: {words}; requests wait until /wake_up)")
            assert first[0][1] == "warn" and len(first[0][0]) <= 78
    awake = _view_of((h200 / "metrics-2-woke.txt").read_text())
    assert not any("SLEEPING" in r[0] for row in signal_lines(awake, 78, True) for r in row)


async def test_live_card_says_sleeping_from_the_recorded_h200_sleep() -> None:
    """The real app polling a local server that answers with the recorded vLLM 0.26.0 payload after
    POST /sleep?level=1 (a request running, as one held while asleep would be): the card's title and
    its one-line form say SLEEPING, its row says what that means, and no alert calls it stalled. Woken
    (the recorded payload after /wake_up), the card says UP again."""
    from tests.helpers.metrics_server import MetricsServer
    from vtop.ui.app import VtopApp

    h200 = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "signals" / "h200-0.26.0" / "sleep"
    running0 = 'vllm:num_requests_running{engine="0",model_name="/tmp/tiny"} 0.0'

    def held(name: str) -> str:
        body = (h200 / name).read_text()
        assert running0 in body
        return body.replace(running0, running0[:-3] + "1.0")

    with MetricsServer([held("metrics-1-sleep1.txt")]) as srv:
        app = VtopApp(Config(urls=(srv.url,), interval=0.25, history=30), hostname="testhost")
        async with app.run_test(size=(120, 40)) as pilot:
            card = app.cards[srv.url]
            for _ in range(100):
                await pilot.pause(0.1)
                if card.view is not None and card.view.sleep_level == 1:
                    break
            assert card.view is not None and card.view.sleep_level == 1 and card.view.state == "up"
            await pilot.pause(0.3)
            assert " · SLEEPING · " in str(card.border_title)
            lines = text_of(card, card.content_width())
            assert any(t.startswith("SLEEPING (level 1: weights offloaded; requests wait until /wake_up)")
                       for t in lines), lines
            assert "SLEEPING" in "".join(r[0] for r in card.summary_line())
            assert not any(a.rule == "engine_stall" or a.severity != "info" for a in app.alerts)
            assert app.server_status_text() == "vLLM: sleeping"
            srv.payloads[:] = [held("metrics-2-woke.txt")]
            srv.i = 0
            for _ in range(100):
                await pilot.pause(0.1)
                if card.view is not None and card.view.sleep_level == 0:
                    break
            await pilot.pause(0.3)
            assert card.view is not None and card.view.sleep_level == 0
            assert app.server_status_text() == "vLLM: up"
            assert " · UP · " in str(card.border_title) and "SLEEPING" not in " ".join(
                text_of(card, card.content_width()))
