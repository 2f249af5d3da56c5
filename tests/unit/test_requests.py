"""Request-log parsing and in-flight tracking (vtop.core.requests).

The logs in tests/fixtures/logs/requests/ were written from docs/vllm-reference.md §2.1/§8
(see the README there); the real recordings hold no request line, which is checked too.
"""

from __future__ import annotations

import ast
import calendar
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtop.core.phases import parse_line
from vtop.core.requests.log import (
    NEVER_ADDED,
    PY_STR_REPR,
    RUNNING_FELL_TO_ZERO,
    RequestTracker,
    endpoint_of,
    parse_request_line,
    redact_prompts,
)
from vtop.sources.logtail import LineSplitter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REQ = FIXTURES / "requests"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
YEAR = 2026


def lines_of(path: Path, *, raw: bool = True) -> list[str]:
    """The file's lines as written (ANSI codes kept), or as vtop's LineSplitter hands them on (codes removed)."""
    if raw:
        return path.read_text(encoding="utf-8").splitlines()
    sp = LineSplitter()
    return sp.feed(path.read_bytes()) + sp.flush()


def log_seconds(line: str) -> float | None:
    ev = parse_line(line)
    return float(calendar.timegm((YEAR, *ev.stamp, 0, 0, 0))) if ev.stamp else None


def replay(
    name: str, max_model_len: int | None, *, at_once: float | None = None, raw: bool = True
) -> tuple[RequestTracker, float]:
    """Feed a fixture; arrival = seconds since its first stamp (live), or one instant (a backlog)."""
    tr = RequestTracker(max_model_len=max_model_len, year=YEAR)
    t0: float | None = None
    arrival = 0.0
    for line in lines_of(REQ / name, raw=raw):
        t = log_seconds(line)
        if t is not None:
            t0 = t if t0 is None else t0
            arrival = t - t0
        tr.feed(line, arrival if at_once is None else at_once)
    return tr, arrival if at_once is None else at_once


# Per fixture: max_model_len, in flight at the end as (endpoint, age, upper bound, max_tokens, n,
# no_client_max_tokens), oldest first, and finished as (endpoint, reason, duration), newest first.
CASES: dict[str, dict[str, Any]] = {
    "vllm-0.8.5-v0.log": dict(
        mml=8192,
        finishes=True,
        inflight=[("chat", 35, False, 8131, 1, True), ("completion", 20, False, 256, 1, False)],
        finished=[
            ("completion", "finished", 2),
            ("completion", "finished", 2),
            ("completion", "aborted", 2),
            ("completion", "finished", 1),
        ],
    ),
    "vllm-0.11.0-v1.log": dict(
        mml=40960,
        finishes=False,
        inflight=[("chat", 30, True, 40930, 1, True), ("completion", 10, True, 16, 1, False)],
        finished=[("chat", "aborted", 4), ("chat", "aborted", 4), ("completion", "aborted", 4)],
    ),
    "vllm-0.26.0-v1.log": dict(
        mml=32768,
        finishes=False,
        inflight=[
            ("chat", 20, True, 32741, 1, True),
            ("completion", 18, True, 16, 1, False),
            ("completion", 17, True, 100, 2, False),
            ("embedding", 16, True, None, None, False),
        ],
        finished=[("chat", "aborted", 2)],
    ),
    "vllm-0.26.0-v1-log-outputs.log": dict(
        mml=32768,
        finishes=True,
        # the completion never gets a Generated response: "at most"; the streaming chat is exact
        inflight=[("completion", 70, True, 16, 1, False), ("chat", 10, False, 2048, 1, False)],
        finished=[("chat", "length", 71), ("chat", "streaming_complete", 1), ("chat", "stop", 1)],
    ),
    "vllm-0.33.0-v1-color.log": dict(
        mml=131072,
        finishes=False,
        inflight=[("chat", 20, True, 131000, 1, True), ("completion", 16, True, 200, 4, False)],
        finished=[("chat", "aborted", 3), ("chat", "aborted", 3)],
    ),
    "vllm-0.33.0-v1-log-outputs.log": dict(
        mml=131072,
        finishes=True,
        inflight=[("completion", 6, True, 500, 1, False), ("chat", 5, False, 300, 1, False)],
        finished=[("chat", "length", 2), ("chat", "streaming_complete", 3)],
    ),
}


def shape(tr: RequestTracker, now: float) -> list[tuple[Any, ...]]:
    return [
        (r.endpoint, round(r.age_s, 6), r.age_is_upper_bound, r.max_tokens, r.n, r.no_client_max_tokens)
        for r in tr.inflight(now)
    ]


@pytest.mark.parametrize("raw", [True, False], ids=["as-written", "via-logtail"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_replay(name: str, raw: bool) -> None:
    case = CASES[name]
    tr, end = replay(name, case["mml"], raw=raw)
    assert tr.logging_seen
    assert tr.finishes_logged is case["finishes"]
    assert shape(tr, end) == case["inflight"]
    fin = [(f.endpoint, f.reason, round(f.duration_s, 6)) for f in tr.recent_finished()]
    assert fin == case["finished"]
    assert all(not f.duration_is_upper_bound for f in tr.recent_finished())
    assert tr.dropped == 0


def test_every_fixture_is_described_in_the_readme() -> None:
    readme = (REQ / "README.md").read_text()
    names = sorted(p.name for p in REQ.glob("*.log"))
    assert names == sorted(CASES)
    assert all(f"`{n}`" in readme for n in names) and "written" in readme.lower()


@pytest.mark.parametrize("name", sorted(CASES))
def test_backlog_replay_gives_the_log_clock_ages(name: str) -> None:
    """vtop attaching to a running server reads the log since its start in one go."""
    case = CASES[name]
    tr, _ = replay(name, case["mml"], at_once=5000.0)
    assert shape(tr, 5000.0) == case["inflight"]
    durations = [round(f.duration_s, 6) for f in tr.recent_finished()]
    assert durations == [d for _, _, d in case["finished"]]


def test_live_ages_follow_the_arrival_clock_not_the_one_second_stamps() -> None:
    tr = RequestTracker(year=YEAR)
    tr.feed("INFO 04-10 10:00:00 [logger.py:39] Received request cmpl-a-0: prompt: 'x', params: "
            "SamplingParams(n=1, max_tokens=5), prompt_token_ids: [1], lora_request: None.", 100.4)
    tr.feed("INFO 04-10 10:00:01 [metrics.py:486] Avg prompt throughput: 0.0 tokens/s", 100.6)
    [row] = tr.inflight(103.0)
    assert row.since == 100.4 and row.age_s == pytest.approx(2.6)
    assert row.added is False  # no Added line yet


# --------------------------------------------------------------------------- parsing


def received_events(name: str) -> list[Any]:
    return [e for line in lines_of(REQ / name) for e in parse_request_line(line, year=YEAR) if e.kind == "received"]


def test_v0_received_fields_and_tricky_prompt() -> None:
    recs = received_events("vllm-0.8.5-v0.log")
    assert len(recs) == 6
    chat = next(e for e in recs if e.endpoint == "chat")
    # the prompt text itself holds "params: SamplingParams(n=9, max_tokens=1)"
    assert (chat.max_tokens, chat.n, chat.temperature, chat.prompt_tokens) == (8131, 1, 0.7, 61)
    raw = next(ln for ln in lines_of(REQ / "vllm-0.8.5-v0.log") if chat.request_id + ": prompt: " in ln)
    literal = raw.split(": prompt: ", 1)[1].split(", params: SamplingParams(n=1", 1)[0]
    assert chat.prompt_chars == len(ast.literal_eval(literal)) == 340
    assert chat.log_t == calendar.timegm((YEAR, 4, 10, 10, 1, 5, 0, 0, 0))
    n2 = next(e for e in recs if e.n == 2)
    assert (n2.max_tokens, n2.temperature, n2.prompt_chars) == (64, 0.8, len("def fib(n):"))
    none_prompt = next(e for e in recs if e.max_tokens == 32)
    assert none_prompt.prompt_chars is None and none_prompt.prompt_tokens == 3


def test_011_prompt_with_both_quotes_and_fake_params() -> None:
    recs = received_events("vllm-0.11.0-v1.log")
    tricky = next(e for e in recs if e.max_tokens == 16)
    assert tricky.n == 1 and tricky.temperature == 0.0 and tricky.prompt_tokens == 27
    text = "It's \"quoted\", params: SamplingParams(n=9, max_tokens=1), prompt_token_ids: [9]\nAdded request cmpl-x."
    assert tricky.prompt_chars == len(text)
    # the "Added request cmpl-x." inside that prompt is not an Added event
    added = [e.request_id for ln in lines_of(REQ / "vllm-0.11.0-v1.log") for e in parse_request_line(ln)
             if e.kind == "added"]
    assert "cmpl-x" not in added and len(added) == 7


def test_stop_strings_that_look_like_params_are_ignored() -> None:
    recs = received_events("vllm-0.33.0-v1-color.log")
    w = next(e for e in recs if e.n == 4)
    assert (w.max_tokens, w.temperature, w.prompt_chars, w.endpoint) == (200, 1.0, None, "completion")


def test_ansi_colours_everywhere_are_stripped() -> None:
    line = next(ln for ln in lines_of(REQ / "vllm-0.33.0-v1-color.log") if "Aborted request(s)" in ln)
    assert "\x1b[" in line
    evs = parse_request_line(line, year=YEAR)
    assert [e.kind for e in evs] == ["aborted", "aborted"]
    assert evs[0].log_t == calendar.timegm((YEAR, 4, 18, 20, 30, 9, 0, 0, 0))
    caret = "^[[1;36m(APIServer pid=31)^[[0;0m INFO 10-21 09:12:20 [async_llm.py:323] Added request cmpl-q-0."
    assert [(e.kind, e.request_id) for e in parse_request_line(caret)] == [("added", "cmpl-q-0")]


@pytest.mark.parametrize(
    ("msg", "ids"),
    [
        ("Aborted request(s) chatcmpl-a,chatcmpl-b.", ["chatcmpl-a", "chatcmpl-b"]),
        ("Aborted request(s) chatcmpl-a, cmpl-b-0.", ["chatcmpl-a", "cmpl-b-0"]),
        ("Aborted request(s) x.y.", ["x.y"]),
        ("Aborted request cmpl-c-0.", ["cmpl-c-0"]),
    ],
)
def test_aborted_lists(msg: str, ids: list[str]) -> None:
    evs = parse_request_line(f"(APIServer pid=7) INFO 11-30 10:00:00 [async_llm.py:612] {msg}")
    assert [e.request_id for e in evs] == ids and {e.kind for e in evs} == {"aborted"}


def test_generated_response_variants() -> None:
    head = "(APIServer pid=7) INFO 11-30 10:00:00 [request_logger.py:126] "
    [d] = parse_request_line(head + "Generated response chatcmpl-r (streaming delta): output: 'lo', "
                             "finish_reason: stop")
    assert d.kind == "delta" and d.finish_reason == "stop"
    [c] = parse_request_line(head + "Generated response chatcmpl-r (streaming complete): output: 'x', "
                             "finish_reason: streaming_complete")
    assert c.kind == "finished" and c.finish_reason == "streaming_complete" and c.output_logged
    # 0.11 also logs output_token_ids; the output may quote a finish reason itself
    [o] = parse_request_line(head + "Generated response chatcmpl-s: output: 'finish_reason: stop', "
                             "output_token_ids: [1, 2], finish_reason: length")
    assert o.kind == "finished" and o.finish_reason == "length"
    [n] = parse_request_line(head + "Generated response chatcmpl-s: output: '', finish_reason: None")
    assert n.kind == "finished" and n.finish_reason is None
    # the DEBUG twin is no event
    assert parse_request_line(head.replace("INFO", "DEBUG") + "Generated response chatcmpl-s details: "
                              "output_token_ids: [1, 2]") == []


@pytest.mark.parametrize(
    ("rid", "params", "endpoint"),
    [
        ("chatcmpl-abc", None, "chat"),
        ("cmpl-abc-0", None, "completion"),
        ("0_cmpl-abc-0-1a2b3c4d", None, "completion"),
        ("embd-abc-0", None, "embedding"),
        ("resp_abc", None, "responses"),
        ("my-own-id", "PoolingParams", "embedding"),
        ("my-own-id", "SamplingParams", None),
    ],
)
def test_endpoint_of(rid: str, params: str | None, endpoint: str | None) -> None:
    assert endpoint_of(rid, params) == endpoint


GARBAGE = [
    "",
    "\r\n",
    "Received request",
    "Received request x",
    "INFO 04-10 10:00:00 [logger.py:39] Received request",
    "INFO 04-10 10:00:00 [logger.py:39] Received request x: nothing",
    "INFO 04-10 10:00:00 [logger.py:39] Added request",
    "INFO 04-10 10:00:00 [logger.py:39] Added request a b c",
    "INFO 04-10 10:00:00 [logger.py:39] Aborted request(s) .",
    "INFO 04-10 10:00:00 [logger.py:39] Generated response x: no output",
    "Received request cmpl-1-0: params: SamplingParams(n=1, max_tokens=5)",  # no log header: a quote, not a record
    'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK',
    "Traceback (most recent call last):",
    "INFO 13-45 99:99:99 [x.py:1] Added request cmpl-z-0.",  # impossible stamp: an event without a time
    "\x00\x1b[31m\xff" * 10,
]


def test_garbage_lines() -> None:
    tr = RequestTracker(year=YEAR)
    out = []
    for i, line in enumerate(GARBAGE):
        out.extend(parse_request_line(line))
        tr.feed(line, float(i))
        assert redact_prompts(line) == line
    assert [(e.kind, e.request_id, e.log_t) for e in out] == [("added", "cmpl-z-0", None)]
    assert [r.request_id for r in tr.inflight(100.0)] == ["cmpl-z-0"]


def test_huge_numbers_do_not_raise() -> None:
    line = ("INFO 04-10 10:00:00 [logger.py:39] Received request cmpl-1-0: params: SamplingParams(n=" + "9" * 5000
            + ", temperature=1e99999, max_tokens=" + "9" * 5000 + "), lora_request: None.")
    [e] = parse_request_line(line)
    assert e.max_tokens is None and e.n is None and e.temperature is not None


def test_cut_received_line() -> None:
    """vtop.sources.logtail cuts lines over 64 KiB and appends " …": the prompt never ends."""
    head = "INFO 10-21 09:12:00 [logger.py:49] Received request chatcmpl-big: prompt: '"
    line = head + "secret " * 100 + " …"
    [e] = parse_request_line(line)
    assert (e.kind, e.request_id, e.max_tokens, e.prompt_chars) == ("received", "chatcmpl-big", None, None)
    red = redact_prompts(line)
    assert "secret" not in red and red == head[:-1] + f"<redacted {len(line) - len(head) + 1 - 2} chars> …"


# --------------------------------------------------------------------------- tracker


def test_note_running_zero_clears_v1_requests() -> None:
    tr, end = replay("vllm-0.26.0-v1.log", 32768)
    assert len(tr.inflight(end)) == 4
    tr.note_running(2, end + 1)
    tr.note_running(0, end + 1, waiting=3)  # queued requests are still in flight
    assert len(tr.inflight(end + 1)) == 4
    assert tr.possibly_finished == 2  # 5 engine requests (one has n=2), 3 of them busy
    tr.note_running(0, end + 5)
    assert tr.inflight(end + 5) == []
    done = tr.recent_finished()[:4]
    assert {f.reason for f in done} == {RUNNING_FELL_TO_ZERO}
    assert all(f.duration_is_upper_bound and f.ended == end + 5 for f in done)
    assert sorted(round(f.duration_s) for f in done) == [21, 22, 23, 25]
    assert tr.recent_finished()[4].reason == "aborted"


def test_a_stats_line_with_nothing_in_flight_clears_the_backlog() -> None:
    """vLLM's stats line (the recorded 0.26 log's words) that says ``Running: 0 reqs, Waiting: 0 reqs`` ends
    the requests the log still has open, as the gauge does; a queue, or another data-parallel engine still
    busy, keeps them. (SGLang's batch lines never say 0: test_sglang.py.)"""
    tr, end = replay("vllm-0.26.0-v1.log", 32768)
    assert len(tr.inflight(end)) == 4

    def stats(engine: str, running: int, waiting: int) -> str:
        return (f"(APIServer pid=982) INFO 11-30 09:56:30 [loggers.py:335] Engine {engine}: Avg prompt throughput: "
                f"0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: {running} reqs, Waiting: "
                f"{waiting} reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")

    tr.feed(stats("000", 0, 2), end + 5)
    tr.feed(stats("001", 1, 0), end + 5)
    tr.feed(stats("000", 0, 0), end + 5)
    assert len(tr.inflight(end + 5)) == 4  # engine 001 still runs one
    tr.feed(stats("001", 0, 0), end + 6)
    assert tr.inflight(end + 6) == []
    done = tr.recent_finished()[:4]
    assert {f.reason for f in done} == {RUNNING_FELL_TO_ZERO} and all(f.ended == end + 6 for f in done)


def test_note_running_zero_spares_requests_younger_than_the_gauge() -> None:
    tr = RequestTracker(year=YEAR, running_zero_grace_s=2.0)
    tr.feed("(APIServer pid=1) INFO 11-30 10:00:00 [async_llm.py:418] Added request chatcmpl-old-1a2b3c4d.", 10.0)
    tr.feed("(APIServer pid=1) INFO 11-30 10:00:05 [async_llm.py:418] Added request chatcmpl-new-5e6f7a8b.", 15.0)
    tr.note_running(0, 16.0)
    assert [r.request_id for r in tr.inflight(16.0)] == ["chatcmpl-new"]
    tr.note_running(None, 30.0)
    tr.note_running(float("nan"), 30.0)
    assert len(tr.inflight(30.0)) == 1


def test_possibly_finished_counts_children() -> None:
    tr, end = replay("vllm-0.26.0-v1.log", 32768)
    tr.note_running(2, end, waiting=0)
    # 4 requests in flight, one with n=2: 5 engine requests against 2 running
    assert tr.possibly_finished == 3


def test_child_ids_make_one_request() -> None:
    tr = RequestTracker(year=YEAR)
    lines = [ln for ln in lines_of(REQ / "vllm-0.11.0-v1.log") if "09:12:05" in ln]
    assert len(lines) == 4
    for ln in lines:
        tr.feed(ln, 1.0)
    [row] = tr.inflight(2.0)
    assert row.request_id.startswith("cmpl-") and row.n == 3 and row.added
    # children without a Received line (logging began mid-stream) still make one request
    tr2 = RequestTracker()
    for k in range(3):
        tr2.feed(f"(APIServer pid=1) INFO 11-30 10:00:00 [async_llm.py:418] Added request {k}_cmpl-p-0-0badcafe.", 1.0)
    [row2] = tr2.inflight(2.0)
    assert row2.request_id == "cmpl-p-0" and row2.endpoint == "completion"
    tr2.feed("(APIServer pid=1) INFO 11-30 10:00:01 [async_llm.py:612] Aborted request(s) cmpl-p-0.", 3.0)
    assert tr2.inflight(3.0) == [] and tr2.recent_finished()[0].reason == "aborted"


def test_internal_ids_resolve_to_the_api_id() -> None:
    h = "(APIServer pid=1) INFO 11-30 10:00:00 "
    tr = RequestTracker(year=YEAR)
    tr.feed(h + "[request_logger.py:69] Received request chatcmpl-q: params: SamplingParams(n=1, max_tokens=9), "
            "lora_request: None.", 1.0)
    tr.feed(h + "[async_llm.py:418] Added request chatcmpl-q-deadbeef.", 1.0)
    assert [(r.request_id, r.added) for r in tr.inflight(2.0)] == [("chatcmpl-q", True)]
    tr.feed(h + "[request_logger.py:126] Generated response chatcmpl-q: output: 'x', finish_reason: stop", 4.0)
    assert tr.inflight(4.0) == [] and tr.recent_finished()[0].duration_s == 3.0
    # a finish naming the internal id works too
    tr.feed(h + "[async_llm.py:418] Added request chatcmpl-r-00c0ffee.", 5.0)
    tr.feed(h + "[async_llm.py:612] Aborted request(s) chatcmpl-r-00c0ffee.", 6.0)
    assert tr.inflight(6.0) == [] and tr.recent_finished()[0].request_id == "chatcmpl-r"


def test_delta_lines_do_not_finish_and_repeat_finishes_are_ignored() -> None:
    tr, end = replay("vllm-0.33.0-v1-log-outputs.log", 131072)
    n2 = [f for f in tr.recent_finished() if f.n == 2]
    assert len(n2) == 1  # the second Generated response of the n=2 request is not a second request
    # before its complete line, the streaming chat with deltas was in flight
    tr2 = RequestTracker(year=YEAR)
    for ln in lines_of(REQ / "vllm-0.33.0-v1-log-outputs.log"):
        if "21:00:08" in ln:
            break
        tr2.feed(ln, 7.0)
    assert [r.max_tokens for r in tr2.inflight(8.0)] == [131048]


def test_no_client_max_tokens_flag() -> None:
    h = "INFO 04-10 10:00:00 [logger.py:39] Received request chatcmpl-{i}: prompt: None, params: "
    tr = RequestTracker(year=YEAR, max_model_len=None)
    tr.feed(h.format(i=1) + "SamplingParams(n=1, max_tokens=8000), prompt_token_ids: [1, 2], lora_request: None.", 0.0)
    # prompt + max_tokens reach max_model_len: filled in by the server even though 5000 < 95 %
    tr.feed(h.format(i=2) + "SamplingParams(n=1, max_tokens=5000), prompt_token_ids: [" + ", ".join(["7"] * 3192)
            + "], lora_request: None.", 0.0)
    tr.feed(h.format(i=3) + "SamplingParams(n=1, max_tokens=512), prompt_token_ids: [1], lora_request: None.", 0.0)
    assert [r.no_client_max_tokens for r in tr.inflight(1.0)] == [False, False, False]  # unknown max_model_len
    tr.set_max_model_len(8192)
    assert [r.no_client_max_tokens for r in tr.inflight(1.0)] == [True, True, False]
    strict = RequestTracker(year=YEAR, max_model_len=8192, near_fraction=0.01)
    strict.feed(h.format(i=1) + "SamplingParams(n=1, max_tokens=8000), lora_request: None.", 0.0)
    assert [r.no_client_max_tokens for r in strict.inflight(1.0)] == [False]


def test_max_inflight_drops_the_oldest_and_keep_finished_bounds_history() -> None:
    tr = RequestTracker(max_inflight=3, keep_finished=2)
    for i in range(5):
        tr.feed(f"INFO 04-10 10:00:0{i} [async_llm.py:1] Added request cmpl-{i}-0.", float(i))
    assert [r.request_id for r in tr.inflight(10.0)] == ["cmpl-2-0", "cmpl-3-0", "cmpl-4-0"]
    assert tr.dropped == 2
    tr.feed("INFO 04-10 10:00:09 [async_llm.py:1] Aborted request(s) cmpl-2-0,cmpl-3-0,cmpl-4-0.", 9.0)
    assert [f.request_id for f in tr.recent_finished()] == ["cmpl-4-0", "cmpl-3-0"]


def test_received_without_added_is_retired_once_added_lines_are_known() -> None:
    rec = "INFO 04-10 10:00:00 [logger.py:39] Received request cmpl-{i}-0: params: SamplingParams(n=1, max_tokens=5)."
    quiet = RequestTracker(unadded_timeout_s=30.0)
    quiet.feed(rec.format(i=1), 0.0)
    assert len(quiet.inflight(100.0)) == 1  # no Added line ever: this server may not log them
    tr = RequestTracker(unadded_timeout_s=30.0)
    tr.feed(rec.format(i=1), 0.0)
    tr.feed(rec.format(i=2), 0.0)
    tr.feed("INFO 04-10 10:00:00 [async_llm.py:1] Added request cmpl-2-0.", 0.0)
    assert len(tr.inflight(20.0)) == 2
    assert [r.request_id for r in tr.inflight(31.0)] == ["cmpl-2-0"]
    assert tr.recent_finished()[0].reason == NEVER_ADDED and tr.recent_finished()[0].duration_is_upper_bound


def test_reset_forgets_inflight_only() -> None:
    tr, end = replay("vllm-0.11.0-v1.log", 40960)
    assert len(tr.inflight(end)) == 2
    tr.reset()
    assert tr.inflight(end) == [] and len(tr.recent_finished()) == 3 and tr.logging_seen


def test_year_rollover_in_the_tracker() -> None:
    tr = RequestTracker(year=2025)
    [a] = tr.feed("INFO 12-31 23:59:59 [async_llm.py:1] Added request cmpl-a-0.", 0.0)
    [b] = tr.feed("INFO 01-01 00:00:01 [async_llm.py:1] Added request cmpl-b-0.", 2.0)
    assert a.log_t is not None and b.log_t is not None and b.log_t - a.log_t == 2.0


def test_feed_accepts_a_parsed_event() -> None:
    line = "(APIServer pid=1) INFO 11-30 10:00:00 [async_llm.py:418] Added request chatcmpl-e-12345678."
    tr = RequestTracker(year=YEAR)
    [ev] = tr.feed(line, 1.0, event=parse_line(line))
    assert ev.kind == "added" and tr.inflight(1.0)[0].request_id == "chatcmpl-e"


# --------------------------------------------------------------------------- real logs


def real_logs() -> list[Path]:
    paths = sorted(FIXTURES.glob("vllm-*.log")) + sorted((FIXTURES / "written").glob("*.log"))
    if SHARED.is_dir():
        paths += sorted(SHARED.glob("vllm-*/*.log")) + sorted(SHARED.glob("vllm-*/*/*.log"))
    return paths


def test_real_and_startup_logs_hold_no_request_line() -> None:
    """No recording we have ran with request logging: nothing may be read as a request, nothing redacted."""
    paths = real_logs()
    assert any(p.name == "vllm-0.32.0-cpu-startup.log" for p in paths)
    n = 0
    for p in paths:
        tr = RequestTracker()
        for line in lines_of(p):
            n += 1
            assert parse_request_line(line) == [], (p.name, line[:200])
            assert redact_prompts(line) == line
            tr.feed(line, 0.0)
        assert not tr.logging_seen and tr.inflight(0.0) == []
    assert n > 500


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize("name", ["vllm-0.8.5-v0.log", "vllm-0.11.0-v1.log"])
def test_redaction_of_fixture_received_lines(name: str) -> None:
    lines = lines_of(REQ / name)
    received = [ln for ln in lines if "Received request" in ln]
    assert len(received) >= 5
    for ln in lines:
        red = redact_prompts(ln)
        if ln not in received:
            assert red == ln
            continue
        before = parse_request_line(ln, year=YEAR)[0]
        after = parse_request_line(red, year=YEAR)[0]
        lit = re.compile(PY_STR_REPR).match(ln, ln.index(": prompt: ") + len(": prompt: "))
        if lit:
            assert f"prompt: <redacted {before.prompt_chars} chars>, params: " in red
            assert lit.group() not in red and before.prompt_chars == len(ast.literal_eval(lit.group()))
        else:
            assert ": prompt: None, params: " in red
        assert "prompt_token_ids: <redacted " in red and " ids>" in red
        # the parameters survive: the redacted line still tells the tracker everything but the prompt
        assert (after.request_id, after.max_tokens, after.n, after.temperature) == (
            before.request_id, before.max_tokens, before.n, before.temperature
        )
        assert red.startswith(ln[: ln.index("Received")])  # ANSI prefix kept


def test_redaction_of_debug_lines() -> None:
    lines = lines_of(REQ / "vllm-0.33.0-v1-log-outputs.log")
    secret = [ln for ln in lines if "hunter2" in ln]
    assert len(secret) == 2
    for ln in secret:
        red = redact_prompts(ln)
        assert "hunter2" not in red and "<redacted " in red
    details = redact_prompts(next(ln for ln in secret if "details: prompt:" in ln))
    assert details.endswith("prompt_token_ids: <redacted 24 ids>, prompt_embeds shape: None.")
    # outputs are not prompts: a Generated response line is left alone
    gen = next(ln for ln in lines if "(streaming complete): output: " in ln)
    assert redact_prompts(gen) == gen


def test_redaction_keeps_line_endings_and_none_prompts() -> None:
    line = "INFO 04-10 10:00:00 [logger.py:39] Received request c: prompt: 'abc', params: SamplingParams(n=1).\r\n"
    assert redact_prompts(line).endswith("prompt: <redacted 3 chars>, params: SamplingParams(n=1).\r\n")
    none = "INFO 04-10 10:00:00 [logger.py:39] Received request c: prompt: None, params: SamplingParams(n=1)."
    assert redact_prompts(none) == none


def test_snapshot_uses_the_shared_pattern() -> None:
    from vtop.actions import snapshot

    assert PY_STR_REPR.encode() in snapshot._PYSTR
    line = "Received request x: prompt: 'It\\'s \"secret\"', params: SamplingParams(n=1)"
    assert "secret" not in snapshot.redact_request_line(line)


# --------------------------------------------------------------------------- properties

HEADS = st.sampled_from(
    [
        "",
        "INFO 04-10 10:00:00 [logger.py:39] ",
        "INFO 11-07 17:49:14 logger.py:39] ",
        "\x1b[1;36m(APIServer pid=31)\x1b[0;0m INFO 10-21 09:12:00 [logger.py:49] ",
        "(APIServer pid=6539) DEBUG 04-18 21:00:05 [request_logger.py:58] ",
        "2026-04-10T08:52:19.57Z stdout F INFO 04-10 10:00:00 [logger.py:39] ",
    ]
)
BODIES = st.sampled_from(
    [
        "Received request ",
        "Added request ",
        "Finished request ",
        "Aborted request(s) ",
        "Aborted request ",
        "Generated response ",
        "Request x details: prompt: ",
        "Received request cmpl-1-0: prompt: ",
        "Received request cmpl-1-0: params: SamplingParams(n=",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=HEADS, body=BODIES, tail=st.text(max_size=80), junk=st.text(max_size=40))
def test_parse_request_line_never_raises(head: str, body: str, tail: str, junk: str) -> None:
    for line in (head + body + tail, junk, head + junk + body + tail):
        evs = parse_request_line(line)
        assert isinstance(evs, list)
        assert all(e.kind in {"received", "added", "finished", "aborted", "delta"} and e.request_id for e in evs)
        redact_prompts(line)
        RequestTracker().feed(line, 0.0)


PROMPTS = st.text(min_size=1, max_size=60).filter(lambda p: p.strip())


@settings(max_examples=100, deadline=None)
@given(head=HEADS, prompt=PROMPTS, version=st.sampled_from(["0.8", "0.11", "debug"]))
def test_redact_prompts_never_leaves_the_prompt(head: str, prompt: str, version: str) -> None:
    params = "SamplingParams(n=1, temperature=0.7, max_tokens=16)"
    if version == "0.8":
        msg = f"Received request cmpl-1-0: prompt: {prompt!r}, params: {params}, prompt_token_ids: [1, 2, 3], " \
              "lora_request: None, prompt_adapter_request: None."
    elif version == "0.11":
        msg = f"Received request chatcmpl-1: prompt: {prompt!r}, params: {params}, prompt_token_ids: [1, 2, 3], " \
              "prompt_embeds shape: None, lora_request: None."
    else:
        msg = f"Request chatcmpl-1 details: prompt: {prompt!r}, prompt_token_ids: [1, 2, 3], prompt_embeds shape: None."
    line = head + msg
    red = redact_prompts(line)
    expected = line.replace(f"prompt: {prompt!r}", f"prompt: <redacted {len(prompt)} chars>", 1)
    expected = expected.replace("prompt_token_ids: [1, 2, 3]", "prompt_token_ids: <redacted 3 ids>")
    assert red == expected and f"prompt: {prompt!r}" not in red
    if version != "debug" and head:
        [ev] = parse_request_line(line)
        assert (ev.prompt_chars, ev.max_tokens, ev.temperature, ev.prompt_tokens) == (len(prompt), 16, 0.7, 3)


@settings(max_examples=100, deadline=None)
@given(prompt=PROMPTS, cut=st.integers(min_value=1, max_value=200))
def test_redaction_of_a_cut_line_drops_everything_after_prompt(prompt: str, cut: int) -> None:
    head = "INFO 10-21 09:12:00 [logger.py:49] Received request chatcmpl-1: prompt: "
    full = head + repr(prompt) + ", params: SamplingParams(n=1, max_tokens=5), prompt_token_ids: [1]."
    cut_at = len(head) + min(cut, len(repr(prompt)) - 1)  # inside the literal
    line = full[:cut_at] + " …"
    red = redact_prompts(line)
    assert red.startswith(head + "<redacted ") and red.endswith(" chars> …")
    assert red.count("<redacted") == 1
