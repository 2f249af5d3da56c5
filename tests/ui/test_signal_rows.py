"""Issue #29's rows of a server card, from the real recording of a CPU server with n-gram speculative
decoding and prefix caching (tests/fixtures/cpu-incidents/spec-prefix-load.jsonl.gz, made by
tests/real/test_real_signals.py): folded to one line by default, a line per family after ``i``, cut to
the card at 80x24; a server that exports none of a family shows nothing of it."""

from __future__ import annotations

from pathlib import Path

from tests.unit import diag_fixtures as F
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
    from vtop.sources.prom import parse_vllm_metrics

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
    assert not any(t.startswith("ASLEEP") for t in folded + detail)  # awake
    # asleep, level 1, as vLLM's source writes it (the CPU build refuses sleep mode)
    asleep = _view_of(text.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0').replace(
        'sleep_state="weights_offloaded"} 0.0', 'sleep_state="weights_offloaded"} 1.0'))
    (first, *_) = signal_lines(asleep, 78, False)
    assert first[0][0].startswith("ASLEEP (level 1: weights offloaded to CPU)") and first[0][1] == "warn"
