"""Issue 42's proof from the real SGLang 0.5.17 on a lent H100 80GB (``tools/device/h200_sglang.sh``, written for
the H200; session 26): the five corpus traces scored, and vtop's own recording of the launch, the burst and the
runaway replayed.

The traces are ``tests/corpus/traces/h100-sglang-*`` (two runaways, the first with SGLang's cold start on the
machine and the second warm; two scheduler stalls; one normal load); vtop's own recording of the first
launch-burst-runaway (``h200-sglang-A.vtop/h200-sglang-launch-burst-runaway/rec.jsonl.gz``) is
``tests/fixtures/h100-sglang/rec.jsonl.gz``. A test skips, saying which file it waits for, if one is missing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.corpus.score import TRACES, score_trace
from vtop.config import Config

REC = FIXTURES / "h100-sglang" / "rec.jsonl.gz"
RUNAWAY, STALL, NORMAL = ("h100-sglang-launch-burst-runaway", "h100-sglang-scheduler-stall", "h100-sglang-normal-load")
ALL = [RUNAWAY, RUNAWAY + "-2", STALL, STALL + "-2", NORMAL]
URL = "http://127.0.0.1:30000"
ROOT = FIXTURES.parent.parent


def _trace(name: str) -> Path:
    p = TRACES / name
    if not (p / "truth.json").exists():
        pytest.skip(f"no trace yet at {p.relative_to(ROOT)} (recorded on the GPU machine by tools/device/h200_sglang.sh)")
    return p


def _rows(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(x) for x in f if x.strip()]


@pytest.mark.parametrize("name", ALL)
def test_each_trace_is_sglangs_own(name: str) -> None:
    """Recorded from SGLang with the flags the proof asks for: its metrics families, its scheduler process."""
    p = _trace(name)
    truth = json.loads((p / "truth.json").read_text())
    srv = truth["server"]
    assert srv["engine"] == "sglang" and srv["sglang"], srv
    flags = " ".join(srv["flags"])
    for f in ("--enable-metrics", "--log-requests --log-requests-level 1", "--max-running-requests 64",
              "--context-length 32768"):
        assert f in flags, (f, flags)
    bodies = [r["text"] for r in _rows(p / "metrics.jsonl.gz") if r.get("status") == 200 and r.get("text")]
    assert bodies and any("sglang:num_running_reqs" in b for b in bodies)
    titles = {str((pr.get("cmdline") or [""])[0]).split()[0] for r in _rows(p / "procs.jsonl.gz")
              for pr in r["procs"] if pr.get("cmdline")}
    assert any(t.startswith("sglang::scheduler") for t in titles), titles


@pytest.mark.parametrize("name", ALL)
def test_the_scoreboard_names_each_in_time_with_no_false_alarm(name: str) -> None:
    s = score_trace(_trace(name))
    assert not s.false_alarms, s.false_alarms
    assert s.in_time, (s.alert_after_s, s.budget_s, s.first_title)
    if s.expect:
        assert s.named and s.cleared is not False, s
    assert s.phase_ok is not False, (s.phase, "expected ready")


def test_the_runaway_is_the_chat_request_without_max_tokens_from_sglangs_request_log() -> None:
    """The request log (--log-requests-level 1) says the client set no max_tokens: the runaway names that
    request, and the burst's requests (max_tokens 256) are not it."""
    from vtop.monitor.player import open_recording

    p = _trace(RUNAWAY)
    truth = json.loads((p / "truth.json").read_text())
    player = open_recording(str(p), config=Config())
    m = player.monitor
    named: list[Any] = []
    while not player.ended:
        player.step()
        if any(a.rule == "runaway" for a in m.alerts) and not named:
            got = m.requests_of(URL)
            named = [r for r in (got.requests if got else ()) if r.no_client_max_tokens]
    assert named, "no request without max_tokens in the runaway's requests"
    assert all(r.max_tokens is None or r.max_tokens > 256 for r in named)
    assert truth["burst"]["waiting_max"] and truth["burst"]["waiting_max"] > 0, truth["burst"]


# --- vtop's own recording ------------------------------------------------------------------------------


def _need_rec() -> None:
    if not REC.exists():
        pytest.skip(f"no recording yet at {REC.relative_to(ROOT)} (vtop's own, made on the GPU machine by "
                    "tools/device/h200_sglang.sh: its h200-sglang-launch-burst-runaway rec.jsonl.gz)")


@pytest.fixture(scope="module")
def played() -> dict[str, Any]:
    """The whole recording played; what the startup panel, the server card and the alerts showed over it."""
    _need_rec()
    from vtop.core.phases.types import Phase
    from vtop.monitor.player import open_recording

    player = open_recording(str(REC), config=Config())
    m = player.monitor
    seen: dict[str, Any] = {"capture_current": False, "waiting_max": 0.0, "runaway": None, "engines": set(),
                            "phase_at_batches": set()}
    while not player.ended:
        player.step()
        lv = m.log_view
        if lv is not None and lv.snapshot.current is Phase.CUDA_GRAPHS:
            seen["capture_current"] = True
        cap = next((ph for ph in lv.snapshot.phases if ph.phase is Phase.CUDA_GRAPHS), None) if lv else None
        bs = cap.progress_for("batches") if cap is not None else None
        if lv is not None and bs is not None and bs.n < bs.total:  # the decode graphs being captured
            seen["phase_at_batches"].add(lv.snapshot.current)
        v = m.views().get(URL)
        if v is not None and v.total is not None and v.total.waiting:
            seen["waiting_max"] = max(seen["waiting_max"], v.total.waiting)
        seen["engines"] |= {sp.engine for sp in m.processes}
        if seen["runaway"] is None:
            seen["runaway"] = next((a for a in m.alerts if a.rule == "runaway" and a.target == URL), None)
    seen["snapshot"] = m.log_view.snapshot if m.log_view is not None else None
    return seen


def test_the_startup_panel_follows_sglangs_launch_through_cuda_graph_capture(played: dict[str, Any]) -> None:
    from vtop.core.phases.types import Phase

    snap = played["snapshot"]
    assert snap is not None, "vtop found no log behind the SGLang launcher"
    assert snap.facts.engine == "sglang", snap.facts
    cap = next((ph for ph in snap.phases if ph.phase is Phase.CUDA_GRAPHS), None)
    assert cap is not None and cap.start is not None and cap.end is not None, snap.phases
    assert snap.facts.kv_cache_tokens, snap.facts  # "KV Cache is allocated. ... #tokens: N"
    assert snap.ready_at is not None and snap.ready_at >= cap.end


def test_the_server_card_shows_the_bursts_queue_and_the_engine(played: dict[str, Any]) -> None:
    assert played["engines"] == {"sglang"}, played["engines"]
    assert played["waiting_max"] > 0, "no poll showed requests waiting during the burst of 600"


def test_the_runaway_is_named(played: dict[str, Any]) -> None:
    a = played["runaway"]
    assert a is not None, "no runaway alert on :30000"
    assert a.severity in ("warning", "critical"), a


def test_the_capture_phase_lasts_through_both_of_sglangs_captures(played: dict[str, Any]) -> None:
    """SGLang 0.5.17 captures its prefill graphs (tqdm "Capturing num tokens ... N/58", 72 s here) and then its
    decode graphs ("Capturing batches ... N/12"): both bars are the capture's progress, and the prefill graphs'
    end is not the phase's (it read as warmup while the decode graphs were captured)."""
    from vtop.core.phases.types import Phase

    cap = next(ph for ph in played["snapshot"].phases if ph.phase is Phase.CUDA_GRAPHS)
    got = {p.label: (p.n, p.total) for p in cap.progress}
    tot_tokens, tot_bs = _bar_totals()
    assert got.get("num tokens") == (tot_tokens, tot_tokens) and got.get("batches") == (tot_bs, tot_bs), got
    assert played["phase_at_batches"] and played["phase_at_batches"] <= {Phase.CUDA_GRAPHS}, played["phase_at_batches"]


def _bar_totals() -> tuple[int, int]:
    """The prefill and decode capture bars' totals, as the real log wrote them (the trace's own log)."""
    import re

    text = gzip.decompress((_trace(RUNAWAY) / "log.bin.gz").read_bytes()).decode("utf-8", "replace")
    tokens = re.search(r"Capturing num tokens \([^)]*\):\s+\d+%\|[^|]*\| \d+/(\d+)", text)
    batches = re.search(r"Capturing batches \([^)]*\):\s+\d+%\|[^|]*\| \d+/(\d+)", text)
    assert tokens and batches, "the trace's log has no capture bars"
    return int(tokens.group(1)), int(batches.group(1))


async def test_the_screen_says_sglang_and_its_own_words(tmp_path: Path) -> None:
    """The card, the header, the startup panel and the log pane's hint speak of SGLang: not "vLLM", not
    vLLM's ``max_model_len`` or its ``--disable-access-log-for-endpoints`` (SGLang has neither)."""
    _need_rec()
    from tests.helpers.screen_text import svg_lines
    from tools.make_screenshots import sglang_shot

    assert await sglang_shot("q.svg", (120, 40), "queue", out=tmp_path)
    text = "\n".join(svg_lines((tmp_path / "q.svg").read_text()))
    assert f"SGLang {URL} · UP" in text and "context_length 32,768" in text, text
    assert "SGLang: up" in text.splitlines()[0], text.splitlines()[0]
    assert "SGLang start" in text and "--uvicorn-access-log-exclude-prefixes" in text, text
    assert "vLLM" not in text and "max_model_len" not in text, [ln for ln in text.splitlines() if "vLLM" in ln]


def test_doctor_over_the_recording_says_sglang_in_text_and_json() -> None:
    """``vtop replay --doctor``: the server's line and the log's history in SGLang's name, ``engine`` in the JSON."""
    _need_rec()
    import subprocess
    import sys

    def doctor(*extra: str) -> str:
        p = subprocess.run([sys.executable, "-m", "vtop", "replay", "--doctor", *extra, str(REC)],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert p.stdout, p.stderr
        return p.stdout

    text = doctor()
    assert f"SGLang {URL}: UP" in text and "of the SGLang log's stats" in text, text
    assert "vLLM" not in text, [ln for ln in text.splitlines() if "vLLM" in ln]
    row = json.loads(doctor("--json"))["report"]["servers"][0]
    assert (row["engine"], row["version"], row["max_model_len"]) == ("sglang", "0.5.17", 32768), row
