"""SGLang's request log (``--log-requests``, issue 42) into the same request tracker, rules and faces as vLLM's.

The lines are SGLang 0.5.17's own: ``tests/fixtures/sglang/requests-0.5.17-handmade.log`` was written by the
wheel's ``RequestLogger`` (``srt/utils/request_logger.py``: ``log_received_request``, ``log_finished_request``,
``log_openai_received_request``, its ``_dataclass_to_string_truncated`` and ``log_utils.log_json``), run by
``tests/fixtures/sglang/make_requests_log.py`` on objects with ``io_struct.py``'s ``GenerateReqInput`` fields:
byte for byte what those format calls print, at made-up times, ids and prompts. The few lines built here by
hand follow the same calls (said where). No SGLang server has run beside vtop yet (no CPU build on this box).
Every prompt holds ``HUNTER2``: nothing vtop shows or writes may.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import pytest

from vtop.core.requests.log import RequestTracker, parse_request_line
from vtop.model.redact import redact_prompts

ROOT = Path(__file__).resolve().parents[2]
SGL = ROOT / "tests" / "fixtures" / "sglang"
LOG = SGL / "requests-0.5.17-handmade.log"
SECRETS = ("HUNTER2", "secret plans", "2, 4, 6, 8, 10", "The answer", "101, 102")


def lines() -> list[str]:
    return LOG.read_text().splitlines(keepends=True)


def line(prefix: str, rid: str) -> str:
    """The first line holding ``prefix`` whose (first) id begins with ``rid``."""
    return next(ln for ln in lines() if prefix in ln and f"'{rid}" in ln)


def fed(upto: int | None = None) -> RequestTracker:
    t = RequestTracker(year=2026, max_model_len=8192)
    for i, ln in enumerate(lines()[:upto]):
        t.feed(ln, 100.0 + i)
    return t


# --------------------------------------------------------------------------- the lines


def test_receive_reads_id_max_new_tokens_n_and_temperature_at_each_level() -> None:
    # level 2 (the default), a chat request without max_tokens: max_new_tokens None, the prompt as input_ids
    (a,) = parse_request_line(line("Receive: obj=", "9f1c0e5a"), year=2026)
    assert (a.kind, a.request_id, a.max_tokens, a.max_tokens_omitted, a.n, a.temperature) == (
        "received", "9f1c0e5a7b2d4c6e8f0a1b2c3d4e5f60", None, True, 1, 1.0)
    assert a.prompt_tokens == 8 and a.engine == "sglang"
    # level 2, max_tokens 64 and a text prompt (38 characters, a quote in it)
    (b,) = parse_request_line(line("Receive: obj=", "0a1b2c3d"), year=2026)
    assert (b.max_tokens, b.max_tokens_omitted, b.temperature, b.prompt_chars) == (64, False, 0.7, 38)
    # level 1: no inputs, the sampling parameters still there
    (c,) = parse_request_line(line("Receive: obj=", "c0ffee00"), year=2026)
    assert (c.max_tokens, c.max_tokens_omitted, c.prompt_chars) == (128, False, None)
    # level 0: no sampling parameters: the cap is not known, and not said to be missing
    (d,) = parse_request_line(line("Receive: obj=", "d00dd00d"), year=2026)
    assert (d.request_id, d.max_tokens, d.max_tokens_omitted, d.n) == ("d00dd00dd00dd00dd00dd00dd00dd00d", None,
                                                                        False, None)
    # level 2 with a prompt longer than 2048: cut to 'head' ... 'tail' by the logger; the fields after it read
    (e,) = parse_request_line(line("Receive: obj=", "eeee0000"), year=2026)
    assert (e.max_tokens, e.prompt_chars) == (32, None)
    # the stamp is the record's: [2026-12-05 04:00:01]
    assert a.log_t is not None and b.log_t is not None and b.log_t - a.log_t == 2.0


def test_finish_reads_the_reason_and_the_tokens_and_an_abort_ends_as_aborted() -> None:
    (f,) = parse_request_line(line("Finish: obj=", "0a1b2c3d"), year=2026)
    assert (f.kind, f.request_id, f.finish_reason, f.completion_tokens) == (
        "finished", "0a1b2c3d4e5f60718293a4b5c6d7e8f9", "length", 64)
    (g,) = parse_request_line(line("Finish: obj=", "d00dd00d"), year=2026)  # level 0's Finish
    assert (g.finish_reason, g.completion_tokens) == ("stop", 30)
    (h,) = parse_request_line(line("Finish: obj=", "a5a5a5a5"), year=2026)  # _handle_abort_req's out
    assert (h.kind, h.request_id) == ("aborted", "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5")
    (i,) = parse_request_line(line("Client disconnected", "d15c0d15"), year=2026)
    assert (i.kind, i.request_id) == ("aborted", "d15c0d15c0d15c0d15c0d15c0d15c0d1")
    # the scheduler's DEBUG line (scheduler.py abort_request: f"Abort running request. {req.rid=}") under its TP0
    (j,) = parse_request_line("[2026-12-05 04:10:00 TP0] Abort running request. req.rid='r1'", year=2026)
    assert (j.kind, j.request_id) == ("aborted", "r1")
    # "Abort request for rid=%s not found in rid_to_state" (_handle_abort_req) names no request being aborted
    assert parse_request_line("[2026-12-05 04:10:00] Abort request for rid=r1 not found in rid_to_state; "
                              "likely already finished/removed.", year=2026) == []


def test_the_json_format_reads_the_same() -> None:
    js = [ln for ln in lines() if '"event": "request.' in ln]
    (r,) = parse_request_line(js[0], year=2026)
    (f,) = parse_request_line(js[1], year=2026)
    assert (r.kind, r.request_id, r.max_tokens, r.max_tokens_omitted) == (
        "received", "11112222333344445555666677778888", None, True)
    assert (f.kind, f.finish_reason, f.completion_tokens) == ("finished", "stop", 12)


def test_the_tracker_keeps_what_is_open_and_ends_the_rest() -> None:
    t = fed()
    rows = t.inflight(200.0)
    # only the runaway is left: every other request ended (a finish, an abort, the n=2 request's two samples)
    assert [(r.request_id, r.max_tokens, r.no_client_max_tokens) for r in rows] == [
        ("7777777777777777777777777777777f", None, True)]
    # SGLang logs no line when a client goes away (create_abort_task): an open entry may have ended unseen
    assert rows[0].age_is_upper_bound and not t.finishes_logged and t.logging_seen
    done = {f.request_id: (f.reason, f.completion_tokens) for f in t.recent_finished()}
    assert done["0a1b2c3d4e5f60718293a4b5c6d7e8f9"] == ("length", 64)
    assert done["a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5"] == ("aborted", 1)
    assert done["d15c0d15c0d15c0d15c0d15c0d15c0d1"] == ("aborted", None)
    assert done["abcdabcdabcdabcdabcdabcdabcdabcd"] == ("stop", 20)  # the last of its 2 samples


def test_an_n2_request_ends_with_its_second_sample_not_its_prefill() -> None:
    ls = lines()
    at = next(i for i, ln in enumerate(ls) if "Receive: obj=" in ln and "abcdabcd" in ln)
    t = RequestTracker(year=2026)
    t.feed(ls[at], 1.0)
    assert [(r.request_id, r.n, r.max_tokens) for r in t.inflight(1.0)] == [("abcdabcdabcdabcdabcdabcdabcdabcd", 2, 48)]
    t.feed(ls[at + 1], 2.0)  # the prefill-only copy (0 tokens)
    t.feed(ls[at + 2], 3.0)  # sample 1 of 2
    assert [r.request_id for r in t.inflight(3.0)] == ["abcdabcdabcdabcdabcdabcdabcdabcd"]
    t.feed(ls[at + 3], 4.0)  # sample 2 of 2
    assert t.inflight(4.0) == [] and t.recent_finished()[0].duration_s == 3.0


def test_a_chat_request_without_max_tokens_is_flagged_whatever_max_model_len_is() -> None:
    ln = line("Receive: obj=", "7777777")
    for mml in (None, 8192):
        t = RequestTracker(year=2026, max_model_len=mml)
        t.feed(ln, 5.0)
        (r,) = t.inflight(6.0)
        assert r.no_client_max_tokens and r.max_tokens is None


def test_a_line_cut_in_the_prompt_gives_the_id_only() -> None:
    full = line("Receive: obj=", "eeee0000")
    cut = full[:600] + " …"  # vtop.sources.logtail's mark on a line it had to cut
    (e,) = parse_request_line(cut, year=2026)
    assert (e.request_id, e.max_tokens, e.max_tokens_omitted) == ("eeee0000eeee0000eeee0000eeee0000", None, False)


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize("n", range(len(LOG.read_text().splitlines())))
def test_redaction_leaves_no_prompt_and_every_field_vtop_reads(n: int) -> None:
    ln = lines()[n]
    red = redact_prompts(ln)
    assert not any(s in red for s in SECRETS), red
    assert red.endswith("\n")
    # a redacted line (what a recording keeps) reads the same but for the prompt's own size; every line but the
    # OpenAI request as sent (no id in it) says something of a request
    strip = [(e.kind, e.request_id, e.max_tokens, e.max_tokens_omitted, e.n, e.finish_reason, e.completion_tokens)
             for e in parse_request_line(ln, year=2026)]
    assert strip or "Receive OpenAI: " in ln
    assert strip == [(e.kind, e.request_id, e.max_tokens, e.max_tokens_omitted, e.n, e.finish_reason,
                      e.completion_tokens) for e in parse_request_line(red, year=2026)]


def test_redaction_says_what_it_took() -> None:
    red = redact_prompts(line("Finish: obj=", "9f1c0e5a"))
    assert "text=<redacted 38 chars>, input_ids=<redacted 8 ids>, " in red
    assert "out={'text': <redacted 12 chars>, 'output_ids': <redacted 3 ids>, 'meta_info': {'id': " in red
    assert "'max_new_tokens': None" in red and "'completion_tokens': 40" in red
    assert redact_prompts(line("Receive OpenAI", "")).rstrip("\n").endswith("Receive OpenAI: obj=<redacted 118 chars>")


@pytest.mark.parametrize("keep", [60, 200, 700, 1500, 2200])
def test_a_cut_line_loses_everything_after_the_cut_point(keep: int) -> None:
    full = line("Finish: obj=", "eeee0000").rstrip("\n")
    cut = full[:keep] + " …"
    red = redact_prompts(cut)
    assert "HUNTER2" not in red and red.endswith(" …") and "<redacted " in red


def test_logprobs_in_meta_info_are_blanked() -> None:
    """``return_logprob`` with ``return_text_in_logprobs`` (the chat path sets it): ``add_logprob_to_meta_info``
    puts ``(logprob, id, text)`` tuples of the prompt's and the answer's tokens in ``meta_info``, which no level
    leaves out; a hand-made line in the format of ``_dataclass_to_string_truncated`` (a dict's values by it,
    lists by ``str``)."""
    ln = ("[2026-12-05 04:20:00] Finish: obj=GenerateReqInput(rid='lp1', session_id=None, mm_hashes=None), "
          "out={'meta_info': {'id': 'lp1', 'finish_reason': {'type': 'stop', 'matched': 2}, "
          "'input_token_logprobs': [(None, 1, '<s>'), (-1.5, 345, 'HUNTER2')], "
          "'output_token_logprobs': [(-0.1, 9, 'secret plans')], 'completion_tokens': 1}, "
          "'prompt_token_ids': [2, 4, 6, 8, 10]}\n")
    red = redact_prompts(ln)
    assert not any(s in red for s in SECRETS) and "'completion_tokens': 1" in red
    (e,) = parse_request_line(red, year=2026)
    assert (e.request_id, e.finish_reason, e.completion_tokens) == ("lp1", "stop", 1)


def test_the_old_in_out_line_is_blanked_whole() -> None:
    """Before 0.4: ``logger.info(f"in={obj.text}, out={out}")`` (``TokenizerManager._wait_for_response``)."""
    red = redact_prompts("[2024-08-01 10:00:00] in=Tell me about HUNTER2, out={'text': 'x'}\n")
    assert red == "[2024-08-01 10:00:00] in=<redacted 40 chars>\n"


def test_the_snapshot_bundle_redacts_them_too() -> None:
    from vtop.actions.snapshot import LogRedactor

    r = LogRedactor((), redact_prompts=True)
    data = r.feed(LOG.read_bytes()) + r.finish()
    assert not any(s.encode() in data for s in SECRETS) and r.redacted >= 19
    assert b"'max_new_tokens': None" in data
    # an over-long SGLang request line is dropped from its marker on
    r2 = LogRedactor((), redact_prompts=True, max_line=512)
    data2 = r2.feed(line("Receive: obj=", "eeee0000").encode()[:3000]) + r2.finish()
    assert b"HUNTER2" not in data2 and b"[redacted: over-long request line]" in data2


# --------------------------------------------------------------------------- through the monitor


def _sgl_metrics(running: int, waiting: int, decode: float, done: int, e2e_sum: float) -> str:
    """The hand-made 0.5.17 payload (tests/fixtures/sglang/metrics-0.5.17-handmade.txt) at other values."""
    text = (SGL / "metrics-0.5.17-handmade.txt").read_text()
    subs = {
        r"(sglang:num_running_reqs\{[^}]*\}) \S+": rf"\g<1> {running}.0",
        r"(sglang:num_queue_reqs\{[^}]*\}) \S+": rf"\g<1> {waiting}.0",
        r'(sglang:realtime_tokens_total\{[^}]*mode="decode"[^}]*\}) \S+': rf"\g<1> {decode}",
        r'(sglang:num_requests_total\{[^}]*is_streaming="false"[^}]*\}) \S+': rf"\g<1> {done}.0",
        r'(sglang:e2e_request_latency_seconds_(?:count|bucket)\{[^}]*is_streaming="false"[^}]*\}) \S+':
            rf"\g<1> {done}.0",
        r'(sglang:e2e_request_latency_seconds_sum\{[^}]*is_streaming="false"[^}]*\}) \S+': rf"\g<1> {e2e_sum}",
    }
    for pat, rep in subs.items():
        text = re.sub(pat, rep, text)
    return text


def _trace(root: Path) -> Path:
    """An SGLang server replayed from a corpus-format trace (tests/corpus/FORMAT.md): the request log's lines
    one a second from mono 101 (their stamps one a second from 04:00:01), then the last request (a chat request
    without max_tokens) decoding alone at 50 tok/s with nothing finishing, to mono 220."""
    root.mkdir()
    url = "http://127.0.0.1:30000"
    log_lines = [ln.encode() for ln in lines()]
    start = 100.0
    (root / "truth.json").write_text(json.dumps({
        "name": root.name, "class": "runaway", "expect_rules": ["runaway"], "began": 1024.0, "should_alert_by": 1090.0,
        "ended": None, "expected_phase": None, "server": {"url": url, "sglang": "0.5.17"}}))
    (root / "events.jsonl").write_text(json.dumps({"t": 1000.0, "mono": start, "what": "launch"}) + "\n"
                                       + json.dumps({"t": 1120.0, "mono": start + 120, "what": "end"}) + "\n")
    metrics, index, size = [], [], 0
    done, decode, e2e = 10, 6400.0, 40.0
    for s in range(0, 121):
        if s < len(log_lines):
            size += len(log_lines[s])
        if 1 <= s <= 22 and s % 2 == 0:
            done += 1
            e2e += 1.0
        decode += 50.0 if s >= 24 else 20.0
        running = 1 if s >= 24 else 2
        metrics.append({"t": 1000.0 + s, "mono": start + s, "dt": 0.01, "status": 200, "error": None,
                        "text": _sgl_metrics(running, 0, decode, done, e2e)})
        index.append({"t": 1000.0 + s, "mono": start + s, "size": size})

    def gz(name: str, rows: list[dict[str, object]]) -> None:
        with gzip.open(root / name, "wt") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    gz("metrics.jsonl.gz", metrics)
    gz("health.jsonl.gz", [{"t": m["t"], "mono": m["mono"], "status": 200, "error": None} for m in metrics])
    gz("info.jsonl.gz", [{"t": 1000.5, "mono": start + 0.5, "version": "0.5.17",
                          "models": {"object": "list", "data": [{"id": "tiny", "max_model_len": 8192}]}}])
    gz("log-index.jsonl.gz", index)
    (root / "log.bin.gz").write_bytes(gzip.compress(b"".join(log_lines)))
    return root


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], str]:
    from vtop.config import Config
    from vtop.faces.headless import replay_doctor

    path = _trace(tmp_path_factory.mktemp("t") / "sglang-runaway")
    out = io.StringIO()
    replay_doctor(str(path), Config(), as_json=True, out=out)
    text_out = io.StringIO()
    replay_doctor(str(path), Config(), as_json=False, out=text_out)
    return json.loads(out.getvalue()), out.getvalue() + text_out.getvalue()


def test_the_monitor_names_the_sglang_request_sent_without_max_tokens(replayed: tuple[dict[str, object], str]) -> None:
    """``vtop replay --doctor --json`` (the ``--once --json`` report at the trace's end): the request log's
    open entry is in the requests answer, sent without max_tokens, and the runaway names it in SGLang's
    words."""
    doc, _ = replayed
    rep = doc["report"]
    assert isinstance(rep, dict)
    rows = rep["requests"]
    assert isinstance(rows, list)
    (row,) = [r for r in rows if r["id"] == "7777777777777777777777777777777f"]
    assert row["client_set_max_tokens"] is False and row["no_client_max_tokens"] is True and row["max_tokens"] is None
    assert "log" in row["evidence"]
    alerts = [a for c in doc["timeline"] for a in c["alerts"] if a["rule"] == "runaway"]  # type: ignore[index, union-attr]
    assert alerts, doc["timeline"]
    ev = json.dumps(rep.get("alerts"))
    assert ("request 7777777777777777777777777777777f: the client sent no max_tokens, SGLang lets it run to the "
            "context length (--context-length) less its prompt") in ev


def test_no_prompt_reaches_any_output(replayed: tuple[dict[str, object], str], tmp_path: Path) -> None:
    """What vtop writes or shows of these lines: the report (``--once --json``, the doctor's text, the alerts),
    a recording (``--record``), the log pane (its text is the bundle's screen.svg); the bundle's log copy is
    :func:`test_the_snapshot_bundle_redacts_them_too`'s."""
    from vtop.core.phases.types import LogLine
    from vtop.sources.recording.record import Recorder
    from vtop.ui.widgets.log_pane import fmt_line

    _, raw = replayed
    assert not any(s in raw for s in SECRETS)
    f = tmp_path / "r.jsonl"
    rec = Recorder(f)
    rec.log(1000.0, 100.0, [ln.rstrip("\n") for ln in lines()])
    rec.close()
    kept = f.read_text()
    assert "7777777777777777777777777777777f" in kept and not any(s in kept for s in SECRETS)
    shown = [fmt_line(LogLine(100.0, None, None, ln.rstrip("\n"), None)) for ln in lines()]
    assert not any(s in x for x in shown for s in SECRETS)


def test_every_cut_of_every_line_keeps_the_prompt_out_and_never_raises() -> None:
    """A line cut anywhere (vtop's line limit, a log read mid-write): nothing from the cut's field on is shown,
    and neither the parser nor the redaction raises."""
    for ln in lines():
        body = ln.rstrip("\n")
        for at in range(0, len(body), 37):
            cut = body[:at] + " …"
            red = redact_prompts(cut)
            assert "HUNT" not in red and "secret" not in red and "2, 4, 6" not in red, (at, red)
            parse_request_line(cut, year=2026)
            parse_request_line(red, year=2026)
