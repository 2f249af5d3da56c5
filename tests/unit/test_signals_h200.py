"""Issue #29's families as a real vLLM 0.26.0 serves them on an H200 (tests/fixtures/vllm/signals/h200-0.26.0/,
recorded 2026-12-02; README.md there says how): n-gram spec decoding with prefix caching, sleep mode at
levels 1 and 2, KV offload to CPU. What the CPU build refused (sleep, offload) was read from vLLM's source
before; these are the payloads themselves, parsed and windowed as vtop does, and the rules fed with them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import diag_fixtures as F
from vtop.clock import FakeClock
from vtop.core.rules import Thresholds
from vtop.core.server import ServerTracker, ServerView, sleep_level
from vtop.faces.headless import format_text, server_row, signals_text
from vtop.sources.codec import metrics_from_json, metrics_to_json
from vtop.sources.metrics_text import parse_vllm_metrics
from vtop.sources.vllm import poll_from_body

H200 = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "signals" / "h200-0.26.0"
SCHEMA = json.loads((Path(__file__).parents[2] / "vtop" / "schema" / "report-v2.schema.json").read_text())


def text(scenario: str, which: str) -> str:
    (path,) = (H200 / scenario).glob(f"metrics-*{which}.txt")
    return path.read_text()


def parsed(body: str):  # type: ignore[no-untyped-def]
    m = parse_vllm_metrics(body)
    assert m.is_vllm and not m.problems, m.problems
    assert metrics_from_json(json.loads(json.dumps(metrics_to_json(m)))) == m  # recordings keep every field
    return m


def windowed(bodies: list[str], step_s: float = 10.0, window_s: float = 60.0) -> ServerView:
    """The scrapes fed ``step_s`` apart on an injected clock (the recording has no timestamps)."""
    clock = FakeClock(start=1000.0)
    tr = ServerTracker("http://127.0.0.1:8000", clock=clock, window_s=window_s)
    for i, body in enumerate(bodies):
        if i:
            clock.advance(step_s)
        tr.feed(poll_from_body(tr.url, body.encode(), t=clock.time(), mono=clock.monotonic(), latency_s=0.01,
                               metrics=parsed(body)))
    return tr.view()


def log_floats(scenario: str, pattern: str) -> list[float]:
    """The numbers of the last vLLM log line matching ``pattern`` (one group: a comma-separated list)."""
    found = re.findall(pattern, (H200 / scenario / "log-lines.txt").read_text())
    assert found, pattern
    return [float(x) for x in found[-1].split(",")]


# --------------------------------------------------------------------------- spec decoding + prefix cache


def test_spec_acceptance_over_the_window_after_vs_idle() -> None:
    idle, load, after, idle5 = (parsed(text("spec-prefix", w)) for w in ("0-idle", "1-load", "2-after", "3-idle"))
    d_tok = after.spec_draft_tokens_total - idle.spec_draft_tokens_total  # type: ignore[operator]
    d_acc = after.spec_accepted_tokens_total - idle.spec_accepted_tokens_total  # type: ignore[operator]
    d_drafts = after.spec_drafts_total - idle.spec_drafts_total  # type: ignore[operator]
    assert d_tok > 100_000 and 0 < d_acc < d_tok  # a real load ran between the two scrapes
    v = windowed([text("spec-prefix", "0-idle"), text("spec-prefix", "1-load"), text("spec-prefix", "2-after")])
    sp = v.spec
    assert sp is not None and sp.draft_tokens == d_tok and sp.accepted == d_acc and sp.drafts == d_drafts
    assert sp.acceptance == pytest.approx(d_acc / d_tok) and 0.9 < sp.acceptance < 1.0
    assert sp.mean_len == pytest.approx(1 + d_acc / d_drafts)
    pos = sorted(after.spec_accepted_per_pos.items(), key=lambda kv: int(kv[0]))
    assert sp.per_pos == pytest.approx([(n - idle.spec_accepted_per_pos[k]) / d_drafts for k, n in pos])
    assert len(sp.per_pos) == 3 and sp.per_pos[0] > sp.per_pos[1]
    # vLLM's own log lines of that run agree (its interval, not ours: to the log's rounding)
    assert sp.mean_len == pytest.approx(log_floats("spec-prefix", r"Mean acceptance length: ([\d.]+)")[0], abs=0.01)
    assert sp.per_pos == pytest.approx(
        log_floats("spec-prefix", r"Per-position acceptance rate: ([\d., ]+?), Avg"), abs=0.002)
    # prefix cache over the same window, and prompt tokens by source
    hits = after.prefix_cache_hits_total - idle.prefix_cache_hits_total  # type: ignore[operator]
    queries = after.prefix_cache_queries_total - idle.prefix_cache_queries_total  # type: ignore[operator]
    assert v.prefix_hit_rate == pytest.approx(hits / queries) and 0.9 < hits / queries < 1.0
    assert v.prompt_by_source is not None and v.prompt_by_source["local_cache_hit"] == hits
    assert v.sleep_level == 0 and v.offload_store_bps is None and v.offload_load_bps is None
    # idle 5 s later: the counters did not move. No drafts in the window is no acceptance, not 0 %
    quiet = windowed([text("spec-prefix", "2-after"), text("spec-prefix", "3-idle")], step_s=5.0)
    assert idle5.spec_draft_tokens_total == after.spec_draft_tokens_total
    assert quiet.spec is not None and quiet.spec.draft_tokens == 0 and quiet.spec.acceptance is None
    assert quiet.prefix_hit_rate is None


def test_spec_decode_low_stays_quiet_on_the_h200_run() -> None:
    """The recorded acceptance (~97 %) repeated for minutes: speculation pays, no ``spec_decode_low``."""
    idle, after = parsed(text("spec-prefix", "0-idle")), parsed(text("spec-prefix", "2-after"))
    ses = F.Session(url="http://127.0.0.1:8000")
    th = Thresholds()
    for i in range(int(th.spec_low_s) + 30):
        k = i / 30  # the recorded load's counters, spread over 30 s, repeated
        ses.metrics(F.grow(idle, running=8.0, generation_tokens_total=after.generation_tokens_total * k,
                           request_success_total={"length": float(i)},
                           spec_drafts_total=after.spec_drafts_total * k,  # type: ignore[operator]
                           spec_draft_tokens_total=after.spec_draft_tokens_total * k,  # type: ignore[operator]
                           spec_accepted_tokens_total=after.spec_accepted_tokens_total * k),  # type: ignore[operator]
                    mono=F.R.BASE + i)
        assert not any(a.rule == "spec_decode_low" for a in ses.tick())


# --------------------------------------------------------------------------- sleep mode


@pytest.mark.parametrize(("which", "level", "state"), [
    ("0-awake", 0, "awake"), ("1-sleep1", 1, "weights_offloaded"), ("2-woke", 0, "awake"),
    ("3-sleep2", 2, "discard_all"), ("4-woke2", 0, "awake")])
def test_sleep_level_per_recorded_state(which: str, level: int, state: str) -> None:
    m = parsed(text("sleep", which))
    assert {k for k, v in m.sleep_state.items() if v == 1.0} == {state}  # the label vLLM 0.26 sets
    assert sleep_level(m) == level
    v = windowed([text("sleep", which)] * 2)
    assert v.sleep_level == level
    row = server_row(v, None)
    assert row["sleep"] == {"level": level, "state": state, "sleeping": level > 0}
    assert row["spec_decode"] is None and row["kv_offload"] is None  # absent families: null, never zero
    assert row["prefix_cache"] is not None  # prefix caching is on by default in V1: the counters are there
    said = "\n".join(signals_text(row))
    assert ("SLEEPING" in said) == (level > 0)
    if level:
        assert f"level {level}" in said and "requests wait until POST /wake_up" in said


def _running(body: str, n: int) -> str:
    """The recorded payload with ``n`` requests running (the completion sent while asleep in the recording
    never reached the engine's families: vLLM held it in the API server, running stayed 0)."""
    line = 'vllm:num_requests_running{engine="0",model_name="/tmp/tiny"} 0.0'
    assert line in body
    return body.replace(line, line.replace("0.0", f"{n}.0"))


def test_running_while_asleep_is_no_stall_and_the_stall_clock_starts_at_wake_up() -> None:
    """The recorded sleep (level 1, then level 2) with a request running and no token for minutes: no
    ``engine_stall`` (nor any other rule above info). Woken (the recorded awake payload), the same frozen
    counters are a stall only ``engine_stall_s`` after /wake_up, not at once."""
    th = Thresholds()
    ses = F.Session(url="http://127.0.0.1:8000", process=F.cpu_process())
    t = F.R.BASE
    asleep_s = int(th.engine_stall_s) * 6
    for which in ("1-sleep1", "3-sleep2"):
        m = parse_vllm_metrics(_running(text("sleep", which), 1))
        assert sleep_level(m) and m.running == 1
        for _ in range(asleep_s // 2):
            ses.metrics(m, mono=t, max_model_len=32768)
            t += 1
            loud = [a for a in ses.tick() if a.severity != "info"]
            assert not loud, [a.title for a in loud]
    woke = parse_vllm_metrics(_running(text("sleep", "2-woke"), 1))
    assert sleep_level(woke) == 0
    fired_at = None
    for i in range(int(th.engine_stall_s) + 10):
        ses.metrics(woke, mono=t, max_model_len=32768)
        t += 1
        if any(a.rule == "engine_stall" for a in ses.tick()):
            fired_at = i
            break
    assert fired_at is not None and fired_at >= th.engine_stall_s - 1, fired_at


def test_once_reports_carry_the_recorded_sleep() -> None:
    """``vtop --once --json`` and its text on the recorded level-2 payload: the schema's fields, SLEEPING."""
    import jsonschema

    from vtop.faces.headless import Report

    v = windowed([text("sleep", "3-sleep2")] * 2)
    row = server_row(v, None)
    rep = Report(t=1796200000.0, host="h200", window_s=1.0, gpu_status="off", gpu_message=None, gpus=[],
                 servers=[row], startup=None, requests=[], requests_in_flight=None, alerts=[], notes=[])
    d = rep.to_json()
    jsonschema.validate(d, SCHEMA)
    assert d["servers"][0]["sleep"] == {"level": 2, "state": "discard_all", "sleeping": True}
    out = format_text(rep)
    assert "  SLEEPING (level 2: all discarded): requests wait until POST /wake_up\n" in out
    assert all(len(ln) <= 80 for ln in out.splitlines())


# --------------------------------------------------------------------------- KV offload


def _without(body: str, family: str) -> str:
    return "\n".join(ln for ln in body.splitlines() if not ln.startswith(family)) + "\n"


def test_kv_offload_bytes_per_direction_with_the_026_and_032_names() -> None:
    idle, load, after = (text("kv-offload", w) for w in ("0-idle", "1-load", "2-after"))
    old_name, new_store = "vllm:kv_offload_total_bytes_total", "vllm:kv_offload_store_bytes_total"
    m = parsed(load)

    def by_type(body: str, direction: str) -> float:
        (line,) = [ln for ln in body.splitlines() if ln.startswith(old_name) and f'"{direction}"' in ln]
        return float(line.rsplit(" ", 1)[1])

    stored = by_type(load, "GPU_to_CPU") - by_type(idle, "GPU_to_CPU")
    assert stored > 1e6 and by_type(load, "CPU_to_GPU") == 0  # stores happened, loads did not
    # 0.26.0 serves both spellings, equal; the store/load one has no series before the first transfer
    assert m.kv_offload_store_bytes_total == by_type(load, "GPU_to_CPU")
    assert new_store not in "".join(ln for ln in idle.splitlines() if not ln.startswith("#"))
    v = windowed([idle, load], step_s=10.0)
    assert v.offload_store_bps == pytest.approx(stored / 10.0) and v.offload_load_bps == 0
    # the 0.26 names alone (older servers: no store/load counters)
    only_old = [_without(b, new_store) for b in (idle, load)]
    assert not any(ln.startswith(new_store) for ln in only_old[1].splitlines())
    v26 = windowed(only_old, step_s=10.0)
    assert v26.offload_store_bps == pytest.approx(stored / 10.0) and v26.offload_load_bps == 0
    # the 0.32 names alone (the deprecated one left out): store from its own counter; no load series
    # ever recorded (none happened), so load is absent, not zero
    only_new = [_without(b, old_name) for b in (load, after)]
    m32 = parsed(only_new[1])
    assert m32.kv_offload_store_bytes_total == by_type(after, "GPU_to_CPU") and m32.kv_offload_load_bytes_total is None
    v32 = windowed(only_new, step_s=10.0)
    grew = m32.kv_offload_store_bytes_total - parsed(only_new[0]).kv_offload_store_bytes_total  # type: ignore[operator]
    assert v32.offload_store_bps == pytest.approx(grew / 10.0) and v32.offload_load_bps is None
    row = server_row(v, None)
    assert row["kv_offload"]["store_bytes_per_s"] == round(stored / 10.0)
    assert row["kv_offload"]["stored_bytes_total"] == by_type(load, "GPU_to_CPU")
    assert "KV offload store" in "\n".join(signals_text(row))
    cc = dict(m.cache_config or ())
    assert cc["kv_offloading_size"] == "8.0" and cc["kv_offloading_backend"] == "native"
    log = (H200 / "kv-offload" / "log-lines.txt").read_text()
    assert "Creating v1 connector with name: OffloadingConnector" in log and "CPUOffloadingSpec" in log


def test_once_fields_where_present_and_null_where_absent() -> None:
    """One round (no window): spec and prefix from the server's totals since start, said so; a window: over it."""
    one = server_row(windowed([text("spec-prefix", "2-after")]), None)
    after = parsed(text("spec-prefix", "2-after"))
    sd = one["spec_decode"]
    assert sd["over"] == "since start" and sd["acceptance"] == round(
        after.spec_accepted_tokens_total / after.spec_draft_tokens_total, 4)  # type: ignore[operator]
    assert one["prefix_cache"] == {"hit_rate": round(after.prefix_cache_hits_total / after.prefix_cache_queries_total,  # type: ignore[operator]
                                                      4), "over": "since start"}
    assert one["sleep"] == {"level": 0, "state": "awake", "sleeping": False} and one["kv_offload"] is None
    win = server_row(windowed([text("spec-prefix", "0-idle"), text("spec-prefix", "2-after")]), None)
    assert win["spec_decode"]["over"] == "window" and win["prefix_cache"]["over"] == "window"
    assert len(win["spec_decode"]["per_position"]) == 3
    # a payload with none of these families (written V0-era): every one null
    v0 = (H200.parents[1] / "written" / "v0-0.6-metrics.txt").read_text()
    bare = server_row(windowed([v0, v0]), None)
    assert (bare["sleep"], bare["spec_decode"], bare["prefix_cache"], bare["kv_offload"]) == (None, None, None, None)
